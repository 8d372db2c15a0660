//! Keeping the control queue's polling thread off the guest's CPU.
//!
//! After each command the control thread polls its ring for a while, so that a driver that
//! busy-waits on every ack need not kick and wait for a wake-up. That only pays while the
//! thread and the guest's vCPU run on different CPUs. When a kick wakes the thread, the
//! scheduler may place it on the CPU the kick came from, the vCPU's. There the poll takes the
//! CPU from the very vCPU it waits for: nothing arrives for the whole window; then the guest,
//! running at last, posts its next command at once and kicks again. Traced with `perf sched`
//! after a guest idled for a second, the two took turns on one CPU in 1 ms slices for
//! several milliseconds while the other CPU idled, and one rx-mode change took 2-10 ms
//! instead of 0.3 (docs/benchmarks.md).
//!
//! Two signs give it away, both cheap to see when the thread wakes for a command ([`SleepWatch`]):
//! - it waited for its CPU longer than [`WAITED`] after the kick: it was put on a busy CPU,
//!   the vCPU's (the kernel keeps that wait per thread, run_delay in
//!   /proc/thread-self/schedstat);
//! - or its last poll window ran out empty and the guest kicked less than [`CO_LOCATED`]
//!   after the thread went to sleep (that wait not counted).
//!
//! The thread then leaves the CPU it is on for any other CPU the process may use.

use std::fs::File;
use std::io;
use std::mem;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use thiserror::Error;

/// A command this soon after an empty poll window was waiting for the poller's CPU. The
/// guest's gap between two commands, once it runs, is 20-110 us under TCG; a guest that was
/// really idle for a whole window is rarely back within this.
pub const CO_LOCATED: Duration = Duration::from_micros(250);

/// A woken thread that waited this long for its CPU was put on a busy one: traced on the
/// vCPU's CPU, 0.4-1.6 ms; elsewhere, 3-40 us (rarely 150).
pub const WAITED: Duration = Duration::from_micros(200);

/// The control thread's record of its own sleeps, to tell on waking whether it shares the
/// guest's CPU. Only the control thread uses it (the schedstat file it opens is its own).
#[derive(Debug, Default)]
pub struct SleepWatch {
    schedstat: Option<File>,
    slept: Option<Slept>,
}

#[derive(Debug, Clone, Copy)]
struct Slept {
    at: Instant,
    run_delay: Option<Duration>,
    window_empty: bool,
}

impl SleepWatch {
    /// Notes that the thread goes back to sleep; `window_empty`: a poll window just ran out
    /// with nothing posted.
    pub fn sleeping(&mut self, window_empty: bool) {
        self.slept = Some(Slept {
            at: Instant::now(),
            run_delay: self.run_delay(),
            window_empty,
        });
    }

    /// On waking for a command: is this thread on the guest's CPU? Either it waited for its
    /// CPU longer than [`WAITED`] after the kick, or a poll window ran out empty and the
    /// guest kicked less than [`CO_LOCATED`] after the thread went to sleep.
    pub fn woke_on_guest_cpu(&mut self) -> bool {
        let Some(slept) = self.slept.take() else {
            return false;
        };
        let waited = match (slept.run_delay, self.run_delay()) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => Duration::ZERO,
        };
        on_guest_cpu(slept.at.elapsed(), waited, slept.window_empty)
    }

    /// The thread's total time spent runnable but waiting for a CPU, if the kernel reports
    /// it. The file stays open; a read into a stack buffer allocates nothing.
    fn run_delay(&mut self) -> Option<Duration> {
        if self.schedstat.is_none() {
            self.schedstat = File::open("/proc/thread-self/schedstat").ok();
        }
        let mut buf = [0u8; 96];
        let n = self.schedstat.as_ref()?.read_at(&mut buf, 0).ok()?;
        parse_run_delay(buf.get(..n)?)
    }
}

/// The decision, given the time since the thread went to sleep, how long it then waited
/// for a CPU, and whether its last poll window ran out empty.
fn on_guest_cpu(since_sleep: Duration, waited_for_cpu: Duration, window_empty: bool) -> bool {
    waited_for_cpu >= WAITED || (window_empty && since_sleep.saturating_sub(waited_for_cpu) < CO_LOCATED)
}

/// schedstat is "<time on cpu ns> <run delay ns> <timeslices>".
fn parse_run_delay(text: &[u8]) -> Option<Duration> {
    let field = text.split(|b| b.is_ascii_whitespace()).nth(1)?;
    let ns = std::str::from_utf8(field).ok()?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(ns))
}

#[derive(Debug, Error)]
pub enum PlacementError {
    #[error("reading the CPU affinity")]
    GetAffinity(#[source] io::Error),
    #[error("finding the current CPU")]
    GetCpu(#[source] io::Error),
    #[error("setting the CPU affinity")]
    SetAffinity(#[source] io::Error),
}

/// The CPUs the process may use, as they were when the port was set up.
#[derive(Clone, Copy)]
pub struct Placement {
    allowed: libc::cpu_set_t,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement").field("cpus", &self.cpus()).finish()
    }
}

impl Placement {
    /// The calling thread's allowed CPUs.
    pub fn of_current_thread() -> Result<Self, PlacementError> {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut allowed: libc::cpu_set_t = unsafe { mem::zeroed() };
        // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `allowed`.
        let r = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut allowed) };
        if r != 0 {
            return Err(PlacementError::GetAffinity(io::Error::last_os_error()));
        }
        Ok(Placement { allowed })
    }

    /// How many CPUs the set holds.
    pub fn cpus(&self) -> usize {
        // SAFETY: CPU_COUNT only reads the set.
        usize::try_from(unsafe { libc::CPU_COUNT(&self.allowed) }).unwrap_or(0)
    }

    /// Moves the calling thread to the allowed CPUs other than the one it is running on;
    /// the scheduler migrates it before this returns. Returns the CPU it left, or `None`
    /// when no other CPU is allowed.
    pub fn leave_current_cpu(&self) -> Result<Option<usize>, PlacementError> {
        // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
        let cpu = unsafe { libc::sched_getcpu() };
        // It returns -1 and sets errno on failure.
        let Ok(cpu) = usize::try_from(cpu) else {
            return Err(PlacementError::GetCpu(io::Error::last_os_error()));
        };
        let mut set = self.allowed;
        // SAFETY: CPU_ISSET and CPU_CLR check `cpu` against the set's size themselves.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            // SAFETY: as above.
            unsafe { libc::CPU_CLR(cpu, &mut set) };
        }
        // SAFETY: CPU_COUNT only reads the set.
        if unsafe { libc::CPU_COUNT(&set) } == 0 {
            return Ok(None);
        }
        // SAFETY: the kernel only reads `size_of::<cpu_set_t>()` bytes from `set`.
        let r = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) };
        if r != 0 {
            return Err(PlacementError::SetAffinity(io::Error::last_os_error()));
        }
        Ok(Some(cpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_delay_is_the_second_schedstat_field() {
        assert_eq!(
            parse_run_delay(b"2043219513 1417052 32\n"),
            Some(Duration::from_nanos(1_417_052))
        );
        assert_eq!(parse_run_delay(b"2043219513\n"), None);
        assert_eq!(parse_run_delay(b"1 x 2\n"), None);
        assert_eq!(parse_run_delay(b""), None);
        // This kernel reports it (without it only the second sign works).
        assert!(SleepWatch::default().run_delay().is_some());
    }

    #[test]
    fn the_guest_cpu_is_told_by_the_wait_for_it_or_by_a_quick_kick() {
        let us = Duration::from_micros;
        // Traced: woken, then waited 853 us for the vCPU to leave the CPU.
        assert!(on_guest_cpu(us(5000), us(853), false));
        // An empty window, then a kick 19 us later; and one 150 us later, followed by a
        // wait of 150 us for the CPU (too short to tell alone).
        assert!(on_guest_cpu(us(19), us(0), true));
        assert!(on_guest_cpu(us(300), us(150), true));
        assert!(!on_guest_cpu(us(300), us(150), false));
        // Woken quickly after a burst the guest ended itself: the window was not empty.
        assert!(!on_guest_cpu(us(19), us(3), false));
        // A guest that was idle longer than the window, then a prompt wake-up.
        assert!(!on_guest_cpu(us(1500), us(3), true));
        assert!(!on_guest_cpu(us(250), us(0), true));
    }

    #[test]
    fn a_watch_without_a_sleep_says_no() {
        let mut w = SleepWatch::default();
        assert!(!w.woke_on_guest_cpu());
        w.sleeping(false);
        // Decided by how long this thread waits for its CPU meanwhile: not checked here.
        w.woke_on_guest_cpu();
        assert!(!w.woke_on_guest_cpu(), "the sleep is used up");
    }

    fn current_cpu() -> usize {
        // SAFETY: as in `leave_current_cpu`.
        usize::try_from(unsafe { libc::sched_getcpu() }).unwrap()
    }

    #[test]
    fn leaves_the_cpu_it_runs_on_for_another_allowed_one() {
        // A thread of its own: the move must not pin the test harness's threads.
        std::thread::spawn(|| {
            let p = Placement::of_current_thread().unwrap();
            assert!(p.cpus() >= 1);
            match p.leave_current_cpu().unwrap() {
                Some(left) => {
                    assert!(p.cpus() >= 2);
                    // SAFETY: CPU_ISSET only reads the set and checks the index itself.
                    assert!(unsafe { libc::CPU_ISSET(left, &p.allowed) });
                    // The thread can no longer run where it was, whatever else happens.
                    assert_ne!(current_cpu(), left);
                    assert_eq!(Placement::of_current_thread().unwrap().cpus(), p.cpus() - 1);
                    // Leaving again picks from the whole original set, minus the new CPU.
                    let again = p.leave_current_cpu().unwrap().unwrap();
                    assert_ne!(current_cpu(), again);
                    assert_eq!(Placement::of_current_thread().unwrap().cpus(), p.cpus() - 1);
                }
                // Nowhere else to go: the affinity is left as it was.
                None => {
                    assert_eq!(p.cpus(), 1);
                    assert_eq!(Placement::of_current_thread().unwrap().cpus(), 1);
                }
            }
        })
        .join()
        .unwrap();
    }
}
