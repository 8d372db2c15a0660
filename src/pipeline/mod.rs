//! Per-packet work between ports: checksum actions, the learning switch, their live
//! configuration. No vrings, no fds.

pub mod csum_action;
pub mod fdb;
pub mod gso;
pub mod router;
pub mod rules;
pub mod switch;

pub use switch::{Egress, Ingress, Packet, Switch};
