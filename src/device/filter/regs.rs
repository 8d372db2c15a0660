//! The filter's register file: what the data path reads per frame. Written by one thread
//! (the port's control path, under the model's lock), read by every RX path without locks:
//! flags, station address and bucket bits are single atomic words; the exact-address table
//! is an open-addressed array of atomics behind a sequence counter, so a reader that raced
//! with a change retries instead of seeing a half-moved entry. No allocation after creation.

use std::hint::spin_loop;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use super::hash::{self, MAX_BUCKETS};
use super::Layout;
use crate::device::RxMode;
use crate::wire::MacAddr;

/// Slots of the exact table; at most half are used so probe runs stay short.
pub const TABLE_SLOTS: usize = 1 << 16;
/// Most addresses the exact table holds.
pub const TABLE_MAX: usize = TABLE_SLOTS / 2;
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
}

fn home(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize & (TABLE_SLOTS - 1)
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
        }
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
            let mut i = home(mac.as_u64());
            let mut found = false;
            for _ in 0..TABLE_SLOTS {
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

    /// Adds `mac` (single writer). The caller keeps the count below TABLE_MAX.
    pub(super) fn insert(&self, mac: &MacAddr) {
        let entry = mac.as_u64() | PRESENT;
        let mut i = home(mac.as_u64());
        loop {
            let e = self.table[i].load(Ordering::Relaxed);
            if e == entry {
                return;
            }
            if e == 0 {
                // A reader either sees the entry or not; no other slot moves.
                self.table[i].store(entry, Ordering::Release);
                return;
            }
            i = (i + 1) & (TABLE_SLOTS - 1);
        }
    }

    /// Removes `mac` (single writer), closing the gap by shifting later entries back
    /// (linear probing without tombstones), inside a write section readers retry around.
    pub(super) fn remove(&self, mac: &MacAddr) {
        let entry = mac.as_u64() | PRESENT;
        let mut i = home(mac.as_u64());
        loop {
            let e = self.table[i].load(Ordering::Relaxed);
            if e == 0 {
                return;
            }
            if e == entry {
                break;
            }
            i = (i + 1) & (TABLE_SLOTS - 1);
        }
        self.write_begin();
        let mut j = i;
        loop {
            j = (j + 1) & (TABLE_SLOTS - 1);
            let e = self.table[j].load(Ordering::Relaxed);
            if e == 0 {
                break;
            }
            let k = home(e & !PRESENT);
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

    #[test]
    fn table_insert_remove_with_collisions() {
        let r = FilterRegs::new(Layout::Exact, MacAddr::default());
        let macs: Vec<MacAddr> = (0..5000u64)
            .map(|i| MacAddr::from_u64(0x0100_5e00_0000 + i))
            .collect();
        for m in &macs {
            r.insert(m);
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
            r.insert(m);
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
            churn.iter().for_each(|m| r.insert(m));
            churn.iter().for_each(|m| r.remove(m));
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
