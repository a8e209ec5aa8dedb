//! A split transfer's second half: each chunk moved by exactly one side, the receiver
//! done only once every chunk is in, and a late sender touching nothing of the next
//! transfer.
#![cfg(loom)]

mod common;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use nemesis_shm::split::{Side, SplitWord};
use nemesis_shm::variant::{Sound, SplitTakeByStore, Variant};
use std::sync::Arc;

const CHUNKS: u32 = 2;
const ID: u32 = 5;

struct Shared {
    word: SplitWord,
    /// The chunks of the receiver's buffer.
    chunks: [UnsafeCell<u8>; CHUNKS as usize],
    /// The sender's FIN, which in the real protocol is a packet, with its ordering.
    fin: AtomicBool,
}

// SAFETY: each chunk is written by the side that took it, as the protocol decides; loom
// checks that the two never overlap.
unsafe impl Sync for Shared {}

/// Moves every chunk `side` can take; returns how many it took.
fn take_all<V: Variant>(s: &Shared, side: Side) -> u32 {
    let c = s.word.view::<V>();
    let mut took = 0;
    while let Some(k) = c.take(ID, CHUNKS, side) {
        // SAFETY: the take makes chunk `k` ours to move.
        s.chunks[k as usize].with_mut(|p| unsafe { *p += 1 });
        took += 1;
    }
    took
}

/// The receiver opens the word and both sides take chunks; the receiver waits for FIN
/// if the sender took any, reads every chunk, closes the word and opens it for the next
/// transfer, which the first one's sender must leave alone.
fn transfer<V: Variant>() {
    let s = Arc::new(Shared {
        word: SplitWord::new(),
        chunks: [UnsafeCell::new(0), UnsafeCell::new(0)],
        fin: AtomicBool::new(false),
    });
    let c = s.word.view::<V>();
    assert!(c.open(ID));
    let s2 = s.clone();
    let sender = thread::spawn(move || {
        if take_all::<V>(&s2, Side::Sender) > 0 {
            s2.fin.store(true, Ordering::Release);
        }
        // Late: the next transfer's word is not this one's.
        assert_eq!(s2.word.view::<V>().take(ID, CHUNKS, Side::Sender), None);
    });
    take_all::<V>(&s, Side::Receiver);
    if c.sender_took(ID) > 0 {
        while !s.fin.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
    // The receive completes: its buffer goes back to the caller, who reads it.
    for ch in &s.chunks {
        // SAFETY: every chunk is in, and nobody writes it any more.
        assert_eq!(ch.with(|p| unsafe { *p }), 1, "a chunk moved twice or not at all");
    }
    c.close(ID);
    assert!(c.open(ID + 1));
    sender.join().unwrap();
}

#[test]
fn split_chunks_move_once_each() {
    common::model(3, transfer::<Sound>);
}

#[test]
fn split_model_catches_a_take_by_load_and_store() {
    common::must_fail(
        3,
        &[
            "Causality violation",
            "causality",
            "data race",
            "concurrent",
            "moved twice",
        ],
        transfer::<SplitTakeByStore>,
    );
}
