//! The Nemesis MPSC queue: per-producer FIFO, no loss, no duplicate; the transitions
//! between empty and non-empty; the race between the consumer's CAS on the last element
//! and a producer's swap on the tail.
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use nemesis_shm::Region;
use nemesis_shm::heap::HeapRegion;
use nemesis_shm::queue::{Consumer, Pop, enqueue};
use nemesis_shm::region::{CellAccess, CellMeta};
use nemesis_shm::variant::{NoTailCas, RelaxedHead, RelaxedLink, Sound, Variant};
use std::sync::Arc;

/// Proc `p` of the region enqueues its cell `i` carrying byte `10 * p + i`.
fn produce<V: Variant>(r: &HeapRegion, dest: u32, p: u32, i: u32) {
    let h = p * r.cells_per_proc() + i + 1;
    let meta = CellMeta {
        src: p as u16,
        seq: i,
        len: 1,
        ..Default::default()
    };
    // SAFETY: cell `h` belongs to producer `p` and is in no queue.
    unsafe { r.cell(h).write(&meta, &[&[(10 * p + i) as u8]]) };
    enqueue::<V>(r.recv_queue(dest), r, h);
}

/// Pops until `want` cells arrived or the producers are done and the queue is empty;
/// checks each producer's order and each cell's contents, and returns the count.
fn consume<V: Variant>(r: &HeapRegion, me: u32, producers: u32, want: u32, done: &AtomicBool) -> u32 {
    let mut c = Consumer::new();
    let mut next = vec![0u32; producers as usize];
    let mut got = 0;
    while got < want {
        // Read before popping: once every producer is done, an empty pop means empty.
        let finished = done.load(Ordering::Acquire);
        // As the port does: look at the head cell's control fields before taking it.
        let Some(h) = c.peek(r.recv_queue(me)) else {
            if finished {
                break;
            }
            thread::yield_now();
            continue;
        };
        // SAFETY: `h` is at the head of our queue, published to us.
        let meta = unsafe { r.cell(h).meta() };
        match c.pop::<V>(r.recv_queue(me), r) {
            Pop::Got(popped) => {
                assert_eq!(popped, h);
                let p = meta.src as usize;
                assert_eq!(meta.seq, next[p], "producer {p} out of order");
                // SAFETY: we dequeued `h`.
                let byte = unsafe { r.cell(h).read(1, |d| d[0]) };
                assert_eq!(byte as u32, 10 * p as u32 + meta.seq, "wrong contents");
                next[p] += 1;
                got += 1;
            }
            Pop::Empty if finished => break,
            Pop::Empty | Pop::Busy => thread::yield_now(),
        }
    }
    got
}

fn two_producers<V: Variant>() {
    let r = Arc::new(HeapRegion::new(3, 2, 1, 0));
    let done = Arc::new(AtomicBool::new(false));
    let running = Arc::new(loom::sync::atomic::AtomicU32::new(2));
    let hs: Vec<_> = (0..2)
        .map(|p| {
            let (r, done, running) = (r.clone(), done.clone(), running.clone());
            thread::spawn(move || {
                produce::<V>(&r, 2, p, 0);
                produce::<V>(&r, 2, p, 1);
                if running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            })
        })
        .collect();
    let got = consume::<V>(&r, 2, 2, 4, &done);
    assert_eq!(got, 4, "cells lost");
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(
        Consumer::new().pop::<V>(r.recv_queue(2), &*r),
        Pop::Empty,
        "duplicate"
    );
}

#[test]
fn two_producers_fifo_no_loss_no_duplicate() {
    common::model(3, two_producers::<Sound>);
}

#[test]
fn two_producers_model_catches_a_relaxed_link() {
    common::must_fail(3, &["Causality violation"], two_producers::<RelaxedLink>);
}

fn three_producers<V: Variant>() {
    let r = Arc::new(HeapRegion::new(4, 1, 1, 0));
    let done = Arc::new(AtomicBool::new(false));
    let running = Arc::new(loom::sync::atomic::AtomicU32::new(3));
    let hs: Vec<_> = (0..3)
        .map(|p| {
            let (r, done, running) = (r.clone(), done.clone(), running.clone());
            thread::spawn(move || {
                produce::<V>(&r, 3, p, 0);
                if running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            })
        })
        .collect();
    assert_eq!(consume::<V>(&r, 3, 3, 3, &done), 3, "cells lost");
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn three_producers_no_loss() {
    common::model(2, three_producers::<Sound>);
}

#[test]
fn three_producers_model_catches_a_relaxed_link() {
    common::must_fail(2, &["Causality violation"], three_producers::<RelaxedLink>);
}

/// One producer fills an empty queue twice while the consumer drains it, so the queue
/// goes empty -> non-empty -> empty -> non-empty under every interleaving.
fn empty_transitions<V: Variant>() {
    let r = Arc::new(HeapRegion::new(2, 3, 1, 0));
    let done = Arc::new(AtomicBool::new(false));
    let (r2, done2) = (r.clone(), done.clone());
    let h = thread::spawn(move || {
        produce::<V>(&r2, 1, 0, 0);
        produce::<V>(&r2, 1, 0, 1);
        done2.store(true, Ordering::Release);
    });
    assert_eq!(consume::<V>(&r, 1, 1, 2, &done), 2, "cells lost");
    h.join().unwrap();
    let mut c = Consumer::new();
    assert!(c.is_empty(r.recv_queue(1)));
    // And it works again from empty.
    produce::<V>(&r, 1, 0, 2);
    assert!(!c.is_empty(r.recv_queue(1)));
    assert_eq!(c.pop::<V>(r.recv_queue(1), &*r), Pop::Got(3));
    assert!(c.is_empty(r.recv_queue(1)));
}

#[test]
fn empty_and_non_empty_transitions() {
    common::model(4, empty_transitions::<Sound>);
}

#[test]
fn transitions_model_catches_a_relaxed_head_store() {
    common::must_fail(3, &["Causality violation"], empty_transitions::<RelaxedHead>);
}

/// The queue holds one cell; the consumer takes it (the CAS path) while a producer
/// swaps the tail to append a second.
fn cas_versus_swap<V: Variant>() {
    let r = Arc::new(HeapRegion::new(3, 1, 1, 0));
    produce::<V>(&r, 2, 0, 0);
    let done = Arc::new(AtomicBool::new(false));
    let (r2, done2) = (r.clone(), done.clone());
    let h = thread::spawn(move || {
        produce::<V>(&r2, 2, 1, 0);
        done2.store(true, Ordering::Release);
    });
    let got = consume::<V>(&r, 2, 2, 2, &done);
    h.join().unwrap();
    assert_eq!(got, 2, "a cell was lost in the race between CAS and swap");
}

#[test]
fn consumer_cas_races_producer_swap() {
    common::model(4, cas_versus_swap::<Sound>);
}

#[test]
fn cas_model_catches_a_missing_cas() {
    common::must_fail(3, &["lost"], cas_versus_swap::<NoTailCas>);
}
