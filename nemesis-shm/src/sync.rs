//! The one place the lock-free code gets its atomics from.
//!
//! Under `--cfg loom` every primitive is loom's, so the models in `loom-tests` run the
//! very algorithms that production runs. Production structures are plain `#[repr(C)]`
//! memory inside the shared segment; loom structures are built on the heap with `new`.

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering, fence};

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering, fence};

/// One iteration of a busy-wait. Under loom this yields, which loom requires of spin loops.
#[inline(always)]
pub fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Gives the CPU away for a moment, as the bounded spins do before giving up.
#[inline]
pub fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// An `UnsafeCell` with loom's closure API, so payload accesses are race-checked under loom.
#[cfg(not(loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct UnsafeCell<T: ?Sized>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }
}

#[cfg(not(loom))]
impl<T: ?Sized> UnsafeCell<T> {
    /// Runs `f` with a shared pointer to the contents.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a unique pointer to the contents.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// Aligns and pads `T` to 128 bytes: two cache lines, because the adjacent-line
/// prefetcher on x86-64 pulls lines in pairs, and a shared field next to a hot one
/// would otherwise ping-pong with it.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The padding unit of every shared structure.
pub const PAD: usize = 128;
