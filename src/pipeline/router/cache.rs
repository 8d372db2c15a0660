//! Each queue worker's cache of resolved routes, and the one shared cache of
//! `--route-cache shared`.

use std::net::IpAddr;
use std::sync::Mutex;

use crate::wire::MacAddr;

/// A resolved destination as a worker caches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheEntry {
    dst: IpAddr,
    mac: MacAddr,
    port: usize,
}

const SLOTS: usize = 256;

/// One queue worker's cache of resolved routes: direct-mapped, owned by the worker (never
/// shared, so never locked), emptied when the rules' generation changes.
pub struct RouteCache {
    generation: u64,
    slots: Box<[Option<CacheEntry>; SLOTS]>,
}

impl Default for RouteCache {
    fn default() -> Self {
        RouteCache {
            generation: 0,
            slots: Box::new([None; SLOTS]),
        }
    }
}

fn slot(dst: &IpAddr) -> usize {
    let h = match dst {
        IpAddr::V4(a) => u64::from(a.to_bits()),
        IpAddr::V6(a) => {
            let b = a.to_bits();
            (b as u64) ^ ((b >> 64) as u64)
        }
    };
    // Fibonacci hashing: the top bits of the product spread consecutive addresses.
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SLOTS
}

impl RouteCache {
    /// The cached (next-hop MAC, port) for `dst` if it is valid for `generation`.
    #[inline]
    pub fn get(&mut self, generation: u64, dst: IpAddr) -> Option<(MacAddr, usize)> {
        if self.generation != generation {
            self.slots.fill(None);
            self.generation = generation;
            return None;
        }
        match self.slots[slot(&dst)] {
            Some(e) if e.dst == dst => Some((e.mac, e.port)),
            _ => None,
        }
    }

    pub fn put(&mut self, dst: IpAddr, mac: MacAddr, port: usize) {
        self.slots[slot(&dst)] = Some(CacheEntry { dst, mac, port });
    }
}

/// `--route-cache shared`: one cache for every worker, behind one lock, so that every
/// routed frame writes the same cache line from whichever CPU it is on. This is the
/// "before" of Linux's per-CPU output route (`nh_pcpu_rth_output`, whose shared route's
/// refcount bounced the same way), kept to measure the per-queue cache against in the same
/// daemon (docs/performance.md, "The seeds' experiments"). Never the default.
#[derive(Default)]
pub struct SharedRouteCache(Mutex<RouteCache>);

impl SharedRouteCache {
    pub fn get(&self, generation: u64, dst: IpAddr) -> Option<(MacAddr, usize)> {
        crate::sync::lock(&self.0).get(generation, dst)
    }

    pub fn put(&self, dst: IpAddr, mac: MacAddr, port: usize) {
        crate::sync::lock(&self.0).put(dst, mac, port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cache_is_invalidated_by_generation() {
        let mut c = RouteCache::default();
        let m = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(c.get(1, ip("10.1.0.7")), None);
        c.put(ip("10.1.0.7"), m, 0);
        assert_eq!(c.get(1, ip("10.1.0.7")), Some((m, 0)));
        // A colliding or different address is a miss, never a wrong answer.
        assert_eq!(c.get(1, ip("10.1.0.8")), None);
        assert_eq!(c.get(2, ip("10.1.0.7")), None);
        assert_eq!(c.get(2, ip("10.1.0.7")), None);
    }

    /// The shared cache answers as a worker's own does, whoever asks.
    #[test]
    fn shared_cache_is_one_cache_for_every_worker() {
        let c = std::sync::Arc::new(SharedRouteCache::default());
        let m = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(c.get(1, ip("10.1.0.7")), None);
        let other = c.clone();
        std::thread::spawn(move || other.put(ip("10.1.0.7"), m, 3))
            .join()
            .unwrap();
        assert_eq!(c.get(1, ip("10.1.0.7")), Some((m, 3)));
        assert_eq!(c.get(2, ip("10.1.0.7")), None);
    }
}
