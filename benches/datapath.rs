//! Per-packet cost of the queue layer on mock guest memory: TX (copy a chain out, return it)
//! chain by chain through virtio-queue and in the daemon's batches through `ring.rs`, and RX
//! (write a frame into merged buffers) with the used index published per frame and per
//! batch, 64 and 1500 bytes, against memcpy of the same bytes as the in-run baseline; and
//! the Internet checksum against memcpy of the same buffer.
//!
//! cargo bench --bench datapath

use std::hint::black_box;

use arrayvec::ArrayVec;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dpaa_vnic::ports::vhost_user::queue::{
    pop_tx, pop_tx_batch, publish_used, push_rx, push_rx_unpublished, RxBurst, TxSlot, TX_BATCH,
};
use dpaa_vnic::wire::checksum;
use dpaa_vnic::wire::VirtioNetHdr;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const QSIZE: u16 = 256;
/// Chains per measured batch. MockSplitQueue (virtio-queue 0.18) lays its used ring over the
/// upper half of the avail ring, so stay below half the ring size.
const BATCH: u16 = 120;
const HDR: usize = 12;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200_0000)]).unwrap()
}

/// A fresh queue: the mock keeps ring indices in guest memory, so clear them first.
fn fresh_queue(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> Queue {
    m.write_slice(&[0u8; 0x1_0000], GuestAddress(0)).unwrap();
    let vq = MockSplitQueue::new(m, QSIZE);
    vq.add_desc_chains(descs, 0).unwrap();
    vq.create_queue::<Queue>().unwrap()
}

fn chains(flags: u16, len: u32) -> Vec<RawDescriptor> {
    (0..BATCH)
        .map(|i| {
            RawDescriptor::from(SplitDescriptor::new(
                0x10_0000 + u64::from(i) * 0x1_0000,
                len,
                flags,
                0,
            ))
        })
        .collect()
}

fn bench_queues(c: &mut Criterion) {
    let m = mem();
    for size in [64usize, 1500] {
        let mut g = c.benchmark_group(format!("queue/{size}B"));
        g.throughput(Throughput::Elements(u64::from(BATCH)));
        let tx = chains(0, (HDR + size) as u32);
        g.bench_function("tx pop+copy+used (virtio-queue)", |b| {
            let mut buf = vec![0u8; 65_562];
            b.iter_batched(
                || fresh_queue(&m, &tx),
                |mut q| {
                    while let Some(t) = pop_tx(&mut q, &m, HDR, &mut buf).unwrap() {
                        q.add_used(&m, t.head, 0).unwrap();
                        black_box(t.result.unwrap());
                    }
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_function("tx batch (ring.rs)", |b| {
            // Room for the largest frame after a batch of this size, as the daemon's arena.
            let mut buf = vec![0u8; 65_562 + TX_BATCH * (HDR + size)];
            let mut batch: ArrayVec<TxSlot, TX_BATCH> = ArrayVec::new();
            b.iter_batched(
                || fresh_queue(&m, &tx),
                |mut q| loop {
                    pop_tx_batch(&mut q, &m, HDR, &mut buf, 65_562, 256, 8192, &mut batch).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for s in batch.drain(..) {
                        black_box(s.chain.result.unwrap());
                    }
                },
                BatchSize::LargeInput,
            )
        });
        let rx = chains(2, 2048);
        let frame = vec![0x5au8; size];
        let hdr = VirtioNetHdr::default();
        g.bench_function("rx push (mrg)", |b| {
            b.iter_batched(
                || fresh_queue(&m, &rx),
                |mut q| {
                    for _ in 0..BATCH {
                        black_box(push_rx(&mut q, &m, HDR, true, &hdr, &frame).expect("rx push"));
                    }
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_function("rx push (mrg), published per batch", |b| {
            b.iter_batched(
                || fresh_queue(&m, &rx),
                |mut q| {
                    // A burst per 32 frames, as the daemon's stage writes a run.
                    let mut burst = RxBurst::new(HDR, true);
                    for i in 0..BATCH {
                        let n = push_rx_unpublished(&mut q, &m, &mut burst, &hdr, &frame);
                        black_box(n.expect("rx push"));
                        if i % 32 == 31 {
                            publish_used(&q, &m).unwrap();
                            burst = RxBurst::new(HDR, true);
                        }
                    }
                    publish_used(&q, &m).unwrap();
                },
                BatchSize::LargeInput,
            )
        });
        // Baseline: copying the same bytes once each way, no queue work.
        let src = vec![0x5au8; size + HDR];
        let mut dst = vec![0u8; size + HDR];
        g.bench_function("baseline memcpy", |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    dst.copy_from_slice(black_box(&src));
                    black_box(&dst);
                }
            })
        });
        g.finish();
    }
}

fn bench_checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum/1500B");
    let data: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 1500];
    g.throughput(Throughput::Bytes(1500));
    g.bench_function("internet checksum", |b| {
        b.iter(|| checksum::checksum(black_box(&data)))
    });
    g.bench_function("baseline memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&data));
            black_box(&dst);
        })
    });
    g.finish();
}

criterion_group!(benches, bench_queues, bench_checksum);
criterion_main!(benches);
