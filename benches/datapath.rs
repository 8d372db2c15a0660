//! Per-packet cost of the queue layer on mock guest memory: TX (copy a chain out, return it)
//! chain by chain through virtio-queue's own accessors and in the daemon's batches through
//! `split_ring.rs`, and RX (write a frame into merged buffers) published per frame and per
//! run of 32, 64 and 1500 bytes, against memcpy of the same bytes as the in-run baseline;
//! and the Internet checksum against memcpy of the same buffer.
//!
//! cargo bench --bench datapath

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dpaa_vnic::ports::vhost_user::rx_chain::RxRun;
use dpaa_vnic::ports::vhost_user::split_ring::SplitRing;
use dpaa_vnic::ports::vhost_user::tx_chain::{pop_tx_batch, BatchLimits, TxBatch, TX_BATCH};
use dpaa_vnic::wire::checksum;
use dpaa_vnic::wire::VirtioNetHdr;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
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
            // One chain through virtio-queue 0.18's own iterator and accessors.
            let mut pop = |q: &mut Queue| {
                let chain = q.iter(&m).unwrap().next()?;
                let head = chain.head_index();
                let mut n = 0;
                for d in chain {
                    let len = d.len() as usize;
                    m.read_slice(&mut buf[n..n + len], d.addr()).unwrap();
                    n += len;
                }
                q.add_used(&m, head, 0).unwrap();
                Some(n)
            };
            b.iter_batched(
                || fresh_queue(&m, &tx),
                |mut q| {
                    while let Some(n) = pop(&mut q) {
                        black_box(n);
                    }
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_function("tx batch (split_ring.rs)", |b| {
            // Room for the largest frame after a batch of this size, as the daemon's arena.
            let mut buf = vec![0u8; 65_562 + TX_BATCH * (HDR + size)];
            let mut batch = TxBatch::default();
            b.iter_batched(
                || fresh_queue(&m, &tx),
                |mut q| loop {
                    let limits = BatchLimits {
                        frame_max: 65_562,
                        chains: 256,
                        walk: 8192,
                        quiet: false,
                        one_desc: true,
                    };
                    pop_tx_batch(&mut q, &m, HDR, &mut buf, limits, &mut batch).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for s in batch.slots() {
                        black_box(s.chain.result.as_ref().unwrap());
                    }
                },
                BatchSize::LargeInput,
            )
        });
        let rx = chains(2, 2048);
        let frame = vec![0x5au8; size];
        let hdr = VirtioNetHdr::default();
        for per in [1u16, 32] {
            g.bench_function(format!("rx push (mrg), a run of {per}"), |b| {
                b.iter_batched(
                    || fresh_queue(&m, &rx),
                    |mut q| {
                        // A run per `per` frames: rings found, then the used index
                        // published and the interrupt asked about once, as the daemon does.
                        for _ in 0..BATCH / per {
                            let ring = SplitRing::new(&q, &m).unwrap();
                            let mut run = RxRun::new(HDR, true);
                            for _ in 0..per {
                                black_box(run.push(&mut q, &ring, &hdr, &frame).expect("rx push"));
                            }
                            black_box(run.finish(&q, &ring).unwrap());
                        }
                    },
                    BatchSize::LargeInput,
                )
            });
        }
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
