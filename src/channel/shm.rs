//! The channel to peers on this node, over the node's shared segment.

use super::pending::Pending;
use super::wait::{WaitPolicy, outnumber, usable_cpus};
use super::{Channel, ChannelError, Header, Kept, Packet, Rank, SendStatus, SendTicket};
use crate::bootstrap::{Boot, BootInfo};
use nemesis_lmt::{LocalLmt, Policy};
use nemesis_shm::config::shm_dir;
use nemesis_shm::pairbuf::PairBufs;
use nemesis_shm::wake::{SocketWake, WakeSocket};
use nemesis_shm::{Envelope, Geometry, JoinSpec, Lane, PeerState, Port, Segment};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In `local_of`: a rank on another node.
const NOT_LOCAL: u32 = u32::MAX;
/// In `local_of`: our own rank. Both sentinels are above every local index, so one
/// comparison finds the ranks that the port can send to.
const SELF: u32 = u32::MAX - 1;

/// The channel over shared memory. Every peer it serves is on this node; sending to a
/// rank on another node fails with [`ChannelError::NoRoute`].
#[derive(Debug)]
pub struct ShmChannel {
    port: Port<Segment>,
    rank: Rank,
    size: u32,
    /// Rank to local index, or `SELF` or `NOT_LOCAL`.
    local_of: Vec<u32>,
    /// Local index to rank.
    rank_of: Vec<Rank>,
    /// Rank to the port's lane to it: local peers with fastboxes only. A look into one
    /// peer's fastbox goes through it with one check.
    lanes: Box<[Option<Lane>]>,
    /// `lanes`, less the peers whose pending list is not empty (or was not when last
    /// looked at): the send into the next fastbox goes through it with one check, which
    /// is also the check that nothing waits before the packet. A lane left out comes
    /// back at the next slow send to its peer that finds the list empty.
    fast: Box<[Option<Lane>]>,
    /// Packets waiting for room, per local destination, in order.
    pending: Pending,
    /// Packets to hand up before the port's, in order, with their senders: those we
    /// sent ourselves, and those a flush took in (see [`super::Kept`]).
    held: VecDeque<Kept>,
    policy: WaitPolicy,
    max_payload: usize,
    /// The line to the process manager, kept for lazy lookups and finalized on drop.
    boot: Option<Boot>,
    lmt: LocalLmt,
    /// Where local peers wake us while we sleep on a descriptor; none without peers.
    wake: Option<WakeSocket>,
    /// We told the peers to wake us through `wake`; the next poll withdraws it.
    armed: bool,
    /// Why a poll cannot be the port's alone: [`MORE`] while it has more to do than
    /// the port's (pending sends, packets to ourselves, an arm to withdraw), [`NET`]
    /// when the channel above polls a network module beside it, [`MANY`] when the port
    /// is not a pair's. One test on the fast path instead of six.
    detour: u8,
}

/// [`ShmChannel::detour`]'s bit for work of a poll's own beside the port's.
const MORE: u8 = 1;
/// [`ShmChannel::detour`]'s bit for a network module beside the port.
const NET: u8 = 2;
/// [`ShmChannel::detour`]'s bit for a port that is not a pair's ([`Port::is_pair`]):
/// more than one local peer, or no fastboxes. Set once, at the start.
const MANY: u8 = 4;

impl ShmChannel {
    /// The local process of world rank `peer`, if it is one of this segment's.
    #[inline]
    fn local_peer(&self, peer: Rank) -> Option<u32> {
        match self.local_of.get(peer as usize) {
            Some(&local) if local < self.rank_of.len() as u32 => Some(local),
            _ => None,
        }
    }

    /// Joins the job the environment describes (see [`Boot::init`]), or starts alone.
    pub fn init() -> Result<Self, ChannelError> {
        Self::from_boot(Boot::init()?)
    }

    /// Joins the node's segment as `boot` describes: node-local process 0 creates it,
    /// the others attach, and it is unlinked once all have. Keeps `boot`, so that the
    /// process manager hears of us until the channel is dropped.
    pub fn from_boot(boot: Boot) -> Result<Self, ChannelError> {
        let mut ch = Self::join(&boot.info)?;
        ch.boot = Some(boot);
        Ok(ch)
    }

    /// As [`ShmChannel::from_boot`], leaving the line to the process manager to the
    /// caller.
    pub fn join(info: &BootInfo) -> Result<Self, ChannelError> {
        let job_id = info.job_id;
        let nlocal = info.local_ranks.len() as u32;
        let seg = if nlocal == 1 {
            Segment::anonymous(1, Geometry::from_env()?)?
        } else {
            Segment::join(&Self::node_spec(info)?, info.local_index)?
        };
        let policy = WaitPolicy::from_env(info.machine_ranks.max(nlocal), usable_cpus())?;
        Self::from_segment_of_job(
            Arc::new(seg),
            info.rank,
            info.size,
            &info.local_ranks,
            info.local_index,
            policy,
            job_id,
        )
    }

    /// How this process joined the job, when it did through [`ShmChannel::from_boot`].
    pub fn boot(&mut self) -> Option<&mut Boot> {
        self.boot.as_mut()
    }

    /// How the processes `info` places on our node find and make their segment.
    pub fn node_spec(info: &BootInfo) -> Result<JoinSpec, ChannelError> {
        Ok(JoinSpec {
            dir: shm_dir(),
            name: info.segment.clone(),
            job_id: info.job_id,
            node: info.node(),
            nprocs: info.local_ranks.len() as u32,
            geometry: Geometry::from_env()?,
            timeout: info.startup_timeout,
        })
    }

    /// A channel over an existing segment, as the process at `local_index` among
    /// `local_ranks` (the ranks that share the segment, in segment order).
    pub fn from_segment(
        seg: Arc<Segment>,
        rank: Rank,
        size: u32,
        local_ranks: &[Rank],
        local_index: u32,
        policy: WaitPolicy,
    ) -> Result<Self, ChannelError> {
        // Every user of the segment must name its large-transfer files alike, and no user
        // of another segment may: the segment's own random key is both.
        let job_id = seg.wake_key();
        Self::from_segment_of_job(seg, rank, size, local_ranks, local_index, policy, job_id)
    }

    /// As [`ShmChannel::from_segment`], in job `job_id`, whose prefix names the files
    /// that large transfers make.
    fn from_segment_of_job(
        seg: Arc<Segment>,
        rank: Rank,
        size: u32,
        local_ranks: &[Rank],
        local_index: u32,
        policy: WaitPolicy,
        job_id: u64,
    ) -> Result<Self, ChannelError> {
        use nemesis_shm::Region;
        let bad = |reason: String| ChannelError::Config {
            var: "local ranks",
            value: format!("{local_ranks:?} (rank {rank}, index {local_index})"),
            reason,
        };
        if local_ranks.len() as u32 != seg.nprocs() {
            return Err(bad(format!("the segment serves {} processes", seg.nprocs())));
        }
        if local_ranks.get(local_index as usize) != Some(&rank) || rank >= size {
            return Err(bad("our rank is not at our local index".into()));
        }
        let mut local_of = vec![NOT_LOCAL; size as usize];
        for (i, &r) in local_ranks.iter().enumerate() {
            match local_of.get_mut(r as usize) {
                Some(slot) if *slot == NOT_LOCAL => *slot = i as u32,
                _ => return Err(bad(format!("rank {r} is out of range or listed twice"))),
            }
        }
        local_of[rank as usize] = SELF;
        let n = local_ranks.len();
        let wake_key = seg.wake_key();
        let mut port = Port::new(seg, local_index);
        port.set_wake(Arc::new(SocketWake::new(wake_key)));
        port.set_read_ahead(nemesis_shm::config::read_ahead(|k| std::env::var(k).ok())?);
        let wake = if n > 1 {
            Some(
                WakeSocket::bind(wake_key, local_index).map_err(|e| ChannelError::Config {
                    var: "wake socket",
                    value: format!("local process {local_index}"),
                    reason: format!("an abstract unix socket could not be bound: {e}"),
                })?,
            )
        } else {
            None
        };
        let max_payload = port.max_payload();
        if port.region().peer_state(local_index) == PeerState::Absent {
            port.region().publish_pid(local_index);
        }
        let mut lmt = LocalLmt::new(
            rank,
            port.region().clone(),
            local_of
                .iter()
                .map(|&l| match l {
                    NOT_LOCAL => u32::MAX,
                    SELF => local_index,
                    l => l,
                })
                .collect(),
            shm_dir(),
            nemesis_shm::config::job_prefix(job_id),
            Policy::from_env()?,
        )?;
        lmt.set_cpus_shared(outnumber(n as u32, usable_cpus()));
        let lanes: Box<[Option<Lane>]> = local_of.iter().map(|&l| port.lane(l)).collect();
        let detour = if port.is_pair() { 0 } else { MANY };
        Ok(Self {
            port,
            rank,
            size,
            fast: lanes.clone(),
            lanes,
            local_of,
            rank_of: local_ranks.to_vec(),
            pending: Pending::new(n, false),
            held: VecDeque::new(),
            policy,
            max_payload,
            boot: None,
            lmt,
            wake,
            armed: false,
            detour,
        })
    }

    /// The large-message strategies towards local peers.
    pub fn local_lmt(&mut self) -> &mut LocalLmt {
        &mut self.lmt
    }

    /// The segment, for diagnostics and the placement probe.
    pub fn segment(&self) -> &Arc<Segment> {
        self.port.region()
    }

    /// The waiting strategy in force.
    pub fn wait_policy(&self) -> WaitPolicy {
        self.policy
    }

    /// Replaces the waiting strategy.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Keeps `kept`, taken in by a flush, to hand up first at the next poll.
    pub(super) fn hold(&mut self, kept: Vec<Kept>) {
        if !kept.is_empty() {
            self.held.extend(kept);
            self.detour |= MORE;
        }
    }

    /// Marks a network module polled beside this port by the channel above, which
    /// then leaves the pair's fast path ([`ShmChannel::poll_pair`]) for it.
    pub(super) fn beside_net(&mut self) {
        self.detour |= NET;
    }

    /// Whether a poll is the port's alone, and the port a pair's
    /// ([`ShmChannel::poll_pair`]): nothing of the channel's own to do, no network
    /// module beside it, and one local peer, with fastboxes.
    #[inline(always)]
    pub(super) fn pair_alone(&self) -> bool {
        self.detour == 0
    }

    /// Whether a poll is the port's alone, and the port not a pair's: nothing of the
    /// channel's own to do and no network module beside it.
    #[inline(always)]
    pub(super) fn many_alone(&self) -> bool {
        self.detour == MANY
    }

    /// Whether a poll would find something.
    #[inline]
    pub fn ready(&self) -> bool {
        !self.held.is_empty() || self.port.has_work()
    }

    /// Whether other processes share the segment.
    pub fn has_local_peers(&self) -> bool {
        self.rank_of.len() > 1
    }

    /// Sleeps on our doorbell until a local peer rings it or `timeout` passes, unless
    /// something is already there.
    pub(super) fn sleep(&mut self, timeout: Duration) {
        if self.held.is_empty() {
            self.port.sleep(Some(timeout));
        }
    }

    /// Withdraws what [`Channel::arm`] announced: senders stop waking our socket.
    #[cold]
    #[inline(never)]
    fn disarm(&mut self) {
        self.armed = false;
        if let Some(w) = &self.wake {
            self.port.unwatch();
            w.drain();
        }
    }

    /// Whether a sleep on the wait descriptor was announced and not yet withdrawn by a
    /// poll: a send to ourselves must then wake the sleeper another way.
    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// The fast path of [`Channel::send`]: into the peer's fastbox, if it is local, its
    /// box is free and nothing waits before it (`fast`). `false` says only that it did
    /// not go.
    // Always inlined: the fast path is a few dozen instructions, and a call would add a
    // fifth of that again.
    #[inline(always)]
    pub(super) fn try_fast_send(&mut self, peer: Rank, header: Header, payload: &[&[u8]]) -> bool {
        let len = match payload {
            [one] => one.len(),
            many => many.iter().map(|p| p.len()).sum(),
        };
        let env = header.to_envelope();
        if let Some(&Some(lane)) = self.fast.get(peer as usize) {
            // SAFETY: the lane came from our port; `len` is the payload's total.
            unsafe { self.port.try_fbox_lane(lane, &env, payload, len) }
        } else {
            false
        }
    }

    /// Everything [`Channel::send`] does besides a fastbox: checks, loopback, cells,
    /// and the pending list. Called after [`ShmChannel::try_fast_send`] said no.
    #[inline(never)]
    pub(super) fn send_slow(
        &mut self,
        peer: Rank,
        header: Header,
        payload: &[&[u8]],
    ) -> Result<SendStatus, ChannelError> {
        self.send_slow_inline(peer, header, payload)
    }

    /// [`ShmChannel::send_slow`], for a caller that is itself out of line (the
    /// [`super::NemesisChannel`]'s slow path), so that a queued packet costs one call.
    #[inline(always)]
    pub(super) fn send_slow_inline(
        &mut self,
        peer: Rank,
        header: Header,
        payload: &[&[u8]],
    ) -> Result<SendStatus, ChannelError> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let env = header.to_envelope();
        let Some(&local) = self.local_of.get(peer as usize) else {
            return Err(ChannelError::InvalidRank {
                rank: peer,
                size: self.size,
            });
        };
        // Before the size check: a network may carry larger packets than a cell.
        if local == NOT_LOCAL {
            return Err(ChannelError::NoRoute { rank: peer });
        }
        if len > self.max_payload {
            return Err(ChannelError::PacketTooLarge {
                len,
                max: self.max_payload,
            });
        }
        match local {
            SELF => {
                self.held.push_back((self.rank, header, payload.concat()));
                self.detour |= MORE;
                Ok(SendStatus::Sent)
            }
            // With nothing pending to this peer, `try_fast_send` has just found the next
            // fastbox past the one-box path's limits (or the packet longer than one box,
            // which the slow path tries in several), or left the peer out of `fast`
            // while its list was not empty: the slow path tries every way but the list.
            _ if !self.pending.has(local) && self.port.try_send_slow(local, &env, payload, len).is_ok() => {
                self.fast[peer as usize] = self.lanes[peer as usize];
                Ok(SendStatus::Sent)
            }
            _ => {
                self.detour |= MORE;
                self.fast[peer as usize] = None;
                Ok(SendStatus::Queued(self.pending.push(local, env, payload)))
            }
        }
    }

    /// A poll of the port alone; the sink moves down ([`up`]).
    #[inline(always)]
    pub(super) fn poll_port<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError> {
        Ok(self.port.poll(up(&self.rank_of, sink))?)
    }

    /// [`ShmChannel::poll_port`] for a pair's port, where
    /// [`ShmChannel::pair_alone`] said so.
    #[inline(always)]
    pub(super) fn poll_pair<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError> {
        debug_assert_eq!(self.detour & MANY, 0);
        // SAFETY: the MANY bit is clear only where the port said it is a pair's, at the
        // start, and a port stays what it is.
        Ok(unsafe { self.port.poll_pair(up(&self.rank_of, sink)) }?)
    }

    /// The lane to `peer` when its fastbox may be looked at alone: not while a full poll
    /// has more to do ([`Channel::poll_from`]).
    #[inline(always)]
    fn lone_lane(&self, peer: Rank) -> Option<Lane> {
        match self.lanes.get(peer as usize) {
            Some(&Some(lane)) if self.detour & MORE == 0 => Some(lane),
            _ => None,
        }
    }

    /// A poll with [`ShmChannel::poll_extra`]'s work to do first; takes the sink over
    /// (see [`ShmChannel::poll_port`]).
    #[inline(never)]
    fn poll_with_extra<F: FnMut(Packet<'_>)>(&mut self, mut sink: F) -> Result<usize, ChannelError> {
        let n = self.poll_extra(&mut sink);
        Ok(n + self.poll_port(sink)?)
    }

    /// What a poll does besides the port's: withdraws an arm, moves pending sends on,
    /// and hands up the packets held back (ours to ourselves, a flush's).
    fn poll_extra<F: FnMut(Packet<'_>)>(&mut self, sink: &mut F) -> usize {
        if self.armed {
            self.disarm();
        }
        if self.pending.count() > 0 {
            self.drain_pending();
        }
        let n = if self.held.is_empty() {
            0
        } else {
            self.drain_held(sink)
        };
        let more = self.pending.count() > 0 || !self.held.is_empty();
        self.detour = (self.detour & !MORE) | if more { MORE } else { 0 };
        n
    }

    /// Hands up the packets held back, in order.
    fn drain_held<F: FnMut(Packet<'_>)>(&mut self, sink: &mut F) -> usize {
        let mut n = 0;
        while let Some((src, header, data)) = self.held.pop_front() {
            sink(Packet {
                src,
                header,
                payload: &data,
            });
            n += 1;
        }
        n
    }

    /// Moves queued packets into the transport, each destination in order, until a
    /// destination has no room; one full destination does not hold up the others.
    #[inline(never)]
    fn drain_pending(&mut self) {
        let port = &mut self.port;
        let _ = self.pending.drain(|local, m| {
            // SAFETY: only other local processes get pending lists.
            let sent = unsafe { port.try_send_unchecked(local, &m.env, &[&m.data], m.data.len()) };
            Ok::<_, std::convert::Infallible>(Some(sent.is_ok()))
        });
    }
}

impl Channel for ShmChannel {
    #[inline]
    fn rank(&self) -> Rank {
        self.rank
    }

    #[inline]
    fn size(&self) -> u32 {
        self.size
    }

    #[inline]
    fn is_local(&self, peer: Rank) -> bool {
        self.local_of.get(peer as usize).is_some_and(|&l| l != NOT_LOCAL)
    }

    #[inline]
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    #[inline(always)]
    fn send(&mut self, peer: Rank, header: Header, payload: &[&[u8]]) -> Result<SendStatus, ChannelError> {
        if self.try_fast_send(peer, header, payload) {
            return Ok(SendStatus::Sent);
        }
        self.send_slow(peer, header, payload)
    }

    #[inline(always)]
    fn try_send_now(&mut self, peer: Rank, header: Header, payload: &[u8]) -> bool {
        self.try_fast_send(peer, header, std::slice::from_ref(&payload))
    }

    fn is_sent(&self, ticket: SendTicket) -> bool {
        self.pending.is_sent(ticket)
    }

    fn pending(&self) -> usize {
        self.pending.count()
    }

    fn flush(&mut self, timeout: Duration) -> Result<(), ChannelError> {
        let mut kept = Vec::new();
        let r = super::drive_until_delivered(self, timeout, |c| c.pending.count(), &mut kept);
        self.hold(kept);
        r
    }

    fn room_for_run(&mut self, peer: Rank, packets: usize) -> bool {
        match self.local_peer(peer) {
            Some(local) => self.pending.count() == 0 && self.port.cells_for(local) >= packets,
            None => self.pending.count() == 0,
        }
    }

    #[inline]
    fn streams_to(&self, peer: Rank) -> bool {
        self.local_peer(peer).is_some_and(|l| self.port.streams_to(l))
    }

    #[inline]
    fn sent_since_taken(&self, peer: Rank) -> bool {
        self.local_peer(peer)
            .is_some_and(|l| self.port.sent_since_taken(l))
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError> {
        if self.detour & MORE != 0 {
            return self.poll_with_extra(sink);
        }
        if self.detour & MANY == 0 {
            return self.poll_pair(sink);
        }
        self.poll_port(sink)
    }

    /// Looks in `peer`'s fastbox, where the next packet from `peer` usually is; not while
    /// a full poll has more to do (sends waiting in the pending lists, which only it moves
    /// on, or held packets, which come before anything newer from their sender).
    #[inline]
    fn poll_from<F: FnMut(Packet<'_>)>(&mut self, peer: Rank, sink: F) -> bool {
        match self.lone_lane(peer) {
            // SAFETY: the lane came from our port.
            Some(lane) => unsafe { self.port.poll_fbox_lane(lane, from_lane(peer, sink)) },
            None => false,
        }
    }

    /// [`ShmChannel::poll_from`] for a packet that `want` accepts, decided on its
    /// header and length before anything of it is handed up.
    #[inline]
    fn poll_from_if<W, F>(&mut self, peer: Rank, want: W, sink: F) -> bool
    where
        W: FnOnce(&Header, usize) -> bool,
        F: FnMut(Packet<'_>),
    {
        match self.lone_lane(peer) {
            // SAFETY: the lane came from our port.
            Some(lane) => unsafe {
                self.port.poll_fbox_lane_if(
                    lane,
                    #[inline(always)]
                    |env, len| want(&Header::from_envelope(env), len),
                    from_lane(peer, sink),
                )
            },
            None => false,
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        let start = Instant::now();
        for _ in 0..self.policy.spin {
            if self.ready() {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        for _ in 0..self.policy.yields {
            if self.ready() {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let slice = match timeout {
            None => self.policy.slice,
            Some(t) => match t.checked_sub(start.elapsed()) {
                Some(left) if !left.is_zero() => left.min(self.policy.slice),
                _ => return Ok(()),
            },
        };
        self.sleep(slice);
        Ok(())
    }

    fn lmt(&mut self) -> nemesis_lmt::Routes<'_> {
        nemesis_lmt::Routes::new(Some(&mut self.lmt), None, None)
    }

    fn wait_policy(&self) -> Option<WaitPolicy> {
        Some(self.policy)
    }

    /// The wake socket of this process, where local peers wake it; `None` when there are
    /// no local peers, and so nothing to wait for.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.wake.as_ref().map(|w| w.as_fd())
    }

    fn arm(&mut self) -> Result<bool, ChannelError> {
        if !self.held.is_empty() {
            return Ok(false);
        }
        if self.wake.is_none() {
            // No peer can wake us; only a send to ourselves could, which whoever owns the
            // descriptor hears of through `armed`.
            self.armed = true;
            self.detour |= MORE;
            return Ok(true);
        }
        if self.armed {
            // Drain what an earlier wake-up left, so the descriptor tells of new work only.
            if let Some(w) = &self.wake {
                w.drain();
            }
        }
        self.armed = self.port.watch();
        if self.armed {
            self.detour |= MORE;
        }
        Ok(self.armed)
    }

    fn node_segment(&self) -> Option<Arc<Segment>> {
        Some(self.segment().clone())
    }

    fn pair_bufs(&self) -> Option<PairBufs> {
        // Ourselves and ranks elsewhere have no buffer: both sentinels become `u32::MAX`.
        let local_of = self
            .local_of
            .iter()
            .map(|&l| if l >= SELF { u32::MAX } else { l })
            .collect();
        PairBufs::new(self.segment().clone(), self.port.me(), local_of)
    }

    fn check_peer(&self, peer: Rank) -> Result<(), ChannelError> {
        let Some(&local) = self.local_of.get(peer as usize) else {
            return Err(ChannelError::InvalidRank {
                rank: peer,
                size: self.size,
            });
        };
        if local == NOT_LOCAL || local == SELF {
            return Ok(());
        }
        match self.segment().peer_state(local) {
            PeerState::Dead { pid } => Err(ChannelError::PeerFailed {
                rank: peer,
                reason: format!("its process (pid {pid}) is gone"),
            }),
            PeerState::Left => Err(ChannelError::PeerFailed {
                rank: peer,
                reason: "it has left the job".into(),
            }),
            PeerState::Absent | PeerState::Alive { .. } => Ok(()),
        }
    }
}

/// The port's sink for a packet from `peer`'s lane, made a [`Packet`] for `sink`. Inline
/// always: the sink is the caller's match, whose state would otherwise be passed through
/// memory.
#[inline(always)]
fn from_lane<F: FnMut(Packet<'_>)>(peer: Rank, mut sink: F) -> impl FnMut(u32, &Envelope, &[u8]) {
    #[inline(always)]
    move |_, env, payload| {
        sink(Packet {
            src: peer,
            header: Header::from_envelope(env),
            payload,
        })
    }
}

/// The port's sink for a packet from any local process, made a [`Packet`] for `sink`
/// with the sender's world rank from `rank_of`. The sink moves in, and on into the
/// port's out-of-line queue part, so that nothing on the fastbox path is lent to a call
/// and kept in memory for it.
#[inline(always)]
// A thin pointer: the slice's parts are loaded only where a packet is handed up.
#[allow(clippy::ptr_arg)]
fn up<'a, F: FnMut(Packet<'_>) + 'a>(
    rank_of: &'a Vec<Rank>,
    mut sink: F,
) -> impl FnMut(u32, &Envelope, &[u8]) + 'a {
    #[inline(always)]
    move |src, env, payload| {
        // SAFETY: the port reports sources below its process count, the length of
        // `rank_of` (checked in `from_segment`).
        let src = unsafe { *rank_of.get_unchecked(src as usize) };
        sink(Packet {
            src,
            header: Header::from_envelope(env),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nemesis_shm::Geometry;

    /// `n` channels on one anonymous segment, as ranks 0..n.
    pub(crate) fn local_job(n: u32, geo: Geometry) -> Vec<ShmChannel> {
        let seg = Arc::new(Segment::anonymous(n, geo).unwrap());
        let ranks: Vec<Rank> = (0..n).collect();
        let policy = WaitPolicy {
            spin: 100,
            yields: 2,
            slice: Duration::from_millis(50),
        };
        (0..n)
            .map(|i| ShmChannel::from_segment(seg.clone(), i, n, &ranks, i, policy).unwrap())
            .collect()
    }

    fn recv_all(ch: &mut ShmChannel) -> Vec<(Rank, Header, Vec<u8>)> {
        let mut out = Vec::new();
        ch.poll(|p| out.push((p.src, p.header, p.payload.to_vec())))
            .unwrap();
        out
    }

    fn tag(t: i32) -> Header {
        Header {
            tag: t,
            ..Header::default()
        }
    }

    #[test]
    fn errors_for_bad_rank_and_oversized_packet() {
        let mut j = local_job(2, Geometry::default());
        let e = j[0].send_bytes(2, tag(0), b"x").unwrap_err();
        assert!(matches!(e, ChannelError::InvalidRank { rank: 2, size: 2 }), "{e}");
        let max = j[0].max_payload();
        let big = vec![0u8; max + 1];
        let e = j[0].send_bytes(1, tag(0), &big).unwrap_err();
        assert!(
            matches!(e, ChannelError::PacketTooLarge { len, max: m } if len == max + 1 && m == max),
            "{e}"
        );
        assert!(e.to_string().contains("NEMESIS_CELL_SIZE"));
        assert!(j[0].check_peer(9).is_err());
        // Nothing was queued or delivered by the failed sends.
        assert_eq!(j[0].pending(), 0);
        assert!(recv_all(&mut j[1]).is_empty());
        // The largest packet is fine.
        j[0].send_bytes(1, tag(1), &big[..max]).unwrap();
        assert_eq!(recv_all(&mut j[1])[0].2.len(), max);
    }

    #[test]
    fn a_packet_from_a_peer_is_taken_only_when_wanted_and_else_left_for_the_poll() {
        let mut j = local_job(2, Geometry::default());
        j[0].send_bytes(1, tag(7), b"seven").unwrap();
        j[0].send_bytes(1, tag(8), b"eight").unwrap();
        let mut asked = Vec::new();
        assert!(!j[1].poll_from_if(
            0,
            |h, len| {
                asked.push((h.tag, len));
                h.tag == 8
            },
            |_| panic!("not wanted")
        ));
        assert_eq!(asked, [(7, 5)], "asked of the next packet alone, with its length");
        let mut got = Vec::new();
        assert!(j[1].poll_from_if(
            0,
            |h, _| h.tag == 7,
            |p| got.push((p.src, p.header, p.payload.to_vec()))
        ));
        assert_eq!(got, [(0, tag(7), b"seven".to_vec())]);
        assert_eq!(recv_all(&mut j[1]), [(0, tag(8), b"eight".to_vec())]);
        assert!(!j[1].poll_from_if(0, |_, _| true, |_| panic!("nothing more")));
        // Not from ourselves, nor from a rank that is not there.
        j[1].send_bytes(1, tag(9), b"me").unwrap();
        assert!(!j[1].poll_from_if(1, |_, _| true, |_| panic!("not by a lane")));
        assert!(!j[1].poll_from_if(5, |_, _| true, |_| panic!("no such rank")));
        assert_eq!(recv_all(&mut j[1]), [(1, tag(9), b"me".to_vec())]);
    }

    #[test]
    fn loopback_and_gather() {
        let mut j = local_job(2, Geometry::default());
        assert_eq!(j[1].send(1, tag(5), &[b"he", b"llo"]).unwrap(), SendStatus::Sent);
        assert!(j[1].ready());
        assert_eq!(recv_all(&mut j[1]), vec![(1, tag(5), b"hello".to_vec())]);
        j[0].send(1, tag(6), &[b"wor", b"ld"]).unwrap();
        assert_eq!(recv_all(&mut j[1]), vec![(0, tag(6), b"world".to_vec())]);
    }

    #[test]
    fn queued_sends_drain_in_order_and_tickets_complete() {
        let geo = Geometry {
            cells_per_proc: 2,
            cell_size: 256,
            fbox_size: 128,
            fbox_slots: 1,
            pair_size: 0,
        };
        let mut j = local_job(2, geo);
        let mut tickets = Vec::new();
        for i in 0..10 {
            match j[0].send_bytes(1, tag(i), &[i as u8; 100]).unwrap() {
                SendStatus::Sent => {}
                SendStatus::Queued(t) => tickets.push(t),
            }
        }
        assert!(
            !tickets.is_empty(),
            "two cells and a fastbox cannot hold ten packets"
        );
        assert!(tickets.iter().all(|&t| !j[0].is_sent(t)));
        let mut got = Vec::new();
        while got.len() < 10 {
            j[0].poll(|_| {}).unwrap();
            got.extend(recv_all(&mut j[1]));
        }
        assert_eq!(
            got.iter().map(|m| m.1.tag).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        assert!(got.iter().all(|m| m.2 == vec![m.1.tag as u8; 100]));
        assert!(tickets.iter().all(|&t| j[0].is_sent(t)));
        assert_eq!(j[0].pending(), 0);
    }

    #[test]
    fn only_a_pair_with_fastboxes_polls_the_pair_way_and_every_way_delivers_in_order() {
        let off = Geometry {
            fbox_size: 0,
            ..Geometry::default()
        };
        for (n, geo, pair) in [
            (2, Geometry::default(), true),
            (2, off, false),
            (3, Geometry::default(), false),
        ] {
            let mut j = local_job(n, geo);
            assert_eq!(j[1].pair_alone(), pair, "{n} processes, {geo:?}");
            let big = vec![3u8; 2000];
            for i in 0..6 {
                let data: &[u8] = if i % 3 == 1 { &big } else { b"small" };
                j[0].send_bytes(1, tag(i), data).unwrap();
            }
            let mut got = Vec::new();
            while got.len() < 6 {
                j[0].poll(|_| {}).unwrap();
                got.extend(recv_all(&mut j[1]).into_iter().map(|m| (m.0, m.1.tag, m.2.len())));
            }
            let want: Vec<_> = (0..6)
                .map(|i| (0, i, if i % 3 == 1 { 2000 } else { 5 }))
                .collect();
            assert_eq!(got, want, "{n} processes, {geo:?}");
        }
    }

    #[test]
    fn a_slow_receiver_does_not_stall_others() {
        let geo = Geometry {
            cells_per_proc: 4,
            cell_size: 256,
            fbox_size: 0,
            fbox_slots: 1,
            pair_size: 0,
        };
        let mut j = local_job(3, geo);
        // Rank 1 never polls; rank 0 keeps sending to it.
        for i in 0..20 {
            j[0].send_bytes(1, tag(i), b"to the slow one").unwrap();
        }
        assert!(j[0].pending() > 0);
        for i in 0..20 {
            assert_eq!(
                j[0].send_bytes(2, tag(i), b"to the fast one").unwrap(),
                SendStatus::Sent
            );
            j[0].poll(|_| {}).unwrap();
            assert_eq!(recv_all(&mut j[2]).len(), 1, "message {i} to rank 2 was held up");
        }
        // The slow one catches up and gets everything, in order.
        let mut got = Vec::new();
        while got.len() < 20 {
            j[0].poll(|_| {}).unwrap();
            got.extend(recv_all(&mut j[1]).into_iter().map(|m| m.1.tag));
        }
        assert_eq!(got, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn flush_times_out_while_the_receiver_is_away() {
        let geo = Geometry {
            cells_per_proc: 2,
            cell_size: 256,
            fbox_size: 0,
            fbox_slots: 1,
            pair_size: 0,
        };
        let mut j = local_job(2, geo);
        j[1].send_bytes(0, tag(100), b"y").unwrap();
        for i in 0..5 {
            j[0].send_bytes(1, tag(i), b"x").unwrap();
        }
        let e = j[0].flush(Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, ChannelError::FlushTimeout { pending: 3, .. }), "{e}");
        // What came in while it waited is kept for the next poll, not dropped.
        let got = recv_all(&mut j[0]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0, got[0].1.tag), (1, 100));
    }

    #[test]
    fn wait_sleeps_and_a_send_wakes_it() {
        let mut j = local_job(2, Geometry::default());
        let mut b = j.pop().unwrap();
        let mut a = j.pop().unwrap();
        let t = std::thread::spawn(move || {
            let mut got = None;
            while got.is_none() {
                b.poll_wait(|p| got = Some(p.header.tag), Some(Duration::from_secs(30)))
                    .unwrap();
            }
            got
        });
        std::thread::sleep(Duration::from_millis(30));
        a.send_bytes(1, tag(42), b"").unwrap();
        assert_eq!(t.join().unwrap(), Some(42));
    }

    #[test]
    fn poll_wait_times_out_with_nothing() {
        let mut j = local_job(2, Geometry::default());
        assert_eq!(
            j[0].poll_wait(|_| {}, Some(Duration::from_millis(10))).unwrap(),
            0
        );
    }

    #[test]
    fn bad_local_rank_lists_are_refused() {
        let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
        let p = WaitPolicy {
            spin: 1,
            yields: 1,
            slice: Duration::from_millis(1),
        };
        assert!(ShmChannel::from_segment(seg.clone(), 0, 2, &[0, 0], 0, p).is_err());
        assert!(ShmChannel::from_segment(seg.clone(), 0, 2, &[0], 0, p).is_err());
        assert!(ShmChannel::from_segment(seg.clone(), 1, 2, &[0, 1], 0, p).is_err());
        assert!(ShmChannel::from_segment(seg, 0, 2, &[0, 5], 0, p).is_err());
    }
}
