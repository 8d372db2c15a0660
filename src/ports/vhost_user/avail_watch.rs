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

use super::split_ring::{driver_says_at, interrupt_wanted, Vring};

/// What a watch reads of a ring, taken once under the vring's lock. The calling thread is
/// the queue's only consumer, so the next index to serve and the next used one cannot
/// change while it watches: the avail index is then read in guest memory, with no lock on
/// every spin. Should the frontend move the ring meanwhile, the old address still lies in
/// the memory the caller holds for its burst, and a stale read either ends the wait early
/// or lets it run the whole window: bounded either way, and the worker reads the ring
/// afresh after it.
pub(super) struct AvailWatch {
    idx: GuestAddress,
    next: u16,
    says: GuestAddress,
    event_idx: bool,
    next_used: u16,
}

impl AvailWatch {
    /// `None` for a ring whose addresses do not add up.
    pub(super) fn new(vring: &Vring) -> Option<AvailWatch> {
        let st = vring.get_ref();
        let q = st.get_queue();
        let avail = q.avail_ring();
        Some(AvailWatch {
            idx: GuestAddress(avail.checked_add(2)?),
            next: q.next_avail(),
            says: GuestAddress(avail.checked_add(driver_says_at(q.event_idx_enabled(), q.size()))?),
            event_idx: q.event_idx_enabled(),
            next_used: q.next_used(),
        })
    }

    /// Whether the driver wants an interrupt for the `added` used entries up to the next
    /// used index, as this CPU last saw its request: no fence (`SplitRing::wants_interrupt`
    /// has one), so a request the driver has just made may be missed. Right to act on when
    /// true; a worker that will sleep asks `SplitRing::wants_interrupt` over the same
    /// entries before it does.
    pub(super) fn driver_wants_interrupt(&self, mem: &GuestMemoryMmap, added: u16) -> bool {
        mem.load::<u16>(self.says, Ordering::Relaxed)
            .is_ok_and(|said| interrupt_wanted(self.event_idx, u16::from_le(said), self.next_used, added))
    }

    /// Spins until `deadline` for a new available descriptor; true if one arrived.
    pub(super) fn wait(&self, mem: &GuestMemoryMmap, deadline: Instant) -> bool {
        for spin in 0u32.. {
            match mem.load::<u16>(self.idx, Ordering::Acquire) {
                Ok(idx) if u16::from_le(idx) != self.next => return true,
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
}

/// Spins up to `window` for a new available descriptor on `vring`; true if one arrived.
pub(super) fn poll_avail(vring: &Vring, mem: &GuestMemoryMmap, window: Duration) -> bool {
    !window.is_zero() && AvailWatch::new(vring).is_some_and(|w| w.wait(mem, Instant::now() + window))
}
