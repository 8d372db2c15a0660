//! Counters. Each queue owns a cache-line-aligned block written by the thread that serves
//! the queue (or, for a guest's RX queue, by whoever holds that queue's lock); the control
//! socket only reads them, and sums on read.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! queue_counters {
    ($($name:ident),* $(,)?) => {
        /// Counters of one queue pair.
        #[derive(Debug, Default)]
        #[repr(align(64))]
        pub struct QueueStats {
            $(pub $name: Counter,)*
        }

        /// A point-in-time copy of [`QueueStats`], as `ctl stats` prints it.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
        pub struct QueueSnapshot {
            $(pub $name: u64,)*
        }

        impl QueueStats {
            pub fn snapshot(&self) -> QueueSnapshot {
                QueueSnapshot { $($name: self.$name.get(),)* }
            }
        }

        impl std::ops::AddAssign for QueueSnapshot {
            fn add_assign(&mut self, o: Self) {
                $(self.$name += o.$name;)*
            }
        }
    };
}

queue_counters!(
    tx_packets,
    tx_bytes,
    tx_errors,
    tx_dropped,
    rx_packets,
    rx_bytes,
    rx_dropped,
    rx_errors,
    rx_csum_completed,
    tx_csum_completed,
    tx_gso,
    rx_gso,
    rx_gso_segmented,
    tx_gso_segmented,
    rx_filtered,
    rx_mcast_accepted,
    rx_hash_false_positive,
    csum_updated,
    csum_failed,
    routed,
    route_cache_hit,
    route_cache_miss,
    route_unresolved,
    route_unreachable,
    route_ttl_exceeded,
    route_errors,
);

/// Counters of a port's control path (device attachment only).
#[derive(Debug, Default)]
pub struct CtrlStats {
    pub ctrl_commands: Counter,
    pub ctrl_errors: Counter,
    /// Nanoseconds from popping a command to returning it with its ack (parse, apply,
    /// filter sync): the daemon's share of the time a guest waits on its control queue.
    pub ctrl_busy_ns: Counter,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CtrlSnapshot {
    pub ctrl_commands: u64,
    pub ctrl_errors: u64,
    pub ctrl_busy_ns: u64,
}

impl CtrlStats {
    pub fn snapshot(&self) -> CtrlSnapshot {
        CtrlSnapshot {
            ctrl_commands: self.ctrl_commands.get(),
            ctrl_errors: self.ctrl_errors.get(),
            ctrl_busy_ns: self.ctrl_busy_ns.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_sum() {
        let a = QueueStats::default();
        a.tx_packets.inc();
        a.tx_bytes.add(60);
        let b = QueueStats::default();
        b.tx_packets.add(2);
        let mut t = a.snapshot();
        t += b.snapshot();
        assert_eq!((t.tx_packets, t.tx_bytes, t.rx_packets), (3, 60, 0));
        assert_eq!(std::mem::align_of::<QueueStats>(), 64);
    }
}
