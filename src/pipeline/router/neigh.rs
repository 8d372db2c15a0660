//! The router's neighbours: IP address to MAC, learned from ARP and neighbour discovery,
//! kept apart from the route snapshot.
//!
//! Guests choose what they announce, so learning is bounded: each port holds at most
//! `limit` neighbours, an entry not heard from for [`NEIGH_TTL`] ages out, and a new
//! neighbour changes nothing anyone cached. Only a neighbour that changes its MAC or ages
//! out bumps [`Neighbours::generation`], which the workers' route caches follow. Before,
//! every learned neighbour cloned every rule under the rules' writer lock and emptied
//! every worker's route cache: on a /64, a guest soliciting from random sources cost
//! O(n^2) and unbounded memory.
//!
//! Readers load an immutable map (`ArcSwap`, no lock); writers copy it under a mutex, which
//! only learning a new neighbour or a sweep takes. Refreshing a known neighbour is one
//! atomic store into its entry.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahash::RandomState;
use arc_swap::ArcSwap;

use crate::wire::MacAddr;

/// How long a neighbour stays without an ARP or NDP message from it. Linux keeps an
/// unreferenced entry about a minute past STALE (gc_stale_time 60 s); five minutes spares
/// a quiet host the drop of the first packet that has to resolve it again, while a guest's
/// own stack refreshes an entry it uses well within it.
pub const NEIGH_TTL: Duration = Duration::from_secs(300);
/// Default neighbours per port (`--neigh-limit`): Linux's gc_thresh3 for a whole table.
pub const DEFAULT_NEIGH_LIMIT: usize = 1024;

#[derive(Debug)]
struct Neigh {
    mac: MacAddr,
    port: usize,
    /// Seconds since the table's epoch when last heard from.
    seen: AtomicU32,
}

type Map = HashMap<IpAddr, Arc<Neigh>, RandomState>;

/// What `learn` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighLearned {
    Refreshed,
    New,
    /// Known with another MAC or port: replaced, and the route caches follow.
    Changed,
    /// The port holds its limit of live neighbours.
    Refused,
}

/// Writer-side state: the per-port counts and when expired entries were last swept.
struct Writer {
    held: Vec<usize>,
    swept: u32,
}

pub struct Neighbours {
    map: ArcSwap<Map>,
    writer: Mutex<Writer>,
    generation: AtomicU64,
    limit: usize,
    ttl: u32,
    epoch: Instant,
}

impl Neighbours {
    pub fn new(ports: usize, limit: usize) -> Self {
        Self::with_ttl(ports, limit, NEIGH_TTL)
    }

    pub fn with_ttl(ports: usize, limit: usize, ttl: Duration) -> Self {
        Neighbours {
            map: ArcSwap::from_pointee(Map::default()),
            writer: Mutex::new(Writer {
                held: vec![0; ports.max(1)],
                swept: u32::MAX,
            }),
            generation: AtomicU64::new(0),
            limit,
            ttl: u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX),
            epoch: Instant::now(),
        }
    }

    /// Neighbours a port may hold (`--neigh-limit`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn now(&self) -> u32 {
        u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    fn live(&self, n: &Neigh, now: u32) -> bool {
        now.saturating_sub(n.seen.load(Ordering::Relaxed)) < self.ttl
    }

    /// Bumped when a neighbour changes or ages out: route caches drop what they hold.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The MAC of a live neighbour.
    pub fn get(&self, ip: &IpAddr) -> Option<MacAddr> {
        let map = self.map.load();
        let n = map.get(ip)?;
        self.live(n, self.now()).then_some(n.mac)
    }

    /// Live neighbours, sorted by address.
    pub fn list(&self) -> Vec<(IpAddr, MacAddr)> {
        let now = self.now();
        let mut v: Vec<_> = self
            .map
            .load()
            .iter()
            .filter(|(_, n)| self.live(n, now))
            .map(|(ip, n)| (*ip, n.mac))
            .collect();
        v.sort();
        v
    }

    /// Records that `ip` is at `mac` on `port`.
    pub fn learn(&self, ip: IpAddr, mac: MacAddr, port: usize) -> NeighLearned {
        let now = self.now();
        if let Some(n) = self.map.load().get(&ip) {
            if n.mac == mac && n.port == port {
                n.seen.store(now, Ordering::Relaxed);
                return NeighLearned::Refreshed;
            }
        }
        let mut w = crate::sync::lock(&self.writer);
        if port >= w.held.len() {
            return NeighLearned::Refused;
        }
        let replaces = self.map.load().get(&ip).is_some_and(|o| o.port == port);
        if !replaces && w.held[port] >= self.limit {
            // Full: make room from expired entries, at most once a second.
            if w.swept == now || !self.sweep(&mut w, now) || w.held[port] >= self.limit {
                return NeighLearned::Refused;
            }
        }
        // Read after any sweep: an old entry the sweep took is already given back.
        let cur = self.map.load_full();
        let old = cur.get(&ip).cloned();
        let mut next = Map::clone(&cur);
        let entry = Arc::new(Neigh {
            mac,
            port,
            seen: AtomicU32::new(now),
        });
        next.insert(ip, entry);
        if let Some(o) = &old {
            w.held[o.port] = w.held[o.port].saturating_sub(1);
        }
        w.held[port] += 1;
        self.map.store(Arc::new(next));
        if old.is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            NeighLearned::Changed
        } else {
            NeighLearned::New
        }
    }

    /// Drops expired entries (writer lock held); true if any went.
    fn sweep(&self, w: &mut Writer, now: u32) -> bool {
        w.swept = now;
        let cur = self.map.load();
        let dead: Vec<IpAddr> = cur
            .iter()
            .filter(|(_, n)| !self.live(n, now))
            .map(|(ip, _)| *ip)
            .collect();
        if dead.is_empty() {
            return false;
        }
        let mut next = Map::clone(&cur);
        for ip in &dead {
            if let Some(n) = next.remove(ip) {
                w.held[n.port] = w.held[n.port].saturating_sub(1);
            }
        }
        self.map.store(Arc::new(next));
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Neighbours `port` holds, live or not yet swept.
    pub fn held(&self, port: usize) -> usize {
        let w = crate::sync::lock(&self.writer);
        w.held.get(port).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(i: u64) -> IpAddr {
        IpAddr::V6(std::net::Ipv6Addr::from((0xfd00_0002u128 << 96) | u128::from(i)))
    }

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);

    #[test]
    fn learn_refresh_change() {
        let n = Neighbours::new(2, 8);
        let ip: IpAddr = "10.1.0.7".parse().unwrap();
        assert_eq!(n.get(&ip), None);
        assert_eq!(n.learn(ip, A, 0), NeighLearned::New);
        let g = n.generation();
        assert_eq!(n.learn(ip, A, 0), NeighLearned::Refreshed);
        assert_eq!(
            n.generation(),
            g,
            "a new or refreshed neighbour invalidates nothing"
        );
        assert_eq!(n.get(&ip), Some(A));
        let b = MacAddr([2, 0, 0, 0, 0, 0xb]);
        assert_eq!(n.learn(ip, b, 0), NeighLearned::Changed);
        assert_eq!(n.generation(), g + 1);
        assert_eq!(n.get(&ip), Some(b));
        assert_eq!(n.list(), vec![(ip, b)]);
        assert_eq!(n.learn(ip, b, 5), NeighLearned::Refused, "no such port");
    }

    #[test]
    fn entries_age_out_and_make_room() {
        let n = Neighbours::with_ttl(1, 1, Duration::ZERO);
        // With a TTL of zero nothing is ever live: learnt, then swept to make room.
        assert_eq!(n.learn(v6(1), A, 0), NeighLearned::New);
        assert_eq!(n.get(&v6(1)), None);
        let g = n.generation();
        assert_eq!(n.learn(v6(2), A, 0), NeighLearned::New);
        assert_eq!(n.held(0), 1);
        assert_eq!(n.generation(), g + 1, "an entry aged out: caches follow");
        // At most one sweep a second: the next is refused until then.
        assert_eq!(n.learn(v6(3), A, 0), NeighLearned::Refused);
    }

    /// 100 000 spoofed neighbours on one port. Before, each cloned the whole
    /// rules snapshot (with every neighbour so far) and emptied every route cache: about
    /// n^2 / 2 = 5 * 10^9 entry copies and 100 000 cache flushes. Now the port's share
    /// fills, the rest cost a lookup and a refusal, and nothing is invalidated.
    #[test]
    fn a_hundred_thousand_spoofed_neighbours_cost_the_limit_and_invalidate_nothing() {
        const N: u64 = 100_000;
        let n = Neighbours::new(2, DEFAULT_NEIGH_LIMIT);
        let good: IpAddr = "fd00:1::9".parse().unwrap();
        n.learn(good, MacAddr([2, 0, 0, 0, 0, 9]), 1);
        let g = n.generation();
        let mut refused = 0u64;
        for i in 0..N {
            if n.learn(v6(i + 1), A, 0) == NeighLearned::Refused {
                refused += 1;
            }
        }
        let limit = DEFAULT_NEIGH_LIMIT as u64;
        assert_eq!(refused, N - limit);
        assert_eq!(n.held(0), DEFAULT_NEIGH_LIMIT);
        assert_eq!(n.generation(), g, "no route cache was emptied");
        assert_eq!(
            n.get(&good),
            Some(MacAddr([2, 0, 0, 0, 0, 9])),
            "the other port's neighbour stays"
        );
        // Entry copies: each accepted neighbour copies the map once (at most limit + 1
        // entries), against every neighbour so far before.
        let before = N * (N + 1) / 2;
        let after = limit * (limit + 1) / 2 + limit;
        eprintln!(
            "100 000 spoofed neighbours: {before} entry copies and {N} cache flushes before, \
             at most {after} copies and 0 flushes now ({:.0}x less)",
            before as f64 / after as f64
        );
        // The other port learns as before.
        assert_eq!(n.learn("fd00:1::10".parse().unwrap(), A, 1), NeighLearned::New);
    }
}
