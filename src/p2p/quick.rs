//! Quick receives: a scope's posted receives of one buffer on a world-ranked
//! communicator, kept in a ring in the order they were posted, and completed there by an
//! eager message without a request in the table.
//!
//! A stream's receiver spends most of its time on bookkeeping: the table's slot, the
//! posted queue's entry, the lookups between them. Here one entry is all three. Anything
//! but an eager match (a medium message, a rendezvous) promotes the entry to a request
//! of the table, which goes on as any other, and the entry only points at it.
//!
//! Matching order holds because an entry is posted only while the table's posted queue
//! is empty: every posted quick receive is older than every posted receive of the
//! table, so the ring is searched first.

use super::requests::{Bufs, Holder, RecvReq, Req, Requests};
use super::{P2pError, Status};
use nemesis_lmt::Seg;

/// The ring's entries: enough for a few windows of osu_bw's 64. A receive posted while
/// it is full goes to the table.
pub(crate) const QUICK_SLOTS: usize = 256;
const MASK: u32 = QUICK_SLOTS as u32 - 1;
/// Quick ids have this bit; the table's never do (see `requests.rs`).
pub(crate) const QUICK_BIT: u32 = 1 << 31;

/// Whether `id` names a quick receive rather than a request of the table.
#[inline(always)]
pub(crate) fn is_quick(id: u32) -> bool {
    id & QUICK_BIT != 0
}

/// The error of a look at a quick receive that has no result: one already taken.
#[cold]
fn no_result(id: u32) -> P2pError {
    P2pError::InvalidArgument(format!("request {id} has no result"))
}

#[derive(Debug)]
enum State {
    /// Taken, cancelled, or never used.
    Free,
    /// Waiting for its message.
    Posted,
    /// Matched by an eager message of `len` bytes from world rank `from` with `tag`,
    /// copied (as much as fits).
    Done {
        from: u32,
        tag: i32,
        len: usize,
    },
    Failed(Box<P2pError>),
    /// Matched by something longer: request `id` of the table carries it on.
    Promoted(u32),
}

#[derive(Debug)]
struct Entry {
    id: u32,
    state: State,
    ctx: u32,
    /// The source selected, as a world rank, and the tag; `None` for any.
    src: Option<u32>,
    tag: Option<i32>,
    buf: Seg,
    scope: u64,
}

impl Entry {
    const FREE: Entry = Entry {
        id: 0,
        state: State::Free,
        ctx: 0,
        src: None,
        tag: None,
        buf: Seg {
            ptr: std::ptr::null_mut(),
            len: 0,
        },
        scope: 0,
    };
}

/// What a look at a quick receive found.
#[derive(Debug)]
pub(crate) enum Look {
    /// Not finished yet.
    Pending,
    /// Finished; the entry is freed. The error is boxed, as in the table, so that the
    /// answer stays small.
    Finished(Result<Status, Box<P2pError>>),
    /// Carried on by request `id` of the table, which says when it is finished.
    Table(u32),
}

#[cfg(test)]
impl Look {
    /// Whether it named nothing (a stale or unknown id).
    fn is_stale(&self) -> bool {
        matches!(self, Look::Finished(Err(e)) if matches!(**e, P2pError::InvalidArgument(_)))
    }
}

/// The ring. Positions count up and wrap; an entry's id is its position with
/// [`QUICK_BIT`], so a stale id names nothing once its entry is reused.
#[derive(Debug)]
pub(crate) struct QuickRecvs {
    /// Indexed by position modulo the length, which the type fixes: no bounds checks.
    entries: Box<[Entry; QUICK_SLOTS]>,
    /// No entry before this one is alive; those after it may have been freed since it
    /// last moved (see [`QuickRecvs::reclaim`]).
    head: u32,
    /// No entry before this one is posted.
    next: u32,
    /// Where the next entry goes.
    tail: u32,
    /// Entries posted: when none, a message looks no further than this count.
    posted: u32,
}

impl Default for QuickRecvs {
    fn default() -> Self {
        Self {
            entries: Box::new([Entry::FREE; QUICK_SLOTS]),
            head: 0,
            next: 0,
            tail: 0,
            posted: 0,
        }
    }
}

impl QuickRecvs {
    /// Whether no quick receive waits for a message.
    #[inline(always)]
    pub(crate) fn none_posted(&self) -> bool {
        self.posted == 0
    }

    /// Entries posted, for a test of several counts at once.
    #[inline(always)]
    pub(crate) fn posted_count(&self) -> u32 {
        self.posted
    }

    /// Posts a receive into `buf` of (`ctx`, `src`, `tag`) for scope `scope`; `None`
    /// when the ring is full.
    #[inline(always)]
    pub(crate) fn post(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: Seg,
        scope: u64,
    ) -> Option<u32> {
        let pos = self.tail;
        if pos.wrapping_sub(self.head) >= QUICK_SLOTS as u32 && !self.reclaim() {
            return None;
        }
        let id = QUICK_BIT | pos;
        let e = Entry {
            id,
            state: State::Posted,
            ctx,
            src,
            tag,
            buf,
            scope,
        };
        let slot = &mut self.entries[(pos & MASK) as usize];
        // A free entry owns nothing: it is overwritten, not dropped.
        debug_assert!(matches!(slot.state, State::Free));
        std::mem::forget(std::mem::replace(slot, e));
        self.tail = pos.wrapping_add(1);
        self.posted += 1;
        Some(id)
    }

    /// The slot of quick receive `id` if it is alive.
    #[inline(always)]
    fn slot(&self, id: u32) -> Option<usize> {
        let i = (id & MASK) as usize;
        let e = &self.entries[i];
        (e.id == id && !matches!(e.state, State::Free)).then_some(i)
    }

    /// The earliest posted entry that selects a message of (`ctx`, `src`, `tag`), taken
    /// off the posted ones; its slot.
    #[inline(always)]
    fn take(&mut self, ctx: u32, src: u32, tag: i32) -> Option<usize> {
        if self.posted == 0 {
            return None;
        }
        // Entries before the first posted one are finished or free: skip them for good.
        let mut pos = self.next;
        while !matches!(self.entries[(pos & MASK) as usize].state, State::Posted) {
            pos = pos.wrapping_add(1);
        }
        let i = (pos & MASK) as usize;
        if !self.selects(i, ctx, src, tag) {
            self.next = pos;
            return self.take_later(pos, ctx, src, tag);
        }
        // The front is taken: the next look starts past it.
        self.next = pos.wrapping_add(1);
        self.posted -= 1;
        Some(i)
    }

    /// [`QuickRecvs::take`] past a first posted entry that does not select the message.
    #[inline(never)]
    fn take_later(&mut self, first: u32, ctx: u32, src: u32, tag: i32) -> Option<usize> {
        let mut pos = first.wrapping_add(1);
        while pos != self.tail {
            let i = (pos & MASK) as usize;
            if matches!(self.entries[i].state, State::Posted) && self.selects(i, ctx, src, tag) {
                self.posted -= 1;
                return Some(i);
            }
            pos = pos.wrapping_add(1);
        }
        None
    }

    #[inline(always)]
    fn selects(&self, i: usize, ctx: u32, src: u32, tag: i32) -> bool {
        let e = &self.entries[i];
        super::matching::selected(e.ctx, e.src, e.tag, ctx, src, tag)
    }

    /// Completes the earliest posted entry that selects an eager message of
    /// (`ctx`, `src`, `tag`) with `data`; says whether there was one.
    #[inline(always)]
    pub(crate) fn deliver(&mut self, ctx: u32, src: u32, tag: i32, data: &[u8]) -> bool {
        let Some(i) = self.take(ctx, src, tag) else {
            return false;
        };
        let e = &mut self.entries[i];
        // SAFETY: a posted entry's buffer is lent by its scope until the entry is freed,
        // and nothing else writes it meanwhile (see `Bufs`).
        unsafe { Bufs::One(e.buf).write_at(0, data) };
        // Posted owns nothing: replaced, not dropped.
        std::mem::forget(std::mem::replace(
            &mut e.state,
            State::Done {
                from: src,
                tag,
                len: data.len(),
            },
        ));
        true
    }

    /// Takes the earliest posted entry that selects a message of (`ctx`, `src`, `tag`)
    /// that needs a request of the table (a medium message, a rendezvous): the request
    /// is made in `reqs`, the entry points at it, and its id is returned. If the table
    /// is full, the entry fails with that, and the next one is tried.
    pub(crate) fn promote(&mut self, reqs: &mut Requests, ctx: u32, src: u32, tag: i32) -> Option<u32> {
        loop {
            let i = self.take(ctx, src, tag)?;
            let e = &mut self.entries[i];
            let made = reqs.insert(Req::Recv(RecvReq {
                holder: Holder::Scope(e.scope),
                ..RecvReq::new(Bufs::One(e.buf), e.buf.len, super::comm::ReqComm::Identity, e.src)
            }));
            match made {
                Ok(id) => {
                    e.state = State::Promoted(id);
                    return Some(id);
                }
                Err(err) => e.state = State::Failed(Box::new(err)),
            }
        }
    }

    /// Looks at quick receive `id`, taking its result if it is finished (an unknown id
    /// is finished without one).
    #[inline(always)]
    pub(crate) fn look(&mut self, id: u32) -> Look {
        let i = (id & MASK) as usize;
        let e = &mut self.entries[i];
        if e.id != id {
            return Look::Finished(Err(Box::new(no_result(id))));
        }
        // A stream's answer first, with one test rather than a jump through the states.
        if let State::Done { from, tag, len } = e.state
            && len <= e.buf.len
        {
            // Done owns nothing: replaced, not dropped.
            std::mem::forget(std::mem::replace(&mut e.state, State::Free));
            return Look::Finished(Ok(Status {
                source: from,
                tag,
                len,
            }));
        }
        match e.state {
            State::Posted => Look::Pending,
            State::Promoted(t) => Look::Table(t),
            // Truncated, failed, or free (taken already): the error says which.
            _ => Look::Finished(Err(Box::new(self.take_error(i)))),
        }
    }

    /// The error of a failed or truncated entry.
    #[cold]
    fn take_error(&mut self, i: usize) -> P2pError {
        let e = &mut self.entries[i];
        match std::mem::replace(&mut e.state, State::Free) {
            State::Done { len, .. } => P2pError::Truncated {
                message_len: len,
                buffer_len: e.buf.len,
            },
            State::Failed(err) => *err,
            _ => no_result(e.id),
        }
    }

    /// Whether quick receive `id` is finished or unknown, as far as the ring knows: one
    /// that a request of the table carries on ([`QuickRecvs::carrier`]) is that
    /// request's to say.
    #[inline]
    pub(crate) fn finished(&self, id: u32) -> bool {
        !matches!(
            self.slot(id).map(|i| &self.entries[i].state),
            Some(State::Posted | State::Promoted(_))
        )
    }

    /// Frees the entry in slot `i`, cancelling it if it is posted.
    fn free(&mut self, i: usize) {
        let e = &mut self.entries[i];
        if matches!(e.state, State::Posted) {
            self.posted -= 1;
        }
        e.state = State::Free;
    }

    /// Moves the ring's head past the entries freed since it last moved; says whether
    /// that made room. Only a post that finds the ring full asks, so a freed entry costs
    /// nothing when it is freed, and each is passed over once.
    #[inline(never)]
    fn reclaim(&mut self) -> bool {
        let old = self.head;
        let mut head = old;
        while head != self.tail && matches!(self.entries[(head & MASK) as usize].state, State::Free) {
            head = head.wrapping_add(1);
        }
        // Nothing before the head is posted: `next` never lags behind it.
        if self.next.wrapping_sub(old) < head.wrapping_sub(old) {
            self.next = head;
        }
        self.head = head;
        self.tail.wrapping_sub(head) < QUICK_SLOTS as u32
    }

    /// Lets quick receive `id` go: cancelled if posted, forgotten if finished. Returns
    /// the table's request that carries it on, for the caller to let go.
    pub(crate) fn release(&mut self, id: u32) -> Option<u32> {
        let i = self.slot(id)?;
        let carried = match self.entries[i].state {
            State::Promoted(t) => Some(t),
            _ => None,
        };
        self.free(i);
        carried
    }

    /// Lets every quick receive of scope `scope` go (see [`QuickRecvs::release`]); the
    /// table's requests that carry some on are the scope's, which the caller lets go.
    pub(crate) fn end_scope(&mut self, scope: u64) {
        let mut pos = self.head;
        while pos != self.tail {
            let i = (pos & MASK) as usize;
            if self.entries[i].scope == scope && !matches!(self.entries[i].state, State::Free) {
                self.free(i);
            }
            pos = pos.wrapping_add(1);
        }
    }

    /// The source quick receive `id` waits on while posted (`Some(None)`: any).
    pub(crate) fn waits_on(&self, id: u32) -> Option<Option<u32>> {
        let i = self.slot(id)?;
        let e = &self.entries[i];
        matches!(e.state, State::Posted).then_some(e.src)
    }

    /// Fails posted quick receive `id` with `err`.
    pub(crate) fn fail(&mut self, id: u32, err: P2pError) {
        if let Some(i) = self.slot(id)
            && matches!(self.entries[i].state, State::Posted)
        {
            self.posted -= 1;
            self.entries[i].state = State::Failed(Box::new(err));
        }
    }

    /// The table's request that carries quick receive `id` on, if one does.
    pub(crate) fn carrier(&self, id: u32) -> Option<u32> {
        match self.entries[self.slot(id)?].state {
            State::Promoted(t) => Some(t),
            _ => None,
        }
    }

    /// Entries alive: only tests ask.
    #[cfg(test)]
    pub(crate) fn alive(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| !matches!(e.state, State::Free))
            .count()
    }

    /// Entries posted: only tests ask.
    #[cfg(test)]
    pub(crate) fn posted(&self) -> u32 {
        self.posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(b: &mut [u8]) -> Seg {
        Seg::of_mut(b)
    }

    fn finished(q: &mut QuickRecvs, id: u32) -> Result<Status, P2pError> {
        match q.look(id) {
            Look::Finished(r) => r.map_err(|e| *e),
            other => panic!("request {id} is not finished: {other:?}"),
        }
    }

    #[test]
    fn receives_match_in_the_order_posted_and_a_later_one_can_match_first() {
        let mut q = QuickRecvs::default();
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let x = q.post(1, None, Some(5), seg(&mut a), 1).unwrap();
        let y = q.post(1, Some(2), None, seg(&mut b), 1).unwrap();
        assert!(!q.none_posted());
        // Tag 6 from rank 2: not the first receive's, so the second's.
        assert!(q.deliver(1, 2, 6, b"second"));
        assert!(matches!(q.look(x), Look::Pending));
        // Another context: nobody's.
        assert!(!q.deliver(2, 2, 5, b"nobody"));
        assert!(q.deliver(1, 3, 5, b"first"));
        assert!(q.none_posted());
        assert!(!q.deliver(1, 3, 5, b"more"), "no receive is left");
        assert_eq!(
            finished(&mut q, x).unwrap(),
            Status {
                source: 3,
                tag: 5,
                len: 5
            }
        );
        assert_eq!(
            finished(&mut q, y).unwrap(),
            Status {
                source: 2,
                tag: 6,
                len: 6
            }
        );
        assert_eq!(&a[..5], b"first");
        assert_eq!(&b[..6], b"second");
        assert_eq!(q.alive(), 0);
        assert!(
            matches!(q.look(x), Look::Finished(Err(_))),
            "a taken result is not taken twice"
        );
    }

    #[test]
    fn a_message_longer_than_the_buffer_is_cut_and_reported() {
        let mut q = QuickRecvs::default();
        let mut a = [0u8; 4];
        let x = q.post(0, None, None, seg(&mut a), 1).unwrap();
        assert!(q.deliver(0, 1, 0, b"abcdefgh"));
        assert_eq!(&a, b"abcd");
        assert!(matches!(
            finished(&mut q, x),
            Err(P2pError::Truncated {
                message_len: 8,
                buffer_len: 4
            })
        ));
    }

    #[test]
    fn a_full_ring_refuses_and_frees_out_of_order_before_it_takes_more() {
        let mut q = QuickRecvs::default();
        let mut bufs = vec![[0u8; 8]; QUICK_SLOTS];
        let ids: Vec<u32> = bufs
            .iter_mut()
            .map(|b| q.post(0, None, None, seg(b), 1).unwrap())
            .collect();
        let mut extra = [0u8; 8];
        assert!(
            q.post(0, None, None, seg(&mut extra), 1).is_none(),
            "the ring is full"
        );
        // Freeing one that is not the oldest makes no room: the head stays.
        assert_eq!(q.release(ids[1]), None);
        assert!(q.post(0, None, None, seg(&mut extra), 1).is_none());
        // Freeing the oldest moves the head past both.
        q.release(ids[0]);
        assert_eq!(q.posted(), QUICK_SLOTS as u32 - 2);
        let a = q.post(0, None, None, seg(&mut extra), 1).unwrap();
        let mut extra2 = [0u8; 8];
        let b = q.post(0, None, None, seg(&mut extra2), 1).unwrap();
        assert!(q.post(0, None, None, seg(&mut extra2), 1).is_none());
        assert!(q.look(ids[0]).is_stale() && q.look(ids[1]).is_stale());
        // Messages go to the oldest posted first, the new ones last.
        for n in 2..QUICK_SLOTS as u32 + 2 {
            assert!(q.deliver(0, 0, n as i32, &n.to_le_bytes()));
        }
        for (i, id) in ids[2..].iter().chain([&a, &b]).enumerate() {
            assert_eq!(finished(&mut q, *id).unwrap().tag, i as i32 + 2);
        }
        assert_eq!(q.alive(), 0);
    }

    #[test]
    fn a_longer_message_promotes_its_receive_to_the_table() {
        let mut q = QuickRecvs::default();
        let mut reqs = Requests::default();
        let mut a = [0u8; 64];
        let x = q.post(3, Some(1), None, seg(&mut a), 7).unwrap();
        assert_eq!(q.promote(&mut reqs, 3, 2, 0), None, "rank 2 is not selected");
        let t = q.promote(&mut reqs, 3, 1, 9).unwrap();
        assert!(!is_quick(t));
        assert_eq!(q.carrier(x), Some(t));
        assert!(matches!(q.look(x), Look::Table(id) if id == t));
        assert!(!q.finished(x), "a promoted receive is its carrier's to finish");
        match reqs.get(t) {
            Some(Req::Recv(rr)) => {
                assert!(matches!(rr.holder, Holder::Scope(7)));
                assert_eq!((rr.cap, rr.src), (64, Some(1)));
            }
            other => panic!("no receive in the table: {other:?}"),
        }
        assert!(q.none_posted());
        // Letting it go hands back the carrier, for the caller to let go.
        assert_eq!(q.release(x), Some(t));
        assert_eq!(q.alive(), 0);
    }

    #[test]
    fn cancelled_failed_and_scope_ended_receives_take_no_message() {
        let mut q = QuickRecvs::default();
        let mut bufs = [[0u8; 8]; 4];
        let [a, b, c, d] = &mut bufs;
        let x = q.post(0, None, None, seg(a), 1).unwrap();
        let y = q.post(0, Some(1), None, seg(b), 1).unwrap();
        let z = q.post(0, None, None, seg(c), 2).unwrap();
        let w = q.post(0, None, None, seg(d), 1).unwrap();
        q.release(x);
        assert_eq!(q.waits_on(y), Some(Some(1)));
        q.fail(
            y,
            P2pError::PeerFailed {
                rank: 1,
                reason: "gone".into(),
            },
        );
        assert_eq!(q.waits_on(y), None);
        q.end_scope(1);
        assert!(q.finished(w), "an ended scope's receive is gone");
        assert!(q.deliver(0, 1, 0, b"z"), "the other scope's receive takes it");
        assert!(q.none_posted());
        assert_eq!(finished(&mut q, z).unwrap().len, 1);
        assert_eq!(bufs, [[0; 8], [0; 8], *b"z\0\0\0\0\0\0\0", [0; 8]]);
        assert_eq!(q.alive(), 0);
    }
}
