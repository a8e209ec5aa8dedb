//! Issuing operations: what every epoch can do to the targets it reaches, by the route
//! this process has to each (a copy into mapped memory, cross-memory attach, or
//! messages), and completing them.
//!
//! A get whose bytes come in packets lands in the proto's buffer first and is copied
//! into the caller's buffer by this epoch's next call that completes it (a wait, a
//! flush, the epoch's end): the epoch holds the caller's buffer for its lifetime, so a
//! forgotten epoch leaves the bytes where they landed and never writes anywhere else.

use super::RmaError;
use super::elem::{self, AccOp};
use super::proto::{Rma, State, Want};
use super::window::{Flavor, Peer, Route, Window, rma};
use super::wire::{self, AccHead, Refusal};
use crate::channel::{Channel, Header, NemesisChannel};
use crate::op::Reducible;
use crate::p2p::{P2pError, World};
use crate::progress::ProtocolId;
use bytemuck::Pod;
use std::marker::PhantomData;
use std::ops::Range;

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
struct Landing {
    req: u32,
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

/// A get started with [`Ops::rget`]: the buffer it fills, lent back by [`Ops::wait`],
/// or in pieces by [`Ops::wait_range`] as they arrive.
#[must_use = "a get completes only when waited for, flushed, or its epoch ends"]
#[derive(Debug)]
pub struct Get<'b, T> {
    req: Option<u32>,
    ptr: *mut T,
    len: usize,
    _buf: PhantomData<&'b mut [T]>,
}

impl<T> Get<'_, T> {
    /// Elements asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it asked for none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Moves bytes to or from another local process by cross-memory attach; false when the
/// kernel refuses (the caller then sends a message instead).
fn cma(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> bool {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: within the caller's buffer of `len` bytes.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec covers the caller's live buffer; the remote one is
        // checked by the kernel against the peer's address space.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
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
    fn serve_others(&mut self) -> Result<(), RmaError> {
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
    fn issued(&mut self, target: u32, answered: bool) {
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
        let r = self
            .world
            .wait_until(&|| format!("{} one-sided answers", reqs.len()), peers, |w| {
                rma(w)
                    .slot(id)
                    .is_none_or(|s| reqs.iter().all(|&q| s.origin.is_over(q)))
            });
        let r = r.map_err(|e| self.fail(e));
        let mut out = Vec::with_capacity(reqs.len());
        let mut first = r.err();
        for &q in reqs {
            let p = self.rma().slot_mut(id).and_then(|s| s.origin.pending.remove(&q));
            match p {
                Some(p) => match p.state {
                    State::Done => out.push(p.data),
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

    fn rank_of(&self, w: u32) -> u32 {
        self.win.comm.inner.rank_of(w).unwrap_or(w)
    }

    fn max_payload(&self, w: u32, head: usize) -> usize {
        self.world.channel().max_payload_to(w).saturating_sub(head).max(1)
    }

    // -----------------------------------------------------------------------------
    // Operations

    /// Writes `src` into member `target`'s memory at `disp`.
    ///
    /// # Errors
    /// [`RmaError::InvalidRank`], [`RmaError::NotInEpoch`], [`RmaError::OutOfBounds`],
    /// and the channel's.
    pub fn put(&mut self, src: &[T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, src.len())?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let off = disp * size_of::<T>();
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                // SAFETY: `check` put the bytes inside the member's memory, mapped here
                // for the window's life; they are written as raw bytes, never borrowed,
                // since others may access them under MPI's rules meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (a + off) as *mut u8, bytes.len()) };
                Ok(())
            }
            Route::Cma { pid, addr }
                if cma(
                    pid,
                    addr + off as u64,
                    bytes.as_ptr().cast_mut(),
                    bytes.len(),
                    true,
                ) =>
            {
                Ok(())
            }
            Route::Cma { .. } => {
                self.win.give_up_cma();
                self.am_put(target, p.world, off as u64, bytes)
            }
            Route::Am => self.am_put(target, p.world, off as u64, bytes),
        }
    }

    fn am_put(&mut self, target: u32, w: u32, off: u64, bytes: &[u8]) -> Result<(), RmaError> {
        let max = self.max_payload(w, wire::DISP_HEAD);
        for (i, chunk) in bytes.chunks(max).enumerate() {
            let head = wire::disp_head(off + (i * max) as u64);
            self.send(w, wire::PUT, 0, 0, &[&head, chunk])?;
            self.issued(target, false);
        }
        Ok(())
    }

    /// Reads member `target`'s memory at `disp` into `dst`, which stays borrowed until
    /// the get completes.
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn get(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.start_get(dst, target, disp).map(|_| ())
    }

    /// As [`Ops::get`], returning a request that [`Ops::wait`] or [`Ops::wait_range`]
    /// completes; a request-based get (MPI's `Rget`).
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn rget(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<Get<'b, T>, RmaError> {
        let (ptr, len) = (dst.as_mut_ptr(), dst.len());
        let req = self.start_get(dst, target, disp)?;
        Ok(Get {
            req,
            ptr,
            len,
            _buf: PhantomData,
        })
    }

    fn start_get(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<Option<u32>, RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, dst.len())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let off = disp * size_of::<T>();
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                // SAFETY: as for `put`, reading.
                unsafe {
                    std::ptr::copy_nonoverlapping((a + off) as *const u8, bytes.as_mut_ptr(), bytes.len())
                };
                Ok(None)
            }
            Route::Cma { pid, addr }
                if cma(pid, addr + off as u64, bytes.as_mut_ptr(), bytes.len(), false) =>
            {
                Ok(None)
            }
            Route::Cma { .. } | Route::Am => {
                if matches!(p.route, Route::Cma { .. }) {
                    self.win.give_up_cma();
                }
                if bytes.is_empty() {
                    return Ok(None);
                }
                let req = self.request(p.world, Want::Data(bytes.len()))?;
                self.send(
                    p.world,
                    wire::GET,
                    0,
                    req,
                    &[&wire::get(off as u64, bytes.len() as u64)],
                )?;
                self.issued(target, true);
                self.landings.push(Landing {
                    req,
                    ptr: bytes.as_mut_ptr(),
                    len: bytes.len(),
                    copied: 0,
                });
                Ok(Some(req))
            }
        }
    }

    /// Reads member `target`'s memory at `disp` into `dst` and returns once it is there:
    /// a get and its completion in one call, so `dst` is borrowed for the call only.
    ///
    /// # Errors
    /// As for [`Ops::put`], and the target's refusal or failure.
    pub fn read(&mut self, dst: &mut [T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, dst.len())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let off = disp * size_of::<T>();
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                // SAFETY: as for `put`, reading.
                unsafe {
                    std::ptr::copy_nonoverlapping((a + off) as *const u8, bytes.as_mut_ptr(), bytes.len())
                };
                return Ok(());
            }
            Route::Cma { pid, addr }
                if cma(pid, addr + off as u64, bytes.as_mut_ptr(), bytes.len(), false) =>
            {
                return Ok(());
            }
            Route::Cma { .. } => self.win.give_up_cma(),
            Route::Am => {}
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let req = self.request(p.world, Want::Data(bytes.len()))?;
        self.send(
            p.world,
            wire::GET,
            0,
            req,
            &[&wire::get(off as u64, bytes.len() as u64)],
        )?;
        self.issued(target, true);
        let got = self.wait_reqs(&[req])?;
        bytes.copy_from_slice(&got[0]);
        Ok(())
    }

    /// Completes a request-based get and lends its buffer back.
    ///
    /// # Errors
    /// The target's refusal, its failure, or the channel's.
    pub fn wait(&mut self, g: Get<'b, T>) -> Result<&'b mut [T], RmaError> {
        if let Some(req) = g.req {
            self.complete_landings(|l| l.req == req)?;
        }
        // SAFETY: the buffer was lent to the get for 'b and is complete: nothing writes
        // it any more, and the handle that held it is consumed.
        Ok(unsafe { std::slice::from_raw_parts_mut(g.ptr, g.len) })
    }

    /// Elements of a request-based get that have arrived, in order from the first.
    pub fn arrived(&mut self, g: &Get<'b, T>) -> usize {
        let Some(req) = g.req else { return g.len };
        let id = self.win.id;
        let bytes = rma(self.world)
            .slot(id)
            .and_then(|s| s.origin.pending.get(&req))
            .map_or_else(
                || {
                    self.landings
                        .iter()
                        .find(|l| l.req == req)
                        .map_or(g.len * size_of::<T>(), |l| l.copied)
                },
                |p| p.data.len(),
            );
        bytes / size_of::<T>()
    }

    /// Waits until elements `range` of a request-based get have arrived, and lends them:
    /// a consumer starts on the first part of a large get while the rest moves.
    ///
    /// # Errors
    /// [`RmaError::InvalidArgument`] for a range outside the get; otherwise as for
    /// [`Ops::wait`].
    pub fn wait_range<'g>(
        &mut self,
        g: &'g mut Get<'b, T>,
        range: Range<usize>,
    ) -> Result<&'g [T], RmaError> {
        if range.start > range.end || range.end > g.len {
            return Err(RmaError::InvalidArgument(format!(
                "elements {range:?} of a get of {}",
                g.len
            )));
        }
        if let Some(req) = g.req {
            let want = range.end * size_of::<T>();
            let id = self.win.id;
            let peers = self.win.world_ranks();
            let r = self
                .world
                .wait_until(&|| "the first part of a get".into(), peers, |w| {
                    rma(w)
                        .slot(id)
                        .and_then(|s| s.origin.pending.get(&req))
                        .is_none_or(|p| p.state != State::Waiting || p.data.len() >= want)
                });
            r.map_err(|e| self.fail(e))?;
            self.copy_arrived(req)?;
        }
        // SAFETY: these elements have been copied into the buffer lent to the get, and
        // later copies write only past them.
        Ok(unsafe { std::slice::from_raw_parts(g.ptr.add(range.start), range.len()) })
    }

    /// Copies what has arrived for landing `req` into its buffer; finishes it when all
    /// has, and reports its failure.
    fn copy_arrived(&mut self, req: u32) -> Result<(), RmaError> {
        let id = self.win.id;
        let Some(i) = self.landings.iter().position(|l| l.req == req) else {
            return Ok(());
        };
        let world = &mut *self.world;
        let l = &mut self.landings[i];
        let Some(p) = rma(world).slot(id).and_then(|s| s.origin.pending.get(&req)) else {
            return Ok(());
        };
        let upto = p.data.len().min(l.len);
        if upto > l.copied {
            // SAFETY: the buffer was lent for 'b; bytes past `copied` have not been
            // handed to anyone.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p.data.as_ptr().add(l.copied),
                    l.ptr.add(l.copied),
                    upto - l.copied,
                )
            };
            l.copied = upto;
        }
        if p.state == State::Waiting {
            return Ok(());
        }
        self.landings.swap_remove(i);
        self.wait_reqs(&[req]).map(|_| ())
    }

    /// Completes every landing that `which` selects.
    fn complete_landings(&mut self, which: impl Fn(&Landing) -> bool) -> Result<(), RmaError> {
        let reqs: Vec<u32> = self.landings.iter().filter(|l| which(l)).map(|l| l.req).collect();
        if reqs.is_empty() {
            return Ok(());
        }
        let id = self.win.id;
        let peers = self.win.world_ranks();
        let r = self
            .world
            .wait_until(&|| format!("{} gets", reqs.len()), peers, |w| {
                rma(w)
                    .slot(id)
                    .is_none_or(|s| reqs.iter().all(|&q| s.origin.is_over(q)))
            });
        let mut first = r.err().map(|e| self.fail(e));
        for q in reqs {
            if let Err(e) = self.copy_arrived(q) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Applies `op` with `src` to member `target`'s elements at `disp`, element by
    /// element atomically: every update of a window's element, from any origin, is one
    /// CPU atomic operation (by the origin where it maps the memory, by the target
    /// otherwise), so concurrent accumulates never lose one another.
    ///
    /// # Errors
    /// As for [`Ops::put`], and [`RmaError::InvalidArgument`] for a bitwise operation on
    /// a floating-point type.
    pub fn accumulate(&mut self, src: &[T], target: u32, disp: usize, op: AccOp) -> Result<(), RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, src.len())?;
        defined::<T>(op)?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let size = size_of::<T>();
        let off = disp * size;
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = [0u8; 8];
                for (i, x) in bytes.chunks_exact(size).enumerate() {
                    // SAFETY: `check` put the elements inside the member's memory, which
                    // is aligned for `T` and mapped here; every update of it is atomic.
                    unsafe {
                        elem::update(
                            T::TYPE_CODE,
                            op,
                            (a + off + i * size) as *mut u8,
                            x,
                            &mut old[..size],
                        )
                    }
                    .map_err(|why| self.refusal(target, why, off, bytes.len()))?;
                }
                Ok(())
            }
            Route::Cma { .. } | Route::Am => {
                let max = self.max_payload(p.world, wire::ACC_HEAD) / size * size;
                for (i, chunk) in bytes.chunks(max.max(size)).enumerate() {
                    let head = self.acc_head(off + i * max, op);
                    self.send(p.world, wire::ACC, 0, 0, &[&head, chunk])?;
                    self.issued(target, false);
                }
                Ok(())
            }
        }
    }

    fn acc_head(&self, off: usize, op: AccOp) -> [u8; wire::ACC_HEAD]
    where
        T: Reducible,
    {
        wire::acc_head(AccHead {
            disp: off as u64,
            tag: self.win.type_tag,
            code: T::TYPE_CODE,
            op: op.code(),
        })
    }

    fn refusal(&self, target: u32, why: Refusal, off: usize, len: usize) -> RmaError {
        RmaError::Refused {
            target,
            why,
            disp: off as u64,
            len: len as u64,
            others: 0,
        }
    }

    /// Applies `op` with `src` as [`Ops::accumulate`] does, and puts what the elements
    /// held before into `result` (as long as `src`), which stays borrowed until the
    /// operation completes. With [`AccOp::NoOp`] it is an atomic read.
    ///
    /// # Errors
    /// As for [`Ops::accumulate`], and [`RmaError::InvalidArgument`] for buffers of
    /// different lengths.
    pub fn get_accumulate(
        &mut self,
        src: &[T],
        result: &'b mut [T],
        target: u32,
        disp: usize,
        op: AccOp,
    ) -> Result<(), RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        if src.len() != result.len() {
            return Err(RmaError::InvalidArgument(format!(
                "a get-accumulate of {} elements into {}",
                src.len(),
                result.len()
            )));
        }
        let p = self.check(target, disp, src.len())?;
        defined::<T>(op)?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let out: &mut [u8] = bytemuck::cast_slice_mut(result);
        let size = size_of::<T>();
        let off = disp * size;
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                for (i, (x, o)) in bytes
                    .chunks_exact(size)
                    .zip(out.chunks_exact_mut(size))
                    .enumerate()
                {
                    // SAFETY: as for `accumulate`.
                    unsafe { elem::update(T::TYPE_CODE, op, (a + off + i * size) as *mut u8, x, o) }
                        .map_err(|why| self.refusal(target, why, off, bytes.len()))?;
                }
                Ok(())
            }
            Route::Cma { .. } | Route::Am => {
                let max = (self.max_payload(p.world, wire::ACC_HEAD) / size * size).max(size);
                for (i, (chunk, dst)) in bytes.chunks(max).zip(out.chunks_mut(max)).enumerate() {
                    let req = self.request(p.world, Want::Data(chunk.len()))?;
                    let head = self.acc_head(off + i * max, op);
                    self.send(p.world, wire::GACC, 0, req, &[&head, chunk])?;
                    self.issued(target, true);
                    self.landings.push(Landing {
                        req,
                        ptr: dst.as_mut_ptr(),
                        len: dst.len(),
                        copied: 0,
                    });
                }
                Ok(())
            }
        }
    }

    /// Applies `op` with `x` to one element of member `target` and returns what it held
    /// before; complete at the target when it returns.
    ///
    /// # Errors
    /// As for [`Ops::accumulate`].
    pub fn fetch_and_op(&mut self, x: T, target: u32, disp: usize, op: AccOp) -> Result<T, RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, 1)?;
        defined::<T>(op)?;
        let size = size_of::<T>();
        let off = disp * size;
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = T::zeroed();
                // SAFETY: as for `accumulate`.
                unsafe {
                    elem::update(
                        T::TYPE_CODE,
                        op,
                        (a + off) as *mut u8,
                        bytemuck::bytes_of(&x),
                        bytemuck::bytes_of_mut(&mut old),
                    )
                }
                .map_err(|why| self.refusal(target, why, off, size))?;
                Ok(old)
            }
            Route::Cma { .. } | Route::Am => {
                let req = self.request(p.world, Want::Data(size))?;
                let head = self.acc_head(off, op);
                self.send(p.world, wire::GACC, 0, req, &[&head, bytemuck::bytes_of(&x)])?;
                self.issued(target, true);
                let got = self.wait_reqs(&[req])?;
                Ok(bytemuck::pod_read_unaligned(&got[0]))
            }
        }
    }

    /// Stores `swap` in one element of member `target` if it holds `compare` (compared
    /// bit for bit), and returns what it held before; complete at the target when it
    /// returns.
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn compare_and_swap(&mut self, compare: T, swap: T, target: u32, disp: usize) -> Result<T, RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, 1)?;
        let size = size_of::<T>();
        let off = disp * size;
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = T::zeroed();
                // SAFETY: as for `accumulate`.
                unsafe {
                    elem::compare_and_swap(
                        size,
                        (a + off) as *mut u8,
                        bytemuck::bytes_of(&compare),
                        bytemuck::bytes_of(&swap),
                        bytemuck::bytes_of_mut(&mut old),
                    )
                }
                .map_err(|why| self.refusal(target, why, off, size))?;
                Ok(old)
            }
            Route::Cma { .. } | Route::Am => {
                let req = self.request(p.world, Want::Data(size))?;
                let head = wire::acc_head(AccHead {
                    disp: off as u64,
                    tag: self.win.type_tag,
                    code: T::TYPE_CODE,
                    op: 0,
                });
                self.send(
                    p.world,
                    wire::CAS,
                    0,
                    req,
                    &[&head, bytemuck::bytes_of(&compare), bytemuck::bytes_of(&swap)],
                )?;
                self.issued(target, true);
                let got = self.wait_reqs(&[req])?;
                Ok(bytemuck::pod_read_unaligned(&got[0]))
            }
        }
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

/// Refuses, at the origin, an operation not defined for `T`.
fn defined<T: Reducible>(op: AccOp) -> Result<(), RmaError> {
    let float = matches!(T::TYPE_CODE, 9 | 10);
    if float && matches!(op, AccOp::BitAnd | AccOp::BitOr | AccOp::BitXor) {
        return Err(RmaError::InvalidArgument(format!(
            "{op:?} is not defined for {}",
            std::any::type_name::<T>()
        )));
    }
    Ok(())
}
