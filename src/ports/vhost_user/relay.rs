//! A message-level relay between QEMU and the vhost-user request handler.
//!
//! Why: QEMU's `-netdev vhost-user` sends VHOST_USER_SET_VRING_ENABLE as soon as the backend
//! offers VHOST_USER_F_PROTOCOL_FEATURES, before VHOST_USER_SET_FEATURES; the `vhost` crate
//! rejects that as an inactive feature and drops the connection. Not offering the bit makes
//! QEMU fall back to a path that silently loses traffic. The relay holds such early enables
//! back (acking them itself when the frontend asked for a reply) and replays them, in order,
//! right after SET_FEATURES. Every other message, with its file descriptors, passes through
//! unchanged, so the released crates serve both attachments unmodified. The data path does
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

use log::{debug, warn};
use thiserror::Error;
use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures, MAX_MSG_SIZE};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::memcheck::{self, FdError};

const HDR_LEN: usize = 12;
/// The largest body the vhost crate accepts (a config space or a memory table); anything
/// bigger is a broken peer.
const MAX_BODY: usize = MAX_MSG_SIZE;
/// Descriptors one message may carry (vhost 0.18's MAX_ATTACHED_FD_ENTRIES); the kernel
/// drops any beyond the buffer.
const MAX_FDS: usize = vhost::vhost_user::message::MAX_ATTACHED_FD_ENTRIES;

const REQ_SET_FEATURES: u32 = FrontendReq::SET_FEATURES as u32;
const REQ_SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
const REQ_SET_VRING_BASE: u32 = FrontendReq::SET_VRING_BASE as u32;
const REQ_SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
const REQ_SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
const REQ_SET_VRING_ERR: u32 = FrontendReq::SET_VRING_ERR as u32;
const REQ_SET_PROTOCOL_FEATURES: u32 = FrontendReq::SET_PROTOCOL_FEATURES as u32;
const REQ_SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;
const REQ_ADD_MEM_REG: u32 = FrontendReq::ADD_MEM_REG as u32;
/// Without it the handler answers no NEED_REPLY.
const PROTOCOL_F_REPLY_ACK: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits();
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
    /// came): a memory table of more regions than vhost-user carries in one message.
    #[error("a message came with more than {MAX_FDS} descriptors (a memory table of more regions than vhost-user allows)")]
    TooManyFds(#[source] vmm_sys_util::errno::Error),
    #[error("{} refused", request_name(*request))]
    Refused {
        request: u32,
        #[source]
        source: FdError,
    },
    #[error("spawning relay thread")]
    Spawn(#[source] io::Error),
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

/// A request's name as vhost-user spells it (`SET_MEM_TABLE`), or its number.
pub fn request_name(code: u32) -> String {
    match FrontendReq::try_from(code) {
        Ok(r) => format!("{r:?}"),
        Err(_) => format!("request {code}"),
    }
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
                if let Err(e) = frontend_to_backend(&fe_r, &be_w, &fe_writer, &awaiting, &last2, &*watch) {
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

fn frontend_to_backend(
    fe: &UnixStream,
    be: &UnixStream,
    fe_writer: &Mutex<UnixStream>,
    awaiting: &AtomicU64,
    last: &AtomicU32,
    watch: &dyn RelayWatch,
) -> Result<(), RelayError> {
    let mut features_set = false;
    let mut reply_ack = false;
    let mut held: Vec<Msg> = Vec::new();
    loop {
        let mut m = match recv_msg(fe) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) => {
                if matches!(e, RelayError::TooBig(_) | RelayError::TooManyFds(_)) {
                    watch.refused(&e);
                }
                return Err(e);
            }
        };
        let req = m.request();
        if !features_set && req == REQ_SET_VRING_ENABLE {
            if m.flags() & FLAG_NEED_REPLY != 0 {
                let w = crate::sync::lock(fe_writer);
                send_msg(&w, &ack(req, 0))?;
                m.set_flags(m.flags() & !FLAG_NEED_REPLY);
            }
            debug!("holding SET_VRING_ENABLE until SET_FEATURES");
            held.push(m);
            continue;
        }
        if req == REQ_SET_PROTOCOL_FEATURES {
            reply_ack = m.body_u64().is_some_and(|f| f & PROTOCOL_F_REPLY_ACK != 0);
        }
        if let Err(e) = m.vet() {
            watch.refused(&e);
            if !(reply_ack && m.flags() & FLAG_NEED_REPLY != 0) {
                return Err(e);
            }
            // The frontend waits for an answer: it gets a failure, and the handler never
            // sees the message (its descriptors are closed here).
            let w = crate::sync::lock(fe_writer);
            send_msg(&w, &ack(req, 1))?;
            continue;
        }
        if let Some(i) = m.ring_programmed() {
            watch.ring_reset(i);
        }
        // Only an enable the frontend waits on marks a moment the guest is stopped; a held
        // one (above) is acked by the relay itself and tells nothing. Without REPLY_ACK the
        // handler would never answer, and the control thread would wait for nothing.
        if reply_ack && m.flags() & FLAG_NEED_REPLY != 0 {
            if let Some(i) = m.enabled_ring() {
                watch.enabling(i);
                awaiting.store(u64::from(i) + 1, Ordering::Release);
            }
        }
        last.store(req.saturating_add(1), Ordering::Relaxed);
        send_msg(be, &m)?;
        if req == REQ_SET_FEATURES && !features_set {
            features_set = true;
            for h in held.drain(..) {
                send_msg(be, &h)?;
            }
        }
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
    let mut n = 0;
    while let Some(m) = recv_msg(&rx)? {
        assert!(m.body.len() <= MAX_BODY);
        let _ = (m.flags(), m.ring_programmed(), m.enabled_ring());
        m.vet()?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    struct Log(Mutex<Vec<(&'static str, u32)>>);

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
        let relay = Relay::spawn("t", fe, be, log.clone()).unwrap();
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
        // A short body is passed on, not reported.
        qemu.write_all(&msg(REQ_SET_VRING_ENABLE, 1 | FLAG_NEED_REPLY, &[1, 0]))
            .unwrap();
        assert_eq!(read_msg(&mut handler).2, [1, 0]);
        assert_eq!(log.seen().len(), 2);
        relay.stop();
    }

    #[test]
    fn early_vring_enable_is_held_until_set_features() {
        let (mut qemu, fe) = UnixStream::pair().unwrap();
        let (be, mut handler) = UnixStream::pair().unwrap();
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default())).unwrap();
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
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default())).unwrap();
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
        let relay = Relay::spawn("t", fe, be, log.clone()).unwrap();
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
        let relay = Relay::spawn("t", fe, be, log.clone()).unwrap();
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
        let relay = Relay::spawn("t", fe, be, Arc::new(Log::default())).unwrap();
        let mut m = msg(5, 1, &[]);
        m[8..12].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        qemu.write_all(&m).unwrap();
        assert!(recv_msg(&handler).unwrap().is_none());
        relay.stop();
    }
}
