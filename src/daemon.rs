//! The daemon's lifecycle: [`start`] builds the switch and every port from a [`Config`],
//! binds their sockets, opens the tap, and starts the control socket, the metrics endpoint,
//! the QMP followers and the snoop clock. Dropping the [`Running`] it returns (or a start
//! that fails halfway) stops every thread in order, joins them, removes the sockets it
//! bound and closes the taps.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use thiserror::Error;

use crate::config::{Config, Endpoint, GuestPortConfig};
use crate::control::metrics_server::{self, MetricsError};
use crate::control::qmp_link::QmpLink;
use crate::control::server::ControlError;
use crate::control::view::{self, PortRef};
use crate::control::{qmp, ControlServer, Daemon};
use crate::device::snoop;
use crate::device::NetConfig;
use crate::pipeline::router::RouteTable;
use crate::pipeline::rules::Rules;
use crate::pipeline::Switch;
use crate::ports::poll::{PollError, PollGroup};
use crate::ports::tap::{TapError, TapPort};
use crate::ports::vhost_user::{self, FilterConfig, GuestPort, Snooping};
use crate::stop::{self, Stop, Stoppable};
use crate::unix_socket;
use crate::unix_socket::{Claim, SocketError};

#[derive(Debug, Error)]
pub enum StartError {
    #[error("guest port {port}")]
    Port {
        port: usize,
        #[source]
        source: SocketError,
    },
    #[error("tap port")]
    Tap(#[source] TapError),
    #[error("control socket")]
    Control(#[source] ControlError),
    #[error("making {dir} for the control socket")]
    ControlDir {
        dir: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("metrics endpoint")]
    Metrics(#[source] MetricsError),
    #[error("poll mode")]
    Poll(#[source] PollError),
    #[error("the daemon may need {needed} descriptors at once and the process may open {limit} (raise the hard limit: `ulimit -Hn`, systemd's LimitNOFILE=)")]
    Descriptors { needed: u64, limit: u64 },
    #[error("raising the descriptor limit to {0}")]
    RaiseLimit(u64, #[source] nix::Error),
    #[error("starting the {what} thread")]
    Spawn {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// How long the threads are given to end once woken, all groups together: well within
/// what a service manager waits after SIGTERM (systemd: 90 s; the guest tests: 10 s).
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// What a start has set going so far. Dropping it stops everything in order: the servers
/// (control socket, metrics, QMP followers, snoop clock), then the guest ports (each ends
/// its frontend's connection and joins its vhost-user workers), then the tap readers; then
/// it removes the sockets this process bound (never another daemon's: binding refuses a
/// live socket). Taps close when the last thread holding them has ended.
#[derive(Default)]
struct Started {
    stop: Stop,
    /// The sockets this process bound; dropped after the threads that serve them.
    owned: Vec<Claim>,
    servers: Vec<Stoppable>,
    /// Poll mode's threads: stopped before the ports, whose connections they serve.
    poll: Vec<Stoppable>,
    ports: Vec<Stoppable>,
    taps: Vec<Stoppable>,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop.request();
        let deadline = Instant::now() + STOP_WITHIN;
        let mut late = 0;
        for group in [&mut self.servers, &mut self.poll, &mut self.ports, &mut self.taps] {
            late += stop::stop_all(std::mem::take(group), deadline);
        }
        if late > 0 {
            warn!("{late} thread(s) did not stop in time");
        }
        // Then `owned` goes, removing the sockets (never another process's: unix_socket.rs).
    }
}

/// A started daemon. Dropping it stops every thread it started, in order, and removes the
/// sockets it bound.
pub struct Running {
    daemon: Arc<Daemon>,
    started: Started,
}

impl Running {
    /// What the control socket and the metrics endpoint see: the ports and the switch.
    pub fn daemon(&self) -> &Arc<Daemon> {
        &self.daemon
    }

    /// Threads started and not yet stopped (each guest port, tap queue reader and server;
    /// not the per-connection threads these start).
    pub fn threads(&self) -> usize {
        let s = &self.started;
        s.servers.len() + s.poll.len() + s.ports.len() + s.taps.len()
    }
}

fn spawned(
    what: impl Into<String>,
    r: io::Result<Stoppable>,
    into: &mut Vec<Stoppable>,
) -> Result<(), StartError> {
    let t = r.map_err(|source| StartError::Spawn {
        what: what.into(),
        source,
    })?;
    into.push(t);
    Ok(())
}

/// Starts everything `cfg` asks for. On an error, what was started is stopped and what was
/// bound is removed.
pub fn start(cfg: &Config) -> Result<Running, StartError> {
    let limit = raise_fd_limit(fds_needed(cfg))?;
    debug!("descriptor limit {limit} for at most {} needed", fds_needed(cfg));
    let mut started = Started::default();
    let stop = started.stop.clone();
    let switch = Arc::new(switch(cfg));
    let poll = match &cfg.poll {
        Some(p) => Some(PollGroup::start(p, &stop, &mut started.poll).map_err(StartError::Poll)?),
        None => None,
    };
    let mut ports = Vec::new();
    let mut guests = Vec::new();
    let mut listeners = Vec::new();
    for (id, g) in cfg.guests.iter().enumerate() {
        let (port, listener) = open_guest(cfg, id, g, &switch, poll.as_ref(), &mut started)?;
        switch.attach(id, port.clone());
        ports.push(PortRef::Guest(port.clone()));
        guests.push(port.clone());
        listeners.push((port, listener));
    }
    if let Some(name) = &cfg.tap {
        ports.push(start_tap(cfg, name, &switch, &mut started)?);
    }
    let daemon = Arc::new(Daemon {
        ports,
        switch,
        refused: Default::default(),
        started: view::Started::now(std::env::args().collect()),
        poll: poll.clone(),
        qmp: cfg
            .qmp
            .iter()
            .map(|q| (q.port, Arc::new(QmpLink::default())))
            .collect(),
        queue_cpus: Default::default(),
    });
    if let Some(path) = &cfg.control {
        make_default_dir(path)?;
        let (t, claim) = ControlServer::new(daemon.clone())
            .start(path, cfg.socket_access, &stop)
            .map_err(StartError::Control)?;
        started.owned.push(claim);
        started.servers.push(t);
    }
    if let Some(at) = &cfg.metrics {
        let (_, t, claim) = metrics_server::serve(at, cfg.socket_access, daemon.clone(), &stop)
            .map_err(StartError::Metrics)?;
        started.servers.push(t);
        started.owned.extend(claim);
    }
    for (port, listener) in listeners {
        serve_port(port, listener, &stop, &mut started)?;
    }
    start_qmp(cfg, &guests, &daemon, &stop, &mut started)?;
    if let Snooping::On { expiry } = cfg.snoop {
        spawned(
            "snoop timer",
            spawn_snoop_clock(guests, expiry, &stop),
            &mut started.servers,
        )?;
    }
    info!(
        "dpaa-vnic serving {} guest port(s){} with {} queue pair(s)",
        cfg.guests.len(),
        cfg.tap
            .as_deref()
            .map(|t| format!(" and tap {t}"))
            .unwrap_or_default(),
        cfg.queue_pairs
    );
    Ok(Running { daemon, started })
}

/// One follower per `--qmp`, each with the connection `daemon` hands `ctl` commands to.
fn start_qmp(
    cfg: &Config,
    guests: &[Arc<GuestPort>],
    daemon: &Daemon,
    stop: &Stop,
    started: &mut Started,
) -> Result<(), StartError> {
    for spec in &cfg.qmp {
        if let (Some(port), Some(link)) = (
            guests.iter().find(|g| g.id == spec.port),
            daemon.qmp.get(&spec.port),
        ) {
            let f = qmp::Follower {
                spec: spec.clone(),
                port: port.clone(),
                link: link.clone(),
                snoop: matches!(cfg.snoop, Snooping::On { .. }),
            };
            spawned("QMP follower", qmp::spawn(f, stop), &mut started.servers)?;
        }
    }
    Ok(())
}

/// A bare `--control` listens in a directory of its own (`client::default_path`), made
/// here if missing: the user's alone under $XDG_RUNTIME_DIR, readable under /run. A path
/// given explicitly is taken as it is.
fn make_default_dir(path: &std::path::Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    if path != crate::control::client::default_path() {
        return Ok(());
    }
    let Some(dir) = path.parent().filter(|d| !d.exists()) else {
        return Ok(());
    };
    let mode = if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        0o700
    } else {
        0o755
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|source| StartError::ControlDir {
            dir: dir.to_path_buf(),
            source,
        })
}

/// Descriptors the whole daemon may hold at once: the ports, the tap's queues, the servers
/// and their clients at their caps, and a margin for the process itself (standard streams,
/// `/proc` reads, the log).
fn fds_needed(cfg: &Config) -> u64 {
    let pairs = u64::from(cfg.queue_pairs);
    let ports = cfg.guests.len() as u64 * (1 + vhost_user::policy::descriptors(pairs));
    let tap = if cfg.tap.is_some() { pairs + 2 } else { 0 };
    let control = cfg
        .control
        .as_ref()
        .map_or(0, |_| 1 + crate::control::server::MAX_CLIENTS as u64);
    let metrics = cfg
        .metrics
        .as_ref()
        .map_or(0, |_| 1 + metrics_server::MAX_CONNECTIONS as u64);
    64 + ports + tap + control + metrics + cfg.qmp.len() as u64
}

/// Raises the soft descriptor limit to the hard one (a process may; the soft default of
/// 1024 is for select(2), which the daemon never calls) and checks that `needed` fits.
/// Returns the limit.
fn raise_fd_limit(needed: u64) -> Result<u64, StartError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| StartError::RaiseLimit(0, e))?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| StartError::RaiseLimit(hard, e))?;
    }
    let limit = soft.max(hard);
    if limit < needed {
        return Err(StartError::Descriptors { needed, limit });
    }
    Ok(limit)
}

/// Starts the thread that serves guest port `port`'s frontends, on `listener` or, without
/// one (`--client`), by connecting to the frontend.
fn serve_port(
    port: Arc<GuestPort>,
    listener: Option<UnixListener>,
    stop: &Stop,
    started: &mut Started,
) -> Result<(), StartError> {
    let (id, stop) = (port.id, stop.clone());
    let waker = port.clone();
    // Woken by ending its connection; a listener's thread also by a knock on its socket,
    // so that a waiting accept returns (a client's thread sees the stop between tries).
    let knock = listener.as_ref().and_then(|l| l.local_addr().ok());
    let wake = move || {
        waker.hang_up();
        if let Some(addr) = &knock {
            let _ = UnixStream::connect_addr(addr);
        }
    };
    let r = thread::Builder::new()
        .name(format!("vnic-port{id}"))
        .spawn(move || match listener {
            Some(l) => vhost_user::serve(port, l, stop),
            None => vhost_user::serve_as_client(port, stop),
        })
        .map(|h| Stoppable::new(format!("port {id}"), h, wake));
    spawned(format!("port {id}"), r, &mut started.ports)
}

/// Makes guest port `id` and, unless it connects to its frontend (`--client`), the socket it
/// listens on: bound here (and removed when the daemon stops), or inherited (`--fd`, never
/// removed: whoever made it owns it).
fn open_guest(
    cfg: &Config,
    id: usize,
    g: &GuestPortConfig,
    switch: &Arc<Switch>,
    poll: Option<&Arc<PollGroup>>,
    started: &mut Started,
) -> Result<(Arc<GuestPort>, Option<UnixListener>), StartError> {
    let failed = |source| StartError::Port { port: id, source };
    let port = |name: PathBuf| {
        let p = guest_port(cfg, id, g.mac, name, switch.clone());
        Arc::new(match poll {
            Some(group) => p.with_poll(group.clone()),
            None => p,
        })
    };
    Ok(match &g.endpoint {
        Endpoint::Listen(path) => {
            let p = port(path.clone());
            let bound = p.bind(cfg.socket_access).map_err(failed)?;
            started.owned.push(bound.claim);
            (p, Some(bound.listener))
        }
        Endpoint::Inherited(fd) => {
            let (listener, path) = unix_socket::inherited(*fd).map_err(failed)?;
            let name = path.unwrap_or_else(|| PathBuf::from(format!("fd {fd}")));
            (port(name), Some(listener))
        }
        Endpoint::Connect(path) => (port(path.clone()), None),
    })
}

/// Opens the tap (the last port), attaches it and starts its readers.
fn start_tap(
    cfg: &Config,
    name: &str,
    switch: &Arc<Switch>,
    started: &mut Started,
) -> Result<PortRef, StartError> {
    let id = cfg.guests.len();
    let queues = usize::from(cfg.queue_pairs);
    let tap = TapPort::open(id, name, queues, cfg.tap_csum, switch.clone()).map_err(StartError::Tap)?;
    tap.set_link(cfg.tap_up, cfg.tap_bridge.as_deref())
        .map_err(StartError::Tap)?;
    let tap = Arc::new(tap);
    switch.attach(id, tap.clone());
    tap.start(&started.stop, &mut started.taps)
        .map_err(StartError::Tap)?;
    Ok(PortRef::Tap(tap))
}

/// The switch with the rules, queues and limits `cfg` sets.
fn switch(cfg: &Config) -> Switch {
    let nports = cfg.guests.len() + usize::from(cfg.tap.is_some());
    let table = RouteTable::new(cfg.router_ips.clone(), cfg.routes.clone());
    let mut rules = Rules::with_router(nports, cfg.csum_actions.clone(), table);
    if cfg.locked_csum_rules {
        warn!("--csum-rules locked: every frame an action list runs on takes that list's one lock (a baseline to measure against)");
        rules = rules.with_locked_actions();
    }
    let switch = Switch::with_queues(rules, usize::from(cfg.queue_pairs))
        .with_fdb_limit(cfg.fdb_limit)
        .with_neigh_limit(cfg.neigh_limit);
    if cfg.shared_route_cache {
        warn!("--route-cache shared: every worker routes through one locked cache (a baseline to measure against)");
        return switch.with_shared_route_cache();
    }
    switch
}

fn guest_port(
    cfg: &Config,
    id: usize,
    mac: crate::wire::MacAddr,
    socket: PathBuf,
    switch: Arc<Switch>,
) -> GuestPort {
    let net = NetConfig {
        mac,
        link_up: true,
        announce: false,
        max_queue_pairs: cfg.queue_pairs,
        mtu: cfg.mtu,
    };
    let filter = FilterConfig {
        layout: cfg.filter,
        exact_limit: cfg.exact_limit,
        snoop: cfg.snoop,
        snoop_max_groups: cfg.snoop_max_groups,
    };
    GuestPort::new(id, socket, cfg.queue_pairs, net, filter, switch)
        .with_mac_lock(cfg.mac_lock)
        .with_ctrl_poll(cfg.ctrl_poll)
        .with_tx_poll(cfg.tx_poll)
        .with_handshake(cfg.handshake)
}

/// The snooper's clock (`--snoop`): audits of each guest's state after its reports go
/// quiet (device/snoop.rs), and with `--snoop-timeout` the expiry of unrefreshed groups and
/// the periodic general queries that refresh them.
fn spawn_snoop_clock(
    guests: Vec<Arc<GuestPort>>,
    timeout: Option<Duration>,
    stop: &Stop,
) -> io::Result<Stoppable> {
    // Queries every third of the timeout make the guests report what they hold before it
    // runs out. Linux answers an MLD general query after a random delay up to the query's
    // Max Resp, and a new query draws that delay again (IGMP keeps the earlier one). With a
    // window as long as the interval, a late draw is pushed past the next query, and a few
    // in a row let every group expire at once: half the interval leaves room.
    let every = timeout.map(|t| (t / 3).max(Duration::from_secs(1)));
    let stop = stop.clone();
    thread::Builder::new()
        .name("vnic-snoop-timer".into())
        .spawn(move || {
            let mut next_query = Instant::now();
            // Sees a stop within one tick.
            while !stop.requested() {
                thread::sleep(snoop::TICK);
                let now = Instant::now();
                for g in &guests {
                    g.snoop_tick(now);
                }
                if let Some(every) = every.filter(|_| now >= next_query) {
                    for g in &guests {
                        g.refresh(every / 2, now);
                    }
                    next_query = now + every;
                }
            }
        })
        .map(|h| Stoppable::polling("snoop timer", h))
}
