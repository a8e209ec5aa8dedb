//! Windows whose atomics the card runs, on the in-memory RDMA double (whose atomics are
//! one set for the whole job, as a card's are): two ranks sharing a node and one alone,
//! so members are reached through memory, by messages and by the device at once.

use super::super::*;
use crate::p2p::World;
use crate::testkit::{job, job_nodes_with};
use crate::{Header, ProtocolId};

fn card_job(f: impl Fn(World) + Send + Sync + Clone + 'static) {
    job_nodes_with(&[2, 1], true, f);
}

fn windows(w: &mut World, len: usize) -> [Window<u64>; 2] {
    let comm = w.comm();
    [
        Window::<u64>::allocate_with(w, &comm, len, Executor::Nic).unwrap(),
        Window::create_with(w, &comm, vec![0u64; len], Executor::Nic).unwrap(),
    ]
}

#[test]
fn every_update_and_lock_of_every_member_runs_on_the_card() {
    card_job(|mut w| {
        let comm = w.comm();
        let (me, n) = (w.rank(), w.size());
        for win in windows(&mut w, 4) {
            assert_eq!(win.executor(), Executor::Nic);
            assert!(win.local_atomics().is_none(), "no CPU view of the card's words");
            // Fetch-and-add from everyone onto every member, its owner included: each
            // value handed out once.
            const K: u64 = 20;
            let mut olds = Vec::new();
            for t in 0..n {
                let mut ep = win.lock(&mut w, t, LockKind::Shared).unwrap();
                for _ in 0..K {
                    olds.push(ep.fetch_and_op(1, t, 0, AccOp::Sum).unwrap());
                }
                ep.unlock().unwrap();
            }
            let mut all = vec![0u64; olds.len() * n as usize];
            w.allgather(&comm, &olds, &mut all).unwrap();
            for t in 0..n as usize {
                let mut seen: Vec<u64> = (0..n as usize)
                    .flat_map(|r| all[r * olds.len() + t * K as usize..][..K as usize].to_vec())
                    .collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..K * u64::from(n)).collect::<Vec<_>>(), "member {t}");
            }
            // A read-modify-write of plain gets and puts under exclusive locks: the
            // counter word excludes, or increments are lost.
            for _ in 0..10 {
                for t in 0..n {
                    let mut ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
                    let mut v = [0u64];
                    ep.read(&mut v, t, 1).unwrap();
                    ep.put(&[v[0] + 1], t, 1).unwrap();
                    ep.unlock().unwrap();
                }
            }
            // Operations the card has no atomic for: a loop of compare-and-swaps.
            let mut before = vec![[0u64]; n as usize];
            let mut ep = win.lock_all(&mut w).unwrap();
            for (t, b) in (0..n).zip(before.iter_mut()) {
                ep.accumulate(&[u64::from(me) + 5], t, 2, AccOp::Max).unwrap();
                ep.get_accumulate(&[3], b, t, 3, AccOp::Sum).unwrap();
            }
            ep.unlock_all().unwrap();
            assert!(before.iter().all(|b| b[0] % 3 == 0 && b[0] < 3 * u64::from(n)));
            w.barrier(&comm).unwrap();
            let mut ep = win.lock(&mut w, me, LockKind::Shared).unwrap();
            let mut mine = [0u64; 4];
            ep.read(&mut mine, me, 0).unwrap();
            let swapped = ep.compare_and_swap(mine[3], 1, me, 3).unwrap();
            assert_eq!(swapped, mine[3]);
            let noop = ep.fetch_and_op(0, me, 3, AccOp::NoOp).unwrap();
            ep.unlock().unwrap();
            assert_eq!(
                mine,
                [
                    K * u64::from(n),
                    10 * u64::from(n),
                    u64::from(n) + 4,
                    3 * u64::from(n)
                ],
                "rank {me}"
            );
            assert_eq!(noop, 1);
            w.barrier(&comm).unwrap();
            assert_eq!(
                nic::lock_word(win.nic.as_ref().unwrap()),
                0,
                "a lock word left held"
            );
            win.free(&mut w).unwrap();
        }
    });
}

#[test]
fn floating_point_updates_run_as_compare_and_swap_loops() {
    card_job(|mut w| {
        let comm = w.comm();
        let n = w.size();
        let win = Window::<f64>::allocate_with(&mut w, &comm, 1, Executor::Nic).unwrap();
        let mut ep = win.lock(&mut w, 0, LockKind::Shared).unwrap();
        for _ in 0..10 {
            ep.accumulate(&[0.5], 0, 0, AccOp::Sum).unwrap();
        }
        ep.unlock().unwrap();
        w.barrier(&comm).unwrap();
        if w.rank() == 0 {
            let mut ep = win.lock(&mut w, 0, LockKind::Shared).unwrap();
            let v = ep.fetch_and_op(0.0, 0, 0, AccOp::NoOp).unwrap();
            ep.unlock().unwrap();
            assert_eq!(v, 5.0 * f64::from(n));
        }
        win.free(&mut w).unwrap();
    });
}

#[test]
fn a_window_the_card_cannot_run_is_refused_at_every_member() {
    // Elements of 4 bytes, a dynamic window, a channel without RDMA atomics, members
    // that disagree on the executor.
    card_job(|mut w| {
        let comm = w.comm();
        let e = Window::<u32>::allocate_with(&mut w, &comm, 4, Executor::Nic).unwrap_err();
        assert!(
            matches!(&e, RmaError::InvalidArgument(m) if m.contains("8-byte")),
            "{e}"
        );
        let e = if w.rank() == 1 {
            Window::<u64>::allocate_with(&mut w, &comm, 1, Executor::Nic)
        } else {
            Window::<u64>::allocate(&mut w, &comm, 1)
        }
        .unwrap_err();
        assert!(matches!(e, RmaError::CollectiveMismatch(_)), "{e}");
    });
    job(2, |mut w| {
        let comm = w.comm();
        let e = Window::<u64>::allocate_with(&mut w, &comm, 4, Executor::Nic).unwrap_err();
        assert!(
            matches!(&e, RmaError::InvalidArgument(m) if m.contains("no RDMA atomics")),
            "{e}"
        );
    });
}

#[test]
fn updates_by_message_on_a_card_window_are_refused_by_the_target() {
    card_job(|mut w| {
        let comm = w.comm();
        let (me, n) = (w.rank(), w.size());
        let win = Window::<u64>::allocate_with(&mut w, &comm, 2, Executor::Nic).unwrap();
        let t = (me + 1) % n;
        let mut acc = wire::acc_head(wire::AccHead {
            disp: 0,
            tag: win.type_tag,
            code: <u64 as crate::op::Reducible>::TYPE_CODE,
            op: AccOp::Sum.code(),
        })
        .to_vec();
        acc.extend_from_slice(&7u64.to_ne_bytes());
        let h = Header {
            kind: u16::from(wire::ACC),
            context: win.id,
            ..Header::default()
        };
        w.core.send(ProtocolId::RMA, t, h, &[&acc]).unwrap();
        let id = win.id;
        let seen = |w: &mut World| window::rma(w).slot(id).unwrap().origin.refusals_seen;
        assert!(
            w.progress_until(Some(std::time::Duration::from_secs(20)), |w| seen(w) >= 1)
                .unwrap()
        );
        let ep = win.lock(&mut w, t, LockKind::Exclusive).unwrap();
        let e = ep.unlock().unwrap_err();
        assert!(
            matches!(
                e,
                RmaError::Refused {
                    why: wire::Refusal::CardExecutes,
                    ..
                }
            ),
            "{e}"
        );
        w.barrier(&comm).unwrap();
        let mut ep = win.lock(&mut w, me, LockKind::Shared).unwrap();
        let v = ep.fetch_and_op(0, me, 0, AccOp::NoOp).unwrap();
        ep.unlock().unwrap();
        assert_eq!(v, 0, "the target's CPU updated a word of the card's");
        win.free(&mut w).unwrap();
    });
}
