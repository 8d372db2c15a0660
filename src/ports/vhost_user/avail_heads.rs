//! The avail entries a run of received frames takes its buffers from, read in one copy
//! ([`SplitRing::heads`]) rather than entry by entry: a run writes frames one by one, and
//! each one's buffer is the chain at the next avail position.

use arrayvec::ArrayVec;
use virtio_queue::Error as QueueError;
use vm_memory::GuestMemory;

use super::split_ring::{RingError, SplitRing, HEADS_AT_ONCE};

/// Heads read at once, from avail position `from` on. Positions between the device's next
/// one and the avail index are the driver's to leave alone (virtio 1.2, 2.7.13), so what
/// was read stays what the driver made available; a head is checked when its chain is
/// walked, wherever it was read.
#[derive(Debug, Default)]
pub struct AvailHeads {
    from: u16,
    heads: ArrayVec<u16, HEADS_AT_ONCE>,
}

impl AvailHeads {
    /// The head at avail position `pos`, which lies before `avail` (the index as last
    /// read): from the entries read at once, reading the next ones when `pos` is past them.
    #[inline(always)]
    pub fn at<M: GuestMemory>(
        &mut self,
        ring: &SplitRing<'_, M>,
        pos: u16,
        avail: u16,
    ) -> Result<u16, RingError> {
        match self.heads.get(usize::from(pos.wrapping_sub(self.from))) {
            Some(&h) => Ok(h),
            None => self.read(ring, pos, avail),
        }
    }

    #[inline(never)]
    fn read<M: GuestMemory>(
        &mut self,
        ring: &SplitRing<'_, M>,
        pos: u16,
        avail: u16,
    ) -> Result<u16, RingError> {
        self.heads = ring.heads(pos, usize::from(avail.wrapping_sub(pos)))?;
        self.from = pos;
        // `pos` before `avail` (the caller's rule) reads one at least.
        self.heads
            .first()
            .copied()
            .ok_or(RingError(QueueError::InvalidAvailRingIndex))
    }

    /// Forgets what was read: for a run on another queue, or after a reset.
    pub fn clear(&mut self) {
        self.heads.clear();
    }
}
