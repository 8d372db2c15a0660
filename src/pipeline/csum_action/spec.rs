//! What a checksum action is: its targets, where it applies, what it matches, and the
//! `--csum-action` / `ctl action add` syntax that names it.

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

use crate::pipeline::packet::Packet;
use crate::wire::ip::{
    PROTO_ICMP, PROTO_ICMPV6, PROTO_IGMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP, PROTO_UDPLITE,
};

/// Which checksums an action recomputes (tc's `csum` targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Targets(pub(super) u8);

impl Targets {
    pub const IPH: Targets = Targets(1);
    pub const ICMP: Targets = Targets(2);
    pub const IGMP: Targets = Targets(4);
    pub const TCP: Targets = Targets(8);
    pub const UDP: Targets = Targets(16);
    pub const UDPLITE: Targets = Targets(32);
    pub const SCTP: Targets = Targets(64);
    const NAMES: [(&'static str, Targets); 7] = [
        ("iph", Self::IPH),
        ("icmp", Self::ICMP),
        ("igmp", Self::IGMP),
        ("tcp", Self::TCP),
        ("udp", Self::UDP),
        ("udplite", Self::UDPLITE),
        ("sctp", Self::SCTP),
    ];

    pub fn has(self, t: Targets) -> bool {
        self.0 & t.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Targets {
    type Output = Targets;
    fn bitor(self, o: Targets) -> Targets {
        Targets(self.0 | o.0)
    }
}

impl fmt::Display for Targets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(_, t)| self.has(*t))
            .map(|(n, _)| *n)
            .collect();
        f.write_str(&names.join("+"))
    }
}

/// Where on a port an action applies: frames entering the switch from it, or leaving to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        })
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ActionParseError {
    #[error("expected key=value, got {0:?}")]
    NotKeyValue(String),
    #[error("unknown key {0:?} (expected port, dir, update, proto, dst, verdict)")]
    UnknownKey(String),
    #[error("missing {0}=")]
    Missing(&'static str),
    #[error("bad port {text:?}")]
    Port {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("bad dir {0:?} (expected ingress or egress)")]
    Dir(String),
    #[error("bad verdict {0:?} (expected pass or drop)")]
    Verdict(String),
    #[error("unknown checksum target {0:?} (expected iph, icmp, igmp, tcp, udp, udplite, sctp)")]
    Target(String),
    #[error("bad protocol {text:?} (a number 0-255 or tcp, udp, udplite, icmp, icmpv6, igmp, sctp)")]
    Proto {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("bad destination prefix {text:?}")]
    Prefix {
        text: String,
        #[source]
        source: ipnet::AddrParseError,
    },
}

impl FromStr for Targets {
    type Err = ActionParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut t = Targets::default();
        for name in s.split('+') {
            let (_, bit) = Self::NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ActionParseError::Target(name.to_string()))?;
            t = t | *bit;
        }
        Ok(t)
    }
}

fn parse_proto(s: &str) -> Result<u8, ActionParseError> {
    Ok(match s {
        "icmp" => PROTO_ICMP,
        "igmp" => PROTO_IGMP,
        "tcp" => PROTO_TCP,
        "udp" => PROTO_UDP,
        "icmpv6" => PROTO_ICMPV6,
        "sctp" => PROTO_SCTP,
        "udplite" => PROTO_UDPLITE,
        n => n.parse().map_err(|source| ActionParseError::Proto {
            text: n.into(),
            source,
        })?,
    })
}

/// What becomes of a frame an action matched and updated (tc's control action after
/// `csum`: `pass`, the default, or `drop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verdict {
    #[default]
    Pass,
    Drop,
}

/// An action no rules have published yet: counted nowhere.
pub const NO_SLOT: u16 = u16::MAX;

/// One `--csum-action`:
/// `port=N,dir=ingress|egress,update=T[+T...][,proto=P][,dst=PREFIX][,verdict=pass|drop]`.
#[derive(Debug, Clone)]
pub struct CsumAction {
    pub port: usize,
    pub dir: Dir,
    pub update: Targets,
    pub proto: Option<u8>,
    pub dst: Option<IpNet>,
    pub verdict: Verdict,
    /// Where the workers count it (`stats::ACTION_SLOTS`), given when the rules holding it
    /// are published ([`NO_SLOT`] before): not part of what the action is.
    pub slot: u16,
}

/// Two actions are the same when they say the same, wherever they are counted.
impl PartialEq for CsumAction {
    fn eq(&self, o: &Self) -> bool {
        (
            self.port,
            self.dir,
            self.update,
            self.proto,
            self.dst,
            self.verdict,
        ) == (o.port, o.dir, o.update, o.proto, o.dst, o.verdict)
    }
}

impl Eq for CsumAction {}

impl FromStr for CsumAction {
    type Err = ActionParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut port, mut dir, mut update, mut proto, mut dst) = (None, None, None, None, None);
        let mut verdict = Verdict::Pass;
        for kv in s.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ActionParseError::NotKeyValue(kv.to_string()))?;
            match k {
                "port" => {
                    port = Some(v.parse().map_err(|source| ActionParseError::Port {
                        text: v.into(),
                        source,
                    })?)
                }
                "dir" => {
                    dir = Some(match v {
                        "ingress" => Dir::Ingress,
                        "egress" => Dir::Egress,
                        _ => return Err(ActionParseError::Dir(v.into())),
                    })
                }
                "update" => update = Some(v.parse::<Targets>()?),
                "proto" => proto = Some(parse_proto(v)?),
                "dst" => {
                    dst = Some(v.parse::<IpNet>().map_err(|source| ActionParseError::Prefix {
                        text: v.into(),
                        source,
                    })?)
                }
                "verdict" => {
                    verdict = match v {
                        "pass" => Verdict::Pass,
                        "drop" => Verdict::Drop,
                        _ => return Err(ActionParseError::Verdict(v.into())),
                    }
                }
                _ => return Err(ActionParseError::UnknownKey(k.into())),
            }
        }
        Ok(CsumAction {
            port: port.ok_or(ActionParseError::Missing("port"))?,
            dir: dir.ok_or(ActionParseError::Missing("dir"))?,
            update: update.ok_or(ActionParseError::Missing("update"))?,
            proto,
            dst,
            verdict,
            slot: NO_SLOT,
        })
    }
}

impl fmt::Display for CsumAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port={},dir={},update={}", self.port, self.dir, self.update)?;
        if let Some(p) = self.proto {
            write!(f, ",proto={p}")?;
        }
        if let Some(d) = self.dst {
            write!(f, ",dst={d}")?;
        }
        if self.verdict == Verdict::Drop {
            f.write_str(",verdict=drop")?;
        }
        Ok(())
    }
}

impl CsumAction {
    /// Whether the frame passes the action's protocol and destination match.
    pub fn matches(&self, pkt: &mut Packet<'_>) -> bool {
        if self.proto.is_none() && self.dst.is_none() {
            return true;
        }
        let Some((proto, _, dst)) = pkt.layers().addresses(pkt.frame) else {
            return false;
        };
        self.proto.is_none_or(|p| p == proto) && self.dst.is_none_or(|net| net.contains(&dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(s: &str) -> CsumAction {
        s.parse().unwrap()
    }

    #[test]
    fn action_syntax() {
        let a = act("port=2,dir=ingress,update=iph+tcp+sctp,proto=tcp,dst=192.168.0.0/16");
        assert_eq!(
            a.to_string(),
            "port=2,dir=ingress,update=iph+tcp+sctp,proto=6,dst=192.168.0.0/16"
        );
        assert_eq!(a.to_string().parse::<CsumAction>().unwrap(), a);
        let d = act("port=0,dir=egress,update=udp,verdict=drop");
        assert_eq!(d.verdict, Verdict::Drop);
        assert_eq!(d.to_string(), "port=0,dir=egress,update=udp,verdict=drop");
        assert_eq!(
            act("port=0,dir=egress,update=udp,verdict=pass").to_string(),
            "port=0,dir=egress,update=udp"
        );
        // Where it is counted is not what it is.
        assert_eq!(CsumAction { slot: 3, ..d.clone() }, d);
        assert_ne!(
            CsumAction {
                verdict: Verdict::Pass,
                ..d.clone()
            },
            d
        );
        for (bad, want) in [
            ("port=0,dir=egress", "missing update="),
            ("port=x,dir=egress,update=udp", "bad port"),
            ("port=0,dir=up,update=udp", "bad dir"),
            (
                "port=0,dir=egress,update=udp+ipx",
                "unknown checksum target \"ipx\"",
            ),
            ("port=0,dir=egress,update=udp,proto=999", "bad protocol"),
            (
                "port=0,dir=egress,update=udp,dst=10.0.0.0/33",
                "bad destination prefix",
            ),
            ("port=0,dir=egress,update=udp,colour=red", "unknown key"),
            ("port=0,dir=egress,update=udp,verdict=maybe", "bad verdict"),
            ("port", "expected key=value"),
        ] {
            let e = bad.parse::<CsumAction>().unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
