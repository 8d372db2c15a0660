//! Serves the control socket on its own threads; never touches the data path's locks.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;

use log::{debug, warn};
use serde::Deserialize;
use thiserror::Error;

use super::view::{self, PortRef};
use crate::pipeline::csum_action::CsumAction;
use crate::pipeline::router::{NextHop, Route};
use crate::pipeline::rules::Rules;
use crate::pipeline::Switch;

/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("binding control socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spawning control thread")]
    Spawn(#[source] io::Error),
}

#[derive(Deserialize)]
struct Request {
    cmd: String,
    /// The argument of commands that take one (an action or route spec).
    #[serde(default)]
    arg: Option<String>,
}

/// What the control socket can see and change.
pub struct Daemon {
    pub ports: Vec<PortRef>,
    pub switch: Arc<Switch>,
}

pub struct ControlServer {
    daemon: Arc<Daemon>,
}

impl ControlServer {
    pub fn new(daemon: Arc<Daemon>) -> Self {
        ControlServer { daemon }
    }

    /// Binds `path` (replacing a stale socket file) and serves it from a background thread.
    pub fn start(&self, path: &Path) -> Result<(), ControlError> {
        if path.exists() && UnixStream::connect(path).is_err() {
            let _ = std::fs::remove_file(path);
        }
        let listener = UnixListener::bind(path).map_err(|source| ControlError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        let daemon = self.daemon.clone();
        thread::Builder::new()
            .name("vnic-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => {
                            let daemon = daemon.clone();
                            let spawned =
                                thread::Builder::new()
                                    .name("vnic-ctl-conn".into())
                                    .spawn(move || {
                                        if let Err(e) = serve_client(&daemon, s) {
                                            debug!("control client: {e}");
                                        }
                                    });
                            if let Err(e) = spawned {
                                warn!("control: cannot spawn client thread: {e}");
                            }
                        }
                        Err(e) => warn!("control: accept failed: {e}"),
                    }
                }
            })
            .map_err(ControlError::Spawn)?;
        Ok(())
    }
}

fn error(msg: String) -> Result<serde_json::Value, serde_json::Error> {
    Ok(serde_json::json!({ "error": msg }))
}

/// Adds or removes one entry of a list in the switch's rules (checksum actions, routes), as
/// a new snapshot: `list` picks the list, `port` names the port an entry needs, if any.
fn edit_list<T>(
    d: &Daemon,
    add: bool,
    arg: Option<&str>,
    list: impl FnOnce(&mut Rules) -> Result<&mut Vec<T>, String>,
    port: impl Fn(&T) -> Option<usize>,
) -> Result<(), String>
where
    T: std::str::FromStr + PartialEq + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let spec = arg.ok_or("this command needs a spec")?;
    let item = spec.parse::<T>().map_err(|e| format!("bad spec {spec:?}: {e}"))?;
    let nports = d.switch.nports();
    d.switch.rules().update(|rules| {
        let items = list(rules)?;
        if add {
            if let Some(p) = port(&item).filter(|&p| p >= nports) {
                return Err(format!("port {p} does not exist ({nports} ports)"));
            }
            if items.contains(&item) {
                return Err(format!("{item} is already there"));
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
    let r = edit_list::<CsumAction>(d, add, arg, |r| Ok(&mut r.actions), |a| Some(a.port));
    reply(r, || view::actions(&d.switch))
}

fn edit_routes(d: &Daemon, add: bool, arg: Option<&str>) -> Result<serde_json::Value, serde_json::Error> {
    let r = edit_list::<Route>(
        d,
        add,
        arg,
        |r| {
            if !r.router.enabled() {
                return Err("the router is off: start the daemon with --router-ip".into());
            }
            Ok(&mut r.router.routes)
        },
        |r| match r.hop {
            NextHop::Port(p) => Some(p),
            NextHop::Via(_) => None,
        },
    );
    reply(r, || view::routes(&d.switch))
}

/// Answers one request line.
pub fn answer(d: &Daemon, line: &str) -> String {
    let reply = match serde_json::from_str::<Request>(line) {
        Ok(r) => match r.cmd.as_str() {
            "stats" => serde_json::to_value(view::stats(&d.ports)),
            "filter" => serde_json::to_value(view::filter(&d.ports)),
            "action-list" => serde_json::to_value(view::actions(&d.switch)),
            "action-add" => edit_actions(d, true, r.arg.as_deref()),
            "action-del" => edit_actions(d, false, r.arg.as_deref()),
            "route-list" => serde_json::to_value(view::routes(&d.switch)),
            "route-add" => edit_routes(d, true, r.arg.as_deref()),
            "route-del" => edit_routes(d, false, r.arg.as_deref()),
            other => error(format!("unknown command {other:?}")),
        },
        Err(e) => Ok(serde_json::json!({ "error": format!("bad request: {e}") })),
    };
    match reply {
        Ok(v) => v.to_string(),
        Err(e) => serde_json::json!({ "error": format!("encoding reply: {e}") }).to_string(),
    }
}

fn serve_client(d: &Daemon, s: UnixStream) -> io::Result<()> {
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(io::Read::take(s, MAX_REQUEST));
    let mut line = String::new();
    while r.read_line(&mut line)? > 0 {
        let mut out = answer(d, line.trim());
        out.push('\n');
        w.write_all(out.as_bytes())?;
        line.clear();
    }
    Ok(())
}
