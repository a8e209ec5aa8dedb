//! What an endpoint knows of one peer: the sending window with its round-trip estimate
//! and timers, and the receiving side's expected number, held segments and reassembly.

use super::config::Tuned;
use super::spare::Spare;
use super::wire::Start;
use crate::Envelope;
use std::collections::VecDeque;
use std::time::Duration;

#[derive(Debug)]
pub(super) enum Standing {
    Active,
    /// Silent for too long; the reason as check_peer reports it.
    Failed(String),
    /// Said goodbye.
    Left,
}

/// An unacknowledged segment; its sequence number is its place in the queue.
#[derive(Debug)]
pub(super) struct Seg {
    pub(super) flags: u8,
    pub(super) start: Option<Start>,
    pub(super) data: Vec<u8>,
    /// When last sent (0 and `sends == 0`: not yet).
    pub(super) sent_at: u64,
    pub(super) sends: u32,
}

/// A segment that arrived ahead of a gap.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) seq: u32,
    pub(super) flags: u8,
    pub(super) start: Option<Start>,
    pub(super) data: Vec<u8>,
}

/// A message of several segments, being put together.
#[derive(Debug)]
pub(super) struct Reasm {
    pub(super) env: Envelope,
    pub(super) total: usize,
    pub(super) data: Vec<u8>,
}

/// Everything known about one peer.
#[derive(Debug)]
pub(super) struct Peer<A> {
    pub(super) addr: A,
    /// The tokens of our datagrams to it and of its datagrams to us.
    pub(super) tok_out: u64,
    pub(super) tok_in: u64,
    pub(super) standing: Standing,
    // Sending.
    /// Sequence number of `queue[0]`, the oldest unacknowledged segment.
    pub(super) una: u32,
    /// Segments at the front of `queue` sent at least once.
    pub(super) sent: usize,
    pub(super) queue: VecDeque<Seg>,
    pub(super) srtt: Option<u64>,
    pub(super) rttvar: u64,
    /// The timeout from the measured round trip, and the one in force (backed off).
    pub(super) rto: u64,
    pub(super) rto_cur: u64,
    /// Last acknowledgement that moved the window, or when the queue stopped being empty.
    pub(super) progress_at: u64,
    /// Our goodbye's number while it is unacknowledged.
    pub(super) bye: Option<u32>,
    // Receiving.
    pub(super) expected: u32,
    pub(super) held: Vec<Held>,
    pub(super) reasm: Option<Reasm>,
    /// Segments taken in order and not acknowledged yet, and when the first of them came.
    pub(super) rx_unacked: u32,
    pub(super) rx_since: u64,
    /// The gap last NACKed (its first number) and when.
    pub(super) nacked: Option<(u32, u64)>,
    pub(super) heard_at: Option<u64>,
    /// In the endpoint's timer list.
    pub(super) busy: bool,
}

impl<A: Copy> Peer<A> {
    pub(super) fn new(addr: A, rank: u32, t: &Tuned) -> Self {
        Self {
            addr,
            tok_out: t.key.token(t.me, rank),
            tok_in: t.key.token(rank, t.me),
            standing: Standing::Active,
            una: t.initial_seq,
            sent: 0,
            queue: VecDeque::new(),
            srtt: None,
            rttvar: 0,
            rto: t.rto_initial,
            rto_cur: t.rto_initial,
            progress_at: 0,
            bye: None,
            expected: t.initial_seq,
            held: Vec::new(),
            reasm: None,
            rx_unacked: 0,
            rx_since: 0,
            nacked: None,
            heard_at: None,
            busy: false,
        }
    }

    pub(super) fn active(&self) -> bool {
        matches!(self.standing, Standing::Active)
    }

    pub(super) fn next_seq(&self) -> u32 {
        self.una.wrapping_add(self.queue.len() as u32)
    }

    /// About one round trip: the smoothed one, or the initial timeout before any.
    pub(super) fn rtt(&self, t: &Tuned) -> u64 {
        self.srtt.unwrap_or(t.rto_initial)
    }

    pub(super) fn idle(&self) -> bool {
        self.queue.is_empty() && self.rx_unacked == 0 && self.held.is_empty()
    }

    /// How long a receiver waits before asking again for a gap that a NACK did not fill:
    /// two round trips, or twice the least retransmission timeout before one is known. A
    /// receiver that only receives learns the round trip from its NACKs.
    pub(super) fn renack_after(&self, t: &Tuned) -> u64 {
        self.srtt.unwrap_or(t.rto_min).saturating_mul(2).max(1_000)
    }

    /// Folds in a round-trip sample the usual way (RFC 6298).
    pub(super) fn rtt_sample(&mut self, r: u64, t: &Tuned) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                self.rttvar = (self.rttvar.saturating_mul(3).saturating_add(s.abs_diff(r))) / 4;
                self.srtt = Some((s.saturating_mul(7).saturating_add(r)) / 8);
            }
        }
        let base = self.srtt.unwrap_or(r);
        self.rto = base
            .saturating_add(self.rttvar.saturating_mul(4).max(1_000))
            .clamp(t.rto_min, t.rto_max);
    }

    /// Adds an empty control segment.
    pub(super) fn enqueue_control(&mut self, flag: u8, now: u64, backlog: &mut usize) -> u32 {
        if self.queue.is_empty() {
            self.progress_at = now;
        }
        let seq = self.next_seq();
        self.queue.push_back(Seg {
            flags: flag,
            start: None,
            data: Vec::new(),
            sent_at: 0,
            sends: 0,
        });
        *backlog += 1;
        seq
    }

    /// Forgets everything queued: the peer failed or left.
    pub(super) fn discard(&mut self, backlog: &mut usize) {
        *backlog = backlog.saturating_sub(self.queue.len());
        self.una = self.next_seq();
        self.sent = 0;
        self.queue = VecDeque::new();
        self.bye = None;
        self.rto_cur = self.rto;
    }

    /// Fails the peer if it has acknowledged nothing for the timeout.
    pub(super) fn expire(&mut self, t: &Tuned, now: u64, backlog: &mut usize) {
        if !self.active() || self.queue.is_empty() {
            return;
        }
        let silent = now.saturating_sub(self.progress_at);
        if silent >= t.timeout {
            self.standing = Standing::Failed(format!(
                "it acknowledged nothing for {:.3} s with {} segments outstanding ({} is {:.3} s)",
                Duration::from_nanos(silent).as_secs_f64(),
                self.queue.len(),
                crate::config::NET_TIMEOUT_VAR,
                Duration::from_nanos(t.timeout).as_secs_f64(),
            ));
            self.discard(backlog);
        }
    }

    /// Takes an acknowledgement of `n` more segments.
    pub(super) fn acked(&mut self, n: u32, now: u64, t: &Tuned, backlog: &mut usize, spare: &mut Spare<Seg>) {
        if n == 0 {
            return;
        }
        let old = self.una;
        let mut sample = None;
        for _ in 0..n {
            match self.queue.pop_front() {
                // Karn: a segment sent more than once gives no sample.
                Some(seg) => {
                    sample = (seg.sends == 1).then(|| now.saturating_sub(seg.sent_at));
                    spare.give(seg.data);
                }
                None => break,
            }
        }
        self.una = self.una.wrapping_add(n);
        self.sent = self.sent.saturating_sub(n as usize);
        *backlog = backlog.saturating_sub(n as usize);
        if self.bye.is_some_and(|b| b.wrapping_sub(old) < n) {
            self.bye = None;
        }
        if let Some(r) = sample {
            self.rtt_sample(r, t);
        }
        self.rto_cur = self.rto;
        self.progress_at = now;
        if self.queue.is_empty() {
            spare.take_queue(&mut self.queue);
        }
    }

    /// Counts a segment taken in order, for the ACK timer.
    pub(super) fn took(&mut self, now: u64) {
        if self.rx_unacked == 0 {
            self.rx_since = now;
        }
        self.rx_unacked = self.rx_unacked.saturating_add(1);
        self.expected = self.expected.wrapping_add(1);
    }
}
