//! Keeping the control queue's polling thread off the guest's CPU.
//!
//! After each command the control thread polls its ring for a while, so that a driver that
//! busy-waits on every ack need not kick and wait for a wake-up. That only pays while the
//! thread and the guest's vCPU run on different CPUs. When a kick wakes the sleeping thread,
//! the scheduler may place it on the CPU the kick came from, the vCPU's: it then waits there
//! behind the vCPU (0.4-1.6 ms traced), and once it runs, its poll takes the CPU from the very
//! vCPU it waits for. Traced with `perf sched` after a guest idled for a second, the two took
//! turns on one CPU in 1 ms slices for several milliseconds while the other CPU idled, and
//! one rx-mode change took 2-10 ms instead of 0.3 (docs/benchmarks.md).
//!
//! Three parts, all on the control thread's own wake-ups, none per command:
//! - **Wake at once** ([`WakePriority`]): the thread sleeps at a low SCHED_FIFO priority, so
//!   a kick runs it at once wherever it lands, if need be ahead of the vCPU, which only
//!   busy-waits for the ack meanwhile. Once the command is served the thread drops back to
//!   normal priority: it never polls at real-time priority.
//! - **See the guest** ([`Frontend`]): then it looks where the frontend's (QEMU's) threads
//!   are runnable, from /proc/PID/task/*/stat, and if one is on its CPU, moves to an allowed
//!   CPU where none is (or else to any other).
//!   Dropping its priority on the vCPU's CPU without moving would leave it queued behind the
//!   vCPU until the next balancing tick.
//! - **Signs** ([`SleepWatch`]), when the frontend's threads cannot be read (another PID
//!   namespace, no /proc): it waited for its CPU longer than [`WAITED`] after the kick, or its
//!   last poll window ran out empty and the guest kicked less than [`CO_LOCATED`] after it went
//!   to sleep. The move is then to any other allowed CPU.

use std::fs::{self, File};
use std::io;
use std::mem;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use thiserror::Error;

/// A command this soon after an empty poll window was waiting for the poller's CPU. The
/// guest's gap between two commands, once it runs, is 20-110 us under TCG; a guest that was
/// really idle for a whole window is rarely back within this.
pub const CO_LOCATED: Duration = Duration::from_micros(250);

/// A woken thread that waited this long for its CPU was put on a busy one: traced on the
/// vCPU's CPU, 0.4-1.6 ms; elsewhere, 3-40 us (rarely 150).
pub const WAITED: Duration = Duration::from_micros(200);

/// How long a list of the frontend's threads is trusted. QEMU's vCPU threads live as long as
/// the guest; worker threads come and go, and a listing this old is taken again when the
/// control thread next goes to sleep (listing costs 100-200 us: never on a wake-up).
const RELIST: Duration = Duration::from_secs(1);

/// More threads than any frontend runs per guest; past this the list is cut short.
const MAX_THREADS: usize = 1024;

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

    /// Takes the sleep noted last, if the thread has not woken from it yet.
    fn woke(&mut self) -> Option<Slept> {
        self.slept.take()
    }

    /// After waking from `slept`, the signs: is this thread on the guest's CPU? Either it
    /// waited for its CPU longer than [`WAITED`] after the kick, or a poll window ran out empty
    /// and the guest kicked less than [`CO_LOCATED`] after the thread went to sleep.
    fn on_guest_cpu(&mut self, slept: Slept) -> bool {
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
    #[error("sleeping at SCHED_FIFO priority {priority} (needs CAP_SYS_NICE or RLIMIT_RTPRIO); wake-ups wait for their CPU")]
    Raise {
        priority: u8,
        #[source]
        source: io::Error,
    },
    #[error("going back to normal priority")]
    Lower(#[source] io::Error),
    #[error("listing the frontend's threads in {path}")]
    ListThreads {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A set of CPUs (the kernel's cpu_set_t).
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    pub fn empty() -> Self {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        CpuSet(unsafe { mem::zeroed() })
    }

    /// The CPUs the calling thread may run on.
    pub fn of_current_thread() -> Result<Self, PlacementError> {
        let mut set = CpuSet::empty();
        // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into the set.
        let r = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set.0) };
        if r != 0 {
            return Err(PlacementError::GetAffinity(io::Error::last_os_error()));
        }
        Ok(set)
    }

    /// Adds `cpu`; one beyond what the set can hold is ignored.
    pub fn insert(&mut self, cpu: usize) {
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: `cpu` is within the set, checked above.
            unsafe { libc::CPU_SET(cpu, &mut self.0) };
        }
    }

    pub fn remove(&mut self, cpu: usize) {
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: as in `insert`.
            unsafe { libc::CPU_CLR(cpu, &mut self.0) };
        }
    }

    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: CPU_ISSET only reads the set and checks the index against its size itself.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    pub fn len(&self) -> usize {
        // SAFETY: CPU_COUNT only reads the set.
        usize::try_from(unsafe { libc::CPU_COUNT(&self.0) }).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The set without `cpu`: where else a thread may go.
    pub fn but(&self, cpu: usize) -> CpuSet {
        let mut out = *self;
        out.remove(cpu);
        out
    }

    /// The CPUs in `self` and not in `other`.
    pub fn without(&self, other: &CpuSet) -> CpuSet {
        let mut out = *self;
        for cpu in 0..libc::CPU_SETSIZE as usize {
            if other.contains(cpu) {
                out.remove(cpu);
            }
        }
        out
    }

    /// Restricts the calling thread to this set; if it runs elsewhere, the kernel migrates
    /// it before returning.
    fn bind_current_thread(&self) -> Result<(), PlacementError> {
        // SAFETY: the kernel only reads `size_of::<cpu_set_t>()` bytes from the set.
        let r = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if r != 0 {
            return Err(PlacementError::SetAffinity(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &Self) -> bool {
        // SAFETY: CPU_EQUAL only reads both sets.
        unsafe { libc::CPU_EQUAL(&self.0, &other.0) }
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries((0..libc::CPU_SETSIZE as usize).filter(|&c| self.contains(c)))
            .finish()
    }
}

/// The CPU the calling thread runs on.
fn current_cpu() -> Result<usize, PlacementError> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    // It returns -1 and sets errno on failure.
    let Ok(cpu) = usize::try_from(cpu) else {
        return Err(PlacementError::GetCpu(io::Error::last_os_error()));
    };
    Ok(cpu)
}

/// Where to poll from: `None` to stay on `current`, else the CPUs to move among. Stay when no
/// frontend thread is runnable here. Otherwise leave: for the allowed CPUs where none is, or,
/// if every one has a frontend thread too, for any other. The thread runnable here is most
/// likely the vCPU that kicked, spinning until its ack; another CPU's is as likely QEMU's
/// main loop on a short errand (traced: one every 2 ms for the guest's timers).
fn destination(allowed: &CpuSet, frontend_busy: &CpuSet, current: usize) -> Option<CpuSet> {
    if !frontend_busy.contains(current) {
        return None;
    }
    let other = allowed.but(current);
    let free = other.without(frontend_busy);
    if !free.is_empty() {
        Some(free)
    } else {
        (!other.is_empty()).then_some(other)
    }
}

/// The frontend process (QEMU) and its threads, as /proc shows them: which CPUs its
/// runnable threads (a vCPU running guest code, or waiting for a CPU) are on.
#[derive(Debug)]
pub struct Frontend {
    pid: u32,
    /// One open /proc/PID/task/TID/stat per thread: a read at offset 0 of an open file
    /// allocates nothing.
    threads: Vec<File>,
    listed: Option<Instant>,
}

impl Frontend {
    pub fn new(pid: u32) -> Self {
        Frontend {
            pid,
            threads: Vec::new(),
            listed: None,
        }
    }

    /// Lists the frontend's threads again if the list is older than [`RELIST`]: threads that
    /// exited drop out, new ones come in.
    pub fn refresh(&mut self) -> Result<(), PlacementError> {
        if self.listed.is_none_or(|at| at.elapsed() >= RELIST) {
            self.list()?;
        }
        Ok(())
    }

    /// The CPUs on which a thread of the frontend, as last listed, is runnable now.
    pub fn busy_cpus(&self) -> CpuSet {
        let mut busy = CpuSet::empty();
        let mut buf = [0u8; 1024];
        for f in &self.threads {
            // A thread that exited fails to read; the next refresh drops it.
            if let Ok(n) = f.read_at(&mut buf, 0) {
                if let Some((b'R', cpu)) = buf.get(..n).and_then(parse_task_stat) {
                    busy.insert(cpu);
                }
            }
        }
        busy
    }

    fn list(&mut self) -> Result<(), PlacementError> {
        let path = format!("/proc/{}/task", self.pid);
        let dir = fs::read_dir(&path).map_err(|source| PlacementError::ListThreads {
            path: path.clone(),
            source,
        })?;
        self.threads.clear();
        // A thread that exits between the listing and the open is simply left out.
        for entry in dir.flatten().take(MAX_THREADS) {
            if let Ok(f) = File::open(entry.path().join("stat")) {
                self.threads.push(f);
            }
        }
        self.listed = Some(Instant::now());
        Ok(())
    }
}

/// The process at the other end of a connected Unix socket (SO_PEERCRED); `None` when it
/// lives in a PID namespace this process cannot see (the kernel reports pid 0).
pub fn peer_pid(sock: &UnixStream) -> io::Result<Option<u32>> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(mem::size_of::<libc::ucred>()).map_err(io::Error::other)?;
    // SAFETY: the kernel writes at most `len` bytes into `cred`, which outlives the call,
    // and the descriptor is open for as long as `sock` is borrowed.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(cred.pid).ok().filter(|&pid| pid != 0))
}

/// From /proc/PID/task/TID/stat: the thread's state letter and the CPU it last ran on
/// (field 39). The command name (field 2, in parentheses) may hold spaces and ')', so the
/// fields are counted from the last ')'.
fn parse_task_stat(text: &[u8]) -> Option<(u8, usize)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let mut fields = text
        .get(close + 1..)?
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    // The state is field 3; the CPU, field 39.
    let cpu = fields.nth(39 - 4)?;
    let cpu = std::str::from_utf8(cpu).ok()?.parse::<usize>().ok()?;
    Some((state, cpu))
}

/// The SCHED_FIFO priority the control thread sleeps at (see the module text); 0 for none.
/// After the kernel refuses it once, the thread stays at normal priority.
#[derive(Debug)]
pub struct WakePriority {
    priority: u8,
    raised: bool,
}

impl WakePriority {
    pub fn new(priority: u8) -> Self {
        WakePriority {
            priority,
            raised: false,
        }
    }

    /// Before sleeping: real-time priority, so that the wake-up runs at once.
    pub fn raise(&mut self) -> Result<(), PlacementError> {
        if self.priority == 0 || self.raised {
            return Ok(());
        }
        let priority = self.priority;
        match set_policy(libc::SCHED_FIFO, i32::from(priority)) {
            Ok(()) => {
                self.raised = true;
                Ok(())
            }
            Err(source) => {
                self.priority = 0;
                Err(PlacementError::Raise { priority, source })
            }
        }
    }

    /// Once the command that woke the thread is served: normal priority for the poll.
    pub fn lower(&mut self) -> Result<(), PlacementError> {
        if !self.raised {
            return Ok(());
        }
        self.raised = false;
        set_policy(libc::SCHED_OTHER, 0).map_err(PlacementError::Lower)
    }
}

/// Sets the calling thread's scheduling policy (on Linux, pid 0 is the calling thread).
fn set_policy(policy: libc::c_int, priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: the kernel only reads `param`, which outlives the call.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How the control thread knew it had woken on the guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A thread of the frontend was runnable on its CPU.
    Frontend,
    /// The signs of [`SleepWatch`].
    Signs,
}

/// What the control thread does with its CPU and priority around its sleeps. Only the
/// control thread uses it.
#[derive(Debug)]
pub struct CtrlCpu {
    /// The CPUs the process may use, as they were when the connection began; `None` if
    /// they could not be read (the thread then stays where the scheduler puts it).
    allowed: Option<CpuSet>,
    frontend: Option<Frontend>,
    watch: SleepWatch,
    priority: WakePriority,
}

impl CtrlCpu {
    pub fn new(allowed: Option<CpuSet>, frontend_pid: Option<u32>, wake_priority: u8) -> Self {
        CtrlCpu {
            allowed,
            frontend: frontend_pid.map(Frontend::new),
            watch: SleepWatch::default(),
            priority: WakePriority::new(wake_priority),
        }
    }

    /// The thread goes to sleep until kicked; `window_empty`: a poll window just ran out
    /// with nothing posted. Errors are for the log: the thread then sleeps at normal priority,
    /// or goes by the signs alone, for the rest of the connection.
    pub fn asleep(&mut self, window_empty: bool) -> Result<(), PlacementError> {
        let listed = self.frontend.as_mut().map_or(Ok(()), Frontend::refresh);
        if listed.is_err() {
            self.frontend = None;
        }
        let raised = self.priority.raise();
        // Noted last, so that the time since the sleep is the guest's alone.
        self.watch.sleeping(window_empty);
        listed.and(raised)
    }

    /// Right after serving the first command since [`CtrlCpu::asleep`]: moves off the
    /// guest's CPU if it is on it, then drops to normal priority. Returns the CPU it left and
    /// how it knew. Does nothing when the thread has not slept since the last call.
    pub fn woke(&mut self) -> Result<Option<(usize, Seen)>, PlacementError> {
        let Some(slept) = self.watch.woke() else {
            return Ok(None);
        };
        // Moved first and lowered after: at normal priority on the vCPU's CPU the thread
        // would wait behind the vCPU even to move.
        let moved = self.leave_guest_cpu(slept);
        let lowered = self.priority.lower();
        let moved = moved?;
        lowered?;
        Ok(moved)
    }

    fn leave_guest_cpu(&mut self, slept: Slept) -> Result<Option<(usize, Seen)>, PlacementError> {
        let Some(allowed) = self.allowed else {
            return Ok(None);
        };
        let current = current_cpu()?;
        let (to, seen) = match &self.frontend {
            Some(f) if !f.threads.is_empty() => {
                (destination(&allowed, &f.busy_cpus(), current), Seen::Frontend)
            }
            // Without the frontend's threads, the signs say whether to move, and to where
            // they cannot: any other allowed CPU.
            _ => {
                let rest = allowed.but(current);
                let to = (self.watch.on_guest_cpu(slept) && !rest.is_empty()).then_some(rest);
                (to, Seen::Signs)
            }
        };
        let Some(to) = to else {
            return Ok(None);
        };
        to.bind_current_thread()?;
        Ok(Some((current, seen)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

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
    fn a_sleep_is_woken_from_once() {
        let mut w = SleepWatch::default();
        assert!(w.woke().is_none());
        w.sleeping(true);
        let slept = w.woke().expect("a sleep was noted");
        assert!(slept.window_empty);
        assert!(w.woke().is_none(), "the sleep is used up");
    }

    /// A line as Linux 6.x writes it for a QEMU vCPU thread: running on CPU 1.
    const VCPU_STAT: &[u8] = b"7550 (CPU 0/TCG) R 1 7543 7543 0 -1 4194624 6093 0 0 0 \
        33412 1893 0 0 20 0 12 0 16884632 3175473152 61522 18446744073709551615 1 1 0 0 0 0 \
        268444224 4096 17990 0 0 0 -1 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn task_stat_gives_the_state_and_the_last_cpu() {
        assert_eq!(parse_task_stat(VCPU_STAT), Some((b'R', 1)));
        // A name with spaces and parentheses of its own; a sleeping thread on CPU 12.
        let odd = format!("9 (a) b (c)) S{} 12 0 0\n", " 0".repeat(39 - 4));
        assert_eq!(parse_task_stat(odd.as_bytes()), Some((b'S', 12)));
        // Cut before field 39, or no name at all: nothing.
        assert_eq!(parse_task_stat(&VCPU_STAT[..120]), None);
        assert_eq!(parse_task_stat(b"7550 R 1 2 3"), None);
        assert_eq!(parse_task_stat(b""), None);
    }

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::empty();
        for &c in cpus {
            s.insert(c);
        }
        s
    }

    #[test]
    fn moves_only_off_a_cpu_the_frontend_wants_and_to_one_it_does_not() {
        let all = set(&[0, 1, 2, 3]);
        // No frontend thread runnable here: stay.
        assert_eq!(destination(&all, &set(&[1]), 0), None);
        assert_eq!(destination(&all, &set(&[]), 0), None);
        // The vCPU is here: go to any allowed CPU where no frontend thread is.
        assert_eq!(destination(&all, &set(&[0]), 0), Some(set(&[1, 2, 3])));
        assert_eq!(destination(&all, &set(&[0, 2]), 0), Some(set(&[1, 3])));
        // Two CPUs, the vCPU on this one: the other.
        assert_eq!(destination(&set(&[0, 1]), &set(&[1]), 1), Some(set(&[0])));
        // Every other CPU has a frontend thread too: still leave the kicker's CPU.
        assert_eq!(destination(&set(&[0, 1]), &set(&[0, 1]), 0), Some(set(&[1])));
        assert_eq!(
            destination(&set(&[0, 1, 2]), &set(&[0, 1, 2]), 2),
            Some(set(&[0, 1]))
        );
        // No other CPU: stay.
        assert_eq!(destination(&set(&[0]), &set(&[0]), 0), None);
        // Busy CPUs outside the allowed set do not count as places to go.
        assert_eq!(destination(&set(&[0, 1]), &set(&[0, 5]), 0), Some(set(&[1])));
    }

    #[test]
    fn cpu_sets_hold_what_is_put_in_them() {
        let mut s = set(&[0, 3]);
        assert!(s.contains(3) && !s.contains(2));
        assert_eq!(s.len(), 2);
        s.remove(3);
        assert_eq!(s, set(&[0]));
        // Out of range: ignored, never a panic.
        s.insert(1 << 20);
        s.remove(1 << 20);
        assert!(!s.contains(1 << 20));
        assert_eq!(set(&[0, 1, 2]).without(&set(&[1, 7])), set(&[0, 2]));
        let three = set(&[0, 1, 2]);
        assert_eq!(three.but(1), set(&[0, 2]));
        assert_eq!(three.but(5), three);
        assert_eq!(three.but(1 << 20), three);
        assert!(CpuSet::empty().is_empty());
        assert_eq!(format!("{:?}", set(&[2, 0])), "{0, 2}");
    }

    /// Runs `f` on a new thread: the tests that bind their thread to CPUs or change its
    /// priority must not do it to the test harness's threads.
    fn on_a_thread_of_its_own(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    /// A busy-looping child process pinned to `cpu`, killed when dropped.
    struct Spinner(Child);

    impl Spinner {
        fn on(cpu: usize) -> Spinner {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap();
            let pid = libc::pid_t::try_from(child.id()).unwrap();
            let spinner = Spinner(child);
            // SAFETY: the kernel only reads the set.
            let r =
                unsafe { libc::sched_setaffinity(pid, mem::size_of::<libc::cpu_set_t>(), &set(&[cpu]).0) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            // Until the kernel shows it runnable there (bounded).
            let mut f = Frontend::new(spinner.0.id());
            f.refresh().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !f.busy_cpus().contains(cpu) {
                assert!(Instant::now() < deadline, "the spinner never showed on CPU {cpu}");
                std::thread::sleep(Duration::from_millis(1));
            }
            spinner
        }
    }

    impl Drop for Spinner {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_runnable_frontend_thread_shows_on_its_cpu() {
        let allowed = CpuSet::of_current_thread().unwrap();
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&c| allowed.contains(c))
            .unwrap();
        let spinner = Spinner::on(cpu);
        let mut f = Frontend::new(spinner.0.id());
        // Not listed yet: nothing known.
        assert!(f.busy_cpus().is_empty());
        f.refresh().unwrap();
        let busy = f.busy_cpus();
        assert!(busy.contains(cpu));
        // Its only thread: nowhere else.
        assert_eq!(busy.len(), 1);
        drop(spinner);
        // Exited: nothing runnable, and no error until the list is taken again.
        assert!(f.busy_cpus().is_empty());
        assert!(matches!(
            Frontend::new(u32::MAX).refresh(),
            Err(PlacementError::ListThreads { .. })
        ));
    }

    #[test]
    fn wakes_off_the_cpu_a_frontend_thread_wants() {
        on_a_thread_of_its_own(|| {
            let allowed = CpuSet::of_current_thread().unwrap();
            let cpu = current_cpu().unwrap();
            set(&[cpu]).bind_current_thread().unwrap();
            let spinner = Spinner::on(cpu);
            let mut ctrl = CtrlCpu::new(Some(allowed), Some(spinner.0.id()), 0);
            // Not woken from a sleep: nothing to do.
            assert_eq!(ctrl.woke().unwrap(), None);
            ctrl.asleep(false).unwrap();
            let mut rest = allowed;
            rest.remove(cpu);
            if rest.is_empty() {
                assert_eq!(ctrl.woke().unwrap(), None, "nowhere else to go");
                return;
            }
            assert_eq!(ctrl.woke().unwrap(), Some((cpu, Seen::Frontend)));
            assert_ne!(current_cpu().unwrap(), cpu);
            assert_eq!(CpuSet::of_current_thread().unwrap(), rest);
            // Now on a CPU without it: stays.
            ctrl.asleep(false).unwrap();
            assert_eq!(ctrl.woke().unwrap(), None);
            assert_eq!(CpuSet::of_current_thread().unwrap(), rest);
        });
    }

    #[test]
    fn a_frontend_that_cannot_be_listed_leaves_the_signs() {
        on_a_thread_of_its_own(|| {
            let mut ctrl = CtrlCpu::new(CpuSet::of_current_thread().ok(), Some(u32::MAX), 0);
            assert!(matches!(
                ctrl.asleep(false),
                Err(PlacementError::ListThreads { .. })
            ));
            assert!(ctrl.frontend.is_none());
            // The sleep still counts, and the next one lists nothing.
            assert!(ctrl.woke().is_ok());
            ctrl.asleep(false).unwrap();
        });
    }

    #[test]
    fn without_the_frontend_the_signs_decide() {
        on_a_thread_of_its_own(|| {
            let allowed = CpuSet::of_current_thread().unwrap();
            let mut ctrl = CtrlCpu::new(Some(allowed), None, 0);
            // An empty window and a wake-up right after it: the quick-kick sign.
            let t = Instant::now();
            ctrl.asleep(true).unwrap();
            let woke = ctrl.woke().unwrap();
            let took = t.elapsed();
            match woke {
                Some((left, seen)) => {
                    assert_eq!(seen, Seen::Signs);
                    assert!(allowed.len() >= 2);
                    assert_ne!(current_cpu().unwrap(), left);
                    assert_eq!(CpuSet::of_current_thread().unwrap().len(), allowed.len() - 1);
                }
                // Only if there is nowhere to go, or the host stopped this whole machine
                // past the window (that wait is not the thread's run delay).
                None => assert!(allowed.len() == 1 || took >= CO_LOCATED, "{took:?}"),
            }
            // Without a sign, no move: the decision itself is tested on traced values above,
            // since here the wait for the CPU is up to the scheduler.
        });
    }

    fn policy() -> libc::c_int {
        // SAFETY: sched_getscheduler only reads the calling thread's policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// The capability sets of the calling thread (capget/capset; libc has no wrapper).
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    const CAP_VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_NICE: u32 = 23;

    fn thread_caps() -> [CapData; 2] {
        let mut hdr = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: version 3 takes one header and two data structs, which outlive the call.
        let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        data
    }

    /// Drops CAP_SYS_NICE from the calling thread's effective set (capabilities are per
    /// thread: the rest of the test process keeps it).
    fn drop_sys_nice() {
        let mut data = thread_caps();
        data[0].effective &= !(1 << CAP_SYS_NICE);
        let mut hdr = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        // SAFETY: as in `thread_caps`; the kernel only reads the data.
        let r = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
    }

    /// Whether this thread may take SCHED_FIFO priority 1: CAP_SYS_NICE, or RLIMIT_RTPRIO.
    fn may_raise() -> bool {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: the kernel writes one rlimit, which outlives the call.
        let r = unsafe { libc::getrlimit(libc::RLIMIT_RTPRIO, &mut lim) };
        assert_eq!(r, 0);
        thread_caps()[0].effective & (1 << CAP_SYS_NICE) != 0 || lim.rlim_cur >= 1
    }

    #[test]
    fn sleeps_at_real_time_priority_and_wakes_to_normal() {
        on_a_thread_of_its_own(|| {
            let mut p = WakePriority::new(1);
            if !may_raise() {
                assert!(matches!(
                    p.raise(),
                    Err(PlacementError::Raise { priority: 1, .. })
                ));
                return;
            }
            p.raise().unwrap();
            assert_eq!(policy(), libc::SCHED_FIFO);
            // Raising twice does nothing.
            p.raise().unwrap();
            p.lower().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
            // Lowering twice does nothing.
            p.lower().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
            let mut off = WakePriority::new(0);
            off.raise().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
        });
    }

    #[test]
    fn without_the_privilege_it_says_so_once_and_sleeps_at_normal_priority() {
        on_a_thread_of_its_own(|| {
            drop_sys_nice();
            let mut ctrl = CtrlCpu::new(CpuSet::of_current_thread().ok(), None, 1);
            if may_raise() {
                // RLIMIT_RTPRIO allows it without the capability.
                ctrl.asleep(false).unwrap();
                assert_eq!(policy(), libc::SCHED_FIFO);
                return;
            }
            assert!(matches!(
                ctrl.asleep(false),
                Err(PlacementError::Raise { priority: 1, .. })
            ));
            assert_eq!(policy(), libc::SCHED_OTHER);
            // Woken: nothing to lower; then no second report, and still normal priority.
            assert!(ctrl.woke().is_ok());
            ctrl.asleep(false).unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
        });
    }
}
