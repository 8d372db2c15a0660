//! The pipeline per packet, without vrings: one frame through the switch to a port that
//! counts it, with checksum actions off and on; the router's route cache, a hit against a
//! full lookup (miss) over tables of growing size; and one parse of a frame's headers.
//!
//! cargo bench --bench pipeline

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dpaa_vnic::pipeline::fdb::FdbCache;
use dpaa_vnic::pipeline::router::Neighbours;
use dpaa_vnic::pipeline::router::{Resolution, RouteCache, RouteTable};
use dpaa_vnic::pipeline::rules::Rules;
use dpaa_vnic::pipeline::{Egress, Ingress, OutboxBuffers, Packet, PortFrames, Switch};
use dpaa_vnic::stats::Tally;
use dpaa_vnic::wire::checksum::checksum;
use dpaa_vnic::wire::{MacAddr, VirtioNetHdr};

/// Counts what it is given, as cheaply as a port can.
#[derive(Default)]
struct Counter(AtomicU64);

impl Egress for Counter {
    fn write(&self, tally: &Tally, frames: &mut PortFrames<'_, '_>, _segment: &mut Vec<u8>) -> usize {
        let mut n = 0;
        while let Some(f) = frames.next() {
            self.0.fetch_add(f.pkt.frame.len() as u64, Ordering::Relaxed);
            tally.at(1, f.flow).tx_packets.inc();
            n += 1;
        }
        n
    }
}

/// Forwards one frame from `from` and writes it out, as a worker's outbox would (here one
/// write per frame, where a worker writes up to 64 at once).
fn forward_one(sw: &Switch, from: &mut Ingress<'_>, bufs: &mut OutboxBuffers, frame: &mut [u8]) {
    let rules = sw.rules().load();
    let mut out = sw.outbox(from.tally, bufs);
    black_box(sw.forward(
        &rules,
        from,
        Packet::new(VirtioNetHdr::default(), frame),
        &mut out,
    ));
}

/// A unicast IPv4/UDP frame of `len` bytes from port 0's station to port 1's.
fn udp_frame(len: usize) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x08, 0x00];
    let ip_len = len - 14;
    let mut ip = vec![
        0x45,
        0,
        (ip_len >> 8) as u8,
        ip_len as u8,
        0,
        1,
        0,
        0,
        64,
        17,
        0,
        0,
    ];
    ip.extend_from_slice(&[10, 1, 0, 2, 10, 1, 0, 3]);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let ul = ip_len - 20;
    f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, (ul >> 8) as u8, ul as u8, 0x12, 0x34]);
    f.resize(len, 0x5a);
    f
}

/// Sends `template` into the switch from port 0, one copy per iteration (the router
/// rewrites the frame it routes, so each iteration starts from the same bytes).
fn forward_from_port0(b: &mut criterion::Bencher<'_>, sw: &Switch, tally: &Tally, template: &[u8]) {
    let (mut routes, mut originated, mut bufs) =
        (RouteCache::default(), Vec::new(), OutboxBuffers::default());
    let mut from = Ingress {
        port: 0,
        queue: 0,
        tally,
        routes: &mut routes,
        fdb: &mut FdbCache::default(),
        originated: &mut originated,
    };
    let mut frame = template.to_vec();
    b.iter(|| {
        frame.copy_from_slice(template);
        forward_one(sw, &mut from, &mut bufs, &mut frame)
    })
}

fn bench_forward(c: &mut Criterion) {
    for size in [64usize, 1500] {
        let mut g = c.benchmark_group(format!("pipeline/{size}B"));
        g.throughput(Throughput::Elements(1));
        for (name, actions) in [
            ("switch, no actions", vec![]),
            (
                "switch + csum action iph+udp",
                vec!["port=1,dir=egress,update=iph+udp".parse().unwrap()],
            ),
        ] {
            let sw = Switch::with_rules(Rules::new(2, actions));
            let sinks: Vec<Arc<Counter>> = (0..2).map(|_| Arc::new(Counter::default())).collect();
            for (i, s) in sinks.iter().enumerate() {
                sw.attach(i, s.clone());
            }
            let tally = sw.tallies().register();
            let (mut routes, mut originated, mut bufs) =
                (RouteCache::default(), Vec::new(), OutboxBuffers::default());
            // Teach the switch where port 1's station is.
            let mut hello = udp_frame(64);
            hello[..6].copy_from_slice(&[0xff; 6]);
            hello[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xb]);
            let mut from1 = Ingress {
                port: 1,
                queue: 0,
                tally: &tally,
                routes: &mut routes,
                fdb: &mut FdbCache::default(),
                originated: &mut originated,
            };
            forward_one(&sw, &mut from1, &mut bufs, &mut hello);
            let frame = udp_frame(size);
            g.bench_function(name, |b| forward_from_port0(b, &sw, &tally, &frame));
        }
        g.finish();
    }
}

fn bench_route_cache(c: &mut Criterion) {
    for routes in [10usize, 100, 1000] {
        let mut g = c.benchmark_group(format!("route/{routes} routes"));
        g.throughput(Throughput::Elements(1));
        let table: Vec<_> = (0..routes)
            .map(|i| {
                format!("172.{}.{}.0/24,via=10.2.0.9", 16 + i / 256, i % 256)
                    .parse()
                    .unwrap()
            })
            .collect();
        let ifaces = vec!["0=10.1.0.1/24".parse().unwrap(), "1=10.2.0.1/24".parse().unwrap()];
        let t = RouteTable::new(ifaces, table);
        let n = Neighbours::new(2, 16);
        n.learn("10.2.0.9".parse().unwrap(), MacAddr([2, 0, 0, 0, 0, 9]), 1);
        // The last route added: a full lookup scans them all.
        let last = routes - 1;
        let dst = IpAddr::V4(Ipv4Addr::new(172, 16 + (last / 256) as u8, (last % 256) as u8, 7));
        assert!(matches!(t.resolve(dst, &n), Resolution::Forward { .. }));
        let mut cache = RouteCache::default();
        cache.get(1, dst);
        if let Resolution::Forward { mac, port } = t.resolve(dst, &n) {
            cache.put(dst, mac, port);
        }
        g.bench_function("cache hit", |b| {
            b.iter(|| black_box(cache.get(1, black_box(dst))))
        });
        g.bench_function("miss: full lookup", |b| {
            b.iter(|| black_box(t.resolve(black_box(dst), &n)))
        });
        g.finish();
    }
}

/// A frame the router forwards: IPv4 to the router's MAC, resolved through the worker's
/// route cache (a hit after the first), MAC rewrite and TTL decrement, then switched.
fn bench_routed(c: &mut Criterion) {
    use dpaa_vnic::pipeline::router::ROUTER_MAC;
    let mut g = c.benchmark_group("pipeline/64B");
    g.throughput(Throughput::Elements(1));
    let ifaces = vec!["0=10.1.0.1/24".parse().unwrap(), "1=10.2.0.1/24".parse().unwrap()];
    let sw = Switch::with_rules(Rules::with_router(2, vec![], RouteTable::new(ifaces, vec![])));
    let sinks: Vec<Arc<Counter>> = (0..2).map(|_| Arc::new(Counter::default())).collect();
    for (i, s) in sinks.iter().enumerate() {
        sw.attach(i, s.clone());
    }
    sw.neighbours()
        .learn("10.2.0.9".parse().unwrap(), MacAddr([2, 0, 0, 0, 0, 9]), 1);
    let mut template = udp_frame(64);
    template[..6].copy_from_slice(&ROUTER_MAC.0);
    template[14 + 16..14 + 20].copy_from_slice(&[10, 2, 0, 9]);
    template[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
    let c = checksum(&template[14..34]);
    template[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    let tally = sw.tallies().register();
    // One frame first, to check it is routed (asserted here, not after the benchmark,
    // which a filter on the command line may skip).
    let (mut routes, mut originated, mut bufs) =
        (RouteCache::default(), Vec::new(), OutboxBuffers::default());
    let mut from = Ingress {
        port: 0,
        queue: 0,
        tally: &tally,
        routes: &mut routes,
        fdb: &mut FdbCache::default(),
        originated: &mut originated,
    };
    let mut first = template.clone();
    forward_one(&sw, &mut from, &mut bufs, &mut first);
    assert!(
        sinks[1].0.load(Ordering::Relaxed) > 0,
        "the frame was routed to port 1"
    );
    g.bench_function("router, routed (cache hit)", |b| {
        forward_from_port0(b, &sw, &tally, &template)
    });
    g.finish();
}

/// What one parse of a frame's headers costs next to what the pipeline does with them
/// ("parse once"): one parse alone, a checksum action's whole update (its parse,
/// then the sums), and three stages that look into one frame (RSS over two queues, then
/// two egress actions, the second matching on the protocol) sharing the packet's layers,
/// against each stage parsing for itself as they did before the layers. IPv4 and an IPv6
/// frame with a hop-by-hop header, whose extension-header walk each parse repeats.
fn bench_parse(c: &mut Criterion) {
    use dpaa_vnic::device::rss::Steering;
    use dpaa_vnic::pipeline::csum_action::{self, update, CsumAction, Targets};
    use dpaa_vnic::wire::layers::Layers;
    let mut g = c.benchmark_group("parse/64B");
    g.throughput(Throughput::Elements(1));
    let template = udp_frame(64);
    g.bench_function("Layers::parse (one parse of the IPv4 header)", |b| {
        b.iter(|| black_box(Layers::parse(black_box(&template))))
    });
    let targets: Targets = "iph+udp".parse().unwrap();
    let hdr = VirtioNetHdr::default();
    let mut frame = template.clone();
    g.bench_function("csum_action::update iph+udp (parse and sums)", |b| {
        b.iter(|| black_box(update(black_box(&mut frame), targets, &hdr)))
    });
    let steering = Steering::automatic(2);
    let actions: Vec<CsumAction> = [
        "port=1,dir=egress,update=iph+udp",
        "port=1,dir=egress,update=udp,proto=udp",
    ]
    .iter()
    .map(|a| a.parse().unwrap())
    .collect();
    for (family, template) in [("IPv4", template.clone()), ("IPv6+HBH", udp6_hbh_frame())] {
        let mut frame = template.clone();
        g.bench_function(format!("{family}: rss + 2 actions, one layers"), |b| {
            b.iter(|| {
                let mut pkt = Packet::new(hdr, black_box(&mut frame));
                let l = pkt.layers();
                black_box(steering.steer_by(&l, pkt.frame));
                black_box(csum_action::run(&actions, &mut pkt))
            })
        });
        let mut frame = template.clone();
        g.bench_function(format!("{family}: rss + 2 actions, a parse each"), |b| {
            b.iter(|| {
                let f = black_box(&mut frame);
                black_box(steering.steer(f));
                for a in &actions {
                    // The match's own parse, as `CsumAction::matches` did.
                    if a.proto.is_some() {
                        black_box(Layers::parse(f).addresses(f));
                    }
                    black_box(update(f, a.update, &hdr)).ok();
                }
            })
        });
    }
    g.finish();
}

/// A 86-byte IPv6/UDP frame whose fixed header is followed by an 8-byte hop-by-hop header.
fn udp6_hbh_frame() -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x86, 0xdd];
    f.extend_from_slice(&[0x60, 0, 0, 0, 0, 32, 0, 64]);
    f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
    f.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 24, 0x12, 0x34]);
    f.resize(86, 0x5a);
    f
}

criterion_group!(
    benches,
    bench_forward,
    bench_routed,
    bench_route_cache,
    bench_parse
);
criterion_main!(benches);
