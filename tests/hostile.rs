//! The daemon as it runs on a host, next to frontends and clients that misbehave: the real
//! binary, driven over temp sockets with raw vhost-user messages, broken rings, shrinking
//! guest memory, and control and metrics clients that flood, stall or lie.
//!
//! After every case the daemon must be alive, hold no more descriptors than before, have
//! logged a bounded number of lines, and serve a fresh frontend on the same socket.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use vhost::VhostBackend;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use common::daemon::*;
use common::frontend::*;
use common::wait_until;

/// Garbage, truncated and oversized messages, wrong versions and sizes, too many or missing
/// descriptors, memory regions longer than their files, rings out of range, and ring
/// descriptors that are not eventfds.
#[test]
fn hostile_messages_end_only_their_own_connection() {
    let mut d = Daemon::start(1, &[]);
    let raw = |d: &Daemon, bytes: Vec<u8>| {
        let mut r = Raw::connect(d.sock());
        r.send(&bytes, &[]);
        assert!(
            r.hung_up(),
            "the daemon kept a connection that sent {:?}",
            &bytes[..bytes.len().min(16)]
        );
    };
    case(&mut d, "garbage", |d| {
        raw(d, (0..64u8).map(|i| i.wrapping_mul(37)).collect())
    });
    case(&mut d, "truncated message", |d| {
        let mut m = msg(SET_FEATURES, 1, &[0u8; 8]);
        m.truncate(15);
        let r = Raw::connect(d.sock());
        r.send(&m, &[]);
    });
    case(&mut d, "wrong version", |d| raw(d, msg(GET_FEATURES, 0x2, &[])));
    case(&mut d, "size past every limit", |d| {
        let refused = d.stat(0, "frontend_refused");
        let mut m = msg(SET_FEATURES, 1, &[]);
        m[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        raw(d, m);
        assert_eq!(d.stat(0, "frontend_refused"), refused + 1);
    });
    case(&mut d, "wrong body size", |d| {
        raw(d, msg(SET_FEATURES, 1, &[0u8; 4]))
    });
    case(&mut d, "too many descriptors", |d| {
        let refused = d.stat(0, "frontend_refused");
        let files: Vec<File> = (0..40).map(|_| memfd(4096)).collect();
        let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        let regions: Vec<_> = (0..40).map(|i| (i * 0x1000, 0x1000, 0)).collect();
        let mut r = Raw::connect(d.sock());
        r.send(&msg(SET_MEM_TABLE, 1, &mem_table(&regions)), &fds);
        assert!(r.hung_up());
        assert_eq!(d.stat(0, "frontend_refused"), refused + 1);
    });
    case(&mut d, "regions without descriptors", |d| {
        raw(
            d,
            msg(
                SET_MEM_TABLE,
                1,
                &mem_table(&[(0, 0x1000, 0), (0x1000, 0x1000, 0)]),
            ),
        )
    });
    case(&mut d, "region past the end of its file", |d| {
        let f = memfd(0x1000);
        let refused = d.stat(0, "frontend_refused");
        let mut r = Raw::connect(d.sock());
        r.send(&msg(SET_PROTOCOL_FEATURES, 1, &REPLY_ACK.to_le_bytes()), &[]);
        // Waiting for an answer: a failure, and the connection stays.
        r.send(
            &msg(SET_MEM_TABLE, 1 | NEED_REPLY, &mem_table(&[(0, 0x20_0000, 0)])),
            &[f.as_raw_fd()],
        );
        let (req, _, body) = r.recv().expect("an answer");
        assert_eq!((req, body), (SET_MEM_TABLE, 1u64.to_le_bytes().to_vec()));
        // Not waiting: the connection ends.
        r.send(
            &msg(SET_MEM_TABLE, 1, &mem_table(&[(0, 0x1000, 0x1000)])),
            &[f.as_raw_fd()],
        );
        assert!(r.hung_up());
        assert_eq!(d.stat(0, "frontend_refused"), refused + 2);
    });
    case(&mut d, "memory a device, not a file", |d| {
        let z = File::open("/dev/zero").unwrap();
        let mut r = Raw::connect(d.sock());
        r.send(
            &msg(SET_MEM_TABLE, 1, &mem_table(&[(0, 0x1000, 0)])),
            &[z.as_raw_fd()],
        );
        assert!(r.hung_up());
    });
    case(&mut d, "rings out of range", |d| {
        for (index, num) in [
            (200u32, 16u32),
            (0, 0),
            (0, 3),
            (0, 65535),
            (0, 2048),
            (u32::MAX, 16),
        ] {
            let mut body = index.to_le_bytes().to_vec();
            body.extend_from_slice(&num.to_le_bytes());
            let r = Raw::connect(d.sock());
            r.send(&msg(SET_OWNER, 1, &[]), &[]);
            r.send(&msg(SET_VRING_NUM, 1, &body), &[]);
            let mut addr = index.to_le_bytes().to_vec();
            addr.extend_from_slice(&[0u8; 36]);
            r.send(&msg(SET_VRING_ADDR, 1, &addr), &[]);
            drop(r);
            wait_until("ring case torn down", || !d.connected(0));
        }
    });
    case(&mut d, "ring descriptors that are not eventfds", |d| {
        let (a, _b) = UnixStream::pair().unwrap();
        let f = memfd(16);
        for fd in [a.as_raw_fd(), f.as_raw_fd()] {
            for req in [SET_VRING_KICK, SET_VRING_CALL] {
                let mut r = Raw::connect(d.sock());
                r.send(&msg(SET_OWNER, 1, &[]), &[]);
                r.send(&msg(req, 1, &0u64.to_le_bytes()), &[fd]);
                assert!(r.hung_up());
            }
        }
    });
    // Each refusal is told at WARN with its reason and the request it concerns
    // (a repeat within a second only counts: one warning a second per port).
    let log = std::fs::read_to_string(&d.log).unwrap();
    let warned = |needle: &str| {
        log.lines()
            .any(|l| l.contains(" WARN ") && l.contains("port 0") && l.contains(needle))
    };
    for needle in [
        "exceeds 4096",
        "the frontend's last was GET_FEATURES",
        "SET_FEATURES refused: a body of 4 bytes is too short",
        "more than 32 came (a memory table of more regions than vhost-user allows)",
        "the frontend's last was SET_MEM_TABLE",
        "SET_MEM_TABLE refused: memory region 0 maps 2097152 bytes of a 4096-byte file",
        "SET_MEM_TABLE refused: memory region 0 is backed by a character device",
        "SET_VRING_NUM refused: queue 200: the device has 3",
        "SET_VRING_KICK refused: kick is not an eventfd",
    ] {
        assert!(warned(needle), "no warning with {needle:?} in\n{log}");
    }
}

/// Rings a driver got wrong, one case per connection.
#[test]
fn hostile_rings_cost_their_guest_alone() {
    let mut d = Daemon::start(1, &[]);
    // A chain the device must refuse is returned and counted; the queue goes on.
    let bad_chain = |d: &Daemon, descs: &[(u16, virtio_queue::desc::RawDescriptor)], heads: &[u16]| {
        let errors = d.stat(0, "tx_errors");
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        for (i, desc) in descs {
            txq.desc_table().store(*i, *desc).unwrap();
        }
        for (k, h) in heads.iter().enumerate() {
            txq.avail().ring().ref_at(k).unwrap().store(*h);
        }
        txq.avail().idx().store(heads.len() as u16);
        g.kick[1].write(1).unwrap();
        wait_until("bad chains refused", || {
            d.stat(0, "tx_errors") + d.stat(0, "rings_broken") > errors
        });
    };
    case(&mut d, "descriptors outside memory", |d| {
        bad_chain(d, &[(0, d_(0xffff_0000_0000, 64, 0, 0))], &[0])
    });
    case(&mut d, "descriptor loop", |d| {
        bad_chain(
            d,
            &[
                (0, d_(0x10_0000, 16, F_NEXT, 1)),
                (1, d_(0x10_1000, 16, F_NEXT, 0)),
            ],
            &[0],
        )
    });
    case(&mut d, "short header", |d| {
        bad_chain(d, &[(0, d_(0x10_0000, 4, 0, 0))], &[0])
    });
    case(&mut d, "write-only TX buffer", |d| {
        bad_chain(d, &[(0, d_(0x10_0000, 64, F_WRITE, 0))], &[0])
    });
    case(&mut d, "garbage indirect tables", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        // Random bytes, a length that is not a multiple of 16, an empty one, one out of memory.
        g.mem
            .write_slice(
                &(0..256u32).map(|i| (i * 97) as u8).collect::<Vec<_>>(),
                GuestAddress(0x12_0000),
            )
            .unwrap();
        let tables = [
            (0x12_0000, 256),
            (0x12_0000, 17),
            (0x12_0000, 0),
            (0xffff_0000_0000, 64),
        ];
        for (i, (addr, len)) in tables.iter().enumerate() {
            txq.desc_table()
                .store(i as u16, d_(*addr, *len, F_INDIRECT, 0))
                .unwrap();
            txq.avail().ring().ref_at(i).unwrap().store(i as u16);
        }
        txq.avail().idx().store(tables.len() as u16);
        g.kick[1].write(1).unwrap();
        wait_until("indirect tables returned", || {
            txq.used().idx().load() == tables.len() as u16
        });
    });
    case(&mut d, "avail head out of range", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        txq.avail().ring().ref_at(0).unwrap().store(5000);
        txq.avail().idx().store(1);
        g.kick[1].write(1).unwrap();
        wait_until("ring marked broken", || d.stat(0, "rings_broken") == 1);
        // Later frames on the broken ring are left alone, not retried.
        post_tx(&g, &txq, 1);
        g.kick[1].write(1).unwrap();
        thread::sleep(Duration::from_millis(200));
        assert_eq!(d.stat(0, "rings_broken"), 1);
    });
    case(&mut d, "avail index a ring ahead", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        txq.avail().idx().store(QSIZE * 3);
        let ticks = d.cpu_ticks();
        for _ in 0..50 {
            g.kick[1].write(1).unwrap();
            thread::sleep(Duration::from_millis(10));
        }
        wait_until("ring marked broken", || d.stat(0, "rings_broken") == 2);
        thread::sleep(Duration::from_millis(500));
        // No thread spins on it: well under a tenth of a CPU over the second.
        let spent = d.cpu_ticks() - ticks;
        assert!(spent < 30, "{spent} ticks of CPU on a broken ring");
        // The frontend stops and restarts the ring (as after a driver reset): served again.
        drop(txq);
        let mut g = g;
        g.fe.get_vring_base(1).unwrap();
        let txq = g.queue(1);
        drop(txq);
        g.set_up_ring(1, 0);
        enable(&mut g.fe, 1);
        let txq = g.queue(1);
        // Read first: the worker may serve the chain as soon as it is posted.
        let before = d.stat(0, "tx_packets");
        post_tx(&g, &txq, 0);
        g.kick[1].write(1).unwrap();
        wait_until("restarted ring served", || d.stat(0, "tx_packets") == before + 1);
    });
    case(&mut d, "a call eventfd whose counter is full", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        g.call[1].write(0xffff_ffff_ffff_fffe).unwrap();
        let before = d.stat(0, "tx_packets");
        post_tx(&g, &txq, 0);
        g.kick[1].write(1).unwrap();
        wait_until("frame served although the interrupt cannot be", || {
            d.stat(0, "tx_packets") == before + 1
        });
    });
    case(&mut d, "a frontend that hangs up while its ring is served", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        for pos in 0..QSIZE / 2 {
            post_tx(&g, &txq, pos);
        }
        for _ in 0..100 {
            g.kick[1].write(1).unwrap();
        }
        drop(txq);
        drop(g);
    });
}

/// A guest that keeps its TX ring full, for ever, cannot hold its worker: the frontend's
/// hang-up is noticed within one budget and the port serves the next frontend.
#[test]
fn a_guest_that_never_stops_sending_cannot_hold_a_disconnect() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut d = Daemon::start(1, &[]);
    let b = Baseline::take(&d);
    let mut g = Guest::connect(d.sock(), NET);
    // TX on a ring of 1024 (the daemon's largest): a device that served until the ring ran
    // dry would never see it run dry.
    let ring = tx_ring_of_one_frame(&mut g, 1024);
    // Every avail entry names chain 0; the "driver" keeps the ring a whole ring ahead of
    // what the device has used, and kicks.
    let stop = Arc::new(AtomicBool::new(false));
    let (mem, kick, stop2) = (g.mem.clone(), g.kick[1].try_clone().unwrap(), stop.clone());
    let driver = thread::spawn(move || {
        // Kicks rarely: a device that polls on while the avail index moves needs none, and
        // a syscall per round would let the device catch up.
        for round in 0u64.. {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            let used: u16 = mem.read_obj(GuestAddress(ring.used + 2)).unwrap();
            mem.write_obj(used.wrapping_add(ring.size), GuestAddress(ring.avail + 2))
                .unwrap();
            if round % 4096 == 0 {
                let _ = kick.write(1);
            }
        }
    });
    wait_until("the flood served", || d.stat(0, "tx_packets") > 10_000);
    let t0 = Instant::now();
    drop(g.fe);
    wait_until("disconnect completed under the flood", || !d.connected(0));
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    driver.join().unwrap();
    assert!(took < Duration::from_secs(3), "the disconnect took {took:?}");
    b.check(&mut d, "endless TX");
}

/// Guest `g`'s TX ring of `size`, laid out as the spec says, started at 0 and enabled, with
/// one chain in its table: chain 0, a well-formed 60-byte frame.
fn tx_ring_of_one_frame(g: &mut Guest, size: u16) -> SplitLayout {
    let ring = SplitLayout::at(0x18_0000, size);
    g.fe.get_vring_base(1).unwrap();
    g.set_up_ring_at(1, 0, ring);
    enable(&mut g.fe, 1);
    g.mem.write_slice(&[0u8; HDR], GuestAddress(0x10_0000)).unwrap();
    g.mem.write_slice(&frame(60), GuestAddress(0x10_1000)).unwrap();
    ring.put_desc(&g.mem, 0, d(0x10_0000, HDR as u32, F_NEXT, 1));
    ring.put_desc(&g.mem, 1, d(0x10_1000, 60, 0, 0));
    ring
}

/// [`tx_ring_of_one_frame`] of 256 (`--tx-poll-us` watches after 32 chains), with chain 2
/// too: a 4-byte header the daemon refuses.
fn watched_tx_ring(g: &mut Guest) -> SplitLayout {
    let ring = tx_ring_of_one_frame(g, 256);
    ring.put_desc(&g.mem, 2, d(0x10_2000, 4, 0, 0));
    ring
}

/// Names `head` at the ring's next `n` avail positions from `at` and publishes them at once.
fn publish(g: &Guest, ring: SplitLayout, at: u16, n: u16, head: u16) -> u16 {
    for pos in at..at + n {
        ring.put_avail(&g.mem, pos, head);
    }
    g.mem.write_obj(at + n, GuestAddress(ring.avail + 2)).unwrap();
    at + n
}

/// Publishes refused chains one at a time, `gap` apart, without a kick, for `long`; returns
/// the avail index it reached.
fn trickle(g: &Guest, ring: SplitLayout, mut at: u16, gap: Duration, long: Duration) -> u16 {
    let t0 = Instant::now();
    while t0.elapsed() < long {
        at = publish(g, ring, at, 1, 2);
        thread::sleep(gap);
    }
    at
}

/// A driver that sends a burst and then trickles chains (refused ones) without a kick keeps
/// the TX watch (`--tx-poll-us`) going round after round, but only for as long as the
/// chains earn (a window per 32): soon after the first window, the worker asks for kicks
/// and sleeps. The counters say how many watches there were and how many found more.
#[test]
fn a_trickle_soon_runs_out_of_tx_watch() {
    const WINDOW: Duration = Duration::from_millis(100); // --tx-poll-us 100000, its most
    let mut d = Daemon::start(1, &["--tx-poll-us", "100000"]);
    let b = Baseline::take(&d);
    let mut g = Guest::connect(d.sock(), NET);
    let ring = watched_tx_ring(&mut g);
    let at = publish(&g, ring, 0, 32, 0);
    g.kick[1].write(1).unwrap();
    wait_until("the burst served", || d.stat(0, "tx_packets") == 32);
    // Ten windows' worth, a chain every tenth of a window.
    let at = trickle(&g, ring, at, WINDOW / 10, 10 * WINDOW);
    let trickled = u64::from(at - 32);
    let served = d.stat(0, "tx_errors");
    assert!(
        served < trickled / 2,
        "{served} of {trickled} chains served without a kick: the watch outlived its window"
    );
    // Each watch but the last found a chain (the last, unless the window ended in the
    // round after it); each found at least one.
    let (watches, found) = (d.stat(0, "tx_watches"), d.stat(0, "tx_watch_found"));
    assert!(
        found > 0 && found <= served,
        "{found} watches found {served} chains"
    );
    assert!(
        (found..=found + 1).contains(&watches),
        "{watches} watches, {found} found"
    );
    g.kick[1].write(1).unwrap();
    wait_until("the rest served once kicked", || {
        d.stat(0, "tx_errors") == trickled
    });
    assert_eq!(used_idx(&g, ring), at);
    drop(g);
    b.check(&mut d, "a trickle after a burst");
}

/// One poll thread serves two ports. One driver trickles chains after a burst, never
/// kicking: the other port's frame is served within a few windows all the same. Then the
/// driver moves its avail index a ring ahead while it is watched: its ring is broken, no
/// thread spins on it, and the other port goes on.
#[test]
fn a_trickling_driver_cannot_hold_a_poll_thread() {
    const WINDOW: Duration = Duration::from_millis(100);
    let (mut d, b, a, other, ring) = two_ports_on_one_poll_thread();
    let txq = other.queue(1);
    let at = publish(&a, ring, 0, 32, 0);
    wait_until("the burst served", || d.stat(0, "tx_packets") == 32);
    let at = thread::scope(|s| {
        let driver = s.spawn(|| trickle(&a, ring, at, WINDOW / 10, 20 * WINDOW));
        other_port_is_served_within(&d, &other, &txq, 3 * WINDOW, 6 * WINDOW);
        driver.join().unwrap()
    });
    wait_until("every trickled chain served", || {
        d.stat(0, "tx_errors") == u64::from(at - 32)
    });
    // A ring ahead, while the watch after a burst runs.
    let at = publish(&a, ring, at, 32, 0);
    wait_until("the second burst used", || used_idx(&a, ring) == at);
    a.mem
        .write_obj(at.wrapping_add(3 * ring.size), GuestAddress(ring.avail + 2))
        .unwrap();
    wait_until("ring marked broken", || d.stat(0, "rings_broken") == 1);
    post_tx(&other, &txq, 1);
    wait_until("the other port served again", || d.stat(1, "tx_packets") == 2);
    thread::sleep(3 * WINDOW);
    assert_eq!(d.stat(0, "tx_packets"), 64, "the broken ring was served");
    assert_eq!(d.stat(0, "rings_broken"), 1);
    drop(txq);
    drop((other, a));
    wait_until("port 1 idle", || !d.connected(1));
    b.check(&mut d, "a trickle on a shared poll thread");
}

/// A driver that adds a burst just inside each window earns watching for every one, up to
/// its budget (16 windows here); a poll thread shares itself with its other queues all the
/// same: a visit watches 4 windows at most (budget.rs POLL_WATCH_WINDOWS).
#[test]
fn a_bursting_driver_holds_a_poll_thread_a_few_windows_at_most() {
    const WINDOW: Duration = Duration::from_millis(100);
    let (mut d, b, a, other, ring) = two_ports_on_one_poll_thread();
    let txq = other.queue(1);
    let at = thread::scope(|s| {
        let driver = s.spawn(|| {
            let (mut at, t0) = (0, Instant::now());
            while t0.elapsed() < 20 * WINDOW {
                at = publish(&a, ring, at, 32, 2);
                thread::sleep(WINDOW / 2);
            }
            at
        });
        other_port_is_served_within(&d, &other, &txq, 3 * WINDOW, 6 * WINDOW);
        driver.join().unwrap()
    });
    wait_until("every burst served", || d.stat(0, "tx_errors") == u64::from(at));
    drop(txq);
    drop((other, a));
    wait_until("port 1 idle", || !d.connected(1));
    b.check(&mut d, "bursts just inside each window on a shared poll thread");
}

/// A daemon with one poll thread and `--tx-poll-us 100000`, and two guests on it: port 0's,
/// with its TX ring watched (`watched_tx_ring`), and port 1's.
fn two_ports_on_one_poll_thread() -> (Daemon, Baseline, Guest, Guest, SplitLayout) {
    let d = Daemon::start(2, &["--poll", "1", "--tx-poll-us", "100000"]);
    let b = Baseline::take(&d);
    let mut a = Guest::connect(&d.socks[0], NET);
    let other = Guest::connect(&d.socks[1], NET);
    let ring = watched_tx_ring(&mut a);
    (d, b, a, other, ring)
}

/// After `after`, port 1 sends its first frame, which must be served within `within` on
/// the poll thread it shares with port 0.
fn other_port_is_served_within(
    d: &Daemon,
    other: &Guest,
    txq: &MockSplitQueue<'_, GuestMemoryMmap>,
    after: Duration,
    within: Duration,
) {
    thread::sleep(after);
    let t0 = Instant::now();
    post_tx(other, txq, 0);
    wait_until("the other port's frame", || d.stat(1, "tx_packets") == 1);
    let took = t0.elapsed();
    assert!(
        took < within,
        "the other port waited {took:?} for the poll thread"
    );
}

/// `d` (a descriptor) under another name, for closures where `d` is the daemon.
fn d_(addr: u64, len: u32, flags: u16, next: u16) -> virtio_queue::desc::RawDescriptor {
    d(addr, len, flags, next)
}

/// A guest whose receive ring is broken: frames flooded to it from another port are
/// dropped and counted, and the other port goes on as if nothing happened.
#[test]
fn a_broken_receive_ring_does_not_slow_its_senders() {
    let mut d = Daemon::start(2, &[]);
    let b = Baseline::take(&d);
    let victim = Guest::connect(&d.socks[0], NET);
    let rxq = victim.queue(0);
    rxq.avail().idx().store(QSIZE * 2);
    let sender = Guest::connect(&d.socks[1], NET);
    let txq = sender.queue(1);
    let ticks = d.cpu_ticks();
    let frames = QSIZE / 2;
    for round in 0..frames {
        post_tx(&sender, &txq, round);
        sender.kick[1].write(1).unwrap();
        wait_until("sender's frame used", || txq.used().idx().load() == round + 1);
    }
    assert_eq!(d.stat(0, "rings_broken"), 1);
    assert_eq!(d.stat(1, "tx_packets"), u64::from(frames));
    // The first frame found the ring broken; the rest were dropped without a look at it.
    assert_eq!(d.stat(0, "rx_errors"), 1);
    assert_eq!(d.stat(0, "rx_dropped"), u64::from(frames) - 1);
    assert!(d.cpu_ticks() - ticks < 100);
    drop(rxq);
    drop(txq);
    drop(victim);
    drop(sender);
    wait_until("port 1 idle", || !d.connected(1));
    b.check(&mut d, "broken receive ring");
}

/// A frontend truncates its memory file under the daemon: the access that would have raised
/// SIGBUS reads zeros, that connection ends, and the daemon goes on.
#[test]
fn guest_memory_that_shrinks_ends_only_its_connection() {
    let mut d = Daemon::start(1, &[]);
    case(&mut d, "memory file truncated after mapping", |d| {
        let g = Guest::connect(d.sock(), NET);
        let txq = g.queue(1);
        stage_tx(&g, &txq, 0);
        // The rings are in the first pages; the frame's buffers at 1 MiB. Cut the file
        // below the buffers, so only the frame's copy faults. The chain is published only
        // then: a worker that looks at the ring on its own (at attach) must not copy the
        // frame before the cut.
        g.file.set_len(0x10_0000).unwrap();
        txq.avail().idx().store(1);
        g.kick[1].write(1).unwrap();
        wait_until("fault survived", || d.stat(0, "memory_faults") >= 1);
        wait_until("connection ended", || !d.connected(0));
    });
    assert!(d.log_text().contains("is gone"));
}

/// The control socket: one connection may ask for ever, an oversized line gets a JSON error,
/// and clients past the cap are told so.
#[test]
fn control_clients_are_bounded_per_line_and_in_number() {
    let mut d = Daemon::start(1, &[]);
    let b = Baseline::take(&d);
    let refused_before = refused_controls(&d.ctl(r#"{"cmd":"stats"}"#));
    let s = UnixStream::connect(&d.ctl).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    // More than the 64 KiB the whole connection used to be allowed.
    for _ in 0..5000 {
        w.write_all(b"{\"cmd\":\"action-list\"}\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("{\"actions\":"), "{line}");
    }
    drop((w, r));
    let mut big = UnixStream::connect(&d.ctl).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = big.write_all(&vec![b'x'; 200 * 1024]);
    let mut line = String::new();
    BufReader::new(big).read_line(&mut line).unwrap();
    assert!(line.contains("request longer than 65536 bytes"), "{line}");
    // The two clients above end on the server's side in their own time: until they have,
    // a new client may be refused. Each of the 16 held here is answered once, so all 16
    // hold a slot before the 17th connects. Every refusal the test meets is counted, so
    // that the daemon's count is checked exactly.
    let mut seen_refused = 1; // the oversized line
    let held: Vec<UnixStream> = (0..16)
        .map(|_| client_with_a_slot(&d, &mut seen_refused))
        .collect();
    let mut extra = UnixStream::connect(&d.ctl).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = String::new();
    BufReader::new(&mut extra).read_line(&mut line).unwrap();
    assert!(is_refusal(&line), "{line}");
    seen_refused += 1;
    drop(held);
    // Until the server has seen the held clients go, a request may be refused too.
    let mut refused = None;
    wait_until("a slot again", || {
        let v = d.ctl(r#"{"cmd":"stats"}"#);
        if is_refusal(&v.to_string()) {
            seen_refused += 1;
            return false;
        }
        refused = Some(refused_controls(&v));
        true
    });
    assert_eq!(refused, Some(refused_before + seen_refused));
    b.check(&mut d, "control clients");
}

fn is_refusal(line: &str) -> bool {
    line.contains("too many control clients")
}

/// `ctl stats`' count of refused control clients.
fn refused_controls(stats: &serde_json::Value) -> u64 {
    stats["clients_refused"]["control"]
        .as_u64()
        .unwrap_or_else(|| panic!("no clients_refused.control in {stats}"))
}

/// A control client the server has answered once, so it holds one of the slots. A client
/// refused while earlier ones are still ending is dropped, counted in `refusals`, and
/// another connects.
fn client_with_a_slot(d: &Daemon, refusals: &mut u64) -> UnixStream {
    let mut held = None;
    wait_until("a control slot", || {
        let (s, line) = d.ctl_client(r#"{"cmd":"action-list"}"#);
        if is_refusal(&line) {
            *refusals += 1;
            return false;
        }
        assert!(line.starts_with("{\"actions\":"), "{line}");
        held = Some(s);
        true
    });
    held.expect("wait_until returned, so a client was answered")
}

fn metrics_addr(d: &Daemon) -> SocketAddr {
    let mut found = None;
    wait_until("metrics address in the log", || {
        found = d
            .log_text()
            .lines()
            .find_map(|l| l.split("metrics at http://").nth(1))
            .and_then(|r| r.trim_end_matches("/metrics").parse().ok());
        found.is_some()
    });
    found.unwrap()
}

fn http(addr: SocketAddr, req: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(req);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// `--metrics` answers what it should and nothing a client sends can kill or hold it.
#[test]
fn metrics_clients_cannot_kill_or_hold_the_daemon() {
    let mut d = Daemon::start(1, &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&d);
    let b = Baseline::take(&d);
    let ok = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        ok.starts_with("HTTP/1.1 200 OK") && ok.contains("dpaa_vnic_connections_total"),
        "{ok}"
    );
    let r = http(
        addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\nabc",
    );
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    long.extend(std::iter::repeat_n(b'a', 100_000));
    assert!(http(addr, &long).starts_with("HTTP/1.1 431"));
    assert!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(http(addr, b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    // A local user holds two thousand connections that say nothing, and
    // reconnects as they are cut, while another scrapes. Every scrape is answered, each
    // within two seconds; the held connections cost a descriptor each and are dropped,
    // oldest first, past the server's cap or when their time is up.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let quit = Arc::new(AtomicBool::new(false));
    let q = quit.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let squatter = thread::spawn(move || {
        let mut held: std::collections::VecDeque<TcpStream> = std::collections::VecDeque::new();
        let mut made = 0u64;
        while !q.load(Ordering::Relaxed) {
            if let Ok(s) = TcpStream::connect(addr) {
                held.push_back(s);
                made += 1;
            }
            if held.len() > 2000 {
                held.pop_front();
            }
            if made == 1500 {
                let _ = ready_tx.send(());
            }
        }
        made
    });
    // More than the server holds (1024) before the first scrape: it has made room by
    // dropping the oldest ones.
    ready.recv_timeout(Duration::from_secs(60)).unwrap();
    let mut slowest = Duration::ZERO;
    for _ in 0..30 {
        let t0 = Instant::now();
        let r = http(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        slowest = slowest.max(t0.elapsed());
        assert!(
            r.starts_with("HTTP/1.1 200"),
            "a scrape under the squat got {r:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    quit.store(true, Ordering::Relaxed);
    let made = squatter.join().unwrap();
    eprintln!("30 scrapes answered while {made} idle connections were made; slowest {slowest:?}");
    assert!(made > 1500, "the squatter made only {made} connections");
    assert!(slowest < Duration::from_secs(2), "slowest scrape {slowest:?}");
    // One that stays silent gets a 408 once its time is up.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(d.alive());
    b.check(&mut d, "metrics clients");
}

/// Sockets: created 0600 (or as asked), never in place of a file, and the relay's channel
/// to the request handler is nothing another process could bind or reach.
#[test]
fn sockets_are_private_and_nothing_is_squatted() {
    let mut d = Daemon::start(1, &[]);
    for p in [d.sock(), d.ctl.as_path()] {
        let m = std::fs::metadata(p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{}", p.display());
    }
    let b = Baseline::take(&d);
    let g = Guest::connect(d.sock(), NET);
    // While a frontend is connected: no abstract socket of ours, no stray directory left.
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    assert!(!unix.contains("@dpaa-vnic"), "an abstract name is bound");
    let names: Vec<String> = std::fs::read_dir(d.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".dpaa-vnic")), "{names:?}");
    drop(g);
    b.check(&mut d, "private channel");
    // A file where a socket should be is refused, and left as it was.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("not-a-socket");
    std::fs::write(&f, b"keep").unwrap();
    let out = Command::new(BIN).arg("--socket").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read(&f).unwrap(), b"keep");
}

/// Connecting and disconnecting ten thousand times, bare, with a full handshake, and with
/// rings started and frames sent, leaves descriptors and threads exactly where they were
/// and the daemon's own memory within a small bound.
#[test]
fn ten_thousand_connections_leak_nothing() {
    let d = Daemon::start(1, &["--queues", "8"]);
    let n: u64 = std::env::var("VNIC_LEAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let kinds: [(&str, &dyn Fn()); 3] = [
        ("bare connect", &|| drop(UnixStream::connect(d.sock()).unwrap())),
        ("full handshake", &|| {
            let g = Guest::connect_enabling(d.sock(), NET, &[], 0);
            g.fe.get_features().unwrap();
        }),
        ("rings started", &|| {
            let g = Guest::connect(d.sock(), NET);
            let txq = g.queue(1);
            post_tx(&g, &txq, 0);
            g.kick[1].write(1).unwrap();
        }),
    ];
    let mut total = 0;
    for (name, once) in kinds {
        // Warm up: allocator arenas, thread stacks and the log file reach their size.
        for _ in 0..100 {
            once();
        }
        total += 100;
        d.wait_idle(total);
        let (fds, threads, rss) = d.settled();
        let t0 = Instant::now();
        for i in 0..n {
            once();
            if i % 1000 == 999 {
                eprintln!("{name}: {} of {n} ({:?})", i + 1, t0.elapsed());
            }
        }
        total += n;
        d.wait_idle(total);
        let (fds2, threads2, rss2) = d.settled();
        eprintln!("{name}: fds {fds} -> {fds2}, threads {threads} -> {threads2}, RssAnon {rss} -> {rss2} kB");
        assert_eq!(fds2, fds, "{name}: descriptors");
        assert_eq!(threads2, threads, "{name}: threads");
        assert!(rss2 <= rss + 2048, "{name}: RssAnon grew from {rss} to {rss2} kB");
    }
}
