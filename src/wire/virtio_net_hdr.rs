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
    /// Parses the first `len` (10 or 12) bytes of `b`.
    pub fn parse(b: &[u8], len: usize) -> Result<Self, HdrError> {
        if b.len() < len || len < HDR_LEN_LEGACY {
            return Err(HdrError::Truncated {
                got: b.len(),
                want: len,
            });
        }
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
            num_buffers: if len >= HDR_LEN { le(10) } else { 0 },
            hash_value: if len >= HDR_LEN_HASH {
                u32::from_le_bytes([b[12], b[13], b[14], b[15]])
            } else {
                0
            },
            hash_report: if len >= HDR_LEN_HASH { le(16) } else { 0 },
        })
    }

    /// The 20-byte encoding with the hash fields; callers send the first 10 (legacy), 12
    /// (v1, MRG_RXBUF) or all 20 (HASH_REPORT).
    pub fn to_bytes(&self) -> [u8; HDR_LEN_HASH] {
        let mut b = [0u8; HDR_LEN_HASH];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b[12..16].copy_from_slice(&self.hash_value.to_le_bytes());
        b[16..18].copy_from_slice(&self.hash_report.to_le_bytes());
        b
    }

    pub fn needs_csum(&self) -> bool {
        self.flags & F_NEEDS_CSUM != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
