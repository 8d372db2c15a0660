//! Poll mode (`--poll`, `--poll-cpus`): worker threads that busy-poll the queues of every
//! port assigned to them, run to completion, as DPDK's PMD threads and OVS-DPDK's do. No
//! kick, no epoll wake-up: a queue's driver is told not to notify (VRING_USED_F_NO_NOTIFY)
//! and the thread looks at the ring again as soon as it has gone round the others.
//!
//! Each poll thread spends a whole CPU, busy or not, so it is opt-in; the default data path is event-driven. Where the threads run is the
//! orchestrator's business unless `--poll-cpus` names CPUs: then each thread is pinned to
//! one, which is the only placement the daemon ever does on its own, and only when asked.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use thiserror::Error;

use crate::stats::Counter;
use crate::stop::{Stop, Stoppable};

/// How many poll threads, and where they run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollConfig {
    /// `--poll N`: N threads, placed by whoever places the daemon.
    Threads(usize),
    /// `--poll-cpus LIST`: one thread per CPU, each pinned to its CPU.
    Cpus(Vec<usize>),
}

impl PollConfig {
    pub fn threads(&self) -> usize {
        match self {
            PollConfig::Threads(n) => *n,
            PollConfig::Cpus(c) => c.len(),
        }
    }

    fn cpu(&self, thread: usize) -> Option<usize> {
        match self {
            PollConfig::Threads(_) => None,
            PollConfig::Cpus(c) => c.get(thread).copied(),
        }
    }
}

#[derive(Debug, Error)]
pub enum PollError {
    #[error("starting poll thread {thread}")]
    Spawn {
        thread: usize,
        #[source]
        source: io::Error,
    },
}

/// What one look at a queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Nothing to do.
    Idle,
    /// Frames were served.
    Busy,
}

/// A queue a poll thread serves. The thread holds it weakly: when the connection ends and
/// its last strong holder lets go, the queue drops out of the thread's round.
pub trait PollQueue: Send + Sync {
    /// Serves queue `queue` once, up to its burst budget. Takes the `Arc` the thread just
    /// upgraded, so an implementation can hand out clones of itself.
    fn poll(self: Arc<Self>, queue: usize) -> Polled;
}

type Entry = (Weak<dyn PollQueue>, usize);

/// One poll thread's round: the queues it serves, changed under the lock and picked up by
/// the thread when `generation` moves (the lock is not taken in the loop otherwise).
#[derive(Default)]
struct Round {
    queues: Mutex<Vec<Entry>>,
    generation: AtomicU64,
    /// Written by the round's thread alone.
    visits: Visits,
}

/// What a poll thread's visits to its queues found, and the time-stamp-counter ticks the
/// busy ones took: a busy visit's time over the frames it served is what a frame costs in
/// poll mode, the figure DPDK's testpmd gives as busy cycles per packet
/// (`--record-core-cycles`, which also leaves empty polls out).
#[derive(Default)]
struct Visits {
    busy: Counter,
    idle: Counter,
    busy_ticks: Counter,
}

/// A poll thread's visits, for `ctl stats` and `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct PollThreadSnapshot {
    pub thread: usize,
    /// The CPU it is pinned to (`--poll-cpus`), if any.
    pub cpu: Option<usize>,
    /// Visits to a queue that found frames, and that found none.
    pub busy_visits: u64,
    pub idle_visits: u64,
    /// Time spent in busy visits, in ns.
    pub busy_ns: u64,
}

/// The time-stamp counter: two reads bracket each visit, so they must cost far less than
/// the clock (`Instant` is a vDSO call). Elsewhere than on x86_64, nanoseconds from a
/// monotonic clock stand in for the ticks.
#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> u64 {
    // SAFETY: RDTSC reads the time-stamp counter into registers; it touches no memory and
    // every x86_64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn ticks() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Ticks per ns, measured once against the monotonic clock over 20 ms.
fn ticks_per_ns() -> f64 {
    let (t0, c0) = (Instant::now(), ticks());
    thread::sleep(Duration::from_millis(20));
    let (ns, c) = (t0.elapsed().as_nanos() as f64, ticks().wrapping_sub(c0) as f64);
    if ns > 0.0 && c > 0.0 {
        c / ns
    } else {
        1.0
    }
}

impl Round {
    fn changed(&self, f: impl FnOnce(&mut Vec<Entry>)) {
        let mut q = crate::sync::lock(&self.queues);
        f(&mut q);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// The poll threads, and which one the next queue goes to.
pub struct PollGroup {
    rounds: Vec<Arc<Round>>,
    next: AtomicUsize,
    cfg: PollConfig,
    ticks_per_ns: f64,
}

impl PollGroup {
    /// Starts the threads `cfg` asks for; they end when `stop` is requested.
    pub fn start(cfg: &PollConfig, stop: &Stop, into: &mut Vec<Stoppable>) -> Result<Arc<Self>, PollError> {
        let rounds: Vec<Arc<Round>> = (0..cfg.threads()).map(|_| Arc::default()).collect();
        for (i, round) in rounds.iter().enumerate() {
            let (round, stop, cpu) = (round.clone(), stop.clone(), cfg.cpu(i));
            let handle = thread::Builder::new()
                .name(format!("vnic-poll{i}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin(i, cpu);
                    }
                    run(&round, &stop);
                })
                .map_err(|source| PollError::Spawn { thread: i, source })?;
            into.push(Stoppable::polling(format!("poll thread {i}"), handle));
        }
        info!(
            "poll mode: {} thread(s){}",
            rounds.len(),
            match cfg {
                PollConfig::Cpus(c) => format!(" pinned to CPU(s) {c:?}"),
                PollConfig::Threads(_) => String::new(),
            }
        );
        Ok(Arc::new(PollGroup {
            rounds,
            next: AtomicUsize::new(0),
            cfg: cfg.clone(),
            ticks_per_ns: ticks_per_ns(),
        }))
    }

    /// Each thread's visits so far.
    pub fn snapshot(&self) -> Vec<PollThreadSnapshot> {
        self.rounds
            .iter()
            .enumerate()
            .map(|(thread, r)| PollThreadSnapshot {
                thread,
                cpu: self.cfg.cpu(thread),
                busy_visits: r.visits.busy.get(),
                idle_visits: r.visits.idle.get(),
                busy_ns: (r.visits.busy_ticks.get() as f64 / self.ticks_per_ns) as u64,
            })
            .collect()
    }

    /// Adds queue `queue` of `q` to the next thread's round, in turn, and says which.
    pub fn add(&self, q: Weak<dyn PollQueue>, queue: usize) -> usize {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.rounds.len().max(1);
        if let Some(round) = self.rounds.get(i) {
            round.changed(|v| {
                // Queues of connections gone since are dropped here too.
                v.retain(|(w, _)| w.strong_count() > 0);
                v.push((q, queue));
            });
        }
        i
    }

    /// Queues in every round (gone ones included until their thread notices).
    pub fn len(&self) -> usize {
        self.rounds
            .iter()
            .map(|r| crate::sync::lock(&r.queues).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn pin(thread: usize, cpu: usize) {
    let mut set = CpuSet::new();
    let r = set
        .set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set));
    match r {
        Ok(()) => debug!("poll thread {thread} pinned to CPU {cpu}"),
        // Left where it is: a CPU the cgroup does not allow is the orchestrator's call.
        Err(e) => warn!("poll thread {thread}: cannot pin to CPU {cpu}: {e}; left unpinned"),
    }
}

/// One poll thread: round after round over its queues until a stop is requested.
fn run(round: &Round, stop: &Stop) {
    let mut local: Vec<Entry> = Vec::new();
    let mut seen = u64::MAX;
    while !stop.requested() {
        let generation = round.generation.load(Ordering::Acquire);
        if generation != seen {
            local = crate::sync::lock(&round.queues).clone();
            seen = generation;
        }
        let mut busy = false;
        let mut gone = false;
        for (q, queue) in &local {
            match q.upgrade() {
                Some(q) => {
                    let t0 = ticks();
                    let found = q.poll(*queue);
                    if found == Polled::Busy {
                        round.visits.busy_ticks.add(ticks().wrapping_sub(t0));
                        round.visits.busy.inc();
                        busy = true;
                    } else {
                        round.visits.idle.inc();
                    }
                }
                None => gone = true,
            }
        }
        if gone {
            round.changed(|v| v.retain(|(w, _)| w.strong_count() > 0));
        }
        if !busy {
            // An idle round: tell the CPU (a pause on x86) and go round again.
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter {
        queues: Mutex<Vec<usize>>,
    }

    impl PollQueue for Counter {
        fn poll(self: Arc<Self>, queue: usize) -> Polled {
            let mut q = crate::sync::lock(&self.queues);
            if !q.contains(&queue) {
                q.push(queue);
            }
            Polled::Idle
        }
    }

    fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn polls_every_queue_and_forgets_a_dropped_one() {
        let stop = Stop::default();
        let mut threads = Vec::new();
        let group = PollGroup::start(&PollConfig::Threads(2), &stop, &mut threads).unwrap();
        let c = Arc::new(Counter {
            queues: Mutex::new(Vec::new()),
        });
        let w: Weak<dyn PollQueue> = Arc::downgrade(&c) as Weak<dyn PollQueue>;
        assert_eq!(group.add(w.clone(), 0), 0);
        assert_eq!(group.add(w, 1), 1, "queues go to the threads in turn");
        until("both queues polled", || crate::sync::lock(&c.queues).len() == 2);
        drop(c);
        until("the gone queues dropped", || group.is_empty());
        stop.request();
        let late = crate::stop::stop_all(threads, Instant::now() + Duration::from_secs(5));
        assert_eq!(late, 0, "poll threads end on a stop");
    }

    #[test]
    fn visits_are_counted_and_busy_ones_timed() {
        struct Busy;
        impl PollQueue for Busy {
            fn poll(self: Arc<Self>, queue: usize) -> Polled {
                if queue == 0 {
                    thread::sleep(Duration::from_millis(2));
                    Polled::Busy
                } else {
                    Polled::Idle
                }
            }
        }
        let stop = Stop::default();
        let mut threads = Vec::new();
        let group = PollGroup::start(&PollConfig::Threads(1), &stop, &mut threads).unwrap();
        let q = Arc::new(Busy);
        group.add(Arc::downgrade(&q) as Weak<dyn PollQueue>, 0);
        group.add(Arc::downgrade(&q) as Weak<dyn PollQueue>, 1);
        until("ten busy visits", || group.snapshot()[0].busy_visits >= 10);
        stop.request();
        assert_eq!(
            crate::stop::stop_all(threads, Instant::now() + Duration::from_secs(5)),
            0
        );
        let s = &group.snapshot()[0];
        assert_eq!((s.thread, s.cpu), (0, None));
        assert!(
            s.idle_visits >= s.busy_visits - 1,
            "one idle visit per round: {s:?}"
        );
        // Each busy visit slept 2 ms: the time is there, give or take the clock's rate.
        let per_visit = s.busy_ns / s.busy_visits;
        assert!((1_500_000..200_000_000).contains(&per_visit), "{s:?}");
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu() {
        let stop = Stop::default();
        let mut threads = Vec::new();
        let group = PollGroup::start(&PollConfig::Cpus(vec![0]), &stop, &mut threads).unwrap();
        struct Where(Mutex<Option<CpuSet>>);
        impl PollQueue for Where {
            fn poll(self: Arc<Self>, _: usize) -> Polled {
                *crate::sync::lock(&self.0) = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok();
                Polled::Idle
            }
        }
        let w = Arc::new(Where(Mutex::new(None)));
        group.add(Arc::downgrade(&w) as Weak<dyn PollQueue>, 0);
        until("the thread polled", || crate::sync::lock(&w.0).is_some());
        let set = crate::sync::lock(&w.0).unwrap();
        assert!(set.is_set(0).unwrap());
        assert_eq!(
            (1..CpuSet::count())
                .filter(|c| set.is_set(*c).unwrap_or(false))
                .count(),
            0,
            "pinned to CPU 0 alone"
        );
        stop.request();
        assert_eq!(
            crate::stop::stop_all(threads, Instant::now() + Duration::from_secs(5)),
            0
        );
    }
}
