use super::*;
use crate::sim::{SimConfig, SimNet, SimSocket};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::time::Duration;

const BASE: u32 = 100;
const JOB: JobKey = JobKey::from_bytes([0xf1; crate::auth::KEY_LEN]);

type Got = Vec<(u32, Envelope, Vec<u8>)>;

fn endpoint(net: &SimNet, rank: u32, size: u32, cfg: ReliableConfig) -> Reliable<SimSocket> {
    let resolve = Box::new(move |r: u32| {
        if r < size {
            Ok(BASE + r)
        } else {
            Err(NetError::BadCard {
                rank: r,
                reason: "no such rank".into(),
            })
        }
    });
    Reliable::new(net.socket(BASE + rank), rank, size, JOB, cfg, resolve)
        .unwrap()
        .quiet()
}

fn small(window: u32, initial_seq: u32) -> ReliableConfig {
    ReliableConfig {
        window,
        initial_seq,
        max_message: 4096,
        ..ReliableConfig::default()
    }
}

/// Polls the live endpoints, then moves the clock to the next thing that happens.
fn step(net: &SimNet, eps: &mut [Reliable<SimSocket>], got: &mut [Got], live: &[bool]) {
    for (i, ep) in eps.iter_mut().enumerate() {
        if live[i] {
            let g = &mut got[i];
            ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
        }
    }
    let mut next = net.next_arrival();
    for (i, ep) in eps.iter().enumerate() {
        if live[i]
            && let Some(d) = ep.next_deadline()
        {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
    }
    if let Some(t) = next {
        net.advance_to(t.max(net.now()));
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

/// Every endpoint sends `plan[src]` (destination, envelope, bytes) in order, retrying
/// on Again; returns what each received.
fn run(
    net: &SimNet,
    eps: &mut [Reliable<SimSocket>],
    plan: &[Vec<(u32, Envelope, Vec<u8>)>],
    limit_s: u64,
) -> Vec<Got> {
    let n = eps.len();
    let live = vec![true; n];
    let mut got: Vec<Got> = vec![Vec::new(); n];
    // Per sender and destination, the index of the next message to send.
    let mut queues: Vec<Vec<VecDeque<usize>>> = vec![vec![VecDeque::new(); n]; n];
    for (s, msgs) in plan.iter().enumerate() {
        for (i, m) in msgs.iter().enumerate() {
            queues[s][m.0 as usize].push_back(i);
        }
    }
    let want: usize = plan.iter().map(Vec::len).sum();
    let mut rounds = 0u64;
    loop {
        for (s, (ep, to_each)) in eps.iter_mut().zip(&mut queues).enumerate() {
            for q in to_each.iter_mut() {
                while let Some(&i) = q.front() {
                    let (to, env, data) = &plan[s][i];
                    let halves = data.split_at(data.len() / 2);
                    match ep.send(*to, env, &[halves.0, halves.1]).unwrap() {
                        Accept::Sent => {
                            q.pop_front();
                        }
                        Accept::Again => break,
                    }
                }
            }
        }
        let received: usize = got.iter().map(Vec::len).sum();
        let queued: usize = queues.iter().flatten().map(VecDeque::len).sum();
        if received == want && queued == 0 && eps.iter().all(|e| e.backlog() == 0) {
            break;
        }
        step(net, eps, &mut got, &live);
        rounds += 1;
        assert!(
            net.now() < limit_s * 1_000_000_000 && rounds < 2_000_000,
            "stuck at {} ns after {rounds} rounds: received {received} of {want}, backlogs {:?}, {:?}",
            net.now(),
            eps.iter().map(Reliable::backlog).collect::<Vec<_>>(),
            net.stats()
        );
    }
    got
}

fn check(plan: &[Vec<(u32, Envelope, Vec<u8>)>], got: &[Got]) {
    for (d, g) in got.iter().enumerate() {
        for (s, msgs) in plan.iter().enumerate() {
            let sent: Vec<(Envelope, &[u8])> = msgs
                .iter()
                .filter(|m| m.0 as usize == d)
                .map(|m| (m.1, &m.2[..]))
                .collect();
            let came: Vec<(Envelope, &[u8])> = g
                .iter()
                .filter(|m| m.0 as usize == s)
                .map(|m| (m.1, &m.2[..]))
                .collect();
            assert_eq!(came.len(), sent.len(), "{s} -> {d}: count");
            assert!(came == sent, "{s} -> {d}: contents or order differ");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lossy_networks_deliver_exactly_once_in_order(
        seed in any::<u64>(),
        loss in 0.0..0.2f64,
        duplicate in 0.0..0.05f64,
        reorder in 0.0..0.3f64,
        delay_us in 1u64..2_000,
        jitter_us in 0u64..1_000,
        n in 2u32..=4,
        window in 2u32..=16,
        below_wrap in 0u32..48,
        max_datagram in 80usize..400,
        msgs in 1usize..40,
    ) {
        let net = SimNet::new(SimConfig {
            seed,
            loss,
            duplicate,
            reorder,
            delay: Duration::from_micros(delay_us),
            jitter: Duration::from_micros(jitter_us),
            max_datagram,
        });
        let cfg = ReliableConfig {
            timeout: Duration::from_secs(120),
            ..small(window, u32::MAX - below_wrap)
        };
        let mut eps: Vec<_> = (0..n).map(|r| endpoint(&net, r, n, cfg.clone())).collect();
        let rest = max_datagram - HEADER_LEN;
        let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let plan: Vec<Vec<(u32, Envelope, Vec<u8>)>> = (0..n)
            .map(|s| {
                (0..msgs)
                    .map(|_| {
                        let to = (s + 1 + (rnd() % u64::from(n - 1)) as u32) % n;
                        let len = (rnd() % (3 * rest as u64 + 1)) as usize;
                        let env = [rnd(), rnd()];
                        (to, env, bytes(rnd(), len))
                    })
                    .collect()
            })
            .collect();
        let got = run(&net, &mut eps, &plan, 600);
        check(&plan, &got);
        for ep in &eps {
            prop_assert_eq!(ep.backlog(), 0);
            for p in ep.peers.iter().flatten() {
                prop_assert!(p.active());
                // Nothing in flight keeps memory.
                prop_assert!(p.queue.capacity() == 0 && p.held.capacity() == 0 && p.reasm.is_none());
            }
        }
    }

    #[test]
    fn decode_header_takes_anything(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_header(&buf);
    }

    #[test]
    fn decode_header_takes_mangled_headers(
        kind in 1u8..=3, flags in 0u8..16, count in 0u32..64, seq in any::<u32>(),
        cut in 0usize..130, byte in 0usize..60, val in any::<u8>(),
    ) {
        let h = Header {
            kind: [Kind::Data, Kind::Ack, Kind::Nack][kind as usize - 1],
            flags, token: 7, src: 1, dst: 2, seq, ack: seq, count,
            start: (flags & FLAG_FIRST != 0).then_some(Start { env: [1, 2], total: count }),
        };
        let mut b = [0u8; MAX_HEADER_LEN];
        let n = encode_header(&h, &mut b);
        let mut v = b[..n].to_vec();
        v.resize(n + count as usize, 0xab);
        v.truncate(cut);
        if let Some(x) = v.get_mut(byte) {
            *x = val;
        }
        let _ = decode_header(&v);
    }

    #[test]
    fn headers_round_trip(
        kind in 0usize..3, flag_pick in 0usize..6, token in any::<u64>(), src in any::<u32>(),
        dst in any::<u32>(), seq in any::<u32>(), ack in any::<u32>(), count in 1u32..300,
        env in any::<[u64; 2]>(), extra in 0u32..300,
    ) {
        let kind = [Kind::Data, Kind::Ack, Kind::Nack][kind];
        let (flags, count, start, seq, ack) = match kind {
            Kind::Ack => (0, 0, None, 0, ack),
            Kind::Nack => (0, count, None, seq, seq),
            Kind::Data => {
                let flags = [0, FLAG_LAST, FLAG_FIRST, FLAG_FIRST | FLAG_LAST, FLAG_BYE, FLAG_PING][flag_pick];
                let count = if flags & FLAGS_CONTROL != 0 { 0 } else { count };
                let start = (flags & FLAG_FIRST != 0).then_some(Start {
                    env,
                    total: if flags & FLAG_LAST != 0 { count } else { count + 1 + extra },
                });
                (flags, count, start, seq, ack)
            }
        };
        let h = Header { kind, flags, token, src, dst, seq, ack, count, start };
        let mut b = [0u8; MAX_HEADER_LEN];
        let n = encode_header(&h, &mut b);
        prop_assert_eq!(n, h.encoded_len());
        let mut v = b[..n].to_vec();
        if kind == Kind::Data {
            v.resize(n + count as usize, 0x5a);
        }
        prop_assert_eq!(decode_header(&v), Ok(h));
        // One byte short, or one too many.
        prop_assert_eq!(decode_header(&v[..v.len() - 1]), Err(DropReason::Truncated));
        v.push(0);
        prop_assert_eq!(decode_header(&v), Err(DropReason::Malformed));
    }
}

fn net(seed: u64) -> SimNet {
    SimNet::new(SimConfig {
        seed,
        delay: Duration::from_micros(50),
        max_datagram: 200,
        ..SimConfig::default()
    })
}

/// Drives `eps` until `done` or `limit_ns` of virtual time.
fn drive(
    net: &SimNet,
    eps: &mut [Reliable<SimSocket>],
    got: &mut [Got],
    live: &[bool],
    limit_ns: u64,
    mut done: impl FnMut(&[Reliable<SimSocket>], &[Got]) -> bool,
) {
    let end = net.now() + limit_ns;
    let mut rounds = 0;
    while !done(eps, got) {
        assert!(
            net.now() < end && rounds < 1_000_000,
            "not done by {} ns",
            net.now()
        );
        step(net, eps, got, live);
        rounds += 1;
    }
}

#[test]
fn sequence_numbers_wrap() {
    let net = net(1);
    let cfg = small(4, u32::MAX - 2);
    let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
    let plan = vec![
        (0..12).map(|i| (1, [i, 0], bytes(i, 300))).collect(),
        (0..5).map(|i| (0, [i, 1], bytes(i, 10))).collect(),
    ];
    let got = run(&net, &mut eps, &plan, 10);
    check(&plan, &got);
    assert_eq!(eps[0].stats().packets_sent, 12);
    assert_eq!(eps[1].stats().packets_received, 12);
    assert_eq!(eps[0].stats().retransmits, 0);
    let p = eps[0].peers[1].as_deref().unwrap();
    assert!(p.una < 100, "wrapped: {}", p.una);
}

#[test]
fn sends_are_checked() {
    let net = net(2);
    let mut a = endpoint(&net, 0, 3, small(4, 0));
    let e = [0, 0];
    assert!(matches!(
        a.send(3, &e, &[]),
        Err(NetError::InvalidRank { rank: 3, size: 3 })
    ));
    assert!(matches!(
        a.send(0, &e, &[]),
        Err(NetError::InvalidRank { rank: 0, .. })
    ));
    let big = vec![0u8; 4097];
    assert!(matches!(
        a.send(1, &e, &[&big]),
        Err(NetError::TooLarge { len: 4097, max: 4096 })
    ));
    assert_eq!(a.backlog(), 0);
    // A rank whose address cannot be had.
    let mut b = Reliable::new(
        net.socket(BASE + 7),
        0,
        2,
        JOB,
        small(4, 0),
        Box::new(|r| {
            Err(NetError::BadCard {
                rank: r,
                reason: "none".into(),
            })
        }),
    )
    .unwrap();
    assert!(matches!(
        b.send(1, &e, &[]),
        Err(NetError::BadCard { rank: 1, .. })
    ));
    assert!(b.check_peer(5).is_err());
    // Bad configurations.
    for cfg in [
        ReliableConfig {
            window: 0,
            ..ReliableConfig::default()
        },
        ReliableConfig {
            rto_min: Duration::ZERO,
            ..ReliableConfig::default()
        },
        ReliableConfig {
            timeout: Duration::ZERO,
            ..ReliableConfig::default()
        },
    ] {
        assert!(matches!(
            Reliable::new(net.socket(BASE + 8), 0, 2, JOB, cfg, Box::new(|_| Ok(0))),
            Err(NetError::Config { .. })
        ));
    }
    assert!(matches!(
        Reliable::new(
            net.socket(BASE + 8),
            2,
            2,
            JOB,
            ReliableConfig::default(),
            Box::new(|_| Ok(0))
        ),
        Err(NetError::InvalidRank { rank: 2, size: 2 })
    ));
}

#[test]
fn back_pressure_takes_nothing_and_everything_arrives_later() {
    let net = net(3);
    let cfg = small(4, 10);
    let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
    let env = [9, 9];
    // 350 bytes are 3 segments of a 200-byte datagram.
    let msg = bytes(5, 350);
    let mut accepted = 0;
    let mut live = [true, false];
    let mut got = vec![Vec::new(), Vec::new()];
    loop {
        let before = eps[0].backlog();
        match eps[0].send(1, &env, &[&msg]).unwrap() {
            Accept::Sent => accepted += 1,
            Accept::Again => {
                assert_eq!(eps[0].backlog(), before, "nothing taken on Again");
                break;
            }
        }
        assert!(accepted < 10);
    }
    assert_eq!(accepted, 2, "a window of 4 takes two 3-segment messages");
    assert_eq!(eps[0].backlog(), 6);
    // The receiver is busy: time passes, nothing is lost, sends still bounce.
    for _ in 0..10 {
        step(&net, &mut eps, &mut got, &live);
    }
    assert_eq!(eps[0].send(1, &env, &[&msg]).unwrap(), Accept::Again);
    assert!(eps[0].stats().retransmits > 0);
    live[1] = true;
    let mut total = accepted;
    drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |eps, got| {
        got[1].len() == total && eps[0].backlog() == 0
    });
    while total < 6 {
        if eps[0].send(1, &env, &[&msg]).unwrap() == Accept::Sent {
            total += 1;
        }
        step(&net, &mut eps, &mut got, &live);
    }
    drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |eps, got| {
        got[1].len() == 6 && eps[0].backlog() == 0
    });
    assert!(got[1].iter().all(|(s, e, b)| *s == 0 && *e == env && *b == msg));
    assert!(
        eps[1].stats().duplicates > 0,
        "the early retransmissions were duplicates"
    );
}

#[test]
fn a_vanished_peer_fails_after_the_timeout() {
    let net = net(4);
    let cfg = ReliableConfig {
        timeout: Duration::from_secs(2),
        ..small(8, 0)
    };
    let mut eps = vec![
        endpoint(&net, 0, 3, cfg.clone()),
        endpoint(&net, 1, 3, cfg.clone()),
    ];
    eps.push(endpoint(&net, 2, 3, cfg));
    let mut got = vec![Vec::new(); 3];
    let live = [true, true, true];
    eps[0].send(1, &[1, 1], &[b"hello"]).unwrap();
    drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, g| {
        g[1].len() == 1 && e[0].backlog() == 0
    });
    // Rank 1 vanishes; rank 0 has something outstanding to it.
    net.close(BASE + 1);
    let live = [true, false, true];
    let t0 = net.now();
    eps[0].send(1, &[2, 2], &[b"anyone?"]).unwrap();
    assert_eq!(eps[0].backlog(), 1);
    eps[0].check_peer(1).unwrap();
    drive(&net, &mut eps, &mut got, &live, 10_000_000_000, |e, _| {
        e[0].check_peer(1).is_err()
    });
    let waited = net.now() - t0;
    assert!(
        (2_000_000_000..2_100_000_000).contains(&waited),
        "failed after {waited} ns"
    );
    assert_eq!(eps[0].backlog(), 0, "its queue is discarded");
    let e = eps[0].send(1, &[3, 3], &[b"x"]).unwrap_err();
    assert!(
        matches!(&e, NetError::PeerFailed { rank: 1, reason } if reason.contains("acknowledged nothing")),
        "{e}"
    );
    // Backing off: a handful of resends in two seconds, not hundreds.
    let r = eps[0].stats().retransmits;
    assert!((4..=20).contains(&r), "{r} retransmits");

    // Rank 2 only waits to hear from rank 1: the probe finds it.
    let t1 = net.now();
    drive(&net, &mut eps, &mut got, &live, 10_000_000_000, |e, _| {
        e[2].check_peer(1).is_err()
    });
    let waited = net.now() - t1;
    assert!(waited <= 2_300_000_000, "found after {waited} ns");
    assert!(matches!(
        eps[2].check_peer(1),
        Err(NetError::PeerFailed { rank: 1, .. })
    ));
    // And the living are fine.
    eps[0].check_peer(2).unwrap();
    eps[2].check_peer(0).unwrap();
}

#[test]
fn a_peer_that_stops_polling_fails_too() {
    let net = net(5);
    let cfg = ReliableConfig {
        timeout: Duration::from_millis(500),
        ..small(8, 0)
    };
    let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
    let mut got = vec![Vec::new(); 2];
    let live = [true, false];
    eps[0].send(1, &[1, 1], &[&[7u8; 500][..]]).unwrap();
    drive(&net, &mut eps, &mut got, &live, 2_000_000_000, |e, _| {
        e[0].check_peer(1).is_err()
    });
    assert!(got[1].is_empty());
    assert_eq!(eps[0].backlog(), 0);
}

#[test]
fn goodbye_marks_the_peer_as_left() {
    let net = net(6);
    let cfg = small(4, 0);
    let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
    let mut got = vec![Vec::new(); 2];
    let live = [true, true];
    eps[0].send(1, &[1, 2], &[b"before"]).unwrap();
    eps[1].send(0, &[3, 4], &[b"reply"]).unwrap();
    drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, g| {
        g[0].len() == 1 && g[1].len() == 1 && e.iter().all(|e| e.backlog() == 0)
    });
    eps[0].begin_shutdown();
    assert!(!eps[0].shutdown_done());
    let e = eps[0].send(1, &[0, 0], &[]).unwrap_err();
    assert!(e.to_string().contains("shutting down"), "{e}");
    drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, _| {
        e[0].shutdown_done()
    });
    let e = eps[1].check_peer(0).unwrap_err();
    assert!(
        matches!(&e, NetError::PeerFailed { rank: 0, reason } if reason.contains("left")),
        "{e}"
    );
    assert!(matches!(
        eps[1].send(0, &[0, 0], &[]),
        Err(NetError::PeerFailed { rank: 0, .. })
    ));
    assert_eq!(eps[0].backlog(), 0);
    assert_eq!(eps[1].backlog(), 0);
    eps[1].begin_shutdown();
    assert!(eps[1].shutdown_done(), "no goodbye to a peer that left");
}

#[test]
fn goodbyes_cross() {
    let net = SimNet::new(SimConfig {
        seed: 7,
        loss: 0.3,
        delay: Duration::from_micros(50),
        max_datagram: 200,
        ..SimConfig::default()
    });
    let cfg = small(4, 0);
    let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
    let mut got = vec![Vec::new(); 2];
    let live = [true, true];
    eps[0].send(1, &[1, 2], &[b"x"]).unwrap();
    eps[1].send(0, &[1, 2], &[b"y"]).unwrap();
    drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |e, _| {
        e.iter().all(|e| e.backlog() == 0)
    });
    eps[0].begin_shutdown();
    eps[1].begin_shutdown();
    drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |e, _| {
        e.iter().all(Reliable::shutdown_done)
    });
}

/// A raw socket at rank 0's address, speaking to a real endpoint at rank 1.
struct Raw {
    net: SimNet,
    sock: SimSocket,
    ep: Reliable<SimSocket>,
    got: Got,
}

impl Raw {
    fn new(window: u32, initial_seq: u32) -> Self {
        let net = net(8);
        let sock = net.socket(BASE);
        let ep = endpoint(&net, 1, 3, small(window, initial_seq));
        Self {
            net,
            sock,
            ep,
            got: Vec::new(),
        }
    }

    fn datagram(h: &Header, body: &[u8]) -> Vec<u8> {
        let mut b = [0u8; MAX_HEADER_LEN];
        let n = encode_header(h, &mut b);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(body);
        v
    }

    fn data(seq: u32, ack: u32, flags: u8, total: u32, body: &[u8]) -> Vec<u8> {
        let h = Header {
            kind: Kind::Data,
            flags,
            token: JOB.token(0, 1),
            src: 0,
            dst: 1,
            seq,
            ack,
            count: body.len() as u32,
            start: (flags & FLAG_FIRST != 0).then_some(Start {
                env: [seq as u64, 0],
                total,
            }),
        };
        Self::datagram(&h, body)
    }

    /// Delivers `d` from `from` and polls the endpoint; returns what it sent back.
    fn feed(&mut self, from: u32, d: &[u8]) -> Vec<Header> {
        self.net.inject(from, BASE + 1, d);
        let g = &mut self.got;
        self.ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
        self.replies()
    }

    /// Runs the endpoint's timers and forgets what it sent.
    fn settle(&mut self) {
        let g = &mut self.got;
        self.ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
        self.replies();
    }

    fn replies(&mut self) -> Vec<Header> {
        self.net.advance_to(self.net.now() + 1_000_000);
        let mut out = Vec::new();
        while let Some((d, from)) = self.sock.recv().unwrap() {
            assert_eq!(from, BASE + 1);
            out.push(decode_header(&d).unwrap());
        }
        out
    }
}

#[test]
fn gaps_are_nacked_and_filled() {
    // A window of 16 acknowledges every 4 segments.
    let mut r = Raw::new(16, 5);
    // Segment 6 comes before 5: held, and 5 is asked for.
    let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
    assert!(r.got.is_empty());
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].kind, out[0].seq, out[0].count, out[0].ack),
        (Kind::Nack, 5, 1, 5)
    );
    // Not again for the same gap within a round trip.
    let out = r.feed(BASE, &Raw::data(8, 5, FLAG_FIRST | FLAG_LAST, 1, b"d"));
    assert!(out.is_empty(), "{out:?}");
    // The same held segment again is a duplicate.
    let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
    assert_eq!(r.ep.stats().duplicates, 1);
    assert_eq!(out.iter().filter(|h| h.kind == Kind::Ack).count(), 1);
    // The gap fills: 5 and 6 come out in order; 8 waits for 7, which is asked for.
    let out = r.feed(BASE, &Raw::data(5, 5, FLAG_FIRST | FLAG_LAST, 1, b"a"));
    let seen: Vec<&[u8]> = r.got.iter().map(|g| &g.2[..]).collect();
    assert_eq!(seen, [&b"a"[..], b"bb"]);
    assert!(
        out.iter()
            .any(|h| h.kind == Kind::Nack && h.seq == 7 && h.count == 1),
        "{out:?}"
    );
    let out = r.feed(BASE, &Raw::data(7, 5, FLAG_FIRST | FLAG_LAST, 1, b"c"));
    assert_eq!(r.got.len(), 4);
    assert_eq!(r.got[3].2, b"d");
    // Two segments since the NACK (which carried an ACK): the ACK waits.
    assert!(out.iter().all(|h| h.kind != Kind::Ack), "{out:?}");
    r.net.advance_to(r.ep.next_deadline().unwrap());
    r.ep.poll(&mut |_, _, _| {}).unwrap();
    let out = r.replies();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 9));
    assert!(r.ep.next_deadline().is_none());
    assert_eq!(r.ep.stats().drops.total(), 0);
}

#[test]
fn a_gap_whose_nack_was_lost_is_asked_for_again_by_the_timer() {
    let mut r = Raw::new(16, 5);
    let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
    assert_eq!(out.iter().filter(|h| h.kind == Kind::Nack).count(), 1, "{out:?}");
    // That NACK is lost and nothing else comes: the receiver's timer asks again,
    // rather than leave the gap to the sender's retransmission timer.
    let due = r.ep.next_deadline().expect("a timer for the gap");
    r.net.advance_to(due);
    r.ep.poll(&mut |_, _, _| {}).unwrap();
    let out = r.replies();
    assert!(
        out.iter()
            .any(|h| h.kind == Kind::Nack && h.seq == 5 && h.count == 1),
        "{out:?}"
    );
    // Once the gap fills, no timer is left for it.
    r.feed(BASE, &Raw::data(5, 5, FLAG_FIRST | FLAG_LAST, 1, b"a"));
    assert_eq!(r.got.len(), 2);
    r.settle();
    r.net.advance_to(r.ep.next_deadline().unwrap_or(0));
    r.settle();
    assert!(r.ep.next_deadline().is_none());
}

#[test]
fn multi_segment_messages_are_reassembled() {
    let mut r = Raw::new(8, 0);
    r.feed(BASE, &Raw::data(0, 0, FLAG_FIRST, 7, b"abc"));
    r.feed(BASE, &Raw::data(2, 0, FLAG_LAST, 0, b"g"));
    r.feed(BASE, &Raw::data(1, 0, 0, 0, b"def"));
    assert_eq!(r.got.len(), 1);
    assert_eq!((r.got[0].1, &r.got[0].2[..]), ([0, 0], &b"abcdefg"[..]));
    assert_eq!(r.ep.stats().drops.total(), 0);
}

#[test]
fn a_nack_resends_at_once() {
    let net = net(9);
    let cfg = small(8, 0);
    let mut a = endpoint(&net, 0, 2, cfg);
    let mut raw = net.socket(BASE + 1);
    for i in 0..3u8 {
        a.send(1, &[i.into(), 0], &[&[i; 10]]).unwrap();
    }
    net.advance_to(net.now() + 1_000_000);
    let mut seqs = Vec::new();
    while let Some((d, _)) = raw.recv().unwrap() {
        seqs.push(decode_header(&d).unwrap().seq);
    }
    assert_eq!(seqs, [0, 1, 2]);
    // "Got 0, missing 1 and 2"; long before the retransmission timer.
    let nack = Raw::datagram(
        &Header {
            kind: Kind::Nack,
            flags: 0,
            token: JOB.token(1, 0),
            src: 1,
            dst: 0,
            seq: 1,
            ack: 1,
            count: 2,
            start: None,
        },
        &[],
    );
    net.inject(BASE + 1, BASE, &nack);
    a.poll(&mut |_, _, _| {}).unwrap();
    assert_eq!(a.backlog(), 2);
    assert_eq!(a.stats().retransmits, 2);
    net.advance_to(net.now() + 100_000);
    let mut again = Vec::new();
    while let Some((d, _)) = raw.recv().unwrap() {
        let h = decode_header(&d).unwrap();
        again.push((h.seq, d[d.len() - 1]));
    }
    assert_eq!(again, [(1, 1), (2, 2)]);
    // The same NACK again within a round trip resends nothing.
    net.inject(BASE + 1, BASE, &nack);
    a.poll(&mut |_, _, _| {}).unwrap();
    assert_eq!(a.stats().retransmits, 2);
    // A NACK for what was never sent is refused.
    let mut bogus = nack.clone();
    bogus[32..36].copy_from_slice(&5u32.to_le_bytes());
    net.inject(BASE + 1, BASE, &bogus);
    a.poll(&mut |_, _, _| {}).unwrap();
    assert_eq!(a.stats().drops.count(DropReason::BadSequence), 1);
    assert_eq!(a.stats().retransmits, 2);
}

#[test]
fn bad_input_is_counted_and_changes_nothing() {
    use DropReason::*;
    let mut r = Raw::new(8, 1000);
    // A good first exchange: segment 1000 delivered.
    r.feed(BASE, &Raw::data(1000, 1000, FLAG_FIRST | FLAG_LAST, 2, b"ok"));
    assert_eq!(r.got.len(), 1);
    r.settle();
    let good = Raw::data(1001, 1000, FLAG_FIRST | FLAG_LAST, 3, b"yes");
    let hdr = |f: &dyn Fn(&mut Header)| {
        let mut h = decode_header(&good).unwrap();
        let token = h.token;
        f(&mut h);
        // A header bent elsewhere carries its pair's token, to reach the check meant.
        if h.token == token {
            h.token = JOB.token(h.src, h.dst);
        }
        Raw::datagram(&h, b"yes")
    };
    let mut oversized = Raw::data(1001, 1000, FLAG_FIRST | FLAG_LAST, 141, &[1; 141]);
    assert_eq!(oversized.len(), 201);
    let mut magic = good.clone();
    magic[0] ^= 0xff;
    let mut version = good.clone();
    version[2] = 9;
    let mut shorter = good.clone();
    shorter.pop();
    let cases: Vec<(DropReason, u32, Vec<u8>)> = vec![
        (Truncated, BASE, good[..20].to_vec()),
        (Truncated, BASE, shorter),
        (Oversized, BASE, std::mem::take(&mut oversized)),
        (BadMagic, BASE, magic),
        (BadMagic, BASE, version),
        (WrongJob, BASE, hdr(&|h| h.token ^= 1)),
        // Another pair's token: what a datagram captured elsewhere in the job carries.
        (WrongJob, BASE, hdr(&|h| h.token = JOB.token(1, 0))),
        (WrongJob, BASE, hdr(&|h| h.token = JOB.token(0, 2))),
        (BadRank, BASE, hdr(&|h| h.dst = 2)),
        (BadRank, BASE, hdr(&|h| h.src = 3)),
        (BadRank, BASE, hdr(&|h| h.src = 1)),
        // A valid header claiming to be rank 0, from elsewhere.
        (UnknownAddress, BASE + 50, good.clone()),
        // Rank 2's card resolves, but not to this address.
        (UnknownAddress, BASE + 50, hdr(&|h| h.src = 2)),
        // Rank 2 from its own address, but with a bogus ACK: no state is made for it.
        (
            BadSequence,
            BASE + 2,
            hdr(&|h| {
                h.src = 2;
                h.ack = 1001;
            }),
        ),
        (BadSequence, BASE, hdr(&|h| h.seq = 1001 + 8)),
        (BadSequence, BASE, hdr(&|h| h.seq = 1000 - 9)),
        (BadSequence, BASE, hdr(&|h| h.seq = 1001 + (1 << 31))),
        (BadSequence, BASE, hdr(&|h| h.ack = 1001)),
        (BadSequence, BASE, hdr(&|h| h.ack = 1000 + 1_000_000)),
        (Malformed, BASE, Raw::data(1001, 1000, 0, 0, b"mid")),
        (Malformed, BASE, Raw::data(1001, 1000, FLAG_LAST, 0, b"end")),
        (Malformed, BASE, hdr(&|h| h.flags |= 0x40)),
        (Malformed, BASE, hdr(&|h| h.flags = FLAG_BYE | FLAG_PING)),
        (Oversized, BASE, Raw::data(1001, 1000, FLAG_FIRST, 5000, b"big")),
    ];
    for (reason, from, d) in &cases {
        let before = r.ep.stats().drops.count(*reason);
        let total = r.ep.stats().drops.total();
        let out = r.feed(*from, d);
        assert!(out.is_empty(), "{reason}: answered {out:?}");
        assert_eq!(r.ep.stats().drops.count(*reason), before + 1, "{reason}: {d:?}");
        assert_eq!(r.ep.stats().drops.total(), total + 1);
        assert_eq!(r.got.len(), 1, "{reason}: delivered");
    }
    assert!(r.ep.peers[2].is_none(), "no state for a rank that never spoke");
    let p = r.ep.peers[0].as_deref().unwrap();
    assert_eq!(
        (p.expected, p.held.len(), p.una, p.reasm.is_none()),
        (1001, 0, 1000, true)
    );
    // The good segment still goes through.
    r.feed(BASE, &good);
    assert_eq!(r.got.len(), 2);
    assert_eq!(r.got[1].2, b"yes");
    // A message started, then a segment that claims to start another: refused; the
    // one in progress still completes.
    r.feed(BASE, &Raw::data(1002, 1000, FLAG_FIRST, 6, b"abc"));
    r.feed(BASE, &Raw::data(1003, 1000, FLAG_FIRST | FLAG_LAST, 1, b"z"));
    assert_eq!(r.ep.stats().drops.count(Malformed), 5);
    r.feed(BASE, &Raw::data(1003, 1000, 0, 0, b"defg"));
    assert_eq!(r.ep.stats().drops.count(Malformed), 6, "beyond its total");
    r.feed(BASE, &Raw::data(1003, 1000, FLAG_LAST, 0, b"def"));
    assert_eq!(r.got.len(), 3);
    assert_eq!(r.got[2].2, b"abcdef");
}

#[test]
fn a_lost_ack_is_answered_on_the_duplicate() {
    let mut r = Raw::new(8, 0);
    let d = Raw::data(0, 0, FLAG_PING, 0, b"");
    let out = r.feed(BASE, &d);
    assert_eq!(out.len(), 1, "a probe is acknowledged at once");
    assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 1));
    let out = r.feed(BASE, &d);
    assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 1));
    assert_eq!(r.ep.stats().duplicates, 1);
    assert!(r.got.is_empty());
}

#[test]
fn peer_state_is_small_and_fixed() {
    assert!(std::mem::size_of::<Peer<std::net::SocketAddr>>() < 320);
}

#[test]
fn memory_per_peer_does_not_depend_on_the_number_of_peers() {
    // Message traffic to every peer, then quiet: the state left is one box a peer.
    for n in [3u32, 17] {
        let net = net(10);
        let cfg = small(4, 0);
        let mut eps: Vec<_> = (0..n).map(|r| endpoint(&net, r, n, cfg.clone())).collect();
        let plan: Vec<Vec<_>> = (0..n)
            .map(|s| {
                (0..n)
                    .filter(|&d| d != s)
                    .map(|d| (d, [0, 0], bytes(u64::from(d), 500)))
                    .collect()
            })
            .collect();
        let got = run(&net, &mut eps, &plan, 10);
        check(&plan, &got);
        for ep in &mut eps {
            ep.poll(&mut |_, _, _| {}).unwrap();
            assert_eq!(ep.peers.iter().flatten().count() as u32, n - 1);
            assert!(ep.busy.is_empty());
            for p in ep.peers.iter().flatten() {
                assert_eq!(p.queue.capacity() + p.held.capacity(), 0);
                assert!(p.reasm.is_none());
            }
        }
    }
}
