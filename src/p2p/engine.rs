//! The matching engine: posted and unexpected queues, requests, the eager and
//! rendezvous protocols, and progress.

use super::comm::{Comm, CommInner};
use super::node::NodeColl;
use super::{Config, Locality, P2pError, Status};
use crate::channel::{Channel, Header, Packet, SendStatus, ShmChannel, WaitPolicy};
use nemesis_shm::Segment;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packet kinds of the two-sided protocol.
pub(crate) const EAGER: u16 = 0x101;
pub(crate) const RTS: u16 = 0x102;
pub(crate) const CTS: u16 = 0x103;
pub(crate) const DATA: u16 = 0x104;
pub(crate) const DONE: u16 = 0x105;

/// How a large message moves, named in its RTS.
const STRATEGY_CHUNKS: u8 = 0;

/// Polls a blocked operation makes back to back before it waits the channel's way
/// (spinning on readiness, yielding, sleeping): a reply that comes within a few
/// microseconds is picked up without a clock read or a readiness check on the way.
const TIGHT_POLLS: u32 = 256;

/// A buffer address a request lent to the engine.
///
/// The engine dereferences it only while the buffer is lent: during a blocking call that
/// borrows it, or within the scope of the request that borrows it, which clears the
/// address (cancelling or copying) before the borrow can end. See `scope.rs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ptr(pub *mut u8);
// SAFETY: the engine lives inside a World, which a scope borrows mutably for as long as
// any lent address exists, so the World cannot move to another thread while one does.
unsafe impl Send for Ptr {}

#[derive(Debug)]
struct Posted {
    id: u32,
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
}

#[derive(Debug)]
enum Body {
    Eager(Vec<u8>),
    Rts { send_id: u32, total: usize },
}

#[derive(Debug)]
struct Unexpected {
    src: u32,
    ctx: u32,
    tag: i32,
    body: Body,
}

impl Unexpected {
    fn len(&self) -> usize {
        match &self.body {
            Body::Eager(d) => d.len(),
            Body::Rts { total, .. } => *total,
        }
    }
}

/// A control packet produced while handling another, sent once the poll returns.
#[derive(Debug, Clone, Copy)]
struct Ctrl {
    dest: u32,
    header: Header,
    payload: [u8; 8],
    len: u8,
}

#[derive(Debug)]
pub(crate) enum RState {
    /// In the posted queue.
    Posted,
    /// Matched to a large message whose chunks are arriving.
    Rndv {
        peer: u32,
        send_id: u32,
        total: usize,
        got: usize,
    },
    /// Complete; the result is in `result`.
    Done,
}

#[derive(Debug)]
pub(crate) enum SState {
    /// RTS sent; waiting for the receiver to match it.
    WaitCts,
    /// Pushing chunks from `off`.
    Push { recv_id: u32, off: usize },
    /// Everything sent; waiting for DONE.
    WaitDone,
    /// Complete.
    Done,
}

#[derive(Debug)]
pub(crate) struct RecvReq {
    pub buf: Ptr,
    pub cap: usize,
    pub comm: Arc<CommInner>,
    pub src: Option<u32>,
    pub state: RState,
    pub result: Option<Result<Status, P2pError>>,
    /// The request was let go: drain into nothing, and forget it when done.
    pub detached: bool,
}

#[derive(Debug)]
pub(crate) struct SendReq {
    pub buf: Ptr,
    pub len: usize,
    pub dest: u32,
    pub comm: Arc<CommInner>,
    pub state: SState,
    /// The remaining data, copied when the request was let go.
    pub owned: Option<Vec<u8>>,
    pub result: Option<Result<Status, P2pError>>,
    pub detached: bool,
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
}

/// What a [`Fresh`] receive found: the sender's world rank, the tag and the length.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// An eager message, copied into the buffer.
    Eager { src: u32, tag: i32, len: usize },
    /// An RTS: `send_id` names the sender's request.
    Rts {
        src: u32,
        tag: i32,
        len: usize,
        send_id: u32,
    },
}

/// Matches any source in a [`Fresh`] receive; world ranks are below it.
const FRESH_ANY_SRC: u32 = u32::MAX;
/// Matches any tag in a [`Fresh`] receive; tags are not negative.
const FRESH_ANY_TAG: i32 = -1;

/// A blocking `recv` with nothing else posted, offered each fresh packet first.
struct Fresh<'b> {
    ctx: u32,
    src: u32,
    tag: i32,
    buf: &'b mut [u8],
    found: Option<Found>,
}

impl Fresh<'_> {
    /// Takes `p` if it is the first that matches; hands anything else to the engine.
    #[inline(always)]
    fn offer(&mut self, eng: &mut Engine, p: Packet<'_>) {
        let h = p.header;
        if self.found.is_none()
            && (h.kind == EAGER || h.kind == RTS)
            && h.context == self.ctx
            && (self.src == FRESH_ANY_SRC || self.src == p.src)
            && (self.tag == FRESH_ANY_TAG || self.tag == h.tag)
        {
            if h.kind == EAGER {
                let n = p.payload.len().min(self.buf.len());
                nemesis_shm::region::copy_into(&mut self.buf[..n], &p.payload[..n]);
                self.found = Some(Found::Eager {
                    src: p.src,
                    tag: h.tag,
                    len: p.payload.len(),
                });
            } else if let Some(len) = eng.parse_rts(p.src, p.payload) {
                self.found = Some(Found::Rts {
                    src: p.src,
                    tag: h.tag,
                    len,
                    send_id: h.aux,
                });
            }
            return;
        }
        eng.handle(p.src, h, p.payload)
    }
}

/// The clock of a blocked operation: polls back to back first, then waits and checks
/// peers now and then.
struct Idle {
    polls: u32,
    last_check: Option<Instant>,
}

impl Idle {
    const fn new() -> Self {
        Self {
            polls: 0,
            last_check: None,
        }
    }
}

/// The engine's state apart from the channel, so both can be borrowed at once.
#[derive(Debug)]
pub(crate) struct Engine {
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
    pub(crate) reqs: HashMap<u32, Req>,
    next_id: u32,
    outbox: Vec<Ctrl>,
    /// Sends that may push chunks.
    pushing: Vec<u32>,
    /// Detached requests, forgotten once complete.
    detached: Vec<u32>,
    fault: Option<P2pError>,
    /// Whether the outbox, the pushing list or the fault may hold something: one test
    /// after each poll instead of three.
    chores: bool,
}

#[inline(always)]
fn selected(ctx: u32, src: Option<u32>, tag: Option<i32>, p_ctx: u32, p_src: u32, p_tag: i32) -> bool {
    ctx == p_ctx && src.is_none_or(|s| s == p_src) && tag.is_none_or(|t| t == p_tag)
}

impl Engine {
    fn new() -> Self {
        Self {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            reqs: HashMap::new(),
            next_id: 1,
            outbox: Vec::new(),
            pushing: Vec::new(),
            detached: Vec::new(),
            fault: None,
            chores: false,
        }
    }

    fn new_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.reqs.contains_key(&id) {
                return id;
            }
        }
    }

    fn fault(&mut self, rank: u32, what: impl Into<String>) {
        if self.fault.is_none() {
            self.fault = Some(P2pError::Protocol {
                rank,
                what: what.into(),
            });
            self.chores = true;
        }
    }

    fn ctrl(&mut self, dest: u32, kind: u16, aux: u32, word: Option<u32>) {
        let mut payload = [0u8; 8];
        let len = match word {
            Some(w) => {
                payload[..4].copy_from_slice(&w.to_le_bytes());
                4
            }
            None => 0,
        };
        self.outbox.push(Ctrl {
            dest,
            header: Header {
                kind,
                aux,
                ..Header::default()
            },
            payload,
            len,
        });
        self.chores = true;
    }

    /// Registers a receive of a large message that has been matched, and accepts it.
    fn accept_rts(&mut self, rr: RecvReq, peer: u32, send_id: u32, total: usize, tag: i32) -> u32 {
        let id = self.new_id();
        self.start_rndv(id, rr, peer, send_id, total, tag);
        id
    }

    fn start_rndv(&mut self, id: u32, mut rr: RecvReq, peer: u32, send_id: u32, total: usize, tag: i32) {
        let source = rr.comm.rank_of(peer).unwrap_or(peer);
        rr.state = RState::Rndv {
            peer,
            send_id,
            total,
            got: 0,
        };
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
            self.ctrl(peer, DONE, send_id, None);
        } else {
            self.ctrl(peer, CTS, send_id, Some(id));
        }
        self.reqs.insert(id, Req::Recv(rr));
    }

    /// Copies an eager payload into a receive buffer and completes the receive.
    fn deliver_eager(rr: &mut RecvReq, src: u32, tag: i32, data: &[u8]) {
        let n = data.len().min(rr.cap);
        if n > 0 && !rr.buf.0.is_null() {
            // SAFETY: the buffer is lent for `cap` bytes (see `Ptr`) and `n <= cap`.
            let dst = unsafe { std::slice::from_raw_parts_mut(rr.buf.0, n) };
            nemesis_shm::region::copy_into(dst, &data[..n]);
        }
        let source = rr.comm.rank_of(src).unwrap_or(src);
        rr.result = Some(if data.len() > rr.cap {
            Err(P2pError::Truncated {
                message_len: data.len(),
                buffer_len: rr.cap,
            })
        } else {
            Ok(Status {
                source,
                tag,
                len: data.len(),
            })
        });
        rr.state = RState::Done;
    }

    /// Handles one arrived packet (taken apart, so that it travels in registers).
    #[inline(never)]
    fn handle(&mut self, src: u32, h: Header, payload: &[u8]) {
        match h.kind {
            EAGER => self.on_eager(src, h.context, h.tag, payload),
            RTS => self.on_rts(src, h, payload),
            CTS => self.on_cts(src, h.aux, payload),
            DATA => self.on_data(src, h.aux, payload),
            DONE => self.on_done(src, h.aux),
            k => self.fault(src, format!("unknown packet kind {k:#x}")),
        }
    }

    #[inline]
    fn on_eager(&mut self, src: u32, ctx: u32, tag: i32, data: &[u8]) {
        if !self.posted.is_empty() {
            if let Some(i) = self
                .posted
                .iter()
                .position(|q| selected(q.ctx, q.src, q.tag, ctx, src, tag))
            {
                let q = self.posted.remove(i).expect("position is in range");
                if let Some(Req::Recv(rr)) = self.reqs.get_mut(&q.id) {
                    Self::deliver_eager(rr, src, tag, data);
                    if rr.detached {
                        self.reqs.remove(&q.id);
                    }
                }
                return;
            }
        }
        self.unexpected.push_back(Unexpected {
            src,
            ctx,
            tag,
            body: Body::Eager(data.to_vec()),
        });
    }

    /// The length an RTS announces, or `None` (and a fault) if it is malformed.
    fn parse_rts(&mut self, src: u32, payload: &[u8]) -> Option<usize> {
        let (Some(total), Some(&strategy)) = (
            payload
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
            payload.get(8),
        ) else {
            self.fault(src, "a short RTS");
            return None;
        };
        if strategy != STRATEGY_CHUNKS {
            self.fault(src, format!("an RTS with unknown strategy {strategy}"));
            return None;
        }
        let Ok(total) = usize::try_from(total) else {
            self.fault(src, "an RTS longer than this machine can address");
            return None;
        };
        Some(total)
    }

    fn on_rts(&mut self, src: u32, h: Header, payload: &[u8]) {
        let Some(total) = self.parse_rts(src, payload) else {
            return;
        };
        let (ctx, tag, send_id) = (h.context, h.tag, h.aux);
        if let Some(i) = self
            .posted
            .iter()
            .position(|q| selected(q.ctx, q.src, q.tag, ctx, src, tag))
        {
            let q = self.posted.remove(i).expect("position is in range");
            if let Some(Req::Recv(rr)) = self.reqs.remove(&q.id) {
                self.start_rndv(q.id, rr, src, send_id, total, tag);
            }
            return;
        }
        self.unexpected.push_back(Unexpected {
            src,
            ctx,
            tag,
            body: Body::Rts { send_id, total },
        });
    }

    fn on_cts(&mut self, src: u32, send_id: u32, payload: &[u8]) {
        let Some(recv_id) = payload
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        else {
            return self.fault(src, "a short CTS");
        };
        match self.reqs.get_mut(&send_id) {
            Some(Req::Send(s)) if s.dest == src && matches!(s.state, SState::WaitCts) => {
                s.state = SState::Push { recv_id, off: 0 };
                self.pushing.push(send_id);
                self.chores = true;
            }
            _ => self.fault(
                src,
                format!("a CTS for send {send_id}, which is not waiting for one"),
            ),
        }
    }

    fn on_data(&mut self, src: u32, recv_id: u32, payload: &[u8]) {
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
            got,
        } = &mut rr.state
        else {
            return self.fault(src, format!("DATA for receive {recv_id}, which is not receiving"));
        };
        let end = off.checked_add(data.len() as u64);
        if *peer != src || end.is_none_or(|e| e > *total as u64) {
            let what = format!("DATA at {off}+{} beyond a message of {total}", data.len());
            return self.fault(src, what);
        }
        let off = off as usize;
        if off < rr.cap && !rr.buf.0.is_null() {
            let n = data.len().min(rr.cap - off);
            // SAFETY: the buffer is lent for `cap` bytes and `off + n <= cap`.
            let dst = unsafe { std::slice::from_raw_parts_mut(rr.buf.0.add(off), n) };
            dst.copy_from_slice(&data[..n]);
        }
        *got += data.len();
        if *got >= *total {
            let (peer, send_id) = (*peer, *send_id);
            rr.state = RState::Done;
            if rr.detached {
                self.reqs.remove(&recv_id);
            }
            self.ctrl(peer, DONE, send_id, None);
        }
    }

    fn on_done(&mut self, src: u32, send_id: u32) {
        match self.reqs.get_mut(&send_id) {
            // An empty large message is acknowledged at once, without a CTS.
            Some(Req::Send(s))
                if s.dest == src
                    && matches!(s.state, SState::WaitCts | SState::WaitDone | SState::Push { .. }) =>
            {
                s.state = SState::Done;
                s.owned = None;
                if s.detached {
                    self.reqs.remove(&send_id);
                }
            }
            _ => self.fault(
                src,
                format!("DONE for send {send_id}, which is not waiting for one"),
            ),
        }
    }

    /// What follows every poll: control packets go out, chunks are pushed, and a
    /// protocol fault is reported.
    #[inline(always)]
    fn settle<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        if self.chores { self.do_chores(ch) } else { Ok(()) }
    }

    /// Keeps `e` to be reported by the next operation.
    #[cold]
    fn defer(&mut self, e: P2pError) {
        if self.fault.is_none() {
            self.fault = Some(e);
        }
        self.chores = true;
    }

    #[inline(never)]
    fn do_chores<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        let r = self.flush(ch).and_then(|()| self.push(ch));
        self.chores = !self.pushing.is_empty() || !self.outbox.is_empty();
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        r
    }

    /// Sends the control packets produced while handling.
    fn flush<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        for c in self.outbox.drain(..) {
            ch.send_bytes(c.dest, c.header, &c.payload[..c.len as usize])?;
        }
        Ok(())
    }

    /// Pushes chunks of accepted large messages while the channel has room.
    fn push<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        let chunk = ch.max_payload().saturating_sub(8).max(1);
        let mut i = 0;
        while i < self.pushing.len() {
            let id = self.pushing[i];
            let Some(Req::Send(s)) = self.reqs.get_mut(&id) else {
                self.pushing.swap_remove(i);
                continue;
            };
            let SState::Push { recv_id, off } = &mut s.state else {
                self.pushing.swap_remove(i);
                continue;
            };
            let data: &[u8] = match &s.owned {
                Some(v) => v,
                // SAFETY: the send buffer is lent for `len` bytes (see `Ptr`).
                None => unsafe { std::slice::from_raw_parts(s.buf.0, s.len) },
            };
            while *off < data.len() && ch.pending() == 0 {
                let end = (*off + chunk).min(data.len());
                let h = Header {
                    kind: DATA,
                    aux: *recv_id,
                    ..Header::default()
                };
                let status = ch.send(s.dest, h, &[&(*off as u64).to_le_bytes(), &data[*off..end]])?;
                *off = end;
                if matches!(status, SendStatus::Queued(_)) {
                    break;
                }
            }
            if *off >= data.len() {
                s.state = SState::WaitDone;
                self.pushing.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Lets a request go: cancels, drains into nothing, or copies what a send still
    /// needs, so the buffer is never touched again.
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
                rr.buf = Ptr(std::ptr::null_mut());
                rr.detached = true;
            }
            Req::Send(s) => {
                if s.owned.is_none() {
                    // SAFETY: the buffer is still lent; this is the last time we read it.
                    s.owned = Some(unsafe { std::slice::from_raw_parts(s.buf.0, s.len) }.to_vec());
                }
                s.buf = Ptr(std::ptr::null_mut());
                s.detached = true;
            }
        }
        self.detached.push(id);
    }
}

/// A job's two-sided endpoint over channel `C`.
#[derive(Debug)]
pub struct World<C: Channel = ShmChannel> {
    pub(crate) ch: C,
    pub(crate) eng: Engine,
    pub(crate) id: u64,
    world: Comm,
    pub(crate) next_ctx: u32,
    pub(crate) cfg: Config,
    locality: Vec<Locality>,
    /// The node's segment, whose blocks serve the collectives of node-local communicators.
    pub(crate) node_seg: Option<Arc<Segment>>,
    /// How a member waits in a node collective: as the channel waits, for as many
    /// processes on as many CPUs.
    pub(crate) node_wait: WaitPolicy,
    _not_sync: PhantomData<Cell<()>>,
}

impl<C: Channel> World<C> {
    /// A world over `ch`, configured from the environment.
    pub fn new(ch: C) -> Result<Self, P2pError> {
        let cfg = Config::from_env(ch.max_payload())?;
        Self::with_config(ch, cfg)
    }

    /// A world over `ch` with explicit tunables.
    pub fn with_config(ch: C, mut cfg: Config) -> Result<Self, P2pError> {
        cfg.eager_limit = cfg.eager_limit.min(ch.max_payload());
        let (me, size) = (ch.rank(), ch.size());
        let id = crate::bootstrap::random_job_id();
        let locality: Vec<Locality> = (0..size)
            .map(|r| {
                if r == me {
                    Locality::Me
                } else if ch.is_local(r) {
                    Locality::Local
                } else {
                    Locality::Remote
                }
            })
            .collect();
        let all_local = locality.iter().all(|l| *l != Locality::Remote);
        let node_seg = ch.node_segment().filter(|_| cfg.node_collectives);
        let local = locality.iter().filter(|l| **l != Locality::Remote).count() as u32;
        let node_wait = WaitPolicy::from_env(local, crate::channel::usable_cpus())?;
        let node = node_seg
            .clone()
            .filter(|_| all_local)
            .and_then(|s| NodeColl::join(s, 0, false));
        let world = Comm::new(id, 0, (0..size).collect(), me, size, all_local, node);
        let eng = Engine::new();
        Ok(Self {
            ch,
            eng,
            id,
            world,
            next_ctx: 1,
            cfg,
            locality,
            node_seg,
            node_wait,
            _not_sync: PhantomData,
        })
    }

    /// Our rank in the job.
    pub fn rank(&self) -> u32 {
        self.ch.rank()
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.ch.size()
    }

    /// The communicator of every rank.
    pub fn comm(&self) -> Comm {
        self.world.clone()
    }

    /// Where each rank is, as seen from here.
    pub fn locality(&self) -> &[Locality] {
        &self.locality
    }

    /// The tunables in force.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// The channel underneath.
    pub fn channel(&mut self) -> &mut C {
        &mut self.ch
    }

    pub(crate) fn check_comm<'a>(&self, comm: &'a Comm) -> Result<&'a Arc<CommInner>, P2pError> {
        if comm.inner.world != self.id {
            return Err(P2pError::WrongWorld("communicator"));
        }
        Ok(&comm.inner)
    }

    /// Polls the channel once and moves every protocol on.
    pub(crate) fn progress(&mut self) -> Result<usize, P2pError> {
        let Self { ch, eng, .. } = self;
        let n = ch.poll(|p| eng.handle(p.src, p.header, p.payload))?;
        eng.settle(ch)?;
        Ok(n)
    }

    /// Fails request `id` if the peer it depends on is known to be gone.
    pub(crate) fn check_failed(&mut self, id: u32) {
        let (peers, comm): (Vec<u32>, Arc<CommInner>) = match self.eng.reqs.get(&id) {
            Some(Req::Recv(rr)) => match (&rr.state, rr.src) {
                (RState::Rndv { peer, .. }, _) => (vec![*peer], rr.comm.clone()),
                (_, Some(s)) => (vec![s], rr.comm.clone()),
                (_, None) => (rr.comm.ranks.clone(), rr.comm.clone()),
            },
            Some(Req::Send(s)) => (vec![s.dest], s.comm.clone()),
            None => return,
        };
        for p in peers {
            if p == self.ch.rank() {
                continue;
            }
            if let Err(e) = self.ch.check_peer(p) {
                let reason = match e {
                    crate::ChannelError::PeerFailed { reason, .. } => reason,
                    other => other.to_string(),
                };
                let rank = comm.rank_of(p).unwrap_or(p);
                self.eng.posted.retain(|q| q.id != id);
                match self.eng.reqs.get_mut(&id) {
                    Some(Req::Recv(rr)) => {
                        rr.state = RState::Done;
                        rr.result = Some(Err(P2pError::PeerFailed { rank, reason }));
                    }
                    Some(Req::Send(s)) => {
                        s.state = SState::Done;
                        s.result = Some(Err(P2pError::PeerFailed { rank, reason }));
                    }
                    None => {}
                }
                return;
            }
        }
    }

    /// Drives progress until every request in `ids` is complete (or failed).
    pub(crate) fn wait_all_ids(&mut self, ids: &[u32]) -> Result<(), P2pError> {
        let mut last_check = None::<Instant>;
        let mut idle = 0;
        loop {
            self.progress()?;
            if ids
                .iter()
                .all(|id| self.eng.reqs.get(id).is_none_or(Req::is_done))
            {
                return Ok(());
            }
            idle += 1;
            if idle < TIGHT_POLLS {
                continue;
            }
            self.ch.wait(Some(self.cfg.failure_check))?;
            let now = Instant::now();
            let last = *last_check.get_or_insert(now);
            if now.duration_since(last) >= self.cfg.failure_check {
                last_check = Some(now);
                for &id in ids {
                    self.check_failed(id);
                }
            }
        }
    }

    /// Takes the result of a complete request and forgets it.
    pub(crate) fn finish(&mut self, id: u32) -> Result<Status, P2pError> {
        match self.eng.reqs.remove(&id) {
            Some(Req::Recv(RecvReq { result: Some(r), .. }))
            | Some(Req::Send(SendReq { result: Some(r), .. })) => r,
            _ => Err(P2pError::InvalidArgument(format!("request {id} has no result"))),
        }
    }

    fn check_tag(tag: i32) -> Result<(), P2pError> {
        if tag < 0 {
            Err(P2pError::InvalidTag(tag))
        } else {
            Ok(())
        }
    }

    fn src_sel(comm: &CommInner, src: Option<u32>) -> Result<Option<u32>, P2pError> {
        src.map(|s| comm.world_of(s)).transpose()
    }

    /// Starts a send: eager sends are complete on return (`None`); large ones return the
    /// request to wait for, whose buffer must stay lent until it completes.
    pub(crate) fn start_send(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        buf: &[u8],
    ) -> Result<Option<u32>, P2pError> {
        let d = comm.world_of(dest)?;
        if buf.len() <= self.cfg.eager_limit {
            self.ch.send_bytes(
                d,
                Header {
                    kind: EAGER,
                    context: ctx,
                    tag,
                    aux: 0,
                    flags: 0,
                },
                buf,
            )?;
            return Ok(None);
        }
        let id = self.eng.new_id();
        self.eng.reqs.insert(
            id,
            Req::Send(SendReq {
                buf: Ptr(buf.as_ptr().cast_mut()),
                len: buf.len(),
                dest: d,
                comm: comm.clone(),
                state: SState::WaitCts,
                owned: None,
                result: Some(Ok(Status {
                    source: dest,
                    tag,
                    len: buf.len(),
                })),
                detached: false,
            }),
        );
        let mut rts = [0u8; 9];
        rts[..8].copy_from_slice(&(buf.len() as u64).to_le_bytes());
        rts[8] = STRATEGY_CHUNKS;
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

    /// Starts a receive into `buf` (lent to the engine until the request completes or is
    /// released). Returns the request, which may already be complete.
    pub(crate) fn start_recv(
        &mut self,
        comm: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        ctx: u32,
        buf: Ptr,
        cap: usize,
    ) -> Result<u32, P2pError> {
        let src = Self::src_sel(comm, src)?;
        let id = self.eng.new_id();
        let mut rr = RecvReq {
            buf,
            cap,
            comm: comm.clone(),
            src,
            state: RState::Posted,
            result: None,
            detached: false,
        };
        if let Some(i) = self
            .eng
            .unexpected
            .iter()
            .position(|u| selected(ctx, src, tag, u.ctx, u.src, u.tag))
        {
            let u = self.eng.unexpected.remove(i).expect("position is in range");
            match u.body {
                Body::Eager(data) => {
                    Engine::deliver_eager(&mut rr, u.src, u.tag, &data);
                    self.eng.reqs.insert(id, Req::Recv(rr));
                }
                Body::Rts { send_id, total } => {
                    self.eng.start_rndv(id, rr, u.src, send_id, total, u.tag);
                    self.eng.flush(&mut self.ch)?;
                }
            }
            return Ok(id);
        }
        self.eng.posted.push_back(Posted { id, ctx, src, tag });
        self.eng.reqs.insert(id, Req::Recv(rr));
        Ok(id)
    }

    /// Sends `buf` to rank `dest` of `comm` with `tag`, returning when the buffer may be
    /// reused.
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
        if buf.len() <= self.cfg.eager_limit
            && let Some(&d) = c.ranks.get(dest as usize)
        {
            return match self.ch.send_bytes(
                d,
                Header {
                    kind: EAGER,
                    context: ctx,
                    tag,
                    aux: 0,
                    flags: 0,
                },
                buf,
            ) {
                Ok(_) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        self.send_large(c, ctx, dest, tag, buf)
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
        match self.start_send(c, dest, tag, ctx, buf)? {
            None => Ok(()),
            Some(id) => {
                let r = self.wait_all_ids(&[id]);
                if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
                    // The buffer is only lent for this call.
                    self.eng.release(id);
                    r?;
                }
                self.finish(id).map(|_| ())
            }
        }
    }

    /// Receives a message from `src` (or [`super::ANY_SOURCE`]) with `tag` (or
    /// [`super::ANY_TAG`]) into `buf`.
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
        if self.eng.posted.is_empty()
            && (self.eng.unexpected.is_empty()
                || !self
                    .eng
                    .unexpected
                    .iter()
                    .any(|u| selected(ctx, src_w, tag, u.ctx, u.src, u.tag)))
        {
            // The message is most likely the next one from a named source, waiting in
            // its fastbox: try for just that first.
            if let Some(s) = src_w {
                let mut f = Fresh {
                    ctx,
                    src: s,
                    tag: tag.unwrap_or(FRESH_ANY_TAG),
                    buf: &mut *buf,
                    found: None,
                };
                let Self { ch, eng, .. } = self;
                if ch.poll_from(s, |p| f.offer(eng, p)) {
                    if let Some(Found::Eager { src, tag, len }) = f.found
                        && !eng.chores
                    {
                        if len > buf.len() {
                            return Err(P2pError::Truncated {
                                message_len: len,
                                buffer_len: buf.len(),
                            });
                        }
                        return Ok(Status {
                            source: c.member(src),
                            tag,
                            len,
                        });
                    }
                    let found = f.found;
                    return self.recv_fresh(c, ctx, src_w, tag, buf, found);
                }
            }
            return self.recv_fresh(c, ctx, src_w, tag, buf, None);
        }
        self.recv_posted(c, ctx, src, tag, buf)
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
        let id = self.start_recv(c, src, tag, ctx, Ptr(buf.as_mut_ptr()), buf.len())?;
        let r = self.wait_all_ids(&[id]);
        if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
            self.eng.release(id);
            r?;
        }
        self.finish(id)
    }

    /// A blocking receive with nothing posted and nothing matching waiting: fresh packets
    /// are matched against it as they are polled, without a posted entry (the receive
    /// queue bypass). `src` is a world rank.
    /// `found` is what a first look found already.
    #[inline(never)]
    fn recv_fresh(
        &mut self,
        c: &Arc<CommInner>,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
        found: Option<Found>,
    ) -> Result<Status, P2pError> {
        let (ptr, cap) = (Ptr(buf.as_mut_ptr()), buf.len());
        let mut idle = Idle::new();
        let mut f = Fresh {
            ctx,
            src: src.unwrap_or(FRESH_ANY_SRC),
            tag: tag.unwrap_or(FRESH_ANY_TAG),
            buf,
            found,
        };
        let found = loop {
            if let Some(found) = f.found {
                // What the poll left to do must not cost this receive its message: a
                // failure is reported by the next call instead.
                if let Err(e) = self.eng.settle(&mut self.ch) {
                    self.eng.defer(e);
                }
                break found;
            }
            let Self { ch, eng, .. } = self;
            let polled = ch.poll(|p| f.offer(eng, p));
            if f.found.is_some() {
                continue;
            }
            polled?;
            eng.settle(ch)?;
            self.idle(c, src, &mut idle)?;
        };
        match found {
            Found::Eager { src, tag, len } => {
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
            Found::Rts {
                src: peer,
                tag,
                len,
                send_id,
            } => self.fresh_rndv(c, src, peer, tag, send_id, len, ptr, cap),
        }
    }

    /// One idle round of a blocked operation waiting on `src` (a world rank, or any
    /// member of `c`): nothing for the first polls, then a wait on the channel, and now
    /// and then a check that the peers are alive.
    #[inline(never)]
    fn idle(&mut self, c: &Arc<CommInner>, src: Option<u32>, idle: &mut Idle) -> Result<(), P2pError> {
        idle.polls += 1;
        if idle.polls < TIGHT_POLLS {
            return Ok(());
        }
        self.ch.wait(Some(self.cfg.failure_check))?;
        let now = Instant::now();
        let last = *idle.last_check.get_or_insert(now);
        if now.duration_since(last) >= self.cfg.failure_check {
            idle.last_check = Some(now);
            if let Some(e) = self.peer_failed(c, src) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Completes a blocking receive whose fresh match was an RTS.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn fresh_rndv(
        &mut self,
        c: &Arc<CommInner>,
        src: Option<u32>,
        peer: u32,
        tag: i32,
        send_id: u32,
        total: usize,
        buf: Ptr,
        cap: usize,
    ) -> Result<Status, P2pError> {
        let rr = RecvReq {
            buf,
            cap,
            comm: c.clone(),
            src,
            state: RState::Posted,
            result: None,
            detached: false,
        };
        let id = self.eng.accept_rts(rr, peer, send_id, total, tag);
        self.eng.flush(&mut self.ch)?;
        let r = self.wait_all_ids(&[id]);
        if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
            self.eng.release(id);
            r?;
        }
        self.finish(id)
    }

    pub(crate) fn peer_failed(&mut self, c: &Arc<CommInner>, src: Option<u32>) -> Option<P2pError> {
        let peers: Vec<u32> = match src {
            Some(s) => vec![s],
            None => c.ranks.clone(),
        };
        for p in peers {
            if p == self.ch.rank() {
                continue;
            }
            if let Err(crate::ChannelError::PeerFailed { reason, .. }) = self.ch.check_peer(p) {
                return Some(P2pError::PeerFailed {
                    rank: c.rank_of(p).unwrap_or(p),
                    reason,
                });
            }
        }
        None
    }

    /// Sends to `dest` and receives from `src` at once, as two ranks exchanging data
    /// must, so neither waits for the other first.
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
        let rid = self.start_recv(c, src, recv_tag, ctx, Ptr(recv.as_mut_ptr()), recv.len())?;
        let sid = match self.start_send(c, dest, send_tag, ctx, send) {
            Ok(s) => s,
            Err(e) => {
                self.eng.release(rid);
                return Err(e);
            }
        };
        let ids: Vec<u32> = std::iter::once(rid).chain(sid).collect();
        let r = self.wait_all_ids(&ids);
        for &id in &ids {
            if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
                self.eng.release(id);
            }
        }
        r?;
        if let Some(sid) = sid {
            self.finish(sid)?;
        }
        self.finish(rid)
    }

    /// Reports the next matching message without receiving it, if one has arrived.
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
            .unexpected
            .iter()
            .find(|u| selected(c.ctx, src, tag, u.ctx, u.src, u.tag))
            .map(|u| Status {
                source: c.rank_of(u.src).unwrap_or(u.src),
                tag: u.tag,
                len: u.len(),
            }))
    }

    /// Waits until a matching message has arrived and reports it without receiving it.
    pub fn probe(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
    ) -> Result<Status, P2pError> {
        let (src, tag) = (src.into(), tag.into());
        let c = self.check_comm(comm)?.clone();
        let src_w = Self::src_sel(&c, src)?;
        let mut last_check = Instant::now();
        loop {
            if let Some(s) = self.iprobe(comm, src, tag)? {
                return Ok(s);
            }
            self.ch.wait(Some(self.cfg.failure_check))?;
            if last_check.elapsed() >= self.cfg.failure_check {
                last_check = Instant::now();
                if let Some(e) = self.peer_failed(&c, src_w) {
                    return Err(e);
                }
            }
        }
    }

    /// Drives progress until every send this world still owes (including those of
    /// released requests) has completed and the channel has nothing queued.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), P2pError> {
        let deadline = Instant::now() + timeout;
        loop {
            // Nothing owed: return without polling, which would take packets that are
            // not ours to take.
            let owed = self
                .eng
                .reqs
                .values()
                .any(|r| matches!(r, Req::Send(s) if !matches!(s.state, SState::Done)));
            if !owed && self.ch.pending() == 0 {
                return Ok(());
            }
            self.progress()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(P2pError::Channel(crate::ChannelError::FlushTimeout {
                    pending: self.ch.pending(),
                    waited: timeout,
                }));
            }
            self.ch.wait(Some((deadline - now).min(self.cfg.failure_check)))?;
        }
    }
}

impl<C: Channel> Drop for World<C> {
    fn drop(&mut self) {
        // What this process sent must still arrive; give it a little time.
        let _ = self.flush(Duration::from_secs(5));
    }
}
