//! Feature bits dpaa-vnic offers and what follows from the ones a driver acks.

use virtio_bindings::virtio_config::{VIRTIO_F_IN_ORDER, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

use crate::wire::virtio_net_hdr::{HDR_LEN, HDR_LEN_HASH, HDR_LEN_LEGACY};

/// vhost-user's own feature bit (bit 30), offered so the frontend negotiates protocol features.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

const fn bit(b: u32) -> u64 {
    1u64 << b
}

/// Everything the device offers. In the net attachment QEMU intersects this with its own list
/// and keeps the control-queue bits for itself; in the device attachment the guest sees it all.
pub fn offered(queue_pairs: u16) -> u64 {
    let mut f = bit(VIRTIO_F_VERSION_1)
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_RING_F_INDIRECT_DESC)
        // Every queue returns its chains in the order the avail ring gave them (the TX
        // batch, the RX run and its give-back, the control queue's one command at a time;
        // tests/ring.rs checks it on random rings), which is what the bit promises (virtio
        // 1.2, 2.6). A driver that knows it (DPDK 22.11's virtio-user asks for it by
        // default, as DPDK's vhost library offers it) takes its in-order paths: TX buffers
        // freed by the used index alone, RX buffers found by position.
        | bit(VIRTIO_F_IN_ORDER)
        | bit(VIRTIO_NET_F_CSUM)
        | bit(VIRTIO_NET_F_GUEST_CSUM)
        | bit(VIRTIO_NET_F_MRG_RXBUF)
        | bit(VIRTIO_NET_F_MAC)
        | bit(VIRTIO_NET_F_MTU)
        | bit(VIRTIO_NET_F_STATUS)
        | bit(VIRTIO_NET_F_CTRL_VQ)
        | bit(VIRTIO_NET_F_CTRL_RX)
        | bit(VIRTIO_NET_F_CTRL_RX_EXTRA)
        | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
        | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS)
        // A VLAN table beside the address filter (device::filter::vlan); in the net
        // attachment QEMU answers the command itself and keeps its own table.
        | bit(VIRTIO_NET_F_CTRL_VLAN)
        // Lets the driver be asked to announce itself (`ctl announce`): by QEMU's virtio-net
        // in the net attachment (QMP announce-self; QEMU answers ANNOUNCE_ACK itself), by
        // the port in the device attachment (VIRTIO_NET_S_ANNOUNCE and a config-change
        // message, ports/vhost_user/config_change.rs; the control queue takes the ack).
        | bit(VIRTIO_NET_F_GUEST_ANNOUNCE)
        // Segmentation offload both ways: guests may send TSO/USO frames; guests that take
        // them get them whole, the others get segments cut by pipeline::gso.
        | bit(VIRTIO_NET_F_HOST_TSO4)
        | bit(VIRTIO_NET_F_HOST_TSO6)
        | bit(VIRTIO_NET_F_HOST_ECN)
        | bit(VIRTIO_NET_F_HOST_USO)
        | bit(VIRTIO_NET_F_GUEST_TSO4)
        | bit(VIRTIO_NET_F_GUEST_TSO6)
        | bit(VIRTIO_NET_F_GUEST_ECN)
        | bit(VIRTIO_NET_F_GUEST_USO4)
        | bit(VIRTIO_NET_F_GUEST_USO6)
        | VHOST_USER_F_PROTOCOL_FEATURES;
    if queue_pairs > 1 {
        // RSS steers over several queues; QEMU's virtio-net-pci keeps both bits off unless
        // told rss=on / hash=on, so the net attachment is unaffected.
        f |= bit(VIRTIO_NET_F_MQ) | bit(VIRTIO_NET_F_RSS);
    }
    f | bit(VIRTIO_NET_F_HASH_REPORT)
}

/// What the data path needs to know about an acked feature set.
/// How QEMU attached the guest's driver (docs/running-with-qemu.md): `vhost-user-net-pci`
/// passes the control queue through (device), `-netdev vhost-user` keeps it in QEMU (net).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attachment {
    /// Connected, no features acked yet.
    Negotiating,
    Device,
    Net,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Negotiated {
    pub bits: u64,
}

impl Negotiated {
    pub fn has(&self, b: u32) -> bool {
        self.bits & bit(b) != 0
    }

    /// The virtio-net header length on every buffer.
    pub fn hdr_len(&self) -> usize {
        if self.hash_report() {
            HDR_LEN_HASH
        } else if self.has(VIRTIO_F_VERSION_1) || self.has(VIRTIO_NET_F_MRG_RXBUF) {
            HDR_LEN
        } else {
            HDR_LEN_LEGACY
        }
    }

    pub fn mrg_rxbuf(&self) -> bool {
        self.has(VIRTIO_NET_F_MRG_RXBUF)
    }

    /// The driver filters VLANs through the control queue: it starts with none allowed.
    pub fn ctrl_vlan(&self) -> bool {
        self.has(VIRTIO_NET_F_CTRL_VLAN)
    }

    /// A driver that acked CTRL_VQ talks to us through a control queue: only the device
    /// attachment passes that bit through.
    pub fn ctrl_vq(&self) -> bool {
        self.has(VIRTIO_NET_F_CTRL_VQ)
    }

    /// How QEMU attached the driver, as far as these features tell.
    pub fn attachment(&self) -> Attachment {
        if self.bits == 0 {
            Attachment::Negotiating
        } else if self.ctrl_vq() {
            Attachment::Device
        } else {
            Attachment::Net
        }
    }

    pub fn mq(&self) -> bool {
        self.has(VIRTIO_NET_F_MQ)
    }

    pub fn rss(&self) -> bool {
        self.has(VIRTIO_NET_F_RSS)
    }

    /// The driver wants each frame's RSS hash in its header (needs the control queue).
    pub fn hash_report(&self) -> bool {
        self.has(VIRTIO_NET_F_HASH_REPORT) && self.ctrl_vq()
    }

    pub fn rx_extra(&self) -> bool {
        self.has(VIRTIO_NET_F_CTRL_RX_EXTRA)
    }

    /// Index of the control queue: 2N with MQ or RSS (N = max pairs), else 2 (virtio 1.2,
    /// 5.1.2).
    pub fn ctrl_queue_index(&self, max_pairs: u16) -> usize {
        if self.mq() || self.rss() {
            2 * usize::from(max_pairs)
        } else {
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_length_follows_features() {
        assert_eq!(Negotiated { bits: 0 }.hdr_len(), 10);
        assert_eq!(
            Negotiated {
                bits: bit(VIRTIO_F_VERSION_1)
            }
            .hdr_len(),
            12
        );
        assert_eq!(
            Negotiated {
                bits: bit(VIRTIO_NET_F_MRG_RXBUF)
            }
            .hdr_len(),
            12
        );
        let hash = bit(VIRTIO_F_VERSION_1) | bit(VIRTIO_NET_F_HASH_REPORT);
        assert_eq!(
            Negotiated { bits: hash }.hdr_len(),
            12,
            "hash report needs the control queue"
        );
        assert_eq!(
            Negotiated {
                bits: hash | bit(VIRTIO_NET_F_CTRL_VQ)
            }
            .hdr_len(),
            20
        );
    }

    #[test]
    fn mq_only_offered_with_several_pairs() {
        assert_eq!(offered(1) & bit(VIRTIO_NET_F_MQ), 0);
        assert_ne!(offered(2) & bit(VIRTIO_NET_F_MQ), 0);
        assert_ne!(offered(1) & VHOST_USER_F_PROTOCOL_FEATURES, 0);
    }

    #[test]
    fn ctrl_queue_index() {
        let n = Negotiated {
            bits: bit(VIRTIO_NET_F_MQ) | bit(VIRTIO_NET_F_CTRL_VQ),
        };
        assert_eq!(n.ctrl_queue_index(4), 8);
        assert_eq!(
            Negotiated {
                bits: bit(VIRTIO_NET_F_CTRL_VQ)
            }
            .ctrl_queue_index(4),
            2
        );
    }
}
