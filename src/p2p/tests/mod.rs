//! Two-sided messaging between worlds that are threads of this process, on one anonymous
//! segment. Multi-process tests are in `tests/p2p.rs`.

use super::*;
use crate::channel::{Channel, NemesisChannel, ShmChannel, WaitPolicy};
use crate::testkit::{job, job_forced, job_ring, job_with, pattern};
use nemesis_lmt::{LmtError, Strategy};
use nemesis_shm::{Geometry, Segment};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[test]
fn eager_and_large_messages_arrive_intact() {
    job(2, |mut w| {
        let c = w.comm();
        let sizes = [0usize, 1, 8, 24, 25, 1000, 8160, 8161, 20_000, 300_000, 1 << 20];
        for (i, &len) in sizes.iter().enumerate() {
            if w.rank() == 0 {
                w.send(&c, 1, i as i32, &pattern(i as u32, len)).unwrap();
            } else {
                let mut buf = vec![0u8; len];
                let st = w.recv(&c, 0, i as i32, &mut buf).unwrap();
                assert_eq!(
                    st,
                    Status {
                        source: 0,
                        tag: i as i32,
                        len
                    }
                );
                assert!(buf == pattern(i as u32, len), "size {len}");
            }
        }
    });
}

#[test]
fn wildcards_status_and_no_overtaking() {
    job(3, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            let mut from = [0u32; 3];
            let mut b = vec![0u8; 50_000];
            for _ in 0..400 {
                let st = w.recv(&c, ANY_SOURCE, ANY_TAG, &mut b).unwrap();
                let n = u32::from_le_bytes(b[..4].try_into().unwrap());
                assert_eq!(
                    n, from[st.source as usize],
                    "message from {} overtaken",
                    st.source
                );
                assert_eq!(st.tag, (n % 5) as i32);
                from[st.source as usize] += 1;
            }
        } else {
            for n in 0..200u32 {
                // Mix eager and large messages on one pair: order must hold across both.
                if n % 50 == 7 {
                    let mut big = vec![0u8; 50_000];
                    big[..4].copy_from_slice(&n.to_le_bytes());
                    let c2 = c.clone();
                    w.scope(|s| {
                        let r = s.isend(&c2, 0, (n % 5) as i32, &big).unwrap();
                        s.wait(r).unwrap();
                    });
                } else {
                    w.send(&c, 0, (n % 5) as i32, &n.to_le_bytes()).unwrap();
                }
            }
        }
    });
}

#[test]
fn large_messages_received_as_any_source_keep_their_length() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            w.send(&c, 1, 3, &pattern(1, 100_000)).unwrap();
        } else {
            let mut buf = vec![0u8; 200_000];
            let st = w.recv(&c, ANY_SOURCE, ANY_TAG, &mut buf).unwrap();
            assert_eq!(
                st,
                Status {
                    source: 0,
                    tag: 3,
                    len: 100_000
                }
            );
            assert!(buf[..100_000] == pattern(1, 100_000));
        }
    });
}

#[test]
fn truncation_reports_both_sizes_and_the_stream_goes_on() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            w.send(&c, 1, 1, &[9u8; 100]).unwrap();
            w.send(&c, 1, 2, &pattern(5, 60_000)).unwrap();
            w.send(&c, 1, 3, b"after").unwrap();
        } else {
            let mut small = [0u8; 10];
            match w.recv(&c, 0, 1, &mut small) {
                Err(P2pError::Truncated {
                    message_len: 100,
                    buffer_len: 10,
                }) => assert_eq!(small, [9u8; 10]),
                other => panic!("eager: {other:?}"),
            }
            let mut part = vec![0u8; 1000];
            match w.recv(&c, 0, 2, &mut part) {
                Err(P2pError::Truncated {
                    message_len: 60_000,
                    buffer_len: 1000,
                }) => {
                    assert!(part == pattern(5, 60_000)[..1000]);
                }
                other => panic!("large: {other:?}"),
            }
            let mut b = [0u8; 5];
            assert_eq!(w.recv(&c, 0, 3, &mut b).unwrap().len, 5);
            assert_eq!(&b, b"after");
        }
    });
}

#[test]
fn probe_and_iprobe() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            w.send(&c, 1, 7, &[1, 2, 3]).unwrap();
            w.send(&c, 1, 8, &pattern(0, 40_000)).unwrap();
        } else {
            let st = w.probe(&c, ANY_SOURCE, 7).unwrap();
            assert_eq!(
                st,
                Status {
                    source: 0,
                    tag: 7,
                    len: 3
                }
            );
            let st = w.probe(&c, 0, 8).unwrap();
            assert_eq!(st.len, 40_000, "a large message reports its full length");
            assert_eq!(w.iprobe(&c, 0, 9).unwrap(), None);
            let mut b = [0u8; 3];
            w.recv(&c, 0, 7, &mut b).unwrap();
            let mut big = vec![0u8; 40_000];
            w.recv(&c, 0, 8, &mut big).unwrap();
        }
    });
}

#[test]
fn isend_then_blocking_recv_does_not_deadlock() {
    // Both ranks start a large send, then block receiving the other's: the pending
    // send must move on while each waits in `recv`.
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        let out = pattern(w.rank(), 3 << 20);
        let mut inb = vec![0u8; 3 << 20];
        w.scope(|s| {
            let r = s.isend(&c, peer, 0, &out).unwrap();
            let st = s.world().recv(&c, peer, 0, &mut inb).unwrap();
            assert_eq!(st.len, 3 << 20);
            s.wait(r).unwrap();
        });
        assert!(inb == pattern(peer, 3 << 20));
    });
}

#[test]
fn nonblocking_operations_complete_with_test_wait_waitall_waitany() {
    job(2, |mut w| {
        let c = w.comm();
        let me = w.rank();
        let peer = 1 - me;
        let outs: Vec<Vec<u8>> = (0..6)
            .map(|i| pattern(me * 10 + i, [3usize, 10_000, 0, 70_000, 8, 100][i as usize]))
            .collect();
        let mut ins: Vec<Vec<u8>> = (0..6)
            .map(|i| vec![0u8; [3usize, 10_000, 0, 70_000, 8, 100][i as usize]])
            .collect();
        w.scope(|s| {
            let mut recvs = Vec::new();
            for (i, b) in ins.iter_mut().enumerate() {
                recvs.push(s.irecv(&c, peer, i as i32, b).unwrap());
            }
            let mut sends: Vec<_> = outs
                .iter()
                .enumerate()
                .map(|(i, b)| s.isend(&c, peer, i as i32, b).unwrap())
                .collect();
            // Progress the first large send by testing it while "computing".
            while !s.test(&mut sends[1]).unwrap() {
                std::hint::spin_loop();
            }
            let d = s.waitall(sends).unwrap();
            assert_eq!(d.len(), 6);
            let mut seen = Vec::new();
            while !recvs.is_empty() {
                let (_, done) = s.waitany(&mut recvs).unwrap();
                let st = done.status();
                assert!(
                    done.data() == pattern(peer * 10 + st.tag as u32, st.len),
                    "tag {}",
                    st.tag
                );
                seen.push(st.tag);
            }
            seen.sort();
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
            assert!(matches!(s.waitany(&mut recvs), Err(P2pError::NoActiveRequest)));
        });
    });
}

#[test]
fn waitall_of_sends_finished_as_they_started_and_of_a_mixed_list_gives_every_status_in_order() {
    job(2, |mut w| {
        let c = w.comm();
        let lens = [0usize, 1, 8, 64, 200, 8];
        if w.rank() == 0 {
            let outs: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(i as u32, n))
                .collect();
            let big = pattern(99, 300_000);
            w.scope(|s| {
                // Eager sends all: each finished as it started.
                let rs: Vec<_> = outs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| s.isend(&c, 1, i as i32, b).unwrap())
                    .collect();
                let done = s.waitall(rs).unwrap();
                assert_eq!(done.len(), lens.len());
                for (i, d) in done.iter().enumerate() {
                    assert_eq!(
                        d.status(),
                        Status {
                            source: 1,
                            tag: i as i32,
                            len: lens[i]
                        }
                    );
                    assert!(d.data() == outs[i], "send {i} lends back its own bytes");
                }
                // Eager first, then one that waits for its receiver (rendezvous): every
                // result still comes back, in the list's order.
                let rs = vec![
                    s.isend(&c, 1, 10, &outs[2]).unwrap(),
                    s.isend(&c, 1, 11, &big).unwrap(),
                    s.isend(&c, 1, 12, &outs[3]).unwrap(),
                ];
                let done = s.waitall(rs).unwrap();
                let got: Vec<_> = done.iter().map(|d| (d.status().tag, d.status().len)).collect();
                assert_eq!(got, vec![(10, 8), (11, 300_000), (12, 64)]);
            });
        } else {
            let mut b = vec![0u8; 300_000];
            for (i, &n) in lens.iter().enumerate() {
                let st = w.recv(&c, 0, i as i32, &mut b).unwrap();
                assert_eq!(st.len, n);
                assert!(b[..n] == pattern(i as u32, n)[..]);
            }
            for (tag, n) in [(10, 8), (11, 300_000), (12, 64)] {
                assert_eq!(w.recv(&c, 0, tag, &mut b).unwrap().len, n);
            }
            assert!(b[..8] == pattern(3, 64)[..8]);
        }
    });
}

#[test]
fn a_dropped_receive_is_cancelled_and_the_message_goes_to_the_next() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut first = [0u8; 4];
            w.scope(|s| {
                let r = s.irecv(&c, 0, 5, &mut first).unwrap();
                drop(r);
            });
            w.send(&c, 0, 1, b"go").unwrap();
            let mut second = [0u8; 4];
            w.recv(&c, 0, 5, &mut second).unwrap();
            assert_eq!(&second, b"ping");
            assert_eq!(first, [0; 4], "the dropped receive's buffer was not written");
        } else {
            let mut go = [0u8; 2];
            w.recv(&c, 1, 1, &mut go).unwrap();
            w.send(&c, 1, 5, b"ping").unwrap();
        }
    });
}

#[test]
fn quick_receives_and_the_tables_match_in_the_order_they_were_posted() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut bufs = [[0u8; 4]; 5];
            let [a, b, cc, d, e] = &mut bufs;
            let got = w.scope(|s| {
                // Quick (one buffer, nothing waiting), quick, then one of the table (a
                // list of buffers): those after it go to the table too.
                let r = [
                    s.irecv(&c, ANY_SOURCE, 1, a).unwrap(),
                    s.irecv(&c, 0, ANY_TAG, b).unwrap(),
                    s.irecv_iov(&c, 0, 1, [&mut cc[..]]).unwrap(),
                    s.irecv(&c, 0, 2, d).unwrap(),
                    s.irecv(&c, ANY_SOURCE, ANY_TAG, e).unwrap(),
                ];
                assert_eq!(s.world().eng.quick.posted(), 2, "the first two are quick");
                s.world().send(&c, 0, 9, b"go").unwrap();
                let v: Vec<Request> = r.into_iter().collect();
                s.waitall(v)
                    .unwrap()
                    .iter()
                    .map(|d| (d.status().tag, d.status().len))
                    .collect::<Vec<_>>()
            });
            // Sent: tag 2 "t2-a", tag 1 "t1-b", tag 1 "t1-c", tag 2 "t2-d", tag 3 "t3-e".
            assert_eq!(got, vec![(1, 4), (2, 4), (1, 4), (2, 4), (3, 4)]);
            assert_eq!(&bufs, &[*b"t1-b", *b"t2-a", *b"t1-c", *b"t2-d", *b"t3-e"]);
            assert_eq!(w.eng.quick.alive(), 0, "every quick receive is freed");
        } else {
            w.recv(&c, 1, 9, &mut [0u8; 2]).unwrap();
            for (tag, m) in [
                (2, b"t2-a"),
                (1, b"t1-b"),
                (1, b"t1-c"),
                (2, b"t2-d"),
                (3, b"t3-e"),
            ] {
                w.send(&c, 1, tag, m).unwrap();
            }
        }
    });
}

#[test]
fn quick_receives_taken_by_medium_and_large_messages_complete_through_the_table() {
    job(2, |mut w| {
        let c = w.comm();
        let sizes = [8usize, 20_000, 300_000, 1 << 20, 8];
        if w.rank() == 1 {
            let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
            w.scope(|s| {
                let r: Vec<Request> = bufs.iter_mut().map(|b| s.irecv(&c, 0, 4, b).unwrap()).collect();
                assert_eq!(s.world().eng.quick.posted(), sizes.len() as u32);
                s.world().send(&c, 0, 9, b"go").unwrap();
                for (d, &n) in s.waitall(r).unwrap().iter().zip(&sizes) {
                    assert_eq!(
                        d.status(),
                        Status {
                            source: 0,
                            tag: 4,
                            len: n
                        }
                    );
                }
            });
            for (i, b) in bufs.iter().enumerate() {
                assert!(
                    *b == pattern(i as u32, sizes[i]),
                    "message {i} of {} bytes",
                    sizes[i]
                );
            }
            assert_eq!((w.eng.quick.alive(), w.eng.reqs.len()), (0, 0));
        } else {
            w.recv(&c, 1, 9, &mut [0u8; 2]).unwrap();
            for (i, &n) in sizes.iter().enumerate() {
                w.send(&c, 1, 4, &pattern(i as u32, n)).unwrap();
            }
        }
    });
}

#[test]
fn more_receives_than_the_quick_ring_holds_all_complete_in_order() {
    job(2, |mut w| {
        let c = w.comm();
        let n = super::quick::QUICK_SLOTS + 40;
        if w.rank() == 1 {
            let mut bufs = vec![[0u8; 4]; n];
            w.scope(|s| {
                let r: Vec<Request> = bufs.iter_mut().map(|b| s.irecv(&c, 0, 3, b).unwrap()).collect();
                s.world().send(&c, 0, 9, b"go").unwrap();
                let done = s.waitall(r).unwrap();
                assert_eq!(done.len(), n);
            });
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(u32::from_le_bytes(*b), i as u32, "receive {i}");
            }
        } else {
            w.recv(&c, 1, 9, &mut [0u8; 2]).unwrap();
            for i in 0..n as u32 {
                w.send(&c, 1, 3, &i.to_le_bytes()).unwrap();
            }
        }
    });
}

#[test]
fn a_dropped_large_send_still_delivers_the_original_bytes() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            let mut buf = pattern(3, 500_000);
            w.scope(|s| {
                let r = s.isend(&c, 1, 0, &buf).unwrap();
                drop(r);
            });
            // The scope is over: the buffer is ours again, and changing it must not
            // change what rank 1 receives.
            buf.iter_mut().for_each(|b| *b = 0xee);
            w.flush(Duration::from_secs(30)).unwrap();
        } else {
            let mut buf = vec![0u8; 500_000];
            w.recv(&c, 0, 0, &mut buf).unwrap();
            assert!(buf == pattern(3, 500_000));
        }
    });
}

#[test]
fn a_scope_ending_early_releases_its_requests() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut buf = vec![0u8; 200_000];
            w.scope(|s| {
                // Posted but never waited: cancelled at the end of the scope.
                let _r = s.irecv(&c, 0, 1, &mut buf).unwrap();
            });
            w.send(&c, 0, 0, b"ready").unwrap();
            let mut again = vec![0u8; 200_000];
            let st = w.recv(&c, 0, 1, &mut again).unwrap();
            assert_eq!(st.len, 200_000);
            assert!(again == pattern(8, 200_000));
        } else {
            let mut b = [0u8; 5];
            w.recv(&c, 1, 0, &mut b).unwrap();
            w.send(&c, 1, 1, &pattern(8, 200_000)).unwrap();
        }
    });
}

#[test]
fn a_forgotten_request_is_still_released_at_the_end_of_its_scope() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut first = [0u8; 4];
            w.scope(|s| {
                // Never dropped: only the scope's end can find it.
                std::mem::forget(s.irecv(&c, 0, 5, &mut first).unwrap());
            });
            assert_eq!(w.eng.reqs.len(), 0, "the scope's end let the receive go");
            w.send(&c, 0, 1, b"go").unwrap();
            let mut second = [0u8; 4];
            w.recv(&c, 0, 5, &mut second).unwrap();
            assert_eq!(&second, b"ping", "the forgotten receive was cancelled");
            assert_eq!(first, [0; 4], "the forgotten receive's buffer was not written");
        } else {
            let mut go = [0u8; 2];
            w.recv(&c, 1, 1, &mut go).unwrap();
            w.send(&c, 1, 5, b"ping").unwrap();
        }
    });
}

#[test]
fn an_inner_scope_ends_without_touching_the_outer_scopes_requests() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut outer = [0u8; 4];
            w.scope(|s| {
                let r = s.irecv(&c, 0, 5, &mut outer).unwrap();
                let mut inner = [0u8; 2];
                s.world().scope(|t| {
                    // Forgotten, so the inner scope's end has to look for what it left.
                    std::mem::forget(t.irecv(&c, 0, 6, &mut inner).unwrap());
                });
                s.world().send(&c, 0, 1, b"go").unwrap();
                let d = s.wait(r).unwrap();
                assert_eq!(d.data(), b"ping", "the outer receive was still posted");
            });
        } else {
            let mut go = [0u8; 2];
            w.recv(&c, 1, 1, &mut go).unwrap();
            w.send(&c, 1, 5, b"ping").unwrap();
        }
    });
}

#[test]
fn an_outer_scopes_requests_can_be_finished_in_an_inner_scope() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
            w.scope(|s| {
                let ra = s.irecv(&c, 0, 5, &mut a).unwrap();
                let rb = s.irecv(&c, 0, 6, &mut b).unwrap();
                s.world().send(&c, 0, 1, b"go").unwrap();
                // Each request counts as its own scope's: neither scope's count of
                // unfinished requests may go wrong (below zero, the inner one would).
                let (da, db) = s.world().scope(|t| {
                    let da = t.wait(ra).unwrap().status();
                    let mut rs = t.waitall(vec![rb]).unwrap();
                    (da, rs.pop().unwrap().status())
                });
                assert_eq!((da.tag, da.len, db.tag, db.len), (5, 4, 6, 4));
                let outer = format!("{s:?}");
                assert!(outer.contains("unfinished: 0"), "{outer}");
            });
            assert_eq!((&a, &b), (b"ping", b"pong"));
        } else {
            let mut go = [0u8; 2];
            w.recv(&c, 1, 1, &mut go).unwrap();
            w.send(&c, 1, 5, b"ping").unwrap();
            w.send(&c, 1, 6, b"pong").unwrap();
        }
    });
}

#[test]
fn bad_arguments_are_typed_errors() {
    job(2, |mut w| {
        let c = w.comm();
        assert!(matches!(
            w.send(&c, 2, 0, b"x"),
            Err(P2pError::InvalidRank { rank: 2, size: 2 })
        ));
        assert!(matches!(w.send(&c, 0, -1, b"x"), Err(P2pError::InvalidTag(-1))));
        let mut b = [0u8; 1];
        assert!(matches!(
            w.recv(&c, 5, 0, &mut b),
            Err(P2pError::InvalidRank { rank: 5, .. })
        ));
        assert!(matches!(w.recv(&c, 0, -3, &mut b), Err(P2pError::InvalidTag(-3))));
        assert!(matches!(
            w.bcast(&c, 9, &mut [0u8; 4]),
            Err(P2pError::InvalidRank { .. })
        ));
        let mut f = [1.0f64];
        assert!(matches!(
            w.allreduce(&c, &mut f, Op::BitAnd),
            Err(P2pError::InvalidArgument(_))
        ));
        assert!(matches!(
            w.allgather(&c, &[1u8], &mut [0u8; 3]),
            Err(P2pError::InvalidArgument(_))
        ));
    });
}

#[test]
fn requests_and_communicators_of_another_world_are_refused() {
    let mut results = job(1, |mut a| {
        let seg = Arc::new(Segment::anonymous(1, Geometry::default()).unwrap());
        let p = WaitPolicy {
            spin: 10,
            yields: 1,
            slice: Duration::from_millis(1),
        };
        let mut b = World::new(ShmChannel::from_segment(seg, 0, 1, &[0], 0, p).unwrap()).unwrap();
        let foreign = b.comm();
        let e1 = a.send(&foreign, 0, 0, b"x").unwrap_err();
        let mut buf = [0u8; 4];
        let bc = b.comm();
        let e2 = b.scope(|sb| {
            let r = sb.irecv(&bc, 0, 0, &mut buf).unwrap();
            a.scope(|sa| sa.wait(r).map(|_| ()).unwrap_err())
        });
        (e1.to_string(), e2.to_string())
    });
    let (e1, e2) = results.pop().unwrap();
    assert!(e1.contains("communicator belongs to another world"), "{e1}");
    assert!(e2.contains("request belongs to another world"), "{e2}");
}

#[test]
fn the_stream_medium_limit_follows_the_copy_a_rendezvous_would_make() {
    let read = |vars: &'static [(&'static str, &'static str)]| {
        Config::from_lookup(8160, |q| {
            vars.iter().find(|(k, _)| *k == q).map(|(_, v)| v.to_string())
        })
    };
    let medium = super::DEFAULT_MEDIUM_LIMIT;
    let stream = |vars| read(vars).unwrap().stream_medium_limit;
    // A stream's way chosen by time from 32 KiB, whatever the strategies.
    for vars in [
        &[("NEMESIS_LMT_AUTO", "ring,cma")][..],
        &[("NEMESIS_LMT", "chunks")],
        &[],
    ] {
        assert_eq!(stream(vars), super::DEFAULT_STREAM_MEDIUM_LIMIT, "{vars:?}");
    }
    // Without that, through the copy ring or chunks, a stream keeps the medium limit.
    let untuned = |v: &'static [(&'static str, &'static str)]| {
        let mut all = v.to_vec();
        all.push(("NEMESIS_STREAM_TUNE_LIMIT", "0"));
        stream(Box::leak(all.into_boxed_slice()))
    };
    assert_eq!(untuned(&[("NEMESIS_LMT_AUTO", "ring,cma")]), medium);
    assert_eq!(untuned(&[("NEMESIS_LMT", "chunks")]), medium);
    // Through CMA, where this process may use it, a stream takes the rendezvous sooner.
    let cma = nemesis_lmt::cma::probe().is_ok();
    let want = if cma {
        super::DEFAULT_STREAM_MEDIUM_LIMIT
    } else {
        medium
    };
    assert_eq!(untuned(&[("NEMESIS_LMT", "cma")]), want);
    assert_eq!(untuned(&[("NEMESIS_LMT_AUTO", "cma-split,ring")]), want);
    // With the choice by time on, the rule's limit is where packets are tried first.
    let first = |vars| read(vars).unwrap().stream_packets_first;
    assert_eq!(first(&[("NEMESIS_LMT", "cma")]), want);
    assert_eq!(first(&[("NEMESIS_LMT", "chunks")]), medium);
    // Set, it holds, never above the medium limit.
    assert_eq!(stream(&[("NEMESIS_STREAM_MEDIUM_LIMIT", "64K")]), 64 << 10);
    assert_eq!(
        stream(&[
            ("NEMESIS_STREAM_MEDIUM_LIMIT", "64K"),
            ("NEMESIS_MEDIUM_LIMIT", "16K")
        ]),
        16 << 10
    );
    assert_eq!(stream(&[("NEMESIS_STREAM_MEDIUM_LIMIT", "0")]), 0);
    for v in ["2M", "lots", "-1"] {
        let vars: &'static [(&str, &str)] = Box::leak(Box::new([("NEMESIS_STREAM_MEDIUM_LIMIT", v)]));
        let e = read(vars).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_STREAM_MEDIUM_LIMIT"), "{e}");
    }
    let tune = |vars| read(vars).unwrap().stream_tune_limit;
    assert_eq!(
        tune(&[("NEMESIS_LMT_AUTO", "ring,cma")]),
        super::DEFAULT_STREAM_TUNE_LIMIT
    );
    assert_eq!(
        tune(&[("NEMESIS_LMT", "chunks")]),
        super::DEFAULT_STREAM_TUNE_LIMIT
    );
    // Where the rendezvous copies by the kernel, it alone: no choice by time.
    let by_kernel = if cma { 0 } else { super::DEFAULT_STREAM_TUNE_LIMIT };
    assert_eq!(tune(&[("NEMESIS_LMT", "cma")]), by_kernel);
    assert_eq!(tune(&[("NEMESIS_LMT_AUTO", "cma-split,ring")]), by_kernel);
    assert_eq!(
        stream(&[("NEMESIS_LMT_AUTO", "cma-split,ring")]),
        super::DEFAULT_STREAM_MEDIUM_LIMIT
    );
    // Set, it holds there too.
    assert_eq!(
        tune(&[("NEMESIS_LMT", "cma"), ("NEMESIS_STREAM_TUNE_LIMIT", "256K")]),
        256 << 10
    );
    assert_eq!(tune(&[("NEMESIS_STREAM_TUNE_LIMIT", "1M")]), 1 << 20);
    assert_eq!(tune(&[("NEMESIS_STREAM_TUNE_LIMIT", "0")]), 0);
    assert_eq!(
        tune(&[("NEMESIS_MEDIUM_LIMIT", "0")]),
        0,
        "no medium messages at all"
    );
    for v in ["2M", "lots", "-1"] {
        let vars: &'static [(&str, &str)] = Box::leak(Box::new([("NEMESIS_STREAM_TUNE_LIMIT", v)]));
        let e = read(vars).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_STREAM_TUNE_LIMIT"), "{e}");
    }
    // Own copies are a choice where the stream's way is chosen by time, and no
    // strategy is forced.
    let copies = |vars| read(vars).unwrap().stream_copies_limit;
    assert_eq!(
        copies(&[("NEMESIS_LMT_AUTO", "ring,cma")]),
        super::DEFAULT_STREAM_COPIES_LIMIT
    );
    assert_eq!(copies(&[("NEMESIS_LMT", "chunks")]), 0, "forced");
    assert_eq!(copies(&[("NEMESIS_STREAM_TUNE_LIMIT", "0")]), 0);
    let by_kernel = if cma {
        0
    } else {
        super::DEFAULT_STREAM_COPIES_LIMIT
    };
    assert_eq!(copies(&[("NEMESIS_LMT_AUTO", "cma-split,ring")]), by_kernel);
    // Set, it holds, above the medium maximum too.
    assert_eq!(
        copies(&[("NEMESIS_LMT", "cma"), ("NEMESIS_STREAM_COPIES_LIMIT", "16M")]),
        16 << 20
    );
    assert_eq!(copies(&[("NEMESIS_STREAM_COPIES_LIMIT", "0")]), 0);
    for v in ["lots", "-1"] {
        let vars: &'static [(&str, &str)] = Box::leak(Box::new([("NEMESIS_STREAM_COPIES_LIMIT", v)]));
        let e = read(vars).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_STREAM_COPIES_LIMIT"), "{e}");
    }
}

#[test]
fn the_pair_eager_limit_is_read_and_a_bad_one_named() {
    let read =
        |v: &'static str| Config::from_lookup(8288, |q| (q == "NEMESIS_PAIR_EAGER_LIMIT").then(|| v.into()));
    assert_eq!(
        Config::from_lookup(8288, |_| None).unwrap().pair_eager_limit,
        super::default_pair_eager_limit()
    );
    let by_maker = if nemesis_shm::cpu::is_intel() {
        super::INTEL_PAIR_EAGER_LIMIT
    } else {
        super::PAIR_EAGER_LIMIT_ELSEWHERE
    };
    assert_eq!(super::default_pair_eager_limit(), by_maker);
    assert_eq!(read("4K").unwrap().pair_eager_limit, 4 << 10);
    assert_eq!(read("0").unwrap().pair_eager_limit, 0);
    for v in ["big", "-2"] {
        let e = read(v).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_PAIR_EAGER_LIMIT"), "{e}");
    }
}

#[test]
fn typed_point_to_point() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            w.send_slice(&c, 1, 0, &[1.5f64, -2.0, 1e300]).unwrap();
            w.send_slice(&c, 1, 1, &[1u8, 2, 3]).unwrap();
        } else {
            let mut v = [0f64; 3];
            let st = w.recv_slice(&c, 0, 0, &mut v).unwrap();
            assert_eq!((v, st.len), ([1.5, -2.0, 1e300], 24));
            let mut u = [0u16; 2];
            assert!(matches!(
                w.recv_slice(&c, 0, 1, &mut u),
                Err(P2pError::InvalidArgument(_))
            ));
        }
    });
}

#[test]
fn everything_works_with_every_message_rendezvous() {
    // An eager limit of 0 sends even empty messages by RTS.
    job_with(
        3,
        Geometry::default(),
        |c| c.eager_limit = 0,
        |mut w| {
            let c = w.comm();
            let mut v = [w.rank() + 1];
            w.allreduce(&c, &mut v, Op::Prod).unwrap();
            assert_eq!(v, [6]);
            w.barrier(&c).unwrap();
        },
    );
}

#[test]
fn a_world_moves_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<World>();
    job(2, |w| {
        let moved = std::thread::spawn(move || {
            let mut w = w;
            let c = w.comm();
            let mut x = [w.rank() as u64];
            w.allreduce(&c, &mut x, Op::Sum).unwrap();
            x[0]
        });
        assert_eq!(moved.join().unwrap(), 1);
    });
}

#[test]
fn threads_share_a_world_behind_a_mutex() {
    // Two threads of rank 0 take turns with its world; rank 1 answers each of them.
    job(2, |w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut w = w;
            for _ in 0..200 {
                let mut b = [0u8; 8];
                let st = w.recv(&c, 0, ANY_TAG, &mut b).unwrap();
                w.send(&c, 0, st.tag, &b).unwrap();
            }
            return;
        }
        let shared = Arc::new(std::sync::Mutex::new(w));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (shared, c) = (shared.clone(), c.clone());
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        let mut w = shared.lock().unwrap();
                        w.send(&c, 1, t, &i.to_le_bytes()).unwrap();
                        let mut b = [0u8; 8];
                        // The same thread takes its answer, by its tag, before letting go.
                        w.recv(&c, 1, t, &mut b).unwrap();
                        assert_eq!(u64::from_le_bytes(b), i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}

#[test]
fn a_named_receive_passes_over_other_tags_from_its_source_in_order() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            // Tags 1, 2, 3 in a row, then a large one with tag 1; the receiver asks for
            // them out of order, so each look at the fastbox finds another tag first.
            for t in 1..=3 {
                w.send(&c, 1, t, &[t as u8; 8]).unwrap();
            }
            w.send(&c, 1, 1, &pattern(9, 50_000)).unwrap();
            w.send(&c, 1, 4, b"done").unwrap();
        } else {
            let mut b = [0u8; 8];
            // Wait until all three small ones are in, so the named receives below find
            // the fastbox and the queue holding other tags.
            std::thread::sleep(Duration::from_millis(50));
            for t in [3, 2] {
                let st = w.recv(&c, 0, t, &mut b).unwrap();
                assert_eq!((st.tag, st.len, b), (t, 8, [t as u8; 8]));
            }
            // Two messages with tag 1: the small one came first and must match first.
            let st = w.recv(&c, 0, 1, &mut b).unwrap();
            assert_eq!((st.len, b), (8, [1; 8]));
            let mut big = vec![0u8; 50_000];
            assert_eq!(w.recv(&c, 0, 1, &mut big).unwrap().len, 50_000);
            assert!(big == pattern(9, 50_000));
            let mut d = [0u8; 4];
            assert_eq!(w.recv(&c, 0, 4, &mut d).unwrap().len, 4);
            assert_eq!(&d, b"done");
        }
    });
}

#[test]
fn a_large_isend_moves_on_while_the_sender_computes_between_tests() {
    const LEN: usize = 4 << 20;
    // A 1 MiB ring, as this was written for: each test fills what the receiver drained,
    // and the bound below leaves room for a receiver that other tests' threads delay.
    let ring = nemesis_shm::ring::RingGeometry {
        slots: 8,
        slot_size: 128 << 10,
    };
    let calls = job_ring(2, ring, |mut w| {
        let c = w.comm();
        if w.rank() == 1 {
            let mut b = vec![0u8; LEN];
            w.recv(&c, 0, 0, &mut b).unwrap();
            assert!(b == pattern(5, LEN));
            return 0;
        }
        let data = pattern(5, LEN);
        w.scope(|s| {
            let mut r = s.isend(&c, 1, 0, &data).unwrap();
            let mut calls = 0;
            loop {
                calls += 1;
                if s.test(&mut r).unwrap() {
                    break calls;
                }
                // "Compute" for a while: the receiver drains what the last test handed
                // the channel, so the next test finds room for much more.
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_micros(300) {
                    std::hint::spin_loop();
                }
            }
        })
    });
    // Chunk by chunk this would take 500 tests; each test moves as much as the
    // channel takes, so a few dozen do.
    assert!(calls[0] < 100, "{} tests to move {LEN} bytes", calls[0]);
}

mod coll;
mod large;
mod medium;
mod stream;

pub(super) use large::raw_rts;

/// Two worlds of this thread on one segment, so that what one sends waits in the other's
/// fastbox before the other looks: the blocking receive's first look at the source's
/// fastbox is what is tested.
fn worlds_of_one_thread() -> (World<NemesisChannel>, World<NemesisChannel>) {
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
    let p = WaitPolicy {
        spin: 10,
        yields: 1,
        slice: Duration::from_millis(1),
    };
    let ch = |r| {
        NemesisChannel::with_netmod(
            ShmChannel::from_segment(seg.clone(), r, 2, &[0, 1], r, p).unwrap(),
            None,
        )
    };
    (World::new(ch(0)).unwrap(), World::new(ch(1)).unwrap())
}

#[test]
fn a_blocking_receive_takes_from_the_fastbox_only_what_it_selects() {
    let (mut a, mut b) = worlds_of_one_thread();
    let (ca, cb) = (a.comm(), b.comm());
    // Another tag ahead of the one asked for: kept for its own receive.
    a.send(&ca, 1, 1, b"one").unwrap();
    a.send(&ca, 1, 2, b"two").unwrap();
    let mut buf = [0u8; 8];
    let st = b.recv(&cb, 0, 2, &mut buf).unwrap();
    assert_eq!((st.tag, st.len, &buf[..3]), (2, 3, &b"two"[..]));
    let st = b.recv(&cb, 0, ANY_TAG, &mut buf).unwrap();
    assert_eq!((st.source, st.tag, st.len, &buf[..3]), (0, 1, 3, &b"one"[..]));
    // Other tags ahead, the first a rendezvous: both are kept.
    let long = pattern(9, 100_000);
    a.scope(|sa| {
        let mut r = sa.isend(&ca, 1, 1, &long).unwrap();
        sa.world().send(&ca, 1, 7, b"seven").unwrap();
        sa.world().send(&ca, 1, 2, b"two").unwrap();
        let mut buf = [0u8; 8];
        let st = b.recv(&cb, 0, 2, &mut buf).unwrap();
        assert_eq!((st.tag, st.len, &buf[..3]), (2, 3, &b"two"[..]));
        let st = b.recv(&cb, 0, 7, &mut buf).unwrap();
        assert_eq!((st.tag, st.len, &buf[..5]), (7, 5, &b"seven"[..]));
        let mut got = vec![0u8; 100_000];
        b.scope(|sb| {
            let mut rr = sb.irecv(&cb, 0, ANY_TAG, &mut got).unwrap();
            // Each side moves only when asked, both in this thread.
            while !(sb.test(&mut rr).unwrap() & sa.test(&mut r).unwrap()) {}
            assert_eq!(sb.wait(rr).unwrap().status().tag, 1);
            sa.wait(r).unwrap();
        });
        assert!(got == long);
    });
    let mut buf = [0u8; 8];
    // Straight from the fastbox: a message longer than the buffer fills it and says so,
    // and the next one is not disturbed.
    a.send(&ca, 1, 3, &[5u8; 20]).unwrap();
    a.send(&ca, 1, 4, b"next").unwrap();
    match b.recv(&cb, 0, 3, &mut buf) {
        Err(P2pError::Truncated {
            message_len: 20,
            buffer_len: 8,
        }) => assert_eq!(buf, [5u8; 8]),
        other => panic!("{other:?}"),
    }
    let st = b.recv(&cb, 0, 4, &mut buf).unwrap();
    assert_eq!((st.tag, st.len, &buf[..4]), (4, 4, &b"next"[..]));
    // An empty message, and a message of a whole fastbox.
    a.send(&ca, 1, 5, b"").unwrap();
    assert_eq!(b.recv(&cb, 0, 5, &mut buf).unwrap().len, 0);
    let full = pattern(3, 1000);
    a.send(&ca, 1, 6, &full).unwrap();
    let mut big = vec![0u8; 1000];
    assert_eq!(b.recv(&cb, 0, 6, &mut big).unwrap().len, 1000);
    assert!(big == full);
}
