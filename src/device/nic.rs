//! The device-side state one guest port keeps: what the control queue set, and the DPAA
//! filter kept in step with it.

use std::sync::Arc;

use super::ctrl::{Command, CtrlError, CtrlOutcome, CtrlState};
use super::features::Negotiated;
use super::filter::{Filter, FilterRegs};
use super::rss::{Steering, SteeringCell};
use super::rx_state::{RxMode, RxState};
use super::snoop;
use crate::wire::MacAddr;

pub struct NicState {
    pub ctrl: CtrlState,
    /// The RX queue steering the data path reads; republished on MQ/RSS commands.
    pub steering: Arc<SteeringCell>,
    pub filter: Filter,
    /// Net attachment with `--snoop`: the guest's own IGMP/MLD reports drive the filter
    /// (the snooper itself lives with the port, under its own lock).
    pub snooping: bool,
    /// `--port-mac-lock`: the one station address the driver may set.
    mac_lock: Option<MacAddr>,
}

impl NicState {
    pub fn new(mac: MacAddr, max_queue_pairs: u16, regs: Arc<FilterRegs>, exact_limit: usize) -> Self {
        NicState {
            ctrl: CtrlState::new(mac, max_queue_pairs),
            steering: Arc::new(SteeringCell::new(max_queue_pairs)),
            filter: Filter::new(regs, exact_limit, mac),
            snooping: false,
            mac_lock: None,
        }
    }

    /// Turns snooping on: multicast is filtered to the groups the guest reports (plus
    /// all-hosts/all-nodes), unicast is left to the switch (alluni).
    pub fn enable_snoop(&mut self) {
        self.snooping = true;
        self.publish_snooped(snoop::ALWAYS.to_vec());
    }

    /// The snooper's addresses (sorted) become the multicast list.
    pub fn publish_snooped(&mut self, multicast: Vec<MacAddr>) {
        let mode = RxMode {
            promisc: false,
            alluni: true,
            ..RxMode::default()
        };
        let rx = RxState {
            mac: self.ctrl.rx.mac,
            mode,
            unicast: Vec::new(),
            multicast,
        };
        self.apply_rx_state(rx);
    }

    /// Applies one control command and brings the filter along: only what changed reaches
    /// the filter registers.
    pub fn apply(&mut self, feat: &Negotiated, cmd: &[u8]) -> Result<CtrlOutcome, CtrlError> {
        let c = self.parse(feat, cmd)?;
        Ok(self.execute(c))
    }

    /// Checks one control command (`CtrlState::parse`): its result is the ack.
    pub fn parse<'a>(&self, feat: &Negotiated, cmd: &'a [u8]) -> Result<Command<'a>, CtrlError> {
        match self.ctrl.parse(feat, cmd)? {
            Command::MacAddr(m) if self.mac_lock.is_some_and(|l| l != m) => Err(CtrlError::MacLocked(m)),
            c => Ok(c),
        }
    }

    /// Locks the station address to `mac` (`--port-mac-lock`), or unlocks it.
    pub fn set_mac_lock(&mut self, mac: Option<MacAddr>) {
        self.mac_lock = mac;
    }

    /// Applies a command `parse` accepted, and brings the filter along.
    pub fn execute(&mut self, c: Command<'_>) -> CtrlOutcome {
        let outcome = self.ctrl.execute(c);
        match &outcome {
            CtrlOutcome::RxMode => self.filter.set_mode(self.ctrl.rx.mode),
            CtrlOutcome::MacTable => {
                self.filter.sync(&self.ctrl.rx.unicast, &self.ctrl.rx.multicast);
            }
            CtrlOutcome::MacAddr => self.filter.set_station(self.ctrl.rx.mac),
            CtrlOutcome::QueuePairs(n) => {
                // Automatic steering over the pairs now in use, unless an RSS indirection
                // table decides (a hash-report-only configuration keeps its key).
                let current = self.steering.load().config.clone();
                match current {
                    Some(c) if !c.indirection.is_empty() => {}
                    Some(c) => self.steering.publish(Steering::from_config(c, *n)),
                    None => self.steering.publish(Steering::automatic(*n)),
                }
            }
            CtrlOutcome::Rss(c) => {
                self.steering
                    .publish(Steering::from_config(c.clone(), self.ctrl.active_queue_pairs));
            }
            CtrlOutcome::GuestOffloads(_) => {}
        }
        outcome
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
        self.steering
            .publish(Steering::automatic(self.ctrl.max_queue_pairs));
        self.filter.reset(mac);
        if self.snooping {
            self.publish_snooped(snoop::ALWAYS.to_vec());
        }
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

#[cfg(test)]
mod rss_tests {
    use super::*;
    use crate::device::filter::Layout;
    use crate::device::rss::{DEFAULT_KEY, SUPPORTED};

    #[test]
    fn rss_config_steers_and_needs_the_feature() {
        let mac: MacAddr = "52:54:00:d0:aa:01".parse().unwrap();
        let mut n = NicState::new(mac, 2, Arc::new(FilterRegs::new(Layout::Memac, mac)), 64);
        // class MQ (4), RSS_CONFIG (1): two-entry table [1, 1], unclassified 1, 2 TX queues.
        let mut cmd = vec![4, 1];
        cmd.extend_from_slice(&SUPPORTED.to_le_bytes());
        cmd.extend_from_slice(&[1, 0, 1, 0, 1, 0, 1, 0, 2, 0, 40]);
        cmd.extend_from_slice(&DEFAULT_KEY);
        let without = Negotiated {
            bits: crate::device::features::offered(2) & !(1 << virtio_bindings::virtio_net::VIRTIO_NET_F_RSS),
        };
        assert!(matches!(
            n.apply(&without, &cmd),
            Err(CtrlError::NotNegotiated { .. })
        ));
        let feat = Negotiated {
            bits: crate::device::features::offered(2),
        };
        assert!(matches!(n.apply(&feat, &cmd), Ok(CtrlOutcome::Rss(_))));
        assert_eq!(n.ctrl.active_queue_pairs, 2);
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        assert_eq!(n.steering.load().steer(&arp).queue, 1);
        // A later VQ_PAIRS_SET does not undo the driver's table; a reset does.
        n.apply(&feat, &[4, 0, 1, 0]).unwrap();
        assert!(n.steering.load().config.is_some());
        n.reset(mac);
        assert!(n.steering.load().config.is_none());
        assert_eq!(n.steering.load().steer(&arp).queue, 0);
    }
}

#[cfg(test)]
mod snoop_tests {
    use super::*;
    use crate::device::filter::Layout;

    #[test]
    fn snooping_publishes_its_base_set_and_survives_reset() {
        let mac: MacAddr = "52:54:00:d0:aa:01".parse().unwrap();
        let mut n = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 64);
        n.enable_snoop();
        assert_eq!(n.ctrl.rx.multicast.len(), 2);
        assert!(!n.ctrl.rx.mode.promisc && n.ctrl.rx.mode.alluni);
        n.reset(mac);
        assert!(n.snooping);
        assert_eq!(n.ctrl.rx.multicast.len(), 2);
    }
}
