//! The virtio-net config space served through VHOST_USER_GET_CONFIG.

use virtio_bindings::virtio_net::{VIRTIO_NET_S_ANNOUNCE, VIRTIO_NET_S_LINK_UP};

use super::rss;
use crate::wire::MacAddr;

/// Bytes of config space we serve: mac, status, max_virtqueue_pairs, mtu, speed, duplex,
/// rss_max_key_size, rss_max_indirection_table_length, supported_hash_types.
pub const CONFIG_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    pub mac: MacAddr,
    pub link_up: bool,
    /// VIRTIO_NET_S_ANNOUNCE: the driver is asked to announce itself (GUEST_ANNOUNCE).
    pub announce: bool,
    pub max_queue_pairs: u16,
    pub mtu: u16,
}

impl NetConfig {
    pub fn to_bytes(&self) -> [u8; CONFIG_LEN] {
        let mut b = [0u8; CONFIG_LEN];
        b[..6].copy_from_slice(&self.mac.0);
        let status = if self.link_up {
            VIRTIO_NET_S_LINK_UP as u16
        } else {
            0
        } | if self.announce {
            VIRTIO_NET_S_ANNOUNCE as u16
        } else {
            0
        };
        b[6..8].copy_from_slice(&status.to_le_bytes());
        b[8..10].copy_from_slice(&self.max_queue_pairs.to_le_bytes());
        b[10..12].copy_from_slice(&self.mtu.to_le_bytes());
        // Speed and duplex unknown (SPEED_DUPLEX is not offered; the values say so anyway).
        b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        b[16] = 0xff;
        b[17] = rss::MAX_KEY as u8;
        b[18..20].copy_from_slice(&(rss::MAX_TABLE as u16).to_le_bytes());
        b[20..24].copy_from_slice(&rss::SUPPORTED.to_le_bytes());
        b
    }

    /// The `size` bytes at `offset`; a read past the end yields what exists (possibly
    /// nothing), which the vhost handler reports to the frontend as a failed read.
    pub fn read(&self, offset: u32, size: u32) -> Vec<u8> {
        let bytes = self.to_bytes();
        let start = (offset as usize).min(CONFIG_LEN);
        let end = start.saturating_add(size as usize).min(CONFIG_LEN);
        bytes[start..end].to_vec()
    }
}

/// What to tell the operator when a frontend reads config space from its start but stops
/// short of its end. QEMU's `vhost-user-test-device-pci` reads `config_size` bytes once,
/// at realize (QEMU 10.2, hw/virtio/vhost-user-base.c), and hands the guest only those. An
/// older example's `config_size=12` stops before the RSS limits (virtio 1.2, 5.1.4), which
/// Linux reads as soon as it negotiates HASH_REPORT or RSS: it then finds garbage, logs
/// "rss_max_key_size=... exceeds the limit 40" and gives up on the device, so no interface
/// appears and the daemon would otherwise say nothing.
pub fn short_read_advice(offset: u32, size: u32) -> Option<String> {
    (offset == 0 && (size as usize) < CONFIG_LEN).then(|| {
        format!(
            "the frontend reads {size} of the {CONFIG_LEN} bytes of config space: a Linux guest \
             will not probe the device (RSS limits missing). With vhost-user-test-device-pci, \
             pass config_size={CONFIG_LEN}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_read_from_the_start_is_explained_and_a_whole_or_partial_one_is_not() {
        let advice = short_read_advice(0, 12).unwrap();
        assert!(advice.contains("reads 12 of the 24 bytes"), "{advice}");
        assert!(advice.contains("config_size=24"), "{advice}");
        assert_eq!(short_read_advice(0, 24), None);
        // QEMU always asks from offset 0 (hw/virtio/vhost-user.c `vhost_user_get_config`);
        // another frontend reading one field further in is not told off.
        assert_eq!(short_read_advice(6, 2), None);
    }

    #[test]
    fn golden_layout() {
        let c = NetConfig {
            mac: "52:54:00:12:34:56".parse().unwrap(),
            link_up: true,
            announce: false,
            max_queue_pairs: 2,
            mtu: 1500,
        };
        assert_eq!(
            c.to_bytes(),
            [
                0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x01, 0x00, 0x02, 0x00, 0xdc, 0x05, 0xff, 0xff, 0xff,
                0xff, 0xff, 40, 128, 0, 0x3f, 0, 0, 0
            ]
        );
        assert_eq!(c.read(6, 2), vec![1, 0]);
        assert_eq!(c.read(20, 8), vec![0x3f, 0, 0, 0]);
        assert!(c.read(40, 4).is_empty());
        // The status word: LINK_UP is bit 0, ANNOUNCE bit 1 (virtio 1.2, 5.1.4).
        let down = NetConfig {
            link_up: false,
            announce: true,
            ..c
        };
        assert_eq!(down.read(6, 2), vec![2, 0]);
    }
}
