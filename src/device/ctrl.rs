//! Control-queue commands (virtio 1.2, 5.1.6.5): parse the driver's bytes, apply them to
//! the device state, and say which ack to write.

use std::sync::Arc;

use thiserror::Error;
use virtio_bindings::virtio_net::*;
use zerocopy::FromBytes;

use super::features::Negotiated;
use super::filter::VLAN_IDS;
use super::rss::{RssConfig, RssError};
use super::rx_state::{MacList, RxState};
use crate::wire::MacAddr;

/// Ack byte values.
pub const ACK_OK: u8 = VIRTIO_NET_OK as u8;
pub const ACK_ERR: u8 = VIRTIO_NET_ERR as u8;

/// Guest offload bits that CTRL_GUEST_OFFLOADS may toggle (virtio 1.2, 5.1.6.5.6.1).
pub const GUEST_OFFLOAD_MASK: u64 = (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_ECN)
    | (1 << VIRTIO_NET_F_GUEST_UFO)
    | (1 << VIRTIO_NET_F_GUEST_USO4)
    | (1 << VIRTIO_NET_F_GUEST_USO6);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CtrlError {
    #[error("command of {0} bytes has no class and command")]
    Truncated(usize),
    #[error("class {class} command {cmd}: payload of {got} bytes, expected {want}")]
    BadLength {
        class: u8,
        cmd: u8,
        got: usize,
        want: usize,
    },
    #[error("MAC table: {0}")]
    BadTable(&'static str),
    #[error("MAC table of {entries} entries overruns the {left} bytes left in the command")]
    TableOverrun { entries: usize, left: usize },
    #[error("class {class} command {cmd} needs a feature the driver did not negotiate")]
    NotNegotiated { class: u8, cmd: u8 },
    #[error("unknown class {class} command {cmd}")]
    Unknown { class: u8, cmd: u8 },
    #[error("rx mode value {0} is neither 0 nor 1")]
    BadFlag(u8),
    #[error("{0} queue pairs requested, device has 1..={1}")]
    BadQueuePairs(u16, u16),
    #[error("guest offloads {0:#x} outside the negotiated set")]
    BadOffloads(u64),
    #[error("RSS configuration")]
    Rss(#[source] RssError),
    #[error("station address {0}: the port is locked to the MAC it was given (--port-mac-lock)")]
    MacLocked(MacAddr),
    #[error("VLAN ID {0} is past 12 bits")]
    BadVlan(u16),
}

/// What an accepted command changed, for statistics and for the filter sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlOutcome {
    RxMode,
    MacTable,
    MacAddr,
    QueuePairs(u16),
    GuestOffloads(u64),
    /// RSS_CONFIG or HASH_CONFIG: a new steering / hash-report configuration.
    Rss(RssConfig),
    /// VLAN_ADD (`allowed`) or VLAN_DEL.
    Vlan {
        vid: u16,
        allowed: bool,
    },
    /// ANNOUNCE_ACK: the driver has announced itself; the device clears
    /// VIRTIO_NET_S_ANNOUNCE (virtio 1.2, 5.1.6.5.4).
    AnnounceAck,
}

/// One command `CtrlState::parse` accepted, borrowing the driver's bytes. `parse` decides
/// the ack; `CtrlState::execute` cannot fail, so a caller may answer the driver between the
/// two and do the work while the driver goes on. Its variant is private, so only `parse`
/// makes one, and `execute` trusts what it holds (a queue-pair count within the device's,
/// for one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCommand<'a>(Cmd<'a>);

impl ValidCommand<'_> {
    /// A MAC_TABLE_SET: answered before it is applied (ports/vhost_user/ctrl_queue.rs).
    pub fn is_table_set(&self) -> bool {
        matches!(self.0, Cmd::MacTable { .. })
    }

    /// The station address a MAC_ADDR_SET asks for.
    pub fn station(&self) -> Option<MacAddr> {
        match self.0 {
            Cmd::MacAddr(m) => Some(m),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cmd<'a> {
    /// CTRL_RX: one of the rx-mode flags (`VIRTIO_NET_CTRL_RX_*`), on or off.
    RxFlag {
        which: u32,
        on: bool,
    },
    MacTable {
        unicast: &'a [MacAddr],
        multicast: &'a [MacAddr],
    },
    MacAddr(MacAddr),
    QueuePairs(u16),
    /// RSS_CONFIG: steering, and the TX queues in use.
    Rss(RssConfig),
    /// HASH_CONFIG: hash reports only.
    HashConfig(RssConfig),
    GuestOffloads(u64),
    Vlan {
        vid: u16,
        allowed: bool,
    },
    AnnounceAck,
}

/// Device-side state the control queue can change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlState {
    pub rx: RxState,
    pub max_queue_pairs: u16,
    pub active_queue_pairs: u16,
    pub guest_offloads: u64,
    /// The unicast and multicast lists before the current ones, whose buffers the next
    /// table set reuses (`refill`).
    spare: [Option<MacList>; 2],
}

/// Puts a table set's addresses in `list`. A join storm sends thousands of table sets, each
/// with the whole list: the buffer of the list before the current one is reused once
/// nothing else holds it (the published view moved on), so a table set allocates nothing.
fn refill(list: &mut MacList, spare: &mut Option<MacList>, macs: &[MacAddr]) {
    let reused = spare.take().and_then(|mut s| {
        let v = Arc::get_mut(&mut s)?;
        v.clear();
        v.extend_from_slice(macs);
        Some(s)
    });
    let next = reused.unwrap_or_else(|| Arc::new(macs.to_vec()));
    *spare = Some(std::mem::replace(list, next));
}

impl CtrlState {
    pub fn new(mac: MacAddr, max_queue_pairs: u16) -> Self {
        CtrlState {
            rx: RxState::new(mac),
            max_queue_pairs,
            active_queue_pairs: 1,
            guest_offloads: 0,
            spare: [None, None],
        }
    }

    /// Parses and applies one command (`class, command, data...`, ack excluded). The state is
    /// unchanged when an error is returned; the caller acks VIRTIO_NET_ERR.
    pub fn apply(&mut self, feat: &Negotiated, cmd: &[u8]) -> Result<CtrlOutcome, CtrlError> {
        let c = self.parse(feat, cmd)?;
        Ok(self.execute(c))
    }

    /// Checks one command against the negotiated features and this device, without changing
    /// anything: an error here is the VIRTIO_NET_ERR ack.
    pub fn parse<'a>(&self, feat: &Negotiated, cmd: &'a [u8]) -> Result<ValidCommand<'a>, CtrlError> {
        self.check(feat, cmd).map(ValidCommand)
    }

    fn check<'a>(&self, feat: &Negotiated, cmd: &'a [u8]) -> Result<Cmd<'a>, CtrlError> {
        let h = match cmd {
            [class, command, data @ ..] => Head {
                class: *class,
                cmd: *command,
                data,
            },
            _ => return Err(CtrlError::Truncated(cmd.len())),
        };
        match (u32::from(h.class), u32::from(h.cmd)) {
            (VIRTIO_NET_CTRL_RX, c) if c <= VIRTIO_NET_CTRL_RX_NOBCAST => h.rx_flag(feat, c),
            (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET) => {
                h.need(feat.has(VIRTIO_NET_F_CTRL_RX))?;
                let (unicast, rest) = split_table(h.data)?;
                let (multicast, rest) = split_table(rest)?;
                if !rest.is_empty() {
                    return Err(CtrlError::BadTable("trailing bytes after the multicast table"));
                }
                Ok(Cmd::MacTable { unicast, multicast })
            }
            (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET) => {
                h.need(feat.has(VIRTIO_NET_F_CTRL_MAC_ADDR))?;
                h.exact(6)?;
                let mac = MacAddr::from_slice(h.data).ok_or(CtrlError::Truncated(h.data.len()))?;
                Ok(Cmd::MacAddr(mac))
            }
            (VIRTIO_NET_CTRL_MQ, c) => h.mq(feat, c, self.max_queue_pairs),
            (VIRTIO_NET_CTRL_GUEST_OFFLOADS, VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET) => h.offloads(feat),
            (VIRTIO_NET_CTRL_VLAN, c @ (VIRTIO_NET_CTRL_VLAN_ADD | VIRTIO_NET_CTRL_VLAN_DEL)) => {
                h.need(feat.has(VIRTIO_NET_F_CTRL_VLAN))?;
                h.exact(2)?;
                // A little-endian u16 (virtio 1.2, 5.1.6.5.3); QEMU refuses IDs past 12 bits.
                let vid = u16::from_le_bytes([h.data[0], h.data[1]]);
                if usize::from(vid) >= VLAN_IDS {
                    return Err(CtrlError::BadVlan(vid));
                }
                Ok(Cmd::Vlan {
                    vid,
                    allowed: c == VIRTIO_NET_CTRL_VLAN_ADD,
                })
            }
            (VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK) => {
                h.need(feat.has(VIRTIO_NET_F_GUEST_ANNOUNCE))?;
                h.exact(0)?;
                Ok(Cmd::AnnounceAck)
            }
            _ => Err(h.unknown()),
        }
    }

    /// Applies a command `parse` accepted.
    pub fn execute(&mut self, c: ValidCommand<'_>) -> CtrlOutcome {
        match c.0 {
            Cmd::RxFlag { which, on } => {
                let m = &mut self.rx.mode;
                let flag = match which {
                    VIRTIO_NET_CTRL_RX_PROMISC => &mut m.promisc,
                    VIRTIO_NET_CTRL_RX_ALLMULTI => &mut m.allmulti,
                    VIRTIO_NET_CTRL_RX_ALLUNI => &mut m.alluni,
                    VIRTIO_NET_CTRL_RX_NOMULTI => &mut m.nomulti,
                    VIRTIO_NET_CTRL_RX_NOUNI => &mut m.nouni,
                    _ => &mut m.nobcast,
                };
                *flag = on;
                CtrlOutcome::RxMode
            }
            Cmd::MacTable { unicast, multicast } => {
                refill(&mut self.rx.unicast, &mut self.spare[0], unicast);
                refill(&mut self.rx.multicast, &mut self.spare[1], multicast);
                CtrlOutcome::MacTable
            }
            Cmd::MacAddr(mac) => {
                self.rx.mac = mac;
                CtrlOutcome::MacAddr
            }
            Cmd::QueuePairs(n) => {
                self.active_queue_pairs = n;
                CtrlOutcome::QueuePairs(n)
            }
            Cmd::Rss(c) => {
                // max_tx_vq plays VQ_PAIRS_SET's part when RSS is on.
                self.active_queue_pairs = c.max_tx_vq;
                CtrlOutcome::Rss(c)
            }
            Cmd::HashConfig(c) => CtrlOutcome::Rss(c),
            Cmd::GuestOffloads(bits) => {
                self.guest_offloads = bits;
                CtrlOutcome::GuestOffloads(bits)
            }
            Cmd::Vlan { vid, allowed } => CtrlOutcome::Vlan { vid, allowed },
            Cmd::AnnounceAck => CtrlOutcome::AnnounceAck,
        }
    }
}

/// A command's class, command and data, as `CtrlState::check` takes it apart.
struct Head<'a> {
    class: u8,
    cmd: u8,
    data: &'a [u8],
}

impl<'a> Head<'a> {
    /// The command needs a feature the driver acked.
    fn need(&self, ok: bool) -> Result<(), CtrlError> {
        if ok {
            Ok(())
        } else {
            Err(CtrlError::NotNegotiated {
                class: self.class,
                cmd: self.cmd,
            })
        }
    }

    /// The command's data is exactly `want` bytes.
    fn exact(&self, want: usize) -> Result<(), CtrlError> {
        if self.data.len() == want {
            Ok(())
        } else {
            Err(CtrlError::BadLength {
                class: self.class,
                cmd: self.cmd,
                got: self.data.len(),
                want,
            })
        }
    }

    fn unknown(&self) -> CtrlError {
        CtrlError::Unknown {
            class: self.class,
            cmd: self.cmd,
        }
    }

    /// CTRL_RX: one flag, on or off; the last four need CTRL_RX_EXTRA.
    fn rx_flag(&self, feat: &Negotiated, which: u32) -> Result<Cmd<'a>, CtrlError> {
        self.need(feat.has(VIRTIO_NET_F_CTRL_RX))?;
        if which > VIRTIO_NET_CTRL_RX_ALLMULTI {
            self.need(feat.rx_extra())?;
        }
        self.exact(1)?;
        let on = match self.data[0] {
            0 => false,
            1 => true,
            v => return Err(CtrlError::BadFlag(v)),
        };
        Ok(Cmd::RxFlag { which, on })
    }

    /// CTRL_MQ: queue pairs, RSS or hash-report configuration.
    fn mq(&self, feat: &Negotiated, which: u32, max_pairs: u16) -> Result<Cmd<'a>, CtrlError> {
        match which {
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET => {
                self.need(feat.mq())?;
                self.exact(2)?;
                let n = u16::from_le_bytes([self.data[0], self.data[1]]);
                if n == 0 || n > max_pairs {
                    return Err(CtrlError::BadQueuePairs(n, max_pairs));
                }
                Ok(Cmd::QueuePairs(n))
            }
            VIRTIO_NET_CTRL_MQ_RSS_CONFIG => {
                self.need(feat.rss())?;
                let c = RssConfig::parse_rss(self.data, max_pairs).map_err(CtrlError::Rss)?;
                Ok(Cmd::Rss(c))
            }
            VIRTIO_NET_CTRL_MQ_HASH_CONFIG => {
                self.need(feat.hash_report())?;
                Ok(Cmd::HashConfig(
                    RssConfig::parse_hash(self.data).map_err(CtrlError::Rss)?,
                ))
            }
            _ => Err(self.unknown()),
        }
    }

    /// CTRL_GUEST_OFFLOADS_SET: only offloads the driver acked.
    fn offloads(&self, feat: &Negotiated) -> Result<Cmd<'a>, CtrlError> {
        self.need(feat.has(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS))?;
        self.exact(8)?;
        let mut le = [0u8; 8];
        le.copy_from_slice(self.data);
        let offloads = u64::from_le_bytes(le);
        if offloads & !(feat.bits & GUEST_OFFLOAD_MASK) != 0 {
            return Err(CtrlError::BadOffloads(offloads));
        }
        Ok(Cmd::GuestOffloads(offloads))
    }
}

/// One `le32 entries; u8 macs[entries][6]` table, read in place: its addresses and the bytes
/// after it.
fn split_table(b: &[u8]) -> Result<(&[MacAddr], &[u8]), CtrlError> {
    let (count, rest) = b
        .split_first_chunk::<4>()
        .ok_or(CtrlError::BadTable("truncated entry count"))?;
    let n = u32::from_le_bytes(*count) as usize;
    // zerocopy checks the guest-controlled count against the buffer (overflow included).
    // Its only possible failure is a size error, which says no more than these two numbers.
    match <[MacAddr]>::ref_from_prefix_with_elems(rest, n) {
        Ok(split) => Ok(split),
        Err(_) => Err(CtrlError::TableOverrun {
            entries: n,
            left: rest.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_features() -> Negotiated {
        Negotiated {
            bits: crate::device::features::offered(4) | (1 << VIRTIO_NET_F_GUEST_CSUM),
        }
    }

    fn state() -> CtrlState {
        CtrlState::new("52:54:00:00:00:01".parse().unwrap(), 4)
    }

    /// A table set reuses the buffer of the list before the current one, but never one a
    /// reader (the published view, a `ctl filter` answer) still holds.
    #[test]
    fn table_sets_reuse_a_list_nobody_holds_and_keep_one_that_is_held() {
        let f = all_features();
        let mut s = state();
        let lists = [
            [[1, 0, 0x5e, 0, 0, 1]],
            [[1, 0, 0x5e, 0, 0, 2]],
            [[1, 0, 0x5e, 0, 0, 3]],
        ];
        s.apply(&f, &table_cmd(&[], &lists[0])).unwrap();
        let first = s.rx.multicast.as_ptr();
        s.apply(&f, &table_cmd(&[], &lists[1])).unwrap();
        s.apply(&f, &table_cmd(&[], &lists[2])).unwrap();
        assert_eq!(
            s.rx.multicast.as_ptr(),
            first,
            "the first list's buffer was reused"
        );
        assert_eq!(&s.rx.multicast[..], &[MacAddr(lists[2][0])]);
        let held = s.rx.multicast.clone();
        s.apply(&f, &table_cmd(&[], &lists[0])).unwrap();
        s.apply(&f, &table_cmd(&[], &lists[1])).unwrap();
        assert_eq!(
            &held[..],
            &[MacAddr(lists[2][0])],
            "a held list is never rewritten"
        );
        assert_eq!(&s.rx.multicast[..], &[MacAddr(lists[1][0])]);
    }

    fn table_cmd(uni: &[[u8; 6]], multi: &[[u8; 6]]) -> Vec<u8> {
        let mut v = vec![VIRTIO_NET_CTRL_MAC as u8, VIRTIO_NET_CTRL_MAC_TABLE_SET as u8];
        for t in [uni, multi] {
            v.extend_from_slice(&(t.len() as u32).to_le_bytes());
            for m in t {
                v.extend_from_slice(m);
            }
        }
        v
    }

    #[test]
    fn rx_mode_commands() {
        let mut s = state();
        let f = all_features();
        assert_eq!(s.apply(&f, &[0, 0, 0]), Ok(CtrlOutcome::RxMode));
        assert!(!s.rx.mode.promisc);
        s.apply(&f, &[0, 1, 1]).unwrap();
        assert!(s.rx.mode.allmulti);
        s.apply(&f, &[0, 5, 1]).unwrap();
        assert!(s.rx.mode.nobcast);
        assert_eq!(s.apply(&f, &[0, 0, 2]), Err(CtrlError::BadFlag(2)));
        assert!(matches!(s.apply(&f, &[0, 0]), Err(CtrlError::BadLength { .. })));
        assert!(matches!(s.apply(&f, &[0, 6, 1]), Err(CtrlError::Unknown { .. })));
        let no_extra = Negotiated {
            bits: 1 << VIRTIO_NET_F_CTRL_RX,
        };
        assert!(matches!(
            s.apply(&no_extra, &[0, 3, 1]),
            Err(CtrlError::NotNegotiated { .. })
        ));
    }

    #[test]
    fn mac_table_set_replaces_both_tables() {
        let mut s = state();
        let f = all_features();
        let m1 = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01];
        let m2 = [0x33, 0x33, 0x00, 0x00, 0x00, 0x01];
        let u1 = [0x02, 0, 0, 0, 0, 9];
        s.apply(&f, &table_cmd(&[u1], &[m1, m2])).unwrap();
        assert_eq!(&s.rx.unicast[..], &[MacAddr(u1)]);
        assert_eq!(&s.rx.multicast[..], &[MacAddr(m1), MacAddr(m2)]);
        s.apply(&f, &table_cmd(&[], &[])).unwrap();
        assert!(s.rx.unicast.is_empty() && s.rx.multicast.is_empty());
    }

    #[test]
    fn bad_tables_leave_state_unchanged() {
        let f = all_features();
        let mut s = state();
        s.apply(&f, &table_cmd(&[], &[[1, 0, 0x5e, 0, 0, 1]])).unwrap();
        let before = s.clone();
        let mut lying = table_cmd(&[], &[[1, 0, 0x5e, 0, 0, 2]]);
        lying[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        for bad in [
            vec![1u8, 0],
            vec![1, 0, 1, 0],
            lying,
            {
                let mut t = table_cmd(&[], &[]);
                t.push(0);
                t
            },
            {
                let mut t = table_cmd(&[[2, 0, 0, 0, 0, 1]], &[]);
                t.truncate(t.len() - 5);
                t
            },
        ] {
            assert!(s.apply(&f, &bad).is_err(), "{bad:?} accepted");
            assert_eq!(s, before);
        }
    }

    #[test]
    fn mac_addr_queue_pairs_and_offloads() {
        let f = all_features();
        let mut s = state();
        s.apply(&f, &[1, 1, 2, 0, 0, 0, 0, 7]).unwrap();
        assert_eq!(s.rx.mac.to_string(), "02:00:00:00:00:07");
        assert_eq!(s.apply(&f, &[4, 0, 3, 0]), Ok(CtrlOutcome::QueuePairs(3)));
        assert_eq!(s.apply(&f, &[4, 0, 5, 0]), Err(CtrlError::BadQueuePairs(5, 4)));
        assert_eq!(s.apply(&f, &[4, 0, 0, 0]), Err(CtrlError::BadQueuePairs(0, 4)));
        let csum = 1u64 << VIRTIO_NET_F_GUEST_CSUM;
        let mut cmd = vec![5, 0];
        cmd.extend_from_slice(&csum.to_le_bytes());
        assert_eq!(s.apply(&f, &cmd), Ok(CtrlOutcome::GuestOffloads(csum)));
        let mut cmd = vec![5, 0];
        cmd.extend_from_slice(&(1u64 << VIRTIO_NET_F_GUEST_UFO).to_le_bytes());
        assert!(matches!(s.apply(&f, &cmd), Err(CtrlError::BadOffloads(_))));
        assert_eq!(s.apply(&f, &[]), Err(CtrlError::Truncated(0)));
    }

    /// VLAN_ADD and VLAN_DEL: a little-endian ID of 12 bits, with CTRL_VLAN acked.
    #[test]
    fn vlan_commands() {
        let f = all_features();
        let mut s = state();
        assert_eq!(
            s.apply(&f, &[2, 0, 0x64, 0]),
            Ok(CtrlOutcome::Vlan {
                vid: 100,
                allowed: true
            })
        );
        assert_eq!(
            s.apply(&f, &[2, 1, 0xff, 0x0f]),
            Ok(CtrlOutcome::Vlan {
                vid: 4095,
                allowed: false
            })
        );
        assert_eq!(s.apply(&f, &[2, 0, 0, 0x10]), Err(CtrlError::BadVlan(4096)));
        assert!(matches!(
            s.apply(&f, &[2, 0, 1]),
            Err(CtrlError::BadLength { .. })
        ));
        assert!(matches!(
            s.apply(&f, &[2, 2, 1, 0]),
            Err(CtrlError::Unknown { .. })
        ));
        let without = Negotiated {
            bits: f.bits & !(1 << VIRTIO_NET_F_CTRL_VLAN),
        };
        assert!(matches!(
            s.apply(&without, &[2, 0, 1, 0]),
            Err(CtrlError::NotNegotiated { .. })
        ));
    }

    /// ANNOUNCE_ACK: no data, with GUEST_ANNOUNCE acked.
    #[test]
    fn announce_ack() {
        let f = all_features();
        let mut s = state();
        assert_eq!(s.apply(&f, &[3, 0]), Ok(CtrlOutcome::AnnounceAck));
        assert!(matches!(
            s.apply(&f, &[3, 0, 1]),
            Err(CtrlError::BadLength { .. })
        ));
        assert!(matches!(s.apply(&f, &[3, 1]), Err(CtrlError::Unknown { .. })));
        let without = Negotiated {
            bits: f.bits & !(1 << VIRTIO_NET_F_GUEST_ANNOUNCE),
        };
        assert!(matches!(
            s.apply(&without, &[3, 0]),
            Err(CtrlError::NotNegotiated { .. })
        ));
    }
}
