use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use clap::Parser;
use log::{error, info};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use dpaa_vnic::config::{Cli, Command, Config, CtlCommand};
use dpaa_vnic::control::view::PortRef;
use dpaa_vnic::control::{client, metrics, qmp};
use dpaa_vnic::control::{ControlServer, Daemon};
use dpaa_vnic::device::NetConfig;
use dpaa_vnic::pipeline::router::RouteTable;
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::Switch;
use dpaa_vnic::ports::tap::TapPort;
use dpaa_vnic::ports::vhost_user::{error_chain, sigbus, FilterConfig, GuestPort};

fn main() -> ExitCode {
    dpaa_vnic::logging::init();
    // A panic is a bug; where guest input is handled it is contained (GuestPort::contain)
    // and the daemon goes on. Its message goes through the log, so a guest that found a
    // way to repeat one is held to the log's rate limit instead of flooding stderr.
    std::panic::set_hook(Box::new(|info| log::error!("bug: {info}")));
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Ctl(c)) => {
            let (cmd, arg) = match &c.what {
                CtlCommand::Stats => ("stats".to_string(), None),
                CtlCommand::Filter => ("filter".to_string(), None),
                CtlCommand::Action { op } => op.request("action"),
                CtlCommand::Route { op } => op.request("route"),
            };
            match client::request(&c.control, &cmd, arg) {
                Ok(out) => {
                    println!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("dpaa-vnic ctl: {}", error_chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
        None => match Config::try_from(cli.run) {
            Ok(cfg) => run(cfg),
            Err(e) => {
                eprintln!("dpaa-vnic: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn run(cfg: Config) -> ExitCode {
    log::debug!("configuration: {cfg:?}");
    // A frontend that truncates its memory file under a mapping must not kill every port.
    if let Err(e) = sigbus::install() {
        log::warn!("guest memory fault guard not installed (a shrunk memory file will kill the daemon): {e}");
    }
    // Only what this process bound is removed on exit, never another daemon's live socket.
    let mut owned: Vec<std::path::PathBuf> = Vec::new();
    let nports = cfg.guests.len() + usize::from(cfg.tap.is_some());
    let table = RouteTable::new(cfg.router_ips.clone(), cfg.routes.clone());
    let switch = Arc::new(
        Switch::with_queues(
            Rules::with_router(nports, cfg.csum_actions.clone(), table),
            usize::from(cfg.queue_pairs),
        )
        .with_fdb_limit(cfg.fdb_limit),
    );
    let mut ports = Vec::new();
    let mut listeners = Vec::new();
    for (id, g) in cfg.guests.iter().enumerate() {
        let net = NetConfig {
            mac: g.mac,
            link_up: true,
            max_queue_pairs: cfg.queue_pairs,
            mtu: cfg.mtu,
        };
        let filter = FilterConfig {
            layout: cfg.filter,
            exact_limit: cfg.exact_limit,
            snoop: cfg.snoop,
            snoop_max_groups: cfg.snoop_max_groups,
        };
        let port = Arc::new(
            GuestPort::new(
                id,
                g.socket.clone(),
                cfg.queue_pairs,
                net,
                filter,
                cfg.ctrl,
                switch.clone(),
            )
            .with_mac_lock(cfg.mac_lock),
        );
        match port.bind(cfg.socket_access) {
            Ok(l) => {
                owned.push(g.socket.clone());
                listeners.push(l);
            }
            Err(e) => {
                error!("{}", error_chain(&e));
                cleanup(&owned);
                return ExitCode::FAILURE;
            }
        }
        switch.attach(id, port.clone());
        ports.push(PortRef::Guest(port));
    }
    if let Some(name) = &cfg.tap {
        let id = cfg.guests.len();
        let tap = match TapPort::open(
            id,
            name,
            usize::from(cfg.queue_pairs),
            cfg.tap_csum,
            switch.clone(),
        ) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                error!("{}", error_chain(&e));
                cleanup(&owned);
                return ExitCode::FAILURE;
            }
        };
        switch.attach(id, tap.clone());
        if let Err(e) = tap.start() {
            error!("{}", error_chain(&e));
            cleanup(&owned);
            return ExitCode::FAILURE;
        }
        ports.push(PortRef::Tap(tap));
    }
    let daemon = Arc::new(Daemon {
        ports: ports.clone(),
        switch: switch.clone(),
        refused: Default::default(),
    });
    if let Some(path) = &cfg.control {
        if let Err(e) = ControlServer::new(daemon.clone()).start(path, cfg.socket_access) {
            error!("{}", error_chain(&e));
            cleanup(&owned);
            return ExitCode::FAILURE;
        }
        owned.push(path.clone());
    }
    if let Some(addr) = cfg.metrics {
        if let Err(e) = metrics::serve(addr, daemon.clone()) {
            error!("{}", error_chain(&e));
            cleanup(&owned);
            return ExitCode::FAILURE;
        }
    }
    for (p, l) in ports.iter().zip(listeners) {
        if let PortRef::Guest(g) = p {
            let g = g.clone();
            let spawned = thread::Builder::new()
                .name(format!("vnic-port{}", g.id))
                .spawn(move || g.serve(l));
            if let Err(e) = spawned {
                error!("spawning port thread: {e}");
                cleanup(&owned);
                return ExitCode::FAILURE;
            }
        }
    }
    for spec in &cfg.qmp {
        let port = ports.iter().find_map(|p| match p {
            PortRef::Guest(g) if g.id == spec.port => Some(g.clone()),
            _ => None,
        });
        if let Some(port) = port {
            if let Err(e) = qmp::spawn(spec.clone(), port) {
                error!("spawning QMP follower: {e}");
                cleanup(&owned);
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(timeout) = cfg.snoop {
        // The snooper's clock: audits of each guest's state after its reports go quiet
        // (device/snoop.rs), and with --snoop-timeout the expiry of unrefreshed groups and
        // the periodic general queries that refresh them.
        let guests: Vec<Arc<GuestPort>> = ports
            .iter()
            .filter_map(|p| match p {
                PortRef::Guest(g) => Some(g.clone()),
                PortRef::Tap(_) => None,
            })
            .collect();
        if let Err(e) = spawn_snoop_clock(guests, timeout) {
            error!("spawning snoop timer: {e}");
            cleanup(&owned);
            return ExitCode::FAILURE;
        }
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
    let mut signals = match Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            error!("installing signal handlers: {e}");
            cleanup(&owned);
            return ExitCode::FAILURE;
        }
    };
    if let Some(sig) = signals.forever().next() {
        info!("signal {sig}: shutting down");
    }
    cleanup(&owned);
    ExitCode::SUCCESS
}

/// The `--snoop` timer thread (see its caller).
fn spawn_snoop_clock(
    guests: Vec<Arc<GuestPort>>,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<()> {
    // Queries every third of the timeout make the guests report what they hold before it
    // runs out. Linux answers an MLD general query after a random delay up to the query's
    // Max Resp, and a new query draws that delay again (IGMP keeps the earlier one). With a
    // window as long as the interval, a late draw is pushed past the next query, and a few
    // in a row let every group expire at once: half the interval leaves room.
    let every = timeout.map(|t| (t / 3).max(std::time::Duration::from_secs(1)));
    thread::Builder::new()
        .name("vnic-snoop-timer".into())
        .spawn(move || {
            let mut next_query = std::time::Instant::now();
            loop {
                thread::sleep(std::time::Duration::from_millis(250));
                let now = std::time::Instant::now();
                for g in &guests {
                    g.snoop_tick(now);
                }
                if let Some(every) = every.filter(|_| now >= next_query) {
                    guests.iter().for_each(|g| {
                        g.send_queries(every / 2);
                    });
                    next_query = now + every;
                }
            }
        })
        .map(|_| ())
}

/// Removes the sockets this daemon created. Workers die with the process.
fn cleanup(owned: &[std::path::PathBuf]) {
    for p in owned {
        let _ = std::fs::remove_file(p);
    }
}
