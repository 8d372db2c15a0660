//! A frame in flight: its virtio-net header, its bytes, and its layers once parsed.

use vm_memory::VolatileSlice;

use crate::wire::layers::Layers;
use crate::wire::VirtioNetHdr;

/// A frame with its virtio-net header. The bytes are mutable so that checksum actions and
/// a port completing a partial checksum can rewrite them in place.
pub struct Packet<'a> {
    pub hdr: VirtioNetHdr,
    pub frame: &'a mut [u8],
    /// The frame's layers, parsed by the first step that looks into the frame and kept for
    /// the rest of its way, as DPDK's mbuf carries `packet_type` and its layer lengths: a
    /// frame no step looks into is never parsed.
    layers: Option<Layers>,
}

impl<'a> Packet<'a> {
    pub fn new(hdr: VirtioNetHdr, frame: &'a mut [u8]) -> Self {
        Packet {
            hdr,
            frame,
            layers: None,
        }
    }

    /// A packet over `frame` that carries `layers`, already found for the same bytes.
    pub(super) fn with_layers(hdr: VirtioNetHdr, frame: &'a mut [u8], layers: Option<Layers>) -> Self {
        Packet { hdr, frame, layers }
    }

    /// The layers found so far, if any (for a copy of the frame).
    pub(super) fn known_layers(&self) -> Option<Layers> {
        self.layers
    }

    /// The frame's layers, parsed at the first call. What the pipeline rewrites in place
    /// (MACs, TTL, addresses, checksums) never moves a layer (wire/layers.rs); debug builds
    /// check that against a fresh parse on every call.
    #[inline]
    pub fn layers(&mut self) -> Layers {
        debug_assert!(
            self.layers.is_none_or(|l| l == Layers::parse(self.frame)),
            "a rewrite moved a layer of the frame"
        );
        if let Some(l) = self.layers {
            return l;
        }
        let l = Layers::parse(self.frame);
        self.layers = Some(l);
        l
    }
}

/// A frame on the burst path ([`Switch::plain_destination`](super::Switch::plain_destination),
/// [`Run`](super::switch::Run)): its room in the sending worker's arena, whose first bytes
/// hold the frame's start, copied out of the sender's buffer; and, for a longer frame, the
/// rest of it, still in that buffer. The rest is copied once: straight into the
/// receiver's buffer ([`BurstFrame::rest`]), or into the room when something must look at
/// the whole frame ([`BurstFrame::bytes`]).
///
/// Every decision about the frame is taken on the bytes copied out, which the guest can no
/// longer change: the rest, which the guest may rewrite until its chain is returned, is
/// only ever copied, never read for a decision (docs/architecture.md, "One copy").
pub struct BurstFrame<'a> {
    room: &'a mut [u8],
    /// Empty once copied, or when there was none: no `Option`, so that a frame with no rest
    /// (every short one) costs no test of it.
    rest: VolatileSlice<'a>,
}

impl<'a> BurstFrame<'a> {
    /// A frame whose bytes are all in `bytes`.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        BurstFrame {
            room: bytes,
            rest: VolatileSlice::from(&mut [][..]),
        }
    }

    /// A frame of `room.len()` bytes whose last `rest.len()` bytes are still in `rest`;
    /// `None` if the room is shorter than the rest.
    pub fn with_rest(room: &'a mut [u8], rest: VolatileSlice<'a>) -> Option<Self> {
        (rest.len() <= room.len()).then_some(BurstFrame { room, rest })
    }

    /// The frame's length.
    pub fn len(&self) -> usize {
        self.room.len()
    }

    pub fn is_empty(&self) -> bool {
        self.room.is_empty()
    }

    /// The bytes copied out so far: the frame's start, or all of it.
    #[inline]
    pub fn head(&self) -> &[u8] {
        &self.room[..self.room.len() - self.rest.len()]
    }

    /// [`BurstFrame::head`], to rewrite in place: what is written there is what the receiver
    /// gets, followed by the rest.
    #[inline]
    pub fn head_mut(&mut self) -> &mut [u8] {
        let n = self.room.len() - self.rest.len();
        &mut self.room[..n]
    }

    /// The bytes still in the sender's buffer, if any: what follows [`BurstFrame::head`].
    #[inline]
    pub fn rest(&self) -> Option<&VolatileSlice<'a>> {
        (!self.rest.is_empty()).then_some(&self.rest)
    }

    /// The whole frame, its rest copied into the room first if it was not yet.
    pub fn bytes(&mut self) -> &mut [u8] {
        self.copy_rest();
        self.room
    }

    /// [`BurstFrame::bytes`], for good.
    pub fn into_bytes(mut self) -> &'a mut [u8] {
        self.copy_rest();
        self.room
    }

    #[inline]
    fn copy_rest(&mut self) {
        if !self.rest.is_empty() {
            let at = self.room.len() - self.rest.len();
            self.rest.copy_to(&mut self.room[at..]);
            self.rest = VolatileSlice::from(&mut [][..]);
        }
    }
}
