//! What the router does with one frame. IPv4 and IPv6 share the forwarding skeleton
//! ([`forward`]): the router's own address, TTL, resolution through the worker's cache,
//! asking for an unresolved next hop, unreachable, rewrite. Each version supplies what
//! differs as a [`Family`].

use std::net::IpAddr;

use super::cache::RouteCache;
use super::lookup::{Lookup, ROUTER_MAC};
use super::table::Resolution;
use super::table::RouteTable;
use crate::stats::QueueStats;
use crate::wire::{EthernetFrame, MacAddr};

/// What the switch does with a frame after the router looked at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Not the router's business: switch it at L2 as usual.
    Switch,
    /// Handled or dropped (and counted); nothing to send.
    Done,
    /// Send the frame the router built in the worker's `Ingress::originated` out of `port`.
    Emit { port: usize },
    /// The frame was turned into an answer in place: send it back out of `port`.
    Bounce { port: usize },
    /// The frame was rewritten for its next hop: switch it to its new destination MAC,
    /// back out of the port it came from if that is where the next hop is.
    Routed,
}

/// The router's verdict plus a neighbour to record (from ARP or NDP) before acting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub step: Step,
    pub learn: Option<(IpAddr, MacAddr)>,
}

impl Outcome {
    pub(super) fn step(step: Step) -> Self {
        Outcome { step, learn: None }
    }
}

/// The ICMP errors the router sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IcmpError {
    TimeExceeded,
    Unreachable,
}

/// What forwarding needs from one IP version, for a packet already checked.
pub(super) trait Family {
    fn dst(&self) -> IpAddr;
    /// TTL or hop limit.
    fn ttl(&self) -> u8;
    /// Turns an echo request to one of the router's addresses into its reply in place;
    /// false when the packet is something else.
    fn echo_reply(&self, frame: &mut [u8]) -> bool;
    /// Builds `e` about the packet in `frame` into `out`, from the router's address on
    /// `port`; false when none may be sent (an error about an error, no address to send
    /// from).
    fn error(&self, table: &RouteTable, port: usize, frame: &[u8], out: &mut Vec<u8>, e: IcmpError) -> bool;
    /// Builds the request for `hop`'s MAC (ARP request, neighbour solicitation), sent
    /// from `from`, into `out`; false if the addresses are not of this family.
    fn solicit(out: &mut Vec<u8>, from: IpAddr, hop: IpAddr) -> bool;
    /// Decrements the TTL or hop limit of the packet in `frame`.
    fn decrement_ttl(frame: &mut [u8]);
}

/// Forwards a packet sent to the router's MAC: the skeleton both IP versions share. An
/// error or a request it sends is built into `out`.
pub(super) fn forward<F: Family>(
    at: &Lookup<'_>,
    port: usize,
    pkt: &F,
    frame: &mut [u8],
    cache: &mut RouteCache,
    out: &mut Vec<u8>,
    stats: &QueueStats,
) -> Step {
    let error = |frame: &[u8], out: &mut Vec<u8>, e| {
        if pkt.error(at.table, port, frame, out, e) {
            Step::Emit { port }
        } else {
            Step::Done
        }
    };
    let dst = pkt.dst();
    if at.table.is_own(dst) {
        return if pkt.echo_reply(frame) {
            Step::Bounce { port }
        } else {
            Step::Done
        };
    }
    if pkt.ttl() <= 1 {
        stats.route_ttl_exceeded.inc();
        return error(frame, out, IcmpError::TimeExceeded);
    }
    let mac = match cached_resolve(at, dst, cache, stats) {
        Resolution::Forward { mac, .. } => mac,
        Resolution::Unresolved {
            next_hop,
            port: hop_port,
            from,
        } => {
            // Ask, and drop this packet: the sender's retransmission finds the neighbour
            // (a router may drop while it resolves, RFC 1812 4.3.2.2).
            stats.route_unresolved.inc();
            return if F::solicit(out, from, next_hop) {
                Step::Emit { port: hop_port }
            } else {
                Step::Done
            };
        }
        Resolution::NoRoute => {
            stats.route_unreachable.inc();
            return error(frame, out, IcmpError::Unreachable);
        }
    };
    if let Ok(mut eth) = EthernetFrame::new_checked(&mut *frame) {
        eth.set_dst(mac);
        eth.set_src(ROUTER_MAC);
    }
    F::decrement_ttl(frame);
    stats.routed.inc();
    Step::Routed
}

/// The next hop for `dst`, from the worker's cache when it holds this generation, else
/// from the table (a forwardable answer is then cached). Counts hits and misses.
fn cached_resolve(at: &Lookup<'_>, dst: IpAddr, cache: &mut RouteCache, stats: &QueueStats) -> Resolution {
    let cached = match at.shared {
        Some(shared) => shared.get(at.generation, dst),
        None => cache.get(at.generation, dst),
    };
    if let Some((mac, port)) = cached {
        stats.route_cache_hit.inc();
        return Resolution::Forward { mac, port };
    }
    stats.route_cache_miss.inc();
    let r = at.table.resolve(dst, at.neigh);
    if let Resolution::Forward { mac, port } = r {
        match at.shared {
            Some(shared) => shared.put(dst, mac, port),
            None => cache.put(dst, mac, port),
        }
    }
    r
}
