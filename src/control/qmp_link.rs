//! Commands for QEMU from the control socket (`ctl announce`, `ctl link`), sent over the
//! `--qmp` follower's connection: a QMP socket (`-qmp unix:PATH,server=on`) serves one
//! client at a time, so a second connection would wait until the follower left. Each
//! command carries a numeric `id`; the follower, the connection's only reader, hands the
//! answer with that id back to the thread waiting for it (QMP echoes `id`, QEMU's
//! docs/interop/qmp-spec.rst, "Commands Responses").

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use log::debug;
use serde_json::{json, Value};
use thiserror::Error;

use crate::stop::{Current, Stop};
use crate::sync::lock;

/// How long a control client waits for QEMU's answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Commands waiting for an answer at once; the control socket serves at most 16 clients,
/// so this is reached only if QEMU stops answering.
const MAX_WAITING: usize = 16;

#[derive(Debug, Error)]
pub enum LinkError {
    #[error("not connected to QEMU's QMP socket")]
    NotConnected,
    #[error("{MAX_WAITING} commands already wait for QEMU's answer")]
    Busy,
    #[error("writing to QMP")]
    Io(#[source] io::Error),
    #[error("QEMU did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the QMP connection closed before QEMU answered")]
    Lost,
    #[error("QEMU answered {0}")]
    Refused(String),
}

/// An answer as the follower read it: `return`'s value, or `error`'s text.
pub type Answer = Result<Value, String>;

/// What the control socket's commands share with the follower, besides the connection.
#[derive(Default)]
struct Commands {
    /// The NIC the follower found or was told (`nic=ID`).
    nic: Option<String>,
    next: u64,
    waiting: HashMap<u64, SyncSender<Answer>>,
    /// Connections that ended on something QEMU sent (not a connect that failed, nor a
    /// QEMU that went away), and the last failure of any kind, for `ctl info`.
    errors: u64,
    last_error: Option<String>,
}

/// A `--qmp` connection's state as `ctl info` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    pub connected: bool,
    /// The NIC followed, once known.
    pub nic: Option<String>,
    /// Connections ended by what QEMU sent: an overlong line, bad JSON, an error answer,
    /// no NIC to follow.
    pub errors: u64,
    /// The last failure, of any kind (QEMU not there yet included).
    pub last_error: Option<String>,
}

/// One `--qmp` connection as other threads see it.
#[derive(Default)]
pub struct QmpLink {
    /// The connection: written here by every thread, under its lock; read by the follower
    /// alone.
    conn: Current<UnixStream>,
    commands: Mutex<Commands>,
}

impl QmpLink {
    /// Registers the follower's new connection (a clone of the one it reads); false if a
    /// stop was requested meanwhile, and the follower should not block on it.
    ///
    /// Writes on it give up after [`ANSWER_WAIT`]: a QEMU that stops reading cannot hold a
    /// writer, and the lock it writes under, for longer (the option is the socket's, so it
    /// holds for the follower's clone too).
    pub fn attach(&self, s: UnixStream, stop: &Stop) -> bool {
        if let Err(e) = s.set_write_timeout(Some(ANSWER_WAIT)) {
            debug!("QMP socket: no write timeout: {e}");
        }
        self.conn.set(s, stop)
    }

    /// The follower knows which NIC it follows.
    pub fn set_nic(&self, nic: &str) {
        lock(&self.commands).nic = Some(nic.to_string());
    }

    /// Whether the follower is connected, the NIC it follows once it knows it, and what
    /// went wrong.
    pub fn state(&self) -> LinkState {
        let connected = self.conn.with(|_| ()).is_some();
        let g = lock(&self.commands);
        LinkState {
            connected,
            nic: g.nic.clone(),
            errors: g.errors,
            last_error: g.last_error.clone(),
        }
    }

    /// The follower's connection failed with `msg`; `by_qemu` if on something QEMU sent.
    pub fn note_failure(&self, msg: &str, by_qemu: bool) {
        let mut g = lock(&self.commands);
        g.errors += u64::from(by_qemu);
        g.last_error = Some(msg.to_string());
    }

    /// The connection is gone: every waiting command gets `Lost`.
    pub fn detach(&self) {
        self.conn.clear();
        let mut g = lock(&self.commands);
        g.nic = None;
        g.waiting.clear();
    }

    /// Wakes the follower from its read (daemon stop).
    pub fn shutdown(&self) {
        self.conn.with(|s| s.shutdown(Shutdown::Both));
    }

    /// Writes one line (the follower's own commands go through here too, so that two
    /// threads never interleave their bytes).
    pub fn send(&self, line: &Value) -> io::Result<()> {
        self.conn
            .with(|mut s: &UnixStream| writeln!(s, "{line}"))
            .unwrap_or_else(|| Err(io::ErrorKind::NotConnected.into()))
    }

    /// Hands an answer with a numeric id to the thread that sent that command; false if
    /// nobody waits for it (it gave up, or QEMU made the id up).
    pub fn answer(&self, id: u64, answer: Answer) -> bool {
        match lock(&self.commands).waiting.remove(&id) {
            Some(tx) => tx.try_send(answer).is_ok(),
            None => false,
        }
    }

    /// Runs `command` with `arguments` (the NIC's name filled in by `args`) and waits up to
    /// `wait` for QEMU's answer.
    pub fn execute(
        &self,
        command: &str,
        args: impl FnOnce(&str) -> Value,
        wait: Duration,
    ) -> Result<Value, LinkError> {
        let (tx, rx) = mpsc::sync_channel(1);
        // Waiting before the line goes out: the follower may read the answer at once.
        let (id, nic) = {
            let mut g = lock(&self.commands);
            let nic = g.nic.clone().ok_or(LinkError::NotConnected)?;
            if g.waiting.len() >= MAX_WAITING {
                return Err(LinkError::Busy);
            }
            let id = g.next;
            g.next += 1;
            g.waiting.insert(id, tx);
            (id, nic)
        };
        let line = json!({ "execute": command, "arguments": args(&nic), "id": id });
        if let Err(e) = self.send(&line) {
            lock(&self.commands).waiting.remove(&id);
            return Err(match e.kind() {
                io::ErrorKind::NotConnected => LinkError::NotConnected,
                _ => LinkError::Io(e),
            });
        }
        match rx.recv_timeout(wait) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(LinkError::Refused(e)),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.commands).waiting.remove(&id);
                Err(LinkError::Timeout(wait))
            }
            Err(RecvTimeoutError::Disconnected) => Err(LinkError::Lost),
        }
    }

    /// QMP `announce-self` for this NIC alone, one round: QEMU's virtio-net sets
    /// VIRTIO_NET_S_ANNOUNCE and raises a config interrupt when the driver acked
    /// GUEST_ANNOUNCE (hw/net/virtio-net.c, `virtio_net_announce`), and the driver's
    /// `netdev_notify_peers` makes Linux report every group again (NETDEV_RESEND_IGMP).
    pub fn announce(&self, wait: Duration) -> Result<(), LinkError> {
        // One round, sent at once (migration/announce.c runs the first round when asked);
        // the timing fields are required but matter only for later rounds.
        self.execute(
            "announce-self",
            |nic| json!({ "initial": 50, "max": 550, "rounds": 1, "step": 50, "interfaces": [nic] }),
            wait,
        )
        .map(drop)
    }

    /// QMP `set_link`: QEMU clears or sets VIRTIO_NET_S_LINK_UP, notifies the guest, and
    /// stops or restarts the vhost-user rings (hw/net/virtio-net.c, `virtio_net_set_link_status`).
    pub fn set_link(&self, up: bool, wait: Duration) -> Result<(), LinkError> {
        self.execute("set_link", |nic| json!({ "name": nic, "up": up }), wait)
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::sync::Arc;
    use std::thread;

    fn linked() -> (Arc<QmpLink>, BufReader<UnixStream>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let link = Arc::new(QmpLink::default());
        assert!(link.attach(ours, &Stop::default()));
        link.set_nic("nic0");
        (link, BufReader::new(theirs))
    }

    fn read_command(r: &mut BufReader<UnixStream>) -> Value {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// The command names the followed NIC and an id; the answer with that id, and only
    /// that one, reaches the caller.
    #[test]
    fn an_answer_reaches_the_command_with_its_id() {
        let (link, mut qemu) = linked();
        let l = link.clone();
        let caller = thread::spawn(move || l.set_link(false, Duration::from_secs(5)));
        let cmd = read_command(&mut qemu);
        assert_eq!(cmd["execute"], "set_link");
        assert_eq!(cmd["arguments"], json!({"name": "nic0", "up": false}));
        let id = cmd["id"].as_u64().unwrap();
        assert!(!link.answer(id + 1, Ok(json!({}))), "an id nobody sent was taken");
        assert!(link.answer(id, Ok(json!({}))));
        caller.join().unwrap().unwrap();
        assert!(!link.answer(id, Ok(json!({}))), "an answer was taken twice");
    }

    /// A QEMU that reads nothing: a command's write gives up once the socket's buffer is
    /// full, rather than holding the writer's lock for ever.
    #[test]
    fn a_qemu_that_does_not_read_cannot_hold_a_writer() {
        let (link, _qemu) = linked();
        let big = json!({ "execute": "x".repeat(64 * 1024) });
        let t0 = std::time::Instant::now();
        let mut failed = false;
        for _ in 0..64 {
            if link.send(&big).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "4 MiB went into a socket nobody reads");
        assert!(t0.elapsed() < ANSWER_WAIT * 2, "{:?}", t0.elapsed());
    }

    #[test]
    fn refusals_timeouts_and_lost_connections_are_errors() {
        let (link, mut qemu) = linked();
        let l = link.clone();
        let caller = thread::spawn(move || l.announce(Duration::from_secs(5)));
        let cmd = read_command(&mut qemu);
        assert_eq!(cmd["arguments"]["interfaces"], json!(["nic0"]));
        link.answer(cmd["id"].as_u64().unwrap(), Err("no such NIC".into()));
        assert!(matches!(caller.join().unwrap(), Err(LinkError::Refused(e)) if e == "no such NIC"));

        let r = link.announce(Duration::from_millis(50));
        assert!(matches!(r, Err(LinkError::Timeout(_))), "{r:?}");
        let cmd = read_command(&mut qemu);
        assert!(
            !link.answer(cmd["id"].as_u64().unwrap(), Ok(json!({}))),
            "kept after its timeout"
        );

        let l = link.clone();
        let caller = thread::spawn(move || l.announce(Duration::from_secs(5)));
        read_command(&mut qemu);
        link.detach();
        assert!(matches!(caller.join().unwrap(), Err(LinkError::Lost)));
        assert!(matches!(link.announce(ANSWER_WAIT), Err(LinkError::NotConnected)));
    }
}
