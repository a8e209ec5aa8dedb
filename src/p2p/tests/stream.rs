//! Streams: the way a stream's messages take (packets, rendezvous, own copies), chosen
//! by time, and the answers through the pair buffer.

use super::*;

#[test]
fn a_medium_message_in_a_stream_goes_by_rendezvous_above_the_stream_limit() {
    const LEN: usize = 64 << 10;
    for stream_limit in [32 << 10, crate::p2p::DEFAULT_MEDIUM_LIMIT] {
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
        |c| c.stream_tune_limit = crate::p2p::DEFAULT_STREAM_TUNE_LIMIT,
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
    count: fn(&crate::p2p::SendCounts) -> (u64, u64),
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
            c.stream_tune_limit = crate::p2p::DEFAULT_STREAM_TUNE_LIMIT;
            c.stream_copies_limit = crate::p2p::DEFAULT_STREAM_COPIES_LIMIT;
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
            |c| c.stream_copies_limit = crate::p2p::DEFAULT_STREAM_COPIES_LIMIT,
            |w| w.config().stream_copies_limit,
        );
        let want = if force.is_some() {
            0
        } else {
            crate::p2p::DEFAULT_STREAM_COPIES_LIMIT
        };
        assert_eq!(limits, [want, want], "{force:?}");
    }
}

#[test]
fn an_answer_above_the_pair_eager_limit_takes_the_pair_buffer_and_a_stream_goes_in_packets() {
    const LEN: usize = 4000;
    for pair_eager in [crate::p2p::default_pair_eager_limit(), usize::MAX] {
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
                let small = vec![5u8; crate::p2p::default_pair_eager_limit()];
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
