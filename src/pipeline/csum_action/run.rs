//! A port's action list on one frame: the verdict, and what it leaves in the frame's
//! virtio-net header.

use log::trace;

use super::plain;
use super::spec::{CsumAction, Verdict};
use super::update::{update_by, CsumFail};
use crate::pipeline::packet::{BurstFrame, Packet};
use crate::stats::Counts;
use crate::wire::virtio_net_hdr::{F_DATA_VALID, F_NEEDS_CSUM, GSO_ECN};

/// The result of a port's action list on one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionVerdict {
    /// No action matched, or none had anything to write.
    Untouched,
    Updated,
    /// A sum could not be written: the frame's headers cannot be trusted.
    Drop,
    /// An action with `verdict=drop` matched (its sums written first, as tc's would be).
    Dropped,
}

/// Runs `actions` (already those of one port and direction) in order on a frame. A frame
/// whose upper-layer checksum an action computed is marked DATA_VALID (and a virtio partial
/// checksum loses NEEDS_CSUM): a GUEST_CSUM receiver need not verify what was just computed.
///
/// The frame is parsed at most once, by the first action that needs its layers; the rest
/// reuse them (the sums they write move no layer).
pub fn run(actions: &[CsumAction], pkt: &mut Packet<'_>) -> (ActionVerdict, Option<CsumFail>) {
    run_in(actions, pkt, None)
}

/// [`run`], each action's work counted in its slot of `counts` if given.
fn run_in(
    actions: &[CsumAction],
    pkt: &mut Packet<'_>,
    counts: Option<Counts<'_>>,
) -> (ActionVerdict, Option<CsumFail>) {
    let mut verdict = ActionVerdict::Untouched;
    for a in actions {
        if !a.matches(pkt) {
            continue;
        }
        let own = counts.and_then(|c| c.action(a.slot));
        if let Some(c) = own {
            c.matched.inc();
        }
        // The common frame in one pass; anything else, or anything that would fail, through
        // its parsed layers (plain.rs says which frames that is).
        let quick = plain::update(
            &mut BurstFrame::new(pkt.frame),
            a.update,
            pkt.hdr.gso_type & !GSO_ECN,
        );
        let done = match quick {
            Some(d) => Ok(d),
            None => update_by(&pkt.layers(), pkt.frame, a.update, &pkt.hdr),
        };
        match done {
            Ok(d) => {
                if d.l4_complete {
                    pkt.hdr.flags = (pkt.hdr.flags & !F_NEEDS_CSUM) | F_DATA_VALID;
                }
                if d.wrote {
                    verdict = ActionVerdict::Updated;
                }
            }
            Err(e) => {
                own.inspect(|c| c.dropped.inc());
                return (ActionVerdict::Drop, Some(e));
            }
        }
        if a.verdict == Verdict::Drop {
            own.inspect(|c| c.dropped.inc());
            return (ActionVerdict::Dropped, None);
        }
        own.inspect(|c| c.passed.inc());
    }
    (verdict, None)
}

/// [`run`], counted in `counts` (the queue of the port the actions belong to, and each
/// action's slot): false if the frame drops.
pub fn apply(actions: &[CsumAction], pkt: &mut Packet<'_>, counts: Counts<'_>) -> bool {
    let stats = counts.queue;
    match run_in(actions, pkt, Some(counts)) {
        (ActionVerdict::Untouched, _) => true,
        (ActionVerdict::Updated, _) => {
            stats.csum_updated.inc();
            true
        }
        (ActionVerdict::Drop, why) => {
            stats.csum_failed.inc();
            trace!("checksum action drops a frame: {why:?}");
            false
        }
        // Counted in the action's own slot: the frame was what the action asks to drop.
        (ActionVerdict::Dropped, _) => {
            trace!("checksum action with verdict=drop drops a frame");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::csum_action::test_frames::{act, eth, ipv4, udp};
    use crate::wire::checksum::checksum;
    use crate::wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
    use crate::wire::ip::{PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP};
    use crate::wire::virtio_net_hdr::GSO_TCPV4;
    use crate::wire::VirtioNetHdr;
    use proptest::prelude::*;

    fn be16(f: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([f[at], f[at + 1]])
    }

    fn run_one(spec: &str, f: &mut [u8]) -> (ActionVerdict, Option<CsumFail>) {
        run(&[act(spec)], &mut Packet::new(VirtioNetHdr::default(), f))
    }

    /// `verdict=drop` drops what it matches, after writing its sums as tc's csum does
    /// before its control action; each action counts what it matched, passed and dropped
    /// in its own slot, and an action that does not match counts nothing.
    #[test]
    fn a_drop_verdict_drops_what_it_matches_and_each_action_counts_its_own() {
        use crate::pipeline::csum_action::test_frames::action_slots;
        use crate::stats::{Counts, QueueStats};
        let slots = action_slots(3);
        let queue = QueueStats::default();
        let at = |spec: &str, slot: u16| CsumAction { slot, ..act(spec) };
        let actions = [
            at("port=0,dir=egress,update=iph,proto=tcp", 0),
            at("port=0,dir=egress,update=iph", 1),
            at("port=0,dir=egress,update=udp,proto=udp,verdict=drop", 2),
        ];
        let frame = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"hello", 0xdead)));
        for _ in 0..3 {
            let mut f = frame.clone();
            let mut pkt = Packet::new(VirtioNetHdr::default(), &mut f);
            assert!(!apply(&actions, &mut pkt, Counts::new(&queue, &slots)));
            assert_eq!(be16(&f, 14 + 20 + 6), 0x83d7, "the UDP sum was written first");
        }
        let counted: Vec<(u64, u64, u64)> = slots
            .iter()
            .map(|c| (c.matched.get(), c.passed.get(), c.dropped.get()))
            .collect();
        assert_eq!(counted, [(0, 0, 0), (3, 3, 0), (3, 0, 3)]);
        // Not a failure: the frame's headers were fine.
        assert_eq!(queue.csum_failed.get(), 0);
        // A frame whose sum cannot be written is dropped by the action that tried, counted
        // there and as a failure.
        let mut short = frame.clone();
        short[14] = 0x44;
        let mut pkt = Packet::new(VirtioNetHdr::default(), &mut short);
        assert!(!apply(&actions[1..2], &mut pkt, Counts::new(&queue, &slots)));
        assert_eq!((slots[1].matched.get(), slots[1].dropped.get()), (4, 1));
        assert_eq!(queue.csum_failed.get(), 1);
        // Uncounted, the same verdicts.
        let mut f = frame.clone();
        assert_eq!(
            run(&actions, &mut Packet::new(VirtioNetHdr::default(), &mut f)).0,
            ActionVerdict::Dropped
        );
    }

    #[test]
    fn ipv4_udp_odd_length_golden() {
        // Expected values from an independent Python implementation of RFC 1071.
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"hello", 0xdead)));
        let (v, e) = run_one("port=0,dir=ingress,update=iph+udp", &mut f);
        assert_eq!((v, e), (ActionVerdict::Updated, None));
        assert_eq!(be16(&f, 14 + 10), 0x65c9);
        assert_eq!(be16(&f, 14 + 20 + 6), 0x83d7);
    }

    #[test]
    fn ipv4_options_tcp_golden() {
        let mut tcp = vec![
            0x04, 0xd2, 0, 80, 0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x18, 0x02, 0, 0xff, 0xff, 0, 0,
        ];
        tcp.extend_from_slice(b"abc");
        let mut ip = ipv4(&[1, 1, 1, 0], PROTO_TCP, 0, &tcp);
        ip[4..6].copy_from_slice(&[0, 7]);
        let mut f = eth(ETHERTYPE_IPV4, &ip);
        assert_eq!(
            run_one("port=0,dir=egress,update=tcp+iph", &mut f).0,
            ActionVerdict::Updated
        );
        assert_eq!(be16(&f, 14 + 10), 0x62bf);
        assert_eq!(be16(&f, 14 + 24 + 16), 0xcf3f);
    }

    #[test]
    fn ipv6_hop_by_hop_icmpv6_golden() {
        let icmp = [0x80, 0, 0xaa, 0xaa, 0, 1, 0, 1, b'x', b'y', b'z'];
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&((8 + icmp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 64]);
        ip.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        ip.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        ip.extend_from_slice(&[PROTO_ICMPV6, 0, 1, 4, 0, 0, 0, 0]);
        ip.extend_from_slice(&icmp);
        let mut f = eth(ETHERTYPE_IPV6, &ip);
        assert_eq!(
            run_one("port=0,dir=egress,update=icmp", &mut f).0,
            ActionVerdict::Updated
        );
        assert_eq!(be16(&f, 14 + 48 + 2), 0x9039);
    }

    #[test]
    fn sctp_crc32c_is_little_endian_golden() {
        let mut sc = vec![0x13, 0x88, 0x17, 0x70, 0x11, 0x22, 0x33, 0x44, 9, 9, 9, 9];
        sc.extend_from_slice(&[0, 3, 0, 8, 0, 0, 0, 1]);
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_SCTP, 0, &sc));
        assert_eq!(
            run_one("port=0,dir=egress,update=sctp", &mut f).0,
            ActionVerdict::Updated
        );
        assert_eq!(&f[14 + 20 + 8..14 + 20 + 12], &[0xca, 0x8b, 0xbe, 0x3c]);
        // The iSCSI check value, so a swapped polynomial would show here too.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn udp_zero_rules() {
        // IPv4 UDP with checksum 0 means "none sent": left alone even with update=udp.
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"abcd", 0)));
        assert_eq!(
            run_one("port=0,dir=egress,update=udp", &mut f).0,
            ActionVerdict::Untouched
        );
        assert_eq!(be16(&f, 40), 0);
        // A payload word chosen so the checksum computes to 0: sent as 0xFFFF.
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(&[0, 0], 1)));
        run_one("port=0,dir=egress,update=udp", &mut f);
        let c = be16(&f, 40);
        f[42..44].copy_from_slice(&c.to_be_bytes());
        f[40..42].copy_from_slice(&[0x12, 0x34]);
        run_one("port=0,dir=egress,update=udp", &mut f);
        assert_eq!(be16(&f, 40), 0xffff);
    }

    #[test]
    fn fragments_vlan_and_obscure_lengths() {
        // A later fragment: L4 bytes are payload, only the IP header is fixed.
        let mut f = eth(
            ETHERTYPE_IPV4,
            &ipv4(&[], PROTO_UDP, 0x0010, &udp(b"hello", 0xdead)),
        );
        run_one("port=0,dir=egress,update=iph+udp", &mut f);
        assert_eq!(be16(&f, 40), 0xdead);
        assert_eq!(checksum(&f[14..34]), 0);
        // The first fragment (MF set, offset 0) gets its L4 checksum.
        let mut f = eth(
            ETHERTYPE_IPV4,
            &ipv4(&[], PROTO_UDP, 0x2000, &udp(b"hello", 0xdead)),
        );
        run_one("port=0,dir=egress,update=udp", &mut f);
        assert_ne!(be16(&f, 40), 0xdead);
        // Behind an 802.1Q tag: the same golden value as untagged.
        let plain = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"hello", 0xdead)));
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        tagged.extend_from_slice(&plain[12..]);
        run_one("port=0,dir=egress,update=udp", &mut tagged);
        assert_eq!(be16(&tagged, 18 + 20 + 6), 0x83d7);
        // UDP length disagreeing with the IP length: passed untouched, as act_csum does.
        let mut u = udp(b"hello", 0xdead);
        u[5] = 99;
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &u));
        assert_eq!(
            run_one("port=0,dir=egress,update=udp", &mut f).0,
            ActionVerdict::Untouched
        );
        assert_eq!(be16(&f, 40), 0xdead);
    }

    #[test]
    fn lying_headers_drop() {
        let good = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"hello", 0xdead)));
        // Total length beyond the frame.
        let mut f = good.clone();
        f[16..18].copy_from_slice(&500u16.to_be_bytes());
        let (v, e) = run_one("port=0,dir=egress,update=udp", &mut f);
        assert_eq!(v, ActionVerdict::Drop);
        assert!(matches!(e, Some(CsumFail::Length { ipl: 500, .. })));
        // Total length too short for a UDP header.
        let mut f = good.clone();
        f[16..18].copy_from_slice(&24u16.to_be_bytes());
        assert_eq!(
            run_one("port=0,dir=egress,update=udp", &mut f).0,
            ActionVerdict::Drop
        );
        // IHL below 5.
        let mut f = good.clone();
        f[14] = 0x44;
        assert_eq!(
            run_one("port=0,dir=egress,update=iph", &mut f).0,
            ActionVerdict::Drop
        );
        // Truncated IPv4 header; a non-IP frame is none of the action's business.
        let mut f = good[..30].to_vec();
        assert_eq!(
            run_one("port=0,dir=egress,update=iph", &mut f).0,
            ActionVerdict::Drop
        );
        let mut arp = eth(0x0806, &[0u8; 28]);
        assert_eq!(
            run_one("port=0,dir=egress,update=iph", &mut arp).0,
            ActionVerdict::Untouched
        );
        // Targets that do not cover the protocol leave the packet alone even if it is bad.
        let mut f = good.clone();
        f[16..18].copy_from_slice(&500u16.to_be_bytes());
        assert_eq!(
            run_one("port=0,dir=egress,update=tcp", &mut f).0,
            ActionVerdict::Untouched
        );
    }

    #[test]
    fn match_by_proto_and_prefix_and_complete_partial() {
        let f0 = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(b"hello", 0xdead)));
        for (spec, hit) in [
            ("port=0,dir=egress,update=udp,proto=udp", true),
            ("port=0,dir=egress,update=udp,proto=6", false),
            ("port=0,dir=egress,update=udp,dst=10.0.1.0/24", true),
            ("port=0,dir=egress,update=udp,dst=10.0.2.0/24", false),
            ("port=0,dir=egress,update=udp,dst=fe80::/10", false),
        ] {
            let mut f = f0.clone();
            let v = run_one(spec, &mut f).0;
            assert_eq!(v == ActionVerdict::Updated, hit, "{spec}");
        }
        // A virtio partial checksum that the action computes in full is no longer partial.
        let hdr = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 6,
            ..Default::default()
        };
        let mut f = f0.clone();
        let mut pkt = Packet::new(hdr, &mut f);
        run(&[act("port=0,dir=egress,update=udp")], &mut pkt);
        assert_eq!(pkt.hdr.flags, F_DATA_VALID);
        // A TSO packet's TCP checksum belongs to the segmenter.
        let mut tcp = vec![0u8; 20];
        tcp[12] = 0x50;
        let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_TCP, 0, &tcp));
        let hdr = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            ..Default::default()
        };
        assert_eq!(
            run(
                &[act("port=0,dir=egress,update=tcp")],
                &mut Packet::new(hdr, &mut f)
            )
            .0,
            ActionVerdict::Untouched
        );
    }

    /// The slow way: a 16-bit loop over pseudo-header and segment must verify to zero.
    fn verifies(f: &[u8], proto: u8) -> bool {
        let ip = &f[14..];
        let hl = usize::from(ip[0] & 0xf) * 4;
        let l4 = &ip[hl..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&ip[12..20]);
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        pseudo.extend_from_slice(l4);
        let mut acc: u32 = 0;
        for ch in pseudo.chunks(2) {
            acc += u32::from(u16::from_be_bytes([ch[0], *ch.get(1).unwrap_or(&0)]));
        }
        while acc >> 16 != 0 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc == 0xffff
    }

    proptest! {
        #[test]
        fn repaired_udp_and_tcp_verify(payload in proptest::collection::vec(any::<u8>(), 0..1500),
                                       junk in 1u16..) {
            let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_UDP, 0, &udp(&payload, junk)));
            run_one("port=0,dir=egress,update=udp", &mut f);
            prop_assert!(verifies(&f, PROTO_UDP));
            let mut tcp = vec![0u8; 20];
            tcp[12] = 0x50;
            tcp[16..18].copy_from_slice(&junk.to_be_bytes());
            tcp.extend_from_slice(&payload);
            let mut f = eth(ETHERTYPE_IPV4, &ipv4(&[], PROTO_TCP, 0, &tcp));
            run_one("port=0,dir=egress,update=tcp", &mut f);
            prop_assert!(verifies(&f, PROTO_TCP));
        }

        #[test]
        fn never_panics_on_garbage(mut f in proptest::collection::vec(any::<u8>(), 0..200), v6 in any::<bool>()) {
            if f.len() > 14 {
                f[12..14].copy_from_slice(&if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 }.to_be_bytes());
                f[14] = (f[14] & 0x0f) | if v6 { 0x60 } else { 0x40 };
            }
            // Two actions, the second matching on the layers the first one parsed: debug
            // builds check in `Packet::layers` that the sums written moved no layer.
            let all = act("port=0,dir=egress,update=iph+icmp+igmp+tcp+udp+udplite+sctp");
            let again = act("port=0,dir=egress,update=iph+udp,proto=udp");
            run(&[all, again], &mut Packet::new(VirtioNetHdr::default(), &mut f));
        }
    }
}
