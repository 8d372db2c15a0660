//! Receive: a frame written into whatever buffers a guest posted. Invariants: a frame walks
//! at most MAX_FRAME_DESCS + 1 descriptors whatever the ring holds, uses at most
//! MAX_RX_BUFFERS buffers, and never reports more bytes used than the chain can hold; and
//! the one-descriptor lane writes, returns and counts what the general walk does on a copy
//! of the same ring.
#![no_main]

mod common;

use dpaa_vnic::ports::vhost_user::rx_chain::{RxRun, MAX_RX_BUFFERS};
use dpaa_vnic::ports::vhost_user::split_ring::{SplitRing, MAX_FRAME_DESCS};
use dpaa_vnic::wire::VirtioNetHdr;
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueT;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let (Some((m, mut q)), Some((m2, mut q2))) = (common::queue(data), common::queue(data)) else {
        return;
    };
    let mrg = flags & 1 != 0;
    let hdr_len = if flags & 2 != 0 { 12 } else { 10 };
    let frame: Vec<u8> = (0..usize::from(flags >> 2) * 100).map(|i| i as u8).collect();
    // One run for the four frames, as the daemon writes one: the avail index read by one
    // frame is reused by the next.
    let (Some(ring), Some(ring2)) = (SplitRing::new(&q, &m), SplitRing::new(&q2, &m2)) else {
        return;
    };
    let mut run = RxRun::new(hdr_len, mrg);
    let mut walk = RxRun::new(hdr_len, mrg).general_only();
    for _ in 0..4 {
        let before = q.next_used();
        let was = run.walked();
        let r = run.push(&mut q, &ring, &VirtioNetHdr::default(), &frame);
        let r2 = walk.push(&mut q2, &ring2, &VirtioNetHdr::default(), &frame);
        assert_eq!(format!("{r:?}"), format!("{r2:?}"));
        assert_eq!(run.walked(), walk.walked());
        assert_eq!((q.next_avail(), q.next_used()), (q2.next_avail(), q2.next_used()));
        let walked = run.walked() - was;
        assert!(walked <= MAX_FRAME_DESCS + 1, "walked {walked}");
        let used = q.next_used().wrapping_sub(before);
        assert!(
            usize::from(used) <= MAX_RX_BUFFERS,
            "{used} buffers for one frame"
        );
        if let Ok(n) = r {
            assert_eq!(n, used);
        }
    }
    let (a, b) = (run.finish(&q, &ring), walk.finish(&q2, &ring2));
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert!(
        common::bytes(&m) == common::bytes(&m2),
        "the lane wrote other bytes"
    );
});
