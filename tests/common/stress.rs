//! The randomised two-sided stress test that several test binaries run as a child role:
//! every rank derives the same plan of messages from a seed, sends its own, and receives
//! its share with random selectors, posted batches and probes, checking each against
//! MPI's matching rules and for its contents.

use nemesis::{ANY_SOURCE, ANY_TAG, Comm, P2pError, World};
use std::collections::VecDeque;
use std::time::Instant;

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

/// The tag of the relayed messages, which no planned message has.
const RELAY_TAG: i32 = 7;
/// Tag of the word a rank sends its predecessor on the ring as it starts to wait.
const READY_TAG: i32 = 6;

/// Passes a message of a length drawn from the seed around the ring of ranks, from a
/// rank drawn too: every rank waits in a blocking receive naming its source before the
/// message is sent to it (it says so first, and its predecessor waits for the word), so
/// a long one over tcp lands straight in the receive buffer while it arrives, however
/// late a loaded machine schedules the receiver. Returns how many messages this rank
/// checked.
fn relay(w: &mut World, c: &Comm, seed: u64, round: usize) -> Result<usize, String> {
    let (me, n) = (w.rank(), w.size());
    if n < 2 {
        return Ok(0);
    }
    let mut mix = Mix(seed ^ (round as u64 + 1).wrapping_mul(0x51_7cc1_b727_220a));
    let start = mix.below(u64::from(n)) as u32;
    // From short to past the eager limit, most of them long enough to land.
    let len = match mix.below(4) {
        0 => mix.below(16 * 1024) as usize,
        _ => 16 * 1024 + mix.below(112 * 1024) as usize,
    };
    let (prev, next) = ((me + n - 1) % n, (me + 1) % n);
    let hop = |src: u32, dst: u32| Msg {
        src,
        dst,
        tag: RELAY_TAG,
        len,
        seq: 1 << 32 | round as u64,
    };
    let pass = |w: &mut World| -> Result<(), String> {
        let mut ready = [0u8; 1];
        w.recv(c, next, READY_TAG, &mut ready)
            .map_err(|e| e.to_string())?;
        w.send(c, next, RELAY_TAG, &payload(&hop(me, next)))
            .map_err(|e| e.to_string())
    };
    if me == start {
        pass(w)?;
    }
    let m = hop(prev, me);
    let mut b = vec![0u8; len];
    w.send(c, prev, READY_TAG, &[1]).map_err(|e| e.to_string())?;
    let st = w.recv(c, prev, RELAY_TAG, &mut b).map_err(|e| e.to_string())?;
    if st.source != prev || st.tag != RELAY_TAG || st.len != len {
        return Err(format!("rank {me} expected {m:?} on the relay, got {st:?}"));
    }
    if b != payload(&m) {
        return Err(format!("rank {me}: the contents of the relayed {m:?} differ"));
    }
    if me != start {
        pass(w)?;
    }
    Ok(1)
}

/// A child's part: `STRESS_SEED` and `STRESS_ROUNDS` say what to run; prints
/// "rank R: N messages checked" on success.
pub fn child() -> Result<(), String> {
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
        count += relay(&mut w, &c, seed, r)?;
    }
    println!("rank {me}: {count} messages checked in {:.1?}", start.elapsed());
    println!("rank {me}: eager limit {}", w.config().eager_limit);
    let s = w.send_counts();
    println!(
        "rank {me}: sent paired {} paired_short {} paired_long {} medium_packets {} rendezvous {} stream_rendezvous {} stream_packets {} stream_own_copies {}",
        s.paired,
        s.paired_short,
        s.paired_long,
        s.medium_packets,
        s.rendezvous,
        s.stream_rendezvous,
        s.stream_packets,
        s.stream_own_copies
    );
    if let Some(s) = w.channel().net_stats() {
        println!("rank {me}: rdma moved {} bytes", s.rdma_bytes);
        println!("rank {me}: landed {}", s.packets_landed);
    }
    Ok(())
}
