//! The two Linux changes this project models, each "after" against its "before" as the
//! daemon itself runs them (the modes guest-tests/seeds.sh compares in a guest), with 1, 2
//! and 4 worker threads, each on a frame or destination of its own:
//!
//! - **checksum actions**: `--csum-rules locked` takes one lock per action list for every
//!   frame and counts under it in statistics every thread writes, as act_csum did before
//!   Linux 4.12's lockless rework; the default loads an immutable snapshot of the rules
//!   (`LiveRules`) and counts in the worker's own `Tally`. Both run
//!   `ActionList::apply` on the same 64-byte UDP frame.
//! - **route caching**: `--route-cache shared`, one cache for every worker behind one
//!   lock, against the per-queue `RouteCache` each worker owns by default (`nh_rth_output`
//!   made per-CPU in Linux 3.6).
//!
//! Criterion reports the time per packet of one thread while the others run the same loop;
//! the ratio between the rows of one mode is the contention. docs/performance.md, "The
//! seeds' experiments", has the results.
//!
//! cargo bench --bench contention

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dpaa_vnic::pipeline::csum_action::{CsumAction, Dir};
use dpaa_vnic::pipeline::router::{RouteCache, SharedRouteCache};
use dpaa_vnic::pipeline::rules::{LiveRules, Rules};
use dpaa_vnic::pipeline::Packet;
use dpaa_vnic::stats::Tallies;
use dpaa_vnic::wire::checksum::checksum;
use dpaa_vnic::wire::{MacAddr, VirtioNetHdr};

/// Threads per row: a 2-CPU machine runs two at once at most, so 4 shows what a queue
/// loses while it waits for a CPU as well as for the lock.
const THREADS: [usize; 3] = [1, 2, 4];

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
    // The daemon's two modes, through the same call a worker makes: `--csum-rules locked`
    // (one lock per list, statistics every thread writes under it) and the default
    // (a snapshot loaded per frame, every count in the worker's own tally).
    let modes = [
        (
            "--csum-rules locked",
            Rules::new(1, vec![action.clone()]).with_locked_actions(),
        ),
        ("--csum-rules lockless", Rules::new(1, vec![action.clone()])),
    ];
    for threads in THREADS {
        for (name, rules) in &modes {
            let live = LiveRules::new(rules.clone());
            let tallies = Tallies::new(1, 1);
            g.bench_with_input(BenchmarkId::new(*name, threads), &threads, |b, &n| {
                b.iter_custom(|iters| {
                    threaded(
                        n,
                        iters,
                        |_| (template.clone(), tallies.register()),
                        |(frame, tally)| {
                            let rules = live.load();
                            let mut pkt = Packet::new(VirtioNetHdr::default(), frame);
                            let counts = tally.counts(0, 0);
                            black_box(rules.actions_for(0, Dir::Ingress).apply(&mut pkt, counts));
                            counts.queue.tx_packets.inc();
                        },
                    )
                })
            });
        }
    }
    g.finish();
}

fn bench_route_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention/route cache hit");
    g.throughput(Throughput::Elements(1));
    let dst = |t: usize| IpAddr::V4(Ipv4Addr::new(172, 16, 0, 7 + t as u8));
    let mac = MacAddr([2, 0, 0, 0, 0, 9]);
    for threads in THREADS {
        // `--route-cache shared`: one cache for all threads, behind its lock.
        let shared = SharedRouteCache::default();
        // The first look-up takes the generation; the entries are put after it.
        shared.get(1, dst(0));
        for t in 0..threads {
            shared.put(dst(t), mac, 1);
        }
        g.bench_with_input(
            BenchmarkId::new("--route-cache shared", threads),
            &threads,
            |b, &n| {
                b.iter_custom(|iters| {
                    threaded(n, iters, dst, |d| {
                        black_box(shared.get(1, black_box(*d)).expect("cached"));
                    })
                })
            },
        );
        // The default: each worker's own cache, checked against the table's generation.
        g.bench_with_input(
            BenchmarkId::new("--route-cache per-queue", threads),
            &threads,
            |b, &n| {
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
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_csum_action, bench_route_cache);
criterion_main!(benches);
