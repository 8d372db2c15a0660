//! The daemon started and stopped in-process (`dpaa_vnic::daemon`): what the command line
//! asks for is what runs, and what it bound is gone once it stops, on a start that fails
//! halfway as on a clean one.

use std::path::Path;

use clap::Parser;
use dpaa_vnic::config::{Cli, Config};
use dpaa_vnic::control::view::PortRef;
use dpaa_vnic::daemon::{self, StartError};

fn config(args: &[&str]) -> Config {
    let cli = Cli::try_parse_from(std::iter::once("dpaa-vnic").chain(args.iter().copied())).unwrap();
    Config::try_from(cli.run).unwrap()
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

#[test]
fn a_started_daemon_runs_what_was_asked_and_removes_its_sockets_when_dropped() {
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
