//! Medium messages: the cells, the pair buffer, and receives that share one buffer.

use super::*;

/// Sizes around the medium protocol: just past the eager limit, several packets, the
/// default limit itself, and one byte past it (a rendezvous).
const MEDIUM_SIZES: [usize; 5] = [
    8161,
    20_000,
    65_536,
    crate::p2p::DEFAULT_MEDIUM_LIMIT,
    crate::p2p::DEFAULT_MEDIUM_LIMIT + 1,
];

#[test]
fn medium_messages_arrive_intact_by_every_receive_path() {
    job(2, |mut w| {
        let c = w.comm();
        assert_eq!(w.config().medium_limit, crate::p2p::DEFAULT_MEDIUM_LIMIT);
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
    use crate::p2p::wire::{MDATA, MEDIUM};
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
    use crate::p2p::wire::{MEDIUM, PAIRED};
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
