//! The pipeline's live configuration: immutable snapshots that workers read without a lock
//! and the control path replaces whole (read-copy-update through `ArcSwap`).

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::capture::Capture;
use super::csum_action::{ActionList, CsumAction, Dir, NO_SLOT};
use super::router::{NextHop, Route, RouteTable, RouterIf};
use crate::stats::{Tallies, ACTION_SLOTS};

/// Checksum actions the daemon holds at most. Each is matched in turn on its port and
/// direction, and every edit copies the whole set (read-copy-update): a cap keeps both
/// bounded whatever the command line or `ctl` asks.
pub const MAX_ACTIONS: usize = ACTION_SLOTS;

/// Static routes the daemon holds at most (looked up by prefix length, not in turn; each
/// edit still copies the table).
pub const MAX_ROUTES: usize = 4096;

/// A rule that names a port (`--csum-action port=N`, `--router-ip N=`, `--route
/// ...,port=N`). Checked in one place against the ports there are, at start
/// (config.rs) and for `ctl` edits (control/server.rs).
pub trait NamesPort: std::fmt::Display {
    fn port(&self) -> Option<usize>;

    /// The port it names, if that is not one of `nports`.
    fn missing_port(&self, nports: usize) -> Option<usize> {
        self.port().filter(|&p| p >= nports)
    }
}

impl NamesPort for CsumAction {
    fn port(&self) -> Option<usize> {
        Some(self.port)
    }
}

impl NamesPort for RouterIf {
    fn port(&self) -> Option<usize> {
        Some(self.port)
    }
}

impl NamesPort for Route {
    fn port(&self) -> Option<usize> {
        match self.hop {
            NextHop::Port(p) => Some(p),
            NextHop::Via(_) => None,
        }
    }
}

/// One snapshot. Workers load it per packet; nothing in it is written after publication.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// Checksum actions in the order they run.
    pub actions: Vec<CsumAction>,
    /// Router interfaces and routes (neighbours live apart: pipeline/router/neigh.rs).
    pub router: RouteTable,
    /// Bumped by every published change: route caches keyed on it drop stale entries.
    generation: u64,
    /// `actions` split by port and direction, so a port without actions costs one
    /// bounds-checked index per packet.
    by_port: Vec<[ActionList; 2]>,
    /// Each port's armed capture, if any (`ctl capture`).
    captures: Vec<Option<Arc<Capture>>>,
    /// Whether any port has one: frames then take the general path, where the hooks are.
    capturing: bool,
    /// `--csum-rules locked`: each port's lists behind a lock ([`ActionList::locked`]).
    locked_actions: bool,
}

/// What [`Rules::actions_for`] lends for a port it does not know.
static NO_ACTIONS: ActionList = ActionList::EMPTY;

impl Rules {
    pub fn new(nports: usize, actions: Vec<CsumAction>) -> Self {
        Self::with_router(nports, actions, RouteTable::default())
    }

    pub fn with_router(nports: usize, actions: Vec<CsumAction>, router: RouteTable) -> Self {
        let mut r = Rules {
            actions,
            router,
            generation: 1,
            by_port: vec![Default::default(); nports],
            captures: vec![None; nports],
            capturing: false,
            locked_actions: false,
        };
        r.index();
        r
    }

    /// The same rules, every list of actions run under a lock of its own and counted in
    /// statistics all workers share (`--csum-rules locked`, the seed's "before").
    pub fn with_locked_actions(mut self) -> Self {
        self.locked_actions = true;
        self.index();
        self
    }

    /// Indexes the snapshot for the workers; returns the action slots it gave out, whose
    /// counts start again.
    fn index(&mut self) -> Vec<u16> {
        self.router.reindex();
        let fresh = self.give_slots();
        let mut split: Vec<[Vec<CsumAction>; 2]> = vec![Default::default(); self.by_port.len()];
        for a in &self.actions {
            if let Some(slot) = split.get_mut(a.port) {
                slot[a.dir.index()].push(a.clone());
            }
        }
        let list = if self.locked_actions {
            ActionList::locked
        } else {
            ActionList::new
        };
        self.by_port = split.into_iter().map(|dirs| dirs.map(list)).collect();
        fresh
    }

    /// Gives each action without a counting slot the lowest free one (at most
    /// [`MAX_ACTIONS`] actions, so there is always one); returns the slots given.
    fn give_slots(&mut self) -> Vec<u16> {
        let mut used = [false; ACTION_SLOTS];
        for a in &self.actions {
            if let Some(u) = used.get_mut(usize::from(a.slot)) {
                *u = true;
            }
        }
        let mut fresh = Vec::new();
        for a in self.actions.iter_mut().filter(|a| a.slot == NO_SLOT) {
            let Some(s) = used.iter().position(|u| !u) else {
                break;
            };
            used[s] = true;
            // Below ACTION_SLOTS, which fits in a u16.
            a.slot = s as u16;
            fresh.push(a.slot);
        }
        fresh
    }

    pub fn actions(&self) -> &[CsumAction] {
        &self.actions
    }

    pub fn actions_for(&self, port: usize, dir: Dir) -> &ActionList {
        self.by_port.get(port).map_or(&NO_ACTIONS, |s| &s[dir.index()])
    }

    pub fn nports(&self) -> usize {
        self.by_port.len()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Port `port`'s armed capture.
    #[inline]
    pub fn capture(&self, port: usize) -> Option<&Capture> {
        self.captures.get(port)?.as_deref()
    }

    /// Port `port`'s armed capture, after one test of [`Rules::capturing`]: what the
    /// switch asks per frame.
    #[inline]
    pub fn capture_of(&self, port: usize) -> Option<&Capture> {
        if self.capturing {
            self.capture(port)
        } else {
            None
        }
    }

    /// Whether any port is being captured.
    #[inline]
    pub fn capturing(&self) -> bool {
        self.capturing
    }

    /// Arms `capture` on its port, or disarms the port's (`None`); false, having done
    /// nothing, for a port there is not.
    pub fn set_capture(&mut self, port: usize, capture: Option<Arc<Capture>>) -> bool {
        match self.captures.get_mut(port) {
            Some(slot) => {
                *slot = capture;
                self.capturing = self.captures.iter().any(Option::is_some);
                true
            }
            None => false,
        }
    }
}

/// The published snapshot plus a writer lock, so concurrent edits (`ctl` clients) do not
/// lose each other's changes. Readers never take it.
#[derive(Debug, Default)]
pub struct LiveRules {
    current: ArcSwap<Rules>,
    writer: Mutex<()>,
    /// Where the actions are counted: an action added takes a slot whose counts restart.
    tallies: Option<Arc<Tallies>>,
}

impl LiveRules {
    pub fn new(rules: Rules) -> Self {
        LiveRules {
            current: ArcSwap::from_pointee(rules),
            writer: Mutex::new(()),
            tallies: None,
        }
    }

    /// The same, the actions counted in `tallies`.
    pub fn counted(rules: Rules, tallies: Arc<Tallies>) -> Self {
        LiveRules {
            tallies: Some(tallies),
            ..Self::new(rules)
        }
    }

    /// A lock-free read of the current snapshot.
    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<Rules>> {
        self.current.load()
    }

    /// Copies the snapshot, lets `edit` change the copy's actions and router tables, and
    /// publishes it with the next generation if `edit` succeeds. Packets in flight finish
    /// with the snapshot they loaded.
    pub fn update<E>(&self, edit: impl FnOnce(&mut Rules) -> Result<(), E>) -> Result<(), E> {
        let _w = crate::sync::lock(&self.writer);
        let mut next = Rules::clone(&self.current.load_full());
        edit(&mut next)?;
        next.generation += 1;
        let fresh = next.index();
        if let Some(t) = &self.tallies {
            for slot in fresh {
                t.restart_action(slot);
            }
        }
        self.current.store(Arc::new(next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each action takes the lowest free counting slot; one deleted frees its slot, and
    /// the action added next counts from zero there, whatever the slot counted before.
    #[test]
    fn actions_take_free_slots_and_a_new_one_counts_from_zero() {
        let act = |s: &str| s.parse::<CsumAction>().unwrap();
        let (udp, tcp, iph) = (
            act("port=0,dir=egress,update=udp"),
            act("port=1,dir=egress,update=tcp"),
            act("port=1,dir=ingress,update=iph"),
        );
        let tallies = Tallies::new(2, 1);
        let live = LiveRules::counted(Rules::new(2, vec![udp.clone(), tcp.clone()]), tallies.clone());
        let slots = |live: &LiveRules| live.load().actions().iter().map(|a| a.slot).collect::<Vec<_>>();
        assert_eq!(slots(&live), [0, 1]);
        let worker = tallies.register();
        for _ in 0..5 {
            worker.counts(0, 0).action(0).unwrap().matched.inc();
        }
        worker.counts(1, 0).action(1).unwrap().passed.inc();
        assert_eq!(tallies.action(0).matched, 5);
        let edit = |f: &dyn Fn(&mut Vec<CsumAction>)| {
            live.update(|r| {
                f(&mut r.actions);
                Ok::<_, ()>(())
            })
            .unwrap()
        };
        edit(&|a| a.retain(|x| *x != udp));
        edit(&|a| a.push(iph.clone()));
        assert_eq!(slots(&live), [1, 0]);
        assert_eq!(
            tallies.action(0),
            Default::default(),
            "the new action starts at zero"
        );
        assert_eq!(tallies.action(1).passed, 1, "the one kept keeps its counts");
        // A worker that ends leaves its counts in the totals.
        worker.counts(1, 0).action(0).unwrap().matched.inc();
        drop(worker);
        assert_eq!(tallies.action(0).matched, 1);
    }

    #[test]
    fn index_and_live_update() {
        let a: CsumAction = "port=1,dir=egress,update=udp".parse().unwrap();
        let live = LiveRules::new(Rules::new(2, vec![a.clone()]));
        let before = live.current.load_full();
        assert_eq!(&**before.actions_for(1, Dir::Egress), std::slice::from_ref(&a));
        assert!(before.actions_for(1, Dir::Ingress).is_empty());
        assert!(before.actions_for(7, Dir::Egress).is_empty());
        live.update(|r| {
            r.actions.clear();
            Ok::<_, ()>(())
        })
        .unwrap();
        // The old snapshot is unchanged for whoever still holds it.
        assert_eq!(before.actions().len(), 1);
        assert!(live.load().actions_for(1, Dir::Egress).is_empty());
        assert_eq!(live.load().generation(), before.generation() + 1);
        // A failed edit publishes nothing.
        assert!(live
            .update(|r| {
                r.actions.push(a.clone());
                Err("no")
            })
            .is_err());
        assert!(live.load().actions().is_empty());
        assert_eq!(live.load().generation(), before.generation() + 1);
    }
}
