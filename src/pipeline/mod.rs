//! Per-packet work between ports: the learning switch. No vrings, no fds.

pub mod fdb;
pub mod switch;

pub use switch::{Egress, Packet, Switch};
