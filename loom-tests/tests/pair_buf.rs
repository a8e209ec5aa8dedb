//! The pair buffer's hand-off: messages go through it whole and in turn, either side may
//! claim it next, and neither side touches bytes the other owns.
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use nemesis_shm::pairbuf::{HeapPair, PIECE};
use nemesis_shm::ring::Seg;
use nemesis_shm::variant::{RelaxedPairPublish, RelaxedPairRelease, Sound, Variant};
use std::sync::Arc;

struct Shared {
    pair: HeapPair,
    /// Messages announced to each side: the channel's packets, which carry the
    /// announcement in the real protocol, with the orderings they have.
    to: [AtomicUsize; 2],
}

fn send<V: Variant>(s: &Shared, me: u32, len: usize, fill: u8) {
    let b = s.pair.view::<V>(me);
    while !b.try_claim() {
        thread::yield_now();
    }
    s.to[1 - me as usize].fetch_add(1, Ordering::Release);
    let msg = vec![fill; len];
    // SAFETY: `msg` holds `len` bytes and lives across the call; we hold the buffer.
    unsafe { b.fill(&[Seg::of(&msg)], len) };
}

fn recv<V: Variant>(s: &Shared, me: u32, seen: &mut usize, len: usize, fill: u8) {
    while s.to[me as usize].load(Ordering::Acquire) == *seen {
        thread::yield_now();
    }
    *seen += 1;
    let b = s.pair.view::<V>(me);
    assert!(
        b.held_by_peer(),
        "announced by a side that does not hold the buffer"
    );
    let mut got = 0;
    while got < len {
        let w = b.written().min(len);
        if w > got {
            // SAFETY: the peer holds the buffer for this message and published `w` bytes.
            unsafe { b.read(got, w, |x| assert!(x.iter().all(|&c| c == fill), "a stale byte")) };
            got = w;
        } else {
            thread::yield_now();
        }
    }
    b.release();
}

/// Two messages one way, the second claimed as soon as the first is freed, then a reply
/// the other way through the same bytes.
fn turns<V: Variant>() {
    let s = Arc::new(Shared {
        pair: HeapPair::new(2),
        to: [AtomicUsize::new(0), AtomicUsize::new(0)],
    });
    let s2 = s.clone();
    let a = thread::spawn(move || {
        send::<V>(&s2, 0, PIECE + 1, 1);
        send::<V>(&s2, 0, PIECE, 2);
        let mut seen = 0;
        recv::<V>(&s2, 0, &mut seen, PIECE, 3);
    });
    let mut seen = 0;
    recv::<V>(&s, 1, &mut seen, PIECE + 1, 1);
    recv::<V>(&s, 1, &mut seen, PIECE, 2);
    send::<V>(&s, 1, PIECE, 3);
    a.join().unwrap();
}

#[test]
fn pair_buffer_turns() {
    common::model(2, turns::<Sound>);
}

#[test]
fn pair_buffer_model_catches_a_relaxed_publish() {
    common::must_fail(
        2,
        &["Causality violation", "causality", "data race"],
        turns::<RelaxedPairPublish>,
    );
}

#[test]
fn pair_buffer_model_catches_a_relaxed_release() {
    common::must_fail(
        2,
        &["Causality violation", "causality", "data race"],
        turns::<RelaxedPairRelease>,
    );
}
