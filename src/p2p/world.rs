//! The world: a job's two-sided endpoint, on the progress core of its channel. Blocking
//! sends and receives, probes, and the loop every blocked call runs.

use super::comm::{Comm, CommInner};
use super::engine::{self, Engine};
use super::matching::Body;
use super::node::{NodeColl, NodeWaiter};
use super::owned::Mailbox;
use super::requests::{Bufs, Holder, RecvReq, Req, SState, SendReq};
use super::stream_way::{StreamWays, Way};
use super::wire::{self, EAGER, MDATA, MEDIUM, REVOKE, RTS, Rts};
use super::{Config, Locality, P2pError, SendCounts, Status};
use crate::channel::{
    Channel, Header, Land, NemesisChannel, Packet, PacketSink, Rank, SendStatus, WaitPolicy,
};
use crate::progress::{Core, Idle, Others, Protocol, ProtocolId, RegistryError, Tick};
use nemesis_lmt::{Lmt, Seg};
use nemesis_shm::Segment;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A job's two-sided endpoint over channel `C`.
///
/// It owns the channel's progress core: every blocking call, collective and
/// [`World::progress`] polls through it, so the protocols registered on it (a runtime's
/// own, with [`World::register`]) move on whichever call is waiting.
///
/// ```
/// let mut world = nemesis::init()?; // rank, size and peers from the process manager
/// let comm = world.comm();
/// let (me, n) = (world.rank(), world.size());
/// world.send(&comm, (me + 1) % n, 7, b"hello")?;
/// let mut buf = [0u8; 16];
/// let st = world.recv(&comm, (me + n - 1) % n, 7, &mut buf)?;
/// assert_eq!(&buf[..st.len], b"hello");
/// # Ok::<(), nemesis::P2pError>(())
/// ```
#[derive(Debug)]
pub struct World<C: Channel = NemesisChannel> {
    pub(crate) core: Core<C>,
    pub(crate) eng: Engine,
    pub(crate) id: u64,
    world: Comm,
    pub(crate) next_ctx: u32,
    pub(crate) cfg: Config,
    locality: Vec<Locality>,
    /// The size up to which a message goes eagerly at once, towards each rank: larger
    /// towards other nodes, whose netmod carries larger packets; towards ranks of the
    /// node with pair buffers, the pair eager limit, above which a message that answers
    /// its peer goes through the pair buffer (up to the eager limit).
    eager_to: Vec<usize>,
    /// The same for the blocking send's first look, whatever the rank.
    eager_at_once: usize,
    /// Sends by each protocol but the eager one.
    sent: SendCounts,
    /// How a stream's longer messages to each local rank go, by what they took.
    ways: StreamWays,
    /// The node's segment, whose blocks serve the collectives of node-local communicators.
    pub(crate) node_seg: Option<Arc<Segment>>,
    /// How a member waits in a node collective: as the channel waits, for as many
    /// processes on as many CPUs.
    node_wait: WaitPolicy,
    /// This rank's vote on whether small collectives through messages go through the
    /// communicator's rank 0 (see `coll.rs`): `NEMESIS_FLAT_COLLECTIVES`, or whether the
    /// node's processes outnumber its CPUs.
    pub(crate) flat_vote: bool,
    /// Owned requests dropped by their handles, to let go at the next call.
    pub(crate) mailbox: Arc<Mailbox>,
    /// Scopes made so far: the next one's number (see [`Holder::Scope`]).
    pub(crate) scopes: u64,
    /// Whether [`World::compute`] runs a helper thread (`NEMESIS_RMA_PROGRESS=thread`).
    pub(crate) helper: bool,
    _not_sync: PhantomData<Cell<()>>,
}

/// Hands `p` to the two-sided engine or to the protocol it belongs to.
#[inline(always)]
fn dispatch(eng: &mut Engine, others: &mut Others<'_>, p: Packet<'_>) {
    if ProtocolId::of(p.header.kind) == ProtocolId::P2P {
        eng.handle(p.src, &p.header, p.payload)
    } else {
        others.dispatch(p);
        // Its outbox waits for the chores.
        eng.chores = true;
    }
}

/// [`dispatch`] for [`World::progress`], whose poll hands up a stream's packets: an
/// eager one is matched in line (see [`Engine::handle_inline`]). Not for the blocking
/// receive's poll, whose fast path would carry the matching code.
#[inline(always)]
fn dispatch_inline(eng: &mut Engine, others: &mut Others<'_>, p: Packet<'_>) {
    if ProtocolId::of(p.header.kind) == ProtocolId::P2P {
        eng.handle_inline(p.src, &p.header, p.payload)
    } else {
        dispatch(eng, others, p)
    }
}

impl<C: Channel> World<C> {
    /// A world over `ch`, configured from the environment.
    ///
    /// # Errors
    /// A bad `NEMESIS_*` variable of the two-sided layer or the progress core.
    pub fn new(ch: C) -> Result<Self, P2pError> {
        let cfg = Config::from_env(ch.max_payload())?;
        Self::with_config(ch, cfg)
    }

    /// A world over `ch` with explicit tunables.
    ///
    /// # Errors
    /// A bad `NEMESIS_SPIN`, `NEMESIS_YIELDS` or `NEMESIS_WAIT_WARN`.
    pub fn with_config(mut ch: C, mut cfg: Config) -> Result<Self, P2pError> {
        cfg.eager_limit = cfg.eager_limit.min(ch.max_payload());
        // However the fields were set: no medium messages, no stream's packets either,
        // and packets never tried first above the medium limit.
        if cfg.medium_limit == 0 {
            cfg.stream_tune_limit = 0;
        }
        cfg.stream_packets_first = cfg.stream_packets_first.min(cfg.medium_limit);
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
        let cpus = crate::channel::usable_cpus();
        let flat_vote = cfg
            .flat_collectives
            .unwrap_or_else(|| crate::channel::outnumber(local, cpus));
        let node_wait = match ch.wait_policy() {
            Some(p) => p,
            None => WaitPolicy::from_env(local, cpus)?,
        };
        let node = node_seg
            .clone()
            .filter(|_| all_local)
            .and_then(|s| NodeColl::join(s, 0, false));
        let world = Comm::new(id, 0, (0..size).collect(), me, size, all_local, node);
        // Messages to other nodes that RDMA reads faster than packets carry them are
        // not sent eagerly, however large a packet the netmod takes (ud's reach 64 KiB).
        let below_rdma = ch
            .lmt()
            .rdma_threshold()
            .map_or(usize::MAX, |m| m.saturating_sub(1));
        let mut eng = Engine::new(size);
        eng.pairs = ch.pair_bufs().filter(|_| cfg.medium_limit > 0);
        let eager_at_once = if eng.pairs.is_some() {
            cfg.pair_eager_limit.min(cfg.eager_limit)
        } else {
            cfg.eager_limit
        };
        let eager_to = locality
            .iter()
            .enumerate()
            .map(|(r, l)| match l {
                Locality::Remote => cfg
                    .net_eager_limit
                    .min(ch.max_payload_to(r as u32))
                    .min(below_rdma),
                _ => eager_at_once,
            })
            .collect();
        let mut core_cfg = crate::progress::Config::from_env()?;
        core_cfg.failure_check = cfg.failure_check;
        Ok(Self {
            core: Core::with_config(ch, core_cfg)?,
            eng,
            id,
            world,
            next_ctx: 1,
            cfg,
            locality,
            eager_to,
            eager_at_once,
            sent: SendCounts::default(),
            ways: StreamWays::default(),
            node_seg,
            node_wait,
            flat_vote,
            mailbox: Arc::default(),
            scopes: 0,
            helper: super::compute::helper_from_env()?,
            _not_sync: PhantomData,
        })
    }

    /// Our rank in the job.
    pub fn rank(&self) -> u32 {
        self.core.ch.rank()
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.core.ch.size()
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

    /// How many sends so far went by each protocol other than the eager one.
    pub fn send_counts(&self) -> SendCounts {
        self.sent
    }

    /// The channel underneath. Everything is polled through the world: a poll of the
    /// channel itself would take packets that belong to the world or to the protocols
    /// registered on it.
    pub fn channel(&self) -> &C {
        &self.core.ch
    }

    /// The channel, for tests that play a broken or hostile peer.
    #[cfg(test)]
    pub(crate) fn channel_mut(&mut self) -> &mut C {
        &mut self.core.ch
    }

    /// The progress core, to look at: the protocols and what was dropped.
    pub fn core(&self) -> &Core<C> {
        &self.core
    }

    // ---------------------------------------------------------------------------------
    // Other protocols on the same channel

    /// Registers protocol `p` under `id`, beside two-sided messaging: from now on it is
    /// handed every packet of `id`, in place, whichever call of this world is polling.
    ///
    /// # Errors
    /// [`RegistryError::Reserved`] for [`ProtocolId::P2P`] and [`ProtocolId::RMA`], which
    /// the world runs itself, and [`RegistryError::Taken`] when `id` has a protocol
    /// already.
    pub fn register<P: Protocol>(&mut self, id: ProtocolId, p: P) -> Result<(), RegistryError> {
        if id == ProtocolId::P2P || id == ProtocolId::RMA {
            return Err(RegistryError::Reserved(id));
        }
        self.core.register(id, p)
    }

    /// Takes the protocol under `id` out; its packets are dropped (and counted) again.
    /// The one-sided layer's own protocol stays: `None`.
    pub fn unregister(&mut self, id: ProtocolId) -> Option<Box<dyn Protocol>> {
        if id == ProtocolId::RMA {
            return None;
        }
        self.core.unregister(id)
    }

    /// The protocol under `id`, if it is a `P`.
    pub fn protocol<P: Protocol>(&self, id: ProtocolId) -> Option<&P> {
        self.core.protocol(id)
    }

    /// The protocol under `id`, if it is a `P`, to reach its state between packets.
    pub fn protocol_mut<P: Protocol>(&mut self, id: ProtocolId) -> Option<&mut P> {
        self.core.protocol_mut(id)
    }

    /// Sends a packet of protocol `id` to `dest` (a world rank): `header.kind` is the
    /// protocol's own kind (0 to 0xff). Never blocks and never drops.
    ///
    /// # Errors
    /// [`RegistryError::Reserved`] for [`ProtocolId::P2P`] and [`ProtocolId::RMA`], a kind above 0xff, a bad
    /// rank, or a packet over [`Channel::max_payload_to`].
    pub fn send_packet(
        &mut self,
        id: ProtocolId,
        dest: Rank,
        header: Header,
        payload: &[u8],
    ) -> Result<SendStatus, P2pError> {
        if id == ProtocolId::P2P || id == ProtocolId::RMA {
            return Err(crate::ChannelError::from(RegistryError::Reserved(id)).into());
        }
        Ok(self.core.send(id, dest, header, &[payload])?)
    }

    /// Polls the channel once and moves every protocol on: two-sided matching and
    /// transfers, and the registered protocols' packets. Returns how many packets came.
    ///
    /// # Errors
    /// The channel's, and a peer's protocol violation.
    pub fn progress(&mut self) -> Result<usize, P2pError> {
        self.release_dropped();
        let (ch, mut others) = self.core.split();
        let eng = &mut self.eng;
        let n = ch.poll(|p| dispatch_inline(eng, &mut others, p))?;
        self.settle()?;
        Ok(n)
    }

    /// Moves every protocol on until `done` says so or `timeout` passes (`None`: no
    /// limit), waiting the channel's way in between; returns whether `done` said so.
    /// `done` sees the world, so it can look at a protocol's state.
    ///
    /// # Errors
    /// As for [`World::progress`].
    pub fn progress_until(
        &mut self,
        timeout: Option<Duration>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<bool, P2pError> {
        crate::progress::drive_until(self, timeout, done)
    }

    /// A descriptor that is readable when the world may have work: shared-memory
    /// traffic, the network module's sockets and timers. An event loop (epoll, mio,
    /// tokio's `AsyncFd`) sleeps on it with everything else it waits for:
    ///
    /// ```
    /// # use std::os::fd::AsRawFd;
    /// let mut world = nemesis::init()?;
    /// let fd = world.wait_fd().expect("a descriptor").as_raw_fd();
    /// loop {
    ///     world.progress()?;
    ///     // ... look at what the progress completed; stop when done ...
    /// #   break;
    ///     if world.arm()? {
    ///         // Sleep: nothing can happen until `fd` is readable.
    ///         let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    ///         unsafe { libc::poll(&mut p, 1, -1) };
    ///     }
    /// }
    /// # Ok::<(), nemesis::P2pError>(())
    /// ```
    ///
    /// While nobody arms, it costs the senders nothing.
    pub fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.core.wait_fd()
    }

    /// Prepares a sleep on [`World::wait_fd`]: says whether the caller may sleep until
    /// it is readable (true), or must call [`World::progress`] first because work is
    /// already there (false). Large messages that move without packets keep it false.
    ///
    /// # Errors
    /// The channel's.
    pub fn arm(&mut self) -> Result<bool, P2pError> {
        self.release_dropped();
        if self.eng.busy() {
            return Ok(false);
        }
        Ok(self.core.arm()?)
    }

    /// What follows every poll: the protocols' outboxes go out, large messages move, and
    /// a protocol fault is reported.
    #[inline(always)]
    fn settle(&mut self) -> Result<(), P2pError> {
        if self.eng.chores { self.chores() } else { Ok(()) }
    }

    #[inline(never)]
    fn chores(&mut self) -> Result<(), P2pError> {
        let r = self.core.flush_outbox();
        self.eng.settle(&mut self.core.ch)?;
        Ok(r?)
    }

    // ---------------------------------------------------------------------------------
    // Checks

    pub(crate) fn check_comm<'a>(&self, comm: &'a Comm) -> Result<&'a Arc<CommInner>, P2pError> {
        if comm.inner.world != self.id {
            return Err(P2pError::WrongWorld("communicator"));
        }
        Ok(&comm.inner)
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

    /// The first of the peers a call waits on (`src`, a world rank, or every member of
    /// `c`) known to have failed.
    pub(crate) fn peer_failed(&mut self, c: &CommInner, src: Option<u32>) -> Option<P2pError> {
        let me = self.rank();
        let one = [src.unwrap_or(0)];
        let peers: &[u32] = if src.is_some() { &one } else { &c.ranks };
        for &p in peers {
            if p == me {
                continue;
            }
            if let Err(crate::ChannelError::PeerFailed { reason, .. }) = self.core.ch.check_peer(p) {
                return Some(P2pError::PeerFailed {
                    rank: c.rank_of(p).unwrap_or(p),
                    reason,
                });
            }
        }
        None
    }

    /// Fails request `id` if the peer it depends on is known to be gone.
    pub(crate) fn check_failed(&mut self, id: u32) {
        let Some(req) = self.eng.reqs.get(id) else { return };
        let comm = match engine::comm_of(req).inner() {
            Some(c) => c.clone(),
            None => self.world.inner.clone(),
        };
        let one;
        let peers: &[u32] = match req {
            Req::Recv(rr) => match (&rr.state, rr.src) {
                (
                    super::requests::RState::Rndv { peer, .. } | super::requests::RState::Arriving { peer },
                    _,
                ) => {
                    one = [*peer];
                    &one
                }
                (_, Some(s)) => {
                    one = [s];
                    &one
                }
                (_, None) => &comm.ranks,
            },
            Req::Send(s) => {
                one = [s.dest];
                &one
            }
        };
        let me = self.rank();
        for &p in peers {
            if p == me {
                continue;
            }
            if let Err(e) = self.core.ch.check_peer(p) {
                let reason = match e {
                    crate::ChannelError::PeerFailed { reason, .. } => reason,
                    other => other.to_string(),
                };
                let rank = comm.rank_of(p).unwrap_or(p);
                let x = self.eng.fail(id, P2pError::PeerFailed { rank, reason });
                self.eng.peer_terminated(p);
                let mut lmt = self.core.ch.lmt();
                for x in x {
                    lmt.end(&x);
                }
                lmt.peer_terminated(p);
                return;
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Waiting

    /// One idle round of a blocked call: nothing for the first polls, then a wait on the
    /// channel, and now and then a check of the peers (`check`).
    #[inline(never)]
    fn idle(
        &mut self,
        idle: &mut Idle,
        what: &dyn Fn() -> String,
        check: &mut dyn FnMut(&mut Self) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        self.idle_busy(idle, false, what, check)
    }

    /// As [`World::idle`]; `busy` when what the call waits for changes without a packet
    /// (a word of shared memory), so that it must not sleep on the channel.
    fn idle_busy(
        &mut self,
        idle: &mut Idle,
        busy: bool,
        what: &dyn Fn() -> String,
        check: &mut dyn FnMut(&mut Self) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        if idle.tight() {
            return Ok(());
        }
        let busy = busy || self.eng.busy();
        if self.core.idle_wait(idle, busy, None, what)? == Tick::CheckPeers {
            check(self)?;
        }
        Ok(())
    }

    /// Drives progress until `done` says so, checking now and then that `peers` (world
    /// ranks) are alive: how the one-sided layer waits for answers, grants and counters.
    /// `busy` when `done` watches shared memory that changes without a packet: the wait
    /// then spins or yields instead of sleeping on the channel, which nothing would ring.
    ///
    /// # Errors
    /// The channel's, a peer's protocol violation, and [`P2pError::PeerFailed`] (with
    /// the world rank) when one of `peers` is found dead.
    pub(crate) fn wait_until(
        &mut self,
        what: &dyn Fn() -> String,
        peers: &[u32],
        busy: bool,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), P2pError> {
        let mut idle = self.core.idle();
        let me = self.rank();
        loop {
            if done(self) {
                return Ok(());
            }
            self.progress()?;
            if done(self) {
                return Ok(());
            }
            self.idle_busy(&mut idle, busy, what, &mut |w| {
                for &p in peers.iter().filter(|&&p| p != me) {
                    if let Err(e) = w.core.ch.check_peer(p) {
                        let reason = match e {
                            crate::ChannelError::PeerFailed { reason, .. } => reason,
                            other => other.to_string(),
                        };
                        return Err(P2pError::PeerFailed { rank: p, reason });
                    }
                }
                Ok(())
            })?;
        }
    }

    /// Drives progress until every request in `ids` is complete (or failed). Each
    /// request is looked at until it is complete and then never again, so the wait costs
    /// time linear in the number of requests.
    pub(crate) fn wait_all_ids(&mut self, ids: &[u32]) -> Result<(), P2pError> {
        self.wait_all_of(ids.len(), |i| ids[i])
    }

    /// As [`World::wait_all_ids`], for the `n` ids that `id` gives by index (0 names a
    /// request complete from the start), so that a caller need not gather them first.
    #[inline]
    pub(crate) fn wait_all_of(&mut self, n: usize, id: impl Fn(usize) -> u32) -> Result<(), P2pError> {
        let mut idle = self.core.idle();
        let mut next = 0;
        loop {
            while next < n && self.eng.reqs.finished(id(next)) {
                next += 1;
            }
            if next == n {
                return Ok(());
            }
            self.progress()?;
            while next < n && self.eng.reqs.finished(id(next)) {
                next += 1;
            }
            if next == n {
                return Ok(());
            }
            let from = next;
            self.idle(&mut idle, &|| describe_wait(n - from), &mut |w| {
                for i in from..n {
                    w.check_failed(id(i));
                }
                Ok(())
            })?;
        }
    }

    /// Waits for request `id`, whose buffer is lent only for the call, and finishes it;
    /// on failure the request is released, so the buffer is never touched again.
    pub(crate) fn block_on(&mut self, id: u32) -> Result<Status, P2pError> {
        let r = self.wait_all_ids(&[id]);
        if r.is_err() || !self.eng.reqs.get(id).is_some_and(Req::is_done) {
            self.release(id);
            r?;
        }
        self.eng.finish(id)
    }

    /// Lets request `id` go (see [`Engine::release`]). A request whose pages the peer
    /// reads or writes in place is first made safe: a send that offered them asks the
    /// receiver to revoke the offer, and either waits for the answer, or for the
    /// transfer to end, whichever comes first; a receive being written waits for the
    /// writer. A dead peer ends the wait.
    pub(crate) fn release(&mut self, id: u32) {
        if self.eng.holds_in_place(id) {
            if let Some(Req::Send(s)) = self.eng.reqs.get(id)
                && matches!(s.state, SState::WaitCts)
            {
                let dest = s.dest;
                if let Err(e) = self.core.ch.send_bytes(dest, wire::ctrl(REVOKE, id), &[]) {
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

    // ---------------------------------------------------------------------------------
    // Starting requests

    /// Starts a send of the `len` bytes in `bufs` to member `dest` of `comm`: eager sends
    /// are complete on return (`None`); large ones return the request to wait for,
    /// whose buffer must stay lent until it completes. `owner`, for an owned request, is
    /// told when it ends.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_send_bufs(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        bufs: Bufs,
        len: usize,
        holder: Holder,
    ) -> Result<Option<u32>, P2pError> {
        let d = comm.world_of(dest)?;
        if len
            <= self
                .eager_to
                .get(d as usize)
                .copied()
                .unwrap_or(self.cfg.eager_limit)
        {
            self.send_eager(d, ctx, tag, &bufs, len)?;
            return Ok(None);
        }
        let local = self.locality.get(d as usize) == Some(&Locality::Local);
        if local && len <= self.cfg.eager_limit {
            // Above the pair eager limit: through the pair buffer when it answers (a
            // ping-pong, whose reply writes the lines its request came in on), else in
            // one packet.
            if !self.send_paired(d, ctx, tag, &bufs, len)? {
                self.send_eager(d, ctx, tag, &bufs, len)?;
            }
            return Ok(None);
        }
        // A message in a stream, which the rendezvous moves with one copy and a run of
        // packets with two, the faster where the CPUs share a cache: up to the stream
        // tune limit, the way this side's recent streams to the peer moved more.
        let mut tuned = false;
        if local
            && len > self.cfg.stream_medium_limit
            && self.cfg.stream_tune_limit > self.cfg.stream_medium_limit
        {
            if self.core.ch.sent_since_taken(d) {
                self.ways.more(d, len, Instant::now);
            } else {
                self.ways.start(d, len, Instant::now());
            }
            tuned = len <= self.cfg.stream_tune_limit;
        }
        if tuned {
            // An answer still goes through the pair buffer; else the way chosen, and by
            // rendezvous when the cells have no room for the packets.
            if self.send_paired(d, ctx, tag, &bufs, len)? {
                return Ok(None);
            }
            let first = if len <= self.cfg.stream_packets_first {
                Way::Packets
            } else {
                Way::Rendezvous
            };
            if self.ways.choose(d, len, first) == Way::Packets && self.run_fits(d, len) {
                self.send_medium(d, ctx, tag, &bufs, len)?;
                self.sent.stream_packets += 1;
                return Ok(None);
            }
        }
        let streamed = tuned
            || local
                && len <= self.cfg.medium_limit
                && len > self.cfg.stream_medium_limit
                && self.core.ch.streams_to(d);
        if len <= self.cfg.medium_limit && local && !streamed {
            if self.send_paired(d, ctx, tag, &bufs, len)? {
                return Ok(None);
            }
            if self.run_fits(d, len) {
                self.send_medium(d, ctx, tag, &bufs, len)?;
                return Ok(None);
            }
        }
        // Longer, an answer that fits the pair buffer still goes through it: without a
        // handshake, its bytes written into the lines the request came in on and read
        // out behind the writer, where a rendezvous pays a round trip first.
        if len > self.cfg.medium_limit && local && !tuned && self.send_paired(d, ctx, tag, &bufs, len)? {
            return Ok(None);
        }
        let mut rts = wire::rts_head(len);
        let nemesis_lmt::Offer {
            strategies: mut offered,
            mut held,
        } = self.core.ch.lmt().offer(d, bufs.segs(), len, &mut rts);
        if rts.len() > self.core.ch.max_payload() {
            // Too many pieces to describe in one packet: no reading in place.
            offered = offered.without_in_place();
            rts.truncate(wire::RTS_HEAD);
            if let Some(h) = held.take() {
                self.core.ch.lmt().end(&h);
            }
        }
        rts[8] = offered.0;
        let id = self.eng.reqs.insert(Req::Send(SendReq {
            bufs,
            len,
            dest: d,
            comm: super::comm::ReqComm::of(comm),
            state: SState::WaitCts,
            offered,
            used: None,
            held: held.map(Box::new),
            owned: None,
            result: Some(Ok(Status {
                source: dest,
                tag,
                len,
            })),
            detached: false,
            holder,
        }))?;
        let h = Header {
            kind: RTS,
            context: ctx,
            tag,
            aux: id,
            flags: 0,
        };
        if let Err(e) = self.core.ch.send_bytes(d, h, &rts) {
            if let Some(Req::Send(s)) = self.eng.reqs.remove(id) {
                if let Some(h) = s.held {
                    self.core.ch.lmt().end(&h);
                }
                // The buffer goes back with the error, not with a completion.
                drop(s.holder);
            }
            return Err(e.into());
        }
        self.sent.rendezvous += 1;
        self.sent.stream_rendezvous += u64::from(streamed && len <= self.cfg.medium_limit);
        Ok(Some(id))
    }

    /// Sends `len` bytes of `bufs` to `d` in one packet.
    #[inline(always)]
    fn send_eager(&mut self, d: u32, ctx: u32, tag: i32, bufs: &Bufs, len: usize) -> Result<(), P2pError> {
        let h = wire::eager(ctx, tag);
        match bufs {
            Bufs::One(s) if !s.ptr.is_null() => {
                // SAFETY: the caller lends the buffer for this call.
                let data = unsafe { std::slice::from_raw_parts(s.ptr.cast_const(), s.len) };
                self.core.ch.send_bytes(d, h, data)?
            }
            b => self.core.ch.send(d, h, &b.slices(0, len))?,
        };
        Ok(())
    }

    /// Sends a medium message through the buffer shared with `d` if it fits and is free:
    /// a MEDIUM packet that says so, then the bytes into the buffer (see `medium.rs`).
    /// Complete on return, as an eager send is; false if the buffer could not be had.
    #[inline(never)]
    fn send_paired(&mut self, d: u32, ctx: u32, tag: i32, bufs: &Bufs, len: usize) -> Result<bool, P2pError> {
        let Some(pb) = self.eng.pairs.as_ref().and_then(|p| p.with(d)) else {
            return Ok(false);
        };
        if len > pb.capacity() || !pb.answers() || !pb.try_claim() {
            return Ok(false);
        }
        let h = Header {
            kind: MEDIUM,
            context: ctx,
            tag,
            aux: len as u32,
            flags: wire::PAIRED,
        };
        if let Err(e) = self.core.ch.send_bytes(d, h, &[]) {
            pb.unclaim();
            return Err(e.into());
        }
        // SAFETY: the caller lends the buffers for this call and they hold `len` bytes;
        // we hold the pair buffer until the receiver frees it.
        unsafe { pb.fill(bufs.segs(), len) };
        self.sent.paired += 1;
        self.sent.paired_short += u64::from(len <= self.cfg.eager_limit);
        self.sent.paired_long += u64::from(len > self.cfg.medium_limit);
        Ok(true)
    }

    /// Whether the cells have room now for `len` bytes to rank `d` as a run of packets.
    fn run_fits(&mut self, d: u32, len: usize) -> bool {
        let packets = len.div_ceil(self.core.ch.max_payload_to(d));
        self.core.ch.room_for_run(d, packets)
    }

    /// Sends a medium message: its packets back to back, the first announcing the length
    /// (see `medium.rs`). Complete on return, as an eager send is.
    fn send_medium(&mut self, d: u32, ctx: u32, tag: i32, bufs: &Bufs, len: usize) -> Result<(), P2pError> {
        let max = self.core.ch.max_payload_to(d);
        let mut h = Header {
            kind: MEDIUM,
            context: ctx,
            tag,
            aux: len as u32,
            flags: 0,
        };
        let mut off = 0;
        while off < len {
            let n = max.min(len - off);
            match bufs {
                Bufs::One(s) if !s.ptr.is_null() => {
                    // SAFETY: the caller lends the buffer for this call; `off + n <= len`.
                    let data = unsafe { std::slice::from_raw_parts(s.ptr.cast_const().add(off), n) };
                    self.core.ch.send_bytes(d, h, data)?
                }
                b => self.core.ch.send(d, h, &b.slices(off, n))?,
            };
            h = wire::ctrl(MDATA, 0);
            off += n;
        }
        self.sent.medium_packets += 1;
        Ok(())
    }

    /// Starts a send of `buf`, lent for the request's life. An eager message to a member
    /// goes here, inline, as a blocking send's does; anything else through
    /// [`World::start_send_bufs`], out of line.
    #[inline(always)]
    pub(crate) fn start_send(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        buf: &[u8],
        holder: Holder,
    ) -> Result<Option<u32>, P2pError> {
        if let Some(&d) = comm.ranks.get(dest as usize)
            && buf.len() <= self.eager_to.get(d as usize).copied().unwrap_or(0)
        {
            let h = wire::eager(ctx, tag);
            self.core.ch.send_bytes(d, h, buf)?;
            return Ok(None);
        }
        self.start_send_bufs(comm, dest, tag, ctx, Bufs::One(Seg::of(buf)), buf.len(), holder)
    }

    /// Starts a receive into `bufs` (lent to the engine until the request completes or is
    /// released). Returns the request, which may already be complete.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn start_recv(
        &mut self,
        comm: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        ctx: u32,
        bufs: impl FnOnce() -> Bufs,
        cap: usize,
        holder: impl FnOnce() -> Holder,
    ) -> Result<u32, P2pError> {
        let src = Self::src_sel(comm, src)?;
        let make = || RecvReq {
            holder: holder(),
            ..RecvReq::new(bufs(), cap, super::comm::ReqComm::of(comm), src)
        };
        let id = self.eng.start_recv(make, ctx, src, tag)?;
        self.settle()?;
        Ok(id)
    }

    // ---------------------------------------------------------------------------------
    // Blocking point to point

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
            return match self.core.ch.send_bytes(d, wire::eager(ctx, tag), buf) {
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
        match self.start_send(c, dest, tag, ctx, buf, Holder::Call)? {
            None => Ok(()),
            Some(id) => self.block_on(id).map(|_| ()),
        }
    }

    /// Receives a message from `src` (or [`super::ANY_SOURCE`]) with `tag` (or
    /// [`super::ANY_TAG`]) into `buf`.
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
        if self.eng.matching.bypass(ctx, src_w, tag) {
            // The message is most likely the next one from a named source, waiting in
            // its fastbox: try for just that first.
            if let Some(s) = src_w {
                let mut f = Fresh {
                    ctx,
                    src: s,
                    tag: tag.unwrap_or(FRESH_ANY_TAG),
                    buf: &mut *buf,
                    found: None,
                    arriving: None,
                };
                let (ch, mut others) = self.core.split();
                let eng = &mut self.eng;
                if ch.poll_from(s, |p| f.offer(eng, &mut others, p)) {
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
                    let (found, arriving) = (f.found, f.arriving);
                    return self.recv_fresh(c, ctx, src_w, tag, buf, found, arriving);
                }
            }
            return self.recv_fresh(c, ctx, src_w, tag, buf, None, None);
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
            Found::Rts { src: peer, tag, rts } => {
                let rr = RecvReq::new(Bufs::One(seg), cap, super::comm::ReqComm::of(c), src);
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

impl<C: Channel> crate::progress::Driven for World<C> {
    type Ch = C;
    type Error = P2pError;
    fn poll_once(&mut self) -> Result<usize, P2pError> {
        self.progress()
    }
    fn busy(&mut self) -> bool {
        self.eng.busy()
    }
    fn core_mut(&mut self) -> &mut Core<C> {
        &mut self.core
    }
    const NAME: &'static str = "World::progress_until";
}

impl<C: Channel> NodeWaiter for World<C> {
    fn progress(&mut self) -> Result<(), P2pError> {
        World::progress(self).map(|_| ())
    }
    fn spins_and_yields(&self) -> (u32, u32) {
        (self.node_wait.spin, self.node_wait.yields)
    }
    fn failure_check(&self) -> Duration {
        self.cfg.failure_check
    }
    fn peer_failed(&mut self, c: &CommInner) -> Option<P2pError> {
        World::peer_failed(self, c, None)
    }
}

impl<C: Channel> Drop for World<C> {
    fn drop(&mut self) {
        // What this process sent must still arrive; give it a little time.
        let _ = self.flush(Duration::from_secs(5));
        self.orphan_owned();
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

fn describe_wait(n: usize) -> String {
    format!("a wait for {n} request(s)")
}

/// What a [`Fresh`] receive found: the sender's world rank, the tag and the length.
#[derive(Debug)]
enum Found {
    /// An eager message, copied into the buffer.
    Eager { src: u32, tag: i32, len: usize },
    /// An RTS (boxed, so the eager case stays small).
    Rts { src: u32, tag: i32, rts: Box<Rts> },
}

/// A blocked receive from a named source looks at that source's fastbox alone, and at
/// everything on every this many rounds.
const FULL_POLL_EVERY: u32 = 8;

/// Matches any source in a [`Fresh`] receive; world ranks are below it.
const FRESH_ANY_SRC: u32 = u32::MAX;
/// Matches any tag in a [`Fresh`] receive; tags are not negative.
const FRESH_ANY_TAG: i32 = -1;

/// A medium message that a [`Fresh`] receive is taking: its packets from `src` go
/// straight into the receive's buffer.
#[derive(Debug, Clone, Copy)]
struct Arriving {
    src: u32,
    tag: i32,
    total: usize,
    got: usize,
    /// Whether the bytes come through the pair buffer rather than MDATA packets.
    paired: bool,
}

impl Arriving {
    /// The whole message, found.
    fn found(&self) -> Found {
        Found::Eager {
            src: self.src,
            tag: self.tag,
            len: self.total,
        }
    }
}

/// A [`Fresh`] receive polling: every packet goes to [`Fresh::offer`], and a long one
/// from a stream transport may be written straight into its buffer ([`Fresh::land`]).
struct FreshSink<'a, 'b, 'o> {
    f: &'a mut Fresh<'b>,
    eng: &'a mut Engine,
    others: &'a mut Others<'o>,
}

impl PacketSink for FreshSink<'_, '_, '_> {
    #[inline(always)]
    fn packet(&mut self, p: Packet<'_>) {
        self.f.offer(self.eng, self.others, p);
    }
    fn arriving(&mut self, src: u32, header: &Header, len: usize, land: &mut dyn Land) -> bool {
        self.f.land(self.eng, src, header, len, land)
    }
    #[inline(always)]
    fn lands(&self) -> bool {
        true
    }
}

/// A blocking `recv` with nothing else posted, offered each fresh packet first.
struct Fresh<'b> {
    ctx: u32,
    src: u32,
    tag: i32,
    buf: &'b mut [u8],
    found: Option<Found>,
    arriving: Option<Arriving>,
}

impl Fresh<'_> {
    /// Whether a message of `h` from `src` is one this receive selects, and it has none
    /// yet.
    #[inline(always)]
    fn waits_for(&self, src: u32, h: &Header) -> bool {
        self.found.is_none()
            && self.arriving.is_none()
            && h.context == self.ctx
            && (self.src == FRESH_ANY_SRC || self.src == src)
            && (self.tag == FRESH_ANY_TAG || self.tag == h.tag)
    }

    /// Has an eager message that is still arriving written straight into the buffer if
    /// it is the first that matches and fits; says whether it was. Only for a receive
    /// that names the source: a landing that gives up has written part of the buffer,
    /// and no other message than this one may then complete the receive.
    #[cold]
    fn land(&mut self, eng: &Engine, src: u32, h: &Header, len: usize, land: &mut dyn Land) -> bool {
        let mine = h.kind == EAGER
            && self.src == src
            && len <= self.buf.len()
            && !eng.medium.interrupted_by(src)
            && self.waits_for(src, h);
        if !mine || !land.land(&mut self.buf[..len]) {
            return false;
        }
        self.found = Some(Found::Eager { src, tag: h.tag, len });
        true
    }

    /// Takes `p` if it is the first that matches; hands anything else on. The medium
    /// protocol's rarer steps are functions that are given fields, never `self`, so that
    /// the receive's state stays in registers on the eager path.
    #[inline(always)]
    fn offer(&mut self, eng: &mut Engine, others: &mut Others<'_>, p: Packet<'_>) {
        let h = p.header;
        if let Some(a) = self.arriving
            && a.src == p.src
        {
            if a.paired {
                self.arriving = None;
                self.found = paired_interrupted(eng, others, a, &mut *self.buf, self.ctx, p);
                return;
            }
            self.arriving = medium_next(eng, a, &mut *self.buf, p);
            if let Some(a) = self.arriving
                && a.got == a.total
            {
                self.found = Some(Found::Eager {
                    src: a.src,
                    tag: a.tag,
                    len: a.total,
                });
                self.arriving = None;
            }
            return;
        }
        // A message the engine is taking from this source through the pair buffer comes
        // before this packet: the engine finishes it first.
        let behind = eng.medium.interrupted_by(p.src);
        if !behind && (h.kind == EAGER || h.kind == RTS || h.kind == MEDIUM) && self.waits_for(p.src, &h) {
            if h.kind == EAGER {
                let n = p.payload.len().min(self.buf.len());
                nemesis_shm::region::copy_into(&mut self.buf[..n], &p.payload[..n]);
                self.found = Some(Found::Eager {
                    src: p.src,
                    tag: h.tag,
                    len: p.payload.len(),
                });
            } else if h.kind == MEDIUM {
                self.arriving = medium_first(eng, &mut *self.buf, p);
                if let Some(a) = &self.arriving
                    && a.got == a.total
                {
                    self.found = Some(Found::Eager {
                        src: a.src,
                        tag: a.tag,
                        len: a.total,
                    });
                    self.arriving = None;
                }
            } else if let Some(rts) = eng.parse_rts(p.src, h.aux, p.payload) {
                self.found = Some(Found::Rts {
                    src: p.src,
                    tag: h.tag,
                    rts: Box::new(rts),
                });
            }
            return;
        }
        let late = (h.kind == MDATA || behind) && self.found.is_none() && self.arriving.is_none();
        dispatch(eng, others, p);
        if late {
            let src = (self.src != FRESH_ANY_SRC).then_some(self.src);
            let tag = (self.tag != FRESH_ANY_TAG).then_some(self.tag);
            if let Some(found) = take_late(eng, self.ctx, src, tag, &mut *self.buf) {
                self.found = Some(found);
            }
        }
    }
}

/// A packet came from the source of the message `a` that a blocking receive into `buf`
/// takes through the pair buffer: the message was written whole before the packet was
/// sent, so it is taken now (and returned, found), and the packet goes on as any other.
/// Given fields, not the receive, so that the receive's state stays in registers.
#[cold]
#[inline(never)]
fn paired_interrupted(
    eng: &mut Engine,
    others: &mut Others<'_>,
    mut a: Arriving,
    buf: &mut [u8],
    ctx: u32,
    p: Packet<'_>,
) -> Option<Found> {
    let found = if pull_fresh(eng, &mut a, buf) {
        Some(a.found())
    } else {
        eng.discard_medium(a.src, ctx, a.tag, a.total, a.got, true);
        eng.fault(p.src, super::medium::PAIRED_BROKEN_OFF);
        None
    };
    dispatch(eng, others, p);
    found
}

/// Copies what the pair buffer holds of the message `a` that a blocking receive into
/// `buf` takes, and frees the buffer once the message is whole; says whether it is.
fn pull_fresh(eng: &Engine, a: &mut Arriving, buf: &mut [u8]) -> bool {
    let Some(pb) = eng.pairs.as_ref().and_then(|p| p.with(a.src)) else {
        return false;
    };
    let mut at = a.got;
    // SAFETY: the peer held the buffer when it announced the message (checked then) and
    // keeps it until we free it; `a.got` is what the last drain returned.
    a.got = unsafe {
        pb.drain(a.got, a.total, |s| {
            if at < buf.len() {
                let n = s.len().min(buf.len() - at);
                nemesis_shm::region::copy_into(&mut buf[at..at + n], &s[..n]);
            }
            at += s.len();
        })
    };
    a.got == a.total
}

/// After the engine took the last packet of a medium message it had gathered aside:
/// if that message waits unexpected and selects a blocking receive of (`ctx`, `src`,
/// `tag`), it is that receive's, for nothing that selected it was waiting when the
/// receive began. Eager bytes are copied into `buf`.
#[cold]
#[inline(never)]
fn take_late(
    eng: &mut Engine,
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
    buf: &mut [u8],
) -> Option<Found> {
    let u = eng.matching.take_unexpected(ctx, src, tag)?;
    Some(match u.body {
        Body::Eager(data) => {
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            Found::Eager {
                src: u.src,
                tag: u.tag,
                len: data.len(),
            }
        }
        Body::Rts(rts) => Found::Rts {
            src: u.src,
            tag: u.tag,
            rts: Box::new(rts),
        },
    })
}

/// The first packet of a medium message for a blocking receive into `buf`: its bytes
/// copied, and what is still to come; `None` (and a fault) if it is malformed.
#[cold]
#[inline(never)]
fn medium_first(eng: &mut Engine, buf: &mut [u8], p: Packet<'_>) -> Option<Arriving> {
    let total = p.header.aux as usize;
    if let Err(what) = eng.medium.check_first(p.src, total, p.payload.len()) {
        eng.fault(p.src, what);
        return None;
    }
    let paired = p.header.flags & wire::PAIRED != 0;
    if paired && let Err(what) = eng.check_paired(p.src, total, p.payload.len()) {
        eng.fault(p.src, what);
        return None;
    }
    let n = p.payload.len().min(buf.len());
    nemesis_shm::region::copy_into(&mut buf[..n], &p.payload[..n]);
    let mut a = Arriving {
        src: p.src,
        tag: p.header.tag,
        total,
        got: p.payload.len(),
        paired,
    };
    if paired {
        eng.medium.paired_taken += 1;
        pull_fresh(eng, &mut a, buf);
    }
    Some(a)
}

/// The next packet from the source of the medium message `a` that a blocking receive
/// into `buf` is taking: its next bytes, copied, and what is still to come. `None` (and
/// a fault) if it is anything but the message's next MDATA: the rest can no longer be
/// told apart.
#[inline(never)]
fn medium_next(eng: &mut Engine, mut a: Arriving, buf: &mut [u8], p: Packet<'_>) -> Option<Arriving> {
    if p.header.kind != MDATA || a.got + p.payload.len() > a.total {
        eng.fault(p.src, "a medium message broken off or overrun");
        return None;
    }
    let at = a.got;
    a.got += p.payload.len();
    if at < buf.len() {
        let n = p.payload.len().min(buf.len() - at);
        nemesis_shm::region::copy_into(&mut buf[at..at + n], &p.payload[..n]);
    }
    Some(a)
}
