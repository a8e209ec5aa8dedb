//! Blocking point to point: send, recv, sendrecv, their iovec forms, and probes.

use super::World;
use super::fresh::Arriving;
use super::fresh::FRESH_ANY_SRC;
use super::fresh::FRESH_ANY_TAG;
use super::fresh::FULL_POLL_EVERY;
use super::fresh::Found;
use super::fresh::Fresh;
use super::fresh::FreshSink;
use super::fresh::pull_fresh;
use super::fresh::take_late;
use crate::channel::Channel;
use crate::p2p::comm::{Comm, CommInner};
use crate::p2p::requests::{Bufs, Holder, RecvReq, Req};
use crate::p2p::wire;
use crate::p2p::{P2pError, Status};
use nemesis_lmt::Seg;
use nemesis_shm::region::copy_into;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many more times a blocking receive from another local process looks at its
/// source's fastbox alone, after a first look found it empty, before the `Fresh`
/// receive takes over: a round trip's reply on these machines comes about 130 ns
/// after the send, at a few nanoseconds a look.
const FIRST_LOOKS: u32 = 32;

impl<C: Channel> World<C> {
    /// Sends `buf` to rank `dest` of `comm` with `tag`, returning when the buffer may be
    /// reused.
    ///
    /// # Errors
    /// A bad rank or tag, a communicator of another world, a peer that failed during a
    /// large transfer, or the channel's error.
    #[inline]
    pub fn send(&mut self, comm: &Comm, dest: u32, tag: i32, buf: &[u8]) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        Self::check_tag(tag)?;
        self.send_in(c, c.ctx, dest, tag, buf)
    }

    #[inline]
    pub(crate) fn send_in(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        dest: u32,
        tag: i32,
        buf: &[u8],
    ) -> Result<(), P2pError> {
        if buf.len() <= self.eager_at_once
            && let Some(&d) = c.ranks.get(dest as usize)
        {
            if self.core.ch.try_send_now(d, wire::eager(ctx, tag), buf) {
                return Ok(());
            }
            return self.send_eager_slow(d, ctx, tag, buf);
        }
        self.send_large(c, ctx, dest, tag, buf)
    }

    /// Sends `buf` eagerly if it can go at once, through the channel's next slot to
    /// `dest`; says whether it went (nothing is sent when it did not).
    #[inline]
    pub(crate) fn try_eager_now(&mut self, c: &CommInner, ctx: u32, dest: u32, tag: i32, buf: &[u8]) -> bool {
        buf.len() <= self.eager_at_once
            && c.ranks
                .get(dest as usize)
                .is_some_and(|&d| self.core.ch.try_send_now(d, wire::eager(ctx, tag), buf))
    }

    /// A blocking send that is not a simple eager one: a rendezvous, or a bad rank.
    #[inline(never)]
    fn send_large(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        dest: u32,
        tag: i32,
        buf: &[u8],
    ) -> Result<(), P2pError> {
        match self.start_send(c, dest, tag, ctx, buf, Holder::Call)? {
            None => Ok(()),
            Some(id) => self.block_on(id).map(|_| ()),
        }
    }

    /// Receives a message from `src` (or [`crate::p2p::ANY_SOURCE`]) with `tag` (or
    /// [`crate::p2p::ANY_TAG`]) into `buf`.
    ///
    /// # Errors
    /// [`P2pError::Truncated`] when the message is longer than `buf` (which holds its
    /// beginning), a bad rank or tag, a source that failed, or the channel's error.
    #[inline]
    pub fn recv(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: &mut [u8],
    ) -> Result<Status, P2pError> {
        let c = self.check_comm(comm)?;
        let tag = tag.into();
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        self.recv_in(c, c.ctx, src.into(), tag, buf)
    }

    #[inline]
    pub(crate) fn recv_in(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Result<Status, P2pError> {
        let src_w = match src {
            None => None,
            Some(s) => Some(c.world_of(s)?),
        };
        // The message is most likely the next one from a named source, waiting in its
        // fastbox: an eager message this receive selects is taken there by a sink that
        // only copies it, so that nothing else any packet might need is kept for it. A
        // packet of any other kind stays in the fastbox. Only while the engine is calm:
        // with anything posted, waiting or arriving, the `Fresh` receive or the posted
        // queue decides, and the `Fresh` receive's first look is at the same fastbox.
        let mut got = None;
        if let Some(s) = src_w
            && self.eng.calm()
            && self.look_eager(ctx, s, tag, buf, || {}, &mut got)
            && let Some((got_tag, len)) = got
        {
            // `took_eager`'s body, written out: called here, even inlined, it cost this
            // path 10 instructions (`scripts/icount.sh p2p`).
            if self.eng.chores {
                let found = Some(Found::Eager {
                    src: s,
                    tag: got_tag,
                    len,
                });
                return self.recv_fresh(c, ctx, src_w, tag, buf, found, None);
            }
            return eager_status(c, s, got_tag, len, buf.len());
        }
        self.recv_waiting(c, ctx, src, src_w, tag, buf)
    }

    /// A blocking receive whose message was not the next in its source's fastbox: by
    /// the `Fresh` receive where nothing is posted or waiting that could match (whose
    /// first look is at the same fastbox), else through the posted queue. `src_w` is
    /// `src` as a world rank.
    #[inline(never)]
    fn recv_waiting(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        src: Option<u32>,
        src_w: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Result<Status, P2pError> {
        // The first look found the box empty: look again, a few times, as the `Fresh`
        // receive would look at it alone, so that a reply that comes within a round
        // trip of the send before it is taken by the first look's short path rather
        // than by that receive's longer one. Not once the box holds a packet the look
        // leaves (`seen`), nor for a source that is not another local process.
        if let Some(s) = src_w
            && s != self.rank()
            && self.core.ch.is_local(s)
        {
            let mut seen = false;
            for _ in 0..FIRST_LOOKS {
                if !self.eng.calm() || seen {
                    break;
                }
                let mut got = None;
                if self.look_eager(ctx, s, tag, buf, || seen = true, &mut got)
                    && let Some((got_tag, len)) = got
                {
                    return self.took_eager(c, ctx, s, tag, buf, got_tag, len);
                }
            }
        }
        if self.eng.bypass(ctx, src_w, tag) {
            return self.recv_fresh(c, ctx, src_w, tag, buf, None, None);
        }
        self.recv_posted(c, ctx, src, tag, buf)
    }

    /// Takes the next packet from `s`'s fastbox into `buf` if it is an eager message of
    /// context `ctx` that `tag` selects, by a sink that only copies it, so that nothing
    /// else any packet might need is kept for it; a packet of any other kind stays in
    /// the fastbox, and `seen` is told of it. Whether it took one, whose tag and length
    /// go to `got`. The caller finishes the receive ([`World::took_eager`]): returned from
    /// here, a receive's `Result` cost the first look 23 instructions.
    #[inline(always)]
    fn look_eager(
        &mut self,
        ctx: u32,
        s: u32,
        tag: Option<i32>,
        buf: &mut [u8],
        mut seen: impl FnMut(),
        got: &mut Option<(i32, usize)>,
    ) -> bool {
        let want = tag.unwrap_or(FRESH_ANY_TAG);
        self.core.ch.poll_from_if(
            s,
            #[inline(always)]
            |h, _| {
                seen();
                // The header's words against those of an eager message of this
                // context and tag (flags and the spare word nought, as `wire::eager`
                // makes them): one comparison each. Any other header, which the
                // `Fresh` receive may still take, is left for it.
                let [w0, w1] = h.to_envelope();
                let [e0, e1] = wire::eager(ctx, want).to_envelope();
                w0 == e0 && (want == FRESH_ANY_TAG || w1 == e1)
            },
            #[inline(always)]
            |p| {
                copy_into(buf, p.payload);
                *got = Some((p.header.tag, p.payload.len()));
            },
        )
    }

    /// The receive whose eager message from `s` (`got_tag`, `len` bytes) a
    /// [`World::look_eager`] took: its status, or, with chores due, through the `Fresh`
    /// receive that does them first.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn took_eager(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        s: u32,
        tag: Option<i32>,
        buf: &mut [u8],
        got_tag: i32,
        len: usize,
    ) -> Result<Status, P2pError> {
        if self.eng.chores {
            let found = Some(Found::Eager {
                src: s,
                tag: got_tag,
                len,
            });
            return self.recv_fresh(c, ctx, Some(s), tag, buf, found, None);
        }
        eager_status(c, s, got_tag, len, buf.len())
    }

    /// A blocking receive that goes through the posted queue.
    #[inline(never)]
    fn recv_posted(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Result<Status, P2pError> {
        let seg = Seg::of_mut(buf);
        let id = self.start_recv(c, src, tag, ctx, || Bufs::One(seg), seg.len, || Holder::Call)?;
        self.block_on(id)
    }

    /// A blocking receive with nothing posted and nothing matching waiting: fresh packets
    /// are matched against it as they are polled, without a posted entry (the receive
    /// queue bypass). `src` is a world rank. `found` is what a first look found already,
    /// and `arriving` the medium message it began to take.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn recv_fresh(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
        found: Option<Found>,
        arriving: Option<Arriving>,
    ) -> Result<Status, P2pError> {
        let (seg, cap) = (Seg::of_mut(buf), buf.len());
        let mut f = Fresh {
            ctx,
            src: src.unwrap_or(FRESH_ANY_SRC),
            tag: tag.unwrap_or(FRESH_ANY_TAG),
            buf,
            found,
            arriving,
        };
        let found = match self.fresh_loop(c, src, tag, &mut f) {
            Ok(found) => found,
            Err(e) => {
                // The rest of a medium message this receive began to take is drained.
                // A dead sender's message through the pair buffer will never be whole.
                if let Some(a) = f.arriving.take()
                    && !(a.paired && matches!(e, P2pError::PeerFailed { .. }))
                {
                    self.eng
                        .discard_medium(a.src, ctx, a.tag, a.total, a.got, a.paired);
                }
                return Err(e);
            }
        };
        match found {
            Found::Eager { src, tag, len } => eager_status(c, src, tag, len, cap),
            Found::Rts { src: peer, tag, rts } => {
                let rr = RecvReq::new(Bufs::One(seg), cap, super::super::comm::ReqComm::of(c), src);
                let id = self.eng.accept_rts(rr, peer, *rts, tag)?;
                self.settle()?;
                self.block_on(id)
            }
        }
    }

    /// The polling of [`World::recv_fresh`], until `f` has found its message.
    fn fresh_loop(
        &mut self,
        c: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        f: &mut Fresh<'_>,
    ) -> Result<Found, P2pError> {
        let mut idle = self.core.idle();
        let mut round = 0u32;
        // Only a local source has a fastbox to look in.
        let boxed = src.filter(|&s| s != self.rank() && self.core.ch.is_local(s));
        loop {
            if let Some(a) = &mut f.arriving
                && a.paired
            {
                let before = a.got;
                if pull_fresh(&self.eng, a, &mut *f.buf) {
                    f.found = Some(a.found());
                    f.arriving = None;
                } else if a.got > before {
                    idle = self.core.idle();
                }
            }
            if let Some(found) = f.found.take() {
                // What the poll left to do must not cost this receive its message: a
                // failure is reported by the next call instead.
                if let Err(e) = self.settle() {
                    self.eng.defer(e);
                }
                return Ok(found);
            }
            round = round.wrapping_add(1);
            // A named source's next message most likely comes through its fastbox: look
            // there alone, and at everything (the queue, the network, every protocol's
            // packets, the chores) on every few rounds.
            if let Some(s) = boxed
                && round % FULL_POLL_EVERY != 0
            {
                let (ch, mut others) = self.core.split();
                let eng = &mut self.eng;
                if ch.poll_from(s, |p| f.offer(eng, &mut others, p)) || idle.tight() {
                    continue;
                }
            }
            self.release_dropped();
            let (ch, mut others) = self.core.split();
            let polled = ch.poll_landing(&mut FreshSink {
                f: &mut *f,
                eng: &mut self.eng,
                others: &mut others,
            });
            if f.found.is_some() {
                continue;
            }
            let progressed = polled? > 0;
            let paired = !self.eng.medium.paired().is_empty();
            self.settle()?;
            if paired && f.arriving.is_none() {
                // The chores may have finished a message from the pair buffer, gathered
                // aside: it came before anything this receive has not seen yet.
                if let Some(found) = take_late(&mut self.eng, f.ctx, src, tag, &mut *f.buf) {
                    f.found = Some(found);
                    continue;
                }
            }
            if progressed && f.arriving.is_some() {
                // A medium message is on its way: its next packets are close behind.
                idle = self.core.idle();
                continue;
            }
            let what = || describe_recv(c, src, tag);
            // Bytes through the pair buffer ring no bell: no sleeping while they come.
            let from_pair = f.arriving.is_some_and(|a| a.paired);
            self.idle_busy(
                &mut idle,
                from_pair,
                &what,
                &mut |w| match w.peer_failed(c, src) {
                    Some(e) => Err(e),
                    None => Ok(()),
                },
            )?;
        }
    }

    /// Sends to `dest` and receives from `src` at once, as two ranks exchanging data
    /// must, so neither waits for the other first.
    ///
    /// # Errors
    /// As for [`World::send`] and [`World::recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv(
        &mut self,
        comm: &Comm,
        dest: u32,
        send_tag: i32,
        send: &[u8],
        src: impl Into<Option<u32>>,
        recv_tag: impl Into<Option<i32>>,
        recv: &mut [u8],
    ) -> Result<Status, P2pError> {
        let c = self.check_comm(comm)?;
        Self::check_tag(send_tag)?;
        let recv_tag = recv_tag.into();
        if let Some(t) = recv_tag {
            Self::check_tag(t)?;
        }
        self.sendrecv_in(c, c.ctx, dest, send_tag, send, src.into(), recv_tag, recv)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv_in(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        dest: u32,
        send_tag: i32,
        send: &[u8],
        src: Option<u32>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
    ) -> Result<Status, P2pError> {
        let seg = Seg::of_mut(recv);
        let rid = self.start_recv(c, src, recv_tag, ctx, || Bufs::One(seg), seg.len, || Holder::Call)?;
        let sid = match self.start_send(c, dest, send_tag, ctx, send, Holder::Call) {
            Ok(s) => s,
            Err(e) => {
                self.release(rid);
                return Err(e);
            }
        };
        let ids: Vec<u32> = std::iter::once(rid).chain(sid).collect();
        let r = self.wait_all_ids(&ids);
        for &id in &ids {
            if r.is_err() || !self.eng.reqs.get(id).is_some_and(Req::is_done) {
                self.release(id);
            }
        }
        r?;
        if let Some(sid) = sid {
            self.eng.finish(sid)?;
        }
        self.eng.finish(rid)
    }

    /// Sends the concatenation of `bufs` to rank `dest` of `comm` with `tag`, without
    /// packing it first where the transfer allows (CMA reads the pieces in place).
    ///
    /// # Errors
    /// As for [`World::send`].
    pub fn send_iov(&mut self, comm: &Comm, dest: u32, tag: i32, bufs: &[&[u8]]) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?.clone();
        Self::check_tag(tag)?;
        let segs: Box<[Seg]> = bufs.iter().map(|b| Seg::of(b)).collect();
        let len = segs.iter().map(|s| s.len).sum();
        match self.start_send_bufs(&c, dest, tag, c.ctx, Bufs::Many(segs), len, Holder::Call)? {
            None => Ok(()),
            Some(id) => self.block_on(id).map(|_| ()),
        }
    }

    /// Receives a message from `src` with `tag` into the slices of `bufs` in turn,
    /// without an intermediate buffer where the transfer allows.
    ///
    /// # Errors
    /// As for [`World::recv`].
    pub fn recv_iov(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        bufs: &mut [&mut [u8]],
    ) -> Result<Status, P2pError> {
        let c = self.check_comm(comm)?.clone();
        let tag = tag.into();
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        let segs: Box<[Seg]> = bufs.iter_mut().map(|b| Seg::of_mut(b)).collect();
        let len = segs.iter().map(|s| s.len).sum();
        let id = self.start_recv(
            &c,
            src.into(),
            tag,
            c.ctx,
            || Bufs::Many(segs),
            len,
            || Holder::Call,
        )?;
        self.block_on(id)
    }

    /// Reports the next matching message without receiving it, if one has arrived.
    ///
    /// # Errors
    /// A bad rank, or the channel's error.
    pub fn iprobe(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
    ) -> Result<Option<Status>, P2pError> {
        let c = self.check_comm(comm)?.clone();
        let src = Self::src_sel(&c, src.into())?;
        let tag = tag.into();
        self.progress()?;
        Ok(self
            .eng
            .matching
            .peek_unexpected(c.ctx, src, tag)
            .map(|u| Status {
                source: c.rank_of(u.src).unwrap_or(u.src),
                tag: u.tag,
                len: u.len(),
            }))
    }

    /// Waits until a matching message has arrived and reports it without receiving it.
    ///
    /// # Errors
    /// A bad rank, a source that failed, or the channel's error.
    pub fn probe(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
    ) -> Result<Status, P2pError> {
        let (src, tag) = (src.into(), tag.into());
        let c = self.check_comm(comm)?.clone();
        let src_w = Self::src_sel(&c, src)?;
        let mut idle = self.core.idle();
        loop {
            if let Some(s) = self.iprobe(comm, src, tag)? {
                return Ok(s);
            }
            let what = || format!("probe: {}", describe_recv(&c, src_w, tag));
            self.idle(&mut idle, &what, &mut |w| match w.peer_failed(&c, src_w) {
                Some(e) => Err(e),
                None => Ok(()),
            })?;
        }
    }

    /// Drives progress until every send this world still owes (including those of
    /// released requests) has completed and the channel has nothing queued.
    ///
    /// # Errors
    /// [`crate::ChannelError::FlushTimeout`] when `timeout` passes first, or the
    /// channel's error.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), P2pError> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.eng.owes() && self.core.ch.pending() == 0 {
                return Ok(());
            }
            self.progress()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(P2pError::Channel(crate::ChannelError::FlushTimeout {
                    pending: self.core.ch.pending(),
                    waited: timeout,
                }));
            }
            self.core
                .ch
                .wait(Some((deadline - now).min(self.cfg.failure_check)))?;
        }
    }
}

/// What a blocked receive waits for, for `NEMESIS_WAIT_WARN`.
fn describe_recv(c: &CommInner, src: Option<u32>, tag: Option<i32>) -> String {
    let from = match src {
        Some(s) => format!("rank {}", c.rank_of(s).unwrap_or(s)),
        None => "any rank".into(),
    };
    let tag = match tag {
        Some(t) => format!("tag {t}"),
        None => "any tag".into(),
    };
    format!("recv from {from} with {tag} on communicator {}", c.ctx / 2)
}

/// The status of a blocking receive that took an eager message of `len` bytes from world
/// rank `src` into a buffer of `cap`: truncated if it was longer.
#[inline(always)]
fn eager_status(c: &CommInner, src: u32, tag: i32, len: usize, cap: usize) -> Result<Status, P2pError> {
    if len > cap {
        return Err(P2pError::Truncated {
            message_len: len,
            buffer_len: cap,
        });
    }
    Ok(Status {
        source: c.member(src),
        tag,
        len,
    })
}
