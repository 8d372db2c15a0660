//! IPv6's part of the router: neighbour discovery for its addresses and from neighbours,
//! and what forwarding needs from IPv6 (ICMPv6 errors, neighbour solicitations).

use std::net::{IpAddr, Ipv6Addr};

use super::cache::RouteCache;
use super::forward::{forward, Family, IcmpError, Outcome, Step};
use super::lookup::{Lookup, ROUTER_MAC};
use super::table::RouteTable;
use crate::stats::QueueStats;
use crate::wire::ethernet::HEADER_LEN;
use crate::wire::icmpv6;
use crate::wire::ip::{Ipv6Packet, IPV6_LEN, PROTO_ICMPV6};
use crate::wire::{EthernetFrame, MacAddr};

/// An IPv6 packet, checked: its payload lies within the frame.
struct V6 {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    /// Header and payload.
    total_len: usize,
    /// The packet fills the frame exactly (an echo is answered in place only then).
    whole_frame: bool,
    /// The ICMPv6 type and message length, if the packet is ICMPv6 with a type.
    icmp: Option<(u8, usize)>,
    /// The frame's source MAC: where errors go.
    from_mac: MacAddr,
}

/// Neighbour discovery for the router's addresses and from neighbours (whatever the
/// destination MAC: solicitations go to multicast), then routing of what is sent to the
/// router's MAC.
pub(super) fn handle(
    at: &Lookup<'_>,
    port: usize,
    to_router: bool,
    frame: &mut [u8],
    cache: &mut RouteCache,
    out: &mut Vec<u8>,
    stats: &QueueStats,
) -> Outcome {
    let table = at.table;
    let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
        return Outcome::step(Step::Switch);
    };
    let ip = eth.payload();
    // A header that does not parse, or a payload length past the frame, is the router's
    // error when the frame was sent to it, else the switch's business.
    let Some(p) = Ipv6Packet::new_checked(ip)
        .ok()
        .filter(|p| IPV6_LEN + p.payload_len() <= ip.len())
    else {
        if to_router {
            stats.route_errors.inc();
            return Outcome::step(Step::Done);
        }
        return Outcome::step(Step::Switch);
    };
    let total = IPV6_LEN + p.payload_len();
    let message = (p.next_header() == PROTO_ICMPV6).then(|| &ip[IPV6_LEN..total]);
    let pkt = V6 {
        src: p.src(),
        dst: p.dst(),
        hop_limit: p.hop_limit(),
        total_len: total,
        whole_frame: total == ip.len(),
        icmp: message.and_then(|m| m.first().map(|t| (*t, m.len()))),
        from_mac: eth.src(),
    };
    let nd = message.and_then(|m| icmpv6::Icmpv6Message::new_checked(m).ok());
    if let Some(n) = nd.and_then(|m| m.neighbour(pkt.hop_limit)) {
        return neighbour(table, port, to_router, &pkt, &n, out);
    }
    if !to_router {
        return Outcome::step(Step::Switch);
    }
    Outcome::step(forward(at, port, &pkt, frame, cache, out, stats))
}

/// A neighbour solicitation or advertisement: answered when it asks for the router's
/// address on `port`, and learned from when it comes from a neighbour on that port.
fn neighbour(
    table: &RouteTable,
    port: usize,
    to_router: bool,
    pkt: &V6,
    n: &icmpv6::NeighbourMessage,
    out: &mut Vec<u8>,
) -> Outcome {
    let src = pkt.src;
    if n.kind == icmpv6::NEIGHBOR_SOLICIT {
        let learn = n
            .lla
            .filter(|_| !src.is_unspecified() && table.is_neighbour(port, src.into()))
            .map(|mac| (IpAddr::V6(src), mac));
        // Duplicate address detection (source ::) is not for the router to answer.
        let step = if table.is_own_on(port, n.target.into()) && !src.is_unspecified() {
            icmpv6::advert(out, ROUTER_MAC, &n.target, (pkt.from_mac, src));
            Step::Emit { port }
        } else {
            Step::Switch
        };
        return Outcome { step, learn };
    }
    Outcome {
        step: if to_router { Step::Done } else { Step::Switch },
        learn: n
            .lla
            .filter(|_| table.is_neighbour(port, n.target.into()))
            .map(|mac| (IpAddr::V6(n.target), mac)),
    }
}

impl Family for V6 {
    fn dst(&self) -> IpAddr {
        IpAddr::V6(self.dst)
    }

    fn ttl(&self) -> u8 {
        self.hop_limit
    }

    fn echo_reply(&self, frame: &mut [u8]) -> bool {
        let echo = self
            .icmp
            .is_some_and(|(t, len)| t == icmpv6::ECHO_REQUEST && len >= 8)
            && self.whole_frame;
        if echo {
            icmpv6::echo_reply(frame, ROUTER_MAC);
        }
        echo
    }

    fn error(&self, table: &RouteTable, port: usize, frame: &[u8], out: &mut Vec<u8>, e: IcmpError) -> bool {
        // Never answer an ICMPv6 error (types below 128) with one.
        if self.icmp.is_some_and(|(t, _)| t < 128) {
            return false;
        }
        let Some(IpAddr::V6(from)) = table.source_for(port, IpAddr::V6(self.src)) else {
            return false;
        };
        let kind = match e {
            IcmpError::TimeExceeded => icmpv6::TIME_EXCEEDED,
            IcmpError::Unreachable => icmpv6::DEST_UNREACHABLE,
        };
        let ip = &frame[HEADER_LEN..HEADER_LEN + self.total_len];
        icmpv6::error(out, (ROUTER_MAC, self.from_mac), &from, kind, 0, ip);
        true
    }

    fn solicit(out: &mut Vec<u8>, from: IpAddr, hop: IpAddr) -> bool {
        let (IpAddr::V6(from), IpAddr::V6(hop)) = (from, hop) else {
            return false;
        };
        icmpv6::solicit(out, ROUTER_MAC, &from, &hop);
        true
    }

    fn decrement_ttl(frame: &mut [u8]) {
        if let Ok(mut p) = Ipv6Packet::new_checked(&mut frame[HEADER_LEN..]) {
            p.decrement_hop_limit();
        }
    }
}
