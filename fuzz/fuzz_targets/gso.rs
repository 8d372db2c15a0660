//! Software segmentation of whatever a guest declares: a header (type, size, flags) and a
//! frame. Invariants: never more segments than the bound for the protocol, `segment`
//! emits exactly what `segment_count` promised, and every segment is a frame whose IP
//! length field matches its length.
#![no_main]

use dpaa_vnic::pipeline::gso::{self, GSO_MAX_SEGS};
use dpaa_vnic::wire::ip::{network_offset, Ipv4Packet, Ipv6Packet};
use dpaa_vnic::wire::VirtioNetHdr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((h, frame)) = data.split_at_checked(4) else {
        return;
    };
    let hdr = VirtioNetHdr {
        gso_type: h[0],
        gso_size: u16::from_le_bytes([h[1], h[2]]),
        flags: h[3] & 3,
        ..Default::default()
    };
    let promised = gso::segment_count(&hdr, frame);
    let mut emitted = 0usize;
    let mut buf = Vec::new();
    let res = gso::segment(&hdr, frame, &mut buf, |_, seg| {
        emitted += 1;
        let (ty, l3) = network_offset(seg).expect("a segment keeps its L2 header");
        let ip = &seg[l3..];
        match ty {
            0x0800 => {
                let p = Ipv4Packet::new_checked(ip).expect("segment's IPv4 header parses");
                assert_eq!(p.total_len(), ip.len());
            }
            _ => {
                let p = Ipv6Packet::new_checked(ip).expect("segment's IPv6 header parses");
                assert_eq!(40 + p.payload_len(), ip.len());
            }
        }
    });
    assert_eq!(res.as_ref().ok(), promised.as_ref().ok());
    if let Ok(n) = res {
        assert_eq!(n, emitted);
        assert!(n <= GSO_MAX_SEGS);
    } else {
        assert_eq!(emitted, 0);
    }
});
