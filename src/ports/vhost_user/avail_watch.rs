//! Watching a ring's avail index for a while before going to sleep: the control queue
//! after a command (`--ctrl-poll-us`), a TX queue after a burst (`--tx-poll-us`). A driver
//! that adds to the ring within the window then costs neither a kick (a syscall on its
//! side) nor a wake-up on this one, as with QEMU's `poll-us` for vhost-net
//! (VHOST_SET_VRING_BUSYLOOP_TIMEOUT).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::split_ring::Vring;

/// Spins up to `window` for a new available descriptor; true if one arrived.
pub(super) fn poll_avail(vring: &Vring, mem: &GuestMemoryMmap, window: Duration) -> bool {
    if window.is_zero() {
        return false;
    }
    // The calling thread is the queue's only consumer, so the next index to serve cannot
    // change while it spins: read it and the ring's address once, then watch the avail
    // index in guest memory without taking the vring lock on every spin. Should the
    // frontend move the ring meanwhile, the old address still lies in `mem` (this burst's
    // memory), and the worst a stale read does is end the wait early.
    let (idx_addr, next) = {
        let st = vring.get_ref();
        let q = st.get_queue();
        (q.avail_ring().checked_add(2), q.next_avail())
    };
    let Some(idx_addr) = idx_addr.map(GuestAddress) else {
        return false;
    };
    let deadline = Instant::now() + window;
    for spin in 0u32.. {
        match mem.load::<u16>(idx_addr, Ordering::Acquire) {
            Ok(idx) if u16::from_le(idx) != next => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        // The clock is read every 64 spins, not on each.
        if spin % 64 == 63 && Instant::now() >= deadline {
            return false;
        }
        std::hint::spin_loop();
    }
    false
}
