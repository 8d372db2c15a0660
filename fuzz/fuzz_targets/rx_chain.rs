//! Receive: a frame written into whatever buffers a guest posted. Invariants: a frame walks
//! at most MAX_FRAME_DESCS + 1 descriptors whatever the ring holds, uses at most
//! MAX_RX_BUFFERS buffers, and never reports more bytes used than the chain can hold.
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
    let Some((m, mut q)) = common::queue(data) else {
        return;
    };
    let mrg = flags & 1 != 0;
    let hdr_len = if flags & 2 != 0 { 12 } else { 10 };
    let frame: Vec<u8> = (0..usize::from(flags >> 2) * 100).map(|i| i as u8).collect();
    // One run for the four frames, as the daemon writes one: the avail index read by one
    // frame is reused by the next.
    let Some(ring) = SplitRing::new(&q, &m) else {
        return;
    };
    let mut run = RxRun::new(hdr_len, mrg);
    for _ in 0..4 {
        let before = q.next_used();
        let was = run.walked();
        let r = run.push(&mut q, &ring, &VirtioNetHdr::default(), &frame);
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
    let _ = run.finish(&q, &ring);
});
