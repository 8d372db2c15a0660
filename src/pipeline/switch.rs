//! The in-process L2 switch that joins ports: unicast to the learned port, unknown unicast,
//! broadcast and multicast flooded to every other port.

use std::sync::{Arc, OnceLock};

use log::trace;

use super::buffers::Buffers;
use super::csum_action::{self, ActionVerdict, Dir};
use super::fdb::{Fdb, Learned, DEFAULT_PORT_LIMIT};
use super::router::neigh::{NeighLearned, Neighbours, DEFAULT_NEIGH_LIMIT};
use super::router::{self, RouteCache, Step};
use super::rules::{LiveRules, Rules};
use crate::stats::{QueueStats, Tallies, Tally};
use crate::wire::layout::Layout;
use crate::wire::{EthernetFrame, MacAddr, VirtioNetHdr};

/// A frame in flight with its virtio-net header. The frame is mutable so an egress that must
/// complete a partial checksum can do it in place (and clear NEEDS_CSUM for those after it).
pub struct Packet<'a> {
    pub hdr: VirtioNetHdr,
    pub frame: &'a mut [u8],
    /// The frame's layers, parsed by the first stage that needs them and kept for the rest
    /// of the path (issue 17, "parse once"): a frame no stage looks into is never parsed.
    layout: Option<Layout>,
    /// The frame's bytes stay where they are, unchanged, until the sending thread's next
    /// [`Switch::flush`], so the port that gets it last may keep a pointer to them instead
    /// of a copy ([`Packet::pinned`]).
    pinned: bool,
}

impl<'a> Packet<'a> {
    pub fn new(hdr: VirtioNetHdr, frame: &'a mut [u8]) -> Self {
        Packet {
            hdr,
            frame,
            layout: None,
            pinned: false,
        }
    }

    /// A packet whose frame a port may hold by pointer until the sending thread flushes:
    /// a guest port then writes it into its ring from where it lies, without a copy into
    /// its stage (vhost_user/stage.rs). The switch hands it so only to the frame's last
    /// destination; the others of a flood get the frame as [`Packet::new`] makes it.
    ///
    /// # Safety
    ///
    /// Until this thread's next [`Switch::flush`] (of the switch it forwards through)
    /// returns, the bytes of `frame` must stay allocated, and nothing may write to them or
    /// take a `&mut` to them but this packet and what it is handed to.
    #[allow(unsafe_code)]
    pub unsafe fn pinned(hdr: VirtioNetHdr, frame: &'a mut [u8]) -> Self {
        Packet {
            pinned: true,
            ..Packet::new(hdr, frame)
        }
    }

    /// Whether the frame may be held by pointer until the sending thread's next flush
    /// (see [`Packet::pinned`]): set only while the packet goes to its last destination.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The frame's layout, parsed at the first call. What the pipeline rewrites in place
    /// (MACs, TTL, addresses, checksums) never moves a layer (wire/layout.rs); debug builds
    /// check that against a fresh parse on every call.
    #[inline]
    pub fn layout(&mut self) -> Layout {
        debug_assert!(
            self.layout.is_none_or(|l| l == Layout::parse(self.frame)),
            "a rewrite moved a layer of the frame"
        );
        if let Some(l) = self.layout {
            return l;
        }
        let l = Layout::parse(self.frame);
        self.layout = Some(l);
        l
    }

    /// This packet with its frame copied into `buf`: the same header, and the layout
    /// already found.
    pub fn copy_into<'b>(&self, buf: &'b mut Vec<u8>) -> Packet<'b> {
        buf.clear();
        buf.extend_from_slice(self.frame);
        Packet {
            hdr: self.hdr,
            frame: buf,
            layout: self.layout,
            pinned: false,
        }
    }
}

/// Something a port can be sent to.
pub trait Egress: Send + Sync {
    /// Hands one frame to the port. `flow` selects the queue; what happens to the frame is
    /// counted in `tally`, the sending worker's own counters. A port that must cut a GSO
    /// frame into segments builds them in `segment`, the sending worker's buffer.
    fn send(&self, tally: &Tally, flow: usize, pkt: &mut Packet<'_>, segment: &mut Vec<u8>);

    /// Finishes what `send` may defer to the end of a burst: a guest port checks once
    /// whether its driver wants an interrupt for every frame written since, instead of once
    /// per frame, and guest ports write out the frames they staged. `tally` is the
    /// flushing worker's, the one its `send`s counted on. Every worker that forwards calls
    /// [`Switch::flush`] after a burst.
    fn flush(&self, _tally: &Tally) {}
}

/// Frames a worker forwards before it flushes the ports it wrote to, even when its burst
/// goes on: Linux vhost-net signals its used entries in batches of VHOST_NET_BATCH (64)
/// too, so a receiving guest never waits for a whole burst.
pub const FLUSH_BATCH: usize = 64;

/// The worker a frame enters through: its port, its queue, and what that worker owns (its
/// counters, its route cache).
pub struct Ingress<'a> {
    pub port: usize,
    pub queue: usize,
    pub tally: &'a Tally,
    pub routes: &'a mut RouteCache,
    pub bufs: &'a mut Buffers,
}

impl Ingress<'_> {
    /// The counters of the queue the frame came in on.
    pub fn stats(&self) -> &QueueStats {
        self.tally.at(self.port, self.queue)
    }
}

/// Where a delivery is counted, which snapshot it follows, and the sending worker's
/// buffers for a copy and for segments.
struct Out<'a> {
    rules: &'a Rules,
    tally: &'a Tally,
    flow: usize,
    copy: &'a mut Vec<u8>,
    segment: &'a mut Vec<u8>,
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
    ports: Vec<OnceLock<Arc<dyn Egress>>>,
    fdb: Fdb,
    neigh: Neighbours,
    rules: LiveRules,
    tallies: Arc<Tallies>,
}

/// Runs a port's actions for one direction, counting on `stats`; false if the frame drops.
fn apply(actions: &[csum_action::CsumAction], pkt: &mut Packet<'_>, stats: &QueueStats) -> bool {
    match csum_action::run(actions, pkt) {
        (ActionVerdict::Untouched, _) => true,
        (ActionVerdict::Updated, _) => {
            stats.csum_updated.inc();
            true
        }
        (ActionVerdict::Drop, why) => {
            stats.csum_failed.inc();
            trace!("checksum action drops a frame: {why:?}");
            false
        }
    }
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
        Switch {
            ports: (0..rules.nports()).map(|_| OnceLock::new()).collect(),
            fdb: Fdb::new(rules.nports(), DEFAULT_PORT_LIMIT),
            neigh: Neighbours::new(rules.nports(), DEFAULT_NEIGH_LIMIT),
            tallies: Tallies::new(rules.nports(), queues),
            rules: LiveRules::new(rules),
        }
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
        if let Some(slot) = self.ports.get(id) {
            let _ = slot.set(egress);
        }
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

    /// Completes every port's deferred work (see [`Egress::flush`]): called by each worker
    /// after a burst of [`Switch::forward`]s, at least every [`FLUSH_BATCH`] frames.
    pub fn flush(&self, tally: &Tally) {
        for p in self.ports.iter().filter_map(OnceLock::get) {
            p.flush(tally);
        }
    }

    /// Sends one frame where it goes. Guest ports defer their interrupts: the caller calls
    /// [`Switch::flush`] after its burst.
    pub fn forward(&self, from: &mut Ingress<'_>, pkt: &mut Packet<'_>) -> Forwarded {
        self.forward_by(&self.rules.load(), from, pkt)
    }

    /// [`Switch::forward`] by the rules `rules`, a snapshot the caller took for its batch
    /// ([`LiveRules::load`]). Each snapshot swaps its pointer into a debt slot with SeqCst
    /// (arc-swap 1.9, `debt/fast.rs`): a full barrier that waits for every store before it,
    /// here the guest's ring lines, so a worker takes one per batch, not one per frame. A
    /// batch forwarded by the rules of its start is as if it had come a batch earlier.
    pub fn forward_by(&self, rules: &Rules, from: &mut Ingress<'_>, pkt: &mut Packet<'_>) -> Forwarded {
        let src = from.port;
        let ingress = rules.actions_for(src, Dir::Ingress);
        if !ingress.is_empty() && !apply(ingress, pkt, from.stats()) {
            return Forwarded::Dropped;
        }
        let Ok(eth) = EthernetFrame::new_checked(&*pkt.frame) else {
            return Forwarded::Dropped;
        };
        let (mut dst, smac): (MacAddr, MacAddr) = (eth.dst(), eth.src());
        if self.fdb.learn(&smac, src) == Learned::Refused {
            // Still forwarded; replies to it are flooded until an entry of the port's
            // changes.
            from.stats().fdb_refused.inc();
        }
        let mut routed = false;
        let Buffers {
            originated,
            egress_copy,
            segment,
        } = &mut *from.bufs;
        let mut out = Out {
            rules,
            tally: from.tally,
            flow: from.queue,
            copy: egress_copy,
            segment,
        };
        if rules.router.enabled() {
            let at = router::Lookup {
                table: &rules.router,
                neigh: &self.neigh,
                generation: router::cache_generation(rules.generation(), self.neigh.generation()),
            };
            let stats = from.tally.at(src, from.queue);
            let r = router::handle(&at, src, pkt.frame, from.routes, originated, stats);
            if let Some((ip, mac)) = r.learn {
                if self.neigh.learn(ip, mac, src) == NeighLearned::Refused {
                    stats.neigh_refused.inc();
                }
            }
            match r.step {
                Step::Switch => {}
                Step::Done => return Forwarded::Routed,
                Step::Emit { port } => {
                    self.send_to(&mut out, port, originated);
                    return Forwarded::Routed;
                }
                Step::Bounce { port } => {
                    if let Some(p) = self.ports.get(port).and_then(OnceLock::get) {
                        self.deliver(&mut out, port, &**p, pkt, false);
                    }
                    return Forwarded::Routed;
                }
                Step::Routed => {
                    routed = true;
                    dst = MacAddr::from_slice(pkt.frame).unwrap_or(dst);
                }
            }
        }
        if dst.is_unicast() {
            if let Some(to) = self.fdb.lookup(&dst) {
                // A routed packet may leave by the port it came in on (both subnets there).
                if to == src && !routed {
                    return Forwarded::Dropped;
                }
                if let Some(p) = self.ports.get(to).and_then(OnceLock::get) {
                    self.deliver(&mut out, to, &**p, pkt, false);
                    return Forwarded::Unicast(to);
                }
            }
        }
        self.flood(&mut out, src, pkt);
        Forwarded::Flooded
    }

    /// Delivers to every attached port but `src`; the last one gets the frame itself, the
    /// others a copy.
    fn flood(&self, out: &mut Out<'_>, src: usize, pkt: &mut Packet<'_>) {
        let last = (0..self.ports.len())
            .rev()
            .find(|&i| i != src && self.ports[i].get().is_some());
        for (i, p) in self.ports.iter().enumerate() {
            if i != src {
                if let Some(p) = p.get() {
                    self.deliver(out, i, &**p, pkt, Some(i) != last);
                }
            }
        }
    }

    /// Sends a frame the switch originated (router replies) to one port.
    fn send_to(&self, out: &mut Out<'_>, port: usize, frame: &mut [u8]) {
        if let Some(p) = self.ports.get(port).and_then(OnceLock::get) {
            let mut pkt = Packet::new(VirtioNetHdr::default(), frame);
            self.deliver(out, port, &**p, &mut pkt, false);
        }
    }

    /// Sends to one port through its egress actions. `shared`: other ports get the same
    /// frame after this one, so actions work on a copy.
    fn deliver(&self, out: &mut Out<'_>, id: usize, p: &dyn Egress, pkt: &mut Packet<'_>, shared: bool) {
        let (tally, flow) = (out.tally, out.flow);
        let actions = out.rules.actions_for(id, Dir::Egress);
        if actions.is_empty() {
            // A port after this one gets the same bytes: this one must not keep them.
            let pinned = pkt.pinned;
            pkt.pinned = pinned && !shared;
            p.send(tally, flow, pkt, out.segment);
            pkt.pinned = pinned;
            return;
        }
        // Counted on the egress port's queue, in the delivering worker's tally.
        let stats = tally.at(id, flow);
        if !shared {
            if apply(actions, pkt, stats) {
                p.send(tally, flow, pkt, out.segment);
            }
            return;
        }
        let mut copy = pkt.copy_into(out.copy);
        if apply(actions, &mut copy, stats) {
            p.send(tally, flow, &mut copy, out.segment);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::TallyHandle;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Sink {
        got: Mutex<Vec<Vec<u8>>>,
        /// Whether each frame came pinned.
        pinned: Mutex<Vec<bool>>,
    }

    impl Egress for Sink {
        fn send(&self, _tally: &Tally, _flow: usize, pkt: &mut Packet<'_>, _segment: &mut Vec<u8>) {
            self.got.lock().unwrap().push(pkt.frame.to_vec());
            self.pinned.lock().unwrap().push(pkt.is_pinned());
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
        bufs: Buffers,
    }

    impl<'a> Worker<'a> {
        fn new(sw: &'a Switch) -> Self {
            Worker {
                sw,
                tally: sw.tallies().register(),
                routes: RouteCache::default(),
                bufs: Buffers::default(),
            }
        }

        fn send(&mut self, port: usize, pkt: &mut Packet<'_>) -> Forwarded {
            let mut from = Ingress {
                port,
                queue: 0,
                tally: &self.tally,
                routes: &mut self.routes,
                bufs: &mut self.bufs,
            };
            self.sw.forward(&mut from, pkt)
        }

        fn go(&mut self, port: usize, mut f: Vec<u8>) -> Forwarded {
            self.send(port, &mut Packet::new(VirtioNetHdr::default(), &mut f))
        }

        /// [`Worker::go`] with the frame pinned; says whether it still is after.
        #[allow(unsafe_code)]
        fn go_pinned(&mut self, port: usize, mut f: Vec<u8>) -> (Forwarded, bool) {
            // SAFETY: `f` lives, untouched, until after this call; no sink keeps a pointer.
            let mut pkt = unsafe { Packet::pinned(VirtioNetHdr::default(), &mut f) };
            (self.send(port, &mut pkt), pkt.is_pinned())
        }
    }

    /// Two stations the switch tests send between.
    const A: &str = "02:00:00:00:00:0a";
    const B: &str = "02:00:00:00:00:0b";

    /// Only a frame's last destination may hold it by pointer until the flush: the ports
    /// before it in a flood get it unpinned (the last may rewrite it in place), and so does
    /// every port when the sender did not pin it. The sender's packet is as it was after.
    #[test]
    fn only_the_last_destination_gets_a_pinned_frame() {
        let sw = Switch::new(4);
        let sinks = plug(&sw);
        let mut w = Worker::new(&sw);
        let pins = |s: &Sink| s.pinned.lock().unwrap().clone();
        assert_eq!(w.go_pinned(0, frame(B, A)), (Forwarded::Flooded, true));
        assert_eq!(
            sinks.iter().map(|s| pins(s)).collect::<Vec<_>>(),
            vec![vec![], vec![false], vec![false], vec![true]]
        );
        // B is learned on port 2; a unicast to it is pinned.
        assert_eq!(w.go(2, frame(A, B)), Forwarded::Unicast(0));
        assert_eq!(w.go_pinned(0, frame(B, A)), (Forwarded::Unicast(2), true));
        assert_eq!(pins(&sinks[2]), vec![false, true]);
        assert_eq!(pins(&sinks[0]), vec![false]);
        // Not pinned by its sender: no port gets it pinned.
        assert_eq!(w.go(1, frame("ff:ff:ff:ff:ff:ff", A)), Forwarded::Flooded);
        assert_eq!(
            sinks.iter().map(|s| pins(s)).collect::<Vec<_>>(),
            vec![
                vec![false, false],
                vec![false],
                vec![false, true, false],
                vec![true, false]
            ]
        );
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
            arp::build(
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
            arp::build(
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

            // A route change moves the generation: the next packet misses once.
            sw.rules()
                .update(|r| {
                    r.router
                        .routes
                        .push("192.168.0.0/16,via=10.2.0.2".parse().unwrap());
                    Ok::<_, ()>(())
                })
                .unwrap();
            go(0, udp_to(b_ip.octets(), 64));
            assert_eq!(st.at(0, 0).route_cache_miss.get(), 3);
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
            use crate::wire::ndp;
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
            ndp::solicit(&mut ns, A, &a_ip, &ip6("fd00:1::1"));
            assert_eq!(go(0, ns), Forwarded::Routed);
            let na = last(&sinks[0]);
            let n = ndp::parse_neighbour(na[21], &na[54..]).unwrap();
            assert_eq!(
                (n.kind, n.target, n.lla),
                (ndp::NEIGHBOR_ADVERT, ip6("fd00:1::1"), Some(ROUTER_MAC))
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
            assert_eq!(ndp::parse_neighbour(sol[21], &sol[54..]).unwrap().target, b_ip);
            assert_eq!(st.at(0, 0).route_unresolved.get(), 1);
            // B advertises itself to the router; then A's packet is routed, hop limit 63.
            let mut na = Vec::new();
            ndp::advert(&mut na, B, &b_ip, (ROUTER_MAC, ip6("fd00:2::1")));
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
                (ndp::TIME_EXCEEDED, &ip6("fd00:1::1").octets()[..])
            );
            // No route: unreachable.
            let mut lost = pkt.clone();
            lost[38..54].copy_from_slice(&ip6("fd00:9::1").octets());
            go(0, lost);
            assert_eq!(
                (last(&sinks[0])[54], st.at(0, 0).route_unreachable.get()),
                (ndp::DEST_UNREACHABLE, 1)
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
