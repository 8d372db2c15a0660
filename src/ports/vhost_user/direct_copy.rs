//! Copies between guest memory and the worker's own buffers, each one call of the C
//! library's `memcpy`: a TX chain's bytes out into the arena, a received frame's first
//! bytes in. vm-memory 0.18's `VolatileSlice::copy_to` and `copy_from` make the same call
//! through `copy_slice`, an out-of-line function that first tests whether the range is a
//! word or less (then copied with volatile accesses, for device registers). A frame never
//! is; docs/performance.md ("What shaped the path") has what the detour cost.

use vm_memory::bitmap::BitmapSlice;
use vm_memory::VolatileSlice;

/// Copies the first bytes of `from` into `dst`, as many as the shorter of the two holds
/// (as vm-memory's `VolatileSlice::copy_to`), and returns how many.
#[inline(always)]
pub fn copy_from_guest<B: BitmapSlice>(from: &VolatileSlice<'_, B>, dst: &mut [u8]) -> usize {
    let n = dst.len().min(from.len());
    let src = from.ptr_guard();
    // SAFETY: vm-memory checked that `from.len()` bytes, at least `n`, are mapped while the
    // guard is held, and `dst` holds at least `n`; guest memory is never the worker's own
    // buffer. The driver may store into its buffer meanwhile, as under vm-memory's own
    // copy: what lands in `dst` is a copy, and is checked afterwards.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), n) };
    n
}

/// Copies `src` into the start of `to`, as much as the shorter of the two holds, and marks
/// it dirty (as vm-memory's `VolatileSlice::copy_from`).
#[inline(always)]
pub fn copy_to_guest<B: BitmapSlice>(to: &VolatileSlice<'_, B>, src: &[u8]) {
    let n = src.len().min(to.len());
    let dst = to.ptr_guard_mut();
    // SAFETY: as in `copy_from_guest`, the other way round: `to` is mapped for at least `n` bytes
    // while the guard is held, `src` holds `n`, and the two never overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), n) };
    to.bitmap().mark_dirty(0, n);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any length, at any offset: exactly the bytes asked for are copied, and nothing
        /// around them is touched.
        #[test]
        fn a_copy_is_the_bytes_asked_for(len in 0usize..300, from_off in 0usize..40, to_off in 0usize..40, seed: u8) {
            let src: Vec<u8> = (0..400).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            let mut guest = src.clone();
            let mut arena = vec![0xeeu8; 400];
            let from = VolatileSlice::from(&mut guest[from_off..from_off + len]);
            prop_assert_eq!(copy_from_guest(&from, &mut arena[to_off..to_off + len + 7]), len);
            prop_assert_eq!(&arena[to_off..to_off + len], &src[from_off..from_off + len]);
            prop_assert!(arena[..to_off].iter().chain(&arena[to_off + len..]).all(|&b| b == 0xee));

            let mut back = vec![0x11u8; 400];
            let to = VolatileSlice::from(&mut back[to_off..to_off + len + 5]);
            copy_to_guest(&to, &src[from_off..from_off + len]);
            prop_assert_eq!(&back[to_off..to_off + len], &src[from_off..from_off + len]);
            prop_assert!(back[..to_off].iter().chain(&back[to_off + len..]).all(|&b| b == 0x11));
        }
    }

    #[test]
    fn the_shorter_side_bounds_the_copy() {
        let mut guest = [7u8; 10];
        let mut dst = [0u8; 20];
        assert_eq!(
            copy_from_guest(&VolatileSlice::from(&mut guest[..]), &mut dst),
            10
        );
        assert_eq!(dst, [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mut small = [0u8; 3];
        copy_to_guest(&VolatileSlice::from(&mut small[..]), &[1, 2, 3, 4, 5]);
        assert_eq!(small, [1, 2, 3]);
    }
}
