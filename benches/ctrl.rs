//! The control queue's round trip between two cores, as a guest driver sees it: one thread
//! plays the Linux driver (writes the command and its indirect descriptor table, publishes
//! the avail index, spins on the used index, reads the ack), the other serves the ring with
//! the daemon's pieces (`pop_ctrl`, `NicState::parse`, ack, `add_used`, `NicState::execute`)
//! while polling the avail index, as the control thread does after a command. The time is
//! the driver's, per command: what a join waits for, without TCG and QEMU around it. The
//! baseline, in the same run as the daemon's way, applies a table set before answering it;
//! the daemon answers first (ctrl_queue.rs). PROMISC, which is applied before its answer
//! either way, is the control row: its ratio is the run's noise.
//!
//! cargo bench --bench ctrl

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use dpaa_vnic::device::features::{offered, Negotiated};
use dpaa_vnic::device::filter::{FilterRegs, Layout};
use dpaa_vnic::device::NicState;
use dpaa_vnic::ports::vhost_user::pop_ctrl;
use dpaa_vnic::wire::MacAddr;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const QSIZE: u16 = 64;
const DESC: u64 = 0x1_0000;
const AVAIL: u64 = 0x1_1000;
const USED: u64 = 0x1_2000;
/// The driver's control buffer: header, then the ack (Linux keeps both in one struct), then
/// the one-byte data of an rx-mode command.
const CTRL: u64 = 0x2_0000;
const ACK: u64 = CTRL + 2;
const DATA: u64 = CTRL + 4;
/// Multicast table of a MAC_TABLE_SET (the unicast table, empty, sits in front of it).
const TABLE: u64 = 0x3_0000;
/// The command's indirect descriptor table.
const INDIRECT: u64 = 0x4_0000;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// What the driver sends each time.
#[derive(Clone, Copy)]
enum Cmd {
    /// VIRTIO_NET_CTRL_RX_PROMISC off: header, one byte, ack.
    Promisc,
    /// VIRTIO_NET_CTRL_MAC_TABLE_SET with N multicast addresses, alternately N and N + 1.
    Table(usize),
}

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
}

/// Descriptor `i` of the command's indirect table. The last one (no NEXT) also writes the
/// ring's head descriptor, which names the table: Linux posts each control command this way
/// when INDIRECT_DESC is negotiated, as both attachments do.
fn desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let d = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
    mem.write_obj(d, GuestAddress(INDIRECT + 16 * u64::from(i)))
        .unwrap();
    if flags & F_NEXT == 0 {
        let n = u32::from(i) + 1;
        let head = RawDescriptor::from(Descriptor::new(INDIRECT, 16 * n, F_INDIRECT, 0));
        mem.write_obj(head, GuestAddress(DESC)).unwrap();
    }
}

/// The driver's side of command number `k`: write it, post it, wait for the used entry.
fn drive(mem: &GuestMemoryMmap, cmd: Cmd, k: u16) {
    match cmd {
        Cmd::Promisc => {
            mem.write_slice(&[0, 0], GuestAddress(CTRL)).unwrap();
            mem.write_obj(0u8, GuestAddress(DATA)).unwrap();
            desc(mem, 0, CTRL, 2, F_NEXT, 1);
            desc(mem, 1, DATA, 1, F_NEXT, 2);
            desc(mem, 2, ACK, 1, F_WRITE, 0);
        }
        Cmd::Table(n) => {
            let n = n + usize::from(k % 2);
            mem.write_slice(&[1, 0], GuestAddress(CTRL)).unwrap();
            mem.write_obj(0u32, GuestAddress(DATA)).unwrap();
            let mut t = Vec::with_capacity(4 + 6 * n);
            t.extend_from_slice(&(n as u32).to_le_bytes());
            for i in 0..n as u64 {
                t.extend_from_slice(&MacAddr::from_u64(0x0100_5e00_0000 + i).0);
            }
            mem.write_slice(&t, GuestAddress(TABLE)).unwrap();
            desc(mem, 0, CTRL, 2, F_NEXT, 1);
            desc(mem, 1, DATA, 4, F_NEXT, 2);
            desc(mem, 2, TABLE, t.len() as u32, F_NEXT, 3);
            desc(mem, 3, ACK, 1, F_WRITE, 0);
        }
    }
    mem.write_obj(0xffu8, GuestAddress(ACK)).unwrap();
    mem.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * u64::from(k % QSIZE)))
        .unwrap();
    mem.store(
        k.wrapping_add(1).to_le(),
        GuestAddress(AVAIL + 2),
        Ordering::Release,
    )
    .unwrap();
    while u16::from_le(mem.load(GuestAddress(USED + 2), Ordering::Acquire).unwrap()) != k.wrapping_add(1) {
        std::hint::spin_loop();
    }
    let ack: u8 = mem.read_obj(GuestAddress(ACK)).unwrap();
    assert_eq!(ack, 0, "command {k} refused");
}

/// The daemon's side: poll the avail index, serve what arrives, until `stop`; as the daemon
/// does while `shipped` is set, else applying a table set before its answer.
fn serve(mem: &GuestMemoryMmap, stop: &AtomicBool, shipped: &AtomicBool) {
    let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    let feat = Negotiated { bits: offered(1) };
    let mut nic = NicState::new(mac, 1, Arc::new(FilterRegs::new(Layout::Memac, mac)), 4096);
    let mut q = Queue::new(QSIZE).unwrap();
    q.set_size(QSIZE);
    q.try_set_desc_table_address(GuestAddress(DESC)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(AVAIL)).unwrap();
    q.try_set_used_ring_address(GuestAddress(USED)).unwrap();
    q.set_ready(true);
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let idx = u16::from_le(mem.load(GuestAddress(AVAIL + 2), Ordering::Acquire).unwrap());
        if idx == q.next_avail() {
            std::hint::spin_loop();
            continue;
        }
        let answer_first = shipped.load(Ordering::Relaxed);
        let Some((head, chain)) = pop_ctrl(&mut q, mem, &mut buf, 1 << 20).unwrap() else {
            continue;
        };
        let c = chain.unwrap();
        let (ack, later) = match nic.parse(&feat, &buf[..c.len]) {
            Ok(table) if answer_first && table.is_table_set() => (0u8, Some(table)),
            Ok(cmd) => {
                nic.execute(cmd);
                (0, None)
            }
            Err(_) => (1, None),
        };
        let ack_addr = c.ack.unwrap();
        mem.write_obj(ack, ack_addr).unwrap();
        q.add_used(mem, head, 1).unwrap();
        if let Some(table) = later {
            nic.execute(table);
        }
    }
    black_box(&nic);
}

/// Keeps the calling thread on one CPU, so every variant runs with the same placement: the
/// driver on CPU 0, the daemon on CPU 1, as a guest's vCPU and the control thread would.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
    // sched_setaffinity only reads it. Failure (a machine with one CPU) leaves things be.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Blocks of commands timed both ways, alternating (and alternating
/// which goes first), so that both see the same machine: on this shared host the same
/// round trip measures 0.8 or 1.5 us depending on where the host runs the two CPUs.
const ROUNDS: usize = 200;
const BLOCK: u16 = 256;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    pin(0);
    println!("control round trip between two threads, {ROUNDS} rounds of {BLOCK} commands per variant");
    println!(
        "{:<22} {:>20} {:>14} {:>14} {:>20}",
        "command", "baseline", "its time", "as shipped", "per-round ratio"
    );
    for (name, cmd) in [
        ("PROMISC off", Cmd::Promisc),
        ("MAC_TABLE_SET 1000", Cmd::Table(1000)),
        ("MAC_TABLE_SET 10000", Cmd::Table(10000)),
    ] {
        let mem = mem();
        let stop = AtomicBool::new(false);
        let shipped = AtomicBool::new(false);
        let (mut off, mut on, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        thread::scope(|s| {
            s.spawn(|| {
                pin(1);
                serve(&mem, &stop, &shipped)
            });
            let mut k = 0u16;
            let mut block = |with: bool| {
                shipped.store(with, Ordering::Relaxed);
                // Let the setting reach the server before timing.
                for _ in 0..8 {
                    drive(&mem, cmd, k);
                    k = k.wrapping_add(1);
                }
                let t0 = Instant::now();
                for _ in 0..BLOCK {
                    drive(&mem, cmd, k);
                    k = k.wrapping_add(1);
                }
                t0.elapsed().as_nanos() as f64 / f64::from(BLOCK)
            };
            for r in 0..ROUNDS {
                let (a, b) = if r % 2 == 0 {
                    let a = block(false);
                    (a, block(true))
                } else {
                    let b = block(true);
                    (block(false), b)
                };
                off.push(a);
                on.push(b);
                ratio.push(b / a);
            }
            stop.store(true, Ordering::Relaxed);
        });
        let base = "applied, then acked";
        println!(
            "{:<22} {:>20} {:>11.0} ns {:>11.0} ns {:>20.3}",
            name,
            base,
            median(&mut off),
            median(&mut on),
            median(&mut ratio)
        );
    }
}
