//! Requests: what the engine knows of each unfinished send and receive, the buffers lent
//! to it, and the table that holds them.

use super::comm::ReqComm;
use super::{P2pError, Status};
use nemesis_lmt::{Seg, Strategies, Strategy, Xfer};
use std::sync::Arc;

/// A buffer a request lent to the engine: one piece, or a list of them (an iovec).
///
/// The engine dereferences it only while the buffer is lent: during a blocking call that
/// borrows it, within the scope of the scoped request that borrows it (which clears it,
/// by cancelling, copying or waiting for the peer, before the borrow can end; see
/// `scope.rs`), or for as long as an owned request's slot holds the buffer (see
/// `owned.rs`).
#[derive(Debug, Clone)]
pub(crate) enum Bufs {
    One(Seg),
    Many(Box<[Seg]>),
}

impl Bufs {
    /// No buffer: what a released request keeps.
    pub(crate) const NONE: Bufs = Bufs::One(Seg {
        ptr: std::ptr::null_mut(),
        len: 0,
    });

    pub(crate) fn segs(&self) -> &[Seg] {
        match self {
            Bufs::One(s) if s.ptr.is_null() => &[],
            Bufs::One(s) => std::slice::from_ref(s),
            Bufs::Many(v) => v,
        }
    }

    /// Writes `data` at byte `off`, dropping what falls past the end. Inline for one
    /// piece, the usual case (an eager receive's copy); a list goes out of line.
    ///
    /// # Safety
    /// The buffer must be lent (see the type) and not otherwise in use.
    #[inline(always)]
    pub(crate) unsafe fn write_at(&self, off: usize, data: &[u8]) {
        if let Bufs::One(s) = self {
            if off < s.len && !s.ptr.is_null() {
                // SAFETY: `off < len`: the rest of the lent piece, which nothing else uses.
                let dst = unsafe { std::slice::from_raw_parts_mut(s.ptr.add(off), s.len - off) };
                nemesis_shm::region::copy_into(dst, data);
            }
            return;
        }
        // SAFETY: as for this function.
        unsafe { self.write_at_many(off, data) }
    }

    /// [`Bufs::write_at`] for a list of pieces.
    ///
    /// # Safety
    /// As for [`Bufs::write_at`].
    #[inline(never)]
    unsafe fn write_at_many(&self, off: usize, data: &[u8]) {
        let mut at = nemesis_shm::ring::SegCursor::default();
        at.walk(self.segs(), off, |_, _| {});
        let mut put = 0;
        at.walk(self.segs(), data.len(), |p, len| {
            // SAFETY: `p` is inside a lent piece for `len` bytes, and `put + len` is
            // within `data`.
            unsafe { nemesis_shm::copy::copy_large(data.as_ptr().add(put), p, len) };
            put += len;
        });
    }

    /// The pieces of bytes `off..off + n`.
    pub(crate) fn slices(&self, off: usize, n: usize) -> Vec<&[u8]> {
        let mut at = nemesis_shm::ring::SegCursor::default();
        at.walk(self.segs(), off, |_, _| {});
        let mut out = Vec::new();
        at.walk(self.segs(), n, |p, len| {
            // SAFETY: `p` is inside a lent piece, readable for `len` bytes while the
            // buffer is lent, which outlasts the returned borrow of `self`.
            out.push(unsafe { std::slice::from_raw_parts(p.cast_const(), len) });
        });
        out
    }
}

/// Where a matched large receive is.
#[derive(Debug)]
pub(crate) enum Stage {
    /// Matched; the next chores choose a strategy (which needs the channel).
    Choose { offered: Strategies, cookie: Vec<u8> },
    /// Chunks are arriving in DATA packets; `got` bytes so far.
    Chunks { got: usize },
    /// A strategy of the LMT is moving the data.
    Lmt(Box<Xfer>),
}

#[derive(Debug)]
pub(crate) enum RState {
    /// In the posted queue.
    Posted,
    /// Matched to a medium message from `peer` whose packets are arriving.
    Arriving { peer: u32 },
    /// Matched to a large message that is on its way.
    Rndv {
        peer: u32,
        send_id: u32,
        total: usize,
        stage: Stage,
    },
    /// Complete; the result is in `result`.
    Done,
}

#[derive(Debug)]
pub(crate) enum SState {
    /// RTS sent; waiting for the receiver to match it (and, for a get, for DONE).
    WaitCts,
    /// The CTS named a strategy of the LMT, to start at the next chores.
    Cts {
        recv_id: u32,
        strategy: Strategy,
        cookie: Vec<u8>,
    },
    /// Pushing chunks from `off`.
    Push { recv_id: u32, off: usize },
    /// Moving the data with a strategy of the LMT.
    Lmt { recv_id: u32, x: Box<Xfer> },
    /// Everything sent; waiting for DONE.
    WaitDone,
    /// Complete.
    Done,
}

/// A request's result once it has one; the error is boxed, as it is rare and large, so
/// that requests stay small to move.
pub(crate) type Outcome = Option<Result<Status, Box<P2pError>>>;

/// Who holds a request, and so who will ask for its result.
#[derive(Debug)]
pub(crate) enum Holder {
    /// The blocking call that made it, which waits for it before it returns.
    Call,
    /// The [`crate::p2p::Scope`] with this number, which releases the request at its end
    /// if nobody finished it, found by its number instead of a list of its own.
    Scope(u64),
    /// An owned request's handle, through the slot it shares with the engine, which is
    /// told of the end instead of asking.
    Owned(Arc<dyn Completion>),
}

impl Holder {
    #[inline(always)]
    pub(crate) fn is_owned(&self) -> bool {
        matches!(self, Holder::Owned(_))
    }
}

/// Who hears of an owned request's end: the slot its handle shares with the engine.
pub(crate) trait Completion: Send + Sync + std::fmt::Debug {
    /// The request finished with `result`; the engine has let go of the buffer.
    fn complete(&self, result: Result<Status, P2pError>);
}

/// A field added here that owns memory must be named in `owns_something`, or
/// [`Requests::take_result`] leaks it.
#[derive(Debug)]
pub(crate) struct RecvReq {
    pub bufs: Bufs,
    pub cap: usize,
    pub comm: ReqComm,
    /// The source selected, as a world rank.
    pub src: Option<u32>,
    pub state: RState,
    pub result: Outcome,
    /// The request was let go: drain into nothing, and forget it when done.
    pub detached: bool,
    pub holder: Holder,
}

impl RecvReq {
    /// Whether nobody will take the result (see [`Requests::settle`]).
    #[inline(always)]
    pub(crate) fn forgotten(&self) -> bool {
        self.detached || self.holder.is_owned()
    }

    /// Whether dropping it would free anything (its result taken).
    #[inline(always)]
    fn owns_something(&self) -> bool {
        !matches!(self.bufs, Bufs::One(_))
            || !matches!(self.comm, ReqComm::Identity)
            || !matches!(self.state, RState::Done)
            || self.holder.is_owned()
    }

    #[inline(always)]
    pub(crate) fn new(bufs: Bufs, cap: usize, comm: ReqComm, src: Option<u32>) -> Self {
        Self {
            bufs,
            cap,
            comm,
            src,
            state: RState::Posted,
            result: None,
            detached: false,
            holder: Holder::Call,
        }
    }
}

/// As for [`RecvReq`], a field that owns memory must be named in `owns_something`.
#[derive(Debug)]
pub(crate) struct SendReq {
    pub bufs: Bufs,
    pub len: usize,
    pub dest: u32,
    pub comm: ReqComm,
    pub state: SState,
    /// What the RTS offered; a revoked offer loses the strategies that read in place.
    pub offered: Strategies,
    /// The strategy the CTS chose, once it came.
    pub used: Option<Strategy>,
    /// What the offer holds until the receiver is done (the registration of the
    /// buffer for RDMA), handed back to the LMT when the offer is over.
    pub held: Option<Box<Xfer>>,
    /// The remaining data, copied when the request was let go.
    pub owned: Option<Vec<u8>>,
    pub result: Outcome,
    pub detached: bool,
    pub holder: Holder,
}

impl SendReq {
    /// As [`RecvReq::forgotten`].
    #[inline(always)]
    pub(crate) fn forgotten(&self) -> bool {
        self.detached || self.holder.is_owned()
    }

    /// As [`RecvReq::owns_something`].
    #[inline(always)]
    fn owns_something(&self) -> bool {
        !matches!(self.bufs, Bufs::One(_))
            || !matches!(self.comm, ReqComm::Identity)
            || !matches!(self.state, SState::Done)
            || self.holder.is_owned()
            || self.held.is_some()
            || self.owned.is_some()
    }
}

#[derive(Debug)]
pub(crate) enum Req {
    Recv(RecvReq),
    Send(SendReq),
}

impl Req {
    pub(crate) fn is_done(&self) -> bool {
        match self {
            Req::Recv(r) => matches!(r.state, RState::Done),
            Req::Send(s) => matches!(s.state, SState::Done),
        }
    }

    /// Whether nobody will take the result: a released request, or an owned one whose
    /// slot is told instead.
    fn forgotten(&self) -> bool {
        match self {
            Req::Recv(r) => r.forgotten(),
            Req::Send(s) => s.forgotten(),
        }
    }

    /// Who holds it.
    pub(crate) fn holder(&self) -> &Holder {
        match self {
            Req::Recv(r) => &r.holder,
            Req::Send(s) => &s.holder,
        }
    }

    /// Whether it was let go (see [`crate::p2p::engine::Engine::release`]).
    pub(crate) fn detached(&self) -> bool {
        match self {
            Req::Recv(r) => r.detached,
            Req::Send(s) => s.detached,
        }
    }
}

/// Bits of a request id that index the table; the rest count the slot's reuses, so an
/// id from the wire that names a finished request is not taken for a newer one. The top
/// bit is never set: it marks the ids of quick receives (`quick.rs`).
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u32 = u32::MAX >> (INDEX_BITS + 1);
/// Most requests alive at once.
pub(crate) const MAX_REQUESTS: usize = INDEX_MASK as usize - 1;

#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    req: Option<Req>,
}

/// The requests the engine knows, by id: a table whose freed slots are reused, so
/// lookups are an index, not a hash.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Requests {
    /// Adds `req`; its id is never 0.
    #[inline(always)]
    pub(crate) fn insert(&mut self, req: Req) -> Result<u32, P2pError> {
        self.insert_with(|| req)
    }

    /// Adds the request `make` builds once its slot is chosen, so that it is built in
    /// place instead of being moved there (a request is about 150 bytes).
    #[inline(always)]
    pub(crate) fn insert_with(&mut self, make: impl FnOnce() -> Req) -> Result<u32, P2pError> {
        let index = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < MAX_REQUESTS => {
                self.slots.push(Slot::default());
                self.slots.len() as u32 - 1
            }
            None => {
                return Err(P2pError::InvalidArgument(format!(
                    "more than {MAX_REQUESTS} requests are unfinished at once"
                )));
            }
        };
        let slot = &mut self.slots[index as usize];
        // The slot is free, so there is nothing to drop: forgetting the `None` saves
        // the drop glue's look at it.
        let was = slot.req.replace(make());
        debug_assert!(was.is_none(), "a free slot held a request");
        std::mem::forget(was);
        Ok(slot.generation << INDEX_BITS | (index + 1))
    }

    fn index(&self, id: u32) -> Option<usize> {
        let i = (id & INDEX_MASK).checked_sub(1)? as usize;
        let slot = self.slots.get(i)?;
        (slot.generation == id >> INDEX_BITS && slot.req.is_some()).then_some(i)
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&Req> {
        self.slots[self.index(id)?].req.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut Req> {
        let i = self.index(id)?;
        self.slots[i].req.as_mut()
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<Req> {
        let i = self.index(id)?;
        let slot = &mut self.slots[i];
        slot.generation = (slot.generation + 1) & GENERATION_MASK;
        self.free.push(i as u32);
        slot.req.take()
    }

    /// Takes the result of request `id` and forgets the request, dropping it in place
    /// rather than moving it out.
    #[inline(always)]
    pub(crate) fn take_result(&mut self, id: u32) -> Option<Outcome> {
        let i = self.index(id)?;
        Some(self.take_at(i))
    }

    /// The result of request `id` as [`Requests::take_result`] takes it, if the request
    /// is complete or unknown (forgotten: no result); `None` while it is unfinished. One
    /// lookup where asking [`Requests::finished`] and then taking the result would make
    /// two.
    #[inline(always)]
    pub(crate) fn take_if_finished(&mut self, id: u32) -> Option<Outcome> {
        let Some(i) = self.index(id) else {
            return Some(None);
        };
        if !self.slots[i].req.as_ref().is_some_and(Req::is_done) {
            return None;
        }
        Some(self.take_at(i))
    }

    /// Takes the result of the request in slot `i` and frees the slot; an empty slot
    /// (which `index` never names) is left alone.
    #[inline(always)]
    fn take_at(&mut self, i: usize) -> Outcome {
        let slot = &mut self.slots[i];
        let (result, owns) = match slot.req.as_mut() {
            Some(Req::Recv(r)) => (r.result.take(), r.owns_something()),
            Some(Req::Send(s)) => (s.result.take(), s.owns_something()),
            None => return None,
        };
        if owns {
            slot.req = None;
        } else {
            // Nothing to free: the four tests above are cheaper than the drop glue's.
            std::mem::forget(slot.req.take());
        }
        slot.generation = (slot.generation + 1) & GENERATION_MASK;
        self.free.push(i as u32);
        result
    }

    /// Whether request `id` is unknown (forgotten) or complete.
    #[inline]
    pub(crate) fn finished(&self, id: u32) -> bool {
        self.get(id).is_none_or(Req::is_done)
    }

    /// Requests alive, counted: only tests ask.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.req.is_some()).count()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Req)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.req
                .as_ref()
                .map(|r| (s.generation << INDEX_BITS | (i as u32 + 1), r))
        })
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Req> {
        self.slots.iter_mut().filter_map(|s| s.req.as_mut())
    }

    /// After request `id` may have finished: a finished request that nobody will ask
    /// about is forgotten, and an owned one's slot is told.
    pub(crate) fn settle(&mut self, id: u32) {
        if !self.get(id).is_some_and(|r| r.is_done() && r.forgotten()) {
            return;
        }
        match self.remove(id) {
            Some(Req::Recv(RecvReq {
                holder: Holder::Owned(o),
                result,
                ..
            }))
            | Some(Req::Send(SendReq {
                holder: Holder::Owned(o),
                result,
                ..
            })) => o.complete(match result {
                Some(r) => r.map_err(|e| *e),
                None => Err(P2pError::InvalidArgument(
                    "the request ended without a result".into(),
                )),
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm() -> ReqComm {
        ReqComm::of(&super::super::comm::Comm::new(1, 0, vec![0], 0, 1, true, None).inner)
    }

    #[test]
    fn ids_of_reused_slots_do_not_name_the_old_request() {
        let mut t = Requests::default();
        let a = t
            .insert(Req::Recv(RecvReq::new(Bufs::NONE, 0, comm(), None)))
            .unwrap();
        assert_ne!(a, 0);
        assert!(t.get(a).is_some());
        t.remove(a).unwrap();
        let b = t
            .insert(Req::Recv(RecvReq::new(Bufs::NONE, 0, comm(), None)))
            .unwrap();
        assert_ne!(a, b, "a reused slot gets a new id");
        assert!(t.get(a).is_none(), "the old id names nothing");
        assert!(t.get(b).is_some());
        assert!(t.get(0).is_none() && t.get(u32::MAX).is_none() && t.get(b + 1).is_none());
        assert_eq!(t.len(), 1);
        assert_eq!(t.iter().map(|(id, _)| id).collect::<Vec<_>>(), vec![b]);
    }
}
