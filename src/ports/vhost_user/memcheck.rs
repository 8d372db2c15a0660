//! Checks on the files a frontend hands over before anything maps or polls them.
//!
//! vm-memory 0.18 maps each SET_MEM_TABLE / ADD_MEM_REG region without looking at its file:
//! a region that runs past the end of its file maps fine, and the first access past the end
//! raises SIGBUS, which kills the whole daemon. So every region's file must be a regular
//! file (memfd, hugetlbfs, tmpfs, /dev/shm: what QEMU's and DPDK's memory backends use) at
//! least as long as the region's offset plus size. A file that shrinks *after* the check
//! (truncated by the frontend) is `sigbus.rs`'s business; a memfd sealed with
//! F_SEAL_SHRINK (QEMU's `memory-backend-memfd` default, `seal=on`) cannot.
//!
//! Kick, call and error descriptors must be eventfds, and are made non-blocking: a frontend
//! could otherwise hand over a pipe, or fill its eventfd's counter, and leave a worker (or,
//! through the RX ring's lock, another port's sender) blocked in a read or a write.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

use thiserror::Error;

/// Bytes of one region in SET_MEM_TABLE's and ADD_MEM_REG's bodies: guest address, size,
/// user address, mmap offset (vhost-user spec, "Memory region description").
const REGION_LEN: usize = 32;

#[derive(Debug, Error)]
pub enum FdError {
    #[error("memory region {index}: looking at its file")]
    Stat {
        index: usize,
        #[source]
        source: io::Error,
    },
    #[error("memory region {index} is backed by a {kind}, not a regular file")]
    NotAFile { index: usize, kind: &'static str },
    #[error("memory region {index} maps {end} bytes of a {len}-byte file")]
    PastEnd { index: usize, end: u128, len: u64 },
    #[error("memory message of {len} bytes does not hold {regions} region(s)")]
    Short { len: usize, regions: usize },
    #[error("{what} is not an eventfd ({found})")]
    NotEventFd { what: &'static str, found: String },
    /// Each read of a semaphore eventfd takes 1 from its count and leaves it readable: a
    /// kick with a count of 2^64-2 would wake its worker that many times.
    #[error("the kick eventfd is in semaphore mode (EFD_SEMAPHORE): each kick must be one read")]
    Semaphore,
    #[error("the backend channel is not a socket ({found})")]
    NotSocket { found: String },
    #[error("the backend channel came without a descriptor")]
    NoChannel,
    #[error("making the {what} eventfd non-blocking")]
    NonBlocking {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Checks the regions of a memory message whose region descriptions start at byte `first`
/// of `body`, each against its file (in order; a count mismatch is the vhost crate's to
/// refuse).
pub fn check_regions(body: &[u8], first: usize, fds: &[File]) -> Result<(), FdError> {
    for (index, file) in fds.iter().enumerate() {
        let at = first + index * REGION_LEN;
        let (Some(size), Some(offset)) = (le_u64(body, at + 8), le_u64(body, at + 24)) else {
            return Err(FdError::Short {
                len: body.len(),
                regions: fds.len(),
            });
        };
        check_region(index, file, offset, size)?;
    }
    Ok(())
}

fn check_region(index: usize, file: &File, offset: u64, size: u64) -> Result<(), FdError> {
    let meta = file
        .metadata()
        .map_err(|source| FdError::Stat { index, source })?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_char_device() {
            "character device"
        } else if ft.is_block_device() {
            "block device"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_fifo() {
            "pipe"
        } else if ft.is_dir() {
            "directory"
        } else {
            "special file"
        };
        return Err(FdError::NotAFile { index, kind });
    }
    let end = u128::from(offset) + u128::from(size);
    if end > u128::from(meta.len()) {
        return Err(FdError::PastEnd {
            index,
            end,
            len: meta.len(),
        });
    }
    Ok(())
}

/// Makes sure `file` is an eventfd and that nothing done with it can block.
/// SET_BACKEND_REQ_FD's descriptor: a socket the port writes its few messages on, with a
/// write timeout, so a frontend that stops reading holds nothing.
pub fn vet_socket(file: &File) -> Result<(), FdError> {
    let found = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    if !found.starts_with("socket:") {
        return Err(FdError::NotSocket { found });
    }
    Ok(())
}

pub fn vet_eventfd(file: &File, what: &'static str) -> Result<(), FdError> {
    let link = format!("/proc/self/fd/{}", file.as_raw_fd());
    let found = std::fs::read_link(&link)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    if found != "anon_inode:[eventfd]" {
        return Err(FdError::NotEventFd { what, found });
    }
    if what == "kick" && semaphore(file) {
        return Err(FdError::Semaphore);
    }
    // O_NONBLOCK belongs to the open file, which the frontend shares: QEMU's own eventfds
    // are non-blocking already (event_notifier_init), so this changes nothing for it.
    // SAFETY: F_GETFL/F_SETFL on a descriptor `file` owns; no memory is passed.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(FdError::NonBlocking {
            what,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Whether the kernel says the eventfd counts as a semaphore. Linux shows the flag in
/// fdinfo from 6.6 on; an older kernel shows nothing, and the eventfd passes.
fn semaphore(file: &File) -> bool {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd()))
        .map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("eventfd-semaphore:"))
                .any(|v| v.trim() == "1")
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EventFd;

    fn region(size: u64, offset: u64) -> Vec<u8> {
        [0u64, size, 0x7f00_0000_0000, offset]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    #[test]
    fn a_region_must_lie_within_its_file() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x20_0000).unwrap();
        let fds = [f];
        let body = [&[1u8, 0, 0, 0, 0, 0, 0, 0][..], &region(0x20_0000, 0)].concat();
        check_regions(&body, 8, &fds).unwrap();
        let body = [&[1u8, 0, 0, 0, 0, 0, 0, 0][..], &region(0x20_0000, 0x1000)].concat();
        assert!(matches!(
            check_regions(&body, 8, &fds),
            Err(FdError::PastEnd { index: 0, .. })
        ));
        // Offsets near u64::MAX do not wrap around into range.
        let body = [&[0u8; 8][..], &region(0x2000, u64::MAX - 0xfff)].concat();
        assert!(matches!(
            check_regions(&body, 8, &fds),
            Err(FdError::PastEnd { .. })
        ));
        assert!(matches!(
            check_regions(&[0u8; 20], 8, &fds),
            Err(FdError::Short { .. })
        ));
    }

    #[test]
    fn only_a_regular_file_backs_guest_memory() {
        let dev = File::open("/dev/zero").unwrap();
        let body = [&[0u8; 8][..], &region(0x1000, 0)].concat();
        assert!(matches!(
            check_regions(&body, 8, &[dev]),
            Err(FdError::NotAFile {
                kind: "character device",
                ..
            })
        ));
    }

    #[test]
    fn ring_descriptors_must_be_eventfds_and_never_block() {
        let e = EventFd::new(0).unwrap();
        // SAFETY: a duplicate of the eventfd's descriptor, owned by the File from here on.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(e.as_raw_fd())) };
        vet_eventfd(&f, "kick").unwrap();
        // The counter is empty: a read that would have blocked forever now says so.
        assert_eq!(e.read().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let not = tempfile::tempfile().unwrap();
        assert!(matches!(
            vet_eventfd(&not, "call"),
            Err(FdError::NotEventFd { what: "call", .. })
        ));
    }

    #[test]
    fn a_semaphore_kick_is_refused_where_the_kernel_tells() {
        let e = EventFd::new(libc::EFD_SEMAPHORE).unwrap();
        // SAFETY: a duplicate of the eventfd's descriptor, owned by the File from here on.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(e.as_raw_fd())) };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).unwrap();
        if !info.contains("eventfd-semaphore:") {
            // Linux before 6.6: the flag cannot be seen, and the kick passes.
            vet_eventfd(&f, "kick").unwrap();
            return;
        }
        assert!(matches!(vet_eventfd(&f, "kick"), Err(FdError::Semaphore)));
        // A call the daemon only writes to may count as it likes.
        vet_eventfd(&f, "call").unwrap();
    }
}
