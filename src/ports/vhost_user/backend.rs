//! The `VhostUserBackend` of one connection: queue-to-thread layout, feature negotiation,
//! config space, and the per-queue TX and control work.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arrayvec::ArrayVec;
use log::{debug, trace, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use self::ctrl_queue::CtrlGate;
use super::super::poll::{PollQueue, Polled};
use super::evict::NextLines;
use super::placement::{CpuSet, CtrlCpu};
use super::proxy::{ProxyError, RelayWatch};
use super::queue::{
    pop_tx_batch, publish_used, wants_interrupt, wants_interrupt_after, ArenaSlots, BrokenRings, ChainError,
    RingError, TxSlot, TX_BATCH,
};
use super::rx::queue_usable;
use super::sigbus::MemOwner;
use super::{error_chain, GuestPort, Mem, Vring};
use crate::device::config;
use crate::device::features::{self, Negotiated};
use crate::pipeline::gso::{self, GsoError};
use crate::pipeline::router::RouteCache;
use crate::pipeline::switch::FLUSH_BATCH;
use crate::pipeline::{Buffers, Ingress, Packet, Switch};
use crate::stats::{QueueStats, Tally, TallyHandle};
use crate::wire::virtio_net_hdr::GSO_NONE;
use crate::wire::VirtioNetHdr;

/// Largest frame (header included) a guest may transmit: a 64 KiB TSO frame (IP total
/// length 65535) behind Ethernet and two VLAN tags, with the 20-byte hash header.
const TX_BUF: usize = 20 + 14 + 8 + 65_535;
/// Half of a worker's TX buffer, which a batch of TX chains is copied into, back to back:
/// room for a batch of 32 full-size (1500-byte MTU) frames before the last chain's worst
/// case. Batches fill the two halves in turn (`Pins`).
const TX_ARENA: usize = TX_BUF + 64 * 1024;
const QUEUE_SIZE: usize = 1024;
/// TX chains a worker serves per wake-up before it goes back to its event loop (and so
/// notices a disconnect) and comes round again: Linux vhost-net's VHOST_NET_PKT_WEIGHT.
const TX_BUDGET: usize = 256;
/// Descriptors a worker walks per wake-up, likewise: a Linux guest's chains hold at most
/// MAX_SKB_FRAGS + 2 (19 by default) descriptors, so 256 such chains fit; chains of up to
/// MAX_FRAME_DESCS zero-length descriptors do not buy a guest more than this per wake.
const TX_WALK_BUDGET: usize = 8192;
mod ctrl_queue;

struct Session {
    port: Arc<GuestPort>,
    /// The switch frames go to, held for as long as the connection lasts.
    switch: Arc<Switch>,
    mem: Mem,
    /// One eventfd per worker thread, fired once at start so each thread reports its vrings.
    attach: Vec<EventFd>,
    /// One eventfd per worker thread, fired when it stopped at its budget with work left.
    again: Vec<EventFd>,
    /// Every vring by queue index, as the worker threads reported them.
    captured: Mutex<Vec<Option<Vring>>>,
    /// Poll mode: each pair's TX vring, for the poll thread that serves it without a lock.
    tx_vrings: Vec<OnceLock<Vring>>,
    /// The control queue's gate (ctrl_queue.rs).
    ctrl_gate: CtrlGate,
    /// What each worker thread owns, by thread index: only that thread locks its own.
    workers: Vec<Mutex<Worker>>,
    /// Queues the driver broke; also in the published RX path.
    broken: Arc<BrokenRings>,
    /// The reading ends of the worker threads' exit events. vhost-user-backend 0.24 takes
    /// each with `into_raw_fd` and never closes it (event_loop.rs, `VringEpollHandler::new`),
    /// so the session closes them when it ends, after every worker has been joined.
    exit_fds: Mutex<Vec<RawFd>>,
    /// The frontend's socket, shut down to end the connection from here.
    frontend: UnixStream,
}

impl Drop for Session {
    fn drop(&mut self) {
        let fds = std::mem::take(self.exit_fds.get_mut().unwrap_or_else(|p| p.into_inner()));
        for fd in fds {
            // SAFETY: the number came from an eventfd this session made in `exit_event`,
            // whose only other holder, a worker's epoll set, is gone: the session outlives
            // every worker (each holds a clone of the backend) and the handler joins them
            // before it drops. Nothing else knows the number, so this is its only owner.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

/// What one worker thread owns: the buffer its chains are read into, its route cache, the
/// pipeline's buffers, its counters. Only that thread locks it, so the lock is never
/// contended.
struct Worker {
    /// TX chains are copied into it, a batch at a time (`TX_ARENA`).
    buf: Vec<u8>,
    /// The chains of the batch in `buf`.
    batch: ArrayVec<TxSlot, TX_BATCH>,
    routes: RouteCache,
    bufs: Buffers,
    /// This thread's counters (registered with the switch, summed on read, folded into the
    /// port's totals when the connection ends).
    tally: TallyHandle,
    /// Control thread only: where the next command is likely to be read from.
    next_ctrl: NextLines,
    /// Control thread only: its CPU and priority around its sleeps (placement.rs).
    ctrl_cpu: CtrlCpu,
    /// Control thread only: it went to sleep (notifications on) after its last burst, so a
    /// kick that finds work is a wake-up. A kick that reached it while it was back from its
    /// budget (notifications still off, a kick the driver sent before they went off) is not.
    ctrl_asleep: bool,
}

/// The switch a TX burst forwards through, and which halves of its worker's buffer hold
/// frames it pinned (`Packet::pinned`) and has not flushed since. Flushed before a half is
/// filled again, every FLUSH_BATCH frames, and when dropped: whatever ends the burst (its
/// end, an error from the ring, a panic), no guest port's stage points into the buffer once
/// the worker's lock is let go.
struct Pins<'a> {
    switch: &'a Switch,
    tally: &'a Tally,
    held: [bool; 2],
}

impl Pins<'_> {
    fn flush(&mut self) {
        self.switch.flush(self.tally);
        self.held = [false; 2];
    }

    /// Half `half` of the buffer is about to be filled.
    fn fill(&mut self, half: usize) {
        if self.held[half] {
            self.flush();
        }
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        if self.held != [false; 2] {
            self.flush();
        }
    }
}

/// Whether a worker found its ring empty, finished what it held, or stopped at its budget.
#[derive(Debug, PartialEq, Eq)]
enum Burst {
    Empty,
    Done,
    More,
}

/// How a TX queue is served: woken by kicks (the default), or looked at again and again by a
/// poll thread, with the driver's notifications left off (poll.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Kicked,
    Polled,
}

#[derive(Clone)]
pub(super) struct VnicBackend(Arc<Session>);

/// What a queue index means for the negotiated features.
enum Role {
    Rx,
    Tx(usize),
    Ctrl,
}

impl VnicBackend {
    /// `frontend_pid`: the process at the other end of the socket, whose threads the control
    /// thread keeps off (`None` when unknown).
    pub fn new(
        port: Arc<GuestPort>,
        mem: GuestMemoryAtomic<vm_memory::GuestMemoryMmap>,
        frontend_pid: Option<u32>,
        frontend: UnixStream,
    ) -> io::Result<Self> {
        let switch = port
            .switch()
            .ok_or_else(|| io::Error::other("the daemon is stopping"))?;
        let threads = usize::from(port.queue_pairs) + 1;
        let tuning = port.ctrl_tuning;
        // Without --ctrl-placement there is no CPU set to move within: the thread stays
        // wherever the scheduler and the orchestrator's affinity put it.
        let allowed = if tuning.placement {
            CpuSet::of_current_thread()
                .inspect_err(|e| {
                    warn!(
                        "port {}: the control thread will not leave the guest's CPU: {}",
                        port.id,
                        error_chain(e)
                    )
                })
                .ok()
        } else {
            None
        };
        let events = || {
            (0..threads)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<io::Result<Vec<_>>>()
        };
        let (attach, again) = (events()?, events()?);
        let workers = (0..threads)
            .map(|_| {
                Mutex::new(Worker {
                    buf: Vec::new(),
                    batch: ArrayVec::new(),
                    routes: RouteCache::default(),
                    bufs: Buffers::default(),
                    tally: switch.tallies().register(),
                    next_ctrl: NextLines::default(),
                    ctrl_cpu: CtrlCpu::new(allowed, frontend_pid, tuning.wake_priority),
                    ctrl_asleep: true,
                })
            })
            .collect();
        let queues = 2 * usize::from(port.queue_pairs) + 1;
        let tx_vrings = (0..port.queue_pairs).map(|_| OnceLock::new()).collect();
        Ok(VnicBackend(Arc::new(Session {
            tx_vrings,
            port,
            switch,
            mem,
            attach,
            again,
            captured: Mutex::new(vec![None; queues]),
            ctrl_gate: CtrlGate::default(),
            workers,
            broken: Arc::default(),
            exit_fds: Mutex::new(Vec::new()),
            frontend,
        })))
    }

    /// The session's guest memory, for the SIGBUS monitor (sigbus.rs).
    pub fn mem_owner(&self) -> Weak<dyn MemOwner> {
        let w: Weak<Session> = Arc::downgrade(&self.0);
        w
    }

    pub fn again_event(&self, thread: usize) -> RawFd {
        self.0.again[thread].as_raw_fd()
    }

    pub fn again_event_id(&self) -> u64 {
        self.attach_event_id() + 1
    }

    /// Comes back to `thread`'s rings once its event loop has looked at its other events.
    fn come_again(&self, thread: usize) -> io::Result<()> {
        self.0.again[thread].write(1)
    }

    pub fn attach_event(&self, thread: usize) -> RawFd {
        self.0.attach[thread].as_raw_fd()
    }

    /// Listener ids above num_queues are ours (vhost-user-backend reserves 0..=num_queues).
    pub fn attach_event_id(&self) -> u64 {
        self.num_queues() as u64 + 1
    }

    pub fn trigger_attach(&self, thread: usize) -> io::Result<()> {
        self.0.attach[thread].write(1)
    }

    fn pairs(&self) -> usize {
        usize::from(self.0.port.queue_pairs)
    }

    /// The port holds the features: one frontend at a time is served per port.
    fn negotiated(&self) -> Negotiated {
        self.0.port.negotiated()
    }

    fn role(&self, global: usize) -> Role {
        let feat = self.negotiated();
        if feat.ctrl_vq() && global == feat.ctrl_queue_index(self.0.port.queue_pairs) {
            Role::Ctrl
        } else if global % 2 == 0 {
            Role::Rx
        } else {
            Role::Tx(global / 2)
        }
    }

    /// Queue index of the `local`th vring of worker `thread` (the layout `queues_per_thread`
    /// gives: a pair per thread, then the control queue alone).
    fn global(&self, thread: usize, local: usize) -> usize {
        if thread < self.pairs() {
            2 * thread + local
        } else {
            2 * self.pairs()
        }
    }

    /// The inverse of `global`: the worker serving queue `global`, and its place there.
    fn owner(&self, global: usize) -> (usize, usize) {
        if global < 2 * self.pairs() {
            (global / 2, global % 2)
        } else {
            (self.pairs(), 0)
        }
    }

    /// Records a thread's vrings (once); publishes the RX path once every pair has reported.
    fn capture(&self, thread: usize, vrings: &[Vring]) {
        let mut cap = crate::sync::lock(&self.0.captured);
        let first = self.global(thread, 0);
        if cap.get(first).is_none_or(Option::is_some) {
            return;
        }
        for (slot, v) in cap.iter_mut().skip(first).zip(vrings) {
            *slot = Some(v.clone());
        }
        if let (Some(group), Some(tx), true) = (&self.0.port.poll, vrings.get(1), thread < self.pairs()) {
            if self.0.tx_vrings[thread].set(tx.clone()).is_ok() {
                let me: Weak<dyn PollQueue> = Arc::downgrade(&self.0) as Weak<dyn PollQueue>;
                let t = group.add(me, thread);
                debug!(
                    "port {}: tx queue {thread} served by poll thread {t}",
                    self.0.port.id
                );
            }
        }
        let rx: Option<Vec<Vring>> = cap.iter().step_by(2).take(self.pairs()).cloned().collect();
        if let (true, Some(all)) = (thread < self.pairs(), rx) {
            self.0
                .port
                .publish(all, self.0.mem.clone(), self.0.broken.clone());
            debug!(
                "port {}: rx path ready ({} queue pairs)",
                self.0.port.id,
                self.pairs()
            );
        }
    }

    /// Serves TX queue `pair`: up to [`TX_BUDGET`] chains, then again later if more wait.
    /// A queue the driver broke is marked and left alone.
    fn process_tx(&self, pair: usize, vring: &Vring, thread: usize) -> io::Result<()> {
        let index = 2 * pair + 1;
        if self.0.broken.is(index) {
            return Ok(());
        }
        if self.0.port.poll.is_some() {
            // A poll thread serves it; a kick the driver sent before it saw NO_NOTIFY is
            // already read.
            return Ok(());
        }
        let burst = self.tx_burst(pair, vring, thread, Mode::Kicked);
        self.after_burst(thread, index, burst)
    }

    /// Poll mode: serves TX queue `pair` once, from a poll thread.
    fn poll_tx(&self, pair: usize) -> Polled {
        let Some(vring) = self.0.tx_vrings.get(pair).and_then(OnceLock::get) else {
            return Polled::Idle;
        };
        let index = 2 * pair + 1;
        if self.0.broken.is(index) || !queue_usable(vring) {
            return Polled::Idle;
        }
        match self.tx_burst(pair, vring, pair, Mode::Polled) {
            Ok(Burst::Empty) => Polled::Idle,
            Ok(Burst::Done | Burst::More) => Polled::Busy,
            Err(e) => {
                self.0.port.ring_broken(&self.0.broken, index, &e);
                Polled::Idle
            }
        }
    }

    /// What follows a burst on queue `index` of worker `thread`: nothing, a later round
    /// (the budget ran out), or the queue marked broken.
    fn after_burst(&self, thread: usize, index: usize, burst: Result<Burst, RingError>) -> io::Result<()> {
        match burst {
            Ok(Burst::Done | Burst::Empty) => Ok(()),
            Ok(Burst::More) => self.come_again(thread),
            Err(e) => {
                self.0.port.ring_broken(&self.0.broken, index, &e);
                Ok(())
            }
        }
    }

    fn tx_burst(&self, pair: usize, vring: &Vring, thread: usize, mode: Mode) -> Result<Burst, RingError> {
        let port = &self.0.port;
        let feat = self.negotiated();
        let hdr_len = feat.hdr_len();
        let mem = self.0.mem.memory();
        let mut worker = crate::sync::lock(&self.0.workers[thread]);
        let Worker {
            buf,
            batch,
            routes,
            bufs,
            tally,
            ..
        } = &mut *worker;
        let stats = tally.at(port.id, pair);
        if buf.len() < 2 * TX_ARENA {
            buf.resize(2 * TX_ARENA, 0);
        }
        // Batches fill the two halves in turn, so the frames of one stay pinned while the
        // next is popped, and the switch is flushed every FLUSH_BATCH frames as before
        // rather than after each batch: a flush per batch cost 5 % at 64 B
        // (docs/benchmarks.md, "Frames written from where they were read").
        let (lo, hi) = buf.split_at_mut(TX_ARENA);
        let halves = [lo, &mut hi[..TX_ARENA]];
        let mut half = 0;
        let mut pins = Pins {
            switch: &self.0.switch,
            tally,
            held: [false; 2],
        };
        // Interrupt the driver only for chains actually returned.
        let mut returned = 0usize;
        let mut walked = 0usize;
        let burst = 'wake: loop {
            if mode == Mode::Kicked {
                vring.disable_notification().map_err(RingError)?;
            }
            loop {
                if returned == TX_BUDGET || walked >= TX_WALK_BUDGET {
                    // Notifications stay off: this thread comes back by itself.
                    break 'wake Burst::More;
                }
                // Pop and return a batch of chains in one short critical section (one look
                // at the avail index for all): the vring lock is not held while the frames
                // go to other ports.
                pins.fill(half);
                {
                    let mut st = vring.get_mut();
                    pop_tx_batch(
                        st.get_queue_mut(),
                        &*mem,
                        hdr_len,
                        halves[half],
                        TX_BUF,
                        TX_BUDGET - returned,
                        TX_WALK_BUDGET - walked,
                        batch,
                    )?;
                }
                if batch.is_empty() {
                    break;
                }
                // One snapshot of the switch's rules per batch (`Switch::forward_by`).
                let rules = self.0.switch.rules().load();
                // Each frame's bytes are split off this one borrow of the half, so none is
                // borrowed again while the frame is pinned (`Packet::pinned`): a guest port
                // writes it into its ring from here rather than copying it into its stage.
                let mut arena = ArenaSlots::new(&mut *halves[half]);
                for TxSlot { start, chain: t } in batch.drain(..) {
                    returned += 1;
                    walked += t.walked;
                    if returned % FLUSH_BATCH == 0 {
                        pins.flush();
                    }
                    let n = match t.result {
                        Ok(n) => n,
                        Err(e) => {
                            self.chain_refused(pair, stats, t.head, &e);
                            continue;
                        }
                    };
                    // `pop_tx_batch` places each chain in the half after the one before.
                    let Some(chain) = arena.take(start, n) else {
                        stats.tx_errors.inc();
                        continue;
                    };
                    let Some(hdr) = self.admit(pair, stats, chain, hdr_len) else {
                        continue;
                    };
                    pins.held[half] = true;
                    let contained = port.contain("a transmitted frame", || {
                        port.snoop_frame(&chain[hdr_len..]);
                        // SAFETY: the frame's bytes lie in this half of `buf`, which this
                        // thread holds (its worker's lock) for the whole burst. Split off
                        // `arena`, they are neither written nor borrowed again until
                        // `pop_tx_batch` fills the half anew, and `pins` flushes the switch
                        // before that (`Pins::fill`) and before the burst ends, however it
                        // ends (`Pins::drop`, before the lock is let go).
                        let mut pkt = unsafe { Packet::pinned(hdr, &mut chain[hdr_len..]) };
                        let mut from = Ingress {
                            port: port.id,
                            queue: pair,
                            tally,
                            routes: &mut *routes,
                            bufs: &mut *bufs,
                        };
                        self.0.switch.forward_by(&rules, &mut from, &mut pkt);
                    });
                    if contained.is_none() {
                        stats.tx_errors.inc();
                    }
                }
                half ^= 1;
            }
            if returned == 0 && mode == Mode::Polled {
                break Burst::Empty;
            }
            if mode == Mode::Polled || !vring.enable_notification().map_err(RingError)? {
                break Burst::Done;
            }
        };
        // The frames for other ports first, then this queue's used chains.
        drop(pins);
        if returned > 0 && mode == Mode::Polled {
            // The driver need not kick a queue that is polled: VRING_USED_F_NO_NOTIFY,
            // written again after each busy burst in case the ring was started anew.
            vring.disable_notification().map_err(RingError)?;
        }
        if returned > 0 && self.wants_interrupt_after(vring, returned)? {
            self.signal(vring);
        }
        Ok(burst)
    }

    /// Counts a frame the guest sent and checks it before it goes anywhere: its header, its
    /// source MAC (`--port-mac-lock`), its GSO segment count. `None`: dropped, and counted.
    #[inline]
    fn admit(&self, pair: usize, stats: &QueueStats, chain: &[u8], hdr_len: usize) -> Option<VirtioNetHdr> {
        let port = &self.0.port;
        let frame = &chain[hdr_len..];
        stats.tx_packets.inc();
        stats.tx_bytes.add(frame.len() as u64);
        let hdr = match VirtioNetHdr::parse(chain, hdr_len) {
            Ok(h) => h,
            Err(e) => {
                stats.tx_errors.inc();
                debug!("port {}: {e}", port.id);
                return None;
            }
        };
        trace!("port {}: tx {} bytes on pair {pair}", port.id, frame.len());
        if !port.source_lock.allows(frame) {
            stats.tx_dropped.inc();
            stats.tx_spoofed.inc();
            if port.warn.allow() {
                warn!(
                    "port {}: tx queue {pair}: dropping a frame from a source MAC other than the \
                     port's (--port-mac-lock)",
                    port.id
                );
            }
            return None;
        }
        if hdr.gso_type != GSO_NONE {
            stats.tx_gso.inc();
            // Refused here, once, rather than at each receiver that would have to segment it.
            // Other GSO errors are for a receiver that segments to find: one that takes GSO
            // whole may accept them.
            if let Err(e @ (GsoError::TooManySegments { .. } | GsoError::ZeroSize)) =
                gso::segment_count(&hdr, frame)
            {
                stats.tx_dropped.inc();
                stats.tx_gso_refused.inc();
                if port.warn.allow() {
                    warn!("port {}: tx queue {pair}: dropping GSO frame: {e}", port.id);
                }
                return None;
            }
        }
        Some(hdr)
    }

    /// A TX chain the queue layer refused (returned empty): counted, logged.
    fn chain_refused(&self, pair: usize, stats: &QueueStats, head: u16, e: &ChainError) {
        let port = &self.0.port;
        stats.tx_errors.inc();
        if matches!(e, ChainError::TooManyDescriptors) {
            stats.tx_desc_limit.inc();
        }
        if port.warn.allow() {
            warn!(
                "port {}: tx queue {pair}: dropping chain {head}: {}",
                port.id,
                error_chain(e)
            );
        }
    }

    /// Whether the driver wants an interrupt for what was just returned.
    fn wants_interrupt(&self, vring: &Vring) -> Result<bool, RingError> {
        let mem = self.0.mem.memory();
        let mut st = vring.get_mut();
        wants_interrupt(st.get_queue_mut(), &*mem)
    }

    /// Whether the driver wants an interrupt for the `returned` TX chains just given back:
    /// only this queue's worker returns them, so the count is exact.
    fn wants_interrupt_after(&self, vring: &Vring, returned: usize) -> Result<bool, RingError> {
        let mem = self.0.mem.memory();
        let st = vring.get_ref();
        let added = u16::try_from(returned).unwrap_or(u16::MAX);
        wants_interrupt_after(st.get_queue(), &*mem, added)
    }

    /// Interrupts the driver. The call eventfd is non-blocking (memcheck.rs): a frontend that
    /// let its counter fill only loses the interrupt.
    fn signal(&self, vring: &Vring) {
        if let Err(e) = vring.signal_used_queue() {
            let port = &self.0.port;
            if port.warn.allow() {
                warn!("port {}: signalling the driver: {e}", port.id);
            }
        }
    }
}

impl VhostUserBackend for VnicBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        2 * self.pairs() + 1
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        features::offered(self.0.port.queue_pairs)
    }

    fn acked_features(&self, features: u64) {
        self.0.port.set_acked(features);
        debug!("port {}: features acked {features:#x}", self.0.port.id);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIG
    }

    fn reset_device(&self) {
        self.0.port.reset();
    }

    fn set_event_idx(&self, _enabled: bool) {}

    /// GET_VRING_BASE: the queue is marked not ready before this is called, so nothing more
    /// is written into it. An RX queue's last entries may still wait for the flush that
    /// publishes them (`rx.rs`): they are published here, before the frontend reads the
    /// used index back.
    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let index = queue_index as usize;
        if !matches!(self.role(index), Role::Rx) {
            return Ok(());
        }
        let vring = crate::sync::lock(&self.0.captured).get(index).cloned().flatten();
        if let Some(vring) = vring {
            let mem = self.0.mem.memory();
            let st = vring.get_ref();
            if let Err(e) = publish_used(st.get_queue(), &*mem) {
                drop(st);
                self.0.port.ring_broken(&self.0.broken, index, &e);
            }
        }
        Ok(())
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let port = &self.0.port;
        if let Some(advice) = config::short_read_advice(offset, size) {
            if port.warn.allow() {
                warn!("port {}: {advice}", port.id);
            }
        }
        port.config.read(offset, size)
    }

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        // `self.0.mem` is the same GuestMemoryAtomic the handler just updated.
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One thread per queue pair, then one for the control queue: a guest busy-waits on
        // every control command, so it must never queue behind data.
        let mut v: Vec<u64> = (0..self.pairs()).map(|p| 0b11u64 << (2 * p)).collect();
        v.push(1u64 << (2 * self.pairs()));
        v
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .inspect_err(|e| warn!("port {}: exit event: {e}", self.0.port.id))
            .ok()?;
        // Closed by the session once the workers are gone (see `Session::exit_fds`).
        crate::sync::lock(&self.0.exit_fds).push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        if u64::from(device_event) == self.attach_event_id() {
            let _ = self.0.attach[thread_id].read();
            self.capture(thread_id, vrings);
            return self.resume_ctrl(thread_id, vrings);
        }
        if u64::from(device_event) == self.again_event_id() {
            let _ = self.0.again[thread_id].read();
            for (local, vring) in vrings.iter().enumerate() {
                self.serve(thread_id, local, vring, false)?;
            }
            return Ok(());
        }
        let local = usize::from(device_event);
        match vrings.get(local) {
            Some(vring) => self.serve(thread_id, local, vring, true),
            None => Ok(()),
        }
    }
}

impl VnicBackend {
    /// Serves vring `local` of worker `thread` by its role; `kicked`: woken for it.
    fn serve(&self, thread: usize, local: usize, vring: &Vring, kicked: bool) -> io::Result<()> {
        let global = self.global(thread, local);
        match self.role(global) {
            Role::Rx if kicked => {
                // Nothing waits for RX buffers: a frame that finds none is dropped and
                // counted. A refill kick only costs the driver a syscall and this thread a
                // wake-up, so the driver is asked to stop (VRING_USED_F_NO_NOTIFY; with
                // EVENT_IDX, avail_event is never moved on for RX, which does the same).
                if let Err(e) = vring.disable_notification() {
                    self.0.port.ring_broken(&self.0.broken, global, &RingError(e));
                }
                Ok(())
            }
            Role::Rx => Ok(()),
            Role::Tx(pair) => self.process_tx(pair, vring, thread),
            Role::Ctrl => self.process_ctrl(vring, thread, kicked),
        }
    }
}

impl PollQueue for Session {
    fn poll(self: Arc<Self>, pair: usize) -> Polled {
        VnicBackend(self).poll_tx(pair)
    }
}

impl MemOwner for Session {
    fn owns(&self, addr: usize) -> bool {
        self.mem.memory().iter().any(|r| {
            let start = r.as_ptr() as usize;
            addr >= start && addr - start < r.len() as usize
        })
    }

    fn fault(&self, addr: usize) {
        let port = &self.port;
        port.conn_stats.memory_faults.inc();
        warn!(
            "port {}: guest memory at {addr:#x} is gone (its file shrank after it was mapped); ending the connection",
            port.id
        );
        let _ = self.frontend.shutdown(Shutdown::Both);
    }
}

/// The relay's view of ring starts: see `proxy` for why an acknowledged enable is the moment
/// the guest's DRIVER_OK is known; and of the rings it programs and the messages it refuses.
impl RelayWatch for VnicBackend {
    fn enabling(&self, index: u32) {
        self.ctrl_enabling(index);
    }

    fn enabled(&self, index: u32) {
        self.ctrl_enabled(index);
    }

    fn ring_reset(&self, index: u32) {
        self.0.broken.clear(index as usize);
    }

    fn refused(&self, why: &ProxyError) {
        let port = &self.0.port;
        port.conn_stats.frontend_refused.inc();
        if port.warn.allow() {
            warn!("port {}: frontend message refused: {}", port.id, error_chain(why));
        }
    }
}
