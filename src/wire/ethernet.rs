//! Ethernet II frames and MAC addresses.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of an Ethernet header without VLAN tags.
pub const HEADER_LEN: usize = 14;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EthernetError {
    #[error("frame of {0} bytes is shorter than an Ethernet header")]
    Truncated(usize),
    #[error("invalid MAC address {0:?}: expected six hex octets separated by ':'")]
    BadMac(String),
    #[error("invalid octet in MAC address {mac:?}")]
    BadMacOctet {
        mac: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

/// A 48-bit IEEE MAC address, octet 0 first on the wire.
// zerocopy checks at compile time that a list of addresses is exactly its wire bytes, so
// a control command's table is read in place.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(transparent)]
pub struct MacAddr(pub [u8; 6]);

/// A list of addresses as its wire bytes, six per address, without copying.
pub fn mac_bytes(list: &[MacAddr]) -> &[u8] {
    list.as_bytes()
}

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Reads a MAC address from the first six bytes of `b`, if there are six.
    pub fn from_slice(b: &[u8]) -> Option<Self> {
        b.get(..6).map(|s| {
            let mut a = [0u8; 6];
            a.copy_from_slice(s);
            MacAddr(a)
        })
    }

    pub fn is_broadcast(&self) -> bool {
        self.0 == [0xff; 6]
    }

    /// Group bit set (includes broadcast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// The address as a 48-bit number, octet 0 most significant (as FMan drivers use it).
    pub fn as_u64(&self) -> u64 {
        // Two loads, of four octets and of two, and byte swaps, where a fold over the
        // octets is a loop of six (the switch and every receiver's filter ask for it per
        // frame). Built from eight octets instead, the compiler loads the six as two
        // overlapping words, and when the address sits on the stack as a four- and a
        // two-octet store, the second load spans both and must wait for them to reach the
        // cache (docs/performance.md, "What shaped the path").
        let [a, b, c, d, e, f] = self.0;
        (u64::from(u32::from_be_bytes([a, b, c, d])) << 16) | u64::from(u16::from_be_bytes([e, f]))
    }

    pub fn from_u64(v: u64) -> Self {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            a[0], a[1], a[2], a[3], a[4], a[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = EthernetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || EthernetError::BadMac(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for o in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || p.len() > 2 {
                return Err(bad());
            }
            *o = u8::from_str_radix(p, 16).map_err(|source| EthernetError::BadMacOctet {
                mac: s.to_string(),
                source,
            })?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where each header field lies, named once (as smoltcp's `wire` does).
pub mod field {
    use std::ops::Range;

    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

/// A view of an Ethernet II frame: read-only over `&[u8]`, writable over `&mut [u8]`.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps `buf` after checking that it holds at least a full header.
    pub fn new_checked(buf: T) -> Result<Self, EthernetError> {
        let len = buf.as_ref().len();
        if len < HEADER_LEN {
            return Err(EthernetError::Truncated(len));
        }
        Ok(EthernetFrame { buf })
    }

    fn mac(&self, f: std::ops::Range<usize>) -> MacAddr {
        let b = &self.buf.as_ref()[f];
        MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    pub fn dst(&self) -> MacAddr {
        self.mac(field::DESTINATION)
    }

    pub fn src(&self) -> MacAddr {
        self.mac(field::SOURCE)
    }

    /// Whether the frame is addressed to `mac` (compared in place).
    pub fn is_to(&self, mac: &MacAddr) -> bool {
        self.buf.as_ref()[field::DESTINATION] == mac.0
    }

    pub fn ethertype(&self) -> u16 {
        let b = &self.buf.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
}

/// Writes an Ethernet header into `out`, cleared first: what every frame the daemon builds
/// starts with.
pub fn emit(out: &mut Vec<u8>, dst: MacAddr, src: MacAddr, ethertype: u16) {
    out.clear();
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&src.0);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, mac: MacAddr) {
        self.buf.as_mut()[field::DESTINATION].copy_from_slice(&mac.0);
    }

    pub fn set_src(&mut self, mac: MacAddr) {
        self.buf.as_mut()[field::SOURCE].copy_from_slice(&mac.0);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parse_and_format_round_trip() {
        let m: MacAddr = "01:00:5E:7f:00:01".parse().unwrap();
        assert_eq!(m.0, [0x01, 0x00, 0x5e, 0x7f, 0x00, 0x01]);
        assert_eq!(m.to_string(), "01:00:5e:7f:00:01");
        assert!(m.is_multicast());
        assert!(!m.is_broadcast());
        assert_eq!(MacAddr::from_u64(m.as_u64()), m);
        // Octet 0 most significant, as the FMan drivers write a MAC into a register.
        assert_eq!(m.as_u64(), 0x0100_5e7f_0001);
    }

    #[test]
    fn mac_parse_rejects_garbage() {
        for s in [
            "",
            "01:02:03:04:05",
            "01:02:03:04:05:06:07",
            "0g:00:00:00:00:00",
            "001:0:0:0:0:0",
        ] {
            assert!(s.parse::<MacAddr>().is_err(), "{s} accepted");
        }
    }

    #[test]
    fn mac_bytes_is_the_wire_order() {
        let l = [MacAddr([1, 2, 3, 4, 5, 6]), MacAddr([7, 8, 9, 10, 11, 12])];
        assert_eq!(mac_bytes(&l), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert!(mac_bytes(&[]).is_empty());
    }

    #[test]
    fn ethernet_view_golden_bytes() {
        let bytes = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56, // src
            0x08, 0x06, // ARP
            0xaa,
        ];
        let f = EthernetFrame::new_checked(&bytes[..]).unwrap();
        assert!(f.dst().is_broadcast());
        assert_eq!(f.src().to_string(), "52:54:00:12:34:56");
        assert_eq!(f.ethertype(), ETHERTYPE_ARP);
        assert_eq!(f.payload(), &[0xaa]);
        assert_eq!(
            EthernetFrame::new_checked(&bytes[..13]).unwrap_err(),
            EthernetError::Truncated(13)
        );
    }
}
