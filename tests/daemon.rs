//! The daemon started and stopped in-process (`dpaa_vnic::daemon`): what the command line
//! asks for is what runs, and what it bound is gone once it stops, on a start that fails
//! halfway as on a clean one; stopping ends every thread it started, within a bound, even
//! with a frontend, a QEMU monitor and a control client connected and silent.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Parser;
use dpaa_vnic::cli::Cli;
use dpaa_vnic::config::Config;
use dpaa_vnic::control::view::PortRef;
use dpaa_vnic::daemon::{self, StartError};

fn config(args: &[&str]) -> Config {
    let cli = Cli::try_parse_from(std::iter::once("dpaa-vnic").chain(args.iter().copied())).unwrap();
    Config::try_from(cli.run).unwrap()
}

/// The tests here count this process's threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Threads of this process the daemon named (vnic-port0, vnic-tap1-q0, vnic-control, ...).
fn daemon_threads() -> Vec<String> {
    let mut names = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(comm) = std::fs::read_to_string(t.path().join("comm")) {
            if comm.starts_with("vnic") {
                names.push(comm.trim().to_string());
            }
        }
    }
    names.sort();
    names
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

#[test]
fn a_started_daemon_runs_what_was_asked_and_removes_its_sockets_when_dropped() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (a, b, ctl) = (
        dir.path().join("a.sock"),
        dir.path().join("b.sock"),
        dir.path().join("ctl"),
    );
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cfg = config(&[
        "--socket",
        &s(&a),
        "--socket",
        &s(&b),
        "--control",
        &s(&ctl),
        "--neigh-limit",
        "7",
        "--fdb-limit",
        "9",
    ]);
    let running = daemon::start(&cfg).unwrap();
    assert!(is_socket(&a) && is_socket(&b) && is_socket(&ctl));
    let d = running.daemon();
    assert_eq!(d.ports.len(), 2);
    assert!(matches!(&d.ports[1], PortRef::Guest(g) if g.socket == b));
    // Both limits reach the switch (--neigh-limit did not before this test).
    assert_eq!(d.switch.neighbours().limit(), 7);
    assert_eq!(d.switch.fdb_limit(), 9);
    drop(running);
    assert!(!a.exists() && !b.exists() && !ctl.exists());
}

#[test]
fn a_start_that_fails_halfway_removes_what_it_bound() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    // Not a socket: binding refuses to replace it.
    std::fs::write(&b, "a file someone keeps").unwrap();
    let cfg = config(&["--socket", a.to_str().unwrap(), "--socket", b.to_str().unwrap()]);
    match daemon::start(&cfg) {
        Err(StartError::Port { port: 1, .. }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("started on a regular file"),
    }
    assert!(!a.exists(), "the first port's socket was removed");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "a file someone keeps");
}

/// A QEMU monitor that greets, accepts capabilities, answers the first query with one NIC,
/// says so on `answered`, and then says nothing: the follower waits on it for ever unless a
/// stop ends the wait. Returns what the follower sent after that (nothing, then end of file).
fn silent_qmp(path: &Path, answered: std::sync::mpsc::Sender<()>) -> std::thread::JoinHandle<Vec<u8>> {
    let l = UnixListener::bind(path).unwrap();
    std::thread::Builder::new()
        .name("test-qmp".into())
        .spawn(move || {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            writeln!(w, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            r.read_line(&mut line).unwrap();
            writeln!(w, r#"{{"return": {{}}}}"#).unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("query-rx-filter"), "{line}");
            writeln!(
                w,
                r#"{{"return": [{{"name": "nic0", "promiscuous": false, "multicast": "normal", "unicast": "normal", "broadcast-allowed": false, "multicast-overflow": false, "unicast-overflow": false, "main-mac": "52:54:00:12:34:56", "unicast-table": [], "multicast-table": []}}]}}"#
            )
            .unwrap();
            answered.send(()).unwrap();
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
            rest
        })
        .unwrap()
}

/// Whether this process may create a tap (CAP_NET_ADMIN, /dev/net/tun): CI and sessions
/// run as root, where the tap part below always runs.
fn can_make_taps() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/net/tun").exists()
}

#[test]
fn stopping_ends_every_thread_in_order_with_peers_connected_and_silent() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(daemon_threads(), Vec::<String>::new(), "no daemon running before");
    let dir = tempfile::tempdir().unwrap();
    let (a, ctl, qmp) = (
        dir.path().join("a.sock"),
        dir.path().join("ctl"),
        dir.path().join("qmp.sock"),
    );
    let (answered, following) = std::sync::mpsc::channel();
    let qemu = silent_qmp(&qmp, answered);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let tap = format!("vnstop{}", std::process::id() % 100_000);
    let mut args = vec![
        "--socket".to_string(),
        s(&a),
        "--control".into(),
        s(&ctl),
        "--metrics".into(),
        "127.0.0.1:0".into(),
        "--qmp".into(),
        format!("{},port=0,nic=nic0", s(&qmp)),
        "--queues".into(),
        "2".into(),
    ];
    let taps = can_make_taps();
    if taps {
        args.extend(["--tap".into(), tap.clone()]);
    } else {
        eprintln!("not root: the tap part of this test does not run here (it does in CI)");
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let running = daemon::start(&config(&args)).unwrap();
    // Threads: the port, the control socket, metrics, the QMP follower, a reader per tap queue.
    assert_eq!(running.threads(), 4 + if taps { 2 } else { 0 });
    // A frontend that connects and says nothing; a control client that does the same.
    let frontend = UnixStream::connect(&a).unwrap();
    let control_client = UnixStream::connect(&ctl).unwrap();
    let t0 = Instant::now();
    while !daemon_threads().iter().any(|t| t.starts_with("vnic-ctl-conn")) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the control client was not served"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The port is serving the frontend: the vhost-user handler's threads are up.
    while daemon_threads()
        .iter()
        .filter(|t| t.starts_with("vnic-port0"))
        .count()
        < 2
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the frontend was not served: {:?}",
            daemon_threads()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    following
        .recv_timeout(Duration::from_secs(10))
        .expect("the QMP follower queried the NIC");
    if taps {
        assert!(Path::new("/sys/class/net").join(&tap).exists());
    }
    let t1 = Instant::now();
    drop(running);
    let took = t1.elapsed();
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert_eq!(
        daemon_threads(),
        Vec::<String>::new(),
        "every daemon thread ended"
    );
    assert!(!a.exists() && !ctl.exists(), "sockets removed");
    // Each peer sees the daemon hang up.
    for (who, mut c) in [("frontend", frontend), ("control client", control_client)] {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).unwrap(), 0, "the {who} sees end of file");
    }
    assert!(qemu.join().unwrap().is_empty(), "the QMP follower hung up");
    if taps {
        // A tap nobody made persistent goes when its last queue is closed (the kernel may
        // finish unregistering it a moment later).
        let gone = Instant::now() + Duration::from_secs(2);
        while Path::new("/sys/class/net").join(&tap).exists() {
            assert!(Instant::now() < gone, "tap {tap} still there: not closed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
