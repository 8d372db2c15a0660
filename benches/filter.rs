//! Cost of one filter sync against the table size N, for the changes a guest makes: none,
//! one join (address appended), one leave (address removed from the middle), and a full
//! replacement; against the baseline of rebuilding the filter from scratch for the same
//! table (what "remove all, add all" drivers did). Also the per-frame accept decision.
//!
//! cargo bench --bench filter

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use dpaa_vnic::device::features::offered;
use dpaa_vnic::device::features::Negotiated;
use dpaa_vnic::device::filter::{Filter, FilterRegs, Layout, Verdict};
use dpaa_vnic::device::rx_state::RxMode;
use dpaa_vnic::device::NicState;
use dpaa_vnic::wire::MacAddr;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn groups(n: usize, base: u64) -> Vec<MacAddr> {
    (0..n as u64)
        .map(|i| MacAddr::from_u64(0x0100_5e00_0000 + base + i))
        .collect()
}

fn filter_with(list: &[MacAddr]) -> Filter {
    let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    let mut f = Filter::new(Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096, mac);
    f.sync(&[], list);
    f
}

fn bench_sync(c: &mut Criterion) {
    let mut g = c.benchmark_group("sync");
    for n in [100usize, 1000, 10_000] {
        let list = groups(n, 0);
        let mut joined = list.clone();
        joined.push(MacAddr::from_u64(0x0100_5e7f_0000));
        let mut left = list.clone();
        left.remove(n / 2);
        let other = groups(n, 0x10_0000);
        for (name, next) in [
            ("unchanged", &list),
            ("one join", &joined),
            ("one leave", &left),
            ("all replaced", &other),
        ] {
            g.bench_with_input(BenchmarkId::new(name, n), next, |b, next| {
                b.iter_batched_ref(
                    || filter_with(&list),
                    |f| black_box(f.sync(&[], next)),
                    BatchSize::LargeInput,
                )
            });
        }
        // Baseline: the same one-join table applied by rebuilding from scratch.
        g.bench_with_input(BenchmarkId::new("rebuild (baseline)", n), &joined, |b, next| {
            b.iter(|| black_box(filter_with(next)))
        });
    }
    g.finish();
}

fn bench_classify(c: &mut Criterion) {
    let mut f = filter_with(&groups(2000, 0));
    // Out of the promiscuous mode a device starts in, as a driver's first commands take it.
    f.set_mode(RxMode {
        promisc: false,
        ..RxMode::default()
    });
    let hit = MacAddr::from_u64(0x0100_5e00_0100);
    let miss = MacAddr::from_u64(0x0100_5e40_0000);
    let uni = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    // Each case takes the path it is named for (checked here: a filter left promiscuous
    // would answer all three at its first test).
    assert_eq!(f.regs().classify(&hit), Verdict::Multicast);
    assert!(matches!(
        f.regs().classify(&miss),
        Verdict::Reject | Verdict::FalsePositive
    ));
    assert_eq!(f.regs().classify(&uni), Verdict::Accept);
    assert_eq!(
        f.regs().classify(&MacAddr([0x52, 0x54, 0, 0, 0, 9])),
        Verdict::Reject
    );
    let mut g = c.benchmark_group("classify (2000 groups, memac)");
    g.bench_function("joined group", |b| b.iter(|| f.regs().classify(black_box(&hit))));
    g.bench_function("other group", |b| b.iter(|| f.regs().classify(black_box(&miss))));
    g.bench_function("station unicast", |b| {
        b.iter(|| f.regs().classify(black_box(&uni)))
    });
    g.finish();
}

/// A MAC_TABLE_SET command: no unicast entries, `n` multicast groups.
fn table(n: usize) -> Vec<u8> {
    let mut cmd = vec![1u8, 0, 0, 0, 0, 0];
    cmd.extend_from_slice(&(n as u32).to_le_bytes());
    for m in groups(n, 0) {
        cmd.extend_from_slice(&m.0);
    }
    cmd
}

/// One whole MAC_TABLE_SET as the control queue applies it (parse, state, filter sync), for
/// the table of the 1001st join: where the daemon's 1.5 us per control command goes.
fn bench_table_set(c: &mut Criterion) {
    let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    let feat = Negotiated { bits: offered(1) };
    let (before, after) = (table(1000), table(1001));
    let mut g = c.benchmark_group("control");
    // A join storm in steady state: each command adds or removes one address at the end of a
    // list of about 1000, as the guest's IP_ADD_MEMBERSHIP / leave pairs do.
    g.bench_function("MAC_TABLE_SET 1000/1001 entries, one join or leave", |b| {
        let mut n = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096);
        n.apply(&feat, &before).unwrap();
        let mut tables = [&after, &before].into_iter().cycle();
        b.iter(|| black_box(n.apply(&feat, tables.next().unwrap()).unwrap()))
    });
    // Linux sends PROMISC and ALLMULTI before every table set, mostly unchanged.
    g.bench_function("PROMISC off", |b| {
        let mut n = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096);
        b.iter(|| black_box(n.apply(&feat, &[0, 0, 0]).unwrap()))
    });
    // Each command a change: what publishing the port's view (`ctl filter`) costs a command.
    g.bench_function("PROMISC on, off", |b| {
        let mut n = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096);
        let mut cmds = [[0u8, 0, 1], [0, 0, 0]].into_iter().cycle();
        b.iter(|| black_box(n.apply(&feat, &cmds.next().unwrap()).unwrap()))
    });
    g.finish();
}

/// Where the device attachment's remaining cost against QEMU's in-process answer comes from.
/// QEMU's virtio-net stops reading a table after 64 entries; dpaa-vnic reads every entry,
/// and the guest has just written each of those lines on another core. Here a second thread
/// plays the guest and rewrites the table before each command (a join or leave at the end
/// of N groups, as in the join storm); the measured thread copies it out and applies it, as
/// the control thread does. The same with the table written by the measuring thread itself
/// is the baseline: the difference is what moving the table between cores costs.
fn bench_table_from_another_core(c: &mut Criterion) {
    let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    let feat = Negotiated { bits: offered(1) };
    let mut g = c.benchmark_group("control, table written by");
    for n in [1000usize, 2000] {
        let (a, b) = (table(n), table(n + 1));
        let srcs = [&a, &b];
        // Guest memory as the daemon maps it; both threads copy with vm-memory, as the
        // driver's memcpy and the daemon's read of a descriptor do.
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let at = GuestAddress(0x1000);
        // Odd: a rewrite of srcs[seq / 2 % 2] is asked for; even: done.
        let seq = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            s.spawn(|| {
                let mut seen = 0;
                while !stop.load(Ordering::Acquire) {
                    let q = seq.load(Ordering::Acquire);
                    if q % 2 == 1 && q != seen {
                        mem.write_slice(srcs[(q / 2 % 2) as usize], at).unwrap();
                        seen = q;
                        seq.store(q + 1, Ordering::Release);
                    }
                    std::hint::spin_loop();
                }
            });
            let mut nic = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096);
            nic.apply(&feat, &a).unwrap();
            let mut buf = Vec::with_capacity(b.len());
            let mut k = 0u64;
            let mut command = |remote: bool| {
                let which = (k % 2) as usize;
                if remote {
                    let q = 2 * k + 1;
                    seq.store(q, Ordering::Release);
                    while seq.load(Ordering::Acquire) != q + 1 {
                        std::hint::spin_loop();
                    }
                } else {
                    mem.write_slice(srcs[which], at).unwrap();
                }
                k += 1;
                let t0 = Instant::now();
                buf.resize(srcs[which].len(), 0);
                mem.read_slice(&mut buf, at).unwrap();
                black_box(nic.apply(&feat, &buf).unwrap());
                t0.elapsed()
            };
            for (name, remote) in [("this core", false), ("another core", true)] {
                g.bench_function(BenchmarkId::new(name, n), |bch| {
                    bch.iter_custom(|iters| (0..iters).map(|_| command(remote)).sum::<Duration>())
                });
            }
            stop.store(true, Ordering::Release);
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_sync,
    bench_classify,
    bench_table_set,
    bench_table_from_another_core
);
criterion_main!(benches);
