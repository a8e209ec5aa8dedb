//! Post, start, complete and wait between a target and an origin on the counters of a
//! window: the origin sees the target's memory as it was at the post, and the target
//! sees the origin's puts once its wait returns; and a second epoch right after the
//! first needs no reset.
#![cfg(loom)]

mod common;

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::thread;
use nemesis_shm::variant::{RelaxedPscw, Sound, Variant};
use nemesis_shm::window::pscw::{reached, signal};
use std::sync::Arc;

struct Shared {
    /// The origin's exposure counter for the target.
    exposure: AtomicU32,
    /// The target's completion counter.
    complete: AtomicU32,
    /// The target's window memory.
    data: UnsafeCell<u64>,
}

// SAFETY: the window memory is touched only as the post/complete hand-off allows, which is what the model checks; the rest are atomics.
unsafe impl Sync for Shared {}

fn epochs<V: Variant>(rounds: u32) {
    let s = Arc::new(Shared {
        exposure: AtomicU32::new(0),
        complete: AtomicU32::new(0),
        data: UnsafeCell::new(0),
    });
    let origin = {
        let s = s.clone();
        thread::spawn(move || {
            for e in 1..=rounds {
                // start
                while !reached(&s.exposure, e) {
                    thread::yield_now();
                }
                // get, then put
                // SAFETY: the target exposed its memory to us until our complete.
                let v = s.data.with(|p| unsafe { *p });
                assert_eq!(v, u64::from(e) * 10, "the target's memory as at its post");
                // SAFETY: as above.
                s.data.with_mut(|p| unsafe { *p = v + 1 });
                // complete
                signal::<V>(&s.complete);
            }
        })
    };
    for e in 1..=rounds {
        // The target writes its own memory before exposing it.
        // SAFETY: no epoch is open: the memory is ours.
        s.data.with_mut(|p| unsafe { *p = u64::from(e) * 10 });
        // post
        signal::<V>(&s.exposure);
        // wait
        while !reached(&s.complete, e) {
            thread::yield_now();
        }
        // SAFETY: the origin completed: the memory is ours again.
        let v = s.data.with(|p| unsafe { *p });
        assert_eq!(v, u64::from(e) * 10 + 1, "the origin's put before its complete");
    }
    origin.join().unwrap();
}

#[test]
fn one_epoch_hands_memory_over_and_back() {
    common::model(3, || epochs::<Sound>(1));
}

#[test]
fn epochs_follow_each_other_without_a_reset() {
    common::model(2, || epochs::<Sound>(2));
}

#[test]
fn pscw_model_catches_relaxed_counts() {
    common::must_fail(2, &["data race", "Causality violation", "causality"], || {
        epochs::<RelaxedPscw>(1)
    });
}
