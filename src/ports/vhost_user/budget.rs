//! How much a worker thread serves per wake-up before it goes back to its event loop (and
//! so notices a disconnect, and lets its other queues in), and how a burst ended.

/// TX chains served per wake-up: four times Linux vhost-net's VHOST_NET_PKT_WEIGHT (256).
/// vhost-net requeues its work for free when the weight runs out; here the worker goes
/// round its event loop (`Burst::More`: an eventfd written, `epoll_wait`, the eventfd
/// read), three system calls per budget: at 256 chains a measurable share of a small
/// frame's cost (docs/performance.md, "What shaped the path"). The thread's other queues
/// wait at most this many frames.
pub const TX_BUDGET: usize = 1024;

/// Descriptors walked per TX wake-up, likewise: a Linux guest's chains hold at most
/// MAX_SKB_FRAGS + 2 (19 by default) descriptors, so 1024 such chains fit; chains of up to
/// MAX_FRAME_DESCS zero-length descriptors do not buy a guest more than this per wake.
pub const TX_WALK_BUDGET: usize = 32768;

/// Chains one round of a TX wake-up or poll visit must serve before the thread watches
/// the ring, or half the ring if that is less: a driver that sends a frame at a time, such
/// as a guest under TCG, gains nothing from the watch, and the thread would spend the
/// window after every frame. The watch goes on while each finds more, for `--tx-poll-us`
/// per this many chains served in all. 32 is the burst DPDK's virtio PMD and testpmd send
/// (MAX_PKT_BURST).
pub const TX_POLL_FROM: usize = 32;

/// Windows of `--tx-poll-us` one poll visit may watch a ring, however many its chains
/// earned: the thread's other queues wait for the visit, and a driver that adds a burst
/// just inside each window would otherwise earn the budget's worth (32 windows). A driver
/// that sends at line rate spends the budget within a few windows anyway
/// (docs/performance.md, "The TX watch").
pub const POLL_WATCH_WINDOWS: u32 = 4;

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
