//! The version of the interface scripts read.

/// The version of the interface docs/interface.md describes: the control socket's JSON keys
/// and the metric names of `--metrics`. A key or metric may be added within a version;
/// renaming or removing one, or changing its meaning, raises it.
pub const INTERFACE_VERSION: u32 = 3;
