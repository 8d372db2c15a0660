//! The virtio-net device model: feature bits, config space, control-queue commands and the
//! receive state they produce. No vrings, no file descriptors: everything here is driven by
//! byte buffers and is tested on its own.

#![forbid(unsafe_code)]

pub mod config_space;
pub mod ctrl;
pub mod features;
pub mod filter;
pub mod nic;
pub mod rss;
pub mod rx_state;
pub mod snoop;
pub mod snoop_counters;

pub use config_space::NetConfig;
pub use ctrl::{CtrlError, CtrlOutcome, ValidCommand};
pub use nic::NicState;
pub use rx_state::{RxMode, RxState};
