//! Transmit: whatever chains a guest posts, copied out and sent through the switch with the
//! router, a checksum action, RSS steering and software segmentation on the way. Invariants: a chain
//! walks at most MAX_FRAME_DESCS + 1 descriptors, and every frame a port is handed is an
//! Ethernet frame (segments included). First, the one-descriptor lane copies, returns and
//! counts what the general walk does on a copy of the same ring.
#![no_main]

mod common;

use std::sync::Arc;

use dpaa_vnic::device::rss::Steering;
use dpaa_vnic::pipeline::fdb::FdbCache;
use dpaa_vnic::pipeline::gso;
use dpaa_vnic::pipeline::router::{RouteCache, RouteTable};
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::{Egress, Ingress, OutboxBuffers, Packet, PortFrames, Switch};
use dpaa_vnic::ports::arena::Arena;
use dpaa_vnic::ports::vhost_user::split_ring::MAX_FRAME_DESCS;
use dpaa_vnic::ports::vhost_user::tx_chain::{pop_tx_batch, BatchLimits, TxBatch, TX_BATCH};
use dpaa_vnic::stats::Tally;
use dpaa_vnic::wire::{EthernetFrame, VirtioNetHdr};
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueT;

/// A port that checks what it is given; `segments`: it takes no GSO, so frames are cut.
/// Each frame is steered (RSS) over four queues, as a guest port's RX path does.
struct Check {
    segments: bool,
    rss: Steering,
}

impl Egress for Check {
    fn write(&self, _tally: &Tally, frames: &mut PortFrames<'_, '_>, segment: &mut Vec<u8>) -> usize {
        let mut n = 0;
        while let Some(f) = frames.next() {
            let pkt = f.pkt;
            assert!(
                EthernetFrame::new_checked(&*pkt.frame).is_ok(),
                "a runt reached a port"
            );
            assert!(self.rss.steer(pkt.frame).queue < 4);
            if self.segments && pkt.hdr.gso_type != 0 {
                let _ = gso::segment(&pkt.hdr, pkt.frame, segment, |_, seg| {
                    assert!(EthernetFrame::new_checked(&*seg).is_ok());
                });
            }
            n += 1;
        }
        n
    }
}

fn switch() -> Arc<Switch> {
    let ifaces = vec![
        "0=10.1.0.1/24".parse().unwrap(),
        "1=fd00:2::1/64".parse().unwrap(),
    ];
    let routes = vec!["10.9.0.0/16,via=10.1.0.7".parse().unwrap()];
    let actions = vec!["port=1,dir=egress,update=iph+tcp+udp+icmp".parse().unwrap()];
    let sw = Arc::new(Switch::with_rules(Rules::with_router(
        3,
        actions,
        RouteTable::new(ifaces, routes),
    )));
    sw.attach(
        1,
        Arc::new(Check {
            segments: false,
            rss: Steering::automatic(4),
        }),
    );
    sw.attach(
        2,
        Arc::new(Check {
            segments: true,
            rss: Steering::automatic(4),
        }),
    );
    sw
}

/// Pops every batch of a ring built from `data` with the lane and, from a second copy,
/// without it: the same batches, bytes, positions and memory.
fn lane_matches_walk(data: &[u8], limits: BatchLimits) {
    let (Some((m1, mut q1)), Some((m2, mut q2))) = (common::queue(data), common::queue(data)) else {
        return;
    };
    let (mut b1, mut b2) = (vec![0u8; 0x2_0000], vec![0u8; 0x2_0000]);
    let (mut s1, mut s2) = (TxBatch::default(), TxBatch::default());
    let general = BatchLimits {
        one_desc: false,
        ..limits
    };
    for _ in 0..common::QSIZE {
        let a = pop_tx_batch(&mut q1, &m1, 12, &mut b1, limits, &mut s1);
        let b = pop_tx_batch(&mut q2, &m2, 12, &mut b2, general, &mut s2);
        assert_eq!(format!("{a:?} {s1:?}"), format!("{b:?} {s2:?}"));
        assert!(b1 == b2, "the lane copied other bytes");
        assert_eq!(
            (q1.next_avail(), q1.next_used()),
            (q2.next_avail(), q2.next_used())
        );
        if a.is_err() || s1.is_empty() {
            break;
        }
    }
    assert!(common::bytes(&m1) == common::bytes(&m2));
}

fuzz_target!(|data: &[u8]| {
    lane_matches_walk(
        data,
        BatchLimits {
            frame_max: 0x1000,
            chains: 256,
            walk: 8192,
            quiet: false,
            one_desc: true,
        },
    );
    let Some((m, mut q)) = common::queue(data) else {
        return;
    };
    let sw = switch();
    let tally = sw.tallies().register();
    let (mut routes, mut originated, mut bufs) =
        (RouteCache::default(), Vec::new(), OutboxBuffers::default());
    // The chains popped in batches as the workers do, back to back into an arena: each
    // chain's walk stays bounded, a batch never holds more than TX_BATCH, every chain of it
    // lies within the arena where the ones before it end, and its frames go through the
    // switch into one outbox.
    let mut buf = vec![0u8; 65_600 + 4096];
    let mut batch = TxBatch::default();
    let limits = BatchLimits {
        frame_max: 65_600,
        chains: 256,
        walk: 8192,
        quiet: false,
        one_desc: true,
    };
    for _ in 0..common::QSIZE {
        let mut arena = Arena::new(&mut buf);
        let mut out = sw.outbox(&tally, &mut bufs);
        let mut from = Ingress {
            port: 0,
            queue: 0,
            tally: &tally,
            routes: &mut routes,
            fdb: &mut FdbCache::default(),
            originated: &mut originated,
        };
        if pop_tx_batch(&mut q, &m, 12, arena.room(), limits, &mut batch).is_err() || batch.is_empty() {
            break;
        }
        assert!(batch.len() <= TX_BATCH);
        let rules = sw.rules().load();
        let mut taken = 0;
        for s in batch.slots() {
            let walked = s.chain.walked;
            assert!(walked <= MAX_FRAME_DESCS + 1, "walked {walked}");
            let Ok(n) = s.chain.result else { continue };
            assert_eq!(s.start, taken, "chains lie back to back");
            taken += n;
            let chain = arena.take(n).expect("a chain within the arena");
            let Ok(hdr) = VirtioNetHdr::parse(chain, 12) else {
                continue;
            };
            sw.forward(&rules, &mut from, Packet::new(hdr, &mut chain[12..]), &mut out);
        }
    }
});
