//! Epochs: the guard values inside which operations exist. Each borrows the world and
//! the window, dereferences to [`Ops`], and synchronises when it opens and closes:
//!
//! - a fence epoch: every member's operations of the epoch are complete at origin and
//!   target when the closing fence returns. Where every member maps the window, that is
//!   a memory fence and the node barrier; otherwise each origin counts the requests it
//!   sent each target, an allreduce tells each target how many to expect, and the target
//!   waits until it has applied that many (counted remote completion, no message per
//!   pair);
//! - post, start, complete and wait: counters in the window file between members that
//!   map it, `POST` and `COMPLETE` messages otherwise;
//! - locks: the target's ticket lock in the window file when every member maps it, else
//!   a FIFO queue at the target served by messages.
//!
//! Closing returns a `Result`. An epoch dropped unclosed is closed by its `Drop`, which
//! can only report a failure on standard error; one forgotten (`mem::forget`) stays
//! open, which blocks others but never touches memory it does not own.

use super::access::{Members, Ops, Reach};
use super::proto::Want;
use super::window::{Flavor, Window, rma};
use super::{Assert, LockKind, RmaError, wire};
use crate::channel::{Channel, NemesisChannel};
use crate::op::Op;
use crate::p2p::World;
use bytemuck::Pod;
use nemesis_shm::variant::Sound;
use nemesis_shm::window::pscw;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{Ordering, fence};

macro_rules! ops_deref {
    ($t:ident) => {
        impl<'w, 'b, T: Pod, C: Channel> Deref for $t<'w, 'b, T, C> {
            type Target = Ops<'w, 'b, T, C>;
            fn deref(&self) -> &Self::Target {
                self.ops
                    .as_ref()
                    .expect("an epoch has its operations until it closes")
            }
        }
        impl<'w, 'b, T: Pod, C: Channel> DerefMut for $t<'w, 'b, T, C> {
            fn deref_mut(&mut self) -> &mut Self::Target {
                self.ops
                    .as_mut()
                    .expect("an epoch has its operations until it closes")
            }
        }
        impl<T: Pod, C: Channel> std::fmt::Debug for $t<'_, '_, T, C> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("ops", &self.ops)
                    .finish_non_exhaustive()
            }
        }
    };
}

/// A group of members as a set, checked.
fn group_mask<T: Pod>(win: &Window<T>, group: &[u32]) -> Result<Members, RmaError> {
    let n = win.peers.len() as u32;
    let mut m = Members::default();
    for &r in group {
        if r >= n {
            return Err(RmaError::InvalidRank { rank: r, size: n });
        }
        if m.contains(r) {
            return Err(RmaError::InvalidArgument(format!(
                "rank {r} is twice in the group"
            )));
        }
        m.insert(r);
    }
    Ok(m)
}

/// Whether `me` and member `r` meet in the window file: post and complete are counters.
fn shm_pair<T: Pod>(win: &Window<T>, r: u32) -> Option<(usize, usize)> {
    Some((win.member?, win.peers[r as usize].member?)).filter(|_| win.file.is_some())
}

// ---------------------------------------------------------------------------------------
// Fence

/// An epoch between two fences, in which every member may access every other
/// ([`Window::fence`]).
pub struct FenceEpoch<'w, 'b, T: Pod, C: Channel = NemesisChannel> {
    ops: Option<Ops<'w, 'b, T, C>>,
}

ops_deref!(FenceEpoch);

impl<T: Pod> Window<T> {
    /// Opens a fence epoch: collective over the window's communicator. Every operation
    /// of a member's previous epoch is complete everywhere when this returns.
    ///
    /// # Errors
    /// [`RmaError::Wrong`] for another world's window; a member's failure; a refusal by
    /// a target of a request of the previous epoch.
    pub fn fence<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
        assert: Assert,
    ) -> Result<FenceEpoch<'w, 'b, T, C>, RmaError> {
        let mut ops = Ops::new(world, self, Reach::All)?;
        fence_sync(&mut ops, assert)?;
        Ok(FenceEpoch { ops: Some(ops) })
    }
}

impl<'w, 'b, T: Pod, C: Channel> FenceEpoch<'w, 'b, T, C> {
    /// Closes this epoch and opens the next: collective. When it returns, every
    /// operation of the closed epoch is complete at its origin and its target, and the
    /// buffers of its gets are free.
    ///
    /// # Errors
    /// As for [`Window::fence`]; the next epoch is not opened.
    pub fn fence<'b2>(mut self, assert: Assert) -> Result<FenceEpoch<'w, 'b2, T, C>, RmaError> {
        let mut ops = self.ops.take().expect("open");
        fence_sync(&mut ops, assert)?;
        Ok(FenceEpoch {
            ops: Some(ops.rebind()),
        })
    }

    /// Closes this epoch without opening another: collective, as [`FenceEpoch::fence`].
    ///
    /// # Errors
    /// As for [`Window::fence`].
    pub fn end(mut self, assert: Assert) -> Result<(), RmaError> {
        let mut ops = self.ops.take().expect("open");
        fence_sync(&mut ops, assert | Assert::NOSUCCEED)
    }
}

impl<T: Pod, C: Channel> Drop for FenceEpoch<'_, '_, T, C> {
    fn drop(&mut self) {
        let Some(mut ops) = self.ops.take() else { return };
        if std::thread::panicking() {
            return;
        }
        // The other members wait in their fence: close it as they do.
        if let Err(e) = fence_sync(&mut ops, Assert::NOSUCCEED) {
            eprintln!("nemesis: a fence epoch dropped unclosed failed to close: {e}");
        }
    }
}

/// A fence: completes this member's operations of the closing epoch at the origin and
/// at every target, and meets the other members.
fn fence_sync<T: Pod, C: Channel>(ops: &mut Ops<'_, '_, T, C>, assert: Assert) -> Result<(), RmaError> {
    let mut first = ops.complete_local(None).err();
    if let Err(e) = ops.complete_rdma(None) {
        first.get_or_insert(e);
    }
    fence(Ordering::SeqCst);
    let win = ops.win;
    let comm = win.comm.clone();
    if win.shm_sync || assert.contains(Assert::NOPRECEDE) {
        // Every operation was a copy or an atomic on mapped memory, or there were none.
        if !assert.contains(Assert::NOPRECEDE | Assert::NOSUCCEED) {
            ops.world.barrier(&comm).map_err(|e| ops.fail(e))?;
        }
        fence(Ordering::SeqCst);
        return first.map_or(Ok(()), Err);
    }
    let id = win.id;
    let n = win.peers.len();
    let me = win.me as usize;
    // How many requests each target is to have applied, all epochs so far.
    let mut counts = rma(ops.world)
        .slot(id)
        .map_or_else(|| vec![0u64; n], |s| s.origin.issued.clone());
    ops.world
        .allreduce(&comm, &mut counts, Op::Sum)
        .map_err(|e| ops.fail(e))?;
    let expected = counts[me];
    let peers = win.world_ranks();
    ops.world
        .wait_until(
            &|| format!("the {expected} requests a fence expects"),
            peers,
            false,
            |w| rma(w).slot(id).is_none_or(|s| s.target.applied >= expected),
        )
        .map_err(|e| ops.fail(e))?;
    // What each origin's requests were refused, all epochs so far: the allreduce is the
    // fence's closing barrier too.
    let mut refused: Vec<u64> = match rma(ops.world).slot(id) {
        Some(s) => win
            .peers
            .iter()
            .map(|p| s.target.refused.get(&p.world).copied().unwrap_or(0))
            .collect(),
        None => vec![0; n],
    };
    ops.world
        .allreduce(&comm, &mut refused, Op::Sum)
        .map_err(|e| ops.fail(e))?;
    let mine = refused[me];
    ops.world
        .wait_until(&|| "the refusals a fence was told of".into(), peers, false, |w| {
            rma(w).slot(id).is_none_or(|s| s.origin.refusals_seen >= mine)
        })
        .map_err(|e| ops.fail(e))?;
    if let Some(s) = rma(ops.world).slot_mut(id) {
        s.origin.unflushed.iter_mut().for_each(|u| *u = false);
    }
    if let Err(e) = ops.take_refusals(None) {
        first.get_or_insert(e);
    }
    fence(Ordering::SeqCst);
    first.map_or(Ok(()), Err)
}

// ---------------------------------------------------------------------------------------
// Post, start, complete, wait

/// An exposure epoch ([`Window::post`]): the origins of its group may access this
/// member until [`ExposureEpoch::wait`] sees each of them complete.
#[must_use = "an exposure epoch ends with wait"]
#[derive(Debug)]
pub struct ExposureEpoch<'w, T: Pod> {
    win: &'w Window<T>,
    open: bool,
}

/// An access epoch ([`Window::start`]) to the targets of its group, ended by
/// [`AccessEpoch::complete`].
pub struct AccessEpoch<'w, 'b, T: Pod, C: Channel = NemesisChannel> {
    ops: Option<Ops<'w, 'b, T, C>>,
    group: Vec<u32>,
}

ops_deref!(AccessEpoch);

impl<T: Pod> Window<T> {
    /// Opens an exposure epoch to the origins `group` (communicator ranks): they may
    /// access this member's memory from their matching [`Window::start`] until their
    /// complete. Does not wait for them.
    ///
    /// # Errors
    /// [`RmaError::InvalidRank`] or [`RmaError::InvalidArgument`] for a bad group; the
    /// channel's.
    pub fn post<'w, C: Channel>(
        &'w self,
        world: &mut World<C>,
        group: &[u32],
        _assert: Assert,
    ) -> Result<ExposureEpoch<'w, T>, RmaError> {
        self.check_world(world)?;
        group_mask(self, group)?;
        // The memory as this member left it is what the origins see.
        fence(Ordering::SeqCst);
        for &o in group {
            match shm_pair(self, o) {
                Some((me, them)) => {
                    let f = self.file.as_ref().expect("a shared pair has the file");
                    pscw::signal::<Sound>(f.exposure(them, me));
                    rma(world).slot_mut(self.id).expect("registered").pscw.shm_posted += 1;
                }
                None => {
                    let w = self.peers[o as usize].world;
                    let h = crate::channel::Header {
                        kind: u16::from(wire::POST),
                        context: self.id,
                        ..Default::default()
                    };
                    world.core.send(crate::ProtocolId::RMA, w, h, &[])?;
                    rma(world).slot_mut(self.id).expect("registered").pscw.am_posted += 1;
                }
            }
        }
        Ok(ExposureEpoch {
            win: self,
            open: true,
        })
    }

    /// Opens an access epoch to the targets `group` (communicator ranks), waiting until
    /// each has posted.
    ///
    /// # Errors
    /// As for [`Window::post`]; a target's failure.
    pub fn start<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
        group: &[u32],
        _assert: Assert,
    ) -> Result<AccessEpoch<'w, 'b, T, C>, RmaError> {
        let mask = group_mask(self, group)?;
        let ops = Ops::new(world, self, Reach::Some(mask))?;
        let id = self.id;
        let mut wants = Vec::with_capacity(group.len());
        {
            let s = rma(ops.world)
                .slot_mut(id)
                .ok_or(RmaError::Wrong("the window was freed"))?;
            for &t in group {
                let n = s.pscw.started.entry(t).or_default();
                *n = n.wrapping_add(1);
                wants.push((t, *n));
            }
        }
        let peers = self.world_ranks();
        // Posts through the window file ring nothing: wait for them awake.
        let shm = group.iter().any(|&t| shm_pair(self, t).is_some());
        let r = ops.world.wait_until(
            &|| "the posts of an access epoch's targets".into(),
            peers,
            shm,
            |w| {
                let s = rma(w).slot(id);
                wants.iter().all(|&(t, n)| match shm_pair(self, t) {
                    Some((me, them)) => {
                        pscw::reached(self.file.as_ref().expect("file").exposure(me, them), n)
                    }
                    None => s.is_none_or(|s| {
                        let got = s
                            .origin
                            .posts
                            .get(&self.peers[t as usize].world)
                            .copied()
                            .unwrap_or(0);
                        got.wrapping_sub(n) as i32 >= 0
                    }),
                })
            },
        );
        r.map_err(|e| ops.fail(e))?;
        Ok(AccessEpoch {
            ops: Some(ops),
            group: group.to_vec(),
        })
    }
}

impl<T: Pod, C: Channel> AccessEpoch<'_, '_, T, C> {
    /// Ends the access epoch: its operations are complete here, and will be at each
    /// target before its wait returns. A target's refusal of a put or an accumulate of
    /// this epoch is reported by this member's next synchronisation on the window.
    ///
    /// # Errors
    /// The first failure or refusal of a get.
    pub fn complete(mut self) -> Result<(), RmaError> {
        let mut ops = self.ops.take().expect("open");
        complete(&mut ops, &self.group)
    }
}

fn complete<T: Pod, C: Channel>(ops: &mut Ops<'_, '_, T, C>, group: &[u32]) -> Result<(), RmaError> {
    let r = ops.complete_local(None).and(ops.complete_rdma(None));
    fence(Ordering::SeqCst);
    let win = ops.win;
    for &t in group {
        match shm_pair(win, t) {
            Some((_, them)) => pscw::signal::<Sound>(win.file.as_ref().expect("file").complete(them)),
            None => {
                let w = win.peers[t as usize].world;
                ops.send(w, wire::COMPLETE, 0, 0, &[])?;
                // The target waits for everything before the complete; no flush is owed.
                if let Some(s) = rma(ops.world).slot_mut(win.id) {
                    s.origin.unflushed[t as usize] = false;
                }
            }
        }
    }
    r
}

impl<T: Pod, C: Channel> Drop for AccessEpoch<'_, '_, T, C> {
    fn drop(&mut self) {
        let Some(mut ops) = self.ops.take() else { return };
        // The targets wait for our complete: send it even while unwinding.
        if let Err(e) = complete(&mut ops, &self.group) {
            eprintln!("nemesis: an access epoch dropped unclosed: {e}");
        }
    }
}

impl<'w, T: Pod> ExposureEpoch<'w, T> {
    /// Ends the exposure epoch once every origin of its group has completed: their
    /// operations are then visible here.
    ///
    /// # Errors
    /// An origin's failure; the channel's.
    pub fn wait<C: Channel>(mut self, world: &mut World<C>) -> Result<(), RmaError> {
        self.open = false;
        let win = self.win;
        win.check_world(world)?;
        let peers = win.world_ranks();
        // Completes through the window file ring nothing: wait for them awake.
        let shm = rma(world).slot(win.id).is_some_and(|s| s.pscw.shm_posted != 0);
        world
            .wait_until(&|| "the completes of an exposure epoch".into(), peers, shm, |w| {
                exposed_done(win, w)
            })
            .map_err(|e| match e {
                crate::P2pError::PeerFailed { rank, reason } => RmaError::PeerFailed {
                    rank: win.comm.inner.rank_of(rank).unwrap_or(rank),
                    reason,
                },
                other => other.into(),
            })?;
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Whether every origin has completed, moving progress on once; true ends the epoch
    /// as [`ExposureEpoch::wait`] would.
    ///
    /// # Errors
    /// The channel's.
    pub fn test<C: Channel>(&mut self, world: &mut World<C>) -> Result<bool, RmaError> {
        self.win.check_world(world)?;
        world.progress()?;
        let done = exposed_done(self.win, world);
        if done {
            self.open = false;
            fence(Ordering::SeqCst);
        }
        Ok(done)
    }
}

fn exposed_done<T: Pod, C: Channel>(win: &Window<T>, w: &mut World<C>) -> bool {
    let Some(s) = rma(w).slot(win.id) else { return true };
    let shm = match (win.member, &win.file) {
        (Some(me), Some(f)) => pscw::reached(f.complete(me), s.pscw.shm_posted),
        _ => true,
    };
    shm && s.target.completes >= s.pscw.am_posted
}

impl<T: Pod> Drop for ExposureEpoch<'_, T> {
    fn drop(&mut self) {
        if self.open && !std::thread::panicking() {
            eprintln!(
                "nemesis: an exposure epoch of window {} was dropped without wait; its origins may still be writing",
                self.win.id
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Locks

/// How a target's lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// A ticket in the window file.
    Ticket,
    /// Granted by the target's queue.
    Queue,
    /// The target's counter word, taken by the card's atomics.
    Nic,
    /// Not taken: the caller asserted no conflict.
    NoCheck,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    target: u32,
    kind: LockKind,
    how: How,
}

/// The locks an epoch holds: one in place, more (a `lock_all`) on the heap.
#[derive(Debug, Default)]
struct Holds {
    first: Option<Held>,
    rest: Vec<Held>,
}

impl Holds {
    fn push(&mut self, h: Held) {
        if self.first.is_none() {
            self.first = Some(h);
        } else {
            self.rest.push(h);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Held> + Clone {
        self.first.iter().chain(self.rest.iter())
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}

/// A passive-target epoch: locks held on one or more targets ([`Window::lock`],
/// [`Window::lock_all`]), which do nothing for them, ended by [`LockEpoch::unlock`].
pub struct LockEpoch<'w, 'b, T: Pod, C: Channel = NemesisChannel> {
    ops: Option<Ops<'w, 'b, T, C>>,
    held: Holds,
}

ops_deref!(LockEpoch);

impl<T: Pod> Window<T> {
    /// Locks member `target` (shared or exclusive) and opens an epoch of operations on
    /// it. Blocks until the lock is granted. More targets can join with
    /// [`LockEpoch::lock`].
    ///
    /// # Errors
    /// [`RmaError::InvalidRank`], a target's failure, the channel's.
    pub fn lock<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
        target: u32,
        kind: LockKind,
    ) -> Result<LockEpoch<'w, 'b, T, C>, RmaError> {
        self.lock_with(world, target, kind, Assert::NONE)
    }

    /// As [`Window::lock`], with an assertion ([`Assert::NOCHECK`] takes no lock).
    ///
    /// # Errors
    /// As for [`Window::lock`].
    pub fn lock_with<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
        target: u32,
        kind: LockKind,
        assert: Assert,
    ) -> Result<LockEpoch<'w, 'b, T, C>, RmaError> {
        let ops = Ops::new(world, self, Reach::Some(Members::default()))?;
        let mut ep = LockEpoch {
            ops: Some(ops),
            held: Holds::default(),
        };
        ep.take(&[target], kind, assert)?;
        Ok(ep)
    }

    /// Locks every member shared and opens an epoch on all of them (MPI's
    /// `Win_lock_all`).
    ///
    /// # Errors
    /// As for [`Window::lock`].
    pub fn lock_all<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
    ) -> Result<LockEpoch<'w, 'b, T, C>, RmaError> {
        self.lock_all_with(world, Assert::NONE)
    }

    /// As [`Window::lock_all`], with an assertion.
    ///
    /// # Errors
    /// As for [`Window::lock`].
    pub fn lock_all_with<'w, 'b, C: Channel>(
        &'w self,
        world: &'w mut World<C>,
        assert: Assert,
    ) -> Result<LockEpoch<'w, 'b, T, C>, RmaError> {
        let n = self.peers.len();
        let ops = Ops::new(world, self, Reach::Some(Members::default()))?;
        let mut ep = LockEpoch {
            ops: Some(ops),
            held: Holds::default(),
        };
        let all: Vec<u32> = (0..n as u32).collect();
        ep.take(&all, LockKind::Shared, assert)?;
        Ok(ep)
    }
}

impl<'w, 'b, T: Pod, C: Channel> LockEpoch<'w, 'b, T, C> {
    /// Locks one more target in this epoch.
    ///
    /// # Errors
    /// [`RmaError::InvalidArgument`] for a target this epoch holds already; as for
    /// [`Window::lock`].
    pub fn lock(&mut self, target: u32, kind: LockKind) -> Result<(), RmaError> {
        self.take(&[target], kind, Assert::NONE)
    }

    fn take(&mut self, targets: &[u32], kind: LockKind, assert: Assert) -> Result<(), RmaError> {
        let ops = self.ops.as_mut().expect("open");
        let win = ops.win;
        let n = win.peers.len() as u32;
        for &t in targets {
            if t >= n {
                return Err(RmaError::InvalidRank { rank: t, size: n });
            }
            if self.held.iter().any(|h| h.target == t) {
                return Err(RmaError::InvalidArgument(format!(
                    "rank {t} is locked by this epoch already"
                )));
            }
        }
        let how = if assert.contains(Assert::NOCHECK) {
            How::NoCheck
        } else if win.nic.is_some() {
            How::Nic
        } else if win.shm_sync {
            How::Ticket
        } else {
            How::Queue
        };
        let excl = kind == LockKind::Exclusive;
        match how {
            How::NoCheck => {}
            How::Nic => {
                for &t in targets {
                    ops.nic_lock(t, excl)?;
                    self.held.push(Held { target: t, kind, how });
                    if let Reach::Some(m) = &mut ops.reach {
                        m.insert(t);
                    }
                }
                fence(Ordering::SeqCst);
                return Ok(());
            }
            How::Ticket => {
                let f = win.file.as_ref().expect("shm_sync has the file");
                let peers = win.world_ranks();
                for &t in targets {
                    let m = win.peers[t as usize].member.expect("shm_sync maps every member");
                    let lock = f.lock(m);
                    let ticket = lock.ticket();
                    // Uncontended, the turn is ours at the first look: no progress call.
                    let ours = |lock: &nemesis_shm::window::lock::RwTicket| {
                        if excl {
                            lock.writer_turn(ticket)
                        } else {
                            lock.reader_turn::<Sound>(ticket)
                        }
                    };
                    if !ours(lock) {
                        let r =
                            ops.world
                                .wait_until(&|| format!("the lock of rank {t}"), peers, true, |_| ours(lock));
                        if let Err(e) = r {
                            // Our ticket is taken: wait for it anyway would block; leave
                            // the lock to the failure that ends the job.
                            return Err(ops.fail(e));
                        }
                    }
                    self.held.push(Held { target: t, kind, how });
                    if let Reach::Some(m) = &mut ops.reach {
                        m.insert(t);
                    }
                }
                return Ok(());
            }
            How::Queue => {
                let flags = if excl { wire::EXCLUSIVE } else { wire::SHARED };
                let mut reqs = Vec::with_capacity(targets.len());
                for &t in targets {
                    let w = win.peers[t as usize].world;
                    let req = ops.request(w, Want::Grant)?;
                    ops.send(w, wire::LOCK, flags, req, &[])?;
                    reqs.push(req);
                }
                ops.wait_reqs(&reqs)?;
            }
        }
        for &t in targets {
            self.held.push(Held { target: t, kind, how });
            if let Reach::Some(m) = &mut ops.reach {
                m.insert(t);
            }
        }
        // What the previous holder wrote happens before what we read.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Completes every operation to `target` at the origin and at the target, keeping
    /// the lock.
    ///
    /// # Errors
    /// A refusal, a failure, the channel's.
    pub fn flush(&mut self, target: u32) -> Result<(), RmaError> {
        self.check_held(target)?;
        self.complete_remote(Some(target))
    }

    /// Completes every operation of the epoch at its origin and its target.
    ///
    /// # Errors
    /// As for [`LockEpoch::flush`].
    pub fn flush_all(&mut self) -> Result<(), RmaError> {
        self.complete_remote(None)
    }

    /// Completes every operation to `target` at the origin: get buffers hold their
    /// data; puts' and accumulates' buffers were free already.
    ///
    /// # Errors
    /// As for [`LockEpoch::flush`].
    pub fn flush_local(&mut self, target: u32) -> Result<(), RmaError> {
        self.check_held(target)?;
        self.complete_local(Some(target))
    }

    /// As [`LockEpoch::flush_local`], for every target.
    ///
    /// # Errors
    /// As for [`LockEpoch::flush`].
    pub fn flush_local_all(&mut self) -> Result<(), RmaError> {
        self.complete_local(None)
    }

    /// A full memory fence between this process's loads and stores of its own window
    /// and the other members' operations (MPI's `Win_sync`).
    pub fn sync(&mut self) {
        fence(Ordering::SeqCst);
    }

    /// Runs `f` on this member's own memory, which the epoch must hold exclusively:
    /// nobody else reaches it meanwhile.
    ///
    /// # Errors
    /// [`RmaError::NotInEpoch`] without an exclusive lock on this member;
    /// [`RmaError::Wrong`] for a dynamic window.
    pub fn with_local<R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R, RmaError> {
        let win = self.ops.as_ref().expect("open").win;
        let me = win.me;
        if !self
            .held
            .iter()
            .any(|h| h.target == me && h.kind == LockKind::Exclusive && h.how != How::NoCheck)
        {
            return Err(RmaError::NotInEpoch {
                target: me,
                why: "local access needs an exclusive lock on this member",
            });
        }
        if win.flavor() == Flavor::Dynamic {
            return Err(RmaError::Wrong("a dynamic window has no memory of its own"));
        }
        fence(Ordering::SeqCst);
        let p = win.local_ptr();
        let len = win.len();
        let s: &mut [T] = if len == 0 {
            &mut []
        } else {
            // SAFETY: this member's memory, aligned for `T` and alive with the window;
            // the exclusive lock keeps every other member out, and requests by messages
            // are applied only by this process's progress, which cannot run during `f`
            // (the epoch holds the world).
            unsafe { std::slice::from_raw_parts_mut(p, len) }
        };
        let r = f(s);
        fence(Ordering::SeqCst);
        Ok(r)
    }

    fn check_held(&self, target: u32) -> Result<(), RmaError> {
        if self.held.iter().any(|h| h.target == target) {
            Ok(())
        } else {
            Err(RmaError::NotInEpoch {
                target,
                why: "this epoch holds no lock on it",
            })
        }
    }

    /// Completes every operation and gives every lock back.
    ///
    /// # Errors
    /// The first refusal or failure; every lock is given back even then.
    pub fn unlock(mut self) -> Result<(), RmaError> {
        let ops = self.ops.take().expect("open");
        release(ops, std::mem::take(&mut self.held), false)
    }

    /// Alias of [`LockEpoch::unlock`], for epochs opened by [`Window::lock_all`].
    ///
    /// # Errors
    /// As for [`LockEpoch::unlock`].
    pub fn unlock_all(self) -> Result<(), RmaError> {
        self.unlock()
    }
}

/// Gives the locks in `held` back, after completing what the epoch did; `hurry` (while
/// unwinding) waits for nothing.
fn release<T: Pod, C: Channel>(mut ops: Ops<'_, '_, T, C>, held: Holds, hurry: bool) -> Result<(), RmaError> {
    let mut first = None;
    if !hurry {
        // A counter word has no queue whose grant orders what came before: what went by
        // messages is completed at the target before the word is given back.
        let done = if held.iter().any(|h| h.how == How::Nic) {
            ops.complete_remote(None)
        } else {
            ops.complete_local(None).and(ops.complete_rdma(None))
        };
        first = done.err();
    }
    fence(Ordering::SeqCst);
    let win = ops.win;
    let mut reqs = Vec::new();
    for h in held.iter() {
        let excl = h.kind == LockKind::Exclusive;
        match h.how {
            How::Ticket => {
                let f = win.file.as_ref().expect("file");
                let lock = f.lock(win.peers[h.target as usize].member.expect("member"));
                if excl {
                    lock.release_exclusive::<Sound>();
                } else {
                    lock.release_shared::<Sound>();
                }
            }
            How::Queue => {
                let w = win.peers[h.target as usize].world;
                let flags = if excl { wire::EXCLUSIVE } else { wire::SHARED };
                let req = match ops.request(w, Want::Ack) {
                    Ok(r) => r,
                    Err(e) => {
                        first.get_or_insert(e);
                        continue;
                    }
                };
                // Everything sent to the target before this is applied before its ack.
                if let Err(e) = ops.send(w, wire::UNLOCK, flags, req, &[]) {
                    first.get_or_insert(e);
                    continue;
                }
                if let Some(s) = rma(ops.world).slot_mut(win.id) {
                    s.origin.unflushed[h.target as usize] = false;
                }
                reqs.push(req);
            }
            How::Nic => {
                if let Err(e) = ops.nic_unlock(h.target, excl) {
                    first.get_or_insert(e);
                }
            }
            How::NoCheck => {}
        }
    }
    if hurry {
        return Ok(());
    }
    if held.iter().any(|h| h.how == How::Ticket) {
        let one = if held.len() == 1 {
            held.first.map(|h| h.target)
        } else {
            None
        };
        if let Err(e) = ops.check_alive(one) {
            first.get_or_insert(e);
        }
    }
    if let Err(e) = ops.wait_reqs(&reqs) {
        first.get_or_insert(e);
    }
    // Targets without a queue (no check) still owe their puts' completion.
    if held.iter().any(|h| h.how == How::NoCheck)
        && let Err(e) = ops.complete_remote(None)
    {
        first.get_or_insert(e);
    }
    if let Err(e) = ops.take_refusals(None) {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

impl<T: Pod, C: Channel> Drop for LockEpoch<'_, '_, T, C> {
    fn drop(&mut self) {
        let Some(ops) = self.ops.take() else { return };
        let held = std::mem::take(&mut self.held);
        if let Err(e) = release(ops, held, std::thread::panicking()) {
            eprintln!("nemesis: a lock epoch dropped unclosed: {e}");
        }
    }
}
