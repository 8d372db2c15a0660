//! Control-queue commands as a guest may write them, in any order: rx mode, MAC tables,
//! station address, queue pairs, RSS and hash report, guest offloads. Invariants after each
//! command: the bucket reference counts equal the addresses the tables hash, and every
//! multicast address the driver listed is accepted by the registers the data path reads.
#![no_main]

use std::collections::HashSet;
use std::sync::Arc;

use dpaa_vnic::device::features::{offered, Negotiated};
use dpaa_vnic::device::filter::{hash, FilterRegs, Layout, Verdict};
use dpaa_vnic::device::NicState;
use dpaa_vnic::wire::MacAddr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let layout = [Layout::Memac, Layout::Dtsec, Layout::DtsecExtended, Layout::Exact][usize::from(sel & 3)];
    let mac = MacAddr([0x52, 0x54, 0, 0xd0, 0xaa, 1]);
    let regs = Arc::new(FilterRegs::new(layout, mac));
    let mut n = NicState::new(mac, 4, regs.clone(), 64);
    let feat = Negotiated { bits: offered(4) };
    // Commands separated by a 16-bit length.
    while let Some((len, r)) = rest.split_at_checked(2) {
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let (cmd, r) = r.split_at(len.min(r.len()));
        rest = r;
        let _ = n.apply(&feat, cmd);
        let rx = &n.ctrl.rx;
        let uc: HashSet<MacAddr> = rx.unicast.iter().copied().collect();
        let mc: HashSet<MacAddr> = rx.multicast.iter().copied().collect();
        let hashed = uc
            .iter()
            .chain(mc.iter())
            .filter(|m| hash::bucket(layout, m).is_some())
            .count();
        let refs: u32 = n.filter.refs().iter().sum();
        assert_eq!(refs as usize, hashed, "bucket references against the tables");
        if !rx.mode.nomulti {
            for m in mc.iter().filter(|m| m.is_multicast() && !m.is_broadcast()) {
                assert_eq!(
                    regs.classify(m),
                    Verdict::Multicast,
                    "{m} listed but not accepted"
                );
            }
        }
    }
});
