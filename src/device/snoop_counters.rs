//! What the snooper counts (device/snoop.rs), and the atomics that mirror it for readers
//! that must not take the snooper's lock (`ctl stats`, `/metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::wire::mcast_report::RecordKind;

/// What the snooper refused, since it started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SnoopRefusals {
    /// Joins ignored because the guest held `max_groups` groups already.
    pub groups: u64,
    /// Groups whose source list outgrew [`MAX_SOURCES`](super::snoop::MAX_SOURCES) and are kept whatever the sources.
    pub sources: u64,
}

/// The kinds of record the counters tell apart, in [`SnoopCounters::records`] order: the
/// six of IGMPv3/MLDv2 (RFC 3376 4.2.12), then IGMPv1/v2 and MLDv1 reports and leaves.
pub const RECORD_KINDS: [&str; 8] = [
    "is_in", "is_ex", "to_in", "to_ex", "allow", "block", "join", "leave",
];

/// What the snooper saw and did, since it started: every change to its state has a number
/// here, so a missed leave or join shows up as one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SnoopCounters {
    /// Reports parsed: IGMP, MLD.
    pub reports: [u64; 2],
    /// Records applied, by protocol (IGMP, MLD) and kind ([`RECORD_KINDS`]).
    pub records: [[u64; 8]; 2],
    /// Records that name a group the snooper does not hold and do not join it (a leave, a
    /// BLOCK, an empty INCLUDE): nothing to do, and a sign of a change seen out of order.
    pub unknown: u64,
    /// What the audits found.
    pub audit: AuditCounters,
}

/// What the snooper's audits (general queries of its own) found, since it started. The
/// names are those `ctl stats` shows, where they sit beside the other snoop counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AuditCounters {
    /// Audit queries sent (rounds).
    pub audits: u64,
    /// Groups an answer to an audit confirmed as the snooper held them.
    pub audit_confirmed: u64,
    /// Groups an answer changed (mode or wanted-ness): a change report that was missed or
    /// merged away.
    pub audit_corrected: u64,
    /// Groups an answer brought that the snooper did not hold: a missed join.
    pub audit_added: u64,
    /// Groups dropped for going unanswered in an audit: a missed leave.
    pub audit_dropped: u64,
    /// Families that said nothing at all to an audit while the snooper held groups of
    /// theirs: judged by the audit asked again at once, not by this one.
    pub audit_silent: u64,
}

impl AuditCounters {
    const LEN: usize = 6;

    fn to_array(self) -> [u64; Self::LEN] {
        [
            self.audits,
            self.audit_confirmed,
            self.audit_corrected,
            self.audit_added,
            self.audit_dropped,
            self.audit_silent,
        ]
    }

    fn from_array(a: [u64; Self::LEN]) -> Self {
        let [audits, audit_confirmed, audit_corrected, audit_added, audit_dropped, audit_silent] = a;
        AuditCounters {
            audits,
            audit_confirmed,
            audit_corrected,
            audit_added,
            audit_dropped,
            audit_silent,
        }
    }
}

impl SnoopCounters {
    /// Every counter in one array, for cells that mirror them (lock-free readers).
    pub const LEN: usize = 2 + 16 + 1 + AuditCounters::LEN;

    pub fn to_array(&self) -> [u64; Self::LEN] {
        let mut a = [0u64; Self::LEN];
        a[..2].copy_from_slice(&self.reports);
        a[2..10].copy_from_slice(&self.records[0]);
        a[10..18].copy_from_slice(&self.records[1]);
        a[18] = self.unknown;
        a[19..].copy_from_slice(&self.audit.to_array());
        a
    }

    pub fn from_array(a: &[u64; Self::LEN]) -> Self {
        let mut c = SnoopCounters::default();
        c.reports.copy_from_slice(&a[..2]);
        c.records[0].copy_from_slice(&a[2..10]);
        c.records[1].copy_from_slice(&a[10..18]);
        c.unknown = a[18];
        let mut audit = [0; AuditCounters::LEN];
        audit.copy_from_slice(&a[19..]);
        c.audit = AuditCounters::from_array(audit);
        c
    }
}

/// [`SnoopCounters`] mirrored in atomics: written under the snooper's lock after each change,
/// read by `ctl stats` and `/metrics` without it (a guest's reports never hold them up).
#[derive(Debug, Default)]
pub struct SnoopCells([AtomicU64; SnoopCounters::LEN]);

impl SnoopCells {
    pub fn store(&self, c: &SnoopCounters) {
        for (cell, v) in self.0.iter().zip(c.to_array()) {
            cell.store(v, Ordering::Relaxed);
        }
    }

    pub fn load(&self) -> SnoopCounters {
        SnoopCounters::from_array(&std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

pub(super) fn kind_index(kind: RecordKind, legacy: bool) -> usize {
    match (kind, legacy) {
        (RecordKind::IsInclude, false) => 0,
        (RecordKind::IsExclude, false) => 1,
        (RecordKind::ToInclude, false) => 2,
        (RecordKind::ToExclude, false) => 3,
        (RecordKind::Allow, _) => 4,
        (RecordKind::Block, _) => 5,
        // v1/v2 messages read as IS_EX {} (a report) or TO_IN {} (a leave).
        (RecordKind::IsExclude | RecordKind::IsInclude | RecordKind::ToExclude, true) => 6,
        (RecordKind::ToInclude, true) => 7,
    }
}
