//! The in-process L2 switch that joins ports: unicast to the learned port, unknown unicast,
//! broadcast and multicast flooded to every other port; checksum actions on the way in and
//! out, and the router between them when one is configured.

use std::sync::Arc;

use arrayvec::ArrayVec;

use super::capture::{Fate, Way};
use super::csum_action::Dir;
use super::fdb::{Fdb, FdbCache, Learned, DEFAULT_PORT_LIMIT};
use super::outbox::{Admitted, Egress, Outbox, OutboxBuffers, Ports, Refused, RUN_FRAMES};
use super::packet::{BurstFrame, Packet};
use super::router::neigh::{NeighLearned, Neighbours, DEFAULT_NEIGH_LIMIT};
use super::router::{self, RouteCache, SharedRouteCache, Step};
use super::rules::{LiveRules, Rules};
use crate::stats::{Counts, QueueStats, Tallies, Tally};
use crate::wire::{ethernet, EthernetFrame, MacAddr, VirtioNetHdr};

/// The worker a frame enters through: its port, its queue, and what that worker owns (its
/// counters, its route cache, the buffer the router builds its own frames in).
pub struct Ingress<'a> {
    pub port: usize,
    pub queue: usize,
    pub tally: &'a Tally,
    pub routes: &'a mut RouteCache,
    /// The worker's last source learned and destination looked up.
    pub fdb: &'a mut FdbCache,
    /// A frame the router originates: an ARP or ND answer or request, an ICMP error.
    pub originated: &'a mut Vec<u8>,
}

impl Ingress<'_> {
    /// The counters of the queue the frame came in on.
    pub fn stats(&self) -> &QueueStats {
        self.tally.at(self.port, self.queue)
    }

    /// What the port's ingress actions count on.
    pub fn counts(&self) -> Counts<'_> {
        self.tally.counts(self.port, self.queue)
    }
}

/// Where a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Unicast(usize),
    Flooded,
    /// The destination is the port it came from, a runt, or an action dropped it.
    Dropped,
    /// The router took it: answered, learned from, or dropped with a reason it counted.
    Routed,
}

pub struct Switch {
    ports: Ports,
    fdb: Fdb,
    neigh: Neighbours,
    rules: LiveRules,
    tallies: Arc<Tallies>,
    /// Whether plain frames may take the burst path ([`Switch::plain_destination`]).
    burst: bool,
    /// `--route-cache shared`: one cache for all workers instead of each its own.
    shared_routes: Option<SharedRouteCache>,
}

impl Switch {
    pub fn new(nports: usize) -> Self {
        Self::with_rules(Rules::new(nports, Vec::new()))
    }

    pub fn with_rules(rules: Rules) -> Self {
        Self::with_queues(rules, 1)
    }

    /// A switch whose ports have `queues` queues each (counters are kept per queue).
    pub fn with_queues(rules: Rules, queues: usize) -> Self {
        let tallies = Tallies::new(rules.nports(), queues);
        Switch {
            ports: Ports::new(rules.nports()),
            fdb: Fdb::new(rules.nports(), DEFAULT_PORT_LIMIT),
            neigh: Neighbours::new(rules.nports(), DEFAULT_NEIGH_LIMIT),
            rules: LiveRules::counted(rules, tallies.clone()),
            tallies,
            burst: true,
            shared_routes: None,
        }
    }

    /// The same switch with every frame forwarded by the general path: what the burst path
    /// is checked against (tests/burst.rs).
    pub fn general_only(mut self) -> Self {
        self.burst = false;
        self
    }

    /// Every worker routes through one shared, locked cache (`--route-cache shared`, the
    /// seed's "before" to measure the per-queue caches against).
    pub fn with_shared_route_cache(mut self) -> Self {
        self.shared_routes = Some(SharedRouteCache::default());
        self
    }

    /// Each port may hold at most `limit` learned addresses (`--fdb-limit`).
    pub fn with_fdb_limit(mut self, limit: usize) -> Self {
        self.fdb = Fdb::new(self.ports.len(), limit);
        self
    }

    /// Each port may hold at most `limit` router neighbours (`--neigh-limit`).
    pub fn with_neigh_limit(mut self, limit: usize) -> Self {
        self.neigh = Neighbours::new(self.ports.len(), limit);
        self
    }

    /// Learned stations a port may hold (`--fdb-limit`).
    pub fn fdb_limit(&self) -> usize {
        self.fdb.limit()
    }

    /// The router's neighbours.
    pub fn neighbours(&self) -> &Neighbours {
        &self.neigh
    }

    /// Every worker's counters: register a worker with it, sum a port's counters from it.
    pub fn tallies(&self) -> &Arc<Tallies> {
        &self.tallies
    }

    /// Plugs `egress` in as port `id`; each port is attached once, at start-up.
    pub fn attach(&self, id: usize, egress: Arc<dyn Egress>) {
        self.ports.attach(id, egress);
    }

    /// Port `id`, once attached.
    fn port(&self, id: usize) -> Option<&Arc<dyn Egress>> {
        self.ports.get(id)
    }

    /// An empty outbox for a worker to forward into: it writes to this switch's ports and
    /// counts in `tally`, the worker's counters, with the worker's `bufs`.
    pub fn outbox<'a>(&'a self, tally: &'a Tally, bufs: &'a mut OutboxBuffers) -> Outbox<'a> {
        Outbox::new(&self.ports, tally, bufs)
    }

    pub fn fdb(&self) -> &Fdb {
        &self.fdb
    }

    pub fn rules(&self) -> &LiveRules {
        &self.rules
    }

    pub fn nports(&self) -> usize {
        self.ports.len()
    }

    /// Sends one frame where it goes, by `rules`, a snapshot the caller took for its whole
    /// batch ([`LiveRules::load`]): each load swaps a pointer into a debt slot with SeqCst
    /// (arc-swap 1.9, `debt/fast.rs`), a full barrier, so a worker takes one per batch. A
    /// batch forwarded by the rules of its start is as if it had come a moment earlier.
    ///
    /// The frame is queued in `out`, lent to its last destination and copied for the
    /// others (outbox.rs); it is written when `out` is flushed or dropped.
    pub fn forward<'a>(
        &self,
        rules: &Rules,
        from: &mut Ingress<'_>,
        mut pkt: Packet<'a>,
        out: &mut Outbox<'a>,
    ) -> Forwarded {
        let src = from.port;
        let ingress = rules.actions_for(src, Dir::Ingress);
        // A capture records the frame as sent: before the port's ingress actions.
        let capture = rules.capture_of(src);
        let sent = capture.and_then(|c| c.take(Way::Sent, pkt.frame));
        if !ingress.apply(&mut pkt, from.counts()) {
            if let (Some(c), Some(rec)) = (capture, sent) {
                c.put(rec, Fate::IngressAction);
            }
            return Forwarded::Dropped;
        }
        if let (Some(c), Some(rec)) = (capture, sent) {
            c.put(rec, Fate::Passed);
        }
        let Ok(eth) = EthernetFrame::new_checked(&*pkt.frame) else {
            return Forwarded::Dropped;
        };
        let (mut dst, smac): (MacAddr, MacAddr) = (eth.dst(), eth.src());
        if from.fdb.learn(&self.fdb, &smac, src) == Learned::Refused {
            // Still forwarded; replies to it are flooded until an entry of the port's
            // changes.
            from.stats().fdb_refused.inc();
        }
        let mut routed = false;
        if rules.router.enabled() {
            match self.route(rules, from, &mut pkt, out) {
                Step::Switch => {}
                Step::Routed => {
                    routed = true;
                    dst = MacAddr::from_slice(pkt.frame).unwrap_or(dst);
                }
                Step::Bounce { port } => {
                    self.unicast(rules, out, port, from.queue, pkt);
                    return Forwarded::Routed;
                }
                Step::Done | Step::Emit { .. } => return Forwarded::Routed,
            }
        }
        if dst.is_unicast() {
            if let Some(to) = from.fdb.lookup(&self.fdb, &dst) {
                // A routed packet may leave by the port it came in on (both subnets there).
                if to == src && !routed {
                    return Forwarded::Dropped;
                }
                if self.port(to).is_some() {
                    self.unicast(rules, out, to, from.queue, pkt);
                    return Forwarded::Unicast(to);
                }
            }
        }
        self.flood(rules, out, src, from.queue, pkt);
        Forwarded::Flooded
    }

    /// Whether frames may take the burst path ([`Switch::plain_destination`]); false for
    /// the switch `general_only` makes. Asked once per batch.
    pub fn burst_path(&self) -> bool {
        self.burst
    }

    /// The burst path's question for a frame from `from` whose header asks for nothing
    /// (the caller checked it, and [`Switch::burst_path`]): the port it goes to, when that
    /// is one learned port other than its own, attached, and the router (if configured)
    /// would only switch the frame ([`router::switches_only`]). The sender's ingress
    /// actions then run on the frame, as [`Switch::forward`] runs them first (a checksum
    /// action moves no MAC and no EtherType, so the answers before stay the same), and the
    /// source is learned as `forward` learns it; the frame is the caller's to hand to a
    /// [`Run`]. `None`: nothing was done, and the frame takes [`Switch::forward`].
    ///
    /// The destination is looked up before the source is learned, where `forward` learns
    /// first: with the two addresses different (checked), a learn changes only the
    /// source's own entry, so the answer is the same.
    #[inline]
    pub fn plain_destination(
        &self,
        rules: &Rules,
        from: &mut Ingress<'_>,
        frame: &mut BurstFrame<'_>,
    ) -> Option<Plain> {
        let head = frame.head();
        let (dst, smac) = (MacAddr::from_slice(head)?, MacAddr::from_slice(head.get(6..)?)?);
        if head.len() < ethernet::HEADER_LEN || !dst.is_unicast() || dst == smac {
            return None;
        }
        if rules.router.enabled() && !router::switches_only(head) {
            return None;
        }
        let src = from.port;
        let to = from.fdb.lookup(&self.fdb, &dst)?;
        if to == src || self.port(to).is_none() {
            return None;
        }
        let ingress = rules.actions_for(src, Dir::Ingress);
        let mut flags = 0;
        if !ingress.is_empty() {
            let mut pkt = Packet::new(VirtioNetHdr::default(), frame.bytes());
            // A frame an ingress action drops is not learned from (`forward`).
            if !ingress.apply(&mut pkt, from.counts()) {
                return Some(Plain::Dropped);
            }
            flags = pkt.hdr.flags;
        }
        if from.fdb.learn(&self.fdb, &smac, src) == Learned::Refused {
            from.stats().fdb_refused.inc();
        }
        Some(Plain::To(Dest { port: to, flags }))
    }

    /// Writes a run of frames [`Switch::plain_destination`] sent to port `to`, through
    /// `to`'s egress actions, after what `out` holds (so a port gets its frames in the order
    /// they came). A port that cannot take them this way ([`Egress::write_plain`]) has them
    /// queued in `out` as `forward` would have queued them.
    fn write_run<'a>(
        &self,
        rules: &Rules,
        from: &Ingress<'_>,
        to: usize,
        frames: &mut ArrayVec<BurstFrame<'a>, RUN_FRAMES>,
        out: &mut Outbox<'a>,
    ) {
        let Some(port) = self.port(to) else {
            frames.clear();
            return;
        };
        if !out.is_empty() {
            out.flush();
        }
        let actions = rules.actions_for(to, Dir::Egress);
        if port
            .write_plain(from.tally, from.queue, frames, actions)
            .is_some()
        {
            frames.clear();
            return;
        }
        for f in frames.drain(..) {
            self.unicast(
                rules,
                out,
                to,
                from.queue,
                Packet::new(VirtioNetHdr::default(), f.into_bytes()),
            );
        }
    }

    /// The router's part: what to do with the frame next ([`Step`]). A frame the router
    /// originates is queued here, and the step is then `Done`.
    fn route(
        &self,
        rules: &Rules,
        from: &mut Ingress<'_>,
        pkt: &mut Packet<'_>,
        out: &mut Outbox<'_>,
    ) -> Step {
        let src = from.port;
        let at = router::Lookup {
            table: &rules.router,
            neigh: &self.neigh,
            generation: router::cache_generation(rules.generation(), self.neigh.generation()),
            shared: self.shared_routes.as_ref(),
        };
        let stats = from.tally.at(src, from.queue);
        let r = router::handle(&at, src, pkt.frame, from.routes, from.originated, stats);
        if let Some((ip, mac)) = r.learn {
            if self.neigh.learn(ip, mac, src) == NeighLearned::Refused {
                stats.neigh_refused.inc();
            }
        }
        if let Step::Emit { port } = r.step {
            let mut pkt = Packet::new(VirtioNetHdr::default(), from.originated);
            if let Some(adm) = self.admit(rules, out, port, from.queue, &pkt) {
                self.queue_copy(rules, out, port, from.queue, adm, &mut pkt);
            }
            return Step::Done;
        }
        r.step
    }

    /// Port `to`'s admission of `pkt`, if the port exists and takes it; a port being
    /// captured records a refusal and its reason.
    fn admit(
        &self,
        rules: &Rules,
        out: &Outbox<'_>,
        to: usize,
        flow: usize,
        pkt: &Packet<'_>,
    ) -> Option<Admitted> {
        match self.port(to)?.admit(out.tally(), flow, pkt.frame) {
            Ok(adm) => Some(adm),
            Err(why) => {
                if let Some(c) = rules.capture_of(to) {
                    let fate = match why {
                        Refused::Address => Fate::FilterAddress,
                        Refused::Vlan => Fate::FilterVlan,
                        Refused::Report => Fate::SnoopedReport,
                    };
                    c.record(Way::Offered, fate, pkt.frame);
                }
                None
            }
        }
    }

    /// Sends `pkt` to one port, which gets the frame itself.
    fn unicast<'a>(&self, rules: &Rules, out: &mut Outbox<'a>, to: usize, flow: usize, pkt: Packet<'a>) {
        if let Some(adm) = self.admit(rules, out, to, flow, &pkt) {
            self.queue_lent(rules, out, to, flow, adm, pkt);
        }
    }

    /// Sends `pkt` to every attached port but `src` that admits it: the last of them gets
    /// the frame itself, the others a copy each.
    fn flood<'a>(&self, rules: &Rules, out: &mut Outbox<'a>, src: usize, flow: usize, mut pkt: Packet<'a>) {
        let mut pending: Option<(usize, Admitted)> = None;
        for to in (0..self.ports.len()).filter(|&i| i != src) {
            let Some(adm) = self.admit(rules, out, to, flow, &pkt) else {
                continue;
            };
            if let Some((before, adm)) = pending.replace((to, adm)) {
                self.queue_copy(rules, out, before, flow, adm, &mut pkt);
            }
        }
        if let Some((last, adm)) = pending {
            self.queue_lent(rules, out, last, flow, adm, pkt);
        }
    }

    /// Queues the frame itself for `to`, through `to`'s egress actions.
    fn queue_lent<'a>(
        &self,
        rules: &Rules,
        out: &mut Outbox<'a>,
        to: usize,
        flow: usize,
        adm: Admitted,
        mut pkt: Packet<'a>,
    ) {
        let actions = rules.actions_for(to, Dir::Egress);
        // Counted on the egress port's queue, in the delivering worker's tally.
        let kept = actions.apply(&mut pkt, out.tally().counts(to, flow));
        if let Some(c) = rules.capture_of(to) {
            c.record(Way::Offered, offered(adm, kept), pkt.frame);
        }
        if kept {
            out.lend(to, flow, adm, pkt);
        }
    }

    /// Queues a copy of the frame for `to`, `to`'s egress actions run on the copy: the
    /// frame stays as it entered for the ports after `to`.
    fn queue_copy(
        &self,
        rules: &Rules,
        out: &mut Outbox<'_>,
        to: usize,
        flow: usize,
        adm: Admitted,
        pkt: &mut Packet<'_>,
    ) {
        let actions = rules.actions_for(to, Dir::Egress);
        let counts = out.tally().counts(to, flow);
        // The layers is found once, for every copy and the frame itself.
        if !actions.is_empty() {
            pkt.layers();
        }
        let capture = rules.capture_of(to);
        out.copy(to, flow, adm, pkt, |copy| {
            let kept = actions.apply(copy, counts);
            if let Some(c) = capture {
                c.record(Way::Offered, offered(adm, kept), copy.frame);
            }
            kept
        });
    }
}

/// What a capture of the receiving port says of a frame it admitted: whether its egress
/// actions `kept` it, and whether a hash bucket took it by chance.
fn offered(adm: Admitted, kept: bool) -> Fate {
    if !kept {
        Fate::EgressAction
    } else if adm == Admitted::HASH_FALSE_POSITIVE {
        Fate::HashFalsePositive
    } else {
        Fate::Passed
    }
}

/// Where the burst path sends a frame: the port, and the header flags the sender's ingress
/// actions left on it (DATA_VALID, or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    pub port: usize,
    pub flags: u8,
}

/// What [`Switch::plain_destination`] did with a frame it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain {
    To(Dest),
    /// An ingress action dropped it (counted there).
    Dropped,
}

/// The frames the burst path sends to one port, in the order they came
/// ([`Switch::plain_destination`]), lent from the worker's arena as an outbox holds its
/// frames: written ([`Switch::write_run`]) when a frame goes to another port or by the
/// general path, when full, and at the end of the worker's batch, before the batch's
/// chains are returned to the sender (a frame's rest is still in the sender's buffer).
#[derive(Default)]
pub struct Run<'a> {
    to: usize,
    frames: ArrayVec<BurstFrame<'a>, RUN_FRAMES>,
}

impl<'a> Run<'a> {
    /// Adds `frame`, for `to`, writing the frames before it first if they go elsewhere. A
    /// frame an ingress action marked DATA_VALID carries a header of its own: it is queued
    /// in `out` after the run, as `forward` queues a frame for one port.
    #[inline]
    pub fn push(
        &mut self,
        switch: &Switch,
        rules: &Rules,
        from: &Ingress<'_>,
        to: Dest,
        frame: BurstFrame<'a>,
        out: &mut Outbox<'a>,
    ) {
        if to.flags != 0 {
            self.write(switch, rules, from, out);
            let hdr = VirtioNetHdr {
                flags: to.flags,
                ..VirtioNetHdr::default()
            };
            let pkt = Packet::new(hdr, frame.into_bytes());
            switch.unicast(rules, out, to.port, from.queue, pkt);
            return;
        }
        if self.to != to.port || self.frames.is_full() {
            self.write(switch, rules, from, out);
            self.to = to.port;
        }
        self.frames.push(frame);
    }

    /// Writes the run's frames, if any.
    pub fn write(&mut self, switch: &Switch, rules: &Rules, from: &Ingress<'_>, out: &mut Outbox<'a>) {
        if !self.frames.is_empty() {
            switch.write_run(rules, from, self.to, &mut self.frames, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::outbox::{OutboxBuffers, PortFrames};
    use crate::stats::TallyHandle;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Sink {
        got: Mutex<Vec<Vec<u8>>>,
        /// Where each frame's bytes lay when the port wrote it.
        at: Mutex<Vec<usize>>,
    }

    impl Egress for Sink {
        fn write(&self, _tally: &Tally, frames: &mut PortFrames<'_, '_>, _segment: &mut Vec<u8>) -> usize {
            let mut n = 0;
            while let Some(f) = frames.next() {
                self.got.lock().unwrap().push(f.pkt.frame.to_vec());
                self.at.lock().unwrap().push(f.pkt.frame.as_ptr() as usize);
                n += 1;
            }
            n
        }
    }

    fn frame(dst: &str, src: &str) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst.parse::<MacAddr>().unwrap().0);
        f.extend_from_slice(&src.parse::<MacAddr>().unwrap().0);
        f.extend_from_slice(&[0x08, 0x00, 0x45]);
        f
    }

    fn plug(sw: &Switch) -> Vec<Arc<Sink>> {
        let sinks: Vec<Arc<Sink>> = (0..sw.nports()).map(|_| Arc::new(Sink::default())).collect();
        for (i, s) in sinks.iter().enumerate() {
            sw.attach(i, s.clone());
        }
        sinks
    }

    /// One worker: its tally, its route cache and its buffers, kept across the frames it
    /// forwards.
    struct Worker<'a> {
        sw: &'a Switch,
        tally: TallyHandle,
        routes: RouteCache,
        fdb: FdbCache,
        originated: Vec<u8>,
        outbox: OutboxBuffers,
    }

    impl<'a> Worker<'a> {
        fn new(sw: &'a Switch) -> Self {
            Worker {
                sw,
                tally: sw.tallies().register(),
                routes: RouteCache::default(),
                fdb: FdbCache::default(),
                originated: Vec::new(),
                outbox: OutboxBuffers::default(),
            }
        }

        /// Forwards `f` from `port` and writes what it queued.
        fn go_in(&mut self, port: usize, f: &mut [u8]) -> Forwarded {
            let mut out = self.sw.outbox(&self.tally, &mut self.outbox);
            let mut from = Ingress {
                port,
                queue: 0,
                tally: &self.tally,
                routes: &mut self.routes,
                fdb: &mut self.fdb,
                originated: &mut self.originated,
            };
            let rules = self.sw.rules().load();
            self.sw.forward(
                &rules,
                &mut from,
                Packet::new(VirtioNetHdr::default(), f),
                &mut out,
            )
        }

        fn go(&mut self, port: usize, mut f: Vec<u8>) -> Forwarded {
            self.go_in(port, &mut f)
        }
    }

    /// Two stations the switch tests send between.
    const A: &str = "02:00:00:00:00:0a";
    const B: &str = "02:00:00:00:00:0b";

    /// A frame's last destination writes it from where the worker holds it; the ports
    /// before it in a flood get copies (the last may rewrite the frame in place).
    #[test]
    fn only_the_last_destination_gets_the_frame_itself() {
        let sw = Switch::new(4);
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        let at = |s: &Sink| s.at.lock().unwrap().clone();
        let mut f = frame(B, A);
        let here = f.as_ptr() as usize;
        assert_eq!(w.go_in(0, &mut f), Forwarded::Flooded);
        assert_eq!(
            sinks.iter().map(|s| at(s) == [here]).collect::<Vec<_>>(),
            [false, false, false, true]
        );
        assert!(at(&sinks[1]).len() == 1 && at(&sinks[2]).len() == 1);
        // B is learned on port 2; a unicast to it is the frame itself.
        assert_eq!(w.go(2, frame(A, B)), Forwarded::Unicast(0));
        let mut f = frame(B, A);
        let here = f.as_ptr() as usize;
        assert_eq!(w.go_in(0, &mut f), Forwarded::Unicast(2));
        assert_eq!(at(&sinks[2]).last(), Some(&here));
    }

    fn counts(sinks: &[Arc<Sink>]) -> Vec<usize> {
        sinks.iter().map(|s| s.got.lock().unwrap().len()).collect()
    }

    #[test]
    fn learns_then_unicasts_and_floods_the_rest() {
        let sw = Switch::new(3);
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        // Unknown destination: flooded to ports 1 and 2, never back to 0.
        assert_eq!(w.go(0, frame(B, A)), Forwarded::Flooded);
        assert_eq!(counts(&sinks), vec![0, 1, 1]);
        // B answers from port 2: A is known on 0, so only port 0 gets it.
        assert_eq!(w.go(2, frame(A, B)), Forwarded::Unicast(0));
        assert_eq!(counts(&sinks), vec![1, 1, 1]);
        // Broadcast floods; a frame for a station on its own port is dropped; so is a runt.
        assert_eq!(w.go(0, frame("ff:ff:ff:ff:ff:ff", A)), Forwarded::Flooded);
        assert_eq!(w.go(0, frame(A, "02:00:00:00:00:0c")), Forwarded::Dropped);
        assert_eq!(w.go(0, vec![0u8; 5]), Forwarded::Dropped);
    }

    /// A broadcast UDP frame whose IPv4 header checksum is wrong.
    fn bad_iph_frame() -> Vec<u8> {
        let mut f = frame("ff:ff:ff:ff:ff:ff", A);
        f.pop();
        f.extend_from_slice(&[
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0xde, 0xad, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        f.extend_from_slice(&[0, 1, 0, 2, 0, 8, 0, 0]);
        f
    }

    #[test]
    fn egress_action_rewrites_only_its_own_copy_of_a_flood() {
        let rules = Rules::new(3, vec!["port=1,dir=egress,update=iph".parse().unwrap()]);
        let sw = Switch::with_rules(rules);
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        assert_eq!(w.go(0, bad_iph_frame()), Forwarded::Flooded);
        let fixed = &sinks[1].got.lock().unwrap()[0];
        assert_eq!(crate::wire::checksum::checksum(&fixed[14..34]), 0);
        assert_eq!(&sinks[2].got.lock().unwrap()[0], &bad_iph_frame());
        // Counted on the egress port, in the sending worker's tally.
        let updated = |p: usize| sw.tallies().port(p)[0].csum_updated;
        assert_eq!((updated(0), updated(1), updated(2)), (0, 1, 0));
    }

    #[test]
    fn ingress_action_failure_drops_and_counts_and_rules_change_live() {
        let sw = Switch::new(2);
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        let mut lying = bad_iph_frame();
        lying[16..18].copy_from_slice(&900u16.to_be_bytes());
        // No actions: the lying frame goes through untouched.
        assert_eq!(w.go(0, lying.clone()), Forwarded::Flooded);
        sw.rules()
            .update(|r| {
                r.actions
                    .push("port=0,dir=ingress,update=iph+udp".parse().unwrap());
                Ok::<_, ()>(())
            })
            .unwrap();
        assert_eq!(w.go(0, lying), Forwarded::Dropped);
        let st = w.tally.share();
        let c = st.at(0, 0);
        assert_eq!((c.csum_failed.get(), c.csum_updated.get()), (1, 0));
        assert_eq!(w.go(0, bad_iph_frame()), Forwarded::Flooded);
        assert_eq!(c.csum_updated.get(), 1);
        assert_eq!(counts(&sinks), vec![0, 2]);
    }

    #[test]
    fn a_capture_sees_what_its_port_sent_and_was_offered_with_each_fate() {
        use crate::pipeline::capture::{Capture, Fate, Way, Ways};
        let sw = Switch::new(3);
        sw.attach(1, Arc::new(crate::pipeline::capture::tests::UnicastOnly));
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        let arm = |c: Option<Arc<Capture>>| {
            sw.rules().update(|r| {
                assert!(r.set_capture(1, c));
                Ok::<_, ()>(())
            })
        };
        // Not armed: nothing recorded, and rules say so.
        assert!(!sw.rules().load().capturing());
        let cap = Arc::new(Capture::new(1, Ways::BOTH, 64));
        arm(Some(cap.clone())).unwrap();
        assert!(sw.rules().load().capturing());
        // Port 1 egress action that drops a lying IPv4 header.
        sw.rules()
            .update(|r| {
                r.actions
                    .push("port=1,dir=egress,update=iph+udp".parse().unwrap());
                Ok::<_, ()>(())
            })
            .unwrap();
        // Not IP: the action lets it be.
        let raw = |dst, src| {
            let mut f = frame(dst, src);
            f.truncate(12);
            f.extend_from_slice(&[0x88, 0xb5, 0]);
            f
        };
        let uni = raw("02:00:00:00:00:01", "02:00:00:00:00:0a");
        w.go(0, uni.clone());
        w.go(1, raw("02:00:00:00:00:0a", "02:00:00:00:00:01"));
        w.go(0, raw("01:00:5e:00:00:07", "02:00:00:00:00:0a"));
        let mut lying = bad_iph_frame();
        lying[16..18].copy_from_slice(&900u16.to_be_bytes());
        // Unicast, not learned: flooded to port 1, whose filter takes it.
        lying[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0x33]);
        w.go(2, lying);
        // An unknown destination: flooded, port 1 among the rest.
        w.go(0, raw("02:00:00:00:00:0b", "02:00:00:00:00:0a"));
        let got: Vec<(Way, Fate, Vec<u8>)> = std::iter::from_fn(|| cap.next())
            .map(|r| (r.way, r.fate, r.data))
            .collect();
        let kinds: Vec<(Way, Fate)> = got.iter().map(|g| (g.0, g.1)).collect();
        assert_eq!(
            kinds,
            [
                (Way::Offered, Fate::Passed),
                (Way::Sent, Fate::Passed),
                (Way::Offered, Fate::FilterAddress),
                (Way::Offered, Fate::EgressAction),
                (Way::Offered, Fate::Passed),
            ]
        );
        assert_eq!(got[0].2, uni);
        // Disarmed: the switch no longer records (port 1 learned its address meanwhile).
        arm(None).unwrap();
        assert!(!sw.rules().load().capturing());
        assert_eq!(w.go(0, uni), Forwarded::Unicast(1));
        assert!(cap.next().is_none());
        assert_eq!(counts(&sinks)[2], 3);
    }

    mod routing {
        use super::*;
        use crate::pipeline::router::{RouteTable, ROUTER_MAC};
        use crate::wire::arp::{self, ArpPacket};
        use crate::wire::checksum::checksum;
        use crate::wire::ip::Ipv4Packet;
        use std::net::Ipv4Addr;

        const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
        const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);

        fn router() -> (Switch, Vec<Arc<Sink>>) {
            let table = RouteTable::new(
                vec!["0=10.1.0.1/24".parse().unwrap(), "1=10.2.0.1/24".parse().unwrap()],
                Vec::new(),
            );
            let sw = Switch::with_rules(Rules::with_router(3, Vec::new(), table));
            let sinks = plug(&sw);
            (sw, sinks)
        }

        fn udp_to(dst: [u8; 4], ttl: u8) -> Vec<u8> {
            let mut f = ROUTER_MAC.0.to_vec();
            f.extend_from_slice(&A.0);
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0, 0, 32, 0, 1, 0, 0, ttl, 17, 0, 0, 10, 1, 0, 2];
            ip.extend_from_slice(&dst);
            let c = checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
            f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 12, 0, 0, b'p', b'i', b'n', b'g']);
            f
        }

        fn last(s: &Sink) -> Vec<u8> {
            s.got.lock().unwrap().last().cloned().unwrap_or_default()
        }

        #[test]
        fn arp_then_route_with_a_per_queue_cache() {
            let (sw, sinks) = router();
            let mut w = Worker::new(&sw);
            let st = w.tally.share();
            let mut go = |port: usize, f: Vec<u8>| w.go(port, f);
            // A asks for its gateway: the router answers on port 0 and learns A.
            let mut req = Vec::new();
            let (a_ip, b_ip) = (Ipv4Addr::new(10, 1, 0, 2), Ipv4Addr::new(10, 2, 0, 2));
            arp::emit(
                &mut req,
                arp::OP_REQUEST,
                MacAddr::BROADCAST,
                (A, a_ip),
                (MacAddr::default(), Ipv4Addr::new(10, 1, 0, 1)),
            );
            assert_eq!(go(0, req), Forwarded::Routed);
            let reply = last(&sinks[0]);
            let a = ArpPacket::new_checked(&reply[14..]).unwrap();
            assert_eq!(
                (a.op(), a.sender_mac(), &reply[..6]),
                (arp::OP_REPLY, ROUTER_MAC, &A.0[..])
            );
            assert_eq!(sw.neighbours().get(&a_ip.into()), Some(A));

            // To B, not yet resolved: the router asks on port 1 and drops the packet.
            assert_eq!(go(0, udp_to(b_ip.octets(), 64)), Forwarded::Routed);
            let ask = last(&sinks[1]);
            let a = ArpPacket::new_checked(&ask[14..]).unwrap();
            assert_eq!(
                (a.op(), a.target_ip(), a.sender_ip()),
                (arp::OP_REQUEST, b_ip, Ipv4Addr::new(10, 2, 0, 1))
            );
            assert_eq!(
                (
                    st.at(0, 0).route_unresolved.get(),
                    st.at(0, 0).route_cache_miss.get()
                ),
                (1, 1)
            );
            // B answers; the reply is for the router and goes no further.
            let mut rep = Vec::new();
            arp::emit(
                &mut rep,
                arp::OP_REPLY,
                ROUTER_MAC,
                (B, b_ip),
                (ROUTER_MAC, Ipv4Addr::new(10, 2, 0, 1)),
            );
            let before = counts(&sinks);
            assert_eq!(go(1, rep), Forwarded::Routed);
            assert_eq!(counts(&sinks), before);

            // Now it routes: MAC rewrite, TTL 64 -> 63 with a valid header checksum.
            assert_eq!(go(0, udp_to(b_ip.octets(), 64)), Forwarded::Unicast(1));
            let out = last(&sinks[1]);
            assert_eq!((&out[..6], &out[6..12]), (&B.0[..], &ROUTER_MAC.0[..]));
            let ip = Ipv4Packet::new_checked(&out[14..]).unwrap();
            assert_eq!(ip.ttl(), 63);
            assert_eq!(checksum(&out[14..34]), 0);
            assert_eq!(
                (
                    st.at(0, 0).route_cache_miss.get(),
                    st.at(0, 0).route_cache_hit.get()
                ),
                (2, 0)
            );
            go(0, udp_to(b_ip.octets(), 64));
            assert_eq!(
                (
                    st.at(0, 0).route_cache_miss.get(),
                    st.at(0, 0).route_cache_hit.get(),
                    st.at(0, 0).routed.get()
                ),
                (2, 1, 2)
            );
        }

        /// A router that has learned A on port 0 and B on port 1.
        fn resolved<'a>(sw: &'a Switch) -> Worker<'a> {
            let mut w = Worker::new(sw);
            let (a_ip, b_ip) = (Ipv4Addr::new(10, 1, 0, 2), Ipv4Addr::new(10, 2, 0, 2));
            for (port, mac, ip, gw) in [(0, A, a_ip, [10, 1, 0, 1]), (1, B, b_ip, [10, 2, 0, 1])] {
                let mut rep = Vec::new();
                arp::emit(
                    &mut rep,
                    arp::OP_REPLY,
                    ROUTER_MAC,
                    (mac, ip),
                    (ROUTER_MAC, gw.into()),
                );
                assert_eq!(w.go(port, rep), Forwarded::Routed);
            }
            w
        }

        /// Per queue, each worker resolves B once, in its own cache; with `--route-cache
        /// shared`, what one worker resolved the next one finds.
        #[test]
        fn each_worker_caches_its_own_routes_unless_shared() {
            for shared in [false, true] {
                let (sw, _sinks) = router();
                let sw = if shared { sw.with_shared_route_cache() } else { sw };
                let b = Ipv4Addr::new(10, 2, 0, 2).octets();
                let mut first = resolved(&sw);
                let mut second = Worker::new(&sw);
                for w in [&mut first, &mut second] {
                    for _ in 0..2 {
                        assert_eq!(w.go(0, udp_to(b, 64)), Forwarded::Unicast(1));
                    }
                }
                let [one, two] = [&first, &second].map(|w| {
                    let q = w.tally.at(0, 0);
                    (q.route_cache_hit.get(), q.route_cache_miss.get())
                });
                assert_eq!(one, (1, 1), "shared: {shared}");
                assert_eq!(two, if shared { (2, 0) } else { (1, 1) }, "shared: {shared}");
            }
        }

        #[test]
        fn route_changes_ttl_and_unreachable_destinations() {
            let (sw, sinks) = router();
            let mut w = resolved(&sw);
            let st = w.tally.share();
            let b_ip = Ipv4Addr::new(10, 2, 0, 2);
            let mut go = |port: usize, f: Vec<u8>| w.go(port, f);
            assert_eq!(go(0, udp_to(b_ip.octets(), 64)), Forwarded::Unicast(1));
            // A route change moves the generation: the next packet misses once.
            let misses = st.at(0, 0).route_cache_miss.get();
            sw.rules()
                .update(|r| {
                    r.router
                        .routes
                        .push("192.168.0.0/16,via=10.2.0.2".parse().unwrap());
                    Ok::<_, ()>(())
                })
                .unwrap();
            go(0, udp_to(b_ip.octets(), 64));
            assert_eq!(st.at(0, 0).route_cache_miss.get(), misses + 1);
            assert_eq!(go(0, udp_to([192, 168, 3, 4], 64)), Forwarded::Unicast(1));
            assert_eq!(&last(&sinks[1])[..6], &B.0[..]);

            // TTL 1: time exceeded back to A, quoting the packet.
            assert_eq!(go(0, udp_to(b_ip.octets(), 1)), Forwarded::Routed);
            let err = last(&sinks[0]);
            assert_eq!((&err[..6], err[34], err[35]), (&A.0[..], 11, 0));
            assert_eq!(checksum(&err[34..]), 0);
            assert_eq!(&err[42..62], &udp_to(b_ip.octets(), 1)[14..34]);
            // No route: net unreachable.
            go(0, udp_to([8, 8, 8, 8], 64));
            assert_eq!(
                (
                    last(&sinks[0])[34],
                    st.at(0, 0).route_unreachable.get(),
                    st.at(0, 0).route_ttl_exceeded.get()
                ),
                (3, 1, 1)
            );
            // A ping to the router's far address is answered.
            let mut ping = udp_to([10, 2, 0, 1], 64);
            ping[23] = 1;
            ping[24..26].copy_from_slice(&[0, 0]);
            let c = checksum(&ping[14..34]);
            ping[24..26].copy_from_slice(&c.to_be_bytes());
            ping[34..42].copy_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]);
            let c = checksum(&ping[34..]);
            ping[36..38].copy_from_slice(&c.to_be_bytes());
            go(0, ping);
            let pong = last(&sinks[0]);
            assert_eq!(
                (pong[34], &pong[26..30], &pong[30..34]),
                (0, &[10, 2, 0, 1][..], &[10, 1, 0, 2][..])
            );
            assert_eq!((checksum(&pong[14..34]), checksum(&pong[34..])), (0, 0));
            // A corrupt header is dropped and counted, never routed.
            let mut bad = udp_to(b_ip.octets(), 64);
            bad[24] ^= 0xff;
            assert_eq!(go(0, bad), Forwarded::Routed);
            assert_eq!(st.at(0, 0).route_errors.get(), 1);
        }

        #[test]
        fn ipv6_neighbour_discovery_and_routing() {
            use crate::wire::icmpv6;
            use std::net::Ipv6Addr;
            let table = RouteTable::new(
                vec![
                    "0=fd00:1::1/64".parse().unwrap(),
                    "1=fd00:2::1/64".parse().unwrap(),
                ],
                Vec::new(),
            );
            let sw = Switch::with_rules(Rules::with_router(2, Vec::new(), table));
            let sinks = plug(&sw);
            let mut w = Worker::new(&sw);
            let st = w.tally.share();
            let mut go = |port: usize, f: Vec<u8>| w.go(port, f);
            let ip6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
            let (a_ip, b_ip) = (ip6("fd00:1::2"), ip6("fd00:2::2"));
            // A solicits its gateway: advertised back on port 0, and A is learned.
            let mut ns = Vec::new();
            icmpv6::solicit(&mut ns, A, &a_ip, &ip6("fd00:1::1"));
            assert_eq!(go(0, ns), Forwarded::Routed);
            let na = last(&sinks[0]);
            let n = icmpv6::parse_neighbour(na[21], &na[54..]).unwrap();
            assert_eq!(
                (n.kind, n.target, n.lla),
                (icmpv6::NEIGHBOR_ADVERT, ip6("fd00:1::1"), Some(ROUTER_MAC))
            );
            assert_eq!(&na[..6], &A.0[..]);
            assert_eq!(sw.neighbours().get(&a_ip.into()), Some(A));
            // A packet for B: the router solicits B on port 1 and drops it.
            let mut pkt = ROUTER_MAC.0.to_vec();
            pkt.extend_from_slice(&A.0);
            pkt.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, 17, 64]);
            pkt.extend_from_slice(&a_ip.octets());
            pkt.extend_from_slice(&b_ip.octets());
            pkt.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 8, 0, 0]);
            assert_eq!(go(0, pkt.clone()), Forwarded::Routed);
            let sol = last(&sinks[1]);
            assert_eq!(&sol[..3], &[0x33, 0x33, 0xff]);
            assert_eq!(icmpv6::parse_neighbour(sol[21], &sol[54..]).unwrap().target, b_ip);
            assert_eq!(st.at(0, 0).route_unresolved.get(), 1);
            // B advertises itself to the router; then A's packet is routed, hop limit 63.
            let mut na = Vec::new();
            icmpv6::advert(&mut na, B, &b_ip, (ROUTER_MAC, ip6("fd00:2::1")));
            assert_eq!(go(1, na), Forwarded::Routed);
            assert_eq!(go(0, pkt.clone()), Forwarded::Unicast(1));
            let out = last(&sinks[1]);
            assert_eq!(
                (&out[..6], &out[6..12], out[21]),
                (&B.0[..], &ROUTER_MAC.0[..], 63)
            );
            // Hop limit 1: time exceeded back to A, from the router's address on port 0.
            let mut expiring = pkt.clone();
            expiring[21] = 1;
            assert_eq!(go(0, expiring), Forwarded::Routed);
            let err = last(&sinks[0]);
            assert_eq!(
                (err[54], &err[22..38]),
                (icmpv6::TIME_EXCEEDED, &ip6("fd00:1::1").octets()[..])
            );
            // No route: unreachable.
            let mut lost = pkt.clone();
            lost[38..54].copy_from_slice(&ip6("fd00:9::1").octets());
            go(0, lost);
            assert_eq!(
                (last(&sinks[0])[54], st.at(0, 0).route_unreachable.get()),
                (icmpv6::DEST_UNREACHABLE, 1)
            );
            // A payload length past the frame: the router's error when sent to it, counted
            // and dropped; not its business otherwise (switched like any frame to B).
            let mut lying = pkt.clone();
            lying[18..20].copy_from_slice(&100u16.to_be_bytes());
            assert_eq!(go(0, lying.clone()), Forwarded::Routed);
            assert_eq!(st.at(0, 0).route_errors.get(), 1);
            lying[..6].copy_from_slice(&B.0);
            assert_eq!(go(0, lying), Forwarded::Unicast(1));
            assert_eq!(st.at(0, 0).route_errors.get(), 1);
        }
    }
}
