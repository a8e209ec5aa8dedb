//! How a blocked call waits: polls, idle rounds, waits for requests, and letting a
//! request go safely.

use super::World;
use super::describe_wait;
use crate::channel::Channel;
use crate::p2p::requests::{Req, SState};
use crate::p2p::wire::{self, REVOKE};
use crate::p2p::{P2pError, Status};
use crate::progress::{Idle, Tick};
use std::time::Instant;

impl<C: Channel> World<C> {
    /// One idle round of a blocked call: nothing for the first polls, then a wait on the
    /// channel, and now and then a check of the peers (`check`).
    #[inline(never)]
    pub(super) fn idle(
        &mut self,
        idle: &mut Idle,
        what: &dyn Fn() -> String,
        check: &mut dyn FnMut(&mut Self) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        self.idle_busy(idle, false, what, check)
    }

    /// As [`World::idle`]; `busy` when what the call waits for changes without a packet
    /// (a word of shared memory), so that it must not sleep on the channel.
    pub(super) fn idle_busy(
        &mut self,
        idle: &mut Idle,
        busy: bool,
        what: &dyn Fn() -> String,
        check: &mut dyn FnMut(&mut Self) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        if idle.tight() {
            return Ok(());
        }
        let busy = busy || self.eng.busy();
        if self.core.idle_wait(idle, busy, None, what)? == Tick::CheckPeers {
            check(self)?;
        }
        Ok(())
    }

    /// Drives progress until `done` says so, checking now and then that `peers` (world
    /// ranks) are alive: how the one-sided layer waits for answers, grants and counters.
    /// `busy` when `done` watches shared memory that changes without a packet: the wait
    /// then spins or yields instead of sleeping on the channel, which nothing would ring.
    ///
    /// # Errors
    /// The channel's, a peer's protocol violation, and [`P2pError::PeerFailed`] (with
    /// the world rank) when one of `peers` is found dead.
    pub(crate) fn wait_until(
        &mut self,
        what: &dyn Fn() -> String,
        peers: &[u32],
        busy: bool,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), P2pError> {
        let mut idle = self.core.idle();
        let me = self.rank();
        loop {
            if done(self) {
                return Ok(());
            }
            self.progress()?;
            if done(self) {
                return Ok(());
            }
            self.idle_busy(&mut idle, busy, what, &mut |w| {
                for &p in peers.iter().filter(|&&p| p != me) {
                    if let Err(e) = w.core.ch.check_peer(p) {
                        let reason = match e {
                            crate::ChannelError::PeerFailed { reason, .. } => reason,
                            other => other.to_string(),
                        };
                        return Err(P2pError::PeerFailed { rank: p, reason });
                    }
                }
                Ok(())
            })?;
        }
    }

    /// Drives progress until every request in `ids` is complete (or failed). Each
    /// request is looked at until it is complete and then never again, so the wait costs
    /// time linear in the number of requests.
    pub(crate) fn wait_all_ids(&mut self, ids: &[u32]) -> Result<(), P2pError> {
        self.wait_each(ids.len(), |w, i| w.eng.reqs.finished(ids[i]), |i| ids[i])
    }

    /// Drives progress until `finished` has said yes to each index of `0..n`, in
    /// order. It is asked of an index until it says yes and never again, so it may take
    /// the request's result when it does. `id` names the request of an index (0 for one
    /// complete from the start), for the checks of failed peers.
    #[inline]
    pub(crate) fn wait_each(
        &mut self,
        n: usize,
        mut finished: impl FnMut(&mut Self, usize) -> bool,
        id: impl Fn(usize) -> u32,
    ) -> Result<(), P2pError> {
        let mut idle = self.core.idle();
        let mut next = 0;
        // Look, poll, look, idle, and again: `finished` is asked from one place, so
        // that it is inlined here.
        let mut polled = false;
        loop {
            while next < n && finished(self, next) {
                next += 1;
            }
            if next == n {
                return Ok(());
            }
            if !polled {
                self.progress()?;
                polled = true;
                continue;
            }
            polled = false;
            let from = next;
            self.idle(&mut idle, &|| describe_wait(n - from), &mut |w| {
                for i in from..n {
                    w.check_failed(id(i));
                }
                Ok(())
            })?;
        }
    }

    /// Waits for request `id`, whose buffer is lent only for the call, and finishes it;
    /// on failure the request is released, so the buffer is never touched again.
    pub(crate) fn block_on(&mut self, id: u32) -> Result<Status, P2pError> {
        let r = self.wait_all_ids(&[id]);
        if r.is_err() || !self.eng.reqs.get(id).is_some_and(Req::is_done) {
            self.release(id);
            r?;
        }
        self.eng.finish(id)
    }

    /// Lets request `id` go (see [`Engine::release`]). A request whose pages the peer
    /// reads or writes in place is first made safe: a send that offered them asks the
    /// receiver to revoke the offer, and either waits for the answer, or for the
    /// transfer to end, whichever comes first; a receive being written waits for the
    /// writer. A dead peer ends the wait.
    pub(crate) fn release(&mut self, id: u32) {
        if crate::p2p::quick::is_quick(id) {
            // A quick receive never lends its pages in place; the request that carries
            // it on, if any, might.
            if let Some(t) = self.eng.quick.release(id) {
                self.release(t);
            }
            return;
        }
        if self.eng.holds_in_place(id) {
            if let Some(Req::Send(s)) = self.eng.reqs.get(id)
                && matches!(s.state, SState::WaitCts)
            {
                let dest = s.dest;
                if let Err(e) = self.core.ch.send_bytes(dest, wire::ctrl(REVOKE, id), &[]) {
                    self.eng.defer(e.into());
                }
            }
            let mut last_check = Instant::now();
            while self.eng.holds_in_place(id) {
                if let Err(e) = self.progress() {
                    self.eng.defer(e);
                }
                if last_check.elapsed() >= self.cfg.failure_check {
                    last_check = Instant::now();
                    self.check_failed(id);
                }
                std::thread::yield_now();
            }
        }
        self.eng.release(id);
    }
}
