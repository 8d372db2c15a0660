//! `--metrics ADDR:PORT`: the counters of `ctl stats` in Prometheus text format
//! (exposition format 0.0.4) at `/metrics`, for CI dashboards.
//!
//! A small HTTP/1.1 server of its own, because the scrape is one fixed page and every byte
//! a client sends is untrusted: it reads the request line and headers only (at most
//! [`HEAD_LIMITS`]`.max` bytes, parsed by `httparse`), never a body, answers `GET` and `HEAD`
//! of `/metrics`, and closes. At most [`MAX_CLIENTS`] are served at once; a client that is
//! slower than [`HEAD_LIMITS`] is dropped. Refusals are counted and logged once a second.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, info};
use thiserror::Error;

use super::bounded::{self, Framed, Limits, ReadError};
use super::view::{self, StatsView};
use super::Daemon;
use crate::stop::{Stop, Stoppable};

/// Scrapes served at once; one more gets 503.
pub const MAX_CLIENTS: usize = 8;

/// A request head: its size, and how long a client has to send it whole.
pub const HEAD_LIMITS: Limits = Limits {
    max: 8 * 1024,
    idle: Duration::from_secs(5),
    request: Duration::from_secs(5),
};

/// Headers a request may carry (Prometheus sends about six).
const MAX_HEADERS: usize = 32;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("listening on {addr} for --metrics")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("spawning the metrics thread")]
    Spawn(#[source] io::Error),
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
        for (name, v) in fields(&p.ctrl)
            .into_iter()
            .chain(fields(&p.conn))
            .chain(fields(&p.filter))
        {
            push(name, port.clone(), v);
        }
    }
    for (server, v) in fields(&stats.clients_refused) {
        push("clients_refused".into(), format!("server=\"{server}\""), v);
    }
    for (name, samples) in series {
        let _ = writeln!(out, "# TYPE dpaa_vnic_{name}_total counter");
        for (labels, v) in samples {
            let _ = writeln!(out, "dpaa_vnic_{name}_total{{{labels}}} {v}");
        }
    }
    out
}

/// Serves `/metrics` from a background thread until `stop` is requested; returns the
/// address bound (`addr` may ask for any port) and the thread.
pub fn serve(
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    stop: &Stop,
) -> Result<(SocketAddr, Stoppable), MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    info!("metrics at http://{bound}/metrics");
    let stop = stop.clone();
    let handle = thread::Builder::new()
        .name("vnic-metrics".into())
        .spawn(move || accept_loop(listener, daemon, &stop))
        .map_err(MetricsError::Spawn)?;
    // Bound to every address: the waker knocks on loopback.
    let mut knock = bound;
    if knock.ip().is_unspecified() {
        knock.set_ip(match bound {
            SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    let wake = move || {
        let _ = TcpStream::connect_timeout(&knock, Duration::from_secs(1));
    };
    Ok((bound, Stoppable::new("metrics", handle, wake)))
}

fn accept_loop(listener: TcpListener, daemon: Arc<Daemon>, stop: &Stop) {
    let d = daemon.clone();
    bounded::accept_loop(
        "metrics",
        "vnic-metrics-conn",
        listener.incoming(),
        MAX_CLIENTS,
        |s: TcpStream| {
            daemon.refused.metrics.fetch_add(1, Ordering::Relaxed);
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            finish(s, &status_only(503, "Service Unavailable"));
        },
        move |s| {
            if let Err(e) = serve_client(&d, s) {
                d.refused.metrics.fetch_add(1, Ordering::Relaxed);
                debug!("metrics client: {e}");
            }
        },
        stop,
    );
}

/// A response with no body but its status line.
fn status_only(code: u16, reason: &str) -> Vec<u8> {
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

/// Writes the answer and closes. Whatever the client still sends (a body nobody reads) is
/// drained for a moment, so the close does not turn into a reset that loses the answer.
fn finish(mut s: TcpStream, answer: &[u8]) {
    if s.write_all(answer).is_err() {
        return;
    }
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let until = Instant::now() + Duration::from_millis(200);
    let mut sink = [0u8; 4096];
    let mut left = 64 * 1024usize;
    while left > 0 && Instant::now() < until {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn serve_client(d: &Daemon, s: TcpStream) -> Result<(), ReadError> {
    s.set_write_timeout(Some(HEAD_LIMITS.request))
        .map_err(ReadError::Io)?;
    let mut r = Framed::new(s, HEAD_LIMITS);
    let head = match r.next(b"\r\n\r\n") {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(()),
        Err(e) => {
            let answer = match e {
                ReadError::TooLong(_) => Some(status_only(431, "Request Header Fields Too Large")),
                ReadError::Slow(_) | ReadError::Idle(_) => Some(status_only(408, "Request Timeout")),
                _ => None,
            };
            if let (Some(a), Ok(s)) = (answer, r.get_ref().try_clone()) {
                finish(s, &a);
            }
            return Err(e);
        }
    };
    let answer = answer_head(d, &head);
    if let Ok(s) = r.get_ref().try_clone() {
        finish(s, &answer);
    }
    Ok(())
}

/// The whole answer to one request head.
fn answer_head(d: &Daemon, head: &[u8]) -> Vec<u8> {
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
    let body = render(&view::stats(d));
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
    use crate::control::view::{PortStats, QueueView, RefusedView};
    use crate::device::filter::model::FilterStats;
    use crate::stats::{ConnSnapshot, CtrlSnapshot, QueueSnapshot};

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
                attachment: Some(crate::device::features::Attachment::Net),
                queues: vec![q(0, 5), q(1, 7)],
                totals: QueueSnapshot::default(),
                ctrl: CtrlSnapshot {
                    ctrl_commands: 3,
                    ctrl_busy_ns: 10,
                    ..Default::default()
                },
                ctrl_answer: Default::default(),
                conn: ConnSnapshot {
                    rings_broken: 1,
                    ..Default::default()
                },
                filter: FilterStats {
                    filter_syncs: 2,
                    ..Default::default()
                },
            }],
            totals: QueueSnapshot::default(),
            ctrl_commands: 3,
            clients_refused: RefusedView {
                control: 0,
                metrics: 2,
            },
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
        assert!(text.contains("dpaa_vnic_rings_broken_total{port=\"0\",kind=\"vhost-user\"} 1\n"));
        assert!(text.contains("dpaa_vnic_clients_refused_total{server=\"metrics\"} 2\n"));
        assert!(text.contains("dpaa_vnic_csum_failed_total{"));
        // Every sample line is "name{labels} value".
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            assert!(v.parse::<u64>().is_ok(), "{line}");
        }
    }
}
