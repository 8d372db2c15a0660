//! Guest ports served over vhost-user: one socket, either QEMU attachment. The only module
//! that imports vhost-user-backend.
//!
//! A frame's way, top to bottom (docs/architecture.md has the tour):
//! - `split_ring`: the guest's rings, found in host memory once per burst;
//! - `tx_chain` and `tx`: a queue pair's worker copies a batch of TX chains out and hands
//!   the frames to the switch (pipeline/switch.rs), whose outbox writes them out;
//! - `rx`, `rx_chain` and `rx_header`: a receiving port admits a frame (its filter) and
//!   writes it into its guest's buffers, a run per queue, one interrupt check per run;
//! - `ctrl_queue`: the control queue (device attachment); `config_change`: the config
//!   space's link and announce bits, and the message that tells the frontend;
//! - `guest_port`: what a port keeps while frontends come and go; `connection` serves them
//!   one after another, `session` is one connection's vhost-user backend, `relay` passes
//!   its messages to vhost-user-backend's handler;
//! - `health`, `budget`, `avail_watch`, `memcheck`, `sigbus`: what the rest leans on.

mod avail_heads;
mod avail_watch;
mod budget;
mod config_change;
mod connection;
mod ctrl_queue;
mod direct_copy;
mod guest_port;
mod health;
mod memcheck;
pub mod policy;
pub mod relay;
mod rx;
pub mod rx_chain;
mod rx_header;
mod session;
pub mod sigbus;
pub mod split_ring;
mod tx;
pub mod tx_chain;
pub mod used_batch;

pub use config_change::ConfigChangeError;
pub use connection::{serve, serve_as_client, ConnectionError, CLIENT_RETRY};
pub use ctrl_queue::{pop_ctrl, CtrlChain, PoppedCtrl};
pub use guest_port::{FilterConfig, GuestPort, Snooping};
pub use health::Health;
