//! The command line: what clap parses, and the help it prints. `config.rs` turns a run's
//! arguments into a checked [`Config`](crate::config::Config).

use std::os::fd::RawFd;
use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
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

/// A section `--help` and the man page print after the options: a title and its entries,
/// each a term (a command, a variable, a code, a path) and what it is.
pub struct Section {
    pub title: &'static str,
    pub entries: &'static [(&'static str, &'static str)],
}

/// The sections after the options, for `--help` ([`after_help`]) and the man page.
pub const SECTIONS: &[Section] = &[
    Section {
        title: "EXAMPLES",
        entries: &[
            (
                "dpaa-vnic --socket /run/vnic0.sock --socket /run/vnic1.sock --tap vtap0 --control",
                "Two guest ports and the host's tap vtap0 on one switch; ctl answers on the default control socket.",
            ),
            (
                "qemu-system-x86_64 ... -chardev socket,id=c0,path=/run/vnic0.sock -netdev vhost-user,id=n0,chardev=c0 -device virtio-net-pci,netdev=n0",
                "A guest on port 0 in the net attachment (QEMU keeps the control queue); its memory must be shared (-object memory-backend-memfd,share=on). docs/running-with-qemu.md has both attachments.",
            ),
            (
                "dpaa-vnic --socket /run/vnic0.sock --snoop --filter dtsec-ext",
                "Net attachment, the filter following the guest's IGMP and MLD reports, with dTSEC's 512 multicast buckets.",
            ),
            (
                "dpaa-vnic ctl stats; dpaa-vnic ctl watch; dpaa-vnic ctl --format json filter",
                "Counters, live rates, and the filter's tables as the versioned JSON interface.",
            ),
            (
                "dpaa-vnic --socket a.sock --socket b.sock --poll-cpus 1",
                "Poll mode: one thread pinned to CPU 1 busy-polls both guests' queues.",
            ),
            (
                "dpaa-vnic qemu-args --attach device --queues 2 --socket /run/vnic0.sock",
                "The QEMU arguments for a guest on that socket in the device attachment (--libvirt: the domain XML).",
            ),
        ],
    },
    Section {
        title: "ENVIRONMENT",
        entries: &[
            (
                "RUST_LOG",
                "What the daemon logs to stderr, in env_logger's syntax (error, warn, info, debug, trace, or per module); info by default. Per-frame lines are trace only.",
            ),
            (
                "DPAA_VNIC_CONTROL",
                "The control socket ctl talks to, and a bare --control listens on, when --control names none.",
            ),
            (
                "XDG_RUNTIME_DIR",
                "Without DPAA_VNIC_CONTROL: the default control socket is $XDG_RUNTIME_DIR/dpaa-vnic/ctl, else /run/dpaa-vnic/ctl.",
            ),
            (
                "NOTIFY_SOCKET",
                "Set by systemd for Type=notify: the daemon reports READY=1 once every socket serves, and STOPPING=1.",
            ),
        ],
    },
    Section {
        title: "SIGNALS",
        entries: &[(
            "SIGTERM, SIGINT, SIGHUP",
            "Each stops the daemon: every port's connection ends, the sockets it bound are removed, and it exits 0. SIGHUP reloads nothing: a terminal that closes, or a service manager's stop, ends the daemon cleanly.",
        )],
    },
    Section {
        title: "EXIT STATUS",
        entries: &[
            ("0", "Stopped by a signal after a clean shutdown; or --print-capabilities, --help, --version, or a ctl command that was answered."),
            ("1", "The daemon could not start (a socket, tap or descriptor limit it could not have), or ctl got no answer or an error."),
            ("2", "The command line is wrong: an unknown option or a value that does not parse."),
        ],
    },
    Section {
        title: "FILES",
        entries: &[
            ("/run/dpaa-vnic/ctl", "The default control socket of a daemon started with a bare --control, as root."),
            (
                "/etc/dpaa-vnic/NAME.env",
                "With the dpaa-vnic@NAME systemd units: DPAA_VNIC_ARGS, the daemon's options for instance NAME (the socket comes from dpaa-vnic@NAME.socket).",
            ),
            (
                "/etc/qemu/vhost-user/50-dpaa-vnic.json",
                "QEMU's backend descriptor (docs/interop/vhost-user.json): how libvirt finds the program.",
            ),
        ],
    },
];

/// [`SECTIONS`] as `--help` prints them after the options.
pub fn after_help() -> String {
    let mut out = String::new();
    for s in SECTIONS {
        out.push_str(s.title);
        out.push_str(":\n");
        for (term, what) in s.entries {
            out.push_str(&format!("  {term}\n      {what}\n"));
        }
        out.push('\n');
    }
    out.trim_end().to_string()
}

#[derive(Debug, Parser)]
#[command(
    name = "dpaa-vnic",
    version,
    about = "vhost-user virtio-net backend modelled on NXP DPAA (FMan)",
    long_about = "Serves a virtio-net NIC to QEMU guests over vhost-user: one guest port per --socket, \
in either attachment (net: QEMU keeps the control queue; device: dpaa-vnic is the whole \
device), joined by an in-process learning switch, and to the host through --tap. Each guest \
port filters what it receives as an NXP DPAA FMan MAC does (exact entries and CRC or XOR hash \
buckets), synced incrementally from the guest's address lists, its IGMP/MLD reports \
(--snoop) or QEMU's table (--qmp). dpaa-vnic ctl inspects a running daemon."
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
    /// Print the QEMU arguments (or libvirt's XML) that attach a guest to one of the
    /// daemon's sockets.
    QemuArgs(QemuArgsArgs),
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

/// How QEMU attaches a guest to a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Attach {
    /// -netdev vhost-user with virtio-net-pci: QEMU keeps config space and the control queue.
    Net,
    /// vhost-user-test-device-pci (QEMU 10.2 and later): dpaa-vnic is the whole device.
    Device,
}

#[derive(Debug, Args)]
pub struct QemuArgsArgs {
    /// The attachment.
    #[arg(long, value_enum, default_value = "net")]
    pub attach: Attach,
    /// The daemon's socket for this guest (its --socket), absolute.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Queue pairs: the daemon's --queues.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub queues: u16,
    /// The guest's MAC, in the net attachment (in the device attachment the daemon's --mac
    /// serves it).
    #[arg(long, default_value = "52:54:00:d0:aa:00", value_name = "MAC")]
    pub mac: MacAddr,
    /// Guest memory, shared with the daemon, in QEMU's size syntax.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub memory: String,
    /// The daemon connects (its --client): QEMU listens on the socket.
    #[arg(long)]
    pub client: bool,
    /// Print libvirt domain XML instead of QEMU arguments: all of it (memoryBacking, and
    /// the interface or qemu:commandline), or one piece: memory (the memoryBacking a
    /// domain needs) or interface (the element alone, as virsh attach-device takes it).
    #[arg(
        long,
        value_enum,
        value_name = "PART",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "all"
    )]
    pub libvirt: Option<LibvirtPart>,
}

/// Which of libvirt's pieces `qemu-args --libvirt` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LibvirtPart {
    /// The memoryBacking, then the interface (or the qemu:commandline).
    All,
    /// The memoryBacking alone.
    Memory,
    /// The interface element alone (net attachment).
    Interface,
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
    /// Tells a guest to announce itself again: Linux then sends its gratuitous ARP and
    /// reports every multicast group again. The port tells it in the device attachment,
    /// QEMU over --qmp in the net attachment. Without a port, every port that can.
    Announce { port: Option<usize> },
    /// Takes a guest port's link down or brings it up (device attachment: the port itself;
    /// net attachment: QEMU over --qmp): the guest's carrier follows, and nothing is
    /// delivered to it while it is down.
    Link { port: usize, state: LinkState },
    /// Says which guest CPUs send on each queue of a guest port (the guest's XPS map,
    /// /sys/class/net/IF/queues/tx-N/xps_cpus), e.g. 0=0 1=1 2=2-3: ctl stats and ctl
    /// watch show it beside each queue. No queue carries a CPU number; none forgets.
    QueueCpus { port: usize, map: Vec<String> },
    /// Records a port's frames as pcapng, for tcpdump -r or Wireshark: what the port sent
    /// (tx) and what the switch offered it (rx), taken or not. A frame the port's receive
    /// filter or a checksum action dropped carries a comment saying why. Runs until the
    /// count, the seconds, or an interrupt; prints what it saw on standard error.
    Capture {
        /// The port, by number (as ctl stats shows it).
        port: usize,
        /// The file to write, or - for standard output.
        file: PathBuf,
        /// rx: frames offered to the port (to the guest, or to the tap); tx: frames it
        /// sent (from the guest, or read from the tap).
        #[arg(long, value_enum, default_value_t = CaptureDirection::Both)]
        direction: CaptureDirection,
        /// Stop after this many frames.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        seconds: Option<f64>,
        /// Bytes kept of each frame.
        #[arg(long, value_name = "BYTES", default_value_t = 65535)]
        snaplen: u32,
    },
}

/// Which frames of a port `ctl capture` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CaptureDirection {
    Rx,
    Tx,
    Both,
}

/// `ctl link`'s state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LinkState {
    Up,
    Down,
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
    /// vhost-user socket to serve (--socket-path in QEMU's backend conventions); repeat
    /// for more guest ports (ports 0, 1, ... in order).
    #[arg(
        help_heading = "Ports",
        long = "socket",
        visible_alias = "socket-path",
        value_name = "PATH"
    )]
    pub sockets: Vec<PathBuf>,
    /// A listening vhost-user socket the daemon inherits as descriptor N (systemd socket
    /// activation, libvirt, a jailer), instead of --socket; repeat for more guest ports. The
    /// daemon never removes its file.
    #[arg(
        help_heading = "Ports",
        long = "fd",
        value_name = "N",
        conflicts_with = "sockets"
    )]
    pub fds: Vec<RawFd>,
    /// Connect to each --socket, where the frontend listens (QEMU: -chardev
    /// socket,path=PATH,server=on), instead of listening there; connect again whenever the
    /// frontend goes away.
    #[arg(help_heading = "Ports", long, conflicts_with = "fds")]
    pub client: bool,
    /// Print the backend's capabilities as QEMU's vhost-user.json schema describes them, and
    /// exit; other arguments are ignored.
    #[arg(long)]
    pub print_capabilities: bool,
    /// Host tap device to join to the switch (created if missing); it is the last port.
    #[arg(help_heading = "Ports", long, value_name = "IFNAME")]
    pub tap: Option<String>,
    /// Bring the tap up once it is open (as ip link set IFNAME up).
    #[arg(help_heading = "Ports", long, requires = "tap")]
    pub tap_up: bool,
    /// Add the tap to bridge BR, which must exist, and bring it up (as ip link set IFNAME
    /// master BR up).
    #[arg(help_heading = "Ports", long, value_name = "BR", requires = "tap")]
    pub tap_bridge: Option<String>,
    /// Queue pairs per port (one worker thread each).
    #[arg(help_heading = "Ports", long, default_value_t = 1, value_name = "N")]
    pub queues: u16,
    /// MAC address served in config space, one per --socket in order (default 52:54:00:d0:aa:NN).
    #[arg(help_heading = "Ports", long = "mac", value_name = "MAC")]
    pub macs: Vec<MacAddr>,
    /// MTU served in config space.
    #[arg(help_heading = "Ports", long, default_value_t = 1500)]
    pub mtu: u16,
    /// Unix socket for dpaa-vnic ctl. Bare, the path ctl looks at by default:
    /// $DPAA_VNIC_CONTROL, else $XDG_RUNTIME_DIR/dpaa-vnic/ctl, else /run/dpaa-vnic/ctl
    /// (its directory is made if missing).
    #[arg(help_heading = "Control and metrics", long, value_name = "PATH", num_args = 0..=1)]
    pub control: Option<Option<PathBuf>>,
    /// Receive filter of every guest port: memac (64 hash buckets), dtsec (256 unicast +
    /// 256 multicast buckets), dtsec-ext (512 multicast buckets), tgec (512 multicast
    /// buckets, no unicast registers) or exact.
    #[arg(help_heading = "Receive filter", long, default_value = "memac", value_name = "LAYOUT",
        value_parser = PossibleValuesParser::new(["memac", "dtsec", "dtsec-ext", "tgec", "exact"]).try_map(|s| s.parse::<Layout>()))]
    pub filter: Layout,
    /// Multicast entries the exact filter keeps before it falls back to allmulti.
    #[arg(help_heading = "Receive filter", long, default_value_t = DEFAULT_EXACT_LIMIT, value_name = "N")]
    pub exact_limit: usize,
    /// Microseconds the control queue keeps polling for the next command after serving one
    /// (0: sleep until kicked). Spends CPU only while a guest is sending commands; the
    /// default covers the gaps between a Linux guest's commands (docs/performance.md).
    #[arg(
        help_heading = "Control and metrics",
        long,
        default_value_t = 1000,
        value_name = "US"
    )]
    pub ctrl_poll_us: u64,
    /// Microseconds a TX worker keeps polling its ring after a round that served a burst
    /// (32 chains, or half a smaller ring), and after each further round the watch finds,
    /// that long in all per 32 chains served, before it asks the driver for kicks and
    /// sleeps (as QEMU's poll-us for vhost-net): a driver that sends again within it costs
    /// no kick and no wake-up. A poll thread likewise stays with the ring before it visits
    /// its other queues, 4 windows at most per visit. A driver that sends a frame at a time is never watched for; 0:
    /// never. At most 100 000
    #[arg(help_heading = "Data path", long, default_value_t = 50, value_name = "US")]
    pub tx_poll_us: u64,
    /// Seconds a frontend has, once connected, to claim its port (VHOST_USER_SET_OWNER,
    /// QEMU's and DPDK's first request or close to it) before it is disconnected: a client
    /// that connects and says nothing holds the port from everyone else (0: no limit).
    #[arg(
        help_heading = "Limits and access",
        long,
        default_value_t = 5,
        value_name = "SECONDS"
    )]
    pub handshake_timeout: u64,
    /// Opt-in poll mode: N threads busy-poll the guests' TX queues (queues spread over them
    /// in turn) and carry each frame to its destination, with no kick or wake-up, as DPDK's
    /// PMD threads do. Each thread keeps a whole CPU busy even when no frame passes; where
    /// they run is left to taskset, systemd or libvirt. Default: event-driven
    #[arg(
        help_heading = "Data path",
        long,
        value_name = "N",
        conflicts_with = "poll_cpus"
    )]
    pub poll: Option<usize>,
    /// Opt-in poll mode with one thread per listed CPU, each pinned to its CPU (e.g. 2,3
    /// or 2-5); otherwise as --poll
    #[arg(help_heading = "Data path", long, value_name = "LIST")]
    pub poll_cpus: Option<String>,
    /// Net attachment: follow QEMU's rx filter of guest port N (default 0) over its QMP
    /// socket, as libvirt does (NIC_RX_FILTER_CHANGED, query-rx-filter); nic=ID picks the
    /// NIC when QEMU has several. With --snoop, only its VLAN table. Also the way for
    /// ctl announce and ctl link to reach the guest. Repeat for more ports.
    #[arg(
        help_heading = "Receive filter",
        long = "qmp",
        value_name = "PATH[,port=N][,nic=ID]"
    )]
    pub qmp: Vec<QmpSpec>,
    /// Net attachment: learn each guest's multicast groups from its own IGMP v1/v2/v3 and
    /// MLD v1/v2 reports and filter to exactly those (QEMU's own table stops at 64).
    #[arg(help_heading = "Receive filter", long)]
    pub snoop: bool,
    /// With --snoop: forget a group no report refreshed for this many seconds (0: keep it
    /// until the guest leaves it). dpaa-vnic then queries the guests every third of it.
    #[arg(
        help_heading = "Receive filter",
        long,
        default_value_t = 0,
        value_name = "SECS"
    )]
    pub snoop_timeout: u64,
    /// With --snoop: groups one guest may hold; joins beyond are ignored and counted
    /// (snoop_groups_refused).
    #[arg(help_heading = "Receive filter", long, default_value_t = DEFAULT_MAX_GROUPS, value_name = "N")]
    pub snoop_max_groups: usize,
    /// Checksum offload on the tap: on passes partial checksums both ways (fast); off
    /// completes them, so the host and captures on the tap see only final checksums.
    #[arg(help_heading = "Data path", long, default_value = "on", value_name = "on|off", value_parser = ["on", "off"])]
    pub tap_csum: String,
    /// Checksum action (tc act_csum semantics):
    /// port=N,dir=ingress|egress,update=iph+icmp+igmp+tcp+udp+udplite+sctp[,proto=P][,dst=PREFIX][,verdict=pass|drop].
    /// Ports are numbered in --socket order, the tap last. Repeat for several.
    #[arg(help_heading = "Data path", long = "csum-action", value_name = "SPEC")]
    pub csum_actions: Vec<CsumAction>,
    /// Serve counters in Prometheus text format at http://ADDR:PORT/metrics. A bare PORT
    /// listens on 127.0.0.1; ADDR may be a host name (localhost). A wildcard address
    /// (0.0.0.0, [::]) needs --metrics-wildcard. unix:PATH serves the same page on a Unix
    /// socket with the mode and group of --socket-mode/--socket-group, for hosts where any
    /// local user may reach loopback TCP.
    #[arg(
        help_heading = "Control and metrics",
        long,
        value_name = "[ADDR:]PORT|unix:PATH"
    )]
    pub metrics: Option<String>,
    /// Let --metrics listen on a wildcard address, reachable from every interface.
    #[arg(help_heading = "Control and metrics", long)]
    pub metrics_wildcard: bool,
    /// Permission bits of the sockets the daemon creates (--socket, --control), octal; the
    /// owner must keep read and write. With a group (--socket-group), 0660 lets a qemu or
    /// libvirt-qemu user in.
    #[arg(
        help_heading = "Limits and access",
        long,
        default_value = "0600",
        value_name = "MODE"
    )]
    pub socket_mode: String,
    /// Group (name or gid) given to the sockets the daemon creates.
    #[arg(help_heading = "Limits and access", long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// The router's address and connected prefix on a port, e.g. 0=10.1.0.1/24 or
    /// 1=fd00:2::1/64: it answers ARP / neighbour solicitations for it there and routes
    /// between such prefixes (MAC 02:76:6e:69:63:01). Repeat.
    #[arg(
        help_heading = "Data path",
        long = "router-ip",
        value_name = "PORT=ADDR/PREFIX"
    )]
    pub router_ips: Vec<RouterIf>,
    /// A static route: PREFIX,via=ADDR (gateway on a connected prefix) or PREFIX,port=N
    /// (on-link out of port N). Needs --router-ip. Repeat.
    #[arg(
        help_heading = "Data path",
        long = "route",
        value_name = "PREFIX,via=ADDR|port=N"
    )]
    pub routes: Vec<Route>,
    /// Where routed frames find their next hop: per-queue, each queue's worker in a cache
    /// of its own; shared, one locked cache for all (the before of Linux's per-CPU route
    /// cache, only to measure against).
    #[arg(help_heading = "Data path", long, default_value = "per-queue", value_name = "per-queue|shared",
        value_parser = ["per-queue", "shared"])]
    pub route_cache: String,
    /// How workers run checksum actions: lockless, from a published snapshot with counters
    /// per worker; locked, each port's actions under one lock with shared counters (the
    /// before of lockless act_csum, only to measure against).
    #[arg(help_heading = "Data path", long, default_value = "lockless", value_name = "lockless|locked",
        value_parser = ["lockless", "locked"])]
    pub csum_rules: String,
    /// Which source MACs a guest may send from (as spoofchk on an SR-IOV NIC): auto
    /// locks a guest to the MAC served in config space (device attachment) and leaves the
    /// net attachment open, where QEMU owns the MAC; sticky also locks a net-attachment
    /// guest to the first unicast source it sends from; off never locks. Refused frames
    /// count in tx_spoofed.
    #[arg(help_heading = "Limits and access", long, default_value = "auto", value_name = "auto|sticky|off",
        value_parser = PossibleValuesParser::new(["auto", "sticky", "off"]).try_map(|s| s.parse::<MacLock>()))]
    pub port_mac_lock: MacLock,
    /// Addresses the switch learns per port at most; beyond it a port's new source
    /// addresses are not learned (fdb_refused), so a guest flooding random sources cannot
    /// evict the others' stations.
    #[arg(help_heading = "Limits and access", long, default_value_t = DEFAULT_PORT_LIMIT, value_name = "N")]
    pub fdb_limit: usize,
    /// Router neighbours (ARP / NDP) kept per port at most; beyond it new ones are refused
    /// (neigh_refused) until entries age out (5 minutes without a message from them).
    #[arg(help_heading = "Limits and access", long, default_value_t = DEFAULT_NEIGH_LIMIT, value_name = "N")]
    pub neigh_limit: usize,
}

/// `--print-capabilities`: what QEMU's vhost-user.json schema (`VHostUserBackendCapabilities`,
/// QEMU 4.0 and later) lets a net backend report, its type; the schema defines no features
/// for `net`.
pub fn capabilities() -> serde_json::Value {
    serde_json::json!({ "type": "net" })
}
