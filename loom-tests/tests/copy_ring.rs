//! The copy ring's slot hand-off: a message larger than the ring goes through it whole
//! and in order, and neither side touches a slot the other owns.
#![cfg(loom)]

mod common;

use loom::thread;
use nemesis_shm::ring::{HeapRing, Place, Seg, SegCursor};
use nemesis_shm::variant::{RelaxedRing, RelaxedRingReturn, Sound, Variant};
use std::sync::Arc;

/// 10 bytes through 2 slots of 4 bytes: three slot fills, one of them a reuse.
fn hand_off<V: Variant>() {
    const TOTAL: usize = 10;
    let hr = Arc::new(HeapRing::new(2, 4));
    let h2 = hr.clone();
    let sender = thread::spawn(move || {
        let data: Vec<u8> = (1..=TOTAL as u8).collect();
        let ring = h2.ring::<V>();
        let src = [Seg::of(&data)];
        let (mut place, mut at, mut done) = (Place::default(), SegCursor::default(), 0);
        while done < TOTAL {
            // SAFETY: `data` lives until the loop ends.
            unsafe { ring.push(&mut place, &src, &mut at, &mut done, TOTAL) };
            thread::yield_now();
        }
    });
    let ring = hr.ring::<V>();
    let mut out = vec![0u8; TOTAL];
    let dst = [Seg::of_mut(&mut out)];
    let (mut place, mut at, mut done) = (Place::default(), SegCursor::default(), 0);
    while done < TOTAL {
        // SAFETY: `out` is not otherwise used until the loop ends.
        unsafe { ring.pull(&mut place, &dst, &mut at, &mut done, TOTAL) };
        thread::yield_now();
    }
    sender.join().unwrap();
    assert_eq!(out, (1..=TOTAL as u8).collect::<Vec<_>>());
}

#[test]
fn copy_ring_hand_off() {
    common::model(3, hand_off::<Sound>);
}

#[test]
fn copy_ring_model_catches_a_relaxed_return() {
    common::must_fail(
        3,
        &["Causality violation", "causality", "data race"],
        hand_off::<RelaxedRingReturn>,
    );
}

#[test]
fn copy_ring_model_catches_a_relaxed_publish() {
    common::must_fail(
        2,
        &["Causality violation", "causality", "data race"],
        hand_off::<RelaxedRing>,
    );
}
