//! The daemon's logger: env_logger's output, with every line a guest, a frontend or a client
//! could repeat at will held to a rate.
//!
//! Lines at INFO and above are limited per target (module path) to [`PER_SECOND`] a second;
//! what is held back is counted and reported in one line when the target next logs. That
//! covers the dependencies too: virtio-queue 0.18 logs an impossible available index at
//! ERROR every time it is asked, and a frontend decides how often that is.
//! DEBUG and TRACE lines are only there when asked for (`RUST_LOG`), and are not limited.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use log::{Level, Log, Metadata, Record};

/// "outer: inner: innermost", an error and its sources, for a log line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Lets a warning through at most once per second, so a misbehaving guest or client cannot
/// flood the log with it; the counters carry the full count.
#[derive(Debug, Default)]
pub struct WarnLimiter {
    last_sec: AtomicU64,
}

impl WarnLimiter {
    pub fn allow(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_sec.load(Ordering::Relaxed);
        now != last
            && self
                .last_sec
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Lines at INFO and above each target may write per second.
pub const PER_SECOND: u32 = 20;

struct Window {
    start: Instant,
    written: u32,
    held: u64,
}

/// env_logger's logger behind a per-target rate limit.
pub struct Limited {
    inner: env_logger::Logger,
    windows: Mutex<HashMap<String, Window>>,
}

impl Limited {
    pub fn new(inner: env_logger::Logger) -> Self {
        Limited {
            inner,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `record` may be written now, and how many of its target's lines were held
    /// back since the last one written.
    fn admit(&self, target: &str, now: Instant) -> (bool, u64) {
        let mut w = crate::sync::lock(&self.windows);
        let win = match w.get_mut(target) {
            Some(win) => win,
            None => w.entry(target.to_string()).or_insert(Window {
                start: now,
                written: 0,
                held: 0,
            }),
        };
        if now.duration_since(win.start).as_secs() >= 1 {
            win.start = now;
            win.written = 0;
        }
        if win.written < PER_SECOND {
            win.written += 1;
            (true, std::mem::take(&mut win.held))
        } else {
            win.held += 1;
            (false, 0)
        }
    }
}

impl Log for Limited {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.inner.matches(record) {
            return;
        }
        if record.level() > Level::Info {
            self.inner.log(record);
            return;
        }
        let (write, held) = self.admit(record.target(), Instant::now());
        if held > 0 {
            self.inner.log(
                &Record::builder()
                    .level(Level::Warn)
                    .target(record.target())
                    .args(format_args!(
                        "{held} more line(s) from {} were not logged (rate limit)",
                        record.target()
                    ))
                    .build(),
            );
        }
        if write {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the limited logger: `RUST_LOG` as env_logger reads it, INFO by default.
pub fn init() {
    // Milliseconds: the snooper's audits and the TX watch act within tens of them.
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Limited::new(inner))).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_target_gets_its_lines_per_second_and_hears_of_the_rest() {
        let l = Limited::new(env_logger::Builder::new().build());
        let t0 = Instant::now();
        let admitted = (0..1000).filter(|_| l.admit("virtio_queue::queue", t0).0).count();
        assert_eq!(admitted, PER_SECOND as usize);
        // Another target is not held back by the first.
        assert!(l.admit("dpaa_vnic::ports", t0).0);
        // A second later the first line tells how many were held.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            l.admit("virtio_queue::queue", t1),
            (true, 1000 - PER_SECOND as u64)
        );
        assert_eq!(l.admit("virtio_queue::queue", t1), (true, 0));
    }
}
