//! What every netmod promises, written once. A test binary names the netmods it runs it
//! against with [`netmod_suite!`]: `tests/conformance.rs` for tcp and udp on the host,
//! `tests/verbs.rs` for ud and rc where a verbs device is.
//!
//! Every check goes through [`nemesis_net::open`] and the [`Netmod`] trait only, so a
//! netmod passes exactly when it keeps the trait's promises: packets to one peer arrive in
//! order and exactly once, "again" takes nothing, a goodbye and a death are reported, and
//! bad input is counted and dropped without harm.

#![allow(dead_code)]

use nemesis_net::{Accept, Cards, Envelope, Identity, NetError, Netmod, WaitHint};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A netmod under test.
pub struct Kind {
    /// Its name, as `NEMESIS_NETMOD` says it.
    pub name: &'static str,
    /// The address every rank binds and publishes.
    pub addr: fn() -> IpAddr,
    /// Whether it can run here; `false` makes every test return at once (a machine
    /// without the device), and says why on stderr.
    pub here: fn() -> bool,
    /// Sends `junk` to the endpoint whose business card is `card`, as a stranger would:
    /// bytes the netmod must count and drop.
    pub inject: fn(card: &[u8], junk: &[u8]),
    /// The netmod's own variables for every job of the suite.
    pub vars: &'static [(&'static str, &'static str)],
}

/// Cards every netmod of a job shares, filled in once all are open.
#[derive(Clone, Default)]
struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

impl Cards for Table {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        self.0.lock().unwrap().card(rank)
    }
}

const KEY: [u8; 32] = [0x5e; 32];

/// `n` netmods of `kind`, ranks 0..n of one job, with `vars` set besides the kind's.
pub fn job(kind: &Kind, n: u32, vars: &[(&str, &str)]) -> Vec<Box<dyn Netmod>> {
    let table = Table::default();
    let lookup = |k: &str| {
        vars.iter()
            .chain(kind.vars)
            .find(|(v, _)| *v == k)
            .map(|(_, x)| (*x).to_string())
    };
    let nms: Vec<Box<dyn Netmod>> = (0..n)
        .map(|rank| {
            let id = Identity {
                rank,
                size: n,
                job_key: nemesis_net::auth::JobKey::from_bytes(KEY),
                addr: (kind.addr)(),
            };
            nemesis_net::open(kind.name, id, Box::new(table.clone()), &lookup)
                .unwrap_or_else(|e| panic!("{}: opening rank {rank}: {e}", kind.name))
        })
        .collect();
    *table.0.lock().unwrap() = nms.iter().map(|m| m.business_card()).collect();
    nms
}

/// A planned packet: (from, to, envelope, payload).
type Planned = (u32, u32, Envelope, Vec<u8>);

/// What each rank received: (source, envelope, payload).
pub type Got = Vec<(u32, Envelope, Vec<u8>)>;

/// Bytes that say where they belong.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed.wrapping_mul(131)) as u8)
        .collect()
}

/// Polls every live netmod once, collecting what arrives; returns how many arrived.
fn poll_all(nms: &mut [Box<dyn Netmod>], got: &mut [Got], live: &[bool]) -> usize {
    let mut any = 0;
    for (i, nm) in nms.iter_mut().enumerate() {
        if live[i] {
            let g = &mut got[i];
            any += nm.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
        }
    }
    any
}

/// Sends one packet, polling every netmod (collecting what arrives) while the answer is
/// "again": a netmod may need its peer to poll before it takes anything (rc connects).
fn send_now(nms: &mut [Box<dyn Netmod>], got: &mut [Got], from: usize, to: u32, env: &Envelope, data: &[u8]) {
    let live = vec![true; nms.len()];
    let end = Instant::now() + Duration::from_secs(30);
    while nms[from].send(to, env, &[data]).unwrap() != Accept::Sent {
        assert!(
            Instant::now() < end,
            "{}: a send was never taken",
            nms[from].name()
        );
        poll_all(nms, got, &live);
    }
}

/// Sends every planned `(from, to, envelope, payload)` in order per sender, scattered
/// into `pieces` slices, polling all the while, until everything planned has arrived.
fn exchange(kind: &Kind, nms: &mut [Box<dyn Netmod>], plan: &[Planned], pieces: usize) -> Vec<Got> {
    let n = nms.len();
    let mut got: Vec<Got> = vec![Vec::new(); n];
    let live = vec![true; n];
    // Each sender's messages, in order.
    let mine: Vec<Vec<&Planned>> = (0..n)
        .map(|s| plan.iter().filter(|m| m.0 as usize == s).collect())
        .collect();
    let mut next = vec![0usize; n];
    let end = Instant::now() + Duration::from_secs(120);
    while got.iter().map(Vec::len).sum::<usize>() < plan.len() {
        assert!(
            Instant::now() < end,
            "{}: stuck with {:?} of {} received",
            kind.name,
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            plan.len()
        );
        for s in 0..n {
            while let Some((_, to, env, data)) = mine[s].get(next[s]).copied() {
                let parts = scatter(data, pieces);
                match nms[s].send(*to, env, &parts).unwrap() {
                    Accept::Sent => next[s] += 1,
                    Accept::Again => break,
                }
            }
        }
        if poll_all(nms, &mut got, &live) == 0 {
            nms[0].wait(Duration::from_millis(1)).unwrap();
        }
    }
    got
}

/// `data` cut into `pieces` slices of uneven lengths, some of them empty.
fn scatter(data: &[u8], pieces: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(pieces);
    let mut rest = data;
    for i in 0..pieces.saturating_sub(1) {
        let k = if i % 3 == 1 {
            0
        } else {
            (rest.len() / 3).max(1).min(rest.len())
        };
        let (a, b) = rest.split_at(k);
        out.push(a);
        rest = b;
    }
    out.push(rest);
    out
}

/// Checks that every rank got exactly the messages planned for it, each source's in the
/// order sent.
fn check(kind: &Kind, plan: &[Planned], got: &[Got]) {
    for (r, g) in got.iter().enumerate() {
        let want: Vec<(u32, Envelope, &[u8])> = plan
            .iter()
            .filter(|m| m.1 as usize == r)
            .map(|m| (m.0, m.2, &m.3[..]))
            .collect();
        assert_eq!(
            g.len(),
            want.len(),
            "{}: rank {r} got the wrong number",
            kind.name
        );
        for src in 0..got.len() as u32 {
            let a: Vec<_> = g.iter().filter(|m| m.0 == src).map(|m| (m.1, &m.2[..])).collect();
            let b: Vec<_> = want.iter().filter(|m| m.0 == src).map(|m| (m.1, m.2)).collect();
            assert!(
                a == b,
                "{}: rank {r} got rank {src}'s messages wrong or out of order",
                kind.name
            );
        }
    }
}

/// Packets both ways between two ranks, of every size from empty to the largest,
/// arrive in order, exactly once, intact.
pub fn ordered_between_two(kind: &Kind) {
    let mut nms = job(kind, 2, &[]);
    let max = nms[0].max_payload();
    assert_eq!(max, nms[1].max_payload(), "{}", kind.name);
    let sizes = [
        0,
        1,
        7,
        100,
        1000,
        1023,
        1024,
        1025,
        4096,
        5000,
        30_000,
        max - 1,
        max,
    ];
    let mut plan = Vec::new();
    for round in 0..3u64 {
        for (i, &len) in sizes.iter().enumerate() {
            for s in 0..2u32 {
                let k = round * 100 + i as u64;
                plan.push((s, 1 - s, [k, u64::from(s)], payload(k, len.min(max))));
            }
        }
    }
    let got = exchange(kind, &mut nms, &plan, 2);
    check(kind, &plan, &got);
}

/// Every rank of three sends to both others; each pair's packets stay in order.
pub fn ordered_among_three(kind: &Kind) {
    let mut nms = job(kind, 3, &[]);
    let max = nms[0].max_payload();
    let mut plan = Vec::new();
    for s in 0..3u32 {
        for k in 0..40u64 {
            let to = (s + 1 + (k % 2) as u32) % 3;
            let len = ((k as usize) * 997) % (max + 1);
            plan.push((s, to, [k, u64::from(s)], payload(k * 3 + u64::from(s), len)));
        }
    }
    let got = exchange(kind, &mut nms, &plan, 1);
    check(kind, &plan, &got);
}

/// The largest packets, gathered from many slices (some empty), arrive whole.
pub fn large_and_scattered(kind: &Kind) {
    let mut nms = job(kind, 2, &[]);
    let max = nms[0].max_payload();
    let plan: Vec<_> = (0..8u64)
        .map(|k| (0, 1, [k, 9], payload(k, max - (k as usize % 3))))
        .collect();
    let got = exchange(kind, &mut nms, &plan, 9);
    check(kind, &plan, &got);
}

/// A sender whose peer does not poll is told "again" at last; what it was told "again"
/// for was not taken (it never arrives unless sent again), and what was taken arrives,
/// once each, in order.
pub fn back_pressure_takes_nothing_on_again(kind: &Kind) {
    let mut nms = job(kind, 2, &[]);
    let len = nms[0].max_payload().min(16 << 10);
    let mut taken = 0u64;
    let mut refused = 0u64;
    let end = Instant::now() + Duration::from_secs(60);
    // Rank 1 does not poll: rank 0 fills whatever lies between them.
    while refused < 3 {
        assert!(
            Instant::now() < end,
            "{}: never answered again ({taken} taken)",
            kind.name
        );
        let before = nms[0].stats().packets_sent;
        // A refused packet is offered again under the same number: had any of it been
        // taken, rank 1 would see that number twice.
        match nms[0].send(1, &[taken, 0], &[&payload(taken, len)]).unwrap() {
            Accept::Sent => taken += 1,
            Accept::Again => {
                refused += 1;
                assert_eq!(
                    nms[0].stats().packets_sent,
                    before,
                    "{}: again, yet counted sent",
                    kind.name
                );
                nms[0].poll(&mut |_, _, _| {}).unwrap();
            }
        }
        assert!(
            taken < 1_000_000,
            "{}: took a million packets without a poll at the peer",
            kind.name
        );
    }
    // Now rank 1 polls; rank 0 sends a few more after the backlog.
    let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
    let mut extra = 0u64;
    let total = taken + 5;
    while (got[1].len() as u64) < total {
        assert!(
            Instant::now() < end,
            "{}: {} of {total} arrived",
            kind.name,
            got[1].len()
        );
        if extra < 5
            && nms[0]
                .send(1, &[taken + extra, 0], &[&payload(taken + extra, len)])
                .unwrap()
                == Accept::Sent
        {
            extra += 1;
        }
        if poll_all(&mut nms, &mut got, &[true, true]) == 0 {
            nms[1].wait(Duration::from_millis(1)).unwrap();
        }
    }
    for (i, (src, env, data)) in got[1].iter().enumerate() {
        assert_eq!(
            (*src, env[0], env[1]),
            (0, i as u64, 0),
            "{}: packet {i}",
            kind.name
        );
        assert!(
            *data == payload(i as u64, len),
            "{}: packet {i} damaged",
            kind.name
        );
    }
    // Nothing more comes: no refused packet slipped through late.
    let settle = Instant::now() + Duration::from_millis(300);
    while Instant::now() < settle {
        poll_all(&mut nms, &mut got, &[true, true]);
    }
    assert_eq!(
        got[1].len() as u64,
        total,
        "{}: more arrived than was taken",
        kind.name
    );
}

/// A rank that shuts down delivers what it sent first and says goodbye: its peer then
/// reports it as gone, and sends to it fail.
pub fn goodbye(kind: &Kind) {
    let mut nms = job(kind, 2, &[]);
    let mut early: Vec<Got> = vec![Vec::new(), Vec::new()];
    let sent = 10u64;
    for i in 0..sent {
        send_now(&mut nms, &mut early, 0, 1, &[i, 0], &payload(i, 3000));
    }
    let mut leaver = nms.remove(0);
    let mut stayer = nms.remove(0);
    let mut got = std::mem::take(&mut early[1]);
    // The leaver shuts down on a thread while the peer polls, as two processes would.
    let t = std::thread::spawn(move || {
        leaver.shutdown(Duration::from_secs(20));
        leaver
    });
    let end = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        assert!(Instant::now() < end, "{}: the goodbye never came", kind.name);
        stayer.poll(&mut |s, e, b| got.push((s, *e, b.to_vec()))).unwrap();
        if let Err(e) = stayer.check_peer(0) {
            break e;
        }
        stayer.wait(Duration::from_millis(1)).unwrap();
    };
    let leaver = t.join().unwrap();
    assert!(
        matches!(&reason, NetError::PeerFailed { rank: 0, reason } if reason.contains("goodbye")),
        "{}: {reason}",
        kind.name
    );
    assert_eq!(
        got.len() as u64,
        sent,
        "{}: not everything sent before the goodbye arrived",
        kind.name
    );
    for (i, (_, env, data)) in got.iter().enumerate() {
        assert!(
            env[0] == i as u64 && *data == payload(i as u64, 3000),
            "{}: packet {i}",
            kind.name
        );
    }
    assert!(
        stayer.send(0, &[0, 0], &[b"late"]).is_err(),
        "{}: a send to a leaver",
        kind.name
    );
    drop(leaver);
}

/// A peer that vanishes without a word is reported by `check_peer` within the bound
/// `NEMESIS_NET_TIMEOUT` sets, to a caller that keeps checking and polling.
pub fn a_dead_peer_is_reported_within_the_bound(kind: &Kind) {
    let timeout = 1.0;
    let mut nms = job(kind, 2, &[("NEMESIS_NET_TIMEOUT", "1")]);
    let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
    // Talk first, so that both know each other.
    send_now(&mut nms, &mut got, 0, 1, &[1, 0], b"hello");
    let end = Instant::now() + Duration::from_secs(30);
    while got[1].is_empty() {
        assert!(Instant::now() < end, "{}: nothing arrived", kind.name);
        poll_all(&mut nms, &mut got, &[true, true]);
    }
    let dead = nms.pop().unwrap();
    drop(dead);
    let t0 = Instant::now();
    let mut alive = nms.pop().unwrap();
    let bound = Duration::from_secs_f64(timeout * 5.0);
    let err = loop {
        assert!(
            t0.elapsed() < bound,
            "{}: a dead peer was not reported within {bound:?}",
            kind.name
        );
        if let Err(e) = alive.check_peer(1) {
            break e;
        }
        alive.poll(&mut |_, _, _| {}).unwrap();
        alive.wait(Duration::from_millis(5)).unwrap();
    };
    assert!(
        matches!(err, NetError::PeerFailed { rank: 1, .. }),
        "{}: {err}",
        kind.name
    );
    assert!(
        alive.send(1, &[0, 0], &[b"x"]).is_err(),
        "{}: a send to a dead peer",
        kind.name
    );
}

/// Strangers' bytes are counted under a reason and dropped, and the netmod goes on
/// carrying its job's packets as before.
pub fn bad_input_is_counted_and_dropped(kind: &Kind) {
    let mut nms = job(kind, 2, &[]);
    let card = nms[1].business_card();
    let junk: [&[u8]; 4] = [b"", b"x", &[0xff; 100], &[0; 64]];
    for j in junk {
        (kind.inject)(&card, j);
    }
    let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
    let end = Instant::now() + Duration::from_secs(30);
    while nms[1].stats().drops.total() == 0 {
        assert!(
            Instant::now() < end,
            "{}: nothing was counted as dropped",
            kind.name
        );
        poll_all(&mut nms, &mut got, &[true, true]);
        nms[1].wait(Duration::from_millis(1)).unwrap();
    }
    assert!(
        got.iter().all(Vec::is_empty),
        "{}: junk was handed up: {got:?}",
        kind.name
    );
    let plan = vec![(0, 1, [5, 5], payload(5, 2000)), (1, 0, [6, 6], payload(6, 10))];
    let got = exchange(kind, &mut nms, &plan, 1);
    check(kind, &plan, &got);
}

fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// The descriptor a waiter sleeps on is readable exactly when a poll may find something.
pub fn the_wait_descriptor_is_readable_when_a_packet_waits_and_not_when_nothing_does(kind: &Kind) {
    let name = kind.name;
    {
        let mut nms = job(kind, 2, &[]);
        // Make contact both ways, then let everything settle.
        let mut early: Vec<Got> = vec![Vec::new(), Vec::new()];
        send_now(&mut nms, &mut early, 0, 1, &[1, 0], b"hello");
        let mut got = early[1].len();
        let (a, b) = nms.split_at_mut(1);
        let end = Instant::now() + Duration::from_secs(10);
        while got == 0 {
            assert!(Instant::now() < end, "{name}: nothing arrived");
            a[0].poll(&mut |_, _, _| {}).unwrap();
            got += b[0].poll(&mut |_, _, _| {}).unwrap();
        }
        // Acknowledgements and replies go out; then nothing is left to do.
        let settle = Instant::now() + Duration::from_millis(500);
        while Instant::now() < settle {
            for m in nms.iter_mut() {
                m.poll(&mut |_, _, _| {}).unwrap();
            }
        }
        let fd = nms[1].wait_fd().expect("a wait descriptor").as_raw_fd();
        assert!(
            matches!(nms[1].wait_hint().unwrap(), WaitHint::Later(_)),
            "{name}: nothing to do"
        );
        assert!(!readable(fd, 0), "{name}: readable with nothing to read");
        assert_eq!(nms[0].send(1, &[2, 0], &[b"wake"]).unwrap(), Accept::Sent);
        // udp sends from `send`; tcp may leave bytes for the next poll.
        nms[0].poll(&mut |_, _, _| {}).unwrap();
        assert!(readable(fd, 5000), "{name}: not readable after a packet came");
        assert_eq!(nms[1].wait_hint().unwrap(), WaitHint::Now, "{name}");
        let mut seen = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while seen.is_empty() {
            assert!(Instant::now() < end, "{name}: the packet did not come");
            nms[1]
                .poll(&mut |src, env, p| seen.push((src, env[0], p.to_vec())))
                .unwrap();
        }
        assert_eq!(seen, vec![(0, 2, b"wake".to_vec())], "{name}");
    }
}

/// A packet over the largest is refused, typed; one of exactly the largest is taken.
pub fn a_packet_over_the_largest_is_refused_and_one_of_exactly_it_taken(kind: &Kind) {
    let name = kind.name;
    {
        let mut nms = job(kind, 2, &[]);
        let max = nms[0].max_payload();
        let big = vec![0u8; max + 1];
        match nms[0].send(1, &[0, 0], &[&big]) {
            Err(NetError::TooLarge { len, max: m }) => assert_eq!((len, m), (max + 1, max), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let exact = vec![0u8; max];
        let end = Instant::now() + Duration::from_secs(10);
        while nms[0]
            .send(1, &[0, 0], &[&exact[..max / 2], &exact[max / 2..]])
            .unwrap()
            == Accept::Again
        {
            assert!(Instant::now() < end, "{name}: never taken");
            for m in nms.iter_mut() {
                m.poll(&mut |_, _, _| {}).unwrap();
            }
        }
        let mut got = 0;
        while got == 0 {
            assert!(Instant::now() < end, "{name}: never arrived");
            nms[0].poll(&mut |_, _, _| {}).unwrap();
            nms[1]
                .poll(&mut |_, _, p| {
                    assert_eq!(p.len(), max);
                    got += 1;
                })
                .unwrap();
        }
    }
}

/// One `#[test]` per check of the suite, for the netmod `$kind` (a [`Kind`]), in a module
/// named `$m`.
#[macro_export]
macro_rules! netmod_suite {
    ($m:ident, $kind:expr) => {
        mod $m {
            use super::suite;
            $crate::netmod_suite!(@tests $kind;
                ordered_between_two,
                ordered_among_three,
                large_and_scattered,
                back_pressure_takes_nothing_on_again,
                goodbye,
                a_dead_peer_is_reported_within_the_bound,
                bad_input_is_counted_and_dropped,
                the_wait_descriptor_is_readable_when_a_packet_waits_and_not_when_nothing_does,
                a_packet_over_the_largest_is_refused_and_one_of_exactly_it_taken
            );
        }
    };
    (@tests $kind:expr; $($t:ident),*) => {
        $(
            #[test]
            fn $t() {
                let kind = $kind;
                if (kind.here)() {
                    suite::$t(&kind);
                }
            }
        )*
    };
}
