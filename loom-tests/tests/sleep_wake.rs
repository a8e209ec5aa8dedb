//! The sleep/wake hand-off: a receiver with nothing to do sleeps on its doorbell, and a
//! sender that hands it work must wake it. A lost wake-up leaves the receiver asleep
//! for ever, which loom reports as a deadlock.
#![cfg(loom)]

mod common;

use loom::thread;
use nemesis_shm::Port;
use nemesis_shm::heap::HeapRegion;
use nemesis_shm::variant::{NoWakeRecheck, NoWatcherWake, Sound, Variant};
use nemesis_shm::wake::Wake;
use std::sync::Arc;

fn sleeper<V: Variant>() {
    let r = Arc::new(HeapRegion::new(2, 2, 8, 8));
    let r2 = r.clone();
    let sender = thread::spawn(move || {
        let mut p = Port::<_, V>::with_variant(r2, 0);
        p.try_send(1, &[7, 0], &[b"wake"], 4).unwrap();
    });
    let mut p = Port::<_, V>::with_variant(r, 1);
    let mut got = 0;
    while got == 0 {
        got = p.poll(|_, env, _| assert_eq!(env[0], 7)).unwrap();
        if got == 0 {
            p.sleep(None);
        }
    }
    sender.join().unwrap();
}

#[test]
fn no_lost_wake_up() {
    common::model(4, sleeper::<Sound>);
}

#[test]
fn sleep_model_catches_a_missing_recheck() {
    common::must_fail(3, &["deadlock"], sleeper::<NoWakeRecheck>);
}

/// Two senders at once, each ringing once.
fn two_senders<V: Variant>() {
    let r = Arc::new(HeapRegion::new(3, 2, 8, 8));
    let senders: Vec<_> = (0..2)
        .map(|s| {
            let r = r.clone();
            thread::spawn(move || {
                let mut p = Port::<_, V>::with_variant(r, s);
                p.try_send(2, &[s as u64, 0], &[b"x"], 1).unwrap();
            })
        })
        .collect();
    let mut p = Port::<_, V>::with_variant(r, 2);
    let mut got = 0;
    while got < 2 {
        let n = p.poll(|_, _, _| {}).unwrap();
        got += n;
        if n == 0 {
            p.sleep(None);
        }
    }
    for s in senders {
        s.join().unwrap();
    }
}

#[test]
fn two_senders_wake_one_sleeper() {
    common::model(3, two_senders::<Sound>);
}

/// A process's wake socket, as the model sees it: readable once a sender woke it, until
/// drained. A wait on it is a wait on a condition variable, as the kernel's socket wait
/// is a wait queue checked under its lock.
#[derive(Debug, Default)]
struct ModelSocket {
    readable: loom::sync::Mutex<bool>,
    cv: loom::sync::Condvar,
}

impl ModelSocket {
    fn wait_then_drain(&self) {
        let mut r = self.readable.lock().unwrap();
        while !*r {
            r = self.cv.wait(r).unwrap();
        }
        *r = false;
    }
}

impl Wake for ModelSocket {
    fn wake(&self, _local: u32) {
        *self.readable.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// The receiver sleeps on its wake socket (as an event loop does) instead of its futex.
fn watcher<V: Variant>() {
    let r = Arc::new(HeapRegion::new(2, 2, 8, 8));
    let sock = Arc::new(ModelSocket::default());
    let (r2, s2) = (r.clone(), sock.clone());
    let sender = thread::spawn(move || {
        let mut p = Port::<_, V>::with_variant(r2, 0);
        p.set_wake(s2);
        p.try_send(1, &[7, 0], &[b"wake"], 4).unwrap();
    });
    let mut p = Port::<_, V>::with_variant(r, 1);
    let mut got = 0;
    while got == 0 {
        got = p.poll(|_, env, _| assert_eq!(env[0], 7)).unwrap();
        if got == 0 && p.watch() {
            sock.wait_then_drain();
            p.unwatch();
        }
    }
    sender.join().unwrap();
}

#[test]
fn no_lost_wake_up_through_the_wake_socket() {
    common::model(4, watcher::<Sound>);
}

#[test]
fn socket_model_catches_a_missing_recheck() {
    common::must_fail(3, &["deadlock"], watcher::<NoWakeRecheck>);
}

#[test]
fn socket_model_catches_a_sender_that_only_wakes_the_futex() {
    common::must_fail(3, &["deadlock"], watcher::<NoWatcherWake>);
}
