//! The command line: what clap parses, and the help it prints. `config.rs` turns a run's
//! arguments into a checked [`Config`](crate::config::Config).

use std::os::fd::RawFd;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::control::qmp::QmpSpec;
use crate::device::filter::model::DEFAULT_EXACT_LIMIT;
use crate::device::filter::Layout;
use crate::device::snoop::DEFAULT_MAX_GROUPS;
use crate::pipeline::csum_action::CsumAction;
use crate::pipeline::fdb::DEFAULT_PORT_LIMIT;
use crate::pipeline::router::neigh::DEFAULT_NEIGH_LIMIT;
use crate::pipeline::router::{Route, RouterIf};
use crate::pipeline::source_lock::MacLock;
use crate::wire::MacAddr;

/// Most queue pairs: 2N data queues plus the control queue must fit vhost-user-backend's
/// 64-bit per-thread queue masks.
pub const MAX_QUEUE_PAIRS: u16 = 31;

#[derive(Debug, Parser)]
#[command(
    name = "dpaa-vnic",
    version,
    about = "vhost-user virtio-net backend modelled on NXP DPAA (FMan)",
    after_long_help = "SIGNALS:\n  SIGTERM, SIGINT and SIGHUP each stop the daemon: every port's connection ends, the \
sockets it bound are removed, and it exits 0. SIGHUP does not reload anything: a terminal \
that closes, or a service manager's stop, ends the daemon cleanly."
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
    /// The daemon's control socket (its --control). Default: $DPAA_VNIC_CONTROL, else
    /// $XDG_RUNTIME_DIR/dpaa-vnic/ctl, else /run/dpaa-vnic/ctl: where a daemon started with
    /// a bare --control listens.
    #[arg(long, value_name = "PATH", env = "DPAA_VNIC_CONTROL")]
    pub control: Option<PathBuf>,
    /// `table` for people, `json` for programs (the versioned interface,
    /// docs/interface.md). Default: table on a terminal, json when piped.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    #[command(subcommand)]
    pub what: CtlCommand,
}

/// How `ctl` prints an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Per-port counters and totals: each port's identity first, then its counters.
    Stats,
    /// Per-port receive mode and MAC tables.
    Filter,
    /// The daemon: version and revision, uptime, command line, ports.
    Info,
    /// A live view: each port's rates (frames, bytes, drops, filtered, hash false
    /// positives, route cache hits per second), refreshed in place.
    Watch {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
        interval: f64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// Checksum actions: list, add or delete them while traffic runs.
    Action {
        #[command(subcommand)]
        op: ActionOp,
    },
    /// Static routes: list (with router interfaces and neighbours), add or delete them.
    Route {
        #[command(subcommand)]
        op: RouteOp,
    },
}

#[derive(Debug, Subcommand)]
pub enum ActionOp {
    /// The actions in force, in order.
    List,
    /// Adds one, e.g. `port=0,dir=egress,update=iph+udp` (the syntax of --csum-action).
    Add { spec: String },
    /// Removes the one with this exact spec.
    Del { spec: String },
}

#[derive(Debug, Subcommand)]
pub enum RouteOp {
    /// Routes, router interfaces and neighbours.
    List,
    /// Adds one, e.g. `10.9.0.0/16,via=10.2.0.2` or `10.8.0.0/16,port=1` (the syntax of
    /// --route).
    Add { spec: String },
    /// Removes the one with this exact spec.
    Del { spec: String },
}

impl ActionOp {
    /// The control-socket command and argument.
    pub fn request(&self) -> (&'static str, Option<&str>) {
        match self {
            ActionOp::List => ("action-list", None),
            ActionOp::Add { spec } => ("action-add", Some(spec)),
            ActionOp::Del { spec } => ("action-del", Some(spec)),
        }
    }
}

impl RouteOp {
    /// The control-socket command and argument.
    pub fn request(&self) -> (&'static str, Option<&str>) {
        match self {
            RouteOp::List => ("route-list", None),
            RouteOp::Add { spec } => ("route-add", Some(spec)),
            RouteOp::Del { spec } => ("route-del", Some(spec)),
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
    /// Unix socket for `dpaa-vnic ctl`. Bare, the path `ctl` looks at by default:
    /// $DPAA_VNIC_CONTROL, else $XDG_RUNTIME_DIR/dpaa-vnic/ctl, else /run/dpaa-vnic/ctl
    /// (its directory is made if missing).
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub control: Option<Option<PathBuf>>,
    /// Receive filter of every guest port: memac (64 hash buckets), dtsec (256 unicast +
    /// 256 multicast buckets), dtsec-ext (512 multicast buckets) or exact.
    #[arg(long, default_value = "memac", value_name = "LAYOUT")]
    pub filter: Layout,
    /// Multicast entries the exact filter keeps before it falls back to allmulti.
    #[arg(long, default_value_t = DEFAULT_EXACT_LIMIT, value_name = "N")]
    pub exact_limit: usize,
    /// Microseconds the control queue keeps polling for the next command after serving one
    /// (0: sleep until kicked). Spends CPU only while a guest is sending commands; the
    /// default covers the gaps between a Linux guest's commands (docs/performance.md).
    #[arg(long, default_value_t = 1000, value_name = "US")]
    pub ctrl_poll_us: u64,
    /// Seconds a frontend has, once connected, to claim its port (VHOST_USER_SET_OWNER,
    /// QEMU's and DPDK's first request or close to it) before it is disconnected: a client
    /// that connects and says nothing holds the port from everyone else (0: no limit).
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    pub handshake_timeout: u64,
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
    /// (0.0.0.0, [::]) needs --metrics-wildcard. `unix:PATH` serves the same page on a Unix
    /// socket with the mode and group of --socket-mode/--socket-group, for hosts where any
    /// local user may reach loopback TCP.
    #[arg(long, value_name = "[ADDR:]PORT|unix:PATH")]
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

/// `--print-capabilities`: what QEMU's vhost-user.json schema (`VHostUserBackendCapabilities`,
/// QEMU 4.0 and later) lets a net backend report, its type; the schema defines no features
/// for `net`.
pub fn capabilities() -> serde_json::Value {
    serde_json::json!({ "type": "net" })
}
