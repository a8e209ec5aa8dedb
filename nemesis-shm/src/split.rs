//! Who moves each piece of a split transfer's second half (the LMT's `cma-split`): the
//! sender, writing into the receiver's buffer, or the receiver, reading it.
//!
//! In a split transfer the receiver reads the first half of the sender's buffer while
//! the sender writes the second half into the receiver's. The second half is cut into
//! chunks, and each side takes the next chunk it has not got before moving it, so a
//! sender that is busy elsewhere holds nothing up (the receiver takes every chunk, as a
//! plain CMA read would) and a sender that comes at once takes chunks while the receiver
//! reads its half. Each chunk is moved by exactly one side.
//!
//! One word per transfer, in a pool of [`SLOTS`] words of the receiving process:
//! - the receiver *opens* a free word for transfer `id` before its CTS, which names it;
//! - either side *takes* the next chunk with a compare-and-swap that also counts the
//!   sender's takes; a take fails once every chunk is taken, or when the word is no
//!   longer the transfer's (a sender that comes late);
//! - once every chunk is taken the word no longer changes: the receiver reads how many
//!   the sender took. None: its buffer is whole. Some: the sender's FIN, sent once its
//!   chunks are written, is to come, and orders those writes before the receive ends;
//! - the receiver then *closes* the word, free for its next transfer.
//!
//! The bytes move by system calls and are ordered by the packets, not by this word.

use crate::sync::{AtomicU64, Ordering};
use crate::variant::{Sound, Variant};
use std::marker::PhantomData;

/// Words per receiving process: its split transfers at once (more are read whole).
pub const SLOTS: usize = 64;

/// Bits of the word: the transfer's number (low 32), the next chunk, the sender's takes.
const ID_MASK: u64 = u32::MAX as u64;
const NEXT_SHIFT: u32 = 32;
const SENDER_SHIFT: u32 = 48;

/// Most chunks a transfer's second half is cut into.
pub const MAX_CHUNKS: u32 = u16::MAX as u32;

/// One transfer's word, in the segment (zero: free).
#[repr(C)]
#[derive(Debug)]
pub struct SplitWord(AtomicU64);

impl SplitWord {
    /// A free word (for the loom models and tests; the segment starts zeroed).
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

/// Which side takes a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The sender, which writes the chunk into the receiver's buffer.
    Sender,
    /// The receiver, which reads it from the sender's buffer.
    Receiver,
}

/// The protocol's steps on one word.
#[derive(Debug)]
pub struct SplitClaim<'a, V: Variant = Sound> {
    word: &'a AtomicU64,
    _v: PhantomData<V>,
}

impl<V: Variant> SplitClaim<'_, V> {
    /// Receiver: opens the word for transfer `id` (not 0); `false` if it is not free.
    pub fn open(&self, id: u32) -> bool {
        debug_assert_ne!(id, 0);
        self.word
            .compare_exchange(0, id as u64, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the next of `chunks` chunks of transfer `id` for `side`: its index, or
    /// `None` once all are taken or the word is another transfer's.
    pub fn take(&self, id: u32, chunks: u32, side: Side) -> Option<u32> {
        let add = match side {
            Side::Sender => 1 << NEXT_SHIFT | 1 << SENDER_SHIFT,
            Side::Receiver => 1 << NEXT_SHIFT,
        };
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let next = (cur >> NEXT_SHIFT & 0xffff) as u32;
            if cur & ID_MASK != id as u64 || cur == 0 || next >= chunks.min(MAX_CHUNKS) {
                return None;
            }
            if !V::SPLIT_TAKE_RMW {
                self.word.store(cur + add, Ordering::Relaxed);
                return Some(next);
            }
            match self
                .word
                .compare_exchange_weak(cur, cur + add, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(next),
                Err(now) => cur = now,
            }
        }
    }

    /// Receiver, once a take has failed with every chunk taken: how many the sender
    /// took (final by then).
    pub fn sender_took(&self, id: u32) -> u32 {
        let cur = self.word.load(Ordering::Relaxed);
        if cur & ID_MASK == id as u64 {
            (cur >> SENDER_SHIFT) as u32
        } else {
            0
        }
    }

    /// Receiver: frees the word of transfer `id`, if it is still that transfer's. A
    /// transfer abandoned before every chunk was taken is closed with a compare-and-swap,
    /// as its sender may take one meanwhile.
    pub fn close(&self, id: u32) {
        let mut cur = self.word.load(Ordering::Relaxed);
        while cur != 0 && cur & ID_MASK == id as u64 {
            match self
                .word
                .compare_exchange_weak(cur, 0, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_chunk_goes_to_one_side_and_the_sender_s_takes_are_counted() {
        let w = SplitWord::new();
        let c = w.view::<Sound>();
        assert_eq!(c.take(7, 3, Side::Sender), None, "not open");
        assert!(c.open(7));
        assert!(!c.open(8), "open already");
        assert_eq!(c.take(8, 3, Side::Sender), None, "another transfer's word");
        assert_eq!(c.take(7, 3, Side::Sender), Some(0));
        assert_eq!(c.take(7, 3, Side::Receiver), Some(1));
        assert_eq!(c.take(7, 3, Side::Sender), Some(2));
        assert_eq!(c.take(7, 3, Side::Receiver), None);
        assert_eq!(c.sender_took(7), 2);
        c.close(7);
        // A late sender finds the next transfer's word, or none.
        assert_eq!(c.take(7, 3, Side::Sender), None);
        assert!(c.open(9));
        assert_eq!(c.take(7, 3, Side::Sender), None);
        assert_eq!(
            (c.take(9, 1, Side::Receiver), c.take(9, 1, Side::Sender)),
            (Some(0), None)
        );
        assert_eq!(c.sender_took(9), 0);
        c.close(7);
        assert!(!c.open(10), "a stale close leaves the word alone");
        c.close(9);
        assert!(c.open(10));
    }
}
