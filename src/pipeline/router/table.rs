//! The router's table: interfaces, static routes and the prefix index built from them,
//! resolved against the neighbours.

use std::net::IpAddr;

use super::lpm::Lpm;
use super::neigh::Neighbours;
use super::spec::{NextHop, Route, RouterIf};
use crate::wire::MacAddr;

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

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;

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
