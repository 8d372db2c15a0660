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
use super::update::{udp, Done};
use crate::wire::checksum::{fold, write_checksum};
use crate::wire::ethernet::ETHERTYPE_IPV4;
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};

/// Where the IPv4 header starts (no tag) and where its upper layer starts (IHL 5).
const L3: usize = 14;
const L4: usize = L3 + 20;

/// The big-endian 32-bit word at `at` of the frame's first bytes `h`, widened for a
/// one's-complement sum.
#[inline(always)]
fn word(h: &[u8; L4], at: usize) -> u64 {
    u64::from(u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]))
}

/// `update`'s answer for the common frame; `None` for every other one. `gso` is the
/// header's GSO type without its ECN bit.
#[inline(always)]
pub(super) fn update(frame: &mut [u8], targets: Targets, gso: u8) -> Option<Done> {
    let len = frame.len();
    let h: &mut [u8; L4] = frame.first_chunk_mut()?;
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
        h[L3 + 10..L3 + 12].copy_from_slice(&[0, 0]);
        let sum = word(h, L3) + word(h, L3 + 4) + word(h, L3 + 8) + addrs;
        h[L3 + 10..L3 + 12].copy_from_slice(&(!fold(sum)).to_be_bytes());
        done.wrote = true;
    }
    if targets.has(target) {
        let l4 = &mut frame[L4..L3 + ipl];
        let pseudo = addrs + u64::from(proto) + l4.len() as u64;
        // The general path's own rules for each protocol: act_csum's for UDP (a datagram
        // that says no checksum was sent, or whose length disagrees, is left as it is).
        let wrote = if proto == PROTO_UDP {
            udp(l4, false, true, pseudo)
        } else {
            let n = l4.len();
            write_checksum(l4, 16, n, pseudo, false);
            true
        };
        if wrote {
            done = Done {
                wrote: true,
                l4_complete: true,
            };
        }
    }
    Some(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::csum_action::test_frames::{any_frame, frame, tcp, udp};
    use crate::pipeline::csum_action::update::update as general;
    use crate::wire::virtio_net_hdr::{GSO_TCPV4, GSO_TCPV6, GSO_UDP};
    use crate::wire::VirtioNetHdr;
    use proptest::prelude::*;

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
        assert_eq!(update(&mut f, t, 0), Some(complete));
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
        assert!(update(&mut good.clone(), t, 0).is_some());
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
            assert_eq!(update(&mut f, t, 0), None, "{what}");
            assert_eq!(f, before, "{what}: a declined frame is left as it was");
        }
        // A first fragment (more fragments, offset 0) holds its upper header: taken.
        let mut f = good.clone();
        f[L3 + 6] |= 0x20;
        assert!(update(&mut f, t, 0).is_some());
        let mut f = frame(PROTO_TCP, &tcp(b"abc", 0));
        assert_eq!(update(&mut f, Targets::TCP, GSO_TCPV4), None, "TSO");
        assert!(update(&mut f, Targets::TCP, 0).is_some());
        assert_eq!(update(&mut good[..33].to_vec(), t, 0), None, "short");
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
            let taken = update(&mut quick, targets, gso);
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
    }
}
