//! `ring::SplitRing` against virtio-queue 0.18 itself: the same random ring, good and bad
//! (loops, indexes past the table, nested and odd-sized indirect tables, buffers outside
//! memory, an avail index too far ahead), read both ways, must give the same chains, and
//! returning them both ways must leave the same used ring and the same interrupt decision.
//! A prefetch of any of it first changes none of that. The one-descriptor lanes of the TX
//! copy and the RX write do on such rings exactly what the general walks do, and so does
//! the single copy (a frame's rest left in its sender's buffer, then written from there).

use dpaa_vnic::pipeline::BurstFrame;
use dpaa_vnic::ports::vhost_user::rx_chain::{RxError, RxRun};
use dpaa_vnic::ports::vhost_user::split_ring::{
    wants_interrupt_after, GuestBuffers, SplitRing, HEADS_AT_ONCE,
};
use dpaa_vnic::ports::vhost_user::tx_chain::{
    pop_tx_batch, return_tx_chains, take_tx_batch, BatchLimits, TxBatch,
};
use dpaa_vnic::ports::vhost_user::used_batch::{put_unwritten, UsedBatch};
use dpaa_vnic::wire::virtio_net_hdr::F_DATA_VALID;
use dpaa_vnic::wire::VirtioNetHdr;
use proptest::prelude::*;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

const SIZE: u16 = 16;
const MEM: usize = 0x1_0000;
/// Where indirect tables may point: 64 random descriptors live here.
const TABLES: u64 = 0x8000;
const TABLE_SLOTS: u16 = 64;

/// One random ring: the descriptor table, the spare descriptors indirect tables point into,
/// the avail entries, the avail index, and `used_event`.
#[derive(Debug, Clone)]
struct Layout {
    table: Vec<(u64, u32, u16, u16)>,
    spare: Vec<(u64, u32, u16, u16)>,
    heads: Vec<u16>,
    avail_idx: u16,
    used_event: u16,
    event_idx: bool,
}

fn desc() -> impl Strategy<Value = (u64, u32, u16, u16)> {
    let addr = prop_oneof![
        Just(TABLES),
        Just(TABLES + 16 * 8),
        (0x1000u64..0x1_1000),
        Just(MEM as u64 - 8),
        Just(u64::MAX - 4),
    ];
    let len = prop_oneof![(0u32..0x200), Just(16), Just(32), Just(48), Just(u32::MAX)];
    let flags = 0u16..8; // NEXT, WRITE, INDIRECT in any mix
    let next = 0u16..SIZE + 2;
    (addr, len, flags, next)
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        prop::collection::vec(desc(), SIZE as usize),
        prop::collection::vec(desc(), TABLE_SLOTS as usize),
        prop::collection::vec(0u16..SIZE + 2, SIZE as usize),
        prop_oneof![0u16..=SIZE, Just(SIZE + 1), Just(u16::MAX)],
        any::<u16>(),
        any::<bool>(),
    )
        .prop_map(|(table, spare, heads, avail_idx, used_event, event_idx)| Layout {
            table,
            spare,
            heads,
            avail_idx,
            used_event,
            event_idx,
        })
}

fn raw((addr, len, flags, next): (u64, u32, u16, u16)) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, next))
}

/// Where the rings live. Laid out here, not by `MockSplitQueue`: virtio-queue 0.18's mock
/// puts the used ring over the avail ring's second half (its `AvailRing::end` counts one byte
/// per entry), which random avail entries would overwrite.
const DESC: u64 = 0;
const AVAIL: u64 = 0x400;
const USED: u64 = 0x800;

/// A started queue of `SIZE` entries at `desc`, `avail`, `used`.
fn queue(desc: u64, avail: u64, used: u64) -> Queue {
    let mut q = Queue::new(SIZE).unwrap();
    q.set_size(SIZE);
    q.try_set_desc_table_address(GuestAddress(desc)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(avail)).unwrap();
    q.try_set_used_ring_address(GuestAddress(used)).unwrap();
    q.set_ready(true);
    q
}

/// Guest memory holding the layout, and its queue, started.
fn build(l: &Layout) -> (GuestMemoryMmap, Queue) {
    let m: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let put = |at: u64, v: u16| m.write_obj(u16::to_le(v), GuestAddress(at)).unwrap();
    for (i, d) in l.table.iter().enumerate() {
        m.write_obj(raw(*d), GuestAddress(DESC + 16 * i as u64)).unwrap();
    }
    for (k, h) in l.heads.iter().enumerate() {
        put(AVAIL + 4 + 2 * k as u64, *h);
    }
    put(AVAIL + 2, l.avail_idx);
    put(AVAIL + 4 + 2 * u64::from(SIZE), l.used_event);
    for (i, d) in l.spare.iter().enumerate() {
        m.write_obj(raw(*d), GuestAddress(TABLES + 16 * i as u64))
            .unwrap();
    }
    let mut q = queue(DESC, AVAIL, USED);
    q.set_event_idx(l.event_idx);
    (m, q)
}

type Seen = Vec<(u64, u32, u16, u16)>;

fn seen(it: impl Iterator<Item = Descriptor>) -> Seen {
    it.map(|d| (d.addr().0, d.len(), d.flags(), d.next())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn reads_and_returns_chains_as_virtio_queue_does(l in layout(), used_start in any::<u16>()) {
        let (m1, mut q1) = build(&l);
        let (m2, mut q2) = build(&l);
        // Returned from anywhere in the ring: a run that wraps past its end. The used index
        // in memory says the ring was used that far.
        let used_so_far = |m: &GuestMemoryMmap| m.write_obj(u16::to_le(used_start), GuestAddress(USED + 2)).unwrap();
        q1.set_next_used(used_start);
        q2.set_next_used(used_start);
        used_so_far(&m1);
        used_so_far(&m2);

        // virtio-queue: every available chain, then each returned with its length.
        let theirs: Result<Vec<(u16, Seen)>, _> = q1
            .iter(&m1)
            .map(|it| it.map(|c| (c.head_index(), seen(c))).collect());

        let ring = SplitRing::new(&q2, &m2).expect("started");
        // A prefetch of anything on this ring, good or bad, from any position, must neither
        // fail nor change what is read after it.
        for (from, n) in [(q2.next_avail(), usize::from(l.avail_idx)), (l.used_event, usize::MAX)] {
            if let Ok(heads) = ring.heads(from, n) {
                ring.prefetch_descriptors(&heads);
            }
        }
        let ours: Result<Vec<(u16, Seen)>, _> = ring.avail_idx(q2.next_avail()).map(|end| {
            let mut pos = q2.next_avail();
            let mut v = Vec::new();
            while pos != end {
                let head = ring.head(pos).expect("avail ring in memory");
                v.push((head, seen(ring.chain(head))));
                pos = pos.wrapping_add(1);
            }
            v
        });
        // The heads read at once are the ones read one by one.
        if let Ok(end) = ring.avail_idx(q2.next_avail()) {
            let n = usize::from(end.wrapping_sub(q2.next_avail()));
            let at_once = ring.heads(q2.next_avail(), n).expect("avail ring in memory");
            prop_assert_eq!(at_once.len(), n.min(HEADS_AT_ONCE));
            for (i, h) in at_once.iter().enumerate() {
                prop_assert_eq!(Some(*h), ring.head(q2.next_avail().wrapping_add(i as u16)).ok());
            }
        }
        match (&theirs, &ours) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => return Ok(()),
            _ => prop_assert!(false, "virtio-queue {:?}, ours {:?}", theirs.is_ok(), ours.is_ok()),
        }
        let chains = ours.unwrap();

        // Returned: virtio-queue's add_used one by one, ours staged, written together
        // (wrapping the ring when the used index lies near its end), then published once.
        let mut refused = (0, 0);
        let mut batch = UsedBatch::default();
        for (i, (head, descs)) in chains.iter().enumerate() {
            let len = descs.iter().map(|d| d.1).fold(0u32, u32::wrapping_add);
            let a = q1.add_used(&m1, *head, len).is_ok();
            let b = batch.put(&ring, q2.next_used().wrapping_add(i as u16), *head, len).is_ok();
            prop_assert_eq!(a, b, "head {}", head);
            if !a {
                refused.0 += 1;
                break;
            }
            refused.1 += 1;
        }
        batch.write(&ring).unwrap();
        let added = refused.1 as u16;
        let end = q2.next_used().wrapping_add(added);
        ring.publish_used(end).unwrap();
        q2.set_next_avail(q2.next_avail().wrapping_add(chains.len() as u16));
        q2.set_next_used(end);
        prop_assert_eq!(q1.next_used(), q2.next_used());
        let used = |m: &GuestMemoryMmap, q: &Queue| {
            let mut b = vec![0u8; 4 + 8 * SIZE as usize];
            m.read_slice(&mut b, GuestAddress(q.used_ring())).unwrap();
            b
        };
        prop_assert_eq!(used(&m1, &q1), used(&m2, &q2));

        // The interrupt decision for what was just added.
        if l.event_idx {
            let theirs = q1.needs_notification(&m1).unwrap();
            let ours = wants_interrupt_after(&q2, &m2, added).unwrap();
            prop_assert_eq!(theirs, ours);
        }
    }
}

/// A ring that does not lie in one memory region is still served, access by access.
#[test]
fn a_ring_across_two_regions_is_read_through_guest_memory() {
    let m: GuestMemoryMmap =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1_0000)]).unwrap();
    // The descriptor table (16 x 16 bytes at 0xf80) crosses from the first region into the next.
    for i in 0..SIZE {
        let d = raw((0x4000 + 0x100 * u64::from(i), 64, 0, 0));
        m.write_obj(d, GuestAddress(0xf80 + 16 * u64::from(i))).unwrap();
        m.write_obj(u16::to_le(i), GuestAddress(0x2004 + 2 * u64::from(i)))
            .unwrap();
    }
    m.write_obj(u16::to_le(SIZE), GuestAddress(0x2002)).unwrap();
    let q = queue(0xf80, 0x2000, 0x3000);
    let ring = SplitRing::new(&q, &m).unwrap();
    let end = ring.avail_idx(0).unwrap();
    assert_eq!(end, SIZE);
    let heads = ring.heads(0, usize::from(SIZE)).unwrap();
    assert_eq!(heads.to_vec(), (0..SIZE).collect::<Vec<_>>());
    ring.prefetch_descriptors(&heads);
    for pos in 0..SIZE {
        let head = ring.head(pos).unwrap();
        assert_eq!(
            seen(ring.chain(head)),
            vec![(0x4000 + 0x100 * u64::from(pos), 64, 0, 0)]
        );
    }
}

/// Three regions with a gap between the last two, and ranges in each, across two, in the
/// gap and past the end.
fn buffer_range() -> impl Strategy<Value = (u64, usize)> {
    let addr = prop_oneof![
        0u64..0x1000,
        0x1000u64..0x3000,
        0x4000u64..0x5000,
        Just(0xfff),
        Just(0x2fff),
        Just(0x3000),
        Just(0x4fff),
        Just(u64::MAX - 2),
    ];
    (addr, prop_oneof![0usize..0x40, Just(0x1000), Just(0x2001)])
}

proptest! {
    /// The region cache answers every look-up of a sequence as vm-memory's own look-up
    /// does: the same host bytes, or none where a range is not one region's.
    #[test]
    fn guest_buffers_find_what_vm_memory_finds(ranges in prop::collection::vec(buffer_range(), 1..40)) {
        let m: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x2000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap();
        let bufs = GuestBuffers::new(&m);
        for (addr, len) in ranges {
            let at = GuestAddress(addr);
            let got = bufs.slice(at, len).map(|s| (s.ptr_guard().as_ptr() as usize, s.len()));
            let want = m.get_slice(at, len).ok().map(|s| (s.ptr_guard().as_ptr() as usize, s.len()));
            prop_assert_eq!(got, want, "{:#x}+{:#x}", addr, len);
        }
    }
}

proptest! {
    /// A TX batch's chains, returned with length 0 in one copy (`put_unwritten`), are
    /// where virtio-queue's `add_used` puts them, from anywhere in the ring; with a head
    /// past the ring the batch is refused and nothing is written.
    #[test]
    fn chains_returned_unwritten_land_where_virtio_queue_puts_them(
        l in layout(),
        used_start in any::<u16>(),
        heads in prop::collection::vec(0..SIZE + 2, 0..=usize::from(SIZE)),
    ) {
        let (m1, mut q1) = build(&l);
        let (m2, q2) = build(&l);
        q1.set_next_used(used_start);
        let before = bytes(&m2);
        let ring = SplitRing::new(&q2, &m2).expect("started");
        let ours = put_unwritten(&ring, used_start, heads.iter().copied());
        if heads.iter().any(|&h| h >= SIZE) {
            prop_assert!(ours.is_err());
            prop_assert_eq!(bytes(&m2), before);
        } else {
            prop_assert!(ours.is_ok());
            for &h in &heads {
                q1.add_used(&m1, h, 0).unwrap();
            }
            // virtio-queue publishes its index with each element; ours is published later.
            m1.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
            m2.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
            prop_assert_eq!(bytes(&m1), bytes(&m2));
        }
    }
}

/// Every byte of guest memory.
fn bytes(m: &GuestMemoryMmap) -> Vec<u8> {
    let mut b = vec![0u8; MEM];
    m.read_slice(&mut b, GuestAddress(0)).unwrap();
    b
}

/// `l` with the table entries `plain` marks made chains of one descriptor (flags `flags`,
/// at least `min_len` bytes), the shape the lanes take; addresses stay as drawn, inside
/// memory or not.
fn with_plain(mut l: Layout, plain: u16, flags: u16, min_len: u32) -> Layout {
    for (i, d) in l.table.iter_mut().enumerate() {
        if plain & (1 << i) != 0 {
            d.1 = d.1.max(min_len);
            d.2 = flags;
        }
    }
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// The RX lane: frame after frame into one run, the same results, the same walk
    /// counted, the same ring positions, the same bytes in memory, the same publication.
    #[test]
    fn the_rx_lane_writes_what_the_general_walk_writes(
        l in layout(),
        plain in any::<u16>(),
        lens in prop::collection::vec(prop_oneof![0usize..0x40, 0usize..0x600], 1..8),
        hdr_len in prop_oneof![Just(10usize), Just(12), Just(20)],
        mrg in any::<bool>(),
    ) {
        // VRING_DESC_F_WRITE alone.
        let l = with_plain(l, plain, 2, 0x60);
        let (m1, mut q1) = build(&l);
        let (m2, mut q2) = build(&l);
        let r1 = SplitRing::new(&q1, &m1).expect("started");
        let r2 = SplitRing::new(&q2, &m2).expect("started");
        let mut lane = RxRun::new(hdr_len, mrg);
        let mut walk = RxRun::new(hdr_len, mrg).general_only();
        let hdr = VirtioNetHdr { flags: 2, gso_type: 0, hdr_len: 14, ..Default::default() };
        for (k, len) in lens.iter().enumerate() {
            let frame: Vec<u8> = (0..*len).map(|i| (i * 7 + k) as u8).collect();
            let a = lane.push(&mut q1, &r1, &hdr, &frame);
            let b = walk.push(&mut q2, &r2, &hdr, &frame);
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "frame {}", k);
            prop_assert_eq!(lane.walked(), walk.walked());
            prop_assert_eq!((q1.next_avail(), q1.next_used()), (q2.next_avail(), q2.next_used()));
        }
        let a = lane.finish(&q1, &r1);
        let b = walk.finish(&q2, &r2);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        prop_assert!(bytes(&m1) == bytes(&m2), "guest memory differs");
    }

    /// The TX lane: batch after batch, the same chains with the same results and walks,
    /// the same bytes copied, the same ring positions and used ring.
    #[test]
    fn the_tx_lane_copies_what_the_general_walk_copies(
        l in layout(),
        plain in any::<u16>(),
        frame_max in prop_oneof![Just(0x40usize), Just(0x200), Just(0x1000)],
        hdr_len in prop_oneof![Just(10usize), Just(12), Just(20)],
    ) {
        let l = with_plain(l, plain, 0, 0);
        let (m1, mut q1) = build(&l);
        let (m2, mut q2) = build(&l);
        let limits = |one_desc| BatchLimits { frame_max, chains: 256, walk: 8192, quiet: false, one_desc };
        let (mut b1, mut b2) = (vec![0u8; 0x4000], vec![0u8; 0x4000]);
        let (mut s1, mut s2) = (TxBatch::default(), TxBatch::default());
        for _ in 0..3 {
            let a = pop_tx_batch(&mut q1, &m1, hdr_len, &mut b1, limits(true), &mut s1);
            let b = pop_tx_batch(&mut q2, &m2, hdr_len, &mut b2, limits(false), &mut s2);
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
            prop_assert_eq!(format!("{s1:?}"), format!("{s2:?}"));
            prop_assert!(b1 == b2, "copied bytes differ");
            prop_assert_eq!((q1.next_avail(), q1.next_used()), (q2.next_avail(), q2.next_used()));
            if a.is_err() || s1.is_empty() {
                break;
            }
        }
        prop_assert!(bytes(&m1) == bytes(&m2), "guest memory differs");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// The single copy, receive side: a plain frame whose bytes after `cut` are still in
    /// its sender's buffer is written, by the lane and by the general walk, as the whole
    /// frame is: the same results, ring positions and bytes in memory.
    #[test]
    fn a_frame_left_partly_in_its_senders_buffer_is_written_as_a_whole_one(
        l in layout(),
        plain in any::<u16>(),
        frames in prop::collection::vec((0usize..0x600, any::<prop::sample::Index>()), 1..8),
        hdr_len in prop_oneof![Just(10usize), Just(12), Just(20)],
        mrg in any::<bool>(),
        general in any::<bool>(),
        valid in any::<bool>(),
    ) {
        let l = with_plain(l, plain, 2, 0x60);
        // A checksum action's DATA_VALID, or no flag at all.
        let flags = if valid { F_DATA_VALID } else { 0 };
        let hdr = VirtioNetHdr { flags, ..VirtioNetHdr::default() };
        let (m1, mut q1) = build(&l);
        let (m2, mut q2) = build(&l);
        let r1 = SplitRing::new(&q1, &m1).expect("started");
        let r2 = SplitRing::new(&q2, &m2).expect("started");
        let run = || if general { RxRun::new(hdr_len, mrg).general_only() } else { RxRun::new(hdr_len, mrg) };
        let (mut split, mut whole) = (run(), run());
        for (k, (len, cut)) in frames.iter().enumerate() {
            let frame: Vec<u8> = (0..*len).map(|i| (i * 7 + k) as u8).collect();
            let cut = cut.index(len + 1);
            // The room's bytes past the cut are not the frame's: reading them shows.
            let mut room = frame.clone();
            room[cut..].fill(0xee);
            let mut sent = frame.clone();
            let rest = VolatileSlice::from(&mut sent[cut..]);
            let mut f = BurstFrame::with_rest(&mut room, rest).expect("a rest within the frame");
            let a = split.push_plain(&mut q1, &r1, &mut f, flags);
            let b = whole.push(&mut q2, &r2, &hdr, &frame);
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "frame {}", k);
            prop_assert_eq!((q1.next_avail(), q1.next_used()), (q2.next_avail(), q2.next_used()));
        }
        let a = split.finish(&q1, &r1);
        let b = whole.finish(&q2, &r2);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        prop_assert!(bytes(&m1) == bytes(&m2), "guest memory differs");
    }

    /// The single copy, transmit side: a batch taken with a copy limit copies each chain's
    /// first bytes, says where the rest of a longer one-descriptor chain lies, and shows the
    /// driver nothing (the used index stays) until the chains are given back; the rests read from there and the bytes copied make
    /// what a whole copy makes, and giving the batch back leaves the used ring a whole
    /// batch leaves.
    #[test]
    fn a_batch_taken_with_a_copy_limit_is_the_whole_batch_once_its_rests_are_read(
        l in layout(),
        plain in any::<u16>(),
        limit in 0usize..0x300,
        frame_max in prop_oneof![Just(0x40usize), Just(0x200), Just(0x1000)],
        hdr_len in prop_oneof![Just(10usize), Just(12), Just(20)],
    ) {
        let l = with_plain(l, plain, 0, 0);
        let (m1, mut q1) = build(&l);
        let (m2, mut q2) = build(&l);
        let limits = BatchLimits { frame_max, chains: 256, walk: 8192, quiet: false, one_desc: true };
        let (mut b1, mut b2) = (vec![0u8; 0x4000], vec![0u8; 0x4000]);
        let (mut s1, mut s2) = (TxBatch::default(), TxBatch::default());
        let copy_limit = hdr_len + limit;
        for _ in 0..3 {
            let used_at = GuestAddress(q1.used_ring().wrapping_add(2));
            let used_idx = || m1.read_obj::<u16>(used_at).ok();
            let before = used_idx();
            let r1 = SplitRing::new(&q1, &m1).expect("started");
            let a = take_tx_batch(&mut q1, &r1, hdr_len, copy_limit, &mut b1, limits, &mut s1);
            let b = pop_tx_batch(&mut q2, &m2, hdr_len, &mut b2, limits, &mut s2);
            prop_assert_eq!(used_idx(), before, "returned before given back");
            if a.is_err() {
                prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
                break;
            }
            for (x, y) in s1.slots().iter().zip(s2.slots()) {
                let (cx, cy) = (&x.chain, &y.chain);
                prop_assert_eq!(
                    (x.start, cx.head, cx.walked, format!("{:?}", cx.result)),
                    (y.start, cy.head, cy.walked, format!("{:?}", cy.result))
                );
                let Ok(n) = cx.result else { continue };
                let start = x.start;
                if let Some(r) = cx.rest {
                    let copied = r.copied as usize;
                    prop_assert!(copied == copy_limit && n > copy_limit);
                    m1.read_slice(&mut b1[start + copied..start + n], r.at).unwrap();
                } else {
                    // Copied whole past the limit: only a chain the lane does not take, one
                    // of several descriptors or whose one descriptor is not plain (an
                    // indirect table of one is walked as one descriptor).
                    let flags = l.table.get(usize::from(cx.head)).map_or(0, |d| d.2);
                    prop_assert!(
                        n <= copy_limit || cx.walked > 1 || flags != 0,
                        "a one-descriptor chain copied past the limit"
                    );
                }
            }
            prop_assert_eq!(s1.len(), s2.len());
            prop_assert!(b1 == b2, "copied bytes differ");
            let a = return_tx_chains(&q1, &r1);
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
            prop_assert_eq!((q1.next_avail(), q1.next_used()), (q2.next_avail(), q2.next_used()));
            if a.is_err() || s1.is_empty() {
                break;
            }
        }
        prop_assert!(bytes(&m1) == bytes(&m2), "guest memory differs");
    }

    /// VIRTIO_F_IN_ORDER, which the device offers: on any ring, good or bad, every chain the
    /// RX run or the TX batch takes is returned, in the order the avail ring gave it, so
    /// the used entry at each position names the head at the same avail position. The
    /// driver's in-order paths rely on it (DPDK's virtio-user frees TX buffers by the used
    /// index alone and finds RX buffers by position).
    #[test]
    fn chains_are_returned_in_the_order_they_were_made_available(
        l in layout(),
        plain in any::<u16>(),
        lens in prop::collection::vec(prop_oneof![0usize..0x40, 0usize..0x600], 1..8),
        hdr_len in prop_oneof![Just(10usize), Just(12), Just(20)],
        mrg in any::<bool>(),
        tx in any::<bool>(),
    ) {
        let l = with_plain(l, plain, if tx { 0 } else { 2 }, 0x60);
        let (m, mut q) = build(&l);
        // A ring the driver broke (an error of the ring, not of one chain) is served no
        // more, and needs a reset: what it promised ends there.
        let mut broken = false;
        if tx {
            let limits = BatchLimits { frame_max: 0x200, chains: 256, walk: 8192, quiet: false, one_desc: true };
            let mut buf = vec![0u8; 0x4000];
            let mut slots = TxBatch::default();
            for _ in 0..3 {
                broken = pop_tx_batch(&mut q, &m, hdr_len, &mut buf, limits, &mut slots).is_err();
                if broken || slots.is_empty() {
                    break;
                }
            }
        } else {
            let ring = SplitRing::new(&q, &m).expect("started");
            let mut run = RxRun::new(hdr_len, mrg);
            let hdr = VirtioNetHdr::default();
            for (k, len) in lens.iter().enumerate() {
                let frame: Vec<u8> = (0..*len).map(|i| (i * 7 + k) as u8).collect();
                broken = matches!(run.push(&mut q, &ring, &hdr, &frame), Err(RxError::Ring(_)));
                if broken {
                    break;
                }
            }
            broken |= run.finish(&q, &ring).is_err();
        }
        // Nothing taken and kept back: the used index is where the avail position is.
        if !broken {
            prop_assert_eq!(q.next_used(), q.next_avail());
        }
        for p in 0..q.next_used() {
            let id: u32 = m.read_obj(GuestAddress(USED + 4 + 8 * u64::from(p % SIZE))).unwrap();
            prop_assert_eq!(id, u32::from(l.heads[usize::from(p % SIZE)]), "used entry {}", p);
        }
    }
}
