//! Checksum actions with the semantics of Linux's tc `act_csum`: recompute the chosen
//! checksums of the packets that match, drop the packets whose headers cannot be trusted.
//!
//! Differences from the kernel, both toward correct output: a UDP-Lite pseudo-header
//! carries the IP payload length (RFC 3828 3.2; the kernel puts the coverage there), and an
//! IPv4 header shorter than 5 words is a failure (the kernel would sum at a wrong offset).

mod list;
mod plain;
mod run;
mod spec;
#[cfg(test)]
mod test_frames;
mod update;

pub use self::list::{ActionList, Passes};
pub use self::run::{apply, run, ActionVerdict};
pub use self::spec::{ActionParseError, CsumAction, Dir, Targets, Verdict, NO_SLOT};
pub use self::update::{update, update_by, CsumFail, Done};
