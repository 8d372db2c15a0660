//! The command line and the validated daemon configuration built from it.

use std::os::fd::RawFd;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

use crate::control::qmp::QmpSpec;
use crate::device::filter::model::DEFAULT_EXACT_LIMIT;
use crate::device::filter::Layout;
use crate::device::snoop::DEFAULT_MAX_GROUPS;
use crate::pipeline::csum_action::CsumAction;
use crate::pipeline::fdb::DEFAULT_PORT_LIMIT;
use crate::pipeline::router::neigh::DEFAULT_NEIGH_LIMIT;
use crate::pipeline::router::{Route, RouterIf};
use crate::pipeline::rules::NamesPort;
use crate::pipeline::source_lock::MacLock;
use crate::ports::poll::PollConfig;
use crate::ports::vhost_user::CtrlTuning;
use crate::unix_socket::SocketAccess;
use crate::wire::MacAddr;

/// Most queue pairs: 2N data queues plus the control queue must fit vhost-user-backend's
/// 64-bit per-thread queue masks.
pub const MAX_QUEUE_PAIRS: u16 = 31;

#[derive(Debug, Parser)]
#[command(
    name = "dpaa-vnic",
    version,
    about = "vhost-user virtio-net backend modelled on NXP DPAA (FMan)"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Query a running daemon over its control socket.
    Ctl(CtlArgs),
    /// Writes the man pages or shell completions into DIR (for packaging: scripts/install).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: Generated,
    },
}

#[derive(Debug, Subcommand)]
pub enum Generated {
    /// dpaa-vnic.1 and a page per subcommand (clap_mangen).
    Man { dir: PathBuf },
    /// The completion script for SHELL (clap_complete).
    Completions {
        shell: clap_complete::Shell,
        dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The daemon's --control socket.
    #[arg(long, value_name = "PATH")]
    pub control: PathBuf,
    #[command(subcommand)]
    pub what: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Per-port, per-queue counters and totals (JSON).
    Stats,
    /// Per-port rx mode and MAC tables (JSON).
    Filter,
    /// Checksum actions: list, add or delete them while traffic runs.
    Action {
        #[command(subcommand)]
        op: ListAddDel,
    },
    /// Static routes: list (with router interfaces and neighbours), add or delete them.
    Route {
        #[command(subcommand)]
        op: ListAddDel,
    },
}

#[derive(Debug, Subcommand)]
pub enum ListAddDel {
    List,
    /// Adds one, e.g. `port=0,dir=egress,update=iph+udp` or `10.9.0.0/16,via=10.2.0.2`.
    Add {
        spec: String,
    },
    /// Removes the one with this exact spec.
    Del {
        spec: String,
    },
}

impl ListAddDel {
    /// The control-socket command and argument: `<what>-list|add|del`.
    pub fn request(&self, what: &str) -> (String, Option<&str>) {
        match self {
            ListAddDel::List => (format!("{what}-list"), None),
            ListAddDel::Add { spec } => (format!("{what}-add"), Some(spec)),
            ListAddDel::Del { spec } => (format!("{what}-del"), Some(spec)),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// vhost-user socket to serve (`--socket-path` in QEMU's backend conventions); repeat
    /// for more guest ports (ports 0, 1, ... in order).
    #[arg(long = "socket", visible_alias = "socket-path", value_name = "PATH")]
    pub sockets: Vec<PathBuf>,
    /// A listening vhost-user socket the daemon inherits as descriptor N (systemd socket
    /// activation, libvirt, a jailer), instead of --socket; repeat for more guest ports. The
    /// daemon never removes its file.
    #[arg(long = "fd", value_name = "N", conflicts_with = "sockets")]
    pub fds: Vec<RawFd>,
    /// Connect to each --socket, where the frontend listens (QEMU: `-chardev
    /// socket,path=PATH,server=on`), instead of listening there; connect again whenever the
    /// frontend goes away.
    #[arg(long, conflicts_with = "fds")]
    pub client: bool,
    /// Print the backend's capabilities as QEMU's vhost-user.json schema describes them, and
    /// exit; other arguments are ignored.
    #[arg(long)]
    pub print_capabilities: bool,
    /// Host tap device to join to the switch (created if missing); it is the last port.
    #[arg(long, value_name = "IFNAME")]
    pub tap: Option<String>,
    /// Queue pairs per port (one worker thread each).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub queues: u16,
    /// MAC address served in config space, one per --socket in order (default 52:54:00:d0:aa:NN).
    #[arg(long = "mac", value_name = "MAC")]
    pub macs: Vec<MacAddr>,
    /// MTU served in config space.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u16,
    /// Unix socket for `dpaa-vnic ctl`.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Receive filter of every guest port: memac (64 hash buckets), dtsec (256 unicast +
    /// 256 multicast buckets), dtsec-ext (512 multicast buckets) or exact.
    #[arg(long, default_value = "memac", value_name = "LAYOUT")]
    pub filter: Layout,
    /// Multicast entries the exact filter keeps before it falls back to allmulti.
    #[arg(long, default_value_t = DEFAULT_EXACT_LIMIT, value_name = "N")]
    pub exact_limit: usize,
    /// Microseconds the control queue keeps polling for the next command after serving one
    /// (0: sleep until kicked). Spends CPU only while a guest is sending commands; the
    /// default covers the gaps between a Linux guest's commands (docs/benchmarks.md, "The
    /// polling window").
    #[arg(long, default_value_t = 1000, value_name = "US")]
    pub ctrl_poll_us: u64,
    /// Opt-in: SCHED_FIFO priority (1-99) the control-queue thread sleeps at, so that a
    /// guest's kick runs it at once even on the guest's own busy CPU; it drops to normal
    /// priority as soon as the command is served and never polls at it. 0 (the default): the
    /// daemon never changes its scheduling policy. Needs CAP_SYS_NICE or RLIMIT_RTPRIO, and a
    /// build with `--features ctrl-placement`.
    #[arg(long, default_value_t = 0, value_name = "PRIO")]
    pub ctrl_wake_priority: u8,
    /// Opt-in: after a wake-up, move the control-queue thread off a CPU where one of the
    /// frontend's threads (read from /proc/PID/task) is runnable. Off (the default): the
    /// daemon never changes its CPU affinity; pin it with taskset, systemd or libvirt. Needs a
    /// build with `--features ctrl-placement`.
    #[arg(long)]
    pub ctrl_placement: bool,
    /// Opt-in poll mode: N threads busy-poll the guests' TX queues (queues spread over them
    /// in turn) and carry each frame to its destination, with no kick or wake-up, as DPDK's
    /// PMD threads do. Each thread keeps a whole CPU busy even when no frame passes; where
    /// they run is left to taskset, systemd or libvirt. Default: event-driven
    #[arg(long, value_name = "N", conflicts_with = "poll_cpus")]
    pub poll: Option<usize>,
    /// Opt-in poll mode with one thread per listed CPU, each pinned to its CPU (e.g. `2,3`
    /// or `2-5`); otherwise as --poll
    #[arg(long, value_name = "LIST")]
    pub poll_cpus: Option<String>,
    /// Net attachment: follow QEMU's rx filter of guest port N (default 0) over its QMP
    /// socket, as libvirt does (NIC_RX_FILTER_CHANGED, query-rx-filter); nic=ID picks the
    /// NIC when QEMU has several. Repeat for more ports.
    #[arg(long = "qmp", value_name = "PATH[,port=N][,nic=ID]")]
    pub qmp: Vec<QmpSpec>,
    /// Net attachment: learn each guest's multicast groups from its own IGMP v1/v2/v3 and
    /// MLD v1/v2 reports and filter to exactly those (QEMU's own table stops at 64).
    #[arg(long)]
    pub snoop: bool,
    /// With --snoop: forget a group no report refreshed for this many seconds (0: keep it
    /// until the guest leaves it). dpaa-vnic then queries the guests every third of it.
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub snoop_timeout: u64,
    /// With --snoop: groups one guest may hold; joins beyond are ignored and counted
    /// (`snoop_groups_refused`).
    #[arg(long, default_value_t = DEFAULT_MAX_GROUPS, value_name = "N")]
    pub snoop_max_groups: usize,
    /// Checksum offload on the tap: `on` passes partial checksums both ways (fast); `off`
    /// completes them, so the host and captures on the tap see only final checksums.
    #[arg(long, default_value = "on", value_name = "on|off", value_parser = ["on", "off"])]
    pub tap_csum: String,
    /// Checksum action (tc act_csum semantics):
    /// `port=N,dir=ingress|egress,update=iph+icmp+igmp+tcp+udp+udplite+sctp[,proto=P][,dst=PREFIX]`.
    /// Ports are numbered in --socket order, the tap last. Repeat for several.
    #[arg(long = "csum-action", value_name = "SPEC")]
    pub csum_actions: Vec<CsumAction>,
    /// Serve counters in Prometheus text format at http://ADDR:PORT/metrics. A bare PORT
    /// listens on 127.0.0.1; ADDR may be a host name (`localhost`). A wildcard address
    /// (0.0.0.0, [::]) needs --metrics-wildcard.
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub metrics: Option<String>,
    /// Let --metrics listen on a wildcard address, reachable from every interface.
    #[arg(long)]
    pub metrics_wildcard: bool,
    /// Permission bits of the sockets the daemon creates (--socket, --control), octal; the
    /// owner must keep read and write. With a group (--socket-group), 0660 lets a `qemu` or
    /// `libvirt-qemu` user in.
    #[arg(long, default_value = "0600", value_name = "MODE")]
    pub socket_mode: String,
    /// Group (name or gid) given to the sockets the daemon creates.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// The router's address and connected prefix on a port, e.g. `0=10.1.0.1/24` or
    /// `1=fd00:2::1/64`: it answers ARP / neighbour solicitations for it there and routes
    /// between such prefixes (MAC 02:76:6e:69:63:01). Repeat.
    #[arg(long = "router-ip", value_name = "PORT=ADDR/PREFIX")]
    pub router_ips: Vec<RouterIf>,
    /// A static route: `PREFIX,via=ADDR` (gateway on a connected prefix) or `PREFIX,port=N`
    /// (on-link out of port N). Needs --router-ip. Repeat.
    #[arg(long = "route", value_name = "PREFIX,via=ADDR|port=N")]
    pub routes: Vec<Route>,
    /// Which source MACs a guest may send from (as `spoofchk` on an SR-IOV NIC): `auto`
    /// locks a guest to the MAC served in config space (device attachment) and leaves the
    /// net attachment open, where QEMU owns the MAC; `sticky` also locks a net-attachment
    /// guest to the first unicast source it sends from; `off` never locks. Refused frames
    /// count in `tx_spoofed`.
    #[arg(long, default_value = "auto", value_name = "auto|sticky|off")]
    pub port_mac_lock: MacLock,
    /// Addresses the switch learns per port at most; beyond it a port's new source
    /// addresses are not learned (`fdb_refused`), so a guest flooding random sources cannot
    /// evict the others' stations.
    #[arg(long, default_value_t = DEFAULT_PORT_LIMIT, value_name = "N")]
    pub fdb_limit: usize,
    /// Router neighbours (ARP / NDP) kept per port at most; beyond it new ones are refused
    /// (`neigh_refused`) until entries age out (5 minutes without a message from them).
    #[arg(long, default_value_t = DEFAULT_NEIGH_LIMIT, value_name = "N")]
    pub neigh_limit: usize,
}

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
    #[error("--tap {0:?}: interface names are 1 to 15 bytes")]
    TapName(String),
    #[error("--socket {0} is given twice")]
    DuplicateSocket(String),
    #[error("--qmp names port {port}, but there are {ports} guest ports")]
    QmpPort { port: usize, ports: usize },
    #[error("--qmp given twice for port {0}")]
    QmpTwice(usize),
    #[error("--snoop-timeout needs --snoop")]
    SnoopTimeoutAlone,
    #[error("--snoop and --qmp both drive port {0}'s filter: choose one")]
    SnoopAndQmp(usize),
    #[error("--ctrl-poll-us {0} is out of range 0..=100000")]
    CtrlPoll(u64),
    #[error("--ctrl-wake-priority {0} is out of range 0..=99")]
    CtrlWakePriority(u8),
    #[error(
        "{0} needs a build with the ctrl-placement feature (cargo build --release --features ctrl-placement)"
    )]
    NotBuilt(&'static str),
    #[error("{what} {spec}: port {port} does not exist ({ports} ports: --socket in order, then --tap)")]
    Port {
        what: &'static str,
        spec: String,
        port: usize,
        ports: usize,
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

/// `--print-capabilities`: what QEMU's vhost-user.json schema (`VHostUserBackendCapabilities`,
/// QEMU 4.0 and later) lets a net backend report, its type; the schema defines no features
/// for `net`.
pub fn capabilities() -> serde_json::Value {
    serde_json::json!({ "type": "net" })
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
    pub queue_pairs: u16,
    pub mtu: u16,
    pub control: Option<PathBuf>,
    pub filter: Layout,
    pub exact_limit: usize,
    pub ctrl: CtrlTuning,
    pub qmp: Vec<QmpSpec>,
    /// `Some(timeout)` when snooping; the inner `None` keeps groups until left.
    pub snoop: Option<Option<std::time::Duration>>,
    pub csum_actions: Vec<CsumAction>,
    pub tap_csum: bool,
    pub metrics: Option<std::net::SocketAddr>,
    /// Mode and group of the sockets the daemon creates.
    pub socket_access: SocketAccess,
    pub router_ips: Vec<RouterIf>,
    pub routes: Vec<Route>,
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

/// `--metrics`: `PORT` (loopback), `ADDR:PORT` or `HOST:PORT`; a wildcard only if allowed.
fn metrics_addr(spec: &str, wildcard: bool) -> Result<std::net::SocketAddr, ConfigError> {
    use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
    let bad = |why: String| ConfigError::Metrics {
        spec: spec.to_string(),
        why,
    };
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
    Ok(addr)
}

fn default_mac(i: usize) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0xd0, 0xaa, (i as u8).wrapping_add(1)])
}

impl RunArgs {
    /// The guest ports, their MACs and sizes, the tap and the QMP followers.
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
        if let Some(t) = &self.tap {
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
        if let Some(q) = self.qmp.iter().find(|_| self.snoop) {
            return Err(ConfigError::SnoopAndQmp(q.port));
        }
        if self.ctrl_poll_us > 100_000 {
            return Err(ConfigError::CtrlPoll(self.ctrl_poll_us));
        }
        if self.ctrl_wake_priority > 99 {
            return Err(ConfigError::CtrlWakePriority(self.ctrl_wake_priority));
        }
        if !cfg!(feature = "ctrl-placement") {
            if self.ctrl_placement {
                return Err(ConfigError::NotBuilt("--ctrl-placement"));
            }
            if self.ctrl_wake_priority > 0 {
                return Err(ConfigError::NotBuilt("--ctrl-wake-priority"));
            }
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
        a.check_ports()?;
        a.check_options()?;
        a.check_rules()?;
        let metrics = a
            .metrics
            .as_deref()
            .map(|spec| metrics_addr(spec, a.metrics_wildcard))
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
            queue_pairs: a.queues,
            mtu: a.mtu,
            control: a.control,
            filter: a.filter,
            exact_limit: a.exact_limit,
            ctrl: CtrlTuning {
                poll: std::time::Duration::from_micros(a.ctrl_poll_us),
                wake_priority: a.ctrl_wake_priority,
                placement: a.ctrl_placement,
            },
            qmp: a.qmp,
            snoop: a
                .snoop
                .then(|| (a.snoop_timeout > 0).then(|| std::time::Duration::from_secs(a.snoop_timeout))),
            csum_actions: a.csum_actions,
            tap_csum: a.tap_csum == "on",
            metrics,
            socket_access,
            router_ips: a.router_ips,
            routes: a.routes,
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
        // Nothing about the daemon's scheduling changes unless asked for.
        assert_eq!(c.ctrl.wake_priority, 0);
        assert!(!c.ctrl.placement);
        // Event-driven unless poll mode is asked for.
        assert_eq!(c.poll, None);
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
    }

    #[test]
    fn metrics_listen_on_loopback_unless_told_otherwise() {
        let m = |args: &[&str]| {
            parse(&[&["--socket", "a"], args].concat()).map(|c| c.metrics.unwrap().to_string())
        };
        assert_eq!(m(&["--metrics", "9100"]).unwrap(), "127.0.0.1:9100");
        assert_eq!(m(&["--metrics", "127.0.0.1:9100"]).unwrap(), "127.0.0.1:9100");
        assert!(m(&["--metrics", "localhost:9100"]).unwrap().ends_with(":9100"));
        assert_eq!(
            m(&["--metrics", "[::]:9100", "--metrics-wildcard"]).unwrap(),
            "[::]:9100"
        );
        let c = parse(&["--socket", "a", "--socket-mode", "0660", "--socket-group", "0"]).unwrap();
        assert_eq!(c.socket_access.mode, 0o660);
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(parse(&[]), Err(ConfigError::NoSocket));
        assert_eq!(
            parse(&["--socket", "a", "--ctrl-wake-priority", "100"]),
            Err(ConfigError::CtrlWakePriority(100))
        );
        let opted_in = parse(&["--socket", "a", "--ctrl-wake-priority", "1", "--ctrl-placement"]);
        if cfg!(feature = "ctrl-placement") {
            assert_eq!(
                opted_in.map(|c| c.ctrl),
                Ok(CtrlTuning {
                    poll: std::time::Duration::from_millis(1),
                    wake_priority: 1,
                    placement: true
                })
            );
        } else {
            // Without the feature the options are refused, never silently ignored.
            assert_eq!(opted_in, Err(ConfigError::NotBuilt("--ctrl-placement")));
            assert_eq!(
                parse(&["--socket", "a", "--ctrl-wake-priority", "1"]),
                Err(ConfigError::NotBuilt("--ctrl-wake-priority"))
            );
        }
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
