//! The rendezvous of large messages, and the large-message transfer (LMT) it drives: the
//! sub-state that owns the lists of transfers under way, and the steps that move them.
//! See `wire.rs` for the packets.

use super::requests::{Bufs, RState, RecvReq, Req, Requests, SState, SendReq, Stage};
use super::wire::{self, CTS, DATA, DONE, FAILED, FIN, OK, Rts, ctrl};
use super::{P2pError, Status};
use crate::channel::{Channel, ChannelError, Header, SendStatus};
use crate::progress::Outbox;
use nemesis_lmt::{Lmt, LmtError, Mode, Seg, Strategies, Strategy, Xfer};

/// Most bytes of chunks one call to progress pushes. A receiver that drains as fast as
/// the sender pushes leaves the channel room forever, and the call would not return
/// before the whole message had gone: its caller's other requests, its failure checks
/// and its `test` would wait for all of it.
const PUSH_BUDGET: usize = 4 << 20;

/// The transfers under way.
#[derive(Debug, Default)]
pub(crate) struct Rndv {
    /// Sends that may push chunks.
    pushing: Vec<u32>,
    /// Requests with LMT work to do at the next chores (choose, start, move data).
    lmt_active: Vec<u32>,
    /// Transfers that ended while handling a packet, to hand back to the LMT.
    retired: Vec<Xfer>,
    /// Requests in a rendezvous (matched, or answered by a CTS), pruned as they finish:
    /// while any is, a blocked call keeps polling rather than sleep.
    moving: Vec<u32>,
}

/// What one step of a transfer leaves to do once the request is no longer borrowed.
#[derive(Default)]
struct After {
    keep: bool,
    ctrl: Option<(u32, u16, u32, Vec<u8>)>,
}

impl After {
    /// More to do at the next chores, nothing to send now.
    const KEEP: After = After {
        keep: true,
        ctrl: None,
    };
}

/// What a send moves from: its buffer, or the copy it took when it was let go.
fn source<'a>(bufs: &'a Bufs, owned: &'a Option<Vec<u8>>) -> std::borrow::Cow<'a, Bufs> {
    match owned {
        Some(v) => std::borrow::Cow::Owned(Bufs::One(Seg::of(v))),
        None => std::borrow::Cow::Borrowed(bufs),
    }
}

impl Rndv {
    /// Whether work is queued for the next chores.
    pub(crate) fn has_chores(&self) -> bool {
        !self.pushing.is_empty() || !self.lmt_active.is_empty() || !self.retired.is_empty()
    }

    /// Whether a large message is being moved, so a blocked call keeps polling (pausing
    /// between polls) rather than sleep: data that moves without packets arriving needs
    /// it, and the peer's next step is answered without a wake-up's delay, which can cost
    /// as much as moving a megabyte. A send still waiting for its receiver to match it
    /// does not count: that may take any time.
    pub(crate) fn busy(&mut self, reqs: &Requests) -> bool {
        if !self.lmt_active.is_empty() || !self.pushing.is_empty() {
            return true;
        }
        self.moving.retain(|&id| !reqs.finished(id));
        !self.moving.is_empty()
    }

    /// Accepts a matched RTS for receive `id` (already in `reqs`): an empty message is
    /// done at once, one that only chunks can carry is cleared to send, and the rest wait
    /// for the chores to choose a strategy.
    pub(crate) fn accept(
        &mut self,
        reqs: &mut Requests,
        out: &mut Outbox,
        id: u32,
        peer: u32,
        rts: Rts,
        tag: i32,
    ) {
        let Some(Req::Recv(rr)) = reqs.get_mut(id) else {
            return;
        };
        let source = rr.comm.rank_of(peer).unwrap_or(peer);
        let Rts {
            send_id,
            total,
            offered,
            cookie,
        } = rts;
        rr.result = Some(if total > rr.cap {
            Err(Box::new(P2pError::Truncated {
                message_len: total,
                buffer_len: rr.cap,
            }))
        } else {
            Ok(Status {
                source,
                tag,
                len: total,
            })
        });
        if total == 0 {
            rr.state = RState::Done;
            out.push(peer, ctrl(DONE, send_id), &[OK]);
            reqs.settle(id);
            return;
        }
        let stage = if offered == Strategies::CHUNKS {
            out.push(peer, ctrl(CTS, send_id), &wire::cts(id, Strategy::Chunks, &[]));
            Stage::Chunks { got: 0 }
        } else {
            self.lmt_active.push(id);
            Stage::Choose { offered, cookie }
        };
        rr.state = RState::Rndv {
            peer,
            send_id,
            total,
            stage,
        };
        self.moving.push(id);
    }

    pub(crate) fn on_cts(
        &mut self,
        reqs: &mut Requests,
        src: u32,
        send_id: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let (recv_id, strategy, cookie) = wire::parse_cts(payload)?;
        match reqs.get_mut(send_id) {
            Some(Req::Send(s)) if s.dest == src && matches!(s.state, SState::WaitCts) => {
                // A CTS means the receiver does not read by RDMA: the registration
                // the offer holds for that can go.
                self.retired.extend(s.held.take().map(|h| *h));
                if strategy == Strategy::Chunks {
                    s.state = SState::Push { recv_id, off: 0 };
                    self.pushing.push(send_id);
                } else if s.offered.has(strategy) && strategy.mode() != Mode::Get {
                    s.state = SState::Cts {
                        recv_id,
                        strategy,
                        cookie: cookie.to_vec(),
                    };
                    self.lmt_active.push(send_id);
                } else {
                    return Err(format!("a CTS choosing {strategy}, which was not offered"));
                }
                s.used = Some(strategy);
                self.moving.push(send_id);
                Ok(())
            }
            _ => Err(format!("a CTS for send {send_id}, which is not waiting for one")),
        }
    }

    pub(crate) fn on_data(
        &mut self,
        reqs: &mut Requests,
        out: &mut Outbox,
        src: u32,
        recv_id: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let (off, data) = wire::parse_data(payload)?;
        let Some(Req::Recv(rr)) = reqs.get_mut(recv_id) else {
            return Err(format!("DATA for receive {recv_id}, which does not exist"));
        };
        let RState::Rndv {
            peer,
            send_id,
            total,
            stage: Stage::Chunks { got },
        } = &mut rr.state
        else {
            return Err(format!(
                "DATA for receive {recv_id}, which is not receiving chunks"
            ));
        };
        let end = off.checked_add(data.len() as u64);
        if *peer != src || end.is_none_or(|e| e > *total as u64) {
            return Err(format!(
                "DATA at {off}+{} beyond a message of {total}",
                data.len()
            ));
        }
        // SAFETY: the buffer is lent (see `Bufs`); `write_at` stays inside it.
        unsafe { rr.bufs.write_at(off as usize, data) };
        *got += data.len();
        if *got >= *total {
            let (peer, send_id) = (*peer, *send_id);
            rr.state = RState::Done;
            out.push(peer, ctrl(DONE, send_id), &[OK]);
            reqs.settle(recv_id);
        }
        Ok(())
    }

    pub(crate) fn on_done(
        &mut self,
        reqs: &mut Requests,
        src: u32,
        send_id: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let status = wire::status(payload);
        match reqs.get_mut(send_id) {
            Some(Req::Send(s)) if s.dest == src && !matches!(s.state, SState::Done) => {
                if let SState::Lmt { x, .. } = std::mem::replace(&mut s.state, SState::Done) {
                    self.retired.push(*x);
                }
                self.retired.extend(s.held.take().map(|h| *h));
                // A send whose own part failed (split) keeps its own error.
                if status != OK && !s.result.as_ref().is_some_and(Result::is_err) {
                    s.result = Some(Err(Box::new(P2pError::RemoteTransfer {
                        rank: s.comm.rank_of(src).unwrap_or(src),
                    })));
                }
                s.owned = None;
                reqs.settle(send_id);
                Ok(())
            }
            // Both sides failed at once: ours is already reported.
            _ if status != OK => Ok(()),
            _ => Err(format!("DONE for send {send_id}, which is not waiting for one")),
        }
    }

    pub(crate) fn on_fin(
        &mut self,
        reqs: &mut Requests,
        src: u32,
        recv_id: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let status = wire::status(payload);
        match reqs.get_mut(recv_id) {
            Some(Req::Recv(rr)) if matches!(rr.state, RState::Rndv { peer, .. } if peer == src) => {
                // A split transfer: the sender's part is done, and the receive completes
                // at the chores once its own part is (the chores answer DONE then).
                if let RState::Rndv {
                    stage: Stage::Lmt(x), ..
                } = &mut rr.state
                    && x.strategy.mode() == Mode::Split
                {
                    x.peer_finished();
                    if status != OK {
                        x.give_up_own_part();
                        rr.result = Some(Err(Box::new(P2pError::RemoteTransfer {
                            rank: rr.comm.rank_of(src).unwrap_or(src),
                        })));
                    }
                    return Ok(());
                }
                if let RState::Rndv {
                    stage: Stage::Lmt(x), ..
                } = std::mem::replace(&mut rr.state, RState::Done)
                {
                    self.retired.push(*x);
                }
                if status != OK {
                    rr.result = Some(Err(Box::new(P2pError::RemoteTransfer {
                        rank: rr.comm.rank_of(src).unwrap_or(src),
                    })));
                }
                reqs.settle(recv_id);
                Ok(())
            }
            _ if status != OK => Ok(()),
            _ => Err(format!("FIN for receive {recv_id}, which is not receiving")),
        }
    }

    /// Takes the in-place offer (CMA, RDMA) out of `src`'s send `send_id` if a receive
    /// matched it but has not chosen yet; says whether it did.
    pub(crate) fn revoke_unchosen(&mut self, reqs: &mut Requests, src: u32, send_id: u32) -> bool {
        for req in reqs.values_mut() {
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
                *offered = offered.without_in_place();
                cookie.clear();
                return true;
            }
        }
        false
    }

    /// The receiver of `send_id` will not read its pages in place.
    pub(crate) fn on_revoked(&mut self, reqs: &mut Requests, src: u32, send_id: u32) {
        if let Some(Req::Send(s)) = reqs.get_mut(send_id)
            && s.dest == src
        {
            s.offered = s.offered.without_in_place();
            self.retired.extend(s.held.take().map(|h| *h));
        }
    }

    /// Pushes chunks of accepted large messages while the channel has room, up to
    /// [`PUSH_BUDGET`] bytes; what is left goes at the next call.
    pub(crate) fn push<C: Channel>(&mut self, reqs: &mut Requests, ch: &mut C) -> Result<(), ChannelError> {
        let mut budget = PUSH_BUDGET;
        let mut i = 0;
        while i < self.pushing.len() && budget > 0 {
            let id = self.pushing[i];
            let Some(Req::Send(s)) = reqs.get_mut(id) else {
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
            while *off < s.len && budget > 0 && ch.room_for(s.dest) {
                let end = (*off + chunk).min(s.len);
                budget = budget.saturating_sub(end - *off);
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
    /// starts sends whose CTS came, and moves data. Control packets go to `out`.
    pub(crate) fn drive<C: Channel>(&mut self, reqs: &mut Requests, ch: &mut C, out: &mut Outbox) {
        if self.retired.is_empty() && self.lmt_active.is_empty() {
            return;
        }
        let mut routes = ch.lmt();
        let lmt: &mut dyn Lmt = &mut routes;
        for x in self.retired.drain(..) {
            lmt.end(&x);
        }
        let mut i = 0;
        while i < self.lmt_active.len() {
            let id = self.lmt_active[i];
            let after = match reqs.get_mut(id) {
                Some(Req::Recv(rr)) => recv_step(lmt, id, rr),
                Some(Req::Send(s)) => send_step(lmt, s),
                None => After::default(),
            };
            if let Some((dest, kind, aux, payload)) = after.ctrl {
                out.push(dest, ctrl(kind, aux), &payload);
            }
            reqs.settle(id);
            if after.keep {
                i += 1;
            } else {
                self.lmt_active.swap_remove(i);
            }
        }
    }
}

/// Whether request `r` lent its pages to the peer in place, so that they cannot be given
/// back (or copied and given back) until the peer answers.
pub(crate) fn holds_in_place(r: &Req) -> bool {
    match r {
        Req::Send(s) => match &s.state {
            SState::WaitCts => s.offered.has_in_place(),
            // A split transfer's receiver reads from its CTS on.
            SState::Cts { strategy, .. } => s.owned.is_none() && strategy.reads_in_place(),
            SState::Lmt { .. } | SState::WaitDone => {
                s.owned.is_none() && s.used.is_some_and(Strategy::reads_in_place)
            }
            _ => false,
        },
        // The peer writes these pages, or the card does.
        Req::Recv(rr) => matches!(
            &rr.state,
            RState::Rndv { stage: Stage::Lmt(x), .. }
                if matches!(x.strategy, Strategy::CmaPut | Strategy::Rdma | Strategy::CmaSplit)
        ),
    }
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
    // Completes the receive (with `err`, if any) and tells the sender so. A split
    // transfer whose own part failed earlier (its error already in the result) says so
    // too; a truncated receive does not.
    let done = |rr: &mut RecvReq, err: Option<LmtError>, split_failed: bool| {
        let status = if err.is_some() || split_failed { FAILED } else { OK };
        if let Some(e) = err {
            rr.result = Some(Err(Box::new(P2pError::Transfer { rank, source: e })));
        }
        rr.state = RState::Done;
        After {
            ctrl: Some((peer, DONE, send_id, vec![status])),
            ..After::default()
        }
    };
    let chunks = |stage: &mut Stage| {
        *stage = Stage::Chunks { got: 0 };
        After {
            ctrl: Some((peer, CTS, send_id, wire::cts(id, Strategy::Chunks, &[]))),
            ..After::default()
        }
    };
    match stage {
        Stage::Choose { offered, cookie } => {
            let strategy = if rr.detached {
                Strategy::Chunks
            } else {
                lmt.choose(peer, total, *offered, cookie, rr.bufs.segs())
            };
            if strategy == Strategy::Chunks || !offered.has(strategy) {
                return chunks(stage);
            }
            let mut reply = Vec::new();
            match lmt.start_recv(peer, strategy, cookie, total, rr.cap, rr.bufs.segs(), &mut reply) {
                // Refused before anything moved (memory that cannot be registered):
                // chunks instead.
                Err(LmtError::NotPermitted { .. }) => chunks(stage),
                Ok(x) => {
                    // The LMT may read a split transfer whole instead (`cma`).
                    let (strategy, mode) = (x.strategy, x.strategy.mode());
                    *stage = Stage::Lmt(Box::new(x));
                    After {
                        // A put waits for FIN; the others move data from the next chores.
                        keep: mode != Mode::Put,
                        ctrl: (mode != Mode::Get)
                            .then(|| (peer, CTS, send_id, wire::cts(id, strategy, &reply))),
                    }
                }
                Err(e) => done(rr, Some(e), false),
            }
        }
        Stage::Lmt(x) => {
            let split = x.strategy.mode() == Mode::Split;
            let r = if rr.detached && x.strategy == Strategy::Cma {
                // Let go: stop reading; the sender only waits for DONE. (An RDMA read
                // let go is given an empty buffer: it waits for the reads in flight.)
                Ok(true)
            } else if rr.detached && split {
                // Let go: stop reading, take every chunk the sender has not (moving none),
                // and wait for its FIN if it took any, as it may be writing into the
                // buffer.
                x.give_up_own_part();
                // SAFETY: an empty list: nothing is read.
                unsafe { lmt.progress(x, &[]) }
            } else {
                // SAFETY: the receive buffer is lent (see `Bufs`), or empty once released.
                unsafe { lmt.progress(x, rr.bufs.segs()) }
            };
            match r {
                Ok(false) => After::KEEP,
                Ok(true) => {
                    lmt.end(x);
                    let failed = split && rr.result.as_ref().is_some_and(Result::is_err);
                    done(rr, None, failed)
                }
                Err(LmtError::NotPermitted { .. }) if x.done == 0 && x.strategy == Strategy::Cma => {
                    // Refused before anything moved: chunks instead.
                    lmt.end(x);
                    chunks(stage)
                }
                Err(e) if split => {
                    // The sender may still be writing into the buffer: the receive fails
                    // once it has said it is done.
                    rr.result = Some(Err(Box::new(P2pError::Transfer { rank, source: e })));
                    x.give_up_own_part();
                    After::KEEP
                }
                Err(e) => {
                    lmt.end(x);
                    done(rr, Some(e), false)
                }
            }
        }
        Stage::Chunks { .. } => After::default(),
    }
}

/// One step of a large send that the LMT carries.
fn send_step(lmt: &mut dyn Lmt, s: &mut SendReq) -> After {
    let rank = s.comm.rank_of(s.dest).unwrap_or(s.dest);
    // Completes the send (with `err`, if any) and tells the receiver so; a split
    // transfer then waits for DONE, as its receiver may still be reading the buffer.
    let done = |s: &mut SendReq, recv_id: u32, err: Option<LmtError>, split: bool| {
        let status = if err.is_some() { FAILED } else { OK };
        if let Some(e) = err {
            s.result = Some(Err(Box::new(P2pError::Transfer { rank, source: e })));
        }
        if split {
            s.state = SState::WaitDone;
        } else {
            s.state = SState::Done;
            s.owned = None;
        }
        After {
            ctrl: Some((s.dest, FIN, recv_id, vec![status])),
            ..After::default()
        }
    };
    match &mut s.state {
        SState::Cts {
            recv_id,
            strategy,
            cookie,
        } => {
            let (recv_id, split) = (*recv_id, strategy.mode() == Mode::Split);
            match lmt.start_send(s.dest, *strategy, cookie, s.len) {
                Ok(x) => {
                    s.state = SState::Lmt {
                        recv_id,
                        x: Box::new(x),
                    };
                    After::KEEP
                }
                Err(e) => done(s, recv_id, Some(e), split),
            }
        }
        SState::Lmt { recv_id, x } => {
            let (recv_id, split) = (*recv_id, x.strategy.mode() == Mode::Split);
            let src = source(&s.bufs, &s.owned);
            // SAFETY: the send buffer (or its copy) is lent for the whole transfer.
            match unsafe { lmt.progress(x, src.segs()) } {
                Ok(false) => After::KEEP,
                Ok(true) => {
                    lmt.end(x);
                    if split && x.took_no_chunk() {
                        // The receiver took every chunk: nothing written, no FIN.
                        s.state = SState::WaitDone;
                        After::default()
                    } else if matches!(x.strategy.mode(), Mode::Put | Mode::Split) {
                        done(s, recv_id, None, split)
                    } else {
                        s.state = SState::WaitDone;
                        After::default()
                    }
                }
                Err(e) => {
                    lmt.end(x);
                    done(s, recv_id, Some(e), split)
                }
            }
        }
        _ => After::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Packet, Rank, SendTicket};
    use crate::p2p::comm::ReqComm;
    use crate::p2p::requests::Holder;
    use std::time::Duration;

    /// A channel with room for everything, as a receiver that keeps pace leaves it;
    /// it counts the bytes of data sent.
    #[derive(Default)]
    struct Bottomless {
        data: usize,
    }

    impl Channel for Bottomless {
        fn rank(&self) -> Rank {
            0
        }
        fn size(&self) -> u32 {
            2
        }
        fn is_local(&self, _: Rank) -> bool {
            true
        }
        fn max_payload(&self) -> usize {
            32 << 10
        }
        fn send(&mut self, _: Rank, h: Header, parts: &[&[u8]]) -> Result<SendStatus, ChannelError> {
            assert_eq!(h.kind, DATA);
            // The first part is the offset.
            self.data += parts[1..].iter().map(|p| p.len()).sum::<usize>();
            Ok(SendStatus::Sent)
        }
        fn is_sent(&self, _: SendTicket) -> bool {
            true
        }
        fn pending(&self) -> usize {
            0
        }
        fn poll<F: FnMut(Packet<'_>)>(&mut self, _: F) -> Result<usize, ChannelError> {
            Ok(0)
        }
        fn wait(&mut self, _: Option<Duration>) -> Result<(), ChannelError> {
            Ok(())
        }
        fn check_peer(&self, _: Rank) -> Result<(), ChannelError> {
            Ok(())
        }
        fn flush(&mut self, _: Duration) -> Result<(), ChannelError> {
            Ok(())
        }
    }

    #[test]
    fn one_push_sends_at_most_its_budget_and_the_next_goes_on() {
        let mut ch = Bottomless::default();
        let chunk = ch.max_payload();
        // More than three calls can push, each at most a chunk past the budget.
        let len = 3 * (PUSH_BUDGET + chunk) + 1000;
        let data = vec![5u8; len];
        let mut reqs = Requests::default();
        let id = reqs
            .insert(Req::Send(SendReq {
                bufs: Bufs::One(Seg::of(&data)),
                len,
                dest: 1,
                comm: ReqComm::Identity,
                state: SState::Push { recv_id: 9, off: 0 },
                offered: Strategies::CHUNKS,
                used: Some(Strategy::Chunks),
                held: None,
                owned: None,
                result: None,
                detached: false,
                holder: Holder::Call,
            }))
            .unwrap();
        let mut rndv = Rndv {
            pushing: vec![id],
            ..Rndv::default()
        };
        let mut calls = 0;
        while rndv.has_chores() {
            let before = ch.data;
            rndv.push(&mut reqs, &mut ch).unwrap();
            let sent = ch.data - before;
            assert!(sent <= PUSH_BUDGET + chunk, "call {calls} pushed {sent} bytes");
            calls += 1;
            assert!(calls <= 4, "the budget held back more than it should");
        }
        assert_eq!(ch.data, len, "every byte went");
        assert_eq!(calls, 4, "three full budgets and the rest");
        assert!(matches!(
            reqs.get(id),
            Some(Req::Send(SendReq {
                state: SState::WaitDone,
                ..
            }))
        ));
    }
}
