//! A host tap device as a switch port (IFF_VNET_HDR, one fd per queue with IFF_MULTI_QUEUE).

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Weak};
use std::thread;

use log::{debug, info, trace, warn};
use thiserror::Error;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::arena::Arena;
use crate::logging::WarnLimiter;
use crate::pipeline::fdb::FdbCache;
use crate::pipeline::gso;
use crate::pipeline::router::RouteCache;
use crate::pipeline::{Egress, Frame, Ingress, Outbox, OutboxBuffers, Packet, PortFrames, Switch};
use crate::stats::{QueueSnapshot, QueueStats, Tallies, Tally};
use crate::stop::{Stop, Stoppable};
use crate::wire::checksum::complete_partial;
use crate::wire::virtio_net_hdr::{VirtioNetHdr, F_NEEDS_CSUM, GSO_NONE, HDR_LEN};

// <linux/if_tun.h>'s flags are ints in libc (0.2.191); `struct ifreq` holds them in a
// short, and all of them fit.
const TAP_FLAGS: libc::c_short = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
const TAP_MULTI_QUEUE: libc::c_short = libc::IFF_MULTI_QUEUE as libc::c_short;

/// Room for the largest frame a tap hands over (a 64 KiB TSO frame behind its header).
const RX_BUF: usize = HDR_LEN + 65_550;
/// A reader's arena: frames are read into it back to back until less than one more
/// largest frame fits, then written out (pipeline/outbox.rs).
const ARENA: usize = 4 * RX_BUF;
/// Epoll tokens of a reader: its queue, and the stop wake-up.
const QUEUE: u64 = 0;
const WAKE: u64 = 1;

#[derive(Debug, Error)]
pub enum TapError {
    #[error("tap name {0:?} must be 1 to 15 bytes without NUL")]
    BadName(String),
    #[error("opening /dev/net/tun")]
    Open(#[source] io::Error),
    #[error(
        "opening /dev/net/tun: the daemon's user may not; the device is usually mode 0666 \
         (check `ls -l /dev/net/tun`, and the device cgroup of a container)"
    )]
    TunDenied(#[source] io::Error),
    #[error("ioctl {what} on tap {name}")]
    Ioctl {
        what: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
    /// TUNSETIFF's EPERM: creating a tap, or attaching to one owned by another user, needs
    /// CAP_NET_ADMIN (drivers/net/tun.c `tun_not_capable`).
    #[error(
        "not permitted to open tap {name}: run the daemon with CAP_NET_ADMIN, or create the tap \
         for its user first (`ip tuntap add dev {name} mode tap vnet_hdr{mq} user USER`)",
        mq = if *.multi_queue { " multi_queue" } else { "" }
    )]
    NotPermitted {
        name: String,
        multi_queue: bool,
        #[source]
        source: io::Error,
    },
    /// TUNSETIFF's EINVAL on an existing device: its flags differ from ours.
    #[error(
        "tap {name} exists with other flags than dpaa-vnic asks for (tap, vnet_hdr, no packet \
         info{mq}): delete it (`ip link del {name}`) or create it with them",
        mq = if *.multi_queue { ", multi_queue for --queues > 1" } else { ", single queue" }
    )]
    OtherFlags {
        name: String,
        multi_queue: bool,
        #[source]
        source: io::Error,
    },
    #[error("bringing tap {name} up (--tap-up)")]
    Up {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "adding tap {name} to bridge {bridge} (--tap-bridge): the bridge must exist \
         (`ip link add {bridge} type bridge`)"
    )]
    Bridge {
        name: String,
        bridge: String,
        #[source]
        source: io::Error,
    },
    #[error("spawning tap reader")]
    Spawn(#[source] io::Error),
    #[error("tap reader wake-up (eventfd, epoll)")]
    Wake(#[source] io::Error),
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `struct ifreq` with the interface index (SIOCBRADDIF).
#[repr(C)]
struct IfReqIndex {
    name: [u8; libc::IFNAMSIZ],
    index: libc::c_int,
    _pad: [u8; 20],
}

/// Adds the interface whose index the request carries to the bridge it names
/// (linux/sockios.h; the libc crate defines it for Android only).
const SIOCBRADDIF: libc::Ioctl = 0x89a2;

/// `name` as `ifr_name` wants it; `None` if it does not fit with its NUL.
fn if_name(name: &str) -> Option<[u8; libc::IFNAMSIZ]> {
    let mut n = [0u8; libc::IFNAMSIZ];
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.as_bytes().contains(&0) {
        return None;
    }
    n[..name.len()].copy_from_slice(name.as_bytes());
    Some(n)
}

/// A socket for the interface ioctls (any family serves; IPv4 is always there).
fn ifreq_socket() -> io::Result<File> {
    // SAFETY: socket(2) with constant arguments; the descriptor it returns is owned by the
    // File made from it here and by nothing else.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub struct TapPort {
    pub id: usize,
    pub name: String,
    queues: Vec<File>,
    /// The switch this port is attached to, which holds the port: a strong reference here
    /// would make a cycle that keeps the tap open after the daemon stops. Each reader holds
    /// it while it runs.
    switch: Weak<Switch>,
    tallies: Arc<Tallies>,
    warn: WarnLimiter,
    /// Partial checksums may be written as they are (`--tap-csum on`).
    csum: bool,
    /// Written once to stop: every reader waits on it beside its queue.
    wake: EventFd,
}

fn raw_ioctl(f: &File, req: libc::Ioctl, arg: *const libc::c_void) -> io::Result<()> {
    // SAFETY: `f` is an open tun fd or interface socket and `arg` is what `req` expects: a
    // pointer to a live IfReq, IfReqIndex or c_int that outlives the call (and, for the
    // requests that write into it, points at memory the caller may write), or
    // (TUNSETOFFLOAD) the flags passed by value.
    if unsafe { libc::ioctl(f.as_raw_fd(), req, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn ioctl(
    f: &File,
    name: &str,
    what: &'static str,
    req: libc::Ioctl,
    arg: *const libc::c_void,
) -> Result<(), TapError> {
    raw_ioctl(f, req, arg).map_err(|source| TapError::Ioctl {
        what,
        name: name.to_string(),
        source,
    })
}

/// TUNSETIFF's failure, with what the operator can do about the two common ones.
fn tunsetiff_error(name: &str, multi_queue: bool, source: io::Error) -> TapError {
    let name = name.to_string();
    match source.raw_os_error() {
        Some(libc::EPERM) => TapError::NotPermitted {
            name,
            multi_queue,
            source,
        },
        Some(libc::EINVAL) => TapError::OtherFlags {
            name,
            multi_queue,
            source,
        },
        _ => TapError::Ioctl {
            what: "TUNSETIFF",
            name,
            source,
        },
    }
}

impl TapPort {
    /// `--tap-bridge` and `--tap-up`: adds the tap to bridge `bridge`, then brings it up,
    /// as `ip link set NAME master BR up` would. Nothing when neither is asked for.
    pub fn set_link(&self, up: bool, bridge: Option<&str>) -> Result<(), TapError> {
        if !up && bridge.is_none() {
            return Ok(());
        }
        let name = self.name.clone();
        let up_err = |source| TapError::Up {
            name: name.clone(),
            source,
        };
        let sock = ifreq_socket().map_err(up_err)?;
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        let own = if_name(&name).ok_or_else(|| up_err(invalid("not an interface name")))?;
        if let Some(br) = bridge {
            let bridge_err = |source| TapError::Bridge {
                name: name.clone(),
                bridge: br.to_string(),
                source,
            };
            let br_name = if_name(br).ok_or_else(|| bridge_err(invalid("not an interface name")))?;
            // SAFETY: `own` holds the name and its NUL (`if_name`), and outlives the call.
            let index = unsafe { libc::if_nametoindex(own.as_ptr().cast()) };
            let index = libc::c_int::try_from(index)
                .ok()
                .filter(|i| *i > 0)
                .ok_or_else(|| bridge_err(io::Error::last_os_error()))?;
            let req = IfReqIndex {
                name: br_name,
                index,
                _pad: [0; 20],
            };
            raw_ioctl(&sock, SIOCBRADDIF, (&req as *const IfReqIndex).cast()).map_err(bridge_err)?;
        }
        let mut req = IfReq {
            name: own,
            flags: 0,
            _pad: [0; 22],
        };
        raw_ioctl(
            &sock,
            libc::SIOCGIFFLAGS,
            (&mut req as *mut IfReq).cast_const().cast(),
        )
        .map_err(up_err)?;
        req.flags |= libc::IFF_UP as libc::c_short;
        raw_ioctl(&sock, libc::SIOCSIFFLAGS, (&req as *const IfReq).cast()).map_err(up_err)?;
        info!(
            "tap {name}: up{}",
            bridge.map(|b| format!(", in bridge {b}")).unwrap_or_default()
        );
        Ok(())
    }

    /// Opens (creating if needed) tap `name` with `queues` queues in the current network
    /// namespace.
    /// With `csum` off the tap exchanges only complete checksums: the kernel finishes its
    /// own before handing frames over, and dpaa-vnic finishes partial ones before writing
    /// (what a capture on the tap then shows is what a wire would carry).
    pub fn open(
        id: usize,
        name: &str,
        queues: usize,
        csum: bool,
        switch: Arc<Switch>,
    ) -> Result<TapPort, TapError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.as_bytes().contains(&0) {
            return Err(TapError::BadName(name.to_string()));
        }
        let mut files = Vec::with_capacity(queues);
        for _ in 0..queues {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                // Non-blocking: a reader that finds its queue empty waits in epoll, where a
                // stop can wake it too. A tap write never waits anyway (the tun socket's
                // send buffer is unlimited unless TUNSETSNDBUF says otherwise).
                .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open("/dev/net/tun")
                .map_err(|e| match e.kind() {
                    io::ErrorKind::PermissionDenied => TapError::TunDenied(e),
                    _ => TapError::Open(e),
                })?;
            let mut req = IfReq {
                name: [0; libc::IFNAMSIZ],
                flags: TAP_FLAGS,
                _pad: [0; 22],
            };
            if queues > 1 {
                req.flags |= TAP_MULTI_QUEUE;
            }
            req.name[..name.len()].copy_from_slice(name.as_bytes());
            let multi_queue = queues > 1;
            raw_ioctl(&f, libc::TUNSETIFF, (&req as *const IfReq).cast())
                .map_err(|source| tunsetiff_error(name, multi_queue, source))?;
            let hdr_len: libc::c_int = HDR_LEN as libc::c_int;
            ioctl(
                &f,
                name,
                "TUNSETVNETHDRSZ",
                libc::TUNSETVNETHDRSZ,
                (&hdr_len as *const libc::c_int).cast(),
            )?;
            // Offloads towards us: the kernel may hand over partial checksums and TSO/USO
            // frames, which pass to guests that take them and are completed or segmented
            // for the others (GuestPort::send). USO needs Linux 6.2; older hosts refuse the
            // flag, and then get TSO only.
            let offload = if csum {
                libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN
            } else {
                0
            };
            let set = |flags: libc::c_uint| {
                ioctl(
                    &f,
                    name,
                    "TUNSETOFFLOAD",
                    libc::TUNSETOFFLOAD,
                    libc::c_ulong::from(flags) as *const libc::c_void,
                )
            };
            if offload == 0 || set(offload | libc::TUN_F_USO4 | libc::TUN_F_USO6).is_err() {
                set(offload)?;
            }
            let actual = CStr::from_bytes_until_nul(&req.name)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            debug!("tap {actual}: queue fd {} open", f.as_raw_fd());
            files.push(f);
        }
        info!("port {id}: tap {name} with {queues} queue(s)");
        Ok(TapPort {
            id,
            name: name.to_string(),
            queues: files,
            tallies: switch.tallies().clone(),
            switch: Arc::downgrade(&switch),
            warn: WarnLimiter::default(),
            csum,
            wake: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(TapError::Wake)?,
        })
    }

    /// Counters per queue, summed over every worker that counted for this port.
    pub fn stats(&self) -> Vec<QueueSnapshot> {
        self.tallies.port(self.id)
    }

    /// Starts one reader thread per queue: frames the host sends into the tap enter the
    /// switch. Each thread is added to `threads` as it starts; it returns once `stop` is
    /// requested and [`TapPort::wake`] has run.
    pub fn start(self: &Arc<Self>, stop: &Stop, threads: &mut Vec<Stoppable>) -> Result<(), TapError> {
        for q in 0..self.queues.len() {
            let epoll = Epoll::new().map_err(TapError::Wake)?;
            for (fd, token) in [(self.queues[q].as_raw_fd(), QUEUE), (self.wake.as_raw_fd(), WAKE)] {
                epoll
                    .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, token))
                    .map_err(TapError::Wake)?;
            }
            let (me, stop) = (self.clone(), stop.clone());
            let handle = thread::Builder::new()
                .name(format!("vnic-tap{}-q{q}", self.id))
                .spawn(move || me.read_loop(q, &epoll, &stop))
                .map_err(TapError::Spawn)?;
            let me = self.clone();
            threads.push(Stoppable::new(
                format!("tap {} queue {q}", self.name),
                handle,
                move || me.wake(),
            ));
        }
        Ok(())
    }

    /// Wakes every reader waiting for its queue (level-triggered: the event stays set).
    pub fn wake(&self) {
        let _ = self.wake.write(1);
    }

    /// Reads frames from queue `q` and forwards them until a stop: back to back into an
    /// arena, each lent to the outbox, which is written when the queue runs dry or the
    /// arena full.
    fn read_loop(&self, q: usize, epoll: &Epoll, stop: &Stop) {
        let Some(switch) = self.switch.upgrade() else {
            return; // The daemon is stopping.
        };
        let mut buf = vec![0u8; ARENA];
        let mut routes = RouteCache::default();
        let mut fdb = FdbCache::default();
        let mut originated = Vec::new();
        let mut outbox = OutboxBuffers::default();
        let tally = switch.tallies().register();
        let mut events = [EpollEvent::default(); 2];
        while !stop.requested() {
            let mut from = Ingress {
                port: self.id,
                queue: q,
                tally: &tally,
                routes: &mut routes,
                fdb: &mut fdb,
                originated: &mut originated,
            };
            let mut out = switch.outbox(&tally, &mut outbox);
            let read = self.read_burst(q, &switch, &mut from, &mut buf, &mut out, stop);
            // Written before the wait.
            drop(out);
            match read {
                ReadEnd::Full => {}
                ReadEnd::Dry => match epoll.wait(-1, &mut events) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        warn!(
                            "tap {}: waiting on queue {q} failed, reader stops: {e}",
                            self.name
                        );
                        return;
                    }
                },
                ReadEnd::Failed => return,
            }
        }
    }

    /// Reads frames from queue `q` into `buf` and forwards each into `out`, until the queue
    /// is empty, the arena full, or a stop.
    fn read_burst<'a>(
        &self,
        q: usize,
        switch: &Switch,
        from: &mut Ingress<'_>,
        buf: &'a mut [u8],
        out: &mut Outbox<'a>,
        stop: &Stop,
    ) -> ReadEnd {
        let stats = from.tally.at(self.id, q);
        let mut f = &self.queues[q];
        let mut arena = Arena::new(buf);
        let rules = switch.rules().load();
        while arena.len() >= RX_BUF && !stop.requested() {
            let n = match f.read(&mut arena.room()[..RX_BUF]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadEnd::Dry,
                Err(e) => {
                    warn!("tap {}: read on queue {q} failed, reader stops: {e}", self.name);
                    return ReadEnd::Failed;
                }
            };
            let Some(frame) = arena.take(n) else {
                return ReadEnd::Failed;
            };
            let hdr = match VirtioNetHdr::parse(frame, HDR_LEN) {
                Ok(h) => h,
                Err(e) => {
                    stats.rx_errors.inc();
                    debug!("tap {}: {e}", self.name);
                    continue;
                }
            };
            stats.rx_packets.inc();
            if hdr.gso_type != GSO_NONE {
                stats.rx_gso.inc();
            }
            stats.rx_bytes.add((n - HDR_LEN) as u64);
            trace!("tap {}: {} bytes from host on queue {q}", self.name, n - HDR_LEN);
            switch.forward(&rules, from, Packet::new(hdr, &mut frame[HDR_LEN..]), out);
        }
        ReadEnd::Full
    }
}

/// How a burst of tap reads ended.
enum ReadEnd {
    /// The arena filled (or a stop came): read again at once.
    Full,
    /// The queue is empty: wait for it.
    Dry,
    /// The queue failed: the reader stops.
    Failed,
}

impl Egress for TapPort {
    fn write(&self, tally: &Tally, frames: &mut PortFrames<'_, '_>, segment: &mut Vec<u8>) -> usize {
        let mut sent = 0;
        while let Some(Frame { flow, mut pkt, .. }) = frames.next() {
            let q = flow % self.queues.len();
            let stats = tally.at(self.id, q);
            if self.csum || pkt.hdr.gso_type == GSO_NONE {
                sent += usize::from(self.write_one(stats, q, &mut pkt));
                continue;
            }
            // No offloads on this tap: the host gets MSS-sized segments.
            let res = gso::segment(&pkt.hdr, pkt.frame, segment, |h, seg| {
                sent += usize::from(self.write_one(stats, q, &mut Packet::new(*h, seg)));
            });
            match res {
                Ok(_) => stats.tx_gso_segmented.inc(),
                Err(e) => {
                    stats.tx_errors.inc();
                    if self.warn.allow() {
                        warn!("tap {}: dropping GSO frame: {e}", self.name);
                    }
                }
            }
        }
        sent
    }
}

impl TapPort {
    /// One frame into tap queue `q`, completing a partial checksum with `--tap-csum off`;
    /// whether the tap took it.
    fn write_one(&self, stats: &QueueStats, q: usize, pkt: &mut Packet<'_>) -> bool {
        if !self.csum && pkt.hdr.needs_csum() {
            let (start, off) = (pkt.hdr.csum_start.into(), pkt.hdr.csum_offset.into());
            if let Err(e) = complete_partial(pkt.frame, start, off) {
                stats.tx_errors.inc();
                if self.warn.allow() {
                    warn!("tap {}: dropping frame with bad checksum offsets: {e}", self.name);
                }
                return false;
            }
            pkt.hdr.flags &= !F_NEEDS_CSUM;
            stats.tx_csum_completed.inc();
        }
        let mut h = pkt.hdr;
        h.num_buffers = 0;
        let hdr = h.to_bytes();
        let hdr = &hdr[..HDR_LEN];
        let mut f = &self.queues[q];
        // A tap takes one frame per write: it is accepted whole or refused.
        let want = hdr.len() + pkt.frame.len();
        match f.write_vectored(&[IoSlice::new(hdr), IoSlice::new(pkt.frame)]) {
            Ok(n) if n == want => {
                stats.tx_packets.inc();
                stats.tx_bytes.add(pkt.frame.len() as u64);
                true
            }
            Ok(n) => {
                stats.tx_dropped.inc();
                if self.warn.allow() {
                    warn!("tap {}: short write of {n} of {want} bytes", self.name);
                }
                false
            }
            Err(e) => {
                // EIO while the interface is down, EINVAL for a header the kernel rejects.
                stats.tx_dropped.inc();
                if self.warn.allow() {
                    warn!("tap {}: write failed: {e}", self.name);
                }
                false
            }
        }
    }
}
