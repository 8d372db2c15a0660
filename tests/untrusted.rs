//! A compromised QEMU and other local users against the daemon binary: each attack as a
//! test, with the figure it is held to. A frontend may only ask
//! for what was offered, only hold a bounded number of descriptors and bytes, only keep
//! its port while it is claimed, and never reach another port; a local user can neither
//! take a socket from its owner nor keep the scrape or the control socket from others.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};
use vhost::VhostBackend;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK, EFD_SEMAPHORE};

use common::daemon::*;
use common::frontend::*;
use common::wait_until;

const SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;
const ADD_MEM_REG: u32 = FrontendReq::ADD_MEM_REG as u32;
const GET_MAX_MEM_SLOTS: u32 = FrontendReq::GET_MAX_MEM_SLOTS as u32;
const SET_BACKEND_REQ_FD: u32 = FrontendReq::SET_BACKEND_REQ_FD as u32;
const RESET_DEVICE: u32 = FrontendReq::RESET_DEVICE as u32;
const MEM_SLOTS: u64 = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();
/// What the daemon offers: MQ, REPLY_ACK, CONFIG.
const OFFERED: u64 = VhostUserProtocolFeatures::MQ.bits()
    | REPLY_ACK
    | VhostUserProtocolFeatures::CONFIG.bits()
    | VhostUserProtocolFeatures::BACKEND_REQ.bits();

/// Sends `sig` to the daemon.
fn signal(d: &Daemon, sig: i32) {
    // SAFETY: kill(2) on the daemon's pid, a child of this test that has not been reaped.
    assert_eq!(unsafe { libc::kill(d.pid() as i32, sig) }, 0);
}

fn state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

/// Sends `req` asking for an answer and returns the status it gets back.
fn ask(r: &mut Raw, req: u32, body: &[u8], fds: &[i32]) -> Option<u64> {
    r.send(&msg(req, 1 | NEED_REPLY, body), fds);
    let (got, _, body) = r.recv()?;
    assert_eq!(got, req, "an answer to another request");
    Some(u64::from_le_bytes(body.get(..8)?.try_into().ok()?))
}

/// SET_VRING_ENABLE again and again before SET_FEATURES. One enable per queue
/// is kept, so 300 000 of them cost the daemon no memory.
#[test]
fn early_enables_hold_no_memory_however_many() {
    let mut d = Daemon::start(1, &[]);
    let b = Baseline::take(&d);
    let rss0 = d.settled().2;
    let mut r = Raw::connect(d.sock());
    r.send(&msg(SET_OWNER, 1, &[]), &[]);
    let batch = msg(SET_VRING_ENABLE, 1, &state(0, 1)).repeat(10_000);
    let t0 = Instant::now();
    for _ in 0..30 {
        r.0.write_all(&batch).unwrap();
    }
    // Answered after everything before it: the enables were all read.
    r.send(&msg(GET_FEATURES, 1, &[]), &[]);
    assert_eq!(r.recv().expect("GET_FEATURES answered").0, GET_FEATURES);
    let rss1 = d.rss_kb();
    // Kept as before, 300 000 enables would have held about 29 MB.
    eprintln!(
        "300 000 early enables in {:?}: RssAnon {rss0} -> {rss1} kB",
        t0.elapsed()
    );
    assert!(rss1 < rss0 + 4096, "RssAnon grew from {rss0} to {rss1} kB");
    drop(r);
    b.check(&mut d, "early enables");
}

/// Features and requests beyond the offer are refused with
/// a failure where the frontend waits for a status, and after 16 refusals the connection
/// ends; ADD_MEM_REG never holds a descriptor, and the other port goes on serving.
#[test]
fn only_what_was_offered_is_served() {
    let mut d = Daemon::start(2, &[]);
    let b = Baseline::take(&d);
    let refused0 = d.stat(0, "frontend_refused");
    let mut r = Raw::connect(d.sock());
    r.send(&msg(SET_OWNER, 1, &[]), &[]);
    r.send(&msg(SET_PROTOCOL_FEATURES, 1, &OFFERED.to_le_bytes()), &[]);
    let efd = EventFd::new(0).unwrap();
    let failures = [
        (
            SET_PROTOCOL_FEATURES,
            (OFFERED | MEM_SLOTS).to_le_bytes().to_vec(),
            None,
        ),
        (SET_FEATURES, (NET | 1 << 63).to_le_bytes().to_vec(), None),
        (SET_VRING_NUM, state(0, 3), None),
        (SET_VRING_ENABLE, state(1000, 1), None),
        (RESET_DEVICE, Vec::new(), None),
        // The config-change channel must be a socket.
        (SET_BACKEND_REQ_FD, Vec::new(), Some(efd.as_raw_fd())),
    ];
    for (req, body, fd) in &failures {
        let fds: Vec<i32> = fd.iter().copied().collect();
        assert_eq!(ask(&mut r, *req, body, &fds), Some(1), "request {req}");
    }
    // What was offered is still served on this connection.
    r.send(&msg(GET_FEATURES, 1, &[]), &[]);
    assert_eq!(r.recv().expect("GET_FEATURES answered").0, GET_FEATURES);
    // ADD_MEM_REG with a descriptor each, 600 of them.
    let f = memfd(0x1000);
    let mut region = vec![0u8; 8];
    for v in [0u64, 0x1000, 0x7f00_0000_0000, 0] {
        region.extend_from_slice(&v.to_le_bytes());
    }
    let mut failed = failures.len();
    let fds_during = (0..600)
        .map_while(|_| {
            let answer = ask(&mut r, ADD_MEM_REG, &region, &[f.as_raw_fd()])?;
            assert_eq!(answer, 1);
            failed += 1;
            Some(d.fds())
        })
        .max()
        .unwrap_or_default();
    assert!(r.hung_up(), "still connected after {failed} refusals");
    eprintln!("{failed} refusals answered, then the connection ended; daemon fds at most {fds_during}");
    assert_eq!(failed, 16, "refusals answered before the end");
    wait_until("refusals counted", || {
        d.stat(0, "frontend_refused") == refused0 + 17
    });
    // A request whose answer is a value, not a status, cannot be refused with a status.
    let mut r = Raw::connect(d.sock());
    r.send(&msg(SET_OWNER, 1, &[]), &[]);
    r.send(&msg(SET_PROTOCOL_FEATURES, 1, &OFFERED.to_le_bytes()), &[]);
    r.send(&msg(GET_MAX_MEM_SLOTS, 1 | NEED_REPLY, &[]), &[]);
    assert!(r.hung_up());
    drop(r);
    fresh_frontend_works(&d, 1);
    b.check(&mut d, "unoffered requests");
}

/// Sets the daemon's soft descriptor limit; returns the one it had.
fn set_soft_nofile(pid: u32, soft: u64) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a null new limit only reads into `old`.
    assert_eq!(
        unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) },
        0
    );
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    // SAFETY: both pointers are to live rlimit values; only the soft limit changes.
    assert_eq!(
        unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) },
        0,
        "prlimit {soft}: {}",
        std::io::Error::last_os_error()
    );
    old.rlim_cur
}

/// A session start that runs out of descriptors at every step in turn (the
/// daemon's limit set just above what it holds, one more each round). Whatever step fails,
/// descriptors and threads come back to the baseline and the port serves again.
#[test]
fn a_session_that_fails_part_way_leaves_nothing() {
    let mut d = Daemon::start(1, &["--queues", "4"]);
    d.wait_idle(0);
    let (fds0, threads0, _) = d.settled();
    let (mut failed, mut served) = (0, 0);
    for spare in 0..90u64 {
        let limit = set_soft_nofile(d.pid(), fds0 as u64 + spare);
        let sock = d.sock().to_path_buf();
        let attempt = thread::spawn(move || {
            let g = Guest::connect(&sock, NET);
            g.fe.get_features().unwrap();
        });
        let t0 = Instant::now();
        while !attempt.is_finished() && t0.elapsed() < Duration::from_millis(1500) {
            thread::sleep(Duration::from_millis(10));
        }
        // With room again, a session still waiting (its accept held back) goes through.
        set_soft_nofile(d.pid(), limit);
        wait_until("the attempt over", || attempt.is_finished());
        match attempt.join() {
            Ok(()) => served += 1,
            Err(_) => failed += 1,
        }
        wait_until("the attempt torn down", || !d.connected(0));
        let t0 = Instant::now();
        let (fds, threads) = loop {
            let (fds, threads, _) = d.settled();
            if (fds <= fds0 && threads <= threads0) || t0.elapsed() > Duration::from_secs(10) {
                break (fds, threads);
            }
        };
        assert_eq!(
            (fds, threads),
            (fds0, threads0),
            "with {spare} descriptors spare: descriptors and threads (before: {fds0}, {threads0})"
        );
    }
    eprintln!("90 rounds: {failed} sessions failed part way, {served} served");
    assert!(failed >= 10 && served >= 10, "{failed} failed, {served} served");
    // Each round logs its connection: no log budget here, but the daemon serves on.
    assert!(d.alive());
    fresh_frontend_works(&d, 0);
}

/// A kick eventfd in semaphore mode, written once with a huge count, would wake
/// its worker that many times. It is refused (Linux 6.6 on shows the flag), and the
/// daemon's CPU time stays flat.
#[test]
fn a_semaphore_kick_and_an_oversized_table_are_refused() {
    let mut d = Daemon::start(1, &[]);
    case(&mut d, "semaphore kick", |d| {
        let refused = d.stat(0, "frontend_refused");
        let e = EventFd::new(EFD_SEMAPHORE | EFD_NONBLOCK).unwrap();
        e.write(1 << 62).unwrap();
        let mut r = Raw::connect(d.sock());
        r.send(&msg(SET_OWNER, 1, &[]), &[]);
        r.send(&msg(SET_VRING_KICK, 1, &1u64.to_le_bytes()), &[e.as_raw_fd()]);
        assert!(r.hung_up());
        assert_eq!(d.stat(0, "frontend_refused"), refused + 1);
        let cpu0 = d.cpu_ticks();
        thread::sleep(Duration::from_secs(1));
        let spent = d.cpu_ticks() - cpu0;
        assert!(spent < 20, "{spent} ticks of CPU in the second after");
    });
    case(&mut d, "nine memory regions", |d| {
        let files: Vec<_> = (0..9).map(|_| memfd(0x1000)).collect();
        let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
        let regions: Vec<_> = (0..9).map(|i| (i * 0x1000, 0x1000, 0)).collect();
        let mut r = Raw::connect(d.sock());
        r.send(&msg(SET_OWNER, 1, &[]), &[]);
        r.send(&msg(SET_MEM_TABLE, 1, &mem_table(&regions)), &fds);
        assert!(r.hung_up());
    });
    let log = d.log_text();
    for needle in ["semaphore mode", "at most 8 without CONFIGURE_MEM_SLOTS"] {
        assert!(log.contains(needle), "no {needle:?} in\n{log}");
    }
}

/// A connection that never claims the port is let go after --handshake-timeout,
/// so the frontend waiting behind it gets the port; one that talks without claiming it is
/// let go as soon. A claimed, serving frontend that goes quiet is never dropped.
#[test]
fn a_frontend_must_claim_its_port_in_time() {
    let mut d = Daemon::start(1, &["--handshake-timeout", "1"]);
    let b = Baseline::take(&d);
    let refused = d.stat(0, "frontend_refused");
    let t0 = Instant::now();
    let mut silent = Raw::connect(d.sock());
    // QEMU reconnecting behind it.
    let sock = d.sock().to_path_buf();
    let qemu = thread::spawn(move || {
        let g = Guest::connect(&sock, NET);
        g.fe.get_features().unwrap();
        Instant::now()
    });
    assert!(silent.hung_up(), "the silent connection was kept");
    let served = qemu.join().unwrap().duration_since(t0);
    eprintln!("the waiting frontend was served {served:?} after the silent one connected");
    assert!(served < Duration::from_secs(4), "{served:?}");
    // Talking without SET_OWNER does not stretch the deadline.
    let mut chatty = Raw::connect(d.sock());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        chatty.send(&msg(GET_FEATURES, 1, &[]), &[]);
        if chatty.recv().is_none() {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let held = t0.elapsed();
    assert!(
        held < Duration::from_secs(3),
        "a chatty unclaimed connection held {held:?}"
    );
    wait_until("both counted", || d.stat(0, "frontend_refused") == refused + 2);
    // Claimed and quiet for three times the deadline: still served.
    let g = Guest::connect(d.sock(), NET);
    thread::sleep(Duration::from_secs(3));
    assert!(d.connected(0));
    let txq = g.queue(1);
    let before = d.stat(0, "tx_packets");
    post_tx(&g, &txq, 0);
    g.kick[1].write(1).unwrap();
    wait_until("the quiet frontend's frame", || {
        d.stat(0, "tx_packets") == before + 1
    });
    drop(txq);
    drop(g);
    assert!(d
        .log_text()
        .contains("did not claim the device (SET_OWNER) within 1s"));
    b.check(&mut d, "handshake");
}

/// Runs `cmd` as user `nobody`: its exit status and output.
fn as_nobody(cmd: &mut Command) -> std::process::Output {
    cmd.uid(65534).gid(65534).output().unwrap()
}

/// In a directory anyone may write (0777, not sticky), another user starts a
/// second daemon on root's live socket: it is refused, root's socket stays the same file
/// and serves. A stale socket of another user is never replaced. Needs root (CI runs as
/// root) to be another user; as anyone else the second daemon is the same user, and the
/// lock refuses it all the same.
#[test]
fn sockets_are_never_taken_from_their_owner() {
    let root = nix::unistd::Uid::effective().is_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut d = Daemon::start_in(dir, 1, &[], |_| {});
    let b = Baseline::take(&d);
    let before = std::fs::metadata(d.sock()).unwrap();
    // A copy the other user can run whatever the build directory's permissions.
    let bin = d.dir.path().join("dpaa-vnic");
    std::fs::copy(BIN, &bin).unwrap();
    let mut second = Command::new(&bin);
    second.arg("--socket").arg(d.sock());
    let out = if root {
        as_nobody(&mut second)
    } else {
        second.output().unwrap()
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("another process is serving") || err.contains("claiming"),
        "{err}"
    );
    let after = std::fs::metadata(d.sock()).unwrap();
    assert_eq!((after.dev(), after.ino()), (before.dev(), before.ino()));
    b.check(&mut d, "second daemon on the same socket");
    if root {
        let stale = d.dir.path().join("theirs.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        nix::unistd::chown(&stale, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let out = Command::new(BIN).arg("--socket").arg(&stale).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("is a socket of user 65534"), "{err}");
        assert!(stale.exists());
    }
    // Stopping removes the socket it bound, and its lock.
    let sock = d.sock().to_path_buf();
    signal(&d, libc::SIGHUP);
    let status = d.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "SIGHUP: {status}");
    assert!(!sock.exists(), "the socket was left behind");
    assert!(
        !d.dir.path().join("p0.sock.lock").exists(),
        "the lock was left behind"
    );
}

/// Socket paths up to the 107 bytes a Unix address holds serve frontends; a
/// longer one is refused at start, with the limit.
#[test]
fn every_socket_path_that_can_be_bound_serves() {
    let base = tempfile::tempdir().unwrap();
    // The harness binds p0.sock and ctl.sock in one directory: name it so that the longer,
    // ctl.sock, is 107 bytes (p0.sock 106).
    let name = 107 - base.path().as_os_str().len() - "/".len() - "/ctl.sock".len();
    let dir = tempfile::Builder::new()
        .prefix(&"d".repeat(name - 6))
        .rand_bytes(6)
        .tempdir_in(base.path())
        .unwrap();
    let mut d = Daemon::start_in(dir, 1, &[], |_| {});
    let len = d.sock().as_os_str().len();
    assert!((100..=107).contains(&len), "{len}");
    let b = Baseline::take(&d);
    fresh_frontend_works(&d, 0);
    b.check(&mut d, "long socket path");
    let too_long = format!("/tmp/{}", "x".repeat(103));
    let out = Command::new(BIN).arg("--socket").arg(&too_long).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("108 bytes") && err.contains("at most 107"), "{err}");
}

/// `--metrics unix:PATH` serves the page on a socket with the
/// daemon's socket mode, which no other user may open.
#[test]
fn metrics_on_a_unix_socket_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.sock");
    let spec = format!("unix:{}", path.display());
    let mut d = Daemon::start(1, &["--metrics", &spec]);
    wait_until("metrics socket", || path.exists());
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("dpaa_vnic_connections_total"),
        "{out}"
    );
    assert!(d.alive());
    signal(&d, libc::SIGTERM);
    assert_eq!(d.child.wait().unwrap().code(), Some(0));
    assert!(!path.exists(), "the metrics socket was left behind");
}

/// The operator's own edits are bounded too: a checksum action past the cap is refused
/// with the cap, and the list stays at it.
#[test]
fn control_edits_are_capped() {
    let d = Daemon::start(1, &[]);
    let mut refused = None;
    for i in 0..300u32 {
        let spec = format!("port=0,dir=egress,update=udp,dst=10.{}.{}.0/24", i / 256, i % 256);
        let v = d.ctl(&format!(r#"{{"cmd":"action-add","arg":"{spec}"}}"#));
        if let Some(e) = v["error"].as_str() {
            refused = Some((i, e.to_string()));
            break;
        }
    }
    let (at, why) = refused.expect("300 actions were all taken");
    assert_eq!(at, 256, "{why}");
    assert!(why.contains("256 is the most"), "{why}");
    let list = d.ctl(r#"{"cmd":"action-list"}"#);
    assert_eq!(list["actions"].as_array().map(Vec::len), Some(256), "{list}");
}

/// The descriptor budget at start: the soft limit is raised to the hard one, and a hard
/// limit below what the ports may need is refused with both numbers.
#[test]
fn the_descriptor_limit_is_raised_and_checked_at_start() {
    let limit = |soft: u64, hard: u64| {
        move || {
            let l = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit in the child before exec, with a live rlimit value.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }
    };
    let d = Daemon::start_in(tempfile::tempdir().unwrap(), 1, &[], |c| {
        // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
        unsafe { c.pre_exec(limit(256, 4096)) };
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    let open = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(open.split_whitespace().nth(3), Some("4096"), "{open}");
    drop(d);
    let mut cmd = Command::new(BIN);
    for i in 0..4 {
        cmd.arg("--socket")
            .arg(format!("/tmp/vnic-budget-{}-{i}.sock", std::process::id()));
    }
    cmd.args(["--queues", "16"]);
    // SAFETY: as above.
    unsafe { cmd.pre_exec(limit(64, 64)) };
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("descriptors at once and the process may open 64"),
        "{err}"
    );
}
