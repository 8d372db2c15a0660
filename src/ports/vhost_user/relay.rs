//! A message-level relay between QEMU and the vhost-user request handler.
//!
//! Why: QEMU's `-netdev vhost-user` sends VHOST_USER_SET_VRING_ENABLE as soon as the backend
//! offers VHOST_USER_F_PROTOCOL_FEATURES, before VHOST_USER_SET_FEATURES; the `vhost` crate
//! rejects that as an inactive feature and drops the connection. Not offering the bit makes
//! QEMU fall back to a path that silently loses traffic. The relay holds such early enables
//! back (acking them itself when the frontend asked for a reply) and replays them, in order,
//! right after SET_FEATURES. It also keeps SET_BACKEND_REQ_FD's channel for the port
//! (config_change.rs): vhost 0.18 cannot send a config change on it. Every other message,
//! with its file descriptors, passes through unchanged, so the released crates serve both
//! attachments unmodified. The data path does
//! not go through here: vrings live in shared memory and kicks/calls are eventfds.
//!
//! The relay is also the only place that sees when the frontend waits on the backend. QEMU
//! (8.2 on) enables the rings from the vCPU thread that wrote DRIVER_OK and does not let that
//! vCPU run on until each SET_VRING_ENABLE is acknowledged. So between a forwarded enable
//! and its acknowledgement the driver is stopped in its DRIVER_OK write, and whatever its
//! rings hold was posted before it. [`RelayWatch`] is told of both moments.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, warn};
use thiserror::Error;
use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, MAX_MSG_SIZE};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::memcheck::{self, FdError};
use super::policy::{request_name, Offer, Policy, PolicyError};

const HDR_LEN: usize = 12;
/// The largest body the vhost crate accepts (a config space or a memory table); anything
/// bigger is a broken peer.
const MAX_BODY: usize = MAX_MSG_SIZE;
/// Descriptors one message may carry (vhost 0.18's MAX_ATTACHED_FD_ENTRIES); the kernel
/// drops any beyond the buffer.
const MAX_FDS: usize = vhost::vhost_user::message::MAX_ATTACHED_FD_ENTRIES;

const REQ_SET_FEATURES: u32 = FrontendReq::SET_FEATURES as u32;
const REQ_SET_OWNER: u32 = FrontendReq::SET_OWNER as u32;
const REQ_SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
const REQ_SET_VRING_BASE: u32 = FrontendReq::SET_VRING_BASE as u32;
const REQ_SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
const REQ_SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
const REQ_SET_VRING_ERR: u32 = FrontendReq::SET_VRING_ERR as u32;
const REQ_SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;
const REQ_ADD_MEM_REG: u32 = FrontendReq::ADD_MEM_REG as u32;
const REQ_SET_BACKEND_REQ_FD: u32 = FrontendReq::SET_BACKEND_REQ_FD as u32;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = VhostUserHeaderFlag::REPLY.bits();
const FLAG_NEED_REPLY: u32 = VhostUserHeaderFlag::NEED_REPLY.bits();
/// SET_VRING_KICK/CALL/ERR: the ring index is the low byte of the body; this bit says no
/// descriptor comes with it (vhost-user spec, "Ring descriptors").
const VRING_NOFD: u64 = 1 << 8;

/// Told what the relay sees of the frontend that the request handler does not tell the
/// backend (see the module text).
pub trait RelayWatch: Send + Sync {
    /// The frontend asked to enable ring `index` and waits; called before the handler sees it.
    fn enabling(&self, index: u32);
    /// The handler has enabled ring `index`; called before the frontend gets the answer, so
    /// the guest is still stopped.
    fn enabled(&self, index: u32);
    /// The frontend programs ring `index` anew (SET_VRING_BASE, SET_VRING_KICK), before the
    /// handler sees it: whatever was wrong with the ring's old state is gone.
    fn ring_reset(&self, index: u32);
    /// The relay refused a message: answered with an error, or the connection ends.
    fn refused(&self, why: &RelayError);
    /// The frontend's channel for the port's own messages (SET_BACKEND_REQ_FD): the relay
    /// keeps it from the request handler, so the port is its only writer.
    fn backend_channel(&self, channel: UnixStream);
}

#[derive(Debug, Error)]
pub enum RelayError {
    #[error("socket I/O")]
    Io(#[source] io::Error),
    #[error("socket I/O")]
    Sys(#[source] vmm_sys_util::errno::Error),
    #[error("message body of {0} bytes exceeds {MAX_BODY}")]
    TooBig(usize),
    /// recvmsg's MSG_CTRUNC, which vmm-sys-util 0.15 reports as ENOBUFS (and closes what
    /// came): a memory table of more regions than vhost-user carries in one message, or a
    /// descriptor table with no room left (the kernel truncates then too).
    #[error("a message's descriptors were cut short: more than {MAX_FDS} came (a memory table of more regions than vhost-user allows), or this process has no room for them")]
    TooManyFds(#[source] vmm_sys_util::errno::Error),
    #[error("{} refused", request_name(*request))]
    Refused {
        request: u32,
        #[source]
        source: FdError,
    },
    #[error("spawning relay thread")]
    Spawn(#[source] io::Error),
    #[error("{} refused", request_name(*request))]
    Policy {
        request: u32,
        #[source]
        source: PolicyError,
    },
    #[error("the frontend did not claim the device (SET_OWNER) within {0:?} of connecting")]
    Handshake(Duration),
}

struct Msg {
    hdr: [u8; HDR_LEN],
    body: Vec<u8>,
    fds: Vec<File>,
}

/// The little-endian `N`-byte value at byte `at` of `b`, if `b` is long enough.
fn le<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

impl Msg {
    /// Word `i` (0-2) of the fixed 12-byte header.
    fn word(&self, i: usize) -> u32 {
        le(&self.hdr, 4 * i).map_or(0, u32::from_le_bytes)
    }

    fn request(&self) -> u32 {
        self.word(0)
    }

    fn flags(&self) -> u32 {
        self.word(1)
    }

    fn set_flags(&mut self, f: u32) {
        self.hdr[4..8].copy_from_slice(&f.to_le_bytes());
    }

    fn body_u64(&self) -> Option<u64> {
        le(&self.body, 0).map(u64::from_le_bytes)
    }

    /// The ring a SET_VRING_BASE / SET_VRING_KICK programs.
    fn ring_programmed(&self) -> Option<u32> {
        match self.request() {
            REQ_SET_VRING_BASE => le(&self.body, 0).map(u32::from_le_bytes),
            REQ_SET_VRING_KICK => self.body_u64().map(|v| (v & 0xff) as u32),
            _ => None,
        }
    }

    /// Checks the descriptors a message carries before anything maps or polls them
    /// (memcheck.rs).
    fn vet(&self) -> Result<(), RelayError> {
        let what = match self.request() {
            // Both bodies put their first region at byte 8 (after a count and padding, or
            // padding alone).
            REQ_SET_MEM_TABLE | REQ_ADD_MEM_REG => memcheck::check_regions(&self.body, 8, &self.fds),
            REQ_SET_BACKEND_REQ_FD => match self.fds.first() {
                Some(f) => memcheck::vet_socket(f),
                None => Err(FdError::NoChannel),
            },
            r @ (REQ_SET_VRING_KICK | REQ_SET_VRING_CALL | REQ_SET_VRING_ERR) => {
                let what = match r {
                    REQ_SET_VRING_KICK => "kick",
                    REQ_SET_VRING_CALL => "call",
                    _ => "error",
                };
                let nofd = self.body_u64().is_some_and(|v| v & VRING_NOFD != 0);
                match self.fds.first() {
                    Some(f) if !nofd => memcheck::vet_eventfd(f, what),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        };
        what.map_err(|source| RelayError::Refused {
            request: self.request(),
            source,
        })
    }

    /// The ring a SET_VRING_ENABLE turns on (`None` for a disable or a short body).
    fn enabled_ring(&self) -> Option<u32> {
        let word = |i: usize| le(&self.body, 4 * i).map(u32::from_le_bytes);
        (self.request() == REQ_SET_VRING_ENABLE && word(1)? == 1).then_some(word(0)?)
    }
}

/// How long a write on the backend channel may wait for the frontend to read.
pub const CHANNEL_WRITE: Duration = Duration::from_secs(1);

/// Ring index + 1 of the enable waiting for its acknowledgement; 0 for none.
type Awaiting = Arc<AtomicU64>;

/// Reads one message; `None` at a clean end of stream.
fn recv_msg(sock: &UnixStream) -> Result<Option<Msg>, RelayError> {
    let mut hdr = [0u8; HDR_LEN];
    let mut raw: [RawFd; MAX_FDS] = [-1; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: HDR_LEN,
    }];
    // SAFETY: the single iovec points at `hdr`, which is HDR_LEN bytes and outlives the call.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }.map_err(|e| match e.errno() {
        libc::ENOBUFS => RelayError::TooManyFds(e),
        _ => RelayError::Sys(e),
    })?;
    let fds = raw[..nfds]
        .iter()
        // SAFETY: recvmsg just installed these descriptors in our table; nothing else owns them.
        .map(|fd| unsafe { File::from_raw_fd(*fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    let mut s = sock;
    if n < HDR_LEN {
        s.read_exact(&mut hdr[n..]).map_err(RelayError::Io)?;
    }
    let size = le(&hdr, 8).map_or(0, u32::from_le_bytes) as usize;
    if size > MAX_BODY {
        return Err(RelayError::TooBig(size));
    }
    let mut body = vec![0u8; size];
    s.read_exact(&mut body).map_err(RelayError::Io)?;
    Ok(Some(Msg { hdr, body, fds }))
}

fn send_msg(sock: &UnixStream, m: &Msg) -> Result<(), RelayError> {
    let mut buf = Vec::with_capacity(HDR_LEN + m.body.len());
    buf.extend_from_slice(&m.hdr);
    buf.extend_from_slice(&m.body);
    let fds: Vec<RawFd> = m.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let n = sock.send_with_fds(&[&buf[..]], &fds).map_err(RelayError::Sys)?;
    if n < buf.len() {
        let mut s = sock;
        s.write_all(&buf[n..]).map_err(RelayError::Io)?;
    }
    Ok(())
}

/// A REPLY_ACK answer to `request`: 0 for success, anything else for failure.
fn ack(request: u32, status: u64) -> Msg {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..4].copy_from_slice(&request.to_le_bytes());
    hdr[4..8].copy_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
    hdr[8..12].copy_from_slice(&8u32.to_le_bytes());
    Msg {
        hdr,
        body: status.to_le_bytes().to_vec(),
        fds: Vec::new(),
    }
}

/// What one connection is held to: the port's offer (policy.rs) and how long the frontend
/// has to claim the device after it connects (`None`: no limit).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub offer: Offer,
    pub handshake: Option<Duration>,
}

/// The running relay of one connection.
pub struct Relay {
    frontend: UnixStream,
    backend: UnixStream,
    threads: Vec<JoinHandle<()>>,
    /// The last request handed to the handler, plus one (0: none yet).
    last: Arc<AtomicU32>,
}

impl Relay {
    /// Starts relaying between `frontend` (QEMU) and `backend` (the request handler).
    pub fn spawn(
        name: &str,
        frontend: UnixStream,
        backend: UnixStream,
        watch: Arc<dyn RelayWatch>,
        limits: Limits,
    ) -> Result<Relay, RelayError> {
        let awaiting: Awaiting = Arc::default();
        let last: Arc<AtomicU32> = Arc::default();
        let (awaiting2, watch2, last2) = (awaiting.clone(), watch.clone(), last.clone());
        let fe_writer = Arc::new(Mutex::new(frontend.try_clone().map_err(RelayError::Io)?));
        let (fe_r, be_w) = (
            frontend.try_clone().map_err(RelayError::Io)?,
            backend.try_clone().map_err(RelayError::Io)?,
        );
        let (be_r, fe_r2, be_w2) = (
            backend.try_clone().map_err(RelayError::Io)?,
            frontend.try_clone().map_err(RelayError::Io)?,
            backend.try_clone().map_err(RelayError::Io)?,
        );
        let fe_w2 = fe_writer.clone();
        let label = name.to_string();
        let down = thread::Builder::new()
            .name(format!("{name}-relay-fe"))
            .spawn(move || {
                let mut down = Down {
                    fe: &fe_r,
                    be: &be_w,
                    fe_writer: &fe_writer,
                    awaiting: &awaiting,
                    last: &last2,
                    watch: &*watch,
                    policy: Policy::new(limits.offer),
                    features_set: false,
                    held: (0..limits.offer.queues).map(|_| None).collect(),
                    handshake: limits.handshake.map(|d| (Instant::now() + d, d)),
                    refusals: 0,
                };
                if let Err(e) = down.run() {
                    debug!("{label}: frontend relay ended: {e}");
                }
                let _ = fe_r.shutdown(Shutdown::Both);
                let _ = be_w.shutdown(Shutdown::Both);
            })
            .map_err(RelayError::Spawn)?;
        let label = name.to_string();
        let up = thread::Builder::new()
            .name(format!("{name}-relay-be"))
            .spawn(move || {
                let r = (|| -> Result<(), RelayError> {
                    while let Some(m) = recv_msg(&be_r)? {
                        if m.request() == REQ_SET_VRING_ENABLE && m.flags() & FLAG_REPLY != 0 {
                            if let Some(i) = awaiting2.swap(0, Ordering::AcqRel).checked_sub(1) {
                                watch2.enabled(i as u32);
                            }
                        }
                        let w = crate::sync::lock(&fe_w2);
                        send_msg(&w, &m)?;
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    debug!("{label}: backend relay ended: {e}");
                }
                let _ = fe_r2.shutdown(Shutdown::Both);
                let _ = be_w2.shutdown(Shutdown::Both);
            })
            .map_err(RelayError::Spawn)?;
        Ok(Relay {
            frontend,
            backend,
            threads: vec![down, up],
            last,
        })
    }

    /// The last request the frontend sent that reached the request handler: the one it
    /// refused, or one the frontend sent after it without waiting for the answer.
    pub fn last_request(&self) -> Option<u32> {
        self.last.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Closes both sides and waits for the relay threads.
    pub fn stop(mut self) {
        let _ = self.frontend.shutdown(Shutdown::Both);
        let _ = self.backend.shutdown(Shutdown::Both);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                warn!("vhost-user relay thread panicked");
            }
        }
    }
}

/// Refusals a connection may earn before it is ended, even for requests that could be
/// answered with a failure: a frontend that goes on asking for what it was refused is
/// broken or hostile, and each answer costs the daemon a message.
const MAX_REFUSALS: u32 = 16;

/// The frontend-to-handler direction of one connection: what it has negotiated, the
/// enables it holds back, and where it stands against its limits.
struct Down<'a> {
    fe: &'a UnixStream,
    be: &'a UnixStream,
    fe_writer: &'a Mutex<UnixStream>,
    awaiting: &'a AtomicU64,
    last: &'a AtomicU32,
    watch: &'a dyn RelayWatch,
    policy: Policy,
    features_set: bool,
    /// SET_VRING_ENABLE received before SET_FEATURES, the last one per queue.
    held: Vec<Option<Msg>>,
    /// Still within the handshake: the frontend has until the deadline (and how long it
    /// was given) to claim the device (SET_OWNER), which QEMU and DPDK do right after they
    /// connect. Messages before it do not extend it.
    handshake: Option<(Instant, Duration)>,
    refusals: u32,
}

impl Down<'_> {
    fn run(&mut self) -> Result<(), RelayError> {
        loop {
            if let Some((deadline, given)) = self.handshake {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let e = RelayError::Handshake(given);
                    self.watch.refused(&e);
                    return Err(e);
                }
                self.fe.set_read_timeout(Some(left)).map_err(RelayError::Io)?;
            }
            let m = match recv_msg(self.fe) {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    let e = self.timed_out(e);
                    if matches!(
                        e,
                        RelayError::TooBig(_) | RelayError::TooManyFds(_) | RelayError::Handshake(_)
                    ) {
                        self.watch.refused(&e);
                    }
                    return Err(e);
                }
            };
            self.one(m)?;
        }
    }

    /// A read that timed out within the handshake is the handshake's end.
    fn timed_out(&self, e: RelayError) -> RelayError {
        match (&e, self.handshake) {
            (RelayError::Sys(errno), Some((_, given))) if errno.errno() == libc::EAGAIN => {
                RelayError::Handshake(given)
            }
            // Within a message: the header came, the rest did not.
            (RelayError::Io(io), Some((_, given))) if io.kind() == io::ErrorKind::WouldBlock => {
                RelayError::Handshake(given)
            }
            _ => e,
        }
    }

    /// Passes one message on, holds it, or refuses it.
    fn one(&mut self, mut m: Msg) -> Result<(), RelayError> {
        let req = m.request();
        if let Err(e) = self
            .policy
            .check(req, &m.body)
            .map_err(|source| RelayError::Policy { request: req, source })
        {
            return self.refuse(&m, e);
        }
        if let Err(e) = m.vet() {
            return self.refuse(&m, e);
        }
        if req == REQ_SET_OWNER && self.handshake.take().is_some() {
            self.fe.set_read_timeout(None).map_err(RelayError::Io)?;
        }
        if !self.features_set && req == REQ_SET_VRING_ENABLE {
            return self.hold(m);
        }
        if req == REQ_SET_BACKEND_REQ_FD {
            return self.keep_channel(m);
        }
        if let Some(i) = m.ring_programmed() {
            self.watch.ring_reset(i);
        }
        // Only an enable the frontend waits on marks a moment the guest is stopped; a held
        // one is acked by the relay itself and tells nothing. Without REPLY_ACK the handler
        // would never answer, and the control thread would wait for nothing.
        if self.policy.reply_ack() && m.flags() & FLAG_NEED_REPLY != 0 {
            if let Some(i) = m.enabled_ring() {
                self.watch.enabling(i);
                self.awaiting.store(u64::from(i) + 1, Ordering::Release);
            }
        }
        self.last.store(req.saturating_add(1), Ordering::Relaxed);
        send_msg(self.be, &m)?;
        if req == REQ_SET_FEATURES && !self.features_set {
            self.features_set = true;
            for h in self.held.iter_mut().filter_map(Option::take) {
                send_msg(self.be, &h)?;
            }
        }
        m.fds.clear();
        Ok(())
    }

    /// SET_BACKEND_REQ_FD: its socket goes to the port, with a write timeout; the request
    /// handler never sees it. Acked here if the frontend waits.
    fn keep_channel(&mut self, mut m: Msg) -> Result<(), RelayError> {
        if let Some(f) = m.fds.pop() {
            let channel = UnixStream::from(std::os::fd::OwnedFd::from(f));
            channel
                .set_write_timeout(Some(CHANNEL_WRITE))
                .map_err(RelayError::Io)?;
            self.watch.backend_channel(channel);
        }
        if m.flags() & FLAG_NEED_REPLY != 0 && self.policy.reply_ack() {
            let w = crate::sync::lock(self.fe_writer);
            send_msg(&w, &ack(m.request(), 0))?;
        }
        Ok(())
    }

    /// An enable before SET_FEATURES: acked here if the frontend waits, and kept until
    /// SET_FEATURES, the last one per queue (the policy checked the index).
    fn hold(&mut self, mut m: Msg) -> Result<(), RelayError> {
        if m.flags() & FLAG_NEED_REPLY != 0 {
            let w = crate::sync::lock(self.fe_writer);
            send_msg(&w, &ack(m.request(), 0))?;
            m.set_flags(m.flags() & !FLAG_NEED_REPLY);
        }
        debug!("holding SET_VRING_ENABLE until SET_FEATURES");
        if let Some(slot) = le::<4>(&m.body, 0)
            .map(u32::from_le_bytes)
            .and_then(|i| self.held.get_mut(i as usize))
        {
            *slot = Some(m);
        }
        Ok(())
    }

    /// Counts and logs a refused message; answers it with a failure if the frontend waits
    /// for an answer (and may be given one), else ends the connection. The handler never
    /// sees it, and its descriptors are closed here.
    fn refuse(&mut self, m: &Msg, e: RelayError) -> Result<(), RelayError> {
        self.watch.refused(&e);
        self.refusals += 1;
        let answerable = self
            .policy
            .may_fail_ack(m.request(), m.flags() & FLAG_NEED_REPLY != 0);
        if !answerable || self.refusals > MAX_REFUSALS {
            return Err(e);
        }
        let w = crate::sync::lock(self.fe_writer);
        send_msg(&w, &ack(m.request(), 1))
    }
}

/// The relay's message reader on bytes a frontend may send, for `fuzz/` (target `relay`):
/// writes `input` into a socket, reads messages from it until the stream ends or a message
/// is refused, and looks at each as the relay does. Returns how many messages were read.
#[doc(hidden)]
pub fn read_all(input: &[u8]) -> Result<usize, RelayError> {
    let (mut tx, rx) = UnixStream::pair().map_err(RelayError::Io)?;
    // Inputs are small (the fuzzer's at most 4 KiB fit a socket buffer): no writer thread.
    tx.write_all(input).map_err(RelayError::Io)?;
    drop(tx);
    let mut policy = Policy::new(Offer {
        features: !0,
        protocol: super::policy::PROTOCOL.bits(),
        queues: 3,
        max_ring: 1024,
    });
    let mut n = 0;
    while let Some(m) = recv_msg(&rx)? {
        assert!(m.body.len() <= MAX_BODY);
        let _ = (m.flags(), m.ring_programmed(), m.enabled_ring());
        let _ = policy.check(m.request(), &m.body);
        let _ = policy.may_fail_ack(m.request(), true);
        m.vet()?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost::vhost_user::message::VhostUserProtocolFeatures;

    const REQ_SET_PROTOCOL_FEATURES: u32 = FrontendReq::SET_PROTOCOL_FEATURES as u32;
    /// Without it the handler answers no NEED_REPLY.
    const PROTOCOL_F_REPLY_ACK: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits();

    /// A port's offer with every virtio feature, MQ, REPLY_ACK and CONFIG, eight queues.
    fn limits() -> Limits {
        Limits {
            offer: Offer {
                features: !0,
                protocol: crate::ports::vhost_user::policy::PROTOCOL.bits(),
                queues: 8,
                max_ring: 1024,
            },
            handshake: None,
        }
    }

    fn msg(req: u32, flags: u32, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&req.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(body);
        v
    }

    fn read_msg(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
        let m = recv_msg(s).unwrap().unwrap();
        (m.request(), m.flags(), m.body)
    }

    /// Records what the relay told it, in order.
    #[derive(Default)]
    struct Log(Mutex<Vec<(&'static str, u32)>>, Mutex<Option<UnixStream>>);

    impl RelayWatch for Log {
        fn enabling(&self, index: u32) {
            self.0.lock().unwrap().push(("enabling", index));
        }
        fn enabled(&self, index: u32) {
            self.0.lock().unwrap().push(("enabled", index));
        }
        fn ring_reset(&self, index: u32) {
            self.0.lock().unwrap().push(("reset", index));
        }
        fn refused(&self, why: &RelayError) {
            let request = match why {
                RelayError::Refused { request, .. } => *request,
                _ => 0,
            };
            self.0.lock().unwrap().push(("refused", request));
        }
        fn backend_channel(&self, channel: UnixStream) {
            self.0.lock().unwrap().push(("channel", 0));
            *self.1.lock().unwrap() = Some(channel);
        }
    }

    impl Log {
        fn seen(&self) -> Vec<(&'static str, u32)> {
            self.0.lock().unwrap().clone()
        }
    }

    fn state(index: u32, num: u32) -> Vec<u8> {
        [index.to_le_bytes(), num.to_le_bytes()].concat()
    }

    #[test]
    fn an_enable_the_frontend_waits_on_is_reported_on_both_sides_of_the_handler() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let log = Arc::new(Log::default());
        let relay = Relay::spawn("t", fe, be, log.clone(), limits()).unwrap();
        qemu.write_all(&msg(REQ_SET_FEATURES, 1, &[0; 8])).unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_FEATURES);
        // Before REPLY_ACK is negotiated the handler answers nothing: no wait to report.
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &state(2, 1)))
            .unwrap();
        assert_eq!(read_msg(&mut handler).2, state(2, 1));
        assert!(log.seen().is_empty());
        let reply_ack = PROTOCOL_F_REPLY_ACK.to_le_bytes();
        qemu.write_all(&msg(REQ_SET_PROTOCOL_FEATURES, 1, &reply_ack))
            .unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_PROTOCOL_FEATURES);
        // Neither a disable nor an enable nobody waits on is a moment the guest is stopped.
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &state(2, 0)))
            .unwrap();
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1, &state(2, 1)))
            .unwrap();
        assert_eq!(read_msg(&mut handler).2, state(2, 0));
        assert_eq!(read_msg(&mut handler).2, state(2, 1));
        assert!(log.seen().is_empty());

        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &state(2, 1)))
            .unwrap();
        assert_eq!(read_msg(&mut handler).2, state(2, 1));
        // Told before the handler could act on it.
        assert_eq!(log.seen(), [("enabling", 2)]);
        handler
            .write_all(&msg(REQ_SET_VRING_ENABLE, FLAG_VERSION | FLAG_REPLY, &[0; 8]))
            .unwrap();
        assert_eq!(read_msg(&mut qemu).0, REQ_SET_VRING_ENABLE);
        // ... and again before the frontend had the answer.
        assert_eq!(log.seen(), [("enabling", 2), ("enabled", 2)]);
        // A short body is refused with a failure: the handler never sees it.
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &[1, 0]))
            .unwrap();
        assert_eq!(
            read_msg(&mut qemu),
            (
                REQ_SET_VRING_ENABLE,
                FLAG_VERSION | FLAG_REPLY,
                1u64.to_le_bytes().to_vec()
            )
        );
        assert_eq!(log.seen()[2..], [("refused", 0)]);
        relay.stop();
    }

    /// SET_BACKEND_REQ_FD's socket goes to the port, acked by the relay, and the handler
    /// never sees it; what is not a socket is refused.
    #[test]
    fn the_backend_channel_is_kept_for_the_port() {
        let (qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let log = Arc::new(Log::default());
        let relay = Relay::spawn("t", fe, be, log.clone(), limits()).unwrap();
        let mut q = &qemu;
        let protocol = crate::ports::vhost_user::policy::PROTOCOL.bits().to_le_bytes();
        q.write_all(&msg(REQ_SET_PROTOCOL_FEATURES, 1, &protocol))
            .unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_PROTOCOL_FEATURES);
        let (mut frontend_end, port_end) = UnixStream::pair().unwrap();
        let m = msg(REQ_SET_BACKEND_REQ_FD, 1 | FLAG_NEED_REPLY, &[]);
        qemu.send_with_fds(&[&m[..]], &[port_end.as_raw_fd()]).unwrap();
        drop(port_end);
        let mut answer = qemu.try_clone().unwrap();
        assert_eq!(
            read_msg(&mut answer),
            (REQ_SET_BACKEND_REQ_FD, FLAG_VERSION | FLAG_REPLY, vec![0; 8])
        );
        assert_eq!(log.seen(), [("channel", 0)]);
        let mut channel = log.1.lock().unwrap().take().unwrap();
        channel.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        frontend_end.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // An eventfd is no channel: refused with a failure, and still the handler sees
        // nothing.
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        qemu.send_with_fds(&[&m[..]], &[efd.as_raw_fd()]).unwrap();
        assert_eq!(read_msg(&mut answer).2, 1u64.to_le_bytes().to_vec());
        assert_eq!(log.seen()[1], ("refused", REQ_SET_BACKEND_REQ_FD));
        q.write_all(&msg(REQ_SET_FEATURES, 1, &[0; 8])).unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_FEATURES);
        relay.stop();
    }

    #[test]
    fn early_vring_enable_is_held_until_set_features() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default()), limits()).unwrap();
        let enable = [0u8, 0, 0, 0, 1, 0, 0, 0];
        qemu.write_all(&msg(1, 1, &[])).unwrap(); // GET_FEATURES
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &enable))
            .unwrap();
        // The relay acks the held message itself.
        assert_eq!(
            read_msg(&mut qemu),
            (REQ_SET_VRING_ENABLE, FLAG_VERSION | FLAG_REPLY, vec![0; 8])
        );
        qemu.write_all(&msg(REQ_SET_FEATURES, 1, &[0; 8])).unwrap();
        assert_eq!(read_msg(&mut handler).0, 1);
        assert_eq!(read_msg(&mut handler).0, REQ_SET_FEATURES);
        // Replayed after SET_FEATURES, without NEED_REPLY so the handler does not answer it.
        assert_eq!(read_msg(&mut handler), (REQ_SET_VRING_ENABLE, 1, enable.to_vec()));
        // Replies flow back.
        handler.write_all(&msg(1, 5, &[7; 8])).unwrap();
        assert_eq!(read_msg(&mut qemu), (1, 5, vec![7; 8]));
        // Later enables pass straight through.
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1, &enable)).unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_VRING_ENABLE);
        drop(qemu);
        assert!(recv_msg(&handler).unwrap().is_none());
        relay.stop();
    }

    #[test]
    fn file_descriptors_pass_through() {
        let (qemu, fe) = UnixStream::pair().unwrap();
        let (be, handler) = UnixStream::pair().unwrap();
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default()), limits()).unwrap();
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x1000).unwrap();
        let m = msg(REQ_SET_MEM_TABLE, 1, &mem_table(0x1000));
        qemu.send_with_fds(&[&m[..]], &[f.as_raw_fd()]).unwrap();
        let m = recv_msg(&handler).unwrap().unwrap();
        assert_eq!((m.request(), m.fds.len()), (REQ_SET_MEM_TABLE, 1));
        relay.stop();
    }

    fn mem_table(size: u64) -> Vec<u8> {
        let mut b = vec![1u8, 0, 0, 0, 0, 0, 0, 0];
        for v in [0u64, size, 0x7f00_0000_0000, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn a_region_past_its_file_is_refused_and_never_reaches_the_handler() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let log = Arc::new(Log::default());
        let relay = Relay::spawn("t", fe, be, log.clone(), limits()).unwrap();
        let reply_ack = PROTOCOL_F_REPLY_ACK.to_le_bytes();
        qemu.write_all(&msg(REQ_SET_PROTOCOL_FEATURES, 1, &reply_ack))
            .unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_PROTOCOL_FEATURES);
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x1000).unwrap();
        // Waiting for an answer: it is a failure, and the handler never hears of it.
        let m = msg(REQ_SET_MEM_TABLE, 1 | FLAG_NEED_REPLY, &mem_table(0x2000));
        qemu.send_with_fds(&[&m[..]], &[f.as_raw_fd()]).unwrap();
        assert_eq!(
            read_msg(&mut qemu),
            (
                REQ_SET_MEM_TABLE,
                FLAG_VERSION | FLAG_REPLY,
                1u64.to_le_bytes().to_vec()
            )
        );
        // One that fits passes.
        let m = msg(REQ_SET_MEM_TABLE, 1, &mem_table(0x1000));
        qemu.send_with_fds(&[&m[..]], &[f.as_raw_fd()]).unwrap();
        let got = recv_msg(&handler).unwrap().unwrap();
        assert_eq!((got.request(), got.fds.len()), (REQ_SET_MEM_TABLE, 1));
        assert_eq!(log.seen(), [("refused", REQ_SET_MEM_TABLE)]);
        // Not waiting for an answer: the connection ends.
        let m = msg(REQ_SET_VRING_CALL, 1, &0u64.to_le_bytes());
        qemu.send_with_fds(&[&m[..]], &[f.as_raw_fd()]).unwrap();
        assert!(recv_msg(&handler).unwrap().is_none());
        assert_eq!(log.seen().last(), Some(&("refused", REQ_SET_VRING_CALL)));
        relay.stop();
    }

    #[test]
    fn programming_a_ring_is_reported_before_the_handler_sees_it() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let log = Arc::new(Log::default());
        let relay = Relay::spawn("t", fe, be, log.clone(), limits()).unwrap();
        qemu.write_all(&msg(REQ_SET_VRING_BASE, 1, &state(3, 0))).unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_VRING_BASE);
        assert_eq!(log.seen(), [("reset", 3)]);
        // A kick without a descriptor (polling mode) is a reset too, and needs no eventfd.
        qemu.write_all(&msg(REQ_SET_VRING_KICK, 1, &(VRING_NOFD | 1).to_le_bytes()))
            .unwrap();
        assert_eq!(read_msg(&mut handler).0, REQ_SET_VRING_KICK);
        assert_eq!(log.seen(), [("reset", 3), ("reset", 1)]);
        relay.stop();
    }

    #[test]
    fn oversized_message_ends_the_relay() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, handler) = UnixStream::pair().unwrap();
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default()), limits()).unwrap();
        let mut m = msg(5, 1, &[]);
        m[8..12].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        qemu.write_all(&m).unwrap();
        assert!(recv_msg(&handler).unwrap().is_none());
        relay.stop();
    }
}
