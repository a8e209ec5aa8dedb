//! Copies of kilobytes and more that keep clear of a slow case of `rep movsb`.
//!
//! `memcpy` copies mid-sized blocks with `rep movsb` on CPUs that advertise fast string
//! moves. On AMD Zen 3 (EPYC family 25 measured), that instruction runs about twenty
//! times slower, 2 GB/s against 40, whenever the destination's offset within its page is
//! 1 to 31 bytes ahead of the source's, even when the two are pages apart; the kernel's
//! copies, CMA's among them, show the same. A buffer from `malloc` that large sits 16
//! bytes into its page, and the ring's slots and the cells sit on page or line
//! boundaries, so the receive of a rendezvous or medium message met the slow case on
//! every message. For those offsets this copies with vector loads and stores instead;
//! every other copy stays with `memcpy`.

/// From this many bytes `memcpy` may take `rep movsb` (glibc's threshold is 2 KiB or
/// more); shorter copies never meet the slow case.
pub const SLOW_CASE_FROM: usize = 1024;

/// Whether a copy of `len` bytes from `src` to `dst` would meet the slow case: the
/// destination 1 to 63 bytes ahead of the source within a page (31 measured; a cache
/// line's worth kept clear).
#[inline(always)]
pub fn meets_slow_case(src: *const u8, dst: *const u8, len: usize) -> bool {
    len >= SLOW_CASE_FROM && ((dst as usize).wrapping_sub(src as usize) % 4096).wrapping_sub(1) < 63
}

/// Copies `len` bytes from `src` to `dst`, as `copy_nonoverlapping` does, but around the
/// slow case of `rep movsb` (see the module's doc).
///
/// # Safety
/// `src` is valid for `len` bytes of reads, `dst` for `len` bytes of writes, and they do
/// not overlap.
#[inline]
pub unsafe fn copy_large(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if meets_slow_case(src, dst, len) {
        // SAFETY: the caller's contract.
        unsafe { vectors(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
}

/// The copy through 16-byte vectors: unaligned loads, stores aligned to the destination,
/// four to a round. SSE2 is part of x86-64, so nothing needs detecting.
///
/// # Safety
/// As for [`copy_large`]; `len >= 64`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn vectors(src: *const u8, dst: *mut u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_store_si128, _mm_storeu_si128};
    debug_assert!(len >= 64);
    // SAFETY: every access is within `len` bytes of `src` and `dst` (the caller's
    // contract): the head and the tail are one unaligned vector each at the ends, which
    // may overlap the rounds' stores with the same bytes; the rounds' stores are aligned
    // by construction.
    unsafe {
        let head = _mm_loadu_si128(src.cast::<__m128i>());
        _mm_storeu_si128(dst.cast::<__m128i>(), head);
        let mut at = 16 - (dst as usize & 15);
        while at + 64 <= len {
            let s = src.add(at);
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            let d = dst.add(at);
            _mm_store_si128(d.cast::<__m128i>(), a);
            _mm_store_si128(d.add(16).cast::<__m128i>(), b);
            _mm_store_si128(d.add(32).cast::<__m128i>(), c);
            _mm_store_si128(d.add(48).cast::<__m128i>(), e);
            at += 64;
        }
        while at + 16 <= len {
            let a = _mm_loadu_si128(src.add(at).cast::<__m128i>());
            _mm_store_si128(dst.add(at).cast::<__m128i>(), a);
            at += 16;
        }
        let tail = _mm_loadu_si128(src.add(len - 16).cast::<__m128i>());
        _mm_storeu_si128(dst.add(len - 16).cast::<__m128i>(), tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_case_is_the_destination_just_ahead_within_a_page() {
        let base = 0x10_0000usize;
        let at = |s: usize, d: usize, len| meets_slow_case(s as *const u8, d as *const u8, len);
        assert!(at(base, base + 16, 4096));
        assert!(at(base + 4080, base + 3 * 4096, 4096));
        assert!(at(base, base + 7 * 4096 + 63, 1 << 20));
        assert!(!at(base, base + 64, 4096));
        assert!(!at(base, base + 8192, 4096));
        assert!(!at(base + 16, base, 4096));
        assert!(!at(base, base + 16, SLOW_CASE_FROM - 1));
    }

    /// Copies with `copy` at many lengths and offsets, and checks every byte in and
    /// around the destination.
    fn copies_exactly(copy: unsafe fn(*const u8, *mut u8, usize)) {
        let src: Vec<u8> = (0..16384u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![0u8; 16384 + 128];
        for len in [1024, 1025, 1039, 1087, 4096, 5000, 8191] {
            for s_off in [0, 1, 15, 16, 17, 63] {
                for d_off in [0, 1, 16, 31, 47, 64] {
                    dst.fill(0xaa);
                    let s = &src[s_off..s_off + len];
                    // SAFETY: both ranges are inside their vectors, which are apart.
                    unsafe { copy(s.as_ptr(), dst.as_mut_ptr().add(d_off), len) };
                    assert_eq!(&dst[d_off..d_off + len], s, "len {len} from +{s_off} to +{d_off}");
                    assert!(dst[..d_off].iter().all(|&b| b == 0xaa), "before, len {len}");
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xaa), "after, len {len}");
                }
            }
        }
    }

    #[test]
    fn copies_every_length_and_offset_exactly() {
        copies_exactly(copy_large);
    }

    /// The vector copy by itself, since whether `copy_large` takes it depends on where
    /// the allocator put the two buffers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_copy_copies_every_length_and_offset_exactly() {
        copies_exactly(vectors);
    }
}
