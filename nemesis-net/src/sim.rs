//! A seeded, in-process, lossy network with a virtual clock, for testing
//! [`crate::reliable`].
//!
//! Endpoints are numbered (`u32` addresses). A datagram sent at virtual time `t` arrives
//! at `t + delay + jitter * u` for a uniform `u` in `[0, 1)`, unless it is lost; a
//! reordered one waits longer still, so that later datagrams overtake it; a duplicated
//! one arrives twice. Nothing moves until the test moves the clock
//! ([`SimNet::advance_to`]), usually to the earliest of [`SimNet::next_arrival`] and the
//! endpoints' deadlines, so a run is deterministic for a seed and takes no real time.

use crate::reliable::Datagram;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How the simulated network misbehaves.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Chance that a datagram is lost, 0 to 1.
    pub loss: f64,
    /// Chance that a datagram arrives twice.
    pub duplicate: f64,
    /// Chance that a datagram is held back so that later ones overtake it.
    pub reorder: f64,
    /// Least time on the wire.
    pub delay: Duration,
    /// Most extra time on the wire, chosen uniformly per datagram.
    pub jitter: Duration,
    /// Largest datagram; a larger send fails as UDP's would (`EMSGSIZE`).
    pub max_datagram: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: Duration::from_micros(50),
            jitter: Duration::ZERO,
            max_datagram: 1472,
        }
    }
}

/// What happened to the datagrams so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Lost: dropped at random, or to or from a closed endpoint.
    pub lost: u64,
    /// Second copies made.
    pub duplicated: u64,
    /// Held back to be overtaken.
    pub reordered: u64,
    /// Put in an endpoint's mailbox, copies and injected ones included.
    pub delivered: u64,
}

/// A datagram on its way.
#[derive(Debug)]
struct InFlight {
    at: u64,
    /// Send order, to break ties deterministically.
    order: u64,
    from: u32,
    to: u32,
    data: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for InFlight {
    /// Reversed, so that the max-heap yields the earliest arrival first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.order).cmp(&(self.at, self.order))
    }
}

/// splitmix64: small, fast, and good enough to pick losses.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `[0, span)` nanoseconds.
    fn upto(&mut self, span: u64) -> u64 {
        if span == 0 { 0 } else { self.next() % span }
    }
}

#[derive(Debug)]
struct Inner {
    cfg: SimConfig,
    delay: u64,
    jitter: u64,
    rng: Rng,
    now: u64,
    order: u64,
    flight: BinaryHeap<InFlight>,
    mailboxes: HashMap<u32, VecDeque<(u32, Vec<u8>)>>,
    closed: HashSet<u32>,
    stats: SimStats,
}

impl Inner {
    fn schedule(&mut self, at: u64, from: u32, to: u32, data: Vec<u8>) {
        self.order += 1;
        self.flight.push(InFlight {
            at,
            order: self.order,
            from,
            to,
            data,
        });
    }

    fn send(&mut self, from: u32, to: u32, data: Vec<u8>) {
        self.stats.sent += 1;
        if self.closed.contains(&from) || self.closed.contains(&to) || self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return;
        }
        let mut at = self.now + self.delay + self.rng.upto(self.jitter);
        if self.rng.chance(self.cfg.reorder) {
            // Long enough for a few later datagrams to pass it.
            at += self.delay + self.jitter + self.rng.upto(2 * (self.delay + self.jitter) + 1);
            self.stats.reordered += 1;
        }
        if self.rng.chance(self.cfg.duplicate) {
            let again = self.now + self.delay + self.rng.upto(self.jitter + self.delay + 1);
            self.stats.duplicated += 1;
            self.schedule(again, from, to, data.clone());
        }
        self.schedule(at, from, to, data);
    }

    /// Moves what has arrived by now into the mailboxes.
    fn deliver_due(&mut self) {
        while self.flight.peek().is_some_and(|f| f.at <= self.now) {
            let Some(f) = self.flight.pop() else { break };
            self.put(f.from, f.to, f.data);
        }
    }

    fn put(&mut self, from: u32, to: u32, data: Vec<u8>) {
        match self.mailboxes.get_mut(&to) {
            Some(q) if !self.closed.contains(&to) => {
                q.push_back((from, data));
                self.stats.delivered += 1;
            }
            // Nobody listens there.
            _ => self.stats.lost += 1,
        }
    }
}

/// The network: shared by its sockets, and by the test that drives the clock.
#[derive(Debug, Clone)]
pub struct SimNet {
    inner: Arc<Mutex<Inner>>,
}

impl SimNet {
    /// A network misbehaving as `cfg` says, its clock at 0.
    pub fn new(cfg: SimConfig) -> Self {
        let delay = u64::try_from(cfg.delay.as_nanos()).unwrap_or(u64::MAX / 4);
        let jitter = u64::try_from(cfg.jitter.as_nanos()).unwrap_or(u64::MAX / 4);
        Self {
            inner: Arc::new(Mutex::new(Inner {
                rng: Rng(cfg.seed),
                cfg,
                delay,
                jitter,
                now: 0,
                order: 0,
                flight: BinaryHeap::new(),
                mailboxes: HashMap::new(),
                closed: HashSet::new(),
                stats: SimStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock left consistent data behind.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A socket at `addr`, which starts taking datagrams now. A second socket at the
    /// same address shares the first one's mailbox.
    pub fn socket(&self, addr: u32) -> SimSocket {
        let mut n = self.lock();
        n.mailboxes.entry(addr).or_default();
        SimSocket {
            net: self.clone(),
            addr,
            max: n.cfg.max_datagram,
        }
    }

    /// The virtual time, nanoseconds.
    pub fn now(&self) -> u64 {
        self.lock().now
    }

    /// Moves the clock to `t` (never back) and delivers what has arrived by then.
    pub fn advance_to(&self, t: u64) {
        let mut n = self.lock();
        n.now = n.now.max(t);
        n.deliver_due();
    }

    /// When the next datagram in flight arrives; datagrams already in a mailbox do not
    /// count.
    pub fn next_arrival(&self) -> Option<u64> {
        self.lock().flight.peek().map(|f| f.at)
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// An endpoint that vanished: what waits for it, what is on its way to or from it,
    /// and whatever it sends or is sent from now on is lost.
    pub fn close(&self, addr: u32) {
        let mut n = self.lock();
        n.closed.insert(addr);
        let waiting = n.mailboxes.get_mut(&addr).map_or(0, |q| std::mem::take(q).len());
        let before = n.flight.len();
        n.flight.retain(|f| f.from != addr && f.to != addr);
        let gone = (before - n.flight.len() + waiting) as u64;
        n.stats.lost += gone;
    }

    /// Puts `data` in `to`'s mailbox at once, as if `from` had sent it: for tests of bad
    /// input. Neither loss nor the size limit applies.
    pub fn inject(&self, from: u32, to: u32, data: &[u8]) {
        self.lock().put(from, to, data.to_vec());
    }
}

/// One endpoint of a [`SimNet`].
#[derive(Debug)]
pub struct SimSocket {
    net: SimNet,
    addr: u32,
    max: usize,
}

impl SimSocket {
    /// This socket's address.
    pub fn addr(&self) -> u32 {
        self.addr
    }
}

impl Datagram for SimSocket {
    type Addr = u32;

    fn max_datagram(&self) -> usize {
        self.max
    }

    fn name(&self) -> &'static str {
        "sim"
    }

    fn send_to(&mut self, parts: &[&[u8]], to: u32) -> io::Result<bool> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a datagram of {len} bytes is larger than the network's {}",
                    self.max
                ),
            ));
        }
        let data = parts.concat();
        self.net.lock().send(self.addr, to, data);
        Ok(true)
    }

    /// The datagram as the network carried it, whole.
    type Rx = Vec<u8>;

    fn recv(&mut self) -> io::Result<Option<(Vec<u8>, u32)>> {
        let mut n = self.net.lock();
        n.deliver_due();
        Ok(n.mailboxes
            .get_mut(&self.addr)
            .and_then(VecDeque::pop_front)
            .map(|(from, data)| (data, from)))
    }

    fn now(&self) -> u64 {
        self.net.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut SimSocket) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((data, from)) = s.recv().unwrap() {
            out.push((from, data));
        }
        out
    }

    #[test]
    fn datagrams_arrive_after_the_delay_in_order() {
        let net = SimNet::new(SimConfig {
            delay: Duration::from_micros(10),
            max_datagram: 16,
            ..SimConfig::default()
        });
        let mut a = net.socket(1);
        let mut b = net.socket(2);
        assert!(a.send_to(&[b"he", b"llo"], 2).unwrap());
        assert!(a.send_to(&[b"world"], 2).unwrap());
        assert!(a.send_to(&[&[0; 17]], 2).is_err(), "too large");
        assert!(drain(&mut b).is_empty());
        assert_eq!(net.next_arrival(), Some(10_000));
        net.advance_to(9_999);
        assert!(drain(&mut b).is_empty());
        net.advance_to(10_000);
        assert_eq!(b.now(), 10_000);
        assert_eq!(drain(&mut b), [(1, b"hello".to_vec()), (1, b"world".to_vec())]);
        assert_eq!(net.next_arrival(), None);
        net.advance_to(5);
        assert_eq!(net.now(), 10_000, "the clock never goes back");
        // Handed up whole.
        a.send_to(&[&[7; 16]], 2).unwrap();
        net.advance_to(20_000);
        assert_eq!(b.recv().unwrap(), Some((vec![7; 16], 1)));
        let s = net.stats();
        assert_eq!((s.sent, s.delivered, s.lost), (3, 3, 0));
    }

    #[test]
    fn runs_are_deterministic_and_misbehave_as_asked() {
        let run = |seed| {
            let net = SimNet::new(SimConfig {
                seed,
                loss: 0.2,
                duplicate: 0.1,
                reorder: 0.2,
                delay: Duration::from_micros(100),
                jitter: Duration::from_micros(50),
                max_datagram: 64,
            });
            let mut a = net.socket(1);
            let mut b = net.socket(2);
            for i in 0..2000u32 {
                a.send_to(&[&i.to_le_bytes()], 2).unwrap();
                net.advance_to(net.now() + 1_000);
            }
            net.advance_to(u64::MAX / 2);
            let got: Vec<u32> = drain(&mut b)
                .iter()
                .map(|(_, d)| u32::from_le_bytes(d[..4].try_into().unwrap()))
                .collect();
            (net.stats(), got)
        };
        let (s, got) = run(42);
        assert_eq!(run(42), (s, got.clone()));
        assert_ne!(run(43).1, got);
        assert_eq!(s.sent, 2000);
        assert!((300..500).contains(&s.lost), "{s:?}");
        assert!((100..260).contains(&s.duplicated), "{s:?}");
        assert!((250..450).contains(&s.reordered), "{s:?}");
        assert_eq!(s.delivered, s.sent - s.lost + s.duplicated);
        assert_eq!(got.len() as u64, s.delivered);
        assert!(got.windows(2).any(|w| w[0] > w[1]), "some overtaken");
    }

    #[test]
    fn closed_endpoints_lose_everything() {
        let net = SimNet::new(SimConfig::default());
        let mut a = net.socket(1);
        let mut b = net.socket(2);
        a.send_to(&[b"on the way"], 2).unwrap();
        b.send_to(&[b"back"], 1).unwrap();
        net.inject(1, 2, b"waiting");
        net.close(2);
        a.send_to(&[b"later"], 2).unwrap();
        b.send_to(&[b"from the grave"], 1).unwrap();
        net.advance_to(1_000_000_000);
        assert!(drain(&mut a).is_empty());
        assert!(drain(&mut b).is_empty());
        assert_eq!(net.next_arrival(), None);
        let s = net.stats();
        assert_eq!((s.sent, s.lost, s.delivered), (4, 5, 1));
        // Injection reaches a live socket at once, whatever its size.
        net.inject(9, 1, &[0; 40]);
        assert_eq!(a.recv().unwrap(), Some((vec![0; 40], 9)));
    }
}
