//! Per-packet work between ports: checksum actions, the learning switch, their live
//! configuration. No vrings, no fds.

#![forbid(unsafe_code)]

pub mod csum_action;
pub mod fdb;
pub mod gso;
pub mod router;
pub mod rules;
pub mod source_lock;
pub mod switch;

pub use switch::{Egress, Ingress, Packet, Switch};

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` with one of this thread's reusable frame buffers (grown once, then reused, so
/// the data path does not allocate per packet); a fresh buffer if that one is already in
/// use, which only a re-entrant call could cause.
pub(crate) fn with_buffer<R>(
    key: &'static LocalKey<RefCell<Vec<u8>>>,
    f: impl FnOnce(&mut Vec<u8>) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut b) => f(&mut b),
        Err(_) => f(&mut Vec::new()),
    })
}
