//! The counter-word lock of a window whose atomics run on the network card: a writer
//! excludes readers and other writers, a waiting writer keeps new readers out, and
//! every holder gets in once the others leave. The card's fetch-and-add and
//! compare-and-swap are modelled as read-modify-writes on one atomic word.
#![cfg(loom)]

mod common;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use nemesis_shm::variant::{BlindReader, Sound, Variant};
use nemesis_shm::window::counter::{self, Word};
use std::convert::Infallible;
use std::sync::Arc;

struct Shared {
    word: AtomicU64,
    /// The "window": written only by writers, read by readers, under the lock.
    data: UnsafeCell<u64>,
}

// SAFETY: the data is touched only under the lock, which is what the model checks; the rest is an atomic.
unsafe impl Sync for Shared {}

/// The card's atomics on the word: each one read-modify-write, ordered as a completion
/// the origin waits for orders it.
struct Card<'a>(&'a AtomicU64);

impl Word for Card<'_> {
    type Error = Infallible;
    fn fetch_add(&mut self, add: u64) -> Result<u64, Infallible> {
        Ok(self.0.fetch_add(add, Ordering::AcqRel))
    }
    fn compare_swap(&mut self, compare: u64, swap: u64) -> Result<u64, Infallible> {
        Ok(
            match self
                .0
                .compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(v) | Err(v) => v,
            },
        )
    }
}

fn write(s: &Shared) {
    let mut w = Card(&s.word);
    if !counter::try_exclusive_at_once(&mut w).unwrap() {
        counter::announce(&mut w).unwrap();
        while !counter::try_exclusive(&mut w).unwrap() {
            thread::yield_now();
        }
    }
    // SAFETY: the lock is held exclusively.
    s.data.with_mut(|p| unsafe { *p += 1 });
    counter::release_exclusive(&mut w).unwrap();
}

fn read<V: Variant>(s: &Shared) -> u64 {
    let mut w = Card(&s.word);
    while !counter::try_shared::<V, _>(&mut w).unwrap() {
        thread::yield_now();
    }
    // SAFETY: the lock is held shared: no writer is inside.
    let v = s.data.with(|p| unsafe { *p });
    counter::release_shared(&mut w).unwrap();
    v
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        word: AtomicU64::new(0),
        data: UnsafeCell::new(0),
    })
}

fn two_writers() {
    let s = shared();
    let w = {
        let s = s.clone();
        thread::spawn(move || write(&s))
    };
    write(&s);
    w.join().unwrap();
    assert_eq!(read::<Sound>(&s), 2, "a writer's update was lost");
    assert!(counter::is_free(s.word.load(Ordering::Relaxed)));
}

fn reader_and_writer<V: Variant>() {
    let s = shared();
    let w = {
        let s = s.clone();
        thread::spawn(move || write(&s))
    };
    let v = read::<V>(&s);
    assert!(v <= 1);
    w.join().unwrap();
    assert_eq!(read::<V>(&s), 1);
    assert!(counter::is_free(s.word.load(Ordering::Relaxed)));
}

#[test]
fn counter_writers_exclude_each_other() {
    common::model(3, two_writers);
}

#[test]
fn counter_reader_never_sees_a_write_half_done() {
    common::model(3, reader_and_writer::<Sound>);
}

#[test]
fn counter_model_catches_a_reader_that_ignores_writers() {
    common::must_fail(3, &["data race", "Causality violation", "causality"], || {
        reader_and_writer::<BlindReader>()
    });
}
