//! ICMPv6 (RFC 4443) as a router needs it: neighbour discovery (RFC 4861), solicitations
//! and advertisements with their link-layer address options, read through a checked view
//! and sent; echo replies and errors, each a whole Ethernet frame with a valid checksum.

use std::net::Ipv6Addr;

use thiserror::Error;

use super::checksum::{pseudo_sum, write_checksum};
use super::ethernet::{self, MacAddr, ETHERTYPE_IPV6};
use super::ip::{self, field_v6, IPV6_LEN, PROTO_ICMPV6};

pub const ECHO_REQUEST: u8 = 128;
pub const ECHO_REPLY: u8 = 129;
pub const NEIGHBOR_SOLICIT: u8 = 135;
pub const NEIGHBOR_ADVERT: u8 = 136;
pub const DEST_UNREACHABLE: u8 = 1;
pub const TIME_EXCEEDED: u8 = 3;

/// The ICMPv6 header: type, code, checksum, and four bytes that depend on the type.
pub const HEADER_LEN: usize = 8;

/// Where each ICMPv6 field lies, named once; a neighbour solicitation's or advertisement's
/// target and options follow the header.
pub mod field {
    use std::ops::Range;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    /// NA: router, solicited, override.
    pub const NA_FLAGS: usize = 4;
    pub const ND_TARGET: Range<usize> = 8..24;
    pub const ND_OPTIONS: usize = 24;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Icmpv6Error {
    #[error("ICMPv6 message of {0} bytes is shorter than its 8-byte header")]
    Truncated(usize),
}

/// An ICMPv6 message that holds at least its header. Its checksum is not checked here:
/// the router decides by the type, and neighbour discovery by its own rules (RFC 4861 7.1).
#[derive(Debug)]
pub struct Icmpv6Message<'a> {
    b: &'a [u8],
}

impl<'a> Icmpv6Message<'a> {
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Icmpv6Error> {
        if b.len() < HEADER_LEN {
            return Err(Icmpv6Error::Truncated(b.len()));
        }
        Ok(Icmpv6Message { b })
    }

    pub fn msg_type(&self) -> u8 {
        self.b[field::TYPE]
    }

    pub fn code(&self) -> u8 {
        self.b[field::CODE]
    }

    pub fn len(&self) -> usize {
        self.b.len()
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// The message as a neighbour solicitation or advertisement, if it is a valid one.
    pub fn neighbour(&self, hop_limit: u8) -> Option<NeighbourMessage> {
        parse_neighbour(hop_limit, self.b)
    }
}

const OPT_SOURCE_LLA: u8 = 1;
const OPT_TARGET_LLA: u8 = 2;
/// NA flags: router, solicited, override.
const NA_ROUTER: u8 = 0x80;
const NA_SOLICITED: u8 = 0x40;
const NA_OVERRIDE: u8 = 0x20;
/// An ICMPv6 error must fit the IPv6 minimum MTU (RFC 4443 2.4(c)).
const ERROR_MAX_IP: usize = 1280;

/// A neighbour solicitation or advertisement, parsed from an ICMPv6 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighbourMessage {
    pub kind: u8,
    pub target: Ipv6Addr,
    /// The source (NS) or target (NA) link-layer address option, if present.
    pub lla: Option<MacAddr>,
}

/// Parses an NS or NA (`icmp` is the ICMPv6 message, checksum already verified by the
/// caller or not needed). RFC 4861 7.1.1: hop limit 255 and code 0, else ignored.
pub fn parse_neighbour(hop_limit: u8, icmp: &[u8]) -> Option<NeighbourMessage> {
    let kind = *icmp.get(field::TYPE)?;
    if !matches!(kind, NEIGHBOR_SOLICIT | NEIGHBOR_ADVERT)
        || hop_limit != 255
        || icmp.get(field::CODE) != Some(&0)
    {
        return None;
    }
    let target: [u8; 16] = icmp.get(field::ND_TARGET)?.try_into().ok()?;
    let want = if kind == NEIGHBOR_SOLICIT {
        OPT_SOURCE_LLA
    } else {
        OPT_TARGET_LLA
    };
    let mut opts = &icmp[field::ND_OPTIONS..];
    let mut lla = None;
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            return None;
        }
        if opts[0] == want && len == 8 {
            lla = MacAddr::from_slice(&opts[2..8]);
        }
        opts = &opts[len..];
    }
    Some(NeighbourMessage {
        kind,
        target: Ipv6Addr::from(target),
        lla,
    })
}

/// The solicited-node multicast address of `a` (RFC 4291 2.7.1) and its MAC (33:33 + low 32).
pub fn solicited_node(a: &Ipv6Addr) -> (Ipv6Addr, MacAddr) {
    let o = a.octets();
    let ip = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    );
    (ip, MacAddr([0x33, 0x33, 0xff, o[13], o[14], o[15]]))
}

/// Starts a frame: Ethernet, IPv6 header for an ICMPv6 payload of `len` bytes.
fn header(out: &mut Vec<u8>, macs: (MacAddr, MacAddr), src: &Ipv6Addr, dst: &Ipv6Addr, hop: u8, len: usize) {
    ethernet::emit(out, macs.1, macs.0, ETHERTYPE_IPV6);
    ip::emit_v6(out, (&src.octets(), &dst.octets()), PROTO_ICMPV6, hop, len);
}

/// Fills the ICMPv6 checksum of a frame built by `header` + message.
fn finish(out: &mut [u8]) {
    let (ip, icmp) = out[ethernet::HEADER_LEN..].split_at_mut(IPV6_LEN);
    let (n, pseudo) = (
        icmp.len(),
        pseudo_sum(
            &ip[field_v6::SRC_ADDR],
            &ip[field_v6::DST_ADDR],
            PROTO_ICMPV6,
            icmp.len(),
        ),
    );
    write_checksum(icmp, field::CHECKSUM.start, n, pseudo, false);
}

/// A solicited neighbour advertisement from the router: `target` is at `mac`.
pub fn advert(out: &mut Vec<u8>, mac: MacAddr, target: &Ipv6Addr, to: (MacAddr, Ipv6Addr)) {
    header(out, (mac, to.0), target, &to.1, 255, 32);
    out.extend_from_slice(&[
        NEIGHBOR_ADVERT,
        0,
        0,
        0,
        NA_ROUTER | NA_SOLICITED | NA_OVERRIDE,
        0,
        0,
        0,
    ]);
    out.extend_from_slice(&target.octets());
    out.extend_from_slice(&[OPT_TARGET_LLA, 1]);
    out.extend_from_slice(&mac.0);
    finish(out);
}

/// A neighbour solicitation for `target`, to its solicited-node group.
pub fn solicit(out: &mut Vec<u8>, mac: MacAddr, src: &Ipv6Addr, target: &Ipv6Addr) {
    let (group, gmac) = solicited_node(target);
    header(out, (mac, gmac), src, &group, 255, 32);
    out.extend_from_slice(&[NEIGHBOR_SOLICIT, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&target.octets());
    out.extend_from_slice(&[OPT_SOURCE_LLA, 1]);
    out.extend_from_slice(&mac.0);
    finish(out);
}

/// An ICMPv6 error from `src` to the sender of `orig` (an IPv6 packet), quoting as much of
/// it as the minimum MTU allows.
pub fn error(out: &mut Vec<u8>, macs: (MacAddr, MacAddr), src: &Ipv6Addr, kind: u8, code: u8, orig: &[u8]) {
    let Some(dst) = orig
        .get(field_v6::SRC_ADDR)
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
    else {
        return;
    };
    let quote = &orig[..orig.len().min(ERROR_MAX_IP - IPV6_LEN - HEADER_LEN)];
    header(out, macs, src, &Ipv6Addr::from(dst), 64, 8 + quote.len());
    out.extend_from_slice(&[kind, code, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(quote);
    finish(out);
}

/// Turns a frame holding an ICMPv6 echo request whose IPv6 payload is the ICMP message into
/// the reply, in place (addresses swapped, type 129, hop limit 64, checksum).
pub fn echo_reply(frame: &mut [u8], router_mac: MacAddr) {
    if let Ok(mut eth) = ethernet::EthernetFrame::new_checked(&mut *frame) {
        let peer = eth.src();
        eth.set_dst(peer);
        eth.set_src(router_mac);
    }
    let ip = &mut frame[ethernet::HEADER_LEN..];
    let mut a = [0u8; 16];
    a.copy_from_slice(&ip[field_v6::SRC_ADDR]);
    ip.copy_within(field_v6::DST_ADDR, field_v6::SRC_ADDR.start);
    ip[field_v6::DST_ADDR].copy_from_slice(&a);
    ip[field_v6::HOP_LIMIT] = 64;
    ip[IPV6_LEN + field::TYPE] = ECHO_REPLY;
    finish(frame);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::{fold, partial_sum};

    fn verifies(f: &[u8]) -> bool {
        let (ip, icmp) = f[14..].split_at(40);
        fold(partial_sum(icmp, 0) + pseudo_sum(&ip[8..24], &ip[24..40], PROTO_ICMPV6, icmp.len())) == 0xffff
    }

    #[test]
    fn solicit_and_advert_round_trip() {
        let mac = MacAddr([2, 0x76, 0x6e, 0x69, 0x63, 1]);
        let me: Ipv6Addr = "fd00:1::1".parse().unwrap();
        let peer: Ipv6Addr = "fd00:1::2:3456".parse().unwrap();
        let mut f = Vec::new();
        solicit(&mut f, mac, &me, &peer);
        assert_eq!(&f[..6], &[0x33, 0x33, 0xff, 0x02, 0x34, 0x56]);
        assert_eq!(
            &f[38..54],
            &"ff02::1:ff02:3456".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert!(verifies(&f));
        let n = parse_neighbour(f[21], &f[54..]).unwrap();
        assert_eq!((n.kind, n.target, n.lla), (NEIGHBOR_SOLICIT, peer, Some(mac)));
        advert(&mut f, mac, &me, (MacAddr([2, 0, 0, 0, 0, 2]), peer));
        assert!(verifies(&f));
        let n = parse_neighbour(f[21], &f[54..]).unwrap();
        assert_eq!((n.kind, n.target, n.lla), (NEIGHBOR_ADVERT, me, Some(mac)));
        assert_eq!(f[58], NA_ROUTER | NA_SOLICITED | NA_OVERRIDE);
        // Hop limit other than 255: not a valid ND message.
        assert!(parse_neighbour(64, &f[54..]).is_none());
        // An option of length 0 is malformed.
        let mut bad = f[54..].to_vec();
        bad[25] = 0;
        assert!(parse_neighbour(255, &bad).is_none());
        assert!(parse_neighbour(255, &bad[..10]).is_none());
    }

    #[test]
    fn error_quotes_within_the_minimum_mtu() {
        let mut orig = vec![0x60, 0, 0, 0, 0x05, 0xc8, 17, 1];
        orig.extend_from_slice(&"fd00:2::2".parse::<Ipv6Addr>().unwrap().octets());
        orig.extend_from_slice(&"fd00:1::2".parse::<Ipv6Addr>().unwrap().octets());
        orig.resize(1500, 0xab);
        let mut f = Vec::new();
        let src: Ipv6Addr = "fd00:2::1".parse().unwrap();
        error(
            &mut f,
            (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])),
            &src,
            TIME_EXCEEDED,
            0,
            &orig,
        );
        assert_eq!(f.len() - 14, 1280);
        assert!(verifies(&f));
        assert_eq!(&f[38..54], &orig[8..24], "sent back to the original source");
    }
}
