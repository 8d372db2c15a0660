//! The frame nearly every action sees, in one pass: untagged IPv4 with a 20-byte header, not
//! a later fragment, carrying UDP or TCP (no segmentation offload) whose lengths hold.
//!
//! The general path (`update_by`) finds the frame's layers (tags, version, header length)
//! and views each header through its checked constructor, once per checksum. Here every
//! offset is fixed, so the checks are a few compares on the first 34 bytes, and the IPv4
//! header's five words are summed once and shared with the pseudo-header. Anything else,
//! and any frame the general path would drop, returns `None`, and the general path decides
//! as before: this path only ever takes frames on which both agree, which the tests below
//! check against `update` on random and mutated frames.

use super::spec::Targets;
use super::update::{udp_covered, Done};
use crate::pipeline::packet::BurstFrame;
use crate::wire::checksum::{fold, write_checksum};
use crate::wire::ethernet::ETHERTYPE_IPV4;
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};

/// Where the IPv4 header starts (no tag) and where its upper layer starts (IHL 5).
const L3: usize = 14;
const L4: usize = L3 + 20;
/// The bytes every decision here reads: up to the end of a UDP header.
const SEEN: usize = L4 + 8;

/// The 32-bit word at `at` of the frame's first bytes `h`, widened for a one's-complement
/// sum, read little-endian: a sum of such words, folded, is the byte-swapped sum of the
/// big-endian ones (RFC 1071 2.B), and no word needs a swap of its own.
#[inline(always)]
fn word(h: &[u8; SEEN], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]))
}

/// `update`'s answer for the common frame; `None` for every other one. `gso` is the
/// header's GSO type without its ECN bit.
///
/// Only the frame's head is read for a decision. Its rest is fetched
/// ([`BurstFrame::bytes`]) only for an upper-layer sum: not for the IPv4 header, nor for a
/// UDP datagram whose checksum stays as it is (none sent), so such a frame keeps its one
/// copy, straight from the sender's buffer into the receiver's.
#[inline(always)]
pub(super) fn update(frame: &mut BurstFrame<'_>, targets: Targets, gso: u8) -> Option<Done> {
    let len = frame.len();
    // A head holds at least 128 bytes (ports/vhost_user/tx.rs) or the whole frame, so this
    // copies nothing on the burst path; it keeps the rule whoever builds the frame.
    if frame.head().len() < SEEN {
        frame.bytes();
    }
    let h: &mut [u8; SEEN] = frame.head_mut().first_chunk_mut()?;
    if u16::from_be_bytes([h[12], h[13]]) != ETHERTYPE_IPV4 || h[L3] != 0x45 {
        return None;
    }
    // A later fragment's upper layer is payload (the general path fixes its header only).
    if u16::from_be_bytes([h[L3 + 6], h[L3 + 7]]) & 0x1fff != 0 {
        return None;
    }
    let ipl = usize::from(u16::from_be_bytes([h[L3 + 2], h[L3 + 3]]));
    let proto = h[L3 + 9];
    // The upper layer's own target and its shortest header.
    let (target, need) = match proto {
        PROTO_UDP => (Targets::UDP, 8),
        PROTO_TCP if gso == 0 => (Targets::TCP, 20),
        _ => return None,
    };
    // An IP length past the frame or short of the upper header: the general path drops it
    // when the action covers the protocol, and passes it otherwise.
    if ipl > len - L3 || ipl < 20 + need {
        return None;
    }
    let addrs = word(h, L3 + 12) + word(h, L3 + 16);
    let mut done = Done::default();
    if targets.has(Targets::IPH) {
        // The header's sum without its checksum field, taken out of the word that holds it
        // (its upper half, read little-endian) rather than zeroed first: a 2-byte store
        // that the wider loads after it overlap waits to reach the cache before they can
        // read it.
        let old = u64::from(u16::from_le_bytes([h[L3 + 10], h[L3 + 11]])) << 16;
        let sum = word(h, L3) + word(h, L3 + 4) + word(h, L3 + 8) - old + addrs;
        // The words were read little-endian: the folded sum comes byte-swapped.
        h[L3 + 10..L3 + 12].copy_from_slice(&(!fold(sum)).to_le_bytes());
        done.wrote = true;
    }
    if !targets.has(target) {
        return Some(done);
    }
    let total = ipl - 20;
    // The general path's own rules for each protocol: act_csum's for UDP (a datagram that
    // says no checksum was sent, or whose length disagrees, is left as it is).
    let (at, covered, zero_as_ffff) = if proto == PROTO_UDP {
        match udp_covered(&h[L4..], total, false, true) {
            Some(covered) => (6, covered, true),
            None => return Some(done),
        }
    } else {
        (16, total, false)
    };
    let pseudo = u64::from(fold(addrs).swap_bytes()) + u64::from(proto) + total as u64;
    write_checksum(
        &mut frame.bytes()[L4..L3 + ipl],
        at,
        covered,
        pseudo,
        zero_as_ffff,
    );
    Some(Done {
        wrote: true,
        l4_complete: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::csum_action::test_frames::{any_frame, frame, tcp, udp};
    use crate::pipeline::csum_action::update::update as general;
    use crate::wire::virtio_net_hdr::{GSO_TCPV4, GSO_TCPV6, GSO_UDP};
    use crate::wire::VirtioNetHdr;
    use proptest::prelude::*;
    use vm_memory::VolatileSlice;

    /// [`update`] on a frame whose bytes are all at hand.
    fn upd(f: &mut [u8], targets: Targets, gso: u8) -> Option<Done> {
        update(&mut BurstFrame::new(f), targets, gso)
    }

    /// A 64-byte UDP frame, the PVP loop's size, flags DF: both sums against the RFC 1071
    /// loop worked out apart from either path (0x25b8, 0xc787), and the general path's bytes.
    #[test]
    fn the_pvp_frame_golden() {
        let t = Targets::IPH | Targets::UDP;
        let mut f = frame(PROTO_UDP, &udp(&[0u8; 22], 0x1234));
        assert_eq!(f.len(), 64);
        let complete = Done {
            wrote: true,
            l4_complete: true,
        };
        assert_eq!(upd(&mut f, t, 0), Some(complete));
        assert_eq!(u16::from_be_bytes([f[24], f[25]]), 0x25b8);
        assert_eq!(u16::from_be_bytes([f[40], f[41]]), 0xc787);
        let mut g = frame(PROTO_UDP, &udp(&[0u8; 22], 0x1234));
        assert_eq!(general(&mut g, t, &VirtioNetHdr::default()), Ok(complete));
        assert_eq!(f, g);
    }

    #[test]
    fn declines_what_it_does_not_know() {
        let good = frame(PROTO_UDP, &udp(b"hello", 0xdead));
        let t = Targets::IPH | Targets::UDP;
        assert!(upd(&mut good.clone(), t, 0).is_some());
        type Spoil = fn(&mut Vec<u8>);
        let cases: [(&str, Spoil); 7] = [
            ("tagged", |f| f.splice(12..12, [0x81, 0, 0, 0x2a]).for_each(drop)),
            ("options", |f| f[L3] = 0x46),
            ("later fragment", |f| f[L3 + 7] = 1),
            ("later fragment, offset's high bit", |f| f[L3 + 6] |= 0x10),
            ("ICMP", |f| f[L3 + 9] = 1),
            ("length past the frame", |f| f[L3 + 3] = 200),
            ("length short of UDP's header", |f| f[L3 + 3] = 27),
        ];
        for (what, spoil) in cases {
            let mut f = good.clone();
            spoil(&mut f);
            let before = f.clone();
            assert_eq!(upd(&mut f, t, 0), None, "{what}");
            assert_eq!(f, before, "{what}: a declined frame is left as it was");
        }
        // A first fragment (more fragments, offset 0) holds its upper header: taken.
        let mut f = good.clone();
        f[L3 + 6] |= 0x20;
        assert!(upd(&mut f, t, 0).is_some());
        let mut f = frame(PROTO_TCP, &tcp(b"abc", 0));
        assert_eq!(upd(&mut f, Targets::TCP, GSO_TCPV4), None, "TSO");
        assert!(upd(&mut f, Targets::TCP, 0).is_some());
        assert_eq!(upd(&mut good[..33].to_vec(), t, 0), None, "short");
    }

    proptest! {
        /// What this path takes, the general path does to the byte; and an unspoiled frame
        /// is always taken (so the comparison is not made on declined frames only).
        #[test]
        fn takes_only_what_the_general_path_does_the_same(
            (f, spoiled) in any_frame(),
            targets in 0u8..128,
            gso in prop::sample::select(vec![0u8, GSO_TCPV4, GSO_TCPV6, GSO_UDP]),
        ) {
            let targets = Targets(targets);
            let mut quick = f.clone();
            let taken = upd(&mut quick, targets, gso);
            if !spoiled && gso == 0 {
                prop_assert!(taken.is_some());
            }
            if let Some(d) = taken {
                let mut slow = f.clone();
                let hdr = VirtioNetHdr { gso_type: gso, ..VirtioNetHdr::default() };
                prop_assert_eq!(general(&mut slow, targets, &hdr), Ok(d));
                prop_assert_eq!(quick, slow);
            } else {
                prop_assert_eq!(quick, f);
            }
        }

        /// A frame whose bytes after its first `head` are still in the sender's buffer
        /// gets what the same frame held whole gets. Its rest is fetched only when an
        /// upper layer's sum is written (`l4_complete`), so that the rest of every other
        /// frame goes to the receiver straight from the sender.
        #[test]
        fn a_frame_with_its_rest_elsewhere_gets_the_same(
            (f, _) in any_frame(),
            targets in 0u8..128,
            head in SEEN..200,
        ) {
            let targets = Targets(targets);
            let head = head.min(f.len());
            let mut whole = f.clone();
            let expected = upd(&mut whole, targets, 0);
            let mut room = f.clone();
            room[head..].fill(0xa5);
            let mut rest = f[head..].to_vec();
            let mut split = BurstFrame::with_rest(&mut room, VolatileSlice::from(&mut rest[..])).unwrap();
            let got = update(&mut split, targets, 0);
            prop_assert_eq!(got, expected);
            let fetched = split.rest().is_none();
            prop_assert_eq!(split.bytes(), &whole[..]);
            if head < f.len() {
                prop_assert_eq!(fetched, got.is_some_and(|d| d.l4_complete));
            }
        }
    }

    /// The PVP loop's 1500-byte frame (UDP, no checksum sent, as testpmd sends it): its
    /// IPv4 header is rewritten in the head, and its payload is never copied out.
    #[test]
    fn a_udp_datagram_without_checksum_keeps_its_rest_in_place() {
        let mut f = frame(PROTO_UDP, &udp(&[7u8; 1458], 0));
        assert_eq!(f.len(), 1500);
        let mut whole = f.clone();
        let t = Targets::IPH | Targets::UDP;
        let expected = Done {
            wrote: true,
            l4_complete: false,
        };
        assert_eq!(upd(&mut whole, t, 0), Some(expected));
        let mut rest = f.split_off(128);
        f.resize(1500, 0);
        let mut split = BurstFrame::with_rest(&mut f, VolatileSlice::from(&mut rest[..])).unwrap();
        assert_eq!(update(&mut split, t, 0), Some(expected));
        assert!(split.rest().is_some(), "the payload stays in the sender's buffer");
        assert_eq!(split.bytes(), &whole[..]);
    }
}
