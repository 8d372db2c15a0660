//! What the driver told the device about reception: rx mode flags and the MAC tables.

use serde::Serialize;

use crate::wire::MacAddr;

/// Rx mode flags of the CTRL_RX class (virtio 1.2, 5.1.6.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RxMode {
    pub promisc: bool,
    pub allmulti: bool,
    pub alluni: bool,
    pub nomulti: bool,
    pub nouni: bool,
    pub nobcast: bool,
}

impl Default for RxMode {
    /// QEMU starts a virtio-net device promiscuous until the driver says otherwise; a driver
    /// without CTRL_RX never does, and must then receive everything.
    fn default() -> Self {
        RxMode {
            promisc: true,
            allmulti: false,
            alluni: false,
            nomulti: false,
            nouni: false,
            nobcast: false,
        }
    }
}

/// The device's receive state as the driver last set it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RxState {
    pub mac: MacAddr,
    pub mode: RxMode,
    pub unicast: Vec<MacAddr>,
    pub multicast: Vec<MacAddr>,
}

impl RxState {
    /// The state after reset: the config-space MAC, default mode, empty tables (the spec
    /// requires the device to start with an empty table).
    pub fn new(mac: MacAddr) -> Self {
        RxState {
            mac,
            mode: RxMode::default(),
            unicast: Vec::new(),
            multicast: Vec::new(),
        }
    }

    /// Whether a frame to `dst` passes the driver's rx mode and tables (exact match).
    pub fn accepts(&self, dst: &MacAddr) -> bool {
        let m = &self.mode;
        if m.promisc {
            return true;
        }
        if dst.is_broadcast() {
            return !m.nobcast;
        }
        if dst.is_multicast() {
            return !m.nomulti && (m.allmulti || self.multicast.contains(dst));
        }
        !m.nouni && (m.alluni || *dst == self.mac || self.unicast.contains(dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    #[test]
    fn default_is_promiscuous() {
        let s = RxState::new(mac("52:54:00:00:00:01"));
        assert!(s.accepts(&mac("02:00:00:00:00:09")));
    }

    #[test]
    fn exact_tables_and_flags() {
        let mut s = RxState::new(mac("52:54:00:00:00:01"));
        s.mode.promisc = false;
        s.multicast.push(mac("01:00:5e:00:00:fb"));
        assert!(s.accepts(&mac("52:54:00:00:00:01")));
        assert!(!s.accepts(&mac("52:54:00:00:00:02")));
        assert!(s.accepts(&MacAddr::BROADCAST));
        assert!(s.accepts(&mac("01:00:5e:00:00:fb")));
        assert!(!s.accepts(&mac("01:00:5e:00:00:fc")));
        s.mode.allmulti = true;
        assert!(s.accepts(&mac("01:00:5e:00:00:fc")));
        s.mode.nomulti = true;
        assert!(!s.accepts(&mac("01:00:5e:00:00:fb")));
        s.mode.nobcast = true;
        assert!(!s.accepts(&MacAddr::BROADCAST));
        s.mode.nouni = true;
        assert!(!s.accepts(&mac("52:54:00:00:00:01")));
    }
}
