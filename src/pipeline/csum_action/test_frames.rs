//! Frames and actions for the tests of this folder's files, frames built field by field.

use proptest::prelude::*;

use super::spec::CsumAction;
use crate::wire::ethernet::ETHERTYPE_IPV4;
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};

/// The action `s` names in `--csum-action` syntax.
pub fn act(s: &str) -> CsumAction {
    s.parse().unwrap()
}

pub const SRC: [u8; 4] = [10, 0, 0, 1];
pub const DST: [u8; 4] = [10, 0, 1, 2];

pub fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ty.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

pub fn ipv4(ihl_opts: &[u8], proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let hl = 20 + ihl_opts.len();
    let mut ip = vec![0x40 | (hl / 4) as u8, 0];
    ip.extend_from_slice(&((hl + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 1]);
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, proto, 0xbe, 0xef]);
    ip.extend_from_slice(&SRC);
    ip.extend_from_slice(&DST);
    ip.extend_from_slice(ihl_opts);
    ip.extend_from_slice(l4);
    ip
}

pub fn udp(payload: &[u8], check: u16) -> Vec<u8> {
    let mut u = vec![0x0f, 0xa0, 0x13, 0x88];
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&check.to_be_bytes());
    u.extend_from_slice(payload);
    u
}

/// An untagged IPv4 frame with a 20-byte header (flags DF), its upper layer `l4` of
/// protocol `proto`.
pub fn frame(proto: u8, l4: &[u8]) -> Vec<u8> {
    eth(ETHERTYPE_IPV4, &ipv4(&[], proto, 0x4000, l4))
}

pub fn tcp(payload: &[u8], check: u16) -> Vec<u8> {
    let mut t = vec![0x04, 0xd2, 0, 80, 0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x18, 0x02, 0];
    t.extend_from_slice(&check.to_be_bytes());
    t.extend_from_slice(&[0, 0]);
    t.extend_from_slice(payload);
    t
}

/// A frame built for the one pass (plain.rs) to take, then perhaps spoiled at one of the
/// bytes it reads.
pub fn any_frame() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let upper = (
        any::<bool>(),
        proptest::collection::vec(any::<u8>(), 0..300),
        prop_oneof![Just(0u16), any::<u16>()],
    )
        .prop_map(|(is_udp, payload, check)| {
            if is_udp {
                frame(PROTO_UDP, &udp(&payload, check))
            } else {
                frame(PROTO_TCP, &tcp(&payload, check))
            }
        });
    // The bytes read for a decision: EtherType, version/IHL, lengths, flags/offset,
    // protocol, UDP's length and checksum; then any byte; and a cut.
    let at = prop_oneof![
        Just(None),
        prop::sample::select(vec![12usize, 13, 14, 16, 17, 20, 21, 23, 38, 39, 40, 41]).prop_map(Some),
        (0usize..64).prop_map(Some),
    ];
    // One bit flipped (a flag, or a length one step off), or a byte changed.
    let flip = prop_oneof![(0..8u32).prop_map(|b| 1u8 << b), 1..=u8::MAX];
    (upper, at, flip, any::<prop::sample::Index>(), any::<bool>()).prop_map(|(mut f, at, flip, cut, trim)| {
        let spoiled = at.is_some() || trim;
        if let Some(i) = at.filter(|i| *i < f.len()) {
            f[i] ^= flip;
        }
        if trim {
            f.truncate(cut.index(f.len() + 1));
        }
        (f, spoiled)
    })
}

/// Per-action counters for `n` slots, as a worker's tally holds them.
pub fn action_slots(n: usize) -> Vec<crate::stats::ActionStats> {
    (0..n).map(|_| Default::default()).collect()
}
