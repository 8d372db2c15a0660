//! The control socket: one JSON request per line, one JSON answer per line.
//!
//! Requests: `{"cmd":"stats"}`, `{"cmd":"filter"}`. Answers are objects; failures carry an
//! `"error"` key.

pub mod client;
pub mod qmp;
pub mod server;
pub mod view;

pub use server::ControlServer;
