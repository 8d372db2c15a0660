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
}

pub struct ControlServer {
    ports: Arc<Vec<PortRef>>,
}

impl ControlServer {
    pub fn new(ports: Vec<PortRef>) -> Self {
        ControlServer {
            ports: Arc::new(ports),
        }
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
        let ports = self.ports.clone();
        thread::Builder::new()
            .name("vnic-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => {
                            let ports = ports.clone();
                            let spawned =
                                thread::Builder::new()
                                    .name("vnic-ctl-conn".into())
                                    .spawn(move || {
                                        if let Err(e) = serve_client(&ports, s) {
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

/// Answers one request line.
pub fn answer(ports: &[PortRef], line: &str) -> String {
    let reply = match serde_json::from_str::<Request>(line) {
        Ok(r) => match r.cmd.as_str() {
            "stats" => serde_json::to_value(view::stats(ports)),
            "filter" => serde_json::to_value(view::filter(ports)),
            other => Ok(serde_json::json!({ "error": format!("unknown command {other:?}") })),
        },
        Err(e) => Ok(serde_json::json!({ "error": format!("bad request: {e}") })),
    };
    match reply {
        Ok(v) => v.to_string(),
        Err(e) => serde_json::json!({ "error": format!("encoding reply: {e}") }).to_string(),
    }
}

fn serve_client(ports: &[PortRef], s: UnixStream) -> io::Result<()> {
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(io::Read::take(s, MAX_REQUEST));
    let mut line = String::new();
    while r.read_line(&mut line)? > 0 {
        let mut out = answer(ports, line.trim());
        out.push('\n');
        w.write_all(out.as_bytes())?;
        line.clear();
    }
    Ok(())
}
