//! What a frontend may ask of a port, checked by the relay before the request handler sees
//! a message: only requests for what was offered and negotiated, only features that were
//! offered, queue indexes within the device, ring sizes a split ring can have, and memory
//! tables of the size vhost-user allows without CONFIGURE_MEM_SLOTS. A frontend that breaks
//! these rules is a broken or compromised QEMU: what it asks is refused, and counted.
//!
//! The vhost crate (0.18) and vhost-user-backend (0.24) record whatever protocol features a
//! frontend acks and serve requests for features never offered (ADD_MEM_REG with
//! CONFIGURE_MEM_SLOTS, each region holding a descriptor, for one): this is where the
//! offer is made to hold.

use thiserror::Error;
use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};

/// Memory regions one SET_MEM_TABLE may carry: VHOST_MEMORY_BASELINE_NREGIONS, the limit
/// without CONFIGURE_MEM_SLOTS (vhost-user spec, "Memory region description"); QEMU and
/// DPDK's virtio-user keep to it.
pub const MAX_REGIONS: usize = 8;

/// Descriptors one connection may hold at once: the connection and the relay's ends of it
/// (12); per worker thread (`pairs` + 1) an epoll set, its enable event, and the session's
/// attach, again and exit events (8); per queue (2 `pairs` + 1) a kick, a call and an
/// error eventfd, each possibly twice while the frontend replaces it (6); the memory table
/// twice while it is replaced; the channel for config changes, twice while it is
/// replaced (2); and one message's descriptors in flight in the relay.
pub fn descriptors(pairs: u64) -> u64 {
    let in_flight = vhost::vhost_user::message::MAX_ATTACHED_FD_ENTRIES as u64;
    14 + 8 * (pairs + 1) + 6 * (2 * pairs + 1) + 2 * MAX_REGIONS as u64 + in_flight
}

/// What the port offers a frontend.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    /// Virtio feature bits (GET_FEATURES), vhost-user's own bit 30 included.
    pub features: u64,
    /// Protocol feature bits (GET_PROTOCOL_FEATURES).
    pub protocol: u64,
    /// Queues the device has (GET_QUEUE_NUM with MQ).
    pub queues: u32,
    /// The largest ring (SET_VRING_NUM).
    pub max_ring: u32,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("not served (it needs a feature this backend does not offer)")]
    NotServed,
    #[error("it needs protocol feature {feature}, which was not negotiated")]
    NotNegotiated { feature: &'static str },
    #[error("the frontend acked virtio features {extra:#x} that were not offered")]
    Features { extra: u64 },
    #[error("the frontend acked protocol features {extra:#x} that were not offered")]
    ProtocolFeatures { extra: u64 },
    #[error("queue {index}: the device has {queues}")]
    Queue { index: u32, queues: u32 },
    #[error("SET_VRING_NUM {num}: a split ring holds a power of two of 1 to {max} entries")]
    RingSize { num: u32, max: u32 },
    #[error("a memory table of {regions} regions: at most {MAX_REGIONS} without CONFIGURE_MEM_SLOTS")]
    Regions { regions: u64 },
    #[error("a body of {len} bytes is too short")]
    Short { len: usize },
}

/// The rules one connection is held to, and what it negotiated so far.
#[derive(Debug)]
pub struct Policy {
    offer: Offer,
    protocol: u64,
}

/// The protocol features every port offers: several queue pairs, an answer to each request
/// that asks for one, the config space (MAC, status, MTU) read through GET_CONFIG, and a
/// channel to the frontend on which the port says that config space changed (the link, an
/// announce: the relay keeps that channel, relay.rs).
pub const PROTOCOL: VhostUserProtocolFeatures = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CONFIG)
    .union(VhostUserProtocolFeatures::BACKEND_REQ);

/// A request's name as vhost-user spells it (`SET_MEM_TABLE`), or its number.
pub fn request_name(code: u32) -> String {
    match FrontendReq::try_from(code) {
        Ok(r) => format!("{r:?}"),
        Err(_) => format!("request {code}"),
    }
}

/// The little-endian u32 at `at` of `body`.
fn le32(body: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?))
}

fn le64(body: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
}

impl Policy {
    pub fn new(offer: Offer) -> Self {
        Policy { offer, protocol: 0 }
    }

    /// Whether REPLY_ACK was negotiated: a refused request that asked for an answer then
    /// gets a failure ack, not the end of the connection.
    pub fn reply_ack(&self) -> bool {
        self.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    /// Checks one request with its body; on success, records what it negotiates.
    pub fn check(&mut self, request: u32, body: &[u8]) -> Result<(), PolicyError> {
        let short = || PolicyError::Short { len: body.len() };
        let Ok(req) = FrontendReq::try_from(request) else {
            return Err(PolicyError::NotServed);
        };
        match req {
            FrontendReq::GET_FEATURES
            | FrontendReq::SET_OWNER
            | FrontendReq::RESET_OWNER
            | FrontendReq::GET_PROTOCOL_FEATURES => Ok(()),
            FrontendReq::SET_FEATURES => {
                let extra = le64(body, 0).ok_or_else(short)? & !self.offer.features;
                if extra != 0 {
                    return Err(PolicyError::Features { extra });
                }
                Ok(())
            }
            FrontendReq::SET_PROTOCOL_FEATURES => {
                let acked = le64(body, 0).ok_or_else(short)?;
                let extra = acked & !self.offer.protocol;
                if extra != 0 {
                    return Err(PolicyError::ProtocolFeatures { extra });
                }
                self.protocol = acked;
                Ok(())
            }
            FrontendReq::SET_MEM_TABLE => {
                let regions = le32(body, 0).ok_or_else(short)?;
                if regions as usize > MAX_REGIONS {
                    return Err(PolicyError::Regions {
                        regions: u64::from(regions),
                    });
                }
                Ok(())
            }
            FrontendReq::SET_VRING_NUM => {
                self.queue(le32(body, 0).ok_or_else(short)?)?;
                let num = le32(body, 4).ok_or_else(short)?;
                if num == 0 || !num.is_power_of_two() || num > self.offer.max_ring {
                    return Err(PolicyError::RingSize {
                        num,
                        max: self.offer.max_ring,
                    });
                }
                Ok(())
            }
            FrontendReq::SET_VRING_ADDR
            | FrontendReq::SET_VRING_BASE
            | FrontendReq::GET_VRING_BASE
            | FrontendReq::SET_VRING_ENABLE => self.queue(le32(body, 0).ok_or_else(short)?),
            FrontendReq::SET_VRING_KICK | FrontendReq::SET_VRING_CALL | FrontendReq::SET_VRING_ERR => {
                let index = le64(body, 0).ok_or_else(short)? & 0xff;
                self.queue(index as u32)
            }
            FrontendReq::GET_QUEUE_NUM => self.needs(VhostUserProtocolFeatures::MQ, "MQ"),
            FrontendReq::GET_CONFIG | FrontendReq::SET_CONFIG => {
                self.needs(VhostUserProtocolFeatures::CONFIG, "CONFIG")
            }
            FrontendReq::SET_BACKEND_REQ_FD => {
                self.needs(VhostUserProtocolFeatures::BACKEND_REQ, "BACKEND_REQ")
            }
            _ => Err(PolicyError::NotServed),
        }
    }

    /// Whether a refused `request` may be answered with a failure ack: REPLY_ACK was
    /// negotiated, the frontend asked for an answer, and the request is a known one with no
    /// answer of its own (a GET_* waits for its value, not for a status; an unknown one's
    /// answer cannot be known). Otherwise the connection ends.
    pub fn may_fail_ack(&self, request: u32, need_reply: bool) -> bool {
        let own_reply = match FrontendReq::try_from(request) {
            Ok(r) => matches!(
                r,
                FrontendReq::GET_FEATURES
                    | FrontendReq::GET_PROTOCOL_FEATURES
                    | FrontendReq::GET_VRING_BASE
                    | FrontendReq::GET_QUEUE_NUM
                    | FrontendReq::GET_CONFIG
                    | FrontendReq::GET_INFLIGHT_FD
                    | FrontendReq::GET_MAX_MEM_SLOTS
                    | FrontendReq::SET_LOG_BASE
                    | FrontendReq::POSTCOPY_ADVISE
                    | FrontendReq::GET_STATUS
                    | FrontendReq::GET_SHARED_OBJECT
                    | FrontendReq::SET_DEVICE_STATE_FD
                    | FrontendReq::CHECK_DEVICE_STATE
            ),
            Err(_) => true,
        };
        self.reply_ack() && need_reply && !own_reply
    }

    fn queue(&self, index: u32) -> Result<(), PolicyError> {
        if index >= self.offer.queues {
            return Err(PolicyError::Queue {
                index,
                queues: self.offer.queues,
            });
        }
        Ok(())
    }

    fn needs(&self, f: VhostUserProtocolFeatures, feature: &'static str) -> Result<(), PolicyError> {
        if self.protocol & f.bits() == 0 {
            return Err(PolicyError::NotNegotiated { feature });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTOCOL: u64 = 0x1 | 0x8 | 0x20 | 0x200; // MQ, REPLY_ACK, BACKEND_REQ, CONFIG

    #[test]
    fn the_test_offer_is_the_ports() {
        assert_eq!(PROTOCOL, super::PROTOCOL.bits());
    }

    fn policy() -> Policy {
        Policy::new(Offer {
            features: 1 << 32 | 1 << 30 | 1 << 5,
            protocol: PROTOCOL,
            queues: 3,
            max_ring: 1024,
        })
    }

    fn state(index: u32, num: u32) -> Vec<u8> {
        [index.to_le_bytes(), num.to_le_bytes()].concat()
    }

    fn req(r: FrontendReq) -> u32 {
        r as u32
    }

    #[test]
    fn only_what_was_offered_is_accepted() {
        let mut p = policy();
        assert_eq!(
            p.check(req(FrontendReq::SET_FEATURES), &(1u64 << 32).to_le_bytes()),
            Ok(())
        );
        assert_eq!(
            p.check(
                req(FrontendReq::SET_FEATURES),
                &(1u64 << 33 | 1 << 32).to_le_bytes()
            ),
            Err(PolicyError::Features { extra: 1 << 33 })
        );
        // CONFIGURE_MEM_SLOTS acked though never offered: refused, and not recorded.
        let slots = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();
        assert_eq!(
            p.check(
                req(FrontendReq::SET_PROTOCOL_FEATURES),
                &(PROTOCOL | slots).to_le_bytes()
            ),
            Err(PolicyError::ProtocolFeatures { extra: slots })
        );
        for r in [
            FrontendReq::GET_MAX_MEM_SLOTS,
            FrontendReq::ADD_MEM_REG,
            FrontendReq::REM_MEM_REG,
            FrontendReq::RESET_DEVICE,
            FrontendReq::SET_LOG_BASE,
        ] {
            assert!(
                matches!(p.check(req(r), &[0; 64]), Err(PolicyError::NotServed)),
                "{r:?}"
            );
        }
        assert!(matches!(p.check(999, &[]), Err(PolicyError::NotServed)));
        // GET_CONFIG and the backend channel only once negotiated.
        assert!(matches!(
            p.check(req(FrontendReq::SET_BACKEND_REQ_FD), &[0; 8]),
            Err(PolicyError::NotNegotiated {
                feature: "BACKEND_REQ",
                ..
            })
        ));
        assert!(matches!(
            p.check(req(FrontendReq::GET_CONFIG), &[0; 12]),
            Err(PolicyError::NotNegotiated {
                feature: "CONFIG",
                ..
            })
        ));
        assert_eq!(
            p.check(req(FrontendReq::SET_PROTOCOL_FEATURES), &PROTOCOL.to_le_bytes()),
            Ok(())
        );
        assert!(p.reply_ack());
        assert_eq!(p.check(req(FrontendReq::GET_CONFIG), &[0; 12]), Ok(()));
        assert_eq!(p.check(req(FrontendReq::SET_BACKEND_REQ_FD), &[0; 8]), Ok(()));
        // A failure ack only where a status is the answer the frontend waits for.
        assert!(p.may_fail_ack(req(FrontendReq::ADD_MEM_REG), true));
        assert!(!p.may_fail_ack(req(FrontendReq::ADD_MEM_REG), false));
        assert!(!p.may_fail_ack(req(FrontendReq::GET_MAX_MEM_SLOTS), true));
        assert!(!p.may_fail_ack(999, true));
    }

    #[test]
    fn queues_ring_sizes_and_memory_tables_are_bounded() {
        let mut p = policy();
        assert_eq!(p.check(req(FrontendReq::SET_VRING_NUM), &state(2, 256)), Ok(()));
        for (index, num) in [(3, 256), (2, 3), (2, 0), (2, 2048)] {
            assert!(
                p.check(req(FrontendReq::SET_VRING_NUM), &state(index, num))
                    .is_err(),
                "{index} {num}"
            );
        }
        assert!(matches!(
            p.check(req(FrontendReq::SET_VRING_ENABLE), &state(1000, 1)),
            Err(PolicyError::Queue { index: 1000, .. })
        ));
        // KICK/CALL/ERR: the index is the low byte of a u64 (bit 8: no descriptor).
        assert_eq!(
            p.check(req(FrontendReq::SET_VRING_KICK), &(1u64 << 8 | 2).to_le_bytes()),
            Ok(())
        );
        assert!(p
            .check(req(FrontendReq::SET_VRING_CALL), &5u64.to_le_bytes())
            .is_err());
        let table = |n: u32| [n.to_le_bytes(), [0; 4]].concat();
        assert_eq!(p.check(req(FrontendReq::SET_MEM_TABLE), &table(8)), Ok(()));
        assert_eq!(
            p.check(req(FrontendReq::SET_MEM_TABLE), &table(9)),
            Err(PolicyError::Regions { regions: 9 })
        );
        assert!(matches!(
            p.check(req(FrontendReq::SET_VRING_BASE), &[0; 3]),
            Err(PolicyError::Short { .. })
        ));
    }
}
