//! The control queue (device attachment only), in one place: the gate the relay drives
//! ([`CtrlGate`]), the control thread's service of its ring ([`CtrlQueue`]), and the reading
//! of one command out of guest memory ([`pop_ctrl`]).
//!
//! The gate's events come from the relay (relay.rs), which sees the frontend's messages:
//! - the frontend is enabling the control ring and waits: the gate closes, and a kick that
//!   comes meanwhile is swallowed;
//! - the ring is enabled, so the driver has written DRIVER_OK: a ring started from index 0
//!   is a device reset, and the commands it already holds were posted before DRIVER_OK:
//!   they are counted (`started`) and refused. The gate opens and the control thread is
//!   sent to look at its ring.
//!
//! The service: each wake-up serves at most [`CTRL_BUDGET`] commands. A command is copied
//! whole into the worker's buffer, parsed (the result is the ack), answered, and applied;
//! a table set is applied after its answer, since the guest spins on the ack. After a burst
//! the thread polls the ring for the poll window (`--ctrl-poll-us`) with notifications off,
//! then sleeps.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::Instant;

use log::{debug, warn};
use vhost_user_backend::VringT;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryMmap, Permissions};

use super::avail_watch::poll_avail;
use super::budget::{Burst, CTRL_BUDGET};
use super::guest_port::GuestPort;
use super::split_ring::{walk_one, ChainError, Mem, RingError, Vring, MAX_FRAME_DESCS};
use crate::device::ctrl::{CtrlOutcome, ValidCommand, ACK_ERR, ACK_OK};
use crate::device::features::Negotiated;
use crate::device::NicState;
use crate::logging::error_chain;

/// Largest control command read: 64 Ki multicast entries fit with room to spare.
const CTRL_MAX: usize = 1 << 20;

/// VRING_AVAIL_F_NO_INTERRUPT in the avail ring's flags.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

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
    pub(super) fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// The ring (re)started with `early` commands posted before DRIVER_OK.
    pub(super) fn started(&self, early: u16) {
        self.early.store(early, Ordering::Release);
        self.resume.store(true, Ordering::Release);
    }

    pub(super) fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether the ring restarted since the control thread last looked.
    pub(super) fn take_resume(&self) -> bool {
        self.resume.swap(false, Ordering::AcqRel)
    }

    /// Whether the command being served is one posted before DRIVER_OK (counting it off).
    // Rust 1.99 deprecates fetch_update for try_update, which the minimum (1.82) lacks.
    #[allow(deprecated)]
    fn take_early(&self) -> bool {
        self.early
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// For a control ring a driver starts from index 0 (a new driver, or one that reset the
/// device): how many commands it holds that were posted before DRIVER_OK. `None` for a
/// ring started past index 0: a restart (a backend reconnect: QEMU hands back where the
/// driver is), where what the ring holds came while the driver was running. Called while
/// the frontend waits on the ring's enable, so the driver is stopped in its DRIVER_OK write
/// and cannot add more.
pub(super) fn fresh_start(vring: &Vring, mem: &Mem) -> Option<u16> {
    let mem = mem.memory();
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

/// What the control thread owns: the buffer commands are read into, and whether it went to
/// sleep (notifications on) after its last burst, so that a kick finding work is a
/// wake-up. A kick that reached it while it was back from its budget (notifications still
/// off, a kick the driver sent before they went off) is not.
pub(super) struct CtrlWorker {
    buf: Vec<u8>,
    asleep: bool,
}

impl Default for CtrlWorker {
    fn default() -> Self {
        CtrlWorker {
            buf: Vec::new(),
            asleep: true,
        }
    }
}

/// A connection's control queue, as its thread serves it.
pub(super) struct CtrlQueue<'s> {
    pub(super) port: &'s GuestPort,
    pub(super) mem: &'s Mem,
    pub(super) gate: &'s CtrlGate,
    pub(super) feat: Negotiated,
}

impl CtrlQueue<'_> {
    /// Serves up to [`CTRL_BUDGET`] commands, then polls for more for the poll window, then
    /// sleeps. `kicked`: the thread was woken for it, not back after its budget. `None`
    /// while the gate is closed: the kick is gone, and the gate's opening sends the thread
    /// back here.
    pub(super) fn burst(
        &self,
        vring: &Vring,
        w: &mut CtrlWorker,
        kicked: bool,
    ) -> Option<Result<Burst, RingError>> {
        self.gate.is_open().then(|| self.serve(vring, w, kicked))
    }

    fn serve(&self, vring: &Vring, w: &mut CtrlWorker, kicked: bool) -> Result<Burst, RingError> {
        let port = self.port;
        let mem = self.mem.memory();
        let window = port.ctrl_poll;
        let mut woken = kicked && std::mem::take(&mut w.asleep);
        // Back after its budget, the thread is in the middle of a burst of commands: it polls
        // for the next one as it would have without the break, even if none is there yet.
        let mut resumed = !kicked;
        let mut served_total = 0usize;
        loop {
            vring.disable_notification().map_err(RingError)?;
            let mut served = false;
            while served_total < CTRL_BUDGET && self.one(vring, &mem, &mut w.buf)? {
                if served_total == 0 && woken {
                    port.ctrl_stats.ctrl_wakeups.inc();
                }
                served = true;
                served_total += 1;
            }
            woken = false;
            if served && wants_interrupt(vring.get_mut().get_queue_mut(), &*mem)? {
                port.ctrl_stats.ctrl_interrupts.inc();
                port.health
                    .signal(vring, self.feat.ctrl_queue_index(port.queue_pairs));
            }
            if served_total == CTRL_BUDGET {
                return Ok(Burst::More);
            }
            // A driver changing its address lists sends several commands back to back and
            // busy-waits on each ack: polling the ring a little while (notifications still
            // off, so the guest does not even exit to kick) saves a wake-up per command.
            let poll = served || std::mem::take(&mut resumed);
            if poll && poll_avail(vring, &mem, window) {
                continue;
            }
            // With EVENT_IDX this publishes avail_event: without it the driver would never
            // kick again and spin forever on its next command.
            if !vring.enable_notification().map_err(RingError)? {
                w.asleep = true;
                return Ok(Burst::Done);
            }
        }
    }

    /// Serves one control command; `false` when the queue is empty.
    fn one(&self, vring: &Vring, mem: &GuestMemoryMmap, buf: &mut Vec<u8>) -> Result<bool, RingError> {
        let port = self.port;
        let t0 = Instant::now();
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        let Some((head, chain)) = pop_ctrl(q, mem, buf, CTRL_MAX)? else {
            return Ok(false);
        };
        port.ctrl_stats.ctrl_commands.inc();
        let early = self.gate.take_early();
        if early {
            // Refused below whether the chain is well formed or not.
            port.ctrl_stats.ctrl_before_driver_ok.inc();
        }
        // Held until the command is applied, after the answer: a reset from the frontend
        // cannot fall between the two and be undone by a stale table.
        let mut nic = port.lock_ctrl();
        let (ack, ack_addr, later) = self.decide(&mut nic, chain, early, buf);
        let written = match ack_addr {
            Some(a) => self.write_ack(mem, ack, a),
            None => 0,
        };
        q.add_used(mem, head, written).map_err(RingError)?;
        port.ctrl_stats.ctrl_answer.record(t0.elapsed().as_nanos() as u64);
        if let Some(table) = later {
            if let Some(outcome) = port.health.catch_bug("a MAC table", || nic.execute(table)) {
                self.applied(outcome);
            }
        }
        drop(nic);
        port.ctrl_stats.ctrl_busy_ns.add(t0.elapsed().as_nanos() as u64);
        Ok(true)
    }

    /// The ack for one popped command, and where it goes. A command is applied here, before
    /// its answer, unless it is a table set: that comes back to be applied after the used
    /// entry, since the tables are already in `buf` and the guest spins until it sees the
    /// answer while the copy and the sync are O(N) in its list.
    fn decide<'b>(
        &self,
        nic: &mut NicState,
        chain: Result<CtrlChain, ChainError>,
        early: bool,
        buf: &'b [u8],
    ) -> (u8, Option<GuestAddress>, Option<ValidCommand<'b>>) {
        let port = self.port;
        // Counted always; logged (rate limited) when `why` says what to log. The line is
        // only built when it is logged.
        let refuse = |why: Option<&dyn Fn() -> String>| {
            port.ctrl_stats.ctrl_errors.inc();
            if let Some(why) = why.filter(|_| port.health.may_warn()) {
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
        let health = &port.health;
        let ack = match health.catch_bug("a control command", || nic.parse(&self.feat, &buf[..c.len])) {
            Some(Ok(table)) if table.is_table_set() => return (ACK_OK, c.ack, Some(table)),
            Some(Ok(cmd)) => match health.catch_bug("a control command", || nic.execute(cmd)) {
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
    /// receive side reads. One place for commands applied before their answer and after it.
    fn applied(&self, outcome: CtrlOutcome) {
        debug!("port {}: control command applied: {outcome:?}", self.port.id);
        match outcome {
            CtrlOutcome::GuestOffloads(bits) => self.port.set_guest_offloads(bits),
            CtrlOutcome::AnnounceAck => self.port.announce_acked(),
            _ => {}
        }
    }

    /// Writes the ack byte; the length to return in the used entry (0 if it could not be
    /// written).
    fn write_ack(&self, mem: &GuestMemoryMmap, ack: u8, addr: GuestAddress) -> u32 {
        match mem.write_obj(ack, addr) {
            Ok(()) => 1,
            Err(e) => {
                let port = self.port;
                port.ctrl_stats.ctrl_errors.inc();
                if port.health.may_warn() {
                    warn!("port {}: writing control ack: {e}", port.id);
                }
                0
            }
        }
    }
}

/// Whether the driver wants an interrupt for the commands just returned (through
/// virtio-queue's `add_used`): EVENT_IDX's used_event when negotiated, else the avail
/// ring's NO_INTERRUPT flag, which virtio-queue 0.18's `needs_notification` does not look
/// at.
fn wants_interrupt<M: GuestMemory>(q: &mut Queue, mem: &M) -> Result<bool, RingError> {
    // Always called: it also resets the count of chains added since the last check.
    let by_event_idx = q.needs_notification(mem).map_err(RingError)?;
    if q.event_idx_enabled() {
        return Ok(by_event_idx);
    }
    let flags: u16 = mem
        .read_obj(GuestAddress(q.avail_ring()))
        .map_err(|e| RingError(virtio_queue::Error::GuestMemory(e)))?;
    Ok(u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0)
}

/// The readable bytes of a control command, and where to write its ack.
#[derive(Debug)]
pub struct CtrlChain {
    pub len: usize,
    pub ack: Option<GuestAddress>,
}

/// A popped control chain: its head, and what it holds or why it was refused.
pub type PoppedCtrl = (u16, Result<CtrlChain, ChainError>);

/// Copies the driver-readable part of the next control chain into `buf` (at most `max`
/// bytes) and finds the ack byte (the first byte of the last writable descriptor). `None`
/// when the ring is empty or not started. Unlike `pop_descriptor_chain`, which logs every
/// refusal at ERROR (virtio-queue 0.18), an impossible available index comes back as an
/// error for the caller to act on once.
pub fn pop_ctrl<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<Option<PoppedCtrl>, RingError> {
    let chain = match q.iter(mem) {
        Ok(mut it) => it.next(),
        Err(virtio_queue::Error::QueueNotReady) => None,
        Err(e) => return Err(RingError(e)),
    };
    let Some(chain) = chain else {
        return Ok(None);
    };
    let head = chain.head_index();
    Ok(Some((
        head,
        read_ctrl(chain, mem, buf, max).map(|(len, ack)| CtrlChain { len, ack }),
    )))
}

fn read_ctrl<M: GuestMemory>(
    chain: DescriptorChain<&M>,
    mem: &M,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(usize, Option<GuestAddress>), ChainError> {
    buf.clear();
    let mut ack = None;
    let mut last_has_next = true;
    let mut walked = 0;
    for d in chain {
        walk_one(&mut walked, MAX_FRAME_DESCS)?;
        last_has_next = d.has_next();
        if d.is_write_only() {
            if d.len() > 0 {
                // The answer must land in guest memory: a chain whose ack byte lies outside
                // is refused before anything is applied, as a TX or RX buffer outside
                // memory is.
                if !mem.check_range(d.addr(), 1, Permissions::Write) {
                    return Err(ChainError::Memory {
                        addr: d.addr().0,
                        len: d.len(),
                        source: vm_memory::GuestMemoryError::InvalidGuestAddress(d.addr()),
                    });
                }
                ack = Some(d.addr());
            }
            continue;
        }
        if ack.is_some() {
            // A readable descriptor after a writable one breaks the chain layout rule.
            return Err(ChainError::WrongDirection);
        }
        read_desc_into(mem, &d, buf, max)?;
    }
    if last_has_next {
        return Err(ChainError::Broken);
    }
    Ok((buf.len(), ack))
}

fn read_desc_into<M: GuestMemory>(
    mem: &M,
    d: &Descriptor,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), ChainError> {
    let start = buf.len();
    let end = start
        .checked_add(d.len() as usize)
        .filter(|e| *e <= max)
        .ok_or(ChainError::TooLong(max))?;
    buf.resize(end, 0);
    mem.read_slice(&mut buf[start..end], d.addr())
        .map_err(|source| ChainError::Memory {
            addr: d.addr().0,
            len: d.len(),
            source,
        })
}
