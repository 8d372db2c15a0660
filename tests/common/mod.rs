//! Helpers shared by the integration tests.

pub mod daemon;
pub mod frontend;
pub mod port;

use std::thread;
use std::time::{Duration, Instant};

/// Polls `f` every 5 ms until it holds; fails the test after 30 s (a bound for a loaded
/// machine, not a measure of speed).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}
