//! Element updates of a window as CPU atomics: what an accumulate, a fetch-and-op or a
//! compare-and-swap does to one element of shared memory, whichever process does it.
//!
//! Every update of a window's elements goes through [`apply`], by the origin when it
//! maps the target's memory and by the target when the update came as a message, so
//! all of them are atomic with respect to each other: one executor, the CPU, for every
//! word. Operations with a native instruction (add, and, or, xor, swap, load) use it;
//! the others (minimum, maximum, product, floating-point sums) loop on a
//! compare-and-swap until no other update came between their load and their store.

use crate::sync::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};
use crate::variant::Variant;

/// The integer behind an atomic word.
pub trait Bits: Copy + Eq + core::fmt::Debug + Send + Sync + 'static {
    /// `self + other`, wrapping.
    fn wrapping_add(self, other: Self) -> Self;
    /// `self & other`.
    fn and(self, other: Self) -> Self;
    /// `self | other`.
    fn or(self, other: Self) -> Self;
    /// `self ^ other`.
    fn xor(self, other: Self) -> Self;
}

/// An atomic word of a window: the operations its updates use.
pub trait AtomicWord: Sync {
    /// Its integer.
    type Int: Bits;
    /// A load.
    fn load(&self, o: Ordering) -> Self::Int;
    /// A store.
    fn store(&self, v: Self::Int, o: Ordering);
    /// An exchange.
    fn swap(&self, v: Self::Int, o: Ordering) -> Self::Int;
    /// A wrapping add.
    fn fetch_add(&self, v: Self::Int, o: Ordering) -> Self::Int;
    /// A bitwise and.
    fn fetch_and(&self, v: Self::Int, o: Ordering) -> Self::Int;
    /// A bitwise or.
    fn fetch_or(&self, v: Self::Int, o: Ordering) -> Self::Int;
    /// A bitwise exclusive or.
    fn fetch_xor(&self, v: Self::Int, o: Ordering) -> Self::Int;
    /// A strong compare-and-swap.
    fn compare_exchange(
        &self,
        current: Self::Int,
        new: Self::Int,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Self::Int, Self::Int>;
}

macro_rules! word {
    ($($a:ty => $i:ty),*) => {$(
        impl Bits for $i {
            #[inline(always)]
            fn wrapping_add(self, other: Self) -> Self {
                <$i>::wrapping_add(self, other)
            }
            #[inline(always)]
            fn and(self, other: Self) -> Self {
                self & other
            }
            #[inline(always)]
            fn or(self, other: Self) -> Self {
                self | other
            }
            #[inline(always)]
            fn xor(self, other: Self) -> Self {
                self ^ other
            }
        }

        impl AtomicWord for $a {
            type Int = $i;
            #[inline(always)]
            fn load(&self, o: Ordering) -> $i {
                <$a>::load(self, o)
            }
            #[inline(always)]
            fn store(&self, v: $i, o: Ordering) {
                <$a>::store(self, v, o)
            }
            #[inline(always)]
            fn swap(&self, v: $i, o: Ordering) -> $i {
                <$a>::swap(self, v, o)
            }
            #[inline(always)]
            fn fetch_add(&self, v: $i, o: Ordering) -> $i {
                <$a>::fetch_add(self, v, o)
            }
            #[inline(always)]
            fn fetch_and(&self, v: $i, o: Ordering) -> $i {
                <$a>::fetch_and(self, v, o)
            }
            #[inline(always)]
            fn fetch_or(&self, v: $i, o: Ordering) -> $i {
                <$a>::fetch_or(self, v, o)
            }
            #[inline(always)]
            fn fetch_xor(&self, v: $i, o: Ordering) -> $i {
                <$a>::fetch_xor(self, v, o)
            }
            #[inline(always)]
            fn compare_exchange(&self, c: $i, n: $i, s: Ordering, f: Ordering) -> Result<$i, $i> {
                <$a>::compare_exchange(self, c, n, s, f)
            }
        }
    )*};
}

word!(AtomicU8 => u8, AtomicU16 => u16, AtomicU32 => u32, AtomicU64 => u64);

/// What an update does to a word `w`, given its operand.
#[derive(Clone, Copy)]
pub enum Update<I> {
    /// `w + x`, wrapping.
    Add(I),
    /// `w & x`.
    And(I),
    /// `w | x`.
    Or(I),
    /// `w ^ x`.
    Xor(I),
    /// `x`.
    Swap(I),
    /// `w`, unchanged: an atomic read.
    Load,
    /// `f(w, x)`: retried until no other update came between the load and the store.
    With(fn(I, I) -> I, I),
    /// `new` if `w == expect`, else `w`.
    Cas {
        /// The value the word must hold.
        expect: I,
        /// What it gets if it does.
        new: I,
    },
}

impl<I: core::fmt::Debug> core::fmt::Debug for Update<I> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Update::Add(x) => write!(f, "Add({x:?})"),
            Update::And(x) => write!(f, "And({x:?})"),
            Update::Or(x) => write!(f, "Or({x:?})"),
            Update::Xor(x) => write!(f, "Xor({x:?})"),
            Update::Swap(x) => write!(f, "Swap({x:?})"),
            Update::Load => f.write_str("Load"),
            Update::With(_, x) => write!(f, "With(_, {x:?})"),
            Update::Cas { expect, new } => write!(f, "Cas({expect:?} -> {new:?})"),
        }
    }
}

impl<I: Bits> Update<I> {
    /// What the word becomes from `w`.
    #[inline]
    pub fn result(self, w: I) -> I {
        match self {
            Update::Add(x) => w.wrapping_add(x),
            Update::And(x) => w.and(x),
            Update::Or(x) => w.or(x),
            Update::Xor(x) => w.xor(x),
            Update::Swap(x) => x,
            Update::Load => w,
            Update::With(f, x) => f(w, x),
            Update::Cas { expect, new } => {
                if w == expect {
                    new
                } else {
                    w
                }
            }
        }
    }
}

/// Applies `u` to `a` atomically and returns the word's value before it.
///
/// Read-modify-writes are `AcqRel`: an update that a process uses to hand over other
/// memory (a flag, a list link) publishes what it wrote before, as the target's
/// applications of remote updates do.
#[inline]
pub fn apply<V: Variant, A: AtomicWord>(a: &A, u: Update<A::Int>) -> A::Int {
    const RMW: Ordering = Ordering::AcqRel;
    if !V::RMA_ATOMIC_RMW {
        // The broken variant: a load and a store, which another update can slip between.
        let w = a.load(Ordering::Acquire);
        a.store(u.result(w), Ordering::Release);
        return w;
    }
    match u {
        Update::Add(x) => a.fetch_add(x, RMW),
        Update::And(x) => a.fetch_and(x, RMW),
        Update::Or(x) => a.fetch_or(x, RMW),
        Update::Xor(x) => a.fetch_xor(x, RMW),
        Update::Swap(x) => a.swap(x, RMW),
        Update::Load => a.load(Ordering::Acquire),
        Update::Cas { expect, new } => match a.compare_exchange(expect, new, RMW, Ordering::Acquire) {
            Ok(w) | Err(w) => w,
        },
        Update::With(f, x) => {
            let mut w = a.load(Ordering::Relaxed);
            loop {
                match a.compare_exchange(w, f(w, x), RMW, Ordering::Relaxed) {
                    Ok(old) => return old,
                    Err(now) => w = now,
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::variant::Sound;

    #[test]
    fn every_update_returns_the_old_word_and_leaves_the_new_one() {
        let a = AtomicU32::new(6);
        assert_eq!(apply::<Sound, _>(&a, Update::Add(u32::MAX)), 6);
        assert_eq!(a.load(Ordering::Relaxed), 5, "adds wrap");
        assert_eq!(apply::<Sound, _>(&a, Update::And(4)), 5);
        assert_eq!(apply::<Sound, _>(&a, Update::Or(3)), 4);
        assert_eq!(apply::<Sound, _>(&a, Update::Xor(1)), 7);
        assert_eq!(apply::<Sound, _>(&a, Update::Swap(10)), 6);
        assert_eq!(apply::<Sound, _>(&a, Update::Load), 10);
        assert_eq!(apply::<Sound, _>(&a, Update::With(u32::max, 3)), 10);
        assert_eq!(apply::<Sound, _>(&a, Update::With(u32::min, 3)), 10);
        assert_eq!(a.load(Ordering::Relaxed), 3);
        assert_eq!(apply::<Sound, _>(&a, Update::Cas { expect: 4, new: 9 }), 3);
        assert_eq!(a.load(Ordering::Relaxed), 3, "a failed compare leaves the word");
        assert_eq!(apply::<Sound, _>(&a, Update::Cas { expect: 3, new: 9 }), 3);
        assert_eq!(a.load(Ordering::Relaxed), 9);
    }

    #[test]
    fn concurrent_updates_lose_nothing() {
        let a = std::sync::Arc::new(AtomicU64::new(0));
        let f: fn(u64, u64) -> u64 = |w, x| w.wrapping_add(x);
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        apply::<Sound, _>(&*a, Update::With(f, 1));
                        apply::<Sound, _>(&*a, Update::Add(1));
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(a.load(Ordering::Relaxed), 80_000);
    }
}
