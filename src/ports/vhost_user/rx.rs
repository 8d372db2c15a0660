//! The receive side of a guest port: which frames the port admits (its DPAA filter, as the
//! switch asks before queuing a frame), and how the frames an outbox holds for it reach the
//! guest: RSS picks the queue, a GSO frame the guest cannot take whole is cut, a partial
//! checksum the guest cannot take is completed, and each run of frames for one queue is
//! written under one hold of its lock, published once, with one interrupt check.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use log::{trace, warn};
use vhost_user_backend::{VringState, VringT};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_USO4, VIRTIO_NET_F_GUEST_USO6,
};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use super::health::{BrokenRings, Health};
use super::rx_chain::{RxError, RxRun};
use super::split_ring::{ChainError, Mem, SplitRing, Vring, MAX_FRAME_DESCS};
use crate::device::features::Negotiated;
use crate::device::filter::{FilterRegs, Verdict};
use crate::device::rss::{Steered, Steering, SteeringCell};
use crate::logging::error_chain;
use crate::pipeline::csum_action::{ActionList, Passes};
use crate::pipeline::{gso, Admitted, BurstFrame, Frame, PortFrames, Refused};
use crate::stats::{QueueStats, Tally};
use crate::wire::checksum::complete_partial;
use crate::wire::mcast_report;
use crate::wire::virtio_net_hdr::{
    VirtioNetHdr, F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4,
};
use crate::wire::MacAddr;

/// What the receive side of a connected guest needs; swapped in whole when a driver
/// attaches.
pub(super) struct RxPath {
    pub(super) vrings: Vec<Vring>,
    pub(super) mem: Mem,
    pub(super) feat: Negotiated,
    /// The connection's broken queues: a broken RX queue takes no more frames.
    pub(super) broken: Arc<BrokenRings>,
}

/// A guest port's receive side: what every sender reads to deliver to it.
pub(super) struct RxSide {
    /// The filter registers every frame to this guest is checked against.
    pub(super) regs: Arc<FilterRegs>,
    /// Which RX queue a frame goes to (RSS), published by the control path.
    pub(super) steering: Arc<SteeringCell>,
    /// The attached driver's rings, features and memory; none while disconnected.
    pub(super) path: ArcSwapOption<RxPath>,
    /// The receive offloads in force: the acked GUEST_* bits, then whatever the driver's
    /// CTRL_GUEST_OFFLOADS set (ethtool -K in the guest).
    pub(super) offloads: AtomicU64,
    /// `--snoop`: reports from other ports are kept from this guest.
    pub(super) snooping: bool,
    /// The link as `ctl link` set it (device attachment): while it is down the guest is
    /// delivered nothing, as if no driver were attached.
    pub(super) link_up: AtomicBool,
}

/// The filter's verdict, carried from the admission to the write.
fn admitted(v: Verdict) -> Admitted {
    Admitted(match v {
        Verdict::Reject | Verdict::Accept => 0,
        Verdict::Multicast => 1,
        Verdict::FalsePositive => Admitted::HASH_FALSE_POSITIVE.0,
    })
}

/// Counts the filter's verdict on a frame admitted for queue `stats`.
#[inline]
fn count_admitted(stats: &QueueStats, note: Admitted) {
    // Most frames are unicast: one compare for them.
    if note == admitted(Verdict::Accept) {
        return;
    }
    if note == admitted(Verdict::Multicast) {
        stats.rx_mcast_accepted.inc();
    } else if note == admitted(Verdict::FalsePositive) {
        stats.rx_mcast_accepted.inc();
        stats.rx_hash_false_positive.inc();
    }
}

impl RxSide {
    /// Whether the port takes `frame`: its receive filter decides, as on the NIC, where the
    /// MAC filter precedes the parser and KeyGen, so a rejected frame costs no copy and no
    /// hash. A snooping port also refuses an IGMP or MLD report from another port, which a
    /// snooping switch passes to routers only (RFC 4541 2.1.1): an IGMPv2 or MLDv1 guest
    /// that heard another's report for its group would stay silent, and its own filter
    /// would never learn the group. Before the address, the VLAN table (a driver that
    /// negotiated CTRL_VLAN), as QEMU's virtio-net looks at the tag first. Refusals are
    /// counted on the queue the frame came in on.
    pub(super) fn admit(
        &self,
        health: &Health,
        tally: &Tally,
        flow: usize,
        frame: &[u8],
    ) -> Result<Admitted, Refused> {
        if !self.regs.vlan_allows(frame) {
            tally.at(health.id, flow).rx_vlan_filtered.inc();
            return Err(Refused::Vlan);
        }
        self.admit_address(health, tally, flow, frame)
    }

    /// [`RxSide::admit`] past the VLAN table: the address filter and the snooping rule.
    #[inline]
    fn admit_address(
        &self,
        health: &Health,
        tally: &Tally,
        flow: usize,
        frame: &[u8],
    ) -> Result<Admitted, Refused> {
        let dst = MacAddr::from_slice(frame).unwrap_or(MacAddr::BROADCAST);
        let verdict = self.regs.classify(&dst);
        let refused = if verdict == Verdict::Reject {
            Refused::Address
        } else if self.snooping && mcast_report::is_report(frame) {
            Refused::Report
        } else {
            return Ok(admitted(verdict));
        };
        tally.at(health.id, flow).rx_filtered.inc();
        Err(refused)
    }

    /// Writes what an outbox holds for the port; returns the frames (or segments)
    /// delivered.
    pub(super) fn write(
        &self,
        health: &Health,
        tally: &Tally,
        frames: &mut PortFrames<'_, '_>,
        segment: &mut Vec<u8>,
    ) -> usize {
        let guard = self.path.load();
        let Some(rx) = guard.as_ref().filter(|_| self.link_up.load(Ordering::Relaxed)) else {
            // No driver attached, or its link is down: nothing to write into.
            while let Some(f) = frames.next() {
                tally.at(health.id, f.flow).rx_dropped.inc();
            }
            return 0;
        };
        let steering = self.steering.load();
        let mem = rx.mem.memory();
        let offloads = self.offloads.load(Ordering::Relaxed);
        let mut w = RxWriter::new(health, rx, &steering, &mem, offloads);
        while let Some(f) = frames.next() {
            w.frame(tally, f, segment);
        }
        w.end_run();
        w.delivered
    }
}

impl RxSide {
    /// The burst path ([`crate::pipeline::Egress::write_plain`]): `frames`, which came in
    /// on queue `flow` with headers that ask for nothing, admitted and written as
    /// [`RxSide::admit`] and [`RxSide::write`] would, less what a plain frame never needs:
    /// RSS (one queue, no hash asked for) and header rewrites (no offload to undo or
    /// complete). The filter is asked at a destination's first frame in the run, and the
    /// run is counted and traced once. `None`, having done nothing, for a driver with
    /// several queues or the hash report (general path), or with none (counted there).
    pub(super) fn write_plain(
        &self,
        health: &Health,
        tally: &Tally,
        flow: usize,
        frames: &mut [BurstFrame<'_>],
        actions: &ActionList,
    ) -> Option<usize> {
        let guard = self.path.load();
        let rx = guard.as_ref()?;
        if rx.vrings.len() != 1 || rx.feat.hash_report() || !self.link_up.load(Ordering::Relaxed) {
            return None;
        }
        let steering = self.steering.load();
        let mem = rx.mem.memory();
        let offloads = self.offloads.load(Ordering::Relaxed);
        let guest_csum = offloads & (1 << VIRTIO_NET_F_GUEST_CSUM) != 0;
        let mut w = RxWriter::new(health, rx, &steering, &mem, offloads);
        let stats = tally.at(health.id, 0);
        // What the frames' own queue counts here: refusals and the actions' work.
        let counts = tally.counts(health.id, flow);
        let flow_stats = counts.queue;
        // The filter's verdict on the run's last destination (a snooping port asks per frame).
        let mut last: Option<(MacAddr, Option<Admitted>)> = None;
        let mut passes = Passes::default();
        // One guard around the run (docs/performance.md): a bug in a frame's actions costs
        // that frame alone. One met elsewhere is taken as one in a push, which leaves the ring
        // where nobody knows: the queue takes nothing more until reset, nor the run's rest.
        let ran = health.catch_bug_in_run("a received frame", frames, |frame, contained| {
            // The VLAN table per frame (frames to one address may differ in tag), then the address.
            if !self.regs.vlan_allows(frame.head()) {
                flow_stats.rx_vlan_filtered.inc();
                return;
            }
            let dst = MacAddr::from_slice(frame.head());
            let note = match last {
                Some((d, note)) if Some(d) == dst && !self.snooping => {
                    if note.is_none() {
                        flow_stats.rx_filtered.inc();
                    }
                    note
                }
                _ => {
                    // A snooping port looks for reports past the frame's head.
                    let seen = if self.snooping {
                        &*frame.bytes()
                    } else {
                        frame.head()
                    };
                    let note = self.admit_address(health, tally, flow, seen).ok();
                    last = dst.map(|d| (d, note));
                    note
                }
            };
            let Some(note) = note else {
                return;
            };
            let mut flags = 0;
            if !actions.is_empty() {
                contained.set(true);
                let acted = actions.apply_plain_in_run(frame, &counts, &mut passes);
                contained.set(false);
                let Some(f) = acted else {
                    return;
                };
                flags = f;
            }
            count_admitted(stats, note);
            // DATA_VALID, for a driver that takes it (VIRTIO_NET_F_GUEST_CSUM).
            w.push_plain(stats, frame, if guest_csum { flags } else { 0 });
        });
        if let Err(at) = ran {
            w.lost(stats, 0);
            let after = frames.len().saturating_sub(at + 1);
            flow_stats.rx_dropped.add(after as u64);
        }
        stats.rx_packets.add(w.delivered as u64);
        stats.rx_bytes.add(w.plain_bytes);
        w.end_run();
        actions.count_passes(&counts, passes);
        trace!("port {}: rx {} frames of queue {flow}", health.id, w.delivered);
        Some(w.delivered)
    }
}

/// The queue being written: its lock held, its rings found.
struct Held<'v, 'm> {
    q: usize,
    state: std::sync::RwLockWriteGuard<'v, VringState<Mem>>,
    ring: SplitRing<'m, GuestMemoryMmap>,
}

/// The frames of one outbox for one guest port, written through one snapshot of its RX
/// path and its RSS steering (each `ArcSwap` load is a full barrier, arc-swap 1.9).
struct RxWriter<'w, 'm> {
    health: &'w Health,
    rx: &'w RxPath,
    steering: &'w Steering,
    mem: &'m GuestMemoryMmap,
    /// The receive offloads in force (GUEST_* bits).
    offloads: u64,
    /// Whether the driver wants each frame's hash in its header (HASH_REPORT).
    hash_report: bool,
    ready: QueueReady,
    /// The queue being written, if any.
    held: Option<Held<'w, 'm>>,
    /// The run of frames into that queue (kept from run to run: it holds room for a
    /// frame's worst case, which is never moved or zeroed).
    run: RxRun,
    delivered: usize,
    plain_bytes: u64,
}

impl<'w, 'm> RxWriter<'w, 'm> {
    /// A writer into `rx`, whose receive offloads are `offloads`, through one snapshot of
    /// its steering and memory.
    fn new(
        health: &'w Health,
        rx: &'w RxPath,
        steering: &'w Steering,
        mem: &'m GuestMemoryMmap,
        offloads: u64,
    ) -> Self {
        RxWriter {
            health,
            rx,
            steering,
            mem,
            offloads,
            hash_report: rx.feat.hash_report(),
            ready: QueueReady::default(),
            held: None,
            run: RxRun::new(rx.feat.hdr_len(), rx.feat.mrg_rxbuf()),
            delivered: 0,
            plain_bytes: 0,
        }
    }

    /// One frame: its queue (RSS), its filter counters, then written whole or cut.
    fn frame(&mut self, tally: &Tally, f: Frame<'_>, segment: &mut Vec<u8>) {
        let Frame {
            admitted: note,
            mut pkt,
            ..
        } = f;
        // RSS: the flow hash picks the queue (one flow, one queue); hashing is skipped
        // when there is one queue and nobody wants the hash reported.
        let queues = self.rx.vrings.len();
        let steered =
            (queues > 1 || self.hash_report).then(|| self.steering.steer_by(&pkt.layers(), pkt.frame));
        let mut q = steered.map_or(0, |s| s.queue % queues);
        // Queue 0 is the fallback anyway: its ring's state is checked once, when written.
        if q != 0 && !self.ready.is_ready(q, || queue_usable(&self.rx.vrings[q])) {
            q = 0;
        }
        let stats = tally.at(self.health.id, q);
        count_admitted(stats, note);
        let gso_type = pkt.hdr.gso_type;
        if gso_type == GSO_NONE || takes_gso(self.offloads, gso_type) {
            self.push(stats, q, steered, &mut pkt.hdr, pkt.frame);
            return;
        }
        // The guest cannot take this GSO frame whole: cut it here, once.
        let res = gso::segment(&pkt.hdr, pkt.frame, segment, |h, seg| {
            let mut h = *h;
            self.push(stats, q, steered, &mut h, seg);
        });
        match res {
            Ok(_) => stats.rx_gso_segmented.inc(),
            Err(e) => {
                stats.rx_errors.inc();
                if self.health.may_warn() {
                    warn!("port {}: dropping GSO frame: {}", self.health.id, error_chain(&e));
                }
            }
        }
    }

    /// Writes one frame (or segment) into RX queue `q`.
    fn push(
        &mut self,
        stats: &QueueStats,
        q: usize,
        steered: Option<Steered>,
        hdr: &mut VirtioNetHdr,
        frame: &mut [u8],
    ) {
        if !self.start_run(q) {
            stats.rx_dropped.inc();
            return;
        }
        let Some((out, completed)) = self.guest_header(stats, steered, hdr, frame) else {
            return;
        };
        let Some(held) = self.held.as_mut() else { return };
        let (queue, ring, run) = (held.state.get_queue_mut(), &held.ring, &mut self.run);
        let res = self
            .health
            .catch_bug("a received frame", || run.push(queue, ring, &out, frame));
        self.pushed(stats, q, res, frame.len(), completed);
    }

    /// [`RxWriter::push`] for a frame whose header asks for nothing, into queue 0, its
    /// header's `flags` as given (DATA_VALID or none), without [`Health::catch_bug`]: for a
    /// caller that guards its whole run.
    fn push_plain(&mut self, stats: &QueueStats, frame: &mut BurstFrame<'_>, flags: u8) {
        if !self.start_run(0) {
            stats.rx_dropped.inc();
            return;
        }
        let Some(held) = self.held.as_mut() else { return };
        let (queue, ring, run) = (held.state.get_queue_mut(), &held.ring, &mut self.run);
        // Unguarded, counted and traced: the caller does each once for its whole run.
        match run.push_plain(queue, ring, &mut *frame, flags) {
            Ok(_) => {
                self.delivered += 1;
                self.plain_bytes += frame.len() as u64;
            }
            Err(e) => self.refused(stats, 0, e),
        }
    }

    /// Counts what became of a frame of `len` bytes written into queue `q` (`None`: a bug
    /// was met in the write).
    #[inline(always)]
    fn pushed(
        &mut self,
        stats: &QueueStats,
        q: usize,
        res: Option<Result<u16, RxError>>,
        len: usize,
        completed: bool,
    ) {
        match res {
            Some(Ok(_)) => {
                stats.rx_packets.inc();
                stats.rx_bytes.add(len as u64);
                if completed {
                    stats.rx_csum_completed.inc();
                }
                self.delivered += 1;
                trace!("port {}: rx {len} bytes on queue {q}", self.health.id);
            }
            Some(Err(e)) => self.refused(stats, q, e),
            None => self.lost(stats, q),
        }
    }

    /// A bug met while writing into queue `q`: where its ring was left is unknown, so
    /// nothing more goes into it (its lock is let go unpoisoned), and the frame is an error.
    fn lost(&mut self, stats: &QueueStats, q: usize) {
        stats.rx_errors.inc();
        self.held = None;
        if self.rx.broken.set(2 * q) {
            self.health.stats.rings_broken.inc();
        }
    }

    /// Counts a frame the ring did not take, and acts on a broken ring.
    fn refused(&mut self, stats: &QueueStats, q: usize, e: RxError) {
        let health = self.health;
        match e {
            RxError::NoBuffers | RxError::TooManyBuffers => stats.rx_dropped.inc(),
            RxError::Chain(ChainError::TooManyDescriptors) => {
                stats.rx_errors.inc();
                stats.rx_desc_limit.inc();
                if health.may_warn() {
                    warn!(
                        "port {}: rx queue {q}: a frame's buffers took more than {MAX_FRAME_DESCS} descriptors; \
                         those chains are returned empty",
                        health.id
                    );
                }
            }
            RxError::Ring(e) => {
                stats.rx_errors.inc();
                // What was written before is the driver's, if the index can still be stored.
                self.end_run();
                health.ring_broken(&self.rx.broken, 2 * q, &e);
            }
            e => {
                stats.rx_errors.inc();
                if health.may_warn() {
                    warn!("port {}: rx queue {q}: {}", health.id, error_chain(&e));
                }
            }
        }
    }

    /// Holds queue `q` for writing, ending the run on another queue first; false if `q`
    /// cannot take frames (broken, stopped).
    #[inline]
    fn start_run(&mut self, q: usize) -> bool {
        self.held.as_ref().is_some_and(|h| h.q == q) || self.hold(q)
    }

    /// [`RxWriter::start_run`] for a queue not held yet: once per run.
    fn hold(&mut self, q: usize) -> bool {
        self.end_run();
        let rx = self.rx;
        let Some(vring) = rx.vrings.get(q) else {
            return false;
        };
        if rx.broken.is(2 * q) {
            return false;
        }
        let state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return false;
        }
        let Some(ring) = SplitRing::new(state.get_queue(), self.mem) else {
            return false;
        };
        self.held = Some(Held { q, state, ring });
        self.run.restart();
        true
    }

    /// Publishes the run's frames, lets the queue go, and interrupts the driver if it
    /// wants that.
    fn end_run(&mut self) {
        let Some(Held { q, state, ring }) = self.held.take() else {
            return;
        };
        let wants = self.run.finish(state.get_queue(), &ring);
        drop(state);
        let health = self.health;
        match wants {
            Ok(false) => {}
            Ok(true) => health.signal(&self.rx.vrings[q], 2 * q),
            Err(e) => health.ring_broken(&self.rx.broken, 2 * q, &e),
        }
    }

    /// The header the guest sees for `hdr`'s frame, and whether its partial checksum was
    /// completed here (in place; NEEDS_CSUM is cleared in `hdr`). `None`: dropped (bad
    /// checksum offsets), counted.
    ///
    /// Always inlined: returned through memory, the header was stored field by field and
    /// loaded back whole, and the load had to wait for the stores.
    #[inline(always)]
    fn guest_header(
        &self,
        stats: &QueueStats,
        steered: Option<Steered>,
        hdr: &mut VirtioNetHdr,
        frame: &mut [u8],
    ) -> Option<(VirtioNetHdr, bool)> {
        let guest_csum = self.offloads & (1 << VIRTIO_NET_F_GUEST_CSUM) != 0;
        let completed = hdr.needs_csum() && !guest_csum;
        if completed {
            if let Err(e) = complete_partial(frame, hdr.csum_start.into(), hdr.csum_offset.into()) {
                stats.rx_errors.inc();
                if self.health.may_warn() {
                    warn!(
                        "port {}: dropping frame with bad checksum offsets: {e}",
                        self.health.id
                    );
                }
                return None;
            }
            hdr.flags &= !F_NEEDS_CSUM;
        }
        let mut out = *hdr;
        if !guest_csum {
            // Without GUEST_CSUM the header flags must be zero (virtio 1.2, 5.1.6.4.1):
            // DATA_VALID from an action or the host's tap is not this guest's to see.
            out.flags = 0;
        }
        if let (true, Some(s)) = (self.hash_report, steered) {
            out.hash_value = s.hash;
            out.hash_report = s.report;
        }
        Some((out, completed))
    }
}

impl Drop for RxWriter<'_, '_> {
    fn drop(&mut self) {
        self.end_run();
    }
}

/// Whether a guest with these receive offloads takes a GSO frame of this type whole.
fn takes_gso(offloads: u64, gso_type: u8) -> bool {
    let has = |b: u32| offloads & (1 << b) != 0;
    let ecn_ok = gso_type & GSO_ECN == 0 || has(VIRTIO_NET_F_GUEST_ECN);
    ecn_ok
        && match gso_type & !GSO_ECN {
            GSO_TCPV4 => has(VIRTIO_NET_F_GUEST_TSO4),
            GSO_TCPV6 => has(VIRTIO_NET_F_GUEST_TSO6),
            GSO_UDP_L4 => has(VIRTIO_NET_F_GUEST_USO4) && has(VIRTIO_NET_F_GUEST_USO6),
            _ => false,
        }
}

/// Whether the frontend has the ring started.
pub(super) fn queue_usable(v: &Vring) -> bool {
    let s = v.get_ref();
    s.is_enabled() && s.get_queue().ready()
}

/// Which RX queues RSS may pick, each looked at once per write: a look takes the ring's
/// lock, two locked read-modify-writes, each a full barrier. A queue the frontend stops
/// meanwhile is found stopped when its frames are written, and they are counted dropped
/// there.
#[derive(Default)]
struct QueueReady {
    looked: Cell<u64>,
    ready: Cell<u64>,
}

impl QueueReady {
    /// Whether RX queue `q` is started, as `look` found it at the first question.
    fn is_ready(&self, q: usize, look: impl FnOnce() -> bool) -> bool {
        // Past 64 queues, looked at each time.
        let Some(bit) = u32::try_from(q).ok().and_then(|q| 1u64.checked_shl(q)) else {
            return look();
        };
        if self.looked.get() & bit == 0 {
            self.looked.set(self.looked.get() | bit);
            if look() {
                self.ready.set(self.ready.get() | bit);
            }
        }
        self.ready.get() & bit != 0
    }
}

#[cfg(test)]
mod tests {
    use super::QueueReady;
    use std::cell::Cell;

    #[test]
    fn each_queue_is_looked_at_once_per_write() {
        let looks = Cell::new(0);
        let look = |answer: bool| {
            let looks = &looks;
            move || {
                looks.set(looks.get() + 1);
                answer
            }
        };
        let ready = QueueReady::default();
        assert!(ready.is_ready(1, look(true)));
        assert!(!ready.is_ready(3, look(false)));
        // The write keeps its first answers, whatever a look would say now.
        assert!(ready.is_ready(1, look(false)));
        assert!(!ready.is_ready(3, look(true)));
        assert_eq!(looks.get(), 2);
        // Queues past 64 have no bit: looked at every time.
        assert!(ready.is_ready(64, look(true)));
        assert!(!ready.is_ready(64, look(false)));
        assert_eq!(looks.get(), 4);
        // The next write looks again.
        let ready = QueueReady::default();
        assert!(!ready.is_ready(1, look(false)));
        assert_eq!(looks.get(), 5);
    }
}
