//! A split virtqueue (virtio 1.2, 2.7) as the data path reads and writes it: its three
//! areas (descriptor table, avail ring, used ring) found in host memory once per burst,
//! the descriptors of a chain, and the errors a ring or a chain can have.
//!
//! virtio-queue 0.18 reads each avail entry, descriptor and used element through
//! `GuestMemory::load`, `read_obj` and `write_obj`: every access looks its region up
//! again, through vm-memory's region iterator for the last two. [`SplitRing`] resolves each
//! area to one `VolatileSlice` when a burst starts; after that an access is a bounds check
//! and one volatile load or store (docs/performance.md).
//!
//! The rules are virtio-queue's, kept exactly (its `AvailIter`, `DescriptorChain` and
//! `add_used`), and `tests/ring.rs` checks that against virtio-queue itself on random rings.
//! Two differences, both on broken rings: an avail entry that cannot be read is an error
//! here, where virtio-queue logs and reports an empty ring each time; and a used entry is
//! written without publishing the used index, which the caller does once per burst
//! ([`SplitRing::publish_used`]). An area that does not lie in one memory region (a driver
//! may place a ring across two) is accessed through `GuestMemory` per access.

use std::cell::Cell;
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use arrayvec::ArrayVec;
use thiserror::Error;
use vhost_user_backend::VringRwLock;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Error as QueueError, Queue, QueueT};
use vm_memory::bitmap::{BitmapSlice, MS};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemory, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryError,
    GuestMemoryMmap, GuestMemoryRegion, VolatileMemory, VolatileSlice,
};

/// A connection's guest memory, as vhost-user-backend 0.24 maps it for the backend.
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// One of a connection's vrings, as vhost-user-backend 0.24 hands it to the backend.
pub type Vring = VringRwLock<Mem>;

/// The driver broke the ring itself (an available index more than a ring ahead, a head or
/// used entry the ring cannot hold, ring memory that cannot be read): nothing more can be
/// served from it until the frontend restarts it.
#[derive(Debug, Error)]
#[error("the ring cannot be served")]
pub struct RingError(#[source] pub QueueError);

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

/// Why one chain was refused: it is returned to the driver used, and the ring goes on.
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
        source: GuestMemoryError,
    },
}

/// Counts one more descriptor walked; past `limit` (the frame's start plus
/// [`MAX_FRAME_DESCS`]) the frame is refused.
#[inline]
pub(super) fn walk_one(walked: &mut usize, limit: usize) -> Result<(), ChainError> {
    *walked += 1;
    if *walked > limit {
        Err(ChainError::TooManyDescriptors)
    } else {
        Ok(())
    }
}

/// VRING_DESC_F_INDIRECT's tables are made of 16-byte descriptors (virtio 1.2, 2.7.5.3).
const DESC_SIZE: u64 = 16;

/// `len` bytes of guest memory at `addr` as one host slice, when they lie in one region
/// (`physical_memory`: vhost-user's memory has no IOMMU in between). One region look-up.
pub(super) fn host_slice<M: GuestMemory + ?Sized>(
    mem: &M,
    addr: GuestAddress,
    len: usize,
) -> Option<VolatileSlice<'_, MS<'_, M::PhysicalMemory>>> {
    mem.physical_memory()?.get_slice(addr, len).ok()
}

/// The memory region type of `M`'s physical memory.
type Region<M> = <<M as GuestMemory>::PhysicalMemory as GuestMemoryBackend>::R;

/// Guest memory as the buffers of one burst are found in it: [`host_slice`], remembering
/// the region the last buffer lay in. vm-memory 0.18 finds a region by a binary search over
/// its list (`find_region`) for every access; a burst's buffers come from one driver's
/// pool, nearly always one region, so most look-ups become one range check. The answer is
/// the same as [`host_slice`]'s: a range the cached region does not hold whole is looked up
/// again.
pub struct GuestBuffers<'m, M: GuestMemory + ?Sized + 'm> {
    mem: &'m M,
    last: Cell<Option<&'m Region<M>>>,
}

impl<'m, M: GuestMemory + ?Sized> GuestBuffers<'m, M> {
    pub fn new(mem: &'m M) -> Self {
        GuestBuffers {
            mem,
            last: Cell::new(None),
        }
    }

    pub fn mem(&self) -> &'m M {
        self.mem
    }

    /// `len` bytes at `addr` as one host slice, when they lie in one region.
    pub fn slice(
        &self,
        addr: GuestAddress,
        len: usize,
    ) -> Option<VolatileSlice<'m, MS<'m, M::PhysicalMemory>>> {
        if let Some(r) = self.last.get() {
            if let Some(s) = r.to_region_addr(addr).and_then(|at| r.get_slice(at, len).ok()) {
                return Some(s);
            }
        }
        let (r, at) = self.mem.physical_memory()?.to_region_addr(addr)?;
        self.last.set(Some(r));
        r.get_slice(at, len).ok()
    }
}

/// One area of the ring: a slice of host memory when it lies in one region, else its guest
/// address, accessed through `GuestMemory` as virtio-queue does.
enum Area<'m, M: GuestMemory + ?Sized + 'm> {
    Host(VolatileSlice<'m, MS<'m, M::PhysicalMemory>>),
    Guest(GuestAddress),
}

impl<'m, M: GuestMemory + ?Sized> Area<'m, M> {
    fn new(mem: &'m M, addr: GuestAddress, len: u64) -> Self {
        let host = usize::try_from(len)
            .ok()
            .and_then(|len| host_slice(mem, addr, len));
        match host {
            Some(s) => Area::Host(s),
            None => Area::Guest(addr),
        }
    }

    fn at(addr: GuestAddress, off: u64) -> Result<GuestAddress, QueueError> {
        addr.checked_add(off).ok_or(QueueError::AddressOverflow)
    }

    fn load_u16(&self, mem: &M, off: u64, order: Ordering) -> Result<u16, QueueError> {
        let v = match self {
            // `off` is within the slice by construction; still checked by vm-memory.
            Area::Host(s) => s
                .load::<u16>(off as usize, order)
                .map_err(QueueError::VolatileMemoryError)?,
            Area::Guest(a) => mem
                .load(Self::at(*a, off)?, order)
                .map_err(QueueError::GuestMemory)?,
        };
        Ok(u16::from_le(v))
    }

    fn store_u16(&self, mem: &M, off: u64, v: u16, order: Ordering) -> Result<(), QueueError> {
        match self {
            Area::Host(s) => s
                .store(v.to_le(), off as usize, order)
                .map_err(QueueError::VolatileMemoryError),
            Area::Guest(a) => mem
                .store(v.to_le(), Self::at(*a, off)?, order)
                .map_err(QueueError::GuestMemory),
        }
    }

    fn read_desc(&self, mem: &M, off: u64) -> Result<Descriptor, QueueError> {
        match self {
            Area::Host(s) => s
                .get_ref::<Descriptor>(off as usize)
                .map(|r| r.load())
                .map_err(QueueError::VolatileMemoryError),
            Area::Guest(a) => mem.read_obj(Self::at(*a, off)?).map_err(QueueError::GuestMemory),
        }
    }

    /// Bytes of the area from `off` into `buf`: one copy.
    fn read_bytes(&self, mem: &M, off: u64, buf: &mut [u8]) -> Result<(), QueueError> {
        match self {
            Area::Host(s) => s
                .read_slice(buf, off as usize)
                .map_err(QueueError::VolatileMemoryError),
            Area::Guest(a) => mem
                .read_slice(buf, Self::at(*a, off)?)
                .map_err(QueueError::GuestMemory),
        }
    }

    /// Bytes at `off`: used elements as the ring holds them.
    fn write_bytes(&self, mem: &M, off: u64, bytes: &[u8]) -> Result<(), QueueError> {
        match self {
            Area::Host(s) => s
                .write_slice(bytes, off as usize)
                .map_err(QueueError::VolatileMemoryError),
            Area::Guest(a) => mem
                .write_slice(bytes, Self::at(*a, off)?)
                .map_err(QueueError::GuestMemory),
        }
    }
}

/// A started queue's rings, valid while the memory guard `mem` lives.
pub struct SplitRing<'m, M: GuestMemory + ?Sized + 'm> {
    /// The guest memory, and the region its last buffer lay in.
    bufs: GuestBuffers<'m, M>,
    size: u16,
    desc: Area<'m, M>,
    avail: Area<'m, M>,
    used: Area<'m, M>,
}

impl<'m, M: GuestMemory + ?Sized> SplitRing<'m, M> {
    /// The rings of `q`; `None` when the queue is not started (virtio-queue's
    /// `QueueNotReady`: not ready, or no avail ring yet).
    pub fn new(q: &Queue, mem: &'m M) -> Option<Self> {
        // virtio-queue takes only sizes that are powers of two (`try_set_size`), as a split
        // ring's must be (virtio 1.2, 2.7): positions are then taken modulo the size with a
        // mask, not a division. Checked here all the same, where the mask is relied on.
        if !q.ready() || q.avail_ring() == 0 || !q.size().is_power_of_two() {
            return None;
        }
        let size = q.size();
        let n = u64::from(size);
        Some(SplitRing {
            bufs: GuestBuffers::new(mem),
            size,
            desc: Area::new(mem, GuestAddress(q.desc_table()), DESC_SIZE * n),
            // With their event fields (virtio 1.2, 2.7.10): used_event after the avail
            // ring's entries, avail_event after the used ring's.
            avail: Area::new(mem, GuestAddress(q.avail_ring()), 6 + 2 * n),
            used: Area::new(mem, GuestAddress(q.used_ring()), 6 + 8 * n),
        })
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// The guest memory the rings (and their chains' buffers) lie in.
    pub fn mem(&self) -> &'m M {
        self.bufs.mem()
    }

    /// The same memory, for the chains' buffers: the region of the last one found is kept.
    pub fn buffers(&self) -> &GuestBuffers<'m, M> {
        &self.bufs
    }

    /// The driver's avail index. One more than a ring ahead of `next_avail` is refused, as
    /// virtio-queue refuses it (`InvalidAvailRingIndex`): the driver never makes a chain
    /// available twice, and believing it would make the device serve chains forever.
    pub fn avail_idx(&self, next_avail: u16) -> Result<u16, RingError> {
        let idx = self
            .avail
            .load_u16(self.mem(), 2, Ordering::Acquire)
            .map_err(RingError)?;
        if (Wrapping(idx) - Wrapping(next_avail)).0 > self.size {
            return Err(RingError(QueueError::InvalidAvailRingIndex));
        }
        Ok(idx)
    }

    /// The head of the chain at avail position `pos` (taken modulo the ring size).
    #[inline]
    pub fn head(&self, pos: u16) -> Result<u16, RingError> {
        let off = 4 + 2 * u64::from(pos & (self.size - 1));
        self.avail
            .load_u16(self.mem(), off, Ordering::Acquire)
            .map_err(RingError)
    }

    /// The heads of the `n` chains from avail position `from` on (modulo the ring size), at
    /// most [`HEADS_AT_ONCE`] and a ring's worth: read in one copy (two where the ring
    /// wraps) rather than entry by entry, as DPDK's vhost library reads a burst's avail
    /// entries. Called after [`SplitRing::avail_idx`], whose acquire load orders these
    /// reads after the driver's writes of the entries (virtio 1.2, 2.7.13.3).
    pub fn heads(&self, from: u16, n: usize) -> Result<ArrayVec<u16, HEADS_AT_ONCE>, RingError> {
        let n = n.min(HEADS_AT_ONCE).min(usize::from(self.size));
        let mut whole = [0u8; AVAIL_ENTRY * HEADS_AT_ONCE];
        let bytes = &mut whole[..AVAIL_ENTRY * n];
        self.wrapping(from, AVAIL_ENTRY, bytes.len(), |off, range| {
            self.avail.read_bytes(self.mem(), 4 + off, &mut bytes[range])
        })?;
        // Converted over the whole array, a loop of fixed length the compiler turns into a
        // few vector moves, then cut to `n`: no capacity check per head.
        let mut all = [0u16; HEADS_AT_ONCE];
        for (h, b) in all.iter_mut().zip(whole.chunks_exact(AVAIL_ENTRY)) {
            *h = u16::from_le_bytes([b[0], b[1]]);
        }
        let mut heads = ArrayVec::from(all);
        heads.truncate(n);
        Ok(heads)
    }

    /// Splits `len` bytes of entries of `entry` bytes each, from ring position `first` on
    /// (modulo the ring size), where the ring ends, and calls `f` with each part's offset
    /// from the ring's first entry and its range in the `len` bytes: once, or twice where
    /// the ring wraps. More than the ring holds is refused.
    fn wrapping(
        &self,
        first: u16,
        entry: usize,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), QueueError>,
    ) -> Result<(), RingError> {
        let size = usize::from(self.size);
        if len > entry * size {
            return Err(RingError(QueueError::InvalidSize));
        }
        let start = usize::from(first & (self.size - 1));
        let to_end = len.min(entry * (size - start));
        f((entry * start) as u64, 0..to_end).map_err(RingError)?;
        if to_end < len {
            f(0, to_end..len).map_err(RingError)?;
        }
        Ok(())
    }

    /// The descriptor at `index` of the ring's own table (not an indirect one); `None` when
    /// the index is past the table or the descriptor cannot be read.
    #[inline]
    pub fn descriptor(&self, index: u16) -> Option<Descriptor> {
        if index >= self.size {
            return None;
        }
        self.desc.read_desc(self.mem(), u64::from(index) * DESC_SIZE).ok()
    }

    /// The descriptors of the chain starting at `head`.
    pub fn chain(&self, head: u16) -> Chain<'_, 'm, M> {
        Chain {
            ring: self,
            table: None,
            table_size: self.size,
            next: head,
            ttl: self.size,
            yielded: 0,
        }
    }

    /// Writes used elements from position `first` on (modulo the ring size), given as the
    /// ring holds them ([`USED_ELEM`] bytes each): one copy, two where the ring wraps. More
    /// elements than the ring holds are refused.
    pub fn put_used_elems(&self, first: u16, bytes: &[u8]) -> Result<(), RingError> {
        self.wrapping(first, USED_ELEM, bytes.len(), |off, range| {
            self.used.write_bytes(self.mem(), 4 + off, &bytes[range])
        })
    }

    /// Tells the driver it need not kick (poll mode): VRING_USED_F_NO_NOTIFY in the used
    /// ring's flags, stored only when they do not say so already, so that a busy poll
    /// visit reads the line and leaves it shared with the driver's CPU. A ring started anew
    /// has them cleared, and is quieted again on its first visit. With EVENT_IDX the driver
    /// reads the avail event instead and there is nothing to do, as virtio-queue 0.18's
    /// `disable_notification` does nothing then.
    pub fn quiet_driver(&self, event_idx: bool) -> Result<(), RingError> {
        if event_idx {
            return Ok(());
        }
        let flags = self
            .used
            .load_u16(self.mem(), 0, Ordering::Relaxed)
            .map_err(RingError)?;
        if flags & USED_F_NO_NOTIFY == 0 {
            self.used
                .store_u16(self.mem(), 0, flags | USED_F_NO_NOTIFY, Ordering::Relaxed)
                .map_err(RingError)?;
        }
        Ok(())
    }

    /// Publishes the used index: every element written before it is the driver's. A release
    /// store, as virtio-queue's `add_used` makes (virtio 1.2, 2.7.8: the device updates the
    /// ring before the index).
    pub fn publish_used(&self, idx: u16) -> Result<(), RingError> {
        self.used
            .store_u16(self.mem(), 2, idx, Ordering::Release)
            .map_err(RingError)
    }

    /// Whether the driver wants an interrupt for the `added` used entries just published,
    /// up to `next_used`: EVENT_IDX's `used_event` when negotiated (virtio-queue 0.18's and
    /// Linux's `vring_need_event`: interrupt if it lies among the entries added), else the
    /// avail ring's NO_INTERRUPT flag, which virtio-queue 0.18's `needs_notification` does
    /// not look at.
    pub fn wants_interrupt(&self, event_idx: bool, next_used: u16, added: u16) -> Result<bool, RingError> {
        // The used index was stored before the driver's used_event or flags are read
        // (virtio 1.2, 2.7.10): a store-load order, so a full fence.
        fence(Ordering::SeqCst);
        let said = self
            .avail
            .load_u16(
                self.mem(),
                driver_says_at(event_idx, self.size),
                Ordering::Relaxed,
            )
            .map_err(RingError)?;
        Ok(interrupt_wanted(event_idx, said, next_used, added))
    }
}

/// Where in the avail ring of a queue of `size` the driver says whether it wants
/// interrupts: `used_event` under EVENT_IDX, after the ring's entries (virtio 1.2, 2.7.6),
/// else `flags`.
pub fn driver_says_at(event_idx: bool, size: u16) -> u64 {
    if event_idx {
        4 + 2 * u64::from(size)
    } else {
        0
    }
}

/// Whether a driver that `said` so ([`driver_says_at`]) wants an interrupt for the `added`
/// used entries just published, up to `next_used`.
pub fn interrupt_wanted(event_idx: bool, said: u16, next_used: u16, added: u16) -> bool {
    if event_idx {
        let (new, used_event) = (Wrapping(next_used), Wrapping(said));
        let old = new - Wrapping(added);
        return new - used_event - Wrapping(1) < new - old;
    }
    said & AVAIL_F_NO_INTERRUPT == 0
}

/// VRING_AVAIL_F_NO_INTERRUPT in the avail ring's flags.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// VRING_USED_F_NO_NOTIFY in the used ring's flags.
const USED_F_NO_NOTIFY: u16 = 1;

/// [`SplitRing::wants_interrupt`] for `q`, whose used index was just published with
/// `added` new entries; false for a queue that is not started.
pub fn wants_interrupt_after<M: GuestMemory>(q: &Queue, mem: &M, added: u16) -> Result<bool, RingError> {
    match SplitRing::new(q, mem) {
        Some(ring) => ring.wants_interrupt(q.event_idx_enabled(), q.next_used(), added),
        None => Ok(false),
    }
}

/// Bytes of one used element (virtio 1.2, 2.7.8: `le32 id`, `le32 len`).
pub const USED_ELEM: usize = 8;

/// Bytes of one avail entry (virtio 1.2, 2.7.6: `le16 ring[]`).
const AVAIL_ENTRY: usize = 2;

/// Avail entries [`SplitRing::heads`] reads at once: a TX batch (tx_chain.rs `TX_BATCH`).
pub const HEADS_AT_ONCE: usize = 32;

/// Chains [`SplitRing::prefetch_descriptors`] looks ahead at most: a TX batch.
const PREFETCH_CHAINS: usize = HEADS_AT_ONCE;

/// Bytes of a buffer [`prefetch_start`] asks for at most: a small frame and its header.
/// A longer frame's later lines follow through the CPU's own prefetchers.
pub const PREFETCH_BYTES: usize = 128;

/// Asks the CPU to start loading the cache line of `p`. A hint: a prefetch never faults
/// and changes nothing the program can see, whatever `p` is.
#[inline]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is SSE, which every x86-64 CPU has; it reads nothing into the
    // program and cannot fault on any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks the CPU to start loading the first bytes of `bytes`, [`PREFETCH_BYTES`] at most:
/// the lines a chain's header and small frame lie in. Served one after the other, each
/// chain waits for its buffer to come over from the driver's CPU; asked for together,
/// a batch's misses overlap, as DPDK's vhost library prefetches a burst's buffers.
#[inline]
pub fn prefetch_start<B: BitmapSlice>(bytes: &VolatileSlice<'_, B>) {
    let len = bytes.len().min(PREFETCH_BYTES);
    if len == 0 {
        return;
    }
    let start = bytes.ptr_guard();
    // The first, middle and last byte: 128 bytes span at most three lines.
    for off in [0, len / 2, len - 1] {
        prefetch_line(start.as_ptr().wrapping_add(off));
    }
}

impl<M: GuestMemory + ?Sized> SplitRing<'_, M> {
    /// Asks the CPU to start loading the descriptors of the chains `heads`, whose reads
    /// would otherwise each wait in turn for a line from the driver's CPU. A hint and
    /// nothing more: it reads nothing. A head past the table, and a descriptor table
    /// outside one memory region, are skipped.
    pub fn prefetch_descriptors(&self, heads: &[u16]) {
        let Area::Host(desc) = &self.desc else {
            return;
        };
        let table = desc.ptr_guard();
        for &h in heads[..heads.len().min(PREFETCH_CHAINS)]
            .iter()
            .filter(|&&h| h < self.size)
        {
            prefetch_line(table.as_ptr().wrapping_add(usize::from(h) * DESC_SIZE as usize));
        }
    }
}

/// The descriptors of one chain, by virtio-queue 0.18's rules (`DescriptorChain`): at most
/// as many as the table holds, one indirect table at most and none inside it, ending early
/// (`None`) at a bad index, an unreadable descriptor, or lengths past `u32::MAX` in total.
/// A caller tells a chain cut short by its last descriptor still having NEXT.
pub struct Chain<'r, 'm, M: GuestMemory + ?Sized + 'm> {
    ring: &'r SplitRing<'m, M>,
    /// The indirect table being walked, if the chain switched to one.
    table: Option<Area<'m, M>>,
    table_size: u16,
    next: u16,
    ttl: u16,
    yielded: u32,
}

impl<M: GuestMemory + ?Sized> Chain<'_, '_, M> {
    #[inline]
    fn read(&self, index: u16) -> Option<Descriptor> {
        let off = u64::from(index) * DESC_SIZE;
        let area = self.table.as_ref().unwrap_or(&self.ring.desc);
        area.read_desc(self.ring.mem(), off).ok()
    }

    /// Follows an indirect descriptor: its table must be a whole number of descriptors, at
    /// most 65 535 of them, and not inside another indirect table.
    fn enter_indirect(&mut self, d: &Descriptor) -> Option<()> {
        if self.table.is_some() || u64::from(d.len()) % DESC_SIZE != 0 {
            return None;
        }
        let n = u16::try_from(u64::from(d.len()) / DESC_SIZE).ok()?;
        self.table = Some(Area::new(self.ring.mem(), d.addr(), u64::from(d.len())));
        self.table_size = n;
        self.next = 0;
        self.ttl = n;
        Some(())
    }
}

impl<M: GuestMemory + ?Sized> Iterator for Chain<'_, '_, M> {
    type Item = Descriptor;

    // Inlined into the TX copy and the RX walk, which call it once per descriptor: nearly
    // every chain is one descriptor, so a call would be a fixed cost on nearly every frame.
    #[inline(always)]
    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.table_size {
                return None;
            }
            let d = self.read(self.next)?;
            if d.refers_to_indirect_table() {
                self.enter_indirect(&d)?;
                continue;
            }
            self.yielded = self.yielded.checked_add(d.len())?;
            if d.has_next() {
                self.next = d.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(d);
        }
    }
}
