//! Collectives and communicators: every size, through the node blocks and through
//! messages, flat or by tree, and their mismatches.

use super::*;

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
        ("AUTO", None),
        ("", None),
        (" 1 ", Some(true)),
        ("yes", Some(true)),
        ("0", Some(false)),
        ("off", Some(false)),
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
    assert!(
        !read("NEMESIS_NODE_COLLECTIVES", "false")
            .unwrap()
            .node_collectives
    );
    // Empty is unset: the default, on.
    assert!(read("NEMESIS_NODE_COLLECTIVES", "").unwrap().node_collectives);
    for (k, v) in [
        ("NEMESIS_FLAT_COLLECTIVES", "sometimes"),
        ("NEMESIS_NODE_COLLECTIVES", "2"),
    ] {
        let e = read(k, v).unwrap_err().to_string();
        assert!(e.contains(k) && e.contains(v) && e.contains("expected"), "{e}");
    }
    // The flat switch's reason names `auto` beside the spellings every switch takes.
    let e = read("NEMESIS_FLAT_COLLECTIVES", "sometimes")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expected auto, 1 or 0 (or on/off, yes/no, true/false)"),
        "{e}"
    );
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
