//! The rendezvous of large messages, and the large-message transfer (LMT) it drives.
//!
//! Packets (`aux` names the request the packet is for, on the side that receives it):
//! - RTS, sender to receiver (aux: send id): the length (u64), the strategies offered
//!   (a bit set), and the cookie of the get strategies (CMA: the sender's pieces).
//! - CTS, receiver to sender (aux: send id): the receive id (u32), the strategy chosen
//!   (u8), and its cookie (a ring or pipe name, or the receiver's pieces for a put).
//! - DATA (aux: receive id): an offset (u64) and bytes, for chunks.
//! - DONE, receiver to sender (aux: send id): a status byte; the sender's buffer is free.
//! - FIN, sender to receiver (aux: receive id): a status byte; a put is complete, or the
//!   sender's side failed.
//! - REVOKE / REVOKED (aux: send id): a sender letting go of a request whose RTS offered
//!   its pages to be read in place asks the receiver not to, and waits for the answer.
//!
//! A get (CMA) needs no CTS: the receiver reads as soon as it matches, then sends DONE.

use super::comm::CommInner;
use super::engine::{
    Body, Bufs, CTS, DATA, DONE, Engine, FIN, REVOKE, REVOKED, RState, RTS, RecvReq, Req, SState, SendReq,
    World, selected,
};
use super::{P2pError, Status};
use crate::channel::{Channel, Header, SendStatus};
use nemesis_lmt::{Lmt, LmtError, Mode, Seg, Strategies, Strategy, Xfer};
use std::sync::Arc;
use std::time::Instant;

/// Status bytes of DONE and FIN.
const OK: u8 = 0;
const FAILED: u8 = 1;

/// What an RTS announces.
#[derive(Debug)]
pub(crate) struct Rts {
    pub send_id: u32,
    pub total: usize,
    pub offered: Strategies,
    pub cookie: Vec<u8>,
}

/// Where a matched large receive is.
#[derive(Debug)]
pub(crate) enum Stage {
    /// Matched; the next chores choose a strategy (which needs the channel).
    Choose { offered: Strategies, cookie: Vec<u8> },
    /// Chunks are arriving in DATA packets; `got` bytes so far.
    Chunks { got: usize },
    /// A strategy of the LMT is moving the data.
    Lmt(Xfer),
}

/// What one step of a transfer leaves to do once the request is no longer borrowed.
#[derive(Default)]
struct After {
    keep: bool,
    ctrl: Option<(u32, u16, u32, Vec<u8>)>,
    forget: bool,
}

impl After {
    /// More to do at the next chores, nothing to send now.
    const KEEP: After = After {
        keep: true,
        ctrl: None,
        forget: false,
    };
}

/// What a send moves from: its buffer, or the copy it took when it was let go.
fn source<'a>(bufs: &'a Bufs, owned: &'a Option<Vec<u8>>) -> std::borrow::Cow<'a, Bufs> {
    match owned {
        Some(v) => std::borrow::Cow::Owned(Bufs::One(Seg::of(v))),
        None => std::borrow::Cow::Borrowed(bufs),
    }
}

impl Engine {
    /// The RTS in `payload`, or `None` (and a fault) if it is malformed.
    pub(super) fn parse_rts(&mut self, src: u32, send_id: u32, payload: &[u8]) -> Option<Rts> {
        let (Some(total), Some(&offered)) = (
            payload
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
            payload.get(8),
        ) else {
            self.fault(src, "a short RTS");
            return None;
        };
        let offered = Strategies(offered);
        if !offered.has(Strategy::Chunks) || offered.0 >> Strategy::ALL.len() != 0 {
            self.fault(src, format!("an RTS offering strategies {:#04x}", offered.0));
            return None;
        }
        let Ok(total) = usize::try_from(total) else {
            self.fault(src, "an RTS longer than this machine can address");
            return None;
        };
        Some(Rts {
            send_id,
            total,
            offered,
            cookie: payload[9..].to_vec(),
        })
    }

    pub(super) fn on_rts(&mut self, src: u32, h: Header, payload: &[u8]) {
        let Some(rts) = self.parse_rts(src, h.aux, payload) else {
            return;
        };
        let (ctx, tag) = (h.context, h.tag);
        if let Some(i) = self
            .posted
            .iter()
            .position(|q| selected(q.ctx, q.src, q.tag, ctx, src, tag))
        {
            let q = self.posted.remove(i).expect("position is in range");
            if let Some(Req::Recv(rr)) = self.reqs.remove(&q.id) {
                self.start_rndv(q.id, rr, src, rts, tag);
            }
            return;
        }
        self.unexpected.push_back(super::engine::Unexpected {
            src,
            ctx,
            tag,
            body: Body::Rts(rts),
        });
    }

    /// Registers a receive of a large message that has been matched, and accepts it.
    pub(super) fn accept_rts(&mut self, rr: RecvReq, peer: u32, rts: Rts, tag: i32) -> u32 {
        let id = self.new_id();
        self.start_rndv(id, rr, peer, rts, tag);
        id
    }

    /// Accepts a matched RTS as request `id`: an empty message is done at once, one that
    /// only chunks can carry is cleared to send, and the rest wait for the chores to
    /// choose a strategy.
    pub(super) fn start_rndv(&mut self, id: u32, mut rr: RecvReq, peer: u32, rts: Rts, tag: i32) {
        let source = rr.comm.rank_of(peer).unwrap_or(peer);
        let Rts {
            send_id,
            total,
            offered,
            cookie,
        } = rts;
        rr.result = Some(if total > rr.cap {
            Err(P2pError::Truncated {
                message_len: total,
                buffer_len: rr.cap,
            })
        } else {
            Ok(Status {
                source,
                tag,
                len: total,
            })
        });
        if total == 0 {
            rr.state = RState::Done;
            self.ctrl(peer, DONE, send_id, &[OK]);
        } else if offered == Strategies::CHUNKS {
            rr.state = RState::Rndv {
                peer,
                send_id,
                total,
                stage: Stage::Chunks { got: 0 },
            };
            self.ctrl(peer, CTS, send_id, &cts(id, Strategy::Chunks, &[]));
        } else {
            rr.state = RState::Rndv {
                peer,
                send_id,
                total,
                stage: Stage::Choose { offered, cookie },
            };
            self.lmt_active.push(id);
            self.chores = true;
        }
        self.reqs.insert(id, Req::Recv(rr));
    }

    pub(super) fn on_cts(&mut self, src: u32, send_id: u32, payload: &[u8]) {
        let (Some(recv_id), Some(strategy)) = (
            payload
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))),
            payload.get(4).and_then(|&c| Strategy::from_code(c)),
        ) else {
            return self.fault(src, "a short CTS, or one naming an unknown strategy");
        };
        match self.reqs.get_mut(&send_id) {
            Some(Req::Send(s)) if s.dest == src && matches!(s.state, SState::WaitCts) => {
                if strategy == Strategy::Chunks {
                    s.state = SState::Push { recv_id, off: 0 };
                    s.used = Some(strategy);
                    self.pushing.push(send_id);
                    self.chores = true;
                } else if s.offered.has(strategy) && strategy.mode() != Mode::Get {
                    s.state = SState::Cts {
                        recv_id,
                        strategy,
                        cookie: payload[5..].to_vec(),
                    };
                    s.used = Some(strategy);
                    self.lmt_active.push(send_id);
                    self.chores = true;
                } else {
                    self.fault(src, format!("a CTS choosing {strategy}, which was not offered"));
                }
            }
            _ => self.fault(
                src,
                format!("a CTS for send {send_id}, which is not waiting for one"),
            ),
        }
    }

    pub(super) fn on_data(&mut self, src: u32, recv_id: u32, payload: &[u8]) {
        let Some(off) = payload
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        else {
            return self.fault(src, "a short DATA packet");
        };
        let data = &payload[8..];
        let Some(Req::Recv(rr)) = self.reqs.get_mut(&recv_id) else {
            return self.fault(src, format!("DATA for receive {recv_id}, which does not exist"));
        };
        let RState::Rndv {
            peer,
            send_id,
            total,
            stage: Stage::Chunks { got },
        } = &mut rr.state
        else {
            return self.fault(
                src,
                format!("DATA for receive {recv_id}, which is not receiving chunks"),
            );
        };
        let end = off.checked_add(data.len() as u64);
        if *peer != src || end.is_none_or(|e| e > *total as u64) {
            let what = format!("DATA at {off}+{} beyond a message of {total}", data.len());
            return self.fault(src, what);
        }
        // SAFETY: the buffer is lent (see `Bufs`); `write_at` stays inside it.
        unsafe { rr.bufs.write_at(off as usize, data) };
        *got += data.len();
        if *got >= *total {
            let (peer, send_id) = (*peer, *send_id);
            rr.state = RState::Done;
            if rr.detached {
                self.reqs.remove(&recv_id);
            }
            self.ctrl(peer, DONE, send_id, &[OK]);
        }
    }

    pub(super) fn on_done(&mut self, src: u32, send_id: u32, payload: &[u8]) {
        let status = payload.first().copied().unwrap_or(OK);
        match self.reqs.get_mut(&send_id) {
            Some(Req::Send(s)) if s.dest == src && !matches!(s.state, SState::Done) => {
                if let SState::Lmt { x, .. } = std::mem::replace(&mut s.state, SState::Done) {
                    self.retired.push(x);
                    self.chores = true;
                }
                if status != OK {
                    s.result = Some(Err(P2pError::RemoteTransfer {
                        rank: s.comm.rank_of(src).unwrap_or(src),
                    }));
                }
                s.owned = None;
                if s.detached {
                    self.reqs.remove(&send_id);
                }
            }
            // Both sides failed at once: ours is already reported.
            _ if status != OK => {}
            _ => self.fault(
                src,
                format!("DONE for send {send_id}, which is not waiting for one"),
            ),
        }
    }

    pub(super) fn on_fin(&mut self, src: u32, recv_id: u32, payload: &[u8]) {
        let status = payload.first().copied().unwrap_or(OK);
        match self.reqs.get_mut(&recv_id) {
            Some(Req::Recv(rr)) if matches!(rr.state, RState::Rndv { peer, .. } if peer == src) => {
                if let RState::Rndv {
                    stage: Stage::Lmt(x), ..
                } = std::mem::replace(&mut rr.state, RState::Done)
                {
                    self.retired.push(x);
                    self.chores = true;
                }
                if status != OK {
                    rr.result = Some(Err(P2pError::RemoteTransfer {
                        rank: rr.comm.rank_of(src).unwrap_or(src),
                    }));
                }
                if rr.detached {
                    self.reqs.remove(&recv_id);
                }
            }
            _ if status != OK => {}
            _ => self.fault(src, format!("FIN for receive {recv_id}, which is not receiving")),
        }
    }

    /// The sender lets go of `send_id`: if its RTS is not yet being read in place, make
    /// sure it never is, and say so.
    pub(super) fn on_revoke(&mut self, src: u32, send_id: u32) {
        let revoke = |offered: &mut Strategies, cookie: &mut Vec<u8>| {
            *offered = offered.without(Strategy::Cma);
            cookie.clear();
        };
        for u in self.unexpected.iter_mut() {
            if let Body::Rts(r) = &mut u.body
                && u.src == src
                && r.send_id == send_id
            {
                revoke(&mut r.offered, &mut r.cookie);
                return self.ctrl(src, REVOKED, send_id, &[]);
            }
        }
        for req in self.reqs.values_mut() {
            if let Req::Recv(RecvReq {
                state:
                    RState::Rndv {
                        peer,
                        send_id: sid,
                        stage: Stage::Choose { offered, cookie },
                        ..
                    },
                ..
            }) = req
                && *peer == src
                && *sid == send_id
            {
                revoke(offered, cookie);
                return self.ctrl(src, REVOKED, send_id, &[]);
            }
        }
        // Already being read: DONE will answer.
    }

    pub(super) fn on_revoked(&mut self, src: u32, send_id: u32) {
        if let Some(Req::Send(s)) = self.reqs.get_mut(&send_id)
            && s.dest == src
        {
            s.offered = s.offered.without(Strategy::Cma);
        }
    }

    /// Pushes chunks of accepted large messages while the channel has room.
    pub(super) fn push<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        let mut i = 0;
        while i < self.pushing.len() {
            let id = self.pushing[i];
            let Some(Req::Send(s)) = self.reqs.get_mut(&id) else {
                self.pushing.swap_remove(i);
                continue;
            };
            // A network may carry larger packets than shared memory does.
            let chunk = ch.max_payload_to(s.dest).saturating_sub(8).max(1);
            let SState::Push { recv_id, off } = &mut s.state else {
                self.pushing.swap_remove(i);
                continue;
            };
            let bufs = &*source(&s.bufs, &s.owned);
            while *off < s.len && ch.room_for(s.dest) {
                let end = (*off + chunk).min(s.len);
                let h = Header {
                    kind: DATA,
                    aux: *recv_id,
                    ..Header::default()
                };
                let at = (*off as u64).to_le_bytes();
                let status = match bufs {
                    Bufs::One(seg) => {
                        // SAFETY: the send buffer (or its copy) is lent for `len` bytes.
                        let data = unsafe { std::slice::from_raw_parts(seg.ptr.cast_const(), s.len) };
                        ch.send(s.dest, h, &[&at, &data[*off..end]])?
                    }
                    many => {
                        let mut parts = vec![&at[..]];
                        parts.extend(many.slices(*off, end - *off));
                        ch.send(s.dest, h, &parts)?
                    }
                };
                *off = end;
                if matches!(status, SendStatus::Queued(_)) {
                    break;
                }
            }
            if *off >= s.len {
                s.state = SState::WaitDone;
                self.pushing.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Moves every transfer of the LMT on: chooses strategies for matched receives,
    /// starts sends whose CTS came, and moves data.
    pub(super) fn drive_lmt<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        if self.retired.is_empty() && self.lmt_active.is_empty() {
            return Ok(());
        }
        let mut none = NoLmt;
        let lmt: &mut dyn Lmt = match ch.lmt() {
            Some(l) => l,
            None => &mut none,
        };
        for x in self.retired.drain(..) {
            lmt.end(&x);
        }
        let mut i = 0;
        while i < self.lmt_active.len() {
            let id = self.lmt_active[i];
            let after = match self.reqs.get_mut(&id) {
                Some(Req::Recv(rr)) => recv_step(lmt, id, rr),
                Some(Req::Send(s)) => send_step(lmt, s),
                None => After::default(),
            };
            if let Some((dest, kind, aux, payload)) = after.ctrl {
                self.ctrl(dest, kind, aux, &payload);
            }
            if after.forget {
                self.reqs.remove(&id);
            }
            if after.keep {
                i += 1;
            } else {
                self.lmt_active.swap_remove(i);
            }
        }
        Ok(())
    }

    /// Whether request `id` lent its pages to the peer in place, so that they cannot be
    /// given back (or copied and given back) until the peer answers.
    pub(super) fn holds_in_place(&self, id: u32) -> bool {
        match self.reqs.get(&id) {
            Some(Req::Send(s)) => match &s.state {
                SState::WaitCts => s.offered.has(Strategy::Cma),
                SState::Lmt { .. } | SState::WaitDone => {
                    s.owned.is_none() && s.used.is_some_and(Strategy::reads_in_place)
                }
                _ => false,
            },
            Some(Req::Recv(rr)) => matches!(
                &rr.state,
                RState::Rndv { stage: Stage::Lmt(x), .. } if x.strategy == Strategy::CmaPut
            ),
            None => false,
        }
    }

    /// Lets a request go: cancels, drains into nothing, or copies what a send still
    /// needs, so the buffer is never touched again. The caller has made sure the
    /// request does not hold its pages in place ([`Engine::holds_in_place`]).
    pub(crate) fn release(&mut self, id: u32) {
        let Some(req) = self.reqs.get_mut(&id) else { return };
        if req.is_done() {
            self.reqs.remove(&id);
            return;
        }
        match req {
            Req::Recv(rr) => {
                if matches!(rr.state, RState::Posted) {
                    self.posted.retain(|q| q.id != id);
                    self.reqs.remove(&id);
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
}

/// The LMT of a channel that has none: only chunks.
struct NoLmt;

impl Lmt for NoLmt {
    fn offer(&mut self, _: u32, _: &[Seg], _: usize, _: &mut Vec<u8>) -> Strategies {
        Strategies::CHUNKS
    }
    fn choose(&mut self, _: u32, _: usize, _: Strategies) -> Strategy {
        Strategy::Chunks
    }
    fn start_recv(
        &mut self,
        peer: u32,
        s: Strategy,
        _: &[u8],
        _: usize,
        _: usize,
        _: &[Seg],
        _: &mut Vec<u8>,
    ) -> Result<Xfer, LmtError> {
        Err(LmtError::BadCookie {
            peer,
            why: format!("{s} is not available on this channel"),
        })
    }
    fn start_send(&mut self, peer: u32, s: Strategy, _: &[u8], _: usize) -> Result<Xfer, LmtError> {
        Err(LmtError::BadCookie {
            peer,
            why: format!("{s} is not available on this channel"),
        })
    }
    unsafe fn progress(&mut self, _: &mut Xfer, _: &[Seg]) -> Result<bool, LmtError> {
        Ok(true)
    }
    fn end(&mut self, _: &Xfer) {}
    fn peer_terminated(&mut self, _: u32) {}
}

/// A CTS payload.
fn cts(recv_id: u32, strategy: Strategy, cookie: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + cookie.len());
    p.extend_from_slice(&recv_id.to_le_bytes());
    p.push(strategy as u8);
    p.extend_from_slice(cookie);
    p
}

/// One step of a matched large receive.
fn recv_step(lmt: &mut dyn Lmt, id: u32, rr: &mut RecvReq) -> After {
    let RState::Rndv {
        peer,
        send_id,
        total,
        stage,
    } = &mut rr.state
    else {
        return After::default();
    };
    let (peer, send_id, total) = (*peer, *send_id, *total);
    let rank = rr.comm.rank_of(peer).unwrap_or(peer);
    // Completes the receive (with `err`, if any) and tells the sender so.
    let done = |rr: &mut RecvReq, err: Option<LmtError>| {
        let status = if err.is_some() { FAILED } else { OK };
        if let Some(e) = err {
            rr.result = Some(Err(P2pError::Transfer { rank, source: e }));
        }
        rr.state = RState::Done;
        After {
            ctrl: Some((peer, DONE, send_id, vec![status])),
            forget: rr.detached,
            ..After::default()
        }
    };
    let chunks = |stage: &mut Stage| {
        *stage = Stage::Chunks { got: 0 };
        After {
            ctrl: Some((peer, CTS, send_id, cts(id, Strategy::Chunks, &[]))),
            ..After::default()
        }
    };
    match stage {
        Stage::Choose { offered, cookie } => {
            let strategy = if rr.detached {
                Strategy::Chunks
            } else {
                lmt.choose(peer, total, *offered)
            };
            if strategy == Strategy::Chunks || !offered.has(strategy) {
                return chunks(stage);
            }
            let mut reply = Vec::new();
            match lmt.start_recv(peer, strategy, cookie, total, rr.cap, rr.bufs.segs(), &mut reply) {
                Ok(x) => {
                    let mode = strategy.mode();
                    *stage = Stage::Lmt(x);
                    After {
                        // A put waits for FIN; the others move data from the next chores.
                        keep: mode != Mode::Put,
                        ctrl: (mode != Mode::Get).then(|| (peer, CTS, send_id, cts(id, strategy, &reply))),
                        forget: false,
                    }
                }
                Err(e) => done(rr, Some(e)),
            }
        }
        Stage::Lmt(x) => {
            let r = if rr.detached && x.strategy.mode() == Mode::Get {
                // Let go: stop reading; the sender only waits for DONE.
                Ok(true)
            } else {
                // SAFETY: the receive buffer is lent (see `Bufs`), or empty once released.
                unsafe { lmt.progress(x, rr.bufs.segs()) }
            };
            match r {
                Ok(false) => After::KEEP,
                Ok(true) => {
                    lmt.end(x);
                    done(rr, None)
                }
                Err(LmtError::NotPermitted { .. }) if x.done == 0 && x.strategy == Strategy::Cma => {
                    // Refused before anything moved: chunks instead.
                    lmt.end(x);
                    chunks(stage)
                }
                Err(e) => {
                    lmt.end(x);
                    done(rr, Some(e))
                }
            }
        }
        Stage::Chunks { .. } => After::default(),
    }
}

/// One step of a large send that the LMT carries.
fn send_step(lmt: &mut dyn Lmt, s: &mut SendReq) -> After {
    let rank = s.comm.rank_of(s.dest).unwrap_or(s.dest);
    // Completes the send (with `err`, if any) and tells the receiver so.
    let done = |s: &mut SendReq, recv_id: u32, err: Option<LmtError>| {
        let status = if err.is_some() { FAILED } else { OK };
        if let Some(e) = err {
            s.result = Some(Err(P2pError::Transfer { rank, source: e }));
        }
        s.state = SState::Done;
        s.owned = None;
        After {
            ctrl: Some((s.dest, FIN, recv_id, vec![status])),
            forget: s.detached,
            ..After::default()
        }
    };
    match &mut s.state {
        SState::Cts {
            recv_id,
            strategy,
            cookie,
        } => {
            let recv_id = *recv_id;
            match lmt.start_send(s.dest, *strategy, cookie, s.len) {
                Ok(x) => {
                    s.state = SState::Lmt { recv_id, x };
                    After::KEEP
                }
                Err(e) => done(s, recv_id, Some(e)),
            }
        }
        SState::Lmt { recv_id, x } => {
            let recv_id = *recv_id;
            let src = source(&s.bufs, &s.owned);
            // SAFETY: the send buffer (or its copy) is lent for the whole transfer.
            match unsafe { lmt.progress(x, src.segs()) } {
                Ok(false) => After::KEEP,
                Ok(true) => {
                    lmt.end(x);
                    if x.strategy.mode() == Mode::Put {
                        done(s, recv_id, None)
                    } else {
                        s.state = SState::WaitDone;
                        After::default()
                    }
                }
                Err(e) => {
                    lmt.end(x);
                    done(s, recv_id, Some(e))
                }
            }
        }
        _ => After::default(),
    }
}

impl<C: Channel> World<C> {
    /// Starts a send of the `len` bytes in `bufs`: eager sends are complete on return
    /// (`None`); large ones return the request to wait for, whose buffer must stay lent
    /// until it completes.
    pub(crate) fn start_send_bufs(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        bufs: Bufs,
        len: usize,
    ) -> Result<Option<u32>, P2pError> {
        let d = comm.world_of(dest)?;
        if len
            <= self
                .eager_to
                .get(d as usize)
                .copied()
                .unwrap_or(self.cfg.eager_limit)
        {
            let h = Header {
                kind: super::engine::EAGER,
                context: ctx,
                tag,
                aux: 0,
                flags: 0,
            };
            match &bufs {
                Bufs::One(s) if !s.ptr.is_null() => {
                    // SAFETY: the caller lends the buffer for this call.
                    let data = unsafe { std::slice::from_raw_parts(s.ptr.cast_const(), s.len) };
                    self.ch.send_bytes(d, h, data)?
                }
                b => self.ch.send(d, h, &b.slices(0, len))?,
            };
            return Ok(None);
        }
        let id = self.eng.new_id();
        let mut rts = Vec::with_capacity(9);
        rts.extend_from_slice(&(len as u64).to_le_bytes());
        rts.push(0);
        let mut offered = match self.ch.lmt() {
            Some(l) => l.offer(d, bufs.segs(), len, &mut rts),
            None => Strategies::CHUNKS,
        };
        if rts.len() > self.ch.max_payload() {
            // Too many pieces to describe in one packet: no reading in place.
            offered = offered.without(Strategy::Cma);
            rts.truncate(9);
        }
        rts[8] = offered.0;
        self.eng.reqs.insert(
            id,
            Req::Send(SendReq {
                bufs,
                len,
                dest: d,
                comm: comm.clone(),
                state: SState::WaitCts,
                offered,
                used: None,
                owned: None,
                result: Some(Ok(Status {
                    source: dest,
                    tag,
                    len,
                })),
                detached: false,
            }),
        );
        let h = Header {
            kind: RTS,
            context: ctx,
            tag,
            aux: id,
            flags: 0,
        };
        if let Err(e) = self.ch.send_bytes(d, h, &rts) {
            self.eng.reqs.remove(&id);
            return Err(e.into());
        }
        Ok(Some(id))
    }

    /// Lets request `id` go (see [`Engine::release`]). A request whose pages the peer
    /// reads or writes in place is first made safe: a send that offered them asks the
    /// receiver to revoke the offer, and either waits for the answer, or for the
    /// transfer to end, whichever comes first; a receive being written waits for the
    /// writer. A dead peer ends the wait.
    pub(crate) fn release(&mut self, id: u32) {
        if self.eng.holds_in_place(id) {
            if let Some(Req::Send(s)) = self.eng.reqs.get(&id)
                && matches!(s.state, SState::WaitCts)
            {
                let h = Header {
                    kind: REVOKE,
                    aux: id,
                    ..Header::default()
                };
                let dest = s.dest;
                if let Err(e) = self.ch.send_bytes(dest, h, &[]) {
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

impl<C: Channel> World<C> {
    /// Sends the concatenation of `bufs` to rank `dest` of `comm` with `tag`, without
    /// packing it first where the transfer allows (CMA reads the pieces in place).
    pub fn send_iov(
        &mut self,
        comm: &super::Comm,
        dest: u32,
        tag: i32,
        bufs: &[&[u8]],
    ) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?.clone();
        Self::check_tag(tag)?;
        let segs: Box<[Seg]> = bufs.iter().map(|b| Seg::of(b)).collect();
        let len = segs.iter().map(|s| s.len).sum();
        match self.start_send_bufs(&c, dest, tag, c.ctx, Bufs::Many(segs), len)? {
            None => Ok(()),
            Some(id) => self.block_on(id).map(|_| ()),
        }
    }

    /// Receives a message from `src` with `tag` into the slices of `bufs` in turn,
    /// without an intermediate buffer where the transfer allows.
    pub fn recv_iov(
        &mut self,
        comm: &super::Comm,
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
        let id = self.start_recv(&c, src.into(), tag, c.ctx, Bufs::Many(segs), len)?;
        self.block_on(id)
    }
}
