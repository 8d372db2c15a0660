//! Software segmentation of GSO frames (virtio-net TSO4/TSO6/USO) for a destination that
//! cannot take them whole: what a NIC without TSO forces the stack to do, done here once
//! instead of in every receiving guest.
//!
//! Each segment gets the original headers with the lengths, IPv4 ID, TCP sequence number
//! and flags of its place in the stream, and complete checksums (IPv4 header and TCP/UDP),
//! so it needs no checksum offload at the receiver.

use thiserror::Error;

use crate::wire::checksum::write_checksum;
use crate::wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::ip::{network_offset, Ipv4Packet, Ipv6Packet, Ipv6Upper, IPV6_LEN, PROTO_TCP, PROTO_UDP};
use crate::wire::virtio_net_hdr::{GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4};
use crate::wire::VirtioNetHdr;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum GsoError {
    #[error("GSO type {0:#x} is not one dpaa-vnic segments")]
    Type(u8),
    #[error("GSO size 0")]
    ZeroSize,
    #[error("GSO size {size} would make {segments} segments, more than {limit}")]
    TooManySegments {
        size: u16,
        segments: usize,
        limit: usize,
    },
    #[error("GSO frame headers: {0}")]
    Headers(&'static str),
    #[error("GSO type {gso:#x} on a frame carrying IP protocol {proto}")]
    Mismatch { gso: u8, proto: u8 },
    #[error("GSO frame IP header")]
    Ip(#[from] crate::wire::ip::IpError),
}

/// Most segments one TCP GSO frame may become: a 64 KiB frame cut at 64 bytes, the smallest
/// TSO MSS of Intel's i40e and ice (below it their drivers fall back to software GSO). A
/// benign 64 KiB frame at MSS 1448 makes 46; without a bound, `gso_size = 1` made ~65 000
/// segments for every receiver without the offload (~65 000 `writev` calls with
/// `--tap-csum off`).
pub const GSO_MAX_SEGS: usize = 1024;
/// Most segments of a UDP GSO frame: Linux's UDP_MAX_SEGMENTS, which
/// `virtio_net_hdr_to_skb` enforces on every virtio-net frame it takes in.
pub const UDP_MAX_SEGMENTS: usize = 128;

/// How many segments `frame` becomes, or why it is refused (a GSO type, header or size
/// this module does not take, or more segments than the bound for its protocol).
pub fn segment_count(hdr: &VirtioNetHdr, frame: &[u8]) -> Result<usize, GsoError> {
    layout(hdr, frame).map(|l| l.segments)
}

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the headers of a GSO frame are.
struct GsoLayout {
    l3: usize,
    l4: usize,
    /// Ethernet + IP (+ extension headers) + TCP/UDP header.
    hdrs: usize,
    v4: bool,
    tcp: bool,
    segments: usize,
}

fn layout(hdr: &VirtioNetHdr, frame: &[u8]) -> Result<GsoLayout, GsoError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if !matches!(gso, GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4) {
        return Err(GsoError::Type(hdr.gso_type));
    }
    if hdr.gso_size == 0 {
        return Err(GsoError::ZeroSize);
    }
    let (ty, l3) = network_offset(frame).ok_or(GsoError::Headers("truncated L2"))?;
    let ip = &frame[l3..];
    let (v4, proto, l4) = match ty {
        ETHERTYPE_IPV4 => {
            let p = Ipv4Packet::new_checked(ip)?;
            if p.is_later_fragment() || p.total_len() != ip.len() {
                return Err(GsoError::Headers("IPv4 fragment or length mismatch"));
            }
            (true, p.protocol(), l3 + p.header_len())
        }
        ETHERTYPE_IPV6 => {
            let p = Ipv6Packet::new_checked(ip)?;
            match p.upper() {
                Ok(Ipv6Upper::Found { proto, offset, .. }) => (false, proto, l3 + offset),
                _ => return Err(GsoError::Headers("no TCP/UDP after the IPv6 headers")),
            }
        }
        _ => return Err(GsoError::Headers("not IP")),
    };
    let want = match gso {
        GSO_TCPV4 if v4 => PROTO_TCP,
        GSO_TCPV6 if !v4 => PROTO_TCP,
        GSO_UDP_L4 => PROTO_UDP,
        _ => 0,
    };
    if proto != want {
        return Err(GsoError::Mismatch {
            gso: hdr.gso_type,
            proto,
        });
    }
    let tcp = proto == PROTO_TCP;
    let l4_len = if tcp {
        let off = *frame
            .get(l4 + 12)
            .ok_or(GsoError::Headers("truncated TCP header"))?;
        usize::from(off >> 4) * 4
    } else {
        8
    };
    if l4_len < if tcp { 20 } else { 8 } || l4 + l4_len > frame.len() {
        return Err(GsoError::Headers("truncated L4 header"));
    }
    let hdrs = l4 + l4_len;
    let segments = (frame.len() - hdrs).div_ceil(usize::from(hdr.gso_size)).max(1);
    let limit = if tcp { GSO_MAX_SEGS } else { UDP_MAX_SEGMENTS };
    if segments > limit {
        return Err(GsoError::TooManySegments {
            size: hdr.gso_size,
            segments,
            limit,
        });
    }
    Ok(GsoLayout {
        l3,
        l4,
        hdrs,
        v4,
        tcp,
        segments,
    })
}

/// Splits `frame` (a GSO frame as `hdr` describes it) into segments of at most `gso_size`
/// payload bytes, builds each in `buf`, and hands it to `emit` with a plain header (no GSO,
/// DATA_VALID: its checksums were just computed). Returns the number of segments. A frame
/// whose payload fits one segment is emitted as one frame, fixed up the same way.
pub fn segment(
    hdr: &VirtioNetHdr,
    frame: &[u8],
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(&VirtioNetHdr, &mut [u8]),
) -> Result<usize, GsoError> {
    let l = layout(hdr, frame)?;
    let mss = usize::from(hdr.gso_size);
    let payload = &frame[l.hdrs..];
    let chunks = l.segments;
    let seg_hdr = VirtioNetHdr {
        flags: crate::wire::virtio_net_hdr::F_DATA_VALID,
        gso_type: GSO_NONE,
        ..Default::default()
    };
    let (seq0, ip_id0) = (
        u32::from_be_bytes([frame[l.l4 + 4], frame[l.l4 + 5], frame[l.l4 + 6], frame[l.l4 + 7]]),
        u16::from_be_bytes([frame[l.l3 + 4], frame[l.l3 + 5]]),
    );
    for i in 0..chunks {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        buf.clear();
        buf.extend_from_slice(&frame[..l.hdrs]);
        buf.extend_from_slice(chunk);
        let ip_len = buf.len() - l.l3;
        let l4_len = buf.len() - l.l4;
        let ip = &mut buf[l.l3..];
        let proto = if l.tcp { PROTO_TCP } else { PROTO_UDP };
        let pseudo = if l.v4 {
            ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&ip_id0.wrapping_add(i as u16).to_be_bytes());
            let mut p = Ipv4Packet::new_checked(&mut *ip)?;
            p.fill_checksum();
            p.pseudo_sum(proto, l4_len)
        } else {
            ip[4..6].copy_from_slice(&((ip_len - IPV6_LEN) as u16).to_be_bytes());
            Ipv6Packet::new_checked(&*ip)?.pseudo_sum(proto, l4_len)
        };
        let l4 = &mut buf[l.l4..];
        let csum_at = if l.tcp {
            l4[4..8].copy_from_slice(&seq0.wrapping_add((i * mss) as u32).to_be_bytes());
            if i + 1 < chunks {
                l4[13] &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                l4[13] &= !TCP_CWR;
            }
            16
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            6
        };
        write_checksum(l4, csum_at, l4_len, pseudo, !l.tcp);
        emit(&seg_hdr, buf);
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::{checksum, fold, partial_sum};

    /// A TCP/IPv4 GSO frame: 20-byte IP header, 20-byte TCP header, `len` payload bytes.
    fn tso4(len: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let tot = 40 + len;
        f.extend_from_slice(&[
            0x45,
            0,
            (tot >> 8) as u8,
            tot as u8,
            0x12,
            0x34,
            0x40,
            0,
            64,
            6,
            0,
            0,
        ]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&[
            0x30, 0x39, 0x00, 0x50, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff,
        ]);
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend((0..len).map(|i| (i * 7) as u8));
        f
    }

    fn verify_l4(seg: &[u8], proto: u8) -> bool {
        let ip = &seg[14..];
        let hl = usize::from(ip[0] & 0xf) * 4;
        let l4 = &ip[hl..];
        let pseudo = partial_sum(&ip[12..20], 0) + u64::from(proto) + l4.len() as u64;
        fold(partial_sum(l4, 0) + pseudo) == 0xffff
    }

    #[test]
    fn tso4_segments_carry_their_place_in_the_stream() {
        let f = tso4(3000, TCP_PSH | TCP_FIN | 0x10);
        let hdr = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            ..Default::default()
        };
        let mut segs = Vec::new();
        let n = segment(&hdr, &f, &mut Vec::new(), |h, s| {
            assert_eq!(h.gso_type, GSO_NONE);
            segs.push(s.to_vec())
        })
        .unwrap();
        assert_eq!(n, 3);
        let lens: Vec<usize> = segs.iter().map(|s| s.len() - 54).collect();
        assert_eq!(lens, vec![1448, 1448, 104]);
        let mut reassembled = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let ip = Ipv4Packet::new_checked(&s[14..]).unwrap();
            assert_eq!(ip.total_len(), s.len() - 14);
            assert_eq!(checksum(&s[14..34]), 0, "IPv4 header checksum of segment {i}");
            assert_eq!(u16::from_be_bytes([s[18], s[19]]), 0x1234 + i as u16);
            assert!(verify_l4(s, PROTO_TCP), "TCP checksum of segment {i}");
            let seq = u32::from_be_bytes([s[38], s[39], s[40], s[41]]);
            assert_eq!(seq, 0x0000_1000 + (i * 1448) as u32);
            let last = i == 2;
            assert_eq!(s[47] & (TCP_FIN | TCP_PSH) != 0, last, "FIN/PSH only on the last");
            reassembled.extend_from_slice(&s[54..]);
        }
        assert_eq!(reassembled, f[54..].to_vec());
    }

    #[test]
    fn uso_and_tso6() {
        // UDP over IPv6, 2500 bytes of payload in 1000-byte datagrams.
        let len = 2500;
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd, 0x60, 0, 0, 0];
        f.extend_from_slice(&((8 + len) as u16).to_be_bytes());
        f.extend_from_slice(&[PROTO_UDP, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 0, 0, 0]);
        f.extend((0..len).map(|i| i as u8));
        let hdr = VirtioNetHdr {
            gso_type: GSO_UDP_L4,
            gso_size: 1000,
            ..Default::default()
        };
        let mut segs = Vec::new();
        assert_eq!(
            segment(&hdr, &f, &mut Vec::new(), |_, s| segs.push(s.to_vec())),
            Ok(3)
        );
        for s in &segs {
            let ip = &s[14..];
            let pl = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            assert_eq!(pl, s.len() - 54);
            assert_eq!(usize::from(u16::from_be_bytes([ip[44], ip[45]])), pl);
            let pseudo = partial_sum(&ip[8..40], 0) + u64::from(PROTO_UDP) + pl as u64;
            assert_eq!(fold(partial_sum(&ip[40..], 0) + pseudo), 0xffff);
        }
        assert_eq!(segs.iter().map(|s| s.len() - 62).sum::<usize>(), len);
    }

    /// `gso_size = 1` on a 64 KiB frame. Each receiver without the offload got
    /// one segment per payload byte; now the frame is refused, and the worst frame still
    /// taken (cut at 64 bytes) costs a known factor over a benign one of the same size.
    #[test]
    fn a_one_byte_gso_size_is_refused_and_the_worst_accepted_frame_is_bounded() {
        let f = tso4(65_495, 0x10);
        let hdr = |gso_size| VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size,
            ..Default::default()
        };
        // (segments, bytes built) for one receiver that segments.
        let cost = |size| {
            let (mut segs, mut bytes) = (0usize, 0usize);
            let r = segment(&hdr(size), &f, &mut Vec::new(), |_, s| {
                segs += 1;
                bytes += s.len();
            });
            (r, segs, bytes)
        };
        let (r, segs, _) = cost(1);
        assert_eq!(
            r,
            Err(GsoError::TooManySegments {
                size: 1,
                segments: 65_495,
                limit: GSO_MAX_SEGS
            })
        );
        assert_eq!(segs, 0, "nothing is built for a refused frame");
        let (r, worst, worst_bytes) = cost(64);
        assert_eq!(r, Ok(1024));
        let (r, benign, benign_bytes) = cost(1448);
        assert_eq!(r, Ok(46));
        assert_eq!((worst, benign), (1024, 46));
        // Before the bound, size 1 built 65 495 segments of 55 bytes.
        let before = (
            65_495.0 / benign as f64,
            (65_495 * 55) as f64 / benign_bytes as f64,
        );
        let after = (
            worst as f64 / benign as f64,
            worst_bytes as f64 / benign_bytes as f64,
        );
        eprintln!(
            "gso, 64 KiB frame vs MSS 1448: before (size 1) {:.0}x segments, {:.0}x bytes; \
             after (size 64, the worst taken) {:.0}x segments, {:.2}x bytes",
            before.0, before.1, after.0, after.1
        );
        assert!(after.1 < 2.0 && after.0 < 25.0);
        // UDP: Linux's own rule, at most 128 segments.
        let mut u = f.clone();
        u[23] = PROTO_UDP;
        let uh = VirtioNetHdr {
            gso_type: GSO_UDP_L4,
            gso_size: 500,
            ..Default::default()
        };
        assert!(matches!(
            segment_count(&uh, &u),
            Err(GsoError::TooManySegments {
                limit: UDP_MAX_SEGMENTS,
                ..
            })
        ));
    }

    #[test]
    fn bad_gso_frames_are_refused() {
        let f = tso4(3000, 0x10);
        let h = |gso_type, gso_size| VirtioNetHdr {
            gso_type,
            gso_size,
            ..Default::default()
        };
        let mut buf = Vec::new();
        let mut none = |_: &VirtioNetHdr, _: &mut [u8]| panic!("emitted");
        assert_eq!(
            segment(&h(GSO_TCPV4, 0), &f, &mut buf, &mut none),
            Err(GsoError::ZeroSize)
        );
        assert_eq!(
            segment(&h(3, 1000), &f, &mut buf, &mut none),
            Err(GsoError::Type(3))
        );
        assert!(matches!(
            segment(&h(GSO_UDP_L4, 1000), &f, &mut buf, &mut none),
            Err(GsoError::Mismatch { proto: 6, .. })
        ));
        assert!(segment(&h(GSO_TCPV6, 1000), &f, &mut buf, &mut none).is_err());
        // IP total length that disagrees with the frame.
        let mut lying = f.clone();
        lying[16] = 0xff;
        assert!(segment(&h(GSO_TCPV4, 1000), &lying, &mut buf, &mut none).is_err());
        // A TCP data offset past the frame.
        let mut short = f[..60].to_vec();
        short[16..18].copy_from_slice(&46u16.to_be_bytes());
        short[46] = 0xf0;
        assert!(segment(&h(GSO_TCPV4, 1000), &short, &mut buf, &mut none).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(mut f in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                        gso_type in proptest::prelude::any::<u8>(), gso_size in proptest::prelude::any::<u16>()) {
            if f.len() > 14 {
                f[12] = 0x08;
                f[13] = 0x00;
                f[14] = 0x45;
            }
            let hdr = VirtioNetHdr { gso_type, gso_size, ..Default::default() };
            let _ = segment(&hdr, &f, &mut Vec::new(), |_, _| {});
        }
    }
}
