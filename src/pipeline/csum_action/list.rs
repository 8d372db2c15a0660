//! One port's actions in one direction, as the switch keeps them: the list, and what the
//! burst path can know of it once, when the rules are published, instead of per frame.

use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

use log::debug;

use super::plain;
use super::run::apply;
use super::spec::{CsumAction, Targets, Verdict};
use crate::pipeline::packet::{BurstFrame, Packet};
use crate::stats::Counts;
use crate::wire::virtio_net_hdr::F_DATA_VALID;
use crate::wire::VirtioNetHdr;

/// A port's actions for one direction, in the order they run.
#[derive(Debug, Clone, Default)]
pub struct ActionList {
    actions: Vec<CsumAction>,
    /// When every action matches every frame (no `proto`, no `dst`) and passes it, the union of their
    /// targets: on a frame the one pass takes, running them in turn writes what one action
    /// with all their targets writes. An IPv4 header's checksum covers no upper layer, an
    /// upper layer's pseudo-header holds no IP checksum, and each sum written again comes
    /// out the same (the tests below hold the two to the same bytes).
    every_frame: Option<Targets>,
    /// `--csum-rules locked` only: the list's one lock, which every worker takes for every
    /// frame the list runs on.
    contended: Option<Arc<Contended>>,
}

/// `--csum-rules locked`: the "before" of the lockless act_csum (DESIGN.md, the seeds),
/// kept to measure the lockless lists against in the same daemon (docs/performance.md,
/// "The seeds' experiments"). As that version of tc's action did, every frame takes one
/// lock per list and counts itself in statistics shared by every CPU, under the lock, so
/// that each frame writes the same cache line wherever it runs. Never the default.
#[derive(Debug, Default)]
struct Contended(Mutex<Shared>);

/// What a locked list counts under its lock: the frames and bytes tc's `bstats` held.
#[derive(Debug, Default)]
struct Shared {
    frames: u64,
    bytes: u64,
}

impl Contended {
    /// The lock, held for a frame, the frame counted under it.
    #[inline]
    fn hold(&self, bytes: usize) -> MutexGuard<'_, Shared> {
        let mut s = crate::sync::lock(&self.0);
        s.frames += 1;
        s.bytes += bytes as u64;
        s
    }
}

impl Drop for Contended {
    fn drop(&mut self) {
        let s = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        debug!(
            "a locked action list ends after {} frames, {} bytes",
            s.frames, s.bytes
        );
    }
}

impl ActionList {
    /// No actions.
    pub const EMPTY: ActionList = ActionList {
        actions: Vec::new(),
        every_frame: None,
        contended: None,
    };

    pub fn new(actions: Vec<CsumAction>) -> Self {
        let every_frame = actions
            .iter()
            .try_fold(Targets::default(), |all, a| {
                let every = a.proto.is_none() && a.dst.is_none() && a.verdict == Verdict::Pass;
                every.then_some(all | a.update)
            })
            .filter(|_| !actions.is_empty());
        ActionList {
            actions,
            every_frame,
            contended: None,
        }
    }

    /// The same list behind one lock and shared counters (`--csum-rules locked`).
    pub fn locked(actions: Vec<CsumAction>) -> Self {
        ActionList {
            contended: Some(Arc::default()),
            ..Self::new(actions)
        }
    }

    /// Runs the list on a frame ([`apply`]): false if the frame drops.
    #[inline]
    pub fn apply(&self, pkt: &mut Packet<'_>, counts: Counts<'_>) -> bool {
        if self.actions.is_empty() {
            return true;
        }
        let _held = self.contended.as_deref().map(|c| c.hold(pkt.frame.len()));
        apply(&self.actions, pkt, counts)
    }

    /// Runs the list on a frame whose header asks for nothing (the burst path's), counted
    /// in `counts` as [`apply`] counts: the header flags it leaves (DATA_VALID once an
    /// upper layer's sum was computed), `None` if the frame drops.
    #[inline]
    pub fn apply_plain(&self, frame: &mut BurstFrame<'_>, counts: &Counts<'_>) -> Option<u8> {
        let mut passes = Passes::default();
        let flags = self.apply_plain_in_run(frame, counts, &mut passes);
        self.count_passes(counts, passes);
        flags
    }

    /// [`ActionList::apply_plain`] for one frame of a run. The common frame of a list that
    /// matches and passes every frame takes one pass, with no [`Packet`] and no match, and
    /// its rest is fetched only if that pass sums the payload (plain.rs). Such a frame is
    /// counted in `passes`, whose counts the caller adds once for the run
    /// ([`ActionList::count_passes`]) rather than two or three counters per frame; any
    /// other frame is counted in `counts` as it goes.
    #[inline]
    pub fn apply_plain_in_run(
        &self,
        frame: &mut BurstFrame<'_>,
        counts: &Counts<'_>,
        passes: &mut Passes,
    ) -> Option<u8> {
        // Out of line, and counted there: an unlocked list's frame pays one test for the
        // lock, not the drop of an `Option` of its guard, and `passes` is handed to no
        // call, so its counts can stay in registers for the whole run (what that is worth:
        // docs/performance.md, "What shaped the path").
        if let Some(c) = &self.contended {
            return self.apply_plain_locked(c, frame, counts);
        }
        self.apply_plain_unlocked(frame, counts, passes)
    }

    /// [`ActionList::apply_plain_in_run`] on a locked list (`--csum-rules locked`), its
    /// frame counted as it goes.
    #[cold]
    #[inline(never)]
    fn apply_plain_locked(
        &self,
        c: &Contended,
        frame: &mut BurstFrame<'_>,
        counts: &Counts<'_>,
    ) -> Option<u8> {
        let _held = c.hold(frame.len());
        let mut passes = Passes::default();
        let flags = self.apply_plain_unlocked(frame, counts, &mut passes);
        self.count_passes(counts, passes);
        flags
    }

    /// [`ActionList::apply_plain_in_run`] once the list's lock, if any, is held.
    #[inline(always)]
    fn apply_plain_unlocked(
        &self,
        frame: &mut BurstFrame<'_>,
        counts: &Counts<'_>,
        passes: &mut Passes,
    ) -> Option<u8> {
        if let Some(targets) = self.every_frame {
            if let Some(done) = plain::update(frame, targets, 0) {
                passes.frames += 1;
                passes.wrote += u64::from(done.wrote);
                return Some(if done.l4_complete { F_DATA_VALID } else { 0 });
            }
        }
        self.apply_general(frame, counts)
    }

    /// The frame [`ActionList::apply_plain_in_run`]'s one pass does not take: every action
    /// in turn, as [`apply`] runs them.
    #[inline(never)]
    fn apply_general(&self, frame: &mut BurstFrame<'_>, counts: &Counts<'_>) -> Option<u8> {
        let mut pkt = Packet::new(VirtioNetHdr::default(), frame.bytes());
        apply(&self.actions, &mut pkt, *counts).then_some(pkt.hdr.flags)
    }

    /// Adds what the one pass did over a run: each frame rewritten counted in
    /// `csum_updated`, and matched and passed by each action.
    pub fn count_passes(&self, counts: &Counts<'_>, passes: Passes) {
        if passes.frames == 0 {
            return;
        }
        counts.queue.csum_updated.add(passes.wrote);
        for c in self.actions.iter().filter_map(|a| counts.action(a.slot)) {
            c.matched.add(passes.frames);
            c.passed.add(passes.frames);
        }
    }
}

/// The frames of a run that took [`ActionList::apply_plain_in_run`]'s one pass, and how
/// many of them it rewrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct Passes {
    frames: u64,
    wrote: u64,
}

impl Deref for ActionList {
    type Target = [CsumAction];
    fn deref(&self) -> &[CsumAction] {
        &self.actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::csum_action::spec::Dir;
    use crate::pipeline::csum_action::test_frames::{act, action_slots, any_frame};
    use crate::stats::{ActionStats, QueueStats};
    use proptest::prelude::*;

    fn list(specs: &[&str]) -> ActionList {
        ActionList::new(specs.iter().map(|s| act(s)).collect())
    }

    #[test]
    fn every_frame_only_when_nothing_is_matched_on() {
        assert_eq!(list(&[]).every_frame, None);
        let both = list(&["port=0,dir=egress,update=iph", "port=0,dir=egress,update=udp+tcp"]);
        assert_eq!(both.every_frame, Some(Targets::IPH | Targets::UDP | Targets::TCP));
        let proto = list(&[
            "port=0,dir=egress,update=iph",
            "port=0,dir=egress,update=udp,proto=udp",
        ]);
        assert_eq!(proto.every_frame, None);
        let dst = list(&["port=0,dir=egress,update=udp,dst=10.0.0.0/8"]);
        assert_eq!(dst.every_frame, None);
    }

    proptest! {
        /// The burst path's answer is the general path's: the same bytes, flags and
        /// counters, for lists of one to three actions, matching every frame or not.
        #[test]
        fn apply_plain_is_apply(
            (f, _) in any_frame(),
            actions in proptest::collection::vec(
                (1u8..128, prop_oneof![Just(None), Just(Some(17u8)), Just(Some(6u8))]),
                1..4,
            ),
        ) {
            let actions: Vec<CsumAction> = actions
                .into_iter()
                .map(|(t, proto)| CsumAction {
                    port: 0,
                    dir: Dir::Egress,
                    update: Targets(t),
                    proto,
                    dst: None,
                    verdict: Verdict::Pass,
                    slot: 0,
                })
                .enumerate()
                .map(|(i, a)| CsumAction { slot: i as u16, ..a })
                .collect();
            let l = ActionList::new(actions);
            let (quick_stats, slow_stats) = (QueueStats::default(), QueueStats::default());
            let (quick_acts, slow_acts) = (action_slots(l.len()), action_slots(l.len()));
            let mut quick = f.clone();
            let flags = l.apply_plain(&mut BurstFrame::new(&mut quick), &Counts::new(&quick_stats, &quick_acts));
            let mut slow = f.clone();
            let mut pkt = Packet::new(VirtioNetHdr::default(), &mut slow);
            let kept = apply(&l, &mut pkt, Counts::new(&slow_stats, &slow_acts));
            prop_assert_eq!(flags, kept.then_some(pkt.hdr.flags));
            prop_assert_eq!(&quick, &slow);
            prop_assert_eq!(quick_stats.csum_updated.get(), slow_stats.csum_updated.get());
            prop_assert_eq!(quick_stats.csum_failed.get(), slow_stats.csum_failed.get());
            let counted = |a: &[ActionStats]| -> Vec<(u64, u64, u64)> {
                a.iter().map(|c| (c.matched.get(), c.passed.get(), c.dropped.get())).collect()
            };
            prop_assert_eq!(counted(&quick_acts), counted(&slow_acts));

            // A locked list (`--csum-rules locked`) does the same on both paths, and counts
            // each frame under its lock.
            let locked = ActionList::locked(l.actions.clone());
            let (locked_stats, locked_acts) = (QueueStats::default(), action_slots(l.len()));
            let mut one = f.clone();
            let counts = Counts::new(&locked_stats, &locked_acts);
            prop_assert_eq!(locked.apply_plain(&mut BurstFrame::new(&mut one), &counts), flags);
            let mut two = f.clone();
            let mut pkt = Packet::new(VirtioNetHdr::default(), &mut two);
            prop_assert_eq!(locked.apply(&mut pkt, counts), kept);
            prop_assert_eq!(&one, &quick);
            prop_assert_eq!(&two, &quick);
            let twice: Vec<_> = counted(&quick_acts).iter().map(|&(m, p, d)| (2 * m, 2 * p, 2 * d)).collect();
            prop_assert_eq!(counted(&locked_acts), twice);
            let shared = locked.contended.as_deref().map(|c| {
                let s = crate::sync::lock(&c.0);
                (s.frames, s.bytes)
            });
            prop_assert_eq!(shared, Some((2, 2 * f.len() as u64)));
        }
    }
}
