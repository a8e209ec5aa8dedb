//! The two-sided engine: the matching queues, the requests and the rendezvous, and what
//! every arrived packet of the protocol does to them. It never touches the channel while
//! handling a packet: control packets go to its outbox, which the chores after each poll
//! send.

use super::comm::ReqComm;
use super::matching::{Body, Matching, Posted, Unexpected};
use super::medium::{self, Assembly, Medium, Step};
use super::quick::{self, Look, QuickRecvs};
use super::requests::{Bufs, Outcome, RState, RecvReq, Req, Requests, SState};
use super::rndv::{self, Rndv};
use super::wire::{self, CTS, DATA, DONE, EAGER, FIN, MDATA, MEDIUM, REVOKE, REVOKED, RTS, Rts, ctrl};
use super::{P2pError, Status};
use crate::channel::{Channel, Header};
use crate::progress::Outbox;
use nemesis_shm::pairbuf::PairBufs;

/// The engine's state apart from the channel, so both can be borrowed at once.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) matching: Matching,
    pub(crate) reqs: Requests,
    /// Posted receives of scopes that an eager message completes in place.
    pub(crate) quick: QuickRecvs,
    pub(crate) rndv: Rndv,
    pub(crate) medium: Medium,
    /// The buffers shared with each local peer, through which medium messages go when
    /// they are free.
    pub(crate) pairs: Option<PairBufs>,
    /// Control packets produced while handling, sent by the chores.
    out: Outbox,
    fault: Option<P2pError>,
    /// Whether the outbox, the transfer lists or the fault may hold something, or a
    /// packet went to another protocol whose outbox waits: one test after each poll
    /// instead of several.
    pub(crate) chores: bool,
}

impl Engine {
    pub(crate) fn new(size: u32) -> Self {
        Self {
            matching: Matching::default(),
            reqs: Requests::default(),
            quick: QuickRecvs::default(),
            rndv: Rndv::default(),
            medium: Medium::new(size),
            pairs: None,
            out: Outbox::new(size),
            fault: None,
            chores: false,
        }
    }

    /// Keeps a protocol violation by `rank` to be reported by the next call.
    #[cold]
    pub(crate) fn fault(&mut self, rank: u32, what: impl Into<String>) {
        self.defer(P2pError::Protocol {
            rank,
            what: what.into(),
        });
    }

    /// Keeps `e` to be reported by the next call.
    #[cold]
    pub(crate) fn defer(&mut self, e: P2pError) {
        if self.fault.is_none() {
            self.fault = Some(e);
        }
        self.chores = true;
    }

    /// Queues a control packet.
    pub(crate) fn ctrl(&mut self, dest: u32, kind: u16, aux: u32, payload: &[u8]) {
        self.out.push(dest, ctrl(kind, aux), payload);
        self.chores = true;
    }

    /// [`Engine::handle`], with an eager packet taken here unless a medium message from
    /// its source is under way: a stream's every packet, without a call.
    #[inline(always)]
    pub(crate) fn handle_inline(&mut self, src: u32, h: &Header, payload: &[u8]) {
        if h.kind == EAGER && !self.medium.interrupted_by(src) {
            self.on_eager(src, h.context, h.tag, payload);
        } else {
            // A copy made here, so that the caller's header is not lent to a call and
            // can stay in registers on the eager path.
            let h = *h;
            self.handle(src, &h, payload);
        }
    }

    /// Handles one arrived packet of the protocol. The header is borrowed where the poll
    /// left it: a copy by value is a 16-byte load of the poll's narrower stores, which
    /// the CPU cannot forward (a stall of about a dozen cycles a packet).
    #[inline(never)]
    pub(crate) fn handle(&mut self, src: u32, h: &Header, payload: &[u8]) {
        if self.medium.interrupted_by(src) && (h.kind != MDATA || self.medium.paired_from(src)) {
            self.interrupted(src);
        }
        let r = match h.kind {
            EAGER => {
                // Queues nothing, so the chores need no second look.
                self.on_eager(src, h.context, h.tag, payload);
                return;
            }
            RTS => {
                self.on_rts(src, *h, payload);
                Ok(())
            }
            MEDIUM => self.on_medium(src, *h, payload),
            MDATA => self.on_mdata(src, payload),
            CTS => self.rndv.on_cts(&mut self.reqs, src, h.aux, payload),
            DATA => self
                .rndv
                .on_data(&mut self.reqs, &mut self.out, src, h.aux, payload),
            DONE => self.rndv.on_done(&mut self.reqs, src, h.aux, payload),
            FIN => self.rndv.on_fin(&mut self.reqs, src, h.aux, payload),
            REVOKE => {
                self.on_revoke(src, h.aux);
                Ok(())
            }
            REVOKED => {
                self.rndv.on_revoked(&mut self.reqs, src, h.aux);
                Ok(())
            }
            k => Err(format!("unknown two-sided packet kind {k:#06x}")),
        };
        if let Err(what) = r {
            self.fault(src, what);
        }
        self.chores |= !self.out.is_empty() || self.rndv.has_chores();
    }

    #[inline(always)]
    fn on_eager(&mut self, src: u32, ctx: u32, tag: i32, data: &[u8]) {
        if self.quick.deliver(ctx, src, tag, data) {
            return;
        }
        if let Some(q) = self.matching.take_posted(ctx, src, tag) {
            if let Some(Req::Recv(rr)) = self.reqs.get_mut(q.id) {
                deliver_eager(rr, src, tag, data);
                // Only a request nobody will ask about needs settling; a lookup saved.
                if rr.forgotten() {
                    self.reqs.settle(q.id);
                }
            }
            return;
        }
        self.unexpected_eager(src, ctx, tag, data);
    }

    /// An eager packet that no posted receive wants, queued with a copy of its payload.
    #[inline(never)]
    fn unexpected_eager(&mut self, src: u32, ctx: u32, tag: i32, data: &[u8]) {
        self.matching.arrived(Unexpected {
            src,
            ctx,
            tag,
            body: Body::Eager(data.to_vec()),
        });
    }

    /// A packet came from `src` while its medium message is under way. One that came
    /// through the pair buffer was written whole before the packet was sent: it is
    /// taken now. Anything else breaks the message off.
    #[cold]
    #[inline(never)]
    fn interrupted(&mut self, src: u32) {
        if self.medium.paired_from(src) {
            self.pull_paired(src);
            if self.medium.paired_from(src) {
                self.break_medium(src, medium::PAIRED_BROKEN_OFF.into());
            }
        } else {
            self.break_medium(src, "a medium message broken off by another packet".into());
        }
    }

    /// Copies what the pair buffer holds of `src`'s message under way, and frees the
    /// buffer once the message is whole.
    fn pull_paired(&mut self, src: u32) {
        let Some((got, total)) = self.medium.progress_of(src) else {
            return;
        };
        let Some(pairs) = self.pairs.take() else {
            return;
        };
        if let Some(pb) = pairs.with(src) {
            // SAFETY: the peer held the buffer when it announced the message (checked
            // then) and keeps it until we free it; `got` is what the assembly counted.
            // The bytes cannot overrun the message: a drain stops at `total`.
            unsafe {
                pb.drain(got, total, |s| {
                    let _ = self.on_mdata(src, s);
                })
            };
        }
        self.pairs = Some(pairs);
    }

    /// Moves every medium message under way through a pair buffer on.
    #[inline(never)]
    fn pull_all_paired(&mut self) {
        let mut i = 0;
        while let Some(&src) = self.medium.paired().get(i) {
            self.pull_paired(src);
            // A whole message left the list; one still under way stays.
            if self.medium.paired_from(src) {
                i += 1;
            }
        }
    }

    /// `peer` failed: a message it was writing into the pair buffer will never be whole.
    /// The buffer stays held, so neither side uses it again.
    pub(crate) fn peer_terminated(&mut self, peer: u32) {
        if self.medium.paired_from(peer) {
            self.medium.abandon(peer);
        }
    }

    /// Checks a MEDIUM from `src` that says its `total` bytes come through the pair
    /// buffer: the buffer is there, `src` holds it, the message fits, and the packet
    /// carries none of them (`first`).
    pub(crate) fn check_paired(&self, src: u32, total: usize, first: usize) -> Result<(), String> {
        let ok = first == 0
            && total > 0
            && self
                .pairs
                .as_ref()
                .and_then(|p| p.with(src))
                .is_some_and(|b| b.held_by_peer() && total <= b.capacity());
        if ok {
            Ok(())
        } else {
            Err(format!(
                "a medium message of {total} bytes in a pair buffer its sender does not hold or that is too small"
            ))
        }
    }

    /// The first packet of a medium message: matched now if a receive is posted for it,
    /// else gathered aside.
    fn on_medium(&mut self, src: u32, h: Header, first: &[u8]) -> Result<(), String> {
        let total = h.aux as usize;
        self.medium.check_first(src, total, first.len())?;
        let paired = h.flags & wire::PAIRED != 0;
        if paired {
            self.check_paired(src, total, first.len())?;
        }
        let (ctx, tag) = (h.context, h.tag);
        let into = match self.take_posted(ctx, src, tag) {
            Some(id) => {
                if let Some(Req::Recv(rr)) = self.reqs.get_mut(id) {
                    // SAFETY: the buffer is lent (see `Bufs`) and not otherwise in use.
                    unsafe { rr.bufs.write_at(0, first) };
                    rr.state = RState::Arriving { peer: src };
                }
                medium::Target::Req(id)
            }
            None => {
                let mut v = Vec::with_capacity(total);
                v.extend_from_slice(first);
                medium::Target::Buffer(v)
            }
        };
        let a = Assembly {
            into,
            ctx,
            tag,
            total,
            got: first.len(),
            paired,
        };
        if a.got == total {
            self.medium_whole(src, a);
        } else {
            self.medium.begin(src, a);
            if paired {
                self.pull_paired(src);
                // The chores take the rest as it comes.
                self.chores |= self.medium.paired_from(src);
            }
        }
        Ok(())
    }

    /// `src` broke the medium protocol: what it had under way is dropped, and the
    /// receive it was for, if any, fails.
    #[cold]
    fn break_medium(&mut self, src: u32, what: String) {
        if let Some(Assembly {
            into: medium::Target::Req(id),
            ..
        }) = self.medium.abandon(src)
            && let Some(Req::Recv(rr)) = self.reqs.get(id)
            && matches!(rr.state, RState::Arriving { .. })
        {
            self.fail(
                id,
                P2pError::Protocol {
                    rank: src,
                    what: what.clone(),
                },
            );
        }
        self.fault(src, what);
    }

    /// The next bytes of the medium message `src` has under way.
    fn on_mdata(&mut self, src: u32, data: &[u8]) -> Result<(), String> {
        let step = match self.medium.next(src, data) {
            Ok(step) => step,
            Err(what) => {
                self.break_medium(src, what);
                return Ok(());
            }
        };
        let (id, at, whole) = match step {
            Step::Part(Some(id), at) => (id, at, None),
            Step::Part(None, _) => return Ok(()),
            Step::Whole(a) => match a.into {
                medium::Target::Req(id) => (id, a.got - data.len(), Some(a)),
                _ => {
                    self.medium_whole(src, a);
                    return Ok(());
                }
            },
        };
        if let Some(Req::Recv(rr)) = self.reqs.get_mut(id)
            && matches!(rr.state, RState::Arriving { .. })
        {
            // SAFETY: the buffer is lent (see `Bufs`), or empty once released.
            unsafe { rr.bufs.write_at(at, data) };
        }
        if let Some(a) = whole {
            self.medium_whole(src, a);
        }
        Ok(())
    }

    /// A medium message is whole: its receive completes, or, gathered aside, it is
    /// matched now or waits with the unexpected messages.
    fn medium_whole(&mut self, src: u32, a: Assembly) {
        match a.into {
            medium::Target::Req(id) => {
                if let Some(Req::Recv(rr)) = self.reqs.get_mut(id)
                    && matches!(rr.state, RState::Arriving { .. })
                {
                    complete_recv(rr, src, a.tag, a.total);
                    self.reqs.settle(id);
                }
            }
            medium::Target::Buffer(data) => {
                if self.quick.deliver(a.ctx, src, a.tag, &data) {
                    return;
                }
                if let Some(q) = self.matching.take_posted(a.ctx, src, a.tag) {
                    if let Some(Req::Recv(rr)) = self.reqs.get_mut(q.id) {
                        deliver_eager(rr, src, a.tag, &data);
                        self.reqs.settle(q.id);
                    }
                    return;
                }
                self.matching.arrived(Unexpected {
                    src,
                    ctx: a.ctx,
                    tag: a.tag,
                    body: Body::Eager(data),
                });
            }
            medium::Target::Discard => {}
        }
    }

    /// A blocking receive that took the first packets of a medium message itself gives
    /// up (it failed): the rest of the message is drained into nothing.
    pub(crate) fn discard_medium(
        &mut self,
        src: u32,
        ctx: u32,
        tag: i32,
        total: usize,
        got: usize,
        paired: bool,
    ) {
        self.medium.begin(
            src,
            Assembly {
                into: medium::Target::Discard,
                ctx,
                tag,
                total,
                got,
                paired,
            },
        );
        self.chores |= paired;
    }

    /// The RTS in `payload`, or `None` (and a fault) if it is malformed.
    pub(crate) fn parse_rts(&mut self, src: u32, send_id: u32, payload: &[u8]) -> Option<Rts> {
        match wire::parse_rts(send_id, payload) {
            Ok(r) => Some(r),
            Err(what) => {
                self.fault(src, what);
                None
            }
        }
    }

    fn on_rts(&mut self, src: u32, h: Header, payload: &[u8]) {
        let Some(rts) = self.parse_rts(src, h.aux, payload) else {
            return;
        };
        let (ctx, tag) = (h.context, h.tag);
        if let Some(id) = self.take_posted(ctx, src, tag) {
            self.rndv.accept(&mut self.reqs, &mut self.out, id, src, rts, tag);
            return;
        }
        self.matching.arrived(Unexpected {
            src,
            ctx,
            tag,
            body: Body::Rts(rts),
        });
    }

    /// The earliest posted receive that selects a message of (`ctx`, `src`, `tag`), as a
    /// request of the table: a quick receive (all older than the table's) is promoted to
    /// one.
    fn take_posted(&mut self, ctx: u32, src: u32, tag: i32) -> Option<u32> {
        if let Some(id) = self.quick.promote(&mut self.reqs, ctx, src, tag) {
            return Some(id);
        }
        self.matching.take_posted(ctx, src, tag).map(|q| q.id)
    }

    /// The sender lets go of `send_id`: if its RTS is not yet being read in place, make
    /// sure it never is, and say so.
    fn on_revoke(&mut self, src: u32, send_id: u32) {
        if self.matching.revoke(src, send_id) || self.rndv.revoke_unchosen(&mut self.reqs, src, send_id) {
            self.ctrl(src, REVOKED, send_id, &[]);
        }
        // Otherwise it is already being read: DONE will answer.
    }

    /// Registers a receive of a large message that has been matched, and accepts it.
    pub(crate) fn accept_rts(&mut self, rr: RecvReq, peer: u32, rts: Rts, tag: i32) -> Result<u32, P2pError> {
        let id = self.reqs.insert(Req::Recv(rr))?;
        self.rndv
            .accept(&mut self.reqs, &mut self.out, id, peer, rts, tag);
        self.chores = true;
        Ok(id)
    }

    /// Starts the receive that `make` builds, of (`ctx`, `src`, `tag`): matched at once
    /// against an unexpected message, or posted. Returns the request, which may already
    /// be complete (and, if owned, already told and forgotten).
    ///
    /// The request is built from its parts where it goes: parts built earlier and moved
    /// in are wide loads of narrower stores, which the CPU cannot forward.
    #[inline(always)]
    pub(crate) fn start_recv(
        &mut self,
        make: impl FnOnce() -> RecvReq,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
    ) -> Result<u32, P2pError> {
        // The request goes in first: if the table is full, a waiting message stays where
        // it is.
        let id = self.reqs.insert_with(|| Req::Recv(make()))?;
        match self.matching.take_unexpected(ctx, src, tag) {
            Some(Unexpected {
                src,
                tag,
                body: Body::Eager(data),
                ..
            }) => {
                if let Some(Req::Recv(rr)) = self.reqs.get_mut(id) {
                    deliver_eager(rr, src, tag, &data);
                }
                self.reqs.settle(id);
            }
            Some(Unexpected {
                src,
                tag,
                body: Body::Rts(rts),
                ..
            }) => {
                self.rndv.accept(&mut self.reqs, &mut self.out, id, src, rts, tag);
                self.chores = true;
            }
            None => self.matching.post(Posted { id, ctx, src, tag }),
        }
        Ok(id)
    }

    /// Posts a quick receive into `buf` for scope `scope` if it can be one: nothing is
    /// waiting to be matched (no unexpected message, no posted receive of the table, so
    /// that the ring's entries stay older than the table's), and the ring has room.
    #[inline(always)]
    pub(crate) fn start_recv_quick(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: nemesis_lmt::Seg,
        scope: u64,
    ) -> Option<u32> {
        if !self.matching.is_empty() {
            return None;
        }
        self.quick.post(ctx, src, tag, buf, scope)
    }

    /// Whether a blocking receive of (`ctx`, `src`, `tag`) may match fresh packets
    /// directly (see [`Matching::bypass`]); no quick receive may be waiting either.
    #[inline(always)]
    pub(crate) fn bypass(&self, ctx: u32, src: Option<u32>, tag: Option<i32>) -> bool {
        self.quick.none_posted() && self.matching.bypass(ctx, src, tag)
    }

    /// Whether nothing is posted, nothing waits unexpected and no medium message is
    /// arriving: the four counts tested together, so that a blocking receive's first
    /// look costs one branch; any of them sends it the longer way ([`Engine::bypass`]).
    #[inline(always)]
    pub(crate) fn calm(&self) -> bool {
        (self.quick.posted_count() as usize | self.matching.queued() | self.medium.arriving_count()) == 0
    }

    /// What follows every poll: control packets go out, chunks are pushed, and a
    /// protocol fault is reported.
    #[inline(always)]
    pub(crate) fn settle<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        if self.chores { self.do_chores(ch) } else { Ok(()) }
    }

    #[inline(never)]
    fn do_chores<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        if !self.medium.paired().is_empty() {
            self.pull_all_paired();
        }
        self.rndv.drive(&mut self.reqs, ch, &mut self.out);
        let r = self
            .out
            .flush(ch)
            .and_then(|()| self.rndv.push(&mut self.reqs, ch))
            .and_then(|()| self.out.flush(ch));
        self.chores = self.rndv.has_chores() || !self.out.is_empty() || !self.medium.paired().is_empty();
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        Ok(r?)
    }

    /// Whether a blocked call should keep polling rather than sleep.
    pub(crate) fn busy(&mut self) -> bool {
        self.chores || self.rndv.busy(&self.reqs)
    }

    /// Whether request `id` lent its pages to the peer in place.
    pub(crate) fn holds_in_place(&self, id: u32) -> bool {
        self.reqs.get(id).is_some_and(rndv::holds_in_place)
    }

    /// Fails request `id` with `e`, ending what it moves; returns the transfers to hand
    /// back to the LMT (what it moved, what its offer held).
    pub(crate) fn fail(&mut self, id: u32, e: P2pError) -> Vec<nemesis_lmt::Xfer> {
        self.matching.cancel(id);
        let Some(req) = self.reqs.get_mut(id) else {
            return Vec::new();
        };
        let x = match req {
            Req::Recv(rr) => {
                rr.result = Some(Err(Box::new(e)));
                match std::mem::replace(&mut rr.state, RState::Done) {
                    RState::Rndv {
                        stage: super::requests::Stage::Lmt(x),
                        ..
                    } => vec![*x],
                    _ => Vec::new(),
                }
            }
            Req::Send(s) => {
                s.result = Some(Err(Box::new(e)));
                let held = s.held.take().map(|h| *h);
                match std::mem::replace(&mut s.state, SState::Done) {
                    SState::Lmt { x, .. } => Some(*x).into_iter().chain(held).collect(),
                    _ => held.into_iter().collect(),
                }
            }
        };
        self.reqs.settle(id);
        x
    }

    /// Lets a request go: cancels, drains into nothing, or copies what a send still
    /// needs, so the buffer is never touched again. The caller has made sure the
    /// request does not hold its pages in place ([`Engine::holds_in_place`]).
    pub(crate) fn release(&mut self, id: u32) {
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.is_done() {
            self.reqs.remove(id);
            return;
        }
        match req {
            Req::Recv(rr) => {
                if matches!(rr.state, RState::Posted) {
                    self.matching.cancel(id);
                    self.reqs.remove(id);
                    return;
                }
                rr.bufs = Bufs::NONE;
                rr.detached = true;
            }
            Req::Send(s) => {
                if s.owned.is_none() {
                    let mut v = Vec::with_capacity(s.len);
                    for p in s.bufs.slices(0, s.len) {
                        v.extend_from_slice(p);
                    }
                    s.owned = Some(v);
                }
                s.bufs = Bufs::NONE;
                s.detached = true;
            }
        }
    }

    /// Lets an owned request go: a receive that nothing has matched is cancelled, and
    /// anything else finishes on its own, the request's slot keeping its buffer alive
    /// until the engine is done with it.
    pub(crate) fn release_owned(&mut self, id: u32) {
        if let Some(Req::Recv(rr)) = self.reqs.get(id)
            && matches!(rr.state, RState::Posted)
        {
            self.matching.cancel(id);
            self.reqs.remove(id);
        }
    }

    /// Takes the result of a complete request and forgets it.
    #[inline(always)]
    pub(crate) fn finish(&mut self, id: u32) -> Result<Status, P2pError> {
        Self::outcome(id, self.reqs.take_result(id).flatten())
    }

    /// As [`Engine::finish`] if request `id` (of the table, or quick) is finished;
    /// `None` while it is not. The error stays boxed, so that the answer is small.
    #[inline(always)]
    pub(crate) fn finish_if_done(&mut self, id: u32) -> Option<Result<Status, Box<P2pError>>> {
        if quick::is_quick(id) {
            return match self.quick.look(id) {
                Look::Pending => None,
                Look::Finished(r) => Some(r),
                Look::Table(t) => self.finish_carried(id, t),
            };
        }
        let taken = self.reqs.take_if_finished(id)?;
        Some(Self::outcome_boxed(id, taken))
    }

    /// [`Engine::finish_if_done`] of quick receive `id`, which request `t` of the table
    /// carries on: when `t` is finished, both are forgotten.
    #[inline(never)]
    fn finish_carried(&mut self, id: u32, t: u32) -> Option<Result<Status, Box<P2pError>>> {
        let taken = self.reqs.take_if_finished(t)?;
        self.quick.release(id);
        Some(Self::outcome_boxed(t, taken))
    }

    /// Whether request `id` (of the table, or quick) is finished or unknown.
    #[inline]
    pub(crate) fn finished(&self, id: u32) -> bool {
        if quick::is_quick(id) {
            return match self.quick.carrier(id) {
                Some(t) => self.reqs.finished(t),
                None => self.quick.finished(id),
            };
        }
        self.reqs.finished(id)
    }

    /// A taken result, or the error of a request that had none.
    #[inline(always)]
    fn outcome_boxed(id: u32, result: Outcome) -> Result<Status, Box<P2pError>> {
        match result {
            Some(r) => r,
            None => Err(Box::new(P2pError::InvalidArgument(format!(
                "request {id} has no result"
            )))),
        }
    }

    #[inline(always)]
    fn outcome(id: u32, result: Outcome) -> Result<Status, P2pError> {
        Self::outcome_boxed(id, result).map_err(|e| *e)
    }

    /// Every send this engine still owes (released ones included).
    pub(crate) fn owes(&self) -> bool {
        self.reqs
            .iter()
            .any(|(_, r)| matches!(r, Req::Send(s) if !matches!(s.state, SState::Done)))
    }
}

/// Copies an eager payload into a receive buffer and completes the receive. Inline: a
/// call spills the request and the payload to memory and loads them back.
#[inline(always)]
pub(crate) fn deliver_eager(rr: &mut RecvReq, src: u32, tag: i32, data: &[u8]) {
    // SAFETY: the buffer is lent (see `Bufs`) and not otherwise in use.
    unsafe { rr.bufs.write_at(0, data) };
    complete_recv(rr, src, tag, data.len());
}

/// Completes a receive whose `len`-byte message from `src` is in its buffer (as much of
/// it as fits). The receive was posted or arriving, with no result yet: neither field
/// owns anything, so the old values are forgotten rather than dropped (the drop glue's
/// tests cost more than the rest of the completion).
#[inline]
fn complete_recv(rr: &mut RecvReq, src: u32, tag: i32, len: usize) {
    debug_assert!(matches!(rr.state, RState::Posted | RState::Arriving { .. }) && rr.result.is_none());
    let source = rr.comm.rank_of(src).unwrap_or(src);
    let result = if len > rr.cap {
        Err(Box::new(P2pError::Truncated {
            message_len: len,
            buffer_len: rr.cap,
        }))
    } else {
        Ok(Status { source, tag, len })
    };
    std::mem::forget(rr.result.replace(result));
    std::mem::forget(std::mem::replace(&mut rr.state, RState::Done));
}

/// The communicator of a request, for the rank of a failed peer.
pub(crate) fn comm_of(r: &Req) -> &ReqComm {
    match r {
        Req::Recv(rr) => &rr.comm,
        Req::Send(s) => &s.comm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::requests::MAX_REQUESTS;

    #[test]
    fn a_quick_receive_that_cannot_be_promoted_fails_and_the_rts_waits_for_the_next() {
        let mut e = Engine::new(2);
        let mut buf = [0u8; 8];
        let id = e
            .start_recv_quick(0, Some(1), Some(5), nemesis_lmt::Seg::of_mut(&mut buf), 1)
            .expect("a quick receive");
        for _ in 0..MAX_REQUESTS {
            e.reqs
                .insert(Req::Recv(RecvReq::new(Bufs::NONE, 0, ReqComm::Identity, None)))
                .unwrap();
        }
        // An RTS of 1 MiB offering chunks: it needs a request of the table, and the
        // table is full.
        let mut rts = (1u64 << 20).to_le_bytes().to_vec();
        rts.push(nemesis_lmt::Strategies::CHUNKS.0);
        let h = Header {
            kind: RTS,
            context: 0,
            tag: 5,
            aux: 7,
            flags: 0,
        };
        e.handle(1, &h, &rts);
        match e.finish_if_done(id) {
            Some(Err(err)) => assert!(matches!(*err, P2pError::InvalidArgument(_)), "{err}"),
            other => panic!("the receive did not fail: {other:?}"),
        }
        assert!(
            e.matching.peek_unexpected(0, Some(1), Some(5)).is_some(),
            "the RTS is kept for the next receive"
        );
        assert_eq!(e.quick.alive(), 0);
    }

    #[test]
    fn a_receive_refused_for_want_of_a_slot_leaves_the_waiting_message_queued() {
        let mut e = Engine::new(2);
        e.handle(1, &wire::eager(0, 5), b"hello");
        for _ in 0..MAX_REQUESTS {
            e.reqs
                .insert(Req::Recv(RecvReq::new(Bufs::NONE, 0, ReqComm::Identity, None)))
                .unwrap();
        }
        let err = e
            .start_recv(
                || RecvReq::new(Bufs::NONE, 8, ReqComm::Identity, Some(1)),
                0,
                Some(1),
                Some(5),
            )
            .unwrap_err();
        assert!(matches!(err, P2pError::InvalidArgument(_)), "{err}");
        assert!(
            e.matching.peek_unexpected(0, Some(1), Some(5)).is_some(),
            "the message that arrived first is still there for the next receive"
        );
    }
}
