//! `dpaa-vnic ctl`: sends requests to a running daemon and prints the answers, as tables
//! for people or as the JSON of the versioned interface (docs/interface.md) for programs.

use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::capture::{self, CaptureAsk, CaptureError, Copied};
use super::present;
use crate::cli::{CaptureDirection, CtlArgs, CtlCommand, Format, LinkState};

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("connecting to control socket {path} (is the daemon running with --control?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} closed the connection without an answer: is it the daemon's control socket (--control), not a vhost-user port's socket?")]
    NoAnswer(PathBuf),
    #[error("{path} answered something that is not JSON: is it the daemon's control socket?")]
    NotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("talking to the daemon")]
    Io(#[source] io::Error),
    #[error("daemon answered: {0}")]
    Daemon(String),
    #[error("--interval {0}: a number of seconds of at least 0.1")]
    Interval(f64),
    #[error("creating {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("capture")]
    Capture(#[source] CaptureError),
}

/// Where a bare `--control` listens and `ctl` looks by default: $DPAA_VNIC_CONTROL, else
/// $XDG_RUNTIME_DIR/dpaa-vnic/ctl (the user's own runtime directory), else
/// /run/dpaa-vnic/ctl.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DPAA_VNIC_CONTROL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/run"), PathBuf::from);
    base.join("dpaa-vnic").join("ctl")
}

/// Sends one request and returns the daemon's answer; an `"error"` answer is an error.
pub fn ask(path: &Path, cmd: &str, arg: Option<&str>) -> Result<serde_json::Value, ClientError> {
    let req = serde_json::json!({ "cmd": cmd, "arg": arg });
    let (v, _) = request(path, &req)?;
    Ok(v)
}

/// Sends `req` and reads the answer line; returns it with the connection, whose reader
/// may hold what the daemon sent after the line.
fn request(
    path: &Path,
    req: &serde_json::Value,
) -> Result<(serde_json::Value, BufReader<UnixStream>), ClientError> {
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(ClientError::Io)?;
    let req = req.to_string() + "\n";
    // A vhost-user socket may hang up before the whole request is written.
    if let Err(e) = s.write_all(req.as_bytes()) {
        return Err(match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                ClientError::NoAnswer(path.to_path_buf())
            }
            _ => ClientError::Io(e),
        });
    }
    let mut line = String::new();
    let mut r = BufReader::new(s);
    match r.read_line(&mut line) {
        Ok(0) => return Err(ClientError::NoAnswer(path.to_path_buf())),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
            return Err(ClientError::NoAnswer(path.to_path_buf()))
        }
        Err(e) => return Err(ClientError::Io(e)),
    }
    let v: serde_json::Value = serde_json::from_str(&line).map_err(|source| ClientError::NotJson {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(ClientError::Daemon(err.to_string()));
    }
    Ok((v, r))
}

/// `ctl capture`: streams port `ask.port`'s frames into `file` (- for standard output)
/// and says on standard error what went by.
fn capture(path: &Path, ask: &CaptureAsk, file: &Path) -> Result<(), ClientError> {
    let req = serde_json::json!({ "cmd": "capture", "capture": ask });
    let (_, r) = request(path, &req)?;
    // Frames may be far apart: the stream ends when the daemon says so.
    r.get_ref().set_read_timeout(None).map_err(ClientError::Io)?;
    let seen = if file == Path::new("-") {
        capture::copy(r, io::stdout().lock())
    } else {
        let f = std::fs::File::create(file).map_err(|source| ClientError::Create {
            path: file.to_path_buf(),
            source,
        })?;
        capture::copy(r, f)
    }
    .map_err(ClientError::Capture)?;
    eprintln!("{}", summary(ask.port, &seen));
    Ok(())
}

fn summary(port: usize, seen: &Copied) -> String {
    let mut s = format!("port {port}: captured {} frames", seen.frames);
    let dropped: u64 = seen.dropped.iter().map(|(_, n)| n).sum();
    if dropped > 0 {
        let why: Vec<String> = seen.dropped.iter().map(|(w, n)| format!("{n} {w}")).collect();
        s += &format!(", {dropped} of them dropped ({})", why.join(", "));
    }
    if seen.false_positives > 0 {
        s += &format!(", {} taken by a hash bucket false positive", seen.false_positives);
    }
    if seen.lost > 0 {
        s += &format!("; {} more went by while the capture's ring was full", seen.lost);
    }
    s
}

/// Runs one `ctl` command and writes its output to `out`.
pub fn run(args: &CtlArgs, out: &mut dyn Write) -> Result<(), ClientError> {
    let path = args.control.clone().unwrap_or_else(default_path);
    let format = args.format.unwrap_or(if io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Json
    });
    let owned: String;
    let (cmd, arg) = match &args.what {
        CtlCommand::Stats => ("stats", None),
        CtlCommand::Filter => ("filter", None),
        CtlCommand::Info => ("info", None),
        CtlCommand::Action { op } => op.request(),
        CtlCommand::Route { op } => op.request(),
        CtlCommand::Watch { interval, count } => return watch(&path, *interval, *count, out),
        CtlCommand::Announce { port } => {
            owned = port.map(|p| p.to_string()).unwrap_or_default();
            ("announce", port.map(|_| owned.as_str()))
        }
        CtlCommand::Capture {
            port,
            file,
            direction,
            count,
            seconds,
            snaplen,
        } => {
            let ask = CaptureAsk {
                port: *port,
                sent: *direction != CaptureDirection::Rx,
                offered: *direction != CaptureDirection::Tx,
                count: *count,
                seconds: *seconds,
                snaplen: *snaplen,
            };
            return capture(&path, &ask, file);
        }
        CtlCommand::QueueCpus { port, map } => {
            owned = std::iter::once(port.to_string())
                .chain(map.iter().cloned())
                .collect::<Vec<_>>()
                .join(" ");
            ("queue-cpus", Some(owned.as_str()))
        }
        CtlCommand::Link { port, state } => {
            let word = if *state == LinkState::Up { "up" } else { "down" };
            owned = format!("{port} {word}");
            ("link", Some(owned.as_str()))
        }
    };
    let v = ask(&path, cmd, arg)?;
    let text = match format {
        Format::Json => serde_json::to_string_pretty(&v).map_err(|e| ClientError::Io(io::Error::other(e)))?,
        Format::Table => present::answer(cmd, &v),
    };
    writeln!(out, "{text}").map_err(ClientError::Io)
}

/// `ctl watch`: the rates between successive `stats`, every `interval` seconds, `count`
/// times (or until interrupted). On a terminal each view replaces the last.
fn watch(path: &Path, interval: f64, count: Option<u64>, out: &mut dyn Write) -> Result<(), ClientError> {
    if !interval.is_finite() || interval < 0.1 {
        return Err(ClientError::Interval(interval));
    }
    let every = Duration::from_secs_f64(interval);
    let in_place = io::stdout().is_terminal();
    let mut last = (Instant::now(), ask(path, "stats", None)?);
    let mut shown = 0u64;
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(every.saturating_sub(last.0.elapsed()));
        let now = (Instant::now(), ask(path, "stats", None)?);
        let seconds = now.0.duration_since(last.0).as_secs_f64();
        let view = present::rates(&last.1, &now.1, seconds);
        // Home and clear, then the view: it replaces the last one in place.
        let clear = if in_place { "\x1b[H\x1b[2J" } else { "" };
        writeln!(out, "{clear}{view}").map_err(ClientError::Io)?;
        out.flush().map_err(ClientError::Io)?;
        last = now;
        shown += 1;
    }
    Ok(())
}
