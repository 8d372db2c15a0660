//! The in-process L2 switch that joins ports: unicast to the learned port, unknown unicast,
//! broadcast and multicast flooded to every other port.

use std::sync::{Arc, OnceLock};

use super::fdb::Fdb;
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
}

/// Where a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Unicast(usize),
    Flooded,
    /// The destination is the port it came from (or a runt): nothing to do.
    Dropped,
}

pub struct Switch {
    ports: Vec<OnceLock<Arc<dyn Egress>>>,
    fdb: Fdb,
}

impl Switch {
    pub fn new(nports: usize) -> Self {
        Switch {
            ports: (0..nports).map(|_| OnceLock::new()).collect(),
            fdb: Fdb::default(),
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

    pub fn forward(&self, src: usize, flow: usize, pkt: &mut Packet<'_>) -> Forwarded {
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
                    p.send(flow, pkt);
                    return Forwarded::Unicast(out);
                }
            }
        }
        for (i, p) in self.ports.iter().enumerate() {
            if i != src {
                if let Some(p) = p.get() {
                    p.send(flow, pkt);
                }
            }
        }
        Forwarded::Flooded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Sink(Mutex<Vec<Vec<u8>>>);

    impl Egress for Sink {
        fn send(&self, _flow: usize, pkt: &mut Packet<'_>) {
            self.0.lock().unwrap().push(pkt.frame.to_vec());
        }
    }

    fn frame(dst: &str, src: &str) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst.parse::<MacAddr>().unwrap().0);
        f.extend_from_slice(&src.parse::<MacAddr>().unwrap().0);
        f.extend_from_slice(&[0x08, 0x00, 0x45]);
        f
    }

    #[test]
    fn learns_then_unicasts_and_floods_the_rest() {
        let sw = Switch::new(3);
        let sinks: Vec<Arc<Sink>> = (0..3).map(|_| Arc::new(Sink::default())).collect();
        for (i, s) in sinks.iter().enumerate() {
            sw.attach(i, s.clone());
        }
        let a = "02:00:00:00:00:0a";
        let b = "02:00:00:00:00:0b";
        // Unknown destination: flooded to ports 1 and 2, never back to 0.
        let mut f = frame(b, a);
        let mut p = Packet {
            hdr: VirtioNetHdr::default(),
            frame: &mut f,
        };
        assert_eq!(sw.forward(0, 0, &mut p), Forwarded::Flooded);
        assert_eq!(
            sinks
                .iter()
                .map(|s| s.0.lock().unwrap().len())
                .collect::<Vec<_>>(),
            vec![0, 1, 1]
        );
        // b answers from port 2: a is known on 0, so only port 0 gets it.
        let mut f = frame(a, b);
        let mut p = Packet {
            hdr: VirtioNetHdr::default(),
            frame: &mut f,
        };
        assert_eq!(sw.forward(2, 0, &mut p), Forwarded::Unicast(0));
        assert_eq!(
            sinks
                .iter()
                .map(|s| s.0.lock().unwrap().len())
                .collect::<Vec<_>>(),
            vec![1, 1, 1]
        );
        // Broadcast floods; a frame for a station on its own port is dropped.
        let mut f = frame("ff:ff:ff:ff:ff:ff", a);
        assert_eq!(
            sw.forward(
                0,
                0,
                &mut Packet {
                    hdr: VirtioNetHdr::default(),
                    frame: &mut f
                }
            ),
            Forwarded::Flooded
        );
        let mut f = frame(a, "02:00:00:00:00:0c");
        assert_eq!(
            sw.forward(
                0,
                0,
                &mut Packet {
                    hdr: VirtioNetHdr::default(),
                    frame: &mut f
                }
            ),
            Forwarded::Dropped
        );
        let mut runt = vec![0u8; 5];
        assert_eq!(
            sw.forward(
                0,
                0,
                &mut Packet {
                    hdr: VirtioNetHdr::default(),
                    frame: &mut runt
                }
            ),
            Forwarded::Dropped
        );
    }
}
