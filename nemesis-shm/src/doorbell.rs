//! Sleep and wake-up for a process that has nothing to do.
//!
//! Each process has one doorbell word in the segment. Every sender that hands it work
//! adds 4 with an acquire-release RMW; a process about to sleep sets bit 0 (sleeping on
//! the futex) or bit 1 (watching its wake socket, see [`crate::wake`]) with an RMW, looks
//! for work once more, then sleeps. Because both sides use RMWs on the same word, they
//! are totally ordered: either the sender's add comes later and sees the bit (and wakes
//! the futex or sends to the socket), or the sleeper's RMW comes later and acquires the
//! sender's work. No SeqCst fence is needed, and loom checks both ways of sleeping.

use crate::futex::Futex;
use crate::sync::Ordering;
use std::time::Duration;

const SLEEPING: u32 = 1;
const WATCHING: u32 = 2;
const RING: u32 = 4;

/// A process's doorbell.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Doorbell {
    word: Futex,
}

impl Doorbell {
    /// A doorbell with nobody asleep.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the owner that work was handed to it, waking it if it sleeps on the futex.
    /// Returns whether it watches its wake socket, so the caller must wake it there.
    /// Call after the work is published.
    #[inline]
    pub fn ring(&self) -> bool {
        let old = self.word.fetch_add(RING, Ordering::AcqRel);
        if old & (SLEEPING | WATCHING) != 0 {
            self.woken(old)
        } else {
            false
        }
    }

    #[cold]
    fn woken(&self, old: u32) -> bool {
        if old & SLEEPING != 0 {
            self.word.wake(1);
        }
        old & WATCHING != 0
    }

    /// Announces that the owner is about to sleep on its wake socket. The owner must look
    /// for work after this and before sleeping, and [`Doorbell::unwatch`] after waking.
    #[inline]
    pub fn watch(&self) {
        self.word.fetch_or(WATCHING, Ordering::AcqRel);
    }

    /// Withdraws a [`Doorbell::watch`].
    #[inline]
    pub fn unwatch(&self) {
        self.word.fetch_and(!WATCHING, Ordering::Relaxed);
    }

    /// Announces that the owner is about to sleep. Returns the token for [`Doorbell::sleep`].
    /// The owner must look for work after this and before sleeping.
    #[inline]
    pub fn announce(&self) -> u32 {
        self.word.fetch_or(SLEEPING, Ordering::AcqRel) | SLEEPING
    }

    /// Withdraws an announcement, after finding work or after waking.
    #[inline]
    pub fn withdraw(&self) {
        self.word.fetch_and(!SLEEPING, Ordering::Relaxed);
    }

    /// Sleeps until a sender rings after `announce` returned `token`, or until `timeout`.
    /// Returns at once if one already did. Spurious returns are possible.
    pub fn sleep(&self, token: u32, timeout: Option<Duration>) {
        self.word.wait(token, timeout);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    #[test]
    fn ring_wakes_a_sleeper() {
        let bell = Arc::new(Doorbell::new());
        let work = Arc::new(AtomicBool::new(false));
        let (b, w) = (bell.clone(), work.clone());
        let t = std::thread::spawn(move || {
            while !w.load(Ordering::Acquire) {
                let token = b.announce();
                if w.load(Ordering::Acquire) {
                    b.withdraw();
                    break;
                }
                b.sleep(token, Some(Duration::from_secs(30)));
                b.withdraw();
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        let start = Instant::now();
        work.store(true, Ordering::Release);
        assert!(!bell.ring(), "nobody watches");
        t.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(25), "sleeper was not woken");
    }

    #[test]
    fn sleep_returns_at_once_after_a_ring() {
        let bell = Doorbell::new();
        let token = bell.announce();
        bell.ring();
        let start = Instant::now();
        bell.sleep(token, Some(Duration::from_secs(30)));
        assert!(start.elapsed() < Duration::from_secs(25));
    }

    #[test]
    fn a_ring_says_whether_the_owner_watches() {
        let bell = Doorbell::new();
        assert!(!bell.ring());
        bell.watch();
        assert!(bell.ring());
        assert!(bell.ring(), "until the owner withdraws");
        bell.unwatch();
        assert!(!bell.ring());
    }

    #[test]
    fn sleep_honours_the_timeout() {
        let bell = Doorbell::new();
        let token = bell.announce();
        bell.sleep(token, Some(Duration::from_millis(5)));
        bell.withdraw();
    }
}
