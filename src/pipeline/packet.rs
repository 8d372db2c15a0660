//! A frame in flight: its virtio-net header, its bytes, and its layers once parsed.

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
