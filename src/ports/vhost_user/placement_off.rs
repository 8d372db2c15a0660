//! Built without the `ctrl-placement` feature: the control thread never changes its CPU
//! affinity or its scheduling policy, and reads nothing about its own scheduling. These are
//! the names the control queue uses; `config.rs` refuses `--ctrl-placement` and a non-zero
//! `--ctrl-wake-priority` in such a build, so nothing here is ever asked to act.

use std::io;
use std::os::unix::net::UnixStream;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlacementError {
    #[error("built without the ctrl-placement feature")]
    NotBuilt,
}

/// No CPU set is ever read: the thread stays where the orchestrator put it.
#[derive(Clone, Copy)]
pub struct CpuSet;

impl CpuSet {
    pub fn of_current_thread() -> Result<Self, PlacementError> {
        Err(PlacementError::NotBuilt)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Frontend,
    Signs,
}

/// The control thread's CPU and priority: left alone.
#[derive(Debug)]
pub struct CtrlCpu;

impl CtrlCpu {
    pub fn new(_allowed: Option<CpuSet>, _frontend_pid: Option<u32>, _wake_priority: u8) -> Self {
        CtrlCpu
    }

    pub fn asleep(&mut self, _window_empty: bool) -> Result<(), PlacementError> {
        Ok(())
    }

    pub fn woke(&mut self) -> Result<Option<(usize, Seen)>, PlacementError> {
        Ok(None)
    }
}

/// The frontend's process is never looked up.
pub fn peer_pid(_sock: &UnixStream) -> io::Result<Option<u32>> {
    Ok(None)
}
