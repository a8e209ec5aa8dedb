//! The one-sided layer, written once and run over every route: members that map each
//! other's memory (one node), members reached only by messages (one rank per node), and
//! both at once; and over every flavour of window.

use super::*;
use crate::p2p::World;
use crate::testkit::{job, job_nodes, job_nodes_with};
use crate::{ChannelError, Header, ProtocolId};
use blocks::Strided;

const FLAVORS: [Flavor; 3] = [Flavor::Allocate, Flavor::Create, Flavor::Dynamic];

/// Runs `f` as every rank of four jobs: three ranks on one node, three ranks each
/// alone on a node, two ranks on one node with one alone, and that again with a netmod
/// that offers RDMA, which every put and get between nodes then uses.
fn each_shape(f: impl Fn(World) + Send + Sync + Clone + 'static) {
    job(3, f.clone());
    job_nodes(&[1, 1, 1], f.clone());
    job_nodes(&[2, 1], f.clone());
    job_nodes_with(&[2, 1], true, move |mut w| {
        window::rma(&mut w).rdma_min = 0;
        f(w)
    });
}

/// A window of `len` u64 per member in `flavor`, and the displacement of each member's
/// first element (non-zero only for a dynamic window's attached memory).
fn window(w: &mut World, flavor: Flavor, len: usize) -> (Window<u64>, Vec<usize>) {
    let comm = w.comm();
    let n = comm.size() as usize;
    let win = match flavor {
        Flavor::Allocate => Window::<u64>::allocate(w, &comm, len).unwrap(),
        Flavor::Create => Window::create(w, &comm, vec![0u64; len]).unwrap(),
        Flavor::Dynamic => Window::dynamic(w, &comm).unwrap(),
    };
    let mut base = vec![0u64; n];
    if flavor == Flavor::Dynamic {
        let r = win.attach(w, vec![0u64; len]).unwrap();
        w.allgather(&comm, &[r.disp() as u64], &mut base).unwrap();
    }
    (win, base.into_iter().map(|b| b as usize).collect())
}

/// Reads `len` elements of member `t` from `at`, in an epoch of its own.
fn read_back(w: &mut World, win: &Window<u64>, t: u32, at: usize, len: usize) -> Vec<u64> {
    let mut out = vec![0u64; len];
    let mut ep = win.lock(w, t, LockKind::Shared).unwrap();
    ep.read(&mut out, t, at).unwrap();
    ep.unlock().unwrap();
    out
}

#[test]
fn fences_order_puts_and_gets_round_a_ring() {
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let (me, n) = (w.rank(), w.size());
            let (right, left) = ((me + 1) % n, (me + n - 1) % n);
            let (win, base) = window(&mut w, flavor, 8);
            let mut got = [0u64; 2];
            for round in 0..3u64 {
                let ep = win.fence(&mut w, Assert::NONE).unwrap();
                let mut ep = ep;
                ep.put(&[100 * round + u64::from(me), 7], right, base[right as usize] + 2)
                    .unwrap();
                let ep = ep.fence(Assert::NONE).unwrap();
                let mut ep = ep;
                ep.get(&mut got, left, base[left as usize] + 2).unwrap();
                ep.end(Assert::NONE).unwrap();
                // The left neighbour put into the left neighbour's right: us; our left
                // neighbour's memory holds its own left neighbour's rank.
                let ll = (left + n - 1) % n;
                assert_eq!(got, [100 * round + u64::from(ll), 7], "{flavor:?} round {round}");
            }
            let mine = read_back(&mut w, &win, me, base[me as usize], 8);
            assert_eq!(mine[2..4], [200 + u64::from(left), 7], "{flavor:?}");
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn fetch_and_add_from_every_rank_hands_out_each_value_once() {
    const EACH: u64 = 40;
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let comm = w.comm();
            let (me, n) = (w.rank(), w.size());
            let (win, base) = window(&mut w, flavor, 2);
            let mut mine = Vec::new();
            {
                let mut ep = win.lock_all(&mut w).unwrap();
                for _ in 0..EACH {
                    mine.push(ep.fetch_and_op(1, 0, base[0], AccOp::Sum).unwrap());
                    ep.accumulate(&[2], 0, base[0] + 1, AccOp::Sum).unwrap();
                }
                ep.unlock().unwrap();
            }
            let mut all = vec![0u64; (EACH * u64::from(n)) as usize];
            w.allgather(&comm, &mine, &mut all).unwrap();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..EACH * u64::from(n)).collect::<Vec<_>>(),
                "{flavor:?}: a value twice"
            );
            w.barrier(&comm).unwrap();
            if me == 0 {
                assert_eq!(
                    read_back(&mut w, &win, 0, base[0], 2),
                    [EACH * u64::from(n), 2 * EACH * u64::from(n)]
                );
            }
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn exclusive_locks_exclude_and_shared_ones_see_whole_updates() {
    const EACH: u64 = 25;
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let comm = w.comm();
            let (me, n) = (w.rank(), w.size());
            let (win, base) = window(&mut w, flavor, 2);
            for i in 0..EACH {
                if (u64::from(me) + i) % 3 == 0 {
                    // A reader sees both words equal: never half an update.
                    let mut v = [0u64; 2];
                    let mut ep = win.lock(&mut w, 0, LockKind::Shared).unwrap();
                    ep.read(&mut v, 0, base[0]).unwrap();
                    ep.unlock().unwrap();
                    assert_eq!(v[0], v[1], "{flavor:?}: a shared lock saw half an update");
                } else {
                    let mut ep = win.lock(&mut w, 0, LockKind::Exclusive).unwrap();
                    let mut v = [0u64; 2];
                    ep.read(&mut v, 0, base[0]).unwrap();
                    ep.put(&[v[0] + 1], 0, base[0]).unwrap();
                    ep.flush(0).unwrap();
                    ep.put(&[v[1] + 1], 0, base[0] + 1).unwrap();
                    ep.unlock().unwrap();
                }
            }
            let writes: u64 = (0..n)
                .map(|r| (0..EACH).filter(|i| (u64::from(r) + i) % 3 != 0).count() as u64)
                .sum();
            w.barrier(&comm).unwrap();
            assert_eq!(
                read_back(&mut w, &win, 0, base[0], 2),
                [writes, writes],
                "{flavor:?}: an update lost"
            );
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn post_start_complete_wait_hand_memory_round_a_ring() {
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let (me, n) = (w.rank(), w.size());
            let (right, left) = ((me + 1) % n, (me + n - 1) % n);
            let (win, base) = window(&mut w, flavor, 4);
            for round in 0..4u64 {
                // We expose ourselves to the left neighbour, and access the right one.
                let exp = win.post(&mut w, &[left], Assert::NONE).unwrap();
                let mut acc = win.start(&mut w, &[right], Assert::NONE).unwrap();
                acc.put(&[round * 10 + u64::from(me)], right, base[right as usize] + 1)
                    .unwrap();
                acc.accumulate(&[1], right, base[right as usize], AccOp::Sum)
                    .unwrap();
                assert!(
                    matches!(
                        acc.put(&[1], left, base[left as usize]),
                        Err(RmaError::NotInEpoch { .. })
                    ) || n == 2 && left == right
                );
                acc.complete().unwrap();
                exp.wait(&mut w).unwrap();
                let mine = read_back(&mut w, &win, me, base[me as usize], 2);
                assert_eq!(
                    mine,
                    [round + 1, round * 10 + u64::from(left)],
                    "{flavor:?} round {round}"
                );
            }
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn accumulates_from_one_origin_apply_in_order() {
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let (me, n) = (w.rank(), w.size());
            let (win, base) = window(&mut w, flavor, 1);
            let t = (me + 1) % n;
            let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
            for i in 1..=30u64 {
                ep.accumulate(&[i], t, base[t as usize], AccOp::Replace).unwrap();
                let seen = ep.fetch_and_op(0, t, base[t as usize], AccOp::NoOp).unwrap();
                assert_eq!(seen, i, "{flavor:?}: a read overtook the replace before it");
            }
            ep.unlock().unwrap();
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn compare_and_swap_builds_a_mutex_that_guards_plain_puts() {
    const EACH: u64 = 15;
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let comm = w.comm();
            let (me, n) = (w.rank(), w.size());
            let (win, base) = window(&mut w, flavor, 2);
            let owner = n - 1;
            let (m, c) = (base[owner as usize], base[owner as usize] + 1);
            let mut ep = win.lock_all(&mut w).unwrap();
            for _ in 0..EACH {
                while ep.compare_and_swap(0, u64::from(me) + 1, owner, m).unwrap() != 0 {
                    std::thread::yield_now();
                }
                let mut v = [0u64];
                ep.read(&mut v, owner, c).unwrap();
                ep.put(&[v[0] + 1], owner, c).unwrap();
                ep.flush(owner).unwrap();
                let held = ep.fetch_and_op(0, owner, m, AccOp::Replace).unwrap();
                assert_eq!(held, u64::from(me) + 1, "{flavor:?}: the mutex was not ours");
            }
            ep.unlock().unwrap();
            w.barrier(&comm).unwrap();
            assert_eq!(
                read_back(&mut w, &win, owner, c, 1),
                [EACH * u64::from(n)],
                "{flavor:?}"
            );
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn floating_point_and_narrow_updates_are_atomic_too() {
    each_shape(|mut w| {
        let comm = w.comm();
        let n = w.size();
        let f = Window::<f64>::allocate(&mut w, &comm, 2).unwrap();
        let b = Window::<i16>::create(&mut w, &comm, vec![0i16; 2]).unwrap();
        {
            let mut ep = f.lock_all(&mut w).unwrap();
            for _ in 0..50 {
                ep.accumulate(&[0.5, -1.0], 0, 0, AccOp::Sum).unwrap();
                ep.accumulate(&[3.0], 0, 1, AccOp::Min).unwrap();
            }
            assert!(matches!(
                ep.accumulate(&[1.0], 0, 0, AccOp::BitXor),
                Err(RmaError::InvalidArgument(_))
            ));
            ep.unlock().unwrap();
        }
        {
            let mut ep = b.lock_all(&mut w).unwrap();
            for _ in 0..50 {
                ep.accumulate(&[-1, 1], 0, 0, AccOp::Sum).unwrap();
            }
            ep.unlock().unwrap();
        }
        w.barrier(&comm).unwrap();
        let mut got = [0f64; 2];
        let mut ep = f.lock(&mut w, 0, LockKind::Shared).unwrap();
        ep.read(&mut got, 0, 0).unwrap();
        ep.unlock().unwrap();
        assert_eq!(got, [25.0 * f64::from(n), -50.0 * f64::from(n)]);
        let mut s = [0i16; 2];
        let mut ep = b.lock(&mut w, 0, LockKind::Shared).unwrap();
        ep.read(&mut s, 0, 0).unwrap();
        ep.unlock().unwrap();
        assert_eq!(s, [-50 * n as i16, 50 * n as i16]);
        f.free(&mut w).unwrap();
        assert_eq!(b.free(&mut w).unwrap().unwrap().len(), 2, "the vector comes back");
    });
}

#[test]
fn a_large_get_arrives_in_order_and_its_first_part_can_be_used_early() {
    each_shape(|mut w| {
        let (me, n) = (w.rank(), w.size());
        let comm = w.comm();
        let len = 300_000;
        let mem: Vec<u64> = (0..len as u64).map(|i| i * 3 + u64::from(me)).collect();
        let win = Window::create(&mut w, &comm, mem).unwrap();
        let t = (me + 1) % n;
        let mut dst = vec![0u64; len];
        let mut ep = win.lock(&mut w, t, LockKind::Shared).unwrap();
        let mut g = ep.rget(&mut dst, t, 0).unwrap();
        let first = ep.wait_range(&mut g, 0..1000).unwrap();
        assert!(
            first
                .iter()
                .enumerate()
                .all(|(i, &v)| v == i as u64 * 3 + u64::from(t))
        );
        assert!(ep.arrived(&g) >= 1000);
        let all = ep.wait(g).unwrap();
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, &v)| v == i as u64 * 3 + u64::from(t))
        );
        ep.unlock().unwrap();
        w.barrier(&comm).unwrap();
        win.free(&mut w).unwrap();
    });
}

#[test]
fn local_memory_is_reached_by_atomics_or_under_an_exclusive_self_lock() {
    each_shape(|mut w| {
        let comm = w.comm();
        let me = w.rank();
        let win = Window::<u32>::allocate(&mut w, &comm, 4).unwrap();
        win.local_atomics().unwrap()[0].store(me, std::sync::atomic::Ordering::Relaxed);
        {
            let mut ep = win.lock(&mut w, me, LockKind::Shared).unwrap();
            assert!(matches!(ep.with_local(|_| ()), Err(RmaError::NotInEpoch { .. })));
            ep.unlock().unwrap();
        }
        let mut ep = win.lock(&mut w, me, LockKind::Exclusive).unwrap();
        ep.with_local(|s| {
            assert_eq!(s[0], me);
            s[1] = me + 100;
        })
        .unwrap();
        ep.unlock().unwrap();
        w.barrier(&comm).unwrap();
        let n = w.size();
        let t = (me + 1) % n;
        let mut v = [0u32; 2];
        let mut ep = win.lock(&mut w, t, LockKind::Shared).unwrap();
        ep.read(&mut v, t, 0).unwrap();
        ep.unlock().unwrap();
        assert_eq!(v, [t, t + 100]);
        win.free(&mut w).unwrap();
    });
}

#[test]
fn attached_memory_is_reached_until_it_is_detached() {
    each_shape(|mut w| {
        let comm = w.comm();
        let (me, n) = (w.rank(), w.size());
        let win = Window::<u64>::dynamic(&mut w, &comm).unwrap();
        assert!(matches!(
            Window::<u64>::allocate(&mut w, &comm, 1)
                .unwrap()
                .attach(&mut w, vec![1]),
            Err(RmaError::Wrong(_))
        ));
        let r = win.attach(&mut w, vec![5u64; 4]).unwrap();
        let mut disps = vec![0u64; n as usize];
        w.allgather(&comm, &[r.disp() as u64], &mut disps).unwrap();
        let t = (me + 1) % n;
        let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
        ep.accumulate(&[u64::from(me)], t, disps[t as usize] as usize + 3, AccOp::Sum)
            .unwrap();
        ep.unlock().unwrap();
        w.barrier(&comm).unwrap();
        let back = win.detach(&mut w, r).unwrap();
        assert_eq!(back, [5, 5, 5, 5 + u64::from((me + n - 1) % n)]);
        w.barrier(&comm).unwrap();
        // Detached: the target refuses, and nothing is written.
        let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
        ep.put(&[9], t, disps[t as usize] as usize).unwrap();
        let e = ep.unlock().unwrap_err();
        assert!(
            matches!(
                e,
                RmaError::Refused {
                    why: wire::Refusal::OutOfBounds,
                    ..
                }
            ),
            "{e}"
        );
        w.barrier(&comm).unwrap();
    });
}

#[test]
fn operations_outside_a_window_fail_at_the_origin_and_forged_ones_at_the_target() {
    each_shape(|mut w| {
        let comm = w.comm();
        let (me, n) = (w.rank(), w.size());
        let win = Window::<u64>::allocate(&mut w, &comm, 4).unwrap();
        let t = (me + 1) % n;
        {
            let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
            assert!(matches!(
                ep.put(&[1, 2], t, 3),
                Err(RmaError::OutOfBounds { len: 4, .. })
            ));
            assert!(matches!(ep.put(&[1], n, 0), Err(RmaError::InvalidRank { .. })));
            let mut big = [0u64; 5];
            assert!(matches!(
                ep.read(&mut big, t, 0),
                Err(RmaError::OutOfBounds { .. })
            ));
            assert!(matches!(ep.put(&[1], (me + 2) % n, 0), Err(RmaError::NotInEpoch { .. })) || n < 3);
            ep.unlock().unwrap();
        }
        w.barrier(&comm).unwrap();
        // A peer that forges requests past the window: the target writes nothing and
        // says why; the forger learns of it at its next synchronisation.
        let h = |k: u8, aux: u32| Header {
            kind: u16::from(k),
            context: win.id,
            aux,
            ..Header::default()
        };
        let mut put = wire::disp_head(24).to_vec();
        put.extend_from_slice(&[0xff; 16]);
        w.core.send(ProtocolId::RMA, t, h(wire::PUT, 0), &[&put]).unwrap();
        let mut bad = wire::acc_head(wire::AccHead {
            disp: 4,
            tag: win.type_tag,
            code: 8,
            op: 1,
        })
        .to_vec();
        bad.extend_from_slice(&[1; 8]);
        w.core.send(ProtocolId::RMA, t, h(wire::ACC, 0), &[&bad]).unwrap();
        w.core
            .send(ProtocolId::RMA, t, h(wire::GRANT, 77), &[&[1]])
            .unwrap();
        let id = win.id;
        let seen = |w: &mut World| window::rma(w).slot(id).unwrap().origin.refusals_seen;
        assert!(
            w.progress_until(Some(std::time::Duration::from_secs(20)), |w| seen(w) >= 2)
                .unwrap()
        );
        // Reported at the next synchronisation, both of them.
        let ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
        let e = ep.unlock().unwrap_err();
        assert!(
            matches!(e, RmaError::Refused { target, others: 1, .. } if target == t),
            "{e}"
        );
        assert!(
            w.progress_until(
                Some(std::time::Duration::from_secs(20)),
                |w| super::stray_packets(w) >= 1
            )
            .unwrap(),
            "the malformed grant was counted"
        );
        w.barrier(&comm).unwrap();
        let mine = read_back(&mut w, &win, me, 0, 4);
        assert_eq!(mine, [0; 4], "a forged request wrote into the window");
        win.free(&mut w).unwrap();
    });
}

#[test]
fn members_that_disagree_on_the_element_type_are_told_so() {
    job(2, |mut w| {
        let comm = w.comm();
        let e = if w.rank() == 0 {
            Window::<u64>::allocate(&mut w, &comm, 1).map(|_| ())
        } else {
            Window::<f64>::allocate(&mut w, &comm, 1).map(|_| ())
        };
        assert!(matches!(e, Err(RmaError::CollectiveMismatch(_))), "{e:?}");
    });
}

#[test]
fn the_layer_s_protocol_id_is_not_the_user_s() {
    job(1, |mut w| {
        assert!(matches!(
            w.register(
                ProtocolId::RMA,
                |_: crate::Packet<'_>, _: &mut crate::progress::Outbox| {}
            ),
            Err(crate::progress::RegistryError::Reserved(_))
        ));
        assert!(matches!(
            w.send_packet(ProtocolId::RMA, 0, Header::default(), b""),
            Err(crate::P2pError::Channel(ChannelError::Registry(_)))
        ));
    });
}

#[test]
fn strided_blocks_gather_and_scatter_between_origin_and_target() {
    for flavor in FLAVORS {
        each_shape(move |mut w| {
            let (me, n) = (w.rank(), w.size());
            let (win, base) = window(&mut w, flavor, 64);
            let t = (me + 1) % n;
            let b = base[t as usize];
            // Column 1 of an 8x8 matrix at the target, from three pieces here.
            let col = Strided {
                disp: b + 1,
                count: 8,
                block: 1,
                stride: 8,
            };
            let (p1, p2, p3) = ([10u64, 11, 12], [13u64], [14u64, 15, 16, 17]);
            let mut back = [0u64; 8];
            let mut diag = [0u64; 8];
            {
                let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
                ep.put_v(&[&p1, &p2, &p3], t, &col.blocks()).unwrap();
                ep.accumulate_v(&[&[100; 8]], t, &col.blocks(), AccOp::Sum)
                    .unwrap();
                assert!(matches!(
                    ep.put_v(&[&p1], t, &col.blocks()),
                    Err(RmaError::InvalidArgument(_))
                ));
                ep.flush(t).unwrap();
                ep.get_v(&mut back, t, &col.blocks()).unwrap();
                let d: Vec<(usize, usize)> = (0..8).map(|i| (b + 9 * i, 1)).collect();
                ep.get_v(&mut diag, t, &d).unwrap();
                // Zero-sized operations do nothing and fail nothing.
                ep.put(&[], t, b + 64).unwrap();
                ep.put_v(&[], t, &[]).unwrap();
                ep.unlock().unwrap();
            }
            assert_eq!(back, [110, 111, 112, 113, 114, 115, 116, 117], "{flavor:?}");
            assert_eq!(
                diag,
                [0, 111, 0, 0, 0, 0, 0, 0],
                "{flavor:?}: the diagonal crosses column 1 at row 1"
            );
            let mut row0 = [0u64; 2];
            let mut ep = win.lock(&mut w, t, LockKind::Shared).unwrap();
            ep.read(&mut row0, t, b).unwrap();
            ep.unlock().unwrap();
            assert_eq!(row0, [0, 110], "{flavor:?}");
            w.barrier(&w.comm()).unwrap();
            win.free(&mut w).unwrap();
        });
    }
}

#[test]
fn large_puts_and_gets_between_nodes_go_by_rdma_where_the_netmod_offers_it() {
    job_nodes_with(&[1, 1], true, |mut w| {
        let comm = w.comm();
        let (me, n) = (w.rank(), w.size());
        let t = (me + 1) % n;
        let win = Window::<u64>::allocate(&mut w, &comm, 8192).unwrap();
        let small = [7u64; 4];
        let big: Vec<u64> = (0..8192).map(|i| i * 5 + u64::from(me)).collect();
        let mut back = vec![0u64; 8192];
        let mut few = [0u64; 4];
        {
            let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
            ep.put(&small, t, 0).unwrap();
            ep.flush(t).unwrap();
            assert_eq!(
                super::rdma_transfers(ep.world()),
                0,
                "below NEMESIS_RMA_RDMA_MIN: packets"
            );
            ep.put(&big, t, 0).unwrap();
            ep.flush(t).unwrap();
            assert_eq!(super::rdma_transfers(ep.world()), 1, "a 64 KiB put by RDMA");
            let g = ep.rget(&mut back, t, 0).unwrap();
            let got = ep.wait(g).unwrap();
            assert!(got == big.as_slice());
            ep.read(&mut few, t, 8188).unwrap();
            ep.unlock().unwrap();
        }
        assert_eq!(few, big[8188..]);
        assert_eq!(
            super::rdma_transfers(&w),
            2,
            "the large get too, and not the small read"
        );
        w.barrier(&comm).unwrap();
        win.free(&mut w).unwrap();
    });
}
