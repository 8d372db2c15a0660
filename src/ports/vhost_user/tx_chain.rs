//! Transmit chains copied out of guest memory: a batch of them at a time, back to back into
//! the worker's arena, and returned to the driver together once the batch is done with
//! them. A long frame's bytes after its start may stay in the guest's buffer until then,
//! to be copied once, straight to where the frame goes. Generic over the guest memory, so
//! tests run it on `MockSplitQueue` without a connection.
//!
//! Every guest-supplied address and length is checked by vm-memory's accessors; a chain the
//! walk had to cut short (a loop, a `next` out of range, a chain longer than the queue, an
//! unreadable indirect table) is detected because its last descriptor still says NEXT.

use arrayvec::ArrayVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::{BitmapSlice, MS};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryError, VolatileSlice};

use super::direct_copy::copy_from_guest;
use super::split_ring::{
    prefetch_start, walk_one, ChainError, GuestBuffers, RingError, SplitRing, HEADS_AT_ONCE, MAX_FRAME_DESCS,
    PREFETCH_BYTES,
};
use super::used_batch::{put_unwritten, USED_BATCH};

/// Most chains one batch pops under one hold of the ring: DPDK's vhost library and
/// testpmd move bursts of 32 (MAX_PKT_BURST).
pub const TX_BATCH: usize = HEADS_AT_ONCE;
const _: () = assert!(
    TX_BATCH <= USED_BATCH,
    "a TX batch's used elements go in one copy"
);

/// One transmitted chain, copied out, as [`TxTake::next`] and [`TxBatch::pop`] hand it over.
#[derive(Debug)]
pub struct TxChain {
    pub head: u16,
    /// The chain's bytes (virtio-net header included), all copied unless it has a
    /// [`Rest`]; or why the chain was refused.
    pub result: Result<usize, ChainError>,
    /// Descriptors walked, at most [`MAX_FRAME_DESCS`] + 1.
    pub walked: usize,
    /// For a chain copied only in part (its room in the buffer left for the rest), where
    /// the rest still lies in guest memory.
    pub rest: Option<Rest>,
}

/// One TX chain of a batch [`take_tx_batch`] took, with where its bytes start in the
/// buffer the batch was copied into.
#[derive(Debug)]
pub struct TxSlot {
    pub start: usize,
    pub chain: TxChain,
}

/// The part of a one-descriptor TX chain left in guest memory: the bytes from `copied` on,
/// at `at`, in one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rest {
    pub copied: u32,
    pub at: GuestAddress,
}

/// The chains one batch took, in ring order. The worker takes its chains one by one
/// ([`TxTake`]) and keeps none; a batch is kept whole for the tests, the fuzz targets and
/// the benchmarks, which look at every chain after the batch.
#[derive(Debug, Default)]
pub struct TxBatch {
    slots: ArrayVec<TxSlot, TX_BATCH>,
}

impl TxBatch {
    pub fn slots(&self) -> &[TxSlot] {
        &self.slots
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Takes the last chain out of the batch.
    pub fn pop(&mut self) -> Option<TxChain> {
        self.slots.pop().map(|s| s.chain)
    }
}

/// How much a batch may take.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Room each chain is given in the buffer: a chain that needs more is refused.
    pub frame_max: usize,
    /// Chains to pop at most (besides [`TX_BATCH`]).
    pub chains: usize,
    /// Descriptors to walk at most, over the whole batch.
    pub walk: usize,
    /// Poll mode: the driver is told not to kick ([`SplitRing::quiet_driver`]).
    pub quiet: bool,
    /// Whether a chain of one descriptor may take the lane that skips the general walk
    /// ([`copy_one_desc`]); false only where the lane is checked against the walk.
    pub one_desc: bool,
}

/// Copies up to `limits.chains` available TX chains into `buf`, back to back, each given at
/// most `limits.frame_max` bytes, and returns every one of them used (length 0). One read of
/// the avail index serves the whole batch, and one store of the used index returns it.
/// Stops early when `buf` has less than `frame_max` bytes left, or once `limits.walk`
/// descriptors have been walked. A refused chain is in the batch with its error, returned
/// like the others, and takes no room.
pub fn pop_tx_batch<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    hdr_len: usize,
    buf: &mut [u8],
    limits: BatchLimits,
    out: &mut TxBatch,
) -> Result<(), RingError> {
    out.slots.clear();
    let Some(ring) = SplitRing::new(q, mem) else {
        return Ok(());
    };
    take_tx_batch(q, &ring, hdr_len, usize::MAX, buf, limits, out)?;
    return_tx_chains(q, &ring)
}

/// [`pop_tx_batch`] on `q`'s rings `ring`, without returning the chains, which stay the
/// device's: their used entries are written but the used index is not, so the driver does
/// not see them yet. A one-descriptor chain longer than `copy_limit` bytes (virtio-net
/// header included) has only its first `copy_limit` bytes copied, its room in `buf` left
/// for the rest, and where the rest lies in [`TxChain::rest`], for the caller to copy
/// straight to where the frame goes. The caller returns the chains with
/// [`return_tx_chains`] once nothing reads them any more (several batches' together),
/// holding the ring's lock until then, so the frontend cannot take the ring back meanwhile.
/// Its chains are what [`TxTake::next`] gives the worker, one by one, kept in order.
pub fn take_tx_batch<M: GuestMemory>(
    q: &mut Queue,
    ring: &SplitRing<'_, M>,
    hdr_len: usize,
    copy_limit: usize,
    buf: &mut [u8],
    limits: BatchLimits,
    out: &mut TxBatch,
) -> Result<(), RingError> {
    out.slots.clear();
    let mut take = TxTake::start(q, ring, hdr_len, copy_limit, limits)?;
    let mut start = 0;
    while let Some(chain) = take.next(&mut buf[start..]) {
        let at = start;
        if let Ok(n) = chain.result {
            start += n;
        }
        // At most TX_BATCH chains, as `TxTake` takes.
        out.slots.push(TxSlot { start: at, chain });
    }
    take.finish(q)
}

/// A batch being taken: one read of the avail index, the chains' descriptors and first
/// bytes asked for together, then each chain copied out when its caller asks for it
/// ([`TxTake::next`]), into the room the caller gives, and decided on before the next is
/// copied: nothing about a chain is kept in between but what `next` returns. The chains
/// are used (length 0) at [`TxTake::finish`], which the caller must reach.
pub struct TxTake<'r, 'm, M: GuestMemory> {
    ring: &'r SplitRing<'m, M>,
    hdr_len: usize,
    copy_limit: usize,
    limits: BatchLimits,
    first: u16,
    heads: ArrayVec<u16, TX_BATCH>,
    lanes: ArrayVec<Option<Lane<'m, MS<'m, M::PhysicalMemory>>>, TX_BATCH>,
    /// Chains taken so far, from `first` on.
    taken: usize,
    walked: usize,
}

impl<'r, 'm, M: GuestMemory> TxTake<'r, 'm, M> {
    /// Up to `limits.chains` of the chains the driver has made available, as
    /// [`take_tx_batch`] takes them.
    pub fn start(
        q: &Queue,
        ring: &'r SplitRing<'m, M>,
        hdr_len: usize,
        copy_limit: usize,
        limits: BatchLimits,
    ) -> Result<Self, RingError> {
        if limits.quiet {
            ring.quiet_driver(q.event_idx_enabled())?;
        }
        let first = q.next_avail();
        let avail = ring.avail_idx(first)?;
        let heads = ring.heads(first, usize::from(avail.wrapping_sub(first)).min(limits.chains))?;
        // Each head's descriptor is read once, here, for the lane and the prefetch both:
        // their lines were asked for together first, so the reads wait for them together.
        ring.prefetch_descriptors(&heads);
        let lanes = heads
            .iter()
            .map(|&h| look(ring, h, hdr_len, limits.frame_max))
            .collect();
        Ok(TxTake {
            ring,
            hdr_len,
            copy_limit,
            limits,
            first,
            heads,
            lanes,
            taken: 0,
            walked: 0,
        })
    }

    /// Whether the driver had no chain for this batch.
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// The next chain, copied to the start of `room`; `None` once the batch's chains are
    /// all taken, `limits.walk` descriptors have been walked, or `room` holds less than
    /// `limits.frame_max` bytes. A refused chain takes no room.
    #[inline(always)]
    pub fn next(&mut self, room: &mut [u8]) -> Option<TxChain> {
        let (&head, lane) = self.heads.get(self.taken).zip(self.lanes.get(self.taken))?;
        let frame_max = self.limits.frame_max;
        if self.walked >= self.limits.walk || room.len() < frame_max {
            return None;
        }
        self.taken += 1;
        let room = &mut room[..frame_max];
        let (result, walked, rest) = match lane.as_ref().filter(|_| self.limits.one_desc) {
            Some(lane) => {
                let (len, rest) = copy_one_desc(lane, self.copy_limit, room);
                (Ok(len), 1, rest)
            }
            None => {
                let mut steps = 0;
                let chain = self.ring.chain(head);
                let result = copy_chain(chain, self.ring.buffers(), self.hdr_len, room, &mut steps);
                (result, steps, None)
            }
        };
        self.walked += walked;
        Some(TxChain {
            head,
            walked,
            result,
            rest,
        })
    }

    /// Every chain taken is used with length 0 (nothing written); the driver is told at
    /// [`return_tx_chains`].
    pub fn finish(self, q: &mut Queue) -> Result<(), RingError> {
        let taken = &self.heads[..self.taken];
        q.set_next_avail(self.first.wrapping_add(taken.len() as u16));
        let used = q.next_used();
        put_unwritten(self.ring, used, taken.iter().copied())?;
        q.set_next_used(used.wrapping_add(taken.len() as u16));
        Ok(())
    }
}

/// Returns the chains taken ([`TxTake`], [`take_tx_batch`]) since the last call: one store
/// of the used index (a release store, after their entries) tells the driver.
pub fn return_tx_chains<M: GuestMemory>(q: &Queue, ring: &SplitRing<'_, M>) -> Result<(), RingError> {
    ring.publish_used(q.next_used())
}

/// The usual chain, found when its batch is taken: one driver-readable descriptor (no
/// NEXT, no INDIRECT, not device-writable) holding the header and a frame of at most
/// `frame_max` bytes, in one memory region. It is copied without the general walk
/// ([`copy_one_desc`]), from what was read here: its descriptor is read once.
struct Lane<'m, B> {
    at: GuestAddress,
    bytes: VolatileSlice<'m, B>,
}

/// Chain `head`'s [`Lane`], when it takes one; either way the first bytes of its first
/// buffer are asked for ([`prefetch_start`]), as its copy will read them next.
#[inline(always)]
fn look<'m, M: GuestMemory>(
    ring: &SplitRing<'m, M>,
    head: u16,
    hdr_len: usize,
    frame_max: usize,
) -> Option<Lane<'m, MS<'m, M::PhysicalMemory>>> {
    let d = ring.descriptor(head)?;
    if d.refers_to_indirect_table() {
        return None;
    }
    let len = d.len() as usize;
    if d.has_next() || d.is_write_only() || len > frame_max || len < hdr_len {
        if let Some(first) = ring.buffers().slice(d.addr(), len.min(PREFETCH_BYTES)) {
            prefetch_start(&first);
        }
        return None;
    }
    // The whole chain is checked to lie in one region, its rest included.
    let bytes = ring.buffers().slice(d.addr(), len)?;
    prefetch_start(&bytes);
    Some(Lane { at: d.addr(), bytes })
}

/// Copies `lane`'s chain into `buf` (which holds `frame_max` bytes): the chain's length,
/// and, for a chain longer than `copy_limit` bytes, of which only the first `copy_limit`
/// are copied, the [`Rest`] that says where the others are. The result is the one
/// [`copy_chain`] gives for it (tests/ring.rs checks the two on random rings, the rest
/// copied).
#[inline(always)]
fn copy_one_desc<B: BitmapSlice>(
    lane: &Lane<'_, B>,
    copy_limit: usize,
    buf: &mut [u8],
) -> (usize, Option<Rest>) {
    let len = lane.bytes.len();
    let copied = len.min(copy_limit);
    // `copied` is less than `len`, a descriptor's 32-bit length, and the rest lies in the
    // region the whole chain was found in.
    let rest = (len > copied).then(|| Rest {
        copied: copied as u32,
        at: lane.at.unchecked_add(copied as u64),
    });
    // As many bytes as the shorter of the two holds.
    let n = copied.min(buf.len());
    copy_from_guest(&lane.bytes, &mut buf[..n]);
    (len, rest)
}

/// Copies one TX chain into `buf` (header first): its length, `walked` counting the
/// descriptors.
fn copy_chain<M: GuestMemory>(
    chain: impl Iterator<Item = Descriptor>,
    mem: &GuestBuffers<'_, M>,
    hdr_len: usize,
    buf: &mut [u8],
    walked: &mut usize,
) -> Result<usize, ChainError> {
    copy_out(chain, mem, buf, walked).and_then(|n| {
        if n < hdr_len {
            Err(ChainError::TooShort(n))
        } else {
            Ok(n)
        }
    })
}

fn copy_out<M: GuestMemory>(
    chain: impl Iterator<Item = Descriptor>,
    mem: &GuestBuffers<'_, M>,
    buf: &mut [u8],
    walked: &mut usize,
) -> Result<usize, ChainError> {
    let mut n = 0usize;
    // Starts true: a chain that yields no descriptor at all (unreadable head or indirect
    // table) is as broken as one cut short.
    let mut last_has_next = true;
    for d in chain {
        walk_one(walked, MAX_FRAME_DESCS)?;
        last_has_next = d.has_next();
        if d.is_write_only() {
            return Err(ChainError::WrongDirection);
        }
        let len = d.len() as usize;
        let end = n
            .checked_add(len)
            .filter(|e| *e <= buf.len())
            .ok_or(ChainError::TooLong(buf.len()))?;
        read_guest(mem, &mut buf[n..end], d.addr()).map_err(|source| ChainError::Memory {
            addr: d.addr().0,
            len: d.len(),
            source,
        })?;
        n = end;
    }
    if last_has_next {
        return Err(ChainError::Broken);
    }
    Ok(n)
}

/// Reads guest memory at `at` into `dst`. A buffer almost always lies in one region: then
/// one translation and one copy (vm-memory 0.18's `get_slice`). `read_slice` walks the
/// regions a range covers through an iterator; it stays the path for a range that crosses
/// regions or lies outside them, and so gives the error for a bad one.
fn read_guest<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    dst: &mut [u8],
    at: GuestAddress,
) -> Result<(), GuestMemoryError> {
    if let Some(s) = mem.slice(at, dst.len()) {
        copy_from_guest(&s, dst);
        return Ok(());
    }
    mem.mem().read_slice(dst, at)
}
