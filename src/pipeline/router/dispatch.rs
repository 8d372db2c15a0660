//! What the router does with one frame: by its EtherType and whether it is addressed to
//! the router, to IPv4 (with ARP) or IPv6 (with neighbour discovery).

use super::cache::RouteCache;
use super::forward::{Outcome, Step};
use super::lookup::{Lookup, ROUTER_MAC};
use super::{ipv4, ipv6};
use crate::stats::QueueStats;
use crate::wire::ethernet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::EthernetFrame;

/// Whether [`handle`] would only hand `frame`, at least an Ethernet header long, back to
/// the switch (`Step::Switch`, nothing learned or counted): a frame that is not ARP, not
/// IPv6 and not addressed to the router. The switch's burst path asks it
/// (`Switch::plain_destination`); the two must answer alike.
#[inline]
pub fn switches_only(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return true;
    };
    !eth.is_to(&ROUTER_MAC) && !matches!(eth.ethertype(), ETHERTYPE_ARP | ETHERTYPE_IPV6)
}

/// Looks at one untagged frame that entered on `port`: ARP for the router's addresses and
/// neighbours, neighbour discovery, and IP addressed to the router's MAC. A frame the router
/// originates (answer, request, error) is built into `out`. Counters go to the ingress
/// queue.
pub fn handle(
    at: &Lookup<'_>,
    port: usize,
    frame: &mut [u8],
    cache: &mut RouteCache,
    out: &mut Vec<u8>,
    stats: &QueueStats,
) -> Outcome {
    let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
        return Outcome::step(Step::Switch);
    };
    let to_router = eth.is_to(&ROUTER_MAC);
    match eth.ethertype() {
        ETHERTYPE_ARP => ipv4::arp(at.table, port, frame, out),
        ETHERTYPE_IPV4 if to_router => Outcome::step(ipv4::route(at, port, frame, cache, out, stats)),
        ETHERTYPE_IPV6 => ipv6::handle(at, port, to_router, frame, cache, out, stats),
        _ => Outcome::step(Step::Switch),
    }
}
