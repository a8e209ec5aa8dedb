use super::*;
use crate::heap::HeapRegion;

fn pair(cells: u32, cell: usize, fbox: usize) -> (Port<HeapRegion>, Port<HeapRegion>) {
    let r = Arc::new(HeapRegion::new(2, cells, cell, fbox));
    (Port::new(r.clone(), 0), Port::new(r, 1))
}

fn drain(p: &mut Port<HeapRegion>) -> Vec<(u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    p.poll(|s, env, data| out.push((s, env[0], data.to_vec())))
        .unwrap();
    out
}

#[test]
fn small_goes_by_fastbox_large_by_queue_in_order() {
    let (mut a, mut b) = pair(8, 256, 64);
    let big = vec![7u8; 200];
    for i in 0..6u64 {
        let data: &[u8] = if i % 2 == 0 { b"tiny" } else { &big };
        a.try_send(1, &[i, 0], &[data], data.len()).unwrap();
    }
    let got = drain(&mut b);
    // The fastbox held message 0 only; 2 and 4 took cells behind it, still in order.
    assert_eq!(
        got.iter().map(|m| m.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert_eq!(got[1].2, big);
    assert_eq!(got[0].2, b"tiny");
}

#[test]
fn a_ring_of_fastboxes_takes_a_run_before_cells_and_wraps_in_order() {
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let m = [5u8; 16];
    for i in 0..4u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    assert_eq!(a.cells_for(1), 8, "four messages fit the ring of four boxes");
    a.try_send(1, &[4, 0], &[&m], 16).unwrap();
    assert_eq!(a.cells_for(1), 7, "the fifth took a cell");
    // A poll takes the boxes' run; the cell waits for its turn behind them.
    let mut got = Vec::new();
    while got.len() < 5 {
        got.extend(drain(&mut b).into_iter().map(|m| m.1));
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    // The acknowledgement hands all four boxes back: the ring wraps, still in order.
    for i in 5..13u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
        if i == 8 {
            // The four boxes, whichever polls take them (the first takes the run).
            assert_eq!((0..4).map(|_| drain(&mut b).len()).sum::<usize>(), 4);
        }
    }
    assert_eq!(a.cells_for(1), 8, "the wrap used boxes, not cells");
    let mut got = Vec::new();
    while got.len() < 4 {
        got.extend(drain(&mut b).into_iter().map(|m| (m.1, m.2)));
    }
    assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), vec![9, 10, 11, 12]);
    assert!(got.iter().all(|g| g.1 == m));
}

#[test]
fn a_run_taken_in_one_poll_returns_every_box_and_ends_the_takers_stream() {
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let m = [9u8; 16];
    b.try_send(0, &[100, 0], &[&m], 16).unwrap();
    assert!(b.sent_since_taken(0));
    for i in 0..4u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    let got = drain(&mut b);
    assert_eq!(
        got.iter().map(|g| g.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "one poll, one run"
    );
    assert!(!b.sent_since_taken(0), "taking the run ended b's stream to a");
    // Every box of the run went back: four more fit the ring, no cell taken.
    for i in 4..8u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    assert_eq!(a.cells_for(1), 8, "the second four went by fastbox");
    let got = drain(&mut b);
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), vec![4, 5, 6, 7]);
    assert_eq!(drain(&mut a).iter().map(|g| g.1).collect::<Vec<_>>(), vec![100]);
}

#[test]
fn lanes_name_only_peers_with_rings_and_carry_both_ways() {
    let r = Arc::new(HeapRegion::new(3, 4, 64, 32));
    let (mut a, mut c) = (Port::new(r.clone(), 0), Port::new(r, 2));
    assert_eq!(a.lane(0), None, "not ourselves");
    assert_eq!(a.lane(3), None, "not past the processes");
    assert_eq!(a.lane(u32::MAX), None);
    let (to_c, to_a) = (a.lane(2).unwrap(), c.lane(0).unwrap());
    assert_ne!(a.lane(1), Some(to_c), "each peer its own lane");
    // SAFETY: lanes of the ports they are used with.
    unsafe {
        assert!(a.try_fbox_lane(to_c, &[7, 0], &[b"hi"], 2));
        assert!(
            !a.try_fbox_lane(to_c, &[8, 0], &[&[0u8; 40]], 40),
            "longer than a box"
        );
        let mut got = Vec::new();
        assert!(c.poll_fbox_lane(to_a, |s, env, d| got.push((s, env[0], d.to_vec()))));
        assert_eq!(got, vec![(0, 7, b"hi".to_vec())]);
        assert!(!c.poll_fbox_lane(to_a, |_, _, _| panic!("nothing more")));
    }
    let (off, _) = pair(2, 64, 0);
    assert_eq!(off.lane(1), None, "no lanes without fastboxes");
}

#[test]
fn only_a_pair_with_fastboxes_is_a_pair_and_its_poll_takes_boxes_then_cells() {
    let (mut a, mut b) = pair(4, 256, 32);
    assert!(a.is_pair() && b.is_pair());
    let (off, _) = pair(2, 64, 0);
    assert!(!off.is_pair(), "no fastboxes");
    let r = Arc::new(HeapRegion::new(3, 4, 64, 32));
    assert!(!Port::new(r, 0).is_pair(), "two peers");
    let big = [9u8; 100];
    a.try_send(1, &[1, 0], &[b"box"], 3).unwrap();
    a.try_send(1, &[2, 0], &[&big], 100).unwrap();
    a.try_send(1, &[3, 0], &[b"after"], 5).unwrap();
    assert_eq!(
        a.cells_for(1),
        2,
        "the ring's one box full, the others took cells"
    );
    let mut got = Vec::new();
    while got.len() < 3 {
        // SAFETY: `b` said it is a pair's.
        unsafe { b.poll_pair(|s, env, d| got.push((s, env[0], d.to_vec()))) }.unwrap();
    }
    assert_eq!(
        got,
        vec![
            (0, 1, b"box".to_vec()),
            (0, 2, big.to_vec()),
            (0, 3, b"after".to_vec())
        ],
        "the box, then the cells behind it, in order"
    );
    // SAFETY: as above.
    let again = unsafe { b.poll_pair(|_, _, _| panic!("nothing more")) };
    assert_eq!(again.unwrap(), 0);
}

#[test]
fn short_messages_keep_to_the_lap_and_long_ones_use_the_whole_ring() {
    // Eight boxes of 16 bytes, messages of one box in the first four of each lap.
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 8).with_fbox_lap(4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let (short, long) = ([1u8; 16], [2u8; 32]);
    for i in 0..4u64 {
        a.try_send(1, &[i, 0], &[&short], 16).unwrap();
    }
    assert_eq!(drain(&mut b).len(), 4);
    // Box 4 is past the lap: marked, and the message goes into box 0 of the next lap.
    a.try_send(1, &[4, 0], &[&short], 16).unwrap();
    assert_eq!(a.rings_to(1).map(|r| r.sent()), Some(9));
    // Until the receiver passes the mark, boxes 4 to 7 count as the sender's.
    assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![4]);
    assert_eq!(b.rings_to(0).map(|r| r.taken()), Some(9));
    // Two boxes each: 9-10, 11-12 and 13-14, past the lap; the ring holds them all.
    for i in 5..8u64 {
        a.try_send(1, &[i, 0], &[&long], 32).unwrap();
    }
    assert_eq!(a.cells_for(1), 8, "every message went by fastbox");
    assert_eq!(a.rings_to(1).map(|r| r.sent()), Some(15));
    let got = drain(&mut b);
    assert_eq!(got.iter().map(|m| m.1).collect::<Vec<_>>(), vec![5, 6, 7]);
    assert!(got.iter().all(|m| m.2 == long));
    assert_eq!(b.rings_to(0).map(|r| r.taken()), Some(15));
    // The next short one is past the lap again: the mark at 15, the message at 16.
    a.try_send(1, &[8, 0], &[&short], 16).unwrap();
    assert_eq!(a.rings_to(1).map(|r| r.sent()), Some(17));
    assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![8]);
    assert_eq!(b.rings_to(0).map(|r| r.taken()), Some(17));
}

#[test]
fn a_lane_taken_only_when_wanted_leaves_the_rest_due_past_a_lap_mark() {
    // Eight boxes of 16 bytes, messages of one box in the first four of each lap.
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 8).with_fbox_lap(4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let to_a = b.lane(0).unwrap();
    let m = [4u8; 16];
    for i in 0..4u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    assert_eq!(drain(&mut b).len(), 4);
    // Past the lap: the mark in box 4, the message in box 0 of the next lap.
    a.try_send(1, &[4, 0], &[&m[..5]], 5).unwrap();
    let mut seen = None;
    // SAFETY: a lane of the port it is used with.
    let taken = unsafe {
        b.poll_fbox_lane_if(
            to_a,
            |env, len| {
                seen = Some((env[0], len));
                false
            },
            |_, _, _| panic!("not wanted"),
        )
    };
    assert!(!taken, "an unwanted message is left");
    assert_eq!(seen, Some((4, 5)), "asked with its envelope and length");
    assert_eq!(b.rings_to(0).map(|r| r.taken()), Some(8), "the mark is passed");
    // The sender refills the lap the mark handed back; the message left is still due.
    for i in 5..8u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    assert_eq!(a.cells_for(1), 8, "every message went by fastbox");
    let mut got = Vec::new();
    // SAFETY: as above.
    let taken = unsafe {
        b.poll_fbox_lane_if(
            to_a,
            |env, _| env[0] == 4,
            |s, env, d| got.push((s, env[0], d.to_vec())),
        )
    };
    assert!(taken);
    assert_eq!(got, vec![(0, 4, m[..5].to_vec())]);
    assert_eq!(
        drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(),
        vec![5, 6, 7]
    );
    // SAFETY: as above.
    assert!(!unsafe { b.poll_fbox_lane_if(to_a, |_, _| true, |_, _, _| panic!("nothing more")) });
}

#[test]
fn a_message_by_cell_after_a_lap_mark_waits_for_the_mark() {
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 8).with_fbox_lap(4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let m = [3u8; 16];
    for i in 0..4u64 {
        a.try_send(1, &[i, 0], &[&m], 16).unwrap();
    }
    // The mark fits box 4, but box 0 of the next lap is not back yet: a cell.
    a.try_send(1, &[4, 0], &[&m], 16).unwrap();
    assert_eq!(a.cells_for(1), 7, "the fifth took a cell");
    assert!(b.has_work());
    let mut got = Vec::new();
    while got.len() < 5 {
        got.extend(drain(&mut b).into_iter().map(|m| m.1));
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    assert!(!b.has_work());
    // The next lap: box 0 is back.
    a.try_send(1, &[5, 0], &[&m], 16).unwrap();
    assert_eq!(a.cells_for(1), 8);
    assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![5]);
}

#[test]
fn threads_stream_through_a_ring_in_order() {
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 4, 256, 64, 8));
    let mut a = Port::new(r.clone(), 0);
    let mut b = Port::new(r, 1);
    const N: u64 = 20_000;
    let t = std::thread::spawn(move || {
        for i in 0..N {
            let len = [0, 8, 64, 200][(i % 4) as usize];
            let data = vec![i as u8; len];
            while a.try_send(1, &[i, 0], &[&data], len).is_err() {
                a.poll(|_, _, _| {}).unwrap();
                std::thread::yield_now();
            }
        }
    });
    let mut next = 0;
    while next < N {
        b.poll(|_, env, data| {
            assert_eq!(env[0], next, "out of order");
            assert_eq!(data.len(), [0, 8, 64, 200][(next % 4) as usize]);
            assert!(data.iter().all(|&x| x == next as u8));
            next += 1;
        })
        .unwrap();
    }
    t.join().unwrap();
}

#[test]
fn streams_to_says_whether_we_sent_a_long_message_since_we_last_took_one() {
    // Spans of at most 4 boxes of 64 bytes: 300 bytes take a cell.
    let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 512, 64, 4));
    let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
    let (short, long) = ([1u8; 8], [2u8; 100]);
    assert!(!a.streams_to(1), "nothing sent yet");
    assert!(!a.sent_since_taken(1));
    a.try_send(1, &[1, 0], &[&short], 8).unwrap();
    assert!(
        !a.streams_to(1),
        "a short message, as a header before its payload"
    );
    assert!(a.sent_since_taken(1), "but sent all the same");
    assert!(!a.sent_since_taken(0) && !a.sent_since_taken(5) && !b.sent_since_taken(0));
    a.try_send(1, &[2, 0], &[&long], 100).unwrap();
    assert!(a.streams_to(1), "a long one, by a span of boxes");
    assert!(!b.streams_to(0));
    assert!(
        !a.streams_to(0) && !a.streams_to(5),
        "not ourselves, not past the processes"
    );
    assert_eq!(drain(&mut b).len(), 2);
    assert!(a.streams_to(1), "the peer taking ours changes nothing here");
    b.try_send(0, &[3, 0], &[&short], 8).unwrap();
    assert_eq!(drain(&mut a).len(), 1);
    assert!(!a.streams_to(1), "we took one of the peer's by fastbox");
    assert!(!a.sent_since_taken(1));
    // A long one by cell starts a stream too, and one taken by cell ends it.
    let big = [3u8; 300];
    a.try_send(1, &[4, 0], &[&big], 300).unwrap();
    assert!(a.streams_to(1));
    b.try_send(0, &[5, 0], &[&big], 300).unwrap();
    let got = drain(&mut a);
    assert_eq!(got[0].2.len(), 300);
    assert!(!a.streams_to(1), "we took one of the peer's by cell");
}

#[test]
fn cells_for_counts_what_a_run_of_packets_would_get() {
    let (mut a, mut b) = pair(3, 64, 0);
    let m = [1u8; 8];
    assert_eq!(a.cells_for(1), 3);
    assert_eq!(a.cells_for(0), 0, "not to ourselves");
    assert_eq!(a.cells_for(7), 0, "not past the processes");
    a.try_send(1, &[1, 0], &[&m], 8).unwrap();
    a.try_send(1, &[2, 0], &[&m], 8).unwrap();
    assert_eq!(a.cells_for(1), 1);
    assert_eq!(drain(&mut b).len(), 2);
    assert_eq!(a.cells_for(1), 3, "returned cells are taken back first");
}

#[test]
fn full_when_cells_run_out_and_recovers_after_poll() {
    let (mut a, mut b) = pair(2, 64, 0);
    let m = [1u8; 8];
    a.try_send(1, &[1, 0], &[&m], 8).unwrap();
    a.try_send(1, &[2, 0], &[&m], 8).unwrap();
    assert_eq!(a.try_send(1, &[3, 0], &[&m], 8), Err(Full));
    assert!(!a.has_work());
    assert_eq!(drain(&mut b).len(), 2);
    assert!(a.has_work(), "returned cells count as work after a failed send");
    a.try_send(1, &[3, 0], &[&m], 8).unwrap();
    assert_eq!(drain(&mut b)[0].1, 3);
}

#[test]
fn credit_keeps_cells_for_other_peers() {
    let r = Arc::new(HeapRegion::new(3, 4, 64, 0));
    let mut a = Port::new(r.clone(), 0);
    let mut c = Port::new(r, 2);
    assert_eq!(a.credit(), 2);
    let m = [0u8; 4];
    a.try_send(1, &[0; 2], &[&m], 4).unwrap();
    a.try_send(1, &[0; 2], &[&m], 4).unwrap();
    assert_eq!(a.try_send(1, &[0; 2], &[&m], 4), Err(Full), "peer 1 never polls");
    a.try_send(2, &[9, 0], &[&m], 4).unwrap();
    assert_eq!(drain(&mut c)[0].1, 9);
}

#[test]
fn gathers_iovecs() {
    let (mut a, mut b) = pair(4, 64, 32);
    a.try_send(1, &[0; 2], &[b"ab", b"", b"cde"], 5).unwrap();
    a.try_send(1, &[0; 2], &[&[1; 40], &[2; 10]], 50).unwrap();
    let got = drain(&mut b);
    assert_eq!(got[0].2, b"abcde");
    assert_eq!(got[1].2.len(), 50);
    assert_eq!(got[1].2[45], 2);
}

#[test]
fn threads_ping_pong_mixed_sizes() {
    let r = Arc::new(HeapRegion::new(2, 4, 512, 64));
    let mut a = Port::new(r.clone(), 0);
    let mut b = Port::new(r, 1);
    const N: u64 = 5000;
    let t = std::thread::spawn(move || {
        let mut next = 0u64;
        let mut echoes = std::collections::VecDeque::new();
        while next < N || !echoes.is_empty() {
            b.poll(|_, env, data| {
                assert_eq!(env[0], next);
                assert!(data.iter().all(|&x| x == next as u8));
                next += 1;
                echoes.push_back((env[0], data.to_vec()));
            })
            .unwrap();
            while let Some((i, d)) = echoes.front() {
                if b.try_send(0, &[*i, 0], &[d], d.len()).is_err() {
                    break;
                }
                echoes.pop_front();
            }
            if !b.has_work() && echoes.is_empty() && next < N {
                b.sleep(Some(Duration::from_millis(50)));
            }
        }
    });
    let mut back = 0u64;
    for i in 0..N {
        let len = [0usize, 8, 63, 64, 65, 300, 512][i as usize % 7];
        let d = vec![i as u8; len];
        while a.try_send(1, &[i, 0], &[&d], len).is_err() {
            a.poll(|_, env, _| {
                assert_eq!(env[0], back);
                back += 1;
            })
            .unwrap();
        }
    }
    while back < N {
        a.poll(|_, env, _| {
            assert_eq!(env[0], back);
            back += 1;
        })
        .unwrap();
    }
    t.join().unwrap();
}

#[test]
fn corrupt_source_is_an_error_not_a_panic() {
    let (mut a, mut b) = pair(2, 64, 0);
    a.try_send(1, &[0; 2], &[b"x"], 1).unwrap();
    // Rewrite the cell's source as a broken peer would.
    let h = 1;
    let region = a.region().clone();
    // SAFETY: single-threaded test; nobody else touches the cell while we rewrite it.
    let mut meta = unsafe { region.cell(h).meta() };
    meta.src = 7;
    // SAFETY: as above.
    unsafe { region.cell(h).write(&meta, &[b"x"]) };
    let err = b.poll(|_, _, _| {}).unwrap_err();
    assert_eq!(err.what, "bad source");
}
