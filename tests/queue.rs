//! Queue-level tests: descriptor chains built in mock guest memory with `MockSplitQueue`,
//! well-formed (gaps, indirect tables, merged RX buffers) and malformed (every way a guest can
//! lie), checking the used ring after each event.

use dpaa_vnic::ports::arena::Arena;
use dpaa_vnic::ports::vhost_user::rx_chain::{RxError, RxRun};
use dpaa_vnic::ports::vhost_user::split_ring::{ChainError, SplitRing, MAX_FRAME_DESCS};
use dpaa_vnic::ports::vhost_user::tx_chain::{pop_tx_batch, BatchLimits, TxBatch, TxChain, TX_BATCH};
use dpaa_vnic::ports::vhost_user::used_batch::{put_unwritten, USED_BATCH};
use dpaa_vnic::ports::vhost_user::{pop_ctrl, CtrlChain};
use dpaa_vnic::wire::VirtioNetHdr;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;
const HDR: usize = 12;
const MEM_SIZE: usize = 0x10_0000;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

/// Stores descriptors at chosen table slots and makes `heads` available, in order: full
/// control over chain shapes, loops included.
fn publish(vq: &MockSplitQueue<GuestMemoryMmap>, descs: &[(u16, RawDescriptor)], heads: &[u16]) {
    for (i, desc) in descs {
        vq.desc_table().store(*i, *desc).unwrap();
    }
    for (k, h) in heads.iter().enumerate() {
        vq.avail().ring().ref_at(k).unwrap().store(u16::to_le(*h));
    }
    vq.avail().idx().store(u16::to_le(heads.len() as u16));
}

fn used(vq: &MockSplitQueue<GuestMemoryMmap>, i: usize) -> (u32, u32) {
    let e = vq.used().ring().ref_at(i).unwrap().load();
    (e.id(), e.len())
}

fn used_idx(vq: &MockSplitQueue<GuestMemoryMmap>) -> u16 {
    vq.used().idx().load()
}

fn frame(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// A batch's limits: `frame_max` bytes of room per chain, the workers' budgets.
fn limits(frame_max: usize) -> BatchLimits {
    BatchLimits {
        frame_max,
        chains: 256,
        walk: 8192,
        quiet: false,
        one_desc: true,
    }
}

/// The next TX chain alone, copied into `buf` and returned used: a batch of one.
fn pop_tx(q: &mut Queue, m: &GuestMemoryMmap, buf: &mut [u8]) -> Option<TxChain> {
    let mut batch = TxBatch::default();
    let lim = BatchLimits {
        frame_max: buf.len(),
        chains: 1,
        walk: 8192,
        quiet: false,
        one_desc: true,
    };
    pop_tx_batch(q, m, HDR, buf, lim, &mut batch).unwrap();
    batch.pop()
}

/// One frame written into `q` as the next of `run`, then published, as a run of one.
fn push_in(
    run: &mut RxRun,
    q: &mut Queue,
    m: &GuestMemoryMmap,
    hdr: &VirtioNetHdr,
    f: &[u8],
) -> Result<u16, RxError> {
    let ring = SplitRing::new(q, m).ok_or(RxError::NoBuffers)?;
    let r = run.push(q, &ring, hdr, f);
    run.finish(q, &ring).map_err(RxError::Ring)?;
    r
}

/// One frame written into `q` on its own.
fn push_rx(
    q: &mut Queue,
    m: &GuestMemoryMmap,
    hdr_len: usize,
    mrg: bool,
    hdr: &VirtioNetHdr,
    f: &[u8],
) -> Result<u16, RxError> {
    push_in(&mut RxRun::new(hdr_len, mrg), q, m, hdr, f)
}

#[test]
fn tx_chain_with_gaps_is_gathered_in_order() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let f = frame(100);
    // Header alone, then the frame in two pieces far apart.
    m.write_slice(&[0u8; HDR], GuestAddress(0x2_0000)).unwrap();
    m.write_slice(&f[..30], GuestAddress(0x3_0000)).unwrap();
    m.write_slice(&f[30..], GuestAddress(0x5_0100)).unwrap();
    vq.add_desc_chains(
        &[
            d(0x2_0000, HDR as u32, F_NEXT, 1),
            d(0x3_0000, 30, F_NEXT, 2),
            d(0x5_0100, 70, 0, 0),
        ],
        0,
    )
    .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = vec![0u8; 65_562];
    let t = pop_tx(&mut q, &m, &mut buf).unwrap();
    assert_eq!(t.head, 0);
    let n = t.result.unwrap();
    assert_eq!(n, HDR + 100);
    assert_eq!(&buf[HDR..n], &f[..]);
    assert!(pop_tx(&mut q, &m, &mut buf).is_none());
}

/// The used ring's flags (its first two bytes).
fn used_flags(m: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>) -> u16 {
    m.read_obj(vq.used_addr()).unwrap()
}

/// Poll mode: a batch tells the driver not to kick (VRING_USED_F_NO_NOTIFY), again after
/// the ring was started anew (the flags cleared), and leaves the flags alone with
/// EVENT_IDX, where the driver does not read them.
#[test]
fn a_polled_batch_quiets_the_driver() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = vec![0u8; 4096];
    let mut batch = TxBatch::default();
    let polled = BatchLimits {
        quiet: true,
        ..limits(2048)
    };
    assert_eq!(used_flags(&m, &vq), 0);
    pop_tx_batch(&mut q, &m, HDR, &mut buf, polled, &mut batch).unwrap();
    assert!(batch.is_empty());
    assert_eq!(used_flags(&m, &vq), 1, "NO_NOTIFY, though the ring was empty");
    pop_tx_batch(&mut q, &m, HDR, &mut buf, polled, &mut batch).unwrap();
    assert_eq!(used_flags(&m, &vq), 1);
    m.write_obj(0u16, vq.used_addr()).unwrap();
    pop_tx_batch(&mut q, &m, HDR, &mut buf, polled, &mut batch).unwrap();
    assert_eq!(used_flags(&m, &vq), 1, "quieted again");
    m.write_obj(0u16, vq.used_addr()).unwrap();
    pop_tx_batch(&mut q, &m, HDR, &mut buf, limits(2048), &mut batch).unwrap();
    assert_eq!(used_flags(&m, &vq), 0, "kicked mode leaves it to the event loop");
    q.set_event_idx(true);
    pop_tx_batch(&mut q, &m, HDR, &mut buf, polled, &mut batch).unwrap();
    assert_eq!(used_flags(&m, &vq), 0, "EVENT_IDX: not read by the driver");
}

#[test]
fn tx_indirect_chain() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let f = frame(40);
    let table = GuestAddress(0x6_0000);
    m.write_slice(&[0u8; HDR], GuestAddress(0x4_0000)).unwrap();
    m.write_slice(&f, GuestAddress(0x4_1000)).unwrap();
    m.write_obj(d(0x4_0000, HDR as u32, F_NEXT, 1), table).unwrap();
    m.write_obj(d(0x4_1000, 40, 0, 0), table.unchecked_add(16))
        .unwrap();
    publish(&vq, &[(0, d(table.0, 32, F_INDIRECT, 0))], &[0]);
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = vec![0u8; 65_562];
    let n = pop_tx(&mut q, &m, &mut buf).unwrap().result.unwrap();
    assert_eq!(&buf[HDR..n], &f[..]);
}

/// Each malformed chain is refused with its own error, and the chain after it still works:
/// a bad chain never wedges the queue.
#[test]
fn tx_malformed_chains_are_refused_and_the_queue_goes_on() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    publish(
        &vq,
        &[
            // 0: device-writable descriptor in a TX chain.
            (0, d(0x2_0000, 64, F_WRITE, 0)),
            // 1: address outside guest memory.
            (1, d(MEM_SIZE as u64 + 0x1000, 64, 0, 0)),
            // 2: shorter than the virtio-net header.
            (2, d(0x2_0000, 8, 0, 0)),
            // 3 -> 4 -> 3: a loop.
            (3, d(0x2_0000, 16, F_NEXT, 4)),
            (4, d(0x2_1000, 16, F_NEXT, 3)),
            // 5: a next index beyond the queue.
            (5, d(0x2_0000, 16, F_NEXT, 200)),
            // 6: more bytes than any frame.
            (6, d(0x2_0000, 70_000, 0, 0)),
            // 7: an indirect table that lies outside guest memory.
            (7, d(MEM_SIZE as u64 + 0x10_0000, 32, F_INDIRECT, 0)),
            // 8: finally a good one.
            (8, d(0x2_0000, 60, 0, 0)),
        ],
        &[0, 1, 2, 3, 5, 6, 7, 8],
    );
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = vec![0u8; 65_562];
    let mut results = Vec::new();
    while let Some(t) = pop_tx(&mut q, &m, &mut buf) {
        results.push((t.head, t.result));
    }
    let kinds: Vec<String> = results
        .iter()
        .map(|(h, r)| match r {
            Ok(n) => format!("{h}:ok{n}"),
            Err(ChainError::WrongDirection) => format!("{h}:dir"),
            Err(ChainError::Memory { .. }) => format!("{h}:mem"),
            Err(ChainError::TooShort(_)) => format!("{h}:short"),
            Err(ChainError::Broken) => format!("{h}:broken"),
            Err(ChainError::TooLong(_)) => format!("{h}:long"),
            Err(e) => format!("{h}:{e}"),
        })
        .collect();
    assert_eq!(
        kinds,
        ["0:dir", "1:mem", "2:short", "3:broken", "5:broken", "6:long", "7:broken", "8:ok60"]
    );
    // Every chain, good or bad, went back to the driver.
    assert_eq!(used_idx(&vq), 8);
    assert_eq!(used(&vq, 7), (8, 0));
}

#[test]
fn rx_merges_small_buffers_and_counts_them() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    // Three 64-byte buffers, each its own chain.
    vq.add_desc_chains(
        &[
            d(0x2_0000, 64, F_WRITE, 0),
            d(0x3_0000, 64, F_WRITE, 0),
            d(0x4_0000, 64, F_WRITE, 0),
        ],
        0,
    )
    .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let f = frame(150);
    let hdr = VirtioNetHdr {
        flags: 2,
        ..Default::default()
    };
    assert_eq!(push_rx(&mut q, &m, HDR, true, &hdr, &f).unwrap(), 3);
    assert_eq!(used_idx(&vq), 3);
    assert_eq!(
        [used(&vq, 0), used(&vq, 1), used(&vq, 2)],
        [(0, 64), (1, 64), (2, 34)]
    );
    let mut out = vec![0u8; 192];
    m.read_slice(&mut out[..64], GuestAddress(0x2_0000)).unwrap();
    m.read_slice(&mut out[64..128], GuestAddress(0x3_0000)).unwrap();
    m.read_slice(&mut out[128..], GuestAddress(0x4_0000)).unwrap();
    let h = VirtioNetHdr::parse(&out, HDR).unwrap();
    assert_eq!((h.flags, h.num_buffers), (2, 3));
    assert_eq!(&out[HDR..HDR + 150], &f[..]);
    // Queue empty now: the next frame is refused without touching the used ring.
    assert!(matches!(
        push_rx(&mut q, &m, HDR, true, &hdr, &f),
        Err(RxError::NoBuffers)
    ));
    assert_eq!(used_idx(&vq), 3);
}

#[test]
fn rx_without_mrg_needs_one_big_enough_chain_and_consumes_nothing_otherwise() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x2_0000, 64, F_WRITE, 0), d(0x3_0000, 2048, F_WRITE, 0)], 0)
        .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let hdr = VirtioNetHdr::default();
    // 100 bytes do not fit the first (64-byte) chain: refused, chain put back.
    assert!(matches!(
        push_rx(&mut q, &m, HDR, false, &hdr, &frame(100)),
        Err(RxError::NoBuffers)
    ));
    assert_eq!(used_idx(&vq), 0);
    // A small frame fits it, and the big chain is next.
    assert_eq!(push_rx(&mut q, &m, HDR, false, &hdr, &frame(20)).unwrap(), 1);
    assert_eq!(used(&vq, 0), (0, 32));
    assert_eq!(push_rx(&mut q, &m, HDR, false, &hdr, &frame(100)).unwrap(), 1);
    assert_eq!(used(&vq, 1), (1, 112));
}

#[test]
fn rx_chain_with_a_driver_readable_buffer_is_returned_empty() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x2_0000, 64, 0, 0), d(0x3_0000, 2048, F_WRITE, 0)], 0)
        .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let hdr = VirtioNetHdr::default();
    assert!(matches!(
        push_rx(&mut q, &m, HDR, true, &hdr, &frame(60)),
        Err(RxError::Chain(ChainError::WrongDirection))
    ));
    assert_eq!((used_idx(&vq), used(&vq, 0)), (1, (0, 0)));
    // The next frame lands in the good chain.
    assert_eq!(push_rx(&mut q, &m, HDR, true, &hdr, &frame(60)).unwrap(), 1);
    assert_eq!(used(&vq, 1), (1, 72));
}

/// A burst reads the driver's avail index once, and again only when its frames have taken
/// every chain that index made available.
#[test]
fn rx_burst_reads_the_avail_index_again_only_when_its_chains_are_used_up() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let descs: Vec<(u16, RawDescriptor)> = (0..4u16)
        .map(|i| (i, d(0x2_0000 + u64::from(i) * 0x1000, 2048, F_WRITE, 0)))
        .collect();
    publish(&vq, &descs, &[0, 1]);
    let mut q: Queue = vq.create_queue().unwrap();
    let hdr = VirtioNetHdr::default();
    let mut burst = RxRun::new(HDR, true);
    assert_eq!(push_in(&mut burst, &mut q, &m, &hdr, &frame(60)).unwrap(), 1);
    // An index a whole ring ahead, which a read refuses: the burst does not read it while
    // the chain it knows of is left...
    vq.avail().idx().store(u16::to_le(40));
    assert_eq!(push_in(&mut burst, &mut q, &m, &hdr, &frame(60)).unwrap(), 1);
    // ...and a fresh burst (the next one) does.
    let r = push_rx(&mut q, &m, HDR, true, &hdr, &frame(60));
    assert!(matches!(r, Err(RxError::Ring(_))), "{r:?}");
    // Chains used up: the burst reads the index again, and takes what the driver posted.
    vq.avail().ring().ref_at(2).unwrap().store(u16::to_le(2));
    vq.avail().ring().ref_at(3).unwrap().store(u16::to_le(3));
    vq.avail().idx().store(u16::to_le(4));
    assert_eq!(push_in(&mut burst, &mut q, &m, &hdr, &frame(60)).unwrap(), 1);
    assert_eq!(push_in(&mut burst, &mut q, &m, &hdr, &frame(60)).unwrap(), 1);
    assert!(matches!(
        push_in(&mut burst, &mut q, &m, &hdr, &frame(60)),
        Err(RxError::NoBuffers)
    ));
    assert_eq!(used_idx(&vq), 4);
    assert_eq!((used(&vq, 2), used(&vq, 3)), ((2, 72), (3, 72)));
}

/// The header is written only where the buffer does not hold it already; a buffer holding
/// anything else gets it whole, also when it is split over two descriptors.
#[test]
fn rx_header_overwrites_what_the_buffer_held_before() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(
        &[
            d(0x2_0000, 2048, F_WRITE, 0),
            d(0x3_0000, 5, F_WRITE | F_NEXT, 2),
            d(0x4_0000, 2048, F_WRITE, 0),
            d(0x5_0000, 2048, F_WRITE, 0),
        ],
        0,
    )
    .unwrap();
    m.write_slice(&[0xffu8; 64], GuestAddress(0x2_0000)).unwrap();
    m.write_slice(&[0xffu8; 5], GuestAddress(0x3_0000)).unwrap();
    m.write_slice(&[0xffu8; 64], GuestAddress(0x4_0000)).unwrap();
    let hdr = VirtioNetHdr {
        flags: 2,
        ..Default::default()
    };
    let expect = VirtioNetHdr {
        num_buffers: 1,
        ..hdr
    }
    .to_bytes();
    let mut q: Queue = vq.create_queue().unwrap();
    let mut out = [0u8; HDR + 60];
    for (addr, split) in [(0x2_0000u64, None), (0x3_0000, Some(0x4_0000u64))] {
        assert_eq!(push_rx(&mut q, &m, HDR, true, &hdr, &frame(60)).unwrap(), 1);
        match split {
            None => m.read_slice(&mut out, GuestAddress(addr)).unwrap(),
            Some(rest) => {
                m.read_slice(&mut out[..5], GuestAddress(addr)).unwrap();
                m.read_slice(&mut out[5..], GuestAddress(rest)).unwrap();
            }
        }
        assert_eq!(&out[..HDR], &expect[..HDR], "header at {addr:#x}");
        assert_eq!(&out[HDR..], &frame(60)[..]);
    }
    // A buffer that holds this very header already: the same bytes after.
    m.write_slice(&expect[..HDR], GuestAddress(0x5_0000)).unwrap();
    assert_eq!(push_rx(&mut q, &m, HDR, true, &hdr, &frame(60)).unwrap(), 1);
    m.read_slice(&mut out, GuestAddress(0x5_0000)).unwrap();
    assert_eq!((&out[..HDR], &out[HDR..]), (&expect[..HDR], &frame(60)[..]));
}

#[test]
fn rx_buffer_outside_guest_memory_is_an_error_not_a_crash() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(MEM_SIZE as u64 - 16, 4096, F_WRITE, 0)], 0)
        .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let r = push_rx(&mut q, &m, HDR, true, &VirtioNetHdr::default(), &frame(60));
    assert!(
        matches!(r, Err(RxError::Chain(ChainError::Memory { .. }))),
        "{r:?}"
    );
    // The chain is not left taken: it is returned empty, and the driver told.
    assert_eq!(q.next_avail(), 1);
    assert_eq!(used_idx(&vq), 1);
    assert_eq!(used(&vq, 0), (0, 0));
}

/// RX_PROMISC on, split as Linux sends it: class/cmd, then the data byte, then the ack byte.
/// Writes the command into guest memory and returns its descriptors.
fn promisc_on(m: &GuestMemoryMmap) -> [RawDescriptor; 3] {
    m.write_slice(&[0, 1], GuestAddress(0x2_0000)).unwrap();
    m.write_slice(&[1], GuestAddress(0x2_1000)).unwrap();
    [
        d(0x2_0000, 2, F_NEXT, 1),
        d(0x2_1000, 1, F_NEXT, 2),
        d(0x2_2000, 1, F_WRITE, 0),
    ]
}

/// Pops the `promisc_on` command from head 0 and checks what the control thread reads.
fn pop_promisc_on(q: &mut Queue, m: &GuestMemoryMmap) -> CtrlChain {
    let mut buf = Vec::new();
    let (head, c) = pop_ctrl(q, m, &mut buf, 1 << 20).unwrap().unwrap();
    let c = c.unwrap();
    assert_eq!(
        (head, &buf[..c.len], c.ack),
        (0, &[0u8, 1, 1][..], Some(GuestAddress(0x2_2000)))
    );
    c
}

#[test]
fn ctrl_chain_split_over_descriptors_with_ack() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&promisc_on(&m), 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    pop_promisc_on(&mut q, &m);
}

/// Linux posts every control command through an indirect table when INDIRECT_DESC is
/// negotiated (both attachments offer it): the command reads the same as a direct one.
#[test]
fn ctrl_chain_through_an_indirect_table() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let table = GuestAddress(0x6_0000);
    for (i, desc) in promisc_on(&m).into_iter().enumerate() {
        m.write_obj(desc, table.unchecked_add(16 * i as u64)).unwrap();
    }
    publish(
        &vq,
        &[
            (0, d(table.0, 48, F_INDIRECT, 0)),
            (1, d(0x2_0000, 2, 0, 0)),
            (2, d(MEM_SIZE as u64 + 0x1000, 48, F_INDIRECT, 0)),
        ],
        &[0],
    );
    let mut q: Queue = vq.create_queue().unwrap();
    pop_promisc_on(&mut q, &m);
}

#[test]
fn ctrl_malformed_chains() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(
        &[
            // Readable after writable: layout violation.
            d(0x2_0000, 1, F_WRITE | F_NEXT, 1),
            d(0x2_1000, 2, 0, 0),
            // Bigger than the limit.
            d(0x2_0000, 4096, F_NEXT, 3),
            d(0x2_2000, 1, F_WRITE, 0),
            // The ack byte outside guest memory (found by fuzz target ctrl_chain): refused
            // before the command can be applied.
            d(0x2_0000, 3, F_NEXT, 5),
            d(0x0800_0000_0000_0001, 1, F_WRITE, 0),
        ],
        0,
    )
    .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = Vec::new();
    let (_, r) = pop_ctrl(&mut q, &m, &mut buf, 1024).unwrap().unwrap();
    assert!(matches!(r, Err(ChainError::WrongDirection)));
    let (_, r) = pop_ctrl(&mut q, &m, &mut buf, 1024).unwrap().unwrap();
    assert!(matches!(r, Err(ChainError::TooLong(1024))));
    let (_, r) = pop_ctrl(&mut q, &m, &mut buf, 1024).unwrap().unwrap();
    assert!(
        matches!(
            r,
            Err(ChainError::Memory {
                addr: 0x0800_0000_0000_0001,
                ..
            })
        ),
        "{:?}",
        r.err()
    );
    assert!(pop_ctrl(&mut q, &m, &mut buf, 1024).unwrap().is_none());
    // Putting a popped chain back works as the RX path expects.
    q.go_to_previous_position();
    assert!(pop_ctrl(&mut q, &m, &mut buf, 1 << 20).unwrap().is_some());
}

/// Many MTU-sized frames, each in its own 2 KiB buffer, then one too many.
///
/// MockSplitQueue (virtio-queue 0.18) places its used ring `len` bytes after the avail ring
/// instead of `2 * len`, so the used ring overlaps avail entries from `len / 2` on: tests keep
/// fewer than half the ring in flight.
#[test]
fn rx_fills_every_posted_buffer_then_drops() {
    const POSTED: u64 = 120;
    let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200_0000)]).unwrap();
    let vq = MockSplitQueue::new(&m, 256);
    let descs: Vec<RawDescriptor> = (0..POSTED)
        .map(|i| d(0x10_0000 + i * 0x1_0000, 2048, F_WRITE, 0))
        .collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let f = frame(1500);
    for i in 0..POSTED {
        let r = push_rx(&mut q, &m, HDR, true, &VirtioNetHdr::default(), &f);
        assert!(r.is_ok(), "frame {i}: {r:?}");
    }
    assert_eq!(u64::from(used_idx(&vq)), POSTED);
    assert!(matches!(
        push_rx(&mut q, &m, HDR, true, &VirtioNetHdr::default(), &f),
        Err(RxError::NoBuffers)
    ));
}

/// An indirect table of 65 534 zero-length descriptors and one short one at its end, in
/// guest memory at `table`: the most descriptors one chain can hold (virtio-queue 0.18
/// accepts tables of up to 65 535 entries).
fn zero_length_table(m: &GuestMemoryMmap, table: u64, flags: u16, last_buf: u64) -> u32 {
    const N: u64 = 65_535;
    for i in 0..N - 1 {
        m.write_obj(
            d(0, 0, flags | F_NEXT, (i + 1) as u16),
            GuestAddress(table + 16 * i),
        )
        .unwrap();
    }
    m.write_obj(d(last_buf, 64, flags, 0), GuestAddress(table + 16 * (N - 1)))
        .unwrap();
    (N * 16) as u32
}

/// 64 heads that all point at one indirect table of 65 534 zero-length
/// descriptors. Before, every frame sent to this guest walked all 64 chains (4.2 million
/// descriptors), gave up, rewound and consumed nothing, so the next frame paid again. Now a
/// frame walks at most MAX_FRAME_DESCS + 1 and the chain that went past it is returned
/// empty: each bad chain costs one bounded walk, once.
#[test]
fn rx_zero_length_indirect_tables_cost_one_bounded_walk_each() {
    const HEADS: u16 = 64;
    let m: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x30_0000)]).unwrap();
    let vq = MockSplitQueue::new(&m, 256);
    let len = zero_length_table(&m, 0x10_0000, F_WRITE, 0x20_0000);
    let descs: Vec<(u16, RawDescriptor)> = (0..HEADS)
        .map(|h| (h, d(0x10_0000, len, F_INDIRECT, 0)))
        .collect();
    let heads: Vec<u16> = (0..HEADS).collect();
    publish(&vq, &descs, &heads);

    // What the walk cost before the bound: every descriptor of every chain, per frame.
    let mut peek: Queue = vq.create_queue().unwrap();
    let before: usize = peek.iter(&m).unwrap().map(|c| c.count()).sum();
    assert_eq!(before, HEADS as usize * 65_535);

    let mut q: Queue = vq.create_queue().unwrap();
    let f = frame(1500);
    let hdr = VirtioNetHdr::default();
    let mut total = 0usize;
    for i in 0..HEADS {
        let mut burst = RxRun::new(HDR, true);
        let r = push_in(&mut burst, &mut q, &m, &hdr, &f);
        assert!(
            matches!(r, Err(RxError::Chain(ChainError::TooManyDescriptors))),
            "frame {i}: {r:?}"
        );
        let walked = burst.walked();
        assert_eq!(walked, MAX_FRAME_DESCS + 1, "frame {i}");
        // The chain is consumed, returned empty.
        assert_eq!(used_idx(&vq), i + 1);
        assert_eq!(used(&vq, i as usize), (u32::from(i), 0));
        total += walked;
    }
    // Every bad chain is gone: the next frame costs nothing.
    let mut burst = RxRun::new(HDR, true);
    let r = push_in(&mut burst, &mut q, &m, &hdr, &f);
    assert!(matches!(r, Err(RxError::NoBuffers)));
    assert_eq!(burst.walked(), 0);

    // A benign frame of the largest size, into 1.5 KiB mergeable buffers: the walk a good
    // guest makes the sender pay.
    let mb: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x30_0000)]).unwrap();
    let vb = MockSplitQueue::new(&mb, 256);
    let bufs: Vec<RawDescriptor> = (0..64u64)
        .map(|i| d(0x10_0000 + i * 0x800, 1536, F_WRITE, 0))
        .collect();
    vb.add_desc_chains(&bufs, 0).unwrap();
    let mut qb: Queue = vb.create_queue().unwrap();
    let mut burst = RxRun::new(HDR, true);
    let big = frame(65_535 + 14);
    let n = push_in(&mut burst, &mut qb, &mb, &hdr, &big).unwrap();
    let benign = burst.walked();
    assert_eq!(usize::from(n), benign);
    let per_frame = (MAX_FRAME_DESCS + 1) as f64 / benign as f64;
    eprintln!(
        "rx walk per frame: hostile before {before}, after {} ({:.1}x a benign 64 KiB frame's {benign}); \
         {HEADS} hostile chains cost {total} once in all, then nothing",
        MAX_FRAME_DESCS + 1,
        per_frame
    );
    assert!(per_frame < 8.0, "{per_frame}");
    assert!(before / (MAX_FRAME_DESCS + 1) > 10_000);
}

/// The same table on the TX side: the chain is refused after MAX_FRAME_DESCS + 1
/// descriptors instead of being walked whole, and the queue goes on.
#[test]
fn tx_zero_length_indirect_table_is_refused_after_the_bound() {
    let m: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x30_0000)]).unwrap();
    let vq = MockSplitQueue::new(&m, 16);
    let len = zero_length_table(&m, 0x10_0000, 0, 0x20_0000);
    m.write_slice(&[0u8; HDR], GuestAddress(0x21_0000)).unwrap();
    publish(
        &vq,
        &[(0, d(0x10_0000, len, F_INDIRECT, 0)), (1, d(0x21_0000, 60, 0, 0))],
        &[0, 1],
    );
    let mut q: Queue = vq.create_queue().unwrap();
    let mut buf = vec![0u8; 65_562];
    let t = pop_tx(&mut q, &m, &mut buf).unwrap();
    assert!(
        matches!(t.result, Err(ChainError::TooManyDescriptors)),
        "{:?}",
        t.result
    );
    assert_eq!(t.walked, MAX_FRAME_DESCS + 1);
    let good = pop_tx(&mut q, &m, &mut buf).unwrap();
    assert_eq!((good.head, good.walked), (1, 1));
    assert_eq!(good.result.unwrap(), 60);
}

/// A batch copies its chains back to back into one buffer: good chains,
/// a chain split over descriptors, and refused ones (a device-writable descriptor, a chain
/// shorter than the header, a loop), each returned used with length 0, in order.
#[test]
fn tx_batch_matches_chain_by_chain() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let (f1, f2) = (frame(60), frame(1500));
    m.write_slice(&[0u8; HDR], GuestAddress(0x2_0000)).unwrap();
    m.write_slice(&f1, GuestAddress(0x2_1000)).unwrap();
    m.write_slice(&f2[..700], GuestAddress(0x3_0000)).unwrap();
    m.write_slice(&f2[700..], GuestAddress(0x4_0000)).unwrap();
    publish(
        &vq,
        &[
            (0, d(0x2_0000, HDR as u32, F_NEXT, 1)),
            (1, d(0x2_1000, 60, 0, 0)),
            (2, d(0x2_0000, HDR as u32, F_NEXT, 3)),
            (3, d(0x3_0000, 700, F_NEXT, 4)),
            (4, d(0x4_0000, 800, 0, 0)),
            (5, d(0x2_1000, 60, F_WRITE, 0)),
            (6, d(0x2_0000, 4, 0, 0)),
            (7, d(0x2_0000, HDR as u32, F_NEXT, 7)),
            (8, d(0x2_0000, HDR as u32, F_NEXT, 9)),
            (9, d(0x2_1000, 60, 0, 0)),
        ],
        &[0, 2, 5, 6, 7, 8],
    );
    let mut q: Queue = vq.create_queue().unwrap();
    let frame_max = 65_562;
    let mut buf = vec![0u8; frame_max + 64 * 1024];
    let mut batch = TxBatch::default();
    pop_tx_batch(&mut q, &m, HDR, &mut buf, limits(frame_max), &mut batch).unwrap();
    assert_eq!(batch.len(), 6);
    let heads: Vec<u16> = batch.slots().iter().map(|s| s.chain.head).collect();
    assert_eq!(heads, [0, 2, 5, 6, 7, 8]);
    let result = |i: usize| batch.slots()[i].chain.result.as_ref();
    let at = |i: usize| {
        let start = batch.slots()[i].start;
        &buf[start + HDR..start + result(i).unwrap()]
    };
    assert_eq!(at(0), &f1[..]);
    assert_eq!(at(1), &f2[..]);
    assert!(matches!(result(2), Err(ChainError::WrongDirection)));
    assert!(matches!(result(3), Err(ChainError::TooShort(4))));
    assert!(matches!(result(4), Err(ChainError::Broken)));
    assert_eq!(at(5), &f1[..]);
    assert_eq!(batch.slots()[1].start, HDR + 60, "back to back");
    assert_eq!(used_idx(&vq), 6, "every chain returned, refused ones too");
    for (i, h) in heads.iter().enumerate() {
        assert_eq!(used(&vq, i), (u32::from(*h), 0));
    }
    // Split off the arena as a worker does, good chains only: the same bytes, each chain
    // starting where the ones before it end.
    let copy = buf.clone();
    let mut arena = Arena::new(&mut buf);
    let mut taken = 0;
    for s in batch.slots() {
        if let Ok(n) = s.chain.result {
            let start = s.start;
            assert_eq!(start, taken);
            let slot = arena.take(n).unwrap();
            assert_eq!(&slot[..], &copy[start..start + n]);
            taken += n;
        }
    }
    pop_tx_batch(&mut q, &m, HDR, &mut buf, limits(frame_max), &mut batch).unwrap();
    assert!(batch.is_empty());
}

/// Chains returned with length 0 in one copy: more than the copy holds are refused, and
/// then nothing is written.
#[test]
fn returning_more_chains_than_one_copy_holds_is_refused() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    let q: Queue = vq.create_queue().unwrap();
    let ring = SplitRing::new(&q, &m).unwrap();
    let n = USED_BATCH as u16;
    assert!(put_unwritten(&ring, 0, 1..n + 2).is_err());
    assert!((0..=n).all(|i| used(&vq, usize::from(i)) == (0, 0)));
    put_unwritten(&ring, 0, 1..n + 1).unwrap();
    assert!((0..n).all(|i| used(&vq, usize::from(i)) == (u32::from(i) + 1, 0)));
    assert_eq!(used(&vq, usize::from(n)), (0, 0));
}

/// A batch stops at its chain budget, its walk budget, and when the buffer has no room left
/// for another chain's worst case; the rest waits in the ring for the next batch.
#[test]
fn tx_batch_stops_at_its_limits() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 128);
    let f = frame(60);
    m.write_slice(&[0u8; HDR], GuestAddress(0x2_0000)).unwrap();
    m.write_slice(&f, GuestAddress(0x2_1000)).unwrap();
    let mut descs = Vec::new();
    for i in 0..40u16 {
        descs.push((2 * i, d(0x2_0000, HDR as u32, F_NEXT, 2 * i + 1)));
        descs.push((2 * i + 1, d(0x2_1000, 60, 0, 0)));
    }
    let heads: Vec<u16> = (0..40).map(|i| 2 * i).collect();
    publish(&vq, &descs[..], &heads);
    let mut q: Queue = vq.create_queue().unwrap();
    let frame_max = 1000;
    let mut buf = vec![0u8; 4000];
    let mut batch = TxBatch::default();
    let mut pop = |lim: BatchLimits| {
        pop_tx_batch(&mut q, &m, HDR, &mut buf, lim, &mut batch).unwrap();
        batch.len()
    };
    // At most TX_BATCH chains, whatever the budget.
    assert_eq!(pop(limits(frame_max)), TX_BATCH);
    // The chain budget.
    let chains = BatchLimits {
        chains: 3,
        ..limits(frame_max)
    };
    assert_eq!(pop(chains), 3);
    // The walk budget: two descriptors per chain, so the second chain goes past 3.
    let walk = BatchLimits {
        walk: 3,
        ..limits(frame_max)
    };
    assert_eq!(pop(walk), 2);
    // Room: 4000 bytes hold 72-byte chains until fewer than 1000 are left.
    let mut small = vec![0u8; 1100];
    pop_tx_batch(&mut q, &m, HDR, &mut small, limits(frame_max), &mut batch).unwrap();
    assert_eq!(batch.len(), 2, "1100 - 72 = 1028 >= 1000, then 956 < 1000");
    assert_eq!(used_idx(&vq), 39);
}
