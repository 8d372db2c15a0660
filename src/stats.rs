//! Counters, each written by exactly one thread. A worker thread (a guest queue pair's, a
//! tap queue's reader, the snoop querier) owns a [`Tally`]: one cache-line-aligned block per
//! (port, queue), holding what it received on its own queue and what it delivered to every
//! other port's queues. Nobody else writes it, so a count is a plain load and store, no
//! atomic read-modify-write and no shared written cache line. `ctl stats` and `--metrics`
//! sum the tallies of all workers on read ([`Tallies`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

pub use crate::counter::Counter;
use crate::histogram::Histogram;

macro_rules! queue_counters {
    ($($(#[doc = $doc:literal])+ $name:ident),* $(,)?) => {
        /// Counters of one queue pair.
        #[derive(Debug, Default)]
        #[repr(align(64))]
        pub struct QueueStats {
            $($(#[doc = $doc])+ pub $name: Counter,)*
        }

        /// A point-in-time copy of [`QueueStats`], as `ctl stats` prints it.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
        pub struct QueueSnapshot {
            $(pub $name: u64,)*
        }

        impl QueueSnapshot {
            /// Each counter's name and what it counts (its doc comment), for `# HELP`.
            pub const HELP: &'static [(&'static str, &'static str)] =
                &[$((stringify!($name), concat!($($doc),+)),)*];
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

        /// Counts since a baseline (`o`, taken earlier from the same counters).
        impl std::ops::SubAssign for QueueSnapshot {
            fn sub_assign(&mut self, o: Self) {
                $(self.$name = self.$name.saturating_sub(o.$name);)*
            }
        }
    };
}

queue_counters!(
    /// Frames the port sent into the switch: from the guest (its TX queues) on a guest
    /// port; from the host, read off the tap, on a tap port.
    tx_packets,
    /// Bytes of the frames the port sent into the switch (tx_packets), virtio-net header
    /// excluded.
    tx_bytes,
    /// Frames the port sent into the switch that were refused as malformed (a broken chain
    /// or header, a GSO frame that cannot be cut); a guest's chain is returned to its driver.
    tx_errors,
    /// Frames the port sent into the switch that were dropped whole (a spoofed source, too
    /// many GSO segments).
    tx_dropped,
    /// Frames the switch delivered out of the port: into the guest's RX queues on a guest
    /// port; written to the tap, to the host, on a tap port.
    rx_packets,
    /// Bytes of the frames the switch delivered out of the port (rx_packets), virtio-net
    /// header excluded.
    rx_bytes,
    /// Frames for the port dropped for want of room (no guest attached, no receive buffers
    /// posted) or refused by the tap.
    rx_dropped,
    /// Frames for the port that could not be written (a broken receive chain, a segment
    /// that does not fit).
    rx_errors,
    /// Frames whose partial checksum was completed before delivery to a guest that did not
    /// negotiate partial checksums.
    rx_csum_completed,
    /// Frames whose partial checksum was completed before they were written to a tap with
    /// `--tap-csum off`.
    tx_csum_completed,
    /// GSO frames (several segments' worth) the guest sent into the switch.
    tx_gso,
    /// GSO frames the tap handed to the switch.
    rx_gso,
    /// GSO frames cut into segments before delivery to a guest that cannot take them whole.
    rx_gso_segmented,
    /// GSO frames cut into segments before they were written to the tap.
    tx_gso_segmented,
    /// Frames for the port that its receive filter (the modelled DPAA filter) dropped.
    rx_filtered,
    /// Tagged frames for the port whose VLAN its driver did not add (VIRTIO_NET_F_CTRL_VLAN),
    /// dropped.
    rx_vlan_filtered,
    /// Multicast frames for the port that its receive filter let through.
    rx_mcast_accepted,
    /// Multicast frames let through only because their hash bucket is shared with a group
    /// the guest joined (a hash filter's false positive, as on the hardware).
    rx_hash_false_positive,
    /// Frames whose checksums a checksum action rewrote (`--csum-action`).
    csum_updated,
    /// Frames a checksum action dropped because their headers lie about their lengths.
    csum_failed,
    /// Packets the router forwarded, counted on the queue they came in on.
    routed,
    /// Route lookups that the queue's own route cache answered.
    route_cache_hit,
    /// Route lookups that went to the route table (the queue's cache empty, or its
    /// generation old).
    route_cache_miss,
    /// Packets dropped while the next hop's address was being resolved (ARP, NDP).
    route_unresolved,
    /// Packets with no route, answered with ICMP (ICMPv6) destination unreachable.
    route_unreachable,
    /// Packets whose TTL (hop limit) ran out, answered with ICMP (ICMPv6) time exceeded.
    route_ttl_exceeded,
    /// Packets to the router with a bad IP header (checksum, lengths).
    route_errors,
    /// Times a TX worker watched its ring for the driver's next chains after a round, rather
    /// than sleeping until kicked (`--tx-poll-us`).
    tx_watches,
    /// Watches (tx_watches) that found the driver's next chains within the window.
    tx_watch_found,
    /// Transmit chains longer than the per-frame descriptor bound, returned unread.
    tx_desc_limit,
    /// Frames for this port whose receive chains ran past the per-frame descriptor bound.
    rx_desc_limit,
    /// GSO frames of more segments than the bound, dropped as they entered.
    tx_gso_refused,
    /// Frames from a source MAC `--port-mac-lock` refuses.
    tx_spoofed,
    /// Source addresses not learned because the port holds `--fdb-limit` of them.
    fdb_refused,
    /// Router neighbours not learned because the port holds `--neigh-limit` of them.
    neigh_refused,
);

/// Checksum actions the daemon holds at most: each has a slot of its own among every
/// tally's action counters (`pipeline::rules` assigns them).
pub const ACTION_SLOTS: usize = 256;

/// One checksum action's counts in one worker's tally: frames it matched, and of those the
/// ones that went on and the ones it dropped (its `verdict=drop`, or a sum it could not
/// write).
#[derive(Debug, Default)]
pub struct ActionStats {
    pub matched: Counter,
    pub passed: Counter,
    pub dropped: Counter,
}

/// A checksum action's counts, summed over the workers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ActionSnapshot {
    pub matched: u64,
    pub passed: u64,
    pub dropped: u64,
}

impl ActionStats {
    fn snapshot(&self) -> ActionSnapshot {
        ActionSnapshot {
            matched: self.matched.get(),
            passed: self.passed.get(),
            dropped: self.dropped.get(),
        }
    }
}

impl std::ops::AddAssign for ActionSnapshot {
    fn add_assign(&mut self, o: Self) {
        self.matched += o.matched;
        self.passed += o.passed;
        self.dropped += o.dropped;
    }
}

/// What checksum actions count on, for one port and queue: the queue's counters and the
/// worker's per-action ones.
#[derive(Debug, Clone, Copy)]
pub struct Counts<'a> {
    pub queue: &'a QueueStats,
    actions: &'a [ActionStats],
}

impl<'a> Counts<'a> {
    /// Counts into `queue` and, by slot, into `actions`.
    pub fn new(queue: &'a QueueStats, actions: &'a [ActionStats]) -> Self {
        Counts { queue, actions }
    }

    /// The counters of the action in `slot`; none for an action no rules published.
    #[inline]
    pub fn action(&self, slot: u16) -> Option<&'a ActionStats> {
        self.actions.get(usize::from(slot))
    }
}

/// What one worker thread counts, for every port and queue: written by that thread only.
#[derive(Debug)]
pub struct Tally {
    queues: usize,
    /// One block per port and queue, then `stray`'s.
    blocks: Vec<QueueStats>,
    /// One per action slot.
    actions: Box<[ActionStats]>,
}

impl Tally {
    fn new(ports: usize, queues: usize) -> Self {
        let queues = queues.max(1);
        Tally {
            queues,
            blocks: (0..ports.max(1) * queues + 1)
                .map(|_| QueueStats::default())
                .collect(),
            actions: (0..ACTION_SLOTS).map(|_| ActionStats::default()).collect(),
        }
    }

    /// Where counts for a port id past the last port go: summed into no port's totals.
    /// Port ids come from the switch's registry, never from a guest, so one here is a bug;
    /// debug builds (the tests) stop on it.
    fn stray(&self) -> &QueueStats {
        &self.blocks[self.blocks.len() - 1]
    }

    /// The block for `port`'s queue `queue` (queue taken modulo the queue count; a port
    /// past the last goes to `stray`).
    #[inline]
    pub fn at(&self, port: usize, queue: usize) -> &QueueStats {
        // A queue index is nearly always below the count: no division then (a `div` costs
        // tens of cycles, and this runs several times per frame).
        let queue = if queue < self.queues {
            queue
        } else {
            queue % self.queues
        };
        let i = port * self.queues + queue;
        match self.blocks.get(i) {
            Some(b) if i + 1 < self.blocks.len() => b,
            _ => {
                debug_assert!(false, "no port {port}: ids come from the switch's registry");
                self.stray()
            }
        }
    }

    /// What checksum actions count on for `port`'s queue `queue`.
    #[inline]
    pub fn counts(&self, port: usize, queue: usize) -> Counts<'_> {
        Counts::new(self.at(port, queue), &self.actions)
    }
}

/// Every live worker's tally, for summing on read, and what ended workers counted.
#[derive(Debug)]
pub struct Tallies {
    ports: usize,
    queues: usize,
    all: Mutex<Registry>,
}

#[derive(Debug)]
struct Registry {
    live: Vec<Arc<Tally>>,
    /// The final counts of workers that ended, per (port, queue) block.
    retired: Vec<QueueSnapshot>,
    /// The same per action slot, and each slot's sum when its action was added (what the
    /// slot's earlier action counted).
    retired_actions: Vec<ActionSnapshot>,
    action_base: Vec<ActionSnapshot>,
}

/// A worker's registered tally. Dropped when the worker ends (with its connection, for a
/// guest port's workers): its counts are then folded into the per-port totals, so totals
/// never go backwards and the list summed on read holds only live workers.
#[derive(Debug)]
pub struct TallyHandle {
    tally: Arc<Tally>,
    all: Arc<Tallies>,
}

impl TallyHandle {
    /// The tally itself, to read while the handle is borrowed elsewhere.
    pub fn share(&self) -> Arc<Tally> {
        self.tally.clone()
    }
}

impl std::ops::Deref for TallyHandle {
    type Target = Tally;

    fn deref(&self) -> &Tally {
        &self.tally
    }
}

impl Drop for TallyHandle {
    fn drop(&mut self) {
        let mut reg = self.all.lock();
        reg.live.retain(|t| !Arc::ptr_eq(t, &self.tally));
        for (sum, block) in reg.retired.iter_mut().zip(&self.tally.blocks) {
            *sum += block.snapshot();
        }
        for (sum, a) in reg.retired_actions.iter_mut().zip(self.tally.actions.iter()) {
            *sum += a.snapshot();
        }
    }
}

impl Tallies {
    pub fn new(ports: usize, queues: usize) -> Arc<Self> {
        let t = Tally::new(ports, queues);
        Arc::new(Tallies {
            ports: ports.max(1),
            queues: t.queues,
            all: Mutex::new(Registry {
                live: Vec::new(),
                retired: vec![QueueSnapshot::default(); t.blocks.len()],
                retired_actions: vec![ActionSnapshot::default(); ACTION_SLOTS],
                action_base: vec![ActionSnapshot::default(); ACTION_SLOTS],
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        crate::sync::lock(&self.all)
    }

    /// A tally for a new worker thread, counted until the handle is dropped and kept in the
    /// totals after.
    pub fn register(self: &Arc<Self>) -> TallyHandle {
        let t = Arc::new(Tally::new(self.ports, self.queues));
        self.lock().live.push(t.clone());
        TallyHandle {
            tally: t,
            all: self.clone(),
        }
    }

    /// The action in `slot`'s counts since it was added ([`Tallies::restart_action`]).
    pub fn action(&self, slot: u16) -> ActionSnapshot {
        let reg = self.lock();
        let now = Self::action_sum(&reg, slot);
        let base = reg
            .action_base
            .get(usize::from(slot))
            .copied()
            .unwrap_or_default();
        ActionSnapshot {
            matched: now.matched.saturating_sub(base.matched),
            passed: now.passed.saturating_sub(base.passed),
            dropped: now.dropped.saturating_sub(base.dropped),
        }
    }

    /// A new action takes `slot`: what the slot counted so far is its earlier action's.
    /// Workers still forwarding with the rules of a moment ago may count a last batch of
    /// the earlier action into the new one.
    pub fn restart_action(&self, slot: u16) {
        let mut reg = self.lock();
        let now = Self::action_sum(&reg, slot);
        if let Some(b) = reg.action_base.get_mut(usize::from(slot)) {
            *b = now;
        }
    }

    fn action_sum(reg: &Registry, slot: u16) -> ActionSnapshot {
        let i = usize::from(slot);
        let mut s = reg.retired_actions.get(i).copied().unwrap_or_default();
        for t in &reg.live {
            if let Some(a) = t.actions.get(i) {
                s += a.snapshot();
            }
        }
        s
    }

    /// Workers counting now.
    pub fn live(&self) -> usize {
        self.lock().live.len()
    }

    /// `port`'s counters per queue: ended workers' totals plus every live worker's.
    pub fn port(&self, port: usize) -> Vec<QueueSnapshot> {
        if port >= self.ports {
            return Vec::new();
        }
        let reg = self.lock();
        (0..self.queues)
            .map(|q| {
                let mut s = reg
                    .retired
                    .get(port * self.queues + q)
                    .copied()
                    .unwrap_or_default();
                for t in reg.live.iter() {
                    s += t.at(port, q).snapshot();
                }
                s
            })
            .collect()
    }
}

/// A counter that any thread may bump: for rare events, where a locked add costs nothing.
#[derive(Debug, Default)]
pub struct EventCounter(AtomicU64);

impl EventCounter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! event_counters {
    ($(#[$doc:meta])* $name:ident, $snap:ident { $($(#[doc = $fdoc:literal])+ $field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        pub struct $name {
            $($(#[doc = $fdoc])+ pub $field: EventCounter,)*
        }

        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
        pub struct $snap {
            $(pub $field: u64,)*
        }

        impl $snap {
            /// Each counter's name and what it counts (its doc comment), for `# HELP`.
            pub const HELP: &'static [(&'static str, &'static str)] =
                &[$((stringify!($field), concat!($($fdoc),+)),)*];
        }

        impl $name {
            pub fn snapshot(&self) -> $snap {
                $snap { $($field: self.$field.get(),)* }
            }
        }
    };
}

event_counters!(
    /// What a guest port's frontends (and, for the snooper's bounds, its guests) did to it,
    /// counted by whichever thread saw it.
    ConnStats, ConnSnapshot {
        /// Frontends accepted on the port's socket.
        connections,
        /// Queues found with impossible indexes and no longer served until the frontend
        /// restarts them or reconnects.
        rings_broken,
        /// Messages the relay refused (oversized, too many fds, memory regions longer than
        /// their files); each ends the connection or is answered with an error.
        frontend_refused,
        /// Guest memory that vanished under its mapping (a file truncated after
        /// SET_MEM_TABLE): the access read zeros and the connection was ended.
        memory_faults,
        /// `--snoop`: joins ignored because the guest held `--snoop-max-groups` groups.
        snoop_groups_refused,
        /// `--snoop`: groups whose INCLUDE source list outgrew the snooper's bound, kept as
        /// wanted whatever their sources.
        snoop_sources_capped,
        /// Bugs met on this port's input and contained (docs/architecture.md, "Panics"):
        /// the frame or command was dropped, a ring it was writing marked broken.
        panics,
    }
);

/// Counters of a port's control path (device attachment only).
#[derive(Debug, Default)]
pub struct CtrlStats {
    pub ctrl_commands: Counter,
    pub ctrl_errors: Counter,
    /// Nanoseconds from popping a command to returning it with its ack (parse, apply,
    /// filter sync): the daemon's share of the time a guest waits on its control queue.
    pub ctrl_busy_ns: Counter,
    /// Times the control thread was woken by a kick and found work: commands that arrived
    /// while it was not polling. Each one cost the guest a notification and a wake-up.
    pub ctrl_wakeups: Counter,
    /// Commands the driver posted before DRIVER_OK, answered VIRTIO_NET_ERR (also counted in
    /// `ctrl_errors`).
    pub ctrl_before_driver_ok: Counter,
    /// Used-buffer notifications sent on the control queue. A driver that spins for its ack
    /// turns them off (Linux does, so a run counts about one); one that sleeps
    /// until the device answers needs one per command, each carried by the frontend.
    pub ctrl_interrupts: Counter,
    /// Per command, from popping it to its used entry: how long the daemon kept the guest
    /// waiting for the answer.
    pub ctrl_answer: Histogram,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CtrlSnapshot {
    pub ctrl_commands: u64,
    pub ctrl_errors: u64,
    pub ctrl_busy_ns: u64,
    pub ctrl_wakeups: u64,
    pub ctrl_before_driver_ok: u64,
    pub ctrl_interrupts: u64,
}

impl CtrlSnapshot {
    /// Each counter's name and what it counts (as [`CtrlStats`] documents it), for `# HELP`.
    pub const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "ctrl_commands",
            "Control-queue commands the guest sent (device attachment).",
        ),
        ("ctrl_errors", "Control-queue commands answered VIRTIO_NET_ERR."),
        (
            "ctrl_busy_ns",
            "Time the control thread spent from popping each command to returning it with its ack (parse, apply, filter sync); in seconds as a metric, nanoseconds in ctl stats.",
        ),
        (
            "ctrl_wakeups",
            "Commands that found the control thread asleep (the guest kicked and waited).",
        ),
        (
            "ctrl_before_driver_ok",
            "Commands posted before DRIVER_OK, answered VIRTIO_NET_ERR.",
        ),
        (
            "ctrl_interrupts",
            "Used-buffer notifications sent on the control queue.",
        ),
    ];
}

impl CtrlStats {
    pub fn snapshot(&self) -> CtrlSnapshot {
        CtrlSnapshot {
            ctrl_commands: self.ctrl_commands.get(),
            ctrl_errors: self.ctrl_errors.get(),
            ctrl_busy_ns: self.ctrl_busy_ns.get(),
            ctrl_wakeups: self.ctrl_wakeups.get(),
            ctrl_before_driver_ok: self.ctrl_before_driver_ok.get(),
            ctrl_interrupts: self.ctrl_interrupts.get(),
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

    #[test]
    fn an_ended_worker_s_counts_stay_in_the_totals() {
        let all = Tallies::new(1, 2);
        let w1 = all.register();
        w1.at(0, 1).tx_packets.add(5);
        let w2 = all.register();
        w2.at(0, 1).tx_packets.add(2);
        assert_eq!((all.port(0)[1].tx_packets, all.live()), (7, 2));
        drop(w1);
        assert_eq!((all.port(0)[1].tx_packets, all.live()), (7, 1));
        // A thousand connections come and go: the list summed on read stays one long.
        for _ in 0..1000 {
            let w = all.register();
            w.at(0, 0).rx_packets.inc();
        }
        assert_eq!((all.port(0)[0].rx_packets, all.live()), (1000, 1));
    }

    #[test]
    fn tallies_sum_per_port_and_queue() {
        let all = Tallies::new(2, 2);
        let (w1, w2) = (all.register(), all.register());
        w1.at(1, 0).rx_packets.inc();
        w2.at(1, 0).rx_packets.add(2);
        w2.at(1, 3).rx_packets.inc(); // queue 3 of 2: queue 1
        w1.at(0, 0).tx_packets.inc();
        let p1 = all.port(1);
        assert_eq!((p1[0].rx_packets, p1[1].rx_packets, p1[0].tx_packets), (3, 1, 0));
        assert_eq!(all.port(0)[0].tx_packets, 1);
    }

    /// A port id past the last is a bug: debug builds stop on it; release builds count it
    /// where no port's totals see it.
    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "no port 9"))]
    fn an_unknown_port_is_counted_in_no_port() {
        let all = Tallies::new(2, 2);
        let w = all.register();
        w.at(9, 9).rx_dropped.inc();
        for p in 0..2 {
            assert!(all.port(p).iter().all(|q| q.rx_dropped == 0));
        }
        assert!(all.port(9).is_empty());
    }
}
