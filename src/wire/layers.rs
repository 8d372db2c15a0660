//! Where a frame's layers lie, found by one parse and handed down the pipeline: the checksum
//! actions' match and update and RSS read it instead of each walking the VLAN tags, the IP
//! header and IPv6's extension headers again (DPDK's mbuf carries the same as
//! `packet_type` and its layer lengths).
//!
//! A layers records where each header is and what it is, never a field's value. The pipeline
//! rewrites MACs, TTLs, addresses (an echo reply) and checksums in place; none of that moves
//! a layer, so a layers stays true of its frame from ingress to the last port
//! ([`crate::pipeline::Packet::layers`] checks that in debug builds). Users still read the
//! frame through the `new_checked` views at the offsets given here, so a layers that did not
//! belong to its frame could give a wrong answer, never a read out of bounds.

use std::net::IpAddr;

use super::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::ip::{network_offset, Ipv4Packet, Ipv6Packet, Ipv6Upper};

/// What lies at a frame's network offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Not IP: another EtherType, or VLAN tags that run past the frame.
    Other,
    /// An IPv4 EtherType whose header fails [`Ipv4Packet::new_checked`] (which says why).
    BadV4,
    /// An IPv6 EtherType whose header fails [`Ipv6Packet::new_checked`] (which says why).
    BadV6,
    /// An IPv4 header that passes [`Ipv4Packet::new_checked`].
    V4,
    /// An IPv6 fixed header that passes [`Ipv6Packet::new_checked`]; [`Layers::upper`] says
    /// what lies after its extension headers.
    V6,
}

/// What [`Ipv6Packet::upper`] found, kept flat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upper {
    /// Not IPv6, or the extension headers run past the packet (`IpError::BadExtension`,
    /// `upper`'s only error).
    None,
    Opaque,
    Found,
}

/// A frame's layers: the EtherType after its tags, where the network header starts, what
/// that header is, and for IPv6 where its upper layer starts.
///
/// Flat, naturally aligned fields: the packet keeps one and hands out copies, which are read
/// back right after they are written (nested enums would pack their tags at odd offsets,
/// which defeats store-to-load forwarding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layers {
    /// The EtherType after the tags (0 with no network offset).
    ethertype: u16,
    /// Offset of the network header; 0 for a frame too short to hold its own tags (a
    /// network header is never at 0).
    l3: u16,
    pub network: Network,
    upper: Upper,
    upper_proto: u8,
    /// Offset of the upper layer from the network header (`Ipv6Upper::Found::offset`).
    upper_at: u32,
    upper_packet_len: usize,
}

impl Layers {
    /// Parses `frame` once: its tags, its IP header and IPv6's extension headers.
    #[inline]
    pub fn parse(frame: &[u8]) -> Self {
        let mut l = Layers {
            ethertype: 0,
            l3: 0,
            network: Network::Other,
            upper: Upper::None,
            upper_proto: 0,
            upper_at: 0,
            upper_packet_len: 0,
        };
        // Tags end at most 2 + 3 * 4 bytes past the EtherType field: the offset fits.
        let Some((ty, at)) = network_offset(frame) else {
            return l;
        };
        let Ok(l3) = u16::try_from(at) else { return l };
        (l.ethertype, l.l3) = (ty, l3);
        let ip = frame.get(at..).unwrap_or_default();
        l.network = match ty {
            ETHERTYPE_IPV4 if Ipv4Packet::new_checked(ip).is_ok() => Network::V4,
            ETHERTYPE_IPV4 => Network::BadV4,
            ETHERTYPE_IPV6 => match Ipv6Packet::new_checked(ip) {
                Ok(p) => {
                    match p.upper() {
                        Ok(Ipv6Upper::Found {
                            proto,
                            offset,
                            packet_len,
                        }) => {
                            // Within the frame, so within u32.
                            if let Ok(at) = u32::try_from(offset) {
                                (l.upper, l.upper_proto, l.upper_at) = (Upper::Found, proto, at);
                                l.upper_packet_len = packet_len;
                            }
                        }
                        Ok(Ipv6Upper::Opaque) => l.upper = Upper::Opaque,
                        Err(_) => {}
                    }
                    Network::V6
                }
                Err(_) => Network::BadV6,
            },
            _ => Network::Other,
        };
        l
    }

    /// [`network_offset`]'s answer: the EtherType after the tags and where its header
    /// starts; `None` for a frame too short to hold its own tags.
    #[inline]
    pub fn l3(&self) -> Option<(u16, usize)> {
        (self.l3 != 0).then_some((self.ethertype, usize::from(self.l3)))
    }

    /// What follows an IPv6 header's extension headers, as [`Ipv6Packet::upper`] said;
    /// `None` where they run past the packet, and for other frames.
    #[inline]
    pub fn upper(&self) -> Option<Ipv6Upper> {
        match self.upper {
            Upper::None => None,
            Upper::Opaque => Some(Ipv6Upper::Opaque),
            Upper::Found => Some(Ipv6Upper::Found {
                proto: self.upper_proto,
                offset: self.upper_at as usize,
                packet_len: self.upper_packet_len,
            }),
        }
    }

    /// The network header and what follows it, when there is one.
    #[inline]
    pub fn ip<'f>(&self, frame: &'f [u8]) -> Option<&'f [u8]> {
        self.l3().and_then(|(_, at)| frame.get(at..))
    }

    /// [`Layers::ip`], writable.
    #[inline]
    pub fn ip_mut<'f>(&self, frame: &'f mut [u8]) -> Option<&'f mut [u8]> {
        self.l3().and_then(|(_, at)| frame.get_mut(at..))
    }

    /// The upper-layer protocol and both addresses of an IP frame, for matching: IPv6's
    /// protocol after its extension headers where they lead to one, else its next header.
    pub fn addresses(&self, frame: &[u8]) -> Option<(u8, IpAddr, IpAddr)> {
        let ip = self.ip(frame)?;
        match self.network {
            Network::V4 => {
                let p = Ipv4Packet::new_checked(ip).ok()?;
                Some((p.protocol(), p.src().into(), p.dst().into()))
            }
            Network::V6 => {
                let p = Ipv6Packet::new_checked(ip).ok()?;
                let proto = match self.upper() {
                    Some(Ipv6Upper::Found { proto, .. }) => proto,
                    _ => p.next_header(),
                };
                Some((proto, p.src().into(), p.dst().into()))
            }
            Network::Other | Network::BadV4 | Network::BadV6 => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ip::{ETHERTYPE_VLAN, PROTO_TCP, PROTO_UDP};
    use proptest::prelude::*;

    fn frame(ty: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    fn ipv4(proto: u8) -> Vec<u8> {
        let mut ip = vec![
            0x45, 0, 0, 28, 0, 1, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 1, 2,
        ];
        ip.extend_from_slice(&[0; 8]);
        ip
    }

    /// A fixed IPv6 header with one hop-by-hop header (8 bytes of padding) before UDP.
    fn ipv6_hop_udp() -> Vec<u8> {
        let mut ip = vec![0x60, 0, 0, 0, 0, 16, 0, 64];
        ip.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        ip.extend_from_slice(&[0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16]);
        ip.extend_from_slice(&[PROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
        ip.extend_from_slice(&[0; 8]);
        ip
    }

    #[test]
    fn finds_each_family_and_says_why_a_header_is_bad() {
        let v4 = frame(ETHERTYPE_IPV4, &ipv4(PROTO_TCP));
        let l = Layers::parse(&v4);
        assert_eq!(l.l3(), Some((ETHERTYPE_IPV4, 14)));
        assert_eq!(l.network, Network::V4);
        assert_eq!(
            l.addresses(&v4),
            Some((
                PROTO_TCP,
                "10.0.0.1".parse().unwrap(),
                "10.0.1.2".parse().unwrap()
            ))
        );

        // Behind a VLAN tag, the extension header is walked to UDP at 40 + 8.
        let mut tagged = frame(ETHERTYPE_VLAN, &[0, 7]);
        tagged.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        tagged.extend_from_slice(&ipv6_hop_udp());
        let l = Layers::parse(&tagged);
        assert_eq!(l.l3(), Some((ETHERTYPE_IPV6, 18)));
        assert_eq!(l.network, Network::V6);
        assert_eq!(
            l.upper(),
            Some(Ipv6Upper::Found {
                proto: PROTO_UDP,
                offset: 48,
                packet_len: 56,
            })
        );
        assert_eq!(l.addresses(&tagged).map(|(p, _, _)| p), Some(PROTO_UDP));

        // An IPv4 EtherType with a version-6 header, a truncated one, ARP, a runt.
        let mut wrong = ipv4(PROTO_UDP);
        wrong[0] = 0x65;
        assert_eq!(
            Layers::parse(&frame(ETHERTYPE_IPV4, &wrong)).network,
            Network::BadV4
        );
        assert_eq!(
            Layers::parse(&frame(ETHERTYPE_IPV6, &[0x60; 39])).network,
            Network::BadV6
        );
        assert_eq!(
            Layers::parse(&frame(ETHERTYPE_IPV4, &[0x45; 10])).network,
            Network::BadV4
        );
        let arp = frame(0x0806, &[0; 28]);
        assert_eq!(Layers::parse(&arp).network, Network::Other);
        assert_eq!(Layers::parse(&arp).addresses(&arp), None);
        let runt = Layers::parse(&[0u8; 5]);
        assert_eq!(
            (runt.l3(), runt.network, runt.upper()),
            (None, Network::Other, None)
        );
    }

    proptest! {
        /// On any bytes, after any tags, the layers's answers are the ones each user got from
        /// its own parse before there was a layers.
        #[test]
        fn answers_as_a_fresh_parse_does(
            tags in 0usize..3,
            ty in prop_oneof![Just(ETHERTYPE_IPV4), Just(ETHERTYPE_IPV6), any::<u16>()],
            body in proptest::collection::vec(any::<u8>(), 0..120),
            version in prop_oneof![Just(0x45u8), Just(0x46u8), Just(0x60u8), any::<u8>()],
        ) {
            let mut f = vec![0u8; 12];
            for _ in 0..tags {
                f.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                f.extend_from_slice(&[0, 1]);
            }
            f.extend_from_slice(&ty.to_be_bytes());
            f.push(version);
            f.extend_from_slice(&body);
            let l = Layers::parse(&f);
            prop_assert_eq!(l.l3(), network_offset(&f));
            let ip = l.ip(&f).unwrap_or_default();
            let want = match l.l3() {
                Some((ETHERTYPE_IPV4, _)) => Ipv4Packet::new_checked(ip).map(|p| {
                    (p.protocol(), IpAddr::from(p.src()), IpAddr::from(p.dst()))
                }).ok(),
                Some((ETHERTYPE_IPV6, _)) => Ipv6Packet::new_checked(ip).map(|p| {
                    let proto = match p.upper() {
                        Ok(Ipv6Upper::Found { proto, .. }) => proto,
                        _ => p.next_header(),
                    };
                    (proto, IpAddr::from(p.src()), IpAddr::from(p.dst()))
                }).ok(),
                _ => None,
            };
            prop_assert_eq!(l.addresses(&f), want);
            if let (Network::V6, Ok(p)) = (l.network, Ipv6Packet::new_checked(ip)) {
                prop_assert_eq!(l.upper(), p.upper().ok());
            }
        }
    }
}
