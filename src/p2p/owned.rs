//! Owned non-blocking requests: a send or receive that owns its buffer, so it lives
//! outside any scope, is `Send`, and can be kept in a runtime's own structures.
//!
//! The buffer moves into a slot that the request's handle shares with the engine. The
//! engine reads or writes the bytes in place for as long as it needs them and holds the
//! slot until then, so dropping a handle early, or forgetting it, never frees memory the
//! engine or a peer still uses: a receive that nothing has matched is cancelled, and
//! anything else finishes on its own. When the request ends the engine writes the result
//! into the slot, wakes a task waiting on it (the `async` feature), and tells the
//! [`RequestSet`] the request belongs to, so that [`World::test_some`] costs time in
//! what completed, not in what is outstanding.

use super::comm::Comm;
use super::requests::{Bufs, Completion, Holder};
use super::{P2pError, Status, World};
use crate::channel::Channel;
use crate::progress::Idle;
use nemesis_lmt::{Lmt, Seg};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A buffer an owned request can take: its bytes are read (send) or written (receive) in
/// place, and it comes back when the request ends.
///
/// Implemented for `Vec<T>` and `Box<[T]>` of any plain type (`bytemuck::Pod`), whose
/// bytes travel as they are in memory.
pub trait OwnedBuf: Send + 'static {
    /// The bytes to send.
    fn bytes(&self) -> &[u8];
    /// The bytes to receive into.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl<T: bytemuck::Pod + Send> OwnedBuf for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
}

impl<T: bytemuck::Pod + Send> OwnedBuf for Box<[T]> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
}

/// A buffer whose RDMA registrations are kept: large messages to other nodes sent from
/// it, or received into it, again and again are registered once.
impl OwnedBuf for nemesis_net::pinned::Pinned {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// The slot is being used by the engine.
const ACTIVE: u8 = 0;
/// The result is in the slot.
const DONE: u8 = 1;
/// The result and the buffer have been taken.
const TAKEN: u8 = 2;

/// What a waiter registered to hear of the end.
#[derive(Debug, Default)]
struct Listeners {
    /// The set the request belongs to, and its index there.
    set: Option<(Arc<Ready>, usize)>,
    #[cfg(feature = "async")]
    waker: Option<std::task::Waker>,
}

/// What a request's handle shares with the engine.
struct Slot<B> {
    state: AtomicU8,
    /// Written through a pointer taken once while `ACTIVE`; taken by the handle's owner
    /// once `DONE`.
    buf: UnsafeCell<Option<B>>,
    /// Written by the engine before `DONE`, read by the handle's owner after.
    result: UnsafeCell<Option<Result<Status, P2pError>>>,
    listeners: Mutex<Listeners>,
}

// SAFETY: `buf` and `result` are handed from one thread to another through `state`: the
// engine writes them (and the bytes of `buf`) only while the slot is `ACTIVE` and
// publishes them with a Release store of `DONE`; the handle's owner touches them only
// after an Acquire load of `DONE`, and only through `&mut` or by value of the handle, of
// which there is one. `B` itself is `Send`.
unsafe impl<B: Send> Sync for Slot<B> {}

impl<B> std::fmt::Debug for Slot<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<B> Slot<B> {
    fn lock(&self) -> MutexGuard<'_, Listeners> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: OwnedBuf> Completion for Slot<B> {
    fn complete(&self, result: Result<Status, P2pError>) {
        if self.state.load(Ordering::Relaxed) != ACTIVE {
            return;
        }
        // SAFETY: the slot is ACTIVE, so only the engine (us) touches `result`.
        unsafe { *self.result.get() = Some(result) };
        self.state.store(DONE, Ordering::Release);
        let mut l = self.lock();
        if let Some((ready, index)) = l.set.take() {
            ready.push(index);
        }
        #[cfg(feature = "async")]
        if let Some(w) = l.waker.take() {
            drop(l);
            w.wake();
        }
    }
}

/// Owned requests whose handles were dropped unfinished, for the world to let go at its
/// next call: a drop may happen on any thread, the world's calls on one.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    any: AtomicBool,
    ids: Mutex<Vec<u32>>,
}

impl Mailbox {
    fn post(&self, id: u32) {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).push(id);
        self.any.store(true, Ordering::Release);
    }

    fn take(&self) -> Vec<u32> {
        if !self.any.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A non-blocking send or receive that owns its buffer. Finish it with [`World::wait`],
/// [`World::test`] or a [`RequestSet`]; with the `async` feature it is also a future.
/// Dropping it unfinished lets it go: a receive that no message has matched is
/// cancelled (the message goes to the next receive that selects it), and anything else
/// finishes on its own, its buffer freed once the engine is done with it.
#[must_use = "an unfinished request is let go when dropped"]
pub struct OwnedRequest<B: OwnedBuf = Vec<u8>> {
    slot: Arc<Slot<B>>,
    /// The engine's id, or 0 when complete from the start.
    id: u32,
    world: u64,
    mailbox: Arc<Mailbox>,
}

impl<B: OwnedBuf> std::fmt::Debug for OwnedRequest<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRequest")
            .field("id", &self.id)
            .field("complete", &self.is_complete())
            .finish()
    }
}

/// A finished owned request: its status (or why it failed) and its buffer back.
#[derive(Debug)]
pub struct Completed<B> {
    /// Its index in the [`RequestSet`] it came from (0 otherwise).
    pub index: usize,
    /// For a receive, the sender, tag and length; for a send, the destination, tag and
    /// length; or why it failed.
    pub status: Result<Status, P2pError>,
    /// The buffer: for a receive, the message's bytes at its start.
    pub buf: B,
}

impl<B: OwnedBuf> OwnedRequest<B> {
    /// Whether the request has finished, without moving anything on: a cheap look that
    /// any thread may take.
    pub fn is_complete(&self) -> bool {
        self.slot.state.load(Ordering::Acquire) != ACTIVE
    }

    /// The result and the buffer of a finished request, without a world: what a request
    /// whose world is gone gives ([`P2pError::WorldGone`]). An unfinished request comes
    /// back unchanged.
    ///
    /// # Errors
    /// The request itself, when it has not finished.
    pub fn try_take(self) -> Result<Completed<B>, Self> {
        if !self.is_complete() {
            return Err(self);
        }
        Ok(self.take(0))
    }

    /// Takes the result and buffer of a finished request.
    fn take(self, index: usize) -> Completed<B> {
        debug_assert!(self.is_complete());
        self.slot.state.store(TAKEN, Ordering::Relaxed);
        // SAFETY: DONE was loaded with Acquire (`is_complete`), so the engine has
        // published both and will not touch them again; this handle is the only one.
        let (status, buf) = unsafe { ((*self.slot.result.get()).take(), (*self.slot.buf.get()).take()) };
        Completed {
            index,
            status: status.unwrap_or(Err(P2pError::WorldGone)),
            buf: buf.expect("a finished slot holds its buffer"),
        }
    }
}

impl<B: OwnedBuf> Drop for OwnedRequest<B> {
    fn drop(&mut self) {
        if self.id != 0 && self.slot.state.load(Ordering::Acquire) == ACTIVE {
            self.mailbox.post(self.id);
        }
    }
}

#[cfg(feature = "async")]
impl<B: OwnedBuf> std::future::Future for OwnedRequest<B> {
    type Output = Result<(Status, B), P2pError>;

    /// Ready once the request has finished; something else must move the world on
    /// meanwhile (a task or thread calling [`World::progress`], or
    /// [`crate::aio::AsyncWorld`]).
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let me = self.get_mut();
        match me.slot.state.load(Ordering::Acquire) {
            ACTIVE => {}
            TAKEN => {
                return Poll::Ready(Err(P2pError::InvalidArgument(
                    "the request was already awaited".into(),
                )));
            }
            _ => return Poll::Ready(me.take_in_place()),
        }
        me.slot.lock().waker = Some(cx.waker().clone());
        // It may have finished before the waker was in place.
        if me.slot.state.load(Ordering::Acquire) != ACTIVE {
            return Poll::Ready(me.take_in_place());
        }
        Poll::Pending
    }
}

#[cfg(feature = "async")]
impl<B: OwnedBuf> OwnedRequest<B> {
    fn take_in_place(&mut self) -> Result<(Status, B), P2pError> {
        self.slot.state.store(TAKEN, Ordering::Relaxed);
        // SAFETY: as in `take`: DONE was loaded with Acquire, and this is the only handle.
        let (status, buf) = unsafe { ((*self.slot.result.get()).take(), (*self.slot.buf.get()).take()) };
        let buf = buf.expect("a finished slot holds its buffer");
        status.unwrap_or(Err(P2pError::WorldGone)).map(|s| (s, buf))
    }
}

/// Indices of a set's requests that finished, pushed by the engine.
#[derive(Debug, Default)]
struct Ready(Mutex<Vec<usize>>);

impl Ready {
    fn push(&self, i: usize) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(i);
    }
    fn drain(&self) -> Vec<usize> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A collection of owned requests to test or wait on together ([`World::test_any`],
/// [`World::test_some`], [`World::wait_any`], [`World::wait_some`]). Requests finish
/// into the set as the engine completes them, so finding the finished ones costs time in
/// their number, not in the number outstanding.
#[derive(Debug)]
pub struct RequestSet<B: OwnedBuf = Vec<u8>> {
    reqs: Vec<Option<OwnedRequest<B>>>,
    ready: Arc<Ready>,
    /// Finished requests drained from `ready` but not yet handed out, in the order they
    /// finished.
    due: std::collections::VecDeque<usize>,
    active: usize,
}

impl<B: OwnedBuf> Default for RequestSet<B> {
    fn default() -> Self {
        Self {
            reqs: Vec::new(),
            ready: Arc::default(),
            due: std::collections::VecDeque::new(),
            active: 0,
        }
    }
}

impl<B: OwnedBuf> RequestSet<B> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `r`; returns its index, which [`Completed::index`] gives back.
    pub fn push(&mut self, r: OwnedRequest<B>) -> usize {
        let index = self.reqs.len();
        {
            let mut l = r.slot.lock();
            if r.slot.state.load(Ordering::Acquire) == ACTIVE {
                l.set = Some((self.ready.clone(), index));
            } else {
                self.due.push_back(index);
            }
        }
        self.reqs.push(Some(r));
        self.active += 1;
        index
    }

    /// Requests in the set that have not been handed out.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Whether every request has been handed out.
    pub fn is_empty(&self) -> bool {
        self.active == 0
    }

    /// Takes request `index` back out, finished or not.
    pub fn take(&mut self, index: usize) -> Option<OwnedRequest<B>> {
        let r = self.reqs.get_mut(index)?.take()?;
        r.slot.lock().set = None;
        self.active -= 1;
        Some(r)
    }

    /// Hands out what has finished, into `out`; returns how many.
    fn collect(&mut self, out: &mut Vec<Completed<B>>, most: usize) -> usize {
        if self.due.is_empty() {
            self.due.extend(self.ready.drain());
        }
        let mut n = 0;
        while n < most {
            let Some(i) = self.due.pop_front() else { break };
            if let Some(r) = self.reqs.get_mut(i).and_then(Option::take) {
                self.active -= 1;
                out.push(r.take(i));
                n += 1;
            }
        }
        n
    }

    /// Ids of the requests still out, to check their peers.
    fn ids(&self) -> Vec<u32> {
        self.reqs
            .iter()
            .flatten()
            .filter(|r| !r.is_complete())
            .map(|r| r.id)
            .collect()
    }
}

impl<C: Channel> World<C> {
    /// Starts sending `buf` to rank `dest` of `comm`; the request owns `buf` and gives it
    /// back when it finishes.
    ///
    /// ```
    /// let mut world = nemesis::init()?;
    /// let comm = world.comm();
    /// let peer = (world.rank() + 1) % world.size();
    /// let r = world.irecv(&comm, nemesis::ANY_SOURCE, 0, vec![0u8; 64])?;
    /// let s = world.isend(&comm, peer, 0, vec![7u8; 64])?;
    /// // Both are `Send`: they can be kept anywhere, or moved to another thread.
    /// let (_, sent) = world.wait(s)?;
    /// let (status, got) = world.wait(r)?;
    /// assert_eq!(got[..status.len], [7u8; 64][..]);
    /// # drop(sent);
    /// # Ok::<(), nemesis::P2pError>(())
    /// ```
    ///
    /// # Errors
    /// A bad rank or tag, a communicator of another world, or the channel's error; the
    /// buffer is dropped.
    pub fn isend<B: OwnedBuf>(
        &mut self,
        comm: &Comm,
        dest: u32,
        tag: i32,
        buf: B,
    ) -> Result<OwnedRequest<B>, P2pError> {
        let c = self.check_comm(comm)?.clone();
        Self::check_tag(tag)?;
        let slot = new_slot(buf);
        // SAFETY: the slot is new and ACTIVE, and only the engine will touch its buffer
        // until it is DONE; the bytes stay where they are, since the buffer does not move
        // inside the slot.
        let seg = unsafe { Seg::of((*slot.buf.get()).as_ref().expect("just put").bytes()) };
        let len = seg.len;
        let owner: Arc<dyn Completion> = slot.clone();
        match self.start_send_bufs(&c, dest, tag, c.ctx, Bufs::One(seg), len, Holder::Owned(owner))? {
            Some(id) => Ok(self.handle(slot, id)),
            None => {
                slot.complete(Ok(Status {
                    source: dest,
                    tag,
                    len,
                }));
                Ok(self.handle(slot, 0))
            }
        }
    }

    /// Starts receiving a message from `src` with `tag` into `buf`, which the request
    /// owns and gives back when it finishes.
    ///
    /// # Errors
    /// A bad rank or tag, a communicator of another world; the buffer is dropped.
    pub fn irecv<B: OwnedBuf>(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: B,
    ) -> Result<OwnedRequest<B>, P2pError> {
        let c = self.check_comm(comm)?.clone();
        let tag = tag.into();
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        let slot = new_slot(buf);
        // SAFETY: as in `isend`; the engine is the only writer until DONE.
        let seg = unsafe { Seg::of_mut((*slot.buf.get()).as_mut().expect("just put").bytes_mut()) };
        let owner: Arc<dyn Completion> = slot.clone();
        let id = self.start_recv(
            &c,
            src.into(),
            tag,
            c.ctx,
            || Bufs::One(seg),
            seg.len,
            move || Holder::Owned(owner),
        )?;
        Ok(self.handle(slot, id))
    }

    fn handle<B: OwnedBuf>(&self, slot: Arc<Slot<B>>, id: u32) -> OwnedRequest<B> {
        // A request complete from the start (or already finished and forgotten by the
        // engine) needs no letting go.
        let id = if slot.state.load(Ordering::Acquire) == ACTIVE {
            id
        } else {
            0
        };
        OwnedRequest {
            slot,
            id,
            world: self.id,
            mailbox: self.mailbox.clone(),
        }
    }

    fn check_request<B: OwnedBuf>(&self, r: &OwnedRequest<B>) -> Result<(), P2pError> {
        if r.world != self.id {
            return Err(P2pError::WrongWorld("request"));
        }
        Ok(())
    }

    /// Moves every protocol on once, unless `r` has finished; says whether it has.
    ///
    /// # Errors
    /// A request of another world, or the progress error.
    pub fn test<B: OwnedBuf>(&mut self, r: &OwnedRequest<B>) -> Result<bool, P2pError> {
        self.check_request(r)?;
        if !r.is_complete() {
            self.progress()?;
        }
        Ok(r.is_complete())
    }

    /// Waits until `r` finishes; returns its status and its buffer.
    ///
    /// # Errors
    /// Why the request failed (its buffer is dropped), a request of another world, or
    /// the progress error (the request is let go).
    pub fn wait<B: OwnedBuf>(&mut self, r: OwnedRequest<B>) -> Result<(Status, B), P2pError> {
        self.check_request(&r)?;
        let mut idle = self.core.idle();
        let ids = [r.id];
        while !r.is_complete() {
            self.progress()?;
            if r.is_complete() {
                break;
            }
            self.idle_ids(&mut idle, 1, &|| ids.to_vec())?;
        }
        let done = r.take(0);
        done.status.map(|s| (s, done.buf))
    }

    /// Moves every protocol on once; hands out one finished request of `set`, if any.
    ///
    /// # Errors
    /// The progress error.
    pub fn test_any<B: OwnedBuf>(
        &mut self,
        set: &mut RequestSet<B>,
    ) -> Result<Option<Completed<B>>, P2pError> {
        let mut out = Vec::with_capacity(1);
        if set.collect(&mut out, 1) == 0 {
            self.progress()?;
            set.collect(&mut out, 1);
        }
        Ok(out.pop())
    }

    /// Moves every protocol on once; hands out every finished request of `set`, in the
    /// order they finished.
    ///
    /// # Errors
    /// The progress error.
    pub fn test_some<B: OwnedBuf>(&mut self, set: &mut RequestSet<B>) -> Result<Vec<Completed<B>>, P2pError> {
        let mut out = Vec::new();
        self.progress()?;
        set.collect(&mut out, usize::MAX);
        Ok(out)
    }

    /// Waits until a request of `set` finishes and hands it out.
    ///
    /// # Errors
    /// [`P2pError::NoActiveRequest`] for an empty set, or the progress error.
    pub fn wait_any<B: OwnedBuf>(&mut self, set: &mut RequestSet<B>) -> Result<Completed<B>, P2pError> {
        let mut out = self.wait_for_set(set, 1)?;
        Ok(out.pop().expect("one came"))
    }

    /// Waits until at least one request of `set` finishes; hands out every finished one.
    ///
    /// # Errors
    /// [`P2pError::NoActiveRequest`] for an empty set, or the progress error.
    pub fn wait_some<B: OwnedBuf>(&mut self, set: &mut RequestSet<B>) -> Result<Vec<Completed<B>>, P2pError> {
        self.wait_for_set(set, usize::MAX)
    }

    fn wait_for_set<B: OwnedBuf>(
        &mut self,
        set: &mut RequestSet<B>,
        most: usize,
    ) -> Result<Vec<Completed<B>>, P2pError> {
        if set.is_empty() {
            return Err(P2pError::NoActiveRequest);
        }
        let mut out = Vec::new();
        let mut idle = self.core.idle();
        loop {
            if set.collect(&mut out, most) > 0 {
                return Ok(out);
            }
            self.progress()?;
            if set.collect(&mut out, most) > 0 {
                return Ok(out);
            }
            self.idle_ids(&mut idle, set.active(), &|| set.ids())?;
        }
    }

    /// One idle round of a call waiting on `n` requests, whose ids `ids` gives when
    /// their peers are due a check.
    pub(crate) fn idle_ids(
        &mut self,
        idle: &mut Idle,
        n: usize,
        ids: &dyn Fn() -> Vec<u32>,
    ) -> Result<(), P2pError> {
        if idle.tight() {
            return Ok(());
        }
        let busy = self.eng.busy();
        let what = move || format!("a wait for {n} request(s)");
        if self.core.idle_wait(idle, busy, None, &what)? == crate::progress::Tick::CheckPeers {
            for id in ids() {
                self.check_failed(id);
            }
        }
        Ok(())
    }

    /// Fails every owned request still out whose peer is known to be gone: what a
    /// progress thread does now and then, since nobody blocks on those requests.
    pub fn check_owned_peers(&mut self) {
        for id in self.owned_ids() {
            self.check_failed(id);
        }
    }

    /// The ids of the owned requests the engine holds.
    fn owned_ids(&self) -> Vec<u32> {
        self.eng
            .reqs
            .iter()
            .filter(|(_, r)| r.holder().is_owned())
            .map(|(id, _)| id)
            .collect()
    }

    /// Lets go of the owned requests whose handles were dropped unfinished.
    #[inline]
    pub(crate) fn release_dropped(&mut self) {
        if self.mailbox.any.load(Ordering::Relaxed) {
            for id in self.mailbox.take() {
                self.eng.release_owned(id);
            }
        }
    }

    /// As the world goes: every owned request still out ends with
    /// [`P2pError::WorldGone`], once no peer reads or writes its buffer in place.
    pub(crate) fn orphan_owned(&mut self) {
        self.release_dropped();
        for id in self.owned_ids() {
            if self.eng.holds_in_place(id) {
                // The peer may still write or read these pages: wait as a release does.
                let mut idle = self.core.idle();
                while self.eng.holds_in_place(id) {
                    if self.progress().is_err() {
                        break;
                    }
                    let _ = self.idle_ids(&mut idle, 1, &|| vec![id]);
                }
            }
            let mut lmt = self.core.ch.lmt();
            for x in self.eng.fail(id, P2pError::WorldGone) {
                lmt.end(&x);
            }
        }
    }
}

fn new_slot<B: OwnedBuf>(buf: B) -> Arc<Slot<B>> {
    Arc::new(Slot {
        state: AtomicU8::new(ACTIVE),
        buf: UnsafeCell::new(Some(buf)),
        result: UnsafeCell::new(None),
        listeners: Mutex::new(Listeners::default()),
    })
}

#[cfg(test)]
#[path = "owned_tests.rs"]
mod tests;
