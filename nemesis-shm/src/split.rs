//! Who copies the second half of a split transfer (the LMT's `cma-split`): the sender,
//! into the receiver's buffer, or the receiver itself.
//!
//! In a split transfer the receiver reads the first half of the sender's buffer while
//! the sender writes the second half into the receiver's. A sender that is busy elsewhere
//! must not hold the receiver up: once its own half is done, a receiver that still waits
//! takes the second half back and reads it too, as a plain CMA read would. The two must
//! never both move it, and the receiver must not hand its buffer back while the sender
//! may still write into it. One word per receiving process settles it, for one split
//! transfer of that process at a time (others go by plain CMA):
//! - the receiver *offers* the half of transfer `id` (a compare-and-swap from free);
//! - the sender *claims* it before writing (a compare-and-swap from offered); having
//!   written, it says so in a FIN packet, which orders its writes before the receiver's
//!   completion;
//! - a receiver done with its own half *takes it back* (a compare-and-swap from offered)
//!   and reads it itself; a sender that then finds it taken writes nothing;
//! - the receiver frees the word when the transfer is over: after the FIN, or after the
//!   half it took back. A sender that comes late finds another id or none, and writes
//!   nothing.
//!
//! Exactly one compare-and-swap out of offered succeeds, so exactly one side moves the
//! half. The bytes themselves move by system calls and are ordered by the packets, not
//! by this word.

use crate::sync::{AtomicU64, Ordering};
use crate::variant::{Sound, Variant};
use std::marker::PhantomData;

const OFFERED: u64 = 1 << 32;
const CLAIMED: u64 = 2 << 32;
const TAKEN: u64 = 3 << 32;

/// A receiving process's word, in the segment (zero: free).
#[repr(C)]
#[derive(Debug)]
pub struct SplitWord(AtomicU64);

impl SplitWord {
    /// A free word (for the loom models and tests; the segment's start zeroed).
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The word as a protocol `V` sees it.
    pub fn view<V: Variant>(&self) -> SplitClaim<'_, V> {
        SplitClaim {
            word: &self.0,
            _v: PhantomData,
        }
    }
}

impl Default for SplitWord {
    fn default() -> Self {
        Self::new()
    }
}

/// The protocol's steps on one word.
#[derive(Debug)]
pub struct SplitClaim<'a, V: Variant = Sound> {
    word: &'a AtomicU64,
    _v: PhantomData<V>,
}

impl<V: Variant> SplitClaim<'_, V> {
    /// Receiver: offers the second half of transfer `id` to its sender; `false` while
    /// another split transfer of ours holds the word.
    pub fn offer(&self, id: u32) -> bool {
        self.word
            .compare_exchange(0, OFFERED | id as u64, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Sender: takes the second half of transfer `id` to write; `false` if the receiver
    /// took it back, or the word is already another transfer's.
    pub fn claim(&self, id: u32) -> bool {
        self.word
            .compare_exchange(
                OFFERED | id as u64,
                CLAIMED | id as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Receiver: takes the second half of transfer `id` back, to read it itself; `false`
    /// if the sender has claimed it (then its FIN is to come).
    pub fn take_back(&self, id: u32) -> bool {
        if V::SPLIT_TAKE_RMW {
            self.word
                .compare_exchange(
                    OFFERED | id as u64,
                    TAKEN | id as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        } else if self.word.load(Ordering::Relaxed) == OFFERED | id as u64 {
            self.word.store(TAKEN | id as u64, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Receiver: frees the word once transfer `id` is over (the sender's FIN came, or the
    /// receiver took the half back), if it is still that transfer's. Claimed or taken,
    /// only the receiver writes it; still offered (a transfer abandoned), the sender may
    /// claim it meanwhile, so that is a compare-and-swap.
    pub fn release(&self, id: u32) {
        loop {
            let cur = self.word.load(Ordering::Relaxed);
            if cur == 0 || cur & u32::MAX as u64 != id as u64 {
                return;
            }
            if cur != OFFERED | id as u64 {
                self.word.store(0, Ordering::Relaxed);
                return;
            }
            if self
                .word
                .compare_exchange(cur, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_side_moves_the_half_and_the_word_comes_back() {
        let w = SplitWord::new();
        let c = w.view::<Sound>();
        assert!(c.offer(7));
        assert!(!c.offer(8), "one split transfer of a receiver at a time");
        assert!(!c.claim(8), "another transfer's claim");
        assert!(c.claim(7));
        assert!(!c.take_back(7), "claimed by the sender");
        c.release(7);
        // Taken back before the sender came: the sender then writes nothing.
        assert!(c.offer(9));
        assert!(c.take_back(9));
        assert!(!c.claim(9));
        c.release(9);
        // A late sender finds the next transfer's offer, not its own.
        assert!(c.offer(10));
        assert!(!c.claim(9));
        c.release(9);
        assert!(
            !c.offer(11),
            "a stale release leaves the next transfer's word alone"
        );
        c.release(10);
        assert!(c.offer(11));
    }
}
