//! The router's configuration syntax: `--router-ip PORT=ADDR/PREFIX` and
//! `--route PREFIX,via=ADDR|port=N` (also `ctl route`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

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

/// Where a static route leads.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
