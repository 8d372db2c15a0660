//! IPv4 and IPv6 headers behind an Ethernet header and up to two VLAN tags: where the network
//! header starts, its fields, and where its upper-layer payload starts.
//!
//! Every length here comes from an untrusted frame; views are built with `new_checked` and
//! the accessors then index only within what the constructor verified.

use std::net::{Ipv4Addr, Ipv6Addr};

use thiserror::Error;

use super::checksum;
use super::ethernet;

pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_QINQ: u16 = 0x88a8;

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IGMP: u8 = 2;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_SCTP: u8 = 132;
pub const PROTO_UDPLITE: u8 = 136;

pub const NEXT_HOP: u8 = 0;
const NEXT_ROUTING: u8 = 43;
const NEXT_FRAGMENT: u8 = 44;
const NEXT_DEST: u8 = 60;

pub const IPV4_MIN: usize = 20;
pub const IPV6_LEN: usize = 40;

/// Where each IPv4 header field lies (RFC 791 3.1), named once.
pub mod field_v4 {
    use std::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const LENGTH: Range<usize> = 2..4;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    /// TTL and protocol: the 16-bit word a TTL change alters in the checksum.
    pub const TTL_PROTO: Range<usize> = 8..10;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Where each IPv6 fixed-header field lies (RFC 8200 3), named once.
pub mod field_v6 {
    use std::ops::Range;

    pub const VERSION: usize = 0;
    pub const LENGTH: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

fn be16(b: &[u8], f: std::ops::Range<usize>) -> u16 {
    let w = &b[f];
    u16::from_be_bytes([w[0], w[1]])
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IpError {
    #[error("{what} truncated: {got} bytes, need {need}")]
    Truncated {
        what: &'static str,
        got: usize,
        need: usize,
    },
    #[error("IPv4 header length {0} words is below the minimum of 5")]
    ShortIhl(u8),
    #[error("IP version {0} in a frame of the other family")]
    Version(u8),
    #[error("IPv6 extension header chain runs past the packet")]
    BadExtension,
}

fn need(what: &'static str, got: usize, need: usize) -> Result<(), IpError> {
    if got < need {
        return Err(IpError::Truncated { what, got, need });
    }
    Ok(())
}

/// The EtherType after any 802.1Q / 802.1ad tags, and the offset of the header it names.
/// `None` for a frame too short to hold its own tags.
pub fn network_offset(frame: &[u8]) -> Option<(u16, usize)> {
    let mut at = ethernet::field::ETHERTYPE.start;
    for _ in 0..3 {
        let ty = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
        if ty != ETHERTYPE_VLAN && ty != ETHERTYPE_QINQ {
            return Some((ty, at + 2));
        }
        // Skip TCI and look at the encapsulated type.
        at += 4;
    }
    None
}

/// Appends an IPv4 header (no fragmentation, DF clear) to `out`: `options` (a multiple of
/// four bytes) after the fixed 20, the total length covering `payload_len` more, the
/// checksum filled.
pub fn emit_v4(
    out: &mut Vec<u8>,
    (src, dst): (Ipv4Addr, Ipv4Addr),
    proto: u8,
    ttl: u8,
    options: &[u8],
    payload_len: usize,
) {
    let at = out.len();
    let hl = IPV4_MIN + options.len();
    out.resize(at + hl, 0);
    let h = &mut out[at..];
    h[field_v4::VER_IHL] = 0x40 | (hl / 4) as u8;
    h[field_v4::LENGTH].copy_from_slice(&((hl + payload_len) as u16).to_be_bytes());
    h[field_v4::TTL] = ttl;
    h[field_v4::PROTOCOL] = proto;
    h[field_v4::SRC_ADDR].copy_from_slice(&src.octets());
    h[field_v4::DST_ADDR].copy_from_slice(&dst.octets());
    h[IPV4_MIN..].copy_from_slice(options);
    checksum::write_checksum(h, field_v4::CHECKSUM.start, hl, 0, false);
}

/// Appends an IPv6 fixed header to `out`, its payload length `payload_len`.
pub fn emit_v6(
    out: &mut Vec<u8>,
    (src, dst): (&[u8; 16], &[u8; 16]),
    next: u8,
    hop_limit: u8,
    payload_len: usize,
) {
    let at = out.len();
    out.resize(at + IPV6_LEN, 0);
    let h = &mut out[at..];
    h[field_v6::VERSION] = 0x60;
    h[field_v6::LENGTH].copy_from_slice(&(payload_len as u16).to_be_bytes());
    h[field_v6::NXT_HDR] = next;
    h[field_v6::HOP_LIMIT] = hop_limit;
    h[field_v6::SRC_ADDR].copy_from_slice(src);
    h[field_v6::DST_ADDR].copy_from_slice(dst);
}

/// A view of an IPv4 header whose IHL and options fit the buffer.
#[derive(Debug)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub fn new_checked(buf: T) -> Result<Self, IpError> {
        let b = buf.as_ref();
        need("IPv4 header", b.len(), IPV4_MIN)?;
        if b[field_v4::VER_IHL] >> 4 != 4 {
            return Err(IpError::Version(b[field_v4::VER_IHL] >> 4));
        }
        let ihl = b[field_v4::VER_IHL] & 0x0f;
        if ihl < 5 {
            return Err(IpError::ShortIhl(ihl));
        }
        need("IPv4 options", b.len(), usize::from(ihl) * 4)?;
        Ok(Ipv4Packet { buf })
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.buf.as_ref()[field_v4::VER_IHL] & 0x0f) * 4
    }

    pub fn total_len(&self) -> usize {
        usize::from(be16(self.buf.as_ref(), field_v4::LENGTH))
    }

    /// The fragment offset is non-zero: no upper-layer header in this packet.
    pub fn is_later_fragment(&self) -> bool {
        be16(self.buf.as_ref(), field_v4::FLG_OFF) & 0x1fff != 0
    }

    pub fn ttl(&self) -> u8 {
        self.buf.as_ref()[field_v4::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buf.as_ref()[field_v4::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        be16(self.buf.as_ref(), field_v4::CHECKSUM)
    }

    fn addr(&self, f: std::ops::Range<usize>) -> Ipv4Addr {
        let b = &self.buf.as_ref()[f];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn src(&self) -> Ipv4Addr {
        self.addr(field_v4::SRC_ADDR)
    }

    pub fn dst(&self) -> Ipv4Addr {
        self.addr(field_v4::DST_ADDR)
    }

    /// Pseudo-header sum for an upper-layer length `len` (RFC 793/768), not folded.
    pub fn pseudo_sum(&self, proto: u8, len: usize) -> u64 {
        let b = self.buf.as_ref();
        checksum::pseudo_sum_of(&b[field_v4::SRC_ADDR.start..field_v4::DST_ADDR.end], proto, len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Recomputes the header checksum over IHL words.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        checksum::write_checksum(self.buf.as_mut(), field_v4::CHECKSUM.start, hl, 0, false);
    }

    /// Decrements the TTL and patches the header checksum incrementally (RFC 1624, eqn. 3):
    /// the 16-bit word holding TTL and protocol is the only one that changes.
    pub fn decrement_ttl(&mut self) {
        let b = self.buf.as_mut();
        let old = be16(b, field_v4::TTL_PROTO);
        b[field_v4::TTL] = b[field_v4::TTL].wrapping_sub(1);
        let new = be16(b, field_v4::TTL_PROTO);
        let c = checksum::update16(be16(b, field_v4::CHECKSUM), old, new);
        b[field_v4::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
}

/// Where the upper layer of an IPv6 packet is, after the extension headers act_csum walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Upper {
    /// Protocol, offset from the start of the IPv6 header, and the IPv6 packet length
    /// (40 + payload length, or the jumbo length).
    Found {
        proto: u8,
        offset: usize,
        packet_len: usize,
    },
    /// A fragment header or an unknown next header: no checksum to touch.
    Opaque,
}

/// A view of an IPv6 fixed header.
#[derive(Debug)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub fn new_checked(buf: T) -> Result<Self, IpError> {
        let b = buf.as_ref();
        need("IPv6 header", b.len(), IPV6_LEN)?;
        if b[field_v6::VERSION] >> 4 != 6 {
            return Err(IpError::Version(b[field_v6::VERSION] >> 4));
        }
        Ok(Ipv6Packet { buf })
    }

    pub fn payload_len(&self) -> usize {
        usize::from(be16(self.buf.as_ref(), field_v6::LENGTH))
    }

    pub fn next_header(&self) -> u8 {
        self.buf.as_ref()[field_v6::NXT_HDR]
    }

    pub fn hop_limit(&self) -> u8 {
        self.buf.as_ref()[field_v6::HOP_LIMIT]
    }

    fn addr(&self, f: std::ops::Range<usize>) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf.as_ref()[f]);
        Ipv6Addr::from(a)
    }

    pub fn src(&self) -> Ipv6Addr {
        self.addr(field_v6::SRC_ADDR)
    }

    pub fn dst(&self) -> Ipv6Addr {
        self.addr(field_v6::DST_ADDR)
    }

    /// Pseudo-header sum (RFC 8200 8.1) for an upper-layer length `len`, not folded.
    pub fn pseudo_sum(&self, proto: u8, len: usize) -> u64 {
        let b = self.buf.as_ref();
        checksum::pseudo_sum_of(&b[field_v6::SRC_ADDR.start..field_v6::DST_ADDR.end], proto, len)
    }

    /// Walks hop-by-hop, routing and destination-options headers to the upper layer. A
    /// jumbo payload option replaces the payload length. Fragments are opaque: even the
    /// first one's checksum covers data this packet does not hold.
    pub fn upper(&self) -> Result<Ipv6Upper, IpError> {
        let b = self.buf.as_ref();
        let mut packet_len = IPV6_LEN + self.payload_len();
        let mut next = self.next_header();
        let mut at = IPV6_LEN;
        loop {
            match next {
                NEXT_HOP | NEXT_ROUTING | NEXT_DEST => {
                    let hdr = b.get(at..at + 2).ok_or(IpError::BadExtension)?;
                    let len = (usize::from(hdr[1]) + 1) * 8;
                    let ext = b.get(at..at + len).ok_or(IpError::BadExtension)?;
                    if next == NEXT_HOP {
                        if let Some(jumbo) = jumbo_len(ext)? {
                            packet_len = IPV6_LEN + jumbo;
                        }
                    }
                    next = ext[0];
                    at += len;
                }
                NEXT_FRAGMENT => return Ok(Ipv6Upper::Opaque),
                PROTO_ICMPV6 | PROTO_TCP | PROTO_UDP | PROTO_UDPLITE | PROTO_SCTP => {
                    return Ok(Ipv6Upper::Found {
                        proto: next,
                        offset: at,
                        packet_len,
                    })
                }
                _ => return Ok(Ipv6Upper::Opaque),
            }
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    pub fn decrement_hop_limit(&mut self) {
        let b = self.buf.as_mut();
        b[field_v6::HOP_LIMIT] = b[field_v6::HOP_LIMIT].wrapping_sub(1);
    }
}

/// The jumbo payload length in a hop-by-hop header, if it has a well-formed one (RFC 2675:
/// option 0xC2, length 4, at offset 4n+2). A malformed jumbo option is an error; other
/// options that overrun the header end the scan, as the kernel's act_csum does.
fn jumbo_len(ext: &[u8]) -> Result<Option<usize>, IpError> {
    let mut off = 2;
    while ext.len() > off + 1 {
        match ext[off] {
            0 => off += 1,
            0xc2 => {
                let optlen = usize::from(ext[off + 1]) + 2;
                if optlen != 6 || ext.len() < off + 6 || off & 3 != 2 {
                    return Err(IpError::BadExtension);
                }
                let v = u32::from_be_bytes([ext[off + 2], ext[off + 3], ext[off + 4], ext[off + 5]]);
                return Ok(Some(v as usize));
            }
            _ => {
                let optlen = usize::from(ext[off + 1]) + 2;
                if off + optlen > ext.len() {
                    return Ok(None);
                }
                off += optlen;
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};

    fn eth(ty: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ty.to_be_bytes());
        f
    }

    #[test]
    fn vlan_tags_are_skipped() {
        let mut f = eth(ETHERTYPE_QINQ);
        f.extend_from_slice(&[0x00, 0x05, 0x81, 0x00, 0x00, 0x07, 0x08, 0x00]);
        assert_eq!(network_offset(&f), Some((ETHERTYPE_IPV4, 22)));
        assert_eq!(network_offset(&eth(ETHERTYPE_IPV6)), Some((ETHERTYPE_IPV6, 14)));
        // A tag with nothing after it.
        assert_eq!(network_offset(&eth(ETHERTYPE_VLAN)), None);
        assert_eq!(network_offset(&[0u8; 5]), None);
    }

    #[test]
    fn ipv4_checked_and_ttl_update_golden() {
        // The header of the checksum module's golden test (checksum 0xb861, TTL 64).
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01,
            0xc0, 0xa8, 0x00, 0xc7,
        ];
        let mut p = Ipv4Packet::new_checked(&mut hdr[..]).unwrap();
        assert_eq!((p.ttl(), p.protocol(), p.total_len()), (64, PROTO_UDP, 0x73));
        assert_eq!(p.dst(), Ipv4Addr::new(192, 168, 0, 199));
        p.decrement_ttl();
        assert_eq!(p.ttl(), 63);
        // TTL is the high byte of its word: the checksum rises by 0x0100.
        assert_eq!(p.checksum(), 0xb961);
        let inc = p.checksum();
        p.fill_checksum();
        assert_eq!(p.checksum(), inc);

        assert_eq!(
            Ipv4Packet::new_checked(&[0x44u8; 20][..]).unwrap_err(),
            IpError::ShortIhl(4)
        );
        let mut opts = [0u8; 23];
        opts[0] = 0x46;
        assert!(matches!(
            Ipv4Packet::new_checked(&opts[..]),
            Err(IpError::Truncated { need: 24, .. })
        ));
        assert_eq!(
            Ipv4Packet::new_checked(&[0x65u8; 20][..]).unwrap_err(),
            IpError::Version(6)
        );
    }

    fn ipv6(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        p.extend_from_slice(&[next, 64]);
        p.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn ipv6_extension_walk() {
        // Hop-by-hop (8 bytes, PadN) then destination options (8 bytes) then UDP.
        let mut pl = vec![NEXT_DEST, 0, 1, 4, 0, 0, 0, 0];
        pl.extend_from_slice(&[PROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
        pl.extend_from_slice(&[0u8; 8]);
        let p = ipv6(NEXT_HOP, &pl);
        assert_eq!(
            Ipv6Packet::new_checked(&p[..]).unwrap().upper(),
            Ok(Ipv6Upper::Found {
                proto: PROTO_UDP,
                offset: 56,
                packet_len: 64
            })
        );
        // A fragment header hides the upper layer.
        let p = ipv6(NEXT_FRAGMENT, &[PROTO_UDP, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(
            Ipv6Packet::new_checked(&p[..]).unwrap().upper(),
            Ok(Ipv6Upper::Opaque)
        );
        // An extension header longer than the packet.
        let p = ipv6(NEXT_ROUTING, &[PROTO_UDP, 3, 0, 0]);
        assert_eq!(
            Ipv6Packet::new_checked(&p[..]).unwrap().upper(),
            Err(IpError::BadExtension)
        );
    }

    #[test]
    fn ipv6_jumbo_option_sets_the_length() {
        let mut pl = vec![PROTO_TCP, 0, 0xc2, 4];
        pl.extend_from_slice(&70_000u32.to_be_bytes());
        let p = ipv6(NEXT_HOP, &pl);
        assert_eq!(
            Ipv6Packet::new_checked(&p[..]).unwrap().upper(),
            Ok(Ipv6Upper::Found {
                proto: PROTO_TCP,
                offset: 48,
                packet_len: 70_040
            })
        );
        // Misaligned jumbo option.
        let p = ipv6(NEXT_HOP, &[PROTO_TCP, 0, 0, 0xc2, 4, 0, 0, 0]);
        assert_eq!(
            Ipv6Packet::new_checked(&p[..]).unwrap().upper(),
            Err(IpError::BadExtension)
        );
    }
}
