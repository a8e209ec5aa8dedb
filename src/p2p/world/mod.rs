//! The world: a job's two-sided endpoint, on the progress core of its channel. Blocking
//! sends and receives, probes, and the loop every blocked call runs.

use super::comm::{Comm, CommInner};
use super::engine::{self, Engine};
use super::node::{NodeColl, NodeWaiter};
use super::owned::Mailbox;
use super::requests::Req;
use super::stream_way::StreamWays;
use super::{Config, Locality, P2pError, SendCounts};
use crate::channel::{Channel, Header, NemesisChannel, Packet, Rank, SendStatus, WaitPolicy};
use crate::progress::{Core, Others, Protocol, ProtocolId, RegistryError};
use nemesis_lmt::Lmt;
use nemesis_shm::Segment;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

mod blocking;
mod fresh;
mod start;
mod wait;

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
        // A strategy forced on the channel's large messages (by `NEMESIS_LMT` or by
        // code) is what they take: no rendezvous that offers only nemesis's own copies.
        if ch.lmt().forced().is_some() {
            cfg.stream_copies_limit = 0;
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
        let n = ch.poll(
            #[inline(always)]
            |p| dispatch_inline(eng, &mut others, p),
        )?;
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
        if crate::p2p::quick::is_quick(id) {
            self.check_failed_quick(id);
            return;
        }
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
        if let Some((p, reason)) = self.first_gone(peers) {
            let rank = comm.rank_of(p).unwrap_or(p);
            let x = self.eng.fail(id, P2pError::PeerFailed { rank, reason });
            self.eng.peer_terminated(p);
            let mut lmt = self.core.ch.lmt();
            for x in x {
                lmt.end(&x);
            }
            lmt.peer_terminated(p);
        }
    }

    /// The first of `peers` (world ranks, this one skipped) the channel finds gone, and
    /// why.
    fn first_gone(&mut self, peers: &[u32]) -> Option<(u32, String)> {
        let me = self.rank();
        for &p in peers.iter().filter(|&&p| p != me) {
            if let Err(e) = self.core.ch.check_peer(p) {
                let reason = match e {
                    crate::ChannelError::PeerFailed { reason, .. } => reason,
                    other => other.to_string(),
                };
                return Some((p, reason));
            }
        }
        None
    }

    /// [`World::check_failed`] for a quick receive: a posted one fails if its source
    /// (for any source, a rank of the world) is gone; one that a request of the table
    /// carries on is that request's to check.
    fn check_failed_quick(&mut self, id: u32) {
        if let Some(t) = self.eng.quick.carrier(id) {
            self.check_failed(t);
            return;
        }
        let Some(src) = self.eng.quick.waits_on(id) else {
            return;
        };
        let world = self.world.inner.clone();
        let one = [src.unwrap_or(0)];
        let peers: &[u32] = if src.is_some() { &one } else { &world.ranks };
        if let Some((p, reason)) = self.first_gone(peers) {
            self.eng.quick.fail(id, P2pError::PeerFailed { rank: p, reason });
            self.eng.peer_terminated(p);
            self.core.ch.lmt().peer_terminated(p);
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

/// A world waiting in the node block of communicator `comm`: what the block's waits
/// ask of it ([`NodeWaiter`]), with the communicator whose members it checks.
pub(crate) struct BlockWait<'a, C: Channel> {
    world: &'a mut World<C>,
    comm: &'a CommInner,
}

impl<'a, C: Channel> BlockWait<'a, C> {
    pub(crate) fn new(world: &'a mut World<C>, comm: &'a CommInner) -> Self {
        Self { world, comm }
    }
}

impl<C: Channel> NodeWaiter for BlockWait<'_, C> {
    fn progress(&mut self) -> Result<(), P2pError> {
        World::progress(self.world).map(|_| ())
    }
    fn spins_and_yields(&self) -> (u32, u32) {
        (self.world.node_wait.spin, self.world.node_wait.yields)
    }
    fn failure_check(&self) -> Duration {
        self.world.cfg.failure_check
    }
    fn peer_failed(&mut self) -> Option<P2pError> {
        self.world.peer_failed(self.comm, None)
    }
}

impl<C: Channel> Drop for World<C> {
    fn drop(&mut self) {
        // What this process sent must still arrive; give it a little time.
        let _ = self.flush(Duration::from_secs(5));
        self.orphan_owned();
    }
}

fn describe_wait(n: usize) -> String {
    format!("a wait for {n} request(s)")
}
