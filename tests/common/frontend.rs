//! A vhost-user frontend for tests: vhost's own `Frontend` with shared guest memory and
//! `MockSplitQueue` rings, set up as QEMU does. Each test binary uses what it needs.
#![allow(dead_code)]

use std::fs::File;
use std::path::Path;

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
    MmapRegion,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub const MEM_SIZE: usize = 0x20_0000;
pub const QSIZE: u16 = 16;
pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;
/// Queue base addresses (guest physical) for RX, TX and control.
pub const QBASE: [u64; 3] = [0x1000, 0x4000, 0x8000];

/// Where a split ring's three parts lie in guest memory, and its size.
#[derive(Debug, Clone, Copy)]
pub struct SplitLayout {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub size: u16,
}

impl SplitLayout {
    /// The virtio spec's layout of a ring of `size` at `base` (no MockSplitQueue quirk).
    pub fn at(base: u64, size: u16) -> SplitLayout {
        let avail = base + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size)).next_multiple_of(4);
        SplitLayout {
            desc: base,
            avail,
            used,
            size,
        }
    }

    /// Writes descriptor `i` of the table, as a driver fills it.
    pub fn put_desc(&self, mem: &GuestMemoryMmap, i: u16, desc: RawDescriptor) {
        mem.write_obj(desc, GuestAddress(self.desc + 16 * u64::from(i)))
            .unwrap();
    }

    /// Names chain `head` at avail position `pos` (modulo the ring's size). The avail index
    /// is the caller's to move.
    pub fn put_avail(&self, mem: &GuestMemoryMmap, pos: u16, head: u16) {
        let entry = self.avail + 4 + 2 * u64::from(pos % self.size);
        mem.write_obj(head, GuestAddress(entry)).unwrap();
    }
}

pub const VERSION_1: u64 = 1 << 32;
pub const GUEST_CSUM: u64 = 1 << 1;
pub const MRG_RXBUF: u64 = 1 << 15;
pub const CTRL_VQ: u64 = 1 << 17;
pub const CTRL_RX: u64 = 1 << 18;
pub const CTRL_VLAN: u64 = 1 << 19;
pub const PROTOCOL_FEATURES: u64 = 1 << 30;

pub fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

/// A connected, fully set up frontend with shared guest memory, like QEMU after boot.
pub struct Guest {
    pub fe: Frontend,
    pub mem: GuestMemoryMmap,
    pub kick: Vec<EventFd>,
    pub call: Vec<EventFd>,
    /// Where the guest memory is mapped in this process (vhost-user speaks these addresses).
    pub host_base: u64,
    /// The file behind the guest memory.
    pub file: File,
}

impl Guest {
    /// The driver's view of queue `i`. Creating it initialises the rings, so each test
    /// makes it once, before the first chain.
    pub fn queue(&self, i: usize) -> MockSplitQueue<'_, GuestMemoryMmap> {
        MockSplitQueue::create(&self.mem, GuestAddress(QBASE[i]), QSIZE)
    }

    pub fn connect(path: &Path, features: u64) -> Guest {
        Guest::connect_enabling(path, features, &[0, 1, 2], 0)
    }

    /// Sets up all three rings as QEMU does, but enables only `enabled`; the control ring
    /// starts at avail index `ctrl_base` (0 for a fresh driver, more for a reconnect).
    pub fn connect_enabling(path: &Path, features: u64, enabled: &[usize], ctrl_base: u16) -> Guest {
        let mut fe = Frontend::connect(path, 3).unwrap();
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        assert_eq!(
            features & !offered,
            0,
            "asking for features the device does not offer"
        );
        let pf = fe.get_protocol_features().unwrap();
        let want = VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK;
        assert!(pf.contains(want));
        fe.set_protocol_features(pf & want).unwrap();
        assert!(fe.get_queue_num().unwrap() >= 3);

        let file = tempfile::tempfile().unwrap();
        file.set_len(MEM_SIZE as u64).unwrap();
        let region =
            MmapRegion::<()>::from_file(FileOffset::new(file.try_clone().unwrap(), 0), MEM_SIZE).unwrap();
        let mem = GuestMemoryMmap::from_regions(vec![GuestRegionMmap::new(region, GuestAddress(0)).unwrap()])
            .unwrap();
        let r = mem.find_region(GuestAddress(0)).unwrap();
        let host_base = r.get_host_address(vm_memory::MemoryRegionAddress(0)).unwrap() as u64;
        fe.set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(r).unwrap()])
            .unwrap();

        let mut g = Guest {
            fe,
            mem,
            kick: Vec::new(),
            call: Vec::new(),
            host_base,
            file,
        };
        for (i, base) in QBASE.iter().enumerate() {
            let q = MockSplitQueue::create(&g.mem, GuestAddress(*base), QSIZE);
            if i == 2 {
                // Where the previous backend left it; the backend reads it at SET_VRING_ADDR.
                q.used().idx().store(ctrl_base);
            }
            g.kick.push(EventFd::new(EFD_NONBLOCK).unwrap());
            g.call.push(EventFd::new(EFD_NONBLOCK).unwrap());
            g.set_up_ring(i, if i == 2 { ctrl_base } else { 0 });
        }
        g.fe.set_features(features).unwrap();
        for &i in enabled {
            enable(&mut g.fe, i);
        }
        g
    }

    /// QEMU's messages for one ring, short of the enable.
    pub fn set_up_ring(&mut self, i: usize, base: u16) {
        // MockSplitQueue's layout: descriptors, then the avail ring, then the used ring at
        // a 4-byte boundary QSIZE bytes (not entries: the 0.18 quirk the tests stay clear
        // of) past the avail entries.
        let desc = QBASE[i];
        let avail = desc + 16 * u64::from(QSIZE);
        let used = (avail + 4 + u64::from(QSIZE)).next_multiple_of(4);
        self.set_up_ring_at(
            i,
            base,
            SplitLayout {
                desc,
                avail,
                used,
                size: QSIZE,
            },
        );
    }

    /// QEMU's messages for one ring at a layout of the caller's (guest addresses), short of
    /// the enable.
    pub fn set_up_ring_at(&mut self, i: usize, base: u16, at: SplitLayout) {
        // vhost-user carries the frontend's virtual addresses.
        let cfg = VringConfigData {
            queue_max_size: at.size,
            queue_size: at.size,
            flags: 0,
            desc_table_addr: self.host_base + at.desc,
            used_ring_addr: self.host_base + at.used,
            avail_ring_addr: self.host_base + at.avail,
            log_addr: None,
        };
        self.fe.set_vring_num(i, at.size).unwrap();
        self.fe.set_vring_addr(i, &cfg).unwrap();
        self.fe.set_vring_base(i, base).unwrap();
        self.fe.set_vring_call(i, &self.call[i]).unwrap();
        self.fe.set_vring_kick(i, &self.kick[i]).unwrap();
    }

    /// Stops ring `i` and starts it again where it stopped, as QEMU does around a VM pause;
    /// returns that index.
    pub fn pause_and_resume_ring(&mut self, i: usize) -> u16 {
        let stopped = self.fe.get_vring_base(i).unwrap() as u16;
        self.set_up_ring(i, stopped);
        enable(&mut self.fe, i);
        stopped
    }
}

/// Enables ring `i` and waits for the backend's answer, as QEMU does from the vCPU thread
/// that wrote DRIVER_OK.
pub fn enable(fe: &mut Frontend, i: usize) {
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    fe.set_vring_enable(i, true).unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::empty());
}

/// Where receive buffer `i` lies in [`rx_ring`]: 2 KiB each.
pub fn rx_buf(i: u16) -> u64 {
    0x10_0000 + 0x800 * u64::from(i)
}

/// Guest A's TX ring and guest B's RX ring, `size` entries each, laid out as the spec says
/// (so that a burst can outgrow a batch), started again at 0 and enabled; B posts
/// `buffers` receive buffers ([`rx_ring`]). Returns the TX and RX layouts.
pub fn two_guest_rings(a: &mut Guest, b: &mut Guest, size: u16, buffers: u16) -> (SplitLayout, SplitLayout) {
    let txr = SplitLayout::at(0x18_0000, size);
    a.fe.get_vring_base(1).unwrap();
    a.set_up_ring_at(1, 0, txr);
    enable(&mut a.fe, 1);
    (txr, rx_ring(b, size, buffers))
}

/// `g`'s RX ring, `size` entries, started again at 0 and enabled, with `buffers` receive
/// buffers of 2 KiB posted ([`rx_buf`]), one descriptor each. Returns its layout.
pub fn rx_ring(g: &mut Guest, size: u16, buffers: u16) -> SplitLayout {
    let rxr = SplitLayout::at(0x1a_0000, size);
    g.fe.get_vring_base(0).unwrap();
    g.set_up_ring_at(0, 0, rxr);
    enable(&mut g.fe, 0);
    for i in 0..buffers {
        rxr.put_desc(&g.mem, i, d(rx_buf(i), 2048, F_WRITE, 0));
        rxr.put_avail(&g.mem, i, i);
    }
    g.mem.write_obj(buffers, GuestAddress(rxr.avail + 2)).unwrap();
    rxr
}

/// The used index of `ring` in `g`'s memory.
pub fn used_idx(g: &Guest, ring: SplitLayout) -> u16 {
    g.mem.read_obj::<u16>(GuestAddress(ring.used + 2)).unwrap()
}
