//! The control queue, in one place: the gate the relay drives ([`CtrlGate`]), and the
//! control thread's service of its ring (pop, parse, answer, apply, poll window).
//!
//! The gate's events come from the relay (proxy.rs), which sees the frontend's messages:
//! - `ctrl_enabling`: the frontend is enabling the control ring; the gate closes, and a
//!   kick that comes meanwhile is swallowed;
//! - `ctrl_enabled`: the ring is enabled, so the driver has written DRIVER_OK; a ring
//!   started from index 0 is a device reset, and the commands it already holds were posted
//!   before DRIVER_OK: they are counted (`started`) and refused. The gate opens and the
//!   control thread is sent to look at its ring.
//!
//! The service: each wake-up serves at most [`CTRL_BUDGET`] commands. A command is popped
//! whole into the worker's buffer, parsed (the result is the ack), answered, and applied;
//! a table set is applied after its answer, since the guest spins on the ack. After a burst
//! the thread polls the ring for the poll window (`--ctrl-poll-us`) with notifications off,
//! then sleeps.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Address, Bytes, GuestAddress, GuestAddressSpace};

use super::super::evict::NextLines;
use super::super::placement::{CtrlCpu, Seen};
use super::super::queue::{add_used, indirect_table, pop_ctrl, ChainError, CtrlChain, RingError};
use super::super::{error_chain, Vring};
use super::{Burst, VnicBackend, Worker};
use crate::device::ctrl::{CtrlOutcome, ValidCommand, ACK_ERR, ACK_OK};
use crate::device::features::Negotiated;
use crate::device::NicState;

/// The cache hints of `evict.rs` (flush a returned command's tables, prefetch the next
/// command's lines) are compiled in with the `ctrl-cache-hints` feature only: they were
/// measured under TCG alone (docs/benchmarks.md, "Closing in on the in-process answer"), and
/// a default build does nothing a KVM host has not been shown to gain from.
const CACHE_HINTS: bool = cfg!(feature = "ctrl-cache-hints");

/// Control commands served per wake-up before the thread goes back to its event loop (and
/// so notices a disconnect), as `TX_BUDGET` is for chains; each may be a table of 64 Ki
/// entries.
const CTRL_BUDGET: usize = 64;

/// Largest control command we read: 64 Ki multicast entries fit with room to spare.
const CTRL_MAX: usize = 1 << 20;

/// Whether the control thread may serve its ring, and what it must do when it does.
/// Written by the relay's thread, read by the control thread.
#[derive(Debug)]
pub(super) struct CtrlGate {
    /// False while the frontend enables the control ring and waits: the control thread
    /// serves nothing until the commands posted before DRIVER_OK are known.
    open: AtomicBool,
    /// Commands at the head of the ring that were posted before DRIVER_OK.
    early: AtomicU16,
    /// Set when the ring (re)started: the control thread must look at it (kicks that came
    /// while the gate was closed were swallowed).
    resume: AtomicBool,
}

impl Default for CtrlGate {
    fn default() -> Self {
        CtrlGate {
            open: AtomicBool::new(true),
            early: AtomicU16::new(0),
            resume: AtomicBool::new(false),
        }
    }
}

impl CtrlGate {
    fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// The ring (re)started with `early` commands posted before DRIVER_OK.
    fn started(&self, early: u16) {
        self.early.store(early, Ordering::Release);
        self.resume.store(true, Ordering::Release);
    }

    fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether the ring restarted since the control thread last looked.
    fn take_resume(&self) -> bool {
        self.resume.swap(false, Ordering::AcqRel)
    }

    /// Whether the command being served is one posted before DRIVER_OK (counting it off).
    fn take_early(&self) -> bool {
        self.early
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl VnicBackend {
    /// After the control ring was (re)started: serves what it holds, on its own thread.
    pub(super) fn resume_ctrl(&self, thread: usize, vrings: &[Vring]) -> io::Result<()> {
        let feat = self.negotiated();
        if !feat.ctrl_vq() {
            return Ok(());
        }
        let (owner, local) = self.owner(feat.ctrl_queue_index(self.0.port.queue_pairs));
        if owner != thread || !self.0.ctrl_gate.take_resume() {
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

    /// Serves the control queue: up to [`CTRL_BUDGET`] commands, then again later if more
    /// wait. A queue the driver broke is marked and left alone. `kicked`: the thread was
    /// woken for it, not back after its budget.
    pub(super) fn process_ctrl(&self, vring: &Vring, thread: usize, kicked: bool) -> io::Result<()> {
        if !self.0.ctrl_gate.is_open() {
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
        let mut worker = crate::sync::lock(&self.0.workers[thread]);
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
                if CACHE_HINTS {
                    next_ctrl.prefetch(&*mem);
                }
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
        let early = self.0.ctrl_gate.take_early();
        if early {
            // Refused below whether the chain is well formed or not.
            port.ctrl_stats.ctrl_before_driver_ok.inc();
        }
        let evict = chain.as_ref().map(|c| c.evict).unwrap_or_default();
        // Held until the command is applied, after the answer: a reset from the frontend
        // cannot fall between the two and be undone by a stale table.
        let mut nic = port.lock_ctrl();
        let (ack, ack_addr, later) = self.decide(&mut nic, chain, early, feat, buf);
        let written = match ack_addr {
            Some(a) => self.write_ack(mem, ack, a),
            None => 0,
        };
        add_used(q, &**mem, head, written)?;
        port.ctrl_stats.ctrl_answer.record(t0.elapsed().as_nanos() as u64);
        if let Some(table) = later {
            if let Some(outcome) = port.contain("a MAC table", || nic.execute(table)) {
                self.applied(outcome);
            }
        }
        drop(nic);
        if CACHE_HINTS {
            let desc = GuestAddress(q.desc_table()).checked_add(16 * u64::from(head));
            next.note(desc, desc.and_then(|d| indirect_table(&**mem, d)), ack_addr);
            // After the used entry, off the path the guest is waiting on.
            evict.evict(&**mem);
        }
        port.ctrl_stats.ctrl_busy_ns.add(t0.elapsed().as_nanos() as u64);
        Ok(true)
    }

    /// The ack for one popped command, and where it goes. A command is applied here, before
    /// its answer, unless it is a table set: that comes back to be applied after the used
    /// entry, since the tables are already in `buf` and the guest spins until it sees the
    /// answer while the copy and the sync are O(N) in its list (docs/benchmarks.md, "Filter
    /// sync against table size").
    fn decide<'b>(
        &self,
        nic: &mut NicState,
        chain: Result<CtrlChain, ChainError>,
        early: bool,
        feat: &Negotiated,
        buf: &'b [u8],
    ) -> (u8, Option<GuestAddress>, Option<ValidCommand<'b>>) {
        let port = &self.0.port;
        // Counted always; logged (rate limited) when `why` says what to log. The line is
        // only built when it is logged.
        let refuse = |why: Option<&dyn Fn() -> String>| {
            port.ctrl_stats.ctrl_errors.inc();
            if let Some(why) = why.filter(|_| port.warn.allow()) {
                warn!("port {}: {}", port.id, why());
            }
            ACK_ERR
        };
        let c = match chain {
            Ok(c) => c,
            Err(e) => {
                let why = || format!("bad control chain: {}", error_chain(&e));
                return (refuse(Some(&why)), None, None);
            }
        };
        // Virtio forbids the driver to use the device before DRIVER_OK; a real NIC answers
        // such commands with an error and does not act on them.
        if early {
            let why = || "control command posted before DRIVER_OK refused".to_string();
            return (refuse(Some(&why)), c.ack, None);
        }
        let ack = match port.contain("a control command", || nic.parse(feat, &buf[..c.len])) {
            Some(Ok(table)) if table.is_table_set() => return (ACK_OK, c.ack, Some(table)),
            Some(Ok(cmd)) => match port.contain("a control command", || nic.execute(cmd)) {
                Some(outcome) => {
                    self.applied(outcome);
                    ACK_OK
                }
                None => refuse(None),
            },
            Some(Err(e)) => refuse(Some(&|| format!("control command refused: {}", error_chain(&e)))),
            None => refuse(None),
        };
        (ack, c.ack, None)
    }

    /// What applying leaves outside the control state: the log line, and the offloads the
    /// RX path reads. One place for commands applied before their answer and after it.
    fn applied(&self, outcome: CtrlOutcome) {
        let port = &self.0.port;
        debug!("port {}: control command applied: {outcome:?}", port.id);
        if let CtrlOutcome::GuestOffloads(bits) = outcome {
            port.set_guest_offloads(bits);
        }
    }

    /// Writes the ack byte; the length to return in the used entry (0 if it could not be
    /// written).
    fn write_ack(
        &self,
        mem: &vm_memory::GuestMemoryLoadGuard<vm_memory::GuestMemoryMmap>,
        ack: u8,
        addr: GuestAddress,
    ) -> u32 {
        match mem.write_obj(ack, addr) {
            Ok(()) => 1,
            Err(e) => {
                let port = &self.0.port;
                port.ctrl_stats.ctrl_errors.inc();
                if port.warn.allow() {
                    warn!("port {}: writing control ack: {e}", port.id);
                }
                0
            }
        }
    }

    /// Relay: the frontend is enabling ring `index` and waits for the answer.
    pub(super) fn ctrl_enabling(&self, index: u32) {
        let pairs = self.pairs();
        let i = index as usize;
        // The control queue's index depends on whether MQ was acked; either candidate closes
        // the gate, and `enabled` reopens it.
        if i == 2 || i == 2 * pairs {
            self.0.ctrl_gate.close();
        }
    }

    /// Relay: ring `index` is enabled; the driver has set DRIVER_OK (proxy.rs says why).
    pub(super) fn ctrl_enabled(&self, index: u32) {
        let s = &self.0;
        let feat = self.negotiated();
        let ctrl = feat.ctrl_vq() && index as usize == feat.ctrl_queue_index(s.port.queue_pairs);
        if ctrl {
            let vring = crate::sync::lock(&s.captured)
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
            s.ctrl_gate.started(early);
        }
        s.ctrl_gate.open();
        if ctrl {
            let (thread, _) = self.owner(index as usize);
            if let Err(e) = self.trigger_attach(thread) {
                warn!("port {}: waking the control thread: {e}", s.port.id);
            }
        }
    }
}
