//! Automatic selection that follows what a pair's own transfers take.
//!
//! Which strategy is fastest can change while a job runs. On a 2-vCPU AMD EPYC guest whose
//! hypervisor moves the two CPUs between sharing a cache and not, a 256 KiB ping-pong took
//! 15–20 µs one way by the copy ring and 23–27 by cma-split with the cache shared, and
//! 51–72 against 33–47 without (BENCHMARKS.md). So the receiver times each transfer that
//! ran alone, keeps a figure per strategy, peer and size band, and tries the strategies its
//! order allows fastest first. A slower one is looked at again now and then, the less often
//! the slower it was, so that a change of placement is noticed: the looks cost at most
//! [`LOOK`]/[`LOOK_EVERY`] (1/16) of a transfer's time on average.
//!
//! [`Tuner`] chooses between anything by time: the two-sided layer's sender uses one,
//! with its own schedule of looks ([`Tuner::with_looks`]), to choose how a stream's
//! longer messages go.

use crate::Strategy;
use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Instant;

/// Choices between two looks at a strategy, per time slower than the best it was.
pub const LOOK_EVERY: u64 = 48;

/// The most times slower a strategy counts as: even a much slower one is looked at again
/// within `LOOK_EVERY * SLOWEST` choices.
const SLOWEST: f64 = 8.0;

/// Transfers in a look, for the receiver's strategies.
pub const LOOK: u32 = 3;

/// The figures of a strategy that count: enough that a few transfers slowed by something
/// else decide nothing, few enough that a change of placement shows within a few.
pub const RECENT: usize = 5;

/// When a transfer that may be timed began: taken by [`Tuner::begin`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    at: Instant,
    /// The number of the receive, among this side's.
    nth: u64,
    /// No other receive was in flight when it began.
    alone: bool,
}

/// What one strategy took with one peer in one size band.
#[derive(Debug, Clone, Copy)]
struct Seen<K> {
    strategy: K,
    /// Nanoseconds per KiB, or `None` until timed: the least of the recent figures, as a
    /// transfer is only ever slowed by what else runs.
    figure: Option<f64>,
    /// The last figures, the newest first.
    recent: [f64; RECENT],
    /// Times it was put first.
    tries: u32,
    /// Transfers left in a look at it.
    look_left: u32,
    /// The choice it was last put first or timed at.
    at: u64,
}

#[derive(Debug)]
struct Band<K> {
    choices: u64,
    seen: Vec<Seen<K>>,
}

impl<K> Default for Band<K> {
    fn default() -> Self {
        Self {
            choices: 0,
            seen: Vec::new(),
        }
    }
}

impl<K: Copy + PartialEq> Band<K> {
    fn get(&self, s: K) -> Option<&Seen<K>> {
        self.seen.iter().find(|x| x.strategy == s)
    }

    fn entry(&mut self, s: K) -> &mut Seen<K> {
        let i = match self.seen.iter().position(|x| x.strategy == s) {
            Some(i) => i,
            None => {
                self.seen.push(Seen {
                    strategy: s,
                    figure: None,
                    recent: [f64::INFINITY; RECENT],
                    tries: 0,
                    look_left: 0,
                    at: 0,
                });
                self.seen.len() - 1
            }
        };
        &mut self.seen[i]
    }

    /// Which of `order` to put first, if not the fastest, and for how many transfers
    /// more after this one.
    fn next_look(&self, order: &[K], look: u32, first_cold: bool, every: u64) -> Option<(usize, u32)> {
        if let Some(i) = order
            .iter()
            .position(|&s| self.get(s).is_some_and(|x| x.look_left > 0))
        {
            return Some((i, self.get(order[i]).map_or(0, |x| x.look_left - 1)));
        }
        // Never tried: a first try, not timed (it may make the ring's file, and touches
        // the buffers' pages for the first time), then a look.
        if let Some(i) = order.iter().position(|&s| self.get(s).is_none()) {
            return Some((i, if first_cold { look } else { look - 1 }));
        }
        let figure = |s: K| self.get(s).and_then(|x| x.figure);
        let best = order
            .iter()
            .filter_map(|&s| figure(s))
            .fold(f64::INFINITY, f64::min);
        let due = |s: K| {
            let x = self.get(s)?;
            let times = figure(s).map_or(1.0, |f| (f / best).clamp(1.0, SLOWEST));
            let wait = (every as f64 * times) as u64;
            (figure(s) != Some(best) && self.choices - x.at >= wait).then_some(x.at)
        };
        // The one due the longest.
        (0..order.len())
            .filter_map(|i| due(order[i]).map(|at| (at, i)))
            .min()
            .map(|(_, i)| (i, look - 1))
    }
}

/// The figures of the ways to move data that a side has tried, per peer and size band:
/// large-message strategies for the receiver ([`Strategy`], the default), or whatever
/// else a layer above chooses between by time (the two-sided layer's way for a stream's
/// longer messages).
#[derive(Debug)]
pub struct Tuner<K = Strategy> {
    bands: HashMap<(u32, u32), Band<K>>,
    /// Receives begun and not yet ended.
    live: u32,
    /// Receives begun, ever.
    begun: u64,
    /// Choices in a look.
    look: u32,
    /// Whether a strategy's first try is left untimed, as cold.
    first_cold: bool,
    /// Choices between looks at a strategy, per time slower than the best.
    look_every: u64,
    /// What the first of an order counts its figure as (see
    /// [`Tuner::favoring_first`]).
    favor_first: f64,
}

/// Sorts `order` by the figures of `b`, fastest first, the first counted `favor` times
/// its figure; ties, and strategies never timed (last), keep their order. With the first
/// never timed, nothing moves: in a stream, the strategies in which both sides copy
/// never run alone, so they are never timed, while a read by the receiver alone ends
/// before the next message's and is; ranked on that, such a read went first once a
/// window and moved half as much (BENCHMARKS.md).
fn by_figures<K: Copy + PartialEq>(b: &Band<K>, order: &mut [K], favor: f64) {
    let Some(&first) = order.first() else {
        return;
    };
    if b.get(first).is_none_or(|x| x.figure.is_none()) {
        return;
    }
    let figure = |s: K| {
        let f = b.get(s).and_then(|x| x.figure).unwrap_or(f64::INFINITY);
        if s == first { f * favor } else { f }
    };
    order.sort_by(|&a, &c| figure(a).total_cmp(&figure(c)));
}

/// The size band of `len` bytes: sizes within a factor of four share figures.
pub fn band(len: usize) -> u32 {
    (usize::BITS - len.leading_zeros()) / 2
}

impl<K> Default for Tuner<K> {
    /// The receiver's schedule: a strategy's first try untimed, then [`LOOK`] timed,
    /// and a look every [`LOOK_EVERY`] choices per time slower.
    fn default() -> Self {
        Self::with_looks(LOOK, true, LOOK_EVERY)
    }
}

impl<K> Tuner<K> {
    /// A tuner whose looks take `look` choices (at least one), the first try of each
    /// strategy among them unless `first_cold`, when it comes before them untimed, and
    /// come every `look_every` choices per time slower than the best (at most
    /// eight times that). For choices that each cover many transfers (a stream's
    /// window), where a cold start weighs little and a look at a slow way costs much.
    pub fn with_looks(look: u32, first_cold: bool, look_every: u64) -> Self {
        Self {
            bands: HashMap::new(),
            live: 0,
            begun: 0,
            look: look.max(1),
            first_cold,
            look_every: look_every.max(1),
            favor_first: 1.0,
        }
    }
}

impl<K: Copy + PartialEq + Debug> Tuner<K> {
    /// Puts `order` (strategies for `len` bytes to `peer`, every one possible now, best
    /// first by the policy) in the order to try them: one being looked at first, then
    /// by what each took. Left as it is with fewer than two, or while another receive is
    /// in flight, since this one would not be timed.
    pub fn rank(&mut self, peer: u32, len: usize, order: &mut [K]) {
        if order.len() < 2 || self.live > 0 {
            return;
        }
        let b = self.bands.entry((peer, band(len))).or_default();
        b.choices += 1;
        match b.next_look(order, self.look, self.first_cold, self.look_every) {
            Some((i, left)) => {
                order[..=i].rotate_right(1);
                let choices = b.choices;
                let x = b.entry(order[0]);
                x.tries += 1;
                x.look_left = left;
                x.at = choices;
            }
            None => {
                // Fastest first, and one never timed (each of its transfers overlapped
                // another) last, until its next look; ties keep the policy's order.
                by_figures(b, order, self.favor_first);
            }
        }
    }

    /// Puts `order` in the order the figures so far give, fastest first, without
    /// counting a choice or starting a look: for a choice that cannot be timed. Ties, and
    /// strategies never timed, keep the order given.
    pub fn prefer(&self, peer: u32, len: usize, order: &mut [K]) {
        if let Some(b) = self.bands.get(&(peer, band(len))) {
            by_figures(b, order, self.favor_first);
        }
    }

    /// The tuner, with the strategy first in each order counted `favor` times its
    /// figure (below 1: it keeps its place unless another is faster by more than
    /// that), so that a few noisy figures do not move a choice that was right as often.
    pub fn favoring_first(mut self, favor: f64) -> Self {
        self.favor_first = favor.clamp(0.1, 1.0);
        self
    }

    /// A receive begins.
    pub(crate) fn begin(&mut self) -> Stamp {
        self.begun += 1;
        self.live += 1;
        Stamp {
            at: Instant::now(),
            nth: self.begun,
            alone: self.live == 1,
        }
    }

    /// A receive that began at `stamp` ends; `moved` when it moved the whole message.
    /// Timed only if it ran alone from start to end.
    pub(crate) fn end(&mut self, stamp: Stamp, peer: u32, len: usize, strategy: K, moved: bool) {
        self.live = self.live.saturating_sub(1);
        if moved && stamp.alone && stamp.nth == self.begun && len > 0 {
            let ns = stamp.at.elapsed().as_nanos() as f64;
            self.record(peer, len, strategy, ns);
        }
    }

    /// Records that a transfer of `len` bytes to `peer` by `strategy` took `ns`, unless it
    /// was the strategy's first and first tries are cold (see [`Tuner::with_looks`]): the
    /// least of the last [`RECENT`] is its figure.
    pub fn record(&mut self, peer: u32, len: usize, strategy: K, ns: f64) {
        self.record_over(peer, len, len, strategy, ns);
    }

    /// As [`Tuner::record`], for `bytes` moved as messages of `len` bytes each (a run of
    /// them timed as a whole): the figure is per KiB of `bytes`, in `len`'s band.
    pub fn record_over(&mut self, peer: u32, len: usize, bytes: usize, strategy: K, ns: f64) {
        let b = self.bands.entry((peer, band(len))).or_default();
        let choices = b.choices;
        let x = b.entry(strategy);
        if self.first_cold && x.figure.is_none() && x.tries <= 1 {
            // Its first try: cold.
            return;
        }
        x.recent.rotate_right(1);
        x.recent[0] = ns / (bytes.max(1) as f64 / 1024.0);
        x.figure = Some(x.recent.iter().copied().fold(f64::INFINITY, f64::min));
        x.at = choices;
    }

    /// What `strategy` took per KiB with `peer` for `len` bytes, as far as measured.
    pub fn figure(&self, peer: u32, len: usize, strategy: K) -> Option<f64> {
        self.bands.get(&(peer, band(len)))?.get(strategy)?.figure
    }

    /// Forgets what was measured with `peer` (its process ended).
    pub fn forget(&mut self, peer: u32) {
        self.bands.retain(|&(p, _), _| p != peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Strategy::{Cma, CmaSplit, Ring};

    const LEN: usize = 256 << 10;

    /// Chooses for `LEN` bytes from the policy's order `CmaSplit, Ring, Cma`, and times the
    /// choice at `took(strategy)` microseconds.
    fn choose(t: &mut Tuner, took: impl Fn(Strategy) -> f64) -> Strategy {
        let mut order = [CmaSplit, Ring, Cma];
        t.rank(1, LEN, &mut order);
        let s = order[0];
        t.record(1, LEN, s, took(s) * 1000.0);
        s
    }

    fn near(s: Strategy) -> f64 {
        match s {
            Ring => 15.0,
            CmaSplit => 22.0,
            _ => 40.0,
        }
    }

    fn far(s: Strategy) -> f64 {
        match s {
            Ring => 66.0,
            CmaSplit => 47.0,
            _ => 90.0,
        }
    }

    #[test]
    fn each_strategy_is_tried_once_then_the_fastest_is_kept() {
        let mut t = Tuner::default();
        let first: Vec<_> = (0..12).map(|_| choose(&mut t, near)).collect();
        let want: Vec<_> = [CmaSplit, Ring, Cma]
            .into_iter()
            .flat_map(|s| [s; 1 + LOOK as usize])
            .collect();
        assert_eq!(
            first, want,
            "the policy's order, each a first untimed try and a look"
        );
        let next: Vec<_> = (0..15).map(|_| choose(&mut t, near)).collect();
        assert!(next.iter().all(|&s| s == Ring), "{next:?}");
    }

    #[test]
    fn a_change_of_placement_is_followed_and_looks_cost_little() {
        let mut t = Tuner::default();
        for _ in 0..50 {
            choose(&mut t, near);
        }
        // Moved far: the ring slows, and cma-split is looked at again within a few dozen
        // choices, then kept.
        let after: Vec<_> = (0..200).map(|_| choose(&mut t, far)).collect();
        let switched = after
            .iter()
            .position(|&s| s == CmaSplit)
            .expect("cma-split tried again");
        assert!(switched <= (LOOK_EVERY * 2) as usize, "after {switched} choices");
        let settled = &after[switched..];
        let best = settled.iter().filter(|&&s| s == CmaSplit).count();
        assert!(
            best * 100 >= settled.len() * 90,
            "{best} of {} by the fastest",
            settled.len()
        );
        // And back.
        let back: Vec<_> = (0..200).map(|_| choose(&mut t, near)).collect();
        let switched = back
            .iter()
            .position(|&s| s == Ring)
            .expect("the ring tried again");
        assert!(switched <= (LOOK_EVERY * 2) as usize, "after {switched} choices");
        let total: f64 = back[switched..].iter().map(|&s| near(s)).sum();
        let ideal = near(Ring) * (back.len() - switched) as f64;
        assert!(
            total <= ideal * 1.1,
            "looks cost {:.1}%",
            (total / ideal - 1.0) * 100.0
        );
    }

    #[test]
    fn an_order_is_left_alone_while_a_receive_is_in_flight_and_overlapping_ones_are_not_timed() {
        let mut t = Tuner::default();
        for _ in 0..12 {
            choose(&mut t, near);
        }
        let a = t.begin();
        let mut order = [CmaSplit, Ring, Cma];
        t.rank(1, LEN, &mut order);
        assert_eq!(order, [CmaSplit, Ring, Cma], "in flight: the policy's order");
        let b = t.begin();
        t.end(a, 1, LEN, CmaSplit, true);
        t.end(b, 1, LEN, CmaSplit, true);
        // Neither ran alone, so the ring stays first.
        let mut order = [CmaSplit, Ring, Cma];
        t.rank(1, LEN, &mut order);
        assert_eq!(order[0], Ring);
        // Those alone are timed: enough ring transfers of a millisecond make it slower
        // than cma-split's 22 µs.
        for _ in 0..RECENT {
            let mut order = [CmaSplit, Ring, Cma];
            t.rank(1, LEN, &mut order);
            assert_eq!(order[0], Ring);
            let c = t.begin();
            std::thread::sleep(std::time::Duration::from_millis(1));
            t.end(c, 1, LEN, Ring, true);
        }
        let mut order = [CmaSplit, Ring, Cma];
        t.rank(1, LEN, &mut order);
        assert_eq!(order[0], CmaSplit);
    }

    #[test]
    fn a_strategy_never_timed_goes_after_those_timed_until_its_next_look() {
        let mut t = Tuner::default();
        // Cma-split and the ring are tried and timed; cma's transfers all overlap others.
        for _ in 0..8 {
            choose(&mut t, near);
        }
        for _ in 0..4 {
            let mut order = [CmaSplit, Ring, Cma];
            t.rank(1, LEN, &mut order);
            assert_eq!(order[0], Cma);
        }
        for _ in 0..LOOK_EVERY - 1 {
            let mut order = [CmaSplit, Cma, Ring];
            t.rank(1, LEN, &mut order);
            assert_eq!(order, [Ring, CmaSplit, Cma]);
        }
        let mut order = [CmaSplit, Ring, Cma];
        t.rank(1, LEN, &mut order);
        assert_eq!(order[0], Cma, "looked at again");
    }

    #[test]
    fn a_first_never_timed_keeps_its_place_before_those_timed() {
        // A stream: cma-split's transfers overlap the next message's, so it is never
        // timed, while cma's end before the next begins. Cma must not go first on that.
        let mut t = Tuner::default();
        let mut firsts = Vec::new();
        for _ in 0..(LOOK_EVERY * 4) {
            let mut order = [CmaSplit, Ring, Cma];
            t.rank(1, LEN, &mut order);
            let s = order[0];
            if s == Cma {
                t.record(1, LEN, Cma, 30_000.0);
            }
            firsts.push(s);
        }
        let cma = firsts.iter().filter(|&&s| s == Cma).count();
        assert!(
            cma <= 2 * (1 + LOOK as usize),
            "cma first {cma} times of {}: {firsts:?}",
            firsts.len()
        );
        assert_eq!(firsts.last(), Some(&CmaSplit));
        // Once the first is timed too, the figures decide.
        t.record(1, LEN, CmaSplit, 60_000.0);
        t.record(1, LEN, CmaSplit, 60_000.0);
        let mut order = [CmaSplit, Ring, Cma];
        t.prefer(1, LEN, &mut order);
        assert_eq!(order, [Cma, CmaSplit, Ring], "cma-split timed, and slower");
    }

    #[test]
    fn a_favoured_first_keeps_its_place_unless_another_is_clearly_faster() {
        for (other, want) in [(95.0, CmaSplit), (80.0, Ring)] {
            let mut t = Tuner::with_looks(1, false, 1 << 20).favoring_first(0.9);
            let mut order = [CmaSplit, Ring];
            for _ in 0..2 {
                t.rank(1, LEN, &mut order);
                let s = order[0];
                t.record(1, LEN, s, if s == CmaSplit { 100.0 } else { other } * 256.0);
                order = [CmaSplit, Ring];
            }
            t.rank(1, LEN, &mut order);
            assert_eq!(order[0], want, "the other at {other}% of the first's time");
            let mut order = [CmaSplit, Ring];
            t.prefer(1, LEN, &mut order);
            assert_eq!(order[0], want, "and without a choice");
        }
    }

    #[test]
    fn peers_and_size_bands_keep_their_own_figures() {
        let mut t = Tuner::default();
        for _ in 0..12 {
            choose(&mut t, near);
        }
        let mut other_peer = [CmaSplit, Ring];
        t.rank(2, LEN, &mut other_peer);
        assert_eq!(other_peer[0], CmaSplit, "nothing measured with peer 2");
        let mut other_size = [CmaSplit, Ring];
        t.rank(1, 4 * LEN, &mut other_size);
        assert_eq!(other_size[0], CmaSplit, "nothing measured at 1 MiB");
        t.forget(1);
        let mut order = [CmaSplit, Ring];
        t.rank(1, LEN, &mut order);
        assert_eq!(order[0], CmaSplit, "forgotten");
    }
}
