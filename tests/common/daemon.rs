//! The daemon binary as a test harness for hostile cases: started on temp sockets with a
//! control socket, its log in a file; raw vhost-user connections; and the baseline every
//! case ends with (alive, serving, no descriptor and a bounded log more than before).

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::frontend::*;
use super::wait_until;

pub const BIN: &str = env!("CARGO_BIN_EXE_dpaa-vnic");
pub const HDR: usize = 12;
/// Log lines one case may cost: a connection logs two, a refusal or a broken ring one,
/// and the rate limit (20 a second per target) caps anything a frontend repeats.
pub const LOG_BUDGET: usize = 60;

/// The daemon binary with a control socket, its stderr in a file.
pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub socks: Vec<PathBuf>,
    pub ctl: PathBuf,
    pub log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    pub fn start(ports: usize, extra: &[&str]) -> Daemon {
        Daemon::start_in(tempfile::tempdir().unwrap(), ports, extra, |_| {})
    }

    /// [`Daemon::start`] in `dir`, with `setup` given the command before it runs.
    pub fn start_in(
        dir: tempfile::TempDir,
        ports: usize,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        let socks: Vec<PathBuf> = (0..ports)
            .map(|i| dir.path().join(format!("p{i}.sock")))
            .collect();
        let ctl = dir.path().join("ctl.sock");
        let log = dir.path().join("log");
        let mut cmd = Command::new(BIN);
        for s in &socks {
            cmd.arg("--socket").arg(s);
        }
        cmd.arg("--control").arg(&ctl).args(extra);
        setup(&mut cmd);
        let child = cmd
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            dir,
            socks,
            ctl,
            log,
        };
        wait_until("daemon up", || UnixStream::connect(&d.ctl).is_ok());
        d
    }

    pub fn sock(&self) -> &Path {
        &self.socks[0]
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Descriptors, threads and RSS once they hold still for half a second: a client served
    /// a moment ago keeps a thread and its descriptors until it notices the hang-up.
    pub fn settled(&self) -> (usize, usize, u64) {
        let mut last = (self.fds(), self.threads());
        let mut same = 0;
        while same < 3 {
            thread::sleep(Duration::from_millis(150));
            let now = (self.fds(), self.threads());
            same = if now == last { same + 1 } else { 0 };
            last = now;
        }
        (last.0, last.1, self.rss_kb())
    }

    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .unwrap()
            .count()
    }

    /// The daemon's own resident memory (heap, stacks): RssAnon, without the guest pages it
    /// has touched (RssShmem), which go with their connection.
    pub fn rss_kb(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// User plus system CPU time, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        // Fields 14 and 15 of stat; `after` starts at field 3.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_lines(&self) -> usize {
        self.log_text().lines().count()
    }

    pub fn ctl(&self, req: &str) -> serde_json::Value {
        let (_, line) = self.ctl_client(req);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e} in {line:?}"))
    }

    /// A new control client that sent `req`, and the line it got back: the answer, or the
    /// refusal of a client past the cap. A refused client may be closed before its request
    /// is written; the refusal is still there to read.
    pub fn ctl_client(&self, req: &str) -> (UnixStream, String) {
        let mut s = UnixStream::connect(&self.ctl).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let sent = s.write_all(format!("{req}\n").as_bytes());
        let mut line = String::new();
        BufReader::new(&mut s).read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "no answer to {req} (request written: {sent:?})");
        (s, line)
    }

    /// A counter of port `port` from `ctl stats` (totals for queue counters).
    pub fn stat(&self, port: usize, key: &str) -> u64 {
        let v = self.ctl(r#"{"cmd":"stats"}"#);
        let p = &v["ports"][port];
        p.get(key)
            .or_else(|| p["totals"].get(key))
            .and_then(|x| x.as_u64())
            .unwrap_or_else(|| panic!("no counter {key} in {p}"))
    }

    pub fn connected(&self, port: usize) -> bool {
        self.ctl(r#"{"cmd":"stats"}"#)["ports"][port]["connected"]
            .as_bool()
            .unwrap()
    }

    /// Waits until port 0 has taken `n` connections in all and none is open.
    pub fn wait_idle(&self, n: u64) {
        wait_until("connection torn down", || {
            self.stat(0, "connections") >= n && !self.connected(0)
        });
    }
}

/// A raw vhost-user connection.
pub struct Raw(pub UnixStream);

pub fn msg(req: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut v = req.to_le_bytes().to_vec();
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(body);
    v
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw(s)
    }

    pub fn send(&self, bytes: &[u8], fds: &[RawFd]) {
        // The daemon may hang up half way: that is its right.
        let _ = self.0.send_with_fds(&[bytes], fds);
    }

    pub fn recv(&mut self) -> Option<(u32, u32, Vec<u8>)> {
        let mut hdr = [0u8; 12];
        self.0.read_exact(&mut hdr).ok()?;
        let w = |i: usize| u32::from_le_bytes(hdr[4 * i..4 * i + 4].try_into().unwrap());
        let mut body = vec![0u8; w(2) as usize];
        self.0.read_exact(&mut body).ok()?;
        Some((w(0), w(1), body))
    }

    /// Waits for the daemon to hang up on this connection.
    pub fn hung_up(&mut self) -> bool {
        let mut b = [0u8; 64];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            match self.0.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
        false
    }
}

/// The net attachment's features.
pub const NET: u64 = VERSION_1 | MRG_RXBUF | PROTOCOL_FEATURES;

pub fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x52, 0x54, 0x00, 0xd0, 0xaa, 0x09, 0x08, 0x00]);
    f.resize(len, 0x5a);
    f
}

/// Queues one well-formed 60-byte TX frame as the driver's `pos`th chain (descriptors
/// `2 * pos` and the next, avail entry `pos`), and publishes it. Positions stop short of
/// half the ring: MockSplitQueue 0.18 puts the used ring over the avail entries past that.
pub fn post_tx(g: &Guest, txq: &MockSplitQueue<'_, GuestMemoryMmap>, pos: u16) {
    stage_tx(g, txq, pos);
    txq.avail().idx().store(pos.wrapping_add(1));
}

/// [`post_tx`] but for the last step: the chain is written, not yet published, so the
/// daemon cannot take it yet.
pub fn stage_tx(g: &Guest, txq: &MockSplitQueue<'_, GuestMemoryMmap>, pos: u16) {
    assert!(pos < QSIZE / 2);
    let slot = 2 * pos;
    let buf = 0x10_0000 + 0x2000 * u64::from(slot);
    g.mem.write_slice(&[0u8; HDR], GuestAddress(buf)).unwrap();
    g.mem.write_slice(&frame(60), GuestAddress(buf + 0x1000)).unwrap();
    txq.desc_table()
        .store(slot, d(buf, HDR as u32, F_NEXT, slot + 1))
        .unwrap();
    txq.desc_table()
        .store(slot + 1, d(buf + 0x1000, 60, 0, 0))
        .unwrap();
    txq.avail()
        .ring()
        .ref_at(usize::from(pos % QSIZE))
        .unwrap()
        .store(slot);
}

/// A new frontend on `port` sets up, sends one frame and sees it counted.
pub fn fresh_frontend_works(d: &Daemon, port: usize) {
    let before = d.stat(port, "tx_packets");
    let g = Guest::connect(&d.socks[port], NET);
    let txq = g.queue(1);
    post_tx(&g, &txq, 0);
    g.kick[1].write(1).unwrap();
    // The worker counts the frame as it forwards it and returns the chain after (one
    // store of the used index per burst), so the two are seen to change in that order.
    wait_until("fresh frontend's frame counted and its chain returned", || {
        txq.used().idx().load() == 1
    });
    assert_eq!(d.stat(port, "tx_packets"), before + 1);
}

/// What every case ends with: the daemon alive, serving, no descriptor and no more than
/// [`LOG_BUDGET`] log lines more than before.
pub struct Baseline {
    fds: usize,
    log: usize,
    connections: u64,
}

impl Baseline {
    pub fn take(d: &Daemon) -> Baseline {
        let connections = d.stat(0, "connections");
        d.wait_idle(connections);
        Baseline {
            fds: d.settled().0,
            log: d.log_lines(),
            connections,
        }
    }

    pub fn check(&self, d: &mut Daemon, case: &str) {
        assert!(d.alive(), "{case}: the daemon died:\n{}", d.log_text());
        // Whatever the case left open is torn down before a fresh frontend gets in.
        wait_until("the case's connection torn down", || !d.connected(0));
        fresh_frontend_works(d, 0);
        d.wait_idle(self.connections + 1);
        let t0 = Instant::now();
        let fds = loop {
            let fds = d.settled().0;
            if fds <= self.fds || t0.elapsed() > Duration::from_secs(10) {
                break fds;
            }
        };
        assert!(fds <= self.fds, "{case}: {fds} descriptors, {} before", self.fds);
        let lines = d.log_lines() - self.log;
        assert!(
            lines <= LOG_BUDGET,
            "{case}: {lines} log lines:\n{}",
            d.log_text()
        );
    }
}

/// Runs `case` against `d` between a baseline and its check.
pub fn case(d: &mut Daemon, name: &str, f: impl FnOnce(&Daemon)) {
    let b = Baseline::take(d);
    f(d);
    b.check(d, name);
}

pub fn memfd(len: u64) -> File {
    // SAFETY: a NUL-terminated name and no flags; the descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"guest".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

pub fn mem_table(regions: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut b = (regions.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 4]);
    for &(gpa, size, offset) in regions {
        for v in [gpa, size, 0x7f00_0000_0000u64 + gpa, offset] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b
}

pub const GET_FEATURES: u32 = FrontendReq::GET_FEATURES as u32;
pub const SET_FEATURES: u32 = FrontendReq::SET_FEATURES as u32;
pub const SET_OWNER: u32 = FrontendReq::SET_OWNER as u32;
pub const SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
pub const SET_VRING_NUM: u32 = FrontendReq::SET_VRING_NUM as u32;
pub const SET_VRING_ADDR: u32 = FrontendReq::SET_VRING_ADDR as u32;
pub const SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
pub const SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
pub const SET_PROTOCOL_FEATURES: u32 = FrontendReq::SET_PROTOCOL_FEATURES as u32;
pub const NEED_REPLY: u32 = VhostUserHeaderFlag::NEED_REPLY.bits();
pub const REPLY_ACK: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits();
