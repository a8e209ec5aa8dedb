//! The clock of a blocked call: polls back to back first, then waits the channel's way,
//! checks peers now and then, and says once what it waits for when it has waited long.

use std::time::{Duration, Instant};

/// Polls a blocked call makes back to back before it waits the channel's way (spinning on
/// readiness, yielding, sleeping): a reply that comes within a few microseconds is picked
/// up without a clock read or a readiness check on the way.
pub(crate) const TIGHT_POLLS: u32 = 256;

/// What one blocked call has done so far.
#[derive(Debug)]
pub(crate) struct Idle {
    pub(crate) polls: u32,
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
    pub(crate) const fn new() -> Self {
        Self {
            polls: 0,
            since: None,
            last_check: None,
            warned: false,
        }
    }

    /// Counts a poll that found nothing; true while the call should poll again at once.
    #[inline(always)]
    pub(crate) fn tight(&mut self) -> bool {
        self.polls += 1;
        self.polls < TIGHT_POLLS
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
