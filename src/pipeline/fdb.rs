//! The switch's forwarding database: MAC address to port, learned from source addresses.
//!
//! A fixed open-addressing table of atomics: lookups are plain loads, learning an address
//! that is already known writes nothing, so workers on different queues never contend on
//! it in the steady state. No lock, no allocation after start-up.
//!
//! Guests choose the source addresses, so the slot hash is keyed (aHash, a random key per
//! daemon start): a set of addresses built to crowd one neighbourhood under one key is a
//! random set under another. Each port may hold at most `limit` entries, so a guest that
//! floods random source addresses fills its own share, not the table: other ports'
//! stations stay learned and their traffic is not flooded to the flooder.
//!
//! Every write bumps a generation. A worker keeps the last source it learned and the last
//! destination it looked up, with the generation they were true at ([`FdbCache`]): a
//! stream of frames between two stations then costs one load per frame, not two keyed
//! hashes and their probes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ahash::RandomState;

use crate::wire::MacAddr;

const SLOTS: usize = 4096;
const PROBES: usize = 8;
/// Default entries per port (`--fdb-limit`): a quarter of the table, so one port can
/// never crowd out the others' neighbourhoods.
pub const DEFAULT_PORT_LIMIT: usize = SLOTS / 4;

/// What `learn` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// Already there for this port (the steady state: nothing written), or not learnable
    /// (a multicast source).
    Known,
    New,
    /// The station moved here from another port.
    Moved,
    /// The port already holds its limit of entries: not learned.
    Refused,
}

/// Entry layout: MAC in bits 16..64, port + 1 in bits 0..16 (0 marks an empty slot).
pub struct Fdb {
    slots: Box<[AtomicU64]>,
    key: RandomState,
    /// Entries per port. Updated with atomic adds by whichever worker learns; two workers
    /// racing for one slot can leave a count off by one until the entry changes again.
    held: Box<[AtomicUsize]>,
    limit: usize,
    /// Bumped after every change of an entry (never in the steady state).
    generation: AtomicU64,
}

impl Default for Fdb {
    fn default() -> Self {
        Fdb::new(1, DEFAULT_PORT_LIMIT)
    }
}

impl Fdb {
    /// A table for `ports` ports (0xffff at most), each holding at most `limit` entries.
    pub fn new(ports: usize, limit: usize) -> Self {
        Fdb {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            key: RandomState::new(),
            held: (0..ports.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            limit,
            generation: AtomicU64::new(0),
        }
    }

    /// Entries a port may hold (`--fdb-limit`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn home(&self, mac: u64) -> usize {
        self.key.hash_one(mac) as usize % SLOTS
    }

    pub fn lookup(&self, mac: &MacAddr) -> Option<usize> {
        let key = mac.as_u64();
        let h = self.home(key);
        for i in 0..PROBES {
            let e = self.slots[(h + i) % SLOTS].load(Ordering::Relaxed);
            if e == 0 {
                return None;
            }
            if e >> 16 == key {
                return Some((e & 0xffff) as usize - 1);
            }
        }
        None
    }

    /// Entries port `port` holds now.
    pub fn held(&self, port: usize) -> usize {
        self.held.get(port).map_or(0, |h| h.load(Ordering::Relaxed))
    }

    /// Takes one of `port`'s places, unless it holds its limit already.
    // Rust 1.99 deprecates fetch_update for try_update, which the minimum (1.82) lacks.
    #[allow(deprecated)]
    fn take(&self, port: usize) -> bool {
        let Some(h) = self.held.get(port) else {
            return false;
        };
        h.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < self.limit).then_some(n + 1)
        })
        .is_ok()
    }

    /// Gives back the place of the entry `e` (port + 1 in its low bits).
    // Rust 1.99 deprecates fetch_update for try_update, which the minimum (1.82) lacks.
    #[allow(deprecated)]
    fn give_back(&self, e: u64) {
        if let Some(h) = self.held.get(((e & 0xffff) as usize).wrapping_sub(1)) {
            let _ = h.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Changes since the table was made: what a worker's [`FdbCache`] is checked against.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records that `mac` was seen on `port`. Multicast sources are never learned.
    pub fn learn(&self, mac: &MacAddr, port: usize) -> Learned {
        let learned = self.learn_entry(mac, port);
        if matches!(learned, Learned::New | Learned::Moved) {
            self.generation.fetch_add(1, Ordering::Release);
        }
        learned
    }

    fn learn_entry(&self, mac: &MacAddr, port: usize) -> Learned {
        if mac.is_multicast() || port >= self.held.len().min(0xffff) {
            return Learned::Known;
        }
        let key = mac.as_u64();
        let entry = (key << 16) | (port as u64 + 1);
        let h = self.home(key);
        for i in 0..PROBES {
            let slot = &self.slots[(h + i) % SLOTS];
            let e = slot.load(Ordering::Relaxed);
            if e == entry {
                return Learned::Known;
            }
            if e >> 16 == key {
                // The station moved to another port.
                if !self.take(port) {
                    return Learned::Refused;
                }
                slot.store(entry, Ordering::Relaxed);
                self.give_back(e);
                return Learned::Moved;
            }
            if e == 0 {
                if !self.take(port) {
                    return Learned::Refused;
                }
                if slot
                    .compare_exchange(0, entry, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    return Learned::New;
                }
                self.give_back(entry);
            }
        }
        // Neighbourhood full: evict the home slot, as a hardware hash table would.
        if !self.take(port) {
            return Learned::Refused;
        }
        let old = self.slots[h].swap(entry, Ordering::Relaxed);
        self.give_back(old);
        Learned::New
    }
}

/// What one worker last learned and looked up, true while the table's generation stays
/// the one it was found at. Owned by the worker: no sharing, no atomics but the
/// generation's load.
#[derive(Debug, Default)]
pub struct FdbCache {
    /// Generation + 1 the entries below were found at (0: none yet).
    generation: u64,
    /// The last source learned: MAC as in [`MacAddr::as_u64`], and its port.
    src: Option<(u64, usize)>,
    /// The last destination looked up, and what the table said.
    dst: Option<(u64, Option<usize>)>,
}

impl FdbCache {
    /// Forgets what the table no longer says.
    #[inline]
    fn sync(&mut self, fdb: &Fdb) {
        let now = fdb.generation().wrapping_add(1);
        if self.generation != now {
            self.generation = now;
            self.src = None;
            self.dst = None;
        }
    }

    /// [`Fdb::learn`], skipped when `mac` on `port` is what this worker learned last and
    /// nothing changed since: the table would say `Known` and write nothing.
    #[inline]
    pub fn learn(&mut self, fdb: &Fdb, mac: &MacAddr, port: usize) -> Learned {
        self.sync(fdb);
        let key = mac.as_u64();
        if self.src == Some((key, port)) {
            return Learned::Known;
        }
        let learned = fdb.learn(mac, port);
        // Kept only when the table already said so, at the generation read before the
        // learn: any change since (another worker moving the station away included) is
        // after that read, and clears it. After a write of its own the next frame asks the
        // table once more, and finds it `Known`.
        if learned == Learned::Known {
            self.src = Some((key, port));
        }
        learned
    }

    /// [`Fdb::lookup`], answered from the last look-up when it was for `mac` and nothing
    /// changed since.
    #[inline]
    pub fn lookup(&mut self, fdb: &Fdb, mac: &MacAddr) -> Option<usize> {
        self.sync(fdb);
        let key = mac.as_u64();
        if let Some((k, port)) = self.dst {
            if k == key {
                return port;
            }
        }
        let port = fdb.lookup(mac);
        self.dst = Some((key, port));
        port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_s_cache_answers_as_the_table_does() {
        let f = Fdb::new(3, 16);
        let (mut c, mut other) = (FdbCache::default(), FdbCache::default());
        let a: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let b: MacAddr = "52:54:00:00:00:02".parse().unwrap();
        assert_eq!(c.lookup(&f, &b), None);
        assert_eq!(c.learn(&f, &a, 0), Learned::New);
        assert_eq!(c.learn(&f, &a, 0), Learned::Known);
        let at = f.generation();
        assert_eq!(c.learn(&f, &a, 0), Learned::Known);
        assert_eq!(f.generation(), at, "the steady state writes nothing");
        // Another worker learns b: this worker's cached miss for b is gone.
        assert_eq!(other.learn(&f, &b, 1), Learned::New);
        assert_eq!(c.lookup(&f, &b), Some(1));
        // a moves to port 2 through the other worker: this one learns it back.
        assert_eq!(other.learn(&f, &a, 2), Learned::Moved);
        assert_eq!(c.lookup(&f, &a), Some(2));
        assert_eq!(c.learn(&f, &a, 0), Learned::Moved);
        assert_eq!(other.lookup(&f, &a), Some(0));
        // A refused learn is not remembered as learned.
        let tiny = Fdb::new(1, 0);
        let mut t = FdbCache::default();
        assert_eq!(t.learn(&tiny, &a, 0), Learned::Refused);
        assert_eq!(t.learn(&tiny, &a, 0), Learned::Refused);
    }

    #[test]
    fn learn_lookup_move() {
        let f = Fdb::new(4, 16);
        let a: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        assert_eq!(f.lookup(&a), None);
        assert_eq!(f.learn(&a, 3), Learned::New);
        assert_eq!(f.learn(&a, 3), Learned::Known);
        assert_eq!(f.lookup(&a), Some(3));
        assert_eq!(f.learn(&a, 0), Learned::Moved);
        assert_eq!(f.lookup(&a), Some(0));
        assert_eq!((f.held(0), f.held(3)), (1, 0));
        let group: MacAddr = "01:00:5e:00:00:01".parse().unwrap();
        f.learn(&group, 1);
        assert_eq!(f.lookup(&group), None, "multicast sources are never learned");
        assert_eq!(f.learn(&a, 9), Learned::Known, "an unknown port learns nothing");
    }

    #[test]
    fn many_stations() {
        let f = Fdb::new(7, SLOTS);
        for i in 0..1000u64 {
            f.learn(&MacAddr::from_u64(0x0200_0000_0000 + i), (i % 7) as usize);
        }
        let found = (0..1000u64)
            .filter(|i| f.lookup(&MacAddr::from_u64(0x0200_0000_0000 + i)) == Some((i % 7) as usize))
            .count();
        // Eviction may drop a few under collisions, never return a wrong port.
        assert!(found > 990, "{found}");
        assert_eq!((0..7).map(|p| f.held(p)).sum::<usize>(), 1000 - (1000 - found));
    }

    /// A guest flooding random source MACs. Without a per-port limit (the table
    /// before) the flood evicted the other ports' stations, whose traffic was then flooded
    /// to every port, the flooder's included. With it the flooder fills its own share.
    #[test]
    fn a_mac_flood_fills_the_flooder_s_share_only() {
        let run = |limit: usize| {
            let f = Fdb::new(3, limit);
            let stations: Vec<MacAddr> = (0..200u64)
                .map(|i| MacAddr::from_u64(0x5254_0000_0000 + i))
                .collect();
            for (i, m) in stations.iter().enumerate() {
                f.learn(m, i % 2);
            }
            let mut refused = 0;
            let mut x = 0x1234_5678_9abc_def1u64;
            for _ in 0..100_000 {
                // xorshift: random locally administered unicast sources.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mac = MacAddr::from_u64((x & 0xfeff_ffff_ffff) | 0x0200_0000_0000);
                if f.learn(&mac, 2) == Learned::Refused {
                    refused += 1;
                }
            }
            let kept = stations
                .iter()
                .enumerate()
                .filter(|(i, m)| f.lookup(m) == Some(i % 2))
                .count();
            (kept, refused, f.held(2))
        };
        let (before, _, _) = run(usize::MAX);
        let (kept, refused, held) = run(DEFAULT_PORT_LIMIT);
        eprintln!("mac flood of 100 000 sources: other ports' stations kept {before} of 200 without a limit, {kept} with it");
        assert!(
            before < 50,
            "the flood must really evict without a limit: {before} kept"
        );
        assert_eq!(held, DEFAULT_PORT_LIMIT);
        assert!(refused >= 100_000 - DEFAULT_PORT_LIMIT - 8);
        // Only the flooder's first DEFAULT_PORT_LIMIT learns could evict (when a whole
        // neighbourhood of 8 was taken): a handful at most.
        assert!(kept >= 195, "{kept} of 200 stations kept");
    }
}
