//! The control socket: one JSON request per line, one JSON answer per line.
//!
//! Requests: `{"cmd":"stats"}`, `{"cmd":"filter"}`, `{"cmd":"action-list"}`,
//! `{"cmd":"action-add","arg":SPEC}`, `{"cmd":"action-del","arg":SPEC}`, and the same three
//! for `route`; `{"cmd":"announce"}` (optionally `"arg":PORT`) and
//! `{"cmd":"link","arg":"PORT up|down"}`, sent on to QEMU over `--qmp`;
//! `{"cmd":"queue-cpus","arg":"PORT QUEUE=CPUS..."}`. Answers are
//! objects; failures carry an `"error"` key. Every answer carries `"version"`:
//! [`INTERFACE_VERSION`].

#![forbid(unsafe_code)]

pub mod bounded;
pub mod capture;
pub mod client;
pub mod metrics;
pub mod metrics_server;
pub mod present;
pub mod qemu_args;
pub mod qmp;
pub mod qmp_link;
pub mod queue_cpus;
pub mod server;
pub mod version;
pub mod view;

pub use server::ControlServer;
pub use version::INTERFACE_VERSION;
pub use view::Daemon;
