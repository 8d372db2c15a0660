//! IPv4's part of the router: ARP for its addresses and from neighbours, and what
//! forwarding needs from IPv4 (RFC 1812 checks, ICMP errors, ARP requests).

use std::net::{IpAddr, Ipv4Addr};

use log::trace;

use super::cache::RouteCache;
use super::forward::{forward, Family, IcmpError, Outcome, Step};
use super::lookup::{Lookup, ROUTER_MAC};
use super::table::RouteTable;
use crate::stats::QueueStats;
use crate::wire::arp::{self, ArpPacket};
use crate::wire::checksum::checksum;
use crate::wire::ethernet::HEADER_LEN;
use crate::wire::icmp;
use crate::wire::ip::{Ipv4Packet, PROTO_ICMP};
use crate::wire::{EthernetFrame, MacAddr};

/// ARP: answers requests for the router's addresses on `port`, takes replies sent to it,
/// and learns the sender when it is a neighbour on that port.
pub(super) fn arp(table: &RouteTable, port: usize, frame: &[u8], out: &mut Vec<u8>) -> Outcome {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Outcome::step(Step::Switch);
    };
    let Ok(a) = ArpPacket::new_checked(eth.payload()) else {
        return Outcome::step(Step::Switch);
    };
    let (sender, smac) = (IpAddr::V4(a.sender_ip()), a.sender_mac());
    let learn = (table.is_neighbour(port, sender) && smac.is_unicast()).then_some((sender, smac));
    let target = IpAddr::V4(a.target_ip());
    let step = if a.op() == arp::OP_REQUEST && table.is_own_on(port, target) {
        arp::emit(
            out,
            arp::OP_REPLY,
            smac,
            (ROUTER_MAC, a.target_ip()),
            (smac, a.sender_ip()),
        );
        Step::Emit { port }
    } else if a.op() == arp::OP_REPLY && eth.dst() == ROUTER_MAC {
        Step::Done
    } else {
        Step::Switch
    };
    Outcome { step, learn }
}

/// An IPv4 packet sent to the router's MAC, checked.
struct V4 {
    header_len: usize,
    total_len: usize,
    protocol: u8,
    ttl: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
}

/// Routes an IPv4 packet sent to the router's MAC: RFC 1812 5.2.2's checks (header
/// checksum, lengths) before anything is touched, then the shared skeleton.
pub(super) fn route(
    at: &Lookup<'_>,
    port: usize,
    frame: &mut [u8],
    cache: &mut RouteCache,
    out: &mut Vec<u8>,
    stats: &QueueStats,
) -> Step {
    let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
        return Step::Switch;
    };
    let ip = eth.payload();
    let p = match Ipv4Packet::new_checked(ip) {
        Ok(p) => p,
        Err(e) => {
            stats.route_errors.inc();
            trace!("router: dropping {e}");
            return Step::Done;
        }
    };
    let (hl, total) = (p.header_len(), p.total_len());
    if total < hl || total > ip.len() || checksum(&ip[..hl]) != 0 {
        stats.route_errors.inc();
        return Step::Done;
    }
    let pkt = V4 {
        header_len: hl,
        total_len: total,
        protocol: p.protocol(),
        ttl: p.ttl(),
        src: p.src(),
        dst: p.dst(),
    };
    forward(at, port, &pkt, frame, cache, out, stats)
}

impl V4 {
    /// The ICMP type, if the packet is ICMP and long enough to carry one. Read only on the
    /// paths that need it (echo, errors), not for every routed packet.
    fn icmp_type(&self, frame: &[u8]) -> Option<u8> {
        (self.protocol == PROTO_ICMP)
            .then(|| frame.get(HEADER_LEN + self.header_len).copied())
            .flatten()
    }
}

impl Family for V4 {
    fn dst(&self) -> IpAddr {
        IpAddr::V4(self.dst)
    }

    fn ttl(&self) -> u8 {
        self.ttl
    }

    fn echo_reply(&self, frame: &mut [u8]) -> bool {
        let echo = self.icmp_type(frame) == Some(icmp::ECHO_REQUEST) && self.total_len >= self.header_len + 8;
        if echo {
            icmp::echo_reply_v4(frame, HEADER_LEN, self.header_len, self.total_len, ROUTER_MAC);
        }
        echo
    }

    fn error(&self, table: &RouteTable, port: usize, frame: &[u8], out: &mut Vec<u8>, e: IcmpError) -> bool {
        // Never answer an error with an error, nor speak from an address we do not have.
        if self
            .icmp_type(frame)
            .is_some_and(|t| ![icmp::ECHO_REQUEST, icmp::ECHO_REPLY].contains(&t))
        {
            return false;
        }
        let Some(IpAddr::V4(from)) = table.source_for(port, IpAddr::V4(self.src)) else {
            return false;
        };
        let (kind, code) = match e {
            IcmpError::TimeExceeded => (icmp::TIME_EXCEEDED, 0),
            IcmpError::Unreachable => (icmp::DEST_UNREACHABLE, icmp::CODE_NET_UNREACHABLE),
        };
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return false;
        };
        let ip = &frame[HEADER_LEN..HEADER_LEN + self.total_len];
        icmp::error_v4(out, (ROUTER_MAC, eth.src()), from, self.src, kind, code, ip);
        true
    }

    fn solicit(out: &mut Vec<u8>, from: IpAddr, hop: IpAddr) -> bool {
        let (IpAddr::V4(from), IpAddr::V4(hop)) = (from, hop) else {
            return false;
        };
        arp::emit(
            out,
            arp::OP_REQUEST,
            MacAddr::BROADCAST,
            (ROUTER_MAC, from),
            (MacAddr::default(), hop),
        );
        true
    }

    fn decrement_ttl(frame: &mut [u8]) {
        if let Ok(mut p) = Ipv4Packet::new_checked(&mut frame[HEADER_LEN..]) {
            p.decrement_ttl();
        }
    }
}
