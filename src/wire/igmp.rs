//! IGMP messages (RFC 2236, RFC 3376): a checked view of what a guest sends, and the
//! general query the snooper sends as querier.

use std::net::{IpAddr, Ipv4Addr};

use thiserror::Error;

use super::checksum::{fold, partial_sum, write_checksum};
use super::group_record::{self, GroupRecord, RecordKind};

pub const MEMBERSHIP_QUERY: u8 = 0x11;
pub const V1_REPORT: u8 = 0x12;
pub const V2_REPORT: u8 = 0x16;
pub const LEAVE: u8 = 0x17;
pub const V3_REPORT: u8 = 0x22;

/// The shortest IGMP message: type, max resp, checksum, group.
pub const MIN_LEN: usize = 8;
/// An IGMPv3 query without sources.
pub const QUERY_V3_LEN: usize = 12;

/// Where each IGMP field lies, named once.
pub mod field {
    use std::ops::Range;

    pub const TYPE: usize = 0;
    pub const MAX_RESP: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    /// v1/v2 messages and queries: the group.
    pub const GROUP: Range<usize> = 4..8;
    /// v3 reports: the number of group records, then the records.
    pub const RECORDS: Range<usize> = 6..8;
    pub const FIRST_RECORD: usize = 8;
    /// v3 queries: S flag and QRV, QQIC, number of sources.
    pub const S_QRV: usize = 8;
    pub const QQIC: usize = 9;
    pub const SOURCES: Range<usize> = 10..12;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IgmpError {
    #[error("IGMP message of {0} bytes is shorter than 8")]
    Truncated(usize),
    #[error("IGMP checksum does not verify")]
    Checksum,
}

/// Whether an IGMP type is a membership report or leave (any version).
pub fn is_report_type(t: u8) -> bool {
    matches!(t, V1_REPORT | V2_REPORT | LEAVE | V3_REPORT)
}

/// An IGMP message whose length and checksum were checked.
#[derive(Debug)]
pub struct IgmpMessage<'a> {
    b: &'a [u8],
}

impl<'a> IgmpMessage<'a> {
    /// `b` is the whole message (the IPv4 payload).
    pub fn new_checked(b: &'a [u8]) -> Result<Self, IgmpError> {
        if b.len() < MIN_LEN {
            return Err(IgmpError::Truncated(b.len()));
        }
        if fold(partial_sum(b, 0)) != 0xffff {
            return Err(IgmpError::Checksum);
        }
        Ok(IgmpMessage { b })
    }

    pub fn msg_type(&self) -> u8 {
        self.b[field::TYPE]
    }

    /// The group records a report carries (`None` for anything else, or a v3 report whose
    /// records run past the message).
    pub fn records(&self) -> Option<Vec<GroupRecord>> {
        let group = || ipv4(&self.b[field::GROUP]);
        match self.msg_type() {
            V1_REPORT | V2_REPORT => group_record::single(RecordKind::IsExclude, group()),
            LEAVE => group_record::single(RecordKind::ToInclude, group()),
            V3_REPORT => group_record::counted(self.b, field::RECORDS, field::FIRST_RECORD, 4, ipv4),
            _ => None,
        }
    }
}

fn ipv4(b: &[u8]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

/// Appends an IGMPv3 general query (group 0, no sources) asking for answers within
/// `max_resp_ds` tenths of a second (the linear range, 1..=127), robustness 2 and a query
/// interval of 125 s (RFC 3376 8.1, 8.2), checksum filled.
pub fn emit_general_query(out: &mut Vec<u8>, max_resp_ds: u8) {
    let at = out.len();
    out.resize(at + QUERY_V3_LEN, 0);
    let q = &mut out[at..];
    q[field::TYPE] = MEMBERSHIP_QUERY;
    q[field::MAX_RESP] = max_resp_ds.min(127);
    q[field::S_QRV] = 2;
    q[field::QQIC] = 125;
    write_checksum(q, field::CHECKSUM.start, QUERY_V3_LEN, 0, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_golden_bytes() {
        let mut q = Vec::new();
        emit_general_query(&mut q, 10);
        assert_eq!(q, [0x11, 10, 0xec, 0x78, 0, 0, 0, 0, 2, 125, 0, 0]);
        let m = IgmpMessage::new_checked(&q).unwrap();
        assert_eq!((m.msg_type(), m.records()), (MEMBERSHIP_QUERY, None));
        assert_eq!(
            IgmpMessage::new_checked(&q[..7]).unwrap_err(),
            IgmpError::Truncated(7)
        );
        q[9] ^= 1;
        assert_eq!(IgmpMessage::new_checked(&q).unwrap_err(), IgmpError::Checksum);
    }
}
