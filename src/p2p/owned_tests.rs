//! Owned requests and request sets, between worlds that are threads of this process.

use super::*;
use crate::testkit::{job, job_forced, pattern};
use nemesis_lmt::Strategy;
use std::time::Duration;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn owned_requests_and_sets_can_be_kept_anywhere() {
    assert_send_sync::<OwnedRequest<Vec<u8>>>();
    assert_send_sync::<OwnedRequest<Box<[u64]>>>();
    fn assert_send<T: Send>() {}
    assert_send::<RequestSet<Vec<u8>>>();
}

#[test]
fn owned_sends_and_receives_carry_eager_and_large_messages_and_give_their_buffers_back() {
    for force in [
        None,
        Some(Strategy::Chunks),
        Some(Strategy::Cma),
        Some(Strategy::Ring),
    ] {
        if force == Some(Strategy::Cma) && nemesis_lmt::cma::probe().is_err() {
            continue;
        }
        let run = move |mut w: World| {
            let c = w.comm();
            let peer = 1 - w.rank();
            for (i, len) in [0usize, 8, 5000, 100_000, 1 << 20].into_iter().enumerate() {
                let data = pattern(w.rank() * 100 + i as u32, len);
                let r = w.irecv(&c, peer, i as i32, vec![0u8; len]).unwrap();
                let s = w.isend(&c, peer, i as i32, data.clone()).unwrap();
                // Handles move between threads: wait for them on another one.
                let (r, s, w2) = std::thread::spawn(move || (r, s, w)).join().unwrap();
                w = w2;
                let (st, sent) = w.wait(s).unwrap();
                assert_eq!((st.len, sent), (len, data));
                let (st, got) = w.wait(r).unwrap();
                assert_eq!((st.source, st.tag, st.len), (peer, i as i32, len));
                assert!(got == pattern(peer * 100 + i as u32, len), "{force:?} {len}");
            }
        };
        match force {
            None => job(2, run),
            Some(s) => job_forced(2, s, run),
        };
    }
}

#[test]
fn a_dropped_owned_receive_is_cancelled_and_a_dropped_large_send_still_delivers() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            let mut go = [0u8; 1];
            w.recv(&c, 1, 9, &mut go).unwrap();
            w.send(&c, 1, 0, b"first").unwrap();
            // Let go at once: the slot keeps the buffer until the receiver has read it.
            drop(w.isend(&c, 1, 1, pattern(7, 300_000)).unwrap());
            w.flush(Duration::from_secs(30)).unwrap();
        } else {
            let early = w.irecv(&c, 0, 0, vec![0u8; 16]).unwrap();
            drop(early);
            w.send(&c, 0, 9, &[1]).unwrap();
            let mut b = [0u8; 16];
            let st = w.recv(&c, 0, 0, &mut b).unwrap();
            assert_eq!(&b[..st.len], b"first", "the cancelled receive did not take it");
            let mut big = vec![0u8; 300_000];
            w.recv(&c, 0, 1, &mut big).unwrap();
            assert!(big == pattern(7, 300_000));
        }
    });
}

#[test]
fn request_sets_hand_out_every_request_once_with_its_index() {
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        let n = 500usize;
        let mut set = RequestSet::new();
        for i in 0..n {
            let len = if i % 50 == 0 { 20_000 } else { i % 64 };
            let idx = set.push(w.irecv(&c, peer, i as i32, vec![0u8; len]).unwrap());
            assert_eq!(idx, i);
        }
        let mut sends = RequestSet::new();
        for i in 0..n {
            let len = if i % 50 == 0 { 20_000 } else { i % 64 };
            sends.push(w.isend(&c, peer, i as i32, pattern(i as u32, len)).unwrap());
        }
        let mut seen = vec![false; n];
        let mut calls = 0;
        while !set.is_empty() {
            let got = match calls % 3 {
                0 => w.test_some(&mut set).unwrap(),
                1 => w.wait_some(&mut set).unwrap(),
                _ => vec![w.wait_any(&mut set).unwrap()],
            };
            calls += 1;
            for d in got {
                assert!(!seen[d.index], "request {} handed out twice", d.index);
                seen[d.index] = true;
                let st = d.status.unwrap();
                assert_eq!(st.tag, d.index as i32);
                assert!(d.buf[..st.len] == pattern(d.index as u32, st.len)[..]);
            }
        }
        assert!(seen.iter().all(|&s| s));
        while !sends.is_empty() {
            if w.test_any(&mut sends).unwrap().is_none() {
                w.wait_some(&mut sends).unwrap();
            }
        }
        assert!(matches!(w.wait_any(&mut sends), Err(P2pError::NoActiveRequest)));
        assert!(matches!(w.wait_some(&mut set), Err(P2pError::NoActiveRequest)));
        assert!(w.test_some(&mut set).unwrap().is_empty());
    });
}

#[test]
fn a_request_taken_out_of_a_set_is_waited_alone() {
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        let mut set = RequestSet::new();
        let a = set.push(w.irecv(&c, peer, 0, vec![0u8; 4]).unwrap());
        set.push(w.irecv(&c, peer, 1, vec![0u8; 4]).unwrap());
        w.send(&c, peer, 0, b"zero").unwrap();
        w.send(&c, peer, 1, b"one!").unwrap();
        let r = set.take(a).unwrap();
        assert_eq!(set.active(), 1);
        let (_, b) = w.wait(r).unwrap();
        assert_eq!(&b, b"zero");
        let d = w.wait_any(&mut set).unwrap();
        assert_eq!((d.index, &d.buf[..]), (1, &b"one!"[..]));
    });
}

#[test]
fn requests_of_another_world_and_of_a_dropped_world_are_typed_errors() {
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        // Nobody sends this: dropping the world ends it with WorldGone, buffer back.
        let other = w.irecv(&c, peer, 5, vec![0u8; 8]).unwrap();
        w.barrier(&c).unwrap();
        drop(w);
        assert!(other.is_complete());
        let done = other.try_take().unwrap();
        assert!(
            matches!(done.status, Err(P2pError::WorldGone)),
            "{:?}",
            done.status
        );
        assert_eq!(done.buf.len(), 8);
    });
    let mut w1 = job(1, |w| w).into_iter().next().unwrap();
    let mut w2 = job(1, |w| w).into_iter().next().unwrap();
    let c1 = w1.comm();
    let r = w1.irecv(&c1, 0, 0, vec![0u8; 1]).unwrap();
    assert!(matches!(w2.test(&r), Err(P2pError::WrongWorld("request"))));
    let pending = r.try_take().unwrap_err();
    assert!(!pending.is_complete());
    drop(pending);
    // The dropped receive is cancelled at the next call: the message goes elsewhere.
    w1.send(&c1, 0, 0, &[42]).unwrap();
    let mut b = [0u8; 1];
    w1.recv(&c1, 0, 0, &mut b).unwrap();
    assert_eq!(b, [42]);
}

#[test]
fn a_forgotten_request_keeps_its_buffer_and_its_message() {
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        if w.rank() == 1 {
            // Never dropped, never waited: it stays posted and takes the first message.
            std::mem::forget(w.irecv(&c, peer, 0, vec![0u8; 100_000]).unwrap());
        }
        w.barrier(&c).unwrap();
        if w.rank() == 0 {
            w.send(&c, peer, 0, &pattern(1, 100_000)).unwrap();
            w.send(&c, peer, 0, b"second").unwrap();
        } else {
            let mut b = [0u8; 16];
            let st = w.recv(&c, peer, 0, &mut b).unwrap();
            assert_eq!(&b[..st.len], b"second");
        }
    });
}
