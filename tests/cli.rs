//! The binary as a user runs it: argument errors, `ctl` output keys, a second daemon on a
//! busy socket, and SIGTERM.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_dpaa-vnic");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--help` groups the options and ends with examples, the environment, exit codes and
/// files; the man page has the same as sections of its own, and no markup shown as text;
/// the completions offer the values an option takes.
#[test]
fn help_man_page_and_completions_are_for_people() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "Ports:",
        "Receive filter:",
        "Data path:",
        "Control and metrics:",
        "Limits and access:",
        "EXAMPLES:",
        "ENVIRONMENT:",
        "EXIT STATUS:",
        "FILES:",
    ] {
        assert!(
            help.contains(&format!("\n{heading}\n")),
            "--help lacks {heading}:\n{help}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let gen = |what: &[&str]| {
        let out = Command::new(BIN)
            .arg("generate")
            .args(what)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    gen(&["man"]);
    let page = std::fs::read_to_string(dir.path().join("dpaa-vnic.1")).unwrap();
    for section in [
        "DESCRIPTION",
        "OPTIONS",
        "EXAMPLES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "FILES",
    ] {
        // roff quotes a title with a space.
        let quoted = format!(".SH \"{section}\"");
        assert!(
            page.contains(&format!(".SH {section}\n")) || page.contains(&quoted),
            "the man page lacks {section}"
        );
    }
    // roff writes a hyphen as \-.
    assert!(page.contains("RUST_LOG") && page.contains("/etc/dpaa\\-vnic/NAME.env"));
    assert!(!page.contains('`'), "backticks in the man page");
    let name = page.split(".SH SYNOPSIS").next().unwrap_or_default().to_string();
    let description = page.split(".SH DESCRIPTION").nth(1).unwrap_or_default();
    assert!(
        description.contains("FMan MAC") && !name.contains("FMan MAC"),
        "DESCRIPTION says more than NAME"
    );
    gen(&["completions", "bash"]);
    let bash = std::fs::read_to_string(dir.path().join("dpaa-vnic.bash")).unwrap();
    assert!(
        bash.contains("memac dtsec dtsec-ext tgec exact"),
        "--filter's values"
    );
    assert!(bash.contains("auto sticky off"), "--port-mac-lock's values");
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for (args, needle) in [
        (&["--queues", "2"][..], "--socket"),
        (&["--socket", "/tmp/x.sock", "--queues", "0"], "--queues 0"),
        (&["--socket", "/tmp/x.sock", "--mac", "nope"], "MAC"),
        (&["--socket", "/tmp/x.sock", "--mtu", "20"], "--mtu"),
        (
            &["--socket", "/tmp/x.sock", "--tap", "waytoolonginterfacename"],
            "--tap",
        ),
        (&["--bogus"], "--bogus"),
        (&["--socket", "/tmp/x.sock", "--poll", "0"], "--poll 0"),
        (&["--socket", "/tmp/x.sock", "--poll-cpus", "2-1"], "--poll-cpus"),
        (
            &["--socket", "/tmp/x.sock", "--poll", "1", "--poll-cpus", "1"],
            "cannot be used with",
        ),
        (&["ctl", "--format", "xml", "stats"], "xml"),
        (&["ctl", "watch", "--interval", "soon"], "--interval"),
        (
            &["--socket", "/tmp/x.sock", "--csum-action", "port=0,update=udp"],
            "missing dir=",
        ),
        (
            &[
                "--socket",
                "/tmp/x.sock",
                "--csum-action",
                "port=3,dir=egress,update=udp",
            ],
            "port 3 does not exist",
        ),
        (
            &["--socket", "/tmp/x.sock", "--metrics", "localhost"],
            "--metrics",
        ),
        (
            &["--socket", "/tmp/x.sock", "--route", "10.0.0.0/8"],
            "exactly one of via=ADDR or port=N",
        ),
        (
            &["--socket", "/tmp/x.sock", "--route", "10.0.0.0/8,port=0"],
            "--route needs at least one --router-ip",
        ),
        (
            &["--socket", "/tmp/x.sock", "--router-ip", "1=10.0.0.1/24"],
            "port 1 does not exist",
        ),
        (
            &["--socket", "/tmp/x.sock", "--router-ip", "0=10.0.0.0/24"],
            "not a host address",
        ),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: message {err:?} lacks {needle:?}");
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(sock: &Path, ctl: &Path) -> Daemon {
    start_with(sock, ctl, &[])
}

/// A daemon with guest ports `sock` and `sock` with extension `b`, and `extra` options.
fn start_with(sock: &Path, ctl: &Path, extra: &[&str]) -> Daemon {
    let c = Command::new(BIN)
        .args(["--socket", sock.to_str().unwrap(), "--socket"])
        .arg(sock.with_extension("b"))
        .args(["--control", ctl.to_str().unwrap()])
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(c);
    // The file appears at bind(), a moment before listen(): wait for a connection.
    wait_until("control socket", || {
        std::os::unix::net::UnixStream::connect(ctl).is_ok()
    });
    d
}

#[test]
fn ctl_prints_stable_keys_and_sigterm_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let ctl = dir.path().join("ctl.sock");
    let mut d = start(&sock, &ctl);

    let out = Command::new(BIN)
        .args(["ctl", "--control", ctl.to_str().unwrap(), "stats"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ports"].as_array().unwrap().len(), 2);
    for k in [
        "tx_packets",
        "tx_bytes",
        "rx_packets",
        "rx_bytes",
        "rx_dropped",
        "tx_errors",
    ] {
        assert_eq!(v["totals"][k], 0, "{k}");
        assert_eq!(v["ports"][0]["queues"][0][k], 0, "{k}");
    }
    assert_eq!(v["ports"][1]["ctrl_commands"], 0);
    assert_eq!(v["ports"][0]["connected"], false);
    // docs/interface.md: every answer says which version of the interface it follows.
    assert_eq!(v["version"], dpaa_vnic::control::INTERFACE_VERSION);

    let out = Command::new(BIN)
        .args(["ctl", "--control", ctl.to_str().unwrap(), "filter"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ports"][0]["mac"], "52:54:00:d0:aa:01");
    assert_eq!(v["ports"][1]["mac"], "52:54:00:d0:aa:02");
    assert_eq!(v["ports"][0]["rx_mode"]["promisc"], true);
    assert!(v["ports"][0]["multicast"].as_array().unwrap().is_empty());
    assert_eq!(v["version"], dpaa_vnic::control::INTERFACE_VERSION);

    // A second daemon must not steal (or delete) a live socket.
    let (code, err) = run(&["--socket", sock.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("another process"), "{err}");
    assert!(sock.exists());

    // SIGTERM: clean exit, sockets gone.
    terminate(&mut d);
    assert!(!sock.exists() && !ctl.exists() && !sock.with_extension("b").exists());
}

/// `ctl` for a person: tables with each port's identity first, `info`, a live `watch`,
/// the control path from DPAA_VNIC_CONTROL, and a clear word when pointed at a vhost-user
/// socket.
#[test]
fn ctl_speaks_to_people_too() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let ctl = dir.path().join("ctl.sock");
    let _d = start(&sock, &ctl);
    let ctl_out = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("ctl")
            .args(args)
            .env("DPAA_VNIC_CONTROL", &ctl)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, table, err) = ctl_out(&["--format", "table", "stats"]);
    assert_eq!(code, Some(0), "{err}");
    let header = table.lines().nth(1).unwrap();
    assert!(
        header.find("port").unwrap() < header.find("rx frames").unwrap(),
        "{table}"
    );
    assert!(
        table.contains(sock.to_str().unwrap()) && table.contains("vhost-user"),
        "{table}"
    );
    // Piped, the default is the JSON of the interface.
    let (_, json, _) = ctl_out(&["stats"]);
    assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok(), "{json}");
    let (code, info, err) = ctl_out(&["--format", "table", "info"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        info.starts_with(&format!("dpaa-vnic {}", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    assert!(
        info.contains("--socket")
            && info.contains(&format!(
                "interface version {}",
                dpaa_vnic::control::INTERFACE_VERSION
            )),
        "{info}"
    );
    let (_, info, _) = ctl_out(&["info"]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["daemon_version"], env!("CARGO_PKG_VERSION"));
    assert_ne!(v["revision"], "");
    let (code, filter, _) = ctl_out(&["--format", "table", "filter"]);
    assert_eq!(code, Some(0));
    assert!(
        filter.contains("52:54:00:d0:aa:01") && filter.contains("promisc"),
        "{filter}"
    );
    let (code, watch, err) = ctl_out(&["watch", "--interval", "0.2", "--count", "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(watch.matches("rx frames/s").count(), 2, "{watch}");
    // Pointed at a port's vhost-user socket instead of the control socket.
    let out = Command::new(BIN)
        .args(["ctl", "--control", sock.to_str().unwrap(), "stats"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("not a vhost-user port's socket"), "{err}");
}

/// A bare `--control` and a bare `ctl` meet at the same default path, here under
/// $XDG_RUNTIME_DIR, whose dpaa-vnic directory the daemon makes (the user's alone).
#[test]
fn a_bare_control_and_ctl_meet_at_the_default_path() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let runtime = dir.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let c = Command::new(BIN)
        .args(["--socket", sock.to_str().unwrap(), "--control"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("DPAA_VNIC_CONTROL")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Daemon(c);
    let ctl = runtime.join("dpaa-vnic/ctl");
    wait_until("control socket at the default path", || {
        std::os::unix::net::UnixStream::connect(&ctl).is_ok()
    });
    let mode = std::fs::metadata(runtime.join("dpaa-vnic"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let out = Command::new(BIN)
        .args(["ctl", "stats"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("DPAA_VNIC_CONTROL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    terminate(&mut d);
}

#[test]
fn ctl_without_a_daemon_fails_clearly() {
    let out = Command::new(BIN)
        .args(["ctl", "--control", "/nonexistent/ctl.sock", "stats"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the daemon running"));
}

fn ctl(ctl: &Path, args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(BIN)
        .args(["ctl", "--control", ctl.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.success(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn actions_change_live_and_metrics_serve_prometheus_text() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let ctlp = dir.path().join("ctl.sock");
    // A free port: bind, read it back, release it for the daemon.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let c = Command::new(BIN)
        .args(["--socket", sock.to_str().unwrap()])
        .args(["--control", ctlp.to_str().unwrap(), "--metrics", &metrics])
        .args(["--csum-action", "port=0,dir=egress,update=iph+udp"])
        // The snooper's families too, for the documentation and promtool checks below.
        .arg("--snoop")
        .args([
            "--router-ip",
            "0=10.1.0.1/24",
            "--route",
            "10.9.0.0/16,via=10.1.0.7",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _d = Daemon(c);
    wait_until("control socket", || {
        std::os::unix::net::UnixStream::connect(&ctlp).is_ok()
    });

    let (ok, v, _) = ctl(&ctlp, &["action", "list"]);
    assert!(ok);
    assert_eq!(
        v["actions"],
        serde_json::json!(["port=0,dir=egress,update=iph+udp"])
    );
    let (ok, v, _) = ctl(
        &ctlp,
        &["action", "add", "port=0,dir=ingress,update=tcp,dst=10.0.0.0/8"],
    );
    assert!(ok);
    assert_eq!(v["actions"].as_array().unwrap().len(), 2);
    let (ok, _, err) = ctl(&ctlp, &["action", "add", "port=9,dir=ingress,update=tcp"]);
    assert!(!ok && err.contains("port 9 does not exist"), "{err}");
    let (ok, _, err) = ctl(&ctlp, &["action", "add", "port=0,dir=sideways,update=tcp"]);
    assert!(!ok && err.contains("bad dir"), "{err}");
    // A drop verdict, listed with its counts (none yet: no traffic here).
    let (ok, v, err) = ctl(
        &ctlp,
        &["action", "add", "port=0,dir=egress,update=udp,verdict=drop"],
    );
    assert!(ok, "{err}");
    assert_eq!(
        v["counts"][2],
        serde_json::json!({"action": "port=0,dir=egress,update=udp,verdict=drop", "matched": 0, "passed": 0, "dropped": 0})
    );
    let (ok, _, err) = ctl(
        &ctlp,
        &["action", "add", "port=0,dir=egress,update=udp,verdict=later"],
    );
    assert!(!ok && err.contains("bad verdict"), "{err}");
    let (ok, _, _) = ctl(
        &ctlp,
        &["action", "del", "port=0,dir=egress,update=udp,verdict=drop"],
    );
    assert!(ok);
    let (ok, v, _) = ctl(&ctlp, &["action", "del", "port=0,dir=egress,update=iph+udp"]);
    assert!(ok);
    assert_eq!(
        v["actions"],
        serde_json::json!(["port=0,dir=ingress,update=tcp,dst=10.0.0.0/8"])
    );
    let (ok, _, err) = ctl(&ctlp, &["action", "del", "port=0,dir=egress,update=iph+udp"]);
    assert!(
        !ok && err.contains("no port=0,dir=egress,update=iph+udp to delete"),
        "{err}"
    );

    let (ok, v, _) = ctl(&ctlp, &["route", "list"]);
    assert!(ok);
    assert_eq!(v["interfaces"], serde_json::json!(["0=10.1.0.1/24"]));
    assert_eq!(v["routes"], serde_json::json!(["10.9.0.0/16,via=10.1.0.7"]));
    assert_eq!(v["router_mac"], "02:76:6e:69:63:01");
    let g0 = v["generation"].as_u64().unwrap();
    let (ok, v, _) = ctl(&ctlp, &["route", "add", "10.8.0.0/16,port=0"]);
    assert!(ok);
    assert_eq!(v["routes"].as_array().unwrap().len(), 2);
    assert!(v["generation"].as_u64().unwrap() > g0);
    let (ok, _, err) = ctl(&ctlp, &["route", "add", "10.8.0.0/16,port=0"]);
    assert!(!ok && err.contains("already there"), "{err}");
    let (ok, _, err) = ctl(&ctlp, &["route", "add", "10.7.0.0/16,port=4"]);
    assert!(!ok && err.contains("port 4 does not exist"), "{err}");
    let (ok, _, err) = ctl(&ctlp, &["route", "add", "10.7.0.0/16"]);
    assert!(!ok && err.contains("exactly one of"), "{err}");
    let (ok, v, _) = ctl(&ctlp, &["route", "del", "10.9.0.0/16,via=10.1.0.7"]);
    assert!(ok);
    assert_eq!(v["routes"], serde_json::json!(["10.8.0.0/16,port=0"]));

    let mut body = String::new();
    wait_until("metrics endpoint", || {
        body.clear();
        let Ok(mut s) = std::net::TcpStream::connect(&metrics) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        s.read_to_string(&mut body).is_ok() && body.starts_with("HTTP/1.")
    });
    assert!(body.contains("200"), "{body}");
    assert!(body.contains("text/plain; version=0.0.4"), "{body}");
    assert!(
        body.contains("# TYPE dpaa_vnic_rx_packets_total counter"),
        "{body}"
    );
    let port0 = format!("port=\"0\",port_name=\"{}\",kind=\"vhost-user\"", sock.display());
    for want in [
        format!("dpaa_vnic_csum_updated_total{{{port0},queue=\"0\"}} 0"),
        "# HELP dpaa_vnic_rx_packets_total ".to_string(),
        format!("dpaa_vnic_connected{{{port0}}} 0"),
        "dpaa_vnic_build_info{".to_string(),
        format!("dpaa_vnic_snoop_records_total{{{port0},protocol=\"mld\",record=\"to_in\"}} 0"),
        format!("dpaa_vnic_snoop_audits_total{{{port0}}} 0"),
        "dpaa_vnic_csum_action_matched_total{action=\"port=0,dir=ingress,update=tcp,dst=10.0.0.0/8\"} 0"
            .to_string(),
        "process_open_fds ".to_string(),
        "# TYPE process_cpu_seconds_total counter".to_string(),
    ] {
        assert!(body.contains(&want), "{want} missing from {body}");
    }
    let text = body.split_once("\r\n\r\n").unwrap().1;
    promtool_lint(text);
    documented(text);
}

/// docs/interface.md is the stable interface: every metric family served, and every
/// per-queue key of `ctl stats`, must be listed there.
fn documented(metrics: &str) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/interface.md")).unwrap();
    let mut missing: Vec<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .map(str::to_string)
        .collect();
    for (key, _) in dpaa_vnic::stats::QueueSnapshot::HELP {
        if !doc.contains(&format!("`{key}`")) {
            missing.push(key.to_string());
        }
    }
    assert!(missing.is_empty(), "not in docs/interface.md: {missing:?}");
}

/// `qemu-args --libvirt`: its pieces, put into a domain, pass libvirt's schema
/// (`virt-xml-validate`) and libvirt's own parser (`virsh define` on the test driver), in
/// both attachments, the daemon listening or connecting.
#[test]
fn qemu_args_libvirt_pieces_make_a_valid_domain() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["--attach", "net", "--queues", "2"][..],
        &["--attach", "net", "--client"],
        &["--attach", "device", "--queues", "2"],
    ] {
        let out = Command::new(BIN)
            .args(["qemu-args", "--libvirt", "--socket", "/run/dpaa-vnic/vm1.sock"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let xml = String::from_utf8(out.stdout).unwrap();
        let piece = |open: &str, close: &str| {
            xml.find(open)
                .and_then(|a| {
                    xml[a..]
                        .find(close)
                        .map(|b| xml[a..a + b + close.len()].to_string())
                })
                .unwrap_or_default()
        };
        let memory = piece("<memoryBacking>", "</memoryBacking>");
        let interface = piece("<interface", "</interface>");
        let commandline = piece("<qemu:commandline>", "</qemu:commandline>");
        assert!(
            !memory.is_empty() && (interface.is_empty() != commandline.is_empty()),
            "{xml}"
        );
        let domain = format!(
            "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n\
             <name>vnic-args</name><memory unit='MiB'>256</memory>\n{memory}\n\
             <os><type arch='x86_64' machine='q35'>hvm</type></os>\n\
             <devices>{interface}</devices>\n{commandline}\n</domain>\n"
        );
        let file = tmp.path().join("domain.xml");
        std::fs::write(&file, &domain).unwrap();
        for cmd in [
            vec!["virt-xml-validate", file.to_str().unwrap(), "domain"],
            vec![
                "virsh",
                "-q",
                "-c",
                "test:///default",
                "define",
                file.to_str().unwrap(),
            ],
        ] {
            let Some(child) = provisioned(
                Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()),
                "libvirt-clients",
            ) else {
                return;
            };
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{cmd:?} {args:?}:\n{domain}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// `--tap-bridge` (and so `--tap-up`): in a network namespace of the test's own, with a
/// bridge made there, the daemon's tap comes up inside the bridge; a bridge that does not
/// exist is a clear error at start. Root only (a tap and a namespace need CAP_NET_ADMIN).
#[test]
fn the_tap_comes_up_in_its_bridge() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("NOT CHECKED: needs root for a network namespace and a tap");
        return;
    }
    let ns = format!("vnic-br-{}", std::process::id());
    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ip(&["netns", "add", &ns]);
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _ns = Netns(ns.clone());
    ip(&["-n", &ns, "link", "add", "br0", "type", "bridge"]);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    // Killed when dropped, so that a failed check leaves no daemon behind.
    let start = |bridge: &str| {
        Daemon(
            Command::new("ip")
                .args(["netns", "exec", &ns, BIN, "--socket"])
                .arg(&sock)
                .args(["--tap", "vtap0", "--tap-bridge", bridge])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let mut d = start("br0");
    wait_until("the tap up in br0", || {
        // Not there until the daemon has made it.
        let out = Command::new("ip")
            .args(["-n", &ns, "-o", "link", "show", "vtap0"])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&out.stdout);
        link.contains("master br0") && link.contains(",UP")
    });
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(d.0.id() as libc::pid_t, libc::SIGTERM) };
    assert!(d.0.wait().unwrap().success());
    let mut d = start("nobr0");
    let status = d.0.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut d.0.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("adding tap vtap0 to bridge nobr0") && err.contains("ip link add nobr0 type bridge"),
        "{err}"
    );
}

/// docs/monitoring: the alerting rules pass `promtool check rules` and their unit tests
/// (`promtool test rules`), every query of the Grafana dashboard is valid PromQL (checked as
/// recording rules), and every metric either names is one docs/interface.md lists.
#[test]
fn monitoring_rules_and_dashboard_check_out() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring");
    let rules = std::fs::read_to_string(dir.join("dpaa-vnic.rules.yml")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("grafana-dashboard.json")).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    // The dashboard's variables, as Grafana fills them in.
    let queries: Vec<String> = exprs
        .iter()
        .map(|e| e.replace("$__rate_interval", "5m").replace("$port", ".*"))
        .collect();
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interface.md")).unwrap();
    let mut undocumented = Vec::new();
    for text in queries.iter().chain([&rules]) {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if (word.starts_with("dpaa_vnic_") || word.starts_with("process_"))
                && !doc.contains(&format!("`{word}`"))
            {
                undocumented.push(word.to_string());
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "not in docs/interface.md: {undocumented:?}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let recording: String = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            format!(
                "      - record: dashboard:query_{i}\n        expr: {}\n",
                serde_json::json!(q)
            )
        })
        .collect();
    let as_rules = tmp.path().join("dashboard.rules.yml");
    std::fs::write(
        &as_rules,
        format!("groups:\n  - name: dashboard\n    rules:\n{recording}"),
    )
    .unwrap();
    for args in [
        vec!["check", "rules", "dpaa-vnic.rules.yml"],
        vec!["test", "rules", "dpaa-vnic.rules.test.yml"],
        vec!["check", "rules", as_rules.to_str().unwrap()],
    ] {
        let Some(child) = provisioned(
            Command::new("promtool")
                .args(&args)
                .current_dir(&dir)
                .stdin(Stdio::null()),
            PROMTOOL,
        ) else {
            return;
        };
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Where scripts/provision gets promtool from.
const PROMTOOL: &str = "the prometheus package";

/// Starts `cmd`, a tool scripts/provision installs from `package`, with its output piped.
/// Missing, it is `None` and the check says
/// NOT CHECKED on a bare `cargo test`; scripts/test sets VNIC_REQUIRE_TOOLS, and there a
/// missing tool fails the test.
fn provisioned(cmd: &mut Command, package: &str) -> Option<Child> {
    match cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os("VNIC_REQUIRE_TOOLS").is_none() => {
            eprintln!(
                "NOT CHECKED: {:?} ({e}); scripts/provision installs {package}",
                cmd.get_program()
            );
            None
        }
        Err(e) => panic!(
            "{:?}: {e} (scripts/provision installs {package})",
            cmd.get_program()
        ),
    }
}

/// Prometheus's own linter (`promtool check metrics`: HELP and TYPE present, counters
/// named `_total`, base units) on a scrape. scripts/provision installs it and scripts/test
/// sets VNIC_REQUIRE_TOOLS, so there it must run; a bare `cargo test` without it says so.
fn promtool_lint(text: &str) {
    use std::io::Write;
    let mut cmd = Command::new("promtool");
    cmd.args(["check", "metrics"]).stdin(Stdio::piped());
    let Some(mut child) = provisioned(&mut cmd, PROMTOOL) else {
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tap the daemon may not open is explained: CAP_NET_ADMIN, or a tap made for
/// the daemon's user beforehand. The daemon runs as root without CAP_NET_ADMIN in its
/// bounding set (util-linux's `setpriv`), so it can open /dev/net/tun but not make a tap.
#[test]
fn a_tap_without_permission_names_the_capability_and_the_command() {
    // SAFETY: getuid(2) has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("NOT CHECKED: needs root (a tap, and a capability to drop)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    for (queues, mq) in [("1", ""), ("2", " multi_queue")] {
        let out = Command::new("setpriv")
            .args(["--bounding-set=-net_admin", BIN])
            .args([
                "--socket",
                sock.to_str().unwrap(),
                "--tap",
                "vnicperm0",
                "--queues",
                queues,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("CAP_NET_ADMIN"), "{err}");
        let cmd = format!("ip tuntap add dev vnicperm0 mode tap vnet_hdr{mq} user USER");
        assert!(err.contains(&cmd), "{err}");
        assert!(!sock.exists(), "socket left behind");
    }
}

/// QEMU's backend program conventions: `--print-capabilities` prints the JSON the
/// vhost-user.json schema describes and exits 0, whatever else is on the command line.
#[test]
fn print_capabilities_follows_qemus_schema() {
    let out = Command::new(BIN)
        .args(["--print-capabilities", "--no-such-option", "--queues", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"type": "net"}));
}

/// The first vhost-user answer a frontend gets on `stream`: the device's features.
fn features_over(stream: std::os::unix::net::UnixStream) -> u64 {
    use vhost::vhost_user::Frontend;
    use vhost::VhostBackend;
    let fe = Frontend::from_stream(stream, 3);
    fe.get_features().expect("GET_FEATURES answered")
}

/// Sends SIGTERM and waits (at most 10 s) for a clean exit.
fn terminate(d: &mut Daemon) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(d.0.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = d.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "daemon ignored SIGTERM");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// Socket activation as systemd does it: the socket is made, bound and listening before
/// the daemon runs, and handed over as a descriptor (`--fd`, here descriptor 7). The
/// daemon tells the service manager when it is ready (`NOTIFY_SOCKET`), serves a frontend
/// on the inherited socket, and on SIGTERM says it is stopping and leaves the socket file
/// to its owner.
#[test]
fn an_inherited_socket_is_served_and_readiness_is_notified() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("activated.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(BIN);
    cmd.args(["--fd", "7"])
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only dup2(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut d = Daemon(cmd.spawn().unwrap());
    drop(listener);
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 15 s");
    assert_eq!(&buf[..n], b"READY=1\n");
    let features = features_over(UnixStream::connect(&path).unwrap());
    assert_ne!(features & (1 << 32), 0, "VERSION_1 offered: {features:#x}");
    terminate(&mut d);
    let n = notify.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1\n");
    assert!(path.exists(), "the daemon removed a socket it did not make");
}

/// `--fd` refuses what is not a listening Unix socket, and the same descriptor twice.
#[test]
fn a_bad_inherited_descriptor_is_refused_clearly() {
    let (code, err) = run(&["--fd", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("stdin, stdout and stderr"), "{err}");
    let (code, err) = run(&["--fd", "900"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--fd 900 is not open"), "{err}");
    let (code, err) = run(&["--fd", "9", "--fd", "9"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--fd 9 is given twice"), "{err}");
    let (code, err) = run(&["--fd", "9", "--socket", "/tmp/x.sock"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

/// `--client`: the frontend owns the socket (QEMU `server=on`); the daemon waits for it to
/// listen, connects, connects again after the frontend goes, and stops at once on SIGTERM
/// even while it waits.
#[test]
fn client_mode_connects_to_a_listening_frontend_and_again_after_it_goes() {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qemu.sock");
    // The daemon starts first, as libvirt may order it: it waits for the socket.
    let mut d = Daemon(
        Command::new(BIN)
            .args(["--socket-path", path.to_str().unwrap(), "--client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    thread::sleep(Duration::from_millis(300));
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let accept = |what: &str| {
        let mut got = None;
        wait_until(what, || {
            got = listener.accept().ok();
            got.is_some()
        });
        let (s, _) = got.unwrap();
        s.set_nonblocking(false).unwrap();
        s
    };
    let features = features_over(accept("the daemon's first connection"));
    assert_ne!(features & (1 << 32), 0, "{features:#x}");
    // features_over dropped the frontend: the daemon comes back.
    let again = accept("the daemon's second connection");
    drop(again);
    terminate(&mut d);
    assert!(path.exists(), "the daemon removed the frontend's socket");
}

/// A QEMU's QMP monitor for `ctl announce` / `ctl link`: greets, follows one NIC, answers
/// every command with its id, refuses `set_link` up, and reports the commands it got.
fn fake_qmp(listener: std::os::unix::net::UnixListener) -> std::sync::mpsc::Receiver<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        writeln!(
            w,
            "{}",
            serde_json::json!({"QMP": {"version": {}, "capabilities": []}})
        )
        .unwrap();
        let info = serde_json::json!([{
            "promiscuous": false, "name": "nic0", "main-mac": "52:54:00:d0:aa:01",
            "unicast": "normal", "multicast": "normal", "broadcast-allowed": false,
            "multicast-overflow": false, "unicast-overflow": false, "unicast-table": [],
            "multicast-table": []
        }]);
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            let cmd: serde_json::Value = serde_json::from_str(&line).unwrap();
            let answer = match cmd["execute"].as_str() {
                Some("query-rx-filter") => serde_json::json!({"return": info, "id": cmd["id"]}),
                Some("set_link") if cmd["arguments"]["up"] == true => serde_json::json!({
                    "error": {"class": "GenericError", "desc": "refused by the test"}, "id": cmd["id"]
                }),
                _ => serde_json::json!({"return": {}, "id": cmd["id"]}),
            };
            writeln!(w, "{answer}").unwrap();
            let _ = tx.send(cmd);
        }
    });
    rx
}

#[test]
fn ctl_announce_and_link_go_to_qemu_through_qmp() {
    let dir = tempfile::tempdir().unwrap();
    let (ctlp, qmp) = (dir.path().join("ctl"), dir.path().join("qmp.sock"));
    let seen = fake_qmp(std::os::unix::net::UnixListener::bind(&qmp).unwrap());
    // --snoop keeps port 1's address filter; --qmp still carries the commands.
    let qmp_opt = format!("{},port=1", qmp.display());
    let _d = start_with(&dir.path().join("a.sock"), &ctlp, &["--snoop", "--qmp", &qmp_opt]);
    let next = |what: &str| loop {
        let cmd = seen.recv_timeout(Duration::from_secs(10)).unwrap();
        if cmd["execute"] == what {
            return cmd;
        }
    };
    // The follower's first query finds the NIC, the second (naming it) follows it.
    while next("query-rx-filter")["arguments"]["name"] != "nic0" {}
    let (ok, v, _) = ctl(&ctlp, &["info"]);
    assert!(ok);
    assert_eq!(v["ports"][0]["qmp"], serde_json::Value::Null);
    assert_eq!(
        v["ports"][1]["qmp"],
        serde_json::json!({"connected": true, "nic": "nic0", "errors": 0, "last_error": null})
    );

    let (ok, v, err) = ctl(&ctlp, &["announce", "1"]);
    assert!(ok, "{err}");
    assert_eq!(v["announced"], serde_json::json!([1]));
    let cmd = next("announce-self");
    assert_eq!(cmd["arguments"]["interfaces"], serde_json::json!(["nic0"]));
    assert_eq!(cmd["arguments"]["rounds"], 1);
    let (ok, v, _) = ctl(&ctlp, &["announce"]);
    assert!(ok && v["announced"] == serde_json::json!([1]), "{v}");
    next("announce-self");

    let (ok, v, err) = ctl(&ctlp, &["link", "1", "down"]);
    assert!(ok, "{err}");
    assert_eq!((v["port"].as_u64(), v["link"].as_str()), (Some(1), Some("down")));
    assert_eq!(
        next("set_link")["arguments"],
        serde_json::json!({"name": "nic0", "up": false})
    );
    let (ok, _, err) = ctl(&ctlp, &["link", "1", "up"]);
    assert!(
        !ok && err.contains("QEMU answered") && err.contains("refused by the test"),
        "{err}"
    );

    let (ok, _, err) = ctl(&ctlp, &["announce", "0"]);
    assert!(
        !ok && err.contains("port 0 has no driver attached, and no --qmp"),
        "{err}"
    );
    let (ok, _, err) = ctl(&ctlp, &["link", "7", "down"]);
    assert!(!ok && err.contains("port 7 does not exist (2 ports)"), "{err}");
    let (ok, _, err) = ctl(&ctlp, &["link", "1", "sideways"]);
    assert!(!ok && err.contains("invalid value 'sideways'"), "{err}");
}

/// A QEMU whose QMP monitor greets, then sends what is not JSON, each time the follower
/// connects: every such connection is counted in `ctl info`, with the reason, and the
/// follower keeps trying.
#[test]
fn a_qmp_monitor_that_sends_garbage_is_counted_and_shown() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (ctlp, qmp) = (dir.path().join("ctl"), dir.path().join("qmp.sock"));
    let listener = std::os::unix::net::UnixListener::bind(&qmp).unwrap();
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let _ = writeln!(
                s,
                "{}",
                serde_json::json!({"QMP": {"version": {}, "capabilities": []}})
            );
            let _ = writeln!(s, "this is not JSON");
            // Open until the follower hangs up, so that what it reads is the garbage.
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        }
    });
    let qmp_opt = format!("{},port=0", qmp.display());
    let _d = start_with(&dir.path().join("a.sock"), &ctlp, &["--qmp", &qmp_opt]);
    let t0 = Instant::now();
    let q = loop {
        let (ok, v, err) = ctl(&ctlp, &["info"]);
        assert!(ok, "{err}");
        let q = v["ports"][0]["qmp"].clone();
        if q["errors"].as_u64() >= Some(2) || t0.elapsed() > Duration::from_secs(10) {
            break q;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert!(q["errors"].as_u64() >= Some(2), "{q}");
    assert_eq!(q["nic"], serde_json::Value::Null);
    assert!(
        q["last_error"].as_str().is_some_and(|e| e.contains("QMP JSON")),
        "{q}"
    );
    // The table says it too.
    let out = Command::new(BIN)
        .args(["ctl", "--control"])
        .arg(&ctlp)
        .args(["--format", "table", "info"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("errors"), "{text}");
}

/// `ctl queue-cpus`: the guest CPUs behind each queue, as told, beside the queue in `ctl
/// stats` (JSON and table); a bad mapping is refused and changes nothing.
#[test]
fn queue_cpus_are_shown_beside_their_queues() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let ctlp = dir.path().join("ctl.sock");
    let _d = start_with(&sock, &ctlp, &["--queues", "2"]);
    let (ok, v, err) = ctl(&ctlp, &["queue-cpus", "0", "0=0", "1=1-3"]);
    assert!(ok, "{err}");
    assert_eq!(v["queue_cpus"], serde_json::json!(["0", "1-3"]));
    for (args, why) in [
        (&["queue-cpus", "0", "2=0"][..], "queue 2 does not exist"),
        (&["queue-cpus", "0", "0=x"][..], "bad CPU number"),
        (&["queue-cpus", "3", "0=0"][..], "port 3 does not exist"),
    ] {
        let (ok, _, err) = ctl(&ctlp, args);
        assert!(!ok && err.contains(why), "{args:?}: {err}");
    }
    let (_, v, _) = ctl(&ctlp, &["stats"]);
    let queues = &v["ports"][0]["queues"];
    assert_eq!(
        (queues[0]["cpus"].as_str(), queues[1]["cpus"].as_str()),
        (Some("0"), Some("1-3"))
    );
    let table = Command::new(BIN)
        .args([
            "ctl",
            "--control",
            ctlp.to_str().unwrap(),
            "--format",
            "table",
            "stats",
        ])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("port 0: queue 0 CPUs 0, queue 1 CPUs 1-3"),
        "{table}"
    );
    // None forgets.
    assert!(ctl(&ctlp, &["queue-cpus", "0"]).0);
    let (_, v, _) = ctl(&ctlp, &["stats"]);
    assert_eq!(v["ports"][0]["queues"][0].get("cpus"), None);
}
