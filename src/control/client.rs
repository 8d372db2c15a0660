//! `dpaa-vnic ctl`: sends one request to a running daemon and prints the JSON answer.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("connecting to control socket {path} (is the daemon running with --control?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("talking to the daemon")]
    Io(#[source] io::Error),
    #[error("daemon answered: {0}")]
    Daemon(String),
}

/// Sends `cmd`, returns the pretty-printed JSON answer.
pub fn request(path: &Path, cmd: &str, arg: Option<&str>) -> Result<String, ClientError> {
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(ClientError::Io)?;
    let req = serde_json::json!({ "cmd": cmd, "arg": arg }).to_string() + "\n";
    s.write_all(req.as_bytes()).map_err(ClientError::Io)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(ClientError::Io)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| ClientError::Io(io::Error::other(e)))?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(ClientError::Daemon(err.to_string()));
    }
    serde_json::to_string_pretty(&v).map_err(|e| ClientError::Io(io::Error::other(e)))
}
