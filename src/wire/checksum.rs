//! The Internet checksum (RFC 1071) and completion of virtio partial checksums.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChecksumError {
    #[error("csum_start {start} + csum_offset {offset} does not fit a {len}-byte frame")]
    OutOfBounds { start: usize, offset: usize, len: usize },
}

/// One's-complement sum of `data`'s big-endian 16-bit words added to `initial`, not yet
/// folded: `fold` of it (or of several such sums added together) is the Internet sum.
/// Words of 32 bits sum to the same as their 16-bit halves once folded (2^16 is 1 modulo
/// 0xffff), so both ways below count whole 32-bit words.
#[inline]
pub fn partial_sum(data: &[u8], initial: u32) -> u64 {
    // Most sums are short (two addresses, an IPv4 header, a small datagram): a few
    // big-endian word adds, left unfolded. Longer data goes through the lanes, and what is
    // left after its last whole block is summed as short data is.
    let blocks = data.chunks_exact(32);
    let tail = sum_words(blocks.remainder()) + u64::from(initial);
    if data.len() < 32 {
        return tail;
    }
    u64::from(fold(sum_blocks(blocks)).swap_bytes()) + tail
}

/// The big-endian 32-bit words of `data`, then its last two or three bytes (an odd last
/// byte is the high byte of a 16-bit word).
#[inline]
fn sum_words(data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(4);
    let mut acc: u64 = (&mut words)
        .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .sum();
    let rest = words.remainder();
    if let [a, b, ..] = rest {
        acc += u64::from(u16::from_be_bytes([*a, *b]));
    }
    if rest.len() % 2 == 1 {
        acc += u64::from(rest[rest.len() - 1]) << 8;
    }
    acc
}

/// The sum of the little-endian 32-bit words of `blocks`, in eight independent lanes:
/// folded and byte-swapped, it is the big-endian sum (one's-complement sums do not depend
/// on byte order except for that final swap, RFC 1071, 2.B), and the lanes vectorise
/// without a byte shuffle. LLVM keeps them in vector registers whatever the surrounding
/// code looks like (a single `.sum()` chain vectorised or not depending on what else the
/// crate's codegen unit held).
fn sum_blocks(blocks: std::slice::ChunksExact<'_, u8>) -> u64 {
    let mut lanes = [0u64; 8];
    for b in blocks {
        for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(4)) {
            *lane += u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        }
    }
    lanes.iter().sum()
}

/// Folds a wide sum to 16 bits (not inverted): two end-around carries take any u64 there,
/// without a loop's branches. The result is 0 only for a sum of 0, as a loop's is.
#[inline]
pub fn fold(acc: u64) -> u16 {
    // End-around carry (RFC 1071 1.2.B), 64 bits to 32 and 32 to 16: an add and an add of
    // its carry each. The second add cannot carry out: when the first did, its sum is at
    // most 2^n - 2.
    let (a, carry) = (acc as u32).overflowing_add((acc >> 32) as u32);
    let a = a + u32::from(carry);
    let (b, carry) = (a as u16).overflowing_add((a >> 16) as u16);
    b + u16::from(carry)
}

/// The Internet checksum of `data`: the inverted folded sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(partial_sum(data, 0))
}

/// The pseudo-header's part of a TCP/UDP/ICMPv6 checksum (RFC 768, RFC 793, RFC 8200 8.1):
/// source and destination address (4 or 16 bytes each), protocol, upper-layer length. Not
/// folded: add the upper layer's `partial_sum` and fold.
pub fn pseudo_sum(src: &[u8], dst: &[u8], proto: u8, len: usize) -> u64 {
    partial_sum(src, 0) + partial_sum(dst, 0) + u64::from(proto) + len as u64
}

/// [`pseudo_sum`] of addresses that lie side by side, source first, as IPv4's and IPv6's
/// headers hold them: one sum over both.
pub fn pseudo_sum_of(addrs: &[u8], proto: u8, len: usize) -> u64 {
    partial_sum(addrs, 0) + u64::from(proto) + len as u64
}

/// Writes the checksum of a header or message into its own field: zeroes the field at
/// `at`, sums `buf[..covered]` with `pseudo` (a pseudo-header sum, or 0 for an IPv4 header,
/// ICMP and IGMP), stores the inverted fold. With `zero_as_ffff`, a result of 0 is sent as
/// 0xFFFF (UDP's 0 means "no checksum").
#[inline]
pub fn write_checksum(buf: &mut [u8], at: usize, covered: usize, pseudo: u64, zero_as_ffff: bool) {
    buf[at..at + 2].copy_from_slice(&[0, 0]);
    let mut c = !fold(partial_sum(&buf[..covered], 0) + pseudo);
    if zero_as_ffff && c == 0 {
        c = 0xffff;
    }
    buf[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// RFC 1624 equation 3: the checksum `hc` after one 16-bit word of the data it covers
/// changes from `old` to `new`, without summing the rest again: HC' = ~(~HC + ~m + m').
pub fn update16(hc: u16, old: u16, new: u16) -> u16 {
    !fold(u64::from(!hc) + u64::from(!old) + u64::from(new))
}

/// Completes a virtio `NEEDS_CSUM` frame in place: the L4 checksum field already holds the
/// pseudo-header sum, so summing from `csum_start` to the end and storing the inverted fold at
/// `csum_start + csum_offset` gives the final value.
pub fn complete_partial(frame: &mut [u8], start: usize, offset: usize) -> Result<(), ChecksumError> {
    let len = frame.len();
    let at = start
        .checked_add(offset)
        .filter(|at| at.checked_add(2).is_some_and(|e| e <= len));
    let at = at.ok_or(ChecksumError::OutOfBounds { start, offset, len })?;
    let mut sum = !fold(partial_sum(&frame[start..], 0));
    // A transmitted UDP checksum of 0 means "none"; RFC 768 sends 0xffff instead. For TCP the
    // two values are equivalent in one's-complement arithmetic, so this is always safe.
    if sum == 0 {
        sum = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook 16-bit loop: slow, obviously right.
    fn reference(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for ch in data.chunks(2) {
            let w = if ch.len() == 2 {
                u16::from_be_bytes([ch[0], ch[1]])
            } else {
                u16::from(ch[0]) << 8
            };
            acc += u32::from(w);
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(partial_sum(&data, 0)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn ipv4_header_golden() {
        // A real IPv4 header with its checksum (0xb861) filled in: the sum verifies to 0.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01,
            0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0);
        let mut zeroed = hdr;
        zeroed[10] = 0;
        zeroed[11] = 0;
        assert_eq!(checksum(&zeroed), 0xb861);
    }

    #[test]
    fn complete_partial_rejects_out_of_bounds() {
        let mut f = [0u8; 20];
        assert!(complete_partial(&mut f, 10, 9).is_err());
        assert!(complete_partial(&mut f, usize::MAX, 2).is_err());
        assert!(complete_partial(&mut f, 10, 8).is_ok());
    }

    #[test]
    fn complete_partial_zero_becomes_ffff() {
        // Summing region whose total is 0xffff inverts to 0: must be sent as 0xffff.
        let mut f = [0xff, 0xff, 0x00, 0x00];
        complete_partial(&mut f, 0, 2).unwrap();
        assert_eq!(&f[2..], &[0xff, 0xff]);
    }

    #[test]
    fn rfc1624_example() {
        // RFC 1624 section 4: HC 0xdd2f, m 0x5555 -> 0x3285 gives HC' 0x0000.
        assert_eq!(update16(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    /// The carries at their edges: every bit set, a carry out of each half, and zero.
    #[test]
    fn fold_edges() {
        assert_eq!(fold(0), 0);
        assert_eq!(fold(u64::MAX), 0xffff);
        assert_eq!(fold(0xffff), 0xffff);
        assert_eq!(fold(0x1_0000), 1);
        assert_eq!(fold(0xffff_ffff), 0xffff);
        assert_eq!(fold(0x1_0000_0000), 1);
        assert_eq!(fold(0xffff_ffff_0000_0001), 1);
    }

    proptest! {
        #[test]
        fn incremental_update_matches_a_full_sum(
            mut data in proptest::collection::vec(any::<u8>(), 2..200),
            word in any::<u16>(),
            at in any::<prop::sample::Index>(),
        ) {
            let i = at.index(data.len() / 2) * 2;
            let before = checksum(&data);
            let old = u16::from_be_bytes([data[i], data[i + 1]]);
            data[i..i + 2].copy_from_slice(&word.to_be_bytes());
            // One's complement has two zeros; the incremental form may yield either.
            let inc = update16(before, old, word);
            let full = checksum(&data);
            prop_assert!(inc == full || (inc == 0xffff && full == 0) || (inc == 0 && full == 0xffff));
        }

        /// The fold against the textbook loop, on any sum (wide ones included).
        #[test]
        fn fold_matches_the_loop(acc in any::<u64>()) {
            let mut a = u128::from(acc);
            while a > 0xffff {
                a = (a & 0xffff) + (a >> 16);
            }
            prop_assert_eq!(u128::from(fold(acc)), a);
        }

        #[test]
        fn wide_sum_matches_reference(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        #[test]
        fn short_sums_match_reference(data in proptest::collection::vec(any::<u8>(), 0..70)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        /// Sums of the parts, added, are the sum of the whole (callers add a pseudo-header's
        /// sum to a message's), whichever way each part was summed.
        #[test]
        fn sums_of_parts_add_up(
            a in proptest::collection::vec(any::<u8>(), 0..80),
            b in proptest::collection::vec(any::<u8>(), 0..80),
            proto in any::<u8>(),
        ) {
            let mut a = a;
            if a.len() % 2 == 1 {
                a.pop();
            }
            let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(!fold(partial_sum(&a, 0) + partial_sum(&b, 0)), reference(&whole));
            let (src, dst) = a.split_at(a.len() / 2 / 2 * 2);
            prop_assert_eq!(
                fold(pseudo_sum_of(&a, proto, b.len())),
                fold(pseudo_sum(src, dst, proto, b.len()))
            );
        }

        /// The folds of the textbook loop, for any sum: its carries added until none is left.
        #[test]
        fn fold_is_the_loop(acc in prop_oneof![any::<u64>(), 0u64..0x3_0000, Just(u64::MAX), Just(0xffff)]) {
            let mut a = acc;
            while a >> 16 != 0 {
                a = (a & 0xffff) + (a >> 16);
            }
            prop_assert_eq!(fold(acc), a as u16);
        }
    }
}
