//! Issuing operations: what every epoch can do to the targets it reaches, by the route
//! this process has to each (a copy into mapped memory, cross-memory attach, or
//! messages), and completing them.
//!
//! A get whose bytes come in packets lands in the proto's buffer first and is copied
//! into the caller's buffer by this epoch's next call that completes it (a wait, a
//! flush, the epoch's end): the epoch holds the caller's buffer for its lifetime, so a
//! forgotten epoch leaves the bytes where they landed and never writes anywhere else.

use super::RmaError;
use super::proto::{Dest, Rma, State, Want, Xfer};
use super::window::{Flavor, Peer, Route, Window, poll_xfers, rma};
use super::wire::{self, Refusal};
use crate::channel::{Channel, Header, NemesisChannel};
use crate::p2p::{P2pError, World};
use crate::progress::ProtocolId;
use bytemuck::Pod;
use nemesis_net::rdma::{RdmaError, Remote, Seg};
use std::marker::PhantomData;

/// Which targets an epoch reaches.
#[derive(Debug, Clone)]
pub(crate) enum Reach {
    /// Every member.
    All,
    /// The members in the set (by communicator rank).
    Some(Members),
}

/// A set of members: the first 128 in a word, any others in a vector made only when
/// needed, so that an epoch on one target allocates nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Members {
    low: u128,
    high: Vec<bool>,
}

impl Members {
    pub(crate) fn insert(&mut self, m: u32) {
        if m < 128 {
            self.low |= 1 << m;
        } else {
            let i = (m - 128) as usize;
            if self.high.len() <= i {
                self.high.resize(i + 1, false);
            }
            self.high[i] = true;
        }
    }

    pub(crate) fn contains(&self, m: u32) -> bool {
        if m < 128 {
            self.low >> m & 1 == 1
        } else {
            self.high.get((m - 128) as usize).copied().unwrap_or(false)
        }
    }
}

/// A get's bytes arriving in packets, and the caller's buffer they go to.
#[derive(Debug)]
pub(crate) struct Landing {
    pub(crate) req: u32,
    ptr: *mut u8,
    len: usize,
    /// Bytes already copied into the buffer.
    copied: usize,
}

/// The operations of an epoch: every epoch type dereferences to this. Displacements
/// count elements of the window's type; `target` is a rank of the window's
/// communicator.
///
/// Puts and accumulates are complete at the origin when they return (their bytes were
/// copied or sent); they are complete at the target after a flush or when the epoch
/// ends. Gets and get-accumulates complete with a flush, a wait, or the epoch's end,
/// and borrow their buffer until then.
pub struct Ops<'w, 'b, T: Pod, C: Channel = NemesisChannel> {
    pub(crate) world: &'w mut World<C>,
    pub(crate) win: &'w Window<T>,
    pub(crate) reach: Reach,
    landings: Vec<Landing>,
    _buf: PhantomData<&'b mut [T]>,
}

impl<T: Pod, C: Channel> std::fmt::Debug for Ops<'_, '_, T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops")
            .field("window", &self.win.id)
            .field("landing", &self.landings.len())
            .finish_non_exhaustive()
    }
}

impl<'w, 'b, T: Pod, C: Channel> Ops<'w, 'b, T, C> {
    pub(crate) fn new(world: &'w mut World<C>, win: &'w Window<T>, reach: Reach) -> Result<Self, RmaError> {
        win.check_world(world)?;
        Ok(Self {
            world,
            win,
            reach,
            landings: Vec::new(),
            _buf: PhantomData,
        })
    }

    /// The world, for two-sided messages and collectives inside the epoch.
    pub fn world(&mut self) -> &mut World<C> {
        self.world
    }

    /// The window.
    pub fn window(&self) -> &'w Window<T> {
        self.win
    }

    // -----------------------------------------------------------------------------
    // Checks and plumbing

    pub(crate) fn rma(&mut self) -> &mut Rma {
        rma(self.world)
    }

    /// The member `target`, if the epoch reaches it and `count` elements at `disp` lie
    /// inside its memory; its route, with cross-memory attach given up if it failed.
    pub(crate) fn check(&self, target: u32, disp: usize, count: usize) -> Result<Peer, RmaError> {
        let n = self.win.peers.len() as u32;
        let mut p = *self.win.peers.get(target as usize).ok_or(RmaError::InvalidRank {
            rank: target,
            size: n,
        })?;
        if let Reach::Some(m) = &self.reach
            && !m.contains(target)
        {
            return Err(RmaError::NotInEpoch {
                target,
                why: "the epoch's group or locks do not include it",
            });
        }
        if self.win.flavor() != Flavor::Dynamic {
            let len = (p.len / size_of::<T>() as u64) as usize;
            if disp.checked_add(count).is_none_or(|end| end > len) {
                return Err(RmaError::OutOfBounds {
                    target,
                    disp,
                    count,
                    len,
                });
            }
        } else if disp
            .checked_add(count)
            .is_none_or(|e| e.checked_mul(size_of::<T>()).is_none())
        {
            return Err(RmaError::InvalidArgument(format!(
                "displacement {disp} and {count} elements overflow the address space"
            )));
        }
        if matches!(p.route, Route::Cma { .. }) && self.win.cma_off() {
            p.route = Route::Am;
        }
        Ok(p)
    }

    /// Fails if `target` (or any member), reached through memory, is known to have
    /// died: a put into a dead member's memory succeeds, so flush and unlock ask now and
    /// then (once every `NEMESIS_FAILURE_TIMEOUT`, as a check costs a system call).
    pub(crate) fn check_alive(&mut self, target: Option<u32>) -> Result<(), RmaError> {
        let mapped = |r: &Route| matches!(r, Route::Shm(_) | Route::Cma { .. });
        let any = match target {
            Some(t) => mapped(&self.win.peers[t as usize].route),
            None => self.win.peers.iter().any(|p| mapped(&p.route)),
        };
        if !any || !self.win.liveness_due(self.world.config().failure_check) {
            return Ok(());
        }
        for (t, p) in self.win.peers.iter().enumerate() {
            if target.is_some_and(|x| x as usize != t) || !mapped(&p.route) {
                continue;
            }
            if let Err(crate::ChannelError::PeerFailed { reason, .. }) =
                self.world.channel().check_peer(p.world)
            {
                return Err(RmaError::PeerFailed {
                    rank: t as u32,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Moves progress on once where others may reach this process by messages: an
    /// origin spinning on its own memory (a compare-and-swap on a lock word) must still
    /// serve the requests that would let it go on.
    #[inline]
    pub(crate) fn serve_others(&mut self) -> Result<(), RmaError> {
        if !self.win.shm_sync {
            self.world.progress().map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// A member's failure or the layers' error, with ranks of the communicator.
    pub(crate) fn fail(&self, e: P2pError) -> RmaError {
        match e {
            P2pError::PeerFailed { rank, reason } => RmaError::PeerFailed {
                rank: self.win.comm.inner.rank_of(rank).unwrap_or(rank),
                reason,
            },
            other => RmaError::P2p(other),
        }
    }

    /// Sends a packet of kind `k` to member `target` (world rank `w`).
    pub(crate) fn send(
        &mut self,
        w: u32,
        k: u8,
        flags: u16,
        req: u32,
        parts: &[&[u8]],
    ) -> Result<(), RmaError> {
        let h = Header {
            kind: u16::from(k),
            flags,
            context: self.win.id,
            tag: 0,
            aux: req,
        };
        self.world.core.send(ProtocolId::RMA, w, h, parts)?;
        Ok(())
    }

    /// Counts a request to member `target` for fences, and marks it unflushed when it
    /// has no answer of its own.
    pub(crate) fn issued(&mut self, target: u32, answered: bool) {
        let id = self.win.id;
        if let Some(s) = self.rma().slot_mut(id) {
            s.origin.issued[target as usize] += 1;
            if !answered {
                s.origin.unflushed[target as usize] = true;
            }
        }
    }

    /// Files a request awaiting `want` from world rank `w`.
    pub(crate) fn request(&mut self, w: u32, want: Want) -> Result<u32, RmaError> {
        let id = self.win.id;
        self.rma()
            .slot_mut(id)
            .map(|s| s.origin.request(w, want))
            .ok_or(RmaError::Wrong("the window was freed"))
    }

    /// Waits until every request in `reqs` is answered (or refused), then takes them:
    /// their bytes, or the first failure.
    pub(crate) fn wait_reqs(&mut self, reqs: &[u32]) -> Result<Vec<Vec<u8>>, RmaError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let id = self.win.id;
        let peers = self.win.world_ranks();
        let busy = self.rdma_busy();
        let r = self.world.wait_until(
            &|| format!("{} one-sided answers", reqs.len()),
            peers,
            busy,
            |w| {
                poll_xfers(w, id);
                rma(w)
                    .slot(id)
                    .is_none_or(|s| reqs.iter().all(|&q| s.origin.is_over(q)))
            },
        );
        let r = r.map_err(|e| self.fail(e));
        let mut out = Vec::with_capacity(reqs.len());
        let mut first = r.err();
        for &q in reqs {
            let p = self.rma().slot_mut(id).and_then(|s| s.origin.pending.remove(&q));
            match p {
                Some(p) => match p.state {
                    State::Done => out.push(p.staged),
                    State::Refused(why, disp, len) => {
                        let target = self.rank_of(p.target);
                        first.get_or_insert(RmaError::Refused {
                            target,
                            why,
                            disp,
                            len,
                            others: 0,
                        });
                    }
                    State::Broken(what) => {
                        let target = self.rank_of(p.target);
                        first.get_or_insert(RmaError::Protocol {
                            target,
                            what: what.into(),
                        });
                    }
                    State::Waiting => {
                        first.get_or_insert(RmaError::Wrong("a request was left unanswered"));
                    }
                },
                None => {
                    first.get_or_insert(RmaError::Wrong("the window was freed"));
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    pub(crate) fn rank_of(&self, w: u32) -> u32 {
        self.win.comm.inner.rank_of(w).unwrap_or(w)
    }

    pub(crate) fn max_payload(&self, w: u32, head: usize) -> usize {
        self.world.channel().max_payload_to(w).saturating_sub(head).max(1)
    }

    /// Whether RDMA transfers are under way: a wait must then not sleep on the channel,
    /// since their completions ring nothing it sleeps on.
    pub(crate) fn rdma_busy(&mut self) -> bool {
        let id = self.win.id;
        rma(self.world)
            .slot(id)
            .is_some_and(|s| !s.origin.xfers.is_empty())
    }

    /// The smallest put or get that goes by RDMA.
    pub(crate) fn rdma_min(&mut self) -> usize {
        self.rma().rdma_min
    }

    /// Posts a transfer by the network module's RDMA with member `target` (`p`, whose
    /// route must be RDMA), `len` bytes at `off` of its memory: a put of `put` (copied first, so the
    /// caller's buffer is free at once), or a get that answers request `req`. `Ok(false)`
    /// when the device cannot take it now: the caller sends packets instead.
    pub(crate) fn rdma_post(
        &mut self,
        target: u32,
        p: Peer,
        off: usize,
        put: Option<&[u8]>,
        len: usize,
        req: u32,
    ) -> Result<bool, RmaError> {
        let (w, Route::Rdma(remote)) = (p.world, p.route) else {
            return Ok(false);
        };
        let buf = match put {
            Some(b) => b.to_vec(),
            None => vec![0u8; len],
        };
        let id = self.win.id;
        let Some(rdma) = self.world.core.ch.rdma() else {
            return Ok(false);
        };
        let seg = Seg {
            ptr: buf.as_ptr().cast_mut(),
            len: buf.len(),
        };
        let Ok(reg) = rdma.register(seg) else {
            return Ok(false);
        };
        let at = Remote {
            addr: remote.addr + off as u64,
            len: len as u64,
            rkey: remote.rkey,
        };
        // SAFETY: `buf` is registered by `reg` and moves, with it, into the proto, which
        // keeps it (a vector's bytes do not move with it) until the transfer completes.
        let posted = unsafe {
            if put.is_some() {
                rdma.put(w, seg, &reg, at)
            } else {
                rdma.get(w, seg, &reg, at)
            }
        };
        match posted {
            Ok(op) => {
                let x = Xfer {
                    op,
                    target: w,
                    reg,
                    buf,
                    req,
                };
                match self.rma().slot_mut(id) {
                    Some(s) => s.origin.xfers.push(x),
                    None => return Err(RmaError::Wrong("the window was freed")),
                }
                Ok(true)
            }
            Err(RdmaError::Again { .. }) => {
                rdma.deregister(&reg);
                Ok(false)
            }
            Err(e) => {
                rdma.deregister(&reg);
                Err(RmaError::Rdma {
                    target,
                    why: e.to_string(),
                })
            }
        }
    }

    /// Completes the RDMA transfers to `target` (or to every member), and reports a
    /// put that failed.
    pub(crate) fn complete_rdma(&mut self, target: Option<u32>) -> Result<(), RmaError> {
        if !self.win.by_rdma {
            // No member is reached by RDMA: nothing to look up (a flush's fast path).
            return Ok(());
        }
        let id = self.win.id;
        let tw = target.map(|t| self.win.peers[t as usize].world);
        let mine = |s: &super::proto::Slot| s.origin.xfers.iter().any(|x| tw.is_none_or(|w| x.target == w));
        if rma(self.world).slot(id).is_some_and(mine) {
            let peers = self.win.world_ranks();
            self.world
                .wait_until(&|| "RDMA transfers".into(), peers, true, |w| {
                    poll_xfers(w, id);
                    !rma(w).slot(id).is_some_and(mine)
                })
                .map_err(|e| self.fail(e))?;
        }
        let failed = rma(self.world).slot_mut(id).and_then(|s| {
            let i = s
                .origin
                .xfer_failed
                .iter()
                .position(|f| tw.is_none_or(|w| f.0 == w))?;
            Some(s.origin.xfer_failed.remove(i))
        });
        match failed {
            Some((w, why)) => Err(RmaError::Rdma {
                target: self.rank_of(w),
                why,
            }),
            None => Ok(()),
        }
    }

    /// Files a get's landing: the bytes of request `req` go to `len` bytes at `ptr`, a
    /// buffer lent to the epoch for `'b`.
    pub(crate) fn land(&mut self, req: u32, ptr: *mut u8, len: usize) {
        self.landings.push(Landing {
            req,
            ptr,
            len,
            copied: 0,
        });
    }

    /// Bytes of request `req` copied into its buffer so far, if it is still landing.
    pub(crate) fn landed(&self, req: u32) -> Option<usize> {
        self.landings.iter().find(|l| l.req == req).map(|l| l.copied)
    }

    /// Copies what has arrived for landing `req` into its buffer; finishes it when all
    /// has, and reports its failure.
    pub(crate) fn copy_arrived(&mut self, req: u32) -> Result<(), RmaError> {
        if self.copy_staged(req) != Some(State::Waiting)
            && let Some(i) = self.landings.iter().position(|l| l.req == req)
        {
            self.landings.swap_remove(i);
            return self.wait_reqs(&[req]).map(|_| ());
        }
        Ok(())
    }

    /// Lends the buffers of landings `reqs` to their requests, so that bytes arriving
    /// while this epoch waits go straight there; [`Ops::take_back`] ends the loan.
    fn lend(&mut self, reqs: &[u32]) {
        for &q in reqs {
            self.copy_staged(q);
            let Some(l) = self.landings.iter().find(|l| l.req == q) else {
                continue;
            };
            let ptr = l.ptr;
            if let Some(p) = rma(self.world)
                .slot_mut(self.win.id)
                .and_then(|s| s.origin.pending.get_mut(&q))
            {
                p.dest = Some(Dest(ptr));
            }
        }
    }

    /// Ends the loans of [`Ops::lend`]: later bytes are held in the proto again.
    fn take_back(&mut self, reqs: &[u32]) {
        let id = self.win.id;
        for &q in reqs {
            let got = rma(self.world)
                .slot_mut(id)
                .and_then(|s| s.origin.pending.get_mut(&q))
                .map(|p| {
                    p.dest = None;
                    p.got
                });
            if let (Some(got), Some(l)) = (got, self.landings.iter_mut().find(|l| l.req == q)) {
                l.copied = got.min(l.len);
            }
        }
    }

    /// Copies the bytes held for landing `req` into its buffer, without finishing it;
    /// where the request stands, if it is still landing.
    fn copy_staged(&mut self, req: u32) -> Option<State> {
        let id = self.win.id;
        let l = self.landings.iter_mut().find(|l| l.req == req)?;
        let p = rma(self.world).slot_mut(id)?.origin.pending.get_mut(&req)?;
        if !p.staged.is_empty() && p.base + p.staged.len() <= l.len {
            // SAFETY: the buffer was lent for 'b and is `l.len` bytes; these bytes lie
            // past every part already handed to the caller.
            unsafe { std::ptr::copy_nonoverlapping(p.staged.as_ptr(), l.ptr.add(p.base), p.staged.len()) };
            p.staged = Vec::new();
        }
        l.copied = p.got.min(l.len);
        Some(p.state)
    }

    /// Waits until `done` says so, with the buffers of every landing lent to their
    /// requests meanwhile (taken back however the wait ends, unwinding included).
    pub(crate) fn wait_lending(
        &mut self,
        what: &dyn Fn() -> String,
        done: impl FnMut(&mut World<C>) -> bool,
    ) -> Result<(), RmaError> {
        // Every landing's buffer is lent, not only those waited for: the others' bytes
        // arrive meanwhile too, and each buffer is the epoch's for 'b.
        let reqs: Vec<u32> = self.landings.iter().map(|l| l.req).collect();
        let reqs = &reqs[..];
        self.lend(reqs);
        let busy = self.rdma_busy();
        let peers = self.win.world_ranks();
        let world = &mut *self.world;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            world.wait_until(what, peers, busy, done)
        }));
        self.take_back(reqs);
        match r {
            Ok(r) => r.map_err(|e| self.fail(e)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Completes every landing that `which` selects.
    pub(crate) fn complete_landings(&mut self, which: impl Fn(&Landing) -> bool) -> Result<(), RmaError> {
        let reqs: Vec<u32> = self.landings.iter().filter(|l| which(l)).map(|l| l.req).collect();
        if reqs.is_empty() {
            return Ok(());
        }
        let id = self.win.id;
        let r = self.wait_lending(&|| format!("{} gets", reqs.len()), |w| {
            poll_xfers(w, id);
            rma(w)
                .slot(id)
                .is_none_or(|s| reqs.iter().all(|&q| s.origin.is_over(q)))
        });
        let mut first = r.err();
        for q in reqs {
            if let Err(e) = self.copy_arrived(q) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    // -----------------------------------------------------------------------------
    // Completion

    /// Completes this epoch's gets and get-accumulates at the origin (their buffers
    /// hold the data); to `target` only, or to every member.
    ///
    /// # Errors
    /// The first refusal or failure among them.
    pub(crate) fn complete_local(&mut self, target: Option<u32>) -> Result<(), RmaError> {
        if self.landings.is_empty() {
            return Ok(());
        }
        let id = self.win.id;
        let peers: Vec<u32> = self.win.peers.iter().map(|p| p.world).collect();
        let sel = target.map(|t| peers[t as usize]);
        let targets: Vec<(u32, u32)> = {
            let s = rma(self.world).slot(id);
            self.landings
                .iter()
                .map(|l| {
                    (
                        l.req,
                        s.and_then(|s| s.origin.pending.get(&l.req))
                            .map_or(u32::MAX, |p| p.target),
                    )
                })
                .collect()
        };
        let pick: Vec<u32> = targets
            .iter()
            .filter(|(_, t)| sel.is_none_or(|s| s == *t))
            .map(|(r, _)| *r)
            .collect();
        self.complete_landings(|l| pick.contains(&l.req))
    }

    /// Completes every operation to `target` (or to every member) at the origin and at
    /// the target: waits for answers, and asks each target that was sent puts or
    /// accumulates by messages to answer once it has applied them. Reports what the
    /// targets refused meanwhile.
    pub(crate) fn complete_remote(&mut self, target: Option<u32>) -> Result<(), RmaError> {
        let mut first = self.complete_local(target).err();
        if let Err(e) = self.complete_rdma(target) {
            first.get_or_insert(e);
        }
        // Stores into mapped memory are complete once they are visible.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = self.check_alive(target) {
            first.get_or_insert(e);
        }
        if self.win.shm_sync {
            // Every operation was a copy or an atomic on mapped memory: nothing is owed.
            return first.map_or(Ok(()), Err);
        }
        let id = self.win.id;
        let members: Vec<u32> = match target {
            Some(t) => vec![t],
            None => (0..self.win.peers.len() as u32).collect(),
        };
        let owed: Vec<u32> = {
            let s = rma(self.world).slot_mut(id);
            match s {
                Some(s) => members
                    .into_iter()
                    .filter(|&t| std::mem::take(&mut s.origin.unflushed[t as usize]))
                    .collect(),
                None => Vec::new(),
            }
        };
        let mut reqs = Vec::with_capacity(owed.len());
        for t in owed {
            let w = self.win.peers[t as usize].world;
            let req = self.request(w, Want::Ack)?;
            self.send(w, wire::FLUSH, 0, req, &[])?;
            reqs.push(req);
        }
        if let Err(e) = self.wait_reqs(&reqs) {
            first.get_or_insert(e);
        }
        if let Err(e) = self.take_refusals(target) {
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }

    /// The first refusal, from `target` (or anyone), of a request without an answer.
    pub(crate) fn take_refusals(&mut self, target: Option<u32>) -> Result<(), RmaError> {
        let id = self.win.id;
        let w = target.map(|t| self.win.peers[t as usize].world);
        let Some(s) = rma(self.world).slot_mut(id) else {
            return Ok(());
        };
        let Some(i) = s
            .origin
            .refusals
            .iter()
            .position(|r| w.is_none_or(|w| r.target == w))
        else {
            return Ok(());
        };
        let r = s.origin.refusals.remove(i);
        let before = s.origin.refusals.len();
        s.origin.refusals.retain(|x| w.is_some_and(|w| x.target != w));
        let others = before - s.origin.refusals.len();
        Err(RmaError::Refused {
            target: self.rank_of(r.target),
            why: r.why.unwrap_or(Refusal::Malformed),
            disp: r.disp,
            len: r.len,
            others,
        })
    }

    /// The same epoch with buffers of another lifetime, once every get of this one is
    /// complete (or failed: its bytes then stay where they landed, never copied).
    pub(crate) fn rebind<'b2>(self) -> Ops<'w, 'b2, T, C> {
        Ops {
            world: self.world,
            win: self.win,
            reach: self.reach,
            landings: Vec::new(),
            _buf: PhantomData,
        }
    }
}
