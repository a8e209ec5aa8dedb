//! A window's reader-writer lock: a fair ticket lock (Mellor-Crummey and Scott's
//! reader-writer ticket lock), one per target, in the window's shared control block.
//!
//! Three counters: `users` hands out tickets, `read` names the next reader to admit,
//! `write` the next writer. A locker takes a ticket and waits for its turn:
//!
//! - a writer waits until `write` is its ticket; it releases by advancing `read` and
//!   then `write`, admitting whoever holds the next ticket;
//! - a reader waits until `read` is its ticket and advances `read` at once, admitting a
//!   reader that queued right behind it; it releases by advancing `write`.
//!
//! Turns come in ticket order, so the lock is FIFO: no writer waits behind readers that
//! came after it. Counters wrap and are only compared for equality. Taking the lock is
//! one read-modify-write and a wait; releasing it one (shared) or two (exclusive).
//! Every release is a `Release` increment and every turn is seen with an `Acquire`
//! load, so what a holder wrote to the window happens before the next holder's access.

use crate::sync::{AtomicU32, Ordering};
use crate::variant::Variant;

/// The lock of one target's window memory.
#[derive(Debug, Default)]
#[repr(C)]
pub struct RwTicket {
    users: AtomicU32,
    read: AtomicU32,
    write: AtomicU32,
}

/// A place in the lock's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u32);

impl RwTicket {
    /// An unlocked lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins the queue. The caller then waits with [`RwTicket::writer_turn`] or
    /// [`RwTicket::reader_turn`], and must wait its turn: a ticket that is never used
    /// blocks everyone behind it.
    #[inline]
    pub fn ticket(&self) -> Ticket {
        Ticket(self.users.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether writer `t` holds the lock now.
    #[inline]
    pub fn writer_turn(&self, t: Ticket) -> bool {
        self.write.load(Ordering::Acquire) == t.0
    }

    /// Whether reader `t` holds the lock now; if it does, the next reader in the queue
    /// is admitted too.
    #[inline]
    pub fn reader_turn<V: Variant>(&self, t: Ticket) -> bool {
        if self.read.load(Ordering::Acquire) != t.0 {
            return false;
        }
        // Only the holder of the turn changes `read` now: a writer ahead of us has
        // released, and the one behind us has not been admitted.
        self.read.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Releases a lock held exclusively.
    #[inline]
    pub fn release_exclusive<V: Variant>(&self) {
        self.read.fetch_add(1, V::RMA_LOCK_RELEASE);
        self.write.fetch_add(1, V::RMA_LOCK_RELEASE);
    }

    /// Releases a lock held shared.
    #[inline]
    pub fn release_shared<V: Variant>(&self) {
        self.write.fetch_add(1, V::RMA_LOCK_RELEASE);
    }

    /// Whether nobody holds or waits for the lock.
    pub fn is_free(&self) -> bool {
        let u = self.users.load(Ordering::Acquire);
        self.write.load(Ordering::Acquire) == u && self.read.load(Ordering::Acquire) == u
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::variant::Sound;

    #[test]
    fn turns_come_in_ticket_order() {
        let l = RwTicket::new();
        let (r0, r1, w2, r3) = (l.ticket(), l.ticket(), l.ticket(), l.ticket());
        assert!(l.reader_turn::<Sound>(r0));
        assert!(
            l.reader_turn::<Sound>(r1),
            "readers queued together share the lock"
        );
        assert!(!l.writer_turn(w2));
        assert!(!l.reader_turn::<Sound>(r3), "a reader behind a writer waits");
        l.release_shared::<Sound>();
        assert!(!l.writer_turn(w2));
        l.release_shared::<Sound>();
        assert!(l.writer_turn(w2));
        assert!(!l.reader_turn::<Sound>(r3));
        l.release_exclusive::<Sound>();
        assert!(l.reader_turn::<Sound>(r3));
        l.release_shared::<Sound>();
        assert!(l.is_free());
    }

    #[test]
    fn writers_exclude_each_other_across_threads() {
        let l = std::sync::Arc::new(RwTicket::new());
        let inside = std::sync::Arc::new(AtomicU32::new(0));
        let ts: Vec<_> = (0..4)
            .map(|i| {
                let (l, inside) = (l.clone(), inside.clone());
                std::thread::spawn(move || {
                    for n in 0..2000 {
                        let t = l.ticket();
                        let writer = (i + n) % 3 == 0;
                        if writer {
                            while !l.writer_turn(t) {
                                std::hint::spin_loop();
                            }
                            assert_eq!(inside.fetch_add(1000, Ordering::Relaxed) % 1000, 0);
                            assert_eq!(inside.fetch_sub(1000, Ordering::Relaxed) % 1000, 0);
                            l.release_exclusive::<Sound>();
                        } else {
                            while !l.reader_turn::<Sound>(t) {
                                std::hint::spin_loop();
                            }
                            assert!(
                                inside.fetch_add(1, Ordering::Relaxed) < 1000,
                                "a writer is inside"
                            );
                            inside.fetch_sub(1, Ordering::Relaxed);
                            l.release_shared::<Sound>();
                        }
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert!(l.is_free());
    }
}
