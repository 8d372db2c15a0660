//! The device-side state one guest port keeps: what the control queue set, and the DPAA
//! filter kept in step with it.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::ctrl::{CtrlError, CtrlOutcome, CtrlState, ValidCommand};
use super::features::Negotiated;
use super::filter::model::FilterSnapshot;
use super::filter::{Filter, FilterRegs};
use super::rss::{Steering, SteeringCell};
use super::rx_state::{MacList, RxMode, RxState};
use super::snoop;
use crate::wire::MacAddr;

/// One port's control state as `ctl filter` shows it. The control path replaces it whole
/// after every change (read-copy-update, as the switch's rules are), so a reader never waits
/// for the control lock, which a guest's command holds while it is applied. The address
/// lists are shared with the previous view until a table set changes them: a command other
/// than a table set publishes in O(buckets).
#[derive(Debug, Clone)]
pub struct NicView {
    pub mac: MacAddr,
    pub mode: RxMode,
    pub unicast: MacList,
    pub multicast: MacList,
    pub active_queue_pairs: u16,
    /// Changes only with the address lists: shared between views until they do.
    pub filter: Arc<FilterSnapshot>,
}

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
    /// The last published view; `view_cell` hands it to readers.
    view: Arc<ArcSwap<NicView>>,
}

impl NicState {
    pub fn new(mac: MacAddr, max_queue_pairs: u16, regs: Arc<FilterRegs>, exact_limit: usize) -> Self {
        let ctrl = CtrlState::new(mac, max_queue_pairs);
        let filter = Filter::new(regs, exact_limit, mac);
        let view = Arc::new(ArcSwap::from_pointee(NicView {
            mac,
            mode: ctrl.rx.mode,
            unicast: MacList::default(),
            multicast: MacList::default(),
            active_queue_pairs: ctrl.active_queue_pairs,
            filter: Arc::new(filter.view()),
        }));
        NicState {
            ctrl,
            steering: Arc::new(SteeringCell::new(max_queue_pairs)),
            filter,
            snooping: false,
            mac_lock: None,
            view,
        }
    }

    /// Where the view is published: readers load it without this state's lock.
    pub fn view_cell(&self) -> Arc<ArcSwap<NicView>> {
        self.view.clone()
    }

    /// Replaces the published view with the current state. `tables`: the address lists
    /// changed (a table set, QEMU's or the snooper's lists, a reset); otherwise the
    /// previous view's lists are kept.
    fn publish(&self, tables: bool) {
        let prev = self.view.load();
        // Linux's virtnet_set_rx_mode sends PROMISC and ALLMULTI before each table set,
        // mostly unchanged: those publish nothing.
        if !tables
            && prev.mac == self.ctrl.rx.mac
            && prev.mode == self.ctrl.rx.mode
            && prev.active_queue_pairs == self.ctrl.active_queue_pairs
        {
            return;
        }
        let (unicast, multicast, filter) = if tables {
            (
                self.ctrl.rx.unicast.clone(),
                self.ctrl.rx.multicast.clone(),
                Arc::new(self.filter.view()),
            )
        } else {
            (prev.unicast.clone(), prev.multicast.clone(), prev.filter.clone())
        };
        self.view.store(Arc::new(NicView {
            mac: self.ctrl.rx.mac,
            mode: self.ctrl.rx.mode,
            unicast,
            multicast,
            active_queue_pairs: self.ctrl.active_queue_pairs,
            filter,
        }));
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
            unicast: MacList::default(),
            multicast: Arc::new(multicast),
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
    pub fn parse<'a>(&self, feat: &Negotiated, cmd: &'a [u8]) -> Result<ValidCommand<'a>, CtrlError> {
        let c = self.ctrl.parse(feat, cmd)?;
        match (c.station(), self.mac_lock) {
            (Some(m), Some(lock)) if m != lock => Err(CtrlError::MacLocked(m)),
            _ => Ok(c),
        }
    }

    /// Locks the station address to `mac` (`--port-mac-lock`), or unlocks it.
    pub fn set_mac_lock(&mut self, mac: Option<MacAddr>) {
        self.mac_lock = mac;
    }

    /// Applies a command `parse` accepted, and brings the filter along.
    pub fn execute(&mut self, c: ValidCommand<'_>) -> CtrlOutcome {
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
            CtrlOutcome::GuestOffloads(_) | CtrlOutcome::AnnounceAck => {}
            CtrlOutcome::Vlan { vid, allowed } => self.filter.regs().vlan().set(*vid, *allowed),
        }
        self.publish(matches!(outcome, CtrlOutcome::MacTable));
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
        self.publish(true);
    }

    /// Device reset: empty tables, default mode; the filter's counters survive.
    pub fn reset(&mut self, mac: MacAddr) {
        self.ctrl = CtrlState::new(mac, self.ctrl.max_queue_pairs);
        self.steering
            .publish(Steering::automatic(self.ctrl.max_queue_pairs));
        self.filter.reset(mac);
        if self.snooping {
            self.publish_snooped(snoop::ALWAYS.to_vec());
        } else {
            self.publish(true);
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

    /// The published view is the state the last command left, for every kind of command,
    /// and a command that leaves the tables alone shares their lists with the view before.
    #[test]
    fn every_change_is_published_and_unchanged_lists_are_shared() {
        let mac: MacAddr = "52:54:00:d0:aa:01".parse().unwrap();
        let regs = Arc::new(FilterRegs::new(Layout::Exact, mac));
        let mut n = NicState::new(mac, 2, regs, 64);
        let cell = n.view_cell();
        let feat = Negotiated {
            bits: crate::device::features::offered(2),
        };
        let check = |n: &NicState| {
            let v = cell.load();
            assert_eq!(v.mac, n.ctrl.rx.mac);
            assert_eq!(v.mode, n.ctrl.rx.mode);
            assert_eq!(&v.unicast[..], &n.ctrl.rx.unicast[..]);
            assert_eq!(&v.multicast[..], &n.ctrl.rx.multicast[..]);
            assert_eq!(v.active_queue_pairs, n.ctrl.active_queue_pairs);
            assert_eq!(*v.filter, n.filter.view());
        };
        check(&n);
        // Two unicast entries (out of order: the view lists them sorted), one group.
        let (u1, u2): (MacAddr, MacAddr) = (
            "02:00:00:00:00:09".parse().unwrap(),
            "02:00:00:00:00:01".parse().unwrap(),
        );
        let mut table = vec![1, 0, 2, 0, 0, 0];
        table.extend_from_slice(&u1.0);
        table.extend_from_slice(&u2.0);
        table.extend_from_slice(&[1, 0, 0, 0, 0x01, 0, 0x5e, 1, 2, 3]);
        n.apply(&feat, &table).unwrap();
        check(&n);
        assert_eq!(&cell.load().filter.exact_unicast[..], &[u2, u1]);
        let before = cell.load_full();
        for cmd in [
            &[0u8, 1, 1][..],
            &[0, 0, 0],
            &[4, 0, 2, 0],
            &[1, 1, 2, 0, 0, 0, 0, 7],
        ] {
            n.apply(&feat, cmd).unwrap();
            check(&n);
            let v = cell.load();
            assert!(Arc::ptr_eq(&v.unicast, &before.unicast));
            assert!(Arc::ptr_eq(&v.multicast, &before.multicast));
            assert!(Arc::ptr_eq(&v.filter, &before.filter));
        }
        n.reset(mac);
        check(&n);
        assert!(cell.load().multicast.is_empty());
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
