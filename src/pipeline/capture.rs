//! Per-port capture (`ctl capture`): the switch hands a copy of each frame a port sends or
//! is offered to the port's [`Capture`], with what became of it, and a control thread
//! drains the records into a pcapng stream (control/capture.rs).
//!
//! A capture is armed through the rules snapshot ([`super::Rules::capture`]), which every
//! worker already loads once per batch: with none armed, the switch's only cost is one
//! test of a field it has in hand, and while one is armed every frame takes the general
//! path (`Switch::forward`), where the hooks are; docs/architecture.md says why the two
//! paths deliver the same frames.
//!
//! Bounded both ways: at most [`RING`] records wait for the control thread, each holding
//! at most the capture's snap length; a record that does not fit is counted in
//! [`Capture::lost`] and the frame goes on unharmed. Buffers come back from the control
//! thread for reuse, so a capture in its steady state allocates nothing per frame, and
//! workers never wait on each other or on the reader (lock-free queues, crossbeam-queue
//! 0.3's `ArrayQueue`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_queue::ArrayQueue;

/// Records a capture holds for its reader at most.
pub const RING: usize = 512;

/// The largest snap length a capture takes: the largest frame a port carries (a GSO frame
/// of 64 KiB and its Ethernet header) fits whole.
pub const MAX_SNAPLEN: u32 = 65_535 + 14;

/// Which way a frame went, seen from the captured port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Sent by the port into the switch (from the guest, or read from the tap).
    Sent,
    /// Offered by the switch to the port (to the guest, or written to the tap), whether
    /// the port took it or not.
    Offered,
}

impl Way {
    /// 0 for sent, 1 for offered: the order of a capture's interfaces.
    pub fn index(self) -> usize {
        match self {
            Way::Sent => 0,
            Way::Offered => 1,
        }
    }
}

/// Which of the port's two ways a capture records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ways {
    pub sent: bool,
    pub offered: bool,
}

impl Ways {
    pub const BOTH: Ways = Ways {
        sent: true,
        offered: true,
    };

    fn has(self, way: Way) -> bool {
        match way {
            Way::Sent => self.sent,
            Way::Offered => self.offered,
        }
    }
}

/// Why a frame did not go on, or how it was taken: the comment a record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Went on with nothing to say.
    Passed,
    /// Taken by the port's receive filter through a hash bucket whose groups do not
    /// include the frame's: a false positive of the DPAA hash.
    HashFalsePositive,
    /// Refused by the port's receive filter: no exact entry, no bucket, no promiscuous mode.
    FilterAddress,
    /// Refused by the port's VLAN table.
    FilterVlan,
    /// A snooping port refused another port's IGMP or MLD report (RFC 4541 2.1.1).
    SnoopedReport,
    /// Dropped by a checksum action of the sending port (ingress).
    IngressAction,
    /// Dropped by a checksum action of the receiving port (egress).
    EgressAction,
}

impl Fate {
    /// The record's comment; `None` for a frame that went on as asked.
    pub fn comment(self) -> Option<&'static str> {
        Some(match self {
            Fate::Passed => return None,
            Fate::HashFalsePositive => "accepted: hash bucket false positive",
            Fate::FilterAddress => "dropped: receive filter (address)",
            Fate::FilterVlan => "dropped: receive filter (VLAN)",
            Fate::SnoopedReport => "dropped: snooping (another port's report)",
            Fate::IngressAction => "dropped: ingress checksum action",
            Fate::EgressAction => "dropped: egress checksum action",
        })
    }

    /// Whether the frame went no further.
    pub fn dropped(self) -> bool {
        !matches!(self, Fate::Passed | Fate::HashFalsePositive)
    }
}

/// One frame as captured.
pub struct Record {
    pub way: Way,
    pub fate: Fate,
    /// Since the Unix epoch.
    pub time: Duration,
    /// The frame's length; `data` holds at most the snap length of it.
    pub len: u32,
    pub data: Vec<u8>,
}

/// One armed capture of one port.
pub struct Capture {
    port: usize,
    ways: Ways,
    snaplen: u32,
    ready: ArrayQueue<Record>,
    /// Buffers the reader is done with.
    spare: ArrayQueue<Vec<u8>>,
    /// Frames there was no room for, by way ([`Way::index`]).
    lost: [AtomicU64; 2],
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("port", &self.port)
            .field("ways", &self.ways)
            .field("snaplen", &self.snaplen)
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// A capture of `port`'s `ways`, keeping at most `snaplen` bytes of each frame (at
    /// least one, at most [`MAX_SNAPLEN`]).
    pub fn new(port: usize, ways: Ways, snaplen: u32) -> Self {
        Capture {
            port,
            ways,
            snaplen: snaplen.clamp(1, MAX_SNAPLEN),
            ready: ArrayQueue::new(RING),
            spare: ArrayQueue::new(RING),
            lost: Default::default(),
        }
    }

    pub fn port(&self) -> usize {
        self.port
    }

    pub fn ways(&self) -> Ways {
        self.ways
    }

    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Records `frame`, which went `way` with `fate`, if the capture takes that way and
    /// has room; counts it lost otherwise.
    pub fn record(&self, way: Way, fate: Fate, frame: &[u8]) {
        if let Some(rec) = self.take(way, frame) {
            self.put(rec, fate);
        }
    }

    /// A copy of `frame`, going `way`, whose fate is not known yet: [`Capture::put`] it
    /// once it is. `None` for a way the capture does not take, or with no room (counted).
    pub fn take(&self, way: Way, frame: &[u8]) -> Option<Record> {
        if !self.ways.has(way) {
            return None;
        }
        if self.ready.is_full() {
            self.lost[way.index()].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let mut data = self.spare.pop().unwrap_or_default();
        data.clear();
        let keep = frame.len().min(self.snaplen as usize);
        data.extend_from_slice(&frame[..keep]);
        Some(Record {
            way,
            fate: Fate::Passed,
            // A clock before 1970 is the host's to fix; the record says 0.
            time: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default(),
            len: u32::try_from(frame.len()).unwrap_or(u32::MAX),
            data,
        })
    }

    /// Queues `rec` for the reader, with its `fate`.
    pub fn put(&self, mut rec: Record, fate: Fate) {
        rec.fate = fate;
        if let Err(rec) = self.ready.push(rec) {
            // Other workers took the last room meanwhile.
            self.lost[rec.way.index()].fetch_add(1, Ordering::Relaxed);
            self.recycle(rec.data);
        }
    }

    /// The oldest record waiting, for the reader.
    pub fn next(&self) -> Option<Record> {
        self.ready.pop()
    }

    /// Hands a record's buffer back for reuse.
    pub fn recycle(&self, data: Vec<u8>) {
        let _ = self.spare.push(data);
    }

    /// Frames going `way` the capture had no room for.
    pub fn lost(&self, way: Way) -> u64 {
        self.lost[way.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pipeline::outbox::{Admitted, Egress, PortFrames, Refused};
    use crate::stats::Tally;
    use crate::wire::MacAddr;

    /// A port that takes unicast only, refusing the rest as a guest's filter with no
    /// multicast entry would: what the switch's and the control socket's capture tests
    /// capture.
    pub(crate) struct UnicastOnly;

    impl Egress for UnicastOnly {
        fn admit(&self, _tally: &Tally, _flow: usize, frame: &[u8]) -> Result<Admitted, Refused> {
            match MacAddr::from_slice(frame) {
                Some(m) if m.is_multicast() => Err(Refused::Address),
                _ => Ok(Admitted::default()),
            }
        }

        fn write(&self, _tally: &Tally, frames: &mut PortFrames<'_, '_>, _segment: &mut Vec<u8>) -> usize {
            let mut n = 0;
            while frames.next().is_some() {
                n += 1;
            }
            n
        }
    }

    #[test]
    fn records_the_ways_asked_cut_at_the_snap_length() {
        let c = Capture::new(
            3,
            Ways {
                sent: false,
                offered: true,
            },
            4,
        );
        c.record(Way::Sent, Fate::Passed, &[1, 2, 3]);
        assert!(c.next().is_none());
        c.record(Way::Offered, Fate::FilterAddress, &[1, 2, 3, 4, 5, 6]);
        let r = c.next().unwrap();
        assert_eq!(
            (r.way, r.fate, r.len, &r.data[..]),
            (Way::Offered, Fate::FilterAddress, 6, &[1, 2, 3, 4][..])
        );
        assert!(r.time > Duration::ZERO);
        assert_eq!(c.lost(Way::Offered), 0);
    }

    #[test]
    fn a_full_ring_counts_what_it_loses_and_buffers_come_back() {
        let c = Capture::new(0, Ways::BOTH, MAX_SNAPLEN);
        for i in 0..RING + 5 {
            c.record(Way::Sent, Fate::Passed, &[i as u8; 60]);
        }
        assert_eq!((c.lost(Way::Sent), c.lost(Way::Offered)), (5, 0));
        let first = c.next().unwrap();
        assert_eq!(first.data, [0u8; 60]);
        let at = first.data.as_ptr();
        c.recycle(first.data);
        // The room freed takes the next frame, in the buffer handed back.
        c.record(Way::Offered, Fate::Passed, &[9; 10]);
        let mut last = None;
        while let Some(r) = c.next() {
            last = Some(r);
        }
        let last = last.unwrap();
        assert_eq!((last.way, &last.data[..]), (Way::Offered, &[9u8; 10][..]));
        assert_eq!(last.data.as_ptr(), at);
        assert_eq!((c.lost(Way::Sent), c.lost(Way::Offered)), (5, 0));
    }

    #[test]
    fn snap_lengths_are_bounded_and_comments_say_drops() {
        assert_eq!(Capture::new(0, Ways::BOTH, 0).snaplen(), 1);
        assert_eq!(Capture::new(0, Ways::BOTH, u32::MAX).snaplen(), MAX_SNAPLEN);
        assert_eq!(Fate::Passed.comment(), None);
        // ctl capture's summary counts drops by this prefix (control/capture.rs).
        for f in [
            Fate::HashFalsePositive,
            Fate::FilterAddress,
            Fate::FilterVlan,
            Fate::SnoopedReport,
            Fate::IngressAction,
            Fate::EgressAction,
        ] {
            assert_eq!(
                f.dropped(),
                f.comment().unwrap().starts_with("dropped: "),
                "{f:?}"
            );
        }
    }
}
