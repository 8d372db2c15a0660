//! Checksum actions with the semantics of Linux's tc `act_csum`: recompute the chosen
//! checksums of the packets that match, drop the packets whose headers cannot be trusted.
//!
//! Differences from the kernel, both toward correct output: a UDP-Lite pseudo-header
//! carries the IP payload length (RFC 3828 3.2; the kernel puts the coverage there), and an
//! IPv4 header shorter than 5 words is a failure (the kernel would sum at a wrong offset).

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use log::trace;
use thiserror::Error;

use super::packet::Packet;
use crate::stats::QueueStats;
use crate::wire::checksum::write_checksum;
use crate::wire::ip::{
    self, Ipv4Packet, Ipv6Packet, Ipv6Upper, PROTO_ICMP, PROTO_ICMPV6, PROTO_IGMP, PROTO_SCTP, PROTO_TCP,
    PROTO_UDP, PROTO_UDPLITE,
};
use crate::wire::layers::{Layers, Network};
use crate::wire::virtio_net_hdr::{F_DATA_VALID, F_NEEDS_CSUM, GSO_ECN, GSO_TCPV4, GSO_TCPV6};
use crate::wire::VirtioNetHdr;

/// Which checksums an action recomputes (tc's `csum` targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Targets(u8);

impl Targets {
    pub const IPH: Targets = Targets(1);
    pub const ICMP: Targets = Targets(2);
    pub const IGMP: Targets = Targets(4);
    pub const TCP: Targets = Targets(8);
    pub const UDP: Targets = Targets(16);
    pub const UDPLITE: Targets = Targets(32);
    pub const SCTP: Targets = Targets(64);
    const NAMES: [(&'static str, Targets); 7] = [
        ("iph", Self::IPH),
        ("icmp", Self::ICMP),
        ("igmp", Self::IGMP),
        ("tcp", Self::TCP),
        ("udp", Self::UDP),
        ("udplite", Self::UDPLITE),
        ("sctp", Self::SCTP),
    ];

    pub fn has(self, t: Targets) -> bool {
        self.0 & t.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Targets {
    type Output = Targets;
    fn bitor(self, o: Targets) -> Targets {
        Targets(self.0 | o.0)
    }
}

impl fmt::Display for Targets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(_, t)| self.has(*t))
            .map(|(n, _)| *n)
            .collect();
        f.write_str(&names.join("+"))
    }
}

/// Where on a port an action applies: frames entering the switch from it, or leaving to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        })
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ActionParseError {
    #[error("expected key=value, got {0:?}")]
    NotKeyValue(String),
    #[error("unknown key {0:?} (expected port, dir, update, proto, dst)")]
    UnknownKey(String),
    #[error("missing {0}=")]
    Missing(&'static str),
    #[error("bad port {text:?}")]
    Port {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("bad dir {0:?} (expected ingress or egress)")]
    Dir(String),
    #[error("unknown checksum target {0:?} (expected iph, icmp, igmp, tcp, udp, udplite, sctp)")]
    Target(String),
    #[error("bad protocol {text:?} (a number 0-255 or tcp, udp, udplite, icmp, icmpv6, igmp, sctp)")]
    Proto {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("bad destination prefix {text:?}")]
    Prefix {
        text: String,
        #[source]
        source: ipnet::AddrParseError,
    },
}

impl FromStr for Targets {
    type Err = ActionParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut t = Targets::default();
        for name in s.split('+') {
            let (_, bit) = Self::NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ActionParseError::Target(name.to_string()))?;
            t = t | *bit;
        }
        Ok(t)
    }
}

fn parse_proto(s: &str) -> Result<u8, ActionParseError> {
    Ok(match s {
        "icmp" => PROTO_ICMP,
        "igmp" => PROTO_IGMP,
        "tcp" => PROTO_TCP,
        "udp" => PROTO_UDP,
        "icmpv6" => PROTO_ICMPV6,
        "sctp" => PROTO_SCTP,
        "udplite" => PROTO_UDPLITE,
        n => n.parse().map_err(|source| ActionParseError::Proto {
            text: n.into(),
            source,
        })?,
    })
}

/// One `--csum-action`: `port=N,dir=ingress|egress,update=T[+T...][,proto=P][,dst=PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsumAction {
    pub port: usize,
    pub dir: Dir,
    pub update: Targets,
    pub proto: Option<u8>,
    pub dst: Option<IpNet>,
}

impl FromStr for CsumAction {
    type Err = ActionParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut port, mut dir, mut update, mut proto, mut dst) = (None, None, None, None, None);
        for kv in s.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ActionParseError::NotKeyValue(kv.to_string()))?;
            match k {
                "port" => {
                    port = Some(v.parse().map_err(|source| ActionParseError::Port {
                        text: v.into(),
                        source,
                    })?)
                }
                "dir" => {
                    dir = Some(match v {
                        "ingress" => Dir::Ingress,
                        "egress" => Dir::Egress,
                        _ => return Err(ActionParseError::Dir(v.into())),
                    })
                }
                "update" => update = Some(v.parse::<Targets>()?),
                "proto" => proto = Some(parse_proto(v)?),
                "dst" => {
                    dst = Some(v.parse::<IpNet>().map_err(|source| ActionParseError::Prefix {
                        text: v.into(),
                        source,
                    })?)
                }
                _ => return Err(ActionParseError::UnknownKey(k.into())),
            }
        }
        Ok(CsumAction {
            port: port.ok_or(ActionParseError::Missing("port"))?,
            dir: dir.ok_or(ActionParseError::Missing("dir"))?,
            update: update.ok_or(ActionParseError::Missing("update"))?,
            proto,
            dst,
        })
    }
}

impl fmt::Display for CsumAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port={},dir={},update={}", self.port, self.dir, self.update)?;
        if let Some(p) = self.proto {
            write!(f, ",proto={p}")?;
        }
        if let Some(d) = self.dst {
            write!(f, ",dst={d}")?;
        }
        Ok(())
    }
}

impl CsumAction {
    /// Whether the frame passes the action's protocol and destination match.
    pub fn matches(&self, pkt: &mut Packet<'_>) -> bool {
        if self.proto.is_none() && self.dst.is_none() {
            return true;
        }
        let Some((proto, _, dst)) = pkt.layers().addresses(pkt.frame) else {
            return false;
        };
        self.proto.is_none_or(|p| p == proto) && self.dst.is_none_or(|net| net.contains(&dst))
    }
}

/// Why an action dropped a packet: the headers it was asked to fix cannot be trusted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CsumFail {
    #[error("IP header: {0}")]
    Ip(#[from] ip::IpError),
    #[error("IP length {ipl} does not hold {what} (header {hl} + {need} bytes, {have} captured)")]
    Length {
        what: &'static str,
        ipl: usize,
        hl: usize,
        need: usize,
        have: usize,
    },
}

/// What an action did to a frame that it did not drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Done {
    /// Some checksum was written.
    pub wrote: bool,
    /// The upper-layer checksum was computed in full: a virtio partial one is now complete.
    pub l4_complete: bool,
}

/// The L4 header at `hl` of `ip` with at least `need` bytes, within the IP length `ipl`.
fn upper_layer<'a>(
    ip: &'a mut [u8],
    what: &'static str,
    hl: usize,
    ipl: usize,
    need: usize,
) -> Result<&'a mut [u8], CsumFail> {
    if ipl > ip.len() || ipl < hl + need {
        return Err(CsumFail::Length {
            what,
            ipl,
            hl,
            need,
            have: ip.len(),
        });
    }
    Ok(&mut ip[hl..ipl])
}

/// SCTP's CRC32c over the whole packet with the field zeroed, stored in little-endian order
/// (RFC 9260 appendix A).
fn store_sctp(l4: &mut [u8]) {
    l4[8..12].copy_from_slice(&[0; 4]);
    let crc = crc32c::crc32c(l4);
    l4[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// UDP and UDP-Lite, both families. `Ok(false)` leaves the packet as it is: an IPv4 UDP
/// checksum of 0 (none was sent), or a length field that disagrees with the IP length
/// (act_csum passes such "obscure" packets untouched).
fn udp(l4: &mut [u8], lite: bool, v4: bool, pseudo: u64) -> bool {
    let ul = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
    let total = l4.len();
    let covered = if lite {
        match ul {
            0 => total,
            n if (8..=total).contains(&n) => n,
            _ => return false,
        }
    } else {
        if v4 && l4[6] == 0 && l4[7] == 0 {
            return false;
        }
        if ul != total {
            return false;
        }
        ul
    };
    write_checksum(l4, 6, covered, pseudo, true);
    true
}

/// Recomputes the `targets` checksums of one Ethernet frame in place, honouring GSO (a
/// segmentation-offload packet's TCP/SCTP checksum is the segmenter's business).
pub fn update(frame: &mut [u8], targets: Targets, hdr: &VirtioNetHdr) -> Result<Done, CsumFail> {
    update_by(&Layers::parse(frame), frame, targets, hdr)
}

/// [`update`] of a frame whose layers `layers` found.
pub fn update_by(
    layers: &Layers,
    frame: &mut [u8],
    targets: Targets,
    hdr: &VirtioNetHdr,
) -> Result<Done, CsumFail> {
    let Some(ip) = layers.ip_mut(frame) else {
        return Ok(Done::default());
    };
    let gso = hdr.gso_type & !GSO_ECN;
    match layers.network {
        // A bad header: the view's constructor, first thing in each, says why.
        Network::V4 | Network::BadV4 => update_v4(ip, targets, gso),
        Network::V6 => update_v6(ip, layers.upper(), targets, gso),
        Network::BadV6 => update_v6(ip, None, targets, gso),
        Network::Other => Ok(Done::default()),
    }
}

fn update_v4(ip: &mut [u8], targets: Targets, gso: u8) -> Result<Done, CsumFail> {
    let p = Ipv4Packet::new_checked(&*ip)?;
    let (hl, ipl, proto) = (p.header_len(), p.total_len(), p.protocol());
    // The upper layer is `ipl - hl` bytes (`upper_layer` refuses the frame otherwise).
    let ps = p.pseudo_sum(proto, ipl.saturating_sub(hl));
    let mut done = Done::default();
    let proto = if p.is_later_fragment() { None } else { Some(proto) };
    match proto {
        Some(PROTO_ICMP | PROTO_IGMP) => {
            let t = if proto == Some(PROTO_ICMP) {
                Targets::ICMP
            } else {
                Targets::IGMP
            };
            if targets.has(t) {
                let l4 = upper_layer(ip, "ICMP/IGMP header", hl, ipl, 4)?;
                let n = l4.len();
                write_checksum(l4, 2, n, 0, false);
                done = Done {
                    wrote: true,
                    l4_complete: true,
                };
            }
        }
        Some(PROTO_TCP) if targets.has(Targets::TCP) && gso != GSO_TCPV4 => {
            let l4 = upper_layer(ip, "TCP header", hl, ipl, 20)?;
            let n = l4.len();
            write_checksum(l4, 16, n, ps, false);
            done = Done {
                wrote: true,
                l4_complete: true,
            };
        }
        Some(pr @ (PROTO_UDP | PROTO_UDPLITE)) => {
            let lite = pr == PROTO_UDPLITE;
            if targets.has(if lite { Targets::UDPLITE } else { Targets::UDP }) {
                let l4 = upper_layer(ip, "UDP header", hl, ipl, 8)?;
                let wrote = udp(l4, lite, true, ps);
                done = Done {
                    wrote,
                    l4_complete: wrote,
                };
            }
        }
        Some(PROTO_SCTP) if targets.has(Targets::SCTP) => {
            store_sctp(upper_layer(ip, "SCTP header", hl, ipl, 12)?);
            done = Done {
                wrote: true,
                l4_complete: true,
            };
        }
        _ => {}
    }
    if targets.has(Targets::IPH) {
        Ipv4Packet::new_checked(&mut *ip)?.fill_checksum();
        done.wrote = true;
    }
    Ok(done)
}

/// `upper`: what the layers found after the extension headers of the IPv6 header `ip`
/// (`None`: they run past the packet).
fn update_v6(ip: &mut [u8], upper: Option<Ipv6Upper>, targets: Targets, gso: u8) -> Result<Done, CsumFail> {
    let p = Ipv6Packet::new_checked(&*ip)?;
    let Ipv6Upper::Found {
        proto,
        offset: hl,
        packet_len: ipl,
    } = upper.ok_or(ip::IpError::BadExtension)?
    else {
        return Ok(Done::default());
    };
    let ps = p.pseudo_sum(proto, ipl.saturating_sub(hl));
    let complete = Done {
        wrote: true,
        l4_complete: true,
    };
    match proto {
        PROTO_ICMPV6 if targets.has(Targets::ICMP) => {
            let l4 = upper_layer(ip, "ICMPv6 header", hl, ipl, 4)?;
            let n = l4.len();
            write_checksum(l4, 2, n, ps, false);
            Ok(complete)
        }
        PROTO_TCP if targets.has(Targets::TCP) && gso != GSO_TCPV6 => {
            let l4 = upper_layer(ip, "TCP header", hl, ipl, 20)?;
            let n = l4.len();
            write_checksum(l4, 16, n, ps, false);
            Ok(complete)
        }
        PROTO_UDP | PROTO_UDPLITE
            if targets.has(if proto == PROTO_UDP {
                Targets::UDP
            } else {
                Targets::UDPLITE
            }) =>
        {
            let l4 = upper_layer(ip, "UDP header", hl, ipl, 8)?;
            // IPv6 has no "no checksum" UDP: a zero field is recomputed like any other.
            let wrote = udp(l4, proto == PROTO_UDPLITE, false, ps);
            Ok(Done {
                wrote,
                l4_complete: wrote,
            })
        }
        PROTO_SCTP if targets.has(Targets::SCTP) => {
            store_sctp(upper_layer(ip, "SCTP header", hl, ipl, 12)?);
            Ok(complete)
        }
        _ => Ok(Done::default()),
    }
}

/// The result of a port's action list on one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionVerdict {
    /// No action matched, or none had anything to write.
    Untouched,
    Updated,
    Drop,
}

/// Runs `actions` (already those of one port and direction) in order on a frame. A frame
/// whose upper-layer checksum an action computed is marked DATA_VALID (and a virtio partial
/// checksum loses NEEDS_CSUM): a GUEST_CSUM receiver need not verify what was just computed.
///
/// The frame is parsed once, by the first action that looks into it; the rest reuse its
/// layers (the sums they write move no layer).
pub fn run(actions: &[CsumAction], pkt: &mut Packet<'_>) -> (ActionVerdict, Option<CsumFail>) {
    let mut verdict = ActionVerdict::Untouched;
    for a in actions {
        if !a.matches(pkt) {
            continue;
        }
        let layers = pkt.layers();
        match update_by(&layers, pkt.frame, a.update, &pkt.hdr) {
            Ok(d) => {
                if d.l4_complete {
                    pkt.hdr.flags = (pkt.hdr.flags & !F_NEEDS_CSUM) | F_DATA_VALID;
                }
                if d.wrote {
                    verdict = ActionVerdict::Updated;
                }
            }
            Err(e) => return (ActionVerdict::Drop, Some(e)),
        }
    }
    (verdict, None)
}

/// [`run`], counted on `stats` (the queue of the port the actions belong to): false if the
/// frame drops.
pub fn apply(actions: &[CsumAction], pkt: &mut Packet<'_>, stats: &QueueStats) -> bool {
    match run(actions, pkt) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::checksum;
    use crate::wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
    use proptest::prelude::*;

    const SRC: [u8; 4] = [10, 0, 0, 1];
    const DST: [u8; 4] = [10, 0, 1, 2];

    fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    fn ipv4(ihl_opts: &[u8], proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
        let hl = 20 + ihl_opts.len();
        let mut ip = vec![0x40 | (hl / 4) as u8, 0];
        ip.extend_from_slice(&((hl + l4.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 1]);
        ip.extend_from_slice(&frag.to_be_bytes());
        ip.extend_from_slice(&[64, proto, 0xbe, 0xef]);
        ip.extend_from_slice(&SRC);
        ip.extend_from_slice(&DST);
        ip.extend_from_slice(ihl_opts);
        ip.extend_from_slice(l4);
        ip
    }

    fn udp(payload: &[u8], check: u16) -> Vec<u8> {
        let mut u = vec![0x0f, 0xa0, 0x13, 0x88];
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&check.to_be_bytes());
        u.extend_from_slice(payload);
        u
    }

    fn act(s: &str) -> CsumAction {
        s.parse().unwrap()
    }

    fn be16(f: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([f[at], f[at + 1]])
    }

    fn run_one(spec: &str, f: &mut [u8]) -> (ActionVerdict, Option<CsumFail>) {
        run(&[act(spec)], &mut Packet::new(VirtioNetHdr::default(), f))
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

    #[test]
    fn action_syntax() {
        let a = act("port=2,dir=ingress,update=iph+tcp+sctp,proto=tcp,dst=192.168.0.0/16");
        assert_eq!(
            a.to_string(),
            "port=2,dir=ingress,update=iph+tcp+sctp,proto=6,dst=192.168.0.0/16"
        );
        assert_eq!(a.to_string().parse::<CsumAction>().unwrap(), a);
        for (bad, want) in [
            ("port=0,dir=egress", "missing update="),
            ("port=x,dir=egress,update=udp", "bad port"),
            ("port=0,dir=up,update=udp", "bad dir"),
            (
                "port=0,dir=egress,update=udp+ipx",
                "unknown checksum target \"ipx\"",
            ),
            ("port=0,dir=egress,update=udp,proto=999", "bad protocol"),
            (
                "port=0,dir=egress,update=udp,dst=10.0.0.0/33",
                "bad destination prefix",
            ),
            ("port=0,dir=egress,update=udp,colour=red", "unknown key"),
            ("port", "expected key=value"),
        ] {
            let e = bad.parse::<CsumAction>().unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
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
