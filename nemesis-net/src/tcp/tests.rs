use super::*;
use crate::Land;
use crate::auth::{JobKey, KEY_LEN, NONCE_LEN};
use crate::config;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

const KEY: JobKey = JobKey::from_bytes([0x5e; KEY_LEN]);
const LONG: Duration = Duration::from_secs(10);

/// A card table that the netmods share, filled once they are bound.
#[derive(Clone, Default)]
struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

impl Cards for Table {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        self.0.lock().unwrap().card(rank)
    }
}

impl Table {
    fn set(&self, rank: u32, card: Vec<u8>) {
        self.0.lock().unwrap()[rank as usize] = card;
    }
}

fn ident(rank: u32, size: u32) -> Identity {
    Identity {
        rank,
        size,
        job_key: KEY,
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

fn small() -> TcpConfig {
    TcpConfig {
        max_payload: 64 << 10,
        ..TcpConfig::default()
    }
}

/// Netmods for ranks `0..n` of a job of `size`, knowing each other's cards; the
/// other ranks' cards are the test's to set.
fn job(n: u32, size: u32, cfg: &TcpConfig) -> (Vec<TcpNetmod>, Table) {
    let table = Table(Arc::new(Mutex::new(vec![Vec::new(); size as usize])));
    let nms: Vec<TcpNetmod> = (0..n)
        .map(|r| {
            TcpNetmod::new(ident(r, size), Box::new(table.clone()), cfg.clone())
                .unwrap()
                .quiet()
        })
        .collect();
    for (r, nm) in (0..).zip(&nms) {
        table.set(r, nm.business_card());
    }
    (nms, table)
}

type Got = Vec<(u32, Envelope, Vec<u8>)>;

fn poll_all(nms: &mut [TcpNetmod], got: &mut [Got]) {
    for (nm, g) in nms.iter_mut().zip(got.iter_mut()) {
        nm.poll(&mut |src, env, p| g.push((src, *env, p.to_vec())))
            .unwrap();
    }
}

/// Polls every netmod in turn until `done` holds or 10 s pass; says whether it held.
fn pump(nms: &mut [TcpNetmod], got: &mut [Got], mut done: impl FnMut(&[TcpNetmod], &[Got]) -> bool) -> bool {
    let end = Instant::now() + LONG;
    loop {
        poll_all(nms, got);
        if done(nms, got) {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Sends, polling everyone while the netmod answers "again".
fn send_all(nms: &mut [TcpNetmod], got: &mut [Got], from: usize, to: u32, env: Envelope, payload: &[&[u8]]) {
    let end = Instant::now() + LONG;
    while nms[from].send(to, &env, payload).unwrap() == Accept::Again {
        assert!(Instant::now() < end, "rank {from} could not send to {to}");
        poll_all(nms, got);
    }
}

fn pattern(src: u32, dst: u32, seq: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i * 31 + seq * 7 + u64::from(src) * 3 + u64::from(dst)) as u8)
        .collect()
}

/// Every netmod has exactly one connection per peer it talked to, and it is up.
fn settled(nms: &[TcpNetmod]) -> bool {
    nms.iter().all(|nm| {
        nm.conns.values().all(|c| c.state == State::Up)
            && nm.peers.values().all(|p| p.dialing.is_none())
            && nm.backlog() == 0
    })
}

fn failure(nm: &TcpNetmod, peer: u32) -> String {
    match nm.check_peer(peer) {
        Err(NetError::PeerFailed { rank, reason }) => {
            assert_eq!(rank, peer);
            reason
        }
        other => panic!("rank {peer}: {other:?}"),
    }
}

#[test]
fn netmod_is_send() {
    fn send<T: Send>() {}
    send::<TcpNetmod>();
}

#[test]
fn ordered_delivery_among_two_and_three() {
    for n in [2u32, 3] {
        let cfg = TcpConfig::default();
        let max = cfg.max_payload;
        let (mut nms, _cards) = job(n, n, &cfg);
        let mut got = vec![Got::new(); n as usize];
        let sizes = [0, 1, 1000, max, 0, 77, max - 1];
        let rounds = 3;
        for round in 0..rounds {
            for src in 0..n {
                for dst in (0..n).filter(|&d| d != src) {
                    for (i, &len) in sizes.iter().enumerate() {
                        let seq = (round * sizes.len() + i) as u64;
                        let data = pattern(src, dst, seq, len);
                        let env = [seq, (u64::from(src) << 32) | u64::from(dst)];
                        let (a, rest) = data.split_at(len / 3);
                        let (b, c) = rest.split_at(rest.len() / 2);
                        let parts: Vec<&[u8]> = if i % 2 == 0 {
                            vec![&data]
                        } else {
                            vec![a, &[], b, c]
                        };
                        send_all(&mut nms, &mut got, src as usize, dst, env, &parts);
                    }
                }
            }
        }
        let per = rounds * sizes.len();
        let want = per * (n as usize - 1);
        assert!(pump(&mut nms, &mut got, |nms, g| g
            .iter()
            .all(|g| g.len() == want)
            && settled(nms)));
        // Exactly once: more polls bring nothing more.
        for _ in 0..20 {
            poll_all(&mut nms, &mut got);
        }
        for dst in 0..n {
            assert_eq!(got[dst as usize].len(), want);
            for src in (0..n).filter(|&s| s != dst) {
                let from: Vec<_> = got[dst as usize].iter().filter(|(s, ..)| *s == src).collect();
                assert_eq!(from.len(), per);
                for (k, (_, env, payload)) in (0u64..).zip(from) {
                    assert_eq!(*env, [k, (u64::from(src) << 32) | u64::from(dst)]);
                    let len = sizes[k as usize % sizes.len()];
                    assert!(*payload == pattern(src, dst, k, len), "{src}->{dst} #{k}");
                }
            }
            let s = nms[dst as usize].stats();
            assert_eq!(s.packets_sent, want as u64);
            assert_eq!(s.packets_received, want as u64);
            assert_eq!(s.drops.total(), 0);
            assert_eq!(nms[dst as usize].conns.len(), n as usize - 1);
        }
        // More slices than one sendmsg takes: the rest is queued, in order.
        let data = pattern(0, 1, 99, 1000);
        let slices: Vec<&[u8]> = data.chunks(7).collect();
        assert!(slices.len() > MAX_IOV);
        send_all(&mut nms, &mut got, 0, 1, [99, 99], &slices);
        assert!(pump(&mut nms, &mut got, |_, g| g[1].len() == want + 1));
        assert_eq!(got[1][want], (0, [99, 99], data));
        let nm = &mut nms[0];
        assert!(matches!(nm.send(n, &[0, 0], &[]), Err(NetError::InvalidRank { rank, .. }) if rank == n));
        assert!(matches!(
            nm.send(0, &[0, 0], &[]),
            Err(NetError::InvalidRank { rank: 0, .. })
        ));
        let big = vec![0u8; max];
        assert!(matches!(
            nm.send(1, &[0, 0], &[&big, b"x"]),
            Err(NetError::TooLarge { len, max: m }) if len == max + 1 && m == max
        ));
        assert_eq!(nm.name(), "tcp");
        assert_eq!(nm.max_payload(), max);
        assert_eq!(
            addr::decode_card("tcp", 0, &nm.business_card()).unwrap(),
            nm.local_addr()
        );
    }
}

#[test]
fn simultaneous_connects_keep_one_connection() {
    for _ in 0..5 {
        let (mut nms, _cards) = job(2, 2, &small());
        let mut got = vec![Got::new(); 2];
        let count = 20u64;
        // Both send before either polls: both dial.
        for k in 0..count {
            for src in 0..2u32 {
                let p = pattern(src, 1 - src, k, 100 + k as usize);
                send_all(
                    &mut nms,
                    &mut got,
                    src as usize,
                    1 - src,
                    [k, u64::from(src)],
                    &[&p],
                );
            }
        }
        assert!(
            nms.iter()
                .all(|nm| nm.peers.values().all(|p| p.dialing.is_some()))
        );
        assert!(pump(&mut nms, &mut got, |nms, g| {
            g.iter().all(|g| g.len() == count as usize) && settled(nms)
        }));
        for _ in 0..20 {
            poll_all(&mut nms, &mut got);
        }
        for dst in 0..2u32 {
            let src = 1 - dst;
            let g = &got[dst as usize];
            assert_eq!(g.len(), count as usize);
            for (k, (s, env, p)) in (0u64..).zip(g) {
                assert_eq!((*s, *env), (src, [k, u64::from(src)]));
                assert!(*p == pattern(src, dst, k, 100 + k as usize));
            }
            let nm = &nms[dst as usize];
            assert_eq!(nm.conns.len(), 1, "rank {dst}: {:?}", nm.conns);
            let up = nm.peers[&src].up.unwrap();
            assert_eq!(nm.conns[&up].state, State::Up);
            assert_eq!(nm.stats().drops.total(), 0);
        }
        // Rank 0's connection won: it is the one that reaches rank 1's listener.
        let winner = |nm: &TcpNetmod, peer: u32| nm.conns[&nm.peers[&peer].up.unwrap()].addr;
        assert_eq!(winner(&nms[0], 1), Some(nms[1].local_addr()));
        assert_ne!(winner(&nms[1], 0), Some(nms[0].local_addr()));
    }
}

/// Reads `n` bytes from `s`, polling the netmods meanwhile.
fn read_pumping(nms: &mut [TcpNetmod], got: &mut [Got], s: &mut TcpStream, n: usize) -> Vec<u8> {
    s.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; n];
    let mut have = 0;
    assert!(pump(nms, got, |_, _| {
        if let Ok(k) = s.read(&mut buf[have..]) {
            have += k;
        }
        have == n
    }));
    s.set_nonblocking(false).unwrap();
    buf
}

/// Reads the challenge a netmod sends on `s`, polling it meanwhile.
fn read_challenge(nms: &mut [TcpNetmod], got: &mut [Got], s: &mut TcpStream) -> Challenge {
    decode_challenge(&read_pumping(nms, got, s, CHALLENGE_LEN)).unwrap()
}

fn hello(key: &JobKey, from: u32, to: u32, max_payload: usize, ch: &Challenge) -> [u8; HELLO_LEN] {
    Hello::new(key, from, to, max_payload as u32, [9; NONCE_LEN], ch).encode()
}

#[test]
fn bad_handshakes_are_refused_and_counted() {
    let cfg = TcpConfig {
        handshake_timeout: Duration::from_millis(300),
        ..small()
    };
    let max = cfg.max_payload;
    let (mut nms, _cards) = job(2, 2, &cfg);
    let mut got = vec![Got::new(); 2];
    let other = JobKey::from_bytes([0xee; KEY_LEN]);
    let stale = Challenge {
        nonce: [1; NONCE_LEN],
    };
    type Make = fn(&JobKey, &JobKey, &Challenge, &Challenge, usize) -> Vec<u8>;
    let cases: [Make; 8] = [
        // Another job's key, and a hello replayed from another connection.
        |_, other, ch, _, max| hello(other, 1, 0, max, ch).to_vec(),
        |key, _, _, stale, max| hello(key, 1, 0, max, stale).to_vec(),
        |key, _, ch, _, max| {
            let mut b = hello(key, 1, 0, max, ch);
            b[0] ^= 0xff;
            b.to_vec()
        },
        |key, _, ch, _, max| hello(key, 1, 1, max, ch).to_vec(),
        |key, _, ch, _, max| hello(key, 5, 0, max, ch).to_vec(),
        |key, _, ch, _, max| hello(key, 0, 0, max, ch).to_vec(),
        |key, _, ch, _, max| hello(key, 1, 0, max + 1, ch).to_vec(),
        // Silence, until the handshake timeout.
        |_, _, _, _, _| Vec::new(),
    ];
    let mut raws = Vec::new();
    for make in cases {
        let mut s = TcpStream::connect(nms[0].local_addr()).unwrap();
        let ch = read_challenge(&mut nms, &mut got, &mut s);
        s.write_all(&make(&KEY, &other, &ch, &stale, max)).unwrap();
        raws.push(s);
    }
    let want = [
        (DropReason::WrongJob, 2),
        (DropReason::BadMagic, 1),
        (DropReason::BadRank, 3),
        (DropReason::BadHandshake, 2),
    ];
    nms[0].send(1, &[1, 2], &[b"good"]).unwrap();
    assert!(pump(&mut nms, &mut got, |nms, g| {
        let d = nms[0].stats().drops;
        want.iter().all(|&(r, n)| d.count(r) == n) && g[1].len() == 1
    }));
    assert_eq!(nms[0].stats().drops.total(), 8);
    // A refused connector is told nothing: the connection just ends.
    for mut s in raws {
        s.set_read_timeout(Some(LONG)).unwrap();
        let mut buf = [0u8; 64];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
    assert!(nms[0].conns.values().all(|c| c.state == State::Up));
    assert_eq!(nms[0].gate.len(), 0);
    // The good peer is unaffected, both ways.
    nms[1].send(0, &[3, 4], &[b"back"]).unwrap();
    assert!(pump(&mut nms, &mut got, |_, g| g[0].len() == 1));
    assert_eq!(got[0][0], (1, [3, 4], b"back".to_vec()));
    assert_eq!(got[1][0], (0, [1, 2], b"good".to_vec()));
    assert!(nms[0].check_peer(1).is_ok() && nms[1].check_peer(0).is_ok());
}

#[test]
fn strangers_that_say_nothing_do_not_keep_a_peer_out() {
    let (mut nms, _cards) = job(2, 2, &small());
    let mut got = vec![Got::new(); 2];
    // More silent connections than the gate holds, all before the peer's.
    let strangers: Vec<TcpStream> = (0..gate::TOTAL + 200)
        .map(|_| TcpStream::connect(nms[1].local_addr()).unwrap())
        .collect();
    nms[0].send(1, &[5, 6], &[b"through"]).unwrap();
    assert!(pump(&mut nms, &mut got, |_, g| g[1].len() == 1));
    assert_eq!(got[1][0], (0, [5, 6], b"through".to_vec()));
    assert!(nms[1].gate.len() <= gate::PER_SOURCE, "{}", nms[1].gate.len());
    assert!(nms[1].stats().drops.count(DropReason::BadHandshake) >= 200);
    drop(strangers);
}

/// A raw client that passes the handshake with `nms[0]` as `from`.
fn raw_peer(nms: &mut [TcpNetmod], got: &mut [Got], from: u32) -> TcpStream {
    let max = nms[0].max_payload();
    let mut s = TcpStream::connect(nms[0].local_addr()).unwrap();
    let ch = read_challenge(nms, got, &mut s);
    let h = Hello::new(&KEY, from, 0, max as u32, [9; NONCE_LEN], &ch);
    s.write_all(&h.encode()).unwrap();
    let reply = decode_reply(&read_pumping(nms, got, &mut s, REPLY_LEN)).unwrap();
    assert_eq!((reply.code, reply.rank), (ReplyCode::Accepted, 0));
    assert!(reply.proves(&KEY, &h, &ch));
    s
}

/// A frame as a sender of ours writes it for a payload `len` bytes long, padded before
/// (a long one, by an arbitrary 24 bytes) and after (to a multiple of `FRAME_ALIGN`).
fn frame(kind: FrameKind, env: Envelope, len: u32, payload: &[u8]) -> Vec<u8> {
    let lead = if len as usize >= ALIGN_FROM { 24 } else { 0 };
    let trail = (FRAME_ALIGN - (FRAME_HEADER_LEN + lead + len as usize) % FRAME_ALIGN) % FRAME_ALIGN;
    let (lead, trail) = if kind == FrameKind::Goodbye {
        (0, 0)
    } else {
        (lead, trail)
    };
    let mut v = encode_frame_header(kind, &env, len, lead, trail).to_vec();
    v.resize(v.len() + lead, 0);
    v.extend_from_slice(payload);
    v.resize(v.len() + trail, 0);
    v
}

#[test]
fn bad_frames_fail_only_their_peer() {
    let max = small().max_payload as u32;
    let cases: [(Vec<u8>, DropReason, &str); 3] = [
        (
            frame(FrameKind::Packet, [0, 0], max + 1, &[]),
            DropReason::Oversized,
            "above the maximum",
        ),
        (
            {
                let mut f = frame(FrameKind::Packet, [0, 0], 0, &[]);
                f[4] = 7;
                f
            },
            DropReason::Malformed,
            "kind 7",
        ),
        (
            frame(FrameKind::Packet, [0, 0], 100, &[5; 50]),
            DropReason::Truncated,
            "middle of a frame",
        ),
    ];
    for (bytes, reason, says) in cases {
        let (mut nms, _cards) = job(2, 3, &small());
        let mut got = vec![Got::new(); 2];
        let mut raw = raw_peer(&mut nms, &mut got, 2);
        raw.write_all(&frame(FrameKind::Packet, [9, 9], 2, b"hi"))
            .unwrap();
        raw.write_all(&bytes).unwrap();
        // The truncated frame ends with the connection; the others stay open, and the
        // netmod must give up on them by itself.
        let _open = (reason != DropReason::Truncated).then_some(raw);
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(2).is_err()));
        assert_eq!(nms[0].stats().drops.count(reason), 1, "{reason}");
        assert_eq!(nms[0].stats().drops.total(), 1);
        let why = failure(&nms[0], 2);
        assert!(why.contains(says), "{why}");
        // What came before the bad frame was handed up.
        assert_eq!(got[0], vec![(2, [9, 9], b"hi".to_vec())]);
        assert!(matches!(
            nms[0].send(2, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 2, .. })
        ));
        // The others are fine.
        nms[0].send(1, &[7, 7], &[b"still"]).unwrap();
        nms[1].send(0, &[8, 8], &[b"here"]).unwrap();
        assert!(pump(&mut nms, &mut got, |_, g| g[0].len() == 2 && g[1].len() == 1));
        assert_eq!(got[0][1], (1, [8, 8], b"here".to_vec()));
        assert!(nms[0].check_peer(1).is_ok());
    }
}

#[test]
fn a_bad_reply_fails_the_peer() {
    type Answer = fn(&Hello, &Challenge) -> Vec<u8>;
    let cases: [(bool, Answer, DropReason, &str); 4] = [
        (
            true,
            |h, ch| Reply::new(&KEY, ReplyCode::Accepted, 7, h, ch).encode().to_vec(),
            DropReason::BadRank,
            "business card",
        ),
        (
            true,
            |h, ch| {
                let other = JobKey::from_bytes([0xee; KEY_LEN]);
                Reply::new(&other, ReplyCode::Accepted, 1, h, ch)
                    .encode()
                    .to_vec()
            },
            DropReason::WrongJob,
            "does not hold the job's key",
        ),
        (
            true,
            |_, _| format!("{:<1$}", "HTTP/1.1 400 Bad Request", REPLY_LEN).into_bytes(),
            DropReason::BadMagic,
            "not a tcp netmod",
        ),
        // A server that speaks first, but not a challenge.
        (false, |_, _| Vec::new(), DropReason::BadMagic, "not a tcp netmod"),
    ];
    for (challenges, answer, reason, says) in cases {
        let (mut nms, cards) = job(1, 2, &small());
        let mut got = vec![Got::new(); 1];
        let fake = TcpListener::bind("127.0.0.1:0").unwrap();
        fake.set_nonblocking(true).unwrap();
        cards.set(1, addr::encode_card("tcp", fake.local_addr().unwrap()));
        assert_eq!(nms[0].send(1, &[1, 1], &[b"lost"]).unwrap(), Accept::Sent);
        let mut conn = None;
        assert!(pump(&mut nms, &mut got, |_, _| {
            conn = conn.take().or_else(|| fake.accept().ok().map(|(s, _)| s));
            conn.is_some()
        }));
        let mut s = conn.unwrap();
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        if challenges {
            let ch = Challenge {
                nonce: [4; NONCE_LEN],
            };
            s.write_all(&ch.encode()).unwrap();
            let hello = decode_hello(&read_pumping(&mut nms, &mut got, &mut s, HELLO_LEN)).unwrap();
            assert_eq!(
                (hello.from, hello.to, hello.max_payload),
                (0, 1, small().max_payload as u32)
            );
            assert!(hello.proves(&KEY, &ch));
            s.write_all(&answer(&hello, &ch)).unwrap();
        } else {
            s.write_all(&format!("{:<1$}", "SSH-2.0-OpenSSH", CHALLENGE_LEN).into_bytes())
                .unwrap();
        }
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
        assert_eq!(nms[0].stats().drops.count(reason), 1);
        let why = failure(&nms[0], 1);
        assert!(why.contains(says) && why.contains("1 packets queued"), "{why}");
        assert_eq!(nms[0].backlog(), 0);
    }
}

#[test]
fn a_peer_that_goes_away_fails() {
    // Dropped without a goodbye.
    let (mut nms, _cards) = job(2, 2, &small());
    let mut got = vec![Got::new(); 2];
    nms[0].send(1, &[1, 0], &[b"a"]).unwrap();
    nms[1].send(0, &[1, 1], &[b"b"]).unwrap();
    assert!(pump(&mut nms, &mut got, |_, g| g.iter().all(|g| g.len() == 1)));
    drop(nms.pop());
    assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
    let why = failure(&nms[0], 1);
    assert!(!why.contains("left"), "{why}");
    assert!(matches!(
        nms[0].send(1, &[0, 0], &[]),
        Err(NetError::PeerFailed { rank: 1, .. })
    ));

    // Shut down: what it sent still arrives, then it has left.
    let (mut nms, _cards) = job(2, 2, &small());
    let mut got = vec![Got::new(); 2];
    nms[0].send(1, &[0, 0], &[b"a"]).unwrap();
    assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 1 && settled(nms)));
    let count = 50u64;
    let mut nm1 = nms.pop().unwrap();
    for k in 0..count {
        let p = pattern(1, 0, k, 10_000);
        assert_eq!(nm1.send(0, &[k, 1], &[&p]).unwrap(), Accept::Sent);
    }
    let leaving = std::thread::spawn(move || {
        let t = Instant::now();
        nm1.shutdown(Duration::from_secs(30));
        (nm1, t.elapsed())
    });
    assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
    let (mut nm1, took) = leaving.join().unwrap();
    // It did not wait out its timeout: our close told it we had read everything.
    assert!(took < LONG, "{took:?}");
    assert_eq!(got[0].len(), count as usize);
    for (k, (src, env, p)) in (0u64..).zip(&got[0]) {
        assert_eq!((*src, *env), (1, [k, 1]));
        assert!(*p == pattern(1, 0, k, 10_000));
    }
    let why = failure(&nms[0], 1);
    assert!(why.contains("left"), "{why}");
    assert!(matches!(
        nms[0].send(1, &[0, 0], &[]),
        Err(NetError::PeerFailed { rank: 1, .. })
    ));
    let e = nm1.send(0, &[0, 0], &[]).unwrap_err();
    assert!(e.to_string().contains("shut down"), "{e}");
    assert_eq!(nm1.backlog(), 0);
    assert_eq!(nm1.poll(&mut |_, _, _| panic!("after shutdown")).unwrap(), 0);
}

#[test]
fn back_pressure_takes_nothing_on_again() {
    let cfg = TcpConfig {
        queue_limit: 64 << 10,
        ..small()
    };
    let (mut nms, _cards) = job(2, 2, &cfg);
    let mut got = vec![Got::new(); 2];
    let len = 16 << 10;
    let mut seq = 0u64;
    let send = |nm: &mut TcpNetmod, seq: u64| nm.send(1, &[seq, 0], &[&pattern(0, 1, seq, len)]).unwrap();
    // No connection yet, and nobody polls: only the queue takes packets, until the
    // limit. 4 of 16 KiB + 24 bytes pass 64 KiB.
    while send(&mut nms[0], seq) == Accept::Sent {
        seq += 1;
        assert!(seq < 100);
    }
    assert_eq!(seq, 4);
    assert_eq!(nms[0].backlog(), 4);
    assert_eq!(nms[0].stats().packets_sent, 4);
    assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 4 && settled(nms)));
    // Up now; the receiver stops polling and the sender fills the socket, then the queue.
    let mut again = false;
    for _ in 0..100_000 {
        nms[0].poll(&mut |_, _, _| {}).unwrap();
        if send(&mut nms[0], seq) == Accept::Again {
            again = true;
            break;
        }
        seq += 1;
    }
    assert!(again, "never pushed back");
    assert!(nms[0].backlog() > 0);
    assert!(nms[0].peers[&1].out.bytes() >= cfg.queue_limit);
    let accepted = seq;
    assert_eq!(nms[0].stats().packets_sent, accepted);
    // The refused packet goes once the receiver reads.
    send_all(&mut nms, &mut got, 0, 1, [seq, 0], &[&pattern(0, 1, seq, len)]);
    let total = accepted as usize + 1;
    assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == total
        && nms[0].backlog() == 0));
    for (k, (src, env, p)) in (0u64..).zip(&got[1]) {
        assert_eq!((*src, *env), (0, [k, 0]));
        assert!(*p == pattern(0, 1, k, len), "#{k}");
    }
    for _ in 0..20 {
        poll_all(&mut nms, &mut got);
    }
    assert_eq!(got[1].len(), total);
}

#[test]
fn probes_find_dead_peers() {
    let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (mut nms, cards) = job(1, 3, &small());
    cards.set(1, addr::encode_card("tcp", dead));
    let mut got = vec![Got::new(); 1];
    assert!(nms[0].check_peer(1).is_ok());
    assert!(nms[0].wait(Duration::ZERO).unwrap(), "a probe is due");
    assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
    let why = failure(&nms[0], 1);
    assert!(why.contains("refused"), "{why}");
    assert!(matches!(
        nms[0].send(1, &[0, 0], &[]),
        Err(NetError::PeerFailed { rank: 1, .. })
    ));

    // Rank 2 has no card: sends say so; a probe marks it failed.
    assert!(matches!(
        nms[0].send(2, &[0, 0], &[]),
        Err(NetError::BadCard { rank: 2, .. })
    ));
    assert!(matches!(
        nms[0].send(2, &[0, 0], &[]),
        Err(NetError::BadCard { rank: 2, .. })
    ));
    assert!(nms[0].check_peer(2).is_ok());
    assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(2).is_err()));
    assert!(failure(&nms[0], 2).contains("card"));
    assert_eq!(nms[0].backlog(), 0);
    assert!(matches!(
        nms[0].check_peer(3),
        Err(NetError::InvalidRank { rank: 3, size: 3 })
    ));
    assert!(nms[0].check_peer(0).is_ok());
}

#[test]
fn wait_says_when_there_is_something() {
    let (mut nms, _cards) = job(2, 2, &small());
    let mut got = vec![Got::new(); 2];
    nms[0].send(1, &[1, 1], &[b"first"]).unwrap();
    assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 1 && settled(nms)));
    assert!(!nms[1].wait(Duration::ZERO).unwrap());
    assert!(!nms[1].wait(Duration::from_millis(50)).unwrap());
    assert_eq!(nms[0].send(1, &[2, 2], &[b"second"]).unwrap(), Accept::Sent);
    let t = Instant::now();
    assert!(nms[1].wait(LONG).unwrap());
    assert!(t.elapsed() < LONG);
    poll_all(&mut nms, &mut got);
    assert_eq!(got[1][1], (0, [2, 2], b"second".to_vec()));
}

#[test]
fn config_from_the_environment() {
    let none = |_: &str| None;
    assert_eq!(TcpConfig::from_lookup(none).unwrap(), TcpConfig::default());
    let c = TcpConfig::from_lookup(|k| match k {
        "NEMESIS_NET_TIMEOUT" => Some("2.5".into()),
        "NEMESIS_TCP_MAX_PAYLOAD" => Some("1M".into()),
        "NEMESIS_TCP_QUEUE_LIMIT" => Some("64K".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.timeout, Duration::from_millis(2500));
    assert_eq!((c.max_payload, c.queue_limit), (1 << 20, 64 << 10));
    for (var, bad) in [
        (MAX_PAYLOAD_VAR, "0"),
        (MAX_PAYLOAD_VAR, "1G"),
        (QUEUE_LIMIT_VAR, "lots"),
        (config::NET_TIMEOUT_VAR, "-1"),
    ] {
        let e = TcpConfig::from_lookup(|k| (k == var).then(|| bad.to_string())).unwrap_err();
        assert!(e.to_string().contains(var), "{e}");
    }
    let bad = TcpConfig {
        max_payload: 0,
        ..TcpConfig::default()
    };
    assert!(TcpNetmod::new(ident(0, 1), Box::new(Table::default()), bad).is_err());
    assert!(matches!(
        TcpNetmod::new(ident(2, 2), Box::new(Table::default()), TcpConfig::default()),
        Err(NetError::InvalidRank { rank: 2, size: 2 })
    ));
}

/// What a landing sink saw, in order: `true` for a packet landed in its own buffer.
type Seen = Vec<(u32, Envelope, Vec<u8>, bool)>;

/// A sink that lands every long packet offered it, into a buffer `extra` bytes longer
/// than the packet (so that `extra != 0` makes every landing refused).
#[derive(Default)]
struct Lander {
    seen: Seen,
    offered: usize,
    extra: usize,
}

impl Sink for Lander {
    fn packet(&mut self, src: u32, env: &Envelope, payload: &[u8]) {
        self.seen.push((src, *env, payload.to_vec(), false));
    }
    fn arriving(&mut self, src: u32, env: &Envelope, len: usize, land: &mut dyn Land) -> bool {
        self.offered += 1;
        let mut buf = vec![0u8; len + self.extra];
        let landed = land.land(&mut buf);
        if landed {
            self.seen.push((src, *env, buf, true));
        }
        landed
    }
    fn lands(&self) -> bool {
        true
    }
}

/// Polls `nms[0]` with `sink` (and the others plainly) until `done` holds or 10 s pass.
fn pump_landing(
    nms: &mut [TcpNetmod],
    got: &mut [Got],
    sink: &mut Lander,
    done: impl Fn(&Lander) -> bool,
) -> bool {
    let end = Instant::now() + LONG;
    while !done(sink) {
        if Instant::now() > end {
            return false;
        }
        nms[0].poll_landing(sink).unwrap();
        poll_all(&mut nms[1..], &mut got[1..]);
    }
    true
}

/// A netmod and a raw peer (rank 2) that has sent it one long packet, already delivered:
/// the next long one may land.
fn after_a_long_packet(sink: &mut Lander) -> (Vec<TcpNetmod>, Table, Vec<Got>, TcpStream) {
    let (mut nms, cards) = job(2, 3, &small());
    let mut got = vec![Got::new(); 2];
    let mut raw = raw_peer(&mut nms, &mut got, 2);
    let first = pattern(2, 0, 0, 30_000);
    raw.write_all(&frame(FrameKind::Packet, [1, 0], 30_000, &first))
        .unwrap();
    assert!(pump_landing(&mut nms, &mut got, sink, |s| s.seen.len() == 1));
    assert_eq!(sink.seen[0].2, first);
    sink.seen.clear();
    sink.offered = 0;
    (nms, cards, got, raw)
}

#[test]
fn long_packets_land_in_the_sinks_buffer() {
    let mut sink = Lander::default();
    let (mut nms, _cards, mut got, mut raw) = after_a_long_packet(&mut sink);
    // After a long packet only a header's worth is read: the rest of the next long one
    // goes straight into the sink's buffer; a short one behind it comes whole.
    let long = pattern(2, 0, 1, 40_000);
    let mut bytes = frame(FrameKind::Packet, [2, 0], 40_000, &long);
    bytes.extend(frame(FrameKind::Packet, [3, 0], 5, b"short"));
    raw.write_all(&bytes).unwrap();
    assert!(pump_landing(&mut nms, &mut got, &mut sink, |s| s.seen.len() == 2));
    assert_eq!(sink.offered, 1);
    assert_eq!(sink.seen[0], (2, [2, 0], long, true));
    assert_eq!(sink.seen[1], (2, [3, 0], b"short".to_vec(), false));
    assert_eq!(nms[0].stats().packets_received, 3);
    assert_eq!(nms[0].stats().packets_landed, 1);

    // A sink whose buffer does not fit is refused, and has the packet whole later.
    sink.extra = 1;
    let other = pattern(2, 0, 2, 50_000);
    raw.write_all(&frame(FrameKind::Packet, [4, 0], 50_000, &other))
        .unwrap();
    assert!(pump_landing(&mut nms, &mut got, &mut sink, |s| s.seen.len() == 3));
    assert!(sink.offered >= 2);
    assert_eq!(sink.seen[2], (2, [4, 0], other, false));
    assert!(nms[0].check_peer(2).is_ok());
}

#[test]
fn a_landing_that_waits_too_long_keeps_what_came() {
    let mut sink = Lander::default();
    let (mut nms, _cards, mut got, mut raw) = after_a_long_packet(&mut sink);
    let long = pattern(2, 0, 1, 40_000);
    let bytes = frame(FrameKind::Packet, [2, 0], 40_000, &long);
    // The header and a fifth of the payload, then nothing for a while: the landing gives
    // up, and the bytes it read are not lost.
    let cut = FRAME_HEADER_LEN + 8_000;
    raw.write_all(&bytes[..cut]).unwrap();
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        nms[0].poll_landing(&mut sink).unwrap();
    }
    assert!(sink.offered >= 1);
    assert!(sink.seen.is_empty());
    raw.write_all(&bytes[cut..]).unwrap();
    assert!(pump_landing(&mut nms, &mut got, &mut sink, |s| !s
        .seen
        .is_empty()));
    assert_eq!(sink.seen.len(), 1);
    assert!(sink.seen[0] == (2, [2, 0], long, sink.seen[0].3));
}

/// [`after_a_long_packet`], then the raw peer writes the header and a quarter of the
/// payload of a 40,000-byte packet.
fn in_the_middle_of_a_long_packet(sink: &mut Lander) -> (Vec<TcpNetmod>, TcpStream) {
    let (nms, _cards, _got, mut raw) = after_a_long_packet(sink);
    let long = pattern(2, 0, 1, 40_000);
    let bytes = frame(FrameKind::Packet, [2, 0], 40_000, &long);
    raw.write_all(&bytes[..FRAME_HEADER_LEN + 10_000]).unwrap();
    (nms, raw)
}

#[test]
fn a_peer_that_ends_mid_landing_fails() {
    let mut sink = Lander::default();
    let (mut nms, raw) = in_the_middle_of_a_long_packet(&mut sink);
    drop(raw);
    let end = Instant::now() + LONG;
    while nms[0].check_peer(2).is_ok() {
        assert!(Instant::now() < end, "the peer's end was not seen");
        nms[0].poll_landing(&mut sink).unwrap();
    }
    assert!(sink.seen.is_empty());
    assert_eq!(nms[0].stats().drops.count(DropReason::Truncated), 1);
    let why = failure(&nms[0], 2);
    assert!(why.contains("middle of a frame"), "{why}");
}

#[test]
fn a_peer_reset_mid_landing_fails() {
    use std::os::fd::AsRawFd;
    let mut sink = Lander::default();
    let (mut nms, raw) = in_the_middle_of_a_long_packet(&mut sink);
    // Closed with a zero linger: a reset, so the landing's read fails rather than ends.
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and option of the size given.
    let rc = unsafe {
        libc::setsockopt(
            raw.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    drop(raw);
    let end = Instant::now() + LONG;
    while nms[0].check_peer(2).is_ok() {
        assert!(Instant::now() < end, "the reset was not seen");
        nms[0].poll_landing(&mut sink).unwrap();
    }
    assert!(sink.offered >= 1 && sink.seen.is_empty());
    let why = failure(&nms[0], 2);
    assert!(why.contains("lost"), "{why}");
}

#[test]
fn payloads_at_any_alignment_arrive_whole_landed_or_not() {
    let cfg = TcpConfig {
        max_payload: 128 << 10,
        ..TcpConfig::default()
    };
    let (mut nms, _cards) = job(2, 2, &cfg);
    let mut got = vec![Got::new(); 2];
    let mut sink = Lander::default();
    let store = pattern(1, 0, 5, (100 << 10) + 64);
    let (mut want, mut back) = (Vec::new(), Vec::new());
    let mut seq = 0u64;
    // Lengths below and at the padding's threshold, one that lands, one longer than a
    // loopback segment; each from a spread of places within 64 bytes, alone or behind a
    // short slice, as the layers above send them.
    for len in [1, ALIGN_FROM - 1, ALIGN_FROM, 20_000, 70_000] {
        for off in (0..FRAME_ALIGN).step_by(9) {
            seq += 1;
            let body = &store[off..off + len];
            let env = [seq, len as u64];
            if seq % 2 == 0 {
                send_all(&mut nms, &mut got, 1, 0, env, &[b"head", body]);
                want.push((1, env, [b"head".as_slice(), body].concat()));
            } else {
                send_all(&mut nms, &mut got, 1, 0, env, &[body]);
                want.push((1, env, body.to_vec()));
            }
            // The other way, read without landing.
            send_all(&mut nms, &mut got, 0, 1, env, &[body]);
            back.push((0, env, body.to_vec()));
        }
        assert!(pump_landing(&mut nms, &mut got, &mut sink, |s| s.seen.len() == want.len()));
    }
    let seen: Vec<_> = sink.seen.iter().map(|(s, e, p, _)| (*s, *e, p.clone())).collect();
    assert!(seen == want, "packets differ from what was sent");
    assert!(nms[0].stats().packets_landed > 0);
    assert!(pump(&mut nms, &mut got, |_, g| g[1].len() == back.len()));
    assert!(got[1] == back, "packets differ from what was sent");
}
