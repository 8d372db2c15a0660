//! The filter as the driver keeps it: the guest's address sets, per-bucket reference counts,
//! and the sync that turns each full list into adds and removes against the current state.
//!
//! Every MAC_TABLE_SET carries the guest's complete lists. A sync compares each list with the
//! previous one: the common prefix and suffix are skipped at slice-compare speed (a driver
//! keeps its list in order and appends new addresses), and only the window in between goes
//! through the per-address occurrence counts. O(N) to compare, O(changes) map and register
//! updates: the registers are never rebuilt, as Linux's `__dev_mc_sync` replaced "remove
//! all, add all". Counting occurrences keeps it exact when a list repeats or reorders.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::hash::{self, MAX_BUCKETS};
use super::layout::Layout;
use super::regs::{mode_flags, FilterRegs, FilterStats, F_MC_OVERFLOW, F_UC_OVERFLOW, TABLE_MAX};
use crate::device::rx_state::RxMode;
use crate::wire::ethernet::mac_bytes;
use crate::wire::MacAddr;

/// Exact-match address registers for unicast besides the station address (the mEMAC has 7).
pub const UNICAST_EXACT: usize = 7;

/// Unicast addresses besides the station's a layout can hold: none on the TGEC, whose
/// driver has no exact registers to put them in (Linux then makes the port promiscuous for
/// unicast, as this model does).
fn unicast_exact(layout: Layout) -> usize {
    match layout {
        Layout::Tgec => 0,
        _ => UNICAST_EXACT,
    }
}
/// Default `--exact-limit`: multicast entries the exact layout keeps before allmulti.
pub const DEFAULT_EXACT_LIMIT: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct ListEntry {
    /// Occurrences in the driver's current list.
    count: u32,
    in_table: bool,
}

/// The registers and what the model knows about them.
struct Hw {
    regs: Arc<FilterRegs>,
    layout: Layout,
    refs: Vec<u32>,
    /// Addresses in the exact table, with the number of lists (unicast, multicast) that
    /// hold each: a driver may list one address in both, and it goes from the table only
    /// when neither does.
    entries: HashMap<MacAddr, u8, ahash::RandomState>,
    in_table: usize,
    /// Adds refused since creation.
    refused: u64,
    /// Addresses of each list (unicast, multicast) the exact table could not take: full, or
    /// their free slot past MAX_PROBE.
    missing: [usize; 2],
}

/// Which of the guest's lists an address is on.
#[derive(Debug, Clone, Copy)]
enum List {
    Unicast = 0,
    Multicast = 1,
}

/// What one sync changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    pub adds: u64,
    pub removes: u64,
}

/// `ctl filter`'s view of the hardware side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilterSnapshot {
    pub layout: Layout,
    pub exact_limit: usize,
    /// Multicast beyond what the layout keeps: the port behaves as allmulti.
    pub mc_overflow: bool,
    /// Unicast beyond the exact registers and no unicast hash: the port accepts all unicast.
    pub uc_overflow: bool,
    pub buckets_total: usize,
    /// Buckets in use with the number of addresses in each.
    pub buckets: Vec<(usize, u32)>,
    /// Unicast addresses in exact registers (layouts without a unicast hash), sorted.
    pub exact_unicast: Vec<MacAddr>,
    pub stats: FilterStats,
}

pub struct Filter {
    /// The registers and the layout they model, with what the model knows of them.
    hw: Hw,
    exact_limit: usize,
    station: MacAddr,
    mode: RxMode,
    uc: HashMap<MacAddr, ListEntry>,
    mc: HashMap<MacAddr, ListEntry>,
    /// The lists as the driver last sent them, to diff the next ones against.
    prev_uc: Vec<MacAddr>,
    prev_mc: Vec<MacAddr>,
    stats: FilterStats,
}

impl Filter {
    pub fn new(regs: Arc<FilterRegs>, exact_limit: usize, station: MacAddr) -> Self {
        let layout = regs.layout();
        regs.clear(station);
        Filter {
            hw: Hw {
                regs: regs.clone(),
                layout,
                refs: vec![0; MAX_BUCKETS],
                entries: HashMap::default(),
                in_table: 0,
                refused: 0,
                missing: [0; 2],
            },
            exact_limit,
            station,
            mode: RxMode::default(),
            uc: HashMap::new(),
            mc: HashMap::new(),
            prev_uc: Vec::new(),
            prev_mc: Vec::new(),
            stats: FilterStats::default(),
        }
    }

    pub fn regs(&self) -> &Arc<FilterRegs> {
        &self.hw.regs
    }

    pub fn stats(&self) -> FilterStats {
        self.stats
    }

    /// Back to the state after reset, keeping the counters.
    pub fn reset(&mut self, station: MacAddr) {
        let stats = self.stats;
        *self = Filter::new(self.hw.regs.clone(), self.exact_limit, station);
        self.stats = stats;
    }

    pub fn set_mode(&mut self, mode: RxMode) {
        self.mode = mode;
        self.publish_flags();
    }

    pub fn set_station(&mut self, mac: MacAddr) {
        self.station = mac;
        self.hw.regs.set_station(mac);
    }

    fn publish_flags(&self) {
        let mut f = mode_flags(&self.mode);
        let mc_fits = match self.hw.layout {
            Layout::Exact => {
                self.mc.len() <= self.exact_limit && self.hw.missing[List::Multicast as usize] == 0
            }
            _ => true,
        };
        if !mc_fits {
            f |= F_MC_OVERFLOW;
        }
        if self.hw.layout != Layout::Dtsec
            && (self.uc.len() > unicast_exact(self.hw.layout) || self.hw.missing[List::Unicast as usize] > 0)
        {
            f |= F_UC_OVERFLOW;
        }
        self.hw.regs.set_flags(f);
    }

    /// Brings the filter to the guest's full lists (one MAC_TABLE_SET).
    pub fn sync(&mut self, unicast: &[MacAddr], multicast: &[MacAddr]) -> SyncReport {
        let mut report = SyncReport::default();
        let refused = self.hw.refused;
        sync_list(
            &mut self.hw,
            List::Unicast,
            &mut self.uc,
            &mut self.prev_uc,
            unicast,
            &mut report,
        );
        sync_list(
            &mut self.hw,
            List::Multicast,
            &mut self.mc,
            &mut self.prev_mc,
            multicast,
            &mut report,
        );
        self.publish_flags();
        self.stats.filter_syncs += 1;
        self.stats.filter_adds += report.adds;
        self.stats.filter_removes += report.removes;
        self.stats.table_refused += self.hw.refused - refused;
        self.hw.regs.publish_stats(&self.stats);
        report
    }

    /// O(buckets + unicast entries): the control path builds it only when a table set
    /// changed the lists, since nothing else changes it.
    pub fn view(&self) -> FilterSnapshot {
        let f = self.hw.regs.flags();
        let mut exact_unicast: Vec<MacAddr> =
            if hash::bucket(self.hw.layout, &MacAddr([2, 0, 0, 0, 0, 0])).is_none() {
                self.uc.keys().copied().collect()
            } else {
                Vec::new()
            };
        exact_unicast.sort();
        FilterSnapshot {
            layout: self.hw.layout,
            exact_limit: self.exact_limit,
            mc_overflow: f & F_MC_OVERFLOW != 0,
            uc_overflow: f & F_UC_OVERFLOW != 0,
            buckets_total: hash::bucket_count(self.hw.layout),
            buckets: self.hw.refs[..hash::bucket_count(self.hw.layout)]
                .iter()
                .enumerate()
                .filter(|(_, r)| **r > 0)
                .map(|(b, r)| (b, *r))
                .collect(),
            exact_unicast,
            stats: self.stats,
        }
    }

    /// Reference counts per bucket (for tests and `ctl filter`).
    pub fn refs(&self) -> &[u32] {
        &self.hw.refs
    }
}

/// Diffs one list against the previous one and applies the changes.
fn sync_list(
    hw: &mut Hw,
    list: List,
    map: &mut HashMap<MacAddr, ListEntry>,
    prev: &mut Vec<MacAddr>,
    next: &[MacAddr],
    report: &mut SyncReport,
) {
    let prefix = common_prefix(mac_bytes(prev), mac_bytes(next)) / 6;
    let suffix = common_suffix(mac_bytes(&prev[prefix..]), mac_bytes(&next[prefix..])) / 6;
    let gone = &prev[prefix..prev.len() - suffix];
    let came = &next[prefix..next.len() - suffix];
    // Count arrivals before departures, so an address that only moved never drops to zero.
    for mac in came {
        let e = map.entry(*mac).or_insert(ListEntry {
            count: 0,
            in_table: false,
        });
        e.count += 1;
        if e.count == 1 {
            e.in_table = hw.add(list, mac);
            report.adds += 1;
        }
    }
    for mac in gone {
        if let Some(e) = map.get_mut(mac) {
            e.count -= 1;
            if e.count == 0 {
                let in_table = e.in_table;
                map.remove(mac);
                hw.remove(list, mac, in_table);
                report.removes += 1;
            }
        }
    }
    // Only the window that differs is rewritten: a join appends one entry, where copying the
    // whole list again cost as much as the comparison.
    let end = prev.len() - suffix;
    prev.splice(prefix..end, came.iter().copied());
}

/// Compare steps, coarse to fine: a whole list that matches costs one memcmp (the join and
/// leave storms' common case), a difference is narrowed down 4 KiB, then 64 bytes at a time,
/// and only the last block is compared byte by byte. One memcmp per 64-byte block across a
/// 6 KB list cost more than the rest of the sync together.
fn steps(n: usize) -> [usize; 3] {
    [n, 4096, 64]
}

/// Bytes `a` and `b` share at the start.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    for step in steps(n) {
        while step > 0 && i + step <= n && a[i..i + step] == b[i..i + step] {
            i += step;
        }
    }
    i + a[i..n].iter().zip(&b[i..n]).take_while(|(x, y)| x == y).count()
}

/// Bytes `a` and `b` share at the end, the same way.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    for step in steps(n) {
        while step > 0 && i + step <= n && a[n - i - step..n - i] == b[n - i - step..n - i] {
            i += step;
        }
    }
    i + a[..n - i]
        .iter()
        .rev()
        .zip(b[..n - i].iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

impl Hw {
    fn add(&mut self, list: List, mac: &MacAddr) -> bool {
        if let Some(b) = hash::bucket(self.layout, mac) {
            self.refs[b] += 1;
            if self.refs[b] == 1 {
                self.regs.set_bucket(b, true);
            }
        }
        if let Some(n) = self.entries.get_mut(mac) {
            *n += 1;
            return true;
        }
        if self.in_table < TABLE_MAX && self.regs.insert(mac).is_some() {
            self.entries.insert(*mac, 1);
            self.in_table += 1;
            true
        } else {
            self.missing[list as usize] += 1;
            self.refused += 1;
            false
        }
    }

    fn remove(&mut self, list: List, mac: &MacAddr, in_table: bool) {
        if let Some(b) = hash::bucket(self.layout, mac) {
            // A bucket is cleared only when its last address goes: others may still need it.
            self.refs[b] = self.refs[b].saturating_sub(1);
            if self.refs[b] == 0 {
                self.regs.set_bucket(b, false);
            }
        }
        if in_table {
            match self.entries.get_mut(mac) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    self.entries.remove(mac);
                    self.regs.remove(mac);
                    self.in_table -= 1;
                }
            }
        } else {
            self.missing[list as usize] -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::filter::regs::Verdict;
    use proptest::prelude::*;

    fn filter(layout: Layout, limit: usize) -> Filter {
        Filter::new(
            Arc::new(FilterRegs::new(layout, MacAddr([0x52, 0x54, 0, 0, 0, 1]))),
            limit,
            MacAddr([0x52, 0x54, 0, 0, 0, 1]),
        )
    }

    fn mc(i: u64) -> MacAddr {
        MacAddr::from_u64(0x0100_5e00_0000 + i)
    }

    #[test]
    fn byte_prefix_and_suffix() {
        let a: Vec<u8> = (0..200).map(|i| i as u8).collect();
        let mut b = a.clone();
        b[130] ^= 1;
        assert_eq!(common_prefix(&a, &b), 130);
        assert_eq!(common_suffix(&a, &b), 69);
        assert_eq!(common_prefix(&a, &a[..70]), 70);
        assert_eq!(common_suffix(&a, &a[150..]), 50);
        assert_eq!((common_prefix(&[], &a), common_suffix(&a, &[])), (0, 0));
    }

    proptest! {
        // Every step size (whole list, 4 KiB, 64 bytes, bytes) against the definition, with
        // the difference anywhere in lists up to 10 000 bytes.
        #[test]
        fn prefix_and_suffix_match_the_definition(
            len in 0usize..10_000,
            cut in 0usize..10_000,
            at in proptest::option::of(0usize..10_000),
        ) {
            let a: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut b = a[..cut.min(len)].to_vec();
            if let Some(at) = at.filter(|at| *at < b.len()) {
                b[at] ^= 0x80;
            }
            let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let suf = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(common_prefix(&a, &b), pre);
            prop_assert_eq!(common_suffix(&a, &b), suf);
        }
    }

    #[test]
    fn sync_applies_only_changes() {
        let mut f = filter(Layout::Memac, DEFAULT_EXACT_LIMIT);
        let list: Vec<MacAddr> = (0..1000).map(mc).collect();
        assert_eq!(
            f.sync(&[], &list),
            SyncReport {
                adds: 1000,
                removes: 0
            }
        );
        // The same list again: nothing to do. One more, one less: two operations.
        assert_eq!(f.sync(&[], &list), SyncReport::default());
        let mut next = list[1..].to_vec();
        next.push(mc(5000));
        assert_eq!(f.sync(&[], &next), SyncReport { adds: 1, removes: 1 });
        assert_eq!(
            f.stats(),
            FilterStats {
                filter_syncs: 3,
                filter_adds: 1001,
                filter_removes: 1,
                table_refused: 0,
            }
        );
        assert_eq!(f.refs().iter().sum::<u32>(), 1000);
    }

    #[test]
    fn an_address_the_table_refuses_opens_the_filter_until_it_goes() {
        let mut f = filter(Layout::Exact, 100);
        let m = MacAddr([0x01, 0, 0x5e, 1, 2, 3]);
        let other = MacAddr([0x01, 0, 0x5e, 1, 2, 4]);
        f.set_mode(RxMode {
            promisc: false,
            ..RxMode::default()
        });
        f.regs().block_home_of(&m);
        f.sync(&[], &[m]);
        // The exact layout cannot tell m from others without its entry: accept-all, counted.
        assert!(f.view().mc_overflow);
        assert_eq!(f.stats().table_refused, 1);
        assert_eq!(f.regs().classify(&other), Verdict::Multicast);
        f.sync(&[], &[]);
        assert!(!f.view().mc_overflow);
        assert_eq!(f.regs().classify(&other), Verdict::Reject);
        assert_eq!(f.stats().table_refused, 1);
    }

    /// The TGEC hashes multicast into the dTSEC's extended buckets and holds no unicast
    /// besides the station's: one more unicast address opens unicast (as Linux's dpaa
    /// driver, without IFF_UNICAST_FLT, makes the port promiscuous), and closing it again
    /// filters once more.
    #[test]
    fn tgec_hashes_multicast_and_opens_unicast_for_a_second_address() {
        let mut t = filter(Layout::Tgec, 100);
        let mut d = filter(Layout::DtsecExtended, 100);
        for f in [&mut t, &mut d] {
            f.set_mode(RxMode {
                promisc: false,
                ..RxMode::default()
            });
        }
        let groups: Vec<MacAddr> = (0..40u8).map(|i| MacAddr([0x01, 0, 0x5e, 0, 1, i])).collect();
        t.sync(&[], &groups);
        d.sync(&[], &groups);
        for b in 0..MAX_BUCKETS {
            assert_eq!(t.regs().bucket_set(b), d.regs().bucket_set(b), "bucket {b}");
        }
        let stranger = MacAddr([0x52, 0x54, 0, 9, 9, 9]);
        assert_eq!(t.regs().classify(&stranger), Verdict::Reject);
        let second = MacAddr([0x52, 0x54, 0, 1, 1, 1]);
        t.sync(&[second], &groups);
        assert!(t.view().uc_overflow);
        assert_eq!(t.regs().classify(&stranger), Verdict::Accept);
        d.sync(&[second], &groups);
        assert!(
            !d.view().uc_overflow,
            "the dTSEC-ext keeps it in an exact register"
        );
        t.sync(&[], &groups);
        assert!(!t.view().uc_overflow);
        assert_eq!(t.regs().classify(&stranger), Verdict::Reject);
    }

    /// Found by fuzz target ctrl: an address the driver lists as unicast and as multicast
    /// has one exact-table entry. Dropping it from one list removed the entry while the
    /// other still held it, and frames to it became hash false positives.
    #[test]
    fn an_address_on_both_lists_stays_until_neither_holds_it() {
        let mut f = filter(Layout::Dtsec, 100);
        f.set_mode(RxMode {
            promisc: false,
            ..RxMode::default()
        });
        let m = MacAddr([0xff, 0xff, 0, 0, 0, 0]);
        f.sync(&[m], &[m]);
        f.sync(&[], &[m]);
        assert_eq!(f.regs().classify(&m), Verdict::Multicast);
        f.sync(&[m], &[]);
        assert_eq!(
            f.regs().classify(&m),
            Verdict::Multicast,
            "a listed unicast group address"
        );
        f.sync(&[], &[]);
        assert_eq!(f.regs().classify(&m), Verdict::Reject);
    }

    #[test]
    fn shared_bucket_survives_one_removal() {
        let mut f = filter(Layout::Memac, DEFAULT_EXACT_LIMIT);
        f.set_mode(RxMode {
            promisc: false,
            ..RxMode::default()
        });
        // Two groups that share a bucket, and one that does not.
        let a = mc(1);
        let b = (2..10_000)
            .map(mc)
            .find(|m| hash::memac(m) == hash::memac(&a))
            .unwrap();
        let c = (2..10_000)
            .map(mc)
            .find(|m| hash::memac(m) != hash::memac(&a))
            .unwrap();
        f.sync(&[], &[a, b]);
        f.sync(&[], &[b]);
        assert_eq!(f.regs().classify(&b), Verdict::Multicast);
        // a's bucket is still set for b: a is now a hash false positive, not rejected.
        assert_eq!(f.regs().classify(&a), Verdict::FalsePositive);
        f.sync(&[], &[]);
        assert_eq!(f.regs().classify(&b), Verdict::Reject);
        assert_eq!(f.regs().classify(&c), Verdict::Reject);
    }

    #[test]
    fn exact_layout_overflows_to_allmulti_and_back() {
        let mut f = filter(Layout::Exact, 4);
        f.set_mode(RxMode {
            promisc: false,
            ..RxMode::default()
        });
        let list: Vec<MacAddr> = (0..5).map(mc).collect();
        f.sync(&[], &list[..4]);
        assert_eq!(f.regs().classify(&mc(9)), Verdict::Reject);
        assert!(!f.view().mc_overflow);
        f.sync(&[], &list);
        assert!(f.view().mc_overflow);
        assert_eq!(f.regs().classify(&mc(9)), Verdict::Multicast);
        f.sync(&[], &list[..2]);
        assert_eq!(f.regs().classify(&mc(9)), Verdict::Reject);
        assert_eq!(f.regs().classify(&mc(1)), Verdict::Multicast);
    }

    #[test]
    fn unicast_exact_registers_then_alluni() {
        let mut f = filter(Layout::Memac, DEFAULT_EXACT_LIMIT);
        f.set_mode(RxMode {
            promisc: false,
            ..RxMode::default()
        });
        let uc: Vec<MacAddr> = (0..8u64)
            .map(|i| MacAddr::from_u64(0x0200_0000_0000 + i))
            .collect();
        f.sync(&uc[..7], &[]);
        assert_eq!(f.regs().classify(&uc[3]), Verdict::Accept);
        assert_eq!(
            f.regs().classify(&MacAddr::from_u64(0x0200_0000_0100)),
            Verdict::Reject
        );
        f.sync(&uc, &[]);
        assert!(f.view().uc_overflow);
        assert_eq!(
            f.regs().classify(&MacAddr::from_u64(0x0200_0000_0100)),
            Verdict::Accept
        );
        assert_eq!(
            f.regs().classify(&MacAddr([0x52, 0x54, 0, 0, 0, 1])),
            Verdict::Accept
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Tables(Vec<u8>, Vec<u8>),
        Mode(u8, bool),
        Station(u8),
    }

    fn addr(i: u8, multicast: bool) -> MacAddr {
        // A small universe so that lists overlap and buckets collide.
        if multicast {
            if i % 5 == 0 {
                MacAddr([0x33, 0x33, 0, 0, 0, i])
            } else {
                MacAddr([0x01, 0x00, 0x5e, 0, i % 3, i])
            }
        } else {
            MacAddr([0x02, 0, 0, 0, i % 4, i])
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (proptest::collection::vec(0u8..24, 0..10), proptest::collection::vec(0u8..48, 0..40))
                .prop_map(|(u, m)| Op::Tables(u, m)),
            2 => (0u8..6, any::<bool>()).prop_map(|(f, on)| Op::Mode(f, on)),
            1 => (0u8..24).prop_map(Op::Station),
        ]
    }

    fn set_flag(m: &mut RxMode, f: u8, on: bool) {
        *[
            &mut m.promisc,
            &mut m.allmulti,
            &mut m.alluni,
            &mut m.nomulti,
            &mut m.nouni,
            &mut m.nobcast,
        ][f as usize] = on;
    }

    proptest! {
        /// After any sequence of table sets and mode commands, the incrementally kept filter
        /// equals one built from scratch from the final state, in every layout.
        #[test]
        fn incremental_equals_from_scratch(ops in proptest::collection::vec(op(), 1..30)) {
            for layout in [Layout::Exact, Layout::Memac, Layout::Dtsec, Layout::DtsecExtended, Layout::Tgec] {
                let mut inc = filter(layout, 12);
                let (mut uc, mut mcl, mut mode, mut station) =
                    (Vec::new(), Vec::new(), RxMode::default(), MacAddr([0x52, 0x54, 0, 0, 0, 1]));
                for o in &ops {
                    match o {
                        Op::Tables(u, m) => {
                            uc = u.iter().map(|i| addr(*i, false)).collect();
                            mcl = m.iter().map(|i| addr(*i, true)).collect();
                            inc.sync(&uc, &mcl);
                        }
                        Op::Mode(f, on) => {
                            set_flag(&mut mode, *f, *on);
                            inc.set_mode(mode);
                        }
                        Op::Station(i) => {
                            station = addr(*i, false);
                            inc.set_station(station);
                        }
                    }
                }
                let mut scratch = filter(layout, 12);
                scratch.set_station(station);
                scratch.set_mode(mode);
                scratch.sync(&uc, &mcl);
                prop_assert_eq!(inc.refs(), scratch.refs());
                prop_assert_eq!(inc.regs().flags(), scratch.regs().flags());
                for b in 0..MAX_BUCKETS {
                    prop_assert_eq!(inc.regs().bucket_set(b), scratch.regs().bucket_set(b));
                }
                let mut v1 = inc.view();
                let mut v2 = scratch.view();
                v1.stats = FilterStats::default();
                v2.stats = FilterStats::default();
                prop_assert_eq!(v1, v2);
                for i in 0..=255u8 {
                    for m in [addr(i, true), addr(i, false), MacAddr::BROADCAST] {
                        prop_assert_eq!(inc.regs().classify(&m), scratch.regs().classify(&m), "{} {}", layout, m);
                    }
                }
            }
        }
    }
}
