//! The switch's forwarding database: MAC address to port, learned from source addresses.
//!
//! A fixed open-addressing table of atomics: lookups are plain loads, learning an address
//! that is already known writes nothing, so workers on different queues never contend on
//! it in the steady state. No lock, no allocation after start-up.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::MacAddr;

const SLOTS: usize = 4096;
const PROBES: usize = 8;

/// Entry layout: MAC in bits 16..64, port + 1 in bits 0..16 (0 marks an empty slot).
pub struct Fdb {
    slots: Box<[AtomicU64]>,
}

impl Default for Fdb {
    fn default() -> Self {
        Fdb {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn home(mac: u64) -> usize {
    // Fibonacci hashing spreads the low-entropy OUI-heavy addresses.
    (mac.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % SLOTS
}

impl Fdb {
    pub fn lookup(&self, mac: &MacAddr) -> Option<usize> {
        let key = mac.as_u64();
        let h = home(key);
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

    /// Records that `mac` was seen on `port`. Multicast sources are never learned.
    pub fn learn(&self, mac: &MacAddr, port: usize) {
        if mac.is_multicast() || port >= 0xffff {
            return;
        }
        let key = mac.as_u64();
        let entry = (key << 16) | (port as u64 + 1);
        let h = home(key);
        for i in 0..PROBES {
            let slot = &self.slots[(h + i) % SLOTS];
            let e = slot.load(Ordering::Relaxed);
            if e == entry {
                return;
            }
            if e >> 16 == key {
                // The station moved to another port.
                slot.store(entry, Ordering::Relaxed);
                return;
            }
            if e == 0
                && slot
                    .compare_exchange(0, entry, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
        // Neighbourhood full: evict the home slot, as a hardware hash table would.
        self.slots[h].store(entry, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learn_lookup_move() {
        let f = Fdb::default();
        let a: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        assert_eq!(f.lookup(&a), None);
        f.learn(&a, 3);
        assert_eq!(f.lookup(&a), Some(3));
        f.learn(&a, 0);
        assert_eq!(f.lookup(&a), Some(0));
        let group: MacAddr = "01:00:5e:00:00:01".parse().unwrap();
        f.learn(&group, 1);
        assert_eq!(f.lookup(&group), None, "multicast sources are never learned");
    }

    #[test]
    fn many_stations() {
        let f = Fdb::default();
        for i in 0..1000u64 {
            f.learn(&MacAddr::from_u64(0x0200_0000_0000 + i), (i % 7) as usize);
        }
        let found = (0..1000u64)
            .filter(|i| f.lookup(&MacAddr::from_u64(0x0200_0000_0000 + i)) == Some((i % 7) as usize))
            .count();
        // Eviction may drop a few under collisions, never return a wrong port.
        assert!(found > 990, "{found}");
    }
}
