//! How the daemon's threads end. Every loop checks one shared [`Stop`]; each thread the
//! daemon starts is kept as a [`Stoppable`]: its handle, and what wakes it from the call it
//! blocks in (an `accept`, a socket read, a tap read), so that it sees the request and
//! returns instead of waiting for a client, a frontend or a frame that may never come.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::warn;

/// A stop request, shared by every thread of one daemon.
#[derive(Clone, Debug, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Asks every thread that holds this to return. A waker runs after this, so a thread
    /// woken by it sees the request (SeqCst: the flag is written before the wake).
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The connection a thread is blocked on, for the waker to shut down. A thread registers
/// the connection, then checks the stop request: the waker requests, then shuts down
/// whatever is registered, so one of the two always sees the other.
pub struct Current<S>(Mutex<Option<S>>);

impl<S> Default for Current<S> {
    fn default() -> Self {
        Current(Mutex::new(None))
    }
}

impl<S> Current<S> {
    /// Registers `s` (a clone of the connection the caller is about to block on); false if
    /// a stop was requested meanwhile, and the caller should not block.
    pub fn set(&self, s: S, stop: &Stop) -> bool {
        *crate::sync::lock(&self.0) = Some(s);
        !stop.requested()
    }

    pub fn clear(&self) {
        *crate::sync::lock(&self.0) = None;
    }

    /// Runs `f` on the registered connection, if any, under its lock (so calls from two
    /// threads do not interleave); `None` when there is none.
    pub fn with<R>(&self, f: impl FnOnce(&S) -> R) -> Option<R> {
        crate::sync::lock(&self.0).as_ref().map(f)
    }
}

/// One thread the daemon started, and what wakes it once [`Stop::request`] has been called.
pub struct Stoppable {
    name: String,
    handle: JoinHandle<()>,
    wake: Box<dyn Fn() + Send>,
}

impl Stoppable {
    pub fn new(name: impl Into<String>, handle: JoinHandle<()>, wake: impl Fn() + Send + 'static) -> Self {
        Stoppable {
            name: name.into(),
            handle,
            wake: Box::new(wake),
        }
    }

    /// A thread that checks the request often enough by itself (a clock).
    pub fn polling(name: impl Into<String>, handle: JoinHandle<()>) -> Self {
        Stoppable::new(name, handle, || {})
    }

    pub fn wake(&self) {
        (self.wake)();
    }

    /// Waits until `deadline` for the thread to end and joins it; false if it did not end
    /// in time (it is then left to run out, and said once).
    pub fn join(self, deadline: Instant) -> bool {
        while !self.handle.is_finished() {
            if Instant::now() >= deadline {
                warn!(
                    "stopping: the {} thread did not end in time; left running",
                    self.name
                );
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
        if self.handle.join().is_err() {
            warn!("stopping: the {} thread had panicked", self.name);
        }
        true
    }
}

/// Stops `threads` as one step: wakes all, then joins all by `deadline`. Returns how many
/// did not end in time.
pub fn stop_all(threads: Vec<Stoppable>, deadline: Instant) -> usize {
    for t in &threads {
        t.wake();
    }
    threads
        .into_iter()
        .map(|t| t.join(deadline))
        .filter(|ended| !ended)
        .count()
}
