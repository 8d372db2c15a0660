//! The shapes of the two Linux changes this project models, with 1 and 2 worker threads
//! each thread on a frame or destination of its own:
//!
//! - **checksum actions**: act_csum before Linux 4.12's lockless rework took the action's
//!   spinlock per packet and counted into shared statistics; dpaa-vnic's workers load an
//!   immutable snapshot of the rules (`LiveRules`) and count into their own `Tally`. Both
//!   sides run the same `csum_action::run` on the same 64-byte UDP frame.
//! - **route caching**: a route cache shared by every CPU, whose entries are reference
//!   counted per packet (as a shared dst is held and released), against the per-queue
//!   `RouteCache` each dpaa-vnic worker owns (`nh_rth_output` made per-CPU in Linux 3.6).
//!
//! Criterion reports the time per packet of one thread while the others run the same loop;
//! the ratio between the 1- and 2-thread rows is the contention. A 2-CPU machine shows two
//! threads at most. docs/performance.md, "The seeds' own comparisons", has the results.
//!
//! cargo bench --bench contention

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dpaa_vnic::pipeline::csum_action::{self, ActionVerdict, CsumAction, Dir};
use dpaa_vnic::pipeline::router::RouteCache;
use dpaa_vnic::pipeline::rules::{LiveRules, Rules};
use dpaa_vnic::pipeline::Packet;
use dpaa_vnic::stats::Tallies;
use dpaa_vnic::wire::checksum::checksum;
use dpaa_vnic::wire::{MacAddr, VirtioNetHdr};

/// A 64-byte IPv4/UDP frame, its IP header checksum right, its UDP checksum to be written.
fn udp64() -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 50, 0, 1, 0, 0, 64, 17, 0, 0, 10, 1, 0, 2, 10, 1, 0, 3];
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 30, 0, 0]);
    f.resize(64, 0x5a);
    f
}

/// Runs `per_packet` `iters` times on each of `threads` threads started together; returns
/// the wall time, which criterion divides by `iters`: one thread's time per packet.
fn threaded<S: Send>(
    threads: usize,
    iters: u64,
    state: impl Fn(usize) -> S + Sync,
    per_packet: impl Fn(&mut S) + Sync,
) -> Duration {
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (start, state, per_packet) = (&start, &state, &per_packet);
            s.spawn(move || {
                let mut st = state(t);
                start.wait();
                for _ in 0..iters {
                    per_packet(&mut st);
                }
            });
        }
        start.wait();
        let t0 = Instant::now();
        // The scope joins every thread before it returns.
        t0
    })
    .elapsed()
}

fn bench_csum_action(c: &mut Criterion) {
    let action: CsumAction = "port=0,dir=ingress,update=iph+udp".parse().unwrap();
    let template = udp64();
    let mut g = c.benchmark_group("contention/csum action, 64B");
    g.throughput(Throughput::Elements(1));
    for threads in [1usize, 2] {
        // Before: the action behind one lock, its counters shared by every thread.
        let locked = Mutex::new(vec![action.clone()]);
        let (updated, packets) = (AtomicU64::new(0), AtomicU64::new(0));
        g.bench_with_input(
            BenchmarkId::new("lock + shared counters", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    threaded(
                        n,
                        iters,
                        |_| template.clone(),
                        |frame| {
                            let actions = locked.lock().unwrap_or_else(|p| p.into_inner());
                            let mut pkt = Packet::new(VirtioNetHdr::default(), frame);
                            if csum_action::run(&actions, &mut pkt).0 == ActionVerdict::Updated {
                                updated.fetch_add(1, Ordering::Relaxed);
                            }
                            packets.fetch_add(1, Ordering::Relaxed);
                            black_box(&frame);
                        },
                    )
                })
            },
        );
        // dpaa-vnic: a snapshot loaded per packet, counters (the queue's and the action's
        // own) in the worker's own tally.
        let live = LiveRules::new(Rules::new(1, vec![action.clone()]));
        let tallies = Tallies::new(1, 1);
        g.bench_with_input(
            BenchmarkId::new("snapshot + per-queue tallies", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    threaded(
                        n,
                        iters,
                        |_| (template.clone(), tallies.register()),
                        |(frame, tally)| {
                            let rules = live.load();
                            let mut pkt = Packet::new(VirtioNetHdr::default(), frame);
                            let counts = tally.counts(0, 0);
                            let actions = rules.actions_for(0, Dir::Ingress);
                            csum_action::apply(actions, &mut pkt, counts);
                            counts.queue.tx_packets.inc();
                            black_box(&frame);
                        },
                    )
                })
            },
        );
    }
    g.finish();
}

/// What a shared cache hands out: a resolved next hop, reference counted as a dst is.
struct Hop {
    mac: MacAddr,
    port: usize,
}

fn bench_route_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention/route cache hit");
    g.throughput(Throughput::Elements(1));
    let dst = |t: usize| IpAddr::V4(Ipv4Addr::new(172, 16, 0, 7 + t as u8));
    let mac = MacAddr([2, 0, 0, 0, 0, 9]);
    for threads in [1usize, 2] {
        // Before: one cache for all, behind a lock, each hit taking and dropping a reference.
        let shared: Mutex<Vec<(IpAddr, Arc<Hop>)>> =
            Mutex::new((0..2).map(|t| (dst(t), Arc::new(Hop { mac, port: 1 }))).collect());
        g.bench_with_input(
            BenchmarkId::new("shared, locked, refcounted", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    threaded(n, iters, dst, |d| {
                        let hop = {
                            let cache = shared.lock().unwrap_or_else(|p| p.into_inner());
                            cache.iter().find(|(k, _)| k == d).map(|(_, h)| h.clone())
                        };
                        let hop = hop.expect("cached");
                        black_box((hop.mac, hop.port));
                    })
                })
            },
        );
        // dpaa-vnic: each worker's own cache, checked against the table's generation.
        g.bench_with_input(BenchmarkId::new("per-queue cache", threads), &threads, |b, &n| {
            b.iter_custom(|iters| {
                threaded(
                    n,
                    iters,
                    |t| {
                        let mut cache = RouteCache::default();
                        cache.get(1, dst(t));
                        cache.put(dst(t), mac, 1);
                        (cache, dst(t))
                    },
                    |(cache, d)| {
                        black_box(cache.get(1, black_box(*d)).expect("cached"));
                    },
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_csum_action, bench_route_cache);
criterion_main!(benches);
