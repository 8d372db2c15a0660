//! Bucket selection of the FMan MACs, bit for bit as their Linux drivers program them.

use super::layout::Layout;
use crate::wire::MacAddr;

/// Total bucket bits the register file holds (the largest layout, dTSEC: 512).
pub const MAX_BUCKETS: usize = 512;

/// mEMAC: bucket bit k (0..6) is the parity of address octet k, octet 0 first on the wire.
pub fn memac(mac: &MacAddr) -> usize {
    mac.0
        .iter()
        .enumerate()
        .fold(0, |b, (k, o)| b | (((o.count_ones() & 1) as usize) << k))
}

const fn crc_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static CRC_TABLE: [u32; 256] = crc_table();

/// dTSEC: CRC-32 in its reflected form over the six octets, register preset to all ones and
/// not inverted at the end, then bit-reversed: the bucket is its top 8 (or 9) bits.
pub fn dtsec_crc(mac: &MacAddr) -> u32 {
    let crc = mac.0.iter().fold(0xffff_ffffu32, |c, b| {
        (c >> 8) ^ CRC_TABLE[((c ^ u32::from(*b)) & 0xff) as usize]
    });
    crc.reverse_bits()
}

/// The bucket bit (index into the 512-bit map) that `mac` sets, if this layout hashes it.
/// dTSEC normal mode keeps unicast in the first bank of 256 and multicast in the second.
pub fn bucket(layout: Layout, mac: &MacAddr) -> Option<usize> {
    match layout {
        Layout::Exact => None,
        Layout::Memac => mac.is_multicast().then(|| memac(mac)),
        Layout::Dtsec => {
            let b = (dtsec_crc(mac) >> 24) as usize;
            Some(if mac.is_multicast() { 256 + b } else { b })
        }
        Layout::DtsecExtended => mac.is_multicast().then(|| (dtsec_crc(mac) >> 23) as usize),
        // fman_tgec.c `tgec_add_hash_mac_address`: crc32_le from all ones over the six
        // octets, bitrev32, then (crc >> 23) & 0x1ff; unicast is refused. The same buckets
        // as the dTSEC's extended mode (older trees folded the address as the mEMAC does).
        Layout::Tgec => mac
            .is_multicast()
            .then(|| ((dtsec_crc(mac) >> 23) & 0x1ff) as usize),
    }
}

/// Buckets a layout has, for display.
pub fn bucket_count(layout: Layout) -> usize {
    match layout {
        Layout::Exact => 0,
        Layout::Memac => 64,
        Layout::Dtsec | Layout::DtsecExtended | Layout::Tgec => 512,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    /// Expected values computed independently (Python zlib: crc32_le(~0, x) is
    /// ~zlib.crc32(x); parity by hand).
    #[test]
    fn golden_buckets() {
        for (mac, crc_rev, memac_b) in [
            ("01:00:5e:00:00:01", 0x7fa3_2d9b_u32, 37),
            ("01:00:5e:01:02:03", 0xe635_7220, 29),
            ("33:33:00:00:00:01", 0xf99b_aaba, 32),
            ("52:54:00:12:34:56", 0xc177_1627, 19),
            ("ff:ff:ff:ff:ff:ff", 0xff48_647d, 0),
        ] {
            assert_eq!(dtsec_crc(&m(mac)), crc_rev, "{mac}");
            assert_eq!(memac(&m(mac)), memac_b, "{mac}");
        }
        assert_eq!(bucket(Layout::Dtsec, &m("01:00:5e:00:00:01")), Some(256 + 127));
        assert_eq!(bucket(Layout::DtsecExtended, &m("01:00:5e:00:00:01")), Some(255));
        assert_eq!(bucket(Layout::Dtsec, &m("52:54:00:12:34:56")), Some(193));
        assert_eq!(bucket(Layout::DtsecExtended, &m("52:54:00:12:34:56")), None);
        assert_eq!(bucket(Layout::Memac, &m("52:54:00:12:34:56")), None);
        assert_eq!(bucket(Layout::Memac, &m("01:00:5e:01:02:03")), Some(29));
        assert_eq!(bucket(Layout::Exact, &m("01:00:5e:01:02:03")), None);
        assert_eq!(bucket(Layout::Tgec, &m("01:00:5e:00:00:01")), Some(255));
        assert_eq!(
            bucket(Layout::Tgec, &m("33:33:00:00:00:01")),
            Some(0xf99b_aaba >> 23)
        );
        assert_eq!(bucket(Layout::Tgec, &m("52:54:00:12:34:56")), None);
    }
}
