//! Element updates of a window as CPU atomics: concurrent updates of one word, native
//! and compare-and-swap loops mixed, lose none, and a fetched value is never handed to
//! two updaters.
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use nemesis_shm::variant::{LoadStoreUpdate, Sound, Variant};
use nemesis_shm::window::atomic::{Update, apply};
use std::sync::Arc;

fn sum(w: u64, x: u64) -> u64 {
    w.wrapping_add(x)
}

/// Two updaters: one adds natively, one through a compare-and-swap loop (as a
/// floating-point sum or a product does); each fetch must be unique, the sum whole.
fn fetch_and_add<V: Variant>() {
    let w = Arc::new(AtomicU64::new(0));
    let t = {
        let w = w.clone();
        thread::spawn(move || apply::<V, _>(&*w, Update::Add(1)))
    };
    let mine = apply::<V, _>(&*w, Update::With(sum, 1));
    let theirs = t.join().unwrap();
    assert_ne!(
        mine, theirs,
        "two updaters fetched the same value: an update was lost"
    );
    assert_eq!(w.load(Ordering::Relaxed), 2, "an update was lost");
}

/// A maximum by compare-and-swap against a compare-and-swap that claims the word.
fn max_and_cas<V: Variant>() {
    let w = Arc::new(AtomicU64::new(5));
    let t = {
        let w = w.clone();
        thread::spawn(move || apply::<V, _>(&*w, Update::With(u64::max, 9)))
    };
    let old = apply::<V, _>(&*w, Update::Cas { expect: 5, new: 7 });
    t.join().unwrap();
    let end = w.load(Ordering::Relaxed);
    assert_eq!(end, 9, "an update was lost (the compare-and-swap saw {old})");
}

#[test]
fn native_and_loop_updates_lose_nothing() {
    common::model(3, fetch_and_add::<Sound>);
}

#[test]
fn a_maximum_and_a_compare_and_swap_both_take_effect() {
    common::model(3, max_and_cas::<Sound>);
}

#[test]
fn update_model_catches_a_load_and_a_store() {
    common::must_fail(2, &["an update was lost"], fetch_and_add::<LoadStoreUpdate>);
}
