//! Unix sockets the daemon listens on (vhost-user ports, the control socket): created with
//! the access the user asked for and never wider, and never in place of a file that is not
//! a stale socket.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::unistd::Gid;
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use thiserror::Error;

/// Pending connections the kernel keeps per socket (one guest per port; a few `ctl` clients).
const BACKLOG: i32 = 16;

/// Who may connect: the socket file's mode and group. The owner is the daemon's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits (0o600 by default: the daemon's user only).
    pub mode: u32,
    /// The group the file is given, for a mode that lets a group in (`qemu`, `libvirt-qemu`).
    pub group: Option<Gid>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            mode: 0o600,
            group: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("{0} exists and is not a socket: refusing to replace it")]
    NotASocket(PathBuf),
    #[error("another process is serving {0}")]
    InUse(PathBuf),
    #[error("removing the stale socket {path}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("giving {path} group {gid}")]
    Chown {
        path: PathBuf,
        gid: u32,
        #[source]
        source: nix::Error,
    },
    #[error("setting mode {mode:o} on {path}")]
    Chmod {
        path: PathBuf,
        mode: u32,
        #[source]
        source: io::Error,
    },
    #[error("--fd {0}: descriptors 0, 1 and 2 are stdin, stdout and stderr, not a socket")]
    StdioFd(RawFd),
    #[error("--fd {fd} is not open in this process (was it passed to the daemon?)")]
    NotOpen {
        fd: RawFd,
        #[source]
        source: io::Error,
    },
    #[error("--fd {0} is not a listening Unix stream socket (the vhost-user socket, bound and listening)")]
    NotAListener(RawFd),
}

/// A listening socket the daemon was started with (QEMU's backend program conventions'
/// `--fd`; systemd socket activation, libvirt, a jailer): descriptor `fd` must be open, a
/// Unix stream socket, and listening. Returns it with the path it is bound to, if any. It
/// is never unlinked: whoever made it owns the file.
pub fn inherited(fd: RawFd) -> Result<(UnixListener, Option<PathBuf>), SocketError> {
    if (0..=2).contains(&fd) {
        return Err(SocketError::StdioFd(fd));
    }
    // SAFETY: F_GETFD reads a descriptor's flags and changes nothing; on a number that is
    // not an open descriptor it fails with EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(SocketError::NotOpen {
            fd,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is open (checked above) and only borrowed, for the checks below, while
    // nothing closes it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let sock = SockRef::from(&borrowed);
    match (sock.domain(), sock.r#type(), sock.is_listener()) {
        (Ok(Domain::UNIX), Ok(Type::STREAM), Ok(true)) => {}
        _ => return Err(SocketError::NotAListener(fd)),
    }
    // Not handed on to anything the daemon might execute.
    let _ = sock.set_cloexec(true);
    // SAFETY: the process was given `fd` for this use, it is an open listening socket, and
    // nothing else in the daemon owns it (config.rs refuses the same --fd twice).
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf));
    Ok((listener, path))
}

/// Binds a listening socket at `path`. A stale socket there (nobody accepts on it) is
/// replaced; a live one, or anything that is not a socket, is an error. The file is created
/// with at most the owner's read and write bits (the socket's own mode before `bind`, as
/// Linux's `unix_bind` takes it), then given its group, then its mode: at no moment can
/// anyone connect whom `access` does not let in.
pub fn bind(path: &Path, access: SocketAccess) -> Result<UnixListener, SocketError> {
    remove_stale(path)?;
    let bind_err = |source: io::Error| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(bind_err)?;
    // SAFETY: fchmod on a descriptor this function owns; no memory is passed.
    if unsafe { libc::fchmod(sock.as_raw_fd(), 0o600) } != 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    let addr = SockAddr::unix(path).map_err(bind_err)?;
    sock.bind(&addr).map_err(bind_err)?;
    sock.listen(BACKLOG).map_err(bind_err)?;
    let listener = UnixListener::from(std::os::fd::OwnedFd::from(sock));
    if let Some(gid) = access.group {
        nix::unistd::chown(path, None, Some(gid)).map_err(|source| SocketError::Chown {
            path: path.to_path_buf(),
            gid: gid.as_raw(),
            source,
        })?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode)).map_err(|source| {
        SocketError::Chmod {
            path: path.to_path_buf(),
            mode: access.mode,
            source,
        }
    })?;
    Ok(listener)
}

/// Removes a socket file nobody accepts on. Anything else at `path` is left alone.
fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_path_buf()));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(SocketError::InUse(path.to_path_buf()));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(SocketError::RemoveStale {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inherited_descriptor_must_be_an_open_listening_unix_stream_socket() {
        use std::os::fd::IntoRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inherited.sock");
        let fd = UnixListener::bind(&path).unwrap().into_raw_fd();
        let (listener, named) = inherited(fd).unwrap();
        assert_eq!(named.as_deref(), Some(path.as_path()));
        let _peer = UnixStream::connect(&path).unwrap();
        assert!(listener.accept().is_ok());

        let (a, _b) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        assert!(matches!(inherited(fd), Err(SocketError::NotAListener(f)) if f == fd));
        // SAFETY: `fd` came from into_raw_fd above and was refused, so it is still ours.
        drop(unsafe { UnixStream::from_raw_fd(fd) });

        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(
            inherited(file.as_raw_fd()),
            Err(SocketError::NotAListener(_))
        ));
        assert!(matches!(inherited(1), Err(SocketError::StdioFd(1))));
        // A number far above any descriptor this test process holds.
        assert!(matches!(inherited(1 << 20), Err(SocketError::NotOpen { .. })));
    }
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_socket_is_created_with_the_mode_and_group_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let _l = bind(&p, SocketAccess::default()).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, 0o600);
        drop(_l);
        // Stale now: replaced, with the wider mode and our own group.
        let gid = nix::unistd::getegid();
        let access = SocketAccess {
            mode: 0o660,
            group: Some(gid),
        };
        let _l = bind(&p, access).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, gid.as_raw()));
    }

    #[test]
    fn a_live_socket_or_a_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let _live = bind(&p, SocketAccess::default()).unwrap();
        assert!(matches!(
            bind(&p, SocketAccess::default()),
            Err(SocketError::InUse(_))
        ));
        let f = dir.path().join("f");
        std::fs::write(&f, b"keep me").unwrap();
        assert!(matches!(
            bind(&f, SocketAccess::default()),
            Err(SocketError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    }
}
