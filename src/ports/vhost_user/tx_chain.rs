//! Transmit chains copied out of guest memory: a batch of them at a time, back to back into
//! the worker's arena, each returned to the driver as soon as it is copied. Generic over the
//! guest memory, so tests run it on `MockSplitQueue` without a connection.
//!
//! Every guest-supplied address and length is checked by vm-memory's accessors; a chain the
//! walk had to cut short (a loop, a `next` out of range, a chain longer than the queue, an
//! unreadable indirect table) is detected because its last descriptor still says NEXT.

use arrayvec::ArrayVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

use super::split_ring::{walk_one, ChainError, GuestBuffers, RingError, SplitRing, MAX_FRAME_DESCS};

/// Most chains one batch pops under one hold of the ring: DPDK's vhost library and
/// testpmd move bursts of 32 (MAX_PKT_BURST).
pub const TX_BATCH: usize = 32;

/// One transmitted chain, copied out.
#[derive(Debug)]
pub struct TxChain {
    pub head: u16,
    /// Bytes copied (virtio-net header included), or why the chain was refused.
    pub result: Result<usize, ChainError>,
    /// Descriptors walked, at most [`MAX_FRAME_DESCS`] + 1.
    pub walked: usize,
}

/// One TX chain of a batch: where its bytes start in the buffer the batch was copied into.
#[derive(Debug)]
pub struct TxSlot {
    pub start: usize,
    pub chain: TxChain,
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
    out: &mut ArrayVec<TxSlot, TX_BATCH>,
) -> Result<(), RingError> {
    out.clear();
    let Some(ring) = SplitRing::new(q, mem) else {
        return Ok(());
    };
    if limits.quiet {
        ring.quiet_driver(q.event_idx_enabled())?;
    }
    let first = q.next_avail();
    let avail = ring.avail_idx(first)?;
    let max = limits.chains.min(TX_BATCH);
    ring.prefetch(first, usize::from(avail.wrapping_sub(first)).min(max));
    let (mut pos, mut start, mut walked) = (first, 0usize, 0usize);
    while out.len() < max && walked < limits.walk && buf.len() - start >= limits.frame_max {
        if pos == avail {
            break;
        }
        let head = ring.head(pos)?;
        pos = pos.wrapping_add(1);
        let room = &mut buf[start..start + limits.frame_max];
        let t = match limits.one_desc.then(|| copy_one_desc(&ring, head, hdr_len, room)) {
            Some(Some(t)) => t,
            _ => copy_chain(head, ring.chain(head), ring.buffers(), hdr_len, room),
        };
        walked += t.walked;
        let next = start + t.result.as_ref().map_or(0, |n| *n);
        out.push(TxSlot { start, chain: t });
        start = next;
    }
    q.set_next_avail(pos);
    // Every chain is returned (length 0: nothing written) and the driver told once.
    let used = q.next_used();
    for (i, s) in out.iter().enumerate() {
        ring.put_used(used.wrapping_add(i as u16), s.chain.head, 0)?;
    }
    if !out.is_empty() {
        let end = used.wrapping_add(out.len() as u16);
        ring.publish_used(end)?;
        q.set_next_used(end);
    }
    Ok(())
}

/// The usual chain, copied without the general walk: one driver-readable descriptor (no
/// NEXT, no INDIRECT, not device-writable) holding the header and a frame that fit in `buf`,
/// in one memory region. The result is the one [`copy_chain`] gives for it (tests/ring.rs
/// checks the two on random rings); `None`, having read only, for anything else.
#[inline]
fn copy_one_desc<M: GuestMemory>(
    ring: &SplitRing<'_, M>,
    head: u16,
    hdr_len: usize,
    buf: &mut [u8],
) -> Option<TxChain> {
    let d = ring.descriptor(head)?;
    let len = d.len() as usize;
    if d.has_next() || d.refers_to_indirect_table() || d.is_write_only() || len > buf.len() || len < hdr_len {
        return None;
    }
    ring.buffers().slice(d.addr(), len)?.copy_to(&mut buf[..len]);
    Some(TxChain {
        head,
        result: Ok(len),
        walked: 1,
    })
}

/// Copies one TX chain into `buf` (header first).
fn copy_chain<M: GuestMemory>(
    head: u16,
    chain: impl Iterator<Item = Descriptor>,
    mem: &GuestBuffers<'_, M>,
    hdr_len: usize,
    buf: &mut [u8],
) -> TxChain {
    let mut walked = 0;
    let result = copy_out(chain, mem, buf, &mut walked).and_then(|n| {
        if n < hdr_len {
            Err(ChainError::TooShort(n))
        } else {
            Ok(n)
        }
    });
    TxChain { head, result, walked }
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
        s.copy_to(dst);
        return Ok(());
    }
    mem.mem().read_slice(dst, at)
}
