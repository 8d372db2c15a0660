//! A guest-facing port: what lives as long as the daemon while frontends come and go (its
//! socket, its device model and filter, its counters), what the attached driver agreed to,
//! and the switch's way into it ([`Egress`]).

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use log::{debug, trace, warn};

use super::config_change::{ConfigChangeError, LiveStatus};
use super::health::{BrokenRings, Health};
use super::rx::{RxPath, RxSide};
use super::split_ring::{Mem, Vring};
use crate::device::config_space::NetConfig;
use crate::device::ctrl::GUEST_OFFLOAD_MASK;
use crate::device::features::{Attachment, Negotiated};
use crate::device::filter::regs::FilterStats;
use crate::device::filter::{FilterRegs, Layout};
use crate::device::nic::NicView;
use crate::device::rss::SteeringCell;
use crate::device::snoop::{SnoopCells, SnoopCounters, Snooper};
use crate::device::NicState;
use crate::pipeline::csum_action::ActionList;
use crate::pipeline::source_lock::{MacLock, SourceLock};
use crate::pipeline::{Admitted, BurstFrame, Egress, OutboxBuffers, Packet, PortFrames, Refused, Switch};
use crate::ports::poll::PollGroup;
use crate::stats::{CtrlStats, QueueSnapshot, Tallies, Tally, TallyHandle};
use crate::stop::{Current, Stop};
use crate::unix_socket::{self, Bound, SocketAccess, SocketError};
use crate::wire::mcast_report::{self, maybe_report};
use crate::wire::VirtioNetHdr;
use virtio_bindings::virtio_net::VIRTIO_NET_F_GUEST_ANNOUNCE;

/// Whether a port learns multicast groups from its guest's IGMP/MLD reports (`--snoop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Snooping {
    #[default]
    Off,
    /// Snooping; a group no report refreshed for `expiry` is forgotten (`None`: kept until
    /// the guest leaves it).
    On { expiry: Option<Duration> },
}

/// The receive filter a port models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterConfig {
    pub layout: Layout,
    /// Multicast entries `Layout::Exact` keeps before it falls back to allmulti.
    pub exact_limit: usize,
    /// Learn multicast groups from the guest's reports (net attachment).
    pub snoop: Snooping,
    /// `--snoop-max-groups`: groups a guest may hold.
    pub snoop_max_groups: usize,
}

/// A guest-facing port. Lives as long as the daemon; connections come and go.
pub struct GuestPort {
    pub id: usize,
    pub socket: PathBuf,
    pub queue_pairs: u16,
    pub config: NetConfig,
    /// The link and announce bits of config space, and the channel that says they changed.
    status: LiveStatus,
    pub ctrl_stats: CtrlStats,
    /// What went wrong on this port: counters, warnings, contained bugs.
    pub health: Health,
    /// Control-path state (rx mode, tables, filter model): only the control queue, the
    /// snooper, a QMP follower and `ctl` touch it.
    ctrl: Mutex<NicState>,
    /// What `ctl filter` shows, published by the control path after each change.
    nic_view: Arc<ArcSwap<NicView>>,
    /// What every sender reads to deliver to this guest.
    pub(super) rx: RxSide,
    connected: AtomicBool,
    acked: AtomicU64,
    /// The switch this port is attached to, which holds the port: a strong reference here
    /// would make a cycle that outlives the daemon. A connection holds it strongly.
    switch: Weak<Switch>,
    tallies: Arc<Tallies>,
    /// Counts what the snoop querier sends to this guest (that thread's own tally).
    query_tally: TallyHandle,
    /// How long the control thread keeps polling its ring after a command (`--ctrl-poll-us`).
    pub(super) ctrl_poll: Duration,
    /// How long an event-driven TX worker keeps polling its ring after a burst
    /// (`--tx-poll-us`).
    pub(super) tx_poll: Duration,
    /// How long a frontend has to claim the port once connected (`--handshake-timeout`).
    pub(super) handshake: Option<Duration>,
    /// The guest's reported groups (`--snoop`), under a lock of their own: a guest's
    /// reports never hold up `ctl`, `/metrics` or another port; the filter's lock is taken
    /// only to publish a changed list.
    snoop: Mutex<Option<Snooper>>,
    /// Groups the snooper holds, for `ctl filter` without its lock.
    snooped_groups: AtomicUsize,
    /// The snooper's counters, for `ctl stats` and `/metrics` without its lock.
    snoop_cells: SnoopCells,
    mac_lock: MacLock,
    /// The source addresses the attached driver may send from (`--port-mac-lock`).
    pub source_lock: SourceLock,
    /// The frontend connection being served, for [`GuestPort::hang_up`] to end.
    pub(super) frontend: Current<UnixStream>,
    /// Poll mode: the threads that serve this port's TX queues instead of its kicks.
    pub(super) poll: Option<Arc<PollGroup>>,
}

impl GuestPort {
    pub fn new(
        id: usize,
        socket: PathBuf,
        queue_pairs: u16,
        config: NetConfig,
        filter: FilterConfig,
        switch: Arc<Switch>,
    ) -> Self {
        let regs = Arc::new(FilterRegs::new(filter.layout, config.mac));
        let mut nic = NicState::new(config.mac, queue_pairs, regs.clone(), filter.exact_limit);
        let snooper = match filter.snoop {
            Snooping::Off => None,
            Snooping::On { expiry } => Some(Snooper::with_max_groups(expiry, filter.snoop_max_groups)),
        };
        if snooper.is_some() {
            nic.enable_snoop();
        }
        let rx = RxSide {
            regs,
            steering: nic.steering.clone(),
            path: ArcSwapOption::empty(),
            offloads: AtomicU64::new(0),
            snooping: snooper.is_some(),
            link_up: AtomicBool::new(true),
        };
        GuestPort {
            id,
            socket,
            queue_pairs,
            config,
            status: LiveStatus::default(),
            ctrl_stats: CtrlStats::default(),
            health: Health::new(id),
            nic_view: nic.view_cell(),
            ctrl: Mutex::new(nic),
            rx,
            connected: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            query_tally: switch.tallies().register(),
            tallies: switch.tallies().clone(),
            switch: Arc::downgrade(&switch),
            ctrl_poll: Duration::from_millis(1),
            tx_poll: Duration::ZERO,
            handshake: None,
            snoop: Mutex::new(snooper),
            snooped_groups: AtomicUsize::new(0),
            snoop_cells: SnoopCells::default(),
            mac_lock: MacLock::Auto,
            source_lock: SourceLock::default(),
            frontend: Current::default(),
            poll: None,
        }
    }

    /// `--port-mac-lock`, applied from the next driver on.
    pub fn with_mac_lock(mut self, mode: MacLock) -> Self {
        self.mac_lock = mode;
        self
    }

    /// Poll mode: `group`'s threads serve this port's TX queues; kicks are not waited for.
    pub fn with_poll(mut self, group: Arc<PollGroup>) -> Self {
        self.poll = Some(group);
        self
    }

    /// `--ctrl-poll-us`: how long the control thread polls its ring after a command, since
    /// a driver sends its rx-mode commands back to back and busy-waits on each ack.
    pub fn with_ctrl_poll(mut self, poll: Duration) -> Self {
        self.ctrl_poll = poll;
        self
    }

    /// `--tx-poll-us`: how long an event-driven TX worker polls its ring after a burst
    /// that found frames, before it asks for kicks and sleeps.
    pub fn with_tx_poll(mut self, poll: Duration) -> Self {
        self.tx_poll = poll;
        self
    }

    /// `--handshake-timeout`: how long a frontend has, once connected, to claim the port.
    pub fn with_handshake(mut self, limit: Option<Duration>) -> Self {
        self.handshake = limit;
        self
    }

    /// Binds the socket, replacing a stale socket file of the daemon's user but never a live
    /// socket, another user's, or a file that is not a socket (unix_socket.rs).
    pub fn bind(&self, access: SocketAccess) -> Result<Bound, SocketError> {
        unix_socket::bind(&self.socket, access)
    }

    /// Ends the connection being served, as a frontend hanging up would: the port's serving
    /// thread returns to look at its `Stop`.
    pub fn hang_up(&self) {
        self.frontend.with(|s| {
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
    }

    /// Marks a frontend as being served, until [`GuestPort::detach`]; false if `stop`
    /// came first.
    pub(super) fn attach_frontend(&self, stream: &UnixStream, stop: &Stop) -> bool {
        match stream.try_clone() {
            Ok(c) => {
                if !self.frontend.set(c, stop) {
                    return false;
                }
            }
            // Served all the same; only a stop cannot end this connection.
            Err(e) => warn!("port {}: the connection cannot be ended by a stop: {e}", self.id),
        }
        self.health.stats.connections.inc();
        self.connected.store(true, Ordering::Relaxed);
        true
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The config space as served now: the fixed part, with the link and announce bits.
    pub fn config_now(&self) -> NetConfig {
        NetConfig {
            link_up: self.status.link_up(),
            announce: self.status.announcing(),
            ..self.config
        }
    }

    /// Device attachment: takes the link down or brings it up and tells the frontend; a
    /// guest whose link is down is delivered nothing.
    pub fn set_link(&self, up: bool) -> Result<(), ConfigChangeError> {
        self.rx.link_up.store(up, Ordering::Relaxed);
        self.status.set_link(up)
    }

    /// Device attachment: asks the driver to announce itself (VIRTIO_NET_S_ANNOUNCE): Linux
    /// sends a gratuitous ARP and reports its groups again, then acks on the control queue.
    pub fn announce(&self) -> Result<(), ConfigChangeError> {
        self.status
            .announce(self.negotiated().has(VIRTIO_NET_F_GUEST_ANNOUNCE))
    }

    /// The driver's ANNOUNCE_ACK.
    pub(super) fn announce_acked(&self) {
        self.status.announce_done();
    }

    /// The frontend's channel for config changes (relay.rs keeps it for the port).
    pub(super) fn set_backend_channel(&self, channel: UnixStream) {
        self.status.set_channel(Some(channel));
    }

    /// The attachment the current driver uses, as far as its features tell.
    pub fn attachment(&self) -> Option<Attachment> {
        self.connected().then(|| self.negotiated().attachment())
    }

    /// The features the current driver acked (none while disconnected).
    pub fn negotiated(&self) -> Negotiated {
        Negotiated {
            bits: self.acked.load(Ordering::Relaxed),
        }
    }

    /// CTRL_GUEST_OFFLOADS_SET accepted: the receive side follows it from the next frame.
    pub fn set_guest_offloads(&self, bits: u64) {
        self.rx.offloads.store(bits, Ordering::Relaxed);
    }

    /// The switch, unless the daemon has let it go (it is stopping).
    pub(super) fn switch(&self) -> Option<Arc<Switch>> {
        self.switch.upgrade()
    }

    /// Registers a worker's counters with the switch.
    pub(super) fn register_tally(&self) -> TallyHandle {
        self.tallies.register()
    }

    /// Counters per queue pair, summed over every worker that counted for this port.
    pub fn stats(&self) -> Vec<QueueSnapshot> {
        self.tallies.port(self.id)
    }

    /// The VLANs the driver lets through; `None` while every VLAN passes.
    pub fn vlans(&self) -> Option<Vec<u16>> {
        self.rx.regs.vlan().allowed()
    }

    /// The net attachment with `--qmp`: QEMU's VLAN table, taken whole.
    pub fn set_vlans(&self, allowed: Option<&[u16]>) {
        self.rx.regs.vlan().replace(allowed);
    }

    /// What `ctl filter` shows, as the control path last published it.
    pub fn nic_view(&self) -> Arc<NicView> {
        self.nic_view.load_full()
    }

    /// The filter's counters, read without the control lock: `ctl stats` and `/metrics`
    /// never wait behind a guest's commands or reports.
    pub fn filter_stats(&self) -> FilterStats {
        self.rx.regs.stats()
    }

    /// The RX steering (RSS) as the control path last published it.
    pub fn steering(&self) -> &SteeringCell {
        &self.rx.steering
    }

    pub fn lock_ctrl(&self) -> MutexGuard<'_, NicState> {
        crate::sync::lock(&self.ctrl)
    }

    /// Groups the snooper holds (`--snoop`).
    pub fn snooped_groups(&self) -> Option<usize> {
        self.rx
            .snooping
            .then(|| self.snooped_groups.load(Ordering::Relaxed))
    }

    /// The snooper's counters (`--snoop`).
    pub fn snoop_counters(&self) -> Option<SnoopCounters> {
        self.rx.snooping.then(|| self.snoop_cells.load())
    }

    /// A driver attached its rings: senders write into them from the next frame.
    pub(super) fn publish_rings(&self, vrings: Vec<Vring>, mem: Mem, broken: Arc<BrokenRings>) {
        let feat = self.negotiated();
        self.rx.path.store(Some(Arc::new(RxPath {
            vrings,
            mem,
            feat,
            broken,
        })));
    }

    /// The driver acked `bits` (SET_FEATURES).
    pub(super) fn set_acked(&self, bits: u64) {
        self.acked.store(bits, Ordering::Relaxed);
        // A driver that acks CTRL_VLAN starts with no VLAN and adds its own; one that does
        // not gets every VLAN (QEMU's virtio_net_set_features). The same bit acked again
        // (QEMU repeats SET_FEATURES to start dirty logging) leaves the table as it is.
        let vlan = Negotiated { bits }.ctrl_vlan();
        if self.rx.regs.vlan().is_on() != vlan {
            self.rx.regs.vlan().reset(vlan);
        }
        // The device attachment serves the MAC in config space: the daemon knows it, and a
        // locked guest may neither send from another nor switch to one (MAC_ADDR_SET).
        let known = Negotiated { bits }.ctrl_vq().then_some(self.config.mac);
        self.source_lock.attach(self.mac_lock, known);
        self.lock_ctrl().set_mac_lock(self.source_lock.locked_to());
        self.rx
            .offloads
            .store(bits & GUEST_OFFLOAD_MASK, Ordering::Relaxed);
        // Rings already attached carry the features: published again.
        if let Some(rx) = self.rx.path.load_full() {
            self.publish_rings(rx.vrings.clone(), rx.mem.clone(), rx.broken.clone());
        }
    }

    /// The device is reset (a new driver, or RESET_DEVICE): back to promiscuous with empty
    /// tables, and no snooped group.
    pub(super) fn reset(&self) {
        let mut snoop = self.lock_snoop();
        if let Some(s) = snoop.as_mut() {
            s.clear();
            self.snooped_groups.store(0, Ordering::Relaxed);
        }
        self.lock_ctrl().reset(self.config.mac);
        self.status.announce_done();
        // Empty, deciding or not as the features in force say (none once detached).
        self.rx.regs.vlan().reset(self.negotiated().ctrl_vlan());
    }

    /// The frontend is gone: nothing more is written to the guest, and the next one starts
    /// from a reset device.
    pub(super) fn detach(&self) {
        self.frontend.clear();
        self.status.set_channel(None);
        self.rx.path.store(None);
        self.source_lock.open();
        self.lock_ctrl().set_mac_lock(None);
        self.acked.store(0, Ordering::Relaxed);
        self.connected.store(false, Ordering::Relaxed);
        self.reset();
    }

    /// A frame the guest sent that may be a membership report (`--snoop`). Only the net
    /// attachment snoops; in the device attachment the control queue is authoritative.
    #[inline]
    pub(super) fn snoop_frame(&self, frame: &[u8]) {
        if self.rx.snooping {
            self.snoop_report(frame);
        }
    }

    /// [`GuestPort::snoop_frame`] on a snooping port.
    fn snoop_report(&self, frame: &[u8]) {
        if !maybe_report(frame) || self.attachment() != Some(Attachment::Net) {
            return;
        }
        match mcast_report::parse(frame) {
            Some(report) => {
                trace!("port {}: membership report: {report:?}", self.id);
                let now = Instant::now();
                self.with_snooper(|s| s.apply_report(&report, now));
            }
            None => trace!(
                "port {}: IGMP/MLD frame that is not a valid report ({} bytes): {:02x?}",
                self.id,
                frame.len(),
                frame
            ),
        }
    }

    /// As querier for `--snoop`: sends an IGMPv3 and an MLDv2 general query to the guest
    /// (the `families` asked: IPv4, IPv6), whose answers (reports of everything it holds),
    /// due within `respond`, refresh the snooped groups. Returns which of the two reached
    /// the guest's receive ring.
    pub fn send_queries(&self, respond: Duration, families: (bool, bool)) -> (bool, bool) {
        if !self.rx.snooping || self.attachment() != Some(Attachment::Net) {
            return (false, false);
        }
        let Some(switch) = self.switch() else {
            return (false, false);
        };
        let (igmp_ds, mld_ms) = mcast_report::max_resp_codes(respond);
        let mut bufs = OutboxBuffers::default();
        let mut frame = Vec::with_capacity(128);
        let mut query = |build: &dyn Fn(&mut Vec<u8>)| {
            frame.clear();
            build(&mut frame);
            let mut out = switch.outbox(&self.query_tally, &mut bufs);
            let Ok(adm) = self.rx.admit(&self.health, &self.query_tally, 0, &frame) else {
                return false;
            };
            out.lend(self.id, 0, adm, Packet::new(VirtioNetHdr::default(), &mut frame));
            out.flush() > 0
        };
        let v4 = families.0 && query(&|f| mcast_report::igmp_general_query(igmp_ds, f));
        let v6 = families.1 && query(&|f| mcast_report::mld_general_query(mld_ms, f));
        (v4, v6)
    }

    /// `--snoop-timeout`'s refresh: general queries whose answers keep the groups the
    /// guest still holds, unless an audit (which does the same) is due or open.
    pub fn refresh(&self, respond: Duration, now: Instant) {
        if !self.rx.snooping || self.attachment() != Some(Attachment::Net) {
            return;
        }
        if !self.lock_snoop().as_ref().is_some_and(Snooper::refresh_allowed) {
            return;
        }
        let (v4, v6) = self.send_queries(respond, (true, true));
        if v4 || v6 {
            if let Some(s) = self.lock_snoop().as_mut() {
                s.refresh_sent(now, respond);
            }
        }
    }

    /// The snooper's clock (`--snoop`): expiry, and the audit of the guest's state once its
    /// change reports have gone quiet (device/snoop.rs). Called every few hundred ms.
    pub fn snoop_tick(&self, now: Instant) {
        if !self.rx.snooping {
            return;
        }
        let mut due = None;
        self.with_snooper(|s| {
            let changed = s.tick(now);
            if let Some(j) = s.take_judgement() {
                debug!(
                    "port {}: audit judged {:?} after its query: asked (IPv4, IPv6) {:?}, heard {:?}, \
                     dropped {} groups{}",
                    self.id,
                    j.after,
                    j.asked,
                    j.heard,
                    j.dropped,
                    if j.spared {
                        ", a silent family asked again"
                    } else {
                        ""
                    }
                );
            }
            due = s.audit_due(now).then(|| s.audit_query());
            changed
        });
        let Some(q) = due.filter(|_| self.attachment() == Some(Attachment::Net)) else {
            return;
        };
        let (v4, v6) = self.send_queries(q.respond, q.families);
        if let Some(s) = self.lock_snoop().as_mut() {
            if s.audit_sent(now, v4, v6) {
                debug!(
                    "port {}: audit query sent (IPv4, IPv6): {:?}, asked {:?}, answers within {:?}",
                    self.id,
                    (v4, v6),
                    q.families,
                    q.respond
                );
            }
            self.snoop_cells.store(&s.counters());
        }
    }

    fn lock_snoop(&self) -> MutexGuard<'_, Option<Snooper>> {
        crate::sync::lock(&self.snoop)
    }

    /// Runs `f` on the snooper; if it says the wanted groups changed, publishes them to the
    /// filter (the snoop lock is taken before the filter's, always in that order). Counts
    /// what the snooper refused meanwhile.
    fn with_snooper(&self, f: impl FnOnce(&mut Snooper) -> bool) {
        let mut guard = self.lock_snoop();
        let Some(s) = guard.as_mut() else { return };
        let before = s.refusals();
        if f(s) {
            self.lock_ctrl().publish_snooped(s.macs());
        }
        let after = s.refusals();
        let stats = &self.health.stats;
        stats.snoop_groups_refused.add(after.groups - before.groups);
        stats.snoop_sources_capped.add(after.sources - before.sources);
        if after.groups > before.groups && self.health.may_warn() {
            warn!(
                "port {}: the guest holds {} snooped groups, the most allowed (--snoop-max-groups); \
                 further joins are ignored",
                self.id,
                s.groups()
            );
        }
        self.snooped_groups.store(s.groups(), Ordering::Relaxed);
        self.snoop_cells.store(&s.counters());
    }
}

/// The switch's way into the guest: the filter admits, the receive side writes.
impl Egress for GuestPort {
    fn admit(&self, tally: &Tally, flow: usize, frame: &[u8]) -> Result<Admitted, Refused> {
        self.rx.admit(&self.health, tally, flow, frame)
    }

    fn write(&self, tally: &Tally, frames: &mut PortFrames<'_, '_>, segment: &mut Vec<u8>) -> usize {
        self.rx.write(&self.health, tally, frames, segment)
    }

    fn write_plain(
        &self,
        tally: &Tally,
        flow: usize,
        frames: &mut [BurstFrame<'_>],
        actions: &ActionList,
    ) -> Option<usize> {
        self.rx.write_plain(&self.health, tally, flow, frames, actions)
    }
}
