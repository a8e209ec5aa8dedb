//! A window's lock as one 64-bit counter word that only remote atomics touch: the lock
//! of a window whose atomics run on the network card, where a CPU atomic on the same
//! word would not be atomic with the card's.
//!
//! The word has three fields: the readers inside (low bits), the writers waiting
//! (middle), and whether a writer holds it (top). Every step is one fetch-and-add or
//! one compare-and-swap, the two atomics a card offers:
//!
//! - a reader adds one and is in if no writer held or waited; otherwise it takes its
//!   one back and tries again later, so waiting writers are not starved by readers;
//! - a writer takes a free word with one compare-and-swap; otherwise it announces
//!   itself once, then, while no reader is in and nobody holds the word, swaps its
//!   announcement for the holder bit;
//! - releasing is one subtraction.
//!
//! Unlike the ticket lock of shared memory, writers among themselves are not served in
//! order: who wins the swap goes first. What a holder wrote is ordered before the next
//! holder's access by the completions of these atomics, which the caller waits for.

use crate::variant::Variant;

/// One reader inside.
pub const READER: u64 = 1;
/// One writer waiting.
pub const WAITING: u64 = 1 << 21;
/// A writer holds the word.
pub const HELD: u64 = 1 << 42;
const READERS: u64 = WAITING - 1;
const WAITERS: u64 = READERS << 21;
const WRITERS: u64 = WAITERS | HELD;

/// The two atomics of a word, as whoever runs them offers them.
pub trait Word {
    /// What running an atomic can fail with.
    type Error;
    /// Adds `add` (wrapping) and returns the value before.
    ///
    /// # Errors
    /// The atomic could not be run.
    fn fetch_add(&mut self, add: u64) -> Result<u64, Self::Error>;
    /// Stores `swap` if the word is `compare`; returns the value before.
    ///
    /// # Errors
    /// As for [`Word::fetch_add`].
    fn compare_swap(&mut self, compare: u64, swap: u64) -> Result<u64, Self::Error>;
}

/// One try for a shared hold; `false`: a writer holds or waits, try again later.
///
/// # Errors
/// The word's.
pub fn try_shared<V: Variant, W: Word>(w: &mut W) -> Result<bool, W::Error> {
    let before = w.fetch_add(READER)?;
    if V::RMA_COUNTER_READER_DEFERS && before & WRITERS != 0 {
        w.fetch_add(READER.wrapping_neg())?;
        return Ok(false);
    }
    Ok(true)
}

/// A writer's first try, before it announces itself: the word is taken only if nobody
/// holds it or waits for it, so an uncontended exclusive lock is one atomic.
///
/// # Errors
/// The word's.
pub fn try_exclusive_at_once<W: Word>(w: &mut W) -> Result<bool, W::Error> {
    Ok(w.compare_swap(0, HELD)? == 0)
}

/// Says a writer waits: readers stay out from now on. Then [`try_exclusive`] until it
/// succeeds, or [`withdraw`].
///
/// # Errors
/// The word's.
pub fn announce<W: Word>(w: &mut W) -> Result<(), W::Error> {
    w.fetch_add(WAITING).map(drop)
}

/// One try of an announced writer for the exclusive hold; `false`: readers are in or
/// another writer holds it.
///
/// # Errors
/// The word's.
pub fn try_exclusive<W: Word>(w: &mut W) -> Result<bool, W::Error> {
    let now = w.fetch_add(0)?;
    if now & READERS != 0 || now & HELD != 0 || now & WAITERS == 0 {
        return Ok(false);
    }
    let want = now - WAITING + HELD;
    Ok(w.compare_swap(now, want)? == now)
}

/// Takes back an announcement that will not be followed by a hold.
///
/// # Errors
/// The word's.
pub fn withdraw<W: Word>(w: &mut W) -> Result<(), W::Error> {
    w.fetch_add(WAITING.wrapping_neg()).map(drop)
}

/// Ends a shared hold.
///
/// # Errors
/// The word's.
pub fn release_shared<W: Word>(w: &mut W) -> Result<(), W::Error> {
    w.fetch_add(READER.wrapping_neg()).map(drop)
}

/// Ends an exclusive hold.
///
/// # Errors
/// The word's.
pub fn release_exclusive<W: Word>(w: &mut W) -> Result<(), W::Error> {
    w.fetch_add(HELD.wrapping_neg()).map(drop)
}

/// Whether nobody holds or waits for the word.
pub fn is_free(word: u64) -> bool {
    word == 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::variant::Sound;
    use std::convert::Infallible;

    struct Plain(u64);

    impl Word for Plain {
        type Error = Infallible;
        fn fetch_add(&mut self, add: u64) -> Result<u64, Infallible> {
            let old = self.0;
            self.0 = old.wrapping_add(add);
            Ok(old)
        }
        fn compare_swap(&mut self, compare: u64, swap: u64) -> Result<u64, Infallible> {
            let old = self.0;
            if old == compare {
                self.0 = swap;
            }
            Ok(old)
        }
    }

    #[test]
    fn readers_share_and_a_waiting_writer_keeps_new_readers_out() {
        let mut w = Plain(0);
        assert!(try_shared::<Sound, _>(&mut w).unwrap());
        assert!(try_shared::<Sound, _>(&mut w).unwrap());
        announce(&mut w).unwrap();
        assert!(!try_exclusive(&mut w).unwrap(), "readers are in");
        assert!(!try_shared::<Sound, _>(&mut w).unwrap(), "a writer waits");
        release_shared(&mut w).unwrap();
        release_shared(&mut w).unwrap();
        assert!(try_exclusive(&mut w).unwrap());
        assert!(!try_shared::<Sound, _>(&mut w).unwrap(), "a writer holds it");
        announce(&mut w).unwrap();
        assert!(!try_exclusive(&mut w).unwrap(), "held by the first writer");
        release_exclusive(&mut w).unwrap();
        assert!(try_exclusive(&mut w).unwrap());
        release_exclusive(&mut w).unwrap();
        assert!(is_free(w.0));
        announce(&mut w).unwrap();
        withdraw(&mut w).unwrap();
        assert!(is_free(w.0));
    }

    #[test]
    fn a_writer_that_did_not_announce_itself_cannot_take_the_word() {
        let mut w = Plain(0);
        assert!(!try_exclusive(&mut w).unwrap());
        assert!(is_free(w.0));
    }

    #[test]
    fn a_free_word_is_taken_at_once_and_only_a_free_one() {
        let mut w = Plain(0);
        assert!(try_exclusive_at_once(&mut w).unwrap());
        assert!(!try_exclusive_at_once(&mut w).unwrap());
        release_exclusive(&mut w).unwrap();
        assert!(try_shared::<Sound, _>(&mut w).unwrap());
        assert!(!try_exclusive_at_once(&mut w).unwrap(), "a reader is in");
        release_shared(&mut w).unwrap();
        announce(&mut w).unwrap();
        assert!(
            !try_exclusive_at_once(&mut w).unwrap(),
            "a writer waits before us"
        );
    }
}
