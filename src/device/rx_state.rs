//! What the driver told the device about reception: rx mode flags and the MAC tables.

use std::sync::Arc;

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
    /// Shared with the published view (`nic::NicView`): publishing copies nothing.
    pub unicast: MacList,
    pub multicast: MacList,
}

/// An address list as the driver sent it, shared between the control state and the views
/// published from it.
pub type MacList = Arc<Vec<MacAddr>>;

impl RxState {
    /// The state after reset: the config-space MAC, default mode, empty tables (the spec
    /// requires the device to start with an empty table).
    pub fn new(mac: MacAddr) -> Self {
        RxState {
            mac,
            mode: RxMode::default(),
            unicast: MacList::default(),
            multicast: MacList::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_promiscuous_with_empty_tables() {
        let s = RxState::new("52:54:00:00:00:01".parse().unwrap());
        assert!(s.mode.promisc && !s.mode.allmulti && !s.mode.nobcast);
        assert!(s.unicast.is_empty() && s.multicast.is_empty());
    }
}
