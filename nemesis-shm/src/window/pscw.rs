//! Post, start, complete and wait among the processes that map a window: counters in
//! the window's control block, after foMPI's matching counters.
//!
//! Each origin has an exposure counter per target: a target's post adds one to the
//! counter of each origin of its group, and an origin's start waits until each of its
//! targets' counters has reached the number of starts it has made towards that target.
//! Each target has a completion counter: an origin's complete adds one to it, and the
//! target's wait waits until it has reached the number of origins of all its posts so
//! far. Counting, rather than setting and clearing flags, lets epochs follow each other
//! without a reset that could race with the next epoch's increments. Counters wrap;
//! [`reached`] compares them modulo 2³².
//!
//! A post publishes the target's window memory to its origins, and a complete publishes
//! an origin's updates to its target: both are `Release` increments, and the waits
//! `Acquire` loads.

use crate::sync::{AtomicU32, Ordering};
use crate::variant::Variant;

/// Counts one post (on an origin's exposure counter for the poster) or one complete (on
/// a target's completion counter).
#[inline]
pub fn signal<V: Variant>(counter: &AtomicU32) {
    counter.fetch_add(1, V::RMA_PSCW_PUBLISH);
}

/// Whether `counter` has reached `want`, modulo 2³².
#[inline]
pub fn reached(counter: &AtomicU32, want: u32) -> bool {
    counter.load(Ordering::Acquire).wrapping_sub(want) as i32 >= 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::variant::Sound;

    #[test]
    fn counts_are_compared_across_the_wrap() {
        let c = AtomicU32::new(u32::MAX);
        assert!(reached(&c, u32::MAX));
        assert!(!reached(&c, 0));
        signal::<Sound>(&c);
        assert!(reached(&c, 0));
        assert!(reached(&c, u32::MAX - 5));
        assert!(!reached(&c, 1));
    }
}
