//! Per-destination lists of packets that a transport had no room for.
//!
//! A send never blocks and never drops: what the transport cannot take now is copied
//! here and moved on, in order, by later polls. Each destination has its own list, so a
//! slow receiver holds up only the traffic to itself.

use super::SendTicket;
use nemesis_shm::Envelope;
use std::collections::VecDeque;

/// A packet waiting for room.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) env: Envelope,
    pub(super) data: Vec<u8>,
}

/// The pending lists of one transport, by destination index.
#[derive(Debug)]
pub(super) struct Pending {
    lists: Vec<VecDeque<Queued>>,
    /// Destinations whose list is not empty.
    busy: Vec<u32>,
    /// Packets in all lists.
    count: usize,
    /// Packets ever queued and ever moved on, per destination; tickets count these.
    queued_total: Vec<u64>,
    moved_total: Vec<u64>,
    /// Whether the tickets name network destinations (ranks) rather than local ones.
    net: bool,
}

impl Pending {
    /// Lists for destinations `0..n`; `net` marks the tickets this hands out.
    pub(super) fn new(n: usize, net: bool) -> Self {
        Self {
            lists: (0..n).map(|_| VecDeque::new()).collect(),
            busy: Vec::new(),
            count: 0,
            queued_total: vec![0; n],
            moved_total: vec![0; n],
            net,
        }
    }

    /// Packets waiting, all destinations together.
    #[inline(always)]
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Whether `dest` has packets waiting, which a new packet to it must follow.
    #[inline]
    pub(super) fn has(&self, dest: u32) -> bool {
        self.lists.get(dest as usize).is_some_and(|l| !l.is_empty())
    }

    /// Copies a packet to the end of `dest`'s list.
    pub(super) fn push(&mut self, dest: u32, env: Envelope, payload: &[&[u8]]) -> SendTicket {
        let d = dest as usize;
        if self.lists[d].is_empty() {
            self.busy.push(dest);
        }
        self.lists[d].push_back(Queued {
            env,
            data: payload.concat(),
        });
        self.count += 1;
        self.queued_total[d] += 1;
        SendTicket {
            peer: dest,
            n: self.queued_total[d],
            net: self.net,
        }
    }

    /// Offers each destination's packets, in order, to `take`, until it declines one
    /// (no room for that destination) or the list is empty. `take` answering `None`
    /// says the destination is gone: its packets are discarded, and counted as moved so
    /// that no one waits for them. Returns how many were discarded.
    pub(super) fn drain<E>(
        &mut self,
        mut take: impl FnMut(u32, &Queued) -> Result<Option<bool>, E>,
    ) -> Result<usize, E> {
        let mut discarded = 0;
        let mut i = 0;
        while i < self.busy.len() {
            let dest = self.busy[i];
            let d = dest as usize;
            while let Some(m) = self.lists[d].front() {
                match take(dest, m)? {
                    Some(true) => {}
                    Some(false) => break,
                    None => {
                        discarded += self.lists[d].len();
                        self.count -= self.lists[d].len();
                        self.moved_total[d] = self.queued_total[d];
                        self.lists[d].clear();
                        break;
                    }
                }
                self.lists[d].pop_front();
                self.count -= 1;
                self.moved_total[d] += 1;
            }
            if self.lists[d].is_empty() {
                self.busy.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(discarded)
    }

    /// Whether the packet `t` names has left its list.
    pub(super) fn is_sent(&self, t: SendTicket) -> bool {
        self.moved_total.get(t.peer as usize).is_none_or(|&m| m >= t.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_drain_in_order_per_destination_and_tickets_follow() {
        let mut p = Pending::new(3, false);
        let t0 = p.push(1, [1, 0], &[b"a"]);
        let t1 = p.push(1, [2, 0], &[b"b", b"c"]);
        let t2 = p.push(2, [3, 0], &[]);
        assert_eq!(p.count(), 3);
        assert!(p.has(1) && p.has(2) && !p.has(0) && !p.has(9));
        // Destination 1 takes one packet, then has no room; 2 takes everything.
        let mut seen = Vec::new();
        let mut room1 = 1;
        p.drain(|d, m| {
            if d == 1 && room1 == 0 {
                return Ok::<_, ()>(Some(false));
            }
            if d == 1 {
                room1 -= 1;
            }
            seen.push((d, m.env[0], m.data.clone()));
            Ok(Some(true))
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen, vec![(1, 1, b"a".to_vec()), (2, 3, Vec::new())]);
        assert!(p.is_sent(t0) && !p.is_sent(t1) && p.is_sent(t2));
        assert_eq!(p.count(), 1);
        // A destination that is gone: its packets are discarded and their tickets end.
        let n = p.drain(|_, _| Ok::<_, ()>(None)).unwrap();
        assert_eq!((n, p.count()), (1, 0));
        assert!(p.is_sent(t1) && !p.has(1));
        // An error stops the drain and leaves the packet in place.
        p.push(0, [4, 0], &[b"x"]);
        assert!(p.drain(|_, _| Err::<Option<bool>, _>("boom")).is_err());
        assert_eq!(p.count(), 1);
    }
}
