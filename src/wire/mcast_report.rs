//! Multicast membership reports a guest sends, read from a whole Ethernet frame: IGMP
//! v1/v2/v3 behind IPv4 (igmp.rs) and MLD v1/v2 behind IPv6 (mld.rs), found through the IP
//! views of ip.rs. Everything is bounds-checked and checksum-verified: a frame that does
//! not parse is simply not a report. Also the general queries the snooper sends.

use std::net::{IpAddr, Ipv4Addr};

use super::checksum::pseudo_sum;
use super::ethernet::{self, MacAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::igmp::{self, IgmpMessage};
use super::ip::{
    self, field_v4, field_v6, Ipv4Packet, Ipv6Packet, Ipv6Upper, IPV6_LEN, NEXT_HOP, PROTO_ICMPV6, PROTO_IGMP,
};
use super::mld::{self, MldMessage};

pub use super::group_record::{GroupRecord, RecordKind};

/// The link-layer address a group maps to: 01:00:5e + low 23 bits (IPv4, RFC 1112), 33:33 +
/// low 32 bits (IPv6, RFC 2464).
pub fn group_mac(group: &IpAddr) -> MacAddr {
    match group {
        IpAddr::V4(a) => {
            let o = a.octets();
            MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
    }
}

/// A cheap look at a frame a guest sent: could it be a report? Lets the TX path skip the
/// parser for everything else: one byte after the tags.
pub fn maybe_report(frame: &[u8]) -> bool {
    match ip::network_offset(frame) {
        Some((ETHERTYPE_IPV4, l3)) => frame.get(l3 + field_v4::PROTOCOL) == Some(&PROTO_IGMP),
        Some((ETHERTYPE_IPV6, l3)) => {
            matches!(frame.get(l3 + field_v6::NXT_HDR), Some(&NEXT_HOP | &PROTO_ICMPV6))
        }
        _ => false,
    }
}

/// Where a frame's IGMP or MLD message lies.
enum Message<'a> {
    Igmp(&'a [u8]),
    /// The ICMPv6 message, and its pseudo-header sum.
    Mld(&'a [u8], u64),
}

/// The IGMP message behind an IPv4 header, or the ICMPv6 message behind an IPv6 header and
/// its extension headers: within the IP lengths if `whole`, else whatever of it the frame
/// holds (enough to read its type).
fn message(frame: &[u8], whole: bool) -> Option<Message<'_>> {
    if !maybe_report(frame) {
        return None;
    }
    let (ethertype, l3) = ip::network_offset(frame)?;
    let ip = &frame[l3..];
    match ethertype {
        ETHERTYPE_IPV4 => {
            let p = Ipv4Packet::new_checked(ip).ok()?;
            let (hl, total) = (p.header_len(), p.total_len());
            let end = if whole { total } else { ip.len() };
            (p.protocol() == PROTO_IGMP && end >= hl && end <= ip.len()).then(|| Message::Igmp(&ip[hl..end]))
        }
        ETHERTYPE_IPV6 => {
            let p = Ipv6Packet::new_checked(ip).ok()?;
            match p.upper().ok()? {
                Ipv6Upper::Found {
                    proto: PROTO_ICMPV6,
                    offset,
                    packet_len,
                } => {
                    let end = if whole { packet_len } else { ip.len() };
                    let fits = end <= ip.len() && offset <= end;
                    // A jumbo length is not MLD's: the payload length must say it all.
                    let plain = !whole || packet_len == IPV6_LEN + p.payload_len();
                    let m = ip.get(offset..end).filter(|_| fits && plain)?;
                    Some(Message::Mld(m, p.pseudo_sum(PROTO_ICMPV6, m.len())))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether `frame` is an IGMP or MLD membership report (any version, leaves included), by
/// its type alone: what a snooping switch keeps from other hosts. No checksum is checked.
pub fn is_report(frame: &[u8]) -> bool {
    match message(frame, false) {
        Some(Message::Igmp(m)) => m.first().is_some_and(|t| igmp::is_report_type(*t)),
        Some(Message::Mld(m, _)) => m.first().is_some_and(|t| mld::is_report_type(*t)),
        None => false,
    }
}

/// The protocol a report came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Igmp,
    Mld,
}

/// A membership report: its protocol, whether it is an IGMPv1/v2 or MLDv1 message (one
/// group: a report or a leave) rather than an IGMPv3/MLDv2 one, and its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub protocol: Protocol,
    pub legacy: bool,
    pub records: Vec<GroupRecord>,
}

/// The IGMP or MLD report in `frame`, or `None` if it is not one (or is truncated,
/// malformed, or fails its checksum).
pub fn parse(frame: &[u8]) -> Option<Report> {
    match message(frame, true)? {
        Message::Igmp(m) => {
            let m = IgmpMessage::new_checked(m).ok()?;
            Some(Report {
                protocol: Protocol::Igmp,
                legacy: matches!(m.msg_type(), igmp::V1_REPORT | igmp::V2_REPORT | igmp::LEAVE),
                records: m.records()?,
            })
        }
        Message::Mld(m, pseudo) => {
            let m = MldMessage::new_checked(m, pseudo).ok()?;
            Some(Report {
                protocol: Protocol::Mld,
                legacy: matches!(m.msg_type(), mld::V1_REPORT | mld::V1_DONE),
                records: m.records()?,
            })
        }
    }
}

/// Source MAC of the queries dpaa-vnic sends as a querier (locally administered).
pub const QUERIER_MAC: MacAddr = MacAddr([0x02, 0x00, 0x5e, 0x00, 0x00, 0x01]);
/// Link-local source of its MLD queries (hosts ignore MLD queries from other scopes).
pub const QUERIER_V6: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0x5e, 0xff, 0xfe, 0, 0, 1];

/// IPv4's router alert option (RFC 2113), which IGMP messages carry.
const ROUTER_ALERT_V4: [u8; 4] = [0x94, 4, 0, 0];

/// The Max Resp Codes that ask hosts to answer within `window`: IGMPv3 in tenths of a second
/// (1..=127, the linear range), MLDv2 in milliseconds (1..=32767). Rounded down, so that
/// hosts never wait longer than asked.
pub fn max_resp_codes(window: std::time::Duration) -> (u8, u16) {
    let ms = window.as_millis();
    let ds = u8::try_from((ms / 100).clamp(1, 127)).unwrap_or(127);
    let ms = u16::try_from(ms.clamp(1, 32767)).unwrap_or(32767);
    (ds, ms)
}

/// An IGMPv3 general query to 224.0.0.1 from 0.0.0.0 (as a bridge querier sends it), with
/// a router-alert option: hosts answer with reports of everything they hold, within
/// `max_resp_ds` tenths of a second (at most 12.7 s here).
pub fn igmp_general_query(max_resp_ds: u8, out: &mut Vec<u8>) {
    ethernet::emit(
        out,
        MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]),
        QUERIER_MAC,
        ETHERTYPE_IPV4,
    );
    let addrs = (Ipv4Addr::UNSPECIFIED, Ipv4Addr::new(224, 0, 0, 1));
    ip::emit_v4(out, addrs, PROTO_IGMP, 1, &ROUTER_ALERT_V4, igmp::QUERY_V3_LEN);
    igmp::emit_general_query(out, max_resp_ds);
}

/// An MLDv2 general query to ff02::1 from a link-local address, behind a hop-by-hop
/// router-alert header; `max_resp_ms` below 32768 is encoded linearly.
pub fn mld_general_query(max_resp_ms: u16, out: &mut Vec<u8>) {
    ethernet::emit(
        out,
        MacAddr([0x33, 0x33, 0, 0, 0, 1]),
        QUERIER_MAC,
        ETHERTYPE_IPV6,
    );
    let dst: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    // Next header ICMPv6, length 0; router alert (RFC 2711) for MLD; PadN.
    let hbh = [PROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    ip::emit_v6(
        out,
        (&QUERIER_V6, &dst),
        NEXT_HOP,
        1,
        hbh.len() + mld::QUERY_V2_LEN,
    );
    out.extend_from_slice(&hbh);
    let pseudo = pseudo_sum(&QUERIER_V6, &dst, PROTO_ICMPV6, mld::QUERY_V2_LEN);
    mld::emit_general_query(out, max_resp_ms, pseudo);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::checksum;
    use std::net::Ipv6Addr;

    fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = vec![0x01, 0x00, 0x5e, 0x00, 0x00, 0x16, 0x52, 0x54, 0, 0, 0, 1];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    /// An IGMP message in an IPv4 packet with a router-alert option, checksums filled in.
    fn igmp_frame(msg: &[u8]) -> Vec<u8> {
        let mut igmp = msg.to_vec();
        let c = checksum(&igmp);
        igmp[2..4].copy_from_slice(&c.to_be_bytes());
        let total = (24 + igmp.len()) as u16;
        let mut ip = vec![
            0x46, 0xc0, 0, 0, 0, 0, 0x40, 0, 1, 2, 0, 0, 10, 0, 0, 2, 224, 0, 0, 22, 0x94, 4, 0, 0,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut f = eth(ETHERTYPE_IPV4);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&igmp);
        f
    }

    #[test]
    fn igmp_v2_report_and_leave() {
        let f = igmp_frame(&[0x16, 0, 0, 0, 239, 1, 2, 3]);
        assert!(maybe_report(&f));
        let report = parse(&f).unwrap();
        assert_eq!((report.protocol, report.legacy), (Protocol::Igmp, true));
        let r = report.records;
        assert_eq!(
            r,
            vec![GroupRecord {
                kind: RecordKind::IsExclude,
                group: "239.1.2.3".parse().unwrap(),
                sources: vec![]
            }]
        );
        assert_eq!(group_mac(&r[0].group).to_string(), "01:00:5e:01:02:03");
        let f = igmp_frame(&[0x17, 0, 0, 0, 239, 129, 2, 3]);
        let r = parse(&f).unwrap().records;
        assert_eq!(r[0].kind, RecordKind::ToInclude);
        // 239.129.2.3 shares its MAC with 239.1.2.3: only 23 bits map.
        assert_eq!(group_mac(&r[0].group).to_string(), "01:00:5e:01:02:03");
    }

    #[test]
    fn igmp_v3_records_with_sources() {
        let msg = [
            0x22, 0, 0, 0, 0, 0, 0, 2, // type, checksum, reserved, 2 records
            4, 0, 0, 0, 239, 1, 0, 1, // TO_EX(239.1.0.1, {})
            1, 1, 0, 2, 232, 1, 1, 1, 10, 0, 0, 1, 10, 0, 0, 2, 0xaa, 0xbb, 0xcc,
            0xdd, // IS_IN with 2 sources + aux
        ];
        let r = parse(&igmp_frame(&msg)).unwrap();
        assert!(!r.legacy);
        let r = r.records;
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].kind, r[0].sources.len()), (RecordKind::ToExclude, 0));
        assert_eq!(r[1].kind, RecordKind::IsInclude);
        assert_eq!(
            r[1].sources,
            vec!["10.0.0.1".parse::<IpAddr>().unwrap(), "10.0.0.2".parse().unwrap()]
        );
    }

    #[test]
    fn bad_reports_are_not_reports() {
        let good = igmp_frame(&[0x16, 0, 0, 0, 239, 1, 2, 3]);
        let mut bad_sum = good.clone();
        *bad_sum.last_mut().unwrap() ^= 1;
        assert!(parse(&bad_sum).is_none());
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_none(), "truncated at {cut}");
        }
        // A v3 report claiming more records than it carries.
        let mut msg = vec![0x22, 0, 0, 0, 0, 0, 0xff, 0xff, 4, 0, 0, 0, 239, 1, 0, 1];
        msg.extend_from_slice(&[0; 4]);
        assert!(parse(&igmp_frame(&msg)).is_none());
        assert!(parse(&eth(0x0806)).is_none());
    }

    #[test]
    fn reports_are_told_from_queries_by_their_type() {
        for t in [0x12u8, 0x16, 0x17, 0x22] {
            assert!(is_report(&igmp_frame(&[t, 0, 0, 0, 239, 1, 2, 3])), "{t:#x}");
        }
        // A query is not a report, nor is anything cut short.
        let mut q = Vec::new();
        igmp_general_query(10, &mut q);
        assert!(!is_report(&q));
        let mut q6 = Vec::new();
        mld_general_query(1000, &mut q6);
        assert!(!is_report(&q6));
        let r = igmp_frame(&[0x22, 0, 0, 0, 0, 0, 0, 0]);
        for cut in 0..38 {
            assert!(!is_report(&r[..cut]), "cut at {cut}");
        }
    }

    #[test]
    fn mld_v2_report_behind_hop_by_hop() {
        // MLDv2 report: 1 record CHANGE_TO_EXCLUDE ff15::1:2, no sources.
        let mut mld = vec![143, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0];
        mld.extend_from_slice(&"ff15::1:2".parse::<Ipv6Addr>().unwrap().octets());
        let src: Ipv6Addr = "fe80::5054:ff:fed0:aa01".parse().unwrap();
        let dst: Ipv6Addr = "ff02::16".parse().unwrap();
        let hbh = [PROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0]; // router alert, PadN
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(mld.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, PROTO_ICMPV6]);
        let mut all = pseudo.clone();
        all.extend_from_slice(&mld);
        let c = checksum(&all);
        mld[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&((hbh.len() + mld.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[NEXT_HOP, 1]);
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        ip.extend_from_slice(&hbh);
        ip.extend_from_slice(&mld);
        let mut f = eth(ETHERTYPE_IPV6);
        f.extend_from_slice(&ip);
        assert!(maybe_report(&f));
        assert!(is_report(&f));
        let r = parse(&f).unwrap().records;
        assert_eq!(r[0].kind, RecordKind::ToExclude);
        assert_eq!(group_mac(&r[0].group).to_string(), "33:33:00:01:00:02");
        let mut bad = f.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert!(parse(&bad).is_none());
    }
}

#[cfg(test)]
mod query_tests {
    use super::*;
    use crate::wire::checksum::{fold, partial_sum};

    #[test]
    fn max_resp_codes_stay_within_the_window_and_the_linear_ranges() {
        use std::time::Duration;
        assert_eq!(max_resp_codes(Duration::from_millis(500)), (5, 500));
        assert_eq!(max_resp_codes(Duration::from_millis(1599)), (15, 1599));
        // Below a tenth of a second IGMP's smallest code; never 0 (answer at once).
        assert_eq!(max_resp_codes(Duration::from_millis(40)), (1, 40));
        assert_eq!(max_resp_codes(Duration::ZERO), (1, 1));
        // Long windows stop at the linear encodings' limits, 12.7 s and 32.767 s.
        assert_eq!(max_resp_codes(Duration::from_secs(50)), (127, 32767));
        assert_eq!(max_resp_codes(Duration::from_secs(u64::MAX)), (127, 32767));
    }

    #[test]
    fn igmp_query_golden_checksums() {
        let mut f = Vec::new();
        igmp_general_query(10, &mut f);
        assert_eq!(f.len(), 14 + 24 + 12);
        // IPv4 header and IGMP message both verify.
        assert_eq!(fold(partial_sum(&f[14..38], 0)), 0xffff);
        assert_eq!(fold(partial_sum(&f[38..], 0)), 0xffff);
        assert_eq!(
            (f[38], f[39], &f[14 + 16..14 + 20]),
            (0x11, 10, &[224u8, 0, 0, 1][..])
        );
        // A query is not a report.
        assert!(maybe_report(&f) && parse(&f).is_none());
    }

    #[test]
    fn mld_query_verifies_like_a_received_packet() {
        let mut f = Vec::new();
        mld_general_query(1000, &mut f);
        let ip = &f[14..];
        let m = &ip[48..];
        assert_eq!(
            fold(partial_sum(m, 0) + pseudo_sum(&ip[8..24], &ip[24..40], PROTO_ICMPV6, m.len())),
            0xffff
        );
        assert_eq!((m[0], u16::from_be_bytes([m[4], m[5]])), (130, 1000));
        assert!(maybe_report(&f) && parse(&f).is_none());
    }

    /// An IGMPv3 report (checksum right) whose second record names 1.1.232.1, which is no
    /// group: that record is skipped, or the snooper would open 01:00:5e:01:e8:01 for it.
    #[test]
    fn records_for_addresses_that_are_no_group_are_skipped() {
        let frame: [u8; 66] = [
            0x01, 0x00, 0x5f, 0x00, 0x00, 0x16, 0x52, 0x54, 0x00, 0xd0, 0xaa, 0x01, 0x08, 0x00, 0x46, 0xc0,
            0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x01, 0x02, 0xf9, 0xe7, 0x0a, 0x01, 0x00, 0x05, 0xe0, 0x00,
            0x00, 0x16, 0x94, 0x04, 0x00, 0x00, 0x22, 0x00, 0xf0, 0xf2, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00,
            0x00, 0x00, 0xef, 0x04, 0x02, 0x01, 0x05, 0x00, 0x00, 0x01, 0x01, 0x01, 0xe8, 0x01, 0x0a, 0x00,
            0x00, 0x01,
        ];
        let r = parse(&frame).expect("still a report").records;
        assert_eq!(
            r,
            vec![GroupRecord {
                kind: RecordKind::ToExclude,
                group: "239.4.2.1".parse().unwrap(),
                sources: vec![]
            }]
        );
        // A v2 report for a unicast address is no report at all; the same for a group is.
        let v2 = |group: [u8; 4]| {
            let mut m = [0x16u8, 0, 0, 0, group[0], group[1], group[2], group[3]];
            let c = fold(partial_sum(&m, 0));
            m[2..4].copy_from_slice(&(!c).to_be_bytes());
            let mut f = vec![0x01, 0x00, 0x5e, 0, 0, 1, 0x52, 0x54, 0, 0, 0, 5, 0x08, 0x00];
            f.extend_from_slice(&[
                0x45, 0, 0, 28, 0, 0, 0x40, 0, 1, 2, 0, 0, 10, 0, 0, 5, 10, 0, 0, 1,
            ]);
            f.extend_from_slice(&m);
            f
        };
        assert_eq!(parse(&v2([10, 0, 0, 1])), None);
        assert_eq!(parse(&v2([239, 0, 0, 1])).map(|r| r.records.len()), Some(1));
    }
}
