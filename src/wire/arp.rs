//! ARP for IPv4 over Ethernet (RFC 826): a checked view and the two messages a router
//! sends.

use std::net::Ipv4Addr;

use thiserror::Error;

use super::ethernet::MacAddr;
use super::ethernet::{ETHERTYPE_ARP, ETHERTYPE_IPV4};

pub const LEN: usize = 28;
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
        let htype = u16::from_be_bytes([b[0], b[1]]);
        let ptype = u16::from_be_bytes([b[2], b[3]]);
        if htype != 1 || ptype != ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
            return Err(ArpError::NotEthernetIpv4 { htype, ptype });
        }
        Ok(ArpPacket { b })
    }

    pub fn op(&self) -> u16 {
        u16::from_be_bytes([self.b[6], self.b[7]])
    }

    pub fn sender_mac(&self) -> MacAddr {
        MacAddr::from_slice(&self.b[8..14]).unwrap_or_default()
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.b[14], self.b[15], self.b[16], self.b[17])
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.b[24], self.b[25], self.b[26], self.b[27])
    }
}

/// Writes a whole Ethernet frame holding an ARP message into `out` (cleared first).
pub fn build(
    out: &mut Vec<u8>,
    op: u16,
    eth_dst: MacAddr,
    sender: (MacAddr, Ipv4Addr),
    target: (MacAddr, Ipv4Addr),
) {
    out.clear();
    out.extend_from_slice(&eth_dst.0);
    out.extend_from_slice(&sender.0 .0);
    out.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    out.extend_from_slice(&op.to_be_bytes());
    out.extend_from_slice(&sender.0 .0);
    out.extend_from_slice(&sender.1.octets());
    out.extend_from_slice(&target.0 .0);
    out.extend_from_slice(&target.1.octets());
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
        build(
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
