//! The burst path against the general path: the same random frames sent by one guest, once
//! through a switch that lets plain frames take the burst path and once through one that
//! forwards every frame the general way (`Switch::general_only`), under the same random
//! rules (egress checksum actions, the router). What the other guest's ring holds (used
//! entries, headers, frames), what a port without a burst path received, and every counter
//! of every port must be the same.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dpaa_vnic::pipeline::csum_action::CsumAction;
use dpaa_vnic::pipeline::router::{RouteTable, RouterIf, ROUTER_MAC};
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::{Egress, OutboxBuffers, Packet, PortFrames, Switch};
use dpaa_vnic::ports::vhost_user::GuestPort;
use dpaa_vnic::stats::Tally;
use dpaa_vnic::wire::{MacAddr, VirtioNetHdr};
use proptest::prelude::*;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use common::frontend::*;
use common::port::{serve_port, PortOpts};
use common::wait_until;

const HDR: usize = 12;
const RING: u16 = 256;

/// Port 2: a port with no burst path of its own (`Egress::write_plain` left out).
#[derive(Default)]
struct Sink(Mutex<Vec<Vec<u8>>>);

impl Egress for Sink {
    fn write(&self, _tally: &Tally, frames: &mut PortFrames<'_, '_>, _segment: &mut Vec<u8>) -> usize {
        let mut n = 0;
        while let Some(f) = frames.next() {
            self.0.lock().unwrap().push(f.pkt.frame.to_vec());
            n += 1;
        }
        n
    }
}

fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0xd0, 0xaa, last])
}

/// The guests' own addresses (ports 0 and 1, as `serve` sets them), a station learned on
/// port 1 that B's filter does not take, one learned on the sink's port, one nobody has.
const A: u8 = 1;
const B: u8 = 2;
const ELSEWHERE_ON_B: u8 = 0x10;
const ON_SINK: u8 = 0x20;
const UNKNOWN: u8 = 0x30;

/// What follows a frame's MACs.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// Bytes that are no protocol's.
    Raw,
    /// IPv4 and UDP or TCP, checksums wrong (an action rewrites them), or an IPv4 header
    /// that says it is shorter than its minimum (an action drops the frame).
    Udp4,
    Tcp4,
    ShortIhl4,
    /// What the router looks into even when not addressed to it.
    Arp,
    Udp6,
}

/// One frame A sends: where to, from where, what header, its 802.1Q tag if any, what it
/// carries, how long (cut there if the body is longer).
#[derive(Debug, Clone)]
struct Sent {
    dst: MacAddr,
    src: MacAddr,
    hdr: [u8; HDR],
    tag: Option<u16>,
    body: Body,
    len: usize,
}

impl Sent {
    /// The frame's bytes; `i` makes each frame's payload its own.
    fn bytes(&self, i: usize) -> Vec<u8> {
        let mut f = self.dst.0.to_vec();
        f.extend_from_slice(&self.src.0);
        if let Some(vid) = self.tag {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&vid.to_be_bytes());
        }
        let payload = |n: usize| (0..n).map(move |k| (k * 7 + i) as u8);
        let ipv4 = |f: &mut Vec<u8>, ihl: u8, proto: u8, l4: &[u8]| {
            f.extend_from_slice(&[0x08, 0x00, 0x40 | ihl, 0]);
            f.extend_from_slice(&(20 + l4.len() as u16).to_be_bytes());
            f.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0xde, 0xad, 198, 18, 0, 1, 198, 18, 0, 2]);
            f.extend_from_slice(l4);
        };
        let udp = |n: usize| {
            let mut u = vec![0x30, 0x39, 0x00, 0x35];
            u.extend_from_slice(&(8 + n as u16).to_be_bytes());
            u.extend_from_slice(&[0xbe, 0xef]);
            u.extend(payload(n));
            u
        };
        match self.body {
            Body::Raw => f.extend(payload(300)),
            Body::Udp4 => ipv4(&mut f, 5, 17, &udp(240)),
            Body::ShortIhl4 => ipv4(&mut f, 4, 17, &udp(240)),
            Body::Tcp4 => {
                let mut t = vec![
                    0x30, 0x39, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0xbe, 0xef, 0, 0,
                ];
                t.extend(payload(230));
                ipv4(&mut f, 5, 6, &t);
            }
            Body::Arp => {
                f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
                f.extend_from_slice(&self.src.0);
                f.extend_from_slice(&[198, 18, 0, 1, 0, 0, 0, 0, 0, 0, 198, 18, 0, 254]);
            }
            Body::Udp6 => {
                let u = udp(240);
                f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
                f.extend_from_slice(&(u.len() as u16).to_be_bytes());
                f.extend_from_slice(&[17, 64]);
                f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
                f.extend_from_slice(&u);
            }
        }
        f.truncate(self.len);
        f
    }
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        3 => Just(Body::Raw),
        4 => Just(Body::Udp4),
        1 => Just(Body::Tcp4),
        1 => Just(Body::ShortIhl4),
        1 => Just(Body::Arp),
        1 => Just(Body::Udp6),
    ]
}

fn dst() -> impl Strategy<Value = MacAddr> {
    prop_oneof![
        6 => Just(mac(B)),
        1 => Just(mac(ELSEWHERE_ON_B)),
        1 => Just(mac(ON_SINK)),
        1 => Just(mac(A)),
        1 => Just(mac(UNKNOWN)),
        1 => Just(MacAddr::BROADCAST),
        1 => Just(MacAddr([0x01, 0x00, 0x5e, 0, 0, 1])),
        1 => Just(ROUTER_MAC),
    ]
}

fn src() -> impl Strategy<Value = MacAddr> {
    // A station that moves: A sending as the station learned on B's port or the sink's.
    prop_oneof![40 => Just(mac(A)), 1 => Just(mac(ELSEWHERE_ON_B)), 1 => Just(mac(ON_SINK))]
}

fn hdr() -> impl Strategy<Value = [u8; HDR]> {
    prop_oneof![
        6 => Just([0u8; HDR]),
        // Any field set: num_buffers, a GSO type, NEEDS_CSUM with offsets good or not.
        1 => (any::<u8>(), 10usize..HDR).prop_map(|(v, at)| {
            let mut h = [0u8; HDR];
            h[at] = v | 1;
            h
        }),
        1 => (0u16..80, 0u16..40).prop_map(|(start, off)| VirtioNetHdr {
            flags: 1,
            csum_start: start,
            csum_offset: off,
            ..VirtioNetHdr::default()
        }
        .to_bytes()[..HDR]
            .try_into()
            .unwrap()),
        1 => any::<[u8; HDR]>(),
    ]
}

/// A few frames alike but for their length: runs of one destination, as traffic comes.
fn sent() -> impl Strategy<Value = Vec<Sent>> {
    // Around 140 bytes: where a TX worker starts leaving a frame's rest in the guest's
    // buffer (tx.rs, HEAD).
    let len = || prop_oneof![1 => 0usize..14, 1 => 14usize..300, 1 => 130usize..150, 7 => Just(300)];
    // VLAN 100 is the one B's driver adds when the set-up has it filter VLANs.
    let tag = prop_oneof![6 => Just(None), 1 => Just(Some(100)), 1 => Just(Some(200))];
    (
        dst(),
        src(),
        hdr(),
        tag,
        body(),
        proptest::collection::vec(len(), 1..5),
    )
        .prop_map(|(dst, src, hdr, tag, body, lens)| {
            lens.into_iter()
                .map(|len| Sent {
                    dst,
                    src,
                    hdr,
                    tag,
                    body,
                    len,
                })
                .collect()
        })
}

/// The rules both switches run under, and how B's driver is set up.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Egress checksum actions on B (bit 0) and on the sink (bit 1), an ingress one on A
    /// (bit 2), and on B's egress one that drops TCP (bit 3, `verdict=drop`).
    actions: u8,
    router: bool,
    promisc: bool,
    /// B's driver takes DATA_VALID in its headers (VIRTIO_NET_F_GUEST_CSUM).
    guest_csum: bool,
    /// B's driver filters VLANs (VIRTIO_NET_F_CTRL_VLAN) and adds VLAN 100 only.
    vlan: bool,
    /// After the frames, the driver names a chain past the end of the ring, which breaks it.
    broken_tail: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        0u8..16,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(actions, router, promisc, guest_csum, vlan)| Setup {
            actions,
            router,
            promisc,
            guest_csum,
            vlan,
            broken_tail: false,
        })
}

impl Setup {
    /// The switch's rules, with the router on A's and B's prefixes (198.18.0.0/24 and
    /// 198.18.1.0/24) if it is on.
    fn rules(&self) -> Rules {
        let actions = [
            (1, "port=1,dir=egress,update=iph+udp"),
            (2, "port=2,dir=egress,update=iph+tcp"),
            (4, "port=0,dir=ingress,update=iph+udp"),
            (8, "port=1,dir=egress,update=tcp,proto=tcp,verdict=drop"),
        ]
        .iter()
        .filter(|(bit, _)| self.actions & bit != 0)
        .map(|(_, a)| a.parse::<CsumAction>().unwrap())
        .collect();
        let ifaces: Vec<RouterIf> = if self.router {
            vec![
                "0=198.18.0.254/24".parse().unwrap(),
                "1=198.18.1.254/24".parse().unwrap(),
            ]
        } else {
            Vec::new()
        };
        Rules::with_router(3, actions, RouteTable::new(ifaces, Vec::new()))
    }
}

/// What one run left behind, compared between the two switches.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// B's used entries after the first, each with the bytes its buffer holds.
    b_rx: Vec<(u32, Vec<u8>)>,
    /// The same on A's RX ring: what the router answered.
    a_rx: Vec<(u32, Vec<u8>)>,
    sink: Vec<Vec<u8>>,
    /// Every port's counters, queue by queue, then each action's.
    stats: String,
    /// B's frames refused by its VLAN table.
    b_vlan_filtered: u64,
    a_tx_used: u16,
}

/// Sends `frames` from guest A to the switch, B's ring and the sink behind it, and returns
/// what they got.
fn run(switch: Switch, frames: &[Sent], setup: Setup) -> Outcome {
    let n = u16::try_from(frames.len()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let switch = Arc::new(switch);
    let paths = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let ports: Vec<Arc<GuestPort>> = (0..2)
        .map(|id| serve_port(&switch, id, &paths[id], PortOpts::default()))
        .collect();
    let sink = Arc::new(Sink::default());
    switch.attach(2, sink.clone());
    let features = VERSION_1 | MRG_RXBUF | PROTOCOL_FEATURES;
    let mut a = Guest::connect(&paths[0], features);
    // B has a control queue, to turn promiscuous mode off: its filter then takes its own
    // address only.
    let guest_csum = if setup.guest_csum { GUEST_CSUM } else { 0 };
    let vlan = if setup.vlan { CTRL_VLAN } else { 0 };
    let mut b = Guest::connect(&paths[1], features | CTRL_VQ | CTRL_RX | guest_csum | vlan);
    let ctlq = b.queue(2);
    if !setup.promisc {
        command(&b, &ctlq, &[0, 0, 0]); // PROMISC off
    }
    if setup.vlan {
        command(&b, &ctlq, &[2, 0, 100, 0]); // VLAN_ADD 100
    }
    drop(ctlq);
    let (txr, rxr) = two_guest_rings(&mut a, &mut b, RING, n + 1);
    // A takes what the router answers.
    let arx = rx_ring(&mut a, RING, n + 1);
    let tally = switch.tallies().register();
    for (guest, port, ring) in [(&b, 1, rxr), (&a, 0, arx)] {
        wait_until("the RX paths up", || {
            let mut f = mac(port as u8 + 1).0.to_vec();
            f.extend_from_slice(&[0; 54]);
            let mut bufs = OutboxBuffers::default();
            let mut out = switch.outbox(&tally, &mut bufs);
            if let Ok(adm) = ports[port].admit(out.tally(), 0, &f) {
                out.lend(port, 0, adm, Packet::new(VirtioNetHdr::default(), &mut f));
            }
            drop(out);
            used_idx(guest, ring) == 1
        });
    }
    for (station, port) in [(B, 1), (ELSEWHERE_ON_B, 1), (ON_SINK, 2)] {
        switch.fdb().learn(&mac(station), port);
    }
    for (i, s) in (0u16..).zip(frames) {
        let at = 0x2_0000 + 0x800 * u64::from(i);
        let f = s.bytes(usize::from(i));
        a.mem.write_slice(&s.hdr, GuestAddress(at)).unwrap();
        a.mem.write_slice(&f, GuestAddress(at + HDR as u64)).unwrap();
        txr.put_desc(&a.mem, i, d(at, (HDR + f.len()) as u32, 0, 0));
        txr.put_avail(&a.mem, i, i);
    }
    let mut avail = n;
    if setup.broken_tail {
        txr.put_avail(&a.mem, n, RING + 7);
        avail += 1;
    }
    a.mem.write_obj(avail, GuestAddress(txr.avail + 2)).unwrap();
    a.kick[1].write(1).unwrap();
    wait_until("every TX chain returned", || used_idx(&a, txr) == n);
    // What the frames did: the set-up's probes (and those dropped while a ring came up, as
    // many as the timing made) are counted in its own tally, and left out.
    let since_setup = |p: usize| {
        let mut queues = switch.tallies().port(p);
        for (q, s) in queues.iter_mut().enumerate() {
            *s -= tally.at(p, q).snapshot();
        }
        queues
    };
    let stats = || {
        let rules = switch.rules().load();
        format!(
            "{:?} {:?}",
            (0..3).map(since_setup).collect::<Vec<_>>(),
            rules
                .actions()
                .iter()
                .map(|a| switch.tallies().action(a.slot))
                .collect::<Vec<_>>()
        )
    };
    settle(|| {
        (
            stats(),
            used_idx(&b, rxr),
            used_idx(&a, arx),
            sink.0.lock().unwrap().len(),
        )
    });
    let sink = sink.0.lock().unwrap().clone();
    Outcome {
        b_rx: received(&b, rxr),
        a_rx: received(&a, arx),
        sink,
        stats: stats(),
        b_vlan_filtered: switch.tallies().port(1).iter().map(|q| q.rx_vlan_filtered).sum(),
        a_tx_used: used_idx(&a, txr),
    }
}

/// `g`'s used entries on `ring` after the first (which the set-up wrote), each with the
/// bytes its buffer holds.
fn received(g: &Guest, ring: SplitLayout) -> Vec<(u32, Vec<u8>)> {
    (1..used_idx(g, ring))
        .map(|i| {
            let entry = ring.used + 4 + 8 * u64::from(i);
            let id: u32 = g.mem.read_obj(GuestAddress(entry)).unwrap();
            let len: u32 = g.mem.read_obj(GuestAddress(entry + 4)).unwrap();
            let mut got = vec![0u8; len as usize];
            g.mem
                .read_slice(&mut got, GuestAddress(rx_buf(id as u16)))
                .unwrap();
            (id, got)
        })
        .collect()
}

/// A control command on B's control queue `q`, acked VIRTIO_NET_OK.
fn command(b: &Guest, q: &MockSplitQueue<'_, GuestMemoryMmap>, cmd: &[u8]) {
    let n = q.used().idx().load();
    let at = 0x1c_0000 + 0x1000 * u64::from(n);
    b.mem.write_slice(cmd, GuestAddress(at)).unwrap();
    b.mem.write_obj(0xffu8, GuestAddress(at + 0x800)).unwrap();
    q.add_desc_chains(
        &[
            d(at, cmd.len() as u32, F_NEXT, 2 * n + 1),
            d(at + 0x800, 1, F_WRITE, 0),
        ],
        2 * n,
    )
    .unwrap();
    b.kick[2].write(1).unwrap();
    wait_until("the command acked", || q.used().idx().load() == n + 1);
    assert_eq!(
        b.mem.read_obj::<u8>(GuestAddress(at + 0x800)).unwrap(),
        0,
        "{cmd:?}"
    );
}

/// Waits until `look` gives the same answer for 250 ms: the worker has written the last
/// batch it took (a batch's chains are returned once its burst-path frames are written,
/// but the frames of the general path wait in the outbox until the worker's arena is
/// done). The margin is for a loaded machine, where a worker may wait its turn that long.
fn settle<T: PartialEq>(mut look: impl FnMut() -> T) {
    let t0 = Instant::now();
    let mut last = look();
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_millis(250) {
        assert!(t0.elapsed() < Duration::from_secs(30), "counters never settled");
        thread::sleep(Duration::from_millis(5));
        let now = look();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn the_burst_path_delivers_and_counts_what_the_general_path_does(
        frames in proptest::collection::vec(sent(), 1..60),
        setup in setup(),
    ) {
        let frames: Vec<Sent> = frames.into_iter().flatten().take(usize::from(RING) - 8).collect();
        let burst = run(Switch::with_rules(setup.rules()), &frames, setup);
        let general = run(Switch::with_rules(setup.rules()).general_only(), &frames, setup);
        prop_assert_eq!(&burst, &general);
        // A frame tagged with VLAN 200, long enough for its tag (16 bytes) to be read, which
        // B's VLAN table refuses when it decides.
        let vlan_refuses = |s: &Sent| setup.vlan && !setup.promisc && s.tag == Some(200) && s.len >= 16;
        let raw_to_b = |s: &Sent| {
            s.dst == mac(B) && s.len >= 14 && matches!(s.body, Body::Raw) && VirtioNetHdr::asks_nothing(&s.hdr)
        };
        // Not vacuous: a plain frame for B that no action or filter can drop gets through.
        let plain_to_b = |s: &Sent| raw_to_b(s) && !vlan_refuses(s);
        prop_assert!(!burst.b_rx.is_empty() || !frames.iter().any(plain_to_b));
        // Nor is the VLAN table: a tagged frame of another VLAN to B's own address is refused.
        if frames.iter().any(|s| raw_to_b(s) && vlan_refuses(s)) {
            prop_assert!(burst.b_vlan_filtered > 0);
        }
    }
}

/// `n` frames from A to B, each `body`, full length.
fn to_b(n: usize, body: Body) -> Vec<Sent> {
    (0..n)
        .map(|_| Sent {
            dst: mac(B),
            src: mac(A),
            hdr: [0; HDR],
            tag: None,
            body,
            len: 300,
        })
        .collect()
}

/// B promiscuous, no action, no router, no VLAN table; the ring broken after the frames.
const PROMISC_PLAIN: Setup = Setup {
    actions: 0,
    router: false,
    promisc: true,
    guest_csum: false,
    vlan: false,
    broken_tail: true,
};

/// A ring the driver breaks after a batch of plain frames (a chain named past the ring's
/// end, in the next batch): the frames already taken are delivered, by either path.
#[test]
fn frames_taken_before_the_ring_breaks_are_delivered() {
    let frames: Vec<Sent> = (0..32)
        .map(|i| Sent {
            len: 60 + i,
            ..to_b(1, Body::Raw).remove(0)
        })
        .collect();
    let setup = PROMISC_PLAIN;
    let burst = run(Switch::new(3), &frames, setup);
    let general = run(Switch::new(3).general_only(), &frames, setup);
    assert_eq!(burst, general);
    assert_eq!(burst.b_rx.len(), frames.len());
}

/// With the router on and a checksum action on B's egress or on A's ingress, plain UDP
/// frames still go as the general path sends them: checksums rewritten, DATA_VALID in the
/// header B takes; and an action that drops (an IPv4 header shorter than its minimum) drops
/// there too.
#[test]
fn actions_and_the_router_leave_plain_frames_as_the_general_path_does() {
    for actions in [1, 4] {
        let setup = Setup {
            actions,
            router: true,
            promisc: false,
            guest_csum: true,
            vlan: false,
            broken_tail: false,
        };
        let mut frames = to_b(20, Body::Udp4);
        frames.extend(to_b(5, Body::ShortIhl4));
        frames.extend(to_b(5, Body::Udp4));
        // Two ARP requests for the router's address on A's side, among them: the router
        // answers.
        frames.splice(10..10, to_b(2, Body::Arp));
        let burst = run(Switch::with_rules(setup.rules()), &frames, setup);
        let general = run(Switch::with_rules(setup.rules()).general_only(), &frames, setup);
        assert_eq!(burst, general, "actions {actions}");
        assert_eq!(burst.b_rx.len(), 25);
        assert_eq!(burst.a_rx.len(), 2, "the router's answers");
        for (_, got) in &burst.b_rx {
            // The header's flags: DATA_VALID (2), the action having computed the UDP
            // checksum.
            assert_eq!(got[0], 2, "{:?}", &got[..HDR]);
            let ip = &got[HDR + 14..HDR + 34];
            let sum = ip
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum::<u32>();
            assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff, "IPv4 header checksum");
        }
    }
}

/// A frame an ingress action drops teaches the switch nothing, on either path: a station
/// learned on B's port that A's dropped frames claim stays on B's port, and A's frames to
/// it still reach B.
#[test]
fn a_frame_an_ingress_action_drops_is_not_learned_from() {
    let setup = Setup {
        actions: 4,
        router: false,
        promisc: true,
        guest_csum: false,
        vlan: false,
        broken_tail: false,
    };
    let mut frames: Vec<Sent> = to_b(3, Body::ShortIhl4)
        .into_iter()
        .map(|s| Sent {
            src: mac(ELSEWHERE_ON_B),
            ..s
        })
        .collect();
    frames.extend(to_b(3, Body::Raw).into_iter().map(|s| Sent {
        dst: mac(ELSEWHERE_ON_B),
        ..s
    }));
    let burst = run(Switch::with_rules(setup.rules()), &frames, setup);
    let general = run(Switch::with_rules(setup.rules()).general_only(), &frames, setup);
    assert_eq!(burst, general);
    assert_eq!(burst.b_rx.len(), 3);
}

/// A capture armed on B sends every frame by the general path, where its hooks are: B gets
/// what it gets without one, and the capture holds each frame B was offered, as B got it.
#[test]
fn a_capture_takes_frames_off_the_burst_path_and_sees_each() {
    use dpaa_vnic::pipeline::capture::{Capture, Fate, Way, Ways};
    let setup = Setup {
        broken_tail: false,
        ..PROMISC_PLAIN
    };
    let frames = to_b(40, Body::Udp4);
    let cap = Arc::new(Capture::new(1, Ways::BOTH, 65535));
    let mut rules = setup.rules();
    assert!(rules.set_capture(1, Some(cap.clone())));
    let captured = run(Switch::with_rules(rules), &frames, setup);
    let general = run(Switch::with_rules(setup.rules()).general_only(), &frames, setup);
    assert_eq!(captured, general);
    assert_eq!(captured.b_rx.len(), frames.len());
    let recs: Vec<_> = std::iter::from_fn(|| cap.next()).collect();
    assert_eq!(recs.len(), frames.len());
    for (r, (_, got)) in recs.iter().zip(&captured.b_rx) {
        assert_eq!((r.way, r.fate), (Way::Offered, Fate::Passed));
        assert_eq!(&r.data[..], &got[HDR..]);
    }
}
