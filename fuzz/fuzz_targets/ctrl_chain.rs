//! The control queue as a guest fills it: chains built from the input (split, indirect,
//! looping, pointing anywhere), popped with their ack byte, then parsed and applied.
//! Invariants: what is read never exceeds the limit, and the ack address, if any, lies in
//! guest memory.
#![no_main]

mod common;

use std::sync::Arc;

use dpaa_vnic::device::features::{offered, Negotiated};
use dpaa_vnic::device::filter::{FilterRegs, Layout};
use dpaa_vnic::device::NicState;
use dpaa_vnic::ports::vhost_user::pop_ctrl;
use dpaa_vnic::wire::MacAddr;
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueT;
use vm_memory::{Address, GuestMemoryBackend};

const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xd0, 0xaa, 1]);
const MAX: usize = 64 * 1024;

thread_local! {
    static REGS: Arc<FilterRegs> = Arc::new(FilterRegs::new(Layout::Dtsec, MAC));
}

fuzz_target!(|data: &[u8]| {
    let Some((m, mut q)) = common::queue(data) else {
        return;
    };
    let mut n = NicState::new(MAC, 4, REGS.with(Arc::clone), 64);
    let feat = Negotiated { bits: offered(4) };
    let mut buf = Vec::new();
    for _ in 0..common::QSIZE {
        let Ok(Some((head, chain))) = pop_ctrl(&mut q, &m, &mut buf, MAX) else {
            break;
        };
        let _ = q.add_used(&m, head, 0);
        let Ok(c) = chain else { continue };
        assert!(c.len <= MAX && c.len == buf.len());
        if let Some(a) = c.ack {
            assert!(m.address_in_range(a), "ack at {:#x}", a.raw_value());
        }
        let _ = n.apply(&feat, &buf[..c.len]);
    }
});
