//! IGMP/MLD snooping for the net attachment: the guest's own membership reports, seen on
//! its TX path, tell which groups it wants, so a stock QEMU (whose table stops at 64
//! entries) still gets an exact filter. The state keeps per group only what the MAC filter
//! needs: whether the group is wanted at all, which in INCLUDE mode depends on the source
//! list, and when the interest expires if no report refreshes it.
//!
//! A host's state-change reports do not always tell the whole story. Linux (6.1 and 7.x)
//! postpones them while changes keep coming and merges what changed meanwhile; a group left
//! while in EXCLUDE mode and joined again source-specifically before the report went out
//! loses its pending TO_IN record (`igmpv3_del_delrec`), so a router that only followed
//! the records would keep it in EXCLUDE mode for ever (found by `guest-tests/churn.sh`).
//! A router recovers through its queries; so does the snooper: once a guest's change reports
//! go quiet for [`AUDIT_QUIET`], it asks for the guest's whole state with a general query
//! (an audit). Everything answered within [`AUDIT_WINDOW`] is confirmed; a group left
//! unconfirmed by [`AUDIT_ROUNDS`] audits in a row is dropped, a round being repeated at
//! once while any group stands unconfirmed. The answers themselves (current-state records)
//! replace what the snooper believed.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::wire::mcast_report::{group_mac, GroupRecord, RecordKind};
use crate::wire::MacAddr;

/// Always delivered, never reported: all-hosts (224.0.0.1) and all-nodes (ff02::1).
pub const ALWAYS: [MacAddr; 2] = [
    MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]),
    MacAddr([0x33, 0x33, 0x00, 0x00, 0x00, 0x01]),
];

/// How long a guest's change reports must be quiet before the audit query goes out: a
/// Linux host retransmits each change a second later (its unsolicited report interval).
pub const AUDIT_QUIET: Duration = Duration::from_millis(1500);
/// The response time an audit query asks for.
pub const AUDIT_RESPONSE: Duration = Duration::from_millis(1000);
/// How long answers to an audit query are counted (the response time, and room for a
/// guest whose timers run late).
pub const AUDIT_WINDOW: Duration = Duration::from_millis(2500);
/// Audits a group may go unanswered in before it is dropped: one lost answer is not a leave
/// (RFC 3376's robustness variable, 2).
pub const AUDIT_ROUNDS: u8 = 2;

#[derive(Debug, Default)]
struct Group {
    /// EXCLUDE mode: wanted whatever the sources.
    exclude: bool,
    /// INCLUDE mode: the sources asked for; wanted while not empty.
    include: HashSet<IpAddr>,
    expires: Option<Instant>,
    /// Audits in a row that found no answer for the group.
    misses: u8,
}

/// Where the audit of the guest's state stands.
#[derive(Debug, Default)]
enum Audit {
    /// Nothing changed since the last audit.
    #[default]
    Idle,
    /// Changes were reported: the query goes out at this time, unless more come first.
    Due(Instant),
    /// Queried: groups answered for (or changed) count as confirmed until `until`.
    Open {
        until: Instant,
        /// The families whose query reached the guest (IPv4, IPv6).
        asked: (bool, bool),
        confirmed: HashSet<IpAddr>,
        /// More changes came while the window was open: audit again after it.
        again: Option<Instant>,
    },
}

#[derive(Debug, Default)]
pub struct Snooper {
    timeout: Option<Duration>,
    groups: HashMap<IpAddr, Group>,
    audit: Audit,
}

impl Snooper {
    /// `timeout`: forget a group no report refreshed for that long (None: keep until left).
    pub fn new(timeout: Option<Duration>) -> Self {
        Snooper {
            timeout,
            groups: HashMap::new(),
            audit: Audit::Idle,
        }
    }

    pub fn clear(&mut self) {
        self.groups.clear();
        self.audit = Audit::Idle;
    }

    /// Applies one report's records; true when the set of wanted groups changed.
    pub fn apply(&mut self, records: &[GroupRecord], now: Instant) -> bool {
        let before = self.groups.len();
        let mut changed = false;
        let mut change_report = false;
        for r in records {
            let expires = self.timeout.map(|t| now + t);
            let g = self.groups.entry(r.group).or_default();
            let was = g.exclude || !g.include.is_empty();
            match r.kind {
                RecordKind::IsExclude | RecordKind::ToExclude => {
                    g.exclude = true;
                    g.include.clear();
                }
                RecordKind::IsInclude | RecordKind::ToInclude => {
                    g.exclude = false;
                    g.include = r.sources.iter().copied().collect();
                }
                RecordKind::Allow => {
                    if !g.exclude {
                        g.include.extend(r.sources.iter().copied());
                    }
                }
                RecordKind::Block => {
                    if !g.exclude {
                        for s in &r.sources {
                            g.include.remove(s);
                        }
                    }
                }
            }
            g.expires = expires;
            g.misses = 0;
            let now_wanted = g.exclude || !g.include.is_empty();
            if !now_wanted {
                self.groups.remove(&r.group);
            }
            changed |= was != now_wanted;
            change_report |= !matches!(r.kind, RecordKind::IsInclude | RecordKind::IsExclude);
            if let Audit::Open { confirmed, .. } = &mut self.audit {
                confirmed.insert(r.group);
            }
        }
        if change_report {
            let due = now + AUDIT_QUIET;
            match &mut self.audit {
                Audit::Open { again, .. } => *again = Some(due),
                a => *a = Audit::Due(due),
            }
        }
        changed || before != self.groups.len()
    }

    /// Whether an audit query should go out now.
    pub fn audit_due(&self, now: Instant) -> bool {
        matches!(self.audit, Audit::Due(t) if now >= t)
    }

    /// The audit queries went out (`v4`, `v6`: which of them reached the guest): answers
    /// are counted from now. With neither delivered, the audit stays due.
    pub fn audit_sent(&mut self, now: Instant, v4: bool, v6: bool) {
        if v4 || v6 {
            self.audit = Audit::Open {
                until: now + AUDIT_WINDOW,
                asked: (v4, v6),
                confirmed: HashSet::new(),
                again: None,
            };
        }
    }

    /// Time passing: groups whose interest timed out go, and an audit window that is over
    /// is judged. True if the set of wanted groups changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        let before = self.groups.len();
        self.groups.retain(|_, g| g.expires.is_none_or(|e| e > now));
        let closed = match &self.audit {
            Audit::Open { until, .. } if now >= *until => std::mem::take(&mut self.audit),
            _ => Audit::Idle,
        };
        if let Audit::Open {
            asked,
            confirmed,
            again,
            ..
        } = closed
        {
            self.groups.retain(|ip, g| {
                let family_asked = if ip.is_ipv4() { asked.0 } else { asked.1 };
                if confirmed.contains(ip) || !family_asked {
                    return true;
                }
                g.misses += 1;
                g.misses < AUDIT_ROUNDS
            });
            // A group no answer confirmed is asked about again at once; changes reported
            // meanwhile are audited once the guest has gone quiet.
            self.audit = if self.groups.values().any(|g| g.misses > 0) {
                Audit::Due(now)
            } else if let Some(t) = again {
                Audit::Due(t.max(now))
            } else {
                Audit::Idle
            };
        }
        before != self.groups.len()
    }

    /// The link-layer addresses to accept: every wanted group's, plus all-hosts/all-nodes.
    pub fn macs(&self) -> Vec<MacAddr> {
        let mut v: Vec<MacAddr> = ALWAYS
            .iter()
            .copied()
            .chain(self.groups.keys().map(group_mac))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn groups(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: RecordKind, group: &str, sources: &[&str]) -> GroupRecord {
        GroupRecord {
            kind,
            group: group.parse().unwrap(),
            sources: sources.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn join_leave_and_sources() {
        let mut s = Snooper::new(None);
        let t = Instant::now();
        assert!(s.apply(&[rec(RecordKind::ToExclude, "239.1.0.1", &[])], t));
        assert!(
            !s.apply(&[rec(RecordKind::IsExclude, "239.1.0.1", &[])], t),
            "refresh is no change"
        );
        assert!(s.macs().contains(&"01:00:5e:01:00:01".parse().unwrap()));
        // Source-specific: wanted while the include list is not empty.
        assert!(s.apply(
            &[rec(RecordKind::Allow, "232.1.1.1", &["10.0.0.1", "10.0.0.2"])],
            t
        ));
        assert!(!s.apply(&[rec(RecordKind::Block, "232.1.1.1", &["10.0.0.1"])], t));
        assert!(s.apply(&[rec(RecordKind::Block, "232.1.1.1", &["10.0.0.2"])], t));
        // Leave (IGMPv2 leave, MLD done, TO_IN {}).
        assert!(s.apply(&[rec(RecordKind::ToInclude, "239.1.0.1", &[])], t));
        assert_eq!(s.macs(), ALWAYS.to_vec());
        // IPv6 and Block in EXCLUDE mode (still wanted).
        s.apply(&[rec(RecordKind::ToExclude, "ff15::1:2", &[])], t);
        s.apply(&[rec(RecordKind::Block, "ff15::1:2", &["fe80::1"])], t);
        assert!(s.macs().contains(&"33:33:00:01:00:02".parse().unwrap()));
        assert_eq!(s.groups(), 1);
    }

    #[test]
    fn interest_expires_unless_refreshed() {
        let mut s = Snooper::new(Some(Duration::from_secs(10)));
        let t = Instant::now();
        s.apply(
            &[
                rec(RecordKind::ToExclude, "239.1.0.1", &[]),
                rec(RecordKind::ToExclude, "239.1.0.2", &[]),
            ],
            t,
        );
        s.apply(
            &[rec(RecordKind::IsExclude, "239.1.0.2", &[])],
            t + Duration::from_secs(8),
        );
        assert!(s.tick(t + Duration::from_secs(11)));
        assert_eq!(s.groups(), 1);
        assert!(!s.tick(t + Duration::from_secs(12)));
        assert!(s.tick(t + Duration::from_secs(19)));
        assert_eq!(s.groups(), 0);
    }

    /// The record stream a Linux guest sent for a group it left in EXCLUDE mode and joined
    /// again source-specifically before its report went out (churn seed 1234): the TO_IN that
    /// would have ended EXCLUDE mode never came, only ALLOW and BLOCK for the new source.
    /// Following the records keeps the group for ever; the audit drops it.
    #[test]
    fn a_leave_the_guest_never_reported_is_found_by_the_audit() {
        let mut s = Snooper::new(None);
        let t = Instant::now();
        s.apply(&[rec(RecordKind::ToExclude, "239.1.0.12", &[])], t);
        s.apply(&[rec(RecordKind::Allow, "239.1.0.12", &["10.200.0.2"])], t);
        s.apply(&[rec(RecordKind::Block, "239.1.0.12", &["10.200.0.2"])], t);
        assert_eq!(s.groups(), 1, "the records alone leave it in EXCLUDE mode");
        // Quiet for AUDIT_QUIET: the query goes out, and nothing answers for the group.
        assert!(!s.audit_due(t + AUDIT_QUIET / 2));
        let t1 = t + AUDIT_QUIET;
        assert!(s.audit_due(t1));
        s.audit_sent(t1, true, true);
        assert!(!s.tick(t1 + AUDIT_WINDOW), "one unanswered audit is not a leave");
        let t2 = t1 + AUDIT_WINDOW;
        assert!(s.audit_due(t2), "asked again at once");
        s.audit_sent(t2, true, true);
        assert!(s.tick(t2 + AUDIT_WINDOW));
        assert_eq!(s.macs(), ALWAYS.to_vec());
        assert!(!s.audit_due(t2 + AUDIT_WINDOW * 4));
    }

    #[test]
    fn the_guest_s_answers_decide_and_keep_what_it_holds() {
        let mut s = Snooper::new(None);
        let t = Instant::now();
        s.apply(
            &[
                rec(RecordKind::ToExclude, "239.1.0.1", &[]),
                rec(RecordKind::ToExclude, "239.1.0.2", &[]),
                rec(RecordKind::ToExclude, "ff15::1:1", &[]),
            ],
            t,
        );
        let t1 = t + AUDIT_QUIET;
        s.audit_sent(t1, true, false);
        // The answer: 239.1.0.1 is source-specific now; 239.1.0.2 is not mentioned.
        s.apply(&[rec(RecordKind::IsInclude, "239.1.0.1", &["10.0.0.9"])], t1);
        // A join while the window is open counts as an answer, and is audited after it.
        s.apply(&[rec(RecordKind::ToExclude, "239.1.0.3", &[])], t1);
        s.tick(t1 + AUDIT_WINDOW);
        // Only IPv4 was asked about: the IPv6 group is not judged.
        let later = t1 + AUDIT_WINDOW;
        assert!(s.audit_due(later), "239.1.0.2 unconfirmed: asked again");
        s.audit_sent(later, true, true);
        s.apply(
            &[
                rec(RecordKind::IsInclude, "239.1.0.1", &["10.0.0.9"]),
                rec(RecordKind::IsExclude, "239.1.0.3", &[]),
                rec(RecordKind::IsExclude, "ff15::1:1", &[]),
            ],
            later,
        );
        assert!(s.tick(later + AUDIT_WINDOW));
        let macs = s.macs();
        assert!(macs.contains(&"01:00:5e:01:00:01".parse().unwrap()));
        assert!(!macs.contains(&"01:00:5e:01:00:02".parse().unwrap()));
        assert!(macs.contains(&"01:00:5e:01:00:03".parse().unwrap()));
        assert!(macs.contains(&"33:33:00:01:00:01".parse().unwrap()));
        // The answers were current-state records: nothing left to audit.
        assert!(!s.audit_due(later + AUDIT_WINDOW * 4));
    }
}
