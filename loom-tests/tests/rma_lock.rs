//! A window's reader-writer ticket lock: holders exclude each other (a writer from
//! everyone, readers only writers), what a holder wrote is seen by the next, and every
//! locker gets its turn.
#![cfg(loom)]

mod common;

use loom::cell::UnsafeCell;
use loom::thread;
use nemesis_shm::variant::{RelaxedLockRelease, Sound, Variant};
use nemesis_shm::window::lock::RwTicket;
use std::sync::Arc;

struct Shared {
    lock: RwTicket,
    /// The "window": written only by writers, read by readers, under the lock.
    data: UnsafeCell<u64>,
}

// SAFETY: the data is touched only under the lock, which is what the model checks; the rest are atomics.
unsafe impl Sync for Shared {}

fn write<V: Variant>(s: &Shared) {
    let t = s.lock.ticket();
    while !s.lock.writer_turn(t) {
        thread::yield_now();
    }
    // SAFETY: the lock is held exclusively.
    s.data.with_mut(|p| unsafe { *p += 1 });
    s.lock.release_exclusive::<V>();
}

fn read<V: Variant>(s: &Shared) -> u64 {
    let t = s.lock.ticket();
    while !s.lock.reader_turn::<V>(t) {
        thread::yield_now();
    }
    // SAFETY: the lock is held shared: no writer is inside.
    let v = s.data.with(|p| unsafe { *p });
    s.lock.release_shared::<V>();
    v
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        lock: RwTicket::new(),
        data: UnsafeCell::new(0),
    })
}

/// Two writers, each adding one under the lock.
fn two_writers<V: Variant>() {
    let s = shared();
    let w = {
        let s = s.clone();
        thread::spawn(move || write::<V>(&s))
    };
    write::<V>(&s);
    w.join().unwrap();
    assert_eq!(read::<V>(&s), 2, "a writer's update was lost");
    assert!(s.lock.is_free());
}

/// A reader and a writer: the reader sees the window before or after the write, never
/// during it.
fn reader_and_writer<V: Variant>() {
    let s = shared();
    let w = {
        let s = s.clone();
        thread::spawn(move || write::<V>(&s))
    };
    let v = read::<V>(&s);
    assert!(v <= 1);
    w.join().unwrap();
    assert_eq!(read::<V>(&s), 1);
    assert!(s.lock.is_free());
}

/// Two readers queued behind a writer both get in once it leaves.
fn readers_behind_a_writer<V: Variant>() {
    let s = shared();
    let t = s.lock.ticket();
    assert!(s.lock.writer_turn(t));
    let r = {
        let s = s.clone();
        thread::spawn(move || read::<V>(&s))
    };
    // SAFETY: held exclusively.
    s.data.with_mut(|p| unsafe { *p = 7 });
    s.lock.release_exclusive::<V>();
    assert_eq!(read::<V>(&s), 7);
    assert_eq!(r.join().unwrap(), 7);
    assert!(s.lock.is_free());
}

#[test]
fn writers_exclude_each_other() {
    common::model(3, two_writers::<Sound>);
}

#[test]
fn a_reader_never_sees_a_write_half_done() {
    common::model(3, reader_and_writer::<Sound>);
}

#[test]
fn readers_queued_behind_a_writer_get_in() {
    common::model(3, readers_behind_a_writer::<Sound>);
}

#[test]
fn lock_model_catches_a_relaxed_release() {
    common::must_fail(2, &["data race", "Causality violation", "causality"], || {
        two_writers::<RelaxedLockRelease>()
    });
}
