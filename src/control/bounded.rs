//! What every client connection of the control socket and of `--metrics` is held to: a cap
//! on connections at once, and requests read with a size limit and deadlines, so that no
//! client can hold a thread, a slot or memory for long.

use crate::sync::lock;
use std::io::{self, Read};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::warn;
use thiserror::Error;

use crate::logging::WarnLimiter;
use crate::stop::Stop;

/// A cap on connections served at once. A connection holds a [`Slot`] until it ends.
#[derive(Debug)]
pub struct Slots {
    used: AtomicUsize,
    max: usize,
}

/// One taken place of [`Slots`], given back on drop.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Slots {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Slots {
            used: AtomicUsize::new(0),
            max,
        })
    }

    /// A place for one more connection, or `None` when all are taken.
    // Rust 1.99 deprecates fetch_update for try_update, which the minimum (1.82) lacks.
    #[allow(deprecated)]
    pub fn take(self: &Arc<Self>) -> Option<Slot> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts clients until `stop` is requested (the waker then connects once, so that a
/// waiting accept returns) or `incoming` ends: each gets a thread of its own (named
/// `thread_name`) holding a slot of `max`; one over the cap is handed to `refuse` on the
/// accepting thread. `server` names the server in log lines, which come at most once a
/// second. A failed accept (out of descriptors) pauses the loop instead of spinning it.
/// On a stop it hangs up on the clients still connected and returns once their threads
/// have ended.
pub fn accept_loop<S: Client>(
    server: &str,
    thread_name: &str,
    incoming: impl Iterator<Item = io::Result<S>>,
    max: usize,
    refuse: impl Fn(S),
    serve: impl Fn(S) + Send + Sync + 'static,
    stop: &Stop,
) {
    let slots = Slots::new(max);
    let serve = Arc::new(serve);
    let warn_limit = WarnLimiter::default();
    // The client threads: at most `max` running, plus those that ended since the last
    // accept. A second handle on each connection still open, to hang up on at a stop; a
    // client's thread takes its own out when it ends, so no descriptor outlives its client.
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    let open: Arc<Mutex<Vec<(u64, S)>>> = Arc::default();
    let mut next_id = 0u64;
    for conn in incoming {
        if stop.requested() {
            break;
        }
        clients.retain(|c| !c.is_finished());
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                if warn_limit.allow() {
                    warn!("{server}: accept failed: {e}");
                }
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            if warn_limit.allow() {
                warn!("{server}: more than {max} clients at once; refusing one");
            }
            refuse(s);
            continue;
        };
        let id = next_id;
        next_id += 1;
        if let Ok(h) = s.handle() {
            lock(&open).push((id, h));
        }
        let (serve, mine) = (serve.clone(), open.clone());
        let spawned = thread::Builder::new().name(thread_name.into()).spawn(move || {
            let _slot = slot;
            serve(s);
            lock(&mine).retain(|(i, _)| *i != id);
        });
        match spawned {
            Ok(c) => clients.push(c),
            Err(e) => {
                lock(&open).retain(|(i, _)| *i != id);
                if warn_limit.allow() {
                    warn!("{server}: cannot spawn a client thread: {e}");
                }
            }
        }
    }
    if !stop.requested() {
        warn!("{server}: no more clients accepted");
    }
    for (_, s) in lock(&open).iter() {
        s.hang_up();
    }
    for c in clients {
        let _ = c.join();
    }
}

/// Why a request could not be read whole.
#[derive(Debug, Error)]
pub enum ReadError {
    #[error("request longer than {0} bytes")]
    TooLong(usize),
    #[error("no request within {0:?}")]
    Idle(Duration),
    #[error("request not complete within {0:?}")]
    Slow(Duration),
    #[error("connection closed in the middle of a request")]
    Truncated,
    #[error("reading the request")]
    Io(#[source] io::Error),
}

/// The limits of one kind of request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest request, terminator included.
    pub max: usize,
    /// How long a connection may wait before a request's first byte.
    pub idle: Duration,
    /// How long a request may take from its first byte to its terminator.
    pub request: Duration,
}

/// A client connection: its reads can be given a timeout, and the accepting thread can
/// hang up on it when the daemon stops.
pub trait Client: Read + Sized + Send + 'static {
    /// A second handle on the same connection.
    fn handle(&self) -> io::Result<Self>;
    /// Ends the connection: the client's thread, blocked reading it, returns.
    fn hang_up(&self);
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

/// `UnixStream` and `TcpStream` have the same three inherent methods, but no std trait.
macro_rules! stream_client {
    ($($t:ty),*) => {$(
        impl Client for $t {
            fn handle(&self) -> io::Result<Self> {
                self.try_clone()
            }
            fn hang_up(&self) {
                let _ = self.shutdown(Shutdown::Both);
            }
            fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(t)
            }
        }
    )*};
}
stream_client!(UnixStream, TcpStream);

/// Reads requests that end in a terminator (`\n`, `\r\n\r\n`), one after another; bytes
/// after a terminator are kept for the next request. The idle time runs from the
/// connection's start or its last request that did something ([`Framed::active`]): a
/// client cannot hold its slot with requests that ask for nothing.
pub struct Framed<S> {
    stream: S,
    buf: Vec<u8>,
    limits: Limits,
    idle_from: Instant,
}

impl<S: Client> Framed<S> {
    pub fn new(stream: S, limits: Limits) -> Self {
        Framed {
            stream,
            buf: Vec::new(),
            limits,
            idle_from: Instant::now(),
        }
    }

    /// The request just read did something: the idle time starts again.
    pub fn active(&mut self) {
        self.idle_from = Instant::now();
    }

    /// The next request, terminator included; `None` when the client closed between
    /// requests.
    pub fn next(&mut self, term: &[u8]) -> Result<Option<Vec<u8>>, ReadError> {
        let Limits { max, idle, request } = self.limits;
        let since = self.idle_from;
        let mut first_byte = (!self.buf.is_empty()).then(Instant::now);
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = find(&self.buf, term).map(|p| p + term.len()) {
                if end > max {
                    return Err(ReadError::TooLong(max));
                }
                return Ok(Some(self.buf.drain(..end).collect()));
            }
            if self.buf.len() >= max {
                return Err(ReadError::TooLong(max));
            }
            let (deadline, late) = match first_byte {
                None => (since + idle, ReadError::Idle(idle)),
                Some(t) => (t + request, ReadError::Slow(request)),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(late);
            }
            self.stream.set_timeout(Some(left)).map_err(ReadError::Io)?;
            // Never more than the request may still hold, so a flood is cut at `max`.
            let room = (max + 1 - self.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(ReadError::Truncated),
                Ok(n) => {
                    first_byte.get_or_insert_with(Instant::now);
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err(late)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn limits(max: usize) -> Limits {
        Limits {
            max,
            idle: Duration::from_millis(200),
            request: Duration::from_millis(200),
        }
    }

    #[test]
    fn slots_cap_connections_and_come_back() {
        let s = Slots::new(2);
        let a = s.take().unwrap();
        let _b = s.take().unwrap();
        assert!(s.take().is_none());
        drop(a);
        assert_eq!(s.in_use(), 1);
        assert!(s.take().is_some());
    }

    #[test]
    fn requests_are_split_on_the_terminator_and_limited_each() {
        let (mut c, s) = UnixStream::pair().unwrap();
        let mut r = Framed::new(s, limits(8));
        c.write_all(b"ab\ncd\n").unwrap();
        assert_eq!(r.next(b"\n").unwrap().unwrap(), b"ab\n");
        assert_eq!(r.next(b"\n").unwrap().unwrap(), b"cd\n");
        // The limit is per request: many short ones pass however many there are.
        for _ in 0..100 {
            c.write_all(b"1234567\n").unwrap();
            assert_eq!(r.next(b"\n").unwrap().unwrap().len(), 8);
        }
        c.write_all(b"123456789\n").unwrap();
        assert!(matches!(r.next(b"\n"), Err(ReadError::TooLong(8))));
    }

    #[test]
    fn a_silent_or_slow_client_times_out_and_a_closed_one_ends() {
        let (mut c, s) = UnixStream::pair().unwrap();
        let mut r = Framed::new(s, limits(64));
        let t0 = Instant::now();
        assert!(matches!(r.next(b"\n"), Err(ReadError::Idle(_))));
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The idle time restarts only when the caller says a request did something.
        r.active();
        c.write_all(b"partial").unwrap();
        assert!(matches!(r.next(b"\n"), Err(ReadError::Slow(_))));
        drop(c);
        assert!(matches!(r.next(b"\n"), Err(ReadError::Truncated)));
        // Requests that are not marked active do not hold the connection open.
        let (mut c, s) = UnixStream::pair().unwrap();
        let mut r = Framed::new(s, limits(64));
        let t0 = Instant::now();
        let err = loop {
            c.write_all(b"\n").unwrap();
            match r.next(b"\n") {
                Ok(Some(_)) => thread::sleep(Duration::from_millis(20)),
                other => break other,
            }
        };
        assert!(matches!(err, Err(ReadError::Idle(_))), "{:?}", err.map(|_| ()));
        assert!(t0.elapsed() < Duration::from_secs(2));
        let (c, s) = UnixStream::pair().unwrap();
        drop(c);
        assert!(Framed::new(s, limits(64)).next(b"\n").unwrap().is_none());
    }
}
