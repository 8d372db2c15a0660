//! The frames one worker has forwarded and not yet written, and the [`Egress`] trait
//! through which a port writes them.
//!
//! A worker reads a batch of frames into its arena (ports/arena.rs) and forwards them one
//! by one; the switch queues each for its destinations in the worker's [`Outbox`]. A frame
//! for one destination is *lent*: the outbox holds the worker's own `&mut` borrow of its
//! bytes, so nothing is copied, and the borrow checker keeps the worker from reading new
//! frames over those bytes until the outbox is gone. Every other destination of a flood
//! gets a copy, since the last may rewrite the frame in place (egress actions, checksum
//! completion). When the outbox is full, flushed, or dropped, each port writes its frames
//! in one go: a guest port takes one snapshot of its RX path, one lock per receive queue
//! and one interrupt check per queue for all of them.

use std::sync::{Arc, OnceLock};

use arrayvec::ArrayVec;

use super::csum_action::ActionList;
use super::packet::{BurstFrame, Packet};
use crate::stats::Tally;
use crate::wire::layers::Layers;
use crate::wire::VirtioNetHdr;

/// Frames an outbox holds before it is written out, whatever the batch: Linux vhost-net
/// hands its used entries over every VHOST_NET_BATCH (64) frames too, so a receiving guest
/// never waits for a whole burst. The sender's chains are held until then, so fewer frames
/// cost more publishes and fences per frame, and more leave the sender short of TX
/// descriptors (docs/performance.md has both, measured).
pub const OUTBOX_FRAMES: usize = 64;

/// Most frames of one run of the burst path ([`Egress::write_plain`]): what an outbox holds.
pub const RUN_FRAMES: usize = OUTBOX_FRAMES;

/// Bytes of copies an outbox holds before it is written out: bounds what a worker keeps
/// for floods of large frames.
const COPY_BYTES: usize = 256 * 1024;

/// A port's own word on a frame it admitted ([`Egress::admit`]), handed back with the
/// frame when the port writes it: a guest port keeps its filter's verdict there, so the
/// filter runs once per frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admitted(pub u8);

impl Admitted {
    /// What a guest port says of a frame its filter took through a hash bucket that holds
    /// none of the guest's groups for it: a capture notes it.
    pub const HASH_FALSE_POSITIVE: Admitted = Admitted(2);
}

/// Why a port refused a frame ([`Egress::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The receive filter has no entry, bucket or mode that takes the destination.
    Address,
    /// The VLAN table does not take the frame's tag.
    Vlan,
    /// A snooping port keeps other ports' IGMP and MLD reports from its guest.
    Report,
}

/// A port the switch delivers to.
pub trait Egress: Send + Sync {
    /// Whether the port takes `frame`, which came in on queue `flow`, and if not why:
    /// asked before the frame is queued, so a refused frame is never copied. Refusals are
    /// counted here, in `tally` (the sending worker's counters).
    fn admit(&self, _tally: &Tally, _flow: usize, _frame: &[u8]) -> Result<Admitted, Refused> {
        Ok(Admitted::default())
    }

    /// Writes the frames queued for this port, in the order they were queued, counting in
    /// `tally`; a port that must cut a GSO frame builds the segments in `segment`. Returns
    /// how many frames (or segments) were delivered.
    fn write(&self, tally: &Tally, frames: &mut PortFrames<'_, '_>, segment: &mut Vec<u8>) -> usize;

    /// The burst path (`Switch::write_run`): admits `frames`, which came in on queue
    /// `flow`, each with a header that asks for nothing, runs the port's egress `actions`
    /// on each frame admitted (`csum_action::apply`, counted on this port's queue `flow`),
    /// and writes the frames they keep, counting in `tally`: what
    /// [`Switch::forward`](super::Switch::forward) and [`Egress::write`] do to such a frame.
    /// A frame's rest ([`BurstFrame::rest`]) is copied straight into the port's buffer
    /// where it can be; whatever must look past the frame's head takes
    /// [`BurstFrame::bytes`].
    /// A port that cannot take them so (the default, or for now: several queues, a hash
    /// asked for) returns `None` having done nothing, and they are queued as the switch
    /// queues any frame. Returns how many were delivered.
    fn write_plain(
        &self,
        _tally: &Tally,
        _flow: usize,
        _frames: &mut [BurstFrame<'_>],
        _actions: &ActionList,
    ) -> Option<usize> {
        None
    }
}

/// The ports an outbox writes to, by id: the switch's, each plugged in once at start-up.
pub struct Ports(Vec<OnceLock<Arc<dyn Egress>>>);

impl Ports {
    pub fn new(n: usize) -> Self {
        Ports((0..n).map(|_| OnceLock::new()).collect())
    }

    /// Plugs `egress` in as port `id`, once.
    pub fn attach(&self, id: usize, egress: Arc<dyn Egress>) {
        if let Some(slot) = self.0.get(id) {
            let _ = slot.set(egress);
        }
    }

    /// Port `id`, once attached.
    pub fn get(&self, id: usize) -> Option<&Arc<dyn Egress>> {
        self.0.get(id).and_then(OnceLock::get)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The buffers an outbox writes into, owned by its worker and reused outbox after outbox.
#[derive(Debug, Default)]
pub struct OutboxBuffers {
    copies: Vec<u8>,
    segment: Vec<u8>,
}

/// Where a queued frame's bytes are.
enum Bytes<'a> {
    /// The worker's own bytes, lent until the outbox is written.
    Lent(&'a mut [u8]),
    /// In the outbox's copy buffer.
    Copied { start: usize, len: usize },
}

struct Queued<'a> {
    port: usize,
    flow: usize,
    admitted: Admitted,
    hdr: VirtioNetHdr,
    layers: Option<Layers>,
    bytes: Bytes<'a>,
}

/// The frames one worker has forwarded and not yet written (see the module text). Written
/// when full and when dropped, so nothing queued is ever lost.
pub struct Outbox<'a> {
    ports: &'a Ports,
    tally: &'a Tally,
    queued: ArrayVec<Queued<'a>, OUTBOX_FRAMES>,
    copies: &'a mut Vec<u8>,
    segment: &'a mut Vec<u8>,
}

impl<'a> Outbox<'a> {
    /// An empty outbox writing to `ports`, counting in `tally` (`Switch::outbox` makes one
    /// for the switch's ports).
    pub fn new(ports: &'a Ports, tally: &'a Tally, bufs: &'a mut OutboxBuffers) -> Self {
        Outbox {
            ports,
            tally,
            queued: ArrayVec::new(),
            copies: &mut bufs.copies,
            segment: &mut bufs.segment,
        }
    }

    /// The counters of the worker that owns this outbox.
    pub fn tally(&self) -> &'a Tally {
        self.tally
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Queues `pkt` for `port`, holding its bytes where they are until the outbox is
    /// written.
    pub fn lend(&mut self, port: usize, flow: usize, admitted: Admitted, pkt: Packet<'a>) {
        if self.queued.is_full() {
            self.flush();
        }
        let layers = pkt.known_layers();
        self.queued.push(Queued {
            port,
            flow,
            admitted,
            hdr: pkt.hdr,
            layers,
            bytes: Bytes::Lent(pkt.frame),
        });
    }

    /// Queues a copy of `pkt` for `port`, after `edit` has had its way with the copy (the
    /// port's egress actions); nothing is queued if `edit` says the frame drops.
    pub fn copy(
        &mut self,
        port: usize,
        flow: usize,
        admitted: Admitted,
        pkt: &Packet<'_>,
        edit: impl FnOnce(&mut Packet<'_>) -> bool,
    ) {
        let len = pkt.frame.len();
        if self.queued.is_full() || (!self.copies.is_empty() && self.copies.len() + len > COPY_BYTES) {
            self.flush();
        }
        let start = self.copies.len();
        self.copies.extend_from_slice(pkt.frame);
        let mut copy = Packet::with_layers(pkt.hdr, &mut self.copies[start..], pkt.known_layers());
        if !edit(&mut copy) {
            self.copies.truncate(start);
            return;
        }
        let (hdr, layers) = (copy.hdr, copy.known_layers());
        self.queued.push(Queued {
            port,
            flow,
            admitted,
            hdr,
            layers,
            bytes: Bytes::Copied { start, len },
        });
    }

    /// Writes out everything queued, port by port in the order each first appears, each
    /// port's frames in the order they were queued. Returns the frames delivered.
    pub fn flush(&mut self) -> usize {
        let mut delivered = 0;
        // Ports below 64 are marked done in a bit each; a higher one is searched for.
        let mut done = 0u64;
        for first in 0..self.queued.len() {
            let port = self.queued[first].port;
            let seen = match u32::try_from(port).ok().and_then(|p| 1u64.checked_shl(p)) {
                Some(bit) => {
                    let seen = done & bit != 0;
                    done |= bit;
                    seen
                }
                None => self.queued[..first].iter().any(|q| q.port == port),
            };
            if seen {
                continue;
            }
            let Some(egress) = self.ports.get(port) else {
                continue;
            };
            let mut frames = PortFrames {
                queued: &mut self.queued[first..],
                copies: &mut self.copies[..],
                port,
                next: 0,
            };
            delivered += egress.write(self.tally, &mut frames, &mut *self.segment);
        }
        self.queued.clear();
        self.copies.clear();
        delivered
    }
}

impl Drop for Outbox<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// One queued frame as its port writes it.
pub struct Frame<'f> {
    /// The queue it came in on: a port with several queues keeps a flow on one.
    pub flow: usize,
    pub admitted: Admitted,
    pub pkt: Packet<'f>,
}

/// The frames an outbox holds for one port, handed out one at a time in queue order.
pub struct PortFrames<'o, 'a> {
    queued: &'o mut [Queued<'a>],
    copies: &'o mut [u8],
    port: usize,
    next: usize,
}

impl PortFrames<'_, '_> {
    /// The port's next frame, if any.
    #[allow(clippy::should_implement_trait)] // each frame borrows the list: not an Iterator
    pub fn next(&mut self) -> Option<Frame<'_>> {
        let i = self.next
            + self.queued[self.next..]
                .iter()
                .position(|q| q.port == self.port)?;
        self.next = i + 1;
        let q = &mut self.queued[i];
        let frame: &mut [u8] = match &mut q.bytes {
            Bytes::Lent(b) => b,
            Bytes::Copied { start, len } => &mut self.copies[*start..*start + *len],
        };
        Some(Frame {
            flow: q.flow,
            admitted: q.admitted,
            pkt: Packet::with_layers(q.hdr, frame, q.layers),
        })
    }
}
