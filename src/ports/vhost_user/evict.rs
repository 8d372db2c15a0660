//! Cache hints for the control queue: handing guest lines back after the daemon has read
//! them, and fetching the lines of the next command together.
//!
//! A driver rebuilds its MAC table in the same pages for every command of a join storm. Once
//! the daemon has read a table, its core holds copies of those lines, and each line the
//! guest writes next must first be taken back from that other core. CLFLUSH writes each line
//! back and drops it from every cache, so the guest's next writes find it in memory instead.
//! Only the tables are flushed, once the command is returned: flushing the small lines the
//! guest reads straight away (ack, used ring) or rewrites (descriptors) did not help
//! (docs/benchmarks.md, "Closing in on the in-process answer"). A flush never changes what
//! memory holds: this is a performance hint only.

use vm_memory::{GuestAddress, GuestMemory, Permissions};

/// Readable buffers at least this long are handed back: a table, not a one-byte flag.
pub const EVICT_MIN: u32 = 512;
/// At most this many buffers per command (MAC_TABLE_SET has two tables).
const EVICT_MAX: usize = 4;

/// The large buffers one control command was read from; no allocation.
#[derive(Debug, Default, Clone, Copy)]
pub struct EvictList {
    ranges: [(GuestAddress, u32); EVICT_MAX],
    n: usize,
}

impl EvictList {
    /// Notes a buffer the daemon read; small ones and those past EVICT_MAX are skipped.
    pub fn note(&mut self, addr: GuestAddress, len: u32) {
        if len >= EVICT_MIN && self.n < EVICT_MAX {
            self.ranges[self.n] = (addr, len);
            self.n += 1;
        }
    }

    pub fn ranges(&self) -> &[(GuestAddress, u32)] {
        &self.ranges[..self.n]
    }

    /// Flushes every noted buffer's lines from the caches. Ranges that are not guest memory
    /// (the chain was read, so they are, unless the map changed since) are skipped.
    pub fn evict<M: GuestMemory>(&self, mem: &M) {
        for &(addr, len) in self.ranges() {
            let Ok(slices) = mem.get_slices(addr, len as usize, Permissions::Read) else {
                continue;
            };
            for slice in slices.flatten() {
                let guard = slice.ptr_guard();
                // SAFETY: the slice is guest memory that `mem` (borrowed for this call) keeps
                // mapped, and `guard` keeps the pointer valid for `slice.len()` bytes.
                unsafe { flush_lines(guard.as_ptr(), slice.len()) };
            }
        }
    }
}

/// The lines the next control command will most likely be read from. Linux takes the same
/// head descriptor and the same control buffer (header and ack share a struct) for every
/// command, and allocates its indirect descriptor table from a slab that hands the last one
/// back (most often the same address in a join storm, always when nothing else allocates
/// in between), so these are the lines of the last command. Popping
/// a command reads them one after another, each behind the read before it (the avail entry
/// names the descriptor, the descriptor the indirect table, the table the buffer), and each
/// is a line the guest has just written on its own core. Prefetched together as soon as the
/// avail index moves, they cross in parallel: `cargo bench --bench ctrl` measures the
/// one-byte command's round trip in blocks alternating with a baseline without it
/// (docs/benchmarks.md). A wrong guess costs one useless prefetch.
#[derive(Debug, Default, Clone, Copy)]
pub struct NextLines {
    lines: [Option<GuestAddress>; 3],
}

impl NextLines {
    /// Remembers the last command's head descriptor, its indirect table if it had one, and
    /// its ack byte.
    pub fn note(
        &mut self,
        desc: Option<GuestAddress>,
        indirect: Option<GuestAddress>,
        ack: Option<GuestAddress>,
    ) {
        self.lines = [desc, indirect, ack];
    }

    /// Starts fetching the remembered lines. Addresses outside guest memory are skipped.
    pub fn prefetch<M: GuestMemory>(&self, mem: &M) {
        for addr in self.lines.iter().flatten() {
            let Ok(slices) = mem.get_slices(*addr, 1, Permissions::Read) else {
                continue;
            };
            for slice in slices.flatten() {
                prefetch_line(slice.ptr_guard().as_ptr());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn prefetch_line(p: *const u8) {
    // SAFETY: PREFETCHT0 (SSE, which every x86_64 CPU has) is a hint: it reads nothing the
    // program sees and never faults, whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch_line(_p: *const u8) {}

/// # Safety
/// `base..base + len` must be mapped memory for the whole call.
#[cfg(target_arch = "x86_64")]
unsafe fn flush_lines(base: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        // SAFETY: CLFLUSH is part of SSE2, which every x86_64 CPU has; `base + off` lies in
        // the mapped range the caller vouches for, and a flush does not change memory.
        unsafe { std::arch::x86_64::_mm_clflush(base.add(off)) };
    }
}

/// # Safety
/// Nothing is touched; the signature matches the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn flush_lines(_base: *const u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    #[test]
    fn notes_only_large_buffers_and_at_most_four() {
        let mut l = EvictList::default();
        l.note(GuestAddress(0), 1);
        l.note(GuestAddress(0x100), EVICT_MIN - 1);
        for i in 0..6 {
            l.note(GuestAddress(0x1000 * i), 6000);
        }
        assert_eq!(l.ranges().len(), EVICT_MAX);
        assert_eq!(l.ranges()[0], (GuestAddress(0), 6000));
    }

    #[test]
    fn prefetching_skips_what_is_not_guest_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut n = NextLines::default();
        n.prefetch(&mem);
        n.note(Some(GuestAddress(0x1000)), None, Some(GuestAddress(0x2_0000)));
        n.prefetch(&mem);
        assert_eq!(
            n.lines,
            [Some(GuestAddress(0x1000)), None, Some(GuestAddress(0x2_0000))]
        );
    }

    #[test]
    fn eviction_keeps_contents_and_skips_unmapped_ranges() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        mem.write_slice(&data, GuestAddress(0x1000)).unwrap();
        let mut l = EvictList::default();
        l.note(GuestAddress(0x1003), 6000);
        l.note(GuestAddress(0xf000), 0x2000); // runs past the end of guest memory
        l.evict(&mem);
        let mut back = vec![0u8; 6000];
        mem.read_slice(&mut back, GuestAddress(0x1000)).unwrap();
        assert_eq!(back, data);
    }
}
