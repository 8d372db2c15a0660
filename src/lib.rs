//! dpaa-vnic: a vhost-user virtio-net backend modelled on NXP DPAA (FMan).
//!
//! Layers, lowest first; each may use only the ones above it in this list:
//! - [`wire`]: packet views and checksums (no I/O);
//! - [`device`]: the virtio-net device model (features, config, control commands);
//! - [`pipeline`]: per-packet work (the learning switch);
//! - [`ports`]: I/O (vhost-user queues, tap); the only layer that touches fds and vrings;
//! - [`control`] and [`config`]: control socket, statistics and the command line;
//! - [`daemon`]: starts all of it from a [`config::Config`] and removes what it bound when
//!   dropped (`main.rs` only parses arguments and waits for a signal).
//!
//! Shared by every layer: [`stats`] (per-thread counters), [`unix_socket`] (listening
//! sockets created with the access asked for), [`stop`] (how threads end) and [`sync`]
//! (locks that outlive a panicking thread).

pub mod cli;
pub mod config;
pub mod control;
pub mod counter;
pub mod daemon;
pub mod device;
pub mod histogram;
pub mod logging;
pub mod pipeline;
pub mod ports;
pub mod stats;
pub mod stop;
pub mod sync;
pub mod unix_socket;
pub mod wire;
