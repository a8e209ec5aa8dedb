//! The matching engine: posted and unexpected queues, requests, the eager and
//! rendezvous protocols, and progress.

use super::comm::{Comm, CommInner};
use super::node::NodeColl;
use super::rndv::{Rts, Stage};
use super::{Config, Locality, P2pError, Status};
use crate::channel::{Channel, Header, NemesisChannel, Packet, WaitPolicy};
use nemesis_lmt::{Seg, Strategies, Strategy, Xfer};
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
pub(crate) const FIN: u16 = 0x106;
pub(crate) const REVOKE: u16 = 0x107;
pub(crate) const REVOKED: u16 = 0x108;

/// Polls a blocked operation makes back to back before it waits the channel's way
/// (spinning on readiness, yielding, sleeping): a reply that comes within a few
/// microseconds is picked up without a clock read or a readiness check on the way.
const TIGHT_POLLS: u32 = 256;

/// A buffer a request lent to the engine: one piece, or a list of them (an iovec).
///
/// The engine dereferences it only while the buffer is lent: during a blocking call that
/// borrows it, or within the scope of the request that borrows it, which clears it
/// (cancelling, copying, or waiting for the peer) before the borrow can end. See
/// `scope.rs`. The engine lives inside a World, which a scope borrows mutably for as
/// long as any lent buffer exists, so the World cannot move to another thread meanwhile.
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

    /// Writes `data` at byte `off`, dropping what falls past the end.
    ///
    /// # Safety
    /// The buffer must be lent (see the type) and not otherwise in use.
    pub(crate) unsafe fn write_at(&self, off: usize, data: &[u8]) {
        if let Bufs::One(s) = self {
            if off < s.len && !s.ptr.is_null() {
                // SAFETY: `off < len`: the rest of the lent piece, which nothing else uses.
                let dst = unsafe { std::slice::from_raw_parts_mut(s.ptr.add(off), s.len - off) };
                nemesis_shm::region::copy_into(dst, data);
            }
            return;
        }
        let mut at = nemesis_shm::ring::SegCursor::default();
        at.walk(self.segs(), off, |_, _| {});
        let mut put = 0;
        at.walk(self.segs(), data.len(), |p, len| {
            // SAFETY: `p` is inside a lent piece for `len` bytes, and `put + len` is
            // within `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(put), p, len) };
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

#[derive(Debug)]
pub(super) struct Posted {
    pub(super) id: u32,
    pub(super) ctx: u32,
    pub(super) src: Option<u32>,
    pub(super) tag: Option<i32>,
}

#[derive(Debug)]
pub(super) enum Body {
    Eager(Vec<u8>),
    Rts(Rts),
}

#[derive(Debug)]
pub(super) struct Unexpected {
    pub(super) src: u32,
    pub(super) ctx: u32,
    pub(super) tag: i32,
    pub(super) body: Body,
}

impl Unexpected {
    fn len(&self) -> usize {
        match &self.body {
            Body::Eager(d) => d.len(),
            Body::Rts(r) => r.total,
        }
    }
}

/// A control packet produced while handling another, sent once the poll returns.
#[derive(Debug)]
pub(super) struct Ctrl {
    dest: u32,
    header: Header,
    payload: Vec<u8>,
}

#[derive(Debug)]
pub(crate) enum RState {
    /// In the posted queue.
    Posted,
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
    Lmt { recv_id: u32, x: Xfer },
    /// Everything sent; waiting for DONE.
    WaitDone,
    /// Complete.
    Done,
}

#[derive(Debug)]
pub(crate) struct RecvReq {
    pub bufs: Bufs,
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
    pub bufs: Bufs,
    pub len: usize,
    pub dest: u32,
    pub comm: Arc<CommInner>,
    pub state: SState,
    /// What the RTS offered; a revoked offer loses the strategies that read in place.
    pub offered: Strategies,
    /// The strategy the CTS chose, once it came.
    pub used: Option<Strategy>,
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
#[derive(Debug)]
enum Found {
    /// An eager message, copied into the buffer.
    Eager { src: u32, tag: i32, len: usize },
    /// An RTS (boxed, so the eager case stays small).
    Rts { src: u32, tag: i32, rts: Box<Rts> },
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
            } else if let Some(rts) = eng.parse_rts(p.src, h.aux, p.payload) {
                self.found = Some(Found::Rts {
                    src: p.src,
                    tag: h.tag,
                    rts: Box::new(rts),
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
    pub(super) posted: VecDeque<Posted>,
    pub(super) unexpected: VecDeque<Unexpected>,
    pub(crate) reqs: HashMap<u32, Req>,
    next_id: u32,
    outbox: Vec<Ctrl>,
    /// Sends that may push chunks.
    pub(super) pushing: Vec<u32>,
    /// Requests with LMT work to do at the next chores (choose, start, move data).
    pub(super) lmt_active: Vec<u32>,
    /// Transfers that ended while handling a packet, to hand back to the LMT.
    pub(super) retired: Vec<Xfer>,
    fault: Option<P2pError>,
    /// Whether the outbox, the work lists or the fault may hold something: one test
    /// after each poll instead of several.
    pub(super) chores: bool,
}

#[inline(always)]
pub(super) fn selected(
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
    p_ctx: u32,
    p_src: u32,
    p_tag: i32,
) -> bool {
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
            lmt_active: Vec::new(),
            retired: Vec::new(),
            fault: None,
            chores: false,
        }
    }

    pub(super) fn new_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.reqs.contains_key(&id) {
                return id;
            }
        }
    }

    pub(super) fn fault(&mut self, rank: u32, what: impl Into<String>) {
        if self.fault.is_none() {
            self.fault = Some(P2pError::Protocol {
                rank,
                what: what.into(),
            });
            self.chores = true;
        }
    }

    pub(super) fn ctrl(&mut self, dest: u32, kind: u16, aux: u32, payload: &[u8]) {
        self.outbox.push(Ctrl {
            dest,
            header: Header {
                kind,
                aux,
                ..Header::default()
            },
            payload: payload.to_vec(),
        });
        self.chores = true;
    }

    /// Copies an eager payload into a receive buffer and completes the receive.
    pub(super) fn deliver_eager(rr: &mut RecvReq, src: u32, tag: i32, data: &[u8]) {
        // SAFETY: the buffer is lent (see `Bufs`) and not otherwise in use.
        unsafe { rr.bufs.write_at(0, data) };
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
            DONE => self.on_done(src, h.aux, payload),
            FIN => self.on_fin(src, h.aux, payload),
            REVOKE => self.on_revoke(src, h.aux),
            REVOKED => self.on_revoked(src, h.aux),
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

    /// What follows every poll: control packets go out, chunks are pushed, and a
    /// protocol fault is reported.
    #[inline(always)]
    pub(super) fn settle<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        if self.chores { self.do_chores(ch) } else { Ok(()) }
    }

    /// Keeps `e` to be reported by the next operation.
    #[cold]
    pub(super) fn defer(&mut self, e: P2pError) {
        if self.fault.is_none() {
            self.fault = Some(e);
        }
        self.chores = true;
    }

    #[inline(never)]
    fn do_chores<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        let r = self
            .drive_lmt(ch)
            .and_then(|()| self.flush(ch))
            .and_then(|()| self.push(ch))
            .and_then(|()| self.flush(ch));
        self.chores = !self.pushing.is_empty() || !self.outbox.is_empty() || !self.lmt_active.is_empty();
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        r
    }

    /// Sends the control packets produced while handling.
    pub(super) fn flush<C: Channel>(&mut self, ch: &mut C) -> Result<(), P2pError> {
        for c in self.outbox.drain(..) {
            ch.send_bytes(c.dest, c.header, &c.payload)?;
        }
        Ok(())
    }

    /// Whether a large message is being moved, so a blocked operation keeps polling
    /// (pausing between polls) rather than sleep: data that moves without packets
    /// arriving needs it, and the peer's next step is answered without a wake-up's
    /// delay, which can cost as much as moving a megabyte. A send still waiting for its
    /// receiver to match it does not count: that may take any time.
    pub(super) fn lmt_busy(&self) -> bool {
        !self.lmt_active.is_empty()
            || self.reqs.values().any(|r| match r {
                Req::Send(s) => !matches!(s.state, SState::Done | SState::WaitCts),
                Req::Recv(rr) => matches!(rr.state, RState::Rndv { .. }),
            })
    }
}

/// A job's two-sided endpoint over channel `C`.
#[derive(Debug)]
pub struct World<C: Channel = NemesisChannel> {
    pub(crate) ch: C,
    pub(crate) eng: Engine,
    pub(crate) id: u64,
    world: Comm,
    pub(crate) next_ctx: u32,
    pub(crate) cfg: Config,
    locality: Vec<Locality>,
    /// The eager limit towards each rank: larger towards other nodes, whose netmod
    /// carries larger packets.
    pub(crate) eager_to: Vec<usize>,
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
        let eager_to = locality
            .iter()
            .enumerate()
            .map(|(r, l)| match l {
                Locality::Remote => cfg.net_eager_limit.min(ch.max_payload_to(r as u32)),
                _ => cfg.eager_limit,
            })
            .collect();
        Ok(Self {
            ch,
            eng,
            id,
            world,
            next_ctx: 1,
            cfg,
            locality,
            eager_to,
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

    /// A pause between polls while a large message is under way: a CPU hint when every
    /// local process has a CPU, a yield when they outnumber the CPUs.
    fn busy_pause(&self) {
        if self.node_wait.spin >= 1000 {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
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
                let old = match self.eng.reqs.get_mut(&id) {
                    Some(Req::Recv(rr)) => {
                        rr.result = Some(Err(P2pError::PeerFailed { rank, reason }));
                        match std::mem::replace(&mut rr.state, RState::Done) {
                            RState::Rndv {
                                stage: Stage::Lmt(x), ..
                            } => Some(x),
                            _ => None,
                        }
                    }
                    Some(Req::Send(s)) => {
                        s.result = Some(Err(P2pError::PeerFailed { rank, reason }));
                        match std::mem::replace(&mut s.state, SState::Done) {
                            SState::Lmt { x, .. } => Some(x),
                            _ => None,
                        }
                    }
                    None => None,
                };
                if let Some(lmt) = self.ch.lmt() {
                    if let Some(x) = old {
                        lmt.end(&x);
                    }
                    lmt.peer_terminated(p);
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
            if self.eng.lmt_busy() {
                self.busy_pause();
            } else {
                self.ch.wait(Some(self.cfg.failure_check))?;
            }
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

    /// Waits for request `id`, whose buffer is lent only for the call, and finishes it;
    /// on failure the request is released, so the buffer is never touched again.
    pub(crate) fn block_on(&mut self, id: u32) -> Result<Status, P2pError> {
        let r = self.wait_all_ids(&[id]);
        if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
            self.release(id);
            r?;
        }
        self.finish(id)
    }

    /// Takes the result of a complete request and forgets it.
    pub(crate) fn finish(&mut self, id: u32) -> Result<Status, P2pError> {
        match self.eng.reqs.remove(&id) {
            Some(Req::Recv(RecvReq { result: Some(r), .. }))
            | Some(Req::Send(SendReq { result: Some(r), .. })) => r,
            _ => Err(P2pError::InvalidArgument(format!("request {id} has no result"))),
        }
    }

    pub(crate) fn check_tag(tag: i32) -> Result<(), P2pError> {
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
        self.start_send_bufs(comm, dest, tag, ctx, Bufs::One(Seg::of(buf)), buf.len())
    }

    /// Starts a receive into `buf` (lent to the engine until the request completes or is
    /// released). Returns the request, which may already be complete.
    pub(crate) fn start_recv(
        &mut self,
        comm: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        ctx: u32,
        bufs: Bufs,
        cap: usize,
    ) -> Result<u32, P2pError> {
        let src = Self::src_sel(comm, src)?;
        let id = self.eng.new_id();
        let mut rr = RecvReq {
            bufs,
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
                Body::Rts(rts) => {
                    self.eng.start_rndv(id, rr, u.src, rts, u.tag);
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
            Some(id) => self.block_on(id).map(|_| ()),
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
        let id = self.start_recv(c, src, tag, ctx, Bufs::One(Seg::of_mut(buf)), buf.len())?;
        self.block_on(id)
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
        let (seg, cap) = (Seg::of_mut(buf), buf.len());
        let mut idle = Idle::new();
        let mut f = Fresh {
            ctx,
            src: src.unwrap_or(FRESH_ANY_SRC),
            tag: tag.unwrap_or(FRESH_ANY_TAG),
            buf,
            found,
        };
        let found = loop {
            if let Some(found) = f.found.take() {
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
            Found::Rts { src: peer, tag, rts } => self.fresh_rndv(c, src, peer, tag, *rts, seg, cap),
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
        if self.eng.lmt_busy() {
            self.busy_pause();
        } else {
            self.ch.wait(Some(self.cfg.failure_check))?;
        }
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
        rts: Rts,
        seg: Seg,
        cap: usize,
    ) -> Result<Status, P2pError> {
        let rr = RecvReq {
            bufs: Bufs::One(seg),
            cap,
            comm: c.clone(),
            src,
            state: RState::Posted,
            result: None,
            detached: false,
        };
        let id = self.eng.accept_rts(rr, peer, rts, tag);
        self.eng.flush(&mut self.ch)?;
        self.block_on(id)
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
        let rid = self.start_recv(c, src, recv_tag, ctx, Bufs::One(Seg::of_mut(recv)), recv.len())?;
        let sid = match self.start_send(c, dest, send_tag, ctx, send) {
            Ok(s) => s,
            Err(e) => {
                self.release(rid);
                return Err(e);
            }
        };
        let ids: Vec<u32> = std::iter::once(rid).chain(sid).collect();
        let r = self.wait_all_ids(&ids);
        for &id in &ids {
            if r.is_err() || !self.eng.reqs.get(&id).is_some_and(Req::is_done) {
                self.release(id);
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
