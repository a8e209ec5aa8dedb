//! A 32-bit word that processes can sleep on until it changes: the kernel futex, and
//! under loom a mutex and condition variable that model it.

use crate::sync::AtomicU32;
use std::time::Duration;

/// A futex word. In the segment it is plain `#[repr(C)]` memory; zero is a valid state.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Futex {
    word: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    cv: loom::sync::Condvar,
}

impl core::ops::Deref for Futex {
    type Target = AtomicU32;
    #[inline(always)]
    fn deref(&self) -> &AtomicU32 {
        &self.word
    }
}

impl Futex {
    /// A word holding zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sleeps while the word holds `token`, until a [`Futex::wake`] or `timeout`.
    /// Returns at once if the word no longer holds `token`; spurious returns are possible.
    #[cfg(not(loom))]
    pub fn wait(&self, token: u32, timeout: Option<Duration>) {
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(core::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the word is a live, aligned u32 in memory shared by the waiters and
        // wakers, and `ts_ptr` is null or points to a timespec that outlives the call.
        // Not FUTEX_PRIVATE: the word may be in a MAP_SHARED mapping of other processes.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAIT,
                token,
                ts_ptr,
                core::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes up to `n` sleepers.
    #[cfg(not(loom))]
    pub fn wake(&self, n: u32) {
        let n = n.min(i32::MAX as u32);
        // SAFETY: as in `wait`; FUTEX_WAKE only uses the address.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAKE,
                n,
                core::ptr::null::<libc::timespec>(),
                core::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    // The kernel checks the word and queues the waiter under one lock, and a wake takes
    // the same lock: a mutex and a condition variable model exactly that.
    /// Sleeps while the word holds `token` (loom's model of the futex).
    #[cfg(loom)]
    pub fn wait(&self, token: u32, _timeout: Option<Duration>) {
        let guard = self.lock.lock().unwrap();
        if self.word.load(crate::sync::Ordering::SeqCst) != token {
            return;
        }
        drop(self.cv.wait(guard).unwrap());
    }

    /// Wakes every sleeper (loom's model of the futex).
    #[cfg(loom)]
    pub fn wake(&self, _n: u32) {
        let _guard = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}
