//! The clock of a blocked call: polls back to back first, then waits the channel's way,
//! checks peers now and then, and says once what it waits for when it has waited long.

use std::time::{Duration, Instant};

/// Polls a blocked call makes back to back before it waits the channel's way (spinning on
/// readiness, yielding, sleeping): a reply that comes within a few microseconds is picked
/// up without a clock read or a readiness check on the way. Fewer when the wait policy
/// spins less ([`crate::progress::Core::idle`]): a process that outnumbers the
/// CPUs and polls 256 times keeps the one that would answer off its CPU for tens of
/// microseconds.
pub(crate) const TIGHT_POLLS: u32 = 256;

/// What one blocked call has done so far.
#[derive(Debug)]
pub(crate) struct Idle {
    pub(crate) polls: u32,
    /// Polls to make back to back before waiting.
    tight: u32,
    since: Option<Instant>,
    last_check: Option<Instant>,
    warned: bool,
}

/// What the clock says after an idle round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Keep polling.
    Poll,
    /// Check that the peers waited on are alive, then keep polling.
    CheckPeers,
}

impl Idle {
    /// A blocked call's clock that polls `tight` times back to back before it waits.
    pub(crate) const fn new(tight: u32) -> Self {
        Self {
            polls: 0,
            tight,
            since: None,
            last_check: None,
            warned: false,
        }
    }

    /// Counts a poll that found nothing; true while the call should poll again at once.
    #[inline(always)]
    pub(crate) fn tight(&mut self) -> bool {
        self.polls += 1;
        self.polls < self.tight
    }

    /// After the call has waited: whether the peers are due a check, and whether the
    /// warning is due (`warn` is `NEMESIS_WAIT_WARN`).
    pub(crate) fn after_wait(&mut self, check_every: Duration, warn: Option<Duration>) -> (Tick, bool) {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let last = *self.last_check.get_or_insert(now);
        let tick = if now.duration_since(last) >= check_every {
            self.last_check = Some(now);
            Tick::CheckPeers
        } else {
            Tick::Poll
        };
        let warn_now = match warn {
            Some(w) if !self.warned && now.duration_since(since) >= w => {
                self.warned = true;
                true
            }
            _ => false,
        };
        (tick, warn_now)
    }

    /// How long the call has waited since its first wait.
    pub(crate) fn waited(&self) -> Duration {
        self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tight_polls_stop_at_the_limit() {
        let mut idle = Idle::new(3);
        assert!(idle.tight());
        assert!(idle.tight());
        assert!(!idle.tight(), "the third empty poll waits");
        let mut none = Idle::new(0);
        assert!(
            !none.tight(),
            "a policy without spins waits after the first empty poll"
        );
    }
}
