//! How long one cache line takes to go from one CPU to another and back: two threads,
//! pinned to the two CPUs given, hand a counter back and forth through one line. Prints the
//! median round trip over several trials, in ns.
//!
//! `scripts/bench-pvp` runs it before each window: on a shared virtual machine the cost of
//! a line crossing between the frontend's CPU and the backend's moves with what the host
//! does, and a vhost-user loop pays it on every ring index and descriptor. The figure says
//! which regime a window ran in.
//!
//! Usage: line-pingpong [CPU_A CPU_B]   (default 0 1)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Round trips per trial, and trials: 220 000 round trips in all, well under a second at
/// any cross-core latency, and enough per trial that the clock's resolution does not
/// matter.
const TRIPS: u64 = 20_000;
const TRIALS: usize = 11;

/// The line the two threads share, alone in its 64 bytes (and the adjacent-line
/// prefetcher's 128).
#[repr(align(128))]
struct Line(AtomicU64);

fn pin(cpu: usize) -> Result<(), String> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set))
        .map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))
}

/// One trial: the median is taken over trials, so that one preemption of either thread
/// (the host's or the guest's scheduler) spoils one trial, not the figure.
fn trial(line: &Arc<Line>, cpu_b: usize) -> Result<f64, String> {
    line.0.store(0, Ordering::SeqCst);
    let other = Arc::clone(line);
    let echo = thread::spawn(move || -> Result<(), String> {
        pin(cpu_b)?;
        // Odd values come from the first thread; each is answered with the next even one.
        let mut expect = 1;
        while expect < 2 * TRIPS {
            while other.0.load(Ordering::Acquire) != expect {
                std::hint::spin_loop();
            }
            other.0.store(expect + 1, Ordering::Release);
            expect += 2;
        }
        Ok(())
    });
    let t0 = Instant::now();
    for i in 0..TRIPS {
        line.0.store(2 * i + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / TRIPS as f64;
    // A panic in the echo thread is this program's own bug: passed on as it is.
    echo.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
    Ok(ns)
}

fn main() -> Result<(), String> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().map_err(|e| format!("CPU '{a}': {e}")))
        .collect::<Result<_, _>>()?;
    let (a, b) = match args[..] {
        [] => (0, 1),
        [a, b] => (a, b),
        _ => return Err("usage: line-pingpong [CPU_A CPU_B]".into()),
    };
    pin(a)?;
    let line = Arc::new(Line(AtomicU64::new(0)));
    let mut trips = (0..TRIALS)
        .map(|_| trial(&line, b))
        .collect::<Result<Vec<_>, _>>()?;
    trips.sort_by(f64::total_cmp);
    println!("{:.0}", trips[TRIALS / 2]);
    Ok(())
}
