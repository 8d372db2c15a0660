//! The daemon's configuration, checked: built from the command line (`cli.rs`) by
//! `TryFrom<RunArgs>`, every check with its own [`ConfigError`].

use std::os::fd::RawFd;
use std::path::PathBuf;

use thiserror::Error;

use crate::cli::{RunArgs, MAX_QUEUE_PAIRS};
use crate::control::metrics_server::MetricsAt;
use crate::control::qmp::QmpSpec;
use crate::device::filter::Layout;
use crate::pipeline::csum_action::CsumAction;
use crate::pipeline::router::{Route, RouterIf};
use crate::pipeline::rules::{NamesPort, MAX_ACTIONS, MAX_ROUTES};
use crate::pipeline::source_lock::MacLock;
use crate::ports::poll::PollConfig;
use crate::ports::vhost_user::Snooping;
use crate::unix_socket::SocketAccess;
use crate::wire::MacAddr;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("at least one --socket (or --fd) is needed")]
    NoSocket,
    #[error("--fd {0} is given twice")]
    DuplicateFd(RawFd),
    #[error("--queues {0} is out of range 1..={MAX_QUEUE_PAIRS}")]
    Queues(u16),
    #[error("{macs} --mac given for {sockets} --socket")]
    TooManyMacs { macs: usize, sockets: usize },
    #[error("--mac {0} is a multicast address")]
    MulticastMac(MacAddr),
    #[error("--mtu {0} is out of range 68..=65535")]
    Mtu(u16),
    #[error("--poll {0} is out of range 1..={MAX_POLL_THREADS}")]
    PollThreads(usize),
    #[error("--poll-cpus {0:?} is not a list of distinct CPUs such as `2,3` or `2-5`")]
    PollCpus(String),
    #[error("--poll-cpus {list:?}: a CPU is not a number")]
    PollCpu {
        list: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("--tap or --tap-bridge {0:?}: interface names are 1 to 15 bytes, without '/' or spaces")]
    TapName(String),
    #[error(
        "{what} {path}: {len} bytes, and a Unix socket's path holds at most {} (unix(7), sun_path)",
        crate::unix_socket::MAX_PATH
    )]
    SocketPath {
        what: &'static str,
        path: String,
        len: usize,
    },
    #[error("--socket {0} is given twice")]
    DuplicateSocket(String),
    #[error("--qmp names port {port}, but there are {ports} guest ports")]
    QmpPort { port: usize, ports: usize },
    #[error("--qmp given twice for port {0}")]
    QmpTwice(usize),
    #[error("--snoop-timeout needs --snoop")]
    SnoopTimeoutAlone,
    #[error("--ctrl-poll-us {0} is out of range 0..=100000")]
    CtrlPoll(u64),
    #[error("--tx-poll-us {0} is out of range 0..=100000")]
    TxPoll(u64),
    #[error("{what} {spec}: port {port} does not exist ({ports} ports: --socket in order, then --tap)")]
    Port {
        what: &'static str,
        spec: String,
        port: usize,
        ports: usize,
    },
    #[error("{n} {what} given: at most {max}")]
    TooMany {
        what: &'static str,
        n: usize,
        max: usize,
    },
    #[error("--route needs at least one --router-ip")]
    RouteWithoutRouter,
    #[error("--metrics {spec}: {why}")]
    Metrics { spec: String, why: String },
    #[error(
        "--metrics {0} listens on every interface: name one address (127.0.0.1:PORT, or just PORT), or add --metrics-wildcard"
    )]
    MetricsWildcard(std::net::SocketAddr),
    #[error("--socket-mode {0:?} is not an octal mode of at most 0777 that keeps the owner's rw bits")]
    SocketMode(String),
    #[error("--socket-group {0:?}: no such group")]
    UnknownGroup(String),
    #[error("--socket-group {name:?}: looking it up")]
    GroupLookup {
        name: String,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("--fdb-limit, --neigh-limit and --snoop-max-groups must be at least 1")]
    Limit,
    #[error("--exact-limit {0} is out of range 1..={max}", max = crate::device::filter::regs::TABLE_MAX)]
    ExactLimit(usize),
}

/// How a guest port meets its frontend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `--socket PATH`: the daemon binds PATH and listens.
    Listen(PathBuf),
    /// `--fd N`: a socket someone else bound, already listening.
    Inherited(RawFd),
    /// `--socket PATH --client`: the frontend listens at PATH; the daemon connects.
    Connect(PathBuf),
}

/// A guest port's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPortConfig {
    pub endpoint: Endpoint,
    pub mac: MacAddr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub guests: Vec<GuestPortConfig>,
    pub tap: Option<String>,
    /// `--tap-up`, or implied by `--tap-bridge`.
    pub tap_up: bool,
    pub tap_bridge: Option<String>,
    pub queue_pairs: u16,
    pub mtu: u16,
    pub control: Option<PathBuf>,
    pub filter: Layout,
    pub exact_limit: usize,
    /// How long the control thread polls its ring after a command (`--ctrl-poll-us`).
    pub ctrl_poll: std::time::Duration,
    /// How long an event-driven TX worker polls its ring after a burst (`--tx-poll-us`).
    pub tx_poll: std::time::Duration,
    /// `--handshake-timeout` (`None`: no limit).
    pub handshake: Option<std::time::Duration>,
    pub qmp: Vec<QmpSpec>,
    pub snoop: Snooping,
    pub csum_actions: Vec<CsumAction>,
    pub tap_csum: bool,
    pub metrics: Option<MetricsAt>,
    /// Mode and group of the sockets the daemon creates.
    pub socket_access: SocketAccess,
    pub router_ips: Vec<RouterIf>,
    pub routes: Vec<Route>,
    /// `--route-cache shared`: one locked route cache for every worker.
    pub shared_route_cache: bool,
    /// `--csum-rules locked`: checksum actions under a lock, with shared counters.
    pub locked_csum_rules: bool,
    pub mac_lock: MacLock,
    pub fdb_limit: usize,
    pub neigh_limit: usize,
    pub snoop_max_groups: usize,
    /// `--poll` / `--poll-cpus`: poll threads instead of kicks (`None`: event-driven).
    pub poll: Option<PollConfig>,
}

/// Poll threads a daemon may start: more than the CPUs of any host this is run on.
pub const MAX_POLL_THREADS: usize = 64;

/// `--poll-cpus`: CPUs as a comma-separated list of numbers and ranges (`2,3`, `2-5`), each
/// named once, as taskset's and cgroups' cpu lists are written.
fn parse_cpu_list(s: &str) -> Result<Vec<usize>, ConfigError> {
    let bad = || ConfigError::PollCpus(s.to_string());
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let cpu = |n: &str| {
            n.trim().parse::<usize>().map_err(|source| ConfigError::PollCpu {
                list: s.to_string(),
                source,
            })
        };
        let (a, b) = (cpu(a)?, cpu(b)?);
        if a > b || b >= nix::sched::CpuSet::count() {
            return Err(bad());
        }
        for c in a..=b {
            if cpus.contains(&c) || cpus.len() == MAX_POLL_THREADS {
                return Err(bad());
            }
            cpus.push(c);
        }
    }
    Ok(cpus)
}

/// The poll mode `--poll` or `--poll-cpus` asks for, if either.
fn poll_config(threads: Option<usize>, cpus: Option<&str>) -> Result<Option<PollConfig>, ConfigError> {
    match (threads, cpus) {
        (Some(n), _) if n == 0 || n > MAX_POLL_THREADS => Err(ConfigError::PollThreads(n)),
        (Some(n), _) => Ok(Some(PollConfig::Threads(n))),
        (None, Some(list)) => Ok(Some(PollConfig::Cpus(parse_cpu_list(list)?))),
        (None, None) => Ok(None),
    }
}

/// `--socket-mode`: octal permission bits that let the owner read and write.
fn parse_mode(s: &str) -> Result<u32, ConfigError> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 && m & 0o600 == 0o600 => Ok(m),
        _ => Err(ConfigError::SocketMode(s.to_string())),
    }
}

/// `--socket-group`: a group name, or a numeric gid.
fn resolve_group(s: &str) -> Result<nix::unistd::Gid, ConfigError> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(nix::unistd::Gid::from_raw(gid));
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid),
        Ok(None) => Err(ConfigError::UnknownGroup(s.to_string())),
        Err(source) => Err(ConfigError::GroupLookup {
            name: s.to_string(),
            source,
        }),
    }
}

/// `--metrics`: `unix:PATH`, `PORT` (loopback), `ADDR:PORT` or `HOST:PORT`; a wildcard
/// only if allowed.
fn metrics_at(spec: &str, wildcard: bool) -> Result<MetricsAt, ConfigError> {
    use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
    let bad = |why: String| ConfigError::Metrics {
        spec: spec.to_string(),
        why,
    };
    if let Some(path) = spec.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(bad("unix: needs a path".into()));
        }
        if path.len() > crate::unix_socket::MAX_PATH {
            return Err(ConfigError::SocketPath {
                what: "--metrics",
                path: path.to_string(),
                len: path.len(),
            });
        }
        return Ok(MetricsAt::Unix(PathBuf::from(path)));
    }
    let addr = match spec.parse::<u16>() {
        Ok(port) => SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Err(_) => spec
            .to_socket_addrs()
            .map_err(|e| bad(format!("not [ADDR:]PORT ({e})")))?
            .next()
            .ok_or_else(|| bad("the name has no address".into()))?,
    };
    if addr.ip().is_unspecified() && !wildcard {
        return Err(ConfigError::MetricsWildcard(addr));
    }
    Ok(MetricsAt::Tcp(addr))
}

fn default_mac(i: usize) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0xd0, 0xaa, (i as u8).wrapping_add(1)])
}

/// What `RunArgs` holds that clap cannot check: the guest ports, their MACs and sizes, the
/// tap and the QMP followers; options with a range and the ones that go together; rules
/// that name ports.
struct Checks<'a>(&'a RunArgs);

impl std::ops::Deref for Checks<'_> {
    type Target = RunArgs;

    fn deref(&self) -> &RunArgs {
        self.0
    }
}

impl Checks<'_> {
    /// Guest ports: one per --socket, or one per --fd (clap refuses both at once).
    fn guest_count(&self) -> usize {
        self.sockets.len() + self.fds.len()
    }

    fn check_ports(&self) -> Result<(), ConfigError> {
        if self.guest_count() == 0 {
            return Err(ConfigError::NoSocket);
        }
        for (i, fd) in self.fds.iter().enumerate() {
            if self.fds[..i].contains(fd) {
                return Err(ConfigError::DuplicateFd(*fd));
            }
        }
        let paths = (self.sockets.iter().map(|p| ("--socket", p)))
            .chain(self.control.iter().flatten().map(|p| ("--control", p)))
            .chain(self.qmp.iter().map(|q| ("--qmp", &q.path)));
        for (what, path) in paths {
            let len = path.as_os_str().len();
            if len > crate::unix_socket::MAX_PATH {
                return Err(ConfigError::SocketPath {
                    what,
                    path: path.display().to_string(),
                    len,
                });
            }
        }
        if self.queues == 0 || self.queues > MAX_QUEUE_PAIRS {
            return Err(ConfigError::Queues(self.queues));
        }
        if self.macs.len() > self.guest_count() {
            return Err(ConfigError::TooManyMacs {
                macs: self.macs.len(),
                sockets: self.guest_count(),
            });
        }
        if let Some(m) = self.macs.iter().find(|m| m.is_multicast()) {
            return Err(ConfigError::MulticastMac(*m));
        }
        if self.mtu < 68 {
            return Err(ConfigError::Mtu(self.mtu));
        }
        for t in self.tap.iter().chain(&self.tap_bridge) {
            if t.is_empty() || t.len() > 15 || t.contains(['/', ' ', '\0']) {
                return Err(ConfigError::TapName(t.clone()));
            }
        }
        for (i, q) in self.qmp.iter().enumerate() {
            if q.port >= self.guest_count() {
                return Err(ConfigError::QmpPort {
                    port: q.port,
                    ports: self.guest_count(),
                });
            }
            if self.qmp[..i].iter().any(|o| o.port == q.port) {
                return Err(ConfigError::QmpTwice(q.port));
            }
        }
        Ok(())
    }

    /// Options with a range, and the ones that go together.
    fn check_options(&self) -> Result<(), ConfigError> {
        if self.snoop_timeout > 0 && !self.snoop {
            return Err(ConfigError::SnoopTimeoutAlone);
        }
        if self.ctrl_poll_us > 100_000 {
            return Err(ConfigError::CtrlPoll(self.ctrl_poll_us));
        }
        if self.tx_poll_us > 100_000 {
            return Err(ConfigError::TxPoll(self.tx_poll_us));
        }
        if self.fdb_limit == 0 || self.neigh_limit == 0 || self.snoop_max_groups == 0 {
            return Err(ConfigError::Limit);
        }
        if self.exact_limit == 0 || self.exact_limit > crate::device::filter::regs::TABLE_MAX {
            return Err(ConfigError::ExactLimit(self.exact_limit));
        }
        Ok(())
    }

    /// Rules that name ports, the router they need, and sockets named twice.
    fn check_rules(&self) -> Result<(), ConfigError> {
        let nports = self.guest_count() + usize::from(self.tap.is_some());
        check_named_ports("--csum-action", &self.csum_actions, nports)?;
        for (what, n, max) in [
            ("--csum-action", self.csum_actions.len(), MAX_ACTIONS),
            ("--route", self.routes.len(), MAX_ROUTES),
        ] {
            if n > max {
                return Err(ConfigError::TooMany { what, n, max });
            }
        }
        check_named_ports("--router-ip", &self.router_ips, nports)?;
        check_named_ports("--route", &self.routes, nports)?;
        if !self.routes.is_empty() && self.router_ips.is_empty() {
            return Err(ConfigError::RouteWithoutRouter);
        }
        for (i, s) in self.sockets.iter().enumerate() {
            if self.sockets[..i].contains(s) {
                return Err(ConfigError::DuplicateSocket(s.display().to_string()));
            }
        }
        Ok(())
    }
}

impl TryFrom<RunArgs> for Config {
    type Error = ConfigError;

    fn try_from(a: RunArgs) -> Result<Self, Self::Error> {
        let checks = Checks(&a);
        checks.check_ports()?;
        checks.check_options()?;
        checks.check_rules()?;
        let metrics = a
            .metrics
            .as_deref()
            .map(|spec| metrics_at(spec, a.metrics_wildcard))
            .transpose()?;
        let poll = poll_config(a.poll, a.poll_cpus.as_deref())?;
        let socket_access = SocketAccess {
            mode: parse_mode(&a.socket_mode)?,
            group: a.socket_group.as_deref().map(resolve_group).transpose()?,
        };
        let endpoints = a.sockets.into_iter().map(|p| match a.client {
            true => Endpoint::Connect(p),
            false => Endpoint::Listen(p),
        });
        let guests = endpoints
            .chain(a.fds.iter().copied().map(Endpoint::Inherited))
            .enumerate()
            .map(|(i, endpoint)| GuestPortConfig {
                endpoint,
                mac: a.macs.get(i).copied().unwrap_or_else(|| default_mac(i)),
            })
            .collect();
        Ok(Config {
            guests,
            tap: a.tap,
            tap_up: a.tap_up || a.tap_bridge.is_some(),
            tap_bridge: a.tap_bridge,
            queue_pairs: a.queues,
            mtu: a.mtu,
            control: a
                .control
                .map(|c| c.unwrap_or_else(crate::control::client::default_path)),
            filter: a.filter,
            exact_limit: a.exact_limit,
            ctrl_poll: std::time::Duration::from_micros(a.ctrl_poll_us),
            tx_poll: std::time::Duration::from_micros(a.tx_poll_us),
            handshake: (a.handshake_timeout > 0).then(|| std::time::Duration::from_secs(a.handshake_timeout)),
            qmp: a.qmp,
            snoop: if a.snoop {
                Snooping::On {
                    expiry: (a.snoop_timeout > 0).then(|| std::time::Duration::from_secs(a.snoop_timeout)),
                }
            } else {
                Snooping::Off
            },
            csum_actions: a.csum_actions,
            tap_csum: a.tap_csum == "on",
            metrics,
            socket_access,
            router_ips: a.router_ips,
            routes: a.routes,
            shared_route_cache: a.route_cache == "shared",
            locked_csum_rules: a.csum_rules == "locked",
            mac_lock: a.port_mac_lock,
            poll,
            fdb_limit: a.fdb_limit,
            neigh_limit: a.neigh_limit,
            snoop_max_groups: a.snoop_max_groups,
        })
    }
}

/// Every rule in `items` names a port there is.
fn check_named_ports<T: NamesPort>(what: &'static str, items: &[T], ports: usize) -> Result<(), ConfigError> {
    match items.iter().find_map(|i| Some((i, i.missing_port(ports)?))) {
        Some((bad, port)) => Err(ConfigError::Port {
            what,
            spec: bad.to_string(),
            port,
            ports,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let cli = Cli::try_parse_from(std::iter::once("dpaa-vnic").chain(args.iter().copied())).unwrap();
        Config::try_from(cli.run)
    }

    #[test]
    fn defaults() {
        let c = parse(&["--socket", "/tmp/a.sock", "--socket", "/tmp/b.sock"]).unwrap();
        assert_eq!(c.queue_pairs, 1);
        assert_eq!(c.mtu, 1500);
        assert_eq!(c.guests[1].mac.to_string(), "52:54:00:d0:aa:02");
        assert_eq!(c.socket_access, SocketAccess::default());
        assert_eq!(c.metrics, None);
        assert_eq!(c.ctrl_poll, std::time::Duration::from_millis(1));
        // A TX worker watches its ring for a while after a burst.
        assert_eq!(c.tx_poll, std::time::Duration::from_micros(50));
        assert_eq!(c.snoop, Snooping::Off);
        // Event-driven unless poll mode is asked for.
        assert_eq!(c.poll, None);
        // The seeds' "before" modes only when asked for.
        assert!(!c.shared_route_cache && !c.locked_csum_rules);
        let c = parse(&[
            "--socket",
            "a",
            "--route-cache",
            "shared",
            "--csum-rules",
            "locked",
        ])
        .unwrap();
        assert!(c.shared_route_cache && c.locked_csum_rules);
    }

    #[test]
    fn poll_mode_options() {
        let p = |args: &[&str]| parse(&[&["--socket", "a"], args].concat()).map(|c| c.poll);
        assert_eq!(p(&["--poll", "2"]).unwrap(), Some(PollConfig::Threads(2)));
        assert_eq!(
            p(&["--poll-cpus", "1,3-4"]).unwrap(),
            Some(PollConfig::Cpus(vec![1, 3, 4]))
        );
        for bad in ["", "1,1", "4-3", "x", "1-", "99999"] {
            assert!(
                matches!(
                    p(&["--poll-cpus", bad]),
                    Err(ConfigError::PollCpus(_) | ConfigError::PollCpu { .. })
                ),
                "--poll-cpus {bad:?} accepted"
            );
        }
        assert!(matches!(p(&["--poll", "0"]), Err(ConfigError::PollThreads(0))));
        assert!(matches!(p(&["--poll", "65"]), Err(ConfigError::PollThreads(65))));
        // The event-driven worker's polling window after a burst.
        assert_eq!(
            parse(&["--socket", "a", "--tx-poll-us", "100001"]),
            Err(ConfigError::TxPoll(100_001))
        );
        let c = parse(&["--socket", "a", "--tx-poll-us", "100000"]).unwrap();
        assert_eq!(c.tx_poll, std::time::Duration::from_millis(100));
    }

    #[test]
    fn metrics_listen_on_loopback_unless_told_otherwise() {
        let m = |args: &[&str]| {
            parse(&[&["--socket", "a"], args].concat()).map(|c| c.metrics.unwrap().to_string())
        };
        assert_eq!(
            m(&["--metrics", "9100"]).unwrap(),
            "http://127.0.0.1:9100/metrics"
        );
        assert_eq!(
            m(&["--metrics", "127.0.0.1:9100"]).unwrap(),
            "http://127.0.0.1:9100/metrics"
        );
        assert!(m(&["--metrics", "localhost:9100"])
            .unwrap()
            .ends_with(":9100/metrics"));
        assert_eq!(
            m(&["--metrics", "[::]:9100", "--metrics-wildcard"]).unwrap(),
            "http://[::]:9100/metrics"
        );
        assert_eq!(
            parse(&["--socket", "a", "--metrics", "unix:/run/m.sock"])
                .unwrap()
                .metrics,
            Some(MetricsAt::Unix("/run/m.sock".into()))
        );
        assert!(matches!(
            parse(&["--socket", "a", "--metrics", "unix:"]),
            Err(ConfigError::Metrics { .. })
        ));
        let c = parse(&["--socket", "a", "--socket-mode", "0660", "--socket-group", "0"]).unwrap();
        assert_eq!(c.socket_access.mode, 0o660);
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(parse(&[]), Err(ConfigError::NoSocket));
        assert_eq!(
            parse(&["--socket", "a", "--queues", "0"]),
            Err(ConfigError::Queues(0))
        );
        assert_eq!(
            parse(&["--socket", "a", "--queues", "32"]),
            Err(ConfigError::Queues(32))
        );
        assert!(matches!(
            parse(&["--socket", "a", "--mac", "01:00:00:00:00:01"]),
            Err(ConfigError::MulticastMac(_))
        ));
        assert!(matches!(
            parse(&["--socket", "a", "--tap", "a-very-long-tap-name"]),
            Err(ConfigError::TapName(_))
        ));
        assert!(matches!(
            parse(&["--socket", "a", "--socket", "a"]),
            Err(ConfigError::DuplicateSocket(_))
        ));
        let long = format!("/run/{}", "d".repeat(103));
        assert!(parse(&["--socket", &long[..107]]).is_ok());
        assert!(matches!(
            parse(&["--socket", &long]),
            Err(ConfigError::SocketPath {
                what: "--socket",
                len: 108,
                ..
            })
        ));
        assert!(matches!(
            parse(&["--socket", "a", "--control", &long]),
            Err(ConfigError::SocketPath {
                what: "--control",
                ..
            })
        ));
        assert!(matches!(
            parse(&[
                "--socket",
                "a",
                "--mac",
                "02:00:00:00:00:01",
                "--mac",
                "02:00:00:00:00:02"
            ]),
            Err(ConfigError::TooManyMacs { .. })
        ));
        assert!(Cli::try_parse_from(["dpaa-vnic", "--socket", "a", "--mac", "zz"]).is_err());
        assert!(Cli::try_parse_from(["dpaa-vnic", "--socket", "a", "--filter", "fman"]).is_err());
        assert!(
            Cli::try_parse_from(["dpaa-vnic", "--socket", "a", "--csum-action", "port=0,dir=in"]).is_err()
        );
        assert!(matches!(
            parse(&["--socket", "a", "--csum-action", "port=1,dir=egress,update=udp"]),
            Err(ConfigError::Port {
                what: "--csum-action",
                port: 1,
                ports: 1,
                ..
            })
        ));
        let c = parse(&[
            "--socket",
            "a",
            "--tap",
            "t0",
            "--csum-action",
            "port=1,dir=egress,update=udp",
        ])
        .unwrap();
        assert_eq!(c.csum_actions[0].port, 1);
    }

    #[test]
    fn rejects_bad_limits_and_sockets() {
        assert_eq!(
            parse(&["--socket", "a", "--exact-limit", "0"]),
            Err(ConfigError::ExactLimit(0))
        );
        assert!(matches!(
            parse(&["--socket", "a", "--metrics", "0.0.0.0:9100"]),
            Err(ConfigError::MetricsWildcard(_))
        ));
        for bad in ["0400", "1777", "rw", "0o1000", ""] {
            assert_eq!(
                parse(&["--socket", "a", "--socket-mode", bad]),
                Err(ConfigError::SocketMode(bad.into()))
            );
        }
        assert_eq!(
            parse(&["--socket", "a", "--socket-group", "no-such-group-here"]),
            Err(ConfigError::UnknownGroup("no-such-group-here".into()))
        );
        assert!(matches!(
            parse(&["--socket", "a", "--metrics", "host:notaport"]),
            Err(ConfigError::Metrics { .. })
        ));
        assert_eq!(
            parse(&["--socket", "a", "--filter", "dtsec-ext"]).unwrap().filter,
            Layout::DtsecExtended
        );
    }
}
