//! The `VhostUserBackend` of one connection: queue-to-thread layout, feature negotiation,
//! config space, and the per-queue TX and control work.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use log::{debug, info, trace, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_queue::QueueT;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::evict::NextLines;
use super::placement::{CpuSet, CtrlCpu, Seen};
use super::proxy::{ProxyError, RelayWatch};
use super::queue::{
    add_used, indirect_table, pop_ctrl, pop_tx, wants_interrupt, BrokenRings, ChainError, RingError,
};
use super::sigbus::MemOwner;
use super::{error_chain, GuestPort, Mem, Vring};
use crate::device::ctrl::{CtrlOutcome, ACK_ERR, ACK_OK};
use crate::device::features::{self, Negotiated};
use crate::pipeline::gso::{self, GsoError};
use crate::pipeline::router::RouteCache;
use crate::pipeline::{Ingress, Packet};
use crate::stats::TallyHandle;
use crate::wire::virtio_net_hdr::GSO_NONE;
use crate::wire::VirtioNetHdr;

/// Largest frame (header included) a guest may transmit: a 64 KiB TSO frame (IP total
/// length 65535) behind Ethernet and two VLAN tags, with the 20-byte hash header.
const TX_BUF: usize = 20 + 14 + 8 + 65_535;
/// Largest control command we read: 64 Ki multicast entries fit with room to spare.
const CTRL_MAX: usize = 1 << 20;
const QUEUE_SIZE: usize = 1024;
/// TX chains a worker serves per wake-up before it goes back to its event loop (and so
/// notices a disconnect) and comes round again: Linux vhost-net's VHOST_NET_PKT_WEIGHT.
const TX_BUDGET: usize = 256;
/// Descriptors a worker walks per wake-up, likewise: a Linux guest's chains hold at most
/// MAX_SKB_FRAGS + 2 (19 by default) descriptors, so 256 such chains fit; chains of up to
/// MAX_FRAME_DESCS zero-length descriptors do not buy a guest more than this per wake.
const TX_WALK_BUDGET: usize = 8192;
/// Control commands served per wake-up, likewise (each may be a table of 64 Ki entries).
const CTRL_BUDGET: usize = 64;

struct Session {
    port: Arc<GuestPort>,
    mem: Mem,
    /// One eventfd per worker thread, fired once at start so each thread reports its vrings.
    attach: Vec<EventFd>,
    /// One eventfd per worker thread, fired when it stopped at its budget with work left.
    again: Vec<EventFd>,
    /// Every vring by queue index, as the worker threads reported them.
    captured: Mutex<Vec<Option<Vring>>>,
    /// False while the frontend enables the control ring and waits: the control thread
    /// serves nothing until the commands posted before DRIVER_OK are known.
    ctrl_open: AtomicBool,
    /// Commands at the head of the control ring that were posted before DRIVER_OK.
    ctrl_early: AtomicU16,
    /// Set with `ctrl_open`: the control thread must look at its ring (kicks that came
    /// while it was closed were swallowed).
    ctrl_resume: AtomicBool,
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

/// What one worker thread owns: its frame buffer, its route cache, its counters. Only that thread
/// locks it, so the lock is never contended.
struct Worker {
    buf: Vec<u8>,
    routes: RouteCache,
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

/// Whether a worker finished what its ring held or stopped at its budget.
#[derive(Debug, PartialEq, Eq)]
enum Burst {
    Done,
    More,
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
                    routes: RouteCache::default(),
                    tally: port.switch.tallies().register(),
                    next_ctrl: NextLines::default(),
                    ctrl_cpu: CtrlCpu::new(allowed, frontend_pid, tuning.wake_priority),
                    ctrl_asleep: true,
                })
            })
            .collect();
        let queues = 2 * usize::from(port.queue_pairs) + 1;
        Ok(VnicBackend(Arc::new(Session {
            port,
            mem,
            attach,
            again,
            captured: Mutex::new(vec![None; queues]),
            ctrl_open: AtomicBool::new(true),
            ctrl_early: AtomicU16::new(0),
            ctrl_resume: AtomicBool::new(false),
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
        let mut cap = self.0.captured.lock().unwrap_or_else(|p| p.into_inner());
        let first = self.global(thread, 0);
        if cap.get(first).is_none_or(Option::is_some) {
            return;
        }
        for (slot, v) in cap.iter_mut().skip(first).zip(vrings) {
            *slot = Some(v.clone());
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

    /// After the control ring was (re)started: serves what it holds, on its own thread.
    fn resume_ctrl(&self, thread: usize, vrings: &[Vring]) -> io::Result<()> {
        let feat = self.negotiated();
        if !feat.ctrl_vq() {
            return Ok(());
        }
        let (owner, local) = self.owner(feat.ctrl_queue_index(self.0.port.queue_pairs));
        if owner != thread || !self.0.ctrl_resume.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        match vrings.get(local) {
            Some(v) => self.process_ctrl(v, thread, true),
            None => Ok(()),
        }
    }

    /// For a control ring a driver starts from index 0 (a new driver, or one that reset the
    /// device): how many commands it holds that were posted before DRIVER_OK. `None` for a
    /// ring started past index 0: a restart (a backend reconnect: QEMU hands back where the
    /// driver is), where what the ring holds came while the driver was running. Called
    /// while the frontend waits on the ring's enable, so the driver is stopped in its
    /// DRIVER_OK write and cannot add more.
    fn fresh_start(&self, vring: &Vring) -> Option<u16> {
        let mem = self.0.mem.memory();
        let st = vring.get_ref();
        let q = st.get_queue();
        if !q.ready() || q.next_avail() != 0 {
            return None;
        }
        match q.avail_idx(&*mem, Ordering::Acquire) {
            // More than a ring's worth is a corrupt index, which popping refuses by itself.
            Ok(idx) => Some(idx.0.min(q.size())),
            Err(_) => Some(0),
        }
    }

    /// Serves TX queue `pair`: up to [`TX_BUDGET`] chains, then again later if more wait.
    /// A queue the driver broke is marked and left alone.
    fn process_tx(&self, pair: usize, vring: &Vring, thread: usize) -> io::Result<()> {
        let index = 2 * pair + 1;
        if self.0.broken.is(index) {
            return Ok(());
        }
        let burst = self.tx_burst(pair, vring, thread);
        self.after_burst(thread, index, burst)
    }

    /// What follows a burst on queue `index` of worker `thread`: nothing, a later round
    /// (the budget ran out), or the queue marked broken.
    fn after_burst(&self, thread: usize, index: usize, burst: Result<Burst, RingError>) -> io::Result<()> {
        match burst {
            Ok(Burst::Done) => Ok(()),
            Ok(Burst::More) => self.come_again(thread),
            Err(e) => {
                self.0.port.ring_broken(&self.0.broken, index, &e);
                Ok(())
            }
        }
    }

    fn tx_burst(&self, pair: usize, vring: &Vring, thread: usize) -> Result<Burst, RingError> {
        let port = &self.0.port;
        let feat = self.negotiated();
        let hdr_len = feat.hdr_len();
        let mem = self.0.mem.memory();
        let mut worker = self.0.workers[thread].lock().unwrap_or_else(|p| p.into_inner());
        let Worker {
            buf, routes, tally, ..
        } = &mut *worker;
        let stats = tally.at(port.id, pair);
        if buf.len() < TX_BUF {
            buf.resize(TX_BUF, 0);
        }
        // Interrupt the driver only for chains actually returned.
        let mut returned = 0usize;
        let mut walked = 0usize;
        let burst = 'wake: loop {
            vring.disable_notification().map_err(RingError)?;
            loop {
                if returned == TX_BUDGET || walked >= TX_WALK_BUDGET {
                    // Notifications stay off: this thread comes back by itself.
                    break 'wake Burst::More;
                }
                // Pop and return the chain in one short critical section: the vring lock must
                // not be held while the frame goes to other ports.
                let popped = {
                    let mut st = vring.get_mut();
                    let q = st.get_queue_mut();
                    let t = pop_tx(q, &*mem, hdr_len, buf)?;
                    if let Some(t) = &t {
                        add_used(q, &*mem, t.head, 0)?;
                    }
                    t
                };
                let Some(t) = popped else { break };
                returned += 1;
                walked += t.walked;
                match t.result {
                    Ok(n) => {
                        stats.tx_packets.inc();
                        stats.tx_bytes.add((n - hdr_len) as u64);
                        let hdr = match VirtioNetHdr::parse(&buf[..n], hdr_len) {
                            Ok(h) => h,
                            Err(e) => {
                                stats.tx_errors.inc();
                                debug!("port {}: {e}", port.id);
                                continue;
                            }
                        };
                        trace!("port {}: tx {} bytes on pair {pair}", port.id, n - hdr_len);
                        if !port.source_lock.allows(&buf[hdr_len..n]) {
                            stats.tx_dropped.inc();
                            stats.tx_spoofed.inc();
                            if port.warn.allow() {
                                warn!(
                                    "port {}: tx queue {pair}: dropping a frame from a source MAC other \
                                     than the port's (--port-mac-lock)",
                                    port.id
                                );
                            }
                            continue;
                        }
                        if hdr.gso_type != GSO_NONE {
                            stats.tx_gso.inc();
                            // Refused here, once, rather than at each receiver that would
                            // have to segment it. Other GSO errors are for a receiver that
                            // segments to find: one that takes GSO whole may accept them.
                            if let Err(e @ (GsoError::TooManySegments { .. } | GsoError::ZeroSize)) =
                                gso::segment_count(&hdr, &buf[hdr_len..n])
                            {
                                stats.tx_dropped.inc();
                                stats.tx_gso_refused.inc();
                                if port.warn.allow() {
                                    warn!("port {}: tx queue {pair}: dropping GSO frame: {e}", port.id);
                                }
                                continue;
                            }
                        }
                        let contained = port.contain("a transmitted frame", || {
                            port.snoop_frame(&buf[hdr_len..n]);
                            let mut pkt = Packet {
                                hdr,
                                frame: &mut buf[hdr_len..n],
                            };
                            let mut from = Ingress {
                                port: port.id,
                                queue: pair,
                                tally,
                                routes: &mut *routes,
                            };
                            port.switch.forward(&mut from, &mut pkt);
                        });
                        if contained.is_none() {
                            stats.tx_errors.inc();
                        }
                    }
                    Err(e) => {
                        stats.tx_errors.inc();
                        if matches!(e, ChainError::TooManyDescriptors) {
                            stats.tx_desc_limit.inc();
                        }
                        if port.warn.allow() {
                            warn!(
                                "port {}: tx queue {pair}: dropping chain {}: {}",
                                port.id,
                                t.head,
                                error_chain(&e)
                            );
                        }
                    }
                }
            }
            if !vring.enable_notification().map_err(RingError)? {
                break Burst::Done;
            }
        };
        if returned > 0 && self.wants_interrupt(vring)? {
            self.signal(vring);
        }
        Ok(burst)
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

    /// Serves the control queue: up to [`CTRL_BUDGET`] commands, then again later if more
    /// wait. A queue the driver broke is marked and left alone. `kicked`: the thread was
    /// woken for it, not back after its budget.
    fn process_ctrl(&self, vring: &Vring, thread: usize, kicked: bool) -> io::Result<()> {
        if !self.0.ctrl_open.load(Ordering::Acquire) {
            // The kick is gone; `enabled` sends this thread back here.
            return Ok(());
        }
        let index = self.negotiated().ctrl_queue_index(self.0.port.queue_pairs);
        if self.0.broken.is(index) {
            return Ok(());
        }
        let burst = self.ctrl_burst(vring, thread, kicked);
        self.after_burst(thread, index, burst)
    }

    fn ctrl_burst(&self, vring: &Vring, thread: usize, kicked: bool) -> Result<Burst, RingError> {
        let feat = self.negotiated();
        let mem = self.0.mem.memory();
        let mut worker = self.0.workers[thread].lock().unwrap_or_else(|p| p.into_inner());
        let Worker {
            buf,
            next_ctrl,
            ctrl_cpu,
            ctrl_asleep,
            ..
        } = &mut *worker;
        let window = self.0.port.ctrl_tuning.poll;
        let mut woken = kicked && std::mem::take(ctrl_asleep);
        // Back after its budget, the thread is in the middle of a burst of commands: it polls
        // for the next one as it would have without the break, even if none is there yet.
        let mut resumed = !kicked;
        let mut served_total = 0usize;
        loop {
            vring.disable_notification().map_err(RingError)?;
            let mut served = false;
            while served_total < CTRL_BUDGET && self.ctrl_one(vring, &feat, &mem, buf, next_ctrl)? {
                if served_total == 0 && woken {
                    self.0.port.ctrl_stats.ctrl_wakeups.inc();
                    // The guest has its ack: now, not before, see where to poll from.
                    self.settle(ctrl_cpu);
                }
                served = true;
                served_total += 1;
            }
            woken = false;
            if served && self.wants_interrupt(vring)? {
                self.0.port.ctrl_stats.ctrl_interrupts.inc();
                self.signal(vring);
            }
            if served_total == CTRL_BUDGET {
                return Ok(Burst::More);
            }
            // A driver changing its address lists sends several commands back to back and
            // busy-waits on each ack: polling the ring a little while (notifications still
            // off, so the guest does not even exit to kick) saves a wake-up per command.
            let poll = served || std::mem::take(&mut resumed);
            if poll && self.poll_avail(vring, &mem, window) {
                next_ctrl.prefetch(&*mem);
                continue;
            }
            // With EVENT_IDX this publishes avail_event: without it the driver would never
            // kick again and spin forever on its next command.
            if !vring.enable_notification().map_err(RingError)? {
                *ctrl_asleep = true;
                if let Err(e) = ctrl_cpu.asleep(poll && !window.is_zero()) {
                    // Once per connection: the thread does not try again.
                    info!("port {}: control thread: {}", self.0.port.id, error_chain(&e));
                }
                return Ok(Burst::Done);
            }
        }
    }

    /// After the first command since a sleep: off the guest's CPU, back to normal priority
    /// (placement.rs).
    fn settle(&self, ctrl_cpu: &mut CtrlCpu) {
        let port = &self.0.port;
        match ctrl_cpu.woke() {
            Ok(Some((cpu, seen))) => {
                port.ctrl_stats.ctrl_cpu_moves.inc();
                let how = match seen {
                    Seen::Frontend => "a frontend thread was runnable there",
                    Seen::Signs => "seen by its wait for the CPU or the kick's timing",
                };
                debug!(
                    "port {}: control thread woke on the guest's CPU {cpu} ({how}); moved off it",
                    port.id
                );
            }
            Ok(None) => {}
            Err(e) => {
                if port.warn.allow() {
                    warn!(
                        "port {}: placing the control thread: {}",
                        port.id,
                        error_chain(&e)
                    );
                }
            }
        }
    }

    fn wants_interrupt(&self, vring: &Vring) -> Result<bool, RingError> {
        let mem = self.0.mem.memory();
        let mut st = vring.get_mut();
        wants_interrupt(st.get_queue_mut(), &*mem)
    }

    /// Spins up to `window` for a new available descriptor; true if one arrived.
    fn poll_avail(
        &self,
        vring: &Vring,
        mem: &vm_memory::GuestMemoryLoadGuard<vm_memory::GuestMemoryMmap>,
        window: Duration,
    ) -> bool {
        if window.is_zero() {
            return false;
        }
        // This thread is the control queue's only consumer, so the ring address and the
        // next index to serve cannot change while it spins: read them once, then watch the
        // avail index in guest memory without taking the vring lock on every spin.
        let (idx_addr, next) = {
            let st = vring.get_ref();
            let q = st.get_queue();
            (q.avail_ring().checked_add(2), q.next_avail())
        };
        let Some(idx_addr) = idx_addr.map(vm_memory::GuestAddress) else {
            return false;
        };
        let deadline = Instant::now() + window;
        for spin in 0u32.. {
            match mem.load::<u16>(idx_addr, std::sync::atomic::Ordering::Acquire) {
                Ok(idx) if u16::from_le(idx) != next => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            // The clock is read every 64 spins, not on each.
            if spin % 64 == 63 && Instant::now() >= deadline {
                return false;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Serves one control command; `false` when the queue is empty.
    fn ctrl_one(
        &self,
        vring: &Vring,
        feat: &Negotiated,
        mem: &vm_memory::GuestMemoryLoadGuard<vm_memory::GuestMemoryMmap>,
        buf: &mut Vec<u8>,
        next: &mut NextLines,
    ) -> Result<bool, RingError> {
        let port = &self.0.port;
        let t0 = Instant::now();
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        let Some((head, chain)) = pop_ctrl(q, &**mem, buf, CTRL_MAX)? else {
            return Ok(false);
        };
        port.ctrl_stats.ctrl_commands.inc();
        let early = self
            .0
            .ctrl_early
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if early {
            // Refused below whether the chain is well formed or not.
            port.ctrl_stats.ctrl_before_driver_ok.inc();
        }
        let evict = chain.as_ref().map(|c| c.evict).unwrap_or_default();
        // Held until the command is applied, after the answer: a reset from the frontend
        // cannot fall between the two and be undone by a stale table.
        let mut nic = port.lock_ctrl();
        // A table set is answered as soon as it is checked and applied after the used entry:
        // the tables are already in `buf`, and the guest spins until it sees the answer,
        // while the copy and the sync are O(N) in its list (docs/benchmarks.md, "Filter sync
        // against table size").
        let mut later = None;
        // What applying leaves outside the control state: the log line, and the offloads the
        // RX path reads. One place for commands applied before their answer and after it.
        let applied = |outcome: CtrlOutcome| {
            debug!("port {}: control command applied: {outcome:?}", port.id);
            if let CtrlOutcome::GuestOffloads(bits) = outcome {
                port.set_guest_offloads(bits);
            }
        };
        let (ack, ack_addr) = match chain {
            // Virtio forbids the driver to use the device before DRIVER_OK; a real NIC
            // answers such commands with an error and does not act on them.
            Ok(c) if early => {
                port.ctrl_stats.ctrl_errors.inc();
                if port.warn.allow() {
                    warn!(
                        "port {}: control command posted before DRIVER_OK refused",
                        port.id
                    );
                }
                (ACK_ERR, c.ack)
            }
            Ok(c) => match port.contain("a control command", || nic.parse(feat, &buf[..c.len])) {
                Some(Ok(table)) if table.is_table_set() => {
                    later = Some(table);
                    (ACK_OK, c.ack)
                }
                Some(Ok(cmd)) => match port.contain("a control command", || nic.execute(cmd)) {
                    Some(outcome) => {
                        applied(outcome);
                        (ACK_OK, c.ack)
                    }
                    None => {
                        port.ctrl_stats.ctrl_errors.inc();
                        (ACK_ERR, c.ack)
                    }
                },
                None => {
                    port.ctrl_stats.ctrl_errors.inc();
                    (ACK_ERR, c.ack)
                }
                Some(Err(e)) => {
                    port.ctrl_stats.ctrl_errors.inc();
                    if port.warn.allow() {
                        warn!("port {}: control command refused: {}", port.id, error_chain(&e));
                    }
                    (ACK_ERR, c.ack)
                }
            },
            Err(e) => {
                port.ctrl_stats.ctrl_errors.inc();
                if port.warn.allow() {
                    warn!("port {}: bad control chain: {}", port.id, error_chain(&e));
                }
                (ACK_ERR, None)
            }
        };
        let written = match ack_addr {
            Some(a) => match mem.write_obj(ack, a) {
                Ok(()) => 1,
                Err(e) => {
                    port.ctrl_stats.ctrl_errors.inc();
                    if port.warn.allow() {
                        warn!("port {}: writing control ack: {e}", port.id);
                    }
                    0
                }
            },
            None => 0,
        };
        add_used(q, &**mem, head, written)?;
        port.ctrl_stats.ctrl_answer.record(t0.elapsed().as_nanos() as u64);
        if let Some(table) = later {
            if let Some(outcome) = port.contain("a MAC table", || nic.execute(table)) {
                applied(outcome);
            }
        }
        drop(nic);
        let desc = GuestAddress(q.desc_table()).checked_add(16 * u64::from(head));
        next.note(desc, desc.and_then(|d| indirect_table(&**mem, d)), ack_addr);
        // After the used entry, off the path the guest is waiting on.
        evict.evict(&**mem);
        port.ctrl_stats.ctrl_busy_ns.add(t0.elapsed().as_nanos() as u64);
        Ok(true)
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

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.0.port.config.read(offset, size)
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
        self.0
            .exit_fds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(consumer.as_raw_fd());
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
        match self.role(self.global(thread, local)) {
            Role::Rx => Ok(()),
            Role::Tx(pair) => self.process_tx(pair, vring, thread),
            Role::Ctrl => self.process_ctrl(vring, thread, kicked),
        }
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
        let pairs = self.pairs();
        let i = index as usize;
        // The control queue's index depends on whether MQ was acked; either candidate closes
        // the gate, and `enabled` reopens it.
        if i == 2 || i == 2 * pairs {
            self.0.ctrl_open.store(false, Ordering::Release);
        }
    }

    fn enabled(&self, index: u32) {
        let s = &self.0;
        let feat = self.negotiated();
        let ctrl = feat.ctrl_vq() && index as usize == feat.ctrl_queue_index(s.port.queue_pairs);
        if ctrl {
            let vring = s
                .captured
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(index as usize)
                .cloned()
                .flatten();
            let fresh = vring.and_then(|v| self.fresh_start(&v));
            if fresh.is_some() {
                // The driver reset the device (or is its first): as a NIC after reset, the
                // filter is back to promiscuous with empty tables until the driver programs
                // it. A VM pause or a reconnect restarts past 0 and keeps the state.
                s.port.reset();
            }
            let early = fresh.unwrap_or(0);
            if early > 0 {
                info!(
                    "port {}: {early} control command(s) posted before DRIVER_OK will be refused",
                    s.port.id
                );
            } else {
                debug!(
                    "port {}: control ring started, nothing posted before DRIVER_OK",
                    s.port.id
                );
            }
            s.ctrl_early.store(early, Ordering::Release);
            s.ctrl_resume.store(true, Ordering::Release);
        }
        s.ctrl_open.store(true, Ordering::Release);
        if ctrl {
            let (thread, _) = self.owner(index as usize);
            if let Err(e) = self.trigger_attach(thread) {
                warn!("port {}: waking the control thread: {e}", s.port.id);
            }
        }
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
