//! Transmit: whatever chains a guest posts, copied out and sent through the switch with the
//! router, a checksum action, RSS steering and software segmentation on the way. Invariants: a chain
//! walks at most MAX_FRAME_DESCS + 1 descriptors, and every frame a port is handed is an
//! Ethernet frame (segments included).
#![no_main]

mod common;

use std::sync::Arc;

use dpaa_vnic::device::rss::Steering;
use dpaa_vnic::pipeline::gso;
use dpaa_vnic::pipeline::router::{RouteCache, RouteTable};
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::{Buffers, Egress, Ingress, Packet, Switch};
use dpaa_vnic::ports::vhost_user::queue::{pop_tx, pop_tx_batch, TxSlot, MAX_FRAME_DESCS, TX_BATCH};
use dpaa_vnic::stats::{Tally, TallyHandle};
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
    fn send(&self, _tally: &Tally, _flow: usize, pkt: &mut Packet<'_>, segment: &mut Vec<u8>) {
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

/// What one worker owns: its counters, its route cache, its buffers.
type Worker = (TallyHandle, RouteCache, Buffers);

/// Sends one copied chain (header first) through the switch, as a worker does.
fn forward(sw: &Switch, (tally, routes, bufs): &mut Worker, chain: &mut [u8]) {
    let Ok(hdr) = VirtioNetHdr::parse(chain, 12) else {
        return;
    };
    let mut pkt = Packet::new(hdr, &mut chain[12..]);
    let mut from = Ingress {
        port: 0,
        queue: 0,
        tally,
        routes,
        bufs,
    };
    sw.forward(&mut from, &mut pkt);
}

fuzz_target!(|data: &[u8]| {
    let Some((m, mut q)) = common::queue(data) else {
        return;
    };
    let sw = switch();
    let mut worker = (sw.tallies().register(), RouteCache::default(), Buffers::default());
    let mut buf = vec![0u8; 65_600];
    for _ in 0..common::QSIZE {
        let Ok(Some(t)) = pop_tx(&mut q, &m, 12, &mut buf) else {
            break;
        };
        assert!(t.walked <= MAX_FRAME_DESCS + 1, "walked {}", t.walked);
        let _ = q.add_used(&m, t.head, 0);
        let Ok(n) = t.result else { continue };
        forward(&sw, &mut worker, &mut buf[..n]);
    }
    sw.flush(&worker.0);
    // The same chains again, popped in batches as the workers do: each chain's walk stays
    // bounded, a batch never holds more than TX_BATCH, every chain of it lies within the
    // buffer, and its frames go through the switch as above.
    let Some((m, mut q)) = common::queue(data) else {
        return;
    };
    let mut arena = vec![0u8; 65_600 + 4096];
    let mut batch = arrayvec::ArrayVec::<TxSlot, TX_BATCH>::new();
    for _ in 0..common::QSIZE {
        if pop_tx_batch(&mut q, &m, 12, &mut arena, 65_600, 256, 8192, &mut batch).is_err()
            || batch.is_empty()
        {
            break;
        }
        assert!(batch.len() <= TX_BATCH);
        for s in batch.drain(..) {
            assert!(s.chain.walked <= MAX_FRAME_DESCS + 1, "walked {}", s.chain.walked);
            let Ok(n) = s.chain.result else { continue };
            forward(&sw, &mut worker, &mut arena[s.start..s.start + n]);
        }
    }
    sw.flush(&worker.0);
});
