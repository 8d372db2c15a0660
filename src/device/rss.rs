//! Receive-side scaling: which RX queue a frame goes to, and the hash the device reports
//! (virtio 1.2, 5.1.6.4.3 and 5.1.6.5.7; FMan's KeyGen plays this part on DPAA).
//!
//! The Toeplitz hash runs over the flow's addresses and ports with the driver's key. The
//! control path parses `VIRTIO_NET_CTRL_MQ_RSS_CONFIG` / `HASH_CONFIG` and publishes a
//! [`Steering`] snapshot; the RX path reads it without a lock and computes one hash per
//! frame from a per-key lookup table (no bit loop, no allocation).

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;
use thiserror::Error;

use crate::wire::ip::{Ipv4Packet, Ipv6Packet, Ipv6Upper, PROTO_TCP, PROTO_UDP};
use crate::wire::layers::{Layers, Network};

/// Key and table sizes we advertise in config space (the Linux driver's maxima).
pub const MAX_KEY: usize = 40;
pub const MAX_TABLE: usize = 128;

/// `supported_hash_types` bits (virtio 1.2, 5.1.6.4.3.1).
pub const HASH_IPV4: u32 = 1 << 0;
pub const HASH_TCPV4: u32 = 1 << 1;
pub const HASH_UDPV4: u32 = 1 << 2;
pub const HASH_IPV6: u32 = 1 << 3;
pub const HASH_TCPV6: u32 = 1 << 4;
pub const HASH_UDPV6: u32 = 1 << 5;
/// What we compute: no IPv6 extension-header (`_EX`) variants.
pub const SUPPORTED: u32 = HASH_IPV4 | HASH_TCPV4 | HASH_UDPV4 | HASH_IPV6 | HASH_TCPV6 | HASH_UDPV6;

/// `hash_report` values in the virtio-net header.
pub const REPORT_NONE: u16 = 0;
pub const REPORT_IPV4: u16 = 1;
pub const REPORT_TCPV4: u16 = 2;
pub const REPORT_UDPV4: u16 = 3;
pub const REPORT_IPV6: u16 = 4;
pub const REPORT_TCPV6: u16 = 5;
pub const REPORT_UDPV6: u16 = 6;

/// The key Microsoft's RSS documentation verifies against; used until a driver sets its own
/// (and always in the net attachment, where QEMU keeps the control queue).
pub const DEFAULT_KEY: [u8; MAX_KEY] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0,
    0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42,
    0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Longest hash input: IPv6 source and destination plus two ports.
const MAX_INPUT: usize = 36;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RssError {
    #[error("RSS command of {0} bytes is shorter than its fixed part")]
    Truncated(usize),
    #[error("indirection table length {0} is not a power of two up to {MAX_TABLE}")]
    TableLength(usize),
    #[error("queue {queue} in the RSS command is beyond the {pairs} queue pairs")]
    Queue { queue: u16, pairs: u16 },
    #[error("key of {0} bytes; the device takes 1..={MAX_KEY}")]
    KeyLength(usize),
    #[error("hash types {0:#x} include some the device does not support")]
    HashTypes(u32),
}

/// A driver's RSS (or hash-report-only) configuration, as the control queue sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RssConfig {
    pub hash_types: u32,
    /// Empty for HASH_CONFIG: hashes are reported but do not steer.
    pub indirection: Vec<u16>,
    pub unclassified_queue: u16,
    /// RSS_CONFIG also sets how many TX queues the driver uses.
    pub max_tx_vq: u16,
    pub key: Vec<u8>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl RssConfig {
    /// `struct virtio_net_rss_config`: le32 hash_types, le16 indirection_table_mask,
    /// le16 unclassified_queue, le16 indirection_table[mask + 1], le16 max_tx_vq,
    /// u8 hash_key_length, u8 hash_key_data[].
    pub fn parse_rss(data: &[u8], pairs: u16) -> Result<Self, RssError> {
        if data.len() < 8 {
            return Err(RssError::Truncated(data.len()));
        }
        let hash_types = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let entries = usize::from(le16(data, 4)) + 1;
        if !entries.is_power_of_two() || entries > MAX_TABLE {
            return Err(RssError::TableLength(entries));
        }
        let unclassified_queue = le16(data, 6);
        let table_end = 8 + 2 * entries;
        if data.len() < table_end + 3 {
            return Err(RssError::Truncated(data.len()));
        }
        let indirection: Vec<u16> = data[8..table_end].chunks_exact(2).map(|c| le16(c, 0)).collect();
        let max_tx_vq = le16(data, table_end);
        for &queue in indirection.iter().chain([&unclassified_queue]) {
            if queue >= pairs {
                return Err(RssError::Queue { queue, pairs });
            }
        }
        if max_tx_vq == 0 || max_tx_vq > pairs {
            return Err(RssError::Queue {
                queue: max_tx_vq,
                pairs,
            });
        }
        let key = Self::key(data, table_end + 2, hash_types)?;
        Ok(RssConfig {
            hash_types,
            indirection,
            unclassified_queue,
            max_tx_vq,
            key,
        })
    }

    /// `struct virtio_net_hash_config`: le32 hash_types, le16 reserved[4], u8
    /// hash_key_length, u8 hash_key_data[].
    pub fn parse_hash(data: &[u8]) -> Result<Self, RssError> {
        if data.len() < 13 {
            return Err(RssError::Truncated(data.len()));
        }
        let hash_types = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        Ok(RssConfig {
            hash_types,
            indirection: Vec::new(),
            unclassified_queue: 0,
            max_tx_vq: 0,
            key: Self::key(data, 12, hash_types)?,
        })
    }

    fn key(data: &[u8], at: usize, hash_types: u32) -> Result<Vec<u8>, RssError> {
        if hash_types & !SUPPORTED & 0x1ff != 0 || hash_types >> 9 != 0 {
            return Err(RssError::HashTypes(hash_types));
        }
        let len = usize::from(data[at]);
        // A key only matters if something is hashed; hashing 36 bytes needs 40 of key.
        if len > MAX_KEY || (len == 0 && hash_types != 0) {
            return Err(RssError::KeyLength(len));
        }
        // Bytes after the key are ignored, as QEMU does: Linux since 6.14 sends its
        // trailer struct's padding byte after the key (`sizeof` of a struct ending in a
        // flexible array), so a strict device would refuse every RSS command.
        let key = data
            .get(at + 1..at + 1 + len)
            .ok_or(RssError::Truncated(data.len()))?;
        Ok(key.to_vec())
    }
}

/// Toeplitz hashing with one key, by table: entry `[i][b]` is the hash contribution of byte
/// value `b` at input offset `i`, so a hash is one lookup and XOR per input byte.
pub struct Toeplitz {
    table: Box<[[u32; 256]; MAX_INPUT]>,
}

impl Toeplitz {
    pub fn new(key: &[u8]) -> Self {
        // Pad short keys with zeros: bits past the key contribute nothing.
        let mut k = [0u8; MAX_INPUT + 4];
        let n = key.len().min(k.len());
        k[..n].copy_from_slice(&key[..n]);
        let mut table = Box::new([[0u32; 256]; MAX_INPUT]);
        for (i, row) in table.iter_mut().enumerate() {
            // The 32-bit key windows starting at each of the byte's eight bits.
            let window = |bit: usize| -> u32 {
                let at = i * 8 + bit;
                let word = u64::from_be_bytes([
                    k[at / 8],
                    k[at / 8 + 1],
                    k[at / 8 + 2],
                    k[at / 8 + 3],
                    k[at / 8 + 4],
                    0,
                    0,
                    0,
                ]);
                (word << (at % 8) >> 32) as u32
            };
            let windows: [u32; 8] = std::array::from_fn(window);
            for (b, slot) in row.iter_mut().enumerate() {
                *slot = (0..8)
                    .filter(|bit| b & (0x80 >> bit) != 0)
                    .fold(0, |h, bit| h ^ windows[bit]);
            }
        }
        Toeplitz { table }
    }

    pub fn hash(&self, input: &[u8]) -> u32 {
        input
            .iter()
            .zip(self.table.iter())
            .fold(0, |h, (&b, row)| h ^ row[usize::from(b)])
    }
}

/// The bytes a frame hashes over and the report type, per the enabled hash types.
fn hash_input(layers: &Layers, frame: &[u8], types: u32, buf: &mut [u8; MAX_INPUT]) -> Option<(usize, u16)> {
    let ip = layers.ip(frame)?;
    let ports = |l4: Option<&[u8]>| l4.and_then(|l| l.get(0..4)).map(|p| [p[0], p[1], p[2], p[3]]);
    match layers.network {
        Network::V4 => {
            let p = Ipv4Packet::new_checked(ip).ok()?;
            buf[0..4].copy_from_slice(&p.src().octets());
            buf[4..8].copy_from_slice(&p.dst().octets());
            let l4 = (!p.is_later_fragment())
                .then(|| ip.get(p.header_len()..))
                .flatten();
            let (tcp, udp) = (p.protocol() == PROTO_TCP, p.protocol() == PROTO_UDP);
            if (tcp && types & HASH_TCPV4 != 0) || (udp && types & HASH_UDPV4 != 0) {
                if let Some(pp) = ports(l4) {
                    buf[8..12].copy_from_slice(&pp);
                    return Some((12, if tcp { REPORT_TCPV4 } else { REPORT_UDPV4 }));
                }
            }
            (types & HASH_IPV4 != 0).then_some((8, REPORT_IPV4))
        }
        Network::V6 => {
            let p = Ipv6Packet::new_checked(ip).ok()?;
            buf[0..16].copy_from_slice(&p.src().octets());
            buf[16..32].copy_from_slice(&p.dst().octets());
            if let Some(Ipv6Upper::Found { proto, offset, .. }) = layers.upper() {
                let (tcp, udp) = (proto == PROTO_TCP, proto == PROTO_UDP);
                if (tcp && types & HASH_TCPV6 != 0) || (udp && types & HASH_UDPV6 != 0) {
                    if let Some(pp) = ports(ip.get(offset..)) {
                        buf[32..36].copy_from_slice(&pp);
                        return Some((36, if tcp { REPORT_TCPV6 } else { REPORT_UDPV6 }));
                    }
                }
            }
            (types & HASH_IPV6 != 0).then_some((32, REPORT_IPV6))
        }
        Network::Other | Network::BadV4 | Network::BadV6 => None,
    }
}

/// One steering decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steered {
    pub queue: usize,
    pub hash: u32,
    pub report: u16,
}

/// A published steering configuration: key table, hash types, indirection.
pub struct Steering {
    toeplitz: Toeplitz,
    hash_types: u32,
    /// Empty: spread over `pairs` queues by hash modulo (automatic steering).
    indirection: Vec<u16>,
    unclassified: u16,
    pairs: u16,
    /// The driver's configuration, for `ctl`.
    pub config: Option<RssConfig>,
}

impl Steering {
    /// Automatic steering over `pairs` queues with the default key, all supported types.
    pub fn automatic(pairs: u16) -> Self {
        Steering {
            toeplitz: Toeplitz::new(&DEFAULT_KEY),
            hash_types: SUPPORTED,
            indirection: Vec::new(),
            unclassified: 0,
            pairs: pairs.max(1),
            config: None,
        }
    }

    /// The driver's RSS_CONFIG (steers) or HASH_CONFIG (reports only, steering stays
    /// automatic over `pairs`).
    pub fn from_config(c: RssConfig, pairs: u16) -> Self {
        Steering {
            toeplitz: Toeplitz::new(&c.key),
            hash_types: c.hash_types,
            indirection: c.indirection.clone(),
            unclassified: c.unclassified_queue,
            pairs: pairs.max(1),
            config: Some(c),
        }
    }

    /// Hashes a frame and picks its queue. Frames of no enabled type go to the
    /// unclassified queue with report NONE.
    pub fn steer(&self, frame: &[u8]) -> Steered {
        self.steer_by(&Layers::parse(frame), frame)
    }

    /// [`Steering::steer`] for a frame whose layers `layers` found.
    pub fn steer_by(&self, layers: &Layers, frame: &[u8]) -> Steered {
        let mut buf = [0u8; MAX_INPUT];
        match hash_input(layers, frame, self.hash_types, &mut buf) {
            Some((n, report)) => {
                let hash = self.toeplitz.hash(&buf[..n]);
                let queue = if self.indirection.is_empty() {
                    hash as usize % usize::from(self.pairs)
                } else {
                    usize::from(self.indirection[hash as usize & (self.indirection.len() - 1)])
                };
                Steered { queue, hash, report }
            }
            None => Steered {
                queue: usize::from(self.unclassified),
                hash: 0,
                report: REPORT_NONE,
            },
        }
    }
}

/// The steering "register" a port's RX path reads: swapped whole by the control path.
pub struct SteeringCell(ArcSwap<Steering>);

impl SteeringCell {
    pub fn new(pairs: u16) -> Self {
        SteeringCell(ArcSwap::from_pointee(Steering::automatic(pairs)))
    }

    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<Steering>> {
        self.0.load()
    }

    /// The steering as published now, kept: a worker holds one for a burst.
    pub fn load_full(&self) -> Arc<Steering> {
        self.0.load_full()
    }

    pub fn publish(&self, s: Steering) {
        self.0.store(Arc::new(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source address and port, destination address and port, IPv4-only hash, hash with
    /// the TCP ports.
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);

    /// Microsoft's "Verifying the RSS Hash Calculation" vectors with [`DEFAULT_KEY`].
    const MS_V4: [Vector; 3] = [
        (
            [66, 9, 149, 187],
            2794,
            [161, 142, 100, 80],
            1766,
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            [199, 92, 111, 2],
            14230,
            [65, 69, 140, 83],
            4739,
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            [24, 19, 198, 95],
            12898,
            [12, 22, 207, 184],
            38024,
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
    ];

    fn tcp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 0, 0, 0, 64, PROTO_TCP, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0u8; 16]);
        f
    }

    #[test]
    fn microsoft_verification_vectors() {
        let t = Toeplitz::new(&DEFAULT_KEY);
        for (src, sp, dst, dp, ip_only, with_ports) in MS_V4 {
            let mut input = [src, dst].concat();
            assert_eq!(t.hash(&input), ip_only);
            input.extend_from_slice(&sp.to_be_bytes());
            input.extend_from_slice(&dp.to_be_bytes());
            assert_eq!(t.hash(&input), with_ports);
            let s = Steering::automatic(4).steer(&tcp4(src, sp, dst, dp));
            assert_eq!(
                (s.hash, s.report, s.queue),
                (with_ports, REPORT_TCPV4, with_ports as usize % 4)
            );
        }
        // IPv6: 3ffe:2501:200:1fff::7 -> 3ffe:2501:200:3::1, ports 2794 -> 1766.
        let src: std::net::Ipv6Addr = "3ffe:2501:200:1fff::7".parse().unwrap();
        let dst: std::net::Ipv6Addr = "3ffe:2501:200:3::1".parse().unwrap();
        let mut input = [src.octets(), dst.octets()].concat();
        assert_eq!(t.hash(&input), 0x2cc1_8cd5);
        input.extend_from_slice(&[0x0a, 0xea, 0x06, 0xe6]);
        assert_eq!(t.hash(&input), 0x4020_7d3d);
    }

    /// The bit-at-a-time definition, to check the table against for any key.
    fn slow(key: &[u8], input: &[u8]) -> u32 {
        let bit = |i: usize| key.get(i / 8).is_some_and(|b| b & (0x80 >> (i % 8)) != 0) as u32;
        let mut h = 0u32;
        for (i, b) in input.iter().enumerate() {
            for j in 0..8 {
                if b & (0x80 >> j) != 0 {
                    let at = i * 8 + j;
                    h ^= (0..32).fold(0u32, |w, k| (w << 1) | bit(at + k));
                }
            }
        }
        h
    }

    proptest::proptest! {
        #[test]
        fn table_equals_bitwise_definition(key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=40),
                                           input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=36)) {
            proptest::prop_assert_eq!(Toeplitz::new(&key).hash(&input), slow(&key, &input));
        }
    }

    fn rss_cmd(types: u32, table: &[u16], unclassified: u16, max_tx: u16, key: &[u8]) -> Vec<u8> {
        let mut d = types.to_le_bytes().to_vec();
        d.extend_from_slice(&((table.len() as u16).wrapping_sub(1)).to_le_bytes());
        d.extend_from_slice(&unclassified.to_le_bytes());
        for q in table {
            d.extend_from_slice(&q.to_le_bytes());
        }
        d.extend_from_slice(&max_tx.to_le_bytes());
        d.push(key.len() as u8);
        d.extend_from_slice(key);
        d
    }

    #[test]
    fn rss_config_parse_and_steer_by_table() {
        let table: Vec<u16> = (0..8).map(|i| i % 2).collect();
        let c = RssConfig::parse_rss(&rss_cmd(SUPPORTED, &table, 1, 2, &DEFAULT_KEY), 2).unwrap();
        assert_eq!(
            (c.indirection.len(), c.unclassified_queue, c.max_tx_vq),
            (8, 1, 2)
        );
        let s = Steering::from_config(c, 2);
        let (src, sp, dst, dp, _, h) = MS_V4[0];
        let st = s.steer(&tcp4(src, sp, dst, dp));
        assert_eq!(st.queue, usize::from(table[h as usize & 7]));
        // ARP is of no hash type: unclassified queue, no report.
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert_eq!(
            s.steer(&arp),
            Steered {
                queue: 1,
                hash: 0,
                report: REPORT_NONE
            }
        );
        // IPv4-only hashing when the TCP type is off.
        let c = RssConfig::parse_rss(&rss_cmd(HASH_IPV4, &table, 0, 1, &DEFAULT_KEY), 2).unwrap();
        let st = Steering::from_config(c, 2).steer(&tcp4(src, sp, dst, dp));
        assert_eq!((st.hash, st.report), (MS_V4[0].4, REPORT_IPV4));
    }

    #[test]
    fn bad_rss_commands() {
        let key = &DEFAULT_KEY[..];
        for (cmd, want) in [
            (
                rss_cmd(SUPPORTED, &[0, 1, 0], 0, 1, key),
                RssError::TableLength(3),
            ),
            (
                rss_cmd(SUPPORTED, &[0, 2], 0, 1, key),
                RssError::Queue { queue: 2, pairs: 2 },
            ),
            (
                rss_cmd(SUPPORTED, &[0, 1], 5, 1, key),
                RssError::Queue { queue: 5, pairs: 2 },
            ),
            (
                rss_cmd(SUPPORTED, &[0, 1], 0, 0, key),
                RssError::Queue { queue: 0, pairs: 2 },
            ),
            (rss_cmd(1 << 6, &[0, 1], 0, 1, key), RssError::HashTypes(1 << 6)),
            (rss_cmd(SUPPORTED, &[0, 1], 0, 1, &[]), RssError::KeyLength(0)),
            (
                rss_cmd(SUPPORTED, &[0, 1], 0, 1, &[0u8; 41]),
                RssError::KeyLength(41),
            ),
        ] {
            assert_eq!(RssConfig::parse_rss(&cmd, 2), Err(want));
        }
        let mut padded = rss_cmd(SUPPORTED, &[0, 1], 0, 1, key);
        padded.push(0);
        assert_eq!(RssConfig::parse_rss(&padded, 2).unwrap().key, key);
        let ok = rss_cmd(SUPPORTED, &[0, 1], 0, 1, key);
        for n in 0..ok.len() {
            assert!(RssConfig::parse_rss(&ok[..n], 2).is_err(), "{n} bytes accepted");
        }
        // Mask claiming 65536 entries in a short buffer.
        let mut huge = ok.clone();
        huge[4..6].copy_from_slice(&[0xff, 0xff]);
        assert!(RssConfig::parse_rss(&huge, 2).is_err());
        let mut hash = SUPPORTED.to_le_bytes().to_vec();
        hash.extend_from_slice(&[0; 8]);
        hash.push(40);
        hash.extend_from_slice(key);
        assert_eq!(RssConfig::parse_hash(&hash).unwrap().key, key);
        assert!(RssConfig::parse_hash(&hash[..20]).is_err());
    }
}
