//! `--qmp`: the net attachment's source of truth for the receive filter. QEMU keeps the
//! control queue there, so dpaa-vnic follows QEMU's own view as libvirt does: query
//! `query-rx-filter` once, then again on every `NIC_RX_FILTER_CHANGED` (QEMU sends that event
//! once and re-arms it only when queried). QEMU's table holds 64 entries; past that it
//! reports overflow, which the filter treats as allmulti / alluni.

use std::io::{self, BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::{debug, info, warn};
use serde::Deserialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::device::{RxMode, RxState};
use crate::ports::vhost_user::GuestPort;
use crate::stop::{Current, Stop, Stoppable};
use crate::wire::MacAddr;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QmpSpecError {
    #[error("--qmp {0:?}: expected PATH[,port=N][,nic=ID]")]
    Syntax(String),
    #[error("--qmp {spec:?}: bad port number")]
    Port {
        spec: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("QMP socket I/O")]
    Io(#[source] io::Error),
    #[error("QMP JSON")]
    Json(#[source] serde_json::Error),
    #[error("QEMU closed the QMP connection")]
    Closed,
    #[error("QEMU answered {0}")]
    Refused(String),
    #[error("QEMU has {0} NICs: say which with nic=ID")]
    Ambiguous(usize),
}

/// One `--qmp` option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QmpSpec {
    pub path: PathBuf,
    pub port: usize,
    pub nic: Option<String>,
}

impl FromStr for QmpSpec {
    type Err = QmpSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let path = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| QmpSpecError::Syntax(s.into()))?;
        let mut spec = QmpSpec {
            path: PathBuf::from(path),
            port: 0,
            nic: None,
        };
        for p in parts {
            match p.split_once('=') {
                Some(("port", v)) => {
                    spec.port = v.parse().map_err(|source| QmpSpecError::Port {
                        spec: s.into(),
                        source,
                    })?
                }
                Some(("nic", v)) if !v.is_empty() => spec.nic = Some(v.to_string()),
                _ => return Err(QmpSpecError::Syntax(s.into())),
            }
        }
        Ok(spec)
    }
}

/// The parts of QEMU's RxFilterInfo the filter needs.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct RxFilterInfo {
    pub name: String,
    pub promiscuous: bool,
    pub multicast: String,
    pub unicast: String,
    /// Not used: QEMU 11.1 fills it from its `nobcast` flag, i.e. inverted (a freshly reset
    /// NIC that delivers broadcast reports `false`), so it cannot be trusted either way.
    pub broadcast_allowed: bool,
    pub multicast_overflow: bool,
    pub unicast_overflow: bool,
    pub main_mac: String,
    pub unicast_table: Vec<String>,
    pub multicast_table: Vec<String>,
    /// "all" when the driver did not negotiate CTRL_VLAN (every VLAN passes), else
    /// "normal" or "none": `vlan_table` decides. Absent from an older QEMU: every VLAN.
    #[serde(default)]
    pub vlan: Option<String>,
    #[serde(default)]
    pub vlan_table: Vec<u16>,
}

impl RxFilterInfo {
    /// The VLANs QEMU's table lets through; `None` when every VLAN passes.
    pub fn vlans(&self) -> Option<Vec<u16>> {
        match self.vlan.as_deref() {
            Some("normal" | "none") => Some(self.vlan_table.clone()),
            _ => None,
        }
    }

    /// The device-model view: overflow means "accept all" of that kind, as libvirt reads it.
    pub fn to_rx_state(&self) -> Option<RxState> {
        let mac: MacAddr = self.main_mac.parse().ok()?;
        let parse = |t: &[String]| t.iter().filter_map(|m| m.parse().ok()).collect::<Vec<MacAddr>>();
        Some(RxState {
            mac,
            mode: RxMode {
                promisc: self.promiscuous,
                allmulti: self.multicast == "all" || self.multicast_overflow,
                alluni: self.unicast == "all" || self.unicast_overflow,
                nomulti: self.multicast == "none",
                nouni: self.unicast == "none",
                // See `broadcast_allowed`; Linux guests never set NOBCAST anyway.
                nobcast: false,
            },
            unicast: Arc::new(parse(&self.unicast_table)),
            multicast: Arc::new(parse(&self.multicast_table)),
        })
    }
}

struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Conn {
    /// Reads QEMU's greeting and leaves capabilities negotiation (no event comes before).
    fn greet(s: UnixStream) -> Result<Conn, QmpError> {
        let mut c = Conn {
            r: BufReader::new(s.try_clone().map_err(QmpError::Io)?),
            w: s,
        };
        c.read()?; // greeting
        c.call(json!({ "execute": "qmp_capabilities" }))?;
        Ok(c)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.r.read_line(&mut line).map_err(QmpError::Io)? == 0 {
            return Err(QmpError::Closed);
        }
        serde_json::from_str(&line).map_err(QmpError::Json)
    }

    /// Sends a command and returns its result; events arriving meanwhile are kept.
    fn call(&mut self, cmd: Value) -> Result<(Value, Vec<Value>), QmpError> {
        writeln!(self.w, "{cmd}").map_err(QmpError::Io)?;
        let mut events = Vec::new();
        loop {
            let v = self.read()?;
            if let Some(r) = v.get("return") {
                return Ok((r.clone(), events));
            }
            if let Some(e) = v.get("error") {
                return Err(QmpError::Refused(e.to_string()));
            }
            events.push(v);
        }
    }

    fn query(&mut self, nic: Option<&str>) -> Result<(Vec<RxFilterInfo>, Vec<Value>), QmpError> {
        let cmd = match nic {
            Some(n) => json!({ "execute": "query-rx-filter", "arguments": { "name": n } }),
            None => json!({ "execute": "query-rx-filter" }),
        };
        let (r, ev) = self.call(cmd)?;
        Ok((serde_json::from_value(r).map_err(QmpError::Json)?, ev))
    }

    /// Queries `nic` and hands the answer to `apply`, again for as long as an event of ours
    /// arrives with the answer. QEMU runs a command in a bottom half and sends its answer
    /// from the monitor's coroutine once that wakes (qapi/qmp-dispatch.c,
    /// `do_qmp_dispatch_bh`), so a change the
    /// guest makes in between is announced before the answer that re-armed the event; the
    /// answer may not hold that change, and no other event follows until the next query.
    /// Dropping such an event left a port's filter stale for good.
    fn sync(&mut self, nic: &str, apply: &mut impl FnMut(&[RxFilterInfo])) -> Result<(), QmpError> {
        loop {
            let (infos, events) = self.query(Some(nic))?;
            apply(&infos);
            if !events.iter().any(|e| is_our_event(e, nic)) {
                return Ok(());
            }
        }
    }

    /// Follows `nic` until the connection fails: a first sync, then one on every event.
    fn follow(&mut self, nic: &str, mut apply: impl FnMut(&[RxFilterInfo])) -> Result<(), QmpError> {
        self.sync(nic, &mut apply)?;
        loop {
            if is_our_event(&self.read()?, nic) {
                self.sync(nic, &mut apply)?;
            }
        }
    }
}

fn is_our_event(ev: &Value, nic: &str) -> bool {
    ev.get("event").and_then(Value::as_str) == Some("NIC_RX_FILTER_CHANGED")
        && ev
            .pointer("/data/name")
            .and_then(Value::as_str)
            .is_none_or(|n| n == nic)
}

/// Follows one QEMU's NIC until `stop` is requested, reconnecting when QEMU restarts.
pub fn spawn(spec: QmpSpec, port: Arc<GuestPort>, stop: &Stop) -> io::Result<Stoppable> {
    let conn = Arc::new(Current::<UnixStream>::default());
    let (stop, current) = (stop.clone(), conn.clone());
    let handle = thread::Builder::new()
        .name(format!("vnic-qmp{}", spec.port))
        .spawn(move || {
            let mut last_err = String::new();
            while !stop.requested() {
                match follow(&spec, &port, &current, &stop) {
                    Ok(()) => {}
                    Err(e) => {
                        let msg = crate::logging::error_chain(&e);
                        // Say it once per kind of failure, not every retry.
                        if msg != last_err {
                            match e {
                                QmpError::Io(_) | QmpError::Closed => {
                                    debug!("qmp {}: {msg}", spec.path.display())
                                }
                                _ => warn!("qmp {}: {msg}", spec.path.display()),
                            }
                            last_err = msg;
                        }
                    }
                }
                current.clear();
                thread::sleep(Duration::from_millis(200));
            }
        })?;
    Ok(Stoppable::new("QMP follower", handle, move || {
        conn.with(|s| {
            let _ = s.shutdown(Shutdown::Both);
        })
    }))
}

fn follow(
    spec: &QmpSpec,
    port: &GuestPort,
    current: &Current<UnixStream>,
    stop: &Stop,
) -> Result<(), QmpError> {
    let s = UnixStream::connect(&spec.path).map_err(QmpError::Io)?;
    // Registered before the greeting: a QEMU that never greets cannot hold up a stop.
    if !current.set(s.try_clone().map_err(QmpError::Io)?, stop) {
        return Ok(());
    }
    let mut c = Conn::greet(s)?;
    let nic = match &spec.nic {
        Some(n) => n.clone(),
        None => match c.query(None)?.0.as_slice() {
            [one] => one.name.clone(),
            many => return Err(QmpError::Ambiguous(many.len())),
        },
    };
    info!(
        "qmp {}: following NIC {nic} for port {}",
        spec.path.display(),
        port.id
    );
    c.follow(&nic, |infos| apply(port, infos, &nic))
}

fn apply(port: &GuestPort, infos: &[RxFilterInfo], nic: &str) {
    let Some(info) = infos.iter().find(|i| i.name == nic) else {
        return;
    };
    if let Some(rx) = info.to_rx_state() {
        port.lock_ctrl().apply_rx_state(rx);
    }
    // QEMU answers the guest's VLAN commands and keeps the table; its own data path is
    // the only one that would apply it.
    port.set_vlans(info.vlans().as_deref());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        assert_eq!(
            "/run/q.sock,port=1,nic=nic0".parse::<QmpSpec>().unwrap(),
            QmpSpec {
                path: "/run/q.sock".into(),
                port: 1,
                nic: Some("nic0".into())
            }
        );
        assert_eq!("/run/q.sock".parse::<QmpSpec>().unwrap().port, 0);
        assert!(matches!(
            "/q,port=x".parse::<QmpSpec>(),
            Err(QmpSpecError::Port { .. })
        ));
        assert!(matches!(
            ",nic=a".parse::<QmpSpec>(),
            Err(QmpSpecError::Syntax(_))
        ));
        assert!(matches!(
            "/q,color=red".parse::<QmpSpec>(),
            Err(QmpSpecError::Syntax(_))
        ));
    }

    /// A QEMU that announces a change before the answer to the query that re-armed the
    /// event, as its dispatcher can: the follower must query again, at start and after an
    /// event, or its port keeps a table QEMU no longer has.
    #[test]
    fn an_event_that_comes_before_the_answer_is_followed() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // A follower that waits for an event that never comes fails the test, not hangs it.
        for end in [&ours, &theirs] {
            end.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        let info = |groups: &[&str]| {
            json!([{
                "promiscuous": false, "name": "nic0", "main-mac": "52:54:00:d0:aa:01",
                "unicast": "normal", "multicast": "normal", "broadcast-allowed": false,
                "multicast-overflow": false, "unicast-overflow": false, "unicast-table": [],
                "multicast-table": groups
            }])
        };
        let event = json!({"event": "NIC_RX_FILTER_CHANGED", "data": {"name": "nic0"}});
        let qemu = thread::spawn(move || {
            let mut w = theirs.try_clone().unwrap();
            let mut r = BufReader::new(theirs);
            let mut expect = |what: &str| {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                assert!(line.contains(what), "{line}");
            };
            writeln!(w, "{}", json!({"QMP": {"version": {}, "capabilities": []}})).unwrap();
            expect("qmp_capabilities");
            writeln!(w, "{}", json!({"return": {}})).unwrap();
            // The first query: a change announced ahead of its answer.
            expect("query-rx-filter");
            writeln!(w, "{event}\n{}", json!({"return": info(&["01:00:5e:00:00:01"])})).unwrap();
            expect("query-rx-filter");
            writeln!(w, "{}", json!({"return": info(&["01:00:5e:00:00:02"])})).unwrap();
            // An event, and again one ahead of the answer to the query it causes.
            writeln!(w, "{event}").unwrap();
            expect("query-rx-filter");
            writeln!(w, "{event}\n{}", json!({"return": info(&["01:00:5e:00:00:03"])})).unwrap();
            expect("query-rx-filter");
            writeln!(w, "{}", json!({"return": info(&["01:00:5e:00:00:04"])})).unwrap();
            // QEMU goes away: the follower returns.
        });
        let mut seen = Vec::new();
        let mut c = Conn::greet(ours).unwrap();
        let end = c.follow("nic0", |infos| seen.push(infos[0].multicast_table.clone()));
        qemu.join().unwrap();
        assert!(matches!(end, Err(QmpError::Closed)), "{end:?}");
        let tables: Vec<_> = seen.iter().map(|t| t.join(",")).collect();
        assert_eq!(
            tables,
            [
                "01:00:5e:00:00:01",
                "01:00:5e:00:00:02",
                "01:00:5e:00:00:03",
                "01:00:5e:00:00:04"
            ]
        );
    }

    /// QEMU's VLAN state: "normal" with the IDs the guest added, "none" with none, "all"
    /// (or, from an older QEMU, nothing) when every VLAN passes.
    #[test]
    fn vlans_from_qemu_json() {
        let info = |vlan: serde_json::Value, table: serde_json::Value| {
            let mut v = json!({
                "promiscuous": false, "name": "nic0", "main-mac": "52:54:00:d0:aa:01",
                "unicast": "normal", "multicast": "normal", "broadcast-allowed": false,
                "multicast-overflow": false, "unicast-overflow": false,
                "unicast-table": [], "multicast-table": []
            });
            if !vlan.is_null() {
                v["vlan"] = vlan;
                v["vlan-table"] = table;
            }
            serde_json::from_value::<RxFilterInfo>(v).unwrap().vlans()
        };
        assert_eq!(info(json!("normal"), json!([0, 100])), Some(vec![0, 100]));
        assert_eq!(info(json!("none"), json!([])), Some(vec![]));
        assert_eq!(info(json!("all"), json!([])), None);
        assert_eq!(info(serde_json::Value::Null, json!([])), None);
    }

    #[test]
    fn rx_filter_info_from_qemu_json() {
        // Shape as QEMU 11.1 answers (fields the filter ignores left in).
        let v = json!([{
            "promiscuous": false, "name": "nic0", "main-mac": "52:54:00:d0:aa:01",
            "unicast": "normal", "vlan": "all", "vlan-table": [4095], "multicast": "normal",
            "broadcast-allowed": false, "multicast-overflow": true, "unicast-overflow": false,
            "unicast-table": [], "multicast-table": ["01:00:5e:00:00:01", "33:33:00:00:00:01"]
        }]);
        let infos: Vec<RxFilterInfo> = serde_json::from_value(v).unwrap();
        let rx = infos[0].to_rx_state().unwrap();
        assert_eq!(infos[0].vlans(), None, "vlan all: the table does not decide");
        assert!(!rx.mode.promisc && rx.mode.allmulti && !rx.mode.alluni);
        // QEMU reports "broadcast-allowed": false for a NIC that delivers broadcast.
        assert!(!rx.mode.nobcast);
        assert_eq!(rx.multicast.len(), 2);
        assert_eq!(rx.mac.to_string(), "52:54:00:d0:aa:01");
        assert!(is_our_event(
            &json!({"event": "NIC_RX_FILTER_CHANGED", "data": {"name": "nic0", "path": "/x"}}),
            "nic0"
        ));
        assert!(!is_our_event(
            &json!({"event": "NIC_RX_FILTER_CHANGED", "data": {"name": "nic1"}}),
            "nic0"
        ));
    }
}
