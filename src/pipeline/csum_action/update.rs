//! The general path: a frame's chosen checksums, found through its parsed layers (tags,
//! IPv4 options, IPv6 extension headers), each header through its checked view.

use thiserror::Error;

use super::spec::Targets;
use crate::wire::checksum::write_checksum;
use crate::wire::ip::{
    self, Ipv4Packet, Ipv6Packet, Ipv6Upper, PROTO_ICMP, PROTO_ICMPV6, PROTO_IGMP, PROTO_SCTP, PROTO_TCP,
    PROTO_UDP, PROTO_UDPLITE,
};
use crate::wire::layers::{Layers, Network};
use crate::wire::virtio_net_hdr::{GSO_ECN, GSO_TCPV4, GSO_TCPV6};
use crate::wire::VirtioNetHdr;

/// Why an action dropped a packet: the headers it was asked to fix cannot be trusted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CsumFail {
    #[error("IP header: {0}")]
    Ip(#[from] ip::IpError),
    #[error("IP length {ipl} does not hold {what} (header {hl} + {need} bytes, {have} captured)")]
    Length {
        what: &'static str,
        ipl: usize,
        hl: usize,
        need: usize,
        have: usize,
    },
}

/// What an action did to a frame that it did not drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Done {
    /// Some checksum was written.
    pub wrote: bool,
    /// The upper-layer checksum was computed in full: a virtio partial one is now complete.
    pub l4_complete: bool,
}

/// The L4 header at `hl` of `ip` with at least `need` bytes, within the IP length `ipl`.
fn upper_layer<'a>(
    ip: &'a mut [u8],
    what: &'static str,
    hl: usize,
    ipl: usize,
    need: usize,
) -> Result<&'a mut [u8], CsumFail> {
    if ipl > ip.len() || ipl < hl + need {
        return Err(CsumFail::Length {
            what,
            ipl,
            hl,
            need,
            have: ip.len(),
        });
    }
    Ok(&mut ip[hl..ipl])
}

/// SCTP's CRC32c over the whole packet with the field zeroed, stored in little-endian order
/// (RFC 9260 appendix A).
fn store_sctp(l4: &mut [u8]) {
    l4[8..12].copy_from_slice(&[0; 4]);
    let crc = crc32c::crc32c(l4);
    l4[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// UDP and UDP-Lite, both families: how many bytes of the datagram the checksum covers,
/// from its header `uh` (its first 8 bytes at least) and its length `total` by the IP
/// header. `None` leaves the packet as it is: an IPv4 UDP checksum of 0 (none was sent), or
/// a length field that disagrees with the IP length (act_csum passes such "obscure" packets
/// untouched). Only the header is read, so a caller holding the header alone learns whether
/// the payload is needed at all.
#[inline]
pub(super) fn udp_covered(uh: &[u8], total: usize, lite: bool, v4: bool) -> Option<usize> {
    let ul = usize::from(u16::from_be_bytes([uh[4], uh[5]]));
    if lite {
        return match ul {
            0 => Some(total),
            n if (8..=total).contains(&n) => Some(n),
            _ => None,
        };
    }
    // The checksum field as one 16-bit load: zero in either byte order.
    if (v4 && u16::from_ne_bytes([uh[6], uh[7]]) == 0) || ul != total {
        return None;
    }
    Some(ul)
}

/// Writes the checksum [`udp_covered`] asks for into the datagram `l4`; false if none.
#[inline]
pub(super) fn udp(l4: &mut [u8], lite: bool, v4: bool, pseudo: u64) -> bool {
    let Some(covered) = udp_covered(l4, l4.len(), lite, v4) else {
        return false;
    };
    write_checksum(l4, 6, covered, pseudo, true);
    true
}

/// Recomputes the `targets` checksums of one Ethernet frame in place, honouring GSO (a
/// segmentation-offload packet's TCP/SCTP checksum is the segmenter's business).
pub fn update(frame: &mut [u8], targets: Targets, hdr: &VirtioNetHdr) -> Result<Done, CsumFail> {
    update_by(&Layers::parse(frame), frame, targets, hdr)
}

/// [`update`] of a frame whose layers `layers` found.
pub fn update_by(
    layers: &Layers,
    frame: &mut [u8],
    targets: Targets,
    hdr: &VirtioNetHdr,
) -> Result<Done, CsumFail> {
    let Some(ip) = layers.ip_mut(frame) else {
        return Ok(Done::default());
    };
    let gso = hdr.gso_type & !GSO_ECN;
    match layers.network {
        // A bad header: the view's constructor, first thing in each, says why.
        Network::V4 | Network::BadV4 => update_v4(ip, targets, gso),
        Network::V6 => update_v6(ip, layers.upper(), targets, gso),
        Network::BadV6 => update_v6(ip, None, targets, gso),
        Network::Other => Ok(Done::default()),
    }
}

fn update_v4(ip: &mut [u8], targets: Targets, gso: u8) -> Result<Done, CsumFail> {
    let p = Ipv4Packet::new_checked(&*ip)?;
    let (hl, ipl, proto) = (p.header_len(), p.total_len(), p.protocol());
    // The upper layer is `ipl - hl` bytes (`upper_layer` refuses the frame otherwise).
    let ps = p.pseudo_sum(proto, ipl.saturating_sub(hl));
    let mut done = Done::default();
    let proto = if p.is_later_fragment() { None } else { Some(proto) };
    match proto {
        Some(PROTO_ICMP | PROTO_IGMP) => {
            let t = if proto == Some(PROTO_ICMP) {
                Targets::ICMP
            } else {
                Targets::IGMP
            };
            if targets.has(t) {
                let l4 = upper_layer(ip, "ICMP/IGMP header", hl, ipl, 4)?;
                let n = l4.len();
                write_checksum(l4, 2, n, 0, false);
                done = Done {
                    wrote: true,
                    l4_complete: true,
                };
            }
        }
        Some(PROTO_TCP) if targets.has(Targets::TCP) && gso != GSO_TCPV4 => {
            let l4 = upper_layer(ip, "TCP header", hl, ipl, 20)?;
            let n = l4.len();
            write_checksum(l4, 16, n, ps, false);
            done = Done {
                wrote: true,
                l4_complete: true,
            };
        }
        Some(pr @ (PROTO_UDP | PROTO_UDPLITE)) => {
            let lite = pr == PROTO_UDPLITE;
            if targets.has(if lite { Targets::UDPLITE } else { Targets::UDP }) {
                let l4 = upper_layer(ip, "UDP header", hl, ipl, 8)?;
                let wrote = udp(l4, lite, true, ps);
                done = Done {
                    wrote,
                    l4_complete: wrote,
                };
            }
        }
        Some(PROTO_SCTP) if targets.has(Targets::SCTP) => {
            store_sctp(upper_layer(ip, "SCTP header", hl, ipl, 12)?);
            done = Done {
                wrote: true,
                l4_complete: true,
            };
        }
        _ => {}
    }
    if targets.has(Targets::IPH) {
        Ipv4Packet::new_checked(&mut *ip)?.fill_checksum();
        done.wrote = true;
    }
    Ok(done)
}

/// `upper`: what the layers found after the extension headers of the IPv6 header `ip`
/// (`None`: they run past the packet).
fn update_v6(ip: &mut [u8], upper: Option<Ipv6Upper>, targets: Targets, gso: u8) -> Result<Done, CsumFail> {
    let p = Ipv6Packet::new_checked(&*ip)?;
    let Ipv6Upper::Found {
        proto,
        offset: hl,
        packet_len: ipl,
    } = upper.ok_or(ip::IpError::BadExtension)?
    else {
        return Ok(Done::default());
    };
    let ps = p.pseudo_sum(proto, ipl.saturating_sub(hl));
    let complete = Done {
        wrote: true,
        l4_complete: true,
    };
    match proto {
        PROTO_ICMPV6 if targets.has(Targets::ICMP) => {
            let l4 = upper_layer(ip, "ICMPv6 header", hl, ipl, 4)?;
            let n = l4.len();
            write_checksum(l4, 2, n, ps, false);
            Ok(complete)
        }
        PROTO_TCP if targets.has(Targets::TCP) && gso != GSO_TCPV6 => {
            let l4 = upper_layer(ip, "TCP header", hl, ipl, 20)?;
            let n = l4.len();
            write_checksum(l4, 16, n, ps, false);
            Ok(complete)
        }
        PROTO_UDP | PROTO_UDPLITE
            if targets.has(if proto == PROTO_UDP {
                Targets::UDP
            } else {
                Targets::UDPLITE
            }) =>
        {
            let l4 = upper_layer(ip, "UDP header", hl, ipl, 8)?;
            // IPv6 has no "no checksum" UDP: a zero field is recomputed like any other.
            let wrote = udp(l4, proto == PROTO_UDPLITE, false, ps);
            Ok(Done {
                wrote,
                l4_complete: wrote,
            })
        }
        PROTO_SCTP if targets.has(Targets::SCTP) => {
            store_sctp(upper_layer(ip, "SCTP header", hl, ipl, 12)?);
            Ok(complete)
        }
        _ => Ok(Done::default()),
    }
}
