//! Serves the control socket on its own threads; never touches the data path's locks.
//!
//! Each client gets a thread of its own, up to [`MAX_CLIENTS`] at once; a request is one
//! line of at most [`LINE_LIMITS`]`.max` bytes (the limit is per line, so a monitor may keep
//! one connection for as long as it likes), and a client that says nothing for
//! [`LINE_LIMITS`]`.idle`, or takes longer than `.request` over one line, is disconnected.
//! Refusals are answered with a JSON error, counted, and logged at most once a second.

use std::io::{self, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::debug;
use serde::Deserialize;
use thiserror::Error;

use super::bounded::{self, Framed, Limits, ReadError};
use super::capture::{self, CaptureAsk, CaptureError};
use super::qmp_link::{QmpLink, ANSWER_WAIT};
use super::view::{self, Daemon, PortRef};
use crate::device::features::Attachment;
use crate::pipeline::csum_action::CsumAction;
use crate::pipeline::router::Route;
use crate::pipeline::rules::{NamesPort, Rules, MAX_ACTIONS, MAX_ROUTES};
use crate::ports::vhost_user::GuestPort;
use crate::stop::{Stop, Stoppable};
use crate::unix_socket::{self, Bound, Claim, SocketAccess, SocketError};

/// Control clients served at once; one more is told so and closed.
pub const MAX_CLIENTS: usize = 16;

/// One request line: its size, how long a client may idle between requests, and how long
/// one line may take once begun.
pub const LINE_LIMITS: Limits = Limits {
    max: 64 * 1024,
    idle: Duration::from_secs(120),
    request: Duration::from_secs(10),
};

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("control socket")]
    Bind(#[source] SocketError),
    #[error("spawning control thread")]
    Spawn(#[source] io::Error),
}

#[derive(Deserialize)]
struct Request {
    cmd: String,
    /// The argument of commands that take one (an action or route spec).
    #[serde(default)]
    arg: Option<String>,
    /// `capture`'s arguments.
    #[serde(default)]
    capture: Option<CaptureAsk>,
}

pub struct ControlServer {
    daemon: Arc<Daemon>,
}

impl ControlServer {
    pub fn new(daemon: Arc<Daemon>) -> Self {
        ControlServer { daemon }
    }

    /// Binds `path` (replacing a stale socket, never anything else) with `access`, and
    /// serves it from a background thread until `stop` is requested.
    /// The claim removes the socket when dropped, after the thread is stopped.
    pub fn start(
        &self,
        path: &Path,
        access: SocketAccess,
        stop: &Stop,
    ) -> Result<(Stoppable, Claim), ControlError> {
        let Bound { listener, claim } = unix_socket::bind(path, access).map_err(ControlError::Bind)?;
        let (daemon, stop) = (self.daemon.clone(), stop.clone());
        let handle = thread::Builder::new()
            .name("vnic-control".into())
            .spawn(move || accept_loop(listener, daemon, &stop))
            .map_err(ControlError::Spawn)?;
        let path = path.to_path_buf();
        Ok((
            Stoppable::new("control socket", handle, move || {
                let _ = UnixStream::connect(&path);
            }),
            claim,
        ))
    }
}

fn accept_loop(listener: UnixListener, daemon: Arc<Daemon>, stop: &Stop) {
    let d = daemon.clone();
    bounded::accept_loop(
        "control",
        "vnic-ctl-conn",
        listener.incoming(),
        MAX_CLIENTS,
        |mut s: UnixStream| {
            daemon.refused.control.fetch_add(1, Ordering::Relaxed);
            let why = format!("too many control clients (at most {MAX_CLIENTS} at once)");
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = s.write_all(error_line(&why).as_bytes());
        },
        move |s| {
            if let Err(e) = serve_client(&d, s, LINE_LIMITS) {
                debug!("control client: {e}");
            }
        },
        stop,
    );
}

fn error(msg: String) -> Result<serde_json::Value, serde_json::Error> {
    Ok(serde_json::json!({ "error": msg }))
}

/// Adds or removes one entry of a list in the switch's rules (checksum actions, routes), as
/// a new snapshot: `list` picks the list; an entry may name only a port there is.
fn edit_list<T>(
    d: &Daemon,
    add: bool,
    arg: Option<&str>,
    max: usize,
    list: impl FnOnce(&mut Rules) -> Result<&mut Vec<T>, String>,
) -> Result<(), String>
where
    T: std::str::FromStr + PartialEq + NamesPort,
    T::Err: std::fmt::Display,
{
    let spec = arg.ok_or("this command needs a spec")?;
    let item = spec.parse::<T>().map_err(|e| format!("bad spec {spec:?}: {e}"))?;
    let nports = d.switch.nports();
    d.switch.rules().update(|rules| {
        let items = list(rules)?;
        if add {
            if let Some(p) = item.missing_port(nports) {
                return Err(format!("port {p} does not exist ({nports} ports)"));
            }
            if items.contains(&item) {
                return Err(format!("{item} is already there"));
            }
            if items.len() >= max {
                return Err(format!("{max} is the most there may be"));
            }
            items.push(item);
        } else {
            let i = items
                .iter()
                .position(|a| *a == item)
                .ok_or_else(|| format!("no {item} to delete"))?;
            items.remove(i);
        }
        Ok(())
    })
}

fn reply<V: serde::Serialize>(
    r: Result<(), String>,
    view: impl FnOnce() -> V,
) -> Result<serde_json::Value, serde_json::Error> {
    match r {
        Ok(()) => serde_json::to_value(view()),
        Err(e) => error(e),
    }
}

fn edit_actions(d: &Daemon, add: bool, arg: Option<&str>) -> Result<serde_json::Value, serde_json::Error> {
    let r = edit_list::<CsumAction>(d, add, arg, MAX_ACTIONS, |r| Ok(&mut r.actions));
    reply(r, || view::actions(&d.switch))
}

fn edit_routes(d: &Daemon, add: bool, arg: Option<&str>) -> Result<serde_json::Value, serde_json::Error> {
    let r = edit_list::<Route>(d, add, arg, MAX_ROUTES, |r| {
        if !r.router.enabled() {
            return Err("the router is off: start the daemon with --router-ip".into());
        }
        Ok(&mut r.router.routes)
    });
    reply(r, || view::routes(&d.switch))
}

/// Who tells a guest port's driver of an announce or a link change.
enum Teller<'a> {
    /// QEMU's virtio-net, over `--qmp` (net attachment).
    Qmp(&'a QmpLink),
    /// The port itself, over the frontend's config-change channel (device attachment).
    Port(&'a GuestPort),
}

impl Teller<'_> {
    fn announce(&self) -> Result<(), String> {
        match self {
            Teller::Qmp(l) => l
                .announce(ANSWER_WAIT)
                .map_err(|e| crate::logging::error_chain(&e)),
            Teller::Port(g) => g.announce().map_err(|e| crate::logging::error_chain(&e)),
        }
    }

    fn set_link(&self, up: bool) -> Result<(), String> {
        match self {
            Teller::Qmp(l) => l
                .set_link(up, ANSWER_WAIT)
                .map_err(|e| crate::logging::error_chain(&e)),
            Teller::Port(g) => g.set_link(up).map_err(|e| crate::logging::error_chain(&e)),
        }
    }
}

/// Who tells port `p`'s driver: the port in the device attachment, where it serves the
/// config space; QEMU over `--qmp` in the net attachment, where QEMU's virtio-net does.
fn teller(d: &Daemon, p: usize) -> Result<Teller<'_>, String> {
    let g = match d.ports.get(p) {
        None => return Err(format!("port {p} does not exist ({} ports)", d.ports.len())),
        Some(PortRef::Tap(_)) => return Err(format!("port {p} is the tap: there is no guest to tell")),
        Some(PortRef::Guest(g)) => g,
    };
    if g.attachment() == Some(Attachment::Device) {
        return Ok(Teller::Port(g));
    }
    d.qmp
        .get(&p)
        .map(|l| Teller::Qmp(l))
        .ok_or_else(|| match g.attachment() {
            None => format!("port {p} has no driver attached, and no --qmp"),
            Some(_) => format!(
                "port {p} has no --qmp: in the net attachment the guest hears of an announce or a \
             link change through QEMU's virtio-net, so start the daemon with --qmp PATH,port={p} \
             (docs/running-with-qemu.md)"
            ),
        })
}

fn port_number(arg: &str) -> Result<usize, String> {
    arg.trim().parse().map_err(|e| format!("bad port {arg:?}: {e}"))
}

/// `announce [PORT]`: one port's driver, or every guest port's that can be told.
fn announce(d: &Daemon, arg: Option<&str>) -> Result<serde_json::Value, String> {
    let tellers: Vec<(usize, Teller<'_>)> = match arg {
        Some(a) => {
            let p = port_number(a)?;
            vec![(p, teller(d, p)?)]
        }
        None => (0..d.ports.len())
            .filter_map(|p| Some((p, teller(d, p).ok()?)))
            .collect(),
    };
    if tellers.is_empty() {
        return Err(
            "no port can be told to announce: a device-attachment driver must be \
                    attached, or a port must have --qmp"
                .into(),
        );
    }
    let mut done = Vec::new();
    for (p, t) in tellers {
        t.announce().map_err(|e| format!("port {p}: {e}"))?;
        done.push(p);
    }
    Ok(serde_json::json!({ "announced": done }))
}

/// `link PORT up|down`.
fn link(d: &Daemon, arg: Option<&str>) -> Result<serde_json::Value, String> {
    let usage = "link needs PORT up|down";
    let (port, state) = arg.and_then(|a| a.split_once(' ')).ok_or(usage)?;
    let up = match state.trim() {
        "up" => true,
        "down" => false,
        other => return Err(format!("{usage}, not {other:?}")),
    };
    let p = port_number(port)?;
    teller(d, p)?.set_link(up).map_err(|e| format!("port {p}: {e}"))?;
    Ok(serde_json::json!({ "port": p, "link": if up { "up" } else { "down" } }))
}

/// `queue-cpus PORT [QUEUE=CPUS...]`: what the guest CPUs behind a guest port's queues
/// are (its XPS map), for the views; no mapping forgets the port's.
fn queue_cpus(d: &Daemon, arg: Option<&str>) -> Result<serde_json::Value, String> {
    let mut words = arg.unwrap_or("").split_whitespace();
    let port = words.next().ok_or("queue-cpus needs PORT [QUEUE=CPUS...]")?;
    let p = port_number(port)?;
    let queues = match d.ports.get(p) {
        None => return Err(format!("port {p} does not exist ({} ports)", d.ports.len())),
        Some(PortRef::Tap(_)) => return Err(format!("port {p} is the tap: no guest CPU sends on it")),
        Some(PortRef::Guest(g)) => g.stats().len(),
    };
    let map: Vec<&str> = words.collect();
    let cpus = d
        .queue_cpus
        .set(p, queues, &map)
        .map_err(|e| crate::logging::error_chain(&e))?;
    Ok(serde_json::json!({ "port": p, "queue_cpus": cpus }))
}

fn answered(r: Result<serde_json::Value, String>) -> Result<serde_json::Value, serde_json::Error> {
    r.or_else(error)
}

/// Answers one request line.
pub fn answer(d: &Daemon, line: &str) -> String {
    let reply = match serde_json::from_str::<Request>(line) {
        Ok(r) => match r.cmd.as_str() {
            "stats" => serde_json::to_value(view::stats(d)),
            "filter" => serde_json::to_value(view::filter(&d.ports)),
            "info" => serde_json::to_value(view::info(d)),
            "action-list" => serde_json::to_value(view::actions(&d.switch)),
            "action-add" => edit_actions(d, true, r.arg.as_deref()),
            "action-del" => edit_actions(d, false, r.arg.as_deref()),
            "route-list" => serde_json::to_value(view::routes(&d.switch)),
            "route-add" => edit_routes(d, true, r.arg.as_deref()),
            "route-del" => edit_routes(d, false, r.arg.as_deref()),
            "announce" => answered(announce(d, r.arg.as_deref())),
            "link" => answered(link(d, r.arg.as_deref())),
            "queue-cpus" => answered(queue_cpus(d, r.arg.as_deref())),
            "capture" => error("capture streams frames: send it as a connection's only request".into()),
            other => error(format!("unknown command {other:?}")),
        },
        Err(e) => Ok(serde_json::json!({ "error": format!("bad request: {e}") })),
    };
    let mut v = match reply {
        Ok(v) => v,
        Err(e) => serde_json::json!({ "error": format!("encoding reply: {e}") }),
    };
    versioned(&mut v);
    v.to_string()
}

/// Adds `"version"` to an answer (every answer is an object).
fn versioned(v: &mut serde_json::Value) {
    if let Some(m) = v.as_object_mut() {
        m.insert("version".into(), super::version::INTERFACE_VERSION.into());
    }
}

fn error_line(msg: &str) -> String {
    let mut v = serde_json::json!({ "error": msg });
    versioned(&mut v);
    let mut out = v.to_string();
    out.push('\n');
    out
}

/// The capture a request line asks for, if it is a `capture` request.
fn capture_request(line: &str) -> Option<CaptureAsk> {
    serde_json::from_str::<Request>(line)
        .ok()
        .filter(|r| r.cmd == "capture")
        .and_then(|r| r.capture)
}

/// Serves `ctl capture` on the client's connection, which it then ends (a pcapng stream
/// has no end a next answer could follow). Writes wait at most 5 s: a client that stops
/// reading ends its capture, and the frames it missed are counted.
fn serve_capture(d: &Daemon, ask: &CaptureAsk, w: &UnixStream) -> io::Result<()> {
    w.set_write_timeout(Some(Duration::from_secs(5)))?;
    let name = d.ports.get(ask.port).map(PortRef::name).unwrap_or_default();
    let head = |r: Result<(), &CaptureError>| {
        let mut v = match r {
            Ok(()) => {
                serde_json::json!({ "capture": { "port": ask.port, "name": name, "snaplen": ask.snaplen } })
            }
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        versioned(&mut v);
        v.to_string() + "\n"
    };
    match capture::serve(&d.switch, ask, &name, head, w) {
        Ok(n) => {
            debug!("control client: captured {n} frames of port {}", ask.port);
            Ok(())
        }
        Err(e) => Err(io::Error::other(e)),
    }
}

fn serve_client(d: &Daemon, s: UnixStream, limits: Limits) -> io::Result<()> {
    let mut w = s.try_clone()?;
    w.set_write_timeout(Some(limits.request))?;
    let mut r = Framed::new(s, limits);
    loop {
        match r.next(b"\n") {
            Ok(Some(line)) => {
                let out = match std::str::from_utf8(&line) {
                    // A blank line is no request: it does not hold the idle time back.
                    Ok(text) if text.trim().is_empty() => continue,
                    Ok(text) => {
                        r.active();
                        if let Some(ask) = capture_request(text) {
                            return serve_capture(d, &ask, &w);
                        }
                        answer(d, text.trim()) + "\n"
                    }
                    Err(e) => error_line(&format!("bad request: {e}")),
                };
                w.write_all(out.as_bytes())?;
            }
            Ok(None) => return Ok(()),
            // A client that went quiet between requests just leaves.
            Err(ReadError::Idle(_)) => return Ok(()),
            Err(e) => {
                d.refused.control.fetch_add(1, Ordering::Relaxed);
                let _ = w.write_all(error_line(&e.to_string()).as_bytes());
                return Err(io::Error::other(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Switch;
    use std::io::{BufRead, BufReader};
    use std::time::Instant;

    fn daemon() -> Daemon {
        Daemon {
            ports: Vec::new(),
            switch: Arc::new(Switch::new(0)),
            refused: Default::default(),
            started: view::Started::now(Vec::new()),
            poll: None,
            qmp: Default::default(),
            queue_cpus: Default::default(),
        }
    }

    /// A client that sends only blank lines is let go at the idle limit, one
    /// that asks for something is not.
    #[test]
    fn blank_lines_do_not_hold_a_client_past_its_idle_limit() {
        let limits = Limits {
            max: 1024,
            idle: Duration::from_millis(300),
            request: Duration::from_millis(300),
        };
        let d = Arc::new(daemon());
        let serve = |d: &Arc<Daemon>| {
            let (c, s) = UnixStream::pair().unwrap();
            let d = d.clone();
            (c, thread::spawn(move || serve_client(&d, s, limits)))
        };
        let (mut blank, served) = serve(&d);
        let t0 = Instant::now();
        while !served.is_finished() && t0.elapsed() < Duration::from_secs(3) {
            let _ = blank.write_all(b"\n \r\n");
            thread::sleep(Duration::from_millis(50));
        }
        assert!(
            served.is_finished(),
            "a client sending blank lines was kept for 3 s"
        );
        assert!(served.join().unwrap().is_ok());
        let (mut asking, served) = serve(&d);
        let mut answers = BufReader::new(asking.try_clone().unwrap());
        for _ in 0..20 {
            asking.write_all(b"{\"cmd\":\"stats\"}\n").unwrap();
            let mut line = String::new();
            answers.read_line(&mut line).unwrap();
            assert!(line.contains("\"version\""), "{line}");
            thread::sleep(Duration::from_millis(50));
        }
        assert!(!served.is_finished(), "a client asking every 50 ms was let go");
        drop(asking);
        assert!(served.join().unwrap().is_ok());
    }

    /// A capture client that asks and then reads nothing: the daemon's writes give up
    /// after their bound, the capture ends and the port is free again, while frames keep
    /// coming (each a full snap length, so the socket's buffer fills).
    #[test]
    fn a_capture_client_that_stops_reading_is_let_go() {
        use crate::control::capture::tests::send;
        use crate::pipeline::capture::tests::UnicastOnly;
        let mut d = daemon();
        let sw = Arc::new(Switch::new(2));
        sw.attach(0, Arc::new(UnicastOnly));
        sw.attach(1, Arc::new(UnicastOnly));
        d.switch = sw.clone();
        let d = Arc::new(d);
        let (mut client, s) = UnixStream::pair().unwrap();
        let served = {
            let d = d.clone();
            thread::spawn(move || serve_client(&d, s, LINE_LIMITS))
        };
        let ask = serde_json::json!({"cmd": "capture", "capture": {
            "port": 1, "sent": false, "offered": true, "count": null, "seconds": null, "snaplen": 65535
        }});
        client.write_all(format!("{ask}\n").as_bytes()).unwrap();
        let t0 = Instant::now();
        while !served.is_finished() && t0.elapsed() < Duration::from_secs(20) {
            send(&sw, 0, [2, 0, 0, 0, 0, 9], 60_000);
            thread::sleep(Duration::from_millis(1));
        }
        assert!(
            served.is_finished(),
            "a client that reads nothing held its capture for 20 s"
        );
        assert!(
            served.join().unwrap().is_err(),
            "the stalled write ends it as an error"
        );
        assert!(!sw.rules().load().capturing(), "the port is free again");
        drop(client);
    }
}
