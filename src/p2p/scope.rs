//! Non-blocking operations: the scope that lends buffers to the engine, and requests.
//!
//! The engine may read a send buffer or write a receive buffer during any progress,
//! not only while its own request is tested: that is what keeps `isend; recv; wait` from
//! deadlocking when both sides do it. It therefore holds buffer addresses, and they must
//! never outlive the buffers. A [`Scope`] guarantees that: its buffers outlive it, and
//! when it ends, every request it made that is still unfinished is released, that is
//! cancelled, drained into nothing, or (for a send) given a copy of what it still
//! needs. A request dropped earlier is released at the next call on its scope.
//! Requests are neither `Send` nor `Sync`, so a drop can never race the engine.

use super::comm::Comm;
use super::requests::{Bufs, Holder};
use super::{P2pError, Status, World};
use crate::channel::Channel;
use nemesis_lmt::Seg;
use std::cell::{Cell, RefCell, RefMut};
use std::marker::PhantomData;

/// A region of code in which non-blocking operations may borrow buffers. Made by
/// [`World::scope`].
pub struct Scope<'scope, 'env: 'scope, C: Channel> {
    world: RefCell<&'env mut World<C>>,
    state: ScopeState,
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl<C: Channel> std::fmt::Debug for Scope<'_, '_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("unfinished", &self.state.unfinished.get())
            .finish_non_exhaustive()
    }
}

/// What requests tell their scope.
#[derive(Debug)]
pub(crate) struct ScopeState {
    /// The scope's number: the engine's requests made in it carry it
    /// ([`Holder::Scope`]), so that its end can find the unfinished ones without a list
    /// kept request by request.
    number: u64,
    /// Requests dropped unfinished, to release at the next call.
    dropped: RefCell<Vec<u32>>,
    /// Whether `dropped` holds any: one load on every call instead of a borrow.
    any_dropped: Cell<bool>,
    /// Requests of this scope that the engine still knows and nobody has finished or
    /// dropped: when none, the scope's end has nothing to look for.
    unfinished: Cell<usize>,
    /// The id of the scope's world, which its requests name through this state rather
    /// than each keeping a copy: a smaller request to move.
    world: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Recv,
}

/// A non-blocking send or receive. Finish it with [`Scope::wait`] (or `waitall`,
/// `waitany`); dropping it unfinished releases it (see the module documentation).
#[must_use = "an unfinished request is released when dropped"]
pub struct Request<'scope> {
    /// The engine's id, or 0 when complete from the start.
    id: u32,
    /// For a send complete from the start, the destination and tag of its status (its
    /// length is `len`): kept apart rather than as a `Status`, so that the request is
    /// small to move.
    peer: u32,
    tag: i32,
    kind: Kind,
    /// Still to be released if dropped; a cell, so that a list of requests can be
    /// finished through shared references while their ids are read for the wait.
    live: Cell<bool>,
    ptr: *mut u8,
    len: usize,
    state: &'scope ScopeState,
    _buf: PhantomData<&'scope mut [u8]>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for Request<'_> {
    // Inline, so that the drop of a finished request, known not to be live, is nothing.
    #[inline]
    fn drop(&mut self) {
        if self.live.get() && self.id != 0 {
            self.let_go();
        }
    }
}

impl Request<'_> {
    /// Dropped while live: the scope lets the engine's request go at its end.
    #[cold]
    #[inline(never)]
    fn let_go(&mut self) {
        self.state.unfinished.set(self.state.unfinished.get() - 1);
        self.state.dropped.borrow_mut().push(self.id);
        self.state.any_dropped.set(true);
    }
}

/// A finished request: its status, and its buffer back.
#[derive(Debug)]
pub struct Done<'scope> {
    status: Status,
    lent: Lent<'scope>,
}

/// The buffer a finished request lends back: one of the two, so that a [`Done`] is as
/// large as a [`Request`] and a list of one becomes a list of the other in place.
#[derive(Debug)]
enum Lent<'scope> {
    Recv(&'scope mut [u8]),
    Send(&'scope [u8]),
    /// A list of slices (`isend_iov`, `irecv_iov`): the caller keeps them.
    None,
}

// A list of requests finished as they started becomes its list of results in place
// (`waitall`), which takes the two to be of one size and alignment.
const _: () = assert!(
    std::mem::size_of::<Done<'static>>() == std::mem::size_of::<Request<'static>>()
        && std::mem::align_of::<Done<'static>>() == std::mem::align_of::<Request<'static>>()
);

impl<'scope> Done<'scope> {
    /// For a receive, the sender, tag and length; for a send, the destination, tag and
    /// length.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The received bytes (the buffer's start, as long as the message), or the sent ones.
    pub fn data(&self) -> &[u8] {
        match &self.lent {
            Lent::Recv(r) => &r[..self.status.len.min(r.len())],
            Lent::Send(s) => s,
            Lent::None => &[],
        }
    }

    /// The receive buffer, lent back for the rest of the scope.
    pub fn into_buffer(self) -> Option<&'scope mut [u8]> {
        match self.lent {
            Lent::Recv(r) => Some(r),
            _ => None,
        }
    }
}

/// A list of requests that `waitall` turns into their results in place: the first
/// `done` slots hold results, the rest requests. Dropped before [`InPlace::finish`] (a
/// failed wait, a panic), it drops the requests left, which releases the live ones,
/// and frees the list.
struct InPlace<'scope> {
    ptr: *mut Request<'scope>,
    len: usize,
    cap: usize,
    done: usize,
}

impl<'scope> InPlace<'scope> {
    fn new(rs: Vec<Request<'scope>>) -> Self {
        let mut rs = std::mem::ManuallyDrop::new(rs);
        Self {
            ptr: rs.as_mut_ptr(),
            len: rs.len(),
            cap: rs.capacity(),
            done: 0,
        }
    }

    /// The list of results, once every slot holds one.
    fn finish(self) -> Vec<Done<'scope>> {
        assert_eq!(self.done, self.len, "every request of the list finished");
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the allocation is the request list's, a `Done` has a request's size
        // and alignment (asserted where `Done` is declared), and all `len` slots hold
        // results.
        unsafe { Vec::from_raw_parts(this.ptr.cast::<Done<'scope>>(), this.len, this.cap) }
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        // SAFETY: slots from `done` to `len` still hold requests, dropped once here; the
        // results before them own nothing. The allocation is then freed as the request
        // list it was, with no elements left to drop.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.add(self.done),
                self.len - self.done,
            ));
            drop(Vec::from_raw_parts(self.ptr, 0, self.cap));
        }
    }
}

impl<C: Channel> World<C> {
    /// Runs `f` with a [`Scope`] for non-blocking operations; when `f` returns (or
    /// unwinds), every request it left unfinished is released.
    pub fn scope<'env, F, T>(&'env mut self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env, C>) -> T,
    {
        self.scopes += 1;
        let scope = Scope {
            state: ScopeState {
                number: self.scopes,
                dropped: RefCell::default(),
                any_dropped: Cell::new(false),
                unfinished: Cell::new(0),
                world: self.id,
            },
            world: RefCell::new(self),
            _scope: PhantomData,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&scope)));
        scope.end();
        match r {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl<'scope, 'env, C: Channel> Scope<'scope, 'env, C> {
    /// The world, for blocking operations and collectives inside the scope.
    #[inline(always)]
    pub fn world(&self) -> RefMut<'_, &'env mut World<C>> {
        let mut w = self.world.borrow_mut();
        self.release_dropped(&mut w);
        w
    }

    #[inline(always)]
    fn release_dropped(&self, w: &mut World<C>) {
        if self.state.any_dropped.get() {
            self.release_dropped_now(w);
        }
    }

    #[cold]
    #[inline(never)]
    fn release_dropped_now(&self, w: &mut World<C>) {
        self.state.any_dropped.set(false);
        let dropped = std::mem::take(&mut *self.state.dropped.borrow_mut());
        for id in dropped {
            w.release(id);
        }
    }

    fn end(&self) {
        let mut w = self.world.borrow_mut();
        self.release_dropped(&mut w);
        if self.state.unfinished.get() == 0 {
            return;
        }
        let number = self.state.number;
        // Quick receives first: those a request of the table carries on are found
        // below, as the scope's.
        w.eng.quick.end_scope(number);
        let left: Vec<u32> = w
            .eng
            .reqs
            .iter()
            .filter(|(_, r)| matches!(r.holder(), Holder::Scope(n) if *n == number) && !r.detached())
            .map(|(id, _)| id)
            .collect();
        for id in left {
            w.release(id);
        }
        self.state.unfinished.set(0);
    }

    /// The holder of this scope's requests.
    #[inline]
    fn holder(&self) -> Holder {
        Holder::Scope(self.state.number)
    }

    /// A request for engine request `id` (0: complete from the start, with the status
    /// of `peer`, `tag` and `len`).
    #[inline]
    fn request(
        &'scope self,
        id: u32,
        kind: Kind,
        (peer, tag): (u32, i32),
        ptr: *mut u8,
        len: usize,
    ) -> Request<'scope> {
        if id != 0 {
            self.state.unfinished.set(self.state.unfinished.get() + 1);
        }
        Request {
            id,
            peer,
            tag,
            kind,
            ptr,
            len,
            state: &self.state,
            live: Cell::new(id != 0),
            _buf: PhantomData,
        }
    }

    /// Starts sending `buf` to rank `dest` of `comm`. `buf` stays borrowed until the
    /// request is finished.
    #[inline]
    pub fn isend(
        &'scope self,
        comm: &Comm,
        dest: u32,
        tag: i32,
        buf: &'scope [u8],
    ) -> Result<Request<'scope>, P2pError> {
        let mut w = self.world();
        let c = w.check_comm(comm)?;
        World::<C>::check_tag(tag)?;
        // Each way answers on its own, so that the eager one's (a stream's every send)
        // does not go through the other's result in memory.
        let id = match w.eager_dest(c, dest, buf.len()) {
            Some(d) => {
                w.send_eager(d, c.ctx, tag, &Bufs::One(Seg::of(buf)), buf.len())?;
                0
            }
            None => {
                let seg = Bufs::One(Seg::of(buf));
                w.start_send_bufs(c, dest, tag, c.ctx, seg, buf.len(), self.holder())?
                    .unwrap_or(0)
            }
        };
        Ok(self.request(id, Kind::Send, (dest, tag), buf.as_ptr().cast_mut(), buf.len()))
    }

    /// Starts receiving a message from `src` with `tag` into `buf`.
    #[inline]
    pub fn irecv(
        &'scope self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: &'scope mut [u8],
    ) -> Result<Request<'scope>, P2pError> {
        let seg = Seg::of_mut(buf);
        self.post_recv(comm, src.into(), tag.into(), Bufs::One(seg), seg.len, seg.ptr)
    }

    /// Posts a receive of up to `len` bytes into `bufs`: what `irecv` and its kin share.
    /// Into one buffer, it is a quick receive where it can be one (`quick.rs`). `ptr` is
    /// the one buffer the [`Done`] lends back, or null for none.
    #[inline(always)]
    fn post_recv(
        &'scope self,
        comm: &Comm,
        src: Option<u32>,
        tag: Option<i32>,
        bufs: Bufs,
        len: usize,
        ptr: *mut u8,
    ) -> Result<Request<'scope>, P2pError> {
        let mut w = self.world();
        let c = w.check_comm(comm)?;
        if let Some(t) = tag {
            World::<C>::check_tag(t)?;
        }
        let quick = match bufs {
            Bufs::One(seg) => w.start_recv_quick(c, src, tag, seg, self.state.number)?,
            Bufs::Many(_) => None,
        };
        let id = match quick {
            Some(id) => id,
            None => w.start_recv(c, src, tag, c.ctx, || bufs, len, || self.holder())?,
        };
        Ok(self.request(id, Kind::Recv, (0, 0), ptr, len))
    }

    /// Starts receiving a message from `src` with `tag` into the `len` bytes at `buf`,
    /// which other pending receives may name too, as MPI lets several receives share one
    /// buffer (osu_bw's receiver posts its whole window into one): for a binding or a
    /// benchmark that needs that shape. Its [`Done`] carries no data.
    ///
    /// # Errors
    /// As [`Scope::irecv`], and [`P2pError::InvalidArgument`] for a null `buf` with a
    /// length.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes until the request finishes or the
    /// scope ends, and nothing but receives may read or write those bytes meanwhile.
    /// Where receives share them, which message's bytes they hold at the end is
    /// unspecified.
    pub unsafe fn irecv_raw(
        &'scope self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: *mut u8,
        len: usize,
    ) -> Result<Request<'scope>, P2pError> {
        if buf.is_null() && len > 0 {
            return Err(P2pError::InvalidArgument(format!(
                "a null receive buffer of {len} bytes"
            )));
        }
        let seg = Seg { ptr: buf, len };
        self.post_recv(
            comm,
            src.into(),
            tag.into(),
            Bufs::One(seg),
            len,
            std::ptr::null_mut(),
        )
    }

    /// Starts sending the concatenation of `bufs` to rank `dest` of `comm`, without
    /// packing it first where the transfer allows. The slices stay borrowed until the
    /// request is finished.
    pub fn isend_iov(
        &'scope self,
        comm: &Comm,
        dest: u32,
        tag: i32,
        bufs: &[&'scope [u8]],
    ) -> Result<Request<'scope>, P2pError> {
        let mut w = self.world();
        let c = w.check_comm(comm)?;
        World::<C>::check_tag(tag)?;
        let segs: Box<[Seg]> = bufs.iter().map(|b| Seg::of(b)).collect();
        let len = segs.iter().map(|s| s.len).sum();
        let id = w.start_send_bufs(c, dest, tag, c.ctx, Bufs::Many(segs), len, self.holder())?;
        Ok(self.request(
            id.unwrap_or(0),
            Kind::Send,
            (dest, tag),
            std::ptr::null_mut(),
            len,
        ))
    }

    /// Starts receiving a message into the slices of `bufs` in turn, without an
    /// intermediate buffer where the transfer allows.
    pub fn irecv_iov(
        &'scope self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        bufs: impl IntoIterator<Item = &'scope mut [u8]>,
    ) -> Result<Request<'scope>, P2pError> {
        let segs: Box<[Seg]> = bufs.into_iter().map(Seg::of_mut).collect();
        let len = segs.iter().map(|s| s.len).sum();
        self.post_recv(
            comm,
            src.into(),
            tag.into(),
            Bufs::Many(segs),
            len,
            std::ptr::null_mut(),
        )
    }

    fn check_world(w: &World<C>, r: &Request<'_>) -> Result<(), P2pError> {
        if r.state.world != w.id {
            Err(P2pError::WrongWorld("request"))
        } else {
            Ok(())
        }
    }

    fn is_complete(w: &World<C>, r: &Request<'_>) -> bool {
        r.id == 0 || w.eng.finished(r.id)
    }

    /// Makes progress; returns whether the request has finished (then [`Scope::wait`]
    /// returns at once).
    pub fn test(&self, r: &mut Request<'scope>) -> Result<bool, P2pError> {
        let mut w = self.world();
        Self::check_world(&w, r)?;
        if !Self::is_complete(&w, r) {
            w.progress()?;
        }
        Ok(Self::is_complete(&w, r))
    }

    /// What [`Scope::wait`] says if its wait ended without the result, which it does
    /// not; the request stays live, so that its drop lets the engine's go.
    #[cold]
    fn unfinished(r: &Request<'scope>) -> P2pError {
        P2pError::InvalidArgument(format!("request {} is unfinished", r.id))
    }

    /// The result of `r` if it is finished, taken from the engine (which forgets the
    /// request); `None` while it is not.
    #[inline(always)]
    fn result_if_done(&self, w: &mut World<C>, r: &Request<'scope>) -> Option<Result<Status, Box<P2pError>>> {
        if r.id == 0 {
            return Some(Ok(Status {
                source: r.peer,
                tag: r.tag,
                len: r.len,
            }));
        }
        let result = w.eng.finish_if_done(r.id)?;
        // The request's own scope's count: an outer scope's request may be finished
        // in an inner scope of the same world.
        r.state.unfinished.set(r.state.unfinished.get() - 1);
        Some(result)
    }

    /// The [`Done`] of `r` from its result, leaving the request where it is, spent (it
    /// is not live, so its drop does nothing): a list of requests is finished without
    /// moving each out.
    #[inline]
    fn done_of(
        r: &Request<'scope>,
        result: Result<Status, Box<P2pError>>,
    ) -> Result<Done<'scope>, Box<P2pError>> {
        debug_assert!(r.live.get() || r.id == 0, "a request finished twice");
        r.live.set(false);
        Ok(Self::done_with(r, result?))
    }

    /// The [`Done`] of a request that finished as it started (id 0): nothing to take
    /// from the engine, nothing to release.
    #[inline(always)]
    fn done_at_once(r: &Request<'scope>) -> Done<'scope> {
        debug_assert_eq!(r.id, 0);
        let status = Status {
            source: r.peer,
            tag: r.tag,
            len: r.len,
        };
        Self::done_with(r, status)
    }

    /// The [`Done`] of finished request `r` with `status`: its buffer lent back.
    #[inline(always)]
    fn done_with(r: &Request<'scope>, status: Status) -> Done<'scope> {
        let lent = match r.kind {
            _ if r.ptr.is_null() => Lent::None,
            // SAFETY: the engine is done with the buffer (the request is finished, and
            // forgotten if it ever had an id), and the slice rebuilds the `&'scope mut`
            // borrow that `irecv` took, from the same pointer.
            Kind::Recv => Lent::Recv(unsafe { std::slice::from_raw_parts_mut(r.ptr, r.len) }),
            // SAFETY: as above, for the shared borrow `isend` took.
            Kind::Send => Lent::Send(unsafe { std::slice::from_raw_parts(r.ptr.cast_const(), r.len) }),
        };
        Done { status, lent }
    }

    /// Waits until the request finishes; returns its status and buffer.
    pub fn wait(&self, r: Request<'scope>) -> Result<Done<'scope>, P2pError> {
        let mut w = self.world();
        Self::check_world(&w, &r)?;
        let mut result = None;
        w.wait_each(
            1,
            |w, _| {
                result = self.result_if_done(w, &r);
                result.is_some()
            },
            |_| r.id,
        )?;
        match result {
            Some(result) => Self::done_of(&r, result).map_err(|e| *e),
            None => Err(Self::unfinished(&r)),
        }
    }

    /// Waits until every request finishes. Fails with the first failure, after
    /// finishing (or releasing) all of them.
    pub fn waitall(&self, rs: Vec<Request<'scope>>) -> Result<Vec<Done<'scope>>, P2pError> {
        let mut w = self.world();
        let mut at_once = true;
        for r in &rs {
            Self::check_world(&w, r)?;
            at_once &= r.id == 0;
        }
        if at_once {
            // Every one finished as it started (a stream's eager sends): each result is
            // the request's own fields, and there is nothing to poll for. Each is
            // forgotten, not dropped (none is live), and the list becomes the list of
            // results in its own allocation.
            return Ok(rs
                .into_iter()
                .map(|r| {
                    let d = Self::done_at_once(&r);
                    std::mem::forget(r);
                    d
                })
                .collect());
        }
        let n = rs.len();
        let mut list = InPlace::new(rs);
        let base = list.ptr;
        let mut first_err = None;
        // Each request's result is taken as soon as it is seen finished: one look at the
        // engine's table per request, and the result written over the request.
        w.wait_each(
            n,
            |w, i| {
                debug_assert_eq!(i, list.done, "wait_each asks in order");
                // SAFETY: `i` is below `n` and not below `list.done` (wait_each asks
                // each index in order until it answers yes), so slot `i` still holds
                // its request.
                let r = unsafe { &*base.add(i) };
                let Some(result) = self.result_if_done(w, r) else {
                    return false;
                };
                let d = Self::done_of(r, result).unwrap_or_else(|e| {
                    first_err.get_or_insert(e);
                    // A stand-in, never seen: the list is dropped for the error.
                    Done {
                        status: Status {
                            source: 0,
                            tag: 0,
                            len: 0,
                        },
                        lent: Lent::None,
                    }
                });
                // SAFETY: the request is spent (`done_of` made it not live, so its drop
                // would do nothing) and not read again; its result, of the same size and
                // alignment, takes its place.
                unsafe { base.add(i).cast::<Done<'scope>>().write(d) };
                list.done = i + 1;
                true
            },
            // SAFETY: wait_each names only indices not yet finished, below `n`: requests.
            |i| unsafe { (*base.add(i)).id },
        )?;
        let done = list.finish();
        first_err.map_or(Ok(done), |e| Err(*e))
    }

    /// Waits until one of the requests finishes, takes it out of `rs`, and returns its
    /// index (in `rs` as it was) and result.
    pub fn waitany(&self, rs: &mut Vec<Request<'scope>>) -> Result<(usize, Done<'scope>), P2pError> {
        if rs.is_empty() {
            return Err(P2pError::NoActiveRequest);
        }
        let mut w = self.world();
        for r in rs.iter() {
            Self::check_world(&w, r)?;
        }
        let mut idle = w.core.idle();
        loop {
            // The first finished request's result, taken as it is found.
            let found = rs
                .iter()
                .enumerate()
                .find_map(|(i, r)| self.result_if_done(&mut w, r).map(|res| (i, res)));
            if let Some((i, result)) = found {
                let r = rs.remove(i);
                return Self::done_of(&r, result).map(|d| (i, d)).map_err(|e| *e);
            }
            w.progress()?;
            if rs.iter().any(|r| Self::is_complete(&w, r)) {
                continue;
            }
            let n = rs.len();
            w.idle_ids(&mut idle, n, &|| rs.iter().map(|r| r.id).collect())?;
        }
    }
}
