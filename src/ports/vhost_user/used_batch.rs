//! Used elements staged and written to the used ring together. Writing them one by one
//! through vm-memory costs a bounds and an alignment check and two volatile stores each;
//! staged, a run's elements go in one copy (two where the ring wraps). DPDK's vhost library
//! does the same with its shadow used ring (`do_flush_shadow_used_ring_split` in
//! lib/vhost/virtio_net.c). Nothing is lost by waiting: the driver sees no element before
//! the used index is published (virtio 1.2, 2.7.8), and every path that publishes writes
//! what is staged first.

use arrayvec::ArrayVec;
use virtio_queue::{Error as QueueError, Queue, QueueT};
use vm_memory::GuestMemory;

use super::split_ring::{RingError, SplitRing, USED_ELEM};

/// Elements staged at most; a run that uses more buffers writes them in several copies.
pub const USED_BATCH: usize = 64;

/// Staged elements, as the ring holds them, kept uninitialised (`ArrayVec`) rather than
/// zeroed per TX batch and per receive run (docs/performance.md, "What shaped the path").
type Staged = ArrayVec<[u8; USED_ELEM], USED_BATCH>;

/// Writes chains `heads` used with length 0 (nothing written into them: a TX batch's),
/// at used positions from `first` on, in one copy (two where the ring wraps). More than
/// [`USED_BATCH`] heads, or more than a ring's worth, are refused, as is a head past the
/// ring (as virtio-queue's `add_used` refuses it); then nothing is written.
pub fn put_unwritten<M: GuestMemory>(
    ring: &SplitRing<'_, M>,
    first: u16,
    mut heads: impl Iterator<Item = u16>,
) -> Result<(), RingError> {
    let mut staged = Staged::new();
    for head in heads.by_ref().take(USED_BATCH) {
        staged.push(used_elem(ring, head, 0)?);
    }
    if heads.next().is_some() {
        return Err(RingError(QueueError::InvalidSize));
    }
    ring.put_used_elems(first, staged.as_flattened())
}

/// The used element of chain `head` with `len` bytes written, as the ring holds it. A head
/// past the ring is refused, as virtio-queue's `add_used` refuses it.
#[inline(always)]
fn used_elem<M: GuestMemory>(
    ring: &SplitRing<'_, M>,
    head: u16,
    len: u32,
) -> Result<[u8; USED_ELEM], RingError> {
    if head >= ring.size() {
        return Err(RingError(QueueError::InvalidDescriptorIndex));
    }
    Ok((u64::from(len) << 32 | u64::from(head)).to_le_bytes())
}

/// Used elements for consecutive used positions from `first`, as the ring holds them.
#[derive(Default)]
pub struct UsedBatch {
    first: u16,
    /// The position the next element must have to join the batch.
    next: u16,
    /// Elements the batch takes before it is written: fewer than [`USED_BATCH`] on a ring
    /// that holds fewer; 0 while empty, so that the first element starts it.
    room: usize,
    staged: Staged,
}

impl UsedBatch {
    /// Stages used element `pos` (modulo the ring size): chain `head`, `len` bytes written.
    /// What is staged is written first when the batch is full or does not end just before
    /// `pos`. A head past the ring is refused, as virtio-queue's `add_used` refuses it.
    /// Always inlined: it runs once per frame in both directions.
    #[inline(always)]
    pub fn put<M: GuestMemory>(
        &mut self,
        ring: &SplitRing<'_, M>,
        pos: u16,
        head: u16,
        len: u32,
    ) -> Result<(), RingError> {
        let elem = used_elem(ring, head, len)?;
        if self.staged.len() >= self.room || pos != self.next {
            self.start(ring, pos)?;
        }
        // `start` left room (`room` is at most the capacity).
        if self.staged.try_push(elem).is_ok() {
            self.next = pos.wrapping_add(1);
        }
        Ok(())
    }

    /// Writes what is staged and starts a batch at `pos`.
    #[cold]
    fn start<M: GuestMemory>(&mut self, ring: &SplitRing<'_, M>, pos: u16) -> Result<(), RingError> {
        self.write(ring)?;
        self.first = pos;
        self.next = pos;
        self.room = USED_BATCH.min(usize::from(ring.size()));
        Ok(())
    }

    /// Writes what is staged into `ring`'s used ring, and empties the batch.
    pub fn write<M: GuestMemory>(&mut self, ring: &SplitRing<'_, M>) -> Result<(), RingError> {
        self.room = 0;
        if self.staged.is_empty() {
            return Ok(());
        }
        let written = ring.put_used_elems(self.first, self.staged.as_flattened());
        self.staged.clear();
        written
    }

    /// Takes the chains up to avail position `pos` and returns `heads` used with length 0:
    /// the driver sees empty buffers (and counts a length error), and the frame is dropped.
    pub fn give_back<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        pos: u16,
        heads: impl Iterator<Item = u16>,
    ) -> Result<(), RingError> {
        let first = q.next_used();
        let mut end = first;
        for head in heads {
            self.put(ring, end, head, 0)?;
            end = end.wrapping_add(1);
        }
        q.set_next_avail(pos);
        q.set_next_used(end);
        Ok(())
    }

    /// Forgets what is staged: for a run that ends without publishing (its ring is gone).
    pub fn clear(&mut self) {
        self.staged.clear();
        self.room = 0;
    }
}
