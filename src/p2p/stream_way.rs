//! Which way a stream's longer messages go within the node: as a run of packets (copied
//! in and out, no handshake) or by rendezvous (a handshake, then a large-message
//! strategy, which may copy once).
//!
//! Which moves more depends on where the two processes run. On the 2-vCPU AMD EPYC
//! guest, osu_bw at 256 KiB moved 15–17 GB/s as packets against 12–13 by `cma-split`
//! with the CPUs sharing a cache, and about 4 against 11–13 without; the hypervisor moves
//! the CPUs while a job runs (BENCHMARKS.md). So the sender times its streams to each
//! peer, one *episode* at a time, and sends the way that moved more lately, looking at
//! the other now and then ([`Tuner`]). Where the rendezvous copies by the kernel (the
//! default order on Intel CPUs), it moved more at every size measured, and the choice
//! is off unless `NEMESIS_STREAM_TUNE_LIMIT` is set (`DEFAULT_STREAM_TUNE_LIMIT`).
//!
//! An episode starts with a send longer than the stream medium limit to a peer that
//! this side has sent nothing to since it last took a packet from it
//! (`Channel::sent_since_taken` says no): osu_bw's window starts one, and the
//! acknowledgement that ends the window lets the next start. It lasts until the next
//! one starts, or for [`MAX_SENDS`] sends, and its time runs from its first send to the
//! next episode's first, so the receiver's copies and the acknowledgement count, the same
//! for either way. An episode's first message, unless it answers through the pair
//! buffer, goes the way that moved more so far: a lone message cannot be timed, and a
//! ping-pong is all first messages. The way of the rest, a look at the slower way
//! included, is chosen at the second. (A window's first message by rendezvous where its
//! rest go as packets keeps the receiver from draining the cells they need.)
//!
//! Above the stream tune limit and up to the stream copies limit
//! (`NEMESIS_STREAM_COPIES_LIMIT`), the same choice is between two rendezvous: one that
//! offers every strategy (on the AMD guest `cma-split` first, both processes copying by
//! the kernel) and one that offers only nemesis's own copies ([`Way::OwnCopies`]: the
//! copy ring, or chunks while it is busy), which moved more through a shared cache at
//! 1 MiB and a third as much without one.

use nemesis_lmt::tune::{Tuner, band};
use std::time::Instant;

/// How a stream's message longer than the stream medium limit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// By rendezvous.
    Rendezvous,
    /// As a run of packets, when the cells have room for the whole run (else by
    /// rendezvous after all).
    Packets,
    /// By rendezvous, offering only nemesis's own copies (the copy ring, or chunks
    /// while it is busy), not the kernel's.
    OwnCopies,
}

/// Sends after which an episode is cut, so that a stream one way that never takes a
/// packet back is timed too.
pub(crate) const MAX_SENDS: u32 = 256;

/// Sends an episode needs to be timed: a lone message is no stream.
const MIN_SENDS: u32 = 2;

/// An episode under way with one peer.
#[derive(Debug, Clone, Copy)]
struct Episode {
    start: Instant,
    /// Bytes sent to the peer in it.
    bytes: usize,
    /// The length of its first message: its size band.
    len: usize,
    /// The way its messages go, once one asked.
    way: Option<Way>,
    /// Messages sent in it.
    sends: u32,
    /// One of them was in another size band than the first (the tuner's bands): not
    /// timed.
    mixed: bool,
}

impl Episode {
    fn new(start: Instant, len: usize) -> Self {
        Self {
            start,
            bytes: len,
            len,
            way: None,
            sends: 1,
            mixed: false,
        }
    }
}

/// Episodes in a look at a way, the first of each way's timed too: an episode is a
/// window of messages, whose cold start weighs little, and a look at the slower way
/// costs a window's worth of the difference.
const LOOK: u32 = 2;

/// Episodes between looks at the slower way, per time slower: a window takes from tens
/// of microseconds to milliseconds, and a hypervisor moves CPUs over seconds, so a look
/// every few hundred windows follows a move within a second and costs a few percent
/// at most (2 windows of 256 at twice the time: 0.8%).
const LOOK_EVERY: u64 = 256;

/// What the way the rule without timing takes counts its figure as: another must be
/// faster by more than a tenth to be taken instead. Two windows of each way decide a
/// fresh sender's choice, and on the 2-vCPU guests one slowed window in a few made it
/// pick the slower way (a 128 KiB osu_bw with the CPUs sharing a cache took the
/// rendezvous in 2 rounds of 15); the ways this is for differ by a quarter or more
/// (BENCHMARKS.md).
const FAVOR_RULE: f64 = 0.9;

/// The sender's episodes and their figures, per peer.
#[derive(Debug)]
pub(crate) struct StreamWays {
    tuner: Tuner<Way>,
    /// The episode under way with each world rank.
    open: Vec<Option<Episode>>,
}

impl Default for StreamWays {
    fn default() -> Self {
        Self {
            tuner: Tuner::with_looks(LOOK, false, LOOK_EVERY).favoring_first(FAVOR_RULE),
            open: Vec::new(),
        }
    }
}

impl StreamWays {
    /// A send of `len` bytes to `peer` that starts an episode: the one under way ends,
    /// and is timed.
    pub(crate) fn start(&mut self, peer: u32, len: usize, now: Instant) {
        self.close(peer, now);
        *self.slot(peer) = Some(Episode::new(now, len));
    }

    /// A send of `len` bytes to `peer` in the stream of the episode under way. `now` is
    /// asked only where an episode starts here.
    pub(crate) fn more(&mut self, peer: u32, len: usize, now: impl FnOnce() -> Instant) {
        match self.slot(peer) {
            Some(ep) if ep.sends < MAX_SENDS => {
                ep.sends += 1;
                ep.bytes += len;
                ep.mixed |= band(len) != band(ep.len);
            }
            _ => self.start(peer, len, now()),
        }
    }

    /// The way the episode under way with `peer` sends its message of `len` bytes, of
    /// the two in `order`, the first the way the rule without timing takes, tried
    /// first. Its first message goes the way that moved more so far (a lone message
    /// cannot be timed, and a ping-pong is all first messages); the way of the rest is
    /// chosen at the second, a look at the slower way included.
    pub(crate) fn choose(&mut self, peer: u32, len: usize, mut order: [Way; 2]) -> Way {
        match self.open.get(peer as usize) {
            Some(Some(Episode { way: Some(w), .. })) => return *w,
            Some(Some(Episode { sends: 2.., .. })) => {}
            _ => {
                self.tuner.prefer(peer, len, &mut order);
                return order[0];
            }
        }
        self.tuner.rank(peer, len, &mut order);
        if let Some(ep) = self.slot(peer) {
            ep.way = Some(order[0]);
        }
        order[0]
    }

    /// What `way` took per KiB of a stream of `len`-byte messages to `peer`, as far as
    /// measured.
    #[cfg(test)]
    pub(crate) fn figure(&self, peer: u32, len: usize, way: Way) -> Option<f64> {
        self.tuner.figure(peer, len, way)
    }

    /// Ends the episode with `peer` at `now`, timing it if it was a stream of one way
    /// and one size band.
    fn close(&mut self, peer: u32, now: Instant) {
        let Some(ep) = self.slot(peer).take() else {
            return;
        };
        if let (Some(way), false, true) = (ep.way, ep.mixed, ep.sends >= MIN_SENDS) {
            let ns = now.saturating_duration_since(ep.start).as_nanos() as f64;
            self.tuner.record_over(peer, ep.len, ep.bytes, way, ns);
        }
    }

    fn slot(&mut self, peer: u32) -> &mut Option<Episode> {
        let i = peer as usize;
        if self.open.len() <= i {
            self.open.resize(i + 1, None);
        }
        &mut self.open[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LEN: usize = 256 << 10;

    /// The rule's way first: the rendezvous, then packets.
    const RP: [Way; 2] = [Way::Rendezvous, Way::Packets];
    /// Packets first.
    const PR: [Way; 2] = [Way::Packets, Way::Rendezvous];
    /// Above the stream tune limit: the rendezvous with every strategy, then with own
    /// copies only.
    const RC: [Way; 2] = [Way::Rendezvous, Way::OwnCopies];

    /// Runs one episode of `window` messages of `len` bytes to peer 1 from `t`, choosing
    /// between the ways of `order`, the stream moving `gb_s(way)` GB/s; returns the way
    /// and the time the next episode starts.
    fn episode(
        s: &mut StreamWays,
        t: Instant,
        window: u32,
        (len, order): (usize, [Way; 2]),
        gb_s: impl Fn(Way) -> f64,
    ) -> (Way, Instant) {
        s.start(1, len, t);
        s.choose(1, len, order);
        s.more(1, len, || unreachable!("an episode is under way"));
        let w = s.choose(1, len, order);
        assert!(order.contains(&w), "{w:?} is not one of {order:?}");
        for _ in 2..window {
            s.more(1, len, || unreachable!("an episode is under way"));
            assert_eq!(s.choose(1, len, order), w, "one way an episode");
        }
        let ns = (window as usize * len) as f64 / gb_s(w);
        (w, t + Duration::from_nanos(ns as u64))
    }

    /// The CPUs share a cache: packets, and own copies, move more than the rendezvous
    /// by the kernel.
    fn near(w: Way) -> f64 {
        match w {
            Way::Packets | Way::OwnCopies => 16.0,
            Way::Rendezvous => 12.0,
        }
    }

    fn far(w: Way) -> f64 {
        match w {
            Way::Packets | Way::OwnCopies => 4.0,
            Way::Rendezvous => 12.0,
        }
    }

    #[test]
    fn each_way_is_tried_then_the_one_that_moved_more_is_kept_and_a_move_is_followed() {
        // Packets against the rendezvous, and above the stream tune limit, own copies
        // against the rendezvous with every strategy.
        for (len, order) in [(LEN, RP), (4 * LEN, RC)] {
            let other = order[1];
            let mut s = StreamWays::default();
            let mut t = Instant::now();
            let mut run = |s: &mut StreamWays, n: usize, gb_s: fn(Way) -> f64| {
                (0..n)
                    .map(|_| {
                        let (w, next) = episode(s, t, 16, (len, order), gb_s);
                        t = next;
                        w
                    })
                    .collect::<Vec<_>>()
            };
            let first = run(&mut s, 8, near);
            assert_eq!(
                first[..4],
                [[Way::Rendezvous; 2], [other; 2]].concat(),
                "the way without timing first, each for a look"
            );
            let settled = run(&mut s, 40, near);
            assert!(settled.iter().all(|&w| w == other), "{settled:?}");
            let faster = s.figure(1, len, other).expect("timed");
            let rendezvous = s.figure(1, len, Way::Rendezvous).expect("timed");
            assert!(faster < rendezvous, "{faster} against {rendezvous} ns per KiB");
            // The CPUs stop sharing a cache: the rendezvous is looked at again and kept.
            let after = run(&mut s, 1200, far);
            let back = after
                .iter()
                .position(|&w| w == Way::Rendezvous)
                .expect("the rendezvous looked at again");
            assert!(back <= 2 * LOOK_EVERY as usize, "after {back} episodes");
            let rest = &after[back + 2 * LOOK as usize..];
            let slow = rest.iter().filter(|&&w| w == other).count();
            assert!(
                slow * 10 <= rest.len(),
                "{slow} of {} episodes the slower way",
                rest.len()
            );
        }
    }

    #[test]
    fn lone_mixed_and_never_ending_streams() {
        let mut s = StreamWays::default();
        let t = Instant::now();
        // A ping-pong: every send starts an episode, none in a stream, nothing timed.
        for i in 0..20 {
            s.start(1, LEN, t + Duration::from_micros(i));
            s.choose(1, LEN, RP);
        }
        assert_eq!(s.figure(1, LEN, Way::Rendezvous), None);
        // Two size bands in one episode: not timed.
        for i in 0..10u64 {
            let t = t + Duration::from_millis(i);
            s.start(1, LEN, t);
            s.more(1, 4 * LEN, || t);
            s.choose(1, 4 * LEN, RP);
        }
        s.start(1, LEN, t + Duration::from_secs(1));
        assert_eq!(s.figure(1, LEN, Way::Rendezvous), None);
        assert_eq!(s.figure(1, LEN, Way::Packets), None);
        // A stream that never takes a packet back is cut every MAX_SENDS sends, and timed.
        let mut s = StreamWays::default();
        let mut now = t;
        for _ in 0..MAX_SENDS * 12 {
            now += Duration::from_micros(20);
            s.more(2, LEN, || now);
            s.choose(2, LEN, PR);
        }
        assert!(s.figure(2, LEN, Way::Rendezvous).is_some());
        assert!(s.figure(2, LEN, Way::Packets).is_some());
        assert_eq!(s.figure(1, LEN, Way::Packets), None, "per peer");
        let mut p = StreamWays::default();
        p.start(3, LEN, t);
        assert_eq!(p.choose(3, LEN, PR), Way::Packets, "the rule's way first");
        // An episode none of whose messages asked (answers through the pair buffer):
        // nothing to time.
        for i in 0..10 {
            p.start(4, LEN, t + Duration::from_millis(i));
            p.more(4, LEN, || t);
        }
        assert_eq!(p.figure(4, LEN, Way::Packets), None);
    }
}
