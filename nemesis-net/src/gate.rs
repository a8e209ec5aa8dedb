//! Which connections that have not yet proved themselves may stay: for the tcp netmod's
//! listener, and for any other listener of a job (a launcher's process manager).
//!
//! Anyone who can reach a listener can open connections and say nothing. Each such
//! connection costs a descriptor and, while it waits, a place in line; a few thousand of
//! them must not keep a member of the job out. So connections waiting to prove
//! themselves are bounded, per source address and in all, and when a bound is reached
//! the oldest one waiting goes: a member answers its challenge within a round trip, so
//! the connection that has waited longest is the one least likely to be a member. Each
//! should also have a deadline, which the listener's owner keeps.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

/// Most connections waiting to prove themselves from one source address, by default.
pub const PER_SOURCE: usize = 64;
/// Most connections waiting to prove themselves in all, by default.
pub const TOTAL: usize = 256;

/// The connections waiting to prove themselves, oldest first.
#[derive(Debug)]
pub struct Gate {
    per_source: usize,
    total: usize,
    /// (connection, source) in the order they came; closed ones are skipped lazily.
    order: VecDeque<(u64, Option<IpAddr>)>,
    waiting: HashMap<u64, Option<IpAddr>>,
    by_source: HashMap<Option<IpAddr>, usize>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new(PER_SOURCE, TOTAL)
    }
}

impl Gate {
    /// A gate with these bounds (each at least one).
    pub fn new(per_source: usize, total: usize) -> Self {
        Self {
            per_source: per_source.max(1),
            total: total.max(1),
            order: VecDeque::new(),
            waiting: HashMap::new(),
            by_source: HashMap::new(),
        }
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none are waiting.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Lets `cid` from `source` wait, and returns the connections that must go to make
    /// room (the oldest of its source, or the oldest of all), which are forgotten here.
    pub fn admit(&mut self, cid: u64, source: Option<IpAddr>) -> Vec<u64> {
        let mut evicted = Vec::new();
        if self.by_source.get(&source).is_some_and(|&n| n >= self.per_source) {
            if let Some(old) = self.oldest_of(source) {
                self.leave(old);
                evicted.push(old);
            }
        }
        while self.waiting.len() >= self.total {
            match self.oldest() {
                Some(old) => {
                    self.leave(old);
                    evicted.push(old);
                }
                None => break,
            }
        }
        self.order.push_back((cid, source));
        self.waiting.insert(cid, source);
        *self.by_source.entry(source).or_default() += 1;
        evicted
    }

    /// `cid` no longer waits: it proved itself, or it was closed. Unknown ones are ignored.
    pub fn leave(&mut self, cid: u64) {
        let Some(source) = self.waiting.remove(&cid) else {
            return;
        };
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
        // Keep the line short: drop what has left from its front.
        while self
            .order
            .front()
            .is_some_and(|(c, _)| !self.waiting.contains_key(c))
        {
            self.order.pop_front();
        }
        // Compact when most of the line has left from the middle.
        if self.order.len() > 2 * self.waiting.len() + 64 {
            let waiting = &self.waiting;
            self.order.retain(|(c, _)| waiting.contains_key(c));
        }
    }

    /// The connection that has waited longest, to close when descriptors run out.
    pub fn oldest(&self) -> Option<u64> {
        self.order
            .iter()
            .map(|&(c, _)| c)
            .find(|c| self.waiting.contains_key(c))
    }

    fn oldest_of(&self, source: Option<IpAddr>) -> Option<u64> {
        self.order
            .iter()
            .find(|&&(c, s)| s == source && self.waiting.contains_key(&c))
            .map(|&(c, _)| c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    #[test]
    fn one_source_cannot_take_more_than_its_share() {
        let mut g = Gate::new(2, 10);
        assert!(g.admit(1, ip(1)).is_empty());
        assert!(g.admit(2, ip(1)).is_empty());
        assert_eq!(g.admit(3, ip(1)), vec![1], "the oldest of the source goes");
        assert!(g.admit(4, ip(2)).is_empty(), "another source is not affected");
        assert_eq!(g.len(), 3);
    }

    #[test]
    fn the_total_is_bounded_and_the_oldest_goes() {
        let mut g = Gate::new(100, 3);
        for c in 0..3 {
            assert!(g.admit(c, ip(c as u8)).is_empty());
        }
        assert_eq!(g.admit(3, ip(9)), vec![0]);
        g.leave(1);
        assert!(g.admit(4, ip(9)).is_empty(), "a place was free");
        assert_eq!(g.admit(5, ip(9)), vec![2]);
        assert_eq!(g.oldest(), Some(3));
        assert_eq!(g.len(), 3);
    }

    #[test]
    fn a_newcomer_always_gets_in_and_the_line_stays_bounded() {
        let mut g = Gate::new(64, 256);
        let mut evicted = 0;
        for c in 0..100_000u64 {
            evicted += g.admit(c, ip((c % 3) as u8)).len();
            assert!(g.waiting.contains_key(&c));
            if c % 7 == 0 {
                g.leave(c); // some prove themselves
            }
        }
        assert!(g.len() <= 3 * 64);
        assert!(g.order.len() <= 2 * g.len() + 64 + 1);
        assert!(evicted > 85_000, "{evicted}");
        // Leaving twice, or leaving what never came, changes nothing.
        let n = g.len();
        assert!(!g.is_empty());
        g.leave(1);
        g.leave(u64::MAX);
        assert_eq!(g.len(), n);
    }
}
