//! One frontend connection as vhost-user-backend serves it: the [`VhostUserBackend`] that
//! lays the queues out over worker threads, offers features and config space, and hands
//! each event to the TX side (tx.rs) or the control queue (ctrl_queue.rs).

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use log::{debug, info, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringT};
use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::budget::{Burst, Mode};
use super::ctrl_queue::{fresh_start, CtrlGate, CtrlQueue, CtrlWorker};
use super::guest_port::GuestPort;
use super::health::BrokenRings;
use super::policy;
use super::relay::{RelayError, RelayWatch};
use super::rx::queue_usable;
use super::sigbus::MemOwner;
use super::split_ring::{Mem, RingError, Vring};
use super::tx::{TxQueue, TxWorker};
use crate::device::config_space;
use crate::device::features::{self, Negotiated};
use crate::logging::error_chain;
use crate::pipeline::Switch;
use crate::ports::poll::{PollQueue, Polled};
use crate::stats::TallyHandle;

/// Descriptors a ring may hold (VIRTQUEUE_MAX_SIZE of virtio 1.2 is 32768; QEMU's
/// virtio-net and the test device use 256 and 64 by default).
const QUEUE_SIZE: usize = 1024;

/// What one worker thread owns; only that thread locks it, so the lock is never contended.
struct Worker {
    /// This thread's counters (registered with the switch, summed on read, folded into the
    /// port's totals when the connection ends).
    tally: TallyHandle,
    tx: TxWorker,
    ctrl: CtrlWorker,
}

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
    /// Poll mode: each pair's TX vring, for the poll thread that serves it.
    tx_vrings: Vec<OnceLock<Vring>>,
    ctrl_gate: CtrlGate,
    /// What each worker thread owns, by thread index.
    workers: Vec<Mutex<Worker>>,
    /// Queues the driver broke; also in the published receive path.
    broken: Arc<BrokenRings>,
    /// The reading ends of the worker threads' exit events. vhost-user-backend 0.24 takes
    /// each with `into_raw_fd` and never closes it (event_loop.rs, `VringEpollHandler::new`),
    /// so the session closes them when it ends, after every worker has been joined.
    exit_fds: Mutex<Vec<RawFd>>,
    /// Each worker thread's exit event, made with the session so that running out of
    /// descriptors fails the connection here: a worker the handler starts without one
    /// could never be stopped, and joining it would hang the port.
    exits: Mutex<Vec<Option<(EventConsumer, EventNotifier)>>>,
    /// A second writing end of each exit event, for [`VnicBackend::stop_workers`].
    exit_notifiers: Vec<EventNotifier>,
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

/// The backend of one connection; clones share the session.
#[derive(Clone)]
pub(super) struct VnicBackend(Arc<Session>);

/// What a queue index means for the negotiated features.
enum Role {
    Rx,
    Tx(usize),
    Ctrl,
}

impl VnicBackend {
    pub fn new(port: Arc<GuestPort>, mem: Mem, frontend: UnixStream) -> io::Result<Self> {
        let switch = port
            .switch()
            .ok_or_else(|| io::Error::other("the daemon is stopping"))?;
        let threads = usize::from(port.queue_pairs) + 1;
        let events = || {
            (0..threads)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<io::Result<Vec<_>>>()
        };
        let (attach, again) = (events()?, events()?);
        let mut exits = Vec::with_capacity(threads);
        let mut exit_notifiers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (consumer, notifier) =
                new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?;
            exit_notifiers.push(notifier.try_clone()?);
            exits.push(Some((consumer, notifier)));
        }
        let workers = (0..threads)
            .map(|_| {
                Mutex::new(Worker {
                    tally: port.register_tally(),
                    tx: TxWorker::default(),
                    ctrl: CtrlWorker::default(),
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
            exits: Mutex::new(exits),
            exit_notifiers,
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

    pub fn attach_event(&self, thread: usize) -> RawFd {
        self.0.attach[thread].as_raw_fd()
    }

    /// Listener ids above num_queues are ours (vhost-user-backend reserves 0..=num_queues).
    pub fn attach_event_id(&self) -> u64 {
        self.num_queues() as u64 + 1
    }

    /// Tells every worker thread the handler started to end. For when the handler failed
    /// before it could own them: vhost-user-backend 0.24 (`VhostUserHandler::new`) drops
    /// the threads it already started when a later one fails, and only an exit event
    /// reaches them.
    pub fn stop_workers(&self) {
        for n in &self.0.exit_notifiers {
            if let Err(e) = n.notify() {
                warn!("port {}: stopping a worker: {e}", self.0.port.id);
            }
        }
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

    /// Records a thread's vrings (once); publishes the receive path once every pair has
    /// reported, and hands a pair's TX queue to a poll thread in poll mode.
    fn capture(&self, thread: usize, vrings: &[Vring]) {
        let s = &self.0;
        let mut cap = crate::sync::lock(&s.captured);
        let first = self.global(thread, 0);
        if cap.get(first).is_none_or(Option::is_some) {
            return;
        }
        for (slot, v) in cap.iter_mut().skip(first).zip(vrings) {
            *slot = Some(v.clone());
        }
        if let (Some(group), Some(tx), true) = (&s.port.poll, vrings.get(1), thread < self.pairs()) {
            if s.tx_vrings[thread].set(tx.clone()).is_ok() {
                let me: Weak<dyn PollQueue> = Arc::downgrade(&self.0) as Weak<dyn PollQueue>;
                let t = group.add(me, thread);
                debug!("port {}: tx queue {thread} served by poll thread {t}", s.port.id);
            }
        }
        let rx: Option<Vec<Vring>> = cap.iter().step_by(2).take(self.pairs()).cloned().collect();
        if let (true, Some(all)) = (thread < self.pairs(), rx) {
            s.port.publish_rings(all, s.mem.clone(), s.broken.clone());
            debug!("port {}: rx path ready ({} queue pairs)", s.port.id, self.pairs());
        }
    }

    /// One TX burst of pair `pair`, on worker `thread`'s own buffers and counters.
    fn tx_burst(&self, pair: usize, vring: &Vring, thread: usize, mode: Mode) -> Result<Burst, RingError> {
        let s = &self.0;
        let mut worker = crate::sync::lock(&s.workers[thread]);
        let Worker { tally, tx, .. } = &mut *worker;
        let queue = TxQueue {
            port: &s.port,
            switch: &s.switch,
            mem: &s.mem,
            feat: self.negotiated(),
            pair,
            tally,
        };
        tx.burst(&queue, vring, mode)
    }

    /// Serves TX queue `pair` after a kick. A queue the driver broke is left alone; a poll
    /// thread serves the queue in poll mode (a kick the driver sent before it saw
    /// NO_NOTIFY is already read).
    fn process_tx(&self, pair: usize, vring: &Vring, thread: usize) -> io::Result<()> {
        let index = 2 * pair + 1;
        if self.0.broken.is(index) || self.0.port.poll.is_some() {
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
                self.0.port.health.ring_broken(&self.0.broken, index, &e);
                Polled::Idle
            }
        }
    }

    /// Serves the control queue on worker `thread`; `kicked`: woken for it.
    fn process_ctrl(&self, vring: &Vring, thread: usize, kicked: bool) -> io::Result<()> {
        let s = &self.0;
        let feat = self.negotiated();
        let index = feat.ctrl_queue_index(s.port.queue_pairs);
        if s.broken.is(index) {
            return Ok(());
        }
        let queue = CtrlQueue {
            port: &s.port,
            mem: &s.mem,
            gate: &s.ctrl_gate,
            feat,
        };
        let burst = queue.burst(vring, &mut crate::sync::lock(&s.workers[thread]).ctrl, kicked);
        match burst {
            Some(b) => self.after_burst(thread, index, b),
            None => Ok(()),
        }
    }

    /// After the control ring was (re)started: serves what it holds, on its own thread.
    fn resume_ctrl(&self, thread: usize, vrings: &[Vring]) -> io::Result<()> {
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

    /// What follows a burst on queue `index` of worker `thread`: nothing, a later round
    /// (the budget ran out), or the queue marked broken.
    fn after_burst(&self, thread: usize, index: usize, burst: Result<Burst, RingError>) -> io::Result<()> {
        match burst {
            Ok(Burst::Done | Burst::Empty) => Ok(()),
            // Comes back to the thread's rings once its event loop has looked at its other
            // events.
            Ok(Burst::More) => self.0.again[thread].write(1),
            Err(e) => {
                self.0.port.health.ring_broken(&self.0.broken, index, &e);
                Ok(())
            }
        }
    }

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
                    self.0
                        .port
                        .health
                        .ring_broken(&self.0.broken, global, &RingError(e));
                }
                Ok(())
            }
            Role::Rx => Ok(()),
            Role::Tx(pair) => self.process_tx(pair, vring, thread),
            Role::Ctrl => self.process_ctrl(vring, thread, kicked),
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
        policy::PROTOCOL
    }

    fn reset_device(&self) {
        self.0.port.reset();
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let port = &self.0.port;
        if let Some(advice) = config_space::short_read_advice(offset, size) {
            if port.health.may_warn() {
                warn!("port {}: {advice}", port.id);
            }
        }
        port.config_now().read(offset, size)
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

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let pair = crate::sync::lock(&self.0.exits).get_mut(thread_index)?.take()?;
        // Closed by the session once the workers are gone (see `Session::exit_fds`).
        crate::sync::lock(&self.0.exit_fds).push(pair.0.as_raw_fd());
        Some(pair)
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
        port.health.stats.memory_faults.inc();
        warn!(
            "port {}: guest memory at {addr:#x} is gone (its file shrank after it was mapped); ending the connection",
            port.id
        );
        let _ = self.frontend.shutdown(Shutdown::Both);
    }
}

/// The relay's view of ring starts: an acknowledged enable is the moment the guest's
/// DRIVER_OK is known (relay.rs says why); and of the rings it programs and the messages it
/// refuses.
impl RelayWatch for VnicBackend {
    /// The frontend is enabling ring `index` and waits for the answer.
    fn enabling(&self, index: u32) {
        let i = index as usize;
        // The control queue's index depends on whether MQ was acked; either candidate closes
        // the gate, and `enabled` reopens it.
        if i == 2 || i == 2 * self.pairs() {
            self.0.ctrl_gate.close();
        }
    }

    /// Ring `index` is enabled: the driver has set DRIVER_OK.
    fn enabled(&self, index: u32) {
        let s = &self.0;
        let feat = self.negotiated();
        let ctrl = feat.ctrl_vq() && index as usize == feat.ctrl_queue_index(s.port.queue_pairs);
        if ctrl {
            let vring = crate::sync::lock(&s.captured)
                .get(index as usize)
                .cloned()
                .flatten();
            let fresh = vring.and_then(|v| fresh_start(&v, &s.mem));
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

    fn ring_reset(&self, index: u32) {
        self.0.broken.clear(index as usize);
    }

    fn refused(&self, why: &RelayError) {
        let port = &self.0.port;
        port.health.stats.frontend_refused.inc();
        if port.health.may_warn() {
            warn!("port {}: frontend message refused: {}", port.id, error_chain(why));
        }
    }

    /// The frontend's channel for config changes (`ctl link`, `ctl announce`).
    fn backend_channel(&self, channel: UnixStream) {
        debug!(
            "port {}: the frontend gave a channel for config changes",
            self.0.port.id
        );
        self.0.port.set_backend_channel(channel);
    }
}
