//! Multicast membership reports a guest sends: IGMP v1/v2/v3 (IPv4) and MLD v1/v2 (IPv6),
//! read from a whole Ethernet frame. Everything is bounds-checked and checksum-verified: a
//! frame that does not parse is simply not a report.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::checksum::{fold, partial_sum, pseudo_sum, write_checksum};
use super::ethernet::MacAddr;
use super::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, HEADER_LEN};

const ETHERTYPE_VLAN: u16 = 0x8100;
const PROTO_IGMP: u8 = 2;
const NEXT_HOP_BY_HOP: u8 = 0;
const NEXT_ICMPV6: u8 = 58;

/// What a group record says about the sender's interest (RFC 3376 4.2.12, RFC 3810 5.2.12);
/// v1/v2 reports read as `IsExclude` with no sources, leaves and MLD done as `ToInclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    IsInclude,
    IsExclude,
    ToInclude,
    ToExclude,
    Allow,
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub kind: RecordKind,
    pub group: IpAddr,
    pub sources: Vec<IpAddr>,
}

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

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn kind(t: u8) -> Option<RecordKind> {
    Some(match t {
        1 => RecordKind::IsInclude,
        2 => RecordKind::IsExclude,
        3 => RecordKind::ToInclude,
        4 => RecordKind::ToExclude,
        5 => RecordKind::Allow,
        6 => RecordKind::Block,
        _ => return None,
    })
}

/// A cheap look at a frame a guest sent: could it be a report? Lets the TX path skip the
/// parser for everything else.
pub fn maybe_report(frame: &[u8]) -> bool {
    let (ethertype, l3) = match be16(frame, 12) {
        Some(ETHERTYPE_VLAN) => (be16(frame, 16), HEADER_LEN + 4),
        t => (t, HEADER_LEN),
    };
    match ethertype {
        Some(ETHERTYPE_IPV4) => frame.get(l3 + 9) == Some(&PROTO_IGMP),
        Some(ETHERTYPE_IPV6) => matches!(frame.get(l3 + 6), Some(&NEXT_HOP_BY_HOP) | Some(&NEXT_ICMPV6)),
        _ => false,
    }
}

/// Whether `frame` is an IGMP or MLD membership report (any version, leaves included), by
/// its type alone: what a snooping switch keeps from other hosts. No checksum is checked.
pub fn is_report(frame: &[u8]) -> bool {
    if !maybe_report(frame) {
        return false;
    }
    let (ethertype, l3) = match be16(frame, 12) {
        Some(ETHERTYPE_VLAN) => (be16(frame, 16), HEADER_LEN + 4),
        t => (t, HEADER_LEN),
    };
    let Some(ip) = frame.get(l3..) else {
        return false;
    };
    match ethertype {
        Some(ETHERTYPE_IPV4) => {
            let ihl = usize::from(ip.first().map_or(0, |b| b & 0x0f)) * 4;
            matches!(ip.get(ihl), Some(0x12 | 0x16 | 0x17 | 0x22))
        }
        Some(ETHERTYPE_IPV6) => {
            let mut at = 40;
            if ip.get(6) == Some(&NEXT_HOP_BY_HOP) {
                if ip.get(at) != Some(&NEXT_ICMPV6) {
                    return false;
                }
                at += match ip.get(at + 1) {
                    Some(len) => (usize::from(*len) + 1) * 8,
                    None => return false,
                };
            }
            matches!(ip.get(at), Some(131 | 132 | 143))
        }
        _ => false,
    }
}

/// The group records of an IGMP or MLD report in `frame`, or `None` if it is not one (or is
/// truncated, malformed, or fails its checksum).
pub fn parse(frame: &[u8]) -> Option<Vec<GroupRecord>> {
    let (ethertype, l3) = match be16(frame, 12)? {
        ETHERTYPE_VLAN => (be16(frame, 16)?, HEADER_LEN + 4),
        t => (t, HEADER_LEN),
    };
    let ip = frame.get(l3..)?;
    match ethertype {
        ETHERTYPE_IPV4 => parse_igmp(ip),
        ETHERTYPE_IPV6 => parse_mld(ip),
        _ => None,
    }
}

fn parse_igmp(ip: &[u8]) -> Option<Vec<GroupRecord>> {
    if ip.first()? >> 4 != 4 || *ip.get(9)? != PROTO_IGMP {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2)?);
    if ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    let m = &ip[ihl..total];
    if m.len() < 8 || fold(partial_sum(m, 0)) != 0xffff {
        return None;
    }
    let v4 = |b: &[u8], at: usize| -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(
            *b.get(at)?,
            *b.get(at + 1)?,
            *b.get(at + 2)?,
            *b.get(at + 3)?,
        )))
    };
    let simple = |kind| {
        Some(vec![GroupRecord {
            kind,
            group: v4(m, 4).filter(IpAddr::is_multicast)?,
            sources: Vec::new(),
        }])
    };
    match m[0] {
        0x12 | 0x16 => simple(RecordKind::IsExclude),
        0x17 => simple(RecordKind::ToInclude),
        0x22 => records(m, 4, 4, v4),
        _ => None,
    }
}

fn parse_mld(ip: &[u8]) -> Option<Vec<GroupRecord>> {
    if ip.first()? >> 4 != 6 || ip.len() < 40 {
        return None;
    }
    let payload = usize::from(be16(ip, 4)?);
    let end = 40usize.checked_add(payload).filter(|e| *e <= ip.len())?;
    let mut next = ip[6];
    let mut at = 40;
    // MLD travels behind a hop-by-hop options header (router alert).
    if next == NEXT_HOP_BY_HOP {
        next = *ip.get(at)?;
        at += (usize::from(*ip.get(at + 1)?) + 1) * 8;
    }
    if next != NEXT_ICMPV6 || at > end {
        return None;
    }
    let m = &ip[at..end];
    if m.len() < 8 {
        return None;
    }
    if fold(partial_sum(m, 0) + pseudo_sum(&ip[8..24], &ip[24..40], NEXT_ICMPV6, m.len())) != 0xffff {
        return None;
    }
    let v6 = |b: &[u8], at: usize| -> Option<IpAddr> {
        let o: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(o)))
    };
    let simple = |kind| {
        Some(vec![GroupRecord {
            kind,
            group: v6(m, 8).filter(IpAddr::is_multicast)?,
            sources: Vec::new(),
        }])
    };
    match m[0] {
        131 => simple(RecordKind::IsExclude),
        132 => simple(RecordKind::ToInclude),
        143 => records(m, 4, 16, v6),
        _ => None,
    }
}

/// The records of an IGMPv3 / MLDv2 report: count at offset `count_at + 2`, records after
/// it, addresses `alen` bytes long.
fn records(
    m: &[u8],
    count_at: usize,
    alen: usize,
    addr: impl Fn(&[u8], usize) -> Option<IpAddr>,
) -> Option<Vec<GroupRecord>> {
    let n = usize::from(be16(m, count_at + 2)?);
    let mut at = count_at + 4;
    let mut out = Vec::with_capacity(n.min(256));
    for _ in 0..n {
        let kind = kind(*m.get(at)?)?;
        let aux = usize::from(*m.get(at + 1)?) * 4;
        let nsrc = usize::from(be16(m, at + 2)?);
        let group = addr(m, at + 4)?;
        let sources = (0..nsrc)
            .map(|i| addr(m, at + 4 + alen * (i + 1)))
            .collect::<Option<Vec<_>>>()?;
        // A record for an address that is no group says nothing a filter can follow (the
        // multicast address field, RFC 3376 4.2.12, RFC 3810 5.2.12): skipped, the rest
        // of the report stands. Found by fuzz/fuzz_targets/wire.rs.
        if group.is_multicast() {
            out.push(GroupRecord { kind, group, sources });
        }
        at += 4 + alen * (nsrc + 1) + aux;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::checksum;

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
        let r = parse(&f).unwrap();
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
        let r = parse(&f).unwrap();
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
        let hbh = [NEXT_ICMPV6, 0, 5, 2, 0, 0, 1, 0]; // router alert, PadN
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(mld.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, NEXT_ICMPV6]);
        let mut all = pseudo.clone();
        all.extend_from_slice(&mld);
        let c = checksum(&all);
        mld[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&((hbh.len() + mld.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[NEXT_HOP_BY_HOP, 1]);
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        ip.extend_from_slice(&hbh);
        ip.extend_from_slice(&mld);
        let mut f = eth(ETHERTYPE_IPV6);
        f.extend_from_slice(&ip);
        assert!(maybe_report(&f));
        assert!(is_report(&f));
        let r = parse(&f).unwrap();
        assert_eq!(r[0].kind, RecordKind::ToExclude);
        assert_eq!(group_mac(&r[0].group).to_string(), "33:33:00:01:00:02");
        let mut bad = f.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert!(parse(&bad).is_none());
    }
}

/// Source MAC of the queries dpaa-vnic sends as a querier (locally administered).
pub const QUERIER_MAC: MacAddr = MacAddr([0x02, 0x00, 0x5e, 0x00, 0x00, 0x01]);
/// Link-local source of its MLD queries (hosts ignore MLD queries from other scopes).
pub const QUERIER_V6: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0x5e, 0xff, 0xfe, 0, 0, 1];

fn ethernet(dst: MacAddr, ethertype: u16, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&QUERIER_MAC.0);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

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
    ethernet(MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]), ETHERTYPE_IPV4, out);
    let mut ip = [
        0x46, 0xc0, 0, 36, 0, 0, 0x40, 0, 1, PROTO_IGMP, 0, 0, 0, 0, 0, 0, 224, 0, 0, 1, 0x94, 4, 0, 0,
    ];
    let c = !fold(partial_sum(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    // type, max resp code (< 128: linear), checksum, group 0, S/QRV = 2, QQIC = 125 s, no sources
    let mut q = [0x11, max_resp_ds.min(127), 0, 0, 0, 0, 0, 0, 2, 125, 0, 0];
    let c = !fold(partial_sum(&q, 0));
    q[2..4].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&ip);
    out.extend_from_slice(&q);
}

/// An MLDv2 general query to ff02::1 from a link-local address, behind a hop-by-hop
/// router-alert header; `max_resp_ms` below 32768 is encoded linearly.
pub fn mld_general_query(max_resp_ms: u16, out: &mut Vec<u8>) {
    ethernet(MacAddr([0x33, 0x33, 0, 0, 0, 1]), ETHERTYPE_IPV6, out);
    let dst: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let mut q = [0u8; 28];
    q[0] = 130;
    q[4..6].copy_from_slice(&max_resp_ms.min(32767).to_be_bytes());
    q[24] = 2; // S/QRV
    q[25] = 125; // QQIC
    let pseudo = pseudo_sum(&QUERIER_V6, &dst, NEXT_ICMPV6, q.len());
    write_checksum(&mut q, 2, 28, pseudo, false);
    let hbh = [NEXT_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&((hbh.len() + q.len()) as u16).to_be_bytes());
    out.extend_from_slice(&[NEXT_HOP_BY_HOP, 1]);
    out.extend_from_slice(&QUERIER_V6);
    out.extend_from_slice(&dst);
    out.extend_from_slice(&hbh);
    out.extend_from_slice(&q);
}

#[cfg(test)]
mod query_tests {
    use super::*;

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
            fold(partial_sum(m, 0) + pseudo_sum(&ip[8..24], &ip[24..40], NEXT_ICMPV6, m.len())),
            0xffff
        );
        assert_eq!((m[0], u16::from_be_bytes([m[4], m[5]])), (130, 1000));
        assert!(maybe_report(&f) && parse(&f).is_none());
    }

    /// Found by the `wire` fuzz target: an IGMPv3 report (checksum right) whose second
    /// record names 1.1.232.1, which is no group. It used to come out as a record, and the
    /// snooper would have opened 01:00:5e:01:e8:01 for it.
    #[test]
    fn records_for_addresses_that_are_no_group_are_skipped() {
        let frame: [u8; 66] = [
            0x01, 0x00, 0x5f, 0x00, 0x00, 0x16, 0x52, 0x54, 0x00, 0xd0, 0xaa, 0x01, 0x08, 0x00, 0x46, 0xc0,
            0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x01, 0x02, 0xf9, 0xe7, 0x0a, 0x01, 0x00, 0x05, 0xe0, 0x00,
            0x00, 0x16, 0x94, 0x04, 0x00, 0x00, 0x22, 0x00, 0xf0, 0xf2, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00,
            0x00, 0x00, 0xef, 0x04, 0x02, 0x01, 0x05, 0x00, 0x00, 0x01, 0x01, 0x01, 0xe8, 0x01, 0x0a, 0x00,
            0x00, 0x01,
        ];
        let r = parse(&frame).expect("still a report");
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
        assert_eq!(parse(&v2([239, 0, 0, 1])).map(|r| r.len()), Some(1));
    }
}
