//! `ctl capture`: a port's frames as pcapng (the IETF draft's format that tcpdump and
//! Wireshark read), streamed over the control connection.
//!
//! The daemon arms a [`Capture`] on the port (pipeline/capture.rs), answers one JSON line,
//! then writes a section header, two interfaces (what the port sent, what the switch
//! offered it), one Enhanced Packet Block per frame, and at the end one statistics block
//! per interface with the frames the capture had no room for (`isb_ifdrop`). A frame the
//! port's filter or an action dropped carries a comment saying which; so does a frame a
//! hash bucket took by chance. The client copies the blocks as they come to a file or to
//! standard output and counts them.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::interface_statistics::{InterfaceStatisticsBlock, InterfaceStatisticsOption};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use pcap_file::{DataLink, PcapError};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::pipeline::capture::{Capture, Fate, Record, Way, Ways, MAX_SNAPLEN};
use crate::pipeline::Switch;

/// How long the daemon waits for frames before it looks again at the deadline and the
/// client: short enough that a ring of [`crate::pipeline::capture::RING`] records rarely
/// fills at the rates a person captures.
const IDLE: Duration = Duration::from_millis(2);

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("port {port} does not exist ({ports} ports)")]
    NoPort { port: usize, ports: usize },
    #[error("port {0} is being captured by another client: one capture per port at a time")]
    Busy(usize),
    #[error("a capture of no direction records nothing: ask for rx, tx or both")]
    NoWay,
    #[error("--count 0 captures nothing: ask for at least one frame")]
    NoCount,
    #[error("--seconds {0}: a number of seconds above 0")]
    Seconds(f64),
    #[error("--snaplen {0}: from 1 to {MAX_SNAPLEN} bytes")]
    Snaplen(u32),
    #[error("writing pcapng")]
    Pcap(#[source] PcapError),
    #[error("the capture's stream")]
    Io(#[source] io::Error),
}

/// What a client asks for: the request's `capture` object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaptureAsk {
    pub port: usize,
    /// Frames the port sends into the switch ("tx": from the guest, or read from the tap).
    pub sent: bool,
    /// Frames the switch offers the port ("rx": to the guest, or to the tap), taken or not.
    pub offered: bool,
    /// Stop after this many frames.
    pub count: Option<u64>,
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    pub snaplen: u32,
}

impl CaptureAsk {
    fn check(&self, ports: usize) -> Result<(), CaptureError> {
        if self.port >= ports {
            return Err(CaptureError::NoPort {
                port: self.port,
                ports,
            });
        }
        if !self.sent && !self.offered {
            return Err(CaptureError::NoWay);
        }
        if self.count == Some(0) {
            return Err(CaptureError::NoCount);
        }
        if let Some(s) = self.seconds.filter(|s| !s.is_finite() || *s <= 0.0 || *s > 1e9) {
            return Err(CaptureError::Seconds(s));
        }
        if self.snaplen == 0 || self.snaplen > MAX_SNAPLEN {
            return Err(CaptureError::Snaplen(self.snaplen));
        }
        Ok(())
    }
}

/// A capture armed in the switch's rules for as long as this lives.
struct Armed<'a> {
    switch: &'a Switch,
    capture: Arc<Capture>,
}

impl<'a> Armed<'a> {
    fn new(switch: &'a Switch, ask: &CaptureAsk) -> Result<Self, CaptureError> {
        let ways = Ways {
            sent: ask.sent,
            offered: ask.offered,
        };
        let capture = Arc::new(Capture::new(ask.port, ways, ask.snaplen));
        switch.rules().update(|r| {
            if r.capture(ask.port).is_some() {
                return Err(CaptureError::Busy(ask.port));
            }
            r.set_capture(ask.port, Some(capture.clone()));
            Ok(())
        })?;
        Ok(Armed { switch, capture })
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let port = self.capture.port();
        let _ = self.switch.rules().update(|r| {
            if r.capture(port).is_some_and(|c| std::ptr::eq(c, &*self.capture)) {
                r.set_capture(port, None);
            }
            Ok::<(), ()>(())
        });
    }
}

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Serves one capture on `s`, whose request has been read: the answer line (`head`, or an
/// error line), then the pcapng stream until the count, the deadline, the client hanging
/// up or the daemon stopping (which hangs up on every client). Returns the frames written.
pub fn serve(
    switch: &Switch,
    ask: &CaptureAsk,
    port_name: &str,
    head: impl FnOnce(Result<(), &CaptureError>) -> String,
    s: &UnixStream,
) -> Result<u64, CaptureError> {
    let armed = ask.check(switch.nports()).and_then(|()| Armed::new(switch, ask));
    let mut w = BufWriter::new(s);
    let line = head(armed.as_ref().map(|_| ()));
    w.write_all(line.as_bytes()).map_err(CaptureError::Io)?;
    let armed = armed?;
    let started = since_epoch();
    let mut pcap = PcapNgWriter::with_section_header(w, section()).map_err(CaptureError::Pcap)?;
    for way in [Way::Sent, Way::Offered] {
        pcap.write_pcapng_block(interface(ask, port_name, way))
            .map_err(CaptureError::Pcap)?;
    }
    let deadline = ask.seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let cap = &armed.capture;
    let mut written = 0u64;
    let full = |n: u64| ask.count.is_some_and(|c| n >= c);
    let gone = loop {
        written += drain(&mut pcap, cap, ask.count.map(|c| c - written))?;
        pcap.get_mut().flush().map_err(CaptureError::Io)?;
        if hung_up(s) {
            break true;
        }
        if full(written) || deadline.is_some_and(|d| Instant::now() >= d) {
            break false;
        }
        thread::sleep(IDLE);
    };
    // Frames recorded before the capture was disarmed are the window's too.
    let capture = armed.capture.clone();
    drop(armed);
    if gone {
        return Ok(written);
    }
    if !full(written) {
        written += drain(&mut pcap, &capture, ask.count.map(|c| c - written))?;
    }
    for way in [Way::Sent, Way::Offered] {
        pcap.write_pcapng_block(statistics(way, started, capture.lost(way)))
            .map_err(CaptureError::Pcap)?;
    }
    pcap.get_mut().flush().map_err(CaptureError::Io)?;
    Ok(written)
}

/// Writes the records waiting, at most `left`; returns how many.
fn drain<W: Write>(
    pcap: &mut PcapNgWriter<W>,
    cap: &Capture,
    left: Option<u64>,
) -> Result<u64, CaptureError> {
    let mut n = 0;
    while left.is_none_or(|l| n < l) {
        let Some(rec) = cap.next() else { break };
        let done = pcap.write_pcapng_block(packet(&rec));
        cap.recycle(rec.data);
        done.map_err(CaptureError::Pcap)?;
        n += 1;
    }
    Ok(n)
}

/// Whether the client hung up (or the daemon hung up on it at a stop): a read that does
/// not wait finds the end of the stream.
fn hung_up(s: &UnixStream) -> bool {
    let mut one = [MaybeUninit::<u8>::uninit(); 1];
    matches!(
        socket2::SockRef::from(s).recv_with_flags(&mut one, libc::MSG_DONTWAIT | libc::MSG_PEEK),
        Ok(0)
    )
}

fn section() -> SectionHeaderBlock<'static> {
    SectionHeaderBlock {
        // The host's order, as libpcap writes it (pcap-file's default is big-endian).
        endianness: pcap_file::Endianness::native(),
        options: vec![SectionHeaderOption::UserApplication(
            format!("dpaa-vnic {}", env!("CARGO_PKG_VERSION")).into(),
        )],
        ..Default::default()
    }
}

fn interface(ask: &CaptureAsk, port_name: &str, way: Way) -> InterfaceDescriptionBlock<'static> {
    let (short, what) = match way {
        Way::Sent => ("tx", "frames it sent into the switch"),
        Way::Offered => ("rx", "frames the switch offered it, taken or not"),
    };
    InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: ask.snaplen,
        options: vec![
            InterfaceDescriptionOption::IfName(format!("port{}-{short}", ask.port).into()),
            InterfaceDescriptionOption::IfDescription(
                format!("dpaa-vnic port {} ({port_name}): {what}", ask.port).into(),
            ),
            // Records carry nanoseconds (pcap-file 2.0 writes `timestamp.as_nanos()`).
            InterfaceDescriptionOption::IfTsResol(9),
        ],
    }
}

/// pcapng's epb_flags direction bits: inbound 1, outbound 2, seen from the port.
fn direction(way: Way) -> u32 {
    match way {
        Way::Sent => 1,
        Way::Offered => 2,
    }
}

fn packet(rec: &Record) -> EnhancedPacketBlock<'_> {
    let mut options = vec![EnhancedPacketOption::Flags(direction(rec.way))];
    if let Some(c) = rec.fate.comment() {
        options.push(EnhancedPacketOption::Comment(c.into()));
    }
    EnhancedPacketBlock {
        interface_id: rec.way.index() as u32,
        timestamp: rec.time,
        original_len: rec.len,
        data: rec.data.as_slice().into(),
        options,
    }
}

fn statistics(way: Way, started: Duration, lost: u64) -> InterfaceStatisticsBlock<'static> {
    let now = since_epoch();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    InterfaceStatisticsBlock {
        interface_id: way.index() as u32,
        timestamp: nanos(now),
        options: vec![
            InterfaceStatisticsOption::IsbStartTime(nanos(started)),
            InterfaceStatisticsOption::IsbEndTime(nanos(now)),
            InterfaceStatisticsOption::IsbIfDrop(lost),
        ],
    }
}

/// What a client saw go by.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Copied {
    pub frames: u64,
    /// Frames whose comment says they went no further, by reason.
    pub dropped: Vec<(String, u64)>,
    /// Frames a hash bucket of the port's filter took by chance.
    pub false_positives: u64,
    /// Frames the capture had no room for (the statistics blocks' `isb_ifdrop`).
    pub lost: u64,
}

/// The client's half: copies the pcapng stream from `from` to `to` block by block,
/// flushing each (so a capture cut short by an interrupt keeps every frame before it), and
/// counts what it copies.
pub fn copy(from: impl Read, to: impl Write) -> Result<Copied, CaptureError> {
    let mut reader = PcapNgReader::new(BufReader::new(from)).map_err(CaptureError::Pcap)?;
    let mut writer =
        PcapNgWriter::with_section_header(to, reader.section().clone()).map_err(CaptureError::Pcap)?;
    let mut seen = Copied::default();
    while let Some(block) = reader.next_block() {
        let block = block.map_err(CaptureError::Pcap)?;
        writer.write_block(&block).map_err(CaptureError::Pcap)?;
        writer.get_mut().flush().map_err(CaptureError::Io)?;
        tally(&mut seen, &block);
    }
    Ok(seen)
}

fn tally(seen: &mut Copied, block: &Block<'_>) {
    match block {
        Block::EnhancedPacket(p) => {
            seen.frames += 1;
            for o in &p.options {
                if let EnhancedPacketOption::Comment(c) = o {
                    if Some(&**c) == Fate::HashFalsePositive.comment() {
                        seen.false_positives += 1;
                    } else if let Some(why) = c.strip_prefix("dropped: ") {
                        match seen.dropped.iter_mut().find(|(w, _)| w == why) {
                            Some((_, n)) => *n += 1,
                            None => seen.dropped.push((why.to_string(), 1)),
                        }
                    }
                }
            }
        }
        Block::InterfaceStatistics(s) => {
            for o in &s.options {
                if let InterfaceStatisticsOption::IsbIfDrop(n) = o {
                    seen.lost += n;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pipeline::capture::tests::UnicastOnly;
    use crate::pipeline::fdb::FdbCache;
    use crate::pipeline::router::RouteCache;
    use crate::pipeline::{Ingress, OutboxBuffers, Packet};
    use crate::wire::VirtioNetHdr;
    use std::io::BufRead;

    /// Forwards one frame of `len` bytes to `dst` from `port`, as a worker would.
    pub(crate) fn send(sw: &Switch, port: usize, dst: [u8; 6], len: usize) {
        let mut f = vec![0u8; len];
        let tally = sw.tallies().register();
        let (mut routes, mut fdb, mut originated) = (RouteCache::default(), FdbCache::default(), Vec::new());
        let mut bufs = OutboxBuffers::default();
        let mut out = sw.outbox(&tally, &mut bufs);
        let mut from = Ingress {
            port,
            queue: 0,
            tally: &tally,
            routes: &mut routes,
            fdb: &mut fdb,
            originated: &mut originated,
        };
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, port as u8 + 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let rules = sw.rules().load();
        sw.forward(
            &rules,
            &mut from,
            Packet::new(VirtioNetHdr::default(), &mut f),
            &mut out,
        );
    }

    fn ask(count: Option<u64>, seconds: Option<f64>) -> CaptureAsk {
        CaptureAsk {
            port: 1,
            sent: true,
            offered: true,
            count,
            seconds,
            snaplen: 100,
        }
    }

    /// Serves `ask` on one end of a socket pair; the other end, its answer line read.
    fn start(
        sw: &Arc<Switch>,
        a: CaptureAsk,
    ) -> (
        BufReader<UnixStream>,
        thread::JoinHandle<Result<u64, CaptureError>>,
        String,
    ) {
        let (client, daemon) = UnixStream::pair().unwrap();
        let sw2 = sw.clone();
        let served = thread::spawn(move || {
            let head = |r: Result<(), &CaptureError>| match r {
                Ok(()) => "{}\n".to_string(),
                Err(e) => format!("{e}\n"),
            };
            serve(&sw2, &a, "test", head, &daemon)
        });
        let mut r = BufReader::new(client);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        (r, served, line)
    }

    #[test]
    fn a_capture_streams_pcapng_that_a_reader_takes_and_stops_at_its_count() {
        let sw = Arc::new(Switch::new(2));
        sw.attach(0, Arc::new(UnicastOnly));
        sw.attach(1, Arc::new(UnicastOnly));
        let (r, served, line) = start(&sw, ask(Some(3), None));
        assert_eq!(line, "{}\n");
        while !sw.rules().load().capturing() {
            thread::yield_now();
        }
        // Unicast to port 1 (flooded: not learned), multicast refused, one port 1 sends,
        // one after the count, and a long one cut at the snap length.
        send(&sw, 0, [2, 0, 0, 0, 0, 9], 300);
        send(&sw, 0, [1, 0, 0x5e, 0, 0, 7], 60);
        send(&sw, 1, [2, 0, 0, 0, 0, 1], 64);
        send(&sw, 1, [2, 0, 0, 0, 0, 1], 64);
        let mut file = Vec::new();
        let seen = copy(r, &mut file).unwrap();
        assert_eq!(served.join().unwrap().unwrap(), 3);
        assert_eq!(seen.frames, 3);
        assert_eq!(seen.dropped, [("receive filter (address)".to_string(), 1)]);
        // The port is free again.
        assert!(!sw.rules().load().capturing());
        // The copy is pcapng a reader takes: two interfaces, nanosecond stamps, the frames
        // in order with their lengths, direction flags and comments.
        let mut rd = PcapNgReader::new(&file[..]).unwrap();
        let mut frames = Vec::new();
        while let Some(b) = rd.next_block() {
            if let Block::EnhancedPacket(p) = b.unwrap() {
                let p = p.into_owned();
                frames.push((p.interface_id, p.original_len, p.data.len(), p.options));
            }
        }
        assert_eq!(rd.interfaces().len(), 2);
        assert!(rd.interfaces()[1]
            .options
            .contains(&InterfaceDescriptionOption::IfTsResol(9)));
        let comment = |s: &str| EnhancedPacketOption::Comment(s.to_string().into());
        assert_eq!(
            frames,
            [
                (1, 300, 100, vec![EnhancedPacketOption::Flags(2)]),
                (
                    1,
                    60,
                    60,
                    vec![
                        EnhancedPacketOption::Flags(2),
                        comment(Fate::FilterAddress.comment().unwrap())
                    ]
                ),
                (0, 64, 64, vec![EnhancedPacketOption::Flags(1)]),
            ]
        );
    }

    #[test]
    fn a_second_capture_of_a_port_and_bad_asks_are_refused_and_seconds_end_one() {
        let sw = Arc::new(Switch::new(2));
        sw.attach(0, Arc::new(UnicastOnly));
        sw.attach(1, Arc::new(UnicastOnly));
        let (r, served, _) = start(&sw, ask(None, Some(0.3)));
        let (_, second, line) = start(&sw, ask(Some(1), None));
        assert!(line.contains("being captured by another client"), "{line}");
        assert!(matches!(second.join().unwrap(), Err(CaptureError::Busy(1))));
        for (bad, says) in [
            (
                CaptureAsk {
                    port: 2,
                    ..ask(None, None)
                },
                "does not exist",
            ),
            (
                CaptureAsk {
                    sent: false,
                    offered: false,
                    ..ask(None, None)
                },
                "no direction",
            ),
            (ask(Some(0), None), "--count 0"),
            (ask(None, Some(f64::NAN)), "--seconds NaN"),
            (
                CaptureAsk {
                    snaplen: 0,
                    ..ask(None, None)
                },
                "--snaplen 0",
            ),
        ] {
            let (_, s, line) = start(&sw, bad);
            assert!(line.contains(says), "{line}");
            assert!(s.join().unwrap().is_err());
        }
        let t0 = Instant::now();
        let seen = copy(r, io::sink()).unwrap();
        assert_eq!(served.join().unwrap().unwrap(), 0);
        assert_eq!(seen, Copied::default());
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert!(!sw.rules().load().capturing());
    }

    #[test]
    fn a_client_that_hangs_up_ends_the_capture_and_frees_the_port() {
        let sw = Arc::new(Switch::new(2));
        sw.attach(1, Arc::new(UnicastOnly));
        let (r, served, _) = start(&sw, ask(None, None));
        drop(r);
        // Without a count or a deadline only the hang-up ends it.
        assert!(served.join().unwrap().is_ok());
        assert!(!sw.rules().load().capturing());
    }
}
