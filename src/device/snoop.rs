//! IGMP/MLD snooping for the net attachment: the guest's own membership reports, seen on
//! its TX path, tell which groups it wants, so a stock QEMU (whose table stops at 64
//! entries) still gets an exact filter. The state keeps per group only what the MAC filter
//! needs: whether the group is wanted at all, which in INCLUDE mode depends on the source
//! list, and when the interest expires if no report refreshes it.

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

#[derive(Debug, Default)]
struct Group {
    /// EXCLUDE mode: wanted whatever the sources.
    exclude: bool,
    /// INCLUDE mode: the sources asked for; wanted while not empty.
    include: HashSet<IpAddr>,
    expires: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct Snooper {
    timeout: Option<Duration>,
    groups: HashMap<IpAddr, Group>,
}

impl Snooper {
    /// `timeout`: forget a group no report refreshed for that long (None: keep until left).
    pub fn new(timeout: Option<Duration>) -> Self {
        Snooper {
            timeout,
            groups: HashMap::new(),
        }
    }

    pub fn clear(&mut self) {
        self.groups.clear();
    }

    /// Applies one report's records; true when the set of wanted groups changed.
    pub fn apply(&mut self, records: &[GroupRecord], now: Instant) -> bool {
        let before = self.groups.len();
        let mut changed = false;
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
            let now_wanted = g.exclude || !g.include.is_empty();
            if !now_wanted {
                self.groups.remove(&r.group);
            }
            changed |= was != now_wanted;
        }
        changed || before != self.groups.len()
    }

    /// Forgets groups whose interest timed out; true if any went.
    pub fn expire(&mut self, now: Instant) -> bool {
        let before = self.groups.len();
        self.groups.retain(|_, g| g.expires.is_none_or(|e| e > now));
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
        assert!(s.expire(t + Duration::from_secs(11)));
        assert_eq!(s.groups(), 1);
        assert!(!s.expire(t + Duration::from_secs(12)));
        assert!(s.expire(t + Duration::from_secs(19)));
        assert_eq!(s.groups(), 0);
    }
}
