//! The VLAN table beside the address filter: the 4096 VLAN IDs a driver that negotiated
//! VIRTIO_NET_F_CTRL_VLAN lets through (VIRTIO_NET_CTRL_VLAN_ADD / _DEL, virtio 1.2,
//! 5.1.6.5.3), as FMan's classifier keys on the 802.1Q tag. Written by the port's control
//! path, read per frame by every RX path without a lock: one atomic word per 64 IDs.
//!
//! The rules are QEMU's virtio-net's (`receive_filter` in hw/net/virtio-net.c), which a
//! Linux guest is written against: a driver that did not negotiate the bit gets every VLAN;
//! one that did starts with none and adds what it uses (Linux's 8021q adds VID 0 when the
//! interface comes up, and N for each `ip link add ... type vlan id N`); untagged frames
//! always pass; only the 0x8100 TPID is looked at; promiscuous mode passes every tag
//! ([`super::FilterRegs::vlan_allows`]). In the net attachment QEMU keeps the table, and
//! `--qmp` copies it here whole ([`VlanTable::replace`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// VLAN IDs are 12 bits.
pub const VLAN_IDS: usize = 4096;

/// The 802.1Q tag protocol identifier.
const TPID_8021Q: [u8; 2] = [0x81, 0x00];

#[derive(Debug)]
pub struct VlanTable {
    /// Whether the table decides at all (the driver acked CTRL_VLAN).
    on: AtomicBool,
    allowed: [AtomicU64; VLAN_IDS / 64],
}

impl Default for VlanTable {
    fn default() -> Self {
        VlanTable {
            on: AtomicBool::new(false),
            allowed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl VlanTable {
    /// An empty table, deciding (`on`) or letting every VLAN through: what a driver finds
    /// after it acks its features, with or without CTRL_VLAN, and after a reset.
    pub fn reset(&self, on: bool) {
        self.replace(on.then_some(&[]));
    }

    /// Lets VLAN `vid` through, or stops it. The control path has checked `vid` (below
    /// [`VLAN_IDS`]); a larger one changes nothing.
    pub fn set(&self, vid: u16, allowed: bool) {
        let Some(w) = self.allowed.get(usize::from(vid) / 64) else {
            return;
        };
        let bit = 1u64 << (vid % 64);
        if allowed {
            w.fetch_or(bit, Ordering::Release);
        } else {
            w.fetch_and(!bit, Ordering::Release);
        }
    }

    /// Takes a whole table from outside (QEMU's, through QMP): `allowed` deciding, or every
    /// VLAN passing. Each word goes straight to its new value, and the table turns on only
    /// once it holds its VLANs (off before it is emptied), so a VLAN allowed before and
    /// after passes throughout.
    pub fn replace(&self, allowed: Option<&[u16]>) {
        if allowed.is_none() {
            self.on.store(false, Ordering::Release);
        }
        let mut words = [0u64; VLAN_IDS / 64];
        for &vid in allowed.unwrap_or_default() {
            if let Some(w) = words.get_mut(usize::from(vid) / 64) {
                *w |= 1 << (vid % 64);
            }
        }
        for (cell, w) in self.allowed.iter().zip(words) {
            cell.store(w, Ordering::Release);
        }
        self.on.store(allowed.is_some(), Ordering::Release);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Whether the table lets `frame` through: an untagged frame, or one whose 802.1Q VID
    /// is allowed, or any frame while the table is off.
    #[inline]
    pub fn allows(&self, frame: &[u8]) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return true;
        }
        match frame.get(12..16) {
            Some(&[t0, t1, hi, lo]) if [t0, t1] == TPID_8021Q => {
                let vid = u16::from_be_bytes([hi & 0x0f, lo]);
                self.allowed[usize::from(vid) / 64].load(Ordering::Relaxed) & (1 << (vid % 64)) != 0
            }
            _ => true,
        }
    }

    /// The allowed VLAN IDs, ascending; `None` while the table is off (every VLAN passes).
    pub fn allowed(&self) -> Option<Vec<u16>> {
        if !self.is_on() {
            return None;
        }
        let mut v = Vec::new();
        for (i, w) in self.allowed.iter().enumerate() {
            let mut bits = w.load(Ordering::Relaxed);
            while bits != 0 {
                let b = bits.trailing_zeros();
                v.push((i * 64) as u16 + b as u16);
                bits &= bits - 1;
            }
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame to a unicast address, tagged with `vid` (and a priority, which is not part of
    /// the ID), or untagged.
    fn frame(vid: Option<u16>) -> Vec<u8> {
        let mut f = vec![0x52, 0x54, 0, 0xd0, 0xaa, 1, 0x52, 0x54, 0, 0xd0, 0xaa, 2];
        if let Some(v) = vid {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&((5 << 13) | v).to_be_bytes());
        }
        f.extend_from_slice(&[0x08, 0x00]);
        f.resize(64, 0);
        f
    }

    #[test]
    fn off_passes_every_vlan() {
        let t = VlanTable::default();
        assert!(t.allows(&frame(Some(100))));
        assert!(t.allows(&frame(None)));
        assert_eq!(t.allowed(), None);
    }

    #[test]
    fn on_passes_the_added_vlans_and_untagged_frames() {
        let t = VlanTable::default();
        t.reset(true);
        assert!(!t.allows(&frame(Some(100))), "starts empty");
        assert!(t.allows(&frame(None)));
        t.set(100, true);
        t.set(0, true);
        t.set(4095, true);
        assert!(t.allows(&frame(Some(100))));
        assert!(!t.allows(&frame(Some(101))));
        assert!(!t.allows(&frame(Some(100 + 64))), "another word's same bit");
        assert!(t.allows(&frame(Some(4095))));
        assert_eq!(t.allowed(), Some(vec![0, 100, 4095]));
        t.set(100, false);
        assert!(!t.allows(&frame(Some(100))));
        t.set(4096, true);
        assert_eq!(
            t.allowed(),
            Some(vec![0, 4095]),
            "an ID past 12 bits changes nothing"
        );
        t.reset(true);
        assert_eq!(t.allowed(), Some(vec![]));
    }

    #[test]
    fn a_whole_table_replaces_the_one_before() {
        let t = VlanTable::default();
        t.replace(Some(&[5, 100, 4095, 5000]));
        assert_eq!(
            t.allowed(),
            Some(vec![5, 100, 4095]),
            "an ID past 12 bits is left out"
        );
        assert!(t.allows(&frame(Some(100))));
        t.replace(Some(&[7]));
        assert_eq!(t.allowed(), Some(vec![7]));
        assert!(!t.allows(&frame(Some(100))));
        t.replace(None);
        assert!(t.allows(&frame(Some(100))));
        assert_eq!(t.allowed(), None);
    }

    #[test]
    fn only_the_8021q_tpid_is_a_tag() {
        let t = VlanTable::default();
        t.reset(true);
        let mut qinq = frame(Some(100));
        qinq[12..14].copy_from_slice(&[0x88, 0xa8]);
        assert!(t.allows(&qinq), "802.1ad is not looked into, as QEMU does not");
        assert!(t.allows(&frame(None)[..13]), "too short to hold a tag");
    }
}
