//! Per-packet work between ports: checksum actions, the learning switch, their live
//! configuration. No vrings, no fds.

// No unsafe operation here. One item is allowed: `Packet::pinned`, an `unsafe fn` only for
// the contract its callers take on (a port may hold the frame by pointer until a flush).
#![deny(unsafe_code)]

pub mod buffers;
pub mod csum_action;
pub mod fdb;
pub mod gso;
pub mod router;
pub mod rules;
pub mod source_lock;
pub mod switch;

pub use buffers::Buffers;
pub use switch::{Egress, Ingress, Packet, Switch};
