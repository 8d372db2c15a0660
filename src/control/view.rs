//! JSON views of the daemon's ports for `ctl stats` and `ctl filter`. Key names are stable.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::qmp_link::QmpLink;
use super::queue_cpus::QueueCpus;
use crate::device::features::Attachment;
use crate::device::filter::model::FilterSnapshot;
use crate::device::filter::regs::FilterStats;
use crate::device::rx_state::MacList;
use crate::device::snoop::{AuditCounters, SnoopCounters, RECORD_KINDS};
use crate::device::RxMode;
use crate::histogram::{Buckets, Quantiles};
use crate::pipeline::Switch;
use crate::ports::poll::{PollGroup, PollThreadSnapshot};
use crate::ports::tap::TapPort;
use crate::ports::vhost_user::GuestPort;
use crate::stats::{ActionSnapshot, ConnSnapshot, CtrlSnapshot, QueueSnapshot};
use crate::wire::MacAddr;

/// A port as the control socket sees it.
#[derive(Clone)]
pub enum PortRef {
    Guest(Arc<GuestPort>),
    Tap(Arc<TapPort>),
}

impl PortRef {
    /// What the views call the port: a guest's socket path, the tap's name.
    pub fn name(&self) -> String {
        match self {
            PortRef::Guest(g) => g.socket.display().to_string(),
            PortRef::Tap(t) => t.name.clone(),
        }
    }
}

/// What the control socket can see and change.
pub struct Daemon {
    pub ports: Vec<PortRef>,
    pub switch: Arc<Switch>,
    /// Clients of the control socket and of `--metrics` that were refused (over the cap,
    /// oversized or slow requests).
    pub refused: ClientRefusals,
    /// When and how the daemon started, for `ctl info`.
    pub started: Started,
    /// The poll threads (`--poll`, `--poll-cpus`), if any.
    pub poll: Option<Arc<PollGroup>>,
    /// `--qmp`'s connections by guest port, for `ctl announce` and `ctl link`.
    pub qmp: BTreeMap<usize, Arc<QmpLink>>,
    /// The guest CPUs behind each queue, as `ctl queue-cpus` was told.
    pub queue_cpus: QueueCpus,
}

/// When the daemon started, and its command line.
#[derive(Debug, Clone)]
pub struct Started {
    pub at: Instant,
    pub unix_seconds: u64,
    pub command_line: Vec<String>,
}

impl Started {
    pub fn now(command_line: Vec<String>) -> Self {
        Started {
            at: Instant::now(),
            unix_seconds: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            command_line,
        }
    }
}

/// The build: the package version and the git revision it was built from (`build.rs`;
/// "unknown" outside a git checkout).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const REVISION: &str = env!("DPAA_VNIC_REVISION");

/// `ctl info`. (`"version"` in every answer is the interface's; the daemon's is
/// `daemon_version`.)
#[derive(Serialize)]
pub struct InfoView {
    pub daemon_version: &'static str,
    pub revision: &'static str,
    pub started_unix: u64,
    pub uptime_seconds: u64,
    pub command_line: Vec<String>,
    pub ports: Vec<PortInfo>,
}

#[derive(Serialize)]
pub struct PortInfo {
    pub id: usize,
    pub kind: &'static str,
    pub name: String,
    pub connected: bool,
    pub attachment: Option<Attachment>,
    /// `--qmp` on this port: whether it is connected to QEMU, and the NIC it follows
    /// (`ctl announce` and `ctl link` go there); null without `--qmp`.
    pub qmp: Option<QmpInfo>,
}

#[derive(Serialize)]
pub struct QmpInfo {
    pub connected: bool,
    pub nic: Option<String>,
    pub errors: u64,
    pub last_error: Option<String>,
}

pub fn info(d: &Daemon) -> InfoView {
    InfoView {
        daemon_version: VERSION,
        revision: REVISION,
        started_unix: d.started.unix_seconds,
        uptime_seconds: d.started.at.elapsed().as_secs(),
        command_line: d.started.command_line.clone(),
        ports: d
            .ports
            .iter()
            .map(|p| match p {
                PortRef::Guest(g) => PortInfo {
                    id: g.id,
                    kind: "vhost-user",
                    name: g.socket.display().to_string(),
                    connected: g.connected(),
                    attachment: g.attachment(),
                    qmp: d.qmp.get(&g.id).map(|l| {
                        let s = l.state();
                        QmpInfo {
                            connected: s.connected,
                            nic: s.nic,
                            errors: s.errors,
                            last_error: s.last_error,
                        }
                    }),
                },
                PortRef::Tap(t) => PortInfo {
                    id: t.id,
                    kind: "tap",
                    name: t.name.clone(),
                    connected: true,
                    attachment: None,
                    qmp: None,
                },
            })
            .collect(),
    }
}

/// Counts of refused clients, by server.
#[derive(Debug, Default)]
pub struct ClientRefusals {
    pub control: AtomicU64,
    pub metrics: AtomicU64,
}

#[derive(Serialize)]
pub struct QueueView {
    pub queue: usize,
    /// The guest CPUs that send on this queue, as `ctl queue-cpus` was told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    #[serde(flatten)]
    pub counters: QueueSnapshot,
}

/// Where /metrics cuts the control-queue answer times: 1 us to 1 s in steps of 1-2.5-5.
/// A command is answered in microseconds (docs/performance.md); a wait of milliseconds is
/// the control thread held up, and one of a second a guest's driver timing out.
pub const ANSWER_BUCKETS_NS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

#[derive(Serialize)]
pub struct PortStats {
    pub id: usize,
    pub kind: &'static str,
    pub name: String,
    pub connected: bool,
    pub attachment: Option<Attachment>,
    pub queues: Vec<QueueView>,
    pub totals: QueueSnapshot,
    #[serde(flatten)]
    pub ctrl: CtrlSnapshot,
    /// How long the daemon kept the guest waiting for each control command's answer.
    pub ctrl_answer: Quantiles,
    /// The same, at the bounds of [`ANSWER_BUCKETS_NS`], for /metrics only.
    #[serde(skip)]
    pub ctrl_answer_buckets: Buckets,
    #[serde(flatten)]
    pub conn: ConnSnapshot,
    #[serde(flatten)]
    pub filter: FilterStats,
    /// `--snoop`, net attachment ports: what the snooper saw and did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snoop: Option<SnoopView>,
}

/// Counts by protocol.
#[derive(Debug, Serialize)]
pub struct ByProtocol<T> {
    pub igmp: T,
    pub mld: T,
}

/// The snooper's counters (device/snoop.rs `SnoopCounters`).
#[derive(Debug, Serialize)]
pub struct SnoopView {
    /// Reports parsed.
    pub reports: ByProtocol<u64>,
    /// Records applied, by kind (`is_in` ... `block`; `join`/`leave`: IGMPv1/v2, MLDv1).
    pub records: ByProtocol<BTreeMap<&'static str, u64>>,
    /// Records for a group not held that do not join it.
    pub unknown_records: u64,
    #[serde(flatten)]
    pub audit: AuditCounters,
}

impl From<SnoopCounters> for SnoopView {
    fn from(c: SnoopCounters) -> Self {
        let kinds = |p: usize| RECORD_KINDS.iter().copied().zip(c.records[p]).collect();
        SnoopView {
            reports: ByProtocol {
                igmp: c.reports[0],
                mld: c.reports[1],
            },
            records: ByProtocol {
                igmp: kinds(0),
                mld: kinds(1),
            },
            unknown_records: c.unknown,
            audit: c.audit,
        }
    }
}

/// Clients of the control socket and of `--metrics` refused (over the cap, oversized,
/// slow or malformed requests).
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct RefusedView {
    pub control: u64,
    pub metrics: u64,
}

/// A poll thread's visits to its queues (poll mode only).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PollThreadView {
    pub thread: usize,
    pub cpu: Option<usize>,
    pub busy_visits: u64,
    pub idle_visits: u64,
    pub busy_ns: u64,
}

impl From<PollThreadSnapshot> for PollThreadView {
    fn from(s: PollThreadSnapshot) -> Self {
        PollThreadView {
            thread: s.thread,
            cpu: s.cpu,
            busy_visits: s.busy_visits,
            idle_visits: s.idle_visits,
            busy_ns: s.busy_ns,
        }
    }
}

#[derive(Serialize)]
pub struct StatsView {
    pub ports: Vec<PortStats>,
    pub totals: QueueSnapshot,
    pub ctrl_commands: u64,
    pub clients_refused: RefusedView,
    /// Empty unless the daemon runs in poll mode.
    pub poll_threads: Vec<PollThreadView>,
    /// The opt-in features in force, which decide the counters that can move.
    pub features: FeaturesView,
}

/// The opt-in parts of the pipeline in force.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct FeaturesView {
    /// Checksum actions configured (`--csum-action`, `ctl action add`).
    pub csum_actions: usize,
    /// Whether the router has interfaces (`--router-ip`).
    pub router: bool,
}

fn queues(stats: Vec<QueueSnapshot>) -> (Vec<QueueView>, QueueSnapshot) {
    let mut total = QueueSnapshot::default();
    let v = stats
        .into_iter()
        .enumerate()
        .map(|(queue, counters)| {
            total += counters;
            QueueView {
                queue,
                cpus: None,
                counters,
            }
        })
        .collect();
    (v, total)
}

pub fn stats(d: &Daemon) -> StatsView {
    let mut view = StatsView {
        ports: Vec::new(),
        totals: QueueSnapshot::default(),
        ctrl_commands: 0,
        clients_refused: RefusedView {
            control: d.refused.control.load(Ordering::Relaxed),
            metrics: d.refused.metrics.load(Ordering::Relaxed),
        },
        poll_threads: d.poll.as_ref().map_or_else(Vec::new, |g| {
            g.snapshot().into_iter().map(PollThreadView::from).collect()
        }),
        features: {
            let rules = d.switch.rules().load();
            FeaturesView {
                csum_actions: rules.actions().len(),
                router: !rules.router.ifaces.is_empty(),
            }
        },
    };
    for p in &d.ports {
        let ps = match p {
            PortRef::Guest(g) => {
                let (queues, totals) = queues(g.stats());
                let filter = g.filter_stats();
                PortStats {
                    id: g.id,
                    kind: "vhost-user",
                    name: g.socket.display().to_string(),
                    connected: g.connected(),
                    attachment: g.attachment(),
                    queues,
                    totals,
                    ctrl: g.ctrl_stats.snapshot(),
                    ctrl_answer: g.ctrl_stats.ctrl_answer.quantiles(),
                    ctrl_answer_buckets: g.ctrl_stats.ctrl_answer.buckets(ANSWER_BUCKETS_NS),
                    conn: g.health.stats.snapshot(),
                    filter,
                    snoop: g.snoop_counters().map(SnoopView::from),
                }
            }
            PortRef::Tap(t) => {
                let (queues, totals) = queues(t.stats());
                PortStats {
                    id: t.id,
                    kind: "tap",
                    name: t.name.clone(),
                    connected: true,
                    attachment: None,
                    queues,
                    totals,
                    ctrl: CtrlSnapshot::default(),
                    ctrl_answer: Quantiles::default(),
                    ctrl_answer_buckets: Buckets::default(),
                    conn: ConnSnapshot::default(),
                    filter: FilterStats::default(),
                    snoop: None,
                }
            }
        };
        view.totals += ps.totals;
        view.ctrl_commands += ps.ctrl.ctrl_commands;
        let mut ps = ps;
        if let Some(told) = d.queue_cpus.of(ps.id) {
            for (q, cpus) in ps.queues.iter_mut().zip(told) {
                q.cpus = cpus;
            }
        }
        view.ports.push(ps);
    }
    view
}

#[derive(Serialize)]
pub struct PortFilter {
    pub id: usize,
    pub name: String,
    pub attachment: Option<Attachment>,
    pub mac: MacAddr,
    pub rx_mode: RxMode,
    pub unicast: MacList,
    pub multicast: MacList,
    pub active_queue_pairs: u16,
    /// The DPAA filter's side: layout, buckets in use with reference counts, overflow.
    pub filter: Arc<FilterSnapshot>,
    /// With --snoop: groups learned from the guest's reports.
    pub snooped_groups: Option<usize>,
    /// RX steering: the driver's RSS / hash configuration, if it sent one.
    pub rss: Option<RssView>,
    /// The driver negotiated VIRTIO_NET_F_HASH_REPORT: each frame carries its hash.
    pub hash_report: bool,
    /// The VLAN IDs a driver that negotiated VIRTIO_NET_F_CTRL_VLAN added: a frame tagged
    /// with another is dropped (`rx_vlan_filtered`). `null`: every VLAN passes.
    pub vlans: Option<Vec<u16>>,
    /// The config space's status as the port serves it (device attachment; in the net
    /// attachment QEMU serves its own): `link_up` (`ctl link`), and `announcing` from `ctl
    /// announce` until the driver's ANNOUNCE_ACK.
    pub link_up: bool,
    pub announcing: bool,
}

#[derive(Serialize)]
pub struct RssView {
    pub hash_types: u32,
    pub indirection: Vec<u16>,
    pub unclassified_queue: u16,
    /// Hex, as `ethtool -x` prints it without colons.
    pub key: String,
}

#[derive(Serialize)]
pub struct FilterView {
    pub ports: Vec<PortFilter>,
}

/// Every guest port's control state as its last applied command left it. Nothing here takes
/// a port's control lock: a guest busy with commands does not hold up the answer.
pub fn filter(ports: &[PortRef]) -> FilterView {
    let ports = ports
        .iter()
        .filter_map(|p| match p {
            PortRef::Guest(g) => {
                let n = g.nic_view();
                let status = g.config_now();
                Some(PortFilter {
                    id: g.id,
                    name: g.socket.display().to_string(),
                    attachment: g.attachment(),
                    mac: n.mac,
                    rx_mode: n.mode,
                    unicast: n.unicast.clone(),
                    multicast: n.multicast.clone(),
                    active_queue_pairs: n.active_queue_pairs,
                    filter: n.filter.clone(),
                    snooped_groups: g.snooped_groups(),
                    rss: g.steering().load().config.as_ref().map(|c| RssView {
                        hash_types: c.hash_types,
                        indirection: c.indirection.clone(),
                        unclassified_queue: c.unclassified_queue,
                        key: c.key.iter().map(|b| format!("{b:02x}")).collect(),
                    }),
                    hash_report: g.negotiated().hash_report(),
                    vlans: g.vlans(),
                    link_up: status.link_up,
                    announcing: status.announce,
                })
            }
            PortRef::Tap(_) => None,
        })
        .collect();
    FilterView { ports }
}

#[derive(Serialize)]
pub struct ActionsView {
    /// The checksum actions in the order they run, each as `--csum-action` takes it.
    pub actions: Vec<String>,
    /// The same, each with what it counted since it was added, over every queue.
    pub counts: Vec<ActionCounts>,
}

#[derive(Serialize)]
pub struct ActionCounts {
    pub action: String,
    #[serde(flatten)]
    pub counts: ActionSnapshot,
}

pub fn actions(switch: &Switch) -> ActionsView {
    let rules = switch.rules().load();
    let tallies = switch.tallies();
    ActionsView {
        actions: rules.actions().iter().map(ToString::to_string).collect(),
        counts: rules
            .actions()
            .iter()
            .map(|a| ActionCounts {
                action: a.to_string(),
                counts: tallies.action(a.slot),
            })
            .collect(),
    }
}

#[derive(Serialize)]
pub struct Neighbour {
    pub ip: std::net::IpAddr,
    pub mac: MacAddr,
}

#[derive(Serialize)]
pub struct RoutesView {
    /// Bumped by every change; each queue's route cache follows it.
    pub generation: u64,
    pub router_mac: MacAddr,
    pub interfaces: Vec<String>,
    pub routes: Vec<String>,
    pub neighbours: Vec<Neighbour>,
}

pub fn routes(switch: &Switch) -> RoutesView {
    let rules = switch.rules().load();
    let t = &rules.router;
    let neighbours: Vec<Neighbour> = switch
        .neighbours()
        .list()
        .into_iter()
        .map(|(ip, mac)| Neighbour { ip, mac })
        .collect();
    RoutesView {
        generation: crate::pipeline::router::cache_generation(
            rules.generation(),
            switch.neighbours().generation(),
        ),
        router_mac: crate::pipeline::router::ROUTER_MAC,
        interfaces: t.ifaces.iter().map(ToString::to_string).collect(),
        routes: t.routes.iter().map(ToString::to_string).collect(),
        neighbours,
    }
}
