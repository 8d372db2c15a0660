//! Guest ports served over vhost-user: one socket, either QEMU attachment.

mod backend;
pub mod evict;
mod memcheck;
// Opt-in at build time: tuned on 2-CPU hosts nobody pins (docs/benchmarks.md, "A daemon left
// running next to guests"); CPU placement otherwise belongs to whoever runs the daemon.
#[cfg(feature = "ctrl-placement")]
pub mod placement;
#[cfg(not(feature = "ctrl-placement"))]
#[path = "placement_off.rs"]
pub mod placement;
pub mod proxy;
pub mod queue;
pub mod ring;
mod rx;
pub mod sigbus;
mod stage;

use std::io;
use std::net::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use log::{error, info, trace, warn};
use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserDaemon, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use self::backend::VnicBackend;
use self::queue::{BrokenRings, RingError};
use super::poll::PollGroup;
use super::WarnLimiter;
use crate::device::config::NetConfig;
use crate::device::ctrl::GUEST_OFFLOAD_MASK;
use crate::device::features::{Attachment, Negotiated};
use crate::device::filter::{FilterRegs, Layout};
use crate::device::nic::NicView;
use crate::device::rss::SteeringCell;
use crate::device::snoop::{self, Snooper};
use crate::device::NicState;
use crate::pipeline::source_lock::{MacLock, SourceLock};
use crate::pipeline::{Packet, Switch};
use crate::stats::{ConnStats, CtrlStats, QueueSnapshot, Tallies, TallyHandle};
use crate::stop::{Current, Stop};
use crate::unix_socket::{self, SocketAccess};
use crate::wire::mcast_report::{self, maybe_report};

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringRwLock<Mem>;

#[derive(Debug, Error)]
pub enum VhostPortError {
    #[error("guest port socket")]
    Bind(#[source] unix_socket::SocketError),
    // vhost_user_backend::Error implements Display but not std::error::Error, so it is
    // carried and printed rather than chained as a source.
    #[error("vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    /// The request handler refused a message, which ends the connection.
    #[error("the request handler refused a message (the frontend's last was {last}): {error}")]
    Refused {
        last: String,
        error: vhost_user_backend::Error,
    },
    #[error("private channel between the relay and the request handler")]
    Inner(#[source] io::Error),
    #[error("registering with the vring worker")]
    Register(#[source] io::Error),
    #[error("relay")]
    Relay(#[source] proxy::ProxyError),
}

/// How often `--client` tries to connect while no frontend listens: short enough that a
/// QEMU started after the daemon is served at once, long enough to cost nothing.
pub const CLIENT_RETRY: Duration = Duration::from_millis(100);

/// The receive filter a port models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterConfig {
    pub layout: Layout,
    /// Multicast entries `Layout::Exact` keeps before it falls back to allmulti.
    pub exact_limit: usize,
    /// Learn multicast groups from the guest's IGMP/MLD reports (net attachment), forgetting
    /// them after the timeout if given.
    pub snoop: Option<Option<std::time::Duration>>,
    /// `--snoop-max-groups`: groups a guest may hold.
    pub snoop_max_groups: usize,
}

/// How the control queue's thread waits for commands. The defaults change nothing about the
/// daemon's scheduling: priority and CPU placement belong to whoever runs it (libvirt,
/// systemd, cgroups, taskset) unless the user opts in (docs/running-with-qemu.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtrlTuning {
    /// How long the thread keeps polling the ring for the next command after serving one.
    pub poll: std::time::Duration,
    /// Opt-in: the SCHED_FIFO priority the thread sleeps at (0: never changes its policy).
    pub wake_priority: u8,
    /// Opt-in: after a wake-up, move off a CPU where a frontend thread is runnable
    /// (placement.rs). Off: the thread never changes its CPU affinity.
    pub placement: bool,
}

/// What the RX side of a connected guest needs; swapped in whole when a driver attaches.
struct RxPath {
    vrings: Vec<Vring>,
    mem: Mem,
    feat: Negotiated,
    /// The connection's broken queues: a broken RX queue takes no more frames.
    broken: Arc<BrokenRings>,
    /// RX queues (bit per queue) written to since the last flush, whose driver may want an
    /// interrupt: checked once per burst by whichever worker flushes first (rx.rs).
    pending: AtomicU64,
    /// Per RX queue: the used index at the last interrupt check ([`UNCHECKED`] before the
    /// first), written under the queue's lock. The used entries go through `ring.rs`, which
    /// virtio-queue does not count, so the flush counts what was added since.
    checked: Box<[AtomicU32]>,
}

/// The next `GuestPort::uid`.
static NEXT_UID: AtomicU64 = AtomicU64::new(0);

/// No interrupt check yet on this queue: the next one counts every entry as new.
const UNCHECKED: u32 = u32::MAX;

/// A guest-facing port. Lives as long as the daemon; connections come and go.
pub struct GuestPort {
    pub id: usize,
    /// Unique among every port this process ever made: what a thread's stage of frames
    /// for it is keyed by (rx.rs), where `id` may repeat (one switch per test, say).
    uid: u64,
    pub socket: PathBuf,
    pub queue_pairs: u16,
    pub config: NetConfig,
    /// Counts what the snoop querier sends to this guest (that thread's own tally).
    query_tally: TallyHandle,
    pub ctrl_stats: CtrlStats,
    /// What frontends did to this port: connections, broken rings, refusals, memory faults.
    pub conn_stats: ConnStats,
    /// Control-path state (rx mode, tables, filter model): only the control queue and `ctl`
    /// touch it.
    pub ctrl: Mutex<NicState>,
    /// What `ctl filter` shows, published by the control path after each change.
    nic_view: Arc<ArcSwap<NicView>>,
    /// The filter registers every frame to this guest is checked against.
    regs: Arc<FilterRegs>,
    /// Which RX queue a frame goes to (RSS), published by the control path.
    steering: Arc<SteeringCell>,
    connected: AtomicBool,
    acked: AtomicU64,
    /// The receive offloads in force: the acked GUEST_* bits, then whatever the driver's
    /// CTRL_GUEST_OFFLOADS set (ethtool -K in the guest).
    guest_offloads: AtomicU64,
    rx: ArcSwapOption<RxPath>,
    /// The switch this port is attached to, which holds the port: a strong reference here
    /// would make a cycle that outlives the daemon. A connection holds it strongly.
    switch: Weak<Switch>,
    tallies: Arc<Tallies>,
    warn: WarnLimiter,
    ctrl_tuning: CtrlTuning,
    snooping: bool,
    /// The guest's reported groups (`--snoop`), under a lock of their own: a guest's
    /// reports never hold up `ctl`, `/metrics` or another port; the filter's lock is taken
    /// only to publish a changed list.
    snoop: Mutex<Option<Snooper>>,
    /// Groups the snooper holds, for `ctl filter` without its lock.
    snooped_groups: std::sync::atomic::AtomicUsize,
    mac_lock: MacLock,
    /// The source addresses the attached driver may send from (`--port-mac-lock`).
    pub source_lock: SourceLock,
    /// The frontend connection being served, for [`GuestPort::wake`] to end.
    frontend: Current<UnixStream>,
    /// Poll mode: the threads that serve this port's TX queues instead of its kicks.
    poll: Option<Arc<PollGroup>>,
}

impl GuestPort {
    /// Runs `f`, which handles input from a guest or frontend; if it panics (a bug: none is
    /// known to be reachable, and the fuzz targets look for them), the panic stops here,
    /// inside whatever lock the caller holds, so no lock is poisoned and no other port or
    /// later frame is affected. Counted in `panics`; the hook in main.rs logs it, rate
    /// limited. `None` when it panicked.
    pub(crate) fn contain<T>(&self, what: &str, f: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(_) => {
                self.conn_stats.panics.inc();
                if self.warn.allow() {
                    error!(
                        "port {}: a bug was hit handling {what}; dropped it and carried on",
                        self.id
                    );
                }
                None
            }
        }
    }

    pub fn new(
        id: usize,
        socket: PathBuf,
        queue_pairs: u16,
        config: NetConfig,
        filter: FilterConfig,
        ctrl_tuning: CtrlTuning,
        switch: Arc<Switch>,
    ) -> Self {
        let regs = Arc::new(FilterRegs::new(filter.layout, config.mac));
        let mut nic = NicState::new(config.mac, queue_pairs, regs.clone(), filter.exact_limit);
        let snooper = filter
            .snoop
            .map(|timeout| Snooper::with_max_groups(timeout, filter.snoop_max_groups));
        if snooper.is_some() {
            nic.enable_snoop();
        }
        let steering = nic.steering.clone();
        let nic_view = nic.view_cell();
        GuestPort {
            id,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            socket,
            queue_pairs,
            config,
            query_tally: switch.tallies().register(),
            tallies: switch.tallies().clone(),
            ctrl_stats: CtrlStats::default(),
            conn_stats: ConnStats::default(),
            ctrl: Mutex::new(nic),
            nic_view,
            regs,
            steering,
            connected: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            guest_offloads: AtomicU64::new(0),
            rx: ArcSwapOption::empty(),
            switch: Arc::downgrade(&switch),
            warn: WarnLimiter::default(),
            ctrl_tuning,
            snooping: filter.snoop.is_some(),
            snoop: Mutex::new(snooper),
            snooped_groups: Default::default(),
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

    /// TX path hook: a frame the guest sent that may be a membership report. Only the net
    /// attachment snoops; in the device attachment the control queue is authoritative.
    pub fn snoop_frame(&self, frame: &[u8]) {
        if !self.snooping || !maybe_report(frame) || self.attachment() != Some(Attachment::Net) {
            return;
        }
        match mcast_report::parse(frame) {
            Some(records) => {
                trace!("port {}: membership report: {records:?}", self.id);
                let now = std::time::Instant::now();
                self.with_snooper(|s| s.apply(&records, now));
            }
            None => trace!(
                "port {}: IGMP/MLD frame that is not a valid report ({} bytes): {:02x?}",
                self.id,
                frame.len(),
                frame
            ),
        }
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
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

    /// CTRL_GUEST_OFFLOADS_SET accepted: the RX path follows it from the next frame.
    pub fn set_guest_offloads(&self, bits: u64) {
        self.guest_offloads.store(bits, Ordering::Relaxed);
    }

    /// The switch, unless the daemon has let it go (it is stopping).
    fn switch(&self) -> Option<Arc<Switch>> {
        self.switch.upgrade()
    }

    /// Counters per queue pair, summed over every worker that counted for this port.
    pub fn stats(&self) -> Vec<QueueSnapshot> {
        self.tallies.port(self.id)
    }

    /// The control state as of the last command applied, without waiting for one being
    /// applied now.
    pub fn nic_view(&self) -> Arc<NicView> {
        self.nic_view.load_full()
    }

    /// RX steering (RSS) as the control path last published it.
    pub fn steering(&self) -> &SteeringCell {
        &self.steering
    }

    pub fn lock_ctrl(&self) -> std::sync::MutexGuard<'_, NicState> {
        crate::sync::lock(&self.ctrl)
    }

    /// Binds the socket, replacing a stale socket file but never a live daemon's socket or
    /// a file that is not a socket.
    pub fn bind(&self, access: SocketAccess) -> Result<UnixListener, VhostPortError> {
        unix_socket::bind(&self.socket, access).map_err(VhostPortError::Bind)
    }

    /// Serves frontends one after another, as they connect to `listener`, until `stop`.
    pub fn serve(self: Arc<Self>, listener: UnixListener, stop: Stop) {
        for conn in listener.incoming() {
            if stop.requested() {
                break;
            }
            match conn {
                Ok(stream) => {
                    if !self.serve_frontend(stream, &stop) {
                        break;
                    }
                    info!(
                        "port {}: frontend disconnected; waiting for the next one",
                        self.id
                    );
                }
                Err(e) => {
                    if self.warn.allow() {
                        warn!("port {}: accept failed: {e}", self.id);
                    }
                    // Out of descriptors, say: let the process breathe instead of spinning.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// `--client`: connects to the frontend listening at the port's socket, serves it, and
    /// connects again once it goes, until `stop`. While nobody listens there it tries again
    /// every [`CLIENT_RETRY`], and says so once per wait.
    pub fn serve_as_client(self: Arc<Self>, stop: Stop) {
        let mut told = false;
        while !stop.requested() {
            match UnixStream::connect(&self.socket) {
                Ok(stream) => {
                    told = false;
                    if !self.serve_frontend(stream, &stop) {
                        break;
                    }
                    info!("port {}: frontend disconnected; connecting again", self.id);
                }
                Err(e) => {
                    if !told {
                        info!(
                            "port {}: waiting for a frontend to listen at {}: {e}",
                            self.id,
                            self.socket.display()
                        );
                        told = true;
                    }
                    std::thread::sleep(CLIENT_RETRY);
                }
            }
        }
    }

    /// Serves one frontend until it goes; false if `stop` came first.
    fn serve_frontend(self: &Arc<Self>, stream: UnixStream, stop: &Stop) -> bool {
        match stream.try_clone() {
            Ok(c) => {
                if !self.frontend.set(c, stop) {
                    return false;
                }
            }
            // Served all the same; only a stop cannot end this connection.
            Err(e) => warn!("port {}: the connection cannot be ended by a stop: {e}", self.id),
        }
        self.conn_stats.connections.inc();
        info!("port {} ({}): frontend connected", self.id, self.socket.display());
        self.connected.store(true, Ordering::Relaxed);
        if let Err(e) = self.serve_connection(stream) {
            warn!("port {}: connection ended: {}", self.id, error_chain(&e));
        }
        self.frontend.clear();
        self.detach();
        true
    }

    /// Ends the connection being served, as a frontend hanging up would: [`GuestPort::serve`]
    /// and [`GuestPort::serve_as_client`] return to look at their `Stop`.
    pub fn hang_up(&self) {
        self.frontend.with(|s| {
            let _ = s.shutdown(Shutdown::Both);
        });
    }

    fn serve_connection(self: &Arc<Self>, frontend: UnixStream) -> Result<(), VhostPortError> {
        let frontend_pid = if self.ctrl_tuning.placement {
            self.frontend_pid(&frontend)
        } else {
            None
        };
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let own_end = frontend.try_clone().map_err(VhostPortError::Inner)?;
        let backend = VnicBackend::new(self.clone(), mem.clone(), frontend_pid, own_end)
            .map_err(VhostPortError::Register)?;
        sigbus::watch(backend.mem_owner());
        let name = format!("vnic-port{}", self.id);
        let mut daemon =
            VhostUserDaemon::new(name.clone(), backend.clone(), mem).map_err(VhostPortError::Daemon)?;
        // Each worker thread gets one "attach" event so the backend learns its vrings before
        // any kick arrives (RX from other ports may come first), and an "again" event to come
        // back to rings it left at its budget.
        for (i, h) in daemon.get_epoll_handlers().iter().enumerate() {
            h.register_listener(backend.attach_event(i), EventSet::IN, backend.attach_event_id())
                .map_err(VhostPortError::Register)?;
            h.register_listener(backend.again_event(i), EventSet::IN, backend.again_event_id())
                .map_err(VhostPortError::Register)?;
            backend.trigger_attach(i).map_err(VhostPortError::Register)?;
        }
        // The handler reads from a channel only this process can reach; the relay feeds it
        // QEMU's messages.
        let (mut listener, handler_side, dir) =
            private_channel(&self.socket).map_err(VhostPortError::Inner)?;
        daemon.start(&mut listener).map_err(VhostPortError::Daemon)?;
        drop(listener);
        drop(dir);
        let relay = proxy::Relay::spawn(&name, frontend, handler_side, Arc::new(backend.clone()))
            .map_err(VhostPortError::Relay)?;
        let result = daemon.wait();
        let last = relay.last_request();
        relay.stop();
        // Joins the workers; the session (exit events, counters, mappings) goes with the
        // last of them.
        drop(daemon);
        drop(backend);
        match result {
            // The frontend hanging up is how every connection ends.
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => Ok(()),
            Err(error @ vhost_user_backend::Error::HandleRequest(_)) => Err(VhostPortError::Refused {
                last: last.map_or_else(|| "none".into(), proxy::request_name),
                error,
            }),
            r => r.map_err(VhostPortError::Daemon),
        }
    }

    /// A driver broke queue `q` of this connection (`broken`): counted and logged once,
    /// then the queue is left alone until the frontend programs it again.
    fn ring_broken(&self, broken: &BrokenRings, q: usize, e: &RingError) {
        if broken.set(q) {
            self.conn_stats.rings_broken.inc();
            if self.warn.allow() {
                warn!(
                    "port {}: queue {q}: {}; not served until the frontend restarts it or reconnects",
                    self.id,
                    error_chain(e)
                );
            }
        }
    }

    /// The frontend's process, whose threads `--ctrl-placement` keeps the control thread off.
    fn frontend_pid(&self, frontend: &UnixStream) -> Option<u32> {
        match placement::peer_pid(frontend) {
            Ok(Some(pid)) => Some(pid),
            Ok(None) => {
                info!(
                    "port {}: the frontend runs in another PID namespace; the control thread goes by signs alone",
                    self.id
                );
                None
            }
            Err(e) => {
                warn!(
                    "port {}: the frontend's process is unknown, so the control thread goes by signs alone: {e}",
                    self.id
                );
                None
            }
        }
    }

    /// As querier for `--snoop`: sends an IGMPv3 and an MLDv2 general query to the guest,
    /// whose answers (reports of everything it holds), due within `respond`, refresh the
    /// snooped groups. Returns which of the two reached the guest's receive ring.
    pub fn send_queries(&self, respond: std::time::Duration) -> (bool, bool) {
        if !self.snooping || self.attachment() != Some(Attachment::Net) {
            return (false, false);
        }
        let (igmp_ds, mld_ms) = mcast_report::max_resp_codes(respond);
        let mut frame = Vec::with_capacity(128);
        let mut query = |build: &dyn Fn(&mut Vec<u8>)| {
            frame.clear();
            build(&mut frame);
            // A query is never a GSO frame: the segment buffer stays empty.
            self.deliver(
                &self.query_tally,
                0,
                &mut Packet::new(Default::default(), &mut frame),
                &mut Vec::new(),
            )
        };
        let v4 = query(&|f| mcast_report::igmp_general_query(igmp_ds, f));
        let v6 = query(&|f| mcast_report::mld_general_query(mld_ms, f));
        self.flush_rx();
        (v4, v6)
    }

    /// The snooper's clock (`--snoop`): expiry, and the audit of the guest's state once its
    /// change reports have gone quiet (device/snoop.rs). Called every few hundred ms.
    pub fn snoop_tick(&self, now: std::time::Instant) {
        if !self.snooping {
            return;
        }
        let mut due = false;
        self.with_snooper(|s| {
            let changed = s.tick(now);
            due = s.audit_due(now);
            changed
        });
        if !due || self.attachment() != Some(Attachment::Net) {
            return;
        }
        let (v4, v6) = self.send_queries(snoop::AUDIT_RESPONSE);
        if let Some(s) = self.lock_snoop().as_mut() {
            s.audit_sent(now, v4, v6);
        }
    }

    fn lock_snoop(&self) -> std::sync::MutexGuard<'_, Option<Snooper>> {
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
        self.conn_stats
            .snoop_groups_refused
            .add(after.groups - before.groups);
        self.conn_stats
            .snoop_sources_capped
            .add(after.sources - before.sources);
        if after.groups > before.groups && self.warn.allow() {
            warn!(
                "port {}: the guest holds {} snooped groups, the most allowed (--snoop-max-groups); \
                 further joins are ignored",
                self.id,
                s.groups()
            );
        }
        self.snooped_groups.store(s.groups(), Ordering::Relaxed);
    }

    /// The filter's counters, read without the control lock: `ctl stats` and `/metrics`
    /// never wait behind a guest's commands or reports.
    pub fn filter_stats(&self) -> crate::device::filter::model::FilterStats {
        self.regs.stats()
    }

    /// Groups the snooper holds (`--snoop`).
    pub fn snooped_groups(&self) -> Option<usize> {
        self.snooping.then(|| self.snooped_groups.load(Ordering::Relaxed))
    }

    fn publish(&self, vrings: Vec<Vring>, mem: Mem, broken: Arc<BrokenRings>) {
        let feat = self.negotiated();
        self.rx.store(Some(Arc::new(RxPath {
            mem,
            feat,
            checked: (0..vrings.len()).map(|_| AtomicU32::new(UNCHECKED)).collect(),
            vrings,
            broken,
            pending: AtomicU64::new(0),
        })));
    }

    fn set_acked(&self, bits: u64) {
        self.acked.store(bits, Ordering::Relaxed);
        // The device attachment serves the MAC in config space: the daemon knows it, and a
        // locked guest may neither send from another nor switch to one (MAC_ADDR_SET).
        let known = Negotiated { bits }.ctrl_vq().then_some(self.config.mac);
        self.source_lock.attach(self.mac_lock, known);
        self.lock_ctrl().set_mac_lock(self.source_lock.locked_to());
        self.guest_offloads
            .store(bits & GUEST_OFFLOAD_MASK, Ordering::Relaxed);
        // Refresh the published features if vrings are already known.
        if let Some(rx) = self.rx.load_full() {
            self.publish(rx.vrings.clone(), rx.mem.clone(), rx.broken.clone());
        }
    }

    fn reset(&self) {
        let mut snoop = self.lock_snoop();
        if let Some(s) = snoop.as_mut() {
            s.clear();
            self.snooped_groups.store(0, Ordering::Relaxed);
        }
        self.lock_ctrl().reset(self.config.mac);
    }

    fn detach(&self) {
        self.rx.store(None);
        self.source_lock.open();
        self.lock_ctrl().set_mac_lock(None);
        self.acked.store(0, Ordering::Relaxed);
        self.connected.store(false, Ordering::Relaxed);
        self.reset();
    }
}

/// A listener only this process can reach, and the end connected to it: a socket in a
/// fresh 0700 directory beside the port's own socket (writable, since the port's socket was
/// bound there). No other user can look into the directory, let alone bind or connect, and
/// both vanish once the handler has accepted (the caller drops the `TempDir`).
fn private_channel(near: &Path) -> io::Result<(Listener, UnixStream, tempfile::TempDir)> {
    let parent = near
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let builder = || {
        let mut b = tempfile::Builder::new();
        b.prefix(".dpaa-vnic-")
            .permissions(std::fs::Permissions::from_mode(0o700));
        b
    };
    // Beside the socket; failing that (an inherited socket in a directory the daemon may
    // not write, or no path at all), in the service's runtime directory or the temp dir.
    let dir = match builder().tempdir_in(parent) {
        Ok(d) => d,
        Err(_) => {
            let runtime = std::env::var_os("RUNTIME_DIRECTORY").map(PathBuf::from);
            builder().tempdir_in(runtime.unwrap_or_else(std::env::temp_dir))?
        }
    };
    let path = dir.path().join("h");
    let listener = UnixListener::bind(&path)?;
    let ours = UnixStream::connect(&path)?;
    Ok((Listener::from(listener), ours, dir))
}

/// "outer: inner: innermost" for log lines.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
