//! The in-process L2 switch that joins ports: unicast to the learned port, unknown unicast,
//! broadcast and multicast flooded to every other port.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use log::trace;

use super::csum_action::{self, Dir, Verdict};
use super::fdb::Fdb;
use super::rules::{LiveRules, Rules};
use crate::stats::QueueStats;
use crate::wire::{EthernetFrame, MacAddr, VirtioNetHdr};

/// A frame in flight with its virtio-net header. The frame is mutable so an egress that must
/// complete a partial checksum can do it in place (and clear NEEDS_CSUM for those after it).
pub struct Packet<'a> {
    pub hdr: VirtioNetHdr,
    pub frame: &'a mut [u8],
}

/// Something a port can be sent to.
pub trait Egress: Send + Sync {
    /// Hands one frame to the port. `flow` selects the queue; the port counts what it drops.
    fn send(&self, flow: usize, pkt: &mut Packet<'_>);

    /// The counters of the queue `flow` is sent on: egress actions count there.
    fn queue_stats(&self, flow: usize) -> &QueueStats;
}

/// The worker a frame enters through: its port, its queue, and that queue's counters.
pub struct Ingress<'a> {
    pub port: usize,
    pub queue: usize,
    pub stats: &'a QueueStats,
}

/// Where a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Unicast(usize),
    Flooded,
    /// The destination is the port it came from, a runt, or an action dropped it.
    Dropped,
}

thread_local! {
    /// A flooded frame that one port's egress actions rewrite is copied here first, so the
    /// other ports get it as it entered. Grows once per thread, then is reused.
    static EGRESS_COPY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

pub struct Switch {
    ports: Vec<OnceLock<Arc<dyn Egress>>>,
    fdb: Fdb,
    rules: LiveRules,
}

/// Runs a port's actions for one direction, counting on `stats`; false if the frame drops.
fn apply(actions: &[csum_action::CsumAction], pkt: &mut Packet<'_>, stats: &QueueStats) -> bool {
    match csum_action::run(actions, &mut pkt.hdr, pkt.frame) {
        (Verdict::Untouched, _) => true,
        (Verdict::Updated, _) => {
            stats.csum_updated.inc();
            true
        }
        (Verdict::Drop, why) => {
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
        Switch {
            ports: (0..rules.nports()).map(|_| OnceLock::new()).collect(),
            fdb: Fdb::default(),
            rules: LiveRules::new(rules),
        }
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

    pub fn forward(&self, from: &Ingress<'_>, pkt: &mut Packet<'_>) -> Forwarded {
        let rules = self.rules.load();
        let src = from.port;
        let ingress = rules.actions_for(src, Dir::Ingress);
        if !ingress.is_empty() && !apply(ingress, pkt, from.stats) {
            return Forwarded::Dropped;
        }
        let Ok(eth) = EthernetFrame::new_checked(&*pkt.frame) else {
            return Forwarded::Dropped;
        };
        let (dst, smac): (MacAddr, MacAddr) = (eth.dst(), eth.src());
        self.fdb.learn(&smac, src);
        if dst.is_unicast() {
            if let Some(out) = self.fdb.lookup(&dst) {
                if out == src {
                    return Forwarded::Dropped;
                }
                if let Some(p) = self.ports.get(out).and_then(OnceLock::get) {
                    self.deliver(&rules, out, &**p, from.queue, pkt, false);
                    return Forwarded::Unicast(out);
                }
            }
        }
        let last = (0..self.ports.len())
            .rev()
            .find(|&i| i != src && self.ports[i].get().is_some());
        for (i, p) in self.ports.iter().enumerate() {
            if i != src {
                if let Some(p) = p.get() {
                    self.deliver(&rules, i, &**p, from.queue, pkt, Some(i) != last);
                }
            }
        }
        Forwarded::Flooded
    }

    /// Sends to one port through its egress actions. `shared`: other ports get the same
    /// frame after this one, so actions work on a copy.
    fn deliver(
        &self,
        rules: &Rules,
        id: usize,
        p: &dyn Egress,
        flow: usize,
        pkt: &mut Packet<'_>,
        shared: bool,
    ) {
        let actions = rules.actions_for(id, Dir::Egress);
        if actions.is_empty() {
            p.send(flow, pkt);
            return;
        }
        let stats = p.queue_stats(flow);
        if !shared {
            if apply(actions, pkt, stats) {
                p.send(flow, pkt);
            }
            return;
        }
        EGRESS_COPY.with(|cell| {
            let mut owned;
            let mut borrowed;
            // Re-entry cannot happen today (no egress forwards); if it ever does, allocate
            // rather than panic.
            let buf: &mut Vec<u8> = match cell.try_borrow_mut() {
                Ok(b) => {
                    borrowed = b;
                    &mut borrowed
                }
                Err(_) => {
                    owned = Vec::new();
                    &mut owned
                }
            };
            buf.clear();
            buf.extend_from_slice(pkt.frame);
            let mut copy = Packet {
                hdr: pkt.hdr,
                frame: buf,
            };
            if apply(actions, &mut copy, stats) {
                p.send(flow, &mut copy);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Sink {
        got: Mutex<Vec<Vec<u8>>>,
        stats: QueueStats,
    }

    impl Egress for Sink {
        fn send(&self, _flow: usize, pkt: &mut Packet<'_>) {
            self.got.lock().unwrap().push(pkt.frame.to_vec());
        }
        fn queue_stats(&self, _flow: usize) -> &QueueStats {
            &self.stats
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

    fn send(sw: &Switch, port: usize, stats: &QueueStats, mut f: Vec<u8>) -> Forwarded {
        let from = Ingress {
            port,
            queue: 0,
            stats,
        };
        sw.forward(
            &from,
            &mut Packet {
                hdr: VirtioNetHdr::default(),
                frame: &mut f,
            },
        )
    }

    fn counts(sinks: &[Arc<Sink>]) -> Vec<usize> {
        sinks.iter().map(|s| s.got.lock().unwrap().len()).collect()
    }

    #[test]
    fn learns_then_unicasts_and_floods_the_rest() {
        let sw = Switch::new(3);
        let sinks = plug(&sw);
        let st = QueueStats::default();
        let a = "02:00:00:00:00:0a";
        let b = "02:00:00:00:00:0b";
        // Unknown destination: flooded to ports 1 and 2, never back to 0.
        assert_eq!(send(&sw, 0, &st, frame(b, a)), Forwarded::Flooded);
        assert_eq!(counts(&sinks), vec![0, 1, 1]);
        // b answers from port 2: a is known on 0, so only port 0 gets it.
        assert_eq!(send(&sw, 2, &st, frame(a, b)), Forwarded::Unicast(0));
        assert_eq!(counts(&sinks), vec![1, 1, 1]);
        // Broadcast floods; a frame for a station on its own port is dropped; so is a runt.
        assert_eq!(
            send(&sw, 0, &st, frame("ff:ff:ff:ff:ff:ff", a)),
            Forwarded::Flooded
        );
        assert_eq!(
            send(&sw, 0, &st, frame(a, "02:00:00:00:00:0c")),
            Forwarded::Dropped
        );
        assert_eq!(send(&sw, 0, &st, vec![0u8; 5]), Forwarded::Dropped);
    }

    /// A broadcast UDP frame whose IPv4 header checksum is wrong.
    fn bad_iph_frame() -> Vec<u8> {
        let mut f = frame("ff:ff:ff:ff:ff:ff", "02:00:00:00:00:0a");
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
        let st = QueueStats::default();
        assert_eq!(send(&sw, 0, &st, bad_iph_frame()), Forwarded::Flooded);
        let fixed = &sinks[1].got.lock().unwrap()[0];
        assert_eq!(crate::wire::checksum::checksum(&fixed[14..34]), 0);
        assert_eq!(&sinks[2].got.lock().unwrap()[0], &bad_iph_frame());
        assert_eq!(sinks[1].stats.csum_updated.get(), 1);
        assert_eq!(sinks[2].stats.csum_updated.get(), 0);
        assert_eq!(st.csum_updated.get(), 0);
    }

    #[test]
    fn ingress_action_failure_drops_and_counts_and_rules_change_live() {
        let sw = Switch::new(2);
        let sinks = plug(&sw);
        let st = QueueStats::default();
        let mut lying = bad_iph_frame();
        lying[16..18].copy_from_slice(&900u16.to_be_bytes());
        // No actions: the lying frame goes through untouched.
        assert_eq!(send(&sw, 0, &st, lying.clone()), Forwarded::Flooded);
        sw.rules()
            .update(|a| {
                a.push("port=0,dir=ingress,update=iph+udp".parse().unwrap());
                Ok::<_, ()>(())
            })
            .unwrap();
        assert_eq!(send(&sw, 0, &st, lying), Forwarded::Dropped);
        assert_eq!((st.csum_failed.get(), st.csum_updated.get()), (1, 0));
        assert_eq!(send(&sw, 0, &st, bad_iph_frame()), Forwarded::Flooded);
        assert_eq!(st.csum_updated.get(), 1);
        assert_eq!(counts(&sinks), vec![0, 2]);
    }
}
