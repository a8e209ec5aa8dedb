//! The node barrier and its data slots: every member's slot must be written before any
//! member reads it, the double-buffered slots must not be overwritten while read, and a
//! member asleep on the barrier must be woken by the last arrival.
#![cfg(loom)]

mod common;

use loom::thread;
use nemesis_shm::coll::{Block, HeapBlock};
use nemesis_shm::variant::{PlainRelease, RelaxedArrive, Sound, Variant};
use std::sync::Arc;

/// Waits for the barrier of `epoch` the way production does, sleeping at once.
fn wait<V: Variant>(b: Block<'_, V>, epoch: u32) {
    while !b.passed(epoch) {
        b.sleep(epoch, None);
    }
}

/// `n` members, `rounds` allreduce episodes of one word each.
fn episodes<V: Variant>(n: usize, rounds: u32) {
    let hb = Arc::new(HeapBlock::new(n));
    let member = move |hb: Arc<HeapBlock>, m: usize| {
        let b = hb.block_with::<V>();
        let mut epoch = b.generation();
        for round in 0..rounds {
            let mine = (m as u64 + 1) << (8 * round);
            b.write_slot(epoch, m, round as u64, &mine.to_le_bytes());
            if !b.arrive(n as u32) {
                wait(b, epoch);
            }
            let mut sum = 0;
            for other in 0..n {
                let mut v = [0u8; 8];
                let (sig, len) = b.read_slot(epoch, other, &mut v);
                assert_eq!(
                    (sig, len),
                    (round as u64, 8),
                    "member {other}'s slot in round {round}"
                );
                sum += u64::from_le_bytes(v);
            }
            let want: u64 = (1..=n as u64).sum::<u64>() << (8 * round);
            assert_eq!(sum, want, "round {round}");
            epoch = epoch.wrapping_add(1);
        }
    };
    let others: Vec<_> = (1..n)
        .map(|m| {
            let hb = hb.clone();
            thread::spawn(move || member(hb, m))
        })
        .collect();
    member(hb, 0);
    for t in others {
        t.join().unwrap();
    }
}

#[test]
fn two_members_three_episodes() {
    common::model(3, || episodes::<Sound>(2, 3));
}

#[test]
fn three_members_one_episode() {
    common::model(2, || episodes::<Sound>(3, 1));
}

#[test]
fn slot_model_catches_relaxed_arrivals() {
    common::must_fail(2, &["data race", "Causality violation", "causality"], || {
        episodes::<RelaxedArrive>(2, 1)
    });
}

#[test]
fn wake_model_catches_a_plain_release() {
    common::must_fail(3, &["deadlock"], || episodes::<PlainRelease>(2, 1));
}
