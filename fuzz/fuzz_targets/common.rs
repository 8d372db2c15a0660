//! A split virtqueue of 16 entries laid out in fresh guest memory, its descriptor table and
//! available ring written straight from the fuzzer's bytes: every shape a driver can make,
//! loops, indirect tables and wild addresses included.

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub const QSIZE: u16 = 16;
pub const MEM: usize = 0x4_0000;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// Where the rest of the input lands: buffers and indirect tables the descriptors may name.
pub const DATA: u64 = 0x1_0000;

/// Guest memory and a ready queue built from `data`: 256 bytes of descriptor table, then
/// the number of available heads and the heads (2 bytes each), then the data area.
pub fn queue(data: &[u8]) -> Option<(GuestMemoryMmap, Queue)> {
    let (table, rest) = data.split_at_checked(16 * usize::from(QSIZE))?;
    let (&n, rest) = rest.split_first()?;
    let heads = usize::from(n % (QSIZE as u8 + 1));
    let (ring, rest) = rest.split_at_checked(2 * heads)?;
    let m: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).ok()?;
    m.write_slice(table, GuestAddress(DESC)).ok()?;
    m.write_slice(ring, GuestAddress(AVAIL + 4)).ok()?;
    m.write_obj(heads as u16, GuestAddress(AVAIL + 2)).ok()?;
    let area = rest.len().min(MEM - DATA as usize);
    m.write_slice(&rest[..area], GuestAddress(DATA)).ok()?;
    let mut q = Queue::new(QSIZE).ok()?;
    q.set_size(QSIZE);
    q.set_desc_table_address(Some(DESC as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    q.set_used_ring_address(Some(USED as u32), Some(0));
    q.set_ready(true);
    Some((m, q))
}

/// Every byte of the guest memory [`queue`] made.
#[allow(dead_code)] // not every target compares memories
pub fn bytes(m: &GuestMemoryMmap) -> Vec<u8> {
    let mut b = vec![0u8; MEM];
    let _ = m.read_slice(&mut b, GuestAddress(0));
    b
}
