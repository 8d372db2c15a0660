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

/// Adds or removes a checksum action in a new snapshot of the switch's rules.
fn edit_actions(d: &Daemon, add: bool, arg: Option<&str>) -> Result<serde_json::Value, serde_json::Error> {
    let Some(spec) = arg else {
        return error("this command needs an action spec".into());
    };
    let action = match spec.parse::<CsumAction>() {
        Ok(a) => a,
        Err(e) => return error(format!("bad action {spec:?}: {e}")),
    };
    let nports = d.switch.nports();
    let res = d.switch.rules().update(|acts| {
        if add {
            if action.port >= nports {
                return Err(format!("port {} does not exist ({nports} ports)", action.port));
            }
            acts.push(action.clone());
        } else {
            let i = acts
                .iter()
                .position(|a| *a == action)
                .ok_or_else(|| format!("no action {action}"))?;
            acts.remove(i);
        }
        Ok(())
    });
    match res {
        Ok(()) => serde_json::to_value(view::actions(&d.switch)),
        Err(e) => error(e),
    }
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
