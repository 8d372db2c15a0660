use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use log::{error, info};
use sd_notify::NotifyState;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use dpaa_vnic::cli::{Cli, Command, Generated, SECTIONS};
use dpaa_vnic::config::Config;
use dpaa_vnic::control::client;
use dpaa_vnic::daemon;
use dpaa_vnic::logging::error_chain;
use dpaa_vnic::ports::vhost_user::sigbus;

fn main() -> ExitCode {
    dpaa_vnic::logging::init();
    // A panic is a bug; where guest input is handled it is contained (Health::catch_bug)
    // and the daemon goes on. Its message goes through the log, so a guest that found a
    // way to repeat one is held to the log's rate limit instead of flooding stderr.
    std::panic::set_hook(Box::new(|info| log::error!("bug: {info}")));
    // QEMU's backend program conventions (docs/interop/vhost-user.rst): print and exit,
    // whatever else the command line holds.
    if std::env::args_os().skip(1).any(|a| a == "--print-capabilities") {
        println!("{}", dpaa_vnic::cli::capabilities());
        return ExitCode::SUCCESS;
    }
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cli.command {
        Some(Command::Ctl(c)) => match client::run(&c, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dpaa-vnic ctl: {}", error_chain(&e));
                ExitCode::FAILURE
            }
        },
        Some(Command::QemuArgs(a)) => match dpaa_vnic::control::qemu_args::render(&a) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dpaa-vnic qemu-args: {e}");
                ExitCode::from(2)
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

/// The command line as clap sees it, with the sections `--help` prints after the options.
fn command() -> clap::Command {
    Cli::command().after_long_help(dpaa_vnic::cli::after_help())
}

/// The man pages or a completion script, from the same definitions as `--help`.
fn generate(what: &Generated) -> std::io::Result<()> {
    match what {
        Generated::Man { dir } => {
            std::fs::create_dir_all(dir)?;
            // A page per subcommand as clap_mangen makes them; the main page is written
            // again below with the sections a man page has after its options.
            clap_mangen::generate_to(Cli::command(), dir)?;
            let mut page = Vec::new();
            main_man_page(&mut page)?;
            std::fs::write(dir.join("dpaa-vnic.1"), page)
        }
        Generated::Completions { shell, dir } => {
            std::fs::create_dir_all(dir)?;
            clap_complete::generate_to(*shell, &mut Cli::command(), "dpaa-vnic", dir).map(drop)
        }
    }
}

/// dpaa-vnic.1: clap_mangen's title, name, synopsis, description, options and
/// subcommands, then EXAMPLES, ENVIRONMENT, SIGNALS, EXIT STATUS and FILES (man-pages(7)'s
/// order) from [`SECTIONS`], and the version.
fn main_man_page(w: &mut dyn std::io::Write) -> std::io::Result<()> {
    use clap_mangen::roff::{bold, roman, Roff};
    let man = clap_mangen::Man::new(Cli::command());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    man.render_subcommands_section(w)?;
    let mut roff = Roff::default();
    for s in SECTIONS {
        roff.control("SH", [s.title]);
        for (term, what) in s.entries {
            roff.control("TP", []);
            roff.text([bold(*term)]);
            roff.text([roman(*what)]);
        }
    }
    roff.to_writer(w)?;
    man.render_version_section(w)
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
