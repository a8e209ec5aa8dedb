//! Two-sided messaging between real processes started by `nemesis-run`: a randomised
//! stress test that checks order and contents, collectives, and dead peers.
//!
//! Each child role is an ignored test of this binary (see `tests/common`).

mod common;

use common::*;
use nemesis::p2p::Locality;
use nemesis::{ANY_SOURCE, ANY_TAG, Comm, Op, P2pError, World};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A small deterministic generator, so every rank derives the same plan.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One planned message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Msg {
    src: u32,
    dst: u32,
    tag: i32,
    len: usize,
    /// Its place among the messages from `src` to `dst`.
    seq: u64,
}

fn byte(m: &Msg, i: usize) -> u8 {
    let x = (m.src as u64) << 40 ^ (m.dst as u64) << 32 ^ m.seq << 8 ^ i as u64;
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 29) as u8
}

fn payload(m: &Msg) -> Vec<u8> {
    (0..m.len).map(|i| byte(m, i)).collect()
}

/// Sizes from empty to rendezvous-sized, most of them small.
fn size(mix: &mut Mix) -> usize {
    match mix.below(100) {
        0..=9 => 0,
        10..=54 => 1 + mix.below(64) as usize,
        55..=79 => 65 + mix.below(8160 - 64) as usize,
        80..=94 => 8161 + mix.below(60_000) as usize,
        _ => 70_000 + mix.below(230_000) as usize,
    }
}

/// Every rank's messages of every round, the same on every rank.
fn plan(seed: u64, n: u32, rounds: usize, per_rank: usize) -> Vec<Vec<Msg>> {
    let mut mix = Mix(seed);
    let mut seq = vec![0u64; (n * n) as usize];
    (0..rounds)
        .map(|_| {
            let mut round = Vec::new();
            for src in 0..n {
                for _ in 0..per_rank {
                    let dst = mix.below(u64::from(n)) as u32;
                    let s = &mut seq[(src * n + dst) as usize];
                    round.push(Msg {
                        src,
                        dst,
                        tag: mix.below(4) as i32,
                        len: size(&mut mix),
                        seq: *s,
                    });
                    *s += 1;
                }
            }
            round
        })
        .collect()
}

/// Receives this round's messages to `me`, with selectors drawn at random and checked
/// against MPI's matching rules: a receive gets the first message, in its sender's
/// order, that its source and tag select.
fn receive_round(w: &mut World, c: &Comm, mix: &mut Mix, mine: &[Msg]) -> Result<(), String> {
    let me = w.rank();
    let n = w.size() as usize;
    let mut pending: Vec<VecDeque<Msg>> = vec![VecDeque::new(); n];
    for m in mine {
        pending[m.src as usize].push_back(*m);
    }
    let take = |pending: &mut Vec<VecDeque<Msg>>, src: u32, tag: Option<i32>| -> Option<Msg> {
        let q = &mut pending[src as usize];
        let i = q.iter().position(|m| tag.is_none_or(|t| t == m.tag))?;
        q.remove(i)
    };
    let check = |m: &Msg, st: nemesis::Status, data: &[u8]| -> Result<(), String> {
        if st.source != m.src || st.tag != m.tag || st.len != m.len {
            return Err(format!("rank {me} expected {m:?}, got {st:?}"));
        }
        if data != payload(m).as_slice() {
            return Err(format!("rank {me}: the contents of {m:?} differ"));
        }
        Ok(())
    };
    while pending.iter().any(|q| !q.is_empty()) {
        let srcs: Vec<usize> = (0..n).filter(|&s| !pending[s].is_empty()).collect();
        let s = srcs[mix.below(srcs.len() as u64) as usize] as u32;
        let pick = pending[s as usize][mix.below(pending[s as usize].len() as u64) as usize];
        match mix.below(10) {
            // A batch of posted receives of the next messages from one source, any tag:
            // they match in the order they were posted.
            0 | 1 => {
                let k = pending[s as usize].len().min(1 + mix.below(4) as usize);
                let want: Vec<Msg> = pending[s as usize].drain(..k).collect();
                let mut bufs: Vec<Vec<u8>> = want.iter().map(|m| vec![0u8; m.len]).collect();
                let got: Vec<nemesis::Status> = w
                    .scope(|sc| {
                        let reqs = bufs
                            .iter_mut()
                            .map(|b| sc.irecv(c, s, ANY_TAG, b))
                            .collect::<Result<Vec<_>, _>>()?;
                        Ok::<_, P2pError>(sc.waitall(reqs)?.iter().map(|d| d.status()).collect())
                    })
                    .map_err(|e| e.to_string())?;
                for ((m, st), b) in want.iter().zip(got).zip(&bufs) {
                    check(m, st, b)?;
                }
            }
            // Probe, then receive what the probe saw.
            2 => {
                let st = w.probe(c, s, pick.tag).map_err(|e| e.to_string())?;
                let m = take(&mut pending, s, Some(pick.tag)).expect("pick is pending");
                let mut b = vec![0u8; st.len];
                let got = w.recv(c, s, pick.tag, &mut b).map_err(|e| e.to_string())?;
                check(&m, got, &b)?;
            }
            sel => {
                let (src, tag) = match sel {
                    3 | 4 => (Some(s), Some(pick.tag)),
                    5 | 6 => (Some(s), None),
                    7 | 8 => (None, Some(pick.tag)),
                    _ => (ANY_SOURCE, ANY_TAG),
                };
                // Room for the largest message the selector could match.
                let cap = pending
                    .iter()
                    .enumerate()
                    .filter(|(q, _)| src.is_none_or(|s| s as usize == *q))
                    .flat_map(|(_, q)| q.iter())
                    .filter(|m| tag.is_none_or(|t| t == m.tag))
                    .map(|m| m.len)
                    .max()
                    .unwrap_or(0);
                let mut b = vec![0u8; cap];
                let st = w.recv(c, src, tag, &mut b).map_err(|e| e.to_string())?;
                let m = take(&mut pending, st.source, tag)
                    .ok_or_else(|| format!("rank {me} got {st:?}, which nothing pending matches"))?;
                check(&m, st, &b[..st.len.min(cap)])?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Children

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_stress() {
    child_main(|| {
        let seed: u64 = std::env::var("STRESS_SEED")
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|_| "seed")?;
        let rounds: usize = std::env::var("STRESS_ROUNDS")
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|_| "rounds")?;
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let c = w.comm();
        let (me, n) = (w.rank(), w.size());
        let mut mix = Mix(seed ^ ((u64::from(me) + 1) * 0x1234_5678));
        let start = Instant::now();
        let mut count = 0;
        for (r, round) in plan(seed, n, rounds, 40).iter().enumerate() {
            let outgoing: Vec<(Msg, Vec<u8>)> = round
                .iter()
                .filter(|m| m.src == me)
                .map(|m| (*m, payload(m)))
                .collect();
            let incoming: Vec<Msg> = round.iter().filter(|m| m.dst == me).copied().collect();
            count += incoming.len();
            // Every send is started first, so no pair can wait on each other's sends.
            w.scope(|s| {
                let sends = outgoing
                    .iter()
                    .map(|(m, data)| s.isend(&c, m.dst, m.tag, data))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                receive_round(&mut s.world(), &c, &mut mix, &incoming)?;
                s.waitall(sends).map_err(|e| format!("round {r}: {e}"))?;
                Ok::<_, String>(())
            })?;
            w.barrier(&c).map_err(|e| e.to_string())?;
        }
        println!("rank {me}: {count} messages checked in {:.1?}", start.elapsed());
        Ok(())
    });
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_collectives() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let e = |e: P2pError| e.to_string();
        let c = w.comm();
        let (r, n) = (w.rank(), w.size());
        if w.locality().contains(&Locality::Remote) {
            return Err("expected every rank on this node".into());
        }
        for _ in 0..50 {
            w.barrier(&c).map_err(e)?;
        }
        let mut b = if r == n - 1 {
            (0..70_000u32).collect()
        } else {
            vec![0u32; 70_000]
        };
        w.bcast(&c, n - 1, &mut b).map_err(e)?;
        if b.iter().enumerate().any(|(i, &v)| v != i as u32) {
            return Err("bcast".into());
        }
        let mut s = [r as f64, 1.0];
        w.allreduce(&c, &mut s, Op::Sum).map_err(e)?;
        if s != [(n * (n - 1) / 2) as f64, n as f64] {
            return Err(format!("allreduce gave {s:?}"));
        }
        let mut big = vec![r as u64; 5000];
        w.allreduce(&c, &mut big, Op::Max).map_err(e)?;
        if big.iter().any(|&v| v != u64::from(n - 1)) {
            return Err("large allreduce".into());
        }
        let mut out = [0i64];
        w.reduce(&c, 0, &[i64::from(r) + 1], &mut out, Op::Prod)
            .map_err(e)?;
        if r == 0 && out[0] != (1..=i64::from(n)).product::<i64>() {
            return Err(format!("reduce gave {out:?}"));
        }
        let mut all = vec![0u32; n as usize];
        w.allgather(&c, &[r * 3], &mut all).map_err(e)?;
        if all != (0..n).map(|i| i * 3).collect::<Vec<_>>() {
            return Err(format!("allgather gave {all:?}"));
        }
        let send: Vec<u32> = (0..n).map(|d| r * 1000 + d).collect();
        let mut recv = vec![0u32; n as usize];
        w.alltoall(&c, &send, &mut recv).map_err(e)?;
        if recv != (0..n).map(|s| s * 1000 + r).collect::<Vec<_>>() {
            return Err(format!("alltoall gave {recv:?}"));
        }
        let mut g = vec![0u16; if r == 1 { n as usize } else { 0 }];
        w.gather(&c, 1, &[r as u16], &mut g).map_err(e)?;
        if r == 1 && g != (0..n as u16).collect::<Vec<_>>() {
            return Err(format!("gather gave {g:?}"));
        }
        // Split into odd and even ranks, in reverse order, and use both halves.
        let half = w
            .split(&c, Some(r % 2), -(r as i32))
            .map_err(e)?
            .ok_or("no half")?;
        let mut x = [1u32];
        w.allreduce(&half, &mut x, Op::Sum).map_err(e)?;
        if x[0] != half.size()
            || half.world_rank(0)
                != Some(if r % 2 == 0 {
                    (n - 1) / 2 * 2
                } else {
                    (n - 2) / 2 * 2 + 1
                })
        {
            return Err(format!(
                "split: sum {} of {}, first member {:?}",
                x[0],
                half.size(),
                half.world_rank(0)
            ));
        }
        w.barrier(&half).map_err(e)?;
        let d = w.dup(&c).map_err(e)?;
        w.barrier(&d).map_err(e)?;
        println!("rank {r}: collectives agree");
        Ok(())
    });
}

/// Rank 1 leaves at once, without saying goodbye (`LEAVE=exit`) or dropping its world
/// cleanly (`LEAVE=drop`); rank 0's receives from it and collectives with it fail with
/// `PeerFailed`, each within a bound set by `NEMESIS_FAILURE_TIMEOUT`.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_dead_peer() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let c = w.comm();
        w.barrier(&c).map_err(|e| e.to_string())?;
        if w.rank() == 1 {
            match std::env::var("LEAVE").as_deref() {
                Ok("exit") => std::process::exit(0),
                _ => {
                    drop(w);
                    return Ok(());
                }
            }
        }
        let limit = w.config().failure_check * 5 + Duration::from_secs(2);
        let timed = |what: &str, f: &mut dyn FnMut() -> Result<(), P2pError>| -> Result<(), String> {
            let t = Instant::now();
            match f() {
                Err(P2pError::PeerFailed { rank: 1, reason }) if t.elapsed() < limit => {
                    println!("{what}: rank 1 failed ({reason}) after {:.2?}", t.elapsed());
                    Ok(())
                }
                other => Err(format!(
                    "{what}: expected PeerFailed within {limit:?}, got {other:?} after {:?}",
                    t.elapsed()
                )),
            }
        };
        let mut buf = [0u8; 8];
        timed("recv", &mut || w.recv(&c, 1, 0, &mut buf).map(|_| ()))?;
        timed("recv from any source", &mut || {
            w.recv(&c, ANY_SOURCE, ANY_TAG, &mut buf).map(|_| ())
        })?;
        timed("irecv", &mut || {
            w.scope(|s| s.wait(s.irecv(&c, 1, 5, &mut buf)?).map(|_| ()))
        })?;
        let big = vec![1u8; 100_000];
        timed("rendezvous send", &mut || w.send(&c, 1, 0, &big))?;
        timed("barrier", &mut || w.barrier(&c))?;
        timed("allreduce", &mut || w.allreduce(&c, &mut [1u32], Op::Sum))?;
        Ok(())
    });
}

/// Rank 0 starts a large send and exits part way through it, without a goodbye; rank
/// 1's receive fails with the peer's failure within a bound set by
/// `NEMESIS_FAILURE_TIMEOUT`, whatever strategy (`NEMESIS_LMT`) moves it.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_dies_mid_transfer() {
    const LEN: usize = 512 << 20;
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let c = w.comm();
        if w.rank() == 0 {
            let data = vec![7u8; LEN];
            let mut go = [0u8; 1];
            w.recv(&c, 1, 9, &mut go).map_err(|e| e.to_string())?;
            w.scope(|s| {
                let mut r = s.isend(&c, 1, 1, &data).map_err(|e| e.to_string())?;
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(5) {
                    if s.test(&mut r).map_err(|e| e.to_string())? {
                        return Err("the whole message moved before the sender could die".to_string());
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                std::process::exit(0)
            })?;
            return Ok(());
        }
        let limit = w.config().failure_check * 5 + Duration::from_secs(2);
        let mut buf = vec![0u8; LEN];
        w.scope(|s| {
            let r = s.irecv(&c, 0, 1, &mut buf).map_err(|e| e.to_string())?;
            s.world().send(&c, 0, 9, &[1]).map_err(|e| e.to_string())?;
            let t = Instant::now();
            match s.wait(r) {
                Err(P2pError::PeerFailed { rank: 0, reason }) if t.elapsed() < limit => {
                    println!(
                        "receive failed: rank 0 failed ({reason}) after {:.2?}",
                        t.elapsed()
                    );
                    Ok(())
                }
                Err(P2pError::Transfer { rank: 0, source }) if t.elapsed() < limit => {
                    println!(
                        "receive failed: the transfer failed ({source}) after {:.2?}",
                        t.elapsed()
                    );
                    Ok(())
                }
                Err(e) => Err(format!("unexpected error after {:.2?}: {e}", t.elapsed())),
                Ok(st) => Err(format!(
                    "a receive of {} bytes completed from a dead sender",
                    st.status().len
                )),
            }
        })
    });
}

// ---------------------------------------------------------------------------------
// Tests

#[test]
fn randomised_stress_keeps_order_and_contents() {
    let dir = shm_dir("p2p-stress");
    let seed = std::env::var("STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026u64);
    let o = run(4, "stress", &dir)
        .env("STRESS_SEED", seed.to_string())
        .env("STRESS_ROUNDS", "150")
        .output()
        .unwrap();
    assert!(o.status.success(), "seed {seed}\n{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("messages checked").count(), 4, "{}", text(&o));
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn stress_with_every_message_through_rendezvous_and_no_node_collectives() {
    let dir = shm_dir("p2p-stress-rndv");
    let o = run(3, "stress", &dir)
        .env("STRESS_SEED", "7")
        .env("STRESS_ROUNDS", "8")
        .env("NEMESIS_EAGER_LIMIT", "0")
        .env("NEMESIS_NODE_COLLECTIVES", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .matches("messages checked")
            .count(),
        3,
        "{}",
        text(&o)
    );
}

/// The strategies that can run here, as `NEMESIS_LMT` names them.
fn lmt_strategies() -> Vec<&'static str> {
    let mut v = vec!["chunks", "ring", "vmsplice"];
    if nemesis::lmt::cma::probe().is_ok() {
        v.extend(["cma", "cma-put"]);
    } else {
        eprintln!("CMA is not permitted here: cma and cma-put are not tested");
    }
    v
}

#[test]
fn stress_through_every_large_message_strategy() {
    for lmt in lmt_strategies() {
        let dir = shm_dir(&format!("p2p-stress-{lmt}"));
        let o = run(3, "stress", &dir)
            .env("STRESS_SEED", "11")
            .env("STRESS_ROUNDS", "12")
            .env("NEMESIS_LMT", lmt)
            .output()
            .unwrap();
        assert!(o.status.success(), "{lmt}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout)
                .matches("messages checked")
                .count(),
            3,
            "{lmt}: {}",
            text(&o)
        );
        assert!(leftovers(&dir).is_empty(), "{lmt}: {:?}", leftovers(&dir));
    }
}

#[test]
fn a_sender_dying_mid_transfer_fails_the_receive_in_bounded_time() {
    for lmt in lmt_strategies().into_iter().chain(["auto"]) {
        let dir = shm_dir(&format!("p2p-dies-{lmt}"));
        let o = run(2, "dies_mid_transfer", &dir)
            .env("NEMESIS_LMT", lmt)
            .env("NEMESIS_FAILURE_TIMEOUT", "0.2")
            .output()
            .unwrap();
        assert!(o.status.success(), "{lmt}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("receive failed:"),
            "{lmt}: {}",
            text(&o)
        );
        assert!(leftovers(&dir).is_empty(), "{lmt}: {:?}", leftovers(&dir));
    }
}

#[test]
fn collectives_between_processes() {
    let dir = shm_dir("p2p-coll");
    for n in [2, 5] {
        let o = run(n, "collectives", &dir).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout)
                .matches("collectives agree")
                .count(),
            n as usize,
            "{}",
            text(&o)
        );
    }
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn a_dead_peer_fails_receives_sends_and_collectives_in_bounded_time() {
    let dir = shm_dir("p2p-dead");
    for leave in ["exit", "drop"] {
        let o = run(2, "dead_peer", &dir)
            .env("LEAVE", leave)
            .env("NEMESIS_FAILURE_TIMEOUT", "0.2")
            .output()
            .unwrap();
        assert!(o.status.success(), "{leave}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        for what in [
            "recv:",
            "recv from any source:",
            "irecv:",
            "rendezvous send:",
            "barrier:",
            "allreduce:",
        ] {
            assert!(out.contains(what), "{leave}: {what} missing\n{}", text(&o));
        }
        let reason = if leave == "exit" { "is gone" } else { "has left" };
        assert!(out.contains(reason), "{leave}: {}", text(&o));
    }
}
