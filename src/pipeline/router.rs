//! The L3 router inside the switch: router interfaces (`--router-ip`), static routes
//! (`--route`, `ctl route`), neighbours learned from ARP, and the per-queue route cache.
//!
//! The tables live in the rules snapshot ([`super::rules::Rules`]); every change to them
//! publishes a new snapshot with a new generation. Each queue worker keeps its own
//! [`RouteCache`] of resolved destinations and drops it whole when the generation moves:
//! Linux's per-CPU cached output route, with a generation number instead of a refcount.

use std::collections::HashMap;

use super::neigh::Neighbours;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

use log::trace;

use crate::stats::QueueStats;
use crate::wire::arp::{self, ArpPacket};
use crate::wire::checksum::checksum;
use crate::wire::ethernet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, HEADER_LEN};
use crate::wire::icmp;
use crate::wire::ip::{Ipv4Packet, Ipv6Packet, IPV6_LEN, PROTO_ICMP, PROTO_ICMPV6};
use crate::wire::ndp;
use crate::wire::MacAddr;

/// The router's MAC on every port ("vnic" in the low octets, locally administered).
pub const ROUTER_MAC: MacAddr = MacAddr([0x02, 0x76, 0x6e, 0x69, 0x63, 0x01]);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteParseError {
    #[error("expected PORT=ADDR/PREFIX, got {0:?}")]
    IfaceSyntax(String),
    #[error("bad port {text:?}")]
    Port {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("bad prefix {text:?}")]
    Prefix {
        text: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("bad gateway address {text:?}")]
    Via {
        text: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("route {0:?} needs exactly one of via=ADDR or port=N")]
    Target(String),
    #[error("unknown route option {0:?} (expected via=ADDR or port=N)")]
    Option(String),
    #[error("gateway {via} is not in the family of {prefix}")]
    Family { prefix: IpNet, via: IpAddr },
    #[error("{0} is not a host address for a router interface")]
    IfaceAddr(IpNet),
}

fn parse_port(s: &str) -> Result<usize, RouteParseError> {
    s.parse().map_err(|source| RouteParseError::Port {
        text: s.into(),
        source,
    })
}

fn parse_net(s: &str) -> Result<IpNet, RouteParseError> {
    s.parse().map_err(|source| RouteParseError::Prefix {
        text: s.into(),
        source,
    })
}

/// `--router-ip PORT=ADDR/PREFIX`: the router's address on a port and the connected prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterIf {
    pub port: usize,
    /// The address with its prefix length, e.g. 10.1.0.1/24.
    pub addr: IpNet,
}

impl FromStr for RouterIf {
    type Err = RouteParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (port, addr) = s
            .split_once('=')
            .ok_or_else(|| RouteParseError::IfaceSyntax(s.into()))?;
        let addr = parse_net(addr)?;
        // The network or (IPv4) broadcast address cannot be the router's own.
        let v4_bcast = matches!(addr, IpNet::V4(n) if n.prefix_len() < 31 && n.addr() == n.broadcast());
        if (addr.addr() == addr.network() && addr.prefix_len() < addr.max_prefix_len() - 1) || v4_bcast {
            return Err(RouteParseError::IfaceAddr(addr));
        }
        Ok(RouterIf {
            port: parse_port(port)?,
            addr,
        })
    }
}

impl fmt::Display for RouterIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.port, self.addr)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextHop {
    /// Through a gateway that must be on a connected prefix.
    Via(IpAddr),
    /// On-link out of a port: the destination is its own next hop.
    Port(usize),
}

/// `--route PREFIX,via=ADDR` or `--route PREFIX,port=N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub prefix: IpNet,
    pub hop: NextHop,
}

impl FromStr for Route {
    type Err = RouteParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let prefix = parse_net(parts.next().unwrap_or_default())?.trunc();
        let mut hop = None;
        for kv in parts {
            let h = match kv.split_once('=') {
                Some(("via", v)) => NextHop::Via(v.parse().map_err(|source| RouteParseError::Via {
                    text: v.into(),
                    source,
                })?),
                Some(("port", v)) => NextHop::Port(parse_port(v)?),
                _ => return Err(RouteParseError::Option(kv.into())),
            };
            if hop.replace(h).is_some() {
                return Err(RouteParseError::Target(s.into()));
            }
        }
        let hop = hop.ok_or_else(|| RouteParseError::Target(s.into()))?;
        if let NextHop::Via(via) = hop {
            if via.is_ipv4() != matches!(prefix, IpNet::V4(_)) {
                return Err(RouteParseError::Family { prefix, via });
            }
        }
        Ok(Route { prefix, hop })
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hop {
            NextHop::Via(a) => write!(f, "{},via={a}", self.prefix),
            NextHop::Port(p) => write!(f, "{},port={p}", self.prefix),
        }
    }
}

/// Where a prefix leads: the egress port, and the gateway (`None`: on-link, the
/// destination is its own next hop).
type Target = (usize, Option<IpAddr>);

/// Longest-prefix match by prefix length: one hash map per length in use, longest first,
/// so a lookup costs one probe per distinct length (a handful), not one per route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Lpm {
    v4: Vec<(u8, HashMap<IpNet, Target>)>,
    v6: Vec<(u8, HashMap<IpNet, Target>)>,
}

impl Lpm {
    fn insert(&mut self, net: IpNet, t: Target, replace: bool) {
        let levels = if matches!(net, IpNet::V4(_)) {
            &mut self.v4
        } else {
            &mut self.v6
        };
        let len = net.prefix_len();
        let i = match levels.iter().position(|(l, _)| *l <= len) {
            Some(i) if levels[i].0 == len => i,
            Some(i) => {
                levels.insert(i, (len, HashMap::new()));
                i
            }
            None => {
                levels.push((len, HashMap::new()));
                levels.len() - 1
            }
        };
        let map = &mut levels[i].1;
        if replace || !map.contains_key(&net.trunc()) {
            map.insert(net.trunc(), t);
        }
    }

    fn lookup(&self, dst: IpAddr) -> Option<Target> {
        let levels = if dst.is_ipv4() { &self.v4 } else { &self.v6 };
        levels
            .iter()
            .find_map(|(len, map)| map.get(&IpNet::new(dst, *len).ok()?.trunc()).copied())
    }
}

/// What the router knows: its interfaces, static routes, resolved neighbours, and the
/// prefix index built from the first two ([`RouteTable::reindex`], which every published
/// snapshot has run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    pub ifaces: Vec<RouterIf>,
    pub routes: Vec<Route>,
    lpm: Lpm,
}

/// The outcome of a full (uncached) lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Forward {
        mac: MacAddr,
        port: usize,
    },
    /// The route is known but the next hop's MAC is not: ask for it on `port` from `from`.
    Unresolved {
        next_hop: IpAddr,
        port: usize,
        from: IpAddr,
    },
    NoRoute,
}

impl RouteTable {
    /// A table of interfaces and static routes, indexed.
    pub fn new(ifaces: Vec<RouterIf>, routes: Vec<Route>) -> Self {
        let mut t = RouteTable {
            ifaces,
            routes,
            ..Default::default()
        };
        t.reindex();
        t
    }

    pub fn enabled(&self) -> bool {
        !self.ifaces.is_empty()
    }

    /// Whether `ip` is one of the router's addresses on `port`.
    pub fn is_own_on(&self, port: usize, ip: IpAddr) -> bool {
        self.ifaces.iter().any(|i| i.port == port && i.addr.addr() == ip)
    }

    pub fn is_own(&self, ip: IpAddr) -> bool {
        self.ifaces.iter().any(|i| i.addr.addr() == ip)
    }

    /// The router's address to speak from on `port` toward `peer`: the interface whose
    /// prefix holds the peer, else any interface on that port of the peer's family, else
    /// any interface of that family.
    pub fn source_for(&self, port: usize, peer: IpAddr) -> Option<IpAddr> {
        let fam = |i: &&RouterIf| i.addr.addr().is_ipv4() == peer.is_ipv4();
        self.ifaces
            .iter()
            .find(|i| i.port == port && i.addr.contains(&peer))
            .or_else(|| self.ifaces.iter().filter(fam).find(|i| i.port == port))
            .or_else(|| self.ifaces.iter().find(fam))
            .map(|i| i.addr.addr())
    }

    /// Rebuilds the prefix index from `ifaces` and `routes`. Connected prefixes win over
    /// a static route of the same prefix; of two routes to one prefix the first counts. A
    /// gateway must lie on a connected prefix: a route through one that does not is left
    /// out, as the kernel refuses it.
    pub fn reindex(&mut self) {
        let mut lpm = Lpm::default();
        for r in &self.routes {
            let target = match r.hop {
                NextHop::Port(p) => Some((p, None)),
                NextHop::Via(gw) => self
                    .ifaces
                    .iter()
                    .filter(|i| i.addr.contains(&gw))
                    .max_by_key(|i| i.addr.prefix_len())
                    .map(|i| (i.port, Some(gw))),
            };
            if let Some(t) = target {
                lpm.insert(r.prefix, t, false);
            }
        }
        for i in &self.ifaces {
            lpm.insert(i.addr, (i.port, None), true);
        }
        self.lpm = lpm;
    }

    /// Longest-prefix match over the connected prefixes and the static routes: the egress
    /// port and the next hop's address.
    pub fn lookup(&self, dst: IpAddr) -> Option<(usize, IpAddr)> {
        self.lpm.lookup(dst).map(|(port, gw)| (port, gw.unwrap_or(dst)))
    }

    pub fn resolve(&self, dst: IpAddr, neigh: &Neighbours) -> Resolution {
        let Some((port, next_hop)) = self.lookup(dst) else {
            return Resolution::NoRoute;
        };
        match neigh.get(&next_hop) {
            Some(mac) => Resolution::Forward { mac, port },
            None => match self.source_for(port, next_hop) {
                Some(from) => Resolution::Unresolved { next_hop, port, from },
                None => Resolution::NoRoute,
            },
        }
    }

    /// Whether an ARP/NDP message from `ip` arriving on `port` names a neighbour the router
    /// would send to: one it reaches on-link out of that same port.
    pub fn is_neighbour(&self, port: usize, ip: IpAddr) -> bool {
        !self.is_own(ip) && self.lookup(ip).is_some_and(|(p, hop)| p == port && hop == ip)
    }
}

/// A resolved destination as a worker caches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    dst: IpAddr,
    mac: MacAddr,
    port: usize,
}

const SLOTS: usize = 256;

/// One queue worker's cache of resolved routes: direct-mapped, owned by the worker (never
/// shared, so never locked), emptied when the rules' generation changes. Also holds the
/// worker's buffer for frames the router originates (ARP, ICMP), so they allocate nothing
/// once warm.
pub struct RouteCache {
    generation: u64,
    slots: Box<[Option<Entry>; SLOTS]>,
    pub scratch: Vec<u8>,
}

impl Default for RouteCache {
    fn default() -> Self {
        RouteCache {
            generation: 0,
            slots: Box::new([None; SLOTS]),
            scratch: Vec::with_capacity(1536),
        }
    }
}

fn slot(dst: &IpAddr) -> usize {
    let h = match dst {
        IpAddr::V4(a) => u64::from(a.to_bits()),
        IpAddr::V6(a) => {
            let b = a.to_bits();
            (b as u64) ^ ((b >> 64) as u64)
        }
    };
    // Fibonacci hashing: the top bits of the product spread consecutive addresses.
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SLOTS
}

impl RouteCache {
    /// The cached (next-hop MAC, port) for `dst` if it is valid for `generation`.
    #[inline]
    pub fn get(&mut self, generation: u64, dst: IpAddr) -> Option<(MacAddr, usize)> {
        if self.generation != generation {
            self.slots.fill(None);
            self.generation = generation;
            return None;
        }
        match self.slots[slot(&dst)] {
            Some(e) if e.dst == dst => Some((e.mac, e.port)),
            _ => None,
        }
    }

    pub fn put(&mut self, dst: IpAddr, mac: MacAddr, port: usize) {
        self.slots[slot(&dst)] = Some(Entry { dst, mac, port });
    }
}

/// What a worker resolves against: the rules' router table, the neighbours, and the
/// generation its route cache must hold ([`cache_generation`]).
pub struct Lookup<'a> {
    pub table: &'a RouteTable,
    pub neigh: &'a Neighbours,
    pub generation: u64,
}

/// The generation a route cache follows: the rules' (bumped by every published change)
/// and the neighbours' (bumped when one changes or ages out), in one word. The rules'
/// count would need 2^40 published changes to reach the neighbours' bits.
pub fn cache_generation(rules: u64, neigh: u64) -> u64 {
    rules.wrapping_add(neigh << 40)
}

/// What the switch does with a frame after the router looked at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Not the router's business: switch it at L2 as usual.
    Switch,
    /// Handled or dropped (and counted); nothing to send.
    Done,
    /// Send the frame the router built in `RouteCache::scratch` out of `port`.
    Emit { port: usize },
    /// The frame was turned into an answer in place: send it back out of `port`.
    Bounce { port: usize },
    /// The frame was rewritten for its next hop: switch it to its new destination MAC,
    /// back out of the port it came from if that is where the next hop is.
    Routed,
}

/// The router's verdict plus a neighbour to record (from ARP) before acting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub step: Step,
    pub learn: Option<(IpAddr, MacAddr)>,
}

impl Outcome {
    fn step(step: Step) -> Self {
        Outcome { step, learn: None }
    }
}

/// Looks at one untagged frame that entered on `port`: ARP for the router's addresses and
/// neighbours, IPv4 addressed to the router's MAC. Counters go to the ingress queue.
pub fn handle(
    at: &Lookup<'_>,
    port: usize,
    frame: &mut [u8],
    cache: &mut RouteCache,
    stats: &QueueStats,
) -> Outcome {
    let table = at.table;
    if frame.len() < HEADER_LEN {
        return Outcome::step(Step::Switch);
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        ETHERTYPE_ARP => arp(table, port, frame, cache),
        ETHERTYPE_IPV4 if frame[..6] == ROUTER_MAC.0 => Outcome::step(ipv4(at, port, frame, cache, stats)),
        ETHERTYPE_IPV6 => ipv6(at, port, frame, cache, stats),
        _ => Outcome::step(Step::Switch),
    }
}

fn arp(table: &RouteTable, port: usize, frame: &[u8], cache: &mut RouteCache) -> Outcome {
    let Ok(a) = ArpPacket::new_checked(&frame[HEADER_LEN..]) else {
        return Outcome::step(Step::Switch);
    };
    let (sender, smac) = (IpAddr::V4(a.sender_ip()), a.sender_mac());
    let learn = (table.is_neighbour(port, sender) && smac.is_unicast()).then_some((sender, smac));
    let target = IpAddr::V4(a.target_ip());
    let step = if a.op() == arp::OP_REQUEST && table.is_own_on(port, target) {
        arp::build(
            &mut cache.scratch,
            arp::OP_REPLY,
            smac,
            (ROUTER_MAC, a.target_ip()),
            (smac, a.sender_ip()),
        );
        Step::Emit { port }
    } else if a.op() == arp::OP_REPLY && frame[..6] == ROUTER_MAC.0 {
        Step::Done
    } else {
        Step::Switch
    };
    Outcome { step, learn }
}

fn icmp_error(
    table: &RouteTable,
    port: usize,
    frame: &[u8],
    cache: &mut RouteCache,
    kind: u8,
    code: u8,
) -> Step {
    let ip = &frame[HEADER_LEN..];
    let Ok(p) = Ipv4Packet::new_checked(ip) else {
        return Step::Done;
    };
    // Never answer an error with an error, nor speak from an address we do not have.
    if p.protocol() == PROTO_ICMP
        && ip
            .get(p.header_len())
            .is_some_and(|t| ![icmp::ECHO_REQUEST, icmp::ECHO_REPLY].contains(t))
    {
        return Step::Done;
    }
    let Some(IpAddr::V4(from)) = table.source_for(port, IpAddr::V4(p.src())) else {
        return Step::Done;
    };
    let to = MacAddr::from_slice(&frame[6..12]).unwrap_or_default();
    let end = p.total_len().min(ip.len());
    icmp::error_v4(
        &mut cache.scratch,
        (ROUTER_MAC, to),
        from,
        p.src(),
        kind,
        code,
        &ip[..end],
    );
    Step::Emit { port }
}

fn ipv4(at: &Lookup<'_>, port: usize, frame: &mut [u8], cache: &mut RouteCache, stats: &QueueStats) -> Step {
    let table = at.table;
    let ip = &frame[HEADER_LEN..];
    let (hl, total, dst, ttl, proto) = match Ipv4Packet::new_checked(ip) {
        Ok(p) => (p.header_len(), p.total_len(), p.dst(), p.ttl(), p.protocol()),
        Err(e) => {
            stats.route_errors.inc();
            trace!("router: dropping {e}");
            return Step::Done;
        }
    };
    // RFC 1812 5.2.2: a router checks the header checksum and the lengths before it
    // touches anything.
    if total < hl || total > ip.len() || checksum(&ip[..hl]) != 0 {
        stats.route_errors.inc();
        return Step::Done;
    }
    let dst = IpAddr::V4(dst);
    if table.is_own(dst) {
        if proto == PROTO_ICMP && total >= hl + 8 && ip[hl] == icmp::ECHO_REQUEST {
            icmp::echo_reply_v4(frame, HEADER_LEN, hl, total, ROUTER_MAC);
            return Step::Bounce { port };
        }
        return Step::Done;
    }
    if ttl <= 1 {
        stats.route_ttl_exceeded.inc();
        return icmp_error(table, port, frame, cache, icmp::TIME_EXCEEDED, 0);
    }
    let mac = match cached_resolve(at, dst, cache, stats) {
        Resolution::Forward { mac, .. } => mac,
        Resolution::Unresolved {
            next_hop: IpAddr::V4(hop),
            port: out,
            from: IpAddr::V4(from),
        } => {
            // Ask, and drop this packet: the sender's retransmission finds the neighbour
            // (a router may drop while it resolves, RFC 1812 4.3.2.2).
            stats.route_unresolved.inc();
            arp::build(
                &mut cache.scratch,
                arp::OP_REQUEST,
                MacAddr::BROADCAST,
                (ROUTER_MAC, from),
                (MacAddr::default(), hop),
            );
            return Step::Emit { port: out };
        }
        _ => {
            stats.route_unreachable.inc();
            return icmp_error(
                table,
                port,
                frame,
                cache,
                icmp::DEST_UNREACHABLE,
                icmp::CODE_NET_UNREACHABLE,
            );
        }
    };
    frame[0..6].copy_from_slice(&mac.0);
    frame[6..12].copy_from_slice(&ROUTER_MAC.0);
    if let Ok(mut p) = Ipv4Packet::new_checked(&mut frame[HEADER_LEN..]) {
        p.decrement_ttl();
    }
    stats.routed.inc();
    Step::Routed
}

/// The next hop for `dst`, from the worker's cache when it holds this generation, else
/// from the table (a forwardable answer is then cached). Counts hits and misses.
fn cached_resolve(at: &Lookup<'_>, dst: IpAddr, cache: &mut RouteCache, stats: &QueueStats) -> Resolution {
    if let Some((mac, port)) = cache.get(at.generation, dst) {
        stats.route_cache_hit.inc();
        return Resolution::Forward { mac, port };
    }
    stats.route_cache_miss.inc();
    let r = at.table.resolve(dst, at.neigh);
    if let Resolution::Forward { mac, port } = r {
        cache.put(dst, mac, port);
    }
    r
}

/// IPv6: neighbour discovery for the router's addresses and from neighbours (whatever the
/// destination MAC: solicitations go to multicast), then routing of what is sent to the
/// router's MAC.
fn ipv6(
    at: &Lookup<'_>,
    port: usize,
    frame: &mut [u8],
    cache: &mut RouteCache,
    stats: &QueueStats,
) -> Outcome {
    let table = at.table;
    let to_router = frame[..6] == ROUTER_MAC.0;
    let ip = &frame[HEADER_LEN..];
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
    let (src, dst, hop_limit) = (p.src(), p.dst(), p.hop_limit());
    let total = IPV6_LEN + p.payload_len();
    let icmp = (p.next_header() == PROTO_ICMPV6).then(|| &ip[IPV6_LEN..total]);
    if let Some(n) = icmp.and_then(|m| ndp::parse_neighbour(hop_limit, m)) {
        let smac = MacAddr::from_slice(&frame[6..12]).unwrap_or_default();
        return match n.kind {
            ndp::NEIGHBOR_SOLICIT => {
                let learn = n
                    .lla
                    .filter(|_| !src.is_unspecified() && table.is_neighbour(port, src.into()))
                    .map(|mac| (IpAddr::V6(src), mac));
                // Duplicate address detection (source ::) is not for the router to answer.
                let step = if table.is_own_on(port, n.target.into()) && !src.is_unspecified() {
                    ndp::advert(&mut cache.scratch, ROUTER_MAC, &n.target, (smac, src));
                    Step::Emit { port }
                } else {
                    Step::Switch
                };
                Outcome { step, learn }
            }
            _ => Outcome {
                step: if to_router { Step::Done } else { Step::Switch },
                learn: n
                    .lla
                    .filter(|_| table.is_neighbour(port, n.target.into()))
                    .map(|mac| (IpAddr::V6(n.target), mac)),
            },
        };
    }
    if !to_router {
        return Outcome::step(Step::Switch);
    }
    let dst = IpAddr::V6(dst);
    if table.is_own(dst) {
        if icmp.is_some_and(|m| m.len() >= 8 && m[0] == ndp::ECHO_REQUEST)
            && p.payload_len() + IPV6_LEN == ip.len()
        {
            ndp::echo_reply(frame, ROUTER_MAC);
            return Outcome::step(Step::Bounce { port });
        }
        return Outcome::step(Step::Done);
    }
    let err = |kind: u8, code: u8, frame: &[u8], cache: &mut RouteCache| {
        // Never answer an ICMPv6 error (types below 128) with one.
        let is_error = icmp.is_some_and(|m| m.first().is_some_and(|t| *t < 128));
        match table.source_for(port, IpAddr::V6(src)) {
            Some(IpAddr::V6(from)) if !is_error => {
                let to = MacAddr::from_slice(&frame[6..12]).unwrap_or_default();
                ndp::error(
                    &mut cache.scratch,
                    (ROUTER_MAC, to),
                    &from,
                    kind,
                    code,
                    &frame[HEADER_LEN..HEADER_LEN + total],
                );
                Step::Emit { port }
            }
            _ => Step::Done,
        }
    };
    if hop_limit <= 1 {
        stats.route_ttl_exceeded.inc();
        return Outcome::step(err(ndp::TIME_EXCEEDED, 0, frame, cache));
    }
    let mac = match cached_resolve(at, dst, cache, stats) {
        Resolution::Forward { mac, .. } => mac,
        Resolution::Unresolved {
            next_hop: IpAddr::V6(hop),
            port: out,
            from: IpAddr::V6(from),
        } => {
            stats.route_unresolved.inc();
            ndp::solicit(&mut cache.scratch, ROUTER_MAC, &from, &hop);
            return Outcome::step(Step::Emit { port: out });
        }
        _ => {
            stats.route_unreachable.inc();
            return Outcome::step(err(ndp::DEST_UNREACHABLE, 0, frame, cache));
        }
    };
    frame[0..6].copy_from_slice(&mac.0);
    frame[6..12].copy_from_slice(&ROUTER_MAC.0);
    if let Ok(mut p) = Ipv6Packet::new_checked(&mut frame[HEADER_LEN..]) {
        p.decrement_hop_limit();
    }
    stats.routed.inc();
    Outcome::step(Step::Routed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        let mut t = RouteTable {
            ifaces: vec!["0=10.1.0.1/24".parse().unwrap(), "1=10.2.0.1/24".parse().unwrap()],
            routes: vec![
                "192.168.0.0/16,via=10.2.0.9".parse().unwrap(),
                "192.168.7.0/24,port=0".parse().unwrap(),
                "172.16.0.0/12,via=10.9.9.9".parse().unwrap(),
            ],
            ..Default::default()
        };
        t.reindex();
        t
    }

    fn neighbours() -> Neighbours {
        let n = Neighbours::new(2, 16);
        n.learn("10.2.0.9".parse().unwrap(), MacAddr([2, 0, 0, 0, 0, 9]), 1);
        n
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn longest_prefix_wins() {
        let t = table();
        let n = neighbours();
        assert_eq!(t.lookup(ip("10.1.0.7")), Some((0, ip("10.1.0.7"))));
        assert_eq!(t.lookup(ip("192.168.1.1")), Some((1, ip("10.2.0.9"))));
        assert_eq!(t.lookup(ip("192.168.7.5")), Some((0, ip("192.168.7.5"))));
        // A gateway off every connected prefix makes its route unusable.
        assert_eq!(t.lookup(ip("172.16.0.1")), None);
        assert_eq!(t.lookup(ip("8.8.8.8")), None);
        assert_eq!(
            t.resolve(ip("192.168.1.1"), &n),
            Resolution::Forward {
                mac: MacAddr([2, 0, 0, 0, 0, 9]),
                port: 1
            }
        );
        assert_eq!(
            t.resolve(ip("10.1.0.7"), &n),
            Resolution::Unresolved {
                next_hop: ip("10.1.0.7"),
                port: 0,
                from: ip("10.1.0.1")
            }
        );
        assert_eq!(t.resolve(ip("8.8.8.8"), &n), Resolution::NoRoute);
        assert!(t.is_neighbour(0, ip("10.1.0.7")));
        assert!(!t.is_neighbour(1, ip("10.1.0.7")));
        assert!(!t.is_neighbour(0, ip("10.1.0.1")));
        assert_eq!(t.source_for(0, ip("192.168.7.5")), Some(ip("10.1.0.1")));
        assert_eq!(t.source_for(0, ip("fe80::1")), None);
    }

    #[test]
    fn syntax_round_trips_and_errors() {
        for s in ["10.0.0.0/8,via=10.2.0.9", "2001:db8::/32,port=3"] {
            assert_eq!(s.parse::<Route>().unwrap().to_string(), s);
        }
        // The prefix is stored truncated to its network.
        assert_eq!(
            "10.1.2.3/8,port=0".parse::<Route>().unwrap().to_string(),
            "10.0.0.0/8,port=0"
        );
        assert_eq!(
            "2=10.1.0.1/24".parse::<RouterIf>().unwrap().to_string(),
            "2=10.1.0.1/24"
        );
        for (bad, want) in [
            ("10.0.0.0/8", "exactly one of"),
            ("10.0.0.0/8,via=10.0.0.1,port=1", "exactly one of"),
            ("10.0.0.0/8,via=fe80::1", "not in the family"),
            ("10.0.0.0/33,port=1", "bad prefix"),
            ("10.0.0.0/8,port=x", "bad port"),
            ("10.0.0.0/8,metric=1", "unknown route option"),
        ] {
            let e = bad.parse::<Route>().unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        for (bad, want) in [
            ("10.1.0.1/24", "PORT=ADDR/PREFIX"),
            ("0=10.1.0.0/24", "not a host address"),
            ("0=10.1.0.255/24", "not a host address"),
            ("0=10.1.0.1", "bad prefix"),
        ] {
            let e = bad.parse::<RouterIf>().unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn cache_is_invalidated_by_generation() {
        let mut c = RouteCache::default();
        let m = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(c.get(1, ip("10.1.0.7")), None);
        c.put(ip("10.1.0.7"), m, 0);
        assert_eq!(c.get(1, ip("10.1.0.7")), Some((m, 0)));
        // A colliding or different address is a miss, never a wrong answer.
        assert_eq!(c.get(1, ip("10.1.0.8")), None);
        assert_eq!(c.get(2, ip("10.1.0.7")), None);
        assert_eq!(c.get(2, ip("10.1.0.7")), None);
    }

    /// The definition: the longest matching prefix, connected before static at equal
    /// length, the first of equal static routes, gateways resolved on connected prefixes.
    fn brute(t: &RouteTable, dst: IpAddr) -> Option<(usize, IpAddr)> {
        let mut best: Option<(u8, u8, usize, IpAddr)> = None; // (len, rank, port, hop)
        for i in t.ifaces.iter().filter(|i| i.addr.contains(&dst)) {
            let c = (i.addr.prefix_len(), 1, i.port, dst);
            if best.is_none_or(|b| (c.0, c.1) > (b.0, b.1)) {
                best = Some(c);
            }
        }
        for r in t.routes.iter().filter(|r| r.prefix.contains(&dst)) {
            let (port, hop) = match r.hop {
                NextHop::Port(p) => (p, dst),
                NextHop::Via(gw) => match t
                    .ifaces
                    .iter()
                    .filter(|i| i.addr.contains(&gw))
                    .max_by_key(|i| i.addr.prefix_len())
                {
                    Some(i) => (i.port, gw),
                    None => continue,
                },
            };
            let c = (r.prefix.prefix_len(), 0, port, hop);
            if best.is_none_or(|b| (c.0, c.1) > (b.0, b.1)) {
                best = Some(c);
            }
        }
        best.map(|(_, _, p, h)| (p, h))
    }

    proptest::proptest! {
        #[test]
        fn indexed_lookup_equals_the_definition(
            routes in proptest::collection::vec((0u32..64, 8u8..=32, 0usize..3, proptest::prelude::any::<bool>()), 0..40),
            probes in proptest::collection::vec(0u32..64, 1..40),
        ) {
            // Addresses in 10.0.0.0/26 so prefixes overlap often.
            let a = |x: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | (x << 2)));
            let ifaces = vec!["0=10.0.0.1/28".parse().unwrap(), "1=10.0.0.129/25".parse().unwrap()];
            let routes = routes
                .into_iter()
                .map(|(x, len, port, via)| Route {
                    prefix: IpNet::new(a(x), len).unwrap().trunc(),
                    hop: if via { NextHop::Via(a(x ^ 7)) } else { NextHop::Port(port) },
                })
                .collect();
            let t = RouteTable::new(ifaces, routes);
            for p in probes {
                proptest::prop_assert_eq!(t.lookup(a(p)), brute(&t, a(p)));
            }
        }
    }
}
