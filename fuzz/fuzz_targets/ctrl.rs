//! Control-queue commands as a guest may write them, in any order: rx mode, MAC tables,
//! station address, queue pairs, RSS and hash report, guest offloads, VLANs. Invariants
//! after each command: the bucket reference counts equal the addresses the tables hash,
//! every multicast address the driver listed is accepted by the registers the data path
//! reads, and the VLAN table holds the IDs added and not deleted since.
#![no_main]

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use dpaa_vnic::device::features::{offered, Negotiated};
use dpaa_vnic::device::filter::{hash, FilterRegs, Layout, Verdict};
use dpaa_vnic::device::{CtrlOutcome, NicState};
use dpaa_vnic::wire::MacAddr;
use libfuzzer_sys::fuzz_target;

const LAYOUTS: [Layout; 5] = [Layout::Memac, Layout::Dtsec, Layout::DtsecExtended, Layout::Tgec, Layout::Exact];
const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xd0, 0xaa, 1]);
/// A UDP/IPv4 frame to steer after each command.
const UDP: [u8; 42] = [
    0x52, 0x54, 0, 0xd0, 0xaa, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0,
    10, 0, 0, 2, 10, 0, 0, 1, 0x13, 0x88, 0x13, 0x89, 0, 8, 0, 0,
];

thread_local! {
    /// One register file per layout, reused: `NicState::new` clears it (a device reset), so
    /// each input starts from an empty filter without allocating 64 Ki slots again.
    static REGS: [Arc<FilterRegs>; 5] = LAYOUTS.map(|l| Arc::new(FilterRegs::new(l, MAC)));
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let pick = usize::from(sel) % LAYOUTS.len();
    let layout = LAYOUTS[pick];
    let regs = REGS.with(|r| r[pick].clone());
    let mut n = NicState::new(MAC, 4, regs.clone(), 64);
    let feat = Negotiated { bits: offered(4) };
    // As the port does when a driver acks CTRL_VLAN (offered(4) has it).
    regs.vlan().reset(true);
    let mut vlans = BTreeSet::new();
    // Commands separated by a 16-bit length.
    while let Some((len, r)) = rest.split_at_checked(2) {
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let (cmd, r) = r.split_at(len.min(r.len()));
        rest = r;
        if let Ok(CtrlOutcome::Vlan { vid, allowed }) = n.apply(&feat, cmd) {
            if allowed {
                vlans.insert(vid);
            } else {
                vlans.remove(&vid);
            }
        }
        assert_eq!(regs.vlan().allowed(), Some(vlans.iter().copied().collect()));
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
        // RSS and queue-pair commands republish the steering: a frame never goes to a
        // queue the device does not have.
        assert!(n.steering.load().steer(&UDP).queue < 4);
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
