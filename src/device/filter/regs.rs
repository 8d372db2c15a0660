//! The filter's register file: what the data path reads per frame. Written by one thread
//! (the port's control path, under the model's lock), read by every RX path without locks:
//! flags, station address and bucket bits are single atomic words; the exact-address table
//! is an open-addressed array of atomics behind a sequence counter, so a reader that raced
//! with a change retries instead of seeing a half-moved entry. No allocation after creation.
//!
//! The guest chooses the keys (with `--snoop`, 32 bits of every 33:33 MAC through its MLD
//! reports), so the slot hash is keyed: aHash with a random key per filter (ahash 0.8's
//! `RandomState`, designed against hash-flooding; std's SipHash would cost several times
//! more per frame), and no entry sits more than
//! [`MAX_PROBE`] slots past its home. A set built to collide under one key is a random set
//! under another, and a lookup never probes more than [`MAX_PROBE`] slots whatever is in
//! the table.

use std::hint::spin_loop;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use ahash::RandomState;

use serde::Serialize;

use super::hash::{self, MAX_BUCKETS};
use super::layout::Layout;
use super::vlan::VlanTable;
use crate::device::rx_state::RxMode;
use crate::wire::MacAddr;

/// Slots of the exact table; at most half are used so probe runs stay short.
pub const TABLE_SLOTS: usize = 1 << 16;
/// Most addresses the exact table holds.
pub const TABLE_MAX: usize = TABLE_SLOTS / 2;
/// Farthest an entry may sit from its home slot. At a load of at most one half a random key
/// set almost never comes near it (`an_adversarial_key_set_costs_what_a_random_one_does`
/// measures the longest displacement); an insert
/// that would go past it is refused, and the model then treats the address as one the
/// table could not take (accept-all for the exact layout, as when the table is full).
pub const MAX_PROBE: usize = 64;
const PRESENT: u64 = 1 << 48;

pub const F_PROMISC: u32 = 1 << 0;
pub const F_ALLMULTI: u32 = 1 << 1;
pub const F_ALLUNI: u32 = 1 << 2;
pub const F_NOMULTI: u32 = 1 << 3;
pub const F_NOUNI: u32 = 1 << 4;
pub const F_NOBCAST: u32 = 1 << 5;
/// More multicast addresses than the layout keeps exactly and cannot hash: accept all.
pub const F_MC_OVERFLOW: u32 = 1 << 6;
/// More unicast addresses than exact registers and no unicast hash: accept all unicast.
pub const F_UC_OVERFLOW: u32 = 1 << 7;

/// What the filter's model did, counted where `ctl` and `/metrics` read it without a lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FilterStats {
    pub filter_syncs: u64,
    pub filter_adds: u64,
    pub filter_removes: u64,
    /// Adds the exact table could not take (full, or no slot within MAX_PROBE of home).
    pub table_refused: u64,
}

impl FilterStats {
    /// Each counter's name and what it counts, for `# HELP`.
    pub const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "filter_syncs",
            "Address lists the driver sent, each diffed against the one before.",
        ),
        (
            "filter_adds",
            "Addresses added to the filter by incremental sync.",
        ),
        (
            "filter_removes",
            "Addresses removed from the filter by incremental sync.",
        ),
        (
            "table_refused",
            "Addresses the exact table could not take (the layout went accept-all).",
        ),
    ];
}

/// What the filter does with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Reject,
    Accept,
    /// Accepted multicast (not broadcast).
    Multicast,
    /// A hash hit for an address the guest never asked for: hardware delivers it, the
    /// guest's stack drops it.
    FalsePositive,
}

pub struct FilterRegs {
    layout: Layout,
    flags: AtomicU32,
    station: AtomicU64,
    buckets: [AtomicU64; MAX_BUCKETS / 64],
    seq: AtomicU64,
    table: Box<[AtomicU64]>,
    /// The slot hash's key, drawn when the filter is created.
    key: RandomState,
    /// The model's counters as of its last sync, for readers that must not wait for the
    /// model's lock (`ctl stats`, `/metrics`): syncs, adds, removes, refused.
    stats: [AtomicU64; 4],
    /// The VLANs a CTRL_VLAN driver lets through. The port keeps it in step with the
    /// features acked and the control queue; a reset of the address filter leaves it.
    vlan: VlanTable,
}

pub fn mode_flags(m: &RxMode) -> u32 {
    [
        (m.promisc, F_PROMISC),
        (m.allmulti, F_ALLMULTI),
        (m.alluni, F_ALLUNI),
        (m.nomulti, F_NOMULTI),
        (m.nouni, F_NOUNI),
        (m.nobcast, F_NOBCAST),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0, |f, (_, b)| f | b)
}

impl FilterRegs {
    pub fn new(layout: Layout, station: MacAddr) -> Self {
        FilterRegs {
            layout,
            flags: AtomicU32::new(mode_flags(&RxMode::default())),
            station: AtomicU64::new(station.as_u64()),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            seq: AtomicU64::new(0),
            table: (0..TABLE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            key: RandomState::new(),
            stats: Default::default(),
            vlan: VlanTable::default(),
        }
    }

    pub(super) fn publish_stats(&self, s: &FilterStats) {
        for (cell, v) in
            self.stats
                .iter()
                .zip([s.filter_syncs, s.filter_adds, s.filter_removes, s.table_refused])
        {
            cell.store(v, Ordering::Relaxed);
        }
    }

    /// The filter's counters as of its last sync, without its model's lock.
    pub fn stats(&self) -> FilterStats {
        let [filter_syncs, filter_adds, filter_removes, table_refused] =
            self.stats.each_ref().map(|c| c.load(Ordering::Relaxed));
        FilterStats {
            filter_syncs,
            filter_adds,
            filter_removes,
            table_refused,
        }
    }

    fn home(&self, mac: u64) -> usize {
        self.key.hash_one(mac) as usize & (TABLE_SLOTS - 1)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }

    pub(super) fn set_flags(&self, f: u32) {
        self.flags.store(f, Ordering::Release);
    }

    pub(super) fn set_station(&self, mac: MacAddr) {
        self.station.store(mac.as_u64(), Ordering::Release);
    }

    pub fn bucket_set(&self, b: usize) -> bool {
        self.buckets[b / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
    }

    pub(super) fn set_bucket(&self, b: usize, on: bool) {
        let bit = 1u64 << (b % 64);
        if on {
            self.buckets[b / 64].fetch_or(bit, Ordering::Release);
        } else {
            self.buckets[b / 64].fetch_and(!bit, Ordering::Release);
        }
    }

    /// Whether `mac` is in the exact table. Lock-free: retries if the writer moved entries
    /// meanwhile.
    pub fn contains(&self, mac: &MacAddr) -> bool {
        let want = mac.as_u64() | PRESENT;
        loop {
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 == 1 {
                spin_loop();
                continue;
            }
            let mut i = self.home(mac.as_u64());
            let mut found = false;
            // No entry sits farther than MAX_PROBE from its home (insert refuses it).
            for _ in 0..=MAX_PROBE {
                let e = self.table[i].load(Ordering::Relaxed);
                if e == 0 {
                    break;
                }
                if e == want {
                    found = true;
                    break;
                }
                i = (i + 1) & (TABLE_SLOTS - 1);
            }
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                return found;
            }
        }
    }

    fn write_begin(&self) {
        self.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn write_end(&self) {
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// Adds `mac` (single writer): the number of slots probed, or `None` if the free slot
    /// lies more than [`MAX_PROBE`] past its home (nothing is written). The caller keeps the
    /// count below TABLE_MAX.
    pub(super) fn insert(&self, mac: &MacAddr) -> Option<usize> {
        let entry = mac.as_u64() | PRESENT;
        let mut i = self.home(mac.as_u64());
        for probes in 1..=MAX_PROBE + 1 {
            let e = self.table[i].load(Ordering::Relaxed);
            if e == entry {
                return Some(probes);
            }
            if e == 0 {
                // A reader either sees the entry or not; no other slot moves.
                self.table[i].store(entry, Ordering::Release);
                return Some(probes);
            }
            i = (i + 1) & (TABLE_SLOTS - 1);
        }
        None
    }

    /// Removes `mac` (single writer), closing the gap by shifting later entries back
    /// (linear probing without tombstones), inside a write section readers retry around.
    pub(super) fn remove(&self, mac: &MacAddr) {
        let entry = mac.as_u64() | PRESENT;
        let mut i = self.home(mac.as_u64());
        let mut probes = 0;
        loop {
            let e = self.table[i].load(Ordering::Relaxed);
            if e == 0 || probes > MAX_PROBE {
                return;
            }
            if e == entry {
                break;
            }
            i = (i + 1) & (TABLE_SLOTS - 1);
            probes += 1;
        }
        self.write_begin();
        let mut j = i;
        loop {
            j = (j + 1) & (TABLE_SLOTS - 1);
            let e = self.table[j].load(Ordering::Relaxed);
            if e == 0 {
                break;
            }
            let k = self.home(e & !PRESENT);
            // Moving back only shortens an entry's distance from home, so MAX_PROBE holds.
            // Move e back to the hole at i unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < k && k <= j } else { i < k || k <= j };
            if !stays {
                self.table[i].store(e, Ordering::Relaxed);
                i = j;
            }
        }
        self.table[i].store(0, Ordering::Relaxed);
        self.write_end();
    }

    /// Fills `mac`'s home slot and the MAX_PROBE after it with other entries, so that its
    /// insert is refused (tests of what the model does then).
    #[cfg(test)]
    pub(super) fn block_home_of(&self, mac: &MacAddr) {
        let h = self.home(mac.as_u64());
        for d in 0..=MAX_PROBE {
            self.table[(h + d) & (TABLE_SLOTS - 1)]
                .store(PRESENT | (0x0100_5e70_0000 + d as u64), Ordering::Relaxed);
        }
    }

    /// Empties everything (driver reset).
    pub(super) fn clear(&self, station: MacAddr) {
        self.write_begin();
        for s in self.table.iter() {
            s.store(0, Ordering::Relaxed);
        }
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.write_end();
        self.set_station(station);
        self.set_flags(mode_flags(&RxMode::default()));
    }

    pub fn vlan(&self) -> &VlanTable {
        &self.vlan
    }

    /// Whether the VLAN table lets `frame` through; promiscuous mode passes every tag, as
    /// QEMU's virtio-net decides before it looks at the tag.
    #[inline]
    pub fn vlan_allows(&self, frame: &[u8]) -> bool {
        self.vlan.allows(frame) || self.flags.load(Ordering::Relaxed) & F_PROMISC != 0
    }

    /// The accept decision for a frame to `dst`: O(1), no allocation, no lock.
    pub fn classify(&self, dst: &MacAddr) -> Verdict {
        let f = self.flags.load(Ordering::Acquire);
        if dst.is_broadcast() {
            return if f & F_NOBCAST != 0 && f & F_PROMISC == 0 {
                Verdict::Reject
            } else {
                Verdict::Accept
            };
        }
        if dst.is_multicast() {
            if f & F_PROMISC != 0 {
                return Verdict::Multicast;
            }
            if f & F_NOMULTI != 0 {
                return Verdict::Reject;
            }
            if f & (F_ALLMULTI | F_MC_OVERFLOW) != 0 {
                return Verdict::Multicast;
            }
            return self.by_table_or_hash(dst, Verdict::Multicast);
        }
        if f & F_PROMISC != 0 {
            return Verdict::Accept;
        }
        if f & F_NOUNI != 0 {
            return Verdict::Reject;
        }
        if dst.as_u64() == self.station.load(Ordering::Acquire) || f & (F_ALLUNI | F_UC_OVERFLOW) != 0 {
            return Verdict::Accept;
        }
        self.by_table_or_hash(dst, Verdict::Accept)
    }

    fn by_table_or_hash(&self, dst: &MacAddr, hit: Verdict) -> Verdict {
        match hash::bucket(self.layout, dst) {
            Some(b) => {
                if !self.bucket_set(b) {
                    Verdict::Reject
                } else if self.contains(dst) {
                    hit
                } else {
                    Verdict::FalsePositive
                }
            }
            None if self.contains(dst) => hit,
            None => Verdict::Reject,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VLAN table decides unless the port is promiscuous (QEMU's order), whatever the
    /// address filter holds.
    #[test]
    fn promiscuous_mode_passes_every_vlan() {
        let r = FilterRegs::new(Layout::Dtsec, MacAddr::default());
        let mut f = vec![0u8; 64];
        f[12..16].copy_from_slice(&[0x81, 0x00, 0x00, 100]);
        assert!(
            r.vlan_allows(&f),
            "the table is off until a driver acks CTRL_VLAN"
        );
        r.vlan().reset(true);
        assert!(
            r.vlan_allows(&f),
            "a reset port is promiscuous, as QEMU's is: every tag passes"
        );
        r.set_flags(0);
        assert!(!r.vlan_allows(&f));
        r.set_flags(F_PROMISC);
        assert!(r.vlan_allows(&f));
        r.clear(MacAddr::default());
        r.set_flags(0);
        assert!(
            !r.vlan_allows(&f),
            "an address filter reset leaves the VLAN table"
        );
    }

    #[test]
    fn table_insert_remove_with_collisions() {
        let r = FilterRegs::new(Layout::Exact, MacAddr::default());
        let macs: Vec<MacAddr> = (0..5000u64)
            .map(|i| MacAddr::from_u64(0x0100_5e00_0000 + i))
            .collect();
        for m in &macs {
            assert!(r.insert(m).is_some());
        }
        assert!(macs.iter().all(|m| r.contains(m)));
        for m in macs.iter().step_by(2) {
            r.remove(m);
        }
        for (i, m) in macs.iter().enumerate() {
            assert_eq!(r.contains(m), i % 2 == 1, "{m}");
        }
        assert_eq!(r.seq.load(Ordering::Relaxed) % 2, 0);
    }

    #[test]
    fn readers_never_miss_an_entry_that_stays() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let r = Arc::new(FilterRegs::new(Layout::Exact, MacAddr::default()));
        let keep: Vec<MacAddr> = (0..64u64)
            .map(|i| MacAddr::from_u64(0x0100_5e10_0000 + i))
            .collect();
        for m in &keep {
            assert!(r.insert(m).is_some());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let (r2, stop2, keep2, started2) = (r.clone(), stop.clone(), keep.clone(), started.clone());
        let reader = std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                for m in &keep2 {
                    assert!(r2.contains(m), "lost {m}");
                    n += 1;
                }
                started2.store(true, Ordering::Relaxed);
            }
            n
        });
        // On a loaded machine the reader may not run before the churn is over: wait for it
        // (bounded), so the reads really overlap the writes.
        let t0 = std::time::Instant::now();
        while !started.load(Ordering::Relaxed) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
        // Churn entries that share probe runs with the kept ones.
        for round in 0..200u64 {
            let churn: Vec<MacAddr> = (0..256u64)
                .map(|i| MacAddr::from_u64(0x0100_5e20_0000 + round * 256 + i))
                .collect();
            churn.iter().for_each(|m| {
                r.insert(m);
            });
            churn.iter().for_each(|m| r.remove(m));
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    /// The slot function before the key (an unkeyed multiplicative hash), kept here to build
    /// the set that attacked it.
    fn unkeyed_home(mac: u64) -> usize {
        (mac.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize & (TABLE_SLOTS - 1)
    }

    /// Slots probed to insert `keys` in order into an empty linear-probing table whose slot
    /// function is `home` (no displacement limit): what the exact table cost before. Finds
    /// each free slot through a union-find of taken runs, so the count comes fast even
    /// where the probing itself is quadratic.
    fn probes_unbounded(home: impl Fn(u64) -> usize, keys: &[u64]) -> u64 {
        fn free(next: &mut [usize], i: usize) -> usize {
            let mut r = i;
            while next[r] != r {
                r = next[r];
            }
            let mut j = i;
            while next[j] != r {
                let n = next[j];
                next[j] = r;
                j = n;
            }
            r
        }
        let mut next: Vec<usize> = (0..TABLE_SLOTS).collect();
        let mut n = 0u64;
        for &k in keys {
            let h = home(k);
            let slot = free(&mut next, h);
            n += ((slot + TABLE_SLOTS - h) & (TABLE_SLOTS - 1)) as u64 + 1;
            next[slot] = (slot + 1) & (TABLE_SLOTS - 1);
        }
        n
    }

    /// Multicast MACs (01:00:5e, the guest picks the low 23 bits) whose unkeyed home slot
    /// lies below 2048: one in 32 random ones, the set an attacker would build against an
    /// unkeyed hash. Deterministic.
    fn colliding_set(n: usize) -> Vec<MacAddr> {
        (0..1u64 << 23)
            .map(|low| 0x0100_5e00_0000 | low)
            .filter(|k| unkeyed_home(*k) < 2048)
            .take(n)
            .map(MacAddr::from_u64)
            .collect()
    }

    fn insert_all(r: &FilterRegs, macs: &[MacAddr]) -> (u64, usize) {
        let mut total = 0u64;
        let mut worst = 0usize;
        for m in macs {
            let p = r.insert(m).expect("a random-looking set fits within MAX_PROBE");
            total += p as u64;
            worst = worst.max(p);
        }
        (total, worst)
    }

    #[test]
    fn an_adversarial_key_set_costs_what_a_random_one_does() {
        let bad = colliding_set(TABLE_MAX);
        assert_eq!(bad.len(), TABLE_MAX);
        // A benign set of the same size: consecutive groups, as a join loop makes them.
        let benign: Vec<MacAddr> = (0..TABLE_MAX as u64)
            .map(|i| MacAddr::from_u64(0x0100_5e40_0000 + i))
            .collect();
        let keys = |v: &[MacAddr]| v.iter().map(|m| m.as_u64()).collect::<Vec<_>>();

        // Before: the unkeyed slot function, on the same two sets.
        let before_bad = probes_unbounded(unkeyed_home, &keys(&bad));
        let before_benign = probes_unbounded(unkeyed_home, &keys(&benign));
        let before = before_bad as f64 / before_benign as f64;

        // Now: the keyed table itself.
        let r = FilterRegs::new(Layout::Exact, MacAddr::default());
        let (bad_probes, bad_worst) = insert_all(&r, &bad);
        let r2 = FilterRegs::new(Layout::Exact, MacAddr::default());
        let (benign_probes, benign_worst) = insert_all(&r2, &benign);
        let after = bad_probes as f64 / benign_probes as f64;
        eprintln!(
            "exact table, {TABLE_MAX} inserts: colliding/benign probes before {before:.0}x \
             ({before_bad} / {before_benign}), after {after:.2}x ({bad_probes} / {benign_probes}); \
             longest displacement {bad_worst} / {benign_worst}"
        );
        assert!(
            before > 1000.0,
            "the set must really attack the unkeyed hash: {before}"
        );
        assert!(
            after < 1.5,
            "keyed: the colliding set costs {after:.2}x a benign one"
        );
        assert!(bad_worst <= MAX_PROBE && benign_worst <= MAX_PROBE);
        // Every entry is found, and a miss probes at most MAX_PROBE + 1 slots.
        assert!(bad.iter().all(|m| r.contains(m)));
        assert!(!r.contains(&MacAddr::from_u64(0x0100_5eff_ffff)));
    }

    #[test]
    fn an_insert_past_the_probe_limit_is_refused_and_changes_nothing() {
        let r = FilterRegs::new(Layout::Exact, MacAddr::default());
        let m = MacAddr::from_u64(0x0100_5e01_0203);
        let h = r.home(m.as_u64());
        r.block_home_of(&m);
        assert_eq!(r.insert(&m), None);
        assert!(!r.contains(&m));
        let used = r.table.iter().filter(|e| e.load(Ordering::Relaxed) != 0).count();
        assert_eq!(used, MAX_PROBE + 1);
        // Free the last slot of the window: now it fits, at the limit.
        r.table[(h + MAX_PROBE) & (TABLE_SLOTS - 1)].store(0, Ordering::Relaxed);
        assert_eq!(r.insert(&m), Some(MAX_PROBE + 1));
        assert!(r.contains(&m));
    }
}
