//! What went wrong on a guest port, kept in one place: its counters of frontend and guest
//! trouble, its rate-limited warnings, the queues whose rings are broken, and the guard
//! that keeps a bug on one frame or command from spreading.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use log::{error, warn};

use vhost_user_backend::VringT;

use super::split_ring::{RingError, Vring};
use crate::logging::{error_chain, WarnLimiter};
use crate::stats::ConnStats;

/// A port's record of trouble: shared by every thread that serves the port.
#[derive(Debug, Default)]
pub struct Health {
    /// The port's id, for log lines.
    pub id: usize,
    /// What frontends and guests did to the port: connections, broken rings, refusals,
    /// memory faults, contained bugs.
    pub stats: ConnStats,
    warn: WarnLimiter,
}

impl Health {
    pub fn new(id: usize) -> Self {
        Health {
            id,
            ..Health::default()
        }
    }

    /// Whether a warning may be logged now (one a second per port).
    pub fn may_warn(&self) -> bool {
        self.warn.allow()
    }

    /// Runs `f`, which handles input from a guest or frontend. If it panics (a bug: none is
    /// known to be reachable, and the fuzz targets look for them), the panic stops here,
    /// inside whatever lock the caller holds, so no lock is poisoned and no other port or
    /// later frame is affected: vhost-user-backend 0.24 locks each vring with
    /// `.write().unwrap()`. Counted in `panics`; the hook in main.rs logs the message, rate
    /// limited. `None` when it panicked.
    pub fn catch_bug<T>(&self, what: &str, f: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(_) => {
                self.stats.panics.inc();
                if self.may_warn() {
                    error!(
                        "port {}: a bug was hit handling {what}; dropped it and carried on",
                        self.id
                    );
                }
                None
            }
        }
    }

    /// Runs `each` on the items of a run under one [`Health::catch_bug`], not one per item:
    /// `catch_unwind` calls its closure through a pointer. A bug met while `each` has set
    /// its `contained` flag (work on the item alone, such as a frame's checksum actions)
    /// costs that item only, and the run resumes at the next. Any other bug ends the run:
    /// `Err` holds the index of the item it was met on.
    #[inline]
    pub fn catch_bug_in_run<T>(
        &self,
        what: &str,
        items: &mut [T],
        mut each: impl FnMut(&mut T, &Cell<bool>),
    ) -> Result<(), usize> {
        let mut at = 0;
        loop {
            let contained = Cell::new(false);
            let from = at;
            let ran = self.catch_bug(what, || {
                for (i, item) in items.iter_mut().enumerate().skip(from) {
                    at = i;
                    each(item, &contained);
                }
            });
            match ran {
                Some(()) => return Ok(()),
                None if contained.get() => at += 1,
                None => return Err(at),
            }
        }
    }

    /// The driver broke queue `q` (`e`): marked in `broken`, counted and logged once, then
    /// the queue is left alone until the frontend programs it again.
    pub fn ring_broken(&self, broken: &BrokenRings, q: usize, e: &RingError) {
        if broken.set(q) {
            self.stats.rings_broken.inc();
            if self.may_warn() {
                warn!(
                    "port {}: queue {q}: {}; not served until the frontend restarts it or reconnects",
                    self.id,
                    error_chain(e)
                );
            }
        }
    }
}

impl Health {
    /// Interrupts the driver of `vring`. The call eventfd is non-blocking (memcheck.rs): a
    /// frontend that let its counter fill only loses this interrupt.
    pub fn signal(&self, vring: &Vring, q: usize) {
        if let Err(e) = vring.signal_used_queue() {
            if self.may_warn() {
                warn!("port {}: signalling queue {q}: {e}", self.id);
            }
        }
    }
}

/// The queues of one connection that are broken (bit per queue index): shared by the worker
/// that serves a queue and by every sender that writes into it. A real device would set
/// DEVICE_NEEDS_RESET (virtio 1.2, 2.1.2); a vhost-user backend has no way to tell the
/// frontend's status register, so the queue is left alone until the frontend programs it
/// again (SET_VRING_BASE, SET_VRING_KICK) or reconnects.
#[derive(Debug, Default)]
pub struct BrokenRings(AtomicU64);

impl BrokenRings {
    /// Whether queue `q` is broken. Queue indexes past 63 (none: 31 pairs and the control
    /// queue at most) count as broken.
    #[inline]
    pub fn is(&self, q: usize) -> bool {
        q >= 64 || self.0.load(Ordering::Acquire) & (1 << q) != 0
    }

    /// Marks queue `q` broken; true if it was not already.
    pub fn set(&self, q: usize) -> bool {
        q < 64 && self.0.fetch_or(1 << q, Ordering::AcqRel) & (1 << q) == 0
    }

    /// The frontend programs queue `q` anew.
    pub fn clear(&self, q: usize) {
        if q < 64 {
            self.0.fetch_and(!(1 << q), Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items 2 and 5 hit a bug in contained work, item 7 outside it: every other item
    /// before 7 runs once, each bug is counted, and the run ends at 7.
    #[test]
    fn a_contained_bug_costs_one_item() {
        let h = Health::new(0);
        let mut done = Vec::new();
        let mut items: Vec<usize> = (0..10).collect();
        let ran = h.catch_bug_in_run("an item", &mut items, |&mut i, contained| {
            contained.set(true);
            assert!(i != 2 && i != 5, "a bug in item {i}'s own work");
            contained.set(false);
            assert!(i != 7, "a bug in the shared work");
            done.push(i);
        });
        assert_eq!(ran, Err(7));
        assert_eq!(done, [0, 1, 3, 4, 6]);
        assert_eq!(h.stats.snapshot().panics, 3);
        assert_eq!(h.catch_bug_in_run("an item", &mut items[..3], |_, _| {}), Ok(()));
        assert_eq!(h.catch_bug_in_run("an item", &mut [0u8; 0], |_, _| {}), Ok(()));
    }
}
