//! The transmit side of a guest port: one queue pair's worker pops the guest's TX chains a
//! batch at a time into its arena, checks each frame (header, source MAC, GSO size), and
//! forwards it through the switch into its outbox, which writes the frames into their
//! receivers when the arena is used up, the outbox is full, or the ring runs dry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::Guard;
use log::{debug, trace, warn};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use super::avail_watch::AvailWatch;
use super::budget::{Burst, Mode, POLL_WATCH_WINDOWS, TX_BUDGET, TX_POLL_FROM, TX_WALK_BUDGET};
use super::guest_port::GuestPort;
use super::split_ring::{wants_interrupt_after, ChainError, Mem, RingError, SplitRing, Vring};
use super::tx_chain::{return_tx_chains, BatchLimits, TxChain, TxTake};
use crate::device::features::Negotiated;
use crate::logging::error_chain;
use crate::pipeline::fdb::FdbCache;
use crate::pipeline::gso::{self, GsoError};
use crate::pipeline::outbox::OUTBOX_FRAMES;
use crate::pipeline::router::RouteCache;
use crate::pipeline::rules::Rules;
use crate::pipeline::switch::{Dest, Plain, Run};
use crate::pipeline::{BurstFrame, Ingress, Outbox, OutboxBuffers, Packet, Switch};
use crate::ports::arena::Arena;
use crate::stats::{QueueStats, Tally};
use crate::wire::virtio_net_hdr::GSO_NONE;
use crate::wire::VirtioNetHdr;

/// Largest frame (header included) a guest may transmit: a 64 KiB TSO frame (IP total
/// length 65535) behind Ethernet and two VLAN tags, with the 20-byte hash header.
const TX_BUF: usize = 20 + 14 + 8 + 65_535;

/// A worker's arena: room for an outbox's worth of full-size (1500-byte MTU) frames, and
/// the last chain's worst case after them. Batches fill it back to back; once an outbox's
/// worth of frames is in it, or less than one largest frame fits, the outbox is written
/// and the arena starts over, so the same lines are reused outbox after outbox.
const ARENA: usize = TX_BUF + OUTBOX_FRAMES * 1536;

/// Bytes of a frame (after its virtio-net header) the burst path copies out of the guest's
/// buffer before it decides anything: every header a decision may look at (Ethernet, a VLAN
/// tag, IPv6, a TCP header with options) lies within them. A longer frame's other bytes
/// are copied once, from the guest's buffer straight into its receiver's
/// (docs/architecture.md, "One copy").
const HEAD: usize = 128;

/// What one queue pair's worker owns for transmitting, reused burst after burst.
#[derive(Default)]
pub(super) struct TxWorker {
    arena: Vec<u8>,
    routes: RouteCache,
    fdb: FdbCache,
    originated: Vec<u8>,
    outbox: OutboxBuffers,
}

/// What a TX burst needs from the connection it serves.
pub(super) struct TxQueue<'s> {
    pub(super) port: &'s GuestPort,
    pub(super) switch: &'s Switch,
    pub(super) mem: &'s Mem,
    pub(super) feat: Negotiated,
    pub(super) pair: usize,
    /// The worker's own counters.
    pub(super) tally: &'s Tally,
}

impl<'s> TxQueue<'s> {
    /// This queue as the switch sees where a frame comes from, with the worker's caches.
    fn ingress<'w>(
        &self,
        routes: &'w mut RouteCache,
        fdb: &'w mut FdbCache,
        originated: &'w mut Vec<u8>,
    ) -> Ingress<'w>
    where
        's: 'w,
    {
        Ingress {
            port: self.port.id,
            queue: self.pair,
            tally: self.tally,
            routes,
            fdb,
            originated,
        }
    }
}

/// Chains and descriptors a burst has served, against its budget.
#[derive(Default)]
struct Spent {
    chains: usize,
    walked: usize,
}

impl Spent {
    fn exhausted(&self) -> bool {
        self.chains >= TX_BUDGET || self.walked >= TX_WALK_BUDGET
    }

    /// What the next batch may take, `popped` chains into the current outbox.
    fn next_batch(&self, popped: usize, mode: Mode) -> BatchLimits {
        BatchLimits {
            frame_max: TX_BUF,
            chains: (TX_BUDGET - self.chains).min(OUTBOX_FRAMES - popped),
            walk: TX_WALK_BUDGET - self.walked,
            // A polled queue's driver need not kick: checked once per batch, in case the
            // ring was started anew, and written only if it changes.
            quiet: mode == Mode::Polled,
            one_desc: true,
        }
    }
}

impl TxWorker {
    /// Serves TX queue `tx.pair`: up to [`TX_BUDGET`] chains, the ring watched for
    /// `--tx-poll-us` after a round that served a burst. Kicked, with the driver's
    /// notifications off meanwhile; polled, with them left off.
    pub(super) fn burst(&mut self, tx: &TxQueue<'_>, vring: &Vring, mode: Mode) -> Result<Burst, RingError> {
        if self.arena.len() < ARENA {
            self.arena.resize(ARENA, 0);
        }
        let mem = tx.mem.memory();
        let mut spent = Spent::default();
        // Whether the ring is being watched (`--tx-poll-us`): from a round of a driver's
        // burst on, for as long as each watch finds more.
        let mut watching = false;
        // When this wake-up first watched, and the round that starts a watch.
        let mut first_watch = None;
        let mut from = WatchFrom::default();
        // Chains served when the driver was last signalled.
        let mut signalled = 0;
        let burst = 'wake: loop {
            if mode == Mode::Kicked {
                vring.disable_notification().map_err(RingError)?;
            }
            let before = spent.chains;
            loop {
                if spent.exhausted() {
                    // Notifications stay off: the worker comes back by itself.
                    break 'wake Burst::More;
                }
                if self.fill_arena(tx, vring, &mem, &mut spent, mode)? == 0 {
                    break;
                }
            }
            if spent.chains == 0 && mode == Mode::Polled {
                break Burst::Empty;
            }
            // `--tx-poll-us`: after a round that served a driver's burst, its next ones are
            // waited for a while, with notifications still off, rather than kicked for. A
            // poll thread likewise stays with the ring, for fewer visits that serve more
            // each (docs/performance.md). A round that served nothing ends the watch, so
            // each one costs budget.
            let round = spent.chains - before;
            watching = round > 0 && !tx.port.tx_poll.is_zero() && (watching || round >= from.get(vring));
            if let Some(watch) = watching.then(|| AvailWatch::new(vring)).flatten() {
                // Watching is earned by chains served, a window per burst's worth, from the
                // wake-up's first watch on: a driver that adds a chain now and then, never
                // kicking, soon runs out, and cannot keep a poll thread from its other
                // queues (nor an event-driven worker from sleeping) much past one window.
                // A poll visit watches a few windows at most, whatever it earned.
                let now = Instant::now();
                let mut earned = watch_earned(tx.port.tx_poll, spent.chains, from.get(vring));
                if mode == Mode::Polled {
                    earned = earned.min(tx.port.tx_poll.saturating_mul(POLL_WATCH_WINDOWS));
                }
                let until = first_watch.get_or_insert(now).checked_add(earned);
                if let Some(until) = until.filter(|&until| now < until) {
                    // A driver that waits for its chains back (its ring full) gets them now,
                    // not after the watch: asked without a fence, which the check before
                    // sleeping makes over every chain since.
                    if watch.driver_wants_interrupt(&mem, unsignalled(spent.chains - signalled)) {
                        tx.port.health.signal(vring, 2 * tx.pair + 1);
                        signalled = spent.chains;
                    }
                    let stats = tx.tally.at(tx.port.id, tx.pair);
                    stats.tx_watches.inc();
                    if watch.wait(&mem, until) {
                        stats.tx_watch_found.inc();
                        continue;
                    }
                }
            }
            if mode == Mode::Polled || !vring.enable_notification().map_err(RingError)? {
                break Burst::Done;
            }
        };
        if spent.chains > signalled && self::wants_interrupt(vring, &mem, spent.chains - signalled)? {
            tx.port.health.signal(vring, 2 * tx.pair + 1);
        }
        Ok(burst)
    }

    /// Takes batches back to back into the arena and forwards their frames into one
    /// outbox, until an outbox's worth of frames is in, the arena has no room for another
    /// largest frame, the ring is empty or the budget spent. The outbox is written before
    /// this returns, so the arena is free again. Returns the chains taken.
    ///
    /// The ring's lock is held from the first chain taken until all are returned, with one
    /// store of the used index, once the run and the outbox are written: a frame on the
    /// burst path keeps its bytes after [`HEAD`] in the guest's buffer until its receiver
    /// copies them straight from there ([`Run::write`]), and the frontend cannot take the
    /// ring back meanwhile. A broken ring ends the loop, not the delivery of what was
    /// taken before.
    fn fill_arena(
        &mut self,
        tx: &TxQueue<'_>,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        spent: &mut Spent,
        mode: Mode,
    ) -> Result<usize, RingError> {
        let TxWorker {
            arena,
            routes,
            fdb,
            originated,
            outbox,
        } = self;
        let hdr_len = tx.feat.hdr_len();
        let mut arena = Arena::new(arena);
        let mut out = tx.switch.outbox(tx.tally, outbox);
        let mut from = tx.ingress(routes, fdb, originated);
        let stats = tx.tally.at(tx.port.id, tx.pair);
        // A snooping port's frames take the general path, which looks for reports.
        let burst = !tx.port.rx.snooping && tx.switch.burst_path();
        let copy_limit = if burst { hdr_len + HEAD } else { usize::MAX };
        let mut state = vring.get_mut();
        let q = state.get_queue_mut();
        // The rings stay where they are while the lock is held.
        let Some(ring) = SplitRing::new(q, mem) else {
            return Ok(0);
        };
        // A run lasts as long as the outbox, across batches, while the rules stay the same.
        let mut run = Run::default();
        let mut last_rules: Option<Guard<Arc<Rules>>> = None;
        let (mut popped, mut ended) = (0, Ok(()));
        while !spent.exhausted() && popped < OUTBOX_FRAMES && arena.len() >= TX_BUF {
            let limits = spent.next_batch(popped, mode);
            let mut take = match TxTake::start(q, &ring, hdr_len, copy_limit, limits) {
                Ok(take) if !take.is_empty() => take,
                end => {
                    ended = end.map(drop);
                    break;
                }
            };
            // One snapshot of the switch's rules per batch (`Switch::forward`).
            let rules = tx.switch.rules().load();
            if let Some(before) = last_rules.take().filter(|r| !Arc::ptr_eq(r, &rules)) {
                run.write(tx.switch, &before, &from, &mut out);
            }
            let plain = burst && !rules.capturing(); // a capture's hooks: general path only
            let mut sent = (0, 0); // the burst path's (frames, bytes)
            while let Some(chain) = take.next(arena.room()) {
                popped += 1;
                spent.chains += 1;
                spent.walked += chain.walked;
                let Some((hdr, frame)) = take_chain(tx, stats, &ring, &mut arena, chain, hdr_len) else {
                    continue;
                };
                let frame = if plain {
                    match plain_frame(tx, &rules, &mut from, &mut sent, hdr, frame) {
                        Ok(Some((to, frame))) => {
                            run.push(tx.switch, &rules, &from, to, frame, &mut out);
                            continue;
                        }
                        Ok(None) => continue,
                        Err(frame) => frame,
                    }
                } else {
                    frame
                };
                // What came before goes first.
                run.write(tx.switch, &rules, &from, &mut out);
                forward(tx, stats, &rules, &mut from, hdr, frame.into_bytes(), &mut out);
            }
            count_sent(stats, sent);
            last_rules = Some(rules);
            ended = take.finish(q);
            if ended.is_err() {
                break;
            }
        }
        if let Some(rules) = last_rules {
            run.write(tx.switch, &rules, &from, &mut out);
        }
        out.flush();
        let returned = return_tx_chains(q, &ring);
        ended.and(returned).map(|()| popped)
    }
}

/// A chain [`TxTake::next`] copied to the start of the arena's room: its virtio-net header
/// and its frame, split off the arena. `None` for a chain refused (counted, and warned of
/// at a bounded rate) or one that no longer fits.
fn take_chain<'a>(
    tx: &TxQueue<'_>,
    stats: &QueueStats,
    ring: &SplitRing<'a, GuestMemoryMmap>,
    arena: &mut Arena<'a>,
    taken: TxChain,
    hdr_len: usize,
) -> Option<(&'a [u8], BurstFrame<'a>)> {
    let n = match taken.result {
        Ok(n) => n,
        Err(e) => {
            chain_refused(tx, stats, taken.head, &e);
            return None;
        }
    };
    let Some(chain) = arena.take(n) else {
        stats.tx_errors.inc();
        return None;
    };
    let (hdr, frame) = chain.split_at_mut(hdr_len.min(n));
    let frame = match taken.rest {
        None => Some(BurstFrame::new(frame)),
        // `TxTake` found the whole chain in one region through the ring's buffers: this
        // finds the same, in the region they looked at last.
        Some(r) => ring
            .buffers()
            .slice(r.at, n.saturating_sub(r.copied as usize))
            .and_then(|rest| BurstFrame::with_rest(frame, rest)),
    };
    let Some(frame) = frame else {
        stats.tx_errors.inc();
        return None;
    };
    Some((hdr, frame))
}

/// Adds the burst path's `(frames, bytes)` of one batch to the worker's queue.
fn count_sent(stats: &QueueStats, (frames, bytes): (u64, u64)) {
    stats.tx_packets.add(frames);
    stats.tx_bytes.add(bytes);
}

/// The general path: [`admit`], then [`Switch::forward`] into `out`, a bug met on the way
/// costing this frame only.
fn forward<'a>(
    tx: &TxQueue<'_>,
    stats: &QueueStats,
    rules: &Rules,
    from: &mut Ingress<'_>,
    hdr: &[u8],
    frame: &'a mut [u8],
    out: &mut Outbox<'a>,
) {
    let Some(hdr) = admit(tx, stats, hdr, frame) else {
        return;
    };
    let forwarded = tx.port.health.catch_bug("a transmitted frame", || {
        tx.port.snoop_frame(frame);
        tx.switch.forward(rules, from, Packet::new(hdr, frame), out);
    });
    if forwarded.is_none() {
        stats.tx_errors.inc();
    }
}

/// The burst path's admission ([`Switch::plain_destination`]): a frame whose header asks
/// for nothing ([`VirtioNetHdr::asks_nothing`]), from a source `--port-mac-lock` allows, to
/// one learned port. Counted as [`admit`] counts it, in `sent` (frames, bytes) for the
/// caller to add to the worker's queue once per batch.
/// `Ok(None)`: an ingress action dropped the frame. `Err`: the frame, for the general path,
/// nothing done or counted.
#[inline]
fn plain_frame<'a>(
    tx: &TxQueue<'_>,
    rules: &Rules,
    from: &mut Ingress<'_>,
    sent: &mut (u64, u64),
    hdr: &[u8],
    mut frame: BurstFrame<'a>,
) -> Result<Option<(Dest, BurstFrame<'a>)>, BurstFrame<'a>> {
    if !VirtioNetHdr::asks_nothing(hdr) || !tx.port.source_lock.allows(frame.head()) {
        return Err(frame);
    }
    let found = tx.port.health.catch_bug("a transmitted frame", || {
        tx.switch.plain_destination(rules, from, &mut frame)
    });
    let Some(plain) = found.flatten() else {
        return Err(frame);
    };
    // Counted as `admit` counts, without its trace line: the receiver's has the run.
    sent.0 += 1;
    sent.1 += frame.len() as u64;
    Ok(match plain {
        Plain::To(to) => Some((to, frame)),
        Plain::Dropped => None,
    })
}

/// Counts a frame the guest sent and checks it before it goes anywhere: its header, its
/// source MAC (`--port-mac-lock`), its GSO segment count. `None`: dropped, and counted.
#[inline]
fn admit(tx: &TxQueue<'_>, stats: &QueueStats, hdr: &[u8], frame: &[u8]) -> Option<VirtioNetHdr> {
    let port = tx.port;
    stats.tx_packets.inc();
    stats.tx_bytes.add(frame.len() as u64);
    let hdr = match VirtioNetHdr::parse(hdr, tx.feat.hdr_len()) {
        Ok(h) => h,
        Err(e) => {
            stats.tx_errors.inc();
            debug!("port {}: {e}", port.id);
            return None;
        }
    };
    trace!("port {}: tx {} bytes on pair {}", port.id, frame.len(), tx.pair);
    if !port.source_lock.allows(frame) {
        stats.tx_dropped.inc();
        stats.tx_spoofed.inc();
        if port.health.may_warn() {
            warn!(
                "port {}: tx queue {}: dropping a frame from a source MAC other than the \
                 port's (--port-mac-lock)",
                port.id, tx.pair
            );
        }
        return None;
    }
    if hdr.gso_type != GSO_NONE {
        stats.tx_gso.inc();
        // Refused here, once, rather than at each receiver that would have to cut it.
        // Other GSO errors are for a receiver that cuts to find: one that takes GSO whole
        // may accept them.
        if let Err(e @ (GsoError::TooManySegments { .. } | GsoError::ZeroSize)) =
            gso::segment_count(&hdr, frame)
        {
            stats.tx_dropped.inc();
            stats.tx_gso_refused.inc();
            if port.health.may_warn() {
                warn!("port {}: tx queue {}: dropping GSO frame: {e}", port.id, tx.pair);
            }
            return None;
        }
    }
    Some(hdr)
}

/// A TX chain the ring walk refused (returned empty): counted, logged.
fn chain_refused(tx: &TxQueue<'_>, stats: &QueueStats, head: u16, e: &ChainError) {
    stats.tx_errors.inc();
    if matches!(e, ChainError::TooManyDescriptors) {
        stats.tx_desc_limit.inc();
    }
    if tx.port.health.may_warn() {
        warn!(
            "port {}: tx queue {}: dropping chain {head}: {}",
            tx.port.id,
            tx.pair,
            error_chain(e)
        );
    }
}

/// The chains a round must serve for the worker to watch the ring after it: a burst
/// ([`TX_POLL_FROM`]), or half a ring too small to hold one. Asked of the ring (under its
/// lock) once per wake-up, and only after a round with frames, not on every visit of a
/// poll thread that finds the ring empty.
#[derive(Default)]
struct WatchFrom(Option<usize>);

impl WatchFrom {
    fn get(&mut self, vring: &Vring) -> usize {
        *self.0.get_or_insert_with(|| {
            let size = usize::from(vring.get_ref().get_queue().size());
            TX_POLL_FROM.min(size / 2).max(1)
        })
    }
}

/// How long after its first watch a wake-up that has served `chains` may watch its ring:
/// `window` for each `from` chains (a burst's worth), so watching costs chains as well as
/// time.
fn watch_earned(window: Duration, chains: usize, from: usize) -> Duration {
    let per = u32::try_from(from).unwrap_or(u32::MAX).max(1);
    window.saturating_mul(u32::try_from(chains).unwrap_or(u32::MAX)) / per
}

/// Whether the driver wants an interrupt for the `returned` TX chains given back since its
/// last one: only this queue's worker returns them, so the count is exact.
fn wants_interrupt(vring: &Vring, mem: &GuestMemoryMmap, returned: usize) -> Result<bool, RingError> {
    let st = vring.get_ref();
    wants_interrupt_after(st.get_queue(), mem, unsignalled(returned))
}

/// Chains returned since the last interrupt, as the used ring counts them: a wake-up
/// returns at most a budget's worth ([`TX_BUDGET`]), so this never saturates.
fn unsignalled(returned: usize) -> u16 {
    u16::try_from(returned).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watching_is_earned_a_window_per_burst() {
        let w = Duration::from_micros(50);
        assert_eq!(watch_earned(w, 32, 32), w);
        assert_eq!(watch_earned(w, 33, 32), Duration::from_nanos(51_562));
        // A wake-up's budget of chains buys 32 windows at most.
        assert_eq!(watch_earned(w, TX_BUDGET, 32), 32 * w);
        // Half a ring of 16 is a burst there; nothing divides by zero.
        assert_eq!(watch_earned(w, 8, 8), w);
        assert_eq!(watch_earned(w, 8, 0), 8 * w);
        assert_eq!(watch_earned(Duration::MAX, usize::MAX, 1), Duration::MAX);
    }
}
