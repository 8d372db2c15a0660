//! The virtio-net header that precedes every frame on a virtqueue (virtio 1.2, 5.1.6).

use thiserror::Error;

/// Header size with VERSION_1 or MRG_RXBUF (num_buffers present).
pub const HDR_LEN: usize = 12;
/// Legacy header size without num_buffers.
pub const HDR_LEN_LEGACY: usize = 10;
/// With VIRTIO_NET_F_HASH_REPORT: `virtio_net_hdr_v1_hash` adds hash_value, hash_report and
/// padding, in both directions.
pub const HDR_LEN_HASH: usize = 20;

pub const F_NEEDS_CSUM: u8 = 1;
pub const F_DATA_VALID: u8 = 2;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
/// Flag bit on top of a GSO type: the segments carry ECN's CWR.
pub const GSO_ECN: u8 = 0x80;

/// Where each field of `struct virtio_net_hdr_v1_hash` lies (little-endian), named once.
pub mod field {
    use std::ops::Range;

    pub const FLAGS: usize = 0;
    pub const GSO_TYPE: usize = 1;
    pub const HDR_LEN: Range<usize> = 2..4;
    pub const GSO_SIZE: Range<usize> = 4..6;
    pub const CSUM_START: Range<usize> = 6..8;
    pub const CSUM_OFFSET: Range<usize> = 8..10;
    pub const NUM_BUFFERS: Range<usize> = 10..12;
    pub const HASH_VALUE: Range<usize> = 12..16;
    pub const HASH_REPORT: Range<usize> = 16..18;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HdrError {
    #[error("buffer of {got} bytes is shorter than the {want}-byte virtio-net header")]
    Truncated { got: usize, want: usize },
}

/// The fields of `struct virtio_net_hdr_v1`, host byte order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
    /// HASH_REPORT only: the RSS hash of the frame and its type.
    pub hash_value: u32,
    pub hash_report: u16,
}

impl VirtioNetHdr {
    /// Reads the first `len` (10, 12 or 20) bytes of `b`, checked to be there: the
    /// header is small and read whole, so it is decoded rather than viewed.
    pub fn parse(b: &[u8], len: usize) -> Result<Self, HdrError> {
        if b.len() < len || len < HDR_LEN_LEGACY {
            return Err(HdrError::Truncated {
                got: b.len(),
                want: len,
            });
        }
        let le = |f: std::ops::Range<usize>| u16::from_le_bytes([b[f.start], b[f.start + 1]]);
        let hash = len >= HDR_LEN_HASH;
        Ok(VirtioNetHdr {
            flags: b[field::FLAGS],
            gso_type: b[field::GSO_TYPE],
            hdr_len: le(field::HDR_LEN),
            gso_size: le(field::GSO_SIZE),
            csum_start: le(field::CSUM_START),
            csum_offset: le(field::CSUM_OFFSET),
            num_buffers: if len >= HDR_LEN { le(field::NUM_BUFFERS) } else { 0 },
            hash_value: if hash {
                let v = &b[field::HASH_VALUE];
                u32::from_le_bytes([v[0], v[1], v[2], v[3]])
            } else {
                0
            },
            hash_report: if hash { le(field::HASH_REPORT) } else { 0 },
        })
    }

    /// The 20-byte encoding with the hash fields; callers send the first 10 (legacy), 12
    /// (v1, MRG_RXBUF) or all 20 (HASH_REPORT).
    pub fn to_bytes(&self) -> [u8; HDR_LEN_HASH] {
        let mut b = [0u8; HDR_LEN_HASH];
        b[field::FLAGS] = self.flags;
        b[field::GSO_TYPE] = self.gso_type;
        b[field::HDR_LEN].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[field::GSO_SIZE].copy_from_slice(&self.gso_size.to_le_bytes());
        b[field::CSUM_START].copy_from_slice(&self.csum_start.to_le_bytes());
        b[field::CSUM_OFFSET].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[field::NUM_BUFFERS].copy_from_slice(&self.num_buffers.to_le_bytes());
        b[field::HASH_VALUE].copy_from_slice(&self.hash_value.to_le_bytes());
        b[field::HASH_REPORT].copy_from_slice(&self.hash_report.to_le_bytes());
        b
    }

    /// Whether the header of a transmitted frame, as bytes, asks for nothing: no flag, no
    /// GSO, no offsets (the fields before num_buffers all zero). Its num_buffers and hash
    /// fields do not matter: a receiver's header gets its own. DPDK's virtio PMD without
    /// TX offloads leaves them as the headroom held them (the header of the frame's own
    /// receipt, when it forwards).
    pub fn asks_nothing(b: &[u8]) -> bool {
        b.get(..field::NUM_BUFFERS.start) == Some(&[0; field::NUM_BUFFERS.start][..])
    }

    pub fn needs_csum(&self) -> bool {
        self.flags & F_NEEDS_CSUM != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_asks_nothing_with_every_field_before_num_buffers_zero() {
        let mut b = [0u8; HDR_LEN_HASH];
        b[field::NUM_BUFFERS].copy_from_slice(&1u16.to_le_bytes());
        b[field::HASH_VALUE].copy_from_slice(&[1, 2, 3, 4]);
        assert!(VirtioNetHdr::asks_nothing(&b));
        assert!(VirtioNetHdr::asks_nothing(&b[..HDR_LEN_LEGACY]));
        assert!(!VirtioNetHdr::asks_nothing(&b[..HDR_LEN_LEGACY - 1]));
        for at in 0..field::NUM_BUFFERS.start {
            let mut c = b;
            c[at] = 0x80;
            assert!(!VirtioNetHdr::asks_nothing(&c), "byte {at}");
        }
    }

    #[test]
    fn golden_round_trip() {
        let bytes = [
            0x01, 0x00, 0x36, 0x00, 0x00, 0x00, 0x22, 0x00, 0x10, 0x00, 0x02, 0x00,
        ];
        let h = VirtioNetHdr::parse(&bytes, HDR_LEN).unwrap();
        assert!(h.needs_csum());
        assert_eq!(
            (h.hdr_len, h.csum_start, h.csum_offset, h.num_buffers),
            (54, 34, 16, 2)
        );
        assert_eq!(h.to_bytes()[..HDR_LEN], bytes);
        let hashed = VirtioNetHdr {
            hash_value: 0x51cc_c178,
            hash_report: 2,
            ..h
        };
        let b = hashed.to_bytes();
        assert_eq!(&b[12..20], &[0x78, 0xc1, 0xcc, 0x51, 2, 0, 0, 0]);
        assert_eq!(VirtioNetHdr::parse(&b, HDR_LEN_HASH).unwrap(), hashed);
        let legacy = VirtioNetHdr::parse(&bytes, HDR_LEN_LEGACY).unwrap();
        assert_eq!(legacy.num_buffers, 0);
        assert!(VirtioNetHdr::parse(&bytes[..11], HDR_LEN).is_err());
    }
}
