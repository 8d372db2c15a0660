//! The switch's burst path against its general path: the same batches of frames, from
//! ports and stations the input picks, forwarded by a switch that lets plain frames take the
//! burst path (`Switch::plain_destination`, `Run`) and by one that forwards every frame the
//! general way (`Switch::general_only`), as a TX worker does (ports/vhost_user/tx.rs).
//! The input's first byte picks the rules both switches run under: an egress and an
//! ingress checksum action on each port or not, the router on or not.
//! Invariant, asserted: every port receives the same frames in the same order, the tables
//! learn the same stations, and every counter is the same. Port 2 has no burst path of its
//! own, so its runs fall back to the outbox. The burst path's frames keep their bytes after
//! a cut in the sender's buffer, as a TX worker leaves a long frame's, so a decision taken
//! on bytes not yet copied out shows as a difference too.
#![no_main]

use std::sync::{Arc, Mutex};

use vm_memory::VolatileSlice;

use dpaa_vnic::pipeline::csum_action::ActionList;
use dpaa_vnic::pipeline::fdb::FdbCache;
use dpaa_vnic::pipeline::router::{RouteCache, RouteTable, RouterIf, ROUTER_MAC};
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::switch::Run;
use dpaa_vnic::pipeline::{
    Admitted, BurstFrame, Egress, Ingress, OutboxBuffers, Packet, Plain, PortFrames, Refused,
    Switch,
};
use dpaa_vnic::stats::Tally;
use dpaa_vnic::wire::{MacAddr, VirtioNetHdr};
use libfuzzer_sys::fuzz_target;

const PORTS: usize = 3;
const HDR: usize = 12;

/// A port that records what it is given, and refuses destinations whose last byte is a
/// multiple of three (counted as a receive filter counts).
struct Recorder {
    id: usize,
    plain: bool,
    got: Mutex<Vec<Vec<u8>>>,
}

impl Recorder {
    fn takes(&self, tally: &Tally, flow: usize, frame: &[u8]) -> bool {
        let ok = frame.get(5).is_none_or(|b| b % 3 != 0);
        if !ok {
            tally.at(self.id, flow).rx_filtered.inc();
        }
        ok
    }
}

impl Egress for Recorder {
    fn admit(&self, tally: &Tally, flow: usize, frame: &[u8]) -> Result<Admitted, Refused> {
        self.takes(tally, flow, frame).then(Admitted::default).ok_or(Refused::Address)
    }

    fn write(&self, _tally: &Tally, frames: &mut PortFrames<'_, '_>, _segment: &mut Vec<u8>) -> usize {
        let mut n = 0;
        while let Some(f) = frames.next() {
            self.got.lock().unwrap().push(f.pkt.frame.to_vec());
            n += 1;
        }
        n
    }

    fn write_plain(
        &self,
        tally: &Tally,
        flow: usize,
        frames: &mut [BurstFrame<'_>],
        actions: &ActionList,
    ) -> Option<usize> {
        if !self.plain {
            return None;
        }
        let mut n = 0;
        for f in frames.iter_mut() {
            if !self.takes(tally, flow, f.head()) {
                continue;
            }
            // As a guest port does (ports/vhost_user/rx.rs): the egress actions on each
            // frame the filter took.
            if !actions.is_empty() && actions.apply_plain(f, &tally.counts(self.id, flow)).is_none() {
                continue;
            }
            self.got.lock().unwrap().push(f.bytes().to_vec());
            n += 1;
        }
        Some(n)
    }
}

/// The stations the input picks from: one per port, a multicast and the broadcast address,
/// the router's.
fn station(pick: u8) -> MacAddr {
    match pick % 9 {
        6 => MacAddr([0x01, 0, 0x5e, 0, 0, 1]),
        7 => MacAddr::BROADCAST,
        8 => ROUTER_MAC,
        n => MacAddr([2, 0, 0, 0, 0, n + 1]),
    }
}

/// One frame from two input bytes: which header, which destination and source, what it
/// carries (bytes of no protocol, or UDP over IPv4 with checksums to rewrite), how long.
fn frame(i: usize, meta: u8, len: u8) -> Vec<u8> {
    let mut f = vec![0u8; HDR];
    if meta & 1 != 0 {
        // A header that asks for something: NEEDS_CSUM at offsets the frame may not have.
        f[0] = 1;
        f[6] = len / 2;
        f[8] = 6;
    }
    f.extend_from_slice(&station(meta >> 1).0);
    f.extend_from_slice(&station(meta >> 4).0);
    if meta & 0x80 != 0 {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 68, 0, 1, 0, 0, 64, 17, 0xde, 0xad]);
        f.extend_from_slice(&[198, 18, 0, 1, 198, 18, 1, 2, 0x30, 0x39, 0, 0x35, 0, 48, 0xbe, 0xef]);
    }
    f.extend((0..).map(|k: usize| (k + i) as u8).take(usize::from(len)));
    f.truncate(HDR + usize::from(len));
    f
}

/// The rules the first input byte asks for: bit N (0-2) an egress action on port N, bit 3
/// the router on 198.18.0.0/24 (port 0) and 198.18.1.0/24 (port 1), bit 4 + N an ingress
/// action on port N (0-2), bit 7 an egress action on port 1 that drops TCP (`verdict=drop`).
fn rules(pick: u8) -> Rules {
    let egress = (0..PORTS)
        .filter(|p| pick & (1 << p) != 0)
        .map(|p| format!("port={p},dir=egress,update=iph+udp"));
    let ingress = (0..PORTS)
        .filter(|p| pick & (1 << (4 + p)) != 0)
        .map(|p| format!("port={p},dir=ingress,update=iph+udp"));
    let dropping = (pick & 0x80 != 0)
        .then(|| "port=1,dir=egress,update=tcp,proto=tcp,verdict=drop".to_string());
    let actions = egress.chain(ingress).chain(dropping).map(|a| a.parse().unwrap()).collect();
    let ifaces: Vec<RouterIf> = if pick & 8 != 0 {
        vec!["0=198.18.0.254/24".parse().unwrap(), "1=198.18.1.254/24".parse().unwrap()]
    } else {
        Vec::new()
    };
    Rules::with_router(PORTS, actions, RouteTable::new(ifaces, Vec::new()))
}

/// Batches as the input cuts them: `[port, n, (meta, len) * n]` each.
fn batches(data: &[u8]) -> Vec<(usize, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut i = 0;
    while let [port, n, tail @ ..] = rest {
        let n = usize::from(*n % 33);
        let take = (2 * n).min(tail.len());
        let frames = tail[..take]
            .chunks_exact(2)
            .map(|p| {
                i += 1;
                frame(i, p[0], p[1])
            })
            .collect();
        out.push((usize::from(*port) % PORTS, frames));
        rest = &tail[take..];
    }
    out
}

/// Forwards every batch as a TX worker does; returns what each port got, what the table
/// holds for each station, and every counter.
fn drive(sw: Switch, input: &[(usize, Vec<Vec<u8>>)]) -> (Vec<Vec<Vec<u8>>>, Vec<Option<usize>>, String) {
    let sw = Arc::new(sw);
    let ports: Vec<Arc<Recorder>> = (0..PORTS)
        .map(|id| {
            let r = Arc::new(Recorder {
                id,
                plain: id != 2,
                got: Mutex::new(Vec::new()),
            });
            sw.attach(id, r.clone());
            r
        })
        .collect();
    let tally = sw.tallies().register();
    let (mut routes, mut fdb, mut originated) = (RouteCache::default(), FdbCache::default(), Vec::new());
    let mut bufs = OutboxBuffers::default();
    for (port, batch) in input {
        let mut frames = batch.clone();
        // The sender's buffers, which a frame's rest is copied from (tx.rs).
        let mut sent = batch.clone();
        let mut out = sw.outbox(&tally, &mut bufs);
        let mut from = Ingress {
            port: *port,
            queue: 0,
            tally: &tally,
            routes: &mut routes,
            fdb: &mut fdb,
            originated: &mut originated,
        };
        let rules = sw.rules().load();
        let burst = sw.burst_path();
        let mut run = Run::default();
        for (f, s) in frames.iter_mut().zip(sent.iter_mut()) {
            let (hdr, frame) = f.split_at_mut(HDR);
            let mut frame = burst_frame(frame, &mut s[HDR..]);
            if burst && VirtioNetHdr::asks_nothing(hdr) {
                match sw.plain_destination(&rules, &mut from, &mut frame) {
                    Some(Plain::To(to)) => {
                        run.push(&sw, &rules, &from, to, frame, &mut out);
                        continue;
                    }
                    Some(Plain::Dropped) => continue,
                    None => {}
                }
            }
            run.write(&sw, &rules, &from, &mut out);
            let Ok(h) = VirtioNetHdr::parse(hdr, HDR) else {
                continue;
            };
            sw.forward(&rules, &mut from, Packet::new(h, frame.into_bytes()), &mut out);
        }
        run.write(&sw, &rules, &from, &mut out);
    }
    let got = ports.iter().map(|p| p.got.lock().unwrap().clone()).collect();
    let learned = (0..8).map(|s| sw.fdb().lookup(&station(s))).collect();
    let stats = format!(
        "{:?}",
        (0..PORTS).map(|p| sw.tallies().port(p)).collect::<Vec<_>>()
    );
    (got, learned, stats)
}

/// A frame as a TX worker hands it on: its first bytes copied into `room`, the rest left in
/// the sender's buffer `sent`. The room's other bytes are poison: whatever reads them
/// before the rest is copied in (`BurstFrame::bytes`) sees a frame the general path never
/// sees. The cut, picked by the frame's length, falls in the middle of the MACs, after
/// them, after the EtherType or further on: a frame cut short of what a decision needs
/// must take the general path, never a decision on poison.
fn burst_frame<'a>(room: &'a mut [u8], sent: &'a mut [u8]) -> BurstFrame<'a> {
    let cut = [3, 6, 12, 14, 34][room.len() % 5];
    if room.len() <= cut {
        return BurstFrame::new(room);
    }
    room[cut..].fill(0xee);
    let rest = VolatileSlice::from(&mut sent[cut..]);
    BurstFrame::with_rest(room, rest).expect("the rest is shorter than the frame")
}

fuzz_target!(|data: &[u8]| {
    let Some((pick, data)) = data.split_first() else {
        return;
    };
    let input = batches(data);
    let burst = drive(Switch::with_rules(rules(*pick)), &input);
    let general = drive(Switch::with_rules(rules(*pick)).general_only(), &input);
    assert_eq!(burst, general);
});
