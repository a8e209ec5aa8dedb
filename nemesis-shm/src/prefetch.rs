//! Taking cache lines for writing before the stores that need them.
//!
//! A sender's stores into a fastbox miss: the receiver read the box's lines last, so
//! each store waits for the line to come back, and the doorbell's locked add after them
//! waits for all of those. Asking for the lines of the next box right after a send, with
//! the prefetch-for-write instruction, overlaps that wait with whatever the sender does
//! until its next send. A prefetch is only a hint: it changes no value and no ordering,
//! so the protocols and their models are untouched (the loom build, whose regions live
//! on the heap, has none).
//!
//! Building with `RUSTFLAGS="--cfg nemesis_no_prefetchw"` leaves the write prefetches
//! out, so that what they buy can be measured on a new machine class
//! (BENCHMARKS.md, "How to measure").

/// Most lines one call asks for: a longer message's further lines are fetched by its
/// own stores, as before.
#[cfg_attr(nemesis_no_prefetchw, allow(dead_code))]
pub(crate) const MAX_LINES: usize = 128;

/// Whether the CPU has the prefetch-for-write instruction, asked once and kept where
/// the hot path reads it (the segment's hot fields): [`for_write`] then costs one test of
/// a byte at hand rather than a load of a global and two comparisons. Only
/// [`Prefetchw::detect`] makes one that says yes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefetchw(bool);

impl Prefetchw {
    /// Whether [`for_write`] asks the CPU for anything.
    #[inline(always)]
    pub(crate) fn yes(self) -> bool {
        self.0
    }

    /// What this CPU has.
    pub(crate) fn detect() -> Self {
        #[cfg(all(target_arch = "x86_64", not(nemesis_no_prefetchw)))]
        return Self(has_prefetchw());
        #[cfg(any(not(target_arch = "x86_64"), nemesis_no_prefetchw))]
        Self(false)
    }
}

/// Asks for the `lines` cache lines from `p` on (at most [`MAX_LINES`]) for writing, where
/// `can` says the CPU can; otherwise does nothing. Never faults, whatever the address.
#[inline(always)]
pub(crate) fn for_write(can: Prefetchw, p: *const u8, lines: usize) {
    #[cfg(all(target_arch = "x86_64", not(nemesis_no_prefetchw)))]
    if can.0 {
        for i in 0..lines.min(MAX_LINES) {
            let at = p.wrapping_add(i * 64);
            // SAFETY: PREFETCHW reads and writes nothing the program can see and does
            // not fault, whatever the address; the CPU has it (`can` came from
            // `Prefetchw::detect`, the only maker of a yes).
            unsafe {
                core::arch::asm!("prefetchw [{0}]", in(reg) at, options(nostack, readonly, preserves_flags))
            };
        }
    }
    #[cfg(any(not(target_arch = "x86_64"), nemesis_no_prefetchw))]
    let _ = (can.0, p, lines);
}

/// Asks for the cache line at `p` for reading, where the CPU can; otherwise does
/// nothing. Never faults, whatever the address.
#[inline(always)]
pub(crate) fn for_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 reads and writes nothing the program can see and does not
    // fault, whatever the address; every x86_64 CPU has it (SSE).
    unsafe {
        core::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether the CPU has PREFETCHW (CPUID 8000_0001h, ECX bit 8), asked once.
#[cfg(all(target_arch = "x86_64", not(nemesis_no_prefetchw)))]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: not asked yet; 1: yes; 2: no.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let yes = ask_cpuid();
            HAS.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(nemesis_no_prefetchw)))]
#[cold]
fn ask_cpuid() -> bool {
    use core::arch::x86_64::__cpuid;
    // SAFETY: CPUID exists on every x86_64 CPU (the call is safe on newer compilers).
    #[allow(unused_unsafe)]
    let (max, ecx) = unsafe {
        let max = __cpuid(0x8000_0000).eax;
        (
            max,
            if max >= 0x8000_0001 {
                __cpuid(0x8000_0001).ecx
            } else {
                0
            },
        )
    };
    max >= 0x8000_0001 && ecx & (1 << 8) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_changes_nothing_and_never_faults() {
        let mut buf = vec![7u8; 4096];
        let can = Prefetchw::detect();
        for_write(can, buf.as_ptr(), 64);
        // Addresses outside any mapping: a prefetch must not fault.
        for_write(can, std::ptr::null(), 4);
        for_write(can, usize::MAX as *const u8, 2);
        for_read(buf.as_ptr().wrapping_add(64));
        for_read(std::ptr::null());
        for_read(usize::MAX as *const u8);
        buf[100] = 9;
        assert!(
            buf.iter()
                .enumerate()
                .all(|(i, &b)| b == if i == 100 { 9 } else { 7 })
        );
    }
}
