//! The ICMP messages a router originates (RFC 792, RFC 1812 4.3.2.3, RFC 4443): echo
//! replies for its own addresses and errors quoting the packet that caused them.

use std::net::Ipv4Addr;

use super::checksum::write_checksum;
use super::ethernet::MacAddr;
use super::ethernet::ETHERTYPE_IPV4;
use super::ip::PROTO_ICMP;

pub const ECHO_REPLY: u8 = 0;
pub const DEST_UNREACHABLE: u8 = 3;
pub const ECHO_REQUEST: u8 = 8;
pub const TIME_EXCEEDED: u8 = 11;
pub const CODE_NET_UNREACHABLE: u8 = 0;
pub const CODE_HOST_UNREACHABLE: u8 = 1;

/// An ICMPv4 error datagram is at most 576 bytes (RFC 1812 4.3.2.3).
const ERROR_MAX_IP: usize = 576;

fn ipv4_header(out: &mut Vec<u8>, src: Ipv4Addr, dst: Ipv4Addr, payload_len: usize) {
    let start = out.len();
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 64, PROTO_ICMP, 0, 0]);
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&dst.octets());
    write_checksum(&mut out[start..], 10, 20, 0, false);
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
    let quote = &orig[..orig.len().min(ERROR_MAX_IP - 28)];
    out.clear();
    out.extend_from_slice(&macs.1 .0);
    out.extend_from_slice(&macs.0 .0);
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    ipv4_header(out, src, dst, 8 + quote.len());
    let icmp = out.len();
    out.extend_from_slice(&[kind, code, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(quote);
    let n = out.len() - icmp;
    write_checksum(&mut out[icmp..], 2, n, 0, false);
}

/// Turns an Ethernet frame holding an ICMPv4 echo request (IPv4 header at `l3`, `hl` bytes,
/// `total` bytes of IP) into the reply, in place: addresses swapped, type 0, TTL 64, both
/// checksums recomputed. The caller has checked the lengths.
pub fn echo_reply_v4(frame: &mut [u8], l3: usize, hl: usize, total: usize, router_mac: MacAddr) {
    let (dst_mac, ip_end) = (MacAddr::from_slice(&frame[6..12]).unwrap_or_default(), l3 + total);
    frame[0..6].copy_from_slice(&dst_mac.0);
    frame[6..12].copy_from_slice(&router_mac.0);
    let ip = &mut frame[l3..ip_end];
    let mut a = [0u8; 4];
    a.copy_from_slice(&ip[12..16]);
    ip.copy_within(16..20, 12);
    ip[16..20].copy_from_slice(&a);
    ip[8] = 64;
    write_checksum(ip, 10, hl, 0, false);
    let icmp = &mut ip[hl..];
    icmp[0] = ECHO_REPLY;
    let n = icmp.len();
    write_checksum(icmp, 2, n, 0, false);
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
