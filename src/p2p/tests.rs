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
fn collectives_on_every_size_up_to_eight() {
    collectives_up_to_eight(true, None);
}

#[test]
fn collectives_through_messages_on_every_size_up_to_eight() {
    collectives_up_to_eight(false, Some(false));
}

#[test]
fn flat_collectives_through_messages_on_every_size_up_to_eight() {
    collectives_up_to_eight(false, Some(true));
}

fn collectives_up_to_eight(node: bool, flat: Option<bool>) {
    for n in 1..=8u32 {
        job_with(
            n,
            Geometry::default(),
            move |c| {
                c.node_collectives = node;
                c.flat_collectives = flat;
            },
            move |mut w| {
                let c = w.comm();
                let (r, n) = (w.rank(), w.size());
                w.barrier(&c).unwrap();
                for root in [0, n - 1] {
                    let mut b = if r == root { [7u64, 8, 9] } else { [0; 3] };
                    w.bcast(&c, root, &mut b).unwrap();
                    assert_eq!(b, [7, 8, 9]);
                    let mut out = [0i32; 2];
                    w.reduce(&c, root, &[r as i32, 1], &mut out, Op::Sum).unwrap();
                    if r == root {
                        assert_eq!(out, [(n * (n - 1) / 2) as i32, n as i32]);
                    }
                    let mut g = vec![0u16; 2 * n as usize];
                    w.gather(&c, root, &[r as u16, 100 + r as u16], &mut g).unwrap();
                    if r == root {
                        let want: Vec<u16> = (0..n as u16).flat_map(|i| [i, 100 + i]).collect();
                        assert_eq!(g, want);
                    }
                }
                let mut s = [r as f64, 1.5];
                w.allreduce(&c, &mut s, Op::Sum).unwrap();
                assert_eq!(s, [(n * (n - 1) / 2) as f64, 1.5 * n as f64]);
                let mut m = [r as i64 - 3];
                w.allreduce(&c, &mut m, Op::Min).unwrap();
                assert_eq!(m, [-3]);
                let mut x = [1u32 << r];
                w.allreduce(&c, &mut x, Op::BitOr).unwrap();
                assert_eq!(x, [(1u32 << n) - 1]);
                let mut all = vec![0u32; n as usize];
                w.allgather(&c, &[r * r], &mut all).unwrap();
                assert_eq!(all, (0..n).map(|i| i * i).collect::<Vec<_>>());
                let send: Vec<u32> = (0..n).map(|d| r * 100 + d).collect();
                let mut recv = vec![0u32; n as usize];
                w.alltoall(&c, &send, &mut recv).unwrap();
                assert_eq!(recv, (0..n).map(|s| s * 100 + r).collect::<Vec<_>>());
                w.barrier(&c).unwrap();
            },
        );
    }
}

#[test]
fn collective_settings_are_read_and_bad_ones_named() {
    let read =
        |k: &'static str, v: &'static str| Config::from_lookup(8160, |q| (q == k).then(|| v.to_string()));
    for (v, want) in [
        ("auto", None),
        ("", None),
        (" 1 ", Some(true)),
        ("0", Some(false)),
    ] {
        assert_eq!(
            read("NEMESIS_FLAT_COLLECTIVES", v).unwrap().flat_collectives,
            want,
            "{v:?}"
        );
    }
    assert_eq!(
        Config::from_lookup(8160, |_| None).unwrap().flat_collectives,
        None
    );
    assert!(!read("NEMESIS_NODE_COLLECTIVES", "0").unwrap().node_collectives);
    for (k, v) in [
        ("NEMESIS_FLAT_COLLECTIVES", "yes"),
        ("NEMESIS_NODE_COLLECTIVES", "2"),
    ] {
        let e = read(k, v).unwrap_err();
        assert!(e.to_string().contains(k), "{e}");
    }
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
        super::DEFAULT_PAIR_EAGER_LIMIT
    );
    assert_eq!(read("4K").unwrap().pair_eager_limit, 4 << 10);
    assert_eq!(read("0").unwrap().pair_eager_limit, 0);
    for v in ["big", "-2"] {
        let e = read(v).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_PAIR_EAGER_LIMIT"), "{e}");
    }
}

#[test]
fn members_agree_on_flat_collectives_when_any_wants_them() {
    for (n, wanting) in [(2u32, 1u32), (3, 0), (3, 2), (4, 99), (5, 1), (8, 7), (9, 1)] {
        let flat = job_with(
            n,
            Geometry::default(),
            |c| c.node_collectives = false,
            move |mut w| {
                let c = w.comm();
                w.flat_vote = w.rank() == wanting;
                // An allreduce too large to go flat does not ask.
                let mut big = vec![1u64; 1024];
                w.allreduce(&c, &mut big, Op::Sum).unwrap();
                assert!(big.iter().all(|&x| x == n as u64));
                assert_eq!(c.inner.flat.get(), None);
                w.barrier(&c).unwrap();
                let mut s = [w.rank() as f64 + 0.25];
                w.allreduce(&c, &mut s, Op::Sum).unwrap();
                assert_eq!(s, [(n * (n - 1) / 2) as f64 + 0.25 * n as f64]);
                *c.inner.flat.get().unwrap()
            },
        );
        let want = (3..=8).contains(&n) && wanting < n;
        assert!(
            flat.iter().all(|&f| f == want),
            "{n} ranks, rank {wanting} wanting: {flat:?}"
        );
    }
}

/// Among 3 and 4 ranks the flat forms are one exchange, every rank sending to every
/// other before it receives: with every message by rendezvous, blocking sends would wait
/// for each other in a circle.
#[test]
fn a_flat_exchange_by_rendezvous_completes() {
    for n in [3, 4] {
        job_with(
            n,
            Geometry::default(),
            |c| {
                c.node_collectives = false;
                c.flat_collectives = Some(true);
                c.eager_limit = 16;
                c.net_eager_limit = 16;
                c.medium_limit = 0;
            },
            |mut w| {
                let c = w.comm();
                let (r, n) = (w.rank(), w.size());
                for round in 0..3u32 {
                    let mut v = vec![r + round; 1024];
                    w.allreduce(&c, &mut v, Op::Sum).unwrap();
                    assert!(v.iter().all(|&x| x == n * (n - 1) / 2 + n * round));
                    w.barrier(&c).unwrap();
                }
                assert!(w.send_counts().rendezvous >= 3 * (n as u64 - 1));
            },
        );
    }
}

#[test]
fn flat_collectives_that_do_not_match_fail_on_every_rank() {
    // Among 4 ranks the flat forms are one exchange; among 6, gathered at rank 0.
    for n in [4, 6] {
        let errs = job_with(
            n,
            Geometry::default(),
            |c| {
                c.node_collectives = false;
                c.flat_collectives = Some(true);
            },
            |mut w| {
                let c = w.comm();
                let mut v = [1i32; 2];
                // Rank 2 calls a barrier where the others reduce; rank 3 another operation.
                let r = match w.rank() {
                    2 => w.barrier(&c),
                    3 => w.allreduce(&c, &mut v, Op::Max),
                    _ => w.allreduce(&c, &mut v, Op::Sum),
                };
                let e = r.unwrap_err();
                assert!(matches!(e, P2pError::CollectiveMismatch(_)), "{e}");
                // The pair goes on: the next collective that matches works.
                w.barrier(&c).unwrap();
                e.to_string()
            },
        );
        assert!(errs[0].contains("rank 2"), "{errs:?}");
        if n == 4 {
            // Each finds the first rank, in rank order, whose message differs from its
            // own call.
            assert!(errs[1].contains("rank 2"), "{errs:?}");
            assert!(errs[2..].iter().all(|e| e.contains("rank 0")), "{errs:?}");
        } else {
            // Told by rank 0, or finding its answer the wrong length.
            assert!(errs[1..].iter().all(|e| e.contains("rank 0")), "{errs:?}");
            assert!(
                errs[1].contains("rank 0 found that the members' calls differ"),
                "{errs:?}"
            );
        }
    }
}

#[test]
fn large_collectives_go_through_rendezvous() {
    job(3, |mut w| {
        let c = w.comm();
        let mut v = vec![w.rank() as f32; 100_000];
        w.allreduce(&c, &mut v, Op::Max).unwrap();
        assert!(v.iter().all(|&x| x == 2.0));
        let mut b = if w.rank() == 1 {
            pattern(1, 300_000)
        } else {
            vec![0; 300_000]
        };
        w.bcast(&c, 1, &mut b).unwrap();
        assert!(b == pattern(1, 300_000));
    });
}

#[test]
fn split_and_dup_isolate_matching() {
    job(4, |mut w| {
        let c = w.comm();
        let r = w.rank();
        let d = w.dup(&c).unwrap();
        // The same source and tag on two communicators: each receive sees its own.
        if r == 0 {
            w.send(&d, 1, 0, b"dup").unwrap();
            w.send(&c, 1, 0, b"world").unwrap();
        } else if r == 1 {
            let mut b = [0u8; 5];
            let st = w.recv(&c, 0, 0, &mut b).unwrap();
            assert_eq!(&b[..st.len], b"world");
            let st = w.recv(&d, 0, 0, &mut b).unwrap();
            assert_eq!(&b[..st.len], b"dup");
        }
        // Even and odd ranks, ordered by descending key.
        let half = w.split(&c, Some(r % 2), -(r as i32)).unwrap().unwrap();
        assert_eq!(half.size(), 2);
        assert_eq!(half.rank(), if r < 2 { 1 } else { 0 });
        let mut sum = [r];
        w.allreduce(&half, &mut sum, Op::Sum).unwrap();
        assert_eq!(sum[0], if r % 2 == 0 { 2 } else { 4 });
        let none = w.split(&c, (r != 3).then_some(0), 0).unwrap();
        assert_eq!(none.is_none(), r == 3);
        if let Some(three) = none {
            assert_eq!(three.size(), 3);
            w.barrier(&three).unwrap();
        }
    });
}

#[test]
fn mismatched_collectives_are_caught() {
    let errs = job(2, |mut w| {
        let c = w.comm();
        let mut v = [1i32; 4];
        let op = if w.rank() == 0 { Op::Sum } else { Op::Max };
        w.allreduce(&c, &mut v, op).unwrap_err().to_string()
    });
    assert!(
        errs.iter().all(|e| e.contains("collective arguments differ")),
        "{errs:?}"
    );
    let errs = job(2, |mut w| {
        let c = w.comm();
        let mut b = vec![0u8; if w.rank() == 0 { 8 } else { 4 }];
        w.bcast(&c, 0, &mut b).err().map(|e| e.to_string())
    });
    assert!(
        errs[1]
            .as_deref()
            .is_some_and(|e| e.contains("sent 8 bytes, this rank expected 4")),
        "{errs:?}"
    );
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
fn node_allreduce_of_every_type_and_operation_matches_a_fold_in_rank_order() {
    fn check<T: Reducible + PartialEq + std::fmt::Debug>(
        w: &mut World,
        c: &Comm,
        op: Op,
        mine: Vec<T>,
        all: &[Vec<T>],
    ) {
        let mut want = all[0].clone();
        for other in &all[1..] {
            T::combine(op, &mut want, other).unwrap();
        }
        let mut got = mine;
        w.allreduce(c, &mut got, op).unwrap();
        assert_eq!(got, want, "{op:?} on {}", std::any::type_name::<T>());
    }
    job(4, |mut w| {
        let c = w.comm();
        let r = w.rank();
        assert!(c.all_local());
        let ints = |r: u32| -> Vec<i64> { (0..32).map(|i| (i * 7 + r as i64 * 13) % 23 - 11).collect() };
        let bytes = |r: u32| -> Vec<u8> { (0..256).map(|i| (i as u32 * 31 + r * 17) as u8).collect() };
        let floats = |r: u32| -> Vec<f32> { (0..64).map(|i| i as f32 * 0.25 - r as f32).collect() };
        let all_i: Vec<_> = (0..4).map(ints).collect();
        let all_b: Vec<_> = (0..4).map(bytes).collect();
        let all_f: Vec<_> = (0..4).map(floats).collect();
        for op in [
            Op::Sum,
            Op::Prod,
            Op::Min,
            Op::Max,
            Op::BitAnd,
            Op::BitOr,
            Op::BitXor,
        ] {
            check(&mut w, &c, op, ints(r), &all_i);
            check(&mut w, &c, op, bytes(r), &all_b);
        }
        for op in [Op::Sum, Op::Prod, Op::Min, Op::Max] {
            check(&mut w, &c, op, floats(r), &all_f);
        }
        // Just past a slot: agreed through the block, then through messages.
        let big = |r: u32| -> Vec<u64> { (0..33).map(|i| i * 1000 + r as u64).collect() };
        let all_big: Vec<_> = (0..4).map(big).collect();
        check(&mut w, &c, Op::Sum, big(r), &all_big);
        check(
            &mut w,
            &c,
            Op::Sum,
            Vec::<u32>::new(),
            &[vec![], vec![], vec![], vec![]],
        );
    });
}

#[test]
fn node_collectives_catch_mismatches_on_every_rank() {
    // One rank's data fits a slot and the other's does not: both hear of it.
    let errs = job(2, |mut w| {
        let c = w.comm();
        let mut v = vec![1u64; if w.rank() == 0 { 4 } else { 100 }];
        let e = w.allreduce(&c, &mut v, Op::Sum).unwrap_err().to_string();
        // Still in step afterwards.
        let mut x = [w.rank()];
        w.allreduce(&c, &mut x, Op::Sum).unwrap();
        assert_eq!(x, [1]);
        e
    });
    assert!(
        errs.iter()
            .all(|e| e.contains("collective arguments differ") && e.contains("32") && e.contains("800")),
        "{errs:?}"
    );
    // A barrier on one rank and an allreduce on the other.
    let errs = job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            w.barrier(&c).map_err(|e| e.to_string())
        } else {
            let mut x = [1.0f64];
            w.allreduce(&c, &mut x, Op::Sum).map_err(|e| e.to_string())
        }
    });
    assert!(errs[0].is_ok(), "{errs:?}");
    assert!(
        errs[1].as_ref().is_err_and(|e| e.contains("another collective")),
        "{errs:?}"
    );
}

#[test]
fn communicators_claim_node_blocks_and_give_them_back() {
    job(3, |mut w| {
        let world = w.comm();
        // More communicators alive at once than there are blocks: the rest use messages.
        let comms: Vec<Comm> = (0..12).map(|_| w.dup(&world).unwrap()).collect();
        for (i, c) in comms.iter().enumerate() {
            let mut x = [i as u32 + w.rank()];
            w.allreduce(c, &mut x, Op::Sum).unwrap();
            assert_eq!(x, [3 * i as u32 + 3]);
            w.barrier(c).unwrap();
        }
        drop(comms);
        w.barrier(&world).unwrap();
        // Dropped ones gave their blocks back: many more come and go.
        for i in 0..40u32 {
            let c = w.dup(&world).unwrap();
            let mut x = [i];
            w.allreduce(&c, &mut x, Op::Max).unwrap();
            assert_eq!(x, [i]);
        }
        // Split halves, each with a block of its own.
        let half = w.split(&world, Some(w.rank() % 2), 0).unwrap().unwrap();
        let mut x = [1u8];
        w.allreduce(&half, &mut x, Op::Sum).unwrap();
        assert_eq!(x, [if w.rank() % 2 == 0 { 2 } else { 1 }]);
        w.barrier(&half).unwrap();
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

// ---------------------------------------------------------------------------------
// Large-message transfer: every strategy, forced.

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
pub(super) fn raw_rts(w: &mut World, dest: u32, send_id: u32, total: u64, s: Strategy, cookie: &[u8]) {
    let mut p = total.to_le_bytes().to_vec();
    p.push(Strategies::CHUNKS.with(s).0);
    p.extend_from_slice(cookie);
    let h = crate::channel::Header {
        kind: super::wire::RTS,
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
    use super::wire::{CTS, FIN, RTS};
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

/// Sizes around the medium protocol: just past the eager limit, several packets, the
/// default limit itself, and one byte past it (a rendezvous).
const MEDIUM_SIZES: [usize; 5] = [
    8161,
    20_000,
    65_536,
    super::DEFAULT_MEDIUM_LIMIT,
    super::DEFAULT_MEDIUM_LIMIT + 1,
];

#[test]
fn medium_messages_arrive_intact_by_every_receive_path() {
    job(2, |mut w| {
        let c = w.comm();
        assert_eq!(w.config().medium_limit, super::DEFAULT_MEDIUM_LIMIT);
        if w.rank() == 0 {
            for (i, &len) in MEDIUM_SIZES.iter().enumerate() {
                let data = pattern(i as u32, len);
                // Received by a blocking receive as it arrives, then by a posted one.
                w.send(&c, 1, 1, &data).unwrap();
                let mut go = [0u8; 1];
                w.recv(&c, 1, 9, &mut go).unwrap();
                w.send(&c, 1, 2, &data).unwrap();
                // Arrived before any receive asks: gathered aside, then matched (and
                // from three pieces into two).
                let (a, b) = data.split_at(len / 3);
                w.scope(|s| {
                    let r3 = s.isend(&c, 1, 3, &data).unwrap();
                    let r4 = s.isend_iov(&c, 1, 4, &[a, &[], b]).unwrap();
                    s.world().send(&c, 1, 5, b"go").unwrap();
                    s.waitall(vec![r3, r4]).unwrap();
                });
            }
        } else {
            for (i, &len) in MEDIUM_SIZES.iter().enumerate() {
                let want = pattern(i as u32, len);
                let mut buf = vec![0u8; len];
                assert_eq!(w.recv(&c, 0, 1, &mut buf).unwrap().len, len);
                assert!(buf == want, "{len} B by a blocking receive");
                let mut posted = vec![0u8; len];
                w.scope(|s| {
                    let r = s.irecv(&c, 0, 2, &mut posted).unwrap();
                    s.world().send(&c, 0, 9, &[1]).unwrap();
                    assert_eq!(s.wait(r).unwrap().status().len, len);
                });
                assert!(posted == want, "{len} B by a posted receive");
                // Tag 5 comes last: tags 3 and 4 wait unexpected by then.
                let mut go = [0u8; 2];
                w.recv(&c, 0, 5, &mut go).unwrap();
                let mut late = vec![0u8; len];
                let st = w.recv(&c, 0, 3, &mut late).unwrap();
                assert_eq!((st.source, st.tag, st.len), (0, 3, len));
                assert!(late == want, "{len} B unexpected");
                let mut x = vec![0u8; len / 2 + 1];
                let mut y = vec![0u8; len - x.len()];
                assert_eq!(w.recv_iov(&c, 0, 4, &mut [&mut x, &mut y]).unwrap().len, len);
                assert!(
                    x[..] == want[..x.len()] && y[..] == want[x.len()..],
                    "{len} B into pieces"
                );
            }
        }
    });
}

#[test]
fn medium_messages_truncate_and_the_stream_goes_on() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            for tag in 1..=2 {
                w.send(&c, 1, tag, &pattern(3, 50_000)).unwrap();
                w.send(&c, 1, 7, b"after").unwrap();
            }
        } else {
            // A blocking receive, then a posted one, each 1000 bytes short of room.
            let mut part = vec![0u8; 1000];
            match w.recv(&c, 0, 1, &mut part) {
                Err(P2pError::Truncated {
                    message_len: 50_000,
                    buffer_len: 1000,
                }) => assert!(part == pattern(3, 50_000)[..1000]),
                other => panic!("blocking: {other:?}"),
            }
            let mut b = [0u8; 5];
            assert_eq!(w.recv(&c, 0, 7, &mut b).unwrap().len, 5);
            let mut guarded = vec![0xeeu8; 2000];
            w.scope(|s| {
                let r = s.irecv(&c, 0, 2, &mut guarded[..1000]).unwrap();
                match s.wait(r) {
                    Err(P2pError::Truncated {
                        message_len: 50_000,
                        buffer_len: 1000,
                    }) => {}
                    other => panic!("posted: {other:?}"),
                }
            });
            assert!(guarded[..1000] == pattern(3, 50_000)[..1000]);
            assert!(
                guarded[1000..].iter().all(|&b| b == 0xee),
                "written past the buffer"
            );
            assert_eq!(w.recv(&c, 0, 7, &mut b).unwrap().len, 5);
            assert_eq!(&b, b"after");
        }
    });
}

#[test]
fn medium_messages_from_many_sources_keep_each_pair_in_order() {
    job(4, |mut w| {
        let c = w.comm();
        let n = w.size();
        if w.rank() == 0 {
            // Posted and blocking receives, any source, while three senders interleave.
            let mut next = vec![0u32; n as usize];
            let mut bufs = vec![vec![0u8; 40_000]; 8];
            for _ in 0..6 {
                let got: Vec<Status> = w.scope(|s| {
                    let rs: Vec<_> = bufs
                        .iter_mut()
                        .map(|b| s.irecv(&c, ANY_SOURCE, 1, b).unwrap())
                        .collect();
                    s.waitall(rs).unwrap().iter().map(|d| d.status()).collect()
                });
                for (st, b) in got.iter().zip(&bufs) {
                    let k = u32::from_le_bytes(b[..4].try_into().unwrap());
                    assert_eq!(k, next[st.source as usize], "from {} overtaken", st.source);
                    assert_eq!(st.len, 9000 + 1000 * (k as usize % 30));
                    next[st.source as usize] += 1;
                }
            }
            assert_eq!(next[1..].iter().sum::<u32>(), 48);
        } else {
            for k in 0..16u32 {
                let mut m = pattern(k, 9000 + 1000 * (k as usize % 30));
                m[..4].copy_from_slice(&k.to_le_bytes());
                w.send(&c, 0, 1, &m).unwrap();
            }
        }
    });
}

/// Packets of the medium protocol as a broken or hostile peer sends them.
fn raw_medium(w: &mut World, dest: u32, kind: u16, aux: u32, payload: &[u8]) {
    let h = crate::channel::Header {
        kind,
        context: 0,
        tag: 5,
        aux,
        flags: 0,
    };
    w.channel_mut().send_bytes(dest, h, payload).unwrap();
}

#[test]
fn broken_medium_messages_are_protocol_errors_not_panics() {
    use super::wire::{MDATA, MEDIUM};
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            // MDATA with nothing under way.
            raw_medium(&mut w, 1, MDATA, 0, &[1; 10]);
            let mut go = [0u8; 1];
            w.recv(&c, 1, 9, &mut go).unwrap();
            // A length past what any receiver gathers.
            raw_medium(&mut w, 1, MEDIUM, u32::MAX, &[1; 100]);
            w.recv(&c, 1, 9, &mut go).unwrap();
            // A message broken off by another: the rest can no longer be told apart.
            raw_medium(&mut w, 1, MEDIUM, 20_000, &[1; 8000]);
            w.send(&c, 1, 5, b"eager").unwrap();
            w.recv(&c, 1, 9, &mut go).unwrap();
            // Overrun of the announced length.
            raw_medium(&mut w, 1, MEDIUM, 9000, &[1; 8000]);
            raw_medium(&mut w, 1, MDATA, 0, &[1; 8000]);
            w.recv(&c, 1, 9, &mut go).unwrap();
            // The same two to a posted receive.
            for overrun in [false, true] {
                w.recv(&c, 1, 9, &mut go).unwrap();
                raw_medium(&mut w, 1, MEDIUM, 9000, &[1; 8000]);
                if overrun {
                    raw_medium(&mut w, 1, MDATA, 0, &[1; 8000]);
                } else {
                    w.send(&c, 1, 8, b"eager").unwrap();
                }
            }
            w.send(&c, 1, 6, b"still here").unwrap();
        } else {
            let wants = [
                "no medium message under way",
                "medium message of 4294967295 bytes",
                "broken off",
                "broken off or overrun",
            ];
            for want in wants {
                let mut buf = vec![0u8; 20_000];
                match w.recv(&c, 0, 5, &mut buf) {
                    Err(P2pError::Protocol { rank: 0, what }) => assert!(what.contains(want), "{what}"),
                    other => panic!(
                        "expected a protocol error ({want}), got {:?}",
                        other.map(|s| s.len)
                    ),
                }
                w.send(&c, 0, 9, &[1]).unwrap();
            }
            for want in ["broken off by another packet", "beyond the 9000 bytes"] {
                let mut buf = vec![0u8; 20_000];
                w.scope(|s| {
                    let r = s.irecv(&c, 0, 5, &mut buf).unwrap();
                    s.world().send(&c, 0, 9, &[1]).unwrap();
                    match s.wait(r).map(|d| d.status()) {
                        Err(P2pError::Protocol { rank: 0, what }) => assert!(what.contains(want), "{what}"),
                        other => panic!("expected a protocol error ({want}), got {other:?}"),
                    }
                });
            }
            // The packet that broke the first off is a message of its own.
            let mut b = [0u8; 10];
            assert_eq!(w.recv(&c, 0, 8, &mut b).unwrap().len, 5);
            assert_eq!(w.recv(&c, 0, 6, &mut b).unwrap().len, 10);
        }
    });
}

#[test]
fn medium_messages_take_the_pair_buffer_both_ways_and_hand_it_back() {
    job(2, |mut w| {
        let c = w.comm();
        let peer = 1 - w.rank();
        let len = 65_536;
        let mut buf = vec![0u8; len];
        for round in 0..3u32 {
            // A ping-pong: each side replies through the lines it has just read.
            if w.rank() == 0 {
                w.send(&c, peer, 1, &pattern(round, len)).unwrap();
                // Posted before the reply comes, this time.
                w.scope(|s| {
                    let r = s.irecv(&c, peer, 2, &mut buf).unwrap();
                    assert_eq!(s.wait(r).unwrap().status().len, len);
                });
            } else {
                assert_eq!(w.recv(&c, peer, 1, &mut buf).unwrap().len, len);
                assert!(buf == pattern(round, len), "round {round} there");
                w.send(&c, peer, 2, &pattern(round + 100, len)).unwrap();
            }
        }
        if w.rank() == 0 {
            assert!(buf == pattern(102, len), "the last reply");
        }
        // Every message took the buffer: each receiver freed it before it replied.
        assert_eq!(w.eng.medium.paired_taken, 3, "rank {}", w.rank());
        let pairs = w.eng.pairs.clone().unwrap();
        let pb = pairs.with(peer).unwrap();
        w.barrier(&c).unwrap();
        assert!(pb.try_claim(), "rank {}: the buffer was handed back", w.rank());
        pb.unclaim();
        w.barrier(&c).unwrap();
        // Gathered aside, then matched: both ranks send first.
        w.send(&c, peer, 3, &pattern(7 + w.rank(), 40_000)).unwrap();
        let mut late = vec![0u8; 40_000];
        w.barrier(&c).unwrap();
        assert_eq!(w.recv(&c, peer, 3, &mut late).unwrap().len, 40_000);
        assert!(late == pattern(7 + peer, 40_000));
    });
}

#[test]
fn with_the_pair_buffer_held_medium_messages_go_in_packets_and_in_order() {
    job(2, |mut w| {
        let c = w.comm();
        if w.rank() == 0 {
            // Held by rank 1 (as a reply under way would be): every message goes in
            // packets, eager ones between them.
            let mut go = [0u8; 1];
            w.recv(&c, 1, 9, &mut go).unwrap();
            for k in 0..6u32 {
                let len = if k % 2 == 0 { 30_000 + k as usize } else { 100 };
                w.send(&c, 1, 1, &pattern(k, len)).unwrap();
            }
            w.recv(&c, 1, 9, &mut go).unwrap();
            // Free again: the first takes it, and whatever follows keeps its place.
            let msgs: Vec<Vec<u8>> = (6..12u32).map(|k| pattern(k, 20_000 + k as usize)).collect();
            w.scope(|s| {
                let rs: Vec<_> = msgs.iter().map(|m| s.isend(&c, 1, 1, m).unwrap()).collect();
                s.waitall(rs).unwrap();
            });
        } else {
            let pairs = w.eng.pairs.clone().unwrap();
            let pb = pairs.with(0).unwrap();
            assert!(pb.try_claim());
            w.send(&c, 0, 9, &[1]).unwrap();
            let mut buf = vec![0u8; 40_000];
            for k in 0..6u32 {
                let st = w.recv(&c, 0, 1, &mut buf).unwrap();
                assert!(buf[..st.len] == pattern(k, st.len)[..], "message {k}");
            }
            assert_eq!(w.eng.medium.paired_taken, 0, "the buffer was ours");
            pb.unclaim();
            w.send(&c, 0, 9, &[1]).unwrap();
            for k in 6..12u32 {
                let st = w.recv(&c, 0, 1, &mut buf).unwrap();
                assert_eq!(st.len, 20_000 + k as usize);
                assert!(buf[..st.len] == pattern(k, st.len)[..], "message {k}");
            }
            assert!(w.eng.medium.paired_taken >= 1);
        }
    });
}

#[test]
fn a_pair_buffer_message_its_sender_does_not_hold_is_a_protocol_error() {
    use super::wire::{MEDIUM, PAIRED};
    job(2, |mut w| {
        let c = w.comm();
        let forged = |w: &mut World, payload: &[u8]| {
            let h = crate::channel::Header {
                kind: MEDIUM,
                context: 0,
                tag: 5,
                aux: 20_000,
                flags: PAIRED,
            };
            w.channel_mut().send_bytes(1, h, payload).unwrap();
        };
        if w.rank() == 0 {
            let mut go = [0u8; 1];
            // Not claimed: the buffer's bytes are nobody's message.
            forged(&mut w, &[]);
            w.recv(&c, 1, 9, &mut go).unwrap();
            // Claimed, but the packet carries bytes of its own.
            let pairs = w.eng.pairs.clone().unwrap();
            let pb = pairs.with(1).unwrap();
            assert!(pb.try_claim());
            forged(&mut w, &[1; 10]);
            w.recv(&c, 1, 9, &mut go).unwrap();
            pb.unclaim();
            w.send(&c, 1, 6, &pattern(1, 30_000)).unwrap();
        } else {
            for _ in 0..2 {
                let mut buf = vec![0u8; 20_000];
                match w.recv(&c, 0, 5, &mut buf) {
                    Err(P2pError::Protocol { rank: 0, what }) => {
                        assert!(what.contains("pair buffer"), "{what}")
                    }
                    other => panic!("expected a protocol error, got {:?}", other.map(|s| s.len)),
                }
                w.send(&c, 0, 9, &[1]).unwrap();
            }
            let mut buf = vec![0u8; 30_000];
            assert_eq!(w.recv(&c, 0, 6, &mut buf).unwrap().len, 30_000);
            assert!(buf == pattern(1, 30_000));
        }
    });
}

#[test]
fn raw_receives_may_share_one_buffer_as_osu_bws_do() {
    job(2, |mut w| {
        let c = w.comm();
        // Eager, medium (through the pair buffer and, while it is held, in packets) and
        // rendezvous.
        for len in [100usize, 30_000, 300_000] {
            if w.rank() == 0 {
                for k in 0..8u32 {
                    w.send(&c, 1, k as i32, &pattern(k, len)).unwrap();
                }
            } else {
                let mut buf = vec![0u8; len];
                let p = buf.as_mut_ptr();
                let st: Vec<Status> = w.scope(|s| {
                    // SAFETY: `buf` outlives the scope, and only these receives touch it.
                    let rs: Vec<_> = (0..8)
                        .map(|k| unsafe { s.irecv_raw(&c, 0, k, p, len) }.unwrap())
                        .collect();
                    s.waitall(rs).unwrap().iter().map(|d| d.status()).collect()
                });
                for (k, st) in st.iter().enumerate() {
                    assert_eq!((st.source, st.tag, st.len), (0, k as i32, len));
                }
                if len < 100_000 {
                    // Taken whole, one after another: the last one's bytes are left.
                    assert!(buf == pattern(7, len), "{len} B");
                }
            }
        }
        w.scope(|s| {
            // SAFETY: a null buffer is refused before anything is posted.
            let e = unsafe { s.irecv_raw(&c, 0, 1, std::ptr::null_mut(), 10) }.unwrap_err();
            assert!(matches!(e, P2pError::InvalidArgument(_)), "{e}");
        });
    });
}

#[test]
fn a_medium_message_in_a_stream_goes_by_rendezvous_above_the_stream_limit() {
    const LEN: usize = 64 << 10;
    for stream_limit in [32 << 10, super::DEFAULT_MEDIUM_LIMIT] {
        let out = job_with(
            2,
            Geometry::default(),
            // The rule alone, without the choice by time (the next test).
            move |c| {
                c.stream_medium_limit = stream_limit;
                c.stream_tune_limit = 0;
            },
            move |mut w| {
                let c = w.comm();
                let mut ack = [0u8; 1];
                if w.rank() == 0 {
                    // Finished on return: sent whole (medium), or not (a rendezvous,
                    // which waits for the receive rank 1 has not posted).
                    let msgs: Vec<Vec<u8>> = (0..5).map(|k| pattern(k, LEN)).collect();
                    let done: Vec<bool> = w.scope(|s| {
                        let mut reqs: Vec<_> =
                            msgs[..4].iter().map(|m| s.isend(&c, 1, 1, m).unwrap()).collect();
                        let done = reqs.iter_mut().map(|r| s.test(r).unwrap()).collect();
                        s.world().send(&c, 1, 9, &[1]).unwrap();
                        s.waitall(reqs).unwrap();
                        done
                    });
                    // Once the peer has answered, the next one is no stream.
                    w.recv(&c, 1, 9, &mut ack).unwrap();
                    let after = w.scope(|s| {
                        let mut r = s.isend(&c, 1, 1, &msgs[4]).unwrap();
                        let d = s.test(&mut r).unwrap();
                        s.wait(r).unwrap();
                        d
                    });
                    let n = w.send_counts();
                    if stream_limit < LEN {
                        // The pair buffer, packets, two by rendezvous, then packets.
                        assert_eq!((n.paired, n.medium_packets), (1, 2));
                        assert_eq!((n.rendezvous, n.stream_rendezvous), (2, 2));
                    } else {
                        assert_eq!((n.paired, n.medium_packets, n.rendezvous), (1, 4, 0));
                    }
                    (done, after)
                } else {
                    w.recv(&c, 0, 9, &mut ack).unwrap();
                    let mut buf = vec![0u8; LEN];
                    for k in 0..4 {
                        assert_eq!(w.recv(&c, 0, 1, &mut buf).unwrap().len, LEN);
                        assert!(buf == pattern(k, LEN), "message {k}");
                    }
                    w.send(&c, 0, 9, &[1]).unwrap();
                    assert_eq!(w.recv(&c, 0, 1, &mut buf).unwrap().len, LEN);
                    assert!(buf == pattern(4, LEN));
                    (Vec::new(), true)
                }
            },
        );
        let (done, after) = &out[0];
        if stream_limit < LEN {
            // The first goes through the pair buffer, announced by a short packet; the
            // second as long packets, which make the rest a stream.
            assert_eq!(done, &[true, true, false, false]);
        } else {
            assert_eq!(done, &[true; 4]);
        }
        assert!(after, "an answer is no stream (limit {stream_limit})");
    }
}

/// Windows of `isend`s answered by an acknowledgement, as osu_bw sends: each window is
/// an episode of the sender's choice by time (`stream_way.rs`), all but its first
/// message in the first two windows one way (as packets where the rule without timing
/// sends this size so, else by rendezvous), in the next two the other, then whichever
/// moved more. Every message arrives whole either way, into distinct buffers and
/// truncated into a short one, at a size within the medium limit and one above it.
#[test]
fn a_stream_takes_both_ways_in_turn_and_every_message_arrives_whole() {
    for len in [96 << 10, 200_000] {
        a_stream_of(len);
    }
}

/// With medium messages turned off in a `Config` after it was read, a stream's way is
/// not chosen by time either: every window goes by rendezvous.
#[test]
fn no_medium_messages_means_no_stream_packets() {
    const LEN: usize = 96 << 10;
    let out = job_with(
        2,
        Geometry::default(),
        |c| c.medium_limit = 0,
        |mut w| {
            let c = w.comm();
            let mut ack = [0u8; 1];
            let mut buf = vec![0u8; LEN];
            for _ in 0..10 {
                if w.rank() == 0 {
                    let msg = pattern(1, LEN);
                    w.scope(|s| {
                        let reqs: Vec<_> = (0..4).map(|_| s.isend(&c, 1, 1, &msg).unwrap()).collect();
                        s.waitall(reqs).unwrap();
                    });
                    w.recv(&c, 1, 9, &mut ack).unwrap();
                } else {
                    for _ in 0..4 {
                        assert_eq!(w.recv(&c, 0, 1, &mut buf).unwrap().len, LEN);
                    }
                    w.send(&c, 0, 9, &[1]).unwrap();
                }
            }
            w.send_counts()
        },
    );
    let n = out[0];
    assert_eq!(
        (n.medium_packets, n.stream_packets, n.rendezvous),
        (0, 0, 40),
        "{n:?}"
    );
}

fn a_stream_of(len: usize) {
    const WINDOW: usize = 6;
    let windows = windows_of(
        (len, WINDOW, 14, 1000),
        // The choice by time on, as where the rendezvous would not copy by the kernel.
        |c| c.stream_tune_limit = super::DEFAULT_STREAM_TUNE_LIMIT,
        |n| (n.stream_packets, n.rendezvous),
    );
    // By rendezvous: all but the first message (which goes the way that moved more so
    // far, or takes the pair buffer); as packets: at least the second, while the cells
    // had room.
    let rendezvous = |w: &[(u64, u64)]| w.iter().all(|&(p, r)| p <= 1 && r >= WINDOW as u64 - 1);
    let packets = |w: &[(u64, u64)]| w.iter().all(|&(p, _)| p >= 1);
    assert!(
        rendezvous(&windows[..2]) && packets(&windows[2..4])
            || packets(&windows[..2]) && rendezvous(&windows[2..4]),
        "two windows each way: {windows:?}"
    );
}

/// Windows of `window` `isend`s of `len` bytes (`shape`: with how many windows, and the
/// length of the short buffer the last receive of each takes), each answered by an
/// acknowledgement, as osu_bw sends, with the tunables changed by `tweak`. The receiver
/// checks every message whole in distinct buffers and the last truncated; returns what
/// `count` reads of the sender's counts in each window.
fn windows_of(
    (len, window, windows, short_len): (usize, usize, usize, usize),
    tweak: impl Fn(&mut Config) + Send + Sync + 'static,
    count: fn(&super::SendCounts) -> (u64, u64),
) -> Vec<(u64, u64)> {
    let out = job_with(2, Geometry::default(), tweak, move |mut w| {
        let c = w.comm();
        let mut ack = [0u8; 1];
        if w.rank() == 0 {
            let msgs: Vec<Vec<u8>> = (0..window as u32).map(|k| pattern(k, len)).collect();
            let mut per_window = Vec::new();
            for _ in 0..windows {
                let before = count(&w.send_counts());
                w.scope(|s| {
                    let reqs: Vec<_> = msgs.iter().map(|m| s.isend(&c, 1, 1, m).unwrap()).collect();
                    s.waitall(reqs).unwrap();
                });
                w.recv(&c, 1, 9, &mut ack).unwrap();
                let after = count(&w.send_counts());
                per_window.push((after.0 - before.0, after.1 - before.1));
            }
            per_window
        } else {
            let mut bufs = vec![vec![0u8; len]; window - 1];
            let mut short = vec![0u8; short_len];
            for _ in 0..windows {
                w.scope(|s| {
                    let mut reqs: Vec<_> = bufs.iter_mut().map(|b| s.irecv(&c, 0, 1, b).unwrap()).collect();
                    reqs.push(s.irecv(&c, 0, 1, &mut short).unwrap());
                    let e = s.waitall(reqs).expect_err("the last message is truncated");
                    assert!(
                        matches!(
                            e,
                            P2pError::Truncated {
                                message_len,
                                buffer_len,
                            } if message_len == len && buffer_len == short_len
                        ),
                        "{e}"
                    );
                });
                for (k, b) in bufs.iter_mut().enumerate() {
                    assert!(*b == pattern(k as u32, len), "message {k}");
                    b.fill(0);
                }
                assert!(short[..] == pattern(window as u32 - 1, len)[..short_len]);
                w.send(&c, 0, 9, &[1]).unwrap();
            }
            Vec::new()
        }
    });
    out.into_iter().next().expect("rank 0")
}

/// Above the stream tune limit, a stream's rendezvous offers every strategy in two
/// windows and only own copies in the next two, or the other way round, then whichever
/// moved more (`stream_way.rs`); every message arrives whole either way, into distinct
/// buffers and truncated into a short one.
#[test]
fn a_long_stream_takes_own_copies_in_turn_and_every_message_arrives_whole() {
    const WINDOW: usize = 4;
    let windows = windows_of(
        ((1 << 20) - 3, WINDOW, 10, 5000),
        |c| {
            c.stream_tune_limit = super::DEFAULT_STREAM_TUNE_LIMIT;
            c.stream_copies_limit = super::DEFAULT_STREAM_COPIES_LIMIT;
        },
        |n| (n.stream_own_copies, n.rendezvous),
    );
    // Every message but a window's first (which goes the way that moved more so far,
    // or through the pair buffer) one way.
    let every = |w: &[(u64, u64)]| w.iter().all(|&(own, r)| own <= 1 && r >= WINDOW as u64 - 1);
    let own = |w: &[(u64, u64)]| w.iter().all(|&(own, _)| own >= WINDOW as u64 - 1);
    assert!(
        every(&windows[..2]) && own(&windows[2..4]) || own(&windows[..2]) && every(&windows[2..4]),
        "two windows each way: {windows:?}"
    );
    assert!(windows.iter().all(|&(own, r)| own <= r), "{windows:?}");
}

/// A strategy forced on the channel, however the configuration was made, leaves no
/// stream way that offers only own copies; one not forced keeps it.
#[test]
fn a_forced_strategy_turns_off_the_rendezvous_through_own_copies() {
    use nemesis_shm::ring::RingGeometry;
    for force in [Some(Strategy::Cma), None] {
        let limits = crate::testkit::job_full(
            2,
            Geometry::default(),
            force,
            None::<RingGeometry>,
            |c| c.stream_copies_limit = super::DEFAULT_STREAM_COPIES_LIMIT,
            |w| w.config().stream_copies_limit,
        );
        let want = if force.is_some() {
            0
        } else {
            super::DEFAULT_STREAM_COPIES_LIMIT
        };
        assert_eq!(limits, [want, want], "{force:?}");
    }
}

#[test]
fn an_answer_above_the_pair_eager_limit_takes_the_pair_buffer_and_a_stream_goes_in_packets() {
    const LEN: usize = 4000;
    for pair_eager in [super::DEFAULT_PAIR_EAGER_LIMIT, usize::MAX] {
        let taken = job_with(
            2,
            Geometry::default(),
            move |c| c.pair_eager_limit = pair_eager,
            |mut w| {
                assert!(LEN <= w.config().eager_limit, "one packet would carry it");
                let c = w.comm();
                let (me, peer) = (w.rank(), 1 - w.rank());
                let mut buf = vec![0u8; LEN];
                // A ping-pong: every message answers the one before.
                for k in 0..6u32 {
                    if k % 2 == me {
                        w.send(&c, peer, 1, &pattern(k, LEN)).unwrap();
                    } else {
                        assert_eq!(w.recv(&c, peer, 1, &mut buf).unwrap().len, LEN);
                        assert!(buf == pattern(k, LEN), "message {k}");
                    }
                }
                let pong = w.eng.medium.paired_taken;
                // At the limit, one packet whatever it answers.
                let small = vec![5u8; super::DEFAULT_PAIR_EAGER_LIMIT];
                if me == 0 {
                    w.send(&c, 1, 2, &small).unwrap();
                } else {
                    assert_eq!(w.recv(&c, 0, 2, &mut buf).unwrap().len, small.len());
                    assert!(buf[..small.len()] == small[..]);
                }
                // A stream one way: only its first message answers.
                for k in 10..15u32 {
                    if me == 0 {
                        w.send(&c, 1, 3, &pattern(k, LEN)).unwrap();
                    } else {
                        assert_eq!(w.recv(&c, 0, 3, &mut buf).unwrap().len, LEN);
                        assert!(buf == pattern(k, LEN), "message {k}");
                    }
                }
                let n = w.send_counts();
                assert_eq!(n.paired, n.paired_short, "every one fits a packet");
                (pong, w.eng.medium.paired_taken, n.paired)
            },
        );
        if pair_eager == usize::MAX {
            assert_eq!(taken, vec![(0, 0, 0), (0, 0, 0)], "never through the buffer");
        } else {
            // Rank 0 took messages 1, 3 and 5 and sent the others, then the stream's
            // first; rank 1 took those.
            assert_eq!(taken, vec![(3, 3, 4), (3, 4, 3)]);
        }
    }
}

#[test]
fn a_stream_one_way_takes_the_pair_buffer_once_and_an_answer_takes_it_again() {
    job(2, |mut w| {
        let c = w.comm();
        let mut buf = vec![0u8; 40_000];
        let mut ack = [0u8; 1];
        if w.rank() == 0 {
            for k in 0..5u32 {
                w.send(&c, 1, 1, &pattern(k, 40_000)).unwrap();
                // The buffer is free again before the next one: only the rule keeps
                // the next from taking it.
                w.recv(&c, 1, 9, &mut ack).unwrap();
            }
            assert_eq!(w.recv(&c, 1, 2, &mut buf).unwrap().len, 40_000);
            assert!(buf == pattern(99, 40_000));
            assert_eq!(w.eng.medium.paired_taken, 1, "the answer came through the buffer");
        } else {
            for k in 0..5u32 {
                assert_eq!(w.recv(&c, 0, 1, &mut buf).unwrap().len, 40_000);
                assert!(buf == pattern(k, 40_000), "message {k}");
                w.send(&c, 0, 9, &[1]).unwrap();
            }
            assert_eq!(w.eng.medium.paired_taken, 1, "only the stream's first message");
            w.send(&c, 0, 2, &pattern(99, 40_000)).unwrap();
        }
    });
}

#[test]
fn an_answer_above_the_medium_limit_that_fits_the_pair_buffer_goes_through_it() {
    const LEN: usize = 300_000;
    for pair_size in [nemesis_shm::config::PAIR_AUTO, 0] {
        let geo = Geometry {
            pair_size,
            ..Geometry::default()
        };
        let counts = job_with(
            2,
            geo,
            |_| {},
            move |mut w| {
                assert!(LEN > w.config().medium_limit);
                let c = w.comm();
                let (me, peer) = (w.rank(), 1 - w.rank());
                let mut buf = vec![0u8; (1 << 20) + 1];
                let mut ack = [0u8; 1];
                // A ping-pong: each message answers the one before.
                for k in 0..4u32 {
                    if k % 2 == me {
                        w.send(&c, peer, 1, &pattern(k, LEN)).unwrap();
                    } else {
                        assert_eq!(w.recv(&c, peer, 1, &mut buf).unwrap().len, LEN);
                        assert!(buf[..LEN] == pattern(k, LEN)[..], "message {k}");
                    }
                }
                // A stream one way, each acknowledged: only its first answers.
                for k in 10..13u32 {
                    if me == 0 {
                        w.send(&c, 1, 2, &pattern(k, LEN)).unwrap();
                        w.recv(&c, 1, 9, &mut ack).unwrap();
                    } else {
                        assert_eq!(w.recv(&c, 0, 2, &mut buf).unwrap().len, LEN);
                        assert!(buf[..LEN] == pattern(k, LEN)[..], "message {k}");
                        w.send(&c, 0, 9, &[1]).unwrap();
                    }
                }
                // An answer longer than the buffer.
                let big = (1 << 20) + 1;
                if me == 1 {
                    w.send(&c, 0, 3, &pattern(20, big)).unwrap();
                } else {
                    assert_eq!(w.recv(&c, 1, 3, &mut buf).unwrap().len, big);
                    assert!(buf == pattern(20, big));
                }
                let n = w.send_counts();
                (n.paired, n.rendezvous)
            },
        );
        if pair_size == 0 {
            assert_eq!(
                counts,
                vec![(0, 5), (0, 3)],
                "no buffers: every one by rendezvous"
            );
        } else {
            // Rank 0: two of the ping-pong and the stream's first through the buffer, the
            // stream's others by rendezvous; rank 1: two, and the long answer.
            assert_eq!(counts, vec![(3, 2), (2, 1)]);
        }
    }
}
