//! The RX side of a guest port: a frame the switch sends to this guest, through the
//! filter and RSS, completed or segmented for the receive offloads the guest has, written
//! into its receive ring: staged by the sending thread and written per burst (stage.rs),
//! or at once for the snoop querier.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

use log::{trace, warn};
use vhost_user_backend::VringT;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_USO4, VIRTIO_NET_F_GUEST_USO6,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemory};

use super::queue::{
    publish_used, push_rx_unpublished, wants_interrupt_after, ChainError, RingError, RxBurst, RxError,
    MAX_FRAME_DESCS,
};
use super::{error_chain, GuestPort, RxPath, Vring, UNCHECKED};
use crate::device::filter::Verdict;
use crate::device::rss::{Steered, Steering};
use crate::pipeline::gso;
use crate::pipeline::{Egress, Packet};
use crate::stats::{QueueStats, Tally};
use crate::wire::checksum::complete_partial;
use crate::wire::mcast_report;
use crate::wire::virtio_net_hdr::{
    VirtioNetHdr, F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4,
};
use crate::wire::MacAddr;

impl Egress for GuestPort {
    fn send(&self, tally: &Tally, flow: usize, pkt: &mut Packet<'_>, segment: &mut Vec<u8>) {
        self.stage(tally, flow, pkt, segment);
    }

    fn flush(&self, tally: &Tally) {
        self.drain(tally);
        self.flush_rx();
    }
}

impl GuestPort {
    /// An IGMP or MLD report from another port, which a snooping switch passes to routers
    /// only (RFC 4541 2.1.1): an IGMPv2 or MLDv1 guest that heard another's report for its
    /// group would stay silent, and its own filter would never learn the group. Counted.
    pub(super) fn is_peer_report(&self, tally: &Tally, flow: usize, frame: &[u8]) -> bool {
        let is = self.snooping && mcast_report::is_report(frame);
        if is {
            tally.at(self.id, flow).rx_filtered.inc();
        }
        is
    }

    /// Writes one frame into the guest's ring now (the snoop querier's path), telling
    /// whether the frame (or every segment of it) was written.
    pub(super) fn deliver(
        &self,
        tally: &Tally,
        flow: usize,
        pkt: &mut Packet<'_>,
        segment: &mut Vec<u8>,
    ) -> bool {
        if self.is_peer_report(tally, flow, pkt.frame) {
            return false;
        }
        let guard = self.rx.load();
        let Some(rx) = guard.as_ref() else {
            tally.at(self.id, flow).rx_dropped.inc();
            return false;
        };
        let steering = self.steering.load();
        let ready = QueueReady::default();
        let path = RxSnapshot {
            rx,
            steering: &steering,
            ready: &ready,
        };
        self.route(path, tally, flow, pkt, segment, &mut |d, hdr, frame| {
            self.push_frame(d, hdr, frame)
        })
    }

    /// The filter, RSS and receive offloads for one frame to this guest, then `write` for
    /// the frame (or each of its segments), which tells whether it was taken.
    pub(super) fn route(
        &self,
        path: RxSnapshot<'_>,
        tally: &Tally,
        flow: usize,
        pkt: &mut Packet<'_>,
        segment: &mut Vec<u8>,
        write: &mut dyn FnMut(&Dest<'_>, &mut VirtioNetHdr, &mut [u8]) -> bool,
    ) -> bool {
        let RxSnapshot { rx, steering, ready } = path;
        // The MAC's filter decides first, as on the NIC, where it precedes the parser and
        // KeyGen: a rejected frame costs no hash and no queue lookup, and is counted on the
        // queue of the flow it came with.
        let dst = MacAddr::from_slice(pkt.frame).unwrap_or(MacAddr::BROADCAST);
        let verdict = self.regs.classify(&dst);
        if verdict == Verdict::Reject {
            tally.at(self.id, flow).rx_filtered.inc();
            return false;
        }
        // RSS: the flow hash picks the queue (one flow, one queue); hashing is skipped when
        // there is one queue and nobody wants the hash reported.
        let hash_report = rx.feat.hash_report();
        let steered =
            (rx.vrings.len() > 1 || hash_report).then(|| steering.steer_by(&pkt.layout(), pkt.frame));
        let mut q = steered.map_or(0, |s| s.queue % rx.vrings.len());
        // Queue 0 is the fallback anyway: its ring's state is checked once, when written.
        if q != 0 && !ready.is_ready(q, || queue_usable(&rx.vrings[q])) {
            q = 0;
        }
        let stats = tally.at(self.id, q);
        match verdict {
            Verdict::Multicast => stats.rx_mcast_accepted.inc(),
            Verdict::FalsePositive => {
                stats.rx_mcast_accepted.inc();
                stats.rx_hash_false_positive.inc();
            }
            Verdict::Accept | Verdict::Reject => {}
        }
        let offloads = self.guest_offloads.load(Ordering::Relaxed);
        let segments = pkt.hdr.gso_type != GSO_NONE && !takes_gso(offloads, pkt.hdr.gso_type);
        let dest = Dest {
            rx,
            q,
            offloads,
            steered,
            stats,
            whole: !segments,
        };
        if segments {
            // The guest cannot take this GSO frame whole: segment it here, once.
            let mut all = true;
            let res = gso::segment(&pkt.hdr, pkt.frame, segment, |h, seg| {
                let mut h = *h;
                all &= write(&dest, &mut h, seg);
            });
            match res {
                Ok(_) => stats.rx_gso_segmented.inc(),
                Err(e) => {
                    stats.rx_errors.inc();
                    if self.warn.allow() {
                        warn!("port {}: dropping GSO frame: {}", self.id, error_chain(&e));
                    }
                    return false;
                }
            }
            return all;
        }
        write(&dest, &mut pkt.hdr, pkt.frame)
    }
}

/// What a frame for this guest is routed by: the connection's RX path and the port's RSS
/// steering, each a snapshot its caller took (the stage takes them once per burst: an
/// `ArcSwap` load is a full barrier, arc-swap 1.9), and which of its RX queues were found
/// started during that burst.
#[derive(Clone, Copy)]
pub(super) struct RxSnapshot<'a> {
    pub(super) rx: &'a RxPath,
    pub(super) steering: &'a Steering,
    pub(super) ready: &'a QueueReady,
}

/// Which RX queues RSS may pick, each looked at once per burst: a look takes the ring's
/// lock, two locked read-modify-writes, each a full barrier that waits for the worker's
/// stores into the frontend's lines (its TX used entries). A queue the frontend stops
/// during the burst is found stopped when its frames are written, and they are counted
/// dropped there, as they were when it stopped between a frame's look and its write.
#[derive(Default)]
pub(super) struct QueueReady {
    looked: Cell<u64>,
    ready: Cell<u64>,
}

impl QueueReady {
    /// Whether RX queue `q` is started, as `look` found it at the burst's first question.
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

/// Where one frame for this guest goes: the RX path, the queue RSS chose, the receive
/// offloads in force, the hash, and the counters (the delivering worker's).
#[derive(Clone, Copy)]
pub(super) struct Dest<'a> {
    rx: &'a RxPath,
    pub(super) q: usize,
    offloads: u64,
    steered: Option<Steered>,
    stats: &'a QueueStats,
    /// `write` gets the packet's own frame, not one of its GSO segments (built one after
    /// the other in the sender's segment buffer).
    pub(super) whole: bool,
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

impl GuestPort {
    /// Writes one frame into RX queue `q`: completes a partial checksum the guest cannot
    /// take (in place, clearing NEEDS_CSUM in `hdr` so later destinations of a flooded
    /// frame see it complete), sets the header the guest may see, counts, signals.
    fn push_frame(&self, d: &Dest<'_>, hdr: &mut VirtioNetHdr, frame: &mut [u8]) -> bool {
        let Dest { rx, q, stats, .. } = *d;
        let mem = rx.mem.memory();
        let vring = &rx.vrings[q];
        let index = 2 * q;
        if rx.broken.is(index) {
            stats.rx_dropped.inc();
            return false;
        }
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            stats.rx_dropped.inc();
            return false;
        }
        let Some((out, completed)) = self.guest_header(d, hdr, frame) else {
            return false;
        };
        let Some(res) = self.contain("a received frame", || {
            // Published with the burst's interrupt check (`flush_rx`).
            let mut burst = RxBurst::new(rx.feat.hdr_len(), rx.feat.mrg_rxbuf());
            push_rx_unpublished(state.get_queue_mut(), &*mem, &mut burst, &out, frame)
        }) else {
            // Where the ring was left is unknown: nothing more goes into it.
            stats.rx_errors.inc();
            drop(state);
            if rx.broken.set(index) {
                self.conn_stats.rings_broken.inc();
            }
            return false;
        };
        let delivered = match self.pushed(stats, q, res.map(drop), completed, frame.len()) {
            Pushed::Delivered => true,
            Pushed::Returned => false,
            Pushed::Dropped => return false,
            Pushed::Broken(e) => {
                drop(state);
                self.ring_broken(&rx.broken, index, &e);
                return false;
            }
        };
        drop(state);
        // The interrupt waits for the flush at the end of the sender's burst. Read first:
        // the bit is usually set already, and a load keeps the line shared between workers.
        let bit = 1u64 << q;
        if rx.pending.load(Ordering::Relaxed) & bit == 0 {
            rx.pending.fetch_or(bit, Ordering::Release);
        }
        delivered
    }

    /// Publishes the used index of every RX queue written to since the last flush, and
    /// interrupts its driver if it wants one: one store and one check per queue and burst.
    /// `checked` holds the used index at the last check, so EVENT_IDX's `used_event` is
    /// weighed against the whole burst.
    pub(super) fn flush_rx(&self) {
        let guard = self.rx.load();
        let Some(rx) = guard.as_ref() else { return };
        if rx.pending.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut bits = rx.pending.swap(0, Ordering::AcqRel);
        let mem = rx.mem.memory();
        while bits != 0 {
            let q = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let Some(vring) = rx.vrings.get(q) else { continue };
            let wants = {
                let st = vring.get_mut();
                let queue = st.get_queue();
                // Published even if the ring was disabled since: what was written is the
                // driver's. A reset queue has no used ring left to write to. (Frames the
                // stage writes out are published as they are written, in `write_run`.)
                if let Err(e) = publish_used(queue, &*mem) {
                    drop(st);
                    self.ring_broken(&rx.broken, 2 * q, &e);
                    continue;
                }
                if !st.is_enabled() || !queue.ready() {
                    continue; // Stopped since: its next start begins afresh.
                }
                check_interrupt(queue, &*mem, &rx.checked[q])
            };
            self.interrupt(rx, q, vring, wants);
        }
    }

    /// The header this guest sees for `hdr`'s frame, and whether its partial checksum was
    /// completed here: in place, clearing NEEDS_CSUM in `hdr` so later destinations of a
    /// flooded frame see it complete. `None`: dropped (bad checksum offsets), counted.
    ///
    /// Always inlined (`#[inline]` was not enough, with three callers): returned through
    /// memory, the header was stored field by field and loaded back whole, and the load
    /// waited for the stores (a failed store-to-load forward, half of the staging
    /// closure's samples in a profile of the loop).
    #[inline(always)]
    pub(super) fn guest_header(
        &self,
        d: &Dest<'_>,
        hdr: &mut VirtioNetHdr,
        frame: &mut [u8],
    ) -> Option<(VirtioNetHdr, bool)> {
        let guest_csum = d.offloads & (1 << VIRTIO_NET_F_GUEST_CSUM) != 0;
        let completed = hdr.needs_csum() && !guest_csum;
        if completed {
            if let Err(e) = complete_partial(frame, hdr.csum_start.into(), hdr.csum_offset.into()) {
                d.stats.rx_errors.inc();
                if self.warn.allow() {
                    warn!("port {}: dropping frame with bad checksum offsets: {e}", self.id);
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
        if let (true, Some(s)) = (d.rx.feat.hash_report(), d.steered) {
            out.hash_value = s.hash;
            out.hash_report = s.report;
        }
        Some((out, completed))
    }

    /// Counts what one push did, and says what is left to do.
    pub(super) fn pushed(
        &self,
        stats: &QueueStats,
        q: usize,
        res: Result<(), RxError>,
        completed: bool,
        len: usize,
    ) -> Pushed {
        match res {
            Ok(()) => {
                stats.rx_packets.inc();
                stats.rx_bytes.add(len as u64);
                if completed {
                    stats.rx_csum_completed.inc();
                }
                trace!("port {}: rx {len} bytes on queue {q}", self.id);
                Pushed::Delivered
            }
            Err(RxError::NoBuffers) | Err(RxError::TooManyBuffers) => {
                stats.rx_dropped.inc();
                Pushed::Dropped
            }
            Err(RxError::Chain(ChainError::TooManyDescriptors)) => {
                stats.rx_errors.inc();
                stats.rx_desc_limit.inc();
                if self.warn.allow() {
                    warn!(
                        "port {}: rx queue {q}: a frame's buffers took more than {MAX_FRAME_DESCS} descriptors; \
                         those chains are returned empty",
                        self.id
                    );
                }
                Pushed::Returned
            }
            Err(RxError::Ring(e)) => {
                stats.rx_errors.inc();
                Pushed::Broken(e)
            }
            Err(e) => {
                stats.rx_errors.inc();
                if self.warn.allow() {
                    warn!("port {}: rx queue {q}: {}", self.id, error_chain(&e));
                }
                Pushed::Returned
            }
        }
    }
}

impl GuestPort {
    /// Acts on an interrupt check of RX queue `q`: signals the driver, or marks the ring
    /// broken if the check could not read it.
    pub(super) fn interrupt(&self, rx: &RxPath, q: usize, vring: &Vring, wants: Result<bool, RingError>) {
        match wants {
            Ok(false) => {}
            Ok(true) => {
                // Non-blocking (memcheck.rs): a full counter loses only this interrupt.
                if let Err(e) = vring.signal_used_queue() {
                    if self.warn.allow() {
                        warn!("port {}: signalling rx queue {q}: {e}", self.id);
                    }
                }
            }
            Err(e) => self.ring_broken(&rx.broken, 2 * q, &e),
        }
    }
}

/// Publishes the used index, then [`check_interrupt`].
pub(super) fn publish_and_check<M: GuestMemory>(
    queue: &Queue,
    mem: &M,
    mark: &AtomicU32,
) -> Result<bool, RingError> {
    publish_used(queue, mem)?;
    check_interrupt(queue, mem, mark)
}

/// Whether the driver wants an interrupt for the entries published since the last check,
/// whose used index `mark` holds (written under the queue's lock).
fn check_interrupt<M: GuestMemory>(queue: &Queue, mem: &M, mark: &AtomicU32) -> Result<bool, RingError> {
    let last = mark.load(Ordering::Relaxed);
    mark.store(u32::from(queue.next_used()), Ordering::Relaxed);
    let added = if last == UNCHECKED {
        u16::MAX
    } else {
        queue.next_used().wrapping_sub(last as u16)
    };
    wants_interrupt_after(queue, mem, added)
}

/// What a push into the receive ring left to do.
pub(super) enum Pushed {
    /// Written: the guest may want an interrupt.
    Delivered,
    /// Chains were returned empty (refused): the guest may want an interrupt for them.
    Returned,
    /// No buffers: nothing was returned, no interrupt.
    Dropped,
    /// The ring is broken: nothing more goes into it.
    Broken(RingError),
}

/// Whether the frontend has the ring started.
pub(super) fn queue_usable(v: &Vring) -> bool {
    let s = v.get_ref();
    s.is_enabled() && s.get_queue().ready()
}

#[cfg(test)]
mod tests {
    use super::QueueReady;
    use std::cell::Cell;

    #[test]
    fn each_queue_is_looked_at_once_per_burst() {
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
        // The burst keeps its first answers, whatever a look would say now.
        assert!(ready.is_ready(1, look(false)));
        assert!(!ready.is_ready(3, look(true)));
        assert_eq!(looks.get(), 2);
        // Queues past 64 have no bit: looked at every time.
        assert!(ready.is_ready(64, look(true)));
        assert!(!ready.is_ready(64, look(false)));
        assert_eq!(looks.get(), 4);
        // The next burst looks again.
        let ready = QueueReady::default();
        assert!(!ready.is_ready(1, look(false)));
        assert_eq!(looks.get(), 5);
    }
}
