//! `--port-mac-lock`: a guest port may send only from its own MAC address, as `spoofchk`
//! makes an SR-IOV NIC drop a VF's frames whose source is not the VF's MAC. Without it any
//! guest can send with a neighbour's source address, take its forwarding entry and receive
//! its unicast traffic.
//!
//! The lock is one atomic word per port, read once per transmitted frame.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use crate::wire::MacAddr;

/// Which source addresses a guest port may send from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MacLock {
    /// Where the daemon knows the guest's MAC (the device attachment serves it in config
    /// space), only that one; in the net attachment QEMU owns the MAC and nothing is locked.
    #[default]
    Auto,
    /// As `auto`, and in the net attachment the first unicast source the guest sends from
    /// after connecting is the only one it may use until it disconnects.
    Sticky,
    /// Any source address (a guest that bridges other stations, say).
    Off,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown --port-mac-lock {0:?}: expected auto, sticky or off")]
pub struct MacLockError(pub String);

impl FromStr for MacLock {
    type Err = MacLockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(MacLock::Auto),
            "sticky" => Ok(MacLock::Sticky),
            "off" => Ok(MacLock::Off),
            _ => Err(MacLockError(s.to_string())),
        }
    }
}

impl fmt::Display for MacLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MacLock::Auto => "auto",
            MacLock::Sticky => "sticky",
            MacLock::Off => "off",
        })
    }
}

const MAC_MASK: u64 = (1 << 48) - 1;
/// The word holds the one address allowed.
const LOCKED: u64 = 1 << 48;
/// The first unicast source seen becomes the one address allowed.
const STICKY: u64 = 1 << 49;

/// A port's lock as the TX path reads it: open, locked to one address, or waiting to lock
/// to the first one it sees.
#[derive(Debug, Default)]
pub struct SourceLock(AtomicU64);

impl SourceLock {
    pub fn open(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    pub fn lock_to(&self, mac: MacAddr) {
        self.0.store(mac.as_u64() | LOCKED, Ordering::Relaxed);
    }

    pub fn lock_to_first(&self) {
        self.0.store(STICKY, Ordering::Relaxed);
    }

    /// Sets the lock a newly attached driver gets under `mode`: `known` is the MAC the
    /// daemon serves the guest, if it serves one.
    pub fn attach(&self, mode: MacLock, known: Option<MacAddr>) {
        match (mode, known) {
            (MacLock::Off, _) => self.open(),
            (_, Some(mac)) => self.lock_to(mac),
            (MacLock::Sticky, None) => self.lock_to_first(),
            (MacLock::Auto, None) => self.open(),
        }
    }

    /// The one address allowed, once there is one.
    pub fn locked_to(&self) -> Option<MacAddr> {
        let w = self.0.load(Ordering::Relaxed);
        (w & LOCKED != 0).then(|| MacAddr::from_u64(w & MAC_MASK))
    }

    /// Whether the guest may send `frame`. A frame too short for a source address is left
    /// to the switch, which drops runts.
    #[inline]
    pub fn allows(&self, frame: &[u8]) -> bool {
        let w = self.0.load(Ordering::Relaxed);
        if w == 0 {
            return true;
        }
        let Some(src) = frame.get(6..12).and_then(MacAddr::from_slice) else {
            return true;
        };
        if w & LOCKED != 0 {
            return src.as_u64() == w & MAC_MASK;
        }
        if src.is_multicast() {
            return false;
        }
        // Sticky: the first worker to see a source locks to it; the others compare.
        match self.0.compare_exchange(
            STICKY,
            src.as_u64() | LOCKED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => true,
            Err(now) => now == 0 || (now & LOCKED != 0 && now & MAC_MASK == src.as_u64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_from(src: &str) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&src.parse::<MacAddr>().unwrap().0);
        f.extend_from_slice(&[0x08, 0x00, 0x45]);
        f
    }

    #[test]
    fn modes_parse_and_print() {
        for m in ["auto", "sticky", "off"] {
            assert_eq!(m.parse::<MacLock>().unwrap().to_string(), m);
        }
        assert!("on".parse::<MacLock>().is_err());
    }

    #[test]
    fn a_locked_port_sends_only_from_its_address() {
        let own = "52:54:00:d0:aa:01";
        let l = SourceLock::default();
        assert!(l.allows(&frame_from("52:54:00:d0:aa:02")), "open until attached");
        l.attach(MacLock::Auto, Some(own.parse().unwrap()));
        assert!(l.allows(&frame_from(own)));
        assert!(
            !l.allows(&frame_from("52:54:00:d0:aa:02")),
            "a neighbour's address"
        );
        assert!(!l.allows(&frame_from("01:00:5e:00:00:01")));
        assert!(l.allows(&[0u8; 8]), "runts are the switch's to drop");
        l.attach(MacLock::Auto, None);
        assert!(
            l.allows(&frame_from("52:54:00:d0:aa:02")),
            "net attachment under auto"
        );
        l.attach(MacLock::Off, Some(own.parse().unwrap()));
        assert!(l.allows(&frame_from("52:54:00:d0:aa:02")));
    }

    #[test]
    fn sticky_locks_to_the_first_unicast_source() {
        let l = SourceLock::default();
        l.attach(MacLock::Sticky, None);
        assert!(
            !l.allows(&frame_from("01:00:5e:00:00:01")),
            "never to a group address"
        );
        assert_eq!(l.locked_to(), None);
        assert!(l.allows(&frame_from("52:54:00:12:34:56")));
        assert_eq!(l.locked_to(), Some("52:54:00:12:34:56".parse().unwrap()));
        assert!(l.allows(&frame_from("52:54:00:12:34:56")));
        assert!(!l.allows(&frame_from("52:54:00:d0:aa:02")));
        l.open();
        assert!(l.allows(&frame_from("52:54:00:d0:aa:02")));
    }
}
