//! How much a worker thread serves per wake-up before it goes back to its event loop (and
//! so notices a disconnect, and lets its other queues in), and how a burst ended.

/// TX chains served per wake-up: Linux vhost-net's VHOST_NET_PKT_WEIGHT.
pub const TX_BUDGET: usize = 256;

/// Descriptors walked per TX wake-up, likewise: a Linux guest's chains hold at most
/// MAX_SKB_FRAGS + 2 (19 by default) descriptors, so 256 such chains fit; chains of up to
/// MAX_FRAME_DESCS zero-length descriptors do not buy a guest more than this per wake.
pub const TX_WALK_BUDGET: usize = 8192;

/// Control commands served per wake-up; each may be a table of 64 Ki entries.
pub const CTRL_BUDGET: usize = 64;

/// How a burst on one queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Burst {
    /// The ring held nothing.
    Empty,
    /// Everything the ring held was served.
    Done,
    /// The budget ran out with work left: the worker comes back by itself.
    More,
}

/// How a TX queue is served: woken by kicks (the default), or looked at again and again by a
/// poll thread with the driver's notifications left off (ports/poll.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Kicked,
    Polled,
}
