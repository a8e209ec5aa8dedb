//! Large-message transfer: every strategy, forced, and the faults around it.

use super::*;

/// Runs `f` as two ranks whose large messages `s` moves: on one node, or, for RDMA, on
/// two nodes whose netmod offers it.
fn job_moved_by<T: Send + 'static>(s: Strategy, f: impl Fn(World) -> T + Send + Sync + 'static) -> Vec<T> {
    if s == Strategy::Rdma {
        let (r, rdma) = crate::testkit::job_between_nodes(s, f);
        assert!(rdma.read.load(Ordering::Relaxed) > 0, "nothing went by RDMA");
        r
    } else {
        job_forced(2, s, f)
    }
}

/// The strategies this system can run (CMA needs ptrace permission).
fn strategies() -> Vec<Strategy> {
    let cma = nemesis_lmt::cma::probe().is_ok();
    Strategy::ALL
        .into_iter()
        .filter(|s| cma || !s.needs_cma())
        .collect()
}

#[test]
fn a_split_receive_completes_while_its_sender_makes_no_progress() {
    if nemesis_lmt::cma::probe().is_err() {
        eprintln!("skipping: CMA is not permitted here");
        return;
    }
    use std::sync::atomic::AtomicU8;
    // 1: the sender's RTS is out; 2: the receive is complete.
    let stage = Arc::new(AtomicU8::new(0));
    let wait_for = |stage: &AtomicU8, want: u8| {
        let t = std::time::Instant::now();
        while stage.load(Ordering::Acquire) < want && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        stage.load(Ordering::Acquire) >= want
    };
    let len = (3 << 20) + 5;
    job_forced(2, Strategy::CmaSplit, move |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            let data = pattern(3, len);
            w.scope(|s| {
                let mut r = s.isend(&c, 1, 4, &data).unwrap();
                // One progress pass puts the RTS out; no CTS can have come yet.
                assert!(!s.test(&mut r).unwrap());
                stage.store(1, Ordering::Release);
                // Busy elsewhere until the receive is done: no progress at all. (Should
                // it wait for us, the wait ends, and our progress lets it finish.)
                let alone = wait_for(&stage, 2);
                assert_eq!(s.wait(r).unwrap().status().len, len);
                assert!(alone, "the receive waited for its sender");
            });
        } else {
            assert!(wait_for(&stage, 1));
            let mut buf = vec![0u8; len];
            assert_eq!(w.recv(&c, 0, 4, &mut buf).unwrap().len, len);
            assert!(buf == pattern(3, len));
            stage.store(2, Ordering::Release);
        }
    });
}

#[test]
fn every_strategy_moves_contiguous_and_scattered_messages_intact() {
    for s in strategies() {
        job_moved_by(s, move |mut w| {
            let c = w.comm();
            let sizes = [8161usize, 100_000, (3 << 20) + 17];
            if w.rank() == 0 {
                for (i, &len) in sizes.iter().enumerate() {
                    let data = pattern(i as u32, len);
                    w.send(&c, 1, 0, &data).unwrap();
                    // The same bytes from three pieces, one of them empty.
                    let (a, b) = data.split_at(len / 3);
                    w.send_iov(&c, 1, 1, &[a, &[], b]).unwrap();
                }
            } else {
                for (i, &len) in sizes.iter().enumerate() {
                    let want = pattern(i as u32, len);
                    // Contiguous into pieces, and pieces into contiguous.
                    let mut x = vec![0u8; len / 2 + 1];
                    let mut y = vec![0u8; len - x.len()];
                    let st = w.recv_iov(&c, 0, 0, &mut [&mut x, &mut y]).unwrap();
                    assert_eq!(st.len, len, "{s}");
                    assert!(
                        x[..] == want[..x.len()] && y[..] == want[x.len()..],
                        "{s}: {len} B into pieces"
                    );
                    let mut z = vec![0u8; len];
                    assert_eq!(w.recv(&c, 0, 1, &mut z).unwrap().len, len);
                    assert!(z == want, "{s}: {len} B from pieces");
                }
            }
        });
    }
}

/// Every strategy delivers exactly into a buffer a few bytes further into its page than
/// the sender's, where `memcpy` would take the slow case of `rep movsb` on some CPUs and
/// the copies take vectors instead (`nemesis_shm::copy`), and writes nothing around it.
#[test]
fn every_strategy_moves_messages_into_buffers_just_ahead_of_the_source_in_their_page() {
    /// `len` bytes starting `off` bytes into a page of `v`.
    fn in_page(v: &mut [u8], off: usize, len: usize) -> std::ops::Range<usize> {
        let at = v.as_ptr().align_offset(4096) + off;
        at..at + len
    }
    for s in strategies() {
        job_moved_by(s, move |mut w| {
            let c = w.comm();
            let sizes = [100_000usize, (1 << 20) + 33];
            let offsets = [1usize, 16, 31, 48];
            if w.rank() == 0 {
                let mut v = vec![0u8; (1 << 20) + 8192];
                for (i, &len) in sizes.iter().enumerate() {
                    let r = in_page(&mut v, 0, len);
                    v[r.clone()].copy_from_slice(&pattern(i as u32, len));
                    for _ in offsets {
                        w.send(&c, 1, 0, &v[r.clone()]).unwrap();
                    }
                }
            } else {
                for (i, &len) in sizes.iter().enumerate() {
                    let want = pattern(i as u32, len);
                    for off in offsets {
                        let mut v = vec![0xeeu8; (1 << 20) + 8192];
                        let r = in_page(&mut v, off, len);
                        assert_eq!(w.recv(&c, 0, 0, &mut v[r.clone()]).unwrap().len, len);
                        assert!(v[r.clone()] == want[..], "{s}: {len} B at +{off}");
                        assert!(
                            v[..r.start].iter().chain(&v[r.end..]).all(|&b| b == 0xee),
                            "{s}: {len} B at +{off} wrote outside its buffer"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn every_strategy_truncates_into_a_short_buffer_and_writes_nothing_past_it() {
    for s in strategies() {
        job_moved_by(s, move |mut w| {
            let c = w.comm();
            if w.rank() == 0 {
                w.send(&c, 1, 0, &pattern(9, 300_000))
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
                w.send(&c, 1, 0, &pattern(10, 20_000)).unwrap();
            } else {
                let mut buf = vec![0xeeu8; 200_001];
                let e = w.recv(&c, 0, 0, &mut buf[..200_000]).unwrap_err();
                assert!(
                    matches!(
                        e,
                        P2pError::Truncated {
                            message_len: 300_000,
                            buffer_len: 200_000
                        }
                    ),
                    "{s}: {e}"
                );
                assert!(buf[..200_000] == pattern(9, 300_000)[..200_000], "{s}");
                assert_eq!(buf[200_000], 0xee, "{s}: a byte past the buffer was written");
                // The pair goes on.
                let mut next = vec![0u8; 20_000];
                w.recv(&c, 0, 0, &mut next).unwrap();
                assert!(next == pattern(10, 20_000), "{s}");
            }
        });
    }
}

#[test]
fn every_strategy_survives_dropped_sends_and_receives() {
    for s in strategies() {
        job_moved_by(s, move |mut w| {
            let c = w.comm();
            if w.rank() == 0 {
                let mut buf = pattern(3, 500_000);
                w.scope(|sc| drop(sc.isend(&c, 1, 0, &buf).unwrap()));
                // Ours again: what rank 1 receives must not change.
                buf.iter_mut().for_each(|b| *b = 0xee);
                let mut go = [0u8; 1];
                w.recv(&c, 1, 9, &mut go).unwrap();
                // Rank 1 lets this one go mid-way; the next must still arrive intact.
                w.send(&c, 1, 1, &pattern(4, 2 << 20)).unwrap();
                w.send(&c, 1, 2, &pattern(5, 100_000)).unwrap();
                w.flush(Duration::from_secs(30)).unwrap();
            } else {
                let mut buf = vec![0u8; 500_000];
                w.recv(&c, 0, 0, &mut buf).unwrap();
                assert!(
                    buf == pattern(3, 500_000),
                    "{s}: a dropped send changed under way"
                );
                w.send(&c, 0, 9, &[1]).unwrap();
                let mut big = vec![0u8; 2 << 20];
                // Matched before it is dropped (a receive dropped before it matches is
                // cancelled, and the message waits for the next).
                w.probe(&c, 0, 1).unwrap();
                w.scope(|sc| {
                    let mut r = sc.irecv(&c, 0, 1, &mut big).unwrap();
                    // Let it start, then drop it.
                    let _ = sc.test(&mut r).unwrap();
                });
                let mut next = vec![0u8; 100_000];
                w.recv(&c, 0, 2, &mut next).unwrap();
                assert!(next == pattern(5, 100_000), "{s}");
            }
        });
    }
}

/// A raw RTS as a broken or hostile peer might send it: `total` bytes, offering
/// chunks and `s` with `cookie`, tag 5.
pub(in crate::p2p) fn raw_rts(
    w: &mut World,
    dest: u32,
    send_id: u32,
    total: u64,
    s: Strategy,
    cookie: &[u8],
) {
    let mut p = total.to_le_bytes().to_vec();
    p.push(Strategies::CHUNKS.with(s).0);
    p.extend_from_slice(cookie);
    let h = crate::channel::Header {
        kind: crate::p2p::wire::RTS,
        context: 0,
        tag: 5,
        aux: send_id,
        flags: 0,
    };
    w.channel_mut().send_bytes(dest, h, &p).unwrap();
}

/// A raw RTS offering CMA with the pieces in `pieces`.
fn raw_cma_rts(w: &mut World, dest: u32, send_id: u32, total: u64, pieces: &[(u64, u64)]) {
    let mut cookie = (pieces.len() as u32).to_le_bytes().to_vec();
    for &(a, l) in pieces {
        cookie.extend_from_slice(&a.to_le_bytes());
        cookie.extend_from_slice(&l.to_le_bytes());
    }
    raw_rts(w, dest, send_id, total, Strategy::Cma, &cookie);
}

use nemesis_lmt::Strategies;

#[test]
fn a_cookie_naming_memory_the_peer_does_not_own_or_the_wrong_length_is_a_typed_error() {
    if nemesis_lmt::cma::probe().is_err() {
        eprintln!("skipping: CMA is not permitted here");
        return;
    }
    job_forced(2, Strategy::Cma, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            // The zero page is never anyone's memory.
            raw_cma_rts(&mut w, 1, 1001, 64 << 10, &[(4096, 64 << 10)]);
            // Pieces that do not add up to the announced length.
            let real = vec![7u8; 1000];
            raw_cma_rts(&mut w, 1, 1002, 64 << 10, &[(real.as_ptr() as u64, 1000)]);
            let mut go = [0u8; 1];
            w.recv(&c, 1, 9, &mut go).unwrap();
            drop(real);
        } else {
            for what in ["not its memory", "hold 1000 bytes"] {
                let mut buf = vec![0u8; 64 << 10];
                let e = w.recv(&c, 0, 5, &mut buf).unwrap_err();
                match &e {
                    P2pError::Transfer {
                        rank: 0,
                        source: LmtError::BadCookie { peer: 0, why },
                    } => assert!(why.contains(what), "{e}"),
                    other => panic!("expected a bad cookie ({what}), got {other}"),
                }
                assert!(buf.iter().all(|&b| b == 0), "bytes were written on a bad cookie");
            }
            w.send(&c, 0, 9, &[1]).unwrap();
        }
    });
}

/// The next packet of `kind` that reaches `w`'s channel, read raw (as a broken or
/// hostile peer would), with its header's `aux` and its payload.
fn raw_next(w: &mut World, kind: u16) -> (u32, Vec<u8>) {
    loop {
        let mut got = None;
        w.channel_mut()
            .poll(|p| {
                if got.is_none() && p.header.kind == kind {
                    got = Some((p.header.aux, p.payload.to_vec()));
                }
            })
            .unwrap();
        if let Some(g) = got {
            return g;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_failure_on_either_side_of_a_transfer_is_reported_to_the_other() {
    use crate::p2p::wire::{CTS, FIN, RTS};
    job_forced(2, Strategy::Ring, |mut w| {
        let c = w.comm();
        let h = |kind, aux| crate::channel::Header {
            kind,
            aux,
            ..Default::default()
        };
        if w.rank() == 0 {
            // 1. Our send gets a CTS naming a ring that is not there: it fails here, and
            //    FIN tells the receiver.
            let data = vec![3u8; 100_000];
            let e = w.send(&c, 1, 0, &data).unwrap_err();
            assert!(
                matches!(
                    e,
                    P2pError::Transfer {
                        rank: 1,
                        source: LmtError::BadCookie { peer: 1, .. }
                    }
                ),
                "{e}"
            );
            // 2. As a broken sender (once rank 1 no longer reads raw): offer the ring,
            //    then report a failure after the CTS.
            w.recv(&c, 1, 5, &mut [0u8; 1]).unwrap();
            let mut rts = 100_000u64.to_le_bytes().to_vec();
            rts.push(Strategies::CHUNKS.with(Strategy::Ring).0);
            let rts_h = crate::channel::Header { tag: 1, ..h(RTS, 77) };
            w.channel_mut().send_bytes(1, rts_h, &rts).unwrap();
            let (send_id, cts) = raw_next(&mut w, CTS);
            assert_eq!(send_id, 77);
            let recv_id = u32::from_le_bytes(cts[..4].try_into().unwrap());
            w.channel_mut().send_bytes(1, h(FIN, recv_id), &[1]).unwrap();
        } else {
            // 1. As a broken receiver: answer the RTS with a bogus ring name.
            let (send_id, _) = raw_next(&mut w, RTS);
            let mut cts = 9u32.to_le_bytes().to_vec();
            cts.push(Strategy::Ring as u8);
            cts.extend_from_slice(b"nemesis-nothing-lmt-ring-0-1");
            w.channel_mut().send_bytes(0, h(CTS, send_id), &cts).unwrap();
            let (recv_id, status) = raw_next(&mut w, FIN);
            assert_eq!(
                (recv_id, status),
                (9, vec![1]),
                "the sender's failure reaches the receiver"
            );
            w.send(&c, 0, 5, &[1]).unwrap();
            // 2. Our receive is told that the sender's side failed.
            let mut buf = vec![0u8; 100_000];
            let e = w.recv(&c, 0, 1, &mut buf).unwrap_err();
            assert!(matches!(e, P2pError::RemoteTransfer { rank: 0 }), "{e}");
        }
    });
}

/// A blocked call returns as soon as its request completes, not when its wait times out:
/// with sleeps and failure checks of an hour, 50 rendezvous each way still finish (a
/// lost wake-up would hang until the harness gives up).
#[test]
fn blocked_calls_return_when_their_request_completes_not_when_their_sleep_ends() {
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    for r in 0..2u32 {
        let (seg, tx) = (seg.clone(), tx.clone());
        std::thread::spawn(move || {
            let hour = Duration::from_secs(3600);
            let policy = WaitPolicy {
                spin: 200,
                yields: 50,
                slice: hour,
            };
            let mut ch = ShmChannel::from_segment(seg, r, 2, &[0, 1], r, policy).unwrap();
            let lmt = ch.local_lmt();
            let p = nemesis_lmt::Policy {
                force: Some(Strategy::Chunks),
                ..lmt.policy()
            };
            lmt.set_policy(p).unwrap();
            let mut cfg = Config::from_lookup(ch.max_payload(), |_| None).unwrap();
            cfg.failure_check = hour;
            let mut w = World::with_config(NemesisChannel::with_netmod(ch, None), cfg).unwrap();
            let c = w.comm();
            for i in 0..50 {
                let data = pattern(i, 50_000);
                let mut b = vec![0u8; 50_000];
                if r == 0 {
                    w.send(&c, 1, 0, &data).unwrap();
                    w.recv(&c, 1, 1, &mut b).unwrap();
                } else {
                    w.recv(&c, 0, 0, &mut b).unwrap();
                    w.send(&c, 0, 1, &data).unwrap();
                }
                assert!(b == data);
            }
            tx.send(r).unwrap();
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("a blocked call slept past its request's completion");
    }
}
