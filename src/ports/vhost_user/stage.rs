//! The frames each thread hands to guest ports during a burst, staged and written out one
//! burst per RX queue at the flush.

use std::cell::RefCell;
use std::sync::Arc;

use log::debug;
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use super::queue::{publish_used, push_rx_ring, RxBurst};
use super::ring::SplitRing;
use super::rx::{publish_and_check, Pushed, QueueReady, RxSnapshot};
use super::{error_chain, GuestPort, RxPath};
use crate::device::rss::Steering;
use crate::pipeline::switch::FLUSH_BATCH;
use crate::pipeline::Packet;
use crate::stats::Tally;
use crate::wire::virtio_net_hdr::VirtioNetHdr;

/// The frames one thread handed to guest ports since its last flush, copied, per port.
///
/// Written out one burst per RX queue at the flush: one snapshot of the RX path per burst,
/// and per queue one lock, one look-up of its rings and one avail-index read, one store of
/// the used index and one interrupt check. Written frame by frame, each frame took the
/// ring's lock and two `ArcSwap` snapshots, and each of those locked instructions waited
/// for the previous frame's stores to reach lines the frontend's CPU holds, so no two
/// frames' stores overlapped (docs/benchmarks.md, "PVP loop"). A frame is copied into the
/// stage unless its sender pinned it ([`Packet::pinned`]: a vhost-user worker's TX batch,
/// for the frame's last destination): the copy keeps each destination's frame its own, as
/// the last destination of a flood may rewrite the frame in place (egress actions,
/// checksum completion) before the earlier ones are written, and the sender's buffers for
/// segments and router replies are reused frame by frame.
#[derive(Default)]
struct Stage {
    ports: Vec<PortStage>,
}

#[derive(Default)]
struct PortStage {
    /// `GuestPort::uid` of the port the frames go to.
    port: u64,
    /// The port's RX path and RSS steering as the burst's first frame found them; `None`
    /// once written out (or with no connection).
    snap: Option<(Arc<RxPath>, Arc<Steering>)>,
    /// Its RX queues found started during the burst, looked at once each.
    ready: QueueReady,
    bytes: Vec<u8>,
    frames: Vec<Staged>,
}

/// One staged frame: its RX queue, the header its guest sees, where its bytes are.
#[derive(Clone, Copy)]
struct Staged {
    q: usize,
    hdr: VirtioNetHdr,
    at: At,
    len: usize,
    /// Its partial checksum was completed here (counted once it is written).
    completed: bool,
}

/// Where a staged frame's bytes are.
#[derive(Clone, Copy)]
enum At {
    /// Copied into the port stage's `bytes`, from this offset.
    Copy(usize),
    /// Where the sender pinned them ([`Packet::pinned`]).
    Pinned(*const u8),
}

impl Staged {
    /// The frame's bytes, from the port stage's `bytes` or where they were pinned.
    fn frame<'b>(&self, bytes: &'b [u8]) -> &'b [u8] {
        match self.at {
            At::Copy(start) => &bytes[start..start + self.len],
            // SAFETY: `Packet::pinned`'s contract keeps a pinned frame's bytes allocated and
            // unwritten until the sending thread's next `Switch::flush` returns. The stage
            // is the sending thread's own (thread-local), and that flush writes out every
            // port's stage (`Egress::flush`, `drain`), so a pinned frame is read here at the
            // latest during it; `write_out` clears the stage after writing it.
            At::Pinned(ptr) => unsafe { std::slice::from_raw_parts(ptr, self.len) },
        }
    }
}

/// Unpinned frames longer than this are not staged but written at once (after the port's
/// staged ones): for them the copy into the stage costs more than the per-frame lock and
/// snapshots it saves (docs/benchmarks.md, "PVP loop"). A pinned frame is staged whatever
/// its length: it costs no copy.
const STAGE_FRAME_MAX: usize = 512;

/// Bytes staged for one port before they are written out without waiting for the flush:
/// bounds what a burst of floods of large frames holds per thread and port.
const STAGE_BYTES: usize = 64 * 1024;

thread_local! {
    static STAGE: RefCell<Stage> = RefCell::new(Stage::default());
}

impl Stage {
    /// The stage of port `uid`, reusing one that is written out.
    fn port(&mut self, uid: u64) -> &mut PortStage {
        let i = match self.ports.iter().position(|p| p.port == uid) {
            Some(i) => i,
            None => match self.ports.iter().position(|p| p.snap.is_none()) {
                Some(i) => {
                    self.ports[i].port = uid;
                    i
                }
                None => {
                    self.ports.push(PortStage {
                        port: uid,
                        ..PortStage::default()
                    });
                    self.ports.len() - 1
                }
            },
        };
        &mut self.ports[i]
    }
}

impl GuestPort {
    /// `Egress::send`: the frame goes through the filter and RSS now, and is staged in this
    /// thread's stage (copied, or by pointer if pinned), written into the ring at the flush
    /// (or once the stage is full).
    pub(super) fn stage(&self, tally: &Tally, flow: usize, pkt: &mut Packet<'_>, segment: &mut Vec<u8>) {
        if self.is_peer_report(tally, flow, pkt.frame) {
            return;
        }
        let pinned = pkt.is_pinned();
        if !pinned && pkt.frame.len() > STAGE_FRAME_MAX {
            // Written at once, after what is staged for this port (the order is kept).
            self.drain(tally);
            self.deliver(tally, flow, pkt, segment);
            return;
        }
        STAGE.with(|cell| {
            // Nothing below sends back into a port, so the stage is never borrowed twice;
            // if it were, the frame would be written directly.
            let Ok(mut stage) = cell.try_borrow_mut() else {
                self.deliver(tally, flow, pkt, segment);
                return;
            };
            let ps = stage.port(self.uid);
            if ps.snap.is_none() {
                ps.snap = self.rx.load_full().map(|rx| (rx, self.steering.load_full()));
                ps.ready = QueueReady::default();
            }
            let PortStage {
                snap,
                ready,
                bytes,
                frames,
                ..
            } = &mut *ps;
            let Some((rx, steering)) = snap.as_ref() else {
                tally.at(self.id, flow).rx_dropped.inc();
                return;
            };
            let path = RxSnapshot { rx, steering, ready };
            self.route(path, tally, flow, pkt, segment, &mut |d, hdr, frame| {
                // Pinned, to its last destination: held where it lies and completed there.
                // Otherwise copied and completed on the copy, the caller's frame and
                // header left as they were (a flood's later ports still get them).
                let copied = !(pinned && d.whole);
                let start = bytes.len();
                let held: &mut [u8] = if copied {
                    bytes.extend_from_slice(frame);
                    &mut bytes[start..]
                } else {
                    frame
                };
                let mut h = *hdr;
                let Some((out, completed)) = self.guest_header(d, &mut h, held) else {
                    bytes.truncate(start);
                    return false;
                };
                frames.push(Staged {
                    q: d.q,
                    hdr: out,
                    // The pointer is taken after the completion wrote through `held`.
                    at: if copied {
                        At::Copy(start)
                    } else {
                        At::Pinned(held.as_ptr())
                    },
                    len: held.len(),
                    completed,
                });
                true
            });
            if ps.bytes.len() >= STAGE_BYTES || ps.frames.len() >= FLUSH_BATCH {
                self.write_out(ps, tally);
            }
        });
    }

    /// Writes out what this thread staged for this port.
    pub(super) fn drain(&self, tally: &Tally) {
        STAGE.with(|cell| {
            if let Ok(mut stage) = cell.try_borrow_mut() {
                if let Some(ps) = stage.ports.iter_mut().find(|p| p.port == self.uid) {
                    self.write_out(ps, tally);
                }
            }
        });
    }

    /// Writes a port's staged frames into their RX queues, one run of consecutive frames
    /// for the same queue at a time, in the order they were staged.
    fn write_out(&self, ps: &mut PortStage, tally: &Tally) {
        if let Some((rx, _)) = ps.snap.take() {
            // The connection the frames were staged for must still be the port's: after a
            // disconnect its rings may be served again by the next one, from the same guest
            // memory. One snapshot per port and flush.
            let current = self.rx.load();
            if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &rx)) {
                for f in &ps.frames {
                    tally.at(self.id, f.q).rx_dropped.inc();
                }
                ps.frames.clear();
                ps.bytes.clear();
                return;
            }
            let mem = rx.mem.memory();
            let mut i = 0;
            while i < ps.frames.len() {
                let q = ps.frames[i].q;
                let n = ps.frames[i..].iter().take_while(|f| f.q == q).count();
                self.write_run(&rx, &mem, tally, &ps.frames[i..i + n], &ps.bytes);
                i += n;
            }
        }
        ps.frames.clear();
        ps.bytes.clear();
    }

    /// Writes `frames`, all for one RX queue, under one hold of its lock: one look-up of
    /// its rings, then one store of the used index and one interrupt check for all.
    fn write_run(&self, rx: &RxPath, mem: &GuestMemoryMmap, tally: &Tally, frames: &[Staged], bytes: &[u8]) {
        let q = frames[0].q;
        let stats = tally.at(self.id, q);
        let index = 2 * q;
        let dropped = |n: usize| stats.rx_dropped.add(n as u64);
        // RSS picked `q` among these queues: always there.
        let Some(vring) = rx.vrings.get(q) else {
            return dropped(frames.len());
        };
        if rx.broken.is(index) {
            return dropped(frames.len());
        }
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return dropped(frames.len());
        }
        let Some(ring) = SplitRing::new(state.get_queue(), mem) else {
            return dropped(frames.len());
        };
        let mut burst = RxBurst::new(rx.feat.hdr_len(), rx.feat.mrg_rxbuf());
        let res = self.contain("received frames", || {
            for (k, f) in frames.iter().enumerate() {
                let frame = f.frame(bytes);
                let r = push_rx_ring(state.get_queue_mut(), &ring, &mut burst, &f.hdr, frame);
                if let Pushed::Broken(e) = self.pushed(stats, q, r.map(drop), f.completed, f.len) {
                    dropped(frames.len() - k - 1);
                    return Err(e);
                }
            }
            Ok(())
        });
        let wants = match res {
            Some(Ok(())) => publish_and_check(state.get_queue(), mem, &rx.checked[q]),
            Some(Err(e)) => {
                // What was written before the ring broke is the driver's, if the used
                // index can still be stored; the ring is marked broken either way.
                if let Err(also) = publish_used(state.get_queue(), mem) {
                    debug!("port {}: rx queue {q}: {}", self.id, error_chain(&also));
                }
                Err(e)
            }
            None => {
                // Where the ring was left is unknown: nothing more goes into it.
                stats.rx_errors.inc();
                drop(state);
                if rx.broken.set(index) {
                    self.conn_stats.rings_broken.inc();
                }
                return;
            }
        };
        drop(state);
        self.interrupt(rx, q, vring, wants);
    }
}
