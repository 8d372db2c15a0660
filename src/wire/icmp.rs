//! ICMPv4 (RFC 792) as a router needs it: a checked view of a message's type, and the
//! messages it originates (RFC 1812 4.3.2.3): echo replies for its own addresses and errors
//! quoting the packet that caused them.

use std::net::Ipv4Addr;

use thiserror::Error;

use super::checksum::write_checksum;
use super::ethernet::{self, MacAddr, ETHERTYPE_IPV4};
use super::ip::{self, field_v4, PROTO_ICMP};

pub const ECHO_REPLY: u8 = 0;
pub const DEST_UNREACHABLE: u8 = 3;
pub const ECHO_REQUEST: u8 = 8;
pub const TIME_EXCEEDED: u8 = 11;
pub const CODE_NET_UNREACHABLE: u8 = 0;
pub const CODE_HOST_UNREACHABLE: u8 = 1;

/// An ICMPv4 error datagram is at most 576 bytes (RFC 1812 4.3.2.3).
const ERROR_MAX_IP: usize = 576;

/// The ICMP header: type, code, checksum, and four bytes that depend on the type.
pub const HEADER_LEN: usize = 8;

/// Where each ICMP header field lies, named once.
pub mod field {
    use std::ops::Range;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const REST: Range<usize> = 4..8;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IcmpError {
    #[error("ICMP message of {0} bytes is shorter than its 8-byte header")]
    Truncated(usize),
}

/// An ICMP message that holds at least its header. Its checksum is not checked: the router
/// only decides by the type whether to answer, and recomputes what it sends back.
#[derive(Debug)]
pub struct IcmpMessage<'a> {
    b: &'a [u8],
}

impl<'a> IcmpMessage<'a> {
    pub fn new_checked(b: &'a [u8]) -> Result<Self, IcmpError> {
        if b.len() < HEADER_LEN {
            return Err(IcmpError::Truncated(b.len()));
        }
        Ok(IcmpMessage { b })
    }

    pub fn msg_type(&self) -> u8 {
        self.b[field::TYPE]
    }

    pub fn code(&self) -> u8 {
        self.b[field::CODE]
    }
}

/// Writes into `out` an Ethernet frame carrying an ICMPv4 error of `kind`/`code` from `src`
/// to the sender of `orig` (an IPv4 packet, header first), quoting as much of `orig` as fits.
pub fn error_v4(
    out: &mut Vec<u8>,
    macs: (MacAddr, MacAddr),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    kind: u8,
    code: u8,
    orig: &[u8],
) {
    let quote = &orig[..orig.len().min(ERROR_MAX_IP - ip::IPV4_MIN - HEADER_LEN)];
    ethernet::emit(out, macs.1, macs.0, ETHERTYPE_IPV4);
    ip::emit_v4(out, (src, dst), PROTO_ICMP, 64, &[], HEADER_LEN + quote.len());
    let icmp = out.len();
    out.resize(icmp + HEADER_LEN, 0);
    out[icmp + field::TYPE] = kind;
    out[icmp + field::CODE] = code;
    out.extend_from_slice(quote);
    let n = out.len() - icmp;
    write_checksum(&mut out[icmp..], field::CHECKSUM.start, n, 0, false);
}

/// Turns an Ethernet frame holding an ICMPv4 echo request (IPv4 header at `l3`, `hl` bytes,
/// `total` bytes of IP) into the reply, in place: addresses swapped, type 0, TTL 64, both
/// checksums recomputed. The caller has checked the lengths.
pub fn echo_reply_v4(frame: &mut [u8], l3: usize, hl: usize, total: usize, router_mac: MacAddr) {
    if let Ok(mut eth) = ethernet::EthernetFrame::new_checked(&mut *frame) {
        let peer = eth.src();
        eth.set_dst(peer);
        eth.set_src(router_mac);
    }
    let ip = &mut frame[l3..l3 + total];
    let mut a = [0u8; 4];
    a.copy_from_slice(&ip[field_v4::SRC_ADDR]);
    ip.copy_within(field_v4::DST_ADDR, field_v4::SRC_ADDR.start);
    ip[field_v4::DST_ADDR].copy_from_slice(&a);
    ip[field_v4::TTL] = 64;
    write_checksum(ip, field_v4::CHECKSUM.start, hl, 0, false);
    let icmp = &mut ip[hl..];
    icmp[field::TYPE] = ECHO_REPLY;
    let n = icmp.len();
    write_checksum(icmp, field::CHECKSUM.start, n, 0, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::checksum;
    use crate::wire::ip::Ipv4Packet;

    #[test]
    fn time_exceeded_quotes_and_verifies() {
        let orig: Vec<u8> = (0..100u8).collect();
        let mut out = Vec::new();
        let (r, h) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        error_v4(
            &mut out,
            (r, h),
            Ipv4Addr::new(10, 1, 0, 1),
            Ipv4Addr::new(10, 1, 0, 2),
            TIME_EXCEEDED,
            0,
            &orig,
        );
        assert_eq!(&out[0..6], &h.0);
        assert_eq!(&out[6..12], &r.0);
        let ip = Ipv4Packet::new_checked(&out[14..]).unwrap();
        assert_eq!(
            (ip.total_len(), ip.protocol(), ip.ttl()),
            (20 + 8 + 100, PROTO_ICMP, 64)
        );
        assert_eq!(checksum(&out[14..34]), 0);
        assert_eq!(checksum(&out[34..]), 0);
        assert_eq!((out[34], out[35]), (TIME_EXCEEDED, 0));
        assert_eq!(&out[42..], &orig[..]);
        // A long original is cut so the whole datagram stays within 576 bytes.
        error_v4(
            &mut out,
            (r, h),
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::LOCALHOST,
            3,
            0,
            &[0u8; 1500],
        );
        assert_eq!(out.len() - 14, 576);
    }
}
