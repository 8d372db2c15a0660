//! Unix sockets the daemon listens on (vhost-user ports, the control socket): created with
//! the access the user asked for and never wider, and never in place of a file that is not
//! a stale socket of the daemon's own user.
//!
//! A socket path is claimed before anything is bound there: an exclusive `flock` on
//! `PATH.lock`, held for as long as the socket is served. Two daemons started on one path
//! at once cannot both find it stale and each unlink what the other just bound; and when
//! the daemon stops it removes the socket only if it is still the one it bound.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{Gid, Uid};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use thiserror::Error;

/// The longest path a Unix socket can be bound or connected at: Linux's `sun_path` is 108
/// bytes with the terminating NUL (unix(7)).
pub const MAX_PATH: usize = 107;

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
    #[error("{path} is a socket of user {uid}, not of this daemon's user: refusing to replace it")]
    Foreign { path: PathBuf, uid: u32 },
    #[error("claiming {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} is not a regular file of this daemon's user: refusing to use it as the lock")]
    BadLock(PathBuf),
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

/// A socket the daemon bound and serves: the listener, and the claim on its path.
#[derive(Debug)]
pub struct Bound {
    pub listener: UnixListener,
    pub claim: Claim,
}

/// A claim on a socket path, held while the socket is served. Dropping it removes the
/// socket, if it is still the one bound here (not one another process put in its place
/// after it was removed by hand), then the lock file.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    /// Device and inode of the socket bound, once bound.
    bound: Option<(u64, u64)>,
    lock_path: PathBuf,
    _lock: Flock<File>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Gone already (removed by hand) is fine; nothing else is worth reporting on exit.
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| Some((m.dev(), m.ino())) == self.bound);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
        // While the lock is held: whoever opens the file next finds it gone (see `claim`).
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// `path` with `.lock` after its file name.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes the lock on `path`, or says who holds it. After the lock is taken, the file is
/// checked to still be the one at the lock's path: a holder removes it before it lets go,
/// and a lock on a removed file claims nothing.
fn claim(path: &Path) -> Result<Claim, SocketError> {
    let lock_path = lock_path(path);
    let lock_err = |source: io::Error| SocketError::Lock {
        path: lock_path.clone(),
        source,
    };
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            // Never a symlink to somewhere else, never a FIFO that blocks the open.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(lock_err)?;
        let meta = file.metadata().map_err(lock_err)?;
        if !meta.is_file() || meta.uid() != Uid::effective().as_raw() {
            return Err(SocketError::BadLock(lock_path));
        }
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Err(SocketError::InUse(path.to_path_buf())),
            Err((_, e)) => return Err(lock_err(e.into())),
        };
        let still = std::fs::symlink_metadata(&lock_path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()));
        if still {
            return Ok(Claim {
                path: path.to_path_buf(),
                bound: None,
                lock_path,
                _lock: lock,
            });
        }
    }
}

/// Binds a listening socket at `path`, claimed first (see the module text). A stale
/// socket there (nobody accepts on it) of the daemon's own user is replaced; a live one,
/// another user's, or anything that is not a socket, is an error. The file is created with
/// at most the owner's read and write bits (the socket's own mode before `bind`, as
/// Linux's `unix_bind` takes it), then given its group, then its mode: at no moment can
/// anyone connect whom `access` does not let in.
pub fn bind(path: &Path, access: SocketAccess) -> Result<Bound, SocketError> {
    let mut claim = claim(path)?;
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
    let meta = std::fs::symlink_metadata(path).map_err(bind_err)?;
    claim.bound = Some((meta.dev(), meta.ino()));
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
    Ok(Bound { listener, claim })
}

/// Removes a socket file nobody accepts on, if it is the daemon's user's. Anything else at
/// `path` is left alone.
fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_path_buf()));
    }
    if meta.uid() != Uid::effective().as_raw() {
        return Err(SocketError::Foreign {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    // Stale only if the kernel says nobody listens (ECONNREFUSED). A non-blocking probe:
    // a live socket with a full backlog answers EAGAIN instead of holding the start.
    let probe = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None).and_then(|s| {
        let addr = SockAddr::unix(path)?;
        s.connect(&addr)
    });
    match probe {
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        _ => return Err(SocketError::InUse(path.to_path_buf())),
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
    use std::os::unix::net::UnixStream;

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
    #[test]
    fn a_socket_is_created_with_the_mode_and_group_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let b = bind(&p, SocketAccess::default()).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, 0o600);
        // Released: the socket and its lock go.
        drop(b);
        assert!(!p.exists() && !lock_path(&p).exists());
        // A stale socket (its process died without removing it) is replaced, here with the
        // wider mode and our own group.
        drop(UnixListener::bind(&p).unwrap());
        let gid = nix::unistd::getegid();
        let access = SocketAccess {
            mode: 0o660,
            group: Some(gid),
        };
        let _b = bind(&p, access).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, gid.as_raw()));
    }

    #[test]
    fn a_live_socket_or_a_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let _live = bind(&p, SocketAccess::default()).unwrap();
        // Held by a daemon: the lock says so.
        assert!(matches!(
            bind(&p, SocketAccess::default()),
            Err(SocketError::InUse(_))
        ));
        // Served by a process that takes no lock (a QEMU server socket): the probe says so.
        let q = dir.path().join("q");
        let _qemu = UnixListener::bind(&q).unwrap();
        assert!(matches!(
            bind(&q, SocketAccess::default()),
            Err(SocketError::InUse(_))
        ));
        let f = dir.path().join("f");
        std::fs::write(&f, b"keep me").unwrap();
        assert!(matches!(
            bind(&f, SocketAccess::default()),
            Err(SocketError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        // A lock path that is a symlink is not followed.
        let l = dir.path().join("l");
        std::os::unix::fs::symlink(&f, lock_path(&l)).unwrap();
        assert!(matches!(
            bind(&l, SocketAccess::default()),
            Err(SocketError::Lock { .. })
        ));
    }

    #[test]
    fn a_socket_put_in_the_place_of_ours_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let b = bind(&p, SocketAccess::default()).unwrap();
        std::fs::remove_file(&p).unwrap();
        let other = UnixListener::bind(&p).unwrap();
        drop(b);
        assert!(p.exists(), "another process's socket was removed");
        drop(other);
    }

    #[test]
    fn another_users_stale_socket_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        drop(UnixListener::bind(&p).unwrap());
        let nobody = Uid::from_raw(65534);
        if Uid::effective().is_root() {
            nix::unistd::chown(&p, Some(nobody), None).unwrap();
            assert!(matches!(
                bind(&p, SocketAccess::default()),
                Err(SocketError::Foreign { uid: 65534, .. })
            ));
            assert!(p.exists());
        } else {
            // Only root can give a file away; as anyone else the check is the same
            // comparison with the file's owner, seen from the other side: ours passes.
            bind(&p, SocketAccess::default()).unwrap();
        }
    }
}
