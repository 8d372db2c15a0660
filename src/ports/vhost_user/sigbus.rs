//! Surviving guest memory that shrinks under the daemon.
//!
//! A frontend's memory files are checked when they arrive (memcheck.rs), but a frontend can
//! still truncate an unsealed file afterwards. The next access past the new end raises
//! SIGBUS (BUS_ADRERR), which by default kills every port. [`install`] replaces that:
//!
//! - The handler looks the faulting address up in `/proc/self/maps` (open beforehand, read
//!   with `pread`: both async-signal-safe). Guest memory is the only *shared* mapping in
//!   this process (vm-memory maps regions `MAP_SHARED`); a fault anywhere else is not
//!   ours, and the handler puts the previous action back so the access faults again and
//!   ends the process as before.
//! - In guest memory, it maps an anonymous private page (or huge page, if the mapping's
//!   pages are huge) over the faulting one, so that the interrupted access completes: a
//!   read sees zeros, a write lands in a page no one else sees. It records the address
//!   and wakes [`monitor`].
//! - The monitor thread finds the connection whose memory holds the address, counts it
//!   (`memory_faults`), logs it and ends that connection. Other ports never notice.
//!
//! The anonymous page stays until the connection's regions are unmapped whole.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::thread;

use log::{error, warn};

/// A connection's guest memory, as the monitor asks about it.
pub trait MemOwner: Send + Sync {
    /// Whether `addr` (a host address) lies in this connection's guest memory.
    fn owns(&self, addr: usize) -> bool;
    /// A fault at `addr` in this connection's memory was survived: end the connection.
    fn fault(&self, addr: usize);
}

/// Faults recorded by the handler and not yet taken by the monitor (a ring; if more than
/// this many arrive between two wake-ups, the oldest addresses are lost, the count is not).
const RING: usize = 256;
static FAULTS: [AtomicUsize; RING] = [const { AtomicUsize::new(0) }; RING];
static HEAD: AtomicUsize = AtomicUsize::new(0);
/// The eventfd the handler writes to wake the monitor; -1 until installed.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// `/proc/self/maps`, opened once so the handler needs no new descriptor.
static MAPS: AtomicI32 = AtomicI32::new(-1);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static OWNERS: Mutex<Vec<Weak<dyn MemOwner>>> = Mutex::new(Vec::new());
/// The SIGBUS action before ours, put back for a fault that is not in guest memory. Written
/// once, before the handler is installed; only read after.
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// Huge page sizes tried when a normal page cannot be mapped over the fault (hugetlbfs
/// mappings can only be replaced whole pages at a time).
const HUGE: [usize; 2] = [2 << 20, 1 << 30];

/// Registers a connection's memory for the monitor to find; dropped owners are forgotten.
pub fn watch(owner: Weak<dyn MemOwner>) {
    let mut all = crate::sync::lock(&OWNERS);
    all.retain(|w| w.strong_count() > 0);
    all.push(owner);
}

/// Installs the handler and starts the monitor. Once per process (the daemon's `run`).
pub fn install() -> io::Result<()> {
    if WAKE.load(Ordering::Acquire) >= 0 {
        return Ok(());
    }
    // SAFETY: plain syscalls with no pointers but the path, a NUL-terminated literal.
    let (wake, maps, page) = unsafe {
        (
            libc::eventfd(0, libc::EFD_CLOEXEC),
            libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if wake < 0 || maps < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened by this function and are owned by nobody
    // else; they stay open for the life of the process (the statics keep their numbers).
    let (wake, maps) = unsafe { (OwnedFd::from_raw_fd(wake), OwnedFd::from_raw_fd(maps)) };
    if page > 0 {
        PAGE.store(page as usize, Ordering::Relaxed);
    }
    MAPS.store(maps.as_raw_fd(), Ordering::Release);
    WAKE.store(wake.as_raw_fd(), Ordering::Release);
    std::mem::forget(maps);
    thread::Builder::new()
        .name("vnic-sigbus".into())
        .spawn(move || monitor(wake))?;
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler has
    // the three-argument signature SA_SIGINFO asks for. The previous action is stored
    // before the handler can run, and never written again.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        std::ptr::addr_of_mut!(PREVIOUS).write(std::mem::MaybeUninit::new(old));
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Faults survived so far in this process.
pub fn faults() -> usize {
    HEAD.load(Ordering::Acquire)
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; it is saved and put back so the interrupted code sees
    // its own value. `info` is the kernel's siginfo for this SIGBUS.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let code = (*info).si_code;
        let addr = (*info).si_addr() as usize;
        let survived = code == libc::BUS_ADRERR && shared_mapping(addr).is_some_and(|m| patch(addr, m));
        if survived {
            let i = HEAD.fetch_add(1, Ordering::AcqRel);
            FAULTS[i % RING].store(addr, Ordering::Release);
            let one = 1u64;
            libc::write(WAKE.load(Ordering::Acquire), std::ptr::addr_of!(one).cast(), 8);
        } else {
            // Not guest memory: the action from before; the access faults again and that
            // action (in the end, the default: the process dies with a core) takes it.
            let prev = std::ptr::addr_of!(PREVIOUS).read();
            libc::sigaction(libc::SIGBUS, prev.as_ptr(), std::ptr::null_mut());
        }
        *errno = saved;
    }
}

/// Maps anonymous memory over the page at `addr`, trying larger pages only where they lie
/// whole inside the shared mapping `(start, end)`.
///
/// SAFETY (for callers): replaces guest memory the daemon maps; called only for a page the
/// kernel just refused to back, inside a mapping of a connection that is about to end.
unsafe fn patch(addr: usize, (start, end): (usize, usize)) -> bool {
    let sizes = std::iter::once(PAGE.load(Ordering::Relaxed)).chain(HUGE);
    for size in sizes {
        let base = addr & !(size - 1);
        if base < start || base + size > end {
            break;
        }
        // SAFETY: MAP_FIXED over [base, base + size), which lies inside a shared mapping
        // of guest memory (checked above); nothing in Rust holds a reference into it
        // (vm-memory reads and writes it through raw volatile accesses).
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p as usize == base {
            return true;
        }
    }
    false
}

/// The shared mapping holding `addr`, from `/proc/self/maps`: no allocation, no lock.
fn shared_mapping(addr: usize) -> Option<(usize, usize)> {
    let fd = MAPS.load(Ordering::Acquire);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8192];
    let mut have = 0usize;
    let mut off: libc::off_t = 0;
    loop {
        // SAFETY: reads into the unused tail of `buf`, which is that long.
        let n = unsafe { libc::pread(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have, off) };
        if n <= 0 {
            // The last line needs no newline.
            return scan_line(&buf[..have], addr).flatten();
        }
        off += n as libc::off_t;
        have += n as usize;
        let mut from = 0;
        while let Some(nl) = buf[from..have].iter().position(|&b| b == b'\n') {
            if let Some(found) = scan_line(&buf[from..from + nl], addr) {
                return found;
            }
            from += nl + 1;
        }
        if from == 0 && have == buf.len() {
            // A line longer than the buffer (a very long path): not ours to judge; skip it.
            have = 0;
            continue;
        }
        buf.copy_within(from..have, 0);
        have -= from;
    }
}

/// One `/proc/self/maps` line ("start-end perms offset dev inode path"): `None` if it does
/// not hold `addr`, `Some(Some(range))` if it does and is shared, `Some(None)` if private.
fn scan_line(line: &[u8], addr: usize) -> Option<Option<(usize, usize)>> {
    let mut fields = line.split(|&b| b == b' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    if addr < start || addr >= end {
        return None;
    }
    Some((perms.get(3) == Some(&b's')).then_some((start, end)))
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0usize, |v, &c| {
        let d = (c as char).to_digit(16)?;
        Some(v << 4 | d as usize)
    })
}

/// Takes the recorded faults and ends the connections they belong to.
fn monitor(wake: OwnedFd) {
    let mut tail = 0usize;
    loop {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into `n` from the eventfd this thread owns.
        let r = unsafe { libc::read(wake.as_raw_fd(), std::ptr::addr_of_mut!(n).cast(), 8) };
        if r != 8 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            error!("guest memory fault monitor stopped: {e}");
            return;
        }
        let head = HEAD.load(Ordering::Acquire);
        if head - tail > RING {
            warn!(
                "{} guest memory faults came too fast to tell where they were",
                head - tail - RING
            );
            tail = head - RING;
        }
        let owners: Vec<_> = crate::sync::lock(&OWNERS)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for i in tail..head {
            let addr = FAULTS[i % RING].load(Ordering::Acquire);
            match owners.iter().find(|o| o.owns(addr)) {
                Some(o) => o.fault(addr),
                None => warn!("guest memory fault at {addr:#x} in no live connection's memory"),
            }
        }
        tail = head;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_say_whether_an_address_is_in_a_shared_mapping() {
        let shared = b"7f0000000000-7f0000200000 rw-s 00000000 00:01 1234    /memfd:mem (deleted)";
        let private = b"55d000000000-55d000001000 r-xp 00000000 fd:00 42 /usr/bin/x";
        assert_eq!(
            scan_line(shared, 0x7f00_0000_1234),
            Some(Some((0x7f00_0000_0000, 0x7f00_0020_0000)))
        );
        assert_eq!(scan_line(shared, 0x7f00_0020_0000), None);
        assert_eq!(scan_line(private, 0x55d0_0000_0010), Some(None));
        assert_eq!(scan_line(b"garbage", 1), None);
        assert_eq!(hex(b"ffffffffffffffff"), Some(usize::MAX));
        assert_eq!(hex(b"1ffffffffffffffff"), None);
    }

    #[test]
    fn this_process_s_maps_are_read_whole() {
        // Opened as install() would, without installing the handler.
        let f = std::fs::File::open("/proc/self/maps").unwrap();
        MAPS.store(f.as_raw_fd(), Ordering::Release);
        let mem = Box::new([0u8; 64]);
        // The heap is private; an address nobody maps is in no line.
        assert_eq!(shared_mapping(mem.as_ptr() as usize), None);
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        // SAFETY: a fresh shared mapping of a file this test owns, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as usize;
        assert_eq!(shared_mapping(a + 100), Some((a, a + 8192)));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 8192) };
        MAPS.store(-1, Ordering::Release);
        drop(f);
    }
}
