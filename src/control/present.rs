//! `ctl`'s tables: the JSON answers of the control socket (docs/interface.md) laid out for
//! a person, each port's identity first. Reads the answers as JSON values, so a newer
//! daemon's added keys are simply not shown.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use serde_json::Value;

/// The counters of `stats` shown per port, with their column titles.
const STATS_COLUMNS: [(&str, &str); 8] = [
    ("rx_packets", "rx frames"),
    ("rx_bytes", "rx bytes"),
    ("tx_packets", "tx frames"),
    ("tx_bytes", "tx bytes"),
    ("rx_dropped", "rx dropped"),
    ("tx_dropped", "tx dropped"),
    ("rx_filtered", "filtered"),
    ("tx_errors", "tx errors"),
];

/// The rates of `watch`, per second.
const RATE_COLUMNS: [(&str, &str); 9] = [
    ("rx_packets", "rx frames/s"),
    ("rx_bytes", "rx bytes/s"),
    ("tx_packets", "tx frames/s"),
    ("tx_bytes", "tx bytes/s"),
    ("rx_dropped", "dropped/s"),
    ("rx_filtered", "filtered/s"),
    ("rx_hash_false_positive", "hash false +/s"),
    ("route_cache_hit", "route hits/s"),
    ("route_cache_miss", "route misses/s"),
];

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.iter().copied());
    t
}

/// Right-aligns every column from `first` on (the numbers).
fn numbers_right(t: &mut Table, first: usize) {
    for c in t.column_iter_mut().skip(first) {
        c.set_cell_alignment(CellAlignment::Right);
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// A port's identity: id, kind, name, attachment, connected.
fn identity(p: &Value) -> Vec<String> {
    vec![
        text(&p["id"]),
        text(&p["kind"]),
        text(&p["name"]),
        text(&p["attachment"]),
        if p["connected"].as_bool() == Some(true) {
            "yes"
        } else {
            "no"
        }
        .into(),
    ]
}

const IDENTITY: [&str; 5] = ["port", "kind", "name", "attachment", "connected"];

/// The table for one answer, by the command that asked for it.
pub fn answer(cmd: &str, v: &Value) -> String {
    match cmd {
        "stats" => stats(v),
        "filter" => filter(v),
        "info" => info(v),
        "action-list" | "action-add" | "action-del" => actions(v),
        "route-list" | "route-add" | "route-del" => routes(v),
        "announce" => format!("announced on port(s) {}", join_values(&v["announced"])),
        "link" => format!("port {}: link {}", v["port"], v["link"].as_str().unwrap_or("?")),
        _ => serde_json::to_string_pretty(v).unwrap_or_default(),
    }
}

/// The actions in the order they run, each with its counts (an older daemon's answer has
/// the list alone).
fn actions(v: &Value) -> String {
    let Some(counts) = v["counts"].as_array() else {
        return list("action (in the order they run)", &v["actions"]);
    };
    let mut t = table(&["action (in the order they run)", "matched", "passed", "dropped"]);
    for c in counts {
        let n = |k: &str| c[k].as_u64().unwrap_or(0).to_string();
        t.add_row(vec![text(&c["action"]), n("matched"), n("passed"), n("dropped")]);
    }
    t.to_string()
}

/// An array's items, comma-separated.
fn join_values(v: &Value) -> String {
    let items = v.as_array().map(Vec::as_slice).unwrap_or_default();
    items.iter().map(Value::to_string).collect::<Vec<_>>().join(", ")
}

fn stats(v: &Value) -> String {
    let header: Vec<&str> = IDENTITY
        .iter()
        .copied()
        .chain(STATS_COLUMNS.map(|c| c.1))
        .collect();
    let mut t = table(&header);
    let ports = v["ports"].as_array().cloned().unwrap_or_default();
    for p in &ports {
        let row = identity(p).into_iter().chain(
            STATS_COLUMNS
                .iter()
                .map(|(k, _)| count(&p["totals"], k).to_string()),
        );
        t.add_row(row);
    }
    let totals = ["all", "", "", "", ""].into_iter().map(String::from).chain(
        STATS_COLUMNS
            .iter()
            .map(|(k, _)| count(&v["totals"], k).to_string()),
    );
    t.add_row(totals);
    numbers_right(&mut t, IDENTITY.len());
    let mut out = t.to_string();
    let control: Vec<String> = ports
        .iter()
        .filter(|p| count(p, "ctrl_commands") > 0)
        .map(|p| {
            format!(
                "port {}: {} control commands, {} refused, answered within {} us at p99",
                text(&p["id"]),
                count(p, "ctrl_commands"),
                count(p, "ctrl_errors"),
                count(&p["ctrl_answer"], "p99_ns") / 1000
            )
        })
        .collect();
    let told = ports.iter().filter_map(|p| {
        let queues = p["queues"].as_array()?;
        let each: Vec<String> = queues
            .iter()
            .filter(|q| q["cpus"].is_string())
            .map(|q| format!("queue {} {}", text(&q["queue"]), queue_cpus(q)))
            .collect();
        (!each.is_empty()).then(|| format!("port {}: {}", text(&p["id"]), each.join(", ")))
    });
    for line in control.into_iter().chain(told) {
        out.push('\n');
        out.push_str(&line);
    }
    out
}

/// What the guest CPUs behind a queue were said to be (`ctl queue-cpus`), if anything.
fn queue_cpus(q: &Value) -> String {
    q["cpus"]
        .as_str()
        .map(|c| format!("CPUs {c}"))
        .unwrap_or_default()
}

fn rx_mode(m: &Value) -> String {
    let on: Vec<&str> = ["promisc", "allmulti", "alluni", "nomulti", "nouni", "nobcast"]
        .into_iter()
        .filter(|k| m[*k].as_bool() == Some(true))
        .collect();
    if on.is_empty() {
        "filtered".into()
    } else {
        on.join(",")
    }
}

fn filter(v: &Value) -> String {
    let mut t = table(&[
        "port",
        "name",
        "attachment",
        "mac",
        "rx mode",
        "unicast",
        "multicast",
        "buckets",
        "layout",
        "snooped",
    ]);
    for p in v["ports"].as_array().into_iter().flatten() {
        let f = &p["filter"];
        let len = |k: &str| p[k].as_array().map_or(0, Vec::len);
        let overflow = f["mc_overflow"].as_bool() == Some(true);
        t.add_row(vec![
            text(&p["id"]),
            text(&p["name"]),
            text(&p["attachment"]),
            text(&p["mac"]),
            rx_mode(&p["rx_mode"]),
            len("unicast").to_string(),
            format!("{}{}", len("multicast"), if overflow { " (all)" } else { "" }),
            format!(
                "{}/{}",
                f["buckets"].as_array().map_or(0, Vec::len),
                count(f, "buckets_total")
            ),
            text(&f["layout"]),
            text(&p["snooped_groups"]),
        ]);
    }
    numbers_right(&mut t, 5);
    t.to_string()
}

fn info(v: &Value) -> String {
    let uptime = count(v, "uptime_seconds");
    let command_line = v["command_line"]
        .as_array()
        .map(|a| a.iter().map(text).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let mut out = format!(
        "dpaa-vnic {} (revision {}), up {}h{:02}m{:02}s, interface version {}\n{}\n",
        text(&v["daemon_version"]),
        text(&v["revision"]),
        uptime / 3600,
        uptime / 60 % 60,
        uptime % 60,
        text(&v["version"]),
        command_line
    );
    let header: Vec<&str> = IDENTITY.iter().copied().chain(["qmp"]).collect();
    let mut t = table(&header);
    for p in v["ports"].as_array().into_iter().flatten() {
        let q = &p["qmp"];
        let mut qmp = match (q["connected"].as_bool(), q["nic"].as_str()) {
            (None, _) => "-".to_string(),
            (Some(true), Some(nic)) => format!("NIC {nic}"),
            (Some(true), None) => "connected".into(),
            (Some(false), _) => "not connected".into(),
        };
        if let Some(n) = q["errors"].as_u64().filter(|n| *n > 0) {
            qmp += &format!(", {n} errors");
        }
        if let (Some(false), Some(why)) = (q["connected"].as_bool(), q["last_error"].as_str()) {
            qmp += &format!(": {why}");
        }
        t.add_row(identity(p).into_iter().chain([qmp]).collect::<Vec<_>>());
    }
    out.push_str(&t.to_string());
    out
}

fn list(title: &str, items: &Value) -> String {
    let mut t = table(&[title]);
    for i in items.as_array().into_iter().flatten() {
        t.add_row(vec![text(i)]);
    }
    t.to_string()
}

fn routes(v: &Value) -> String {
    let mut out = format!(
        "router MAC {}, generation {}\n",
        text(&v["router_mac"]),
        text(&v["generation"])
    );
    out.push_str(&list("interface (port=address/prefix)", &v["interfaces"]));
    out.push('\n');
    out.push_str(&list("route", &v["routes"]));
    out.push('\n');
    let mut t = table(&["neighbour", "mac"]);
    for n in v["neighbours"].as_array().into_iter().flatten() {
        t.add_row(vec![text(&n["ip"]), text(&n["mac"])]);
    }
    out.push_str(&t.to_string());
    out
}

/// `watch`'s view: per port, then per queue of ports with more than one, the counters'
/// change between two `stats` answers `seconds` apart, per second.
pub fn rates(before: &Value, after: &Value, seconds: f64) -> String {
    let rate = |a: &Value, b: &Value, k: &str| -> String {
        let d = count(b, k).saturating_sub(count(a, k)) as f64 / seconds.max(1e-9);
        if d >= 100.0 {
            format!("{d:.0}")
        } else {
            format!("{d:.1}")
        }
    };
    let header: Vec<&str> = ["port", "queue", "name"]
        .into_iter()
        .chain(RATE_COLUMNS.map(|c| c.1))
        .collect();
    let mut t = table(&header);
    let empty = Vec::new();
    let was = before["ports"].as_array().unwrap_or(&empty);
    for p in after["ports"].as_array().into_iter().flatten() {
        let Some(q) = was.iter().find(|w| w["id"] == p["id"]) else {
            continue;
        };
        let mut row = vec![text(&p["id"]), "all".into(), text(&p["name"])];
        row.extend(
            RATE_COLUMNS
                .iter()
                .map(|(k, _)| rate(&q["totals"], &p["totals"], k)),
        );
        t.add_row(row);
        let queues = p["queues"].as_array().cloned().unwrap_or_default();
        if queues.len() > 1 {
            for (i, now) in queues.iter().enumerate() {
                let then = &q["queues"][i];
                let mut row = vec![String::new(), i.to_string(), queue_cpus(now)];
                row.extend(RATE_COLUMNS.iter().map(|(k, _)| rate(then, now, k)));
                t.add_row(row);
            }
        }
    }
    numbers_right(&mut t, 3);
    format!("every {seconds:.1} s; rx: to the guest on a guest port, from the host on the tap\n{t}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_answer(rx: u64) -> Value {
        serde_json::json!({
            "ports": [{
                "id": 0, "kind": "vhost-user", "name": "/run/vm0.sock", "attachment": "net",
                "connected": true, "totals": {"rx_packets": rx, "tx_packets": 3},
                "queues": [{"queue": 0, "rx_packets": rx, "cpus": "0"}, {"queue": 1, "rx_packets": 0}],
                "ctrl_commands": 0
            }],
            "totals": {"rx_packets": rx, "tx_packets": 3},
            "version": 3
        })
    }

    #[test]
    fn stats_put_each_port_s_identity_first() {
        let out = answer("stats", &stats_answer(5));
        let header = out.lines().nth(1).unwrap();
        assert!(
            header.find("port").unwrap() < header.find("rx frames").unwrap(),
            "{out}"
        );
        let row = out.lines().find(|l| l.contains("/run/vm0.sock")).unwrap();
        for cell in ["vhost-user", "net", "yes", "5", "3"] {
            assert!(row.contains(cell), "{cell} missing from {row}");
        }
        assert!(out.lines().any(|l| l.contains("all")), "{out}");
        // What ctl queue-cpus was told, under the table.
        assert!(out.lines().any(|l| l == "port 0: queue 0 CPUs 0"), "{out}");
    }

    #[test]
    fn watch_shows_rates_per_port_and_queue() {
        let out = rates(&stats_answer(100), &stats_answer(300), 2.0);
        let port = out.lines().find(|l| l.contains("/run/vm0.sock")).unwrap();
        assert!(port.contains("100"), "200 frames in 2 s: {port}");
        let cells = |l: &str| {
            l.split(['│', '┆'])
                .map(str::trim)
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let queue_rows = out
            .lines()
            .map(cells)
            .filter(|c| c.len() > 2 && (c[2] == "0" || c[2] == "1"))
            .count();
        assert_eq!(queue_rows, 2, "{out}");
        assert!(
            out.lines().any(|l| cells(l).iter().any(|c| c == "CPUs 0")),
            "{out}"
        );
    }

    #[test]
    fn a_list_and_an_unknown_answer() {
        let out = answer(
            "action-list",
            &serde_json::json!({"actions": ["port=0,dir=egress,update=udp"]}),
        );
        assert!(out.contains("port=0,dir=egress,update=udp"));
        assert!(answer("something-new", &serde_json::json!({"a": 1})).contains("\"a\": 1"));
    }
}
