//! Which FMan MAC a port's filter behaves like (`--filter`).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Which FMan MAC the filter behaves like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Exact entries only, up to `--exact-limit`, then allmulti (no hash table).
    Exact,
    /// 10G mEMAC: 64 multicast buckets, parity hash; unicast only in exact registers.
    Memac,
    /// 1G dTSEC, normal mode: CRC hash, 256 unicast + 256 multicast buckets.
    Dtsec,
    /// 1G dTSEC, extended mode: 512 multicast buckets; unicast only in exact registers.
    DtsecExtended,
    /// 10G TGEC: 512 multicast buckets (the dTSEC's CRC, its top 9 bits); no exact
    /// registers besides the station address, so any other unicast address opens unicast.
    Tgec,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown filter layout {0:?}: expected exact, memac, dtsec, dtsec-ext or tgec")]
pub struct LayoutError(pub String);

impl FromStr for Layout {
    type Err = LayoutError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(Layout::Exact),
            "memac" => Ok(Layout::Memac),
            "dtsec" => Ok(Layout::Dtsec),
            "dtsec-ext" => Ok(Layout::DtsecExtended),
            "tgec" => Ok(Layout::Tgec),
            _ => Err(LayoutError(s.to_string())),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Exact => "exact",
            Layout::Memac => "memac",
            Layout::Dtsec => "dtsec",
            Layout::DtsecExtended => "dtsec-ext",
            Layout::Tgec => "tgec",
        })
    }
}

impl serde::Serialize for Layout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
