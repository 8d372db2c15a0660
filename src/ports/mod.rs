//! I/O ports: vhost-user guests and host tap devices. The only layer that touches file
//! descriptors and vrings; `vhost_user` is the only module that imports vhost-user-backend.

pub mod poll;
pub mod tap;
pub mod vhost_user;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lets a warning through at most once per second, so a misbehaving guest cannot flood the
/// log; the counters carry the full count.
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
