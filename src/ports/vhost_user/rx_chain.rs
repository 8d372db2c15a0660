//! Received frames written into the buffers a guest posted: one frame at a time into the
//! chains it needs (several with VIRTIO_NET_F_MRG_RXBUF), a run of frames into one queue
//! under one hold of its lock, its used index published and the driver's wish for an
//! interrupt read once per run. Generic over the guest memory, so tests run it on
//! `MockSplitQueue` without a connection.

use arrayvec::ArrayVec;
use thiserror::Error;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryError, VolatileSlice};

use super::avail_heads::AvailHeads;
use super::direct_copy::copy_to_guest;
use super::rx_header::{plain_header, update_guest, update_header, PLAIN, PLAIN_DATA_VALID};
use super::split_ring::{walk_one, ChainError, GuestBuffers, RingError, SplitRing, MAX_FRAME_DESCS};
use super::used_batch::UsedBatch;
use crate::pipeline::BurstFrame;
use crate::wire::virtio_net_hdr::{VirtioNetHdr, F_DATA_VALID, HDR_LEN_HASH};

/// Most buffers one received frame may be spread over with MRG_RXBUF. A guest posting
/// smaller buffers than this allows loses the frame (counted as dropped).
pub const MAX_RX_BUFFERS: usize = 64;

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

/// A run of frames into one RX queue, written under one hold of its lock: the header the
/// queue's features ask for, the descriptors walked so far, the driver's avail index as
/// last read, and where the run's used entries began.
///
/// The avail index is read again only when the frames have used every chain it made
/// available, as DPDK's vhost library reads it once per burst (`virtio_dev_rx_split`):
/// the driver keeps storing it while it refills, so each read moves the line from the
/// driver's CPU. A stale index is a smaller one, never past the ring (checked when it was
/// read), so it costs at most a look again. A run serves one queue only and ends with the
/// lock: after a reset the index means nothing.
pub struct RxRun {
    hdr_len: usize,
    mrg_rxbuf: bool,
    walked: usize,
    avail: Option<u16>,
    /// The used index when the run wrote its first entry.
    first_used: Option<u16>,
    /// Whether a frame may take the one-descriptor lane ([`RxRun::push_one_desc`]).
    one_desc: bool,
    /// The chains of the frame being written, kept here rather than on the stack of each
    /// push: they hold room for the worst case, and are never zeroed.
    chains: RxChains,
    /// The run's used elements, written to the ring at [`RxRun::finish`] (or when it
    /// fills), not one by one.
    used: UsedBatch,
    /// The avail entries the one-descriptor lane takes its chains from, read at once.
    heads: AvailHeads,
}

impl RxRun {
    /// A run into a queue whose header is `hdr_len` bytes, with VIRTIO_NET_F_MRG_RXBUF or
    /// without.
    pub fn new(hdr_len: usize, mrg_rxbuf: bool) -> Self {
        RxRun {
            hdr_len,
            mrg_rxbuf,
            walked: 0,
            avail: None,
            first_used: None,
            one_desc: true,
            chains: RxChains::new(),
            used: UsedBatch::default(),
            heads: AvailHeads::default(),
        }
    }

    /// The same run with every frame written by the general walk: what the one-descriptor
    /// lane is checked against (tests/ring.rs, fuzz target `rx_chain`).
    pub fn general_only(mut self) -> Self {
        self.one_desc = false;
        self
    }

    /// Starts the next run, of any queue with these features, keeping nothing of the last.
    pub fn restart(&mut self) {
        self.walked = 0;
        self.avail = None;
        self.first_used = None;
        self.used.clear();
        self.heads.clear();
    }

    /// Descriptors walked so far, at most [`MAX_FRAME_DESCS`] + 1 per frame.
    pub fn walked(&self) -> usize {
        self.walked
    }

    /// Writes one frame into `q`'s receive buffers (whose rings are `ring`) and returns the
    /// number of buffers used. The driver sees it at [`RxRun::finish`].
    ///
    /// On `NoBuffers`/`TooManyBuffers` nothing is consumed. A broken chain is returned used
    /// with length 0, together with any good chains taken before it (the driver sees empty
    /// buffers and counts a length error), and the frame is dropped. So is a chain that
    /// takes the frame's walk past [`MAX_FRAME_DESCS`]: each bad chain is walked once.
    pub fn push<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        hdr: &VirtioNetHdr,
        frame: &[u8],
    ) -> Result<u16, RxError> {
        let one = VirtioNetHdr {
            num_buffers: 1,
            ..*hdr
        };
        self.push_with(q, ring, &one.to_bytes(), || *hdr, frame)
    }

    /// [`RxRun::push`] for a frame whose header has no field set but `flags` (DATA_VALID
    /// from a checksum action, or none). A rest still in the sender's buffer
    /// ([`BurstFrame::rest`]) goes from there straight into the lane's buffer; the general
    /// walk takes the frame whole ([`BurstFrame::bytes`]).
    pub fn push_plain<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        frame: &mut BurstFrame<'_>,
        flags: u8,
    ) -> Result<u16, RxError> {
        // The two usual headers are constants, compared with the buffer's as they are.
        // Built per frame (a copy, then its flags byte stored), a header would make the
        // compare's wider load span two stores and wait for them to reach the cache,
        // behind every store before them: at 1500 B, the last frame's copy into RX lines
        // still on their way from the frontend's CPU (docs/performance.md).
        let other;
        let one = match flags {
            0 => &PLAIN,
            F_DATA_VALID => &PLAIN_DATA_VALID,
            _ => {
                other = plain_header(flags);
                &other
            }
        };
        let hdr = || VirtioNetHdr {
            flags,
            ..VirtioNetHdr::default()
        };
        let Some(rest) = frame.rest() else {
            return self.push_with(q, ring, one, hdr, frame.head());
        };
        self.first_used.get_or_insert(q.next_used());
        if self.one_desc && self.push_one_desc(q, ring, one, frame.head(), rest)? {
            return Ok(1);
        }
        self.push_walked(q, ring, &hdr(), frame.bytes())
    }

    /// [`RxRun::push`], `one` being the header's bytes for a frame in one buffer and `hdr`
    /// making its header for the general walk, only if the frame takes it.
    #[inline(always)]
    fn push_with<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        one: &[u8; HDR_LEN_HASH],
        hdr: impl FnOnce() -> VirtioNetHdr,
        frame: &[u8],
    ) -> Result<u16, RxError> {
        self.first_used.get_or_insert(q.next_used());
        if self.one_desc && self.push_one_desc(q, ring, one, frame, ())? {
            return Ok(1);
        }
        self.push_walked(q, ring, &hdr(), frame)
    }

    /// The general walk: [`RxRun::push`] for a frame the lane did not take.
    fn push_walked<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        hdr: &VirtioNetHdr,
        frame: &[u8],
    ) -> Result<u16, RxError> {
        let pos = self.take_chains(q, ring, frame.len())?;
        let (hdr_len, rx) = (self.hdr_len, &self.chains);
        let used = rx.chains.len();
        let mut h = *hdr;
        h.num_buffers = used as u16;
        let hdr_bytes = h.to_bytes();
        if let Err(e) = write_frame(ring.buffers(), rx, hdr_len, &hdr_bytes[..hdr_len], frame) {
            // A buffer outside guest memory: the frame is dropped, its chains returned empty.
            self.used
                .give_back(q, ring, pos, rx.chains.iter().map(|rc| rc.head))
                .map_err(RxError::Ring)?;
            return Err(RxError::Chain(e));
        }
        let first = q.next_used();
        let mut src_off = 0usize;
        for (i, rc) in rx.chains.iter().enumerate() {
            let off = if i == 0 { hdr_len } else { 0 };
            let take = (rc.capacity - off).min(frame.len() - src_off);
            src_off += take;
            self.used
                .put(ring, first.wrapping_add(i as u16), rc.head, (off + take) as u32)
                .map_err(RxError::Ring)?;
        }
        q.set_next_avail(pos);
        q.set_next_used(first.wrapping_add(used as u16));
        Ok(used as u16)
    }

    /// The usual frame, written without the general walk, with `hdr` (its header with
    /// `num_buffers` 1, as bytes): the next chain is one
    /// device-writable descriptor (no NEXT, no INDIRECT) that holds the header and the whole
    /// frame in one memory region, as DPDK's virtio-user and Linux's virtio-net (with
    /// mergeable or big buffers of a page or more) post them. What it writes, returns and
    /// counts is what the general walk would (tests/ring.rs checks the two on random
    /// rings). Returns false, having changed nothing but the avail index it read, when the
    /// chain is anything else; errors are the ones the general walk would give first.
    /// Always inlined: in its caller a whole frame's `rest` is `()` and the result a
    /// branch, not a value in memory (docs/performance.md, "What shaped the path").
    #[inline(always)]
    fn push_one_desc<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        hdr: &[u8; HDR_LEN_HASH],
        frame: &[u8],
        rest: impl Rest,
    ) -> Result<bool, RxError> {
        let pos = q.next_avail();
        let avail = self.avail.get_or_insert(pos);
        if pos == *avail {
            *avail = ring.avail_idx(pos).map_err(RxError::Ring)?;
            if pos == *avail {
                return Err(RxError::NoBuffers);
            }
        }
        let (hdr_len, total) = (self.hdr_len, self.hdr_len + frame.len() + rest.len());
        let head = self.heads.at(ring, pos, *avail).map_err(RxError::Ring)?;
        let Some(d) = ring.descriptor(head) else {
            return Ok(false);
        };
        if d.has_next() || d.refers_to_indirect_table() || !d.is_write_only() || (d.len() as usize) < total {
            return Ok(false);
        }
        let Some(buf) = ring.buffers().slice(d.addr(), total) else {
            return Ok(false);
        };
        let Ok(body) = buf.offset(hdr_len) else {
            return Ok(false);
        };
        let after = match rest.len() {
            0 => None,
            _ => match body.offset(frame.len()) {
                Ok(after) => Some(after),
                Err(_) => return Ok(false),
            },
        };
        update_header(&buf, &hdr[..hdr_len]);
        copy_to_guest(&body, frame);
        if let Some(after) = after {
            rest.copy_into(after);
        }
        let first = q.next_used();
        // Within the descriptor's u32 length.
        self.used
            .put(ring, first, head, total as u32)
            .map_err(RxError::Ring)?;
        self.walked += 1;
        q.set_next_avail(pos.wrapping_add(1));
        q.set_next_used(first.wrapping_add(1));
        Ok(true)
    }

    /// Takes the chains a frame of `len` bytes needs, from `next_avail` on, into
    /// `self.chains`; returns the avail position after them. `next_avail` moves only once
    /// the frame is placed or refused, so a frame that finds too few buffers consumes none.
    fn take_chains<M: GuestMemory>(
        &mut self,
        q: &mut Queue,
        ring: &SplitRing<'_, M>,
        len: usize,
    ) -> Result<u16, RxError> {
        let (hdr_len, mrg_rxbuf) = (self.hdr_len, self.mrg_rxbuf);
        let walked = &mut self.walked;
        let limit = walked.saturating_add(MAX_FRAME_DESCS);
        let total = hdr_len + len;
        let rx = &mut self.chains;
        rx.clear();
        let mut room = 0usize;
        let mut pos = q.next_avail();
        // No index read yet: equal to `pos`, so the loop reads it before the first chain.
        let avail = self.avail.get_or_insert(pos);
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
                // Every chain the index made available is taken: a look again, the driver
                // may have posted more since (mergeable buffers, or the run's next frame).
                *avail = ring.avail_idx(pos).map_err(RxError::Ring)?;
                if pos == *avail {
                    return Err(RxError::NoBuffers);
                }
            }
            let head = self.heads.at(ring, pos, *avail).map_err(RxError::Ring)?;
            pos = pos.wrapping_add(1);
            let collected = rx
                .collect(head, ring.chain(head), walked, limit)
                .and_then(|capacity| {
                    if used == 0 && capacity < hdr_len {
                        rx.clear();
                        Err(ChainError::TooShort(capacity))
                    } else {
                        Ok(capacity)
                    }
                });
            match collected {
                Ok(capacity) => room += capacity,
                Err(e) => {
                    let heads = rx.chains.iter().map(|rc| rc.head).chain([head]);
                    self.used.give_back(q, ring, pos, heads).map_err(RxError::Ring)?;
                    return Err(RxError::Chain(e));
                }
            }
        }
        Ok(pos)
    }

    /// Publishes what the run wrote (the used index, a release store) and says whether the
    /// driver wants an interrupt for it. Published even if the queue was stopped since:
    /// what was written is the driver's.
    pub fn finish<M: GuestMemory>(&mut self, q: &Queue, ring: &SplitRing<'_, M>) -> Result<bool, RingError> {
        let Some(first) = self.first_used.take() else {
            return Ok(false);
        };
        self.used.write(ring)?;
        let added = q.next_used().wrapping_sub(first);
        if added == 0 {
            return Ok(false);
        }
        ring.publish_used(q.next_used())?;
        ring.wants_interrupt(q.event_idx_enabled(), q.next_used(), added)
    }
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

    fn clear(&mut self) {
        self.descs.clear();
        self.chains.clear();
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

/// What follows a frame's head in [`RxRun::push_one_desc`]: nothing (`()`), or the rest
/// still in its sender's buffer ([`BurstFrame::rest`]). A type rather than an `Option`, so
/// that the lane for a frame with no rest is compiled without one.
trait Rest {
    fn len(&self) -> usize;
    fn copy_into<B: BitmapSlice>(&self, to: VolatileSlice<'_, B>);
}

impl Rest for () {
    #[inline(always)]
    fn len(&self) -> usize {
        0
    }

    #[inline(always)]
    fn copy_into<B: BitmapSlice>(&self, _to: VolatileSlice<'_, B>) {}
}

impl Rest for &VolatileSlice<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        VolatileSlice::len(self)
    }

    /// From one guest's buffer into another's (or the same guest's): a memmove (vm-memory
    /// 0.18), so even buffers a guest made overlap are copied safely.
    #[inline(always)]
    fn copy_into<B: BitmapSlice>(&self, to: VolatileSlice<'_, B>) {
        self.copy_to_volatile_slice(to);
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

/// Writes `src` into guest memory at `at`: one translation and one copy when the range
/// lies in one region (the usual case), vm-memory's region walk otherwise.
fn write_guest<M: GuestMemory>(
    mem: &GuestBuffers<'_, M>,
    src: &[u8],
    at: GuestAddress,
) -> Result<(), GuestMemoryError> {
    if let Some(s) = mem.slice(at, src.len()) {
        copy_to_guest(&s, src);
        return Ok(());
    }
    mem.mem().write_slice(src, at)
}
