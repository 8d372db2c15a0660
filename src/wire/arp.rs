//! ARP for IPv4 over Ethernet (RFC 826): a checked view and the two messages a router
//! sends.

use std::net::Ipv4Addr;

use thiserror::Error;

use super::ethernet::{self, MacAddr, ETHERTYPE_ARP, ETHERTYPE_IPV4};

pub const LEN: usize = 28;

/// Where each field of an Ethernet/IPv4 ARP packet lies (RFC 826), named once.
pub mod field {
    use std::ops::Range;

    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// HTYPE of Ethernet.
const HTYPE_ETHERNET: u16 = 1;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArpError {
    #[error("ARP packet of {0} bytes is shorter than 28")]
    Truncated(usize),
    #[error("ARP for hardware {htype:#x} / protocol {ptype:#x} is not Ethernet/IPv4")]
    NotEthernetIpv4 { htype: u16, ptype: u16 },
}

/// An Ethernet/IPv4 ARP packet (the Ethernet payload).
#[derive(Debug)]
pub struct ArpPacket<'a> {
    b: &'a [u8],
}

impl<'a> ArpPacket<'a> {
    pub fn new_checked(b: &'a [u8]) -> Result<Self, ArpError> {
        if b.len() < LEN {
            return Err(ArpError::Truncated(b.len()));
        }
        let p = ArpPacket { b };
        let (htype, ptype) = (p.be16(field::HTYPE), p.be16(field::PTYPE));
        if htype != HTYPE_ETHERNET || ptype != ETHERTYPE_IPV4 || b[field::HLEN] != 6 || b[field::PLEN] != 4 {
            return Err(ArpError::NotEthernetIpv4 { htype, ptype });
        }
        Ok(p)
    }

    fn be16(&self, f: std::ops::Range<usize>) -> u16 {
        let w = &self.b[f];
        u16::from_be_bytes([w[0], w[1]])
    }

    fn ipv4(&self, f: std::ops::Range<usize>) -> Ipv4Addr {
        let a = &self.b[f];
        Ipv4Addr::new(a[0], a[1], a[2], a[3])
    }

    pub fn op(&self) -> u16 {
        self.be16(field::OPER)
    }

    pub fn sender_mac(&self) -> MacAddr {
        MacAddr::from_slice(&self.b[field::SHA]).unwrap_or_default()
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        self.ipv4(field::SPA)
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        self.ipv4(field::TPA)
    }
}

/// Writes a whole Ethernet frame holding an ARP message into `out` (cleared first).
pub fn emit(
    out: &mut Vec<u8>,
    op: u16,
    eth_dst: MacAddr,
    sender: (MacAddr, Ipv4Addr),
    target: (MacAddr, Ipv4Addr),
) {
    ethernet::emit(out, eth_dst, sender.0, ETHERTYPE_ARP);
    let at = out.len();
    out.resize(at + LEN, 0);
    let arp = &mut out[at..];
    arp[field::HTYPE].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
    arp[field::PTYPE].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    arp[field::HLEN] = 6;
    arp[field::PLEN] = 4;
    arp[field::OPER].copy_from_slice(&op.to_be_bytes());
    arp[field::SHA].copy_from_slice(&sender.0 .0);
    arp[field::SPA].copy_from_slice(&sender.1.octets());
    arp[field::THA].copy_from_slice(&target.0 .0);
    arp[field::TPA].copy_from_slice(&target.1.octets());
    // Pad to the 60-byte Ethernet minimum, as a NIC would.
    out.resize(60, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_golden_and_round_trip() {
        let me: MacAddr = "02:76:6e:69:63:00".parse().unwrap();
        let mut f = Vec::new();
        emit(
            &mut f,
            OP_REQUEST,
            MacAddr::BROADCAST,
            (me, Ipv4Addr::new(10, 1, 0, 1)),
            (MacAddr::default(), Ipv4Addr::new(10, 1, 0, 2)),
        );
        assert_eq!(f.len(), 60);
        assert_eq!(
            &f[12..42],
            &[
                0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1, 2, 0x76, 0x6e, 0x69, 0x63, 0, 10, 1, 0, 1, 0, 0, 0, 0, 0,
                0, 10, 1, 0, 2
            ]
        );
        let a = ArpPacket::new_checked(&f[14..]).unwrap();
        assert_eq!(
            (a.op(), a.sender_mac(), a.sender_ip()),
            (OP_REQUEST, me, Ipv4Addr::new(10, 1, 0, 1))
        );
        assert_eq!(a.target_ip(), Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(
            ArpPacket::new_checked(&f[14..40]).unwrap_err(),
            ArpError::Truncated(26)
        );
        let mut bad = f[14..].to_vec();
        bad[3] = 0xdd;
        assert!(matches!(
            ArpPacket::new_checked(&bad),
            Err(ArpError::NotEthernetIpv4 { .. })
        ));
    }
}
