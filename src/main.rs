use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use log::{error, info};
use sd_notify::NotifyState;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use dpaa_vnic::cli::{Cli, Command, Generated};
use dpaa_vnic::config::Config;
use dpaa_vnic::control::client;
use dpaa_vnic::daemon;
use dpaa_vnic::logging::error_chain;
use dpaa_vnic::ports::vhost_user::sigbus;

fn main() -> ExitCode {
    dpaa_vnic::logging::init();
    // A panic is a bug; where guest input is handled it is contained (GuestPort::contain)
    // and the daemon goes on. Its message goes through the log, so a guest that found a
    // way to repeat one is held to the log's rate limit instead of flooding stderr.
    std::panic::set_hook(Box::new(|info| log::error!("bug: {info}")));
    // QEMU's backend program conventions (docs/interop/vhost-user.rst): print and exit,
    // whatever else the command line holds.
    if std::env::args_os().skip(1).any(|a| a == "--print-capabilities") {
        println!("{}", dpaa_vnic::cli::capabilities());
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Ctl(c)) => match client::run(&c, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dpaa-vnic ctl: {}", error_chain(&e));
                ExitCode::FAILURE
            }
        },
        Some(Command::Generate { what }) => match generate(&what) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dpaa-vnic generate: {e}");
                ExitCode::FAILURE
            }
        },
        None => match Config::try_from(cli.run) {
            Ok(cfg) => run(&cfg),
            Err(e) => {
                eprintln!("dpaa-vnic: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// The man pages or a completion script, from the same definitions as `--help`.
fn generate(what: &Generated) -> std::io::Result<()> {
    match what {
        Generated::Man { dir } => {
            std::fs::create_dir_all(dir)?;
            clap_mangen::generate_to(Cli::command(), dir)
        }
        Generated::Completions { shell, dir } => {
            std::fs::create_dir_all(dir)?;
            clap_complete::generate_to(*shell, &mut Cli::command(), "dpaa-vnic", dir).map(drop)
        }
    }
}

/// Serves until SIGINT, SIGTERM or SIGHUP, then stops every thread in order (daemon.rs).
fn run(cfg: &Config) -> ExitCode {
    log::debug!("configuration: {cfg:?}");
    // A frontend that truncates its memory file under a mapping must not kill every port.
    if let Err(e) = sigbus::install() {
        log::warn!("guest memory fault guard not installed (a shrunk memory file will kill the daemon): {e}");
    }
    // Before anything starts: a daemon that cannot be stopped cleanly does not start.
    // SIGHUP too (the man page says so): there is nothing to reload, and its default action
    // would end the process without removing its sockets.
    let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            error!("installing signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let running = match daemon::start(cfg) {
        Ok(r) => r,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // systemd's Type=notify: serving from here on (a no-op without NOTIFY_SOCKET).
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        log::warn!("telling the service manager the daemon is ready: {e}");
    }
    if let Some(sig) = signals.forever().next() {
        info!("signal {sig}: shutting down");
        let _ = sd_notify::notify(&[NotifyState::Stopping]);
    }
    // Stops the threads in order and joins them, removes the sockets, closes the taps.
    drop(running);
    info!("stopped");
    ExitCode::SUCCESS
}
