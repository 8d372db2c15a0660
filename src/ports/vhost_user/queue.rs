//! Moving frames between descriptor chains and flat buffers. Generic over the guest memory,
//! so queue-level tests run on `MockSplitQueue` without any vhost-user connection.
//!
//! Every guest-supplied address and length is checked by vm-memory's accessors; a chain the
//! iterator had to cut short (a loop, a `next` out of range, a chain longer than the queue,
//! an unreadable indirect table) is detected because its last descriptor still says NEXT.

use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use arrayvec::ArrayVec;
use thiserror::Error;
use virtio_queue::QueueOwnedT;
use virtio_queue::{desc::split::Descriptor, DescriptorChain, Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryError, Permissions};

use super::evict::EvictList;
use super::ring::{GuestBuffers, SplitRing};
use crate::wire::virtio_net_hdr::{HdrError, VirtioNetHdr, HDR_LEN_HASH};

/// Most buffers one received frame may be spread over with MRG_RXBUF. A guest posting
/// smaller buffers than this allows loses the frame (counted as dropped).
pub const MAX_RX_BUFFERS: usize = 64;

/// Most descriptors walked for one frame: one TX chain, one control chain, or every RX
/// chain one received frame is written into, zero-length and indirect ones included.
/// virtio-queue 0.18 follows a chain for up to the queue size (32 768) and then an
/// indirect table of up to 65 535 entries, so without this a guest could make each frame
/// cost ~10^5 guest-memory reads. Linux never builds more than MAX_SKB_FRAGS + 2 (19 by
/// default, 47 at the largest build option) per chain, and a mergeable-buffer frame of
/// 64 KiB takes ~43 single-descriptor buffers of 1.5 KiB; DPDK's vhost library likewise
/// refuses chains of more than BUF_VECTOR_MAX (256) buffers. A chain past the limit is
/// returned to the driver used with length 0, so each bad chain costs its walk once.
pub const MAX_FRAME_DESCS: usize = 256;

#[derive(Debug, Error)]
pub enum ChainError {
    #[error("descriptor chain is cut short (loop, bad next index, or longer than the queue)")]
    Broken,
    #[error("device-writable descriptor in a driver-to-device chain")]
    WrongDirection,
    #[error("chain of {0} bytes holds no virtio-net header")]
    TooShort(usize),
    #[error("chain of more than {0} bytes")]
    TooLong(usize),
    #[error("more than {MAX_FRAME_DESCS} descriptors for one frame")]
    TooManyDescriptors,
    #[error("guest memory access at {addr:#x}+{len}")]
    Memory {
        addr: u64,
        len: u32,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("bad virtio-net header")]
    Header(#[source] HdrError),
}

/// The driver broke the ring itself (an available index more than a ring ahead, a head or
/// used entry the ring cannot hold, ring memory that cannot be read): nothing more can be
/// served from it until the frontend restarts it.
#[derive(Debug, Error)]
#[error("the ring cannot be served")]
pub struct RingError(#[source] pub virtio_queue::Error);

/// The queues of one connection that are broken (bit per queue index): shared by the worker
/// that serves a queue and by every sender that writes into it. A real device would set
/// DEVICE_NEEDS_RESET (virtio 1.2, 2.1.2); a vhost-user backend has no way to tell the
/// frontend's status register, so the queue is simply left alone until the frontend
/// programs it again (SET_VRING_BASE, SET_VRING_KICK) or reconnects.
#[derive(Debug, Default)]
pub struct BrokenRings(AtomicU64);

impl BrokenRings {
    /// Whether queue `q` is broken. Queue indexes past 63 (none: 31 pairs and the control
    /// queue at most) count as broken.
    #[inline]
    pub fn is(&self, q: usize) -> bool {
        q >= 64 || self.0.load(Ordering::Acquire) & (1 << q) != 0
    }

    /// Marks queue `q` broken; true if it was not already.
    pub fn set(&self, q: usize) -> bool {
        q < 64 && self.0.fetch_or(1 << q, Ordering::AcqRel) & (1 << q) == 0
    }

    /// The frontend programs queue `q` anew.
    pub fn clear(&self, q: usize) {
        if q < 64 {
            self.0.fetch_and(!(1 << q), Ordering::AcqRel);
        }
    }
}

#[derive(Debug, Error)]
pub enum RxError {
    #[error("no receive buffers available")]
    NoBuffers,
    #[error("frame needs more than {MAX_RX_BUFFERS} receive buffers")]
    TooManyBuffers,
    #[error("bad receive chain")]
    Chain(#[source] ChainError),
    #[error("receive queue")]
    Ring(#[source] RingError),
}

/// The next available chain: `None` when the ring is empty or not started. Unlike
/// `pop_descriptor_chain`, which logs every refusal at ERROR (virtio-queue 0.18), an
/// impossible available index comes back as an error for the caller to act on once.
pub fn next_chain<'a, M: GuestMemory>(
    q: &mut Queue,
    mem: &'a M,
) -> Result<Option<DescriptorChain<&'a M>>, RingError> {
    match q.iter(mem) {
        Ok(mut it) => Ok(it.next()),
        Err(virtio_queue::Error::QueueNotReady) => Ok(None),
        Err(e) => Err(RingError(e)),
    }
}

/// Returns a chain to the driver; a failure means the used ring itself is broken.
pub fn add_used<M: GuestMemory>(q: &mut Queue, mem: &M, head: u16, len: u32) -> Result<(), RingError> {
    q.add_used(mem, head, len).map_err(RingError)
}

/// One transmitted chain, copied out.
#[derive(Debug)]
pub struct TxChain {
    pub head: u16,
    /// Bytes copied into the buffer (header included), or why the chain was refused.
    pub result: Result<usize, ChainError>,
    /// Descriptors walked, at most [`MAX_FRAME_DESCS`] + 1.
    pub walked: usize,
}

/// Copies the next available TX chain into `buf` (header first). `None` when the queue is
/// empty. A refused chain must still be returned to the driver as used.
pub fn pop_tx<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    hdr_len: usize,
    buf: &mut [u8],
) -> Result<Option<TxChain>, RingError> {
    let Some(chain) = next_chain(q, mem)? else {
        return Ok(None);
    };
    Ok(Some(copy_chain(
        chain.head_index(),
        chain,
        &GuestBuffers::new(mem),
        hdr_len,
        buf,
    )))
}

/// One TX chain of a batch: where its bytes start in the batch's buffer.
#[derive(Debug)]
pub struct TxSlot {
    pub start: usize,
    pub chain: TxChain,
}

/// Most chains one batch pops under one hold of the ring: DPDK's vhost library and
/// testpmd move bursts of 32 (MAX_PKT_BURST).
pub const TX_BATCH: usize = 32;

/// Copies up to `max` available TX chains into `buf`, back to back, each given at most
/// `frame_max` bytes, and returns every one of them used (length 0), like [`pop_tx`] chain
/// after chain. One look at the avail index serves the whole batch. Stops early when `buf`
/// has less than `frame_max` bytes left, or once `walk_left` descriptors have been walked.
/// A refused chain is in the batch with its error, returned like the others.
#[allow(clippy::too_many_arguments)]
pub fn pop_tx_batch<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    hdr_len: usize,
    buf: &mut [u8],
    frame_max: usize,
    max: usize,
    walk_left: usize,
    out: &mut ArrayVec<TxSlot, TX_BATCH>,
) -> Result<(), RingError> {
    out.clear();
    let Some(ring) = SplitRing::new(q, mem) else {
        return Ok(());
    };
    let first = q.next_avail();
    let avail = ring.avail_idx(first)?;
    ring.prefetch(first, usize::from(avail.wrapping_sub(first)).min(max));
    let (mut pos, mut start, mut walked) = (first, 0usize, 0usize);
    while out.len() < max.min(TX_BATCH) && walked < walk_left && buf.len() - start >= frame_max {
        if pos == avail {
            break;
        }
        let head = ring.head(pos)?;
        pos = pos.wrapping_add(1);
        let t = copy_chain(
            head,
            ring.chain(head),
            ring.buffers(),
            hdr_len,
            &mut buf[start..start + frame_max],
        );
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

/// The chains of one TX batch, split off the buffer [`pop_tx_batch`] copied them into, one
/// after the other. Each chain's bytes are a borrow of their own, disjoint from the rest,
/// so a frame the pipeline holds by pointer until the batch is flushed is never borrowed
/// again meanwhile (`Packet::pinned`).
pub struct ArenaSlots<'a> {
    rest: &'a mut [u8],
    /// Where `rest` starts in the batch's buffer.
    at: usize,
}

impl<'a> ArenaSlots<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        ArenaSlots { rest: buf, at: 0 }
    }

    /// Bytes `start..start + len` of the buffer. `None` if they overlap a chain taken
    /// before or lie past the buffer: chains are taken in the order of the batch.
    pub fn take(&mut self, start: usize, len: usize) -> Option<&'a mut [u8]> {
        let skip = start.checked_sub(self.at)?;
        let end = skip.checked_add(len).filter(|e| *e <= self.rest.len())?;
        let rest = std::mem::take(&mut self.rest);
        let (slot, rest) = rest.split_at_mut(end);
        self.rest = rest;
        self.at = start + len;
        Some(&mut slot[skip..])
    }
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

/// Reads guest memory at `at` into `dst`. A buffer almost always lies in one region: then
/// one translation and one copy (vm-memory 0.18's `get_slice`). `read_slice` walks the
/// regions a range covers through an iterator, which cost more than the copy of a small
/// frame (docs/benchmarks.md, "PVP loop"); it stays the path for a range that crosses
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

/// Writes `src` into guest memory at `at`, as [`read_guest`] reads.
fn write_guest<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    src: &[u8],
    at: GuestAddress,
) -> Result<(), GuestMemoryError> {
    if let Some(s) = mem.slice(at, src.len()) {
        s.copy_from(src);
        return Ok(());
    }
    mem.mem().write_slice(src, at)
}

/// Writes `src` into guest memory at `at` unless the bytes there are `src` already. For the
/// virtio-net header of a received frame: a buffer the driver posts again often still
/// holds the header of its last frame, the same one (no offloads, one buffer; DPDK's
/// virtio-user always places it there, a Linux guest's page fragments may not), and a line
/// only read stays shared with the driver's CPU where a store would take it over and make
/// the driver fetch it back. DPDK's vhost library writes the header's fields the same way
/// (`ASSIGN_UNLESS_EQUAL`, lib/vhost/virtio_net.c). Header-sized ranges only; a longer
/// one, or one across regions, is written as [`write_guest`] writes.
fn update_guest<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    src: &[u8],
    at: GuestAddress,
) -> Result<(), GuestMemoryError> {
    const MAX: usize = HDR_LEN_HASH;
    if src.len() <= MAX {
        if let Some(s) = mem.slice(at, src.len()) {
            // Compared as whole arrays, zero past `src`: a fixed-size compare the compiler
            // inlines, where a slice compare calls memcmp for 12 bytes.
            let (mut now, mut want) = ([0u8; MAX], [0u8; MAX]);
            s.copy_to(&mut now[..src.len()]);
            want[..src.len()].copy_from_slice(src);
            if now != want {
                s.copy_from(src);
            }
            return Ok(());
        }
    }
    write_guest(mem, src, at)
}

/// Counts one more descriptor walked; past `limit` (the frame's start plus
/// [`MAX_FRAME_DESCS`]) the frame is refused.
#[inline]
fn walk_one(walked: &mut usize, limit: usize) -> Result<(), ChainError> {
    *walked += 1;
    if *walked > limit {
        Err(ChainError::TooManyDescriptors)
    } else {
        Ok(())
    }
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

/// The device-writable descriptors of every RX chain one frame goes into, validated up
/// front so that a frame is either written whole or not at all. Kept flat and
/// uninitialised (`ArrayVec`): a frame usually takes one chain of one descriptor, and
/// zeroing room for the worst case on every frame cost more than writing a small frame.
struct RxChains {
    /// Every chain's non-empty descriptors, in order. The walk limit bounds them.
    descs: ArrayVec<(GuestAddress, u32), MAX_FRAME_DESCS>,
    /// Per chain: its head, its descriptors' end in `descs`, its capacity in bytes.
    chains: ArrayVec<RxChain, MAX_RX_BUFFERS>,
}

#[derive(Clone, Copy)]
struct RxChain {
    head: u16,
    end: u16,
    capacity: usize,
}

impl RxChains {
    fn new() -> Self {
        RxChains {
            descs: ArrayVec::new(),
            chains: ArrayVec::new(),
        }
    }

    /// The descriptors of chain `i`.
    fn descs(&self, i: usize) -> &[(GuestAddress, u32)] {
        let start = if i == 0 {
            0
        } else {
            usize::from(self.chains[i - 1].end)
        };
        &self.descs[start..usize::from(self.chains[i].end)]
    }

    /// Reads one RX chain, counting its descriptors into `walked` (the frame's whole walk),
    /// and keeps it if it is good. On error its descriptors are dropped again.
    fn collect(
        &mut self,
        head: u16,
        chain: impl Iterator<Item = Descriptor>,
        walked: &mut usize,
        limit: usize,
    ) -> Result<usize, ChainError> {
        let start = self.descs.len();
        let res = self.walk(chain, walked, limit);
        match res {
            Ok(capacity) => {
                // Within MAX_FRAME_DESCS (256), so within u16.
                let end = self.descs.len() as u16;
                self.chains.push(RxChain { head, end, capacity });
            }
            Err(_) => self.descs.truncate(start),
        }
        res
    }

    fn walk(
        &mut self,
        chain: impl Iterator<Item = Descriptor>,
        walked: &mut usize,
        limit: usize,
    ) -> Result<usize, ChainError> {
        let mut capacity = 0usize;
        let mut last_has_next = true;
        for d in chain {
            walk_one(walked, limit)?;
            last_has_next = d.has_next();
            if !d.is_write_only() {
                return Err(ChainError::WrongDirection);
            }
            if d.len() == 0 {
                continue;
            }
            // Cannot fail: each descriptor kept was walked, and a frame walks at most
            // MAX_FRAME_DESCS; refused all the same rather than trusted.
            if self.descs.is_full() {
                return Err(ChainError::TooManyDescriptors);
            }
            self.descs.push((d.addr(), d.len()));
            capacity += d.len() as usize;
        }
        if last_has_next {
            return Err(ChainError::Broken);
        }
        Ok(capacity)
    }
}

/// How [`write_at`] stores one piece: [`write_guest`] or [`update_guest`].
type Put<M> = for<'a, 'm> fn(&'a GuestBuffers<'m, M>, &'a [u8], GuestAddress) -> Result<(), GuestMemoryError>;

/// Writes `src` at byte `off` of a chain's buffers.
fn write_at<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    descs: &[(GuestAddress, u32)],
    mut off: usize,
    mut src: &[u8],
    put: Put<M>,
) -> Result<(), ChainError> {
    for &(addr, len) in descs {
        let len = len as usize;
        if src.is_empty() {
            break;
        }
        if off >= len {
            off -= len;
            continue;
        }
        let take = (len - off).min(src.len());
        let at = addr.checked_add(off as u64).ok_or(ChainError::Broken)?;
        put(mem, &src[..take], at).map_err(|source| ChainError::Memory {
            addr: at.0,
            len: take as u32,
            source,
        })?;
        src = &src[take..];
        off = 0;
    }
    Ok(())
}

/// One burst of frames into one RX queue, written under one hold of its lock: the
/// header the queue's features ask for, the descriptors walked so far, and the driver's
/// avail index as last read.
///
/// The avail index is read again only when the frames have used every chain it made
/// available, as DPDK's vhost library reads it once per burst (`virtio_dev_rx_split`):
/// the driver keeps storing it while it refills, so each read moves the line from the
/// driver's CPU (docs/benchmarks.md, "PVP loop"). A stale index is a smaller one, never
/// past the ring (checked when it was read), so it costs at most a look again. Use a
/// burst for one queue only, and drop it with the lock: after a reset the index means
/// nothing.
#[derive(Debug, Clone)]
pub struct RxBurst {
    hdr_len: usize,
    mrg_rxbuf: bool,
    walked: usize,
    avail: Option<u16>,
}

impl RxBurst {
    /// A burst into a queue whose header is `hdr_len` bytes, with VIRTIO_NET_F_MRG_RXBUF
    /// or without.
    pub fn new(hdr_len: usize, mrg_rxbuf: bool) -> Self {
        RxBurst {
            hdr_len,
            mrg_rxbuf,
            walked: 0,
            avail: None,
        }
    }

    /// Descriptors walked so far, at most [`MAX_FRAME_DESCS`] + 1 per frame.
    pub fn walked(&self) -> usize {
        self.walked
    }
}

/// Delivers one frame into the guest's RX queue and returns the number of buffers used.
///
/// On `NoBuffers`/`TooManyBuffers` nothing is consumed (the chains are put back). A broken
/// chain is returned used with length 0, together with any good chains popped before it
/// (the driver sees empty buffers and counts a length error), and the frame is dropped.
/// So is a chain that takes the frame's walk past [`MAX_FRAME_DESCS`]: each bad chain is
/// walked once, never again for the next frame.
pub fn push_rx<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    hdr_len: usize,
    mrg_rxbuf: bool,
    hdr: &VirtioNetHdr,
    frame: &[u8],
) -> Result<u16, RxError> {
    push_rx_burst(q, mem, &mut RxBurst::new(hdr_len, mrg_rxbuf), hdr, frame)
}

/// [`push_rx`] as the next frame of `burst`.
pub fn push_rx_burst<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    burst: &mut RxBurst,
    hdr: &VirtioNetHdr,
    frame: &[u8],
) -> Result<u16, RxError> {
    let res = push_rx_unpublished(q, mem, burst, hdr, frame);
    publish_used(q, mem).map_err(RxError::Ring)?;
    res
}

/// [`push_rx_burst`] without publishing the used index: the entries are written and
/// `next_used` moves on, but the driver sees them only at the next [`publish_used`]. The
/// daemon publishes once per burst, when it checks for an interrupt: each store of the
/// index moves a cache line the driver keeps reading to this CPU and back, as vhost-net and
/// DPDK's vhost library batch their used-index updates too.
pub fn push_rx_unpublished<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    burst: &mut RxBurst,
    hdr: &VirtioNetHdr,
    frame: &[u8],
) -> Result<u16, RxError> {
    let Some(ring) = SplitRing::new(q, mem) else {
        return Err(RxError::NoBuffers);
    };
    push_rx_ring(q, &ring, burst, hdr, frame)
}

/// [`push_rx_unpublished`] into rings already found for `q`: a worker writing a burst into
/// one queue finds them once, under the queue's lock.
pub fn push_rx_ring<M: GuestMemory>(
    q: &mut Queue,
    ring: &SplitRing<'_, M>,
    burst: &mut RxBurst,
    hdr: &VirtioNetHdr,
    frame: &[u8],
) -> Result<u16, RxError> {
    let (hdr_len, mrg_rxbuf) = (burst.hdr_len, burst.mrg_rxbuf);
    let walked = &mut burst.walked;
    let limit = walked.saturating_add(MAX_FRAME_DESCS);
    let total = hdr_len + frame.len();
    let mut rx = RxChains::new();
    let mut room = 0usize;
    // Chains are taken from `pos` on; `next_avail` moves only once the frame is placed or
    // refused, so a frame that finds too few buffers consumes none.
    let mut pos = q.next_avail();
    // No index read yet: equal to `pos`, so the loop reads it before the first chain.
    let avail = burst.avail.get_or_insert(pos);
    while room < total {
        let used = rx.chains.len();
        if used == MAX_RX_BUFFERS || (!mrg_rxbuf && used == 1) {
            return Err(if mrg_rxbuf {
                RxError::TooManyBuffers
            } else {
                RxError::NoBuffers
            });
        }
        if pos == *avail {
            // Every chain the index made available is taken: a look again, the driver may
            // have posted more since (mergeable buffers, or the burst's next frame).
            *avail = ring.avail_idx(pos).map_err(RxError::Ring)?;
            if pos == *avail {
                return Err(RxError::NoBuffers);
            }
        }
        let head = ring.head(pos).map_err(RxError::Ring)?;
        pos = pos.wrapping_add(1);
        let collected = rx
            .collect(head, ring.chain(head), walked, limit)
            .and_then(|capacity| {
                if used == 0 && capacity < hdr_len {
                    rx.chains.pop();
                    rx.descs.clear();
                    Err(ChainError::TooShort(capacity))
                } else {
                    Ok(capacity)
                }
            });
        match collected {
            Ok(capacity) => room += capacity,
            Err(e) => {
                let heads = rx.chains.iter().map(|rc| rc.head).chain([head]);
                give_back(q, ring, pos, heads)?;
                return Err(RxError::Chain(e));
            }
        }
    }
    let used = rx.chains.len();
    let mut h = *hdr;
    h.num_buffers = used as u16;
    let hdr_bytes = h.to_bytes();
    if let Err(e) = write_frame(ring.buffers(), &rx, hdr_len, &hdr_bytes[..hdr_len], frame) {
        // A buffer outside guest memory: the frame is dropped, its chains returned empty.
        give_back(q, ring, pos, rx.chains.iter().map(|rc| rc.head))?;
        return Err(RxError::Chain(e));
    }
    let first = q.next_used();
    let mut src_off = 0usize;
    for (i, rc) in rx.chains.iter().enumerate() {
        let off = if i == 0 { hdr_len } else { 0 };
        let take = (rc.capacity - off).min(frame.len() - src_off);
        src_off += take;
        ring.put_used(first.wrapping_add(i as u16), rc.head, (off + take) as u32)
            .map_err(RxError::Ring)?;
    }
    let end = first.wrapping_add(used as u16);
    q.set_next_avail(pos);
    q.set_next_used(end);
    Ok(used as u16)
}

/// Writes the header and the frame into the chains: the header at the start of the first,
/// the frame's bytes filling the buffers in order after it.
fn write_frame<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    rx: &RxChains,
    hdr_len: usize,
    hdr: &[u8],
    frame: &[u8],
) -> Result<(), ChainError> {
    let mut src_off = 0usize;
    for (i, rc) in rx.chains.iter().enumerate() {
        let descs = rx.descs(i);
        let off = if i == 0 { hdr_len } else { 0 };
        if i == 0 {
            write_at(mem, descs, 0, hdr, update_guest)?;
        }
        let take = (rc.capacity - off).min(frame.len() - src_off);
        write_at(mem, descs, off, &frame[src_off..src_off + take], write_guest)?;
        src_off += take;
    }
    Ok(())
}

/// Takes the chains up to avail position `pos` and returns `heads` used with length 0: the
/// driver sees empty buffers (and counts a length error) and the frame is dropped.
fn give_back<M: GuestMemory>(
    q: &mut Queue,
    ring: &SplitRing<'_, M>,
    pos: u16,
    heads: impl Iterator<Item = u16>,
) -> Result<(), RxError> {
    let first = q.next_used();
    let mut end = first;
    for head in heads {
        ring.put_used(end, head, 0).map_err(RxError::Ring)?;
        end = end.wrapping_add(1);
    }
    q.set_next_avail(pos);
    q.set_next_used(end);
    Ok(())
}

/// Publishes `next_used` as the used index (a release store): every used entry written
/// before it becomes the driver's. Works on a stopped queue too, for what a burst wrote
/// before GET_VRING_BASE stopped it.
pub fn publish_used<M: GuestMemory>(q: &Queue, mem: &M) -> Result<(), RingError> {
    if q.used_ring() == 0 {
        return Ok(());
    }
    let at = GuestAddress(q.used_ring())
        .checked_add(2)
        .ok_or(RingError(virtio_queue::Error::AddressOverflow))?;
    mem.store(q.next_used().to_le(), at, Ordering::Release)
        .map_err(|e| RingError(virtio_queue::Error::GuestMemory(e)))
}

/// VRING_AVAIL_F_NO_INTERRUPT in the avail ring's flags.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Whether the driver wants an interrupt for the chains just returned: EVENT_IDX's
/// used_event when negotiated, else the avail ring's NO_INTERRUPT flag, which virtio-queue
/// 0.18's `needs_notification` does not look at.
pub fn wants_interrupt<M: GuestMemory>(q: &mut Queue, mem: &M) -> Result<bool, RingError> {
    // Always called: it also resets the count of chains added since the last check.
    let by_event_idx = q.needs_notification(mem).map_err(RingError)?;
    if q.event_idx_enabled() {
        return Ok(by_event_idx);
    }
    let flags: u16 = mem
        .read_obj(GuestAddress(q.avail_ring()))
        .map_err(|e| RingError(virtio_queue::Error::GuestMemory(e)))?;
    Ok(u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0)
}

/// [`wants_interrupt`] for a queue whose used entries go through [`SplitRing`], which
/// virtio-queue does not count: `added` is how many were published since the last check.
/// The EVENT_IDX test is virtio-queue 0.18's (and Linux's `vring_need_event`): interrupt if
/// `used_event` lies among the entries added since.
pub fn wants_interrupt_after<M: GuestMemory>(q: &Queue, mem: &M, added: u16) -> Result<bool, RingError> {
    // The used index was stored before the driver's used_event or flags are read
    // (virtio 1.2, 2.7.10): a store-load order, so a full fence.
    fence(Ordering::SeqCst);
    let avail = GuestAddress(q.avail_ring());
    let load = |off: u64| -> Result<u16, RingError> {
        let at = avail
            .checked_add(off)
            .ok_or(RingError(virtio_queue::Error::AddressOverflow))?;
        mem.load::<u16>(at, Ordering::Relaxed)
            .map(u16::from_le)
            .map_err(|e| RingError(virtio_queue::Error::GuestMemory(e)))
    };
    if q.event_idx_enabled() {
        let used_event = Wrapping(load(4 + 2 * u64::from(q.size()))?);
        let new = Wrapping(q.next_used());
        let old = new - Wrapping(added);
        return Ok(new - used_event - Wrapping(1) < new - old);
    }
    Ok(load(0)? & AVAIL_F_NO_INTERRUPT == 0)
}

/// The readable bytes of a control command, where to write its ack, and the large buffers
/// to hand back to the guest's cache once the command is returned.
pub struct CtrlChain {
    pub len: usize,
    pub ack: Option<GuestAddress>,
    pub evict: EvictList,
}

/// A popped control chain: its head, and what it holds or why it was refused.
pub type PoppedCtrl = (u16, Result<CtrlChain, ChainError>);

/// The indirect table the descriptor at `desc` refers to, if it does and can be read.
pub fn indirect_table<M: GuestMemory>(mem: &M, desc: GuestAddress) -> Option<GuestAddress> {
    let d: Descriptor = mem.read_obj(desc).ok()?;
    d.refers_to_indirect_table().then(|| d.addr())
}

/// Copies the driver-readable part of a control chain into `buf` and finds the ack byte (the
/// first byte of the last writable descriptor).
pub fn pop_ctrl<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<Option<PoppedCtrl>, RingError> {
    let Some(chain) = next_chain(q, mem)? else {
        return Ok(None);
    };
    let head = chain.head_index();
    Ok(Some((
        head,
        read_ctrl(chain, mem, buf, max).map(|(len, ack, evict)| CtrlChain { len, ack, evict }),
    )))
}

fn read_ctrl<M: GuestMemory>(
    chain: DescriptorChain<&M>,
    mem: &M,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(usize, Option<GuestAddress>, EvictList), ChainError> {
    buf.clear();
    let mut ack = None;
    let mut evict = EvictList::default();
    let mut last_has_next = true;
    let mut walked = 0;
    for d in chain {
        walk_one(&mut walked, MAX_FRAME_DESCS)?;
        last_has_next = d.has_next();
        if d.is_write_only() {
            if d.len() > 0 {
                // The answer must land in guest memory: a chain whose ack byte lies outside
                // is refused before anything is applied (found by fuzz target ctrl_chain),
                // as a TX or RX buffer outside memory is.
                if !mem.check_range(d.addr(), 1, Permissions::Write) {
                    return Err(ChainError::Memory {
                        addr: d.addr().0,
                        len: d.len(),
                        source: vm_memory::GuestMemoryError::InvalidGuestAddress(d.addr()),
                    });
                }
                ack = Some(d.addr());
            }
            continue;
        }
        if ack.is_some() {
            // A readable descriptor after a writable one breaks the chain layout rule.
            return Err(ChainError::WrongDirection);
        }
        read_desc_into(mem, &d, buf, max)?;
        evict.note(d.addr(), d.len());
    }
    if last_has_next {
        return Err(ChainError::Broken);
    }
    Ok((buf.len(), ack, evict))
}

fn read_desc_into<M: GuestMemory>(
    mem: &M,
    d: &Descriptor,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), ChainError> {
    let start = buf.len();
    let end = start
        .checked_add(d.len() as usize)
        .filter(|e| *e <= max)
        .ok_or(ChainError::TooLong(max))?;
    buf.resize(end, 0);
    mem.read_slice(&mut buf[start..end], d.addr())
        .map_err(|source| ChainError::Memory {
            addr: d.addr().0,
            len: d.len(),
            source,
        })
}
