//! The free-queue round trip: a sender with one cell sends, the receiver returns the
//! cell to the sender's free queue, and the sender, asleep for want of a cell, is woken
//! and reuses it.
#![cfg(loom)]

mod common;

use loom::thread;
use nemesis_shm::Port;
use nemesis_shm::heap::HeapRegion;
use nemesis_shm::variant::{RelaxedQueue, Sound, Variant};
use std::sync::Arc;

fn round_trip<V: Variant>() {
    // One cell each and no fastboxes: the second message needs the first one's cell back.
    let r = Arc::new(HeapRegion::new(2, 1, 4, 0));
    let r2 = r.clone();
    let sender = thread::spawn(move || {
        let mut p = Port::<_, V>::with_variant(r2, 0);
        for i in 0..2u64 {
            while p.try_send(1, &[i, 0], &[&[i as u8 + 1; 4]], 4).is_err() {
                p.sleep(None);
            }
        }
    });
    let mut p = Port::<_, V>::with_variant(r, 1);
    let mut got = Vec::new();
    while got.len() < 2 {
        let n = p
            .poll(|src, env, data| {
                assert_eq!(src, 0);
                got.push((env[0], data.to_vec()));
            })
            .unwrap();
        if n == 0 {
            p.sleep(None);
        }
    }
    sender.join().unwrap();
    assert_eq!(got, vec![(0, vec![1; 4]), (1, vec![2; 4])]);
}

#[test]
fn free_queue_round_trip() {
    common::model(4, round_trip::<Sound>);
}

#[test]
fn round_trip_model_catches_relaxed_queue_publication() {
    common::must_fail(2, &["Causality violation"], round_trip::<RelaxedQueue>);
}
