//! `--metrics ADDR:PORT`: the counters of `ctl stats` in Prometheus text format
//! (exposition format 0.0.4) at `/metrics`, for CI dashboards.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;

use log::{debug, info, warn};
use thiserror::Error;

use super::view::{self, StatsView};
use super::Daemon;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("listening on {addr} for --metrics")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("spawning the metrics thread")]
    Spawn(#[source] std::io::Error),
}

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

/// Renders every queue counter as `dpaa_vnic_<name>_total{port,kind,queue}` and every port
/// counter (control queue, filter sync) as `dpaa_vnic_<name>_total{port,kind}`.
pub fn render(stats: &StatsView) -> String {
    let mut out = String::new();
    let mut series: Vec<(String, Vec<(String, u64)>)> = Vec::new();
    let mut push = |name: String, labels: String, v: u64| match series.iter_mut().find(|(n, _)| *n == name) {
        Some((_, s)) => s.push((labels, v)),
        None => series.push((name, vec![(labels, v)])),
    };
    for p in &stats.ports {
        let port = format!("port=\"{}\",kind=\"{}\"", p.id, p.kind);
        for q in &p.queues {
            for (name, v) in fields(&q.counters) {
                push(name, format!("{port},queue=\"{}\"", q.queue), v);
            }
        }
        for (name, v) in fields(&p.ctrl).into_iter().chain(fields(&p.filter)) {
            push(name, port.clone(), v);
        }
    }
    for (name, samples) in series {
        let _ = writeln!(out, "# TYPE dpaa_vnic_{name}_total counter");
        for (labels, v) in samples {
            let _ = writeln!(out, "dpaa_vnic_{name}_total{{{labels}}} {v}");
        }
    }
    out
}

/// Serves `/metrics` from a background thread until the process exits.
pub fn serve(addr: SocketAddr, daemon: Arc<Daemon>) -> Result<(), MetricsError> {
    let server = tiny_http::Server::http(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    info!("metrics at http://{addr}/metrics");
    thread::Builder::new()
        .name("vnic-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" {
                    let body = render(&view::stats(&daemon.ports));
                    let ctype = "text/plain; version=0.0.4; charset=utf-8";
                    match tiny_http::Header::from_bytes("Content-Type", ctype) {
                        Ok(h) => tiny_http::Response::from_string(body).with_header(h),
                        Err(()) => tiny_http::Response::from_string(body),
                    }
                } else {
                    tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                };
                if let Err(e) = req.respond(resp) {
                    debug!("metrics client went away: {e}");
                }
            }
            warn!("metrics server stopped");
        })
        .map_err(MetricsError::Spawn)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::view::{PortStats, QueueView};
    use crate::device::filter::model::FilterStats;
    use crate::stats::{CtrlSnapshot, QueueSnapshot};

    #[test]
    fn text_format_groups_series_under_one_type_line() {
        let q = |queue, rx| QueueView {
            queue,
            counters: QueueSnapshot {
                rx_packets: rx,
                ..Default::default()
            },
        };
        let view = StatsView {
            ports: vec![PortStats {
                id: 0,
                kind: "vhost-user",
                name: "s".into(),
                connected: true,
                attachment: Some("net"),
                queues: vec![q(0, 5), q(1, 7)],
                totals: QueueSnapshot::default(),
                ctrl: CtrlSnapshot {
                    ctrl_commands: 3,
                    ctrl_busy_ns: 10,
                    ..Default::default()
                },
                filter: FilterStats {
                    filter_syncs: 2,
                    ..Default::default()
                },
            }],
            totals: QueueSnapshot::default(),
            ctrl_commands: 3,
        };
        let text = render(&view);
        assert_eq!(
            text.matches("# TYPE dpaa_vnic_rx_packets_total counter\n")
                .count(),
            1
        );
        assert!(text.contains("dpaa_vnic_rx_packets_total{port=\"0\",kind=\"vhost-user\",queue=\"0\"} 5\n"));
        assert!(text.contains("dpaa_vnic_rx_packets_total{port=\"0\",kind=\"vhost-user\",queue=\"1\"} 7\n"));
        assert!(text.contains("dpaa_vnic_ctrl_commands_total{port=\"0\",kind=\"vhost-user\"} 3\n"));
        assert!(text.contains("dpaa_vnic_filter_syncs_total{port=\"0\",kind=\"vhost-user\"} 2\n"));
        assert!(text.contains("dpaa_vnic_csum_failed_total{"));
        // Every sample line is "name{labels} value".
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<u64>().is_ok(), "{line}");
        }
    }
}
