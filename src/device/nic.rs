//! The device-side state one guest port keeps: what the control queue set, and the DPAA
//! filter kept in step with it.

use std::sync::Arc;

use super::ctrl::{CtrlError, CtrlOutcome, CtrlState};
use super::features::Negotiated;
use super::filter::{Filter, FilterRegs};
use super::rx_state::RxState;
use crate::wire::MacAddr;

pub struct NicState {
    pub ctrl: CtrlState,
    pub filter: Filter,
}

impl NicState {
    pub fn new(mac: MacAddr, max_queue_pairs: u16, regs: Arc<FilterRegs>, exact_limit: usize) -> Self {
        NicState {
            ctrl: CtrlState::new(mac, max_queue_pairs),
            filter: Filter::new(regs, exact_limit, mac),
        }
    }

    /// Applies one control command and brings the filter along: only what changed reaches
    /// the filter registers.
    pub fn apply(&mut self, feat: &Negotiated, cmd: &[u8]) -> Result<CtrlOutcome, CtrlError> {
        let outcome = self.ctrl.apply(feat, cmd)?;
        match outcome {
            CtrlOutcome::RxMode => self.filter.set_mode(self.ctrl.rx.mode),
            CtrlOutcome::MacTable => {
                self.filter.sync(&self.ctrl.rx.unicast, &self.ctrl.rx.multicast);
            }
            CtrlOutcome::MacAddr => self.filter.set_station(self.ctrl.rx.mac),
            CtrlOutcome::QueuePairs(_) | CtrlOutcome::GuestOffloads(_) => {}
        }
        Ok(outcome)
    }

    /// Takes the whole receive state from outside (QEMU's view, in the net attachment) and
    /// brings the filter along incrementally, as a table set would.
    pub fn apply_rx_state(&mut self, rx: RxState) {
        if rx.mac != self.ctrl.rx.mac {
            self.filter.set_station(rx.mac);
        }
        self.filter.set_mode(rx.mode);
        self.filter.sync(&rx.unicast, &rx.multicast);
        self.ctrl.rx = rx;
    }

    /// Device reset: empty tables, default mode; the filter's counters survive.
    pub fn reset(&mut self, mac: MacAddr) {
        self.ctrl = CtrlState::new(mac, self.ctrl.max_queue_pairs);
        self.filter.reset(mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::filter::{Layout, Verdict};

    #[test]
    fn commands_drive_the_filter() {
        let mac: MacAddr = "52:54:00:d0:aa:01".parse().unwrap();
        let regs = Arc::new(FilterRegs::new(Layout::Dtsec, mac));
        let mut n = NicState::new(mac, 1, regs.clone(), 64);
        let feat = Negotiated {
            bits: crate::device::features::offered(1),
        };
        let group: MacAddr = "01:00:5e:01:02:03".parse().unwrap();
        let other: MacAddr = "01:00:5e:7f:00:09".parse().unwrap();
        assert_eq!(
            regs.classify(&other),
            Verdict::Multicast,
            "promiscuous until told"
        );
        n.apply(&feat, &[0, 0, 0]).unwrap();
        let mut table = vec![1, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        table.extend_from_slice(&group.0);
        n.apply(&feat, &table).unwrap();
        assert_eq!(regs.classify(&group), Verdict::Multicast);
        assert_eq!(regs.classify(&other), Verdict::Reject);
        assert_eq!(n.filter.stats().filter_adds, 1);
        n.reset(mac);
        assert_eq!(regs.classify(&other), Verdict::Multicast);
        assert_eq!(n.filter.stats().filter_syncs, 1);
    }
}
