//! The virtio-net header of a received frame as it goes into the guest's buffer: the
//! burst path's usual headers, built once, and the store that leaves a buffer alone when it
//! holds the header already.

use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError, VolatileSlice};

use super::split_ring::GuestBuffers;
use crate::wire::virtio_net_hdr::{field, F_DATA_VALID, HDR_LEN, HDR_LEN_HASH, HDR_LEN_LEGACY};

/// Writes `src` into guest memory at `at` unless the bytes there are `src` already. For the
/// virtio-net header of a received frame: a buffer the driver posts again often still
/// holds the header of its last frame, the same one (no offloads, one buffer; DPDK's
/// virtio-user always places it there, a Linux guest's page fragments may not), and a line
/// only read stays shared with the driver's CPU where a store would take it over and make
/// the driver fetch it back. DPDK's vhost library writes the header's fields the same way
/// (`ASSIGN_UNLESS_EQUAL`, lib/vhost/virtio_net.c). Header-sized ranges only; a longer
/// one, or one across regions, is written as `rx_chain.rs::write_guest` writes.
pub(super) fn update_guest<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    src: &[u8],
    at: GuestAddress,
) -> Result<(), GuestMemoryError> {
    match mem.slice(at, src.len()) {
        Some(s) => {
            update_header(&s, src);
            Ok(())
        }
        None => mem.mem().write_slice(src, at),
    }
}

/// What `RxRun::push_plain` writes as a frame's header: every field 0 but `flags`, and
/// `num_buffers` 1 (virtio 1.2, 5.1.6).
pub(super) const fn plain_header(flags: u8) -> [u8; HDR_LEN_HASH] {
    let mut b = [0u8; HDR_LEN_HASH];
    b[field::FLAGS] = flags;
    b[field::NUM_BUFFERS.start] = 1; // little-endian
    b
}

pub(super) static PLAIN: [u8; HDR_LEN_HASH] = plain_header(0);
pub(super) static PLAIN_DATA_VALID: [u8; HDR_LEN_HASH] = plain_header(F_DATA_VALID);

/// Stores `src` at the start of `s` (at least as long) unless those bytes hold it already
/// ([`update_guest`] says why; docs/performance.md has what storing it always costs).
#[inline(always)]
pub(super) fn update_header<B: BitmapSlice>(s: &VolatileSlice<'_, B>, src: &[u8]) {
    // The three header sizes (virtio 1.2, 5.1.6), each compared at its own fixed size: a
    // compare the compiler inlines, with no memcmp or memset call per frame.
    match src.len() {
        HDR_LEN_LEGACY => update_fixed::<HDR_LEN_LEGACY, B>(s, src),
        HDR_LEN => update_fixed::<HDR_LEN, B>(s, src),
        HDR_LEN_HASH => update_fixed::<HDR_LEN_HASH, B>(s, src),
        _ => s.copy_from(src),
    }
}

/// [`update_header`] for a header of `N` bytes.
#[inline(always)]
fn update_fixed<const N: usize, B: BitmapSlice>(s: &VolatileSlice<'_, B>, src: &[u8]) {
    let Ok(want) = <&[u8; N]>::try_from(src) else {
        s.copy_from(src);
        return;
    };
    let mut now = [0u8; N];
    s.copy_to(&mut now);
    if &now != want {
        s.copy_from(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::virtio_net_hdr::VirtioNetHdr;

    #[test]
    fn the_plain_headers_are_the_ones_a_header_encodes() {
        for flags in [0, F_DATA_VALID, 0xff] {
            let hdr = VirtioNetHdr {
                flags,
                num_buffers: 1,
                ..VirtioNetHdr::default()
            };
            assert_eq!(plain_header(flags), hdr.to_bytes());
        }
        assert_eq!(PLAIN, plain_header(0));
        assert_eq!(PLAIN_DATA_VALID, plain_header(F_DATA_VALID));
    }
}
