//! Per-packet work between ports: checksum actions, the learning switch and router, the
//! outbox that carries frames to their ports, and their live configuration. No vrings, no
//! fds.

#![forbid(unsafe_code)]

pub mod capture;
pub mod csum_action;
pub mod fdb;
pub mod gso;
pub mod outbox;
pub mod packet;
pub mod router;
pub mod rules;
pub mod source_lock;
pub mod switch;

pub use outbox::{Admitted, Egress, Frame, Outbox, OutboxBuffers, PortFrames, Refused, RUN_FRAMES};
pub use packet::{BurstFrame, Packet};
pub use switch::{Dest, Ingress, Plain, Switch};
