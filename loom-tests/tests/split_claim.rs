//! A split transfer's second half: moved by the sender or taken back by the receiver,
//! never both, and never written after the receiver is done with its buffer.
#![cfg(loom)]

mod common;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use nemesis_shm::split::SplitWord;
use nemesis_shm::variant::{Sound, SplitTakeByStore, Variant};
use std::sync::Arc;

struct Shared {
    word: SplitWord,
    /// The second half of the receiver's buffer.
    half: UnsafeCell<u8>,
    /// The sender's FIN, which in the real protocol is a packet, with its ordering.
    fin: AtomicBool,
}

// SAFETY: `half` is written by whichever side holds the half, as the protocol decides;
// loom checks that the two never overlap.
unsafe impl Sync for Shared {}

const ID: u32 = 5;

/// The receiver offers the half, the sender claims it when it comes to it, and the
/// receiver, done with its own half, takes it back unless claimed; then, once the half
/// is in, it reads it and frees the word. A second transfer follows, which the first's
/// late sender must not touch.
fn transfer<V: Variant>() {
    let s = Arc::new(Shared {
        word: SplitWord::new(),
        half: UnsafeCell::new(0),
        fin: AtomicBool::new(false),
    });
    assert!(s.word.view::<V>().offer(ID));
    let s2 = s.clone();
    let sender = thread::spawn(move || {
        if s2.word.view::<V>().claim(ID) {
            // SAFETY: the claim makes the half ours until FIN.
            s2.half.with_mut(|p| unsafe { *p = 1 });
            s2.fin.store(true, Ordering::Release);
        }
    });
    let c = s.word.view::<V>();
    if c.take_back(ID) {
        // SAFETY: taken back: the sender writes nothing.
        s.half.with_mut(|p| unsafe { *p = 1 });
    } else {
        while !s.fin.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
    // The receive completes: its buffer goes back to the caller, who reads it.
    // SAFETY: the half is in, and nobody writes it any more.
    assert_eq!(s.half.with(|p| unsafe { *p }), 1);
    c.release(ID);
    // The next transfer's offer: a late sender of the first finds it not its own.
    assert!(c.offer(ID + 1));
    sender.join().unwrap();
    // SAFETY: both threads are done.
    s.half.with_mut(|p| unsafe { *p = 0 });
    assert!(!c.claim(ID), "a stale claim");
}

#[test]
fn split_claim_moves_the_half_once() {
    common::model(3, transfer::<Sound>);
}

#[test]
fn split_claim_model_catches_a_take_back_by_store() {
    common::must_fail(
        3,
        &["Causality violation", "causality", "data race", "concurrent"],
        transfer::<SplitTakeByStore>,
    );
}
