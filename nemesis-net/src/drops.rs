//! Counting and logging what the wire sent that could not be used.
//!
//! Input from the network is untrusted. Whatever fails a check is dropped (a datagram)
//! or refused (a connection), and the reason is counted here. The first drop of each
//! reason, and then every drop whose count is a power of two, is logged to standard
//! error, so a misbehaving peer is visible without flooding the log.

use std::fmt;

/// Why something from the wire was dropped or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than its header, or than the length its header states.
    Truncated,
    /// Longer than the largest frame or datagram the netmod accepts.
    Oversized,
    /// Not a nemesis frame or datagram: wrong magic or version.
    BadMagic,
    /// A job key other than ours.
    WrongJob,
    /// A rank outside the job, or one that does not match the connection or card.
    BadRank,
    /// A sequence or acknowledgement number outside the window.
    BadSequence,
    /// A datagram from an address that no peer's card names.
    UnknownAddress,
    /// A connection whose handshake was wrong or incomplete.
    BadHandshake,
    /// A field holds a value the protocol does not allow.
    Malformed,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 9] = [
        DropReason::Truncated,
        DropReason::Oversized,
        DropReason::BadMagic,
        DropReason::WrongJob,
        DropReason::BadRank,
        DropReason::BadSequence,
        DropReason::UnknownAddress,
        DropReason::BadHandshake,
        DropReason::Malformed,
    ];

    /// A short name, for logs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Oversized => "oversized",
            DropReason::BadMagic => "bad-magic",
            DropReason::WrongJob => "wrong-job",
            DropReason::BadRank => "bad-rank",
            DropReason::BadSequence => "bad-sequence",
            DropReason::UnknownAddress => "unknown-address",
            DropReason::BadHandshake => "bad-handshake",
            DropReason::Malformed => "malformed",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters of drops by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drops {
    counts: [u64; DropReason::ALL.len()],
    /// Whether to log; on unless the netmod was made quiet (tests that drop on purpose).
    quiet: bool,
}

impl Drops {
    /// Counters that never log.
    pub fn quiet() -> Self {
        Self {
            quiet: true,
            ..Self::default()
        }
    }

    /// Counts a drop, and logs it when its count is 1, 2, 4, 8, ...; `detail` says what
    /// was seen (the peer's address or rank, the bad value).
    pub fn note(&mut self, netmod: &str, reason: DropReason, detail: impl fmt::Display) {
        let c = &mut self.counts[reason as usize];
        *c += 1;
        if !self.quiet && c.is_power_of_two() {
            eprintln!("nemesis-net {netmod}: dropped ({reason}, {c} so far): {detail}");
        }
    }

    /// Drops for `reason` so far.
    pub fn count(&self, reason: DropReason) -> u64 {
        self.counts[reason as usize]
    }

    /// Drops for every reason so far.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s counts to these: one netmod made of two reports both.
    pub fn merge(&mut self, other: &Drops) {
        for (c, o) in self.counts.iter_mut().zip(other.counts) {
            *c += o;
        }
    }

    /// The reasons with a non-zero count.
    pub fn nonzero(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|&r| (r, self.count(r)))
            .filter(|&(_, c)| c > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason() {
        let mut d = Drops::quiet();
        d.note("t", DropReason::WrongJob, "x");
        d.note("t", DropReason::WrongJob, "x");
        d.note("t", DropReason::Truncated, "y");
        assert_eq!(d.count(DropReason::WrongJob), 2);
        assert_eq!(d.count(DropReason::Truncated), 1);
        assert_eq!(d.count(DropReason::BadMagic), 0);
        assert_eq!(d.total(), 3);
        assert_eq!(
            d.nonzero().collect::<Vec<_>>(),
            vec![(DropReason::Truncated, 1), (DropReason::WrongJob, 2)]
        );
        let mut e = Drops::quiet();
        e.note("t", DropReason::Truncated, "z");
        e.merge(&d);
        assert_eq!((e.count(DropReason::Truncated), e.total()), (2, 4));
    }
}
