//! MLD messages (RFC 2710, RFC 3810), ICMPv6 messages of their own: a checked view of what
//! a guest sends, and the general query the snooper sends as querier.

use std::net::{IpAddr, Ipv6Addr};

use thiserror::Error;

use super::checksum::{fold, partial_sum, write_checksum};
use super::group_record::{self, GroupRecord, RecordKind};

pub const QUERY: u8 = 130;
pub const V1_REPORT: u8 = 131;
pub const V1_DONE: u8 = 132;
pub const V2_REPORT: u8 = 143;

/// The shortest MLD message read here: type, code, checksum, max resp, reserved.
pub const MIN_LEN: usize = 8;
/// An MLDv2 query without sources.
pub const QUERY_V2_LEN: usize = 28;

/// Where each MLD field lies, named once.
pub mod field {
    use std::ops::Range;

    pub const TYPE: usize = 0;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const MAX_RESP: Range<usize> = 4..6;
    /// v1 messages and queries: the multicast address.
    pub const ADDRESS: Range<usize> = 8..24;
    /// v2 reports: the number of records, then the records.
    pub const RECORDS: Range<usize> = 6..8;
    pub const FIRST_RECORD: usize = 8;
    /// v2 queries: S flag and QRV, QQIC, number of sources.
    pub const S_QRV: usize = 24;
    pub const QQIC: usize = 25;
    pub const SOURCES: Range<usize> = 26..28;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MldError {
    #[error("MLD message of {0} bytes is too short for its type")]
    Truncated(usize),
    #[error("MLD checksum does not verify")]
    Checksum,
}

/// Whether an ICMPv6 type is an MLD report or done (either version).
pub fn is_report_type(t: u8) -> bool {
    matches!(t, V1_REPORT | V1_DONE | V2_REPORT)
}

/// An MLD message whose length and checksum were checked.
#[derive(Debug)]
pub struct MldMessage<'a> {
    b: &'a [u8],
}

impl<'a> MldMessage<'a> {
    /// `b` is the whole ICMPv6 message, `pseudo` its IPv6 pseudo-header sum
    /// (`Ipv6Packet::pseudo_sum`), which the checksum covers.
    pub fn new_checked(b: &'a [u8], pseudo: u64) -> Result<Self, MldError> {
        let v1 = matches!(b.first(), Some(&V1_REPORT | &V1_DONE));
        let need = if v1 { field::ADDRESS.end } else { MIN_LEN };
        if b.len() < need {
            return Err(MldError::Truncated(b.len()));
        }
        if fold(partial_sum(b, 0) + pseudo) != 0xffff {
            return Err(MldError::Checksum);
        }
        Ok(MldMessage { b })
    }

    pub fn msg_type(&self) -> u8 {
        self.b[field::TYPE]
    }

    /// The group records a report carries (`None` for anything else, or a v2 report whose
    /// records run past the message).
    pub fn records(&self) -> Option<Vec<GroupRecord>> {
        let group = || ipv6(&self.b[field::ADDRESS]);
        match self.msg_type() {
            V1_REPORT => group_record::single(RecordKind::IsExclude, group()),
            V1_DONE => group_record::single(RecordKind::ToInclude, group()),
            V2_REPORT => group_record::counted(self.b, field::RECORDS, field::FIRST_RECORD, 16, ipv6),
            _ => None,
        }
    }
}

fn ipv6(b: &[u8]) -> IpAddr {
    let mut o = [0u8; 16];
    o.copy_from_slice(b);
    IpAddr::V6(Ipv6Addr::from(o))
}

/// Appends an MLDv2 general query (no address, no sources) asking for answers within
/// `max_resp_ms` milliseconds (the linear range, below 32768), robustness 2 and a query
/// interval of 125 s (RFC 3810 9.1, 9.2); `pseudo` is its IPv6 pseudo-header sum.
pub fn emit_general_query(out: &mut Vec<u8>, max_resp_ms: u16, pseudo: u64) {
    let at = out.len();
    out.resize(at + QUERY_V2_LEN, 0);
    let q = &mut out[at..];
    q[field::TYPE] = QUERY;
    q[field::MAX_RESP].copy_from_slice(&max_resp_ms.min(32767).to_be_bytes());
    q[field::S_QRV] = 2;
    q[field::QQIC] = 125;
    write_checksum(q, field::CHECKSUM.start, QUERY_V2_LEN, pseudo, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_message_needs_its_address() {
        let mut m = [0u8; 24];
        m[0] = V1_REPORT;
        m[8] = 0xff;
        let c = !fold(partial_sum(&m, 0));
        m[2..4].copy_from_slice(&c.to_be_bytes());
        let r = MldMessage::new_checked(&m, 0).unwrap().records().unwrap();
        assert_eq!(
            (r[0].kind, r[0].group.to_string()),
            (RecordKind::IsExclude, "ff00::".into())
        );
        assert_eq!(
            MldMessage::new_checked(&m[..23], 0).unwrap_err(),
            MldError::Truncated(23)
        );
        assert_eq!(MldMessage::new_checked(&m, 1).unwrap_err(), MldError::Checksum);
    }
}
