//! The `/metrics` server: one thread and one event loop (mio) over loopback TCP or a Unix
//! socket. A connection costs a descriptor and a small buffer, not a thread, so clients
//! that connect and say nothing cannot hold the scrape: up to [`MAX_CONNECTIONS`] are kept
//! at once, and when they are all taken the oldest one still waiting for its request is
//! dropped to make room. A scrape sends its request as it connects and is answered on the
//! loop's next turn, long before [`MAX_CONNECTIONS`] newer clients could push it out.
//!
//! Each connection has [`HEAD_LIMITS`] to send its request head (read, never a body, at
//! most `HEAD_LIMITS.max` bytes), gets one answer (metrics.rs), and is closed once the
//! answer is written and what it still sends is drained, or when its time is up.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, info};
use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use thiserror::Error;

use super::metrics::{answer_head, status_only, HEAD_LIMITS};
use super::view::Daemon;
use crate::stop::{Stop, Stoppable};
use crate::unix_socket::{self, Bound, Claim, SocketAccess, SocketError};

/// Connections held at once (each a descriptor; daemon.rs counts them in its budget).
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a connection lives in all: its head within `HEAD_LIMITS.request`, then as long
/// again for the answer to be read.
const LIFETIME: Duration = Duration::from_secs(2 * HEAD_LIMITS.request.as_secs());

/// Bytes read and thrown away after the answer, so that closing does not reset the
/// connection under an answer the client has not read yet (a body nobody asked for).
const DRAIN: usize = 64 * 1024;

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);
const FIRST_CLIENT: usize = 2;

/// Where `/metrics` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAt {
    /// `--metrics [ADDR:]PORT`.
    Tcp(SocketAddr),
    /// `--metrics unix:PATH`, with the mode and group of the daemon's other sockets.
    Unix(PathBuf),
}

impl std::fmt::Display for MetricsAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAt::Tcp(a) => write!(f, "http://{a}/metrics"),
            MetricsAt::Unix(p) => write!(f, "unix:{} (GET /metrics)", p.display()),
        }
    }
}

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("listening on {addr} for --metrics")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("--metrics unix socket")]
    Unix(#[source] SocketError),
    #[error("setting up the metrics event loop")]
    Poll(#[source] io::Error),
    #[error("spawning the metrics thread")]
    Spawn(#[source] io::Error),
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }

    fn shutdown_write(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a connection stands.
enum Phase {
    /// Reading the request head into the buffer.
    Head(Vec<u8>),
    /// Writing the answer, from the offset.
    Answer(Vec<u8>, usize),
    /// Answered; reading what the client still sends until it closes, up to [`DRAIN`].
    Drain(usize),
}

struct Conn {
    stream: Stream,
    phase: Phase,
    accepted: Instant,
}

/// What happened to a connection on its turn.
enum Turn {
    Open,
    Done,
    /// Ended early: counted as refused (a broken or slow client).
    Refused,
}

/// The loop's state: the connections by token, oldest first in `order`.
struct Server {
    daemon: Arc<Daemon>,
    poll: Poll,
    conns: HashMap<Token, Conn>,
    /// When each connection must be looked at again, soonest first; a token whose
    /// connection is gone is skipped.
    deadlines: BinaryHeap<Reverse<(Instant, usize)>>,
    next: usize,
}

/// Serves `/metrics` at `at` from a thread of its own until `stop`. Returns where it
/// serves (the TCP port bound, if `at` asked for any), the thread, and for a Unix socket
/// the claim that removes it.
pub fn serve(
    at: &MetricsAt,
    access: SocketAccess,
    daemon: Arc<Daemon>,
    stop: &Stop,
) -> Result<(MetricsAt, Stoppable, Option<Claim>), MetricsError> {
    let (listener, bound, claim) = match at {
        MetricsAt::Tcp(addr) => {
            let bind = |source| MetricsError::Bind { addr: *addr, source };
            let l = std::net::TcpListener::bind(addr).map_err(bind)?;
            l.set_nonblocking(true).map_err(bind)?;
            let bound = l.local_addr().unwrap_or(*addr);
            (
                Listener::Tcp(TcpListener::from_std(l)),
                MetricsAt::Tcp(bound),
                None,
            )
        }
        MetricsAt::Unix(path) => {
            let Bound { listener, claim } = unix_socket::bind(path, access).map_err(MetricsError::Unix)?;
            listener.set_nonblocking(true).map_err(|e| {
                MetricsError::Unix(SocketError::Bind {
                    path: path.clone(),
                    source: e,
                })
            })?;
            (
                Listener::Unix(UnixListener::from_std(listener)),
                at.clone(),
                Some(claim),
            )
        }
    };
    let poll = Poll::new().map_err(MetricsError::Poll)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE).map_err(MetricsError::Poll)?);
    info!("metrics at {bound}");
    let mut server = Server {
        daemon,
        poll,
        conns: HashMap::new(),
        deadlines: BinaryHeap::new(),
        next: FIRST_CLIENT,
    };
    let stop2 = stop.clone();
    let handle = thread::Builder::new()
        .name("vnic-metrics".into())
        .spawn(move || {
            if let Err(e) = server.run(listener, &stop2) {
                log::error!("metrics server stopped: {e}");
            }
        })
        .map_err(MetricsError::Spawn)?;
    let wake = move || {
        let _ = waker.wake();
    };
    Ok((bound, Stoppable::new("metrics", handle, wake), claim))
}

impl Server {
    fn run(&mut self, mut listener: Listener, stop: &Stop) -> io::Result<()> {
        let source: &mut dyn mio::event::Source = match &mut listener {
            Listener::Tcp(l) => l,
            Listener::Unix(l) => l,
        };
        self.poll
            .registry()
            .register(source, LISTENER, Interest::READABLE)?;
        let mut events = Events::with_capacity(256);
        while !stop.requested() {
            let timeout = self
                .deadlines
                .peek()
                .map(|Reverse((at, _))| at.saturating_duration_since(Instant::now()));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(&listener),
                    WAKE => {}
                    t => self.turn(t),
                }
            }
            self.expire(Instant::now());
        }
        Ok(())
    }

    /// Takes every connection waiting on the listener.
    fn accept(&mut self, listener: &Listener) {
        loop {
            let stream = match listener {
                Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
                Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            };
            match stream {
                Ok(s) => self.admit(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors, say: the next readiness event tries again, and the
                // oldest waiting connection makes room.
                Err(e) => {
                    debug!("metrics accept: {e}");
                    self.evict_oldest_waiting();
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: Stream) {
        if self.conns.len() >= MAX_CONNECTIONS {
            self.evict_oldest_waiting();
        }
        let token = Token(self.next);
        self.next += 1;
        let registered = self
            .poll
            .registry()
            .register(stream.source(), token, Interest::READABLE);
        if registered.is_err() {
            return;
        }
        let now = Instant::now();
        self.conns.insert(
            token,
            Conn {
                stream,
                phase: Phase::Head(Vec::new()),
                accepted: now,
            },
        );
        self.deadlines.push(Reverse((now + HEAD_LIMITS.request, token.0)));
    }

    /// Drops the oldest connection still waiting for its request, counted as refused.
    fn evict_oldest_waiting(&mut self) {
        let oldest = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Head(_)))
            .min_by_key(|(_, c)| c.accepted)
            .map(|(t, _)| *t);
        if let Some(t) = oldest {
            self.close(t, true);
        }
    }

    fn turn(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let was_head = matches!(conn.phase, Phase::Head(_));
        let turn = conn.advance(&self.daemon);
        if was_head && matches!(conn.phase, Phase::Answer(..)) {
            let reregistered = self.poll.registry().reregister(
                conn.stream.source(),
                token,
                Interest::READABLE | Interest::WRITABLE,
            );
            if reregistered.is_err() {
                self.close(token, true);
                return;
            }
            // Now that it has asked, the rest of its lifetime is for reading the answer.
            self.deadlines.push(Reverse((conn.accepted + LIFETIME, token.0)));
            // A turn of writing right away: most answers fit the socket buffer.
            if let Some(conn) = self.conns.get_mut(&token) {
                let again = conn.advance(&self.daemon);
                self.settle(token, again);
                return;
            }
        }
        self.settle(token, turn);
    }

    fn settle(&mut self, token: Token, turn: Turn) {
        match turn {
            Turn::Open => {}
            Turn::Done => self.close(token, false),
            Turn::Refused => self.close(token, true),
        }
    }

    /// Ends connections whose time is up: one still without its request gets a 408.
    fn expire(&mut self, now: Instant) {
        while let Some(&Reverse((at, t))) = self.deadlines.peek() {
            if at > now {
                return;
            }
            self.deadlines.pop();
            let token = Token(t);
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            match conn.phase {
                Phase::Head(_) => {
                    let _ = conn.stream.write(&status_only(408, "Request Timeout"));
                    self.close(token, true);
                }
                // Its head came in time; the answer's own deadline is further down the queue.
                _ if now < conn.accepted + LIFETIME => {}
                _ => self.close(token, false),
            }
        }
    }

    fn close(&mut self, token: Token, refused: bool) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(c.stream.source());
            if refused {
                self.daemon.refused.metrics.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Conn {
    /// Reads, answers, writes or drains as far as the socket lets it now.
    fn advance(&mut self, daemon: &Daemon) -> Turn {
        let mut chunk = [0u8; 4096];
        loop {
            match &mut self.phase {
                Phase::Head(buf) => {
                    let room = (HEAD_LIMITS.max + 1 - buf.len()).min(chunk.len());
                    match self.stream.read(&mut chunk[..room]) {
                        Ok(0) => return if buf.is_empty() { Turn::Done } else { Turn::Refused },
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return blocked(e),
                    }
                    let answer = match buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        Some(p) if p + 4 <= HEAD_LIMITS.max => answer_head(daemon, &buf[..p + 4]),
                        Some(_) => status_only(431, "Request Header Fields Too Large"),
                        None if buf.len() > HEAD_LIMITS.max => {
                            status_only(431, "Request Header Fields Too Large")
                        }
                        None => continue,
                    };
                    self.phase = Phase::Answer(answer, 0);
                    return Turn::Open;
                }
                Phase::Answer(out, sent) => match self.stream.write(&out[*sent..]) {
                    Ok(0) => return Turn::Refused,
                    Ok(n) => {
                        *sent += n;
                        if *sent == out.len() {
                            self.stream.shutdown_write();
                            self.phase = Phase::Drain(0);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return blocked(e),
                },
                Phase::Drain(drained) => match self.stream.read(&mut chunk) {
                    Ok(0) => return Turn::Done,
                    Ok(n) => {
                        *drained += n;
                        if *drained >= DRAIN {
                            return Turn::Done;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return blocked(e).done_if_open(),
                },
            }
        }
    }
}

/// A read or write that would block leaves the connection open; any other error ends it.
fn blocked(e: io::Error) -> Turn {
    match e.kind() {
        io::ErrorKind::WouldBlock => Turn::Open,
        _ => Turn::Refused,
    }
}

impl Turn {
    /// After the answer, an error only means the client is gone: not a refusal.
    fn done_if_open(self) -> Turn {
        match self {
            Turn::Refused => Turn::Done,
            t => t,
        }
    }
}
