//! `--metrics`: the counters of `ctl stats` in Prometheus text format (exposition format
//! 0.0.4) at `/metrics`, for CI dashboards, and the answer to one request head.
//!
//! The scrape is one fixed page and every byte a client sends is untrusted: only the
//! request line and headers are looked at (at most [`HEAD_LIMITS`]`.max` bytes, parsed by
//! `httparse`), never a body; `GET` and `HEAD` of `/metrics` are answered, and the
//! connection closes. metrics_server.rs holds the connections.

use std::fmt::Write as _;
use std::time::Duration;

use super::bounded::Limits;
use super::view::{self, ActionsView, FeaturesView, FilterView, StatsView};
use super::view::{Daemon, PollThreadView, PortFilter, PortStats, SnoopView};
use crate::device::features::Attachment;
use crate::device::filter::regs::FilterStats;
use crate::histogram::Buckets;
use crate::stats::{ConnSnapshot, CtrlSnapshot, QueueSnapshot};

/// A request head: its size, and how long a client has to send it whole.
pub const HEAD_LIMITS: Limits = Limits {
    max: 8 * 1024,
    idle: Duration::from_secs(5),
    request: Duration::from_secs(5),
};

/// Headers a request may carry (Prometheus sends about six).
const MAX_HEADERS: usize = 32;

/// The numeric fields of a serialisable counter block, by name.
fn fields<T: serde::Serialize>(v: &T) -> Vec<(String, u64)> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| v.as_u64().map(|n| (k, n)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escaped(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its samples, printed under one `# HELP` and one `# TYPE`.
struct Family {
    name: String,
    kind: &'static str,
    help: &'static str,
    /// Suffix of the sample's name (a histogram's `_bucket`, `_sum`, `_count`), labels,
    /// value.
    samples: Vec<(&'static str, String, String)>,
}

/// The families of one scrape, in the order they first appear.
#[derive(Default)]
struct Exposition(Vec<Family>);

impl Exposition {
    fn sample(&mut self, name: &str, kind: &'static str, help: &'static str, labels: &str, value: String) {
        self.sample_of(name, "", kind, help, labels, value);
    }

    fn sample_of(
        &mut self,
        name: &str,
        suffix: &'static str,
        kind: &'static str,
        help: &'static str,
        labels: &str,
        value: String,
    ) {
        let name = format!("dpaa_vnic_{name}");
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family {
                    name,
                    kind,
                    help,
                    samples: Vec::new(),
                });
                self.0.len() - 1
            }
        };
        self.0[i].samples.push((suffix, labels.to_string(), value));
    }

    /// A counter, renamed to the base unit (seconds) where it counts nanoseconds.
    fn counter(&mut self, field: &str, help: &'static str, labels: &str, v: u64) {
        match field.strip_suffix("_ns") {
            Some(stem) => {
                let seconds = Duration::from_nanos(v).as_secs_f64();
                self.sample(
                    &format!("{stem}_seconds_total"),
                    "counter",
                    help,
                    labels,
                    seconds.to_string(),
                );
            }
            None => self.sample(&format!("{field}_total"), "counter", help, labels, v.to_string()),
        }
    }

    /// The counters of `block` that `keep` takes, and any other that is not zero: a family
    /// is left out only while it cannot have moved.
    fn counters_where<T: serde::Serialize>(
        &mut self,
        block: &T,
        help: &[(&str, &'static str)],
        labels: &str,
        keep: impl Fn(&str) -> bool,
    ) {
        for (name, v) in fields(block) {
            if v == 0 && !keep(&name) {
                continue;
            }
            let h = help.iter().find(|(n, _)| *n == name).map_or("", |(_, h)| *h);
            self.counter(&name, h, labels, v);
        }
    }

    fn gauge(&mut self, name: &str, help: &'static str, labels: &str, v: impl ToString) {
        self.sample(name, "gauge", help, labels, v.to_string());
    }

    /// A histogram of nanoseconds, exported in seconds: `_bucket` per bound and `+Inf`,
    /// `_sum`, `_count`.
    fn histogram(&mut self, name: &str, help: &'static str, labels: &str, b: &Buckets) {
        let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64().to_string();
        let kind = "histogram";
        for (le, n) in b.le_ns.iter().zip(&b.cumulative) {
            let l = format!("{labels},le=\"{}\"", secs(*le));
            self.sample_of(name, "_bucket", kind, help, &l, n.to_string());
        }
        let inf = format!("{labels},le=\"+Inf\"");
        self.sample_of(name, "_bucket", kind, help, &inf, b.count.to_string());
        self.sample_of(name, "_sum", kind, help, labels, secs(b.sum_ns));
        self.sample_of(name, "_count", kind, help, labels, b.count.to_string());
    }

    fn text(self) -> String {
        let mut out = String::new();
        for f in self.0 {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help.trim());
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (suffix, labels, v) in f.samples {
                if labels.is_empty() {
                    let _ = writeln!(out, "{}{suffix} {v}", f.name);
                } else {
                    let _ = writeln!(out, "{}{suffix}{{{labels}}} {v}", f.name);
                }
            }
        }
        out
    }
}

/// The control-queue answer times of port `p`, where the daemon answers them: only the
/// device attachment's control queue is answered here (QEMU answers the net attachment's,
/// and a tap has none).
fn ctrl_answers(x: &mut Exposition, p: &PortStats, port: &str) {
    let answers = &p.ctrl_answer_buckets;
    if answers.count > 0 || (p.kind != "tap" && p.attachment != Some(Attachment::Net)) {
        x.histogram(
            "ctrl_answer_seconds",
            "Seconds the daemon took from taking a control command off the guest's ring to putting its answer in the used ring (device attachment).",
            port,
            answers,
        );
    }
}

/// Renders every queue counter as `dpaa_vnic_<name>_total{port,port_name,kind,queue}`, every
/// port counter (control queue, connection, filter sync) as
/// `dpaa_vnic_<name>_total{port,port_name,kind}`, the ports' state as gauges, and
/// `dpaa_vnic_build_info`. docs/interface.md lists them all.
pub fn render(stats: &StatsView, filter: &FilterView, actions: &ActionsView) -> String {
    let mut x = Exposition::default();
    x.gauge(
        "build_info",
        "The daemon's version, the git revision it was built from, and the interface version of its answers; always 1.",
        &format!(
            "version=\"{}\",revision=\"{}\",interface=\"{}\"",
            view::VERSION,
            escaped(view::REVISION),
            super::version::INTERFACE_VERSION
        ),
        1,
    );
    let port_labels = |id: usize| {
        stats.ports.iter().find(|p| p.id == id).map(|p| {
            format!(
                "port=\"{}\",port_name=\"{}\",kind=\"{}\"",
                p.id,
                escaped(&p.name),
                p.kind
            )
        })
    };
    for p in &stats.ports {
        let port = port_labels(p.id).unwrap_or_default();
        x.gauge(
            "connected",
            "1 while a frontend is attached to the port (a tap: always).",
            &port,
            u8::from(p.connected),
        );
        let tap = p.kind == "tap";
        let can_move = |key: &str| moves(key, tap, &stats.features);
        for q in &p.queues {
            x.counters_where(
                &q.counters,
                QueueSnapshot::HELP,
                &format!("{port},queue=\"{}\"", q.queue),
                |k| !RARE.contains(&k) && can_move(k),
            );
        }
        // The rare ones once per port, summed over its queues.
        x.counters_where(&p.totals, QueueSnapshot::HELP, &port, |k| {
            RARE.contains(&k) && can_move(k)
        });
        // A tap has no control queue, no vhost-user connection and no DPAA filter.
        x.counters_where(&p.ctrl, CtrlSnapshot::HELP, &port, |_| !tap);
        ctrl_answers(&mut x, p, &port);
        x.counters_where(&p.conn, ConnSnapshot::HELP, &port, |_| !tap);
        x.counters_where(&p.filter, FilterStats::HELP, &port, |_| !tap);
        if let Some(s) = &p.snoop {
            snoop_counters(&mut x, s, &port);
        }
    }
    for f in &filter.ports {
        if let Some(port) = port_labels(f.id) {
            filter_gauges(&mut x, f, &port);
        }
    }
    for (server, v) in fields(&stats.clients_refused) {
        x.counter(
            "clients_refused",
            "Clients of the control socket or of /metrics refused (too many, too slow, too long).",
            &format!("server=\"{server}\""),
            v,
        );
    }
    action_metrics(&mut x, actions);
    poll_metrics(&mut x, &stats.poll_threads);
    process_metrics(&mut x);
    x.text()
}

/// Each checksum action's own counts (`ctl action list`): summed over every queue, since
/// the action was added; labelled with the action as `--csum-action` takes it.
fn action_metrics(x: &mut Exposition, actions: &ActionsView) {
    for a in &actions.counts {
        let labels = format!("action=\"{}\"", escaped(&a.action));
        for (name, v) in fields(&a.counts) {
            let help = match name.as_str() {
                "matched" => "Frames a checksum action matched.",
                "passed" => "Frames a checksum action matched and let through.",
                _ => {
                    "Frames a checksum action matched and dropped: its verdict, or a sum it could not write."
                }
            };
            x.counter(&format!("csum_action_{name}"), help, &labels, v);
        }
    }
}

/// Queue counters that count refusals and limits: exported per port (summed over its
/// queues), where the others are per queue.
const RARE: &[&str] = &[
    "tx_desc_limit",
    "rx_desc_limit",
    "tx_gso_refused",
    "tx_spoofed",
    "fdb_refused",
    "neigh_refused",
    "route_unresolved",
    "route_unreachable",
    "route_ttl_exceeded",
    "route_errors",
    "csum_failed",
];

/// Whether queue counter `key` can move on a port of this kind with these features: the
/// checksum actions' counters need an action, the router's an interface, and a tap has
/// no filter, no source-MAC lock and no descriptors of a guest's.
fn moves(key: &str, tap: bool, f: &FeaturesView) -> bool {
    match key {
        "csum_updated" | "csum_failed" => f.csum_actions > 0,
        "routed" | "neigh_refused" => f.router,
        k if k.starts_with("route_") => f.router,
        "rx_filtered"
        | "rx_vlan_filtered"
        | "rx_mcast_accepted"
        | "rx_hash_false_positive"
        | "tx_spoofed"
        | "tx_desc_limit"
        | "rx_desc_limit"
        | "tx_watches"
        | "tx_watch_found" => !tap,
        _ => true,
    }
}

/// Poll mode's threads: their busy and idle visits, and the time the busy ones took.
fn poll_metrics(x: &mut Exposition, threads: &[PollThreadView]) {
    for t in threads {
        let labels = format!("thread=\"{}\"", t.thread);
        x.counter(
            "poll_busy_visits",
            "Visits of a poll thread to a queue that found frames to serve.",
            &labels,
            t.busy_visits,
        );
        x.counter(
            "poll_idle_visits",
            "Visits of a poll thread to a queue that found nothing to serve.",
            &labels,
            t.idle_visits,
        );
        x.counter(
            "poll_busy_ns",
            "Seconds a poll thread spent in visits that found frames (its CPU time is all of it, busy or not).",
            &labels,
            t.busy_ns,
        );
    }
}

/// Prometheus's standard `process_*` families for the daemon itself, from /proc (Linux):
/// CPU time, resident memory, descriptors open and allowed, threads, start time. A value
/// /proc cannot give is left out rather than made up.
fn process_metrics(x: &mut Exposition) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which may hold spaces: state is field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    use nix::unistd::{sysconf, SysconfVar};
    let conf = |v| sysconf(v).ok().flatten().unwrap_or(0);
    let (hz, page) = (conf(SysconfVar::CLK_TCK), conf(SysconfVar::PAGE_SIZE));
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
    });
    // Unprefixed, as every exporter names them.
    let mut raw = |name: &str, kind: &'static str, help: &'static str, v: String| {
        x.0.push(Family {
            name: name.to_string(),
            kind,
            help,
            samples: vec![("", String::new(), v)],
        });
    };
    if let (Some(u), Some(s), true) = (field(14), field(15), hz > 0) {
        raw(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time the daemon has spent, in seconds.",
            ((u + s) as f64 / hz as f64).to_string(),
        );
    }
    if let (Some(rss), true) = (field(24), page > 0) {
        raw(
            "process_resident_memory_bytes",
            "gauge",
            "The daemon's resident memory, in bytes (guest memory it has touched included).",
            (rss * page as u64).to_string(),
        );
    }
    if let Some(n) = field(20) {
        raw("process_threads", "gauge", "The daemon's threads.", n.to_string());
    }
    if let (Some(start), Some(boot), true) = (field(22), boot, hz > 0) {
        raw(
            "process_start_time_seconds",
            "gauge",
            "When the daemon started, in seconds since the Unix epoch.",
            (boot as f64 + start as f64 / hz as f64).to_string(),
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        raw(
            "process_open_fds",
            "gauge",
            "Descriptors the daemon holds open.",
            fds.count().to_string(),
        );
    }
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        raw(
            "process_max_fds",
            "gauge",
            "Descriptors the daemon may hold open (its soft RLIMIT_NOFILE).",
            soft.to_string(),
        );
    }
}

/// The snooper's counters of one port (`--snoop`).
fn snoop_counters(x: &mut Exposition, s: &SnoopView, port: &str) {
    for (protocol, reports, records) in [
        ("igmp", s.reports.igmp, &s.records.igmp),
        ("mld", s.reports.mld, &s.records.mld),
    ] {
        let labels = format!("{port},protocol=\"{protocol}\"");
        x.counter(
            "snoop_reports",
            "--snoop: membership reports the guest sent that the snooper parsed.",
            &labels,
            reports,
        );
        for (record, n) in records {
            x.counter(
                "snoop_records",
                "--snoop: group records applied, by kind (is_in, is_ex, to_in, to_ex, allow, block; \
                 join and leave for IGMPv1/v2 and MLDv1 messages).",
                &format!("{labels},record=\"{record}\""),
                *n,
            );
        }
    }
    for (name, help, v) in [
        (
            "snoop_unknown_records",
            "--snoop: records naming a group the snooper did not hold that did not join it.",
            s.unknown_records,
        ),
        (
            "snoop_audits",
            "--snoop: audit queries the snooper sent the guest.",
            s.audit.audits,
        ),
        (
            "snoop_audit_confirmed",
            "--snoop: groups an answer to an audit showed as the snooper held them.",
            s.audit.audit_confirmed,
        ),
        (
            "snoop_audit_corrected",
            "--snoop: groups whose mode or interest an answer to an audit changed (a change report missed).",
            s.audit.audit_corrected,
        ),
        (
            "snoop_audit_added",
            "--snoop: groups an answer to an audit brought that the snooper did not hold (a join missed).",
            s.audit.audit_added,
        ),
        (
            "snoop_audit_dropped",
            "--snoop: groups dropped for going unanswered in an audit their family answered (a leave missed).",
            s.audit.audit_dropped,
        ),
        (
            "snoop_audit_silent",
            "--snoop: families that said nothing to an audit while groups of theirs were held, asked again before judged.",
            s.audit.audit_silent,
        ),
    ] {
        x.counter(name, help, port, v);
    }
}

/// The state of one port's filter, as gauges labelled `port`.
fn filter_gauges(x: &mut Exposition, f: &PortFilter, port: &str) {
    x.gauge(
        "multicast_addresses",
        "Multicast addresses in the guest's list, as the filter was last synced to it.",
        port,
        f.multicast.len(),
    );
    x.gauge(
        "filter_buckets",
        "Hash buckets the port's filter layout has (0: exact layout).",
        port,
        f.filter.buckets_total,
    );
    x.gauge(
        "filter_buckets_used",
        "Hash buckets at least one address of the guest's lists maps to.",
        port,
        f.filter.buckets.len(),
    );
    x.gauge(
        "filter_multicast_overflow",
        "1 while the filter holds more multicast than its layout keeps and accepts all.",
        port,
        u8::from(f.filter.mc_overflow),
    );
    x.gauge(
        "filter_unicast_overflow",
        "1 while the filter holds more unicast than its layout keeps and accepts all.",
        port,
        u8::from(f.filter.uc_overflow),
    );
    if let Some(n) = f.snooped_groups {
        x.gauge(
            "snooped_groups",
            "--snoop: groups learned from the guest's IGMP and MLD reports.",
            port,
            n,
        );
    }
}

/// A response with no body but its status line.
pub fn status_only(code: u16, reason: &str) -> Vec<u8> {
    response(
        code,
        reason,
        "text/plain; charset=utf-8",
        format!("{code} {reason}\n").as_bytes(),
        true,
    )
}

fn response(code: u16, reason: &str, ctype: &str, body: &[u8], with_body: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

/// The whole answer to one request head (terminator included).
pub fn answer_head(d: &Daemon, head: &[u8]) -> Vec<u8> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return status_only(400, "Bad Request"),
        Err(httparse::Error::TooManyHeaders) => return status_only(431, "Request Header Fields Too Large"),
        Err(_) => return status_only(400, "Bad Request"),
    }
    let with_body = match req.method {
        Some("GET") => true,
        Some("HEAD") => false,
        _ => return status_only(405, "Method Not Allowed"),
    };
    // The query string, if any, selects nothing.
    let path = req.path.unwrap_or("").split('?').next().unwrap_or("");
    if path != "/metrics" {
        return response(
            404,
            "Not Found",
            "text/plain; charset=utf-8",
            b"see /metrics\n",
            with_body,
        );
    }
    let body = render(
        &view::stats(d),
        &view::filter(&d.ports),
        &view::actions(&d.switch),
    );
    response(
        200,
        "OK",
        "text/plain; version=0.0.4; charset=utf-8",
        body.as_bytes(),
        with_body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::view::{FeaturesView, PortFilter, PortStats, QueueView, RefusedView};
    use crate::device::filter::model::FilterSnapshot;
    use crate::device::filter::Layout;
    use crate::device::rx_state::RxMode;
    use crate::wire::MacAddr;

    fn filter_view() -> FilterView {
        let mac = MacAddr([0x52, 0x54, 0, 0xd0, 0xaa, 0]);
        let group = MacAddr([0x01, 0, 0x5e, 0, 0, 1]);
        FilterView {
            ports: vec![PortFilter {
                id: 0,
                name: "s".into(),
                attachment: None,
                mac,
                rx_mode: RxMode {
                    promisc: false,
                    allmulti: false,
                    alluni: false,
                    nomulti: false,
                    nouni: false,
                    nobcast: false,
                },
                unicast: Default::default(),
                multicast: std::sync::Arc::new(vec![group; 3]),
                active_queue_pairs: 1,
                filter: std::sync::Arc::new(FilterSnapshot {
                    layout: Layout::Memac,
                    exact_limit: 4096,
                    mc_overflow: true,
                    uc_overflow: false,
                    buckets_total: 64,
                    buckets: vec![(1, 2), (9, 1)],
                    exact_unicast: Vec::new(),
                    stats: FilterStats::default(),
                }),
                snooped_groups: Some(5),
                rss: None,
                hash_report: false,
                vlans: None,
                link_up: true,
                announcing: false,
            }],
        }
    }

    /// One vhost-user port with a few counters set, and one control client refused.
    fn stats_view() -> StatsView {
        let q = |queue, rx| QueueView {
            queue,
            cpus: None,
            counters: QueueSnapshot {
                rx_packets: rx,
                ..Default::default()
            },
        };
        StatsView {
            ports: vec![PortStats {
                id: 0,
                kind: "vhost-user",
                name: "/run/a \"b\"\\c.sock".into(),
                connected: true,
                attachment: Some(crate::device::features::Attachment::Net),
                queues: vec![q(0, 5), q(1, 7)],
                totals: QueueSnapshot::default(),
                ctrl: CtrlSnapshot {
                    ctrl_commands: 3,
                    ctrl_busy_ns: 1_500_000_000,
                    ..Default::default()
                },
                ctrl_answer: Default::default(),
                ctrl_answer_buckets: {
                    let h = crate::histogram::Histogram::default();
                    for ns in [800, 3_000, 2_000_000] {
                        h.record(ns);
                    }
                    h.buckets(view::ANSWER_BUCKETS_NS)
                },
                conn: ConnSnapshot {
                    rings_broken: 1,
                    ..Default::default()
                },
                filter: FilterStats {
                    filter_syncs: 2,
                    ..Default::default()
                },
                snoop: Some(crate::control::view::SnoopView::from(
                    crate::device::snoop::SnoopCounters {
                        reports: [4, 1],
                        records: [[0, 0, 2, 3, 0, 0, 0, 0], [0; 8]],
                        audit: crate::device::snoop::AuditCounters {
                            audit_dropped: 1,
                            audit_silent: 2,
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                )),
            }],
            totals: QueueSnapshot::default(),
            ctrl_commands: 3,
            clients_refused: RefusedView {
                control: 0,
                metrics: 2,
            },
            features: FeaturesView::default(),
            poll_threads: vec![PollThreadView {
                thread: 0,
                cpu: Some(1),
                busy_visits: 10,
                idle_visits: 90,
                busy_ns: 1_500_000_000,
            }],
        }
    }

    fn actions_view() -> ActionsView {
        let action = "port=0,dir=ingress,update=iph,verdict=drop".to_string();
        ActionsView {
            actions: vec![action.clone()],
            counts: vec![view::ActionCounts {
                action,
                counts: crate::stats::ActionSnapshot {
                    matched: 9,
                    passed: 0,
                    dropped: 9,
                },
            }],
        }
    }

    /// What a port cannot move is not on the page: the actions' and the router's counters
    /// without them, and a tap's filter, control and connection families; refusals are per
    /// port. A counter that did move is there whatever the rule says.
    #[test]
    fn only_families_that_can_move_are_exported() {
        let mut view = stats_view();
        let mut tap = stats_view().ports.remove(0);
        tap.id = 1;
        tap.kind = "tap";
        tap.name = "vtap0".into();
        tap.snoop = None;
        tap.ctrl = CtrlSnapshot::default();
        tap.conn = ConnSnapshot::default();
        tap.filter = FilterStats::default();
        tap.ctrl_answer_buckets = Default::default();
        view.ports[0].totals.tx_spoofed = 4;
        view.ports.push(tap);
        let text = render(&view, &filter_view(), &actions_view());
        let guest = r#"port="0",port_name="/run/a \"b\"\\c.sock",kind="vhost-user""#;
        let tap = r#"port="1",port_name="vtap0",kind="tap""#;
        for absent in [
            "csum_updated_total",
            "routed_total",
            "route_cache_hit_total",
            "fdb_refused_total{",
        ] {
            assert!(
                !text.contains(&format!("dpaa_vnic_{absent}{{{guest},queue")),
                "{absent}"
            );
        }
        for absent in [
            "rx_filtered_total",
            "ctrl_commands_total",
            "rings_broken_total",
            "filter_syncs_total",
            "ctrl_answer_seconds_bucket",
        ] {
            assert!(
                !text.contains(&format!("dpaa_vnic_{absent}{{{tap}")),
                "{absent} on the tap"
            );
        }
        assert!(text.contains(&format!("dpaa_vnic_rx_packets_total{{{tap},queue=\"0\"}} 5\n")));
        assert!(
            text.contains(&format!("dpaa_vnic_tx_spoofed_total{{{guest}}} 4\n")),
            "{text}"
        );
        assert!(text.contains(&format!("dpaa_vnic_fdb_refused_total{{{guest}}} 0\n")));
        view.features = FeaturesView {
            csum_actions: 1,
            router: true,
        };
        let text = render(&view, &filter_view(), &actions_view());
        assert!(text.contains(&format!(
            "dpaa_vnic_csum_updated_total{{{guest},queue=\"0\"}} 0\n"
        )));
        assert!(text.contains(&format!("dpaa_vnic_route_errors_total{{{guest}}} 0\n")));
    }

    #[test]
    fn text_format_groups_series_under_one_type_line() {
        let view = stats_view();
        let text = render(&view, &filter_view(), &actions_view());
        let port = r#"port="0",port_name="/run/a \"b\"\\c.sock",kind="vhost-user""#;
        assert_eq!(
            text.matches("# TYPE dpaa_vnic_rx_packets_total counter\n")
                .count(),
            1
        );
        for want in [
            format!("dpaa_vnic_rx_packets_total{{{port},queue=\"0\"}} 5\n"),
            format!("dpaa_vnic_rx_packets_total{{{port},queue=\"1\"}} 7\n"),
            format!("dpaa_vnic_ctrl_commands_total{{{port}}} 3\n"),
            format!("dpaa_vnic_ctrl_busy_seconds_total{{{port}}} 1.5\n"),
            format!("dpaa_vnic_filter_syncs_total{{{port}}} 2\n"),
            format!("dpaa_vnic_rings_broken_total{{{port}}} 1\n"),
            format!("dpaa_vnic_connected{{{port}}} 1\n"),
            "dpaa_vnic_csum_action_matched_total{action=\"port=0,dir=ingress,update=iph,verdict=drop\"} 9\n"
                .into(),
            "dpaa_vnic_csum_action_dropped_total{action=\"port=0,dir=ingress,update=iph,verdict=drop\"} 9\n"
                .into(),
            format!("dpaa_vnic_multicast_addresses{{{port}}} 3\n"),
            format!("dpaa_vnic_filter_buckets{{{port}}} 64\n"),
            format!("dpaa_vnic_filter_buckets_used{{{port}}} 2\n"),
            format!("dpaa_vnic_filter_multicast_overflow{{{port}}} 1\n"),
            format!("dpaa_vnic_filter_unicast_overflow{{{port}}} 0\n"),
            format!("dpaa_vnic_snooped_groups{{{port}}} 5\n"),
            format!("dpaa_vnic_snoop_reports_total{{{port},protocol=\"igmp\"}} 4\n"),
            format!("dpaa_vnic_snoop_records_total{{{port},protocol=\"igmp\",record=\"to_ex\"}} 3\n"),
            format!("dpaa_vnic_snoop_audit_dropped_total{{{port}}} 1\n"),
            format!("dpaa_vnic_snoop_audit_silent_total{{{port}}} 2\n"),
            "dpaa_vnic_clients_refused_total{server=\"metrics\"} 2\n".to_string(),
            "dpaa_vnic_poll_busy_visits_total{thread=\"0\"} 10\n".to_string(),
            "dpaa_vnic_poll_busy_seconds_total{thread=\"0\"} 1.5\n".to_string(),
            format!(
                "dpaa_vnic_build_info{{version=\"{}\",revision=\"{}\",interface=\"3\"}} 1\n",
                env!("CARGO_PKG_VERSION"),
                view::REVISION
            ),
            "# TYPE dpaa_vnic_connected gauge\n".to_string(),
            // 800 ns, 3 us and 2 ms, each at the first bound at or above its bucket's top.
            "# TYPE dpaa_vnic_ctrl_answer_seconds histogram\n".to_string(),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"0.000001\"}} 1\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"0.0000025\"}} 1\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"0.000005\"}} 2\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"0.001\"}} 2\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"0.0025\"}} 3\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_bucket{{{port},le=\"+Inf\"}} 3\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_sum{{{port}}} 0.0020038\n"),
            format!("dpaa_vnic_ctrl_answer_seconds_count{{{port}}} 3\n"),
        ] {
            assert!(text.contains(&want), "{want} missing from\n{text}");
        }
        assert!(!text.contains("_ns"), "a family not in base units:\n{text}");
        // Every family has one # HELP with text and one # TYPE, right before its samples.
        let lines: Vec<&str> = text.lines().collect();
        let mut families = 0;
        for (i, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(help.len() > 10, "{name} has no help");
                assert!(lines[i + 1].starts_with(&format!("# TYPE {name} ")), "{l}");
                assert!(lines[i + 2].starts_with(name), "{l}");
                families += 1;
            }
        }
        assert_eq!(families, text.matches("# TYPE ").count());
        assert!(families > 40, "{families} families");
        // Every sample line is "name{labels} value".
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}
