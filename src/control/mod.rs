//! The control socket: one JSON request per line, one JSON answer per line.
//!
//! Requests: `{"cmd":"stats"}`, `{"cmd":"filter"}`, `{"cmd":"action-list"}`,
//! `{"cmd":"action-add","arg":SPEC}`, `{"cmd":"action-del","arg":SPEC}`, and the same three
//! for `route`. Answers are objects; failures carry an `"error"` key. Every answer carries
//! `"version"`: [`INTERFACE_VERSION`].

#![forbid(unsafe_code)]

pub mod bounded;
pub mod client;
pub mod metrics;
pub mod qmp;
pub mod server;
pub mod view;

pub use server::{ControlServer, Daemon};

/// The version of the interface docs/interface.md describes: the control socket's JSON keys
/// and the metric names of `--metrics`. A key or metric may be added within a version;
/// renaming or removing one, or changing its meaning, raises it.
pub const INTERFACE_VERSION: u32 = 1;
