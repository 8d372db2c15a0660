//! A guest port's frontends, one after another: accepted on the port's socket (or, with
//! `--client`, connected to), each served by a fresh session, relayed to the request
//! handler, and torn down when it goes.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use super::guest_port::GuestPort;
use super::policy::{self, Offer};
use super::relay::{Limits, Relay, RelayError};
use super::session::VnicBackend;
use super::sigbus;
use crate::logging::error_chain;
use crate::stop::Stop;
use crate::unix_socket::MAX_PATH;

#[derive(Debug, Error)]
pub enum ConnectionError {
    // vhost_user_backend::Error implements Display but not std::error::Error, so it is
    // carried and printed rather than chained as a source.
    #[error("vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    /// The request handler refused a message, which ends the connection.
    #[error("the request handler refused a message (the frontend's last was {last}): {error}")]
    Refused {
        last: String,
        error: vhost_user_backend::Error,
    },
    #[error("private channel between the relay and the request handler")]
    Inner(#[source] io::Error),
    #[error("registering with the vring worker")]
    Register(#[source] io::Error),
    #[error("relay")]
    Relay(#[source] RelayError),
}

/// How often `--client` tries to connect while no frontend listens: short enough that a
/// QEMU started after the daemon is served at once, long enough to cost nothing.
pub const CLIENT_RETRY: Duration = Duration::from_millis(100);

/// Serves frontends one after another, as they connect to `listener`, until `stop`.
pub fn serve(port: Arc<GuestPort>, listener: UnixListener, stop: Stop) {
    for conn in listener.incoming() {
        if stop.requested() {
            break;
        }
        match conn {
            Ok(stream) => {
                if !serve_frontend(&port, stream, &stop) {
                    break;
                }
                info!(
                    "port {}: frontend disconnected; waiting for the next one",
                    port.id
                );
            }
            Err(e) => {
                if port.health.may_warn() {
                    warn!("port {}: accept failed: {e}", port.id);
                }
                // Out of descriptors, say: let the process breathe instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// `--client`: connects to the frontend listening at the port's socket, serves it, and
/// connects again once it goes, until `stop`. While nobody listens there it tries again
/// every [`CLIENT_RETRY`], and says so once per wait.
pub fn serve_as_client(port: Arc<GuestPort>, stop: Stop) {
    let mut told = false;
    while !stop.requested() {
        match UnixStream::connect(&port.socket) {
            Ok(stream) => {
                told = false;
                if !serve_frontend(&port, stream, &stop) {
                    break;
                }
                info!("port {}: frontend disconnected; connecting again", port.id);
            }
            Err(e) => {
                if !told {
                    info!(
                        "port {}: waiting for a frontend to listen at {}: {e}",
                        port.id,
                        port.socket.display()
                    );
                    told = true;
                }
                std::thread::sleep(CLIENT_RETRY);
            }
        }
    }
}

/// Serves one frontend until it goes; false if `stop` came first.
fn serve_frontend(port: &Arc<GuestPort>, stream: UnixStream, stop: &Stop) -> bool {
    if !port.attach_frontend(&stream, stop) {
        return false;
    }
    info!("port {} ({}): frontend connected", port.id, port.socket.display());
    if let Err(e) = serve_connection(port, stream) {
        warn!("port {}: connection ended: {}", port.id, error_chain(&e));
    }
    port.detach();
    true
}

/// One connection: a session, the request handler's threads and the relay, until the
/// frontend hangs up or a message is refused.
fn serve_connection(port: &Arc<GuestPort>, frontend: UnixStream) -> Result<(), ConnectionError> {
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let own_end = frontend.try_clone().map_err(ConnectionError::Inner)?;
    let backend = VnicBackend::new(port.clone(), mem.clone(), own_end).map_err(ConnectionError::Register)?;
    sigbus::watch(backend.mem_owner());
    let name = format!("vnic-port{}", port.id);
    let mut daemon = VhostUserDaemon::new(name.clone(), backend.clone(), mem).map_err(|e| {
        // The worker threads started before the failure hold the session until told.
        backend.stop_workers();
        ConnectionError::Daemon(e)
    })?;
    // Each worker thread gets one "attach" event so the backend learns its vrings before
    // any kick arrives (RX from other ports may come first), and an "again" event to come
    // back to rings it left at its budget.
    for (i, h) in daemon.get_epoll_handlers().iter().enumerate() {
        h.register_listener(backend.attach_event(i), EventSet::IN, backend.attach_event_id())
            .map_err(ConnectionError::Register)?;
        h.register_listener(backend.again_event(i), EventSet::IN, backend.again_event_id())
            .map_err(ConnectionError::Register)?;
        backend.trigger_attach(i).map_err(ConnectionError::Register)?;
    }
    // The handler reads from a channel only this process can reach; the relay feeds it
    // QEMU's messages.
    let (mut listener, handler_side, dir) = private_channel(&port.socket).map_err(ConnectionError::Inner)?;
    daemon.start(&mut listener).map_err(ConnectionError::Daemon)?;
    drop(listener);
    drop(dir);
    let limits = Limits {
        offer: Offer {
            features: backend.features(),
            protocol: backend.protocol_features().bits(),
            queues: u32::try_from(backend.num_queues()).unwrap_or(u32::MAX),
            max_ring: u32::try_from(backend.max_queue_size()).unwrap_or(u32::MAX),
        },
        handshake: port.handshake,
    };
    let relay = Relay::spawn(&name, frontend, handler_side, Arc::new(backend.clone()), limits)
        .map_err(ConnectionError::Relay)?;
    let result = daemon.wait();
    let last = relay.last_request();
    relay.stop();
    // Joins the workers; the session (exit events, counters, mappings) goes with the last
    // of them.
    drop(daemon);
    drop(backend);
    match result {
        // The frontend hanging up is how every connection ends.
        Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => Ok(()),
        Err(error @ vhost_user_backend::Error::HandleRequest(_)) => Err(ConnectionError::Refused {
            last: last.map_or_else(|| "none".into(), policy::request_name),
            error,
        }),
        r => r.map_err(ConnectionError::Daemon),
    }
}

/// A listener only this process can reach, and the end connected to it: a socket in a
/// fresh 0700 directory. No other user can look into the directory, let alone bind or
/// connect, and both vanish once the handler has accepted (the caller drops the `TempDir`).
/// vhost-user-backend 0.24 only starts from a listener; an abstract-namespace name would
/// carry no permissions at all.
///
/// The directory goes beside the port's socket (writable, since that was bound there), or
/// where that is not possible or the path would not fit a socket address (an inherited
/// socket in a directory the daemon may not write, a deep path), in the service's runtime
/// directory, the user's, or the temp dir.
fn private_channel(near: &Path) -> io::Result<(Listener, UnixStream, tempfile::TempDir)> {
    let beside = near.parent().filter(|p| !p.as_os_str().is_empty());
    let runtime = ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"]
        .into_iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from));
    let places = beside
        .map(Path::to_path_buf)
        .into_iter()
        .chain(runtime)
        .chain([std::env::temp_dir()]);
    let mut last = io::Error::other("no directory for the private channel");
    for place in places {
        let dir = match tempfile::Builder::new()
            .prefix(".dpaa-vnic-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&place)
        {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let path = dir.path().join("h");
        if path.as_os_str().len() > MAX_PATH {
            last = io::Error::other(format!("{} is too long for a socket address", path.display()));
            continue;
        }
        let listener = UnixListener::bind(&path)?;
        let ours = UnixStream::connect(&path)?;
        return Ok((Listener::from(listener), ours, dir));
    }
    Err(last)
}
