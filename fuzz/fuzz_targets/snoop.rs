//! Sequences of IGMP/MLD frames into the snooper, with time passing between them and audit
//! queries answered or not. Invariants: the groups held never exceed the bound, the list the
//! filter gets is strictly ordered, multicast only, and always holds all-hosts/all-nodes.
#![no_main]

use std::time::{Duration, Instant};

use dpaa_vnic::device::snoop::{Snooper, ALWAYS};
use dpaa_vnic::wire::mcast_report;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 32;

fuzz_target!(|data: &[u8]| {
    let mut s = Snooper::with_max_groups(Some(Duration::from_secs(30)), MAX);
    let t0 = Instant::now();
    let mut now = t0;
    // Frames separated by a length byte; a control byte first moves time and the audit.
    let mut rest = data;
    while let Some((&ctl, r)) = rest.split_first() {
        let Some((&len, r)) = r.split_first() else { break };
        let (frame, r) = r.split_at(usize::from(len).min(r.len()));
        rest = r;
        now += Duration::from_millis(u64::from(ctl & 0x3f) * 100);
        if ctl & 0x40 != 0 && s.audit_due(now) {
            s.audit_sent(now, ctl & 1 != 0, ctl & 2 != 0);
        }
        if let Some(report) = mcast_report::parse(frame) {
            let before = s.counters();
            s.apply_report(&report, now);
            let after = s.counters();
            let p = usize::from(report.protocol == mcast_report::Protocol::Mld);
            assert_eq!(after.reports[p], before.reports[p] + 1);
            let counted: u64 = after.records[p].iter().sum::<u64>() - before.records[p].iter().sum::<u64>();
            assert_eq!(counted, report.records.len() as u64);
        }
        s.tick(now);
        assert!(s.groups() <= MAX);
        let macs = s.macs();
        assert!(
            macs.windows(2).all(|w| w[0] < w[1]),
            "not strictly ordered: {macs:?}"
        );
        assert!(macs.iter().all(|m| m.is_multicast()));
        assert!(ALWAYS.iter().all(|a| macs.contains(a)));
        assert!(macs.len() <= MAX + ALWAYS.len());
    }
});
