//! The channel of a job: shared memory to the peers on this node, a network module to
//! the others.
//!
//! Sends try shared memory first, whose fast path is unchanged; a rank it cannot reach
//! goes to the netmod under the same rule: taken now, or copied into that destination's
//! pending list. Polls look at the node first and at the network less often while the
//! node keeps them busy, since every look at the network is a system call.

use super::pending::Pending;
use super::wait::{WaitPolicy, usable_cpus};
use super::waitset::WaitSet;
use super::{
    Channel, ChannelError, Header, Land, Packet, PacketSink, Rank, SendStatus, SendTicket, ShmChannel,
};
use crate::bootstrap::{Boot, BootInfo};
use nemesis_net::{Accept, Cards, Identity, NetError, NetStats, Netmod, WaitHint};
use nemesis_shm::Segment;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Forces every peer, local ones too, through the network module when `1`.
pub const NO_SHM_VAR: &str = "NEMESIS_NO_SHM";

/// The key-value name under which each rank publishes its netmod's business card.
const CARD: &str = "nem-card";

/// While local peers keep polls busy, the network is looked at on every this many
/// polls (and whenever a wait saw it ready).
const NET_POLL_EVERY: u32 = 16;

/// While local peers may ring the doorbell, a spinning waiter looks at the network on
/// every this many spins.
const NET_SPIN_EVERY: u32 = 64;

/// A netmod without a wait descriptor cannot be slept on: a waiter looks at it again
/// after at most this long.
const BLIND_SLEEP: Duration = Duration::from_millis(1);

/// How long a dropped channel waits for the network to deliver what it owes, and then
/// for its goodbyes.
const DROP_FLUSH: Duration = Duration::from_secs(5);
const DROP_SHUTDOWN: Duration = Duration::from_secs(2);

/// The network part: the netmod and the packets it had no room for, by rank.
#[derive(Debug)]
struct Net {
    netmod: Box<dyn Netmod>,
    pending: Pending,
    max_payload: usize,
    /// Polls left before the network is looked at again while the node is busy.
    skip: u32,
    /// `NET_POLL_EVERY`, or 0 without local peers: then every poll looks.
    every: u32,
    /// The last wait saw the network ready.
    hint: bool,
    /// Whether the netmod has a descriptor to sleep on.
    has_fd: bool,
    /// Registrations of pinned buffers kept for the netmod's RDMA.
    regs: nemesis_lmt::RegCache,
}

impl Net {
    fn poll<S: PacketSink>(&mut self, sink: &mut S, node_busy: bool) -> Result<usize, ChannelError> {
        if node_busy && !self.hint && self.skip > 0 {
            self.skip -= 1;
            return Ok(0);
        }
        self.skip = self.every;
        self.hint = false;
        self.drain()?;
        let n = self.netmod.poll_landing(&mut Up(sink))?;
        // Acknowledgements may have made room.
        self.drain()?;
        Ok(n)
    }

    /// Moves pending packets into the netmod, each destination in order; a failed
    /// destination's packets are discarded.
    fn drain(&mut self) -> Result<(), ChannelError> {
        if self.pending.count() == 0 {
            return Ok(());
        }
        let netmod = &mut self.netmod;
        self.pending
            .drain(|rank, m| match netmod.send(rank, &m.env, &[&m.data]) {
                Ok(Accept::Sent) => Ok(Some(true)),
                Ok(Accept::Again) => Ok(Some(false)),
                Err(NetError::PeerFailed { .. }) => Ok(None),
                Err(e) => Err(ChannelError::from(e)),
            })?;
        Ok(())
    }
}

/// A channel's sink, as a netmod's.
struct Up<'s, S>(&'s mut S);

impl<S: PacketSink> nemesis_net::Sink for Up<'_, S> {
    fn packet(&mut self, src: u32, env: &nemesis_net::Envelope, payload: &[u8]) {
        self.0.packet(Packet {
            src,
            header: Header::from_envelope(env),
            payload,
        })
    }
    fn arriving(&mut self, src: u32, env: &nemesis_net::Envelope, len: usize, land: &mut dyn Land) -> bool {
        self.0.arriving(src, &Header::from_envelope(env), len, land)
    }
    fn lands(&self) -> bool {
        self.0.lands()
    }
}

/// The line to the process manager. A panic while it was held leaves nothing half
/// done that matters here, so a poisoned lock is taken as it is.
fn lock(boot: &Mutex<Boot>) -> std::sync::MutexGuard<'_, Boot> {
    boot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a netmod finds business cards: the job's key-value space, asked once per peer
/// on first contact.
struct KvsCards(Arc<Mutex<Boot>>);

impl Cards for KvsCards {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        lock(&self.0).fetch(rank, CARD).map_err(|e| NetError::BadCard {
            rank,
            reason: e.to_string(),
        })
    }
}

/// The channel over shared memory and a network module.
#[derive(Debug)]
pub struct NemesisChannel {
    shm: ShmChannel,
    net: Option<Net>,
    info: Option<BootInfo>,
    /// The line to the process manager, shared with the netmod's card lookups and
    /// finalized when the last holder lets go.
    boot: Option<Arc<Mutex<Boot>>>,
    /// Shared memory's wake socket, the netmod's descriptor and its timer in one
    /// descriptor; `None` if one could not be made (then waits look now and then).
    waits: Option<WaitSet>,
}

impl NemesisChannel {
    /// Joins the job the environment describes (see [`Boot::init`]), or starts alone.
    pub fn init() -> Result<Self, ChannelError> {
        Self::from_boot(Boot::init()?)
    }

    /// Joins the node's segment as `boot` describes and, when some peers are on other
    /// nodes (or `NEMESIS_NO_SHM=1`), opens the network module `NEMESIS_NETMOD` names,
    /// publishes its business card and meets the others at a barrier.
    pub fn from_boot(boot: Boot) -> Result<Self, ChannelError> {
        Self::from_boot_with(boot, |k| std::env::var(k).ok())
    }

    /// As [`NemesisChannel::from_boot`], reading variables through `get`.
    pub fn from_boot_with(boot: Boot, get: impl Fn(&str) -> Option<String>) -> Result<Self, ChannelError> {
        let info = boot.info.clone();
        let no_shm = nemesis_shm::config::switch(&get, NO_SHM_VAR)
            .map_err(|value| ChannelError::Config {
                var: NO_SHM_VAR,
                value,
                reason: nemesis_shm::config::SWITCH_EXPECTED.into(),
            })?
            .unwrap_or(false);
        // Without shared memory every other rank is as good as on another node.
        let view = if no_shm {
            BootInfo {
                local_ranks: vec![info.rank],
                local_index: 0,
                ..info.clone()
            }
        } else {
            info.clone()
        };
        let mut shm = ShmChannel::join(&view)?;
        // Waiting is tuned to the processes that really share the CPUs.
        shm.set_wait_policy(WaitPolicy::from_lookup(info.machine_ranks, usable_cpus(), &get)?);
        let boot = Arc::new(Mutex::new(boot));
        let netmod = if view.local_ranks.len() as u32 == info.size {
            // No netmod opens here, but a bad network variable fails here as it would on
            // many nodes.
            nemesis_net::check_config(&get)?;
            None
        } else {
            let name = nemesis_net::config::netmod(&get)?;
            let all_here = info.local_ranks.len() as u32 == info.size;
            let id = Identity {
                rank: info.rank,
                size: info.size,
                job_key: lock(&boot).job_key()?,
                addr: nemesis_net::addr::choose(&get, all_here)?,
            };
            let netmod = nemesis_net::open(name, id, Box::new(KvsCards(boot.clone())), &get)?;
            let mut b = lock(&boot);
            b.publish(CARD, &netmod.business_card())?;
            b.barrier()?;
            Some(netmod)
        };
        let mut ch = Self::with_netmod(shm, netmod);
        ch.info = Some(info);
        ch.boot = Some(boot);
        Ok(ch)
    }

    /// A channel over `shm` and, for the ranks that `shm` cannot reach, `netmod`.
    pub fn with_netmod(mut shm: ShmChannel, netmod: Option<Box<dyn Netmod>>) -> Self {
        if netmod.is_some() {
            shm.beside_net();
        }
        let size = shm.size();
        let every = if shm.has_local_peers() { NET_POLL_EVERY } else { 0 };
        let fds: Vec<BorrowedFd<'_>> = shm
            .wait_fd()
            .into_iter()
            .chain(netmod.as_ref().and_then(|n| n.wait_fd()))
            .collect();
        let waits = WaitSet::new(&fds).ok();
        drop(fds);
        Self {
            net: netmod.map(|netmod| Net {
                max_payload: netmod.max_payload(),
                has_fd: netmod.wait_fd().is_some(),
                netmod,
                pending: Pending::new(size as usize, true),
                skip: 0,
                every,
                hint: false,
                regs: nemesis_lmt::RegCache::default(),
            }),
            shm,
            info: None,
            boot: None,
            waits,
        }
    }

    /// The shared-memory part.
    pub fn shm(&self) -> &ShmChannel {
        &self.shm
    }

    /// The shared-memory part, to tune it.
    pub fn shm_mut(&mut self) -> &mut ShmChannel {
        &mut self.shm
    }

    /// The network module, if the job needs one.
    pub fn netmod(&self) -> Option<&dyn Netmod> {
        self.net.as_ref().map(|n| &*n.netmod)
    }

    /// Which transport reaches peers on other nodes: `shm` when there are none, else
    /// the netmod's name.
    pub fn transport(&self) -> &'static str {
        self.net.as_ref().map_or("shm", |n| n.netmod.name())
    }

    /// The network module's counters, if there is one.
    pub fn net_stats(&self) -> Option<NetStats> {
        self.net.as_ref().map(|n| n.netmod.stats())
    }

    /// This process's place in the job, as start-up found it; `None` for a channel
    /// put together from parts.
    pub fn boot_info(&self) -> Option<&BootInfo> {
        self.info.as_ref()
    }

    /// Everything but a fastbox: shared memory's slow path, and the network for the
    /// ranks shared memory does not reach. The error comes boxed: a result as large as
    /// [`ChannelError`] was copied out through memory on every queued packet. The header
    /// comes as its two words ([`pair`]).
    #[inline(never)]
    fn send_slow(
        &mut self,
        peer: Rank,
        (w0, w1): (u64, u64),
        payload: &[&[u8]],
    ) -> Result<SendStatus, Box<ChannelError>> {
        let header = Header::from_envelope(&[w0, w1]);
        match self.shm.send_slow_inline(peer, header, payload) {
            Err(ChannelError::NoRoute { .. }) if self.net.is_some() => {
                self.send_net(peer, header, payload).map_err(Box::new)
            }
            Ok(s) if peer == self.shm.rank() && self.shm.armed() => {
                // Nothing rings for a packet to ourselves: whoever sleeps on the wait
                // descriptor (another task of this process) hears of it from the timer.
                if let Some(w) = &self.waits {
                    let _ = w.set_timer(Some(Instant::now()));
                }
                Ok(s)
            }
            r => r.map_err(Box::new),
        }
    }

    fn send_net(
        &mut self,
        peer: Rank,
        header: Header,
        payload: &[&[u8]],
    ) -> Result<SendStatus, ChannelError> {
        let Some(net) = self.net.as_mut() else {
            return Err(ChannelError::NoRoute { rank: peer });
        };
        let len: usize = payload.iter().map(|p| p.len()).sum();
        if len > net.max_payload {
            return Err(ChannelError::PacketTooLarge {
                len,
                max: net.max_payload,
            });
        }
        let env = header.to_envelope();
        if !net.pending.has(peer) {
            match net.netmod.send(peer, &env, payload) {
                Ok(Accept::Sent) => return Ok(SendStatus::Sent),
                Ok(Accept::Again) => {}
                // As a packet put in a dead local peer's queue is, this one is gone;
                // `check_peer` tells the sender, which is how it learns of failures.
                Err(NetError::PeerFailed { .. }) => return Ok(SendStatus::Sent),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(SendStatus::Queued(net.pending.push(peer, env, payload)))
    }

    /// [`Channel::poll`] where it is not a pair's port's alone: the port of more than
    /// one peer alone, or [`NemesisChannel::poll_detour`]. Takes the sink over, so
    /// that a poll of the port alone lends it to nothing (lent, it would be kept in
    /// memory). Out of line, so that the pair's poll keeps its registers: inlined, the
    /// loop over peers cost it 5 instructions (`scripts/icount.sh channel`).
    #[inline(never)]
    fn poll_other<F: FnMut(Packet<'_>)>(&mut self, mut sink: F) -> Result<usize, ChannelError> {
        if self.shm.many_alone() {
            return self.shm.poll_port(sink);
        }
        self.poll_detour(&mut sink)
    }

    /// A poll that is not a pair's port's alone: shared memory with its own work or
    /// more than one peer, then the network module, if there is one.
    #[inline(never)]
    fn poll_detour<S: PacketSink>(&mut self, sink: &mut S) -> Result<usize, ChannelError> {
        let mut n = self.shm.poll(|p| sink.packet(p))?;
        if let Some(net) = &mut self.net {
            n += net.poll(sink, n > 0)?;
        }
        Ok(n)
    }

    /// Packets owed to the network: queued here, or taken by the netmod and not yet
    /// delivered for good.
    fn net_owed(&self) -> usize {
        self.net
            .as_ref()
            .map_or(0, |n| n.pending.count() + n.netmod.backlog())
    }
}

impl From<NetError> for ChannelError {
    fn from(e: NetError) -> Self {
        match e {
            NetError::PeerFailed { rank, reason } => ChannelError::PeerFailed { rank, reason },
            NetError::InvalidRank { rank, size } => ChannelError::InvalidRank { rank, size },
            NetError::TooLarge { len, max } => ChannelError::PacketTooLarge { len, max },
            NetError::Config { var, value, reason } => ChannelError::Config { var, value, reason },
            other => ChannelError::Net(other),
        }
    }
}

impl Channel for NemesisChannel {
    #[inline(always)]
    fn rank(&self) -> Rank {
        self.shm.rank()
    }

    #[inline(always)]
    fn size(&self) -> u32 {
        self.shm.size()
    }

    #[inline(always)]
    fn is_local(&self, peer: Rank) -> bool {
        self.shm.is_local(peer)
    }

    fn max_payload(&self) -> usize {
        match &self.net {
            Some(n) => self.shm.max_payload().min(n.max_payload),
            None => self.shm.max_payload(),
        }
    }

    fn max_payload_to(&self, peer: Rank) -> usize {
        match &self.net {
            Some(n) if !self.shm.is_local(peer) => n.max_payload,
            _ => self.shm.max_payload(),
        }
    }

    #[inline(always)]
    fn send(&mut self, peer: Rank, header: Header, payload: &[&[u8]]) -> Result<SendStatus, ChannelError> {
        if self.shm.try_fast_send(peer, header, payload) {
            return Ok(SendStatus::Sent);
        }
        self.send_slow(peer, pair(header), payload).map_err(|e| *e)
    }

    // The list of one payload the slow path takes is made on that path only: made
    // before the fastbox is tried, it and the header were stored to memory on every send.
    #[inline(always)]
    fn send_bytes(&mut self, peer: Rank, header: Header, payload: &[u8]) -> Result<SendStatus, ChannelError> {
        if self
            .shm
            .try_fast_send(peer, header, std::slice::from_ref(&payload))
        {
            return Ok(SendStatus::Sent);
        }
        self.send_slow(peer, pair(header), &[payload]).map_err(|e| *e)
    }

    #[inline(always)]
    fn try_send_now(&mut self, peer: Rank, header: Header, payload: &[u8]) -> bool {
        self.shm
            .try_fast_send(peer, header, std::slice::from_ref(&payload))
    }

    fn is_sent(&self, ticket: SendTicket) -> bool {
        match &self.net {
            Some(n) if ticket.net => n.pending.is_sent(ticket),
            _ => self.shm.is_sent(ticket),
        }
    }

    #[inline]
    fn pending(&self) -> usize {
        self.shm.pending() + self.net.as_ref().map_or(0, |n| n.pending.count())
    }

    fn room_for(&self, peer: Rank) -> bool {
        match &self.net {
            Some(n) if peer < self.size() && !self.shm.is_local(peer) => {
                !n.pending.has(peer) && n.netmod.writable(peer)
            }
            _ => self.shm.pending() == 0,
        }
    }

    fn room_for_run(&mut self, peer: Rank, packets: usize) -> bool {
        if self.shm.is_local(peer) {
            self.shm.room_for_run(peer, packets)
        } else {
            self.room_for(peer)
        }
    }

    #[inline]
    fn streams_to(&self, peer: Rank) -> bool {
        self.shm.is_local(peer) && self.shm.streams_to(peer)
    }

    fn sent_since_taken(&self, peer: Rank) -> bool {
        self.shm.is_local(peer) && self.shm.sent_since_taken(peer)
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError> {
        if self.shm.pair_alone() {
            // The sink moves down (see `ShmChannel::poll_port`).
            return self.shm.poll_pair(sink);
        }
        self.poll_other(sink)
    }

    #[inline(always)]
    fn poll_landing<S: PacketSink>(&mut self, sink: &mut S) -> Result<usize, ChannelError> {
        if !self.shm.pair_alone() {
            return self.poll_detour(sink);
        }
        self.shm.poll_pair(|p| sink.packet(p))
    }

    #[inline(always)]
    fn poll_from<F: FnMut(Packet<'_>)>(&mut self, peer: Rank, sink: F) -> bool {
        self.shm.poll_from(peer, sink)
    }

    #[inline(always)]
    fn poll_from_if<W, F>(&mut self, peer: Rank, want: W, sink: F) -> bool
    where
        W: FnOnce(&Header, usize) -> bool,
        F: FnMut(Packet<'_>),
    {
        self.shm.poll_from_if(peer, want, sink)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        let Some(net) = self.net.as_mut() else {
            return self.shm.wait(timeout);
        };
        let start = Instant::now();
        let policy = self.shm.wait_policy();
        let mixed = self.shm.has_local_peers();
        let every = if mixed { NET_SPIN_EVERY } else { 1 };
        let look = |net: &mut Net| -> Result<bool, ChannelError> {
            let ready = net.netmod.wait(Duration::ZERO)? || net.pending.count() > 0;
            net.hint |= ready;
            Ok(ready)
        };
        for i in 0..policy.spin {
            if self.shm.ready() || (i % every == 0 && look(net)?) {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        for _ in 0..policy.yields {
            if self.shm.ready() || look(net)? {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let slice = match timeout {
            None => policy.slice,
            Some(t) => match t.checked_sub(start.elapsed()) {
                Some(left) if !left.is_zero() => left.min(policy.slice),
                _ => return Ok(()),
            },
        };
        if net.has_fd && self.waits.is_some() {
            // Asleep on shared memory, the sockets and the netmod's timers at once.
            if self.arm()? {
                let woke = match self.waits.as_mut() {
                    Some(w) => w.sleep(slice).map_err(|e| NetError::io("epoll_wait", e))?,
                    None => false,
                };
                if let Some(net) = self.net.as_mut() {
                    net.hint |= woke;
                }
            }
        } else if mixed {
            self.shm.sleep(slice.min(BLIND_SLEEP));
            look(net)?;
        } else if net.netmod.wait(slice)? {
            net.hint = true;
        }
        Ok(())
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.waits.as_ref().map(|w| w.as_fd())
    }

    fn arm(&mut self) -> Result<bool, ChannelError> {
        let Some(waits) = &self.waits else {
            return Ok(false);
        };
        if !self.shm.arm()? {
            return Ok(false);
        }
        let mut timer = None;
        if let Some(net) = self.net.as_mut() {
            match net.netmod.wait_hint()? {
                WaitHint::Now => {
                    net.hint = true;
                    return Ok(false);
                }
                WaitHint::Later(t) => timer = t,
            }
            if !net.has_fd {
                let look = Instant::now() + BLIND_SLEEP;
                timer = Some(timer.map_or(look, |t| t.min(look)));
            }
        }
        waits
            .set_timer(timer)
            .map_err(|e| NetError::io("timerfd_settime", e))?;
        Ok(true)
    }

    fn check_peer(&self, peer: Rank) -> Result<(), ChannelError> {
        match &self.net {
            Some(n) if peer < self.size() && !self.shm.is_local(peer) => Ok(n.netmod.check_peer(peer)?),
            _ => self.shm.check_peer(peer),
        }
    }

    fn node_segment(&self) -> Option<Arc<Segment>> {
        self.shm.node_segment()
    }

    fn pair_bufs(&self) -> Option<nemesis_shm::pairbuf::PairBufs> {
        self.shm.pair_bufs()
    }

    fn lmt(&mut self) -> nemesis_lmt::Routes<'_> {
        let (rdma, regs) = match self.net.as_mut() {
            Some(Net { netmod, regs, .. }) => match netmod.rdma() {
                Some(r) => (Some(r), Some(regs)),
                None => (None, None),
            },
            None => (None, None),
        };
        nemesis_lmt::Routes::new(Some(self.shm.local_lmt()), rdma, regs)
    }

    fn rdma(&mut self) -> Option<&mut dyn nemesis_net::Rdma> {
        self.net.as_mut().and_then(|n| n.netmod.rdma())
    }

    fn wait_policy(&self) -> Option<WaitPolicy> {
        Some(self.shm.wait_policy())
    }

    /// Also waits until the network has delivered what it took: written to the socket
    /// (tcp) or acknowledged (udp). Packets that arrive meanwhile, from the node or the
    /// network, are kept for the next poll.
    fn flush(&mut self, timeout: Duration) -> Result<(), ChannelError> {
        let mut kept = Vec::new();
        let r = super::drive_until_delivered(self, timeout, |c| c.shm.pending() + c.net_owed(), &mut kept);
        self.shm.hold(kept);
        r
    }
}

impl Drop for NemesisChannel {
    /// Delivers what is still queued, for a bounded time, and says on standard error
    /// what could not be delivered; then says goodbye to the network.
    fn drop(&mut self) {
        if let Err(e) = self.flush(DROP_FLUSH) {
            eprintln!(
                "nemesis: rank {} closes its channel with packets undelivered: {e}",
                self.rank()
            );
        }
        if let Some(net) = self.net.as_mut() {
            net.netmod.shutdown(DROP_SHUTDOWN);
        }
    }
}

/// A header as its two words, which a call takes in two registers: passed as a
/// `Header`, it was stored to memory on every send, for the slow path's call.
#[inline(always)]
fn pair(header: Header) -> (u64, u64) {
    let [w0, w1] = header.to_envelope();
    (w0, w1)
}

/// Ranks 0 and 1 sharing a segment and rank 2 alone on another "node", each with the
/// netmod `net` makes for its rank: the job the channel tests run.
#[cfg(test)]
pub(crate) fn three_ranks(
    slice: Duration,
    mut net: impl FnMut(u32) -> Box<dyn Netmod>,
) -> Vec<NemesisChannel> {
    let policy = WaitPolicy {
        spin: 10,
        yields: 1,
        slice,
    };
    let pair = Arc::new(Segment::anonymous(2, nemesis_shm::Geometry::default()).unwrap());
    let alone = Arc::new(Segment::anonymous(1, nemesis_shm::Geometry::default()).unwrap());
    let shm = [
        ShmChannel::from_segment(pair.clone(), 0, 3, &[0, 1], 0, policy).unwrap(),
        ShmChannel::from_segment(pair, 1, 3, &[0, 1], 1, policy).unwrap(),
        ShmChannel::from_segment(alone, 2, 3, &[2], 0, policy).unwrap(),
    ];
    shm.into_iter()
        .zip(0..)
        .map(|(s, r)| NemesisChannel::with_netmod(s, Some(net(r))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{MemNet, Wire};
    use nemesis_shm::Geometry;

    /// Ranks 0 and 1 share a segment, rank 2 is alone on another "node"; all three
    /// have a netmod on one in-memory wire.
    fn job(cap: usize) -> (Vec<NemesisChannel>, Arc<Mutex<Wire>>) {
        let wire = Arc::new(Mutex::new(Wire {
            cap,
            ..Wire::default()
        }));
        let chans = three_ranks(Duration::from_millis(5), |r| {
            Box::new(MemNet {
                me: r,
                wire: wire.clone(),
                rdma: None,
            })
        });
        (chans, wire)
    }

    fn drain(ch: &mut NemesisChannel) -> Vec<(Rank, i32, Vec<u8>)> {
        let mut out = Vec::new();
        for _ in 0..2 * NET_POLL_EVERY {
            ch.poll(|p| out.push((p.src, p.header.tag, p.payload.to_vec())))
                .unwrap();
        }
        out
    }

    fn tag(t: i32) -> Header {
        Header {
            tag: t,
            ..Header::default()
        }
    }

    #[test]
    fn local_peers_go_through_memory_and_remote_ones_through_the_netmod() {
        let (mut j, wire) = job(100);
        assert!(j[0].is_local(1) && !j[0].is_local(2) && !j[2].is_local(0));
        assert_eq!(j[0].transport(), "mem");
        // The network carries larger packets than a cell, and only to remote peers.
        assert_eq!(j[0].max_payload_to(2), 100_000);
        assert_eq!(j[0].max_payload_to(1), j[0].shm().max_payload());
        assert_eq!(j[0].max_payload(), j[0].shm().max_payload());
        let big = vec![7u8; 50_000];
        j[0].send_bytes(1, tag(1), b"near").unwrap();
        j[0].send_bytes(2, tag(2), &big).unwrap();
        assert_eq!(
            wire.lock().unwrap().queues[&(0, 2)].len(),
            1,
            "the remote packet went to the netmod"
        );
        let e = j[0].send_bytes(1, tag(3), &big).unwrap_err();
        assert!(matches!(e, ChannelError::PacketTooLarge { .. }), "{e}");
        assert_eq!(drain(&mut j[1]), vec![(0, 1, b"near".to_vec())]);
        assert_eq!(drain(&mut j[2]), vec![(0, 2, big)]);
        // And back, from the remote rank to both.
        j[2].send(0, tag(4), &[b"fa", b"r"]).unwrap();
        j[2].send_bytes(1, tag(5), b"").unwrap();
        assert_eq!(drain(&mut j[0]), vec![(2, 4, b"far".to_vec())]);
        assert_eq!(drain(&mut j[1]), vec![(2, 5, Vec::new())]);
        assert!(matches!(
            j[0].send_bytes(3, tag(0), b""),
            Err(ChannelError::InvalidRank { .. })
        ));
    }

    #[test]
    fn a_full_netmod_queues_in_order_and_tickets_complete() {
        let (mut j, _) = job(2);
        let mut tickets = Vec::new();
        for i in 0..6 {
            if let SendStatus::Queued(t) = j[0].send_bytes(2, tag(i), &[i as u8]).unwrap() {
                tickets.push(t);
            }
        }
        assert_eq!(tickets.len(), 4, "two went to the netmod, the rest wait");
        assert_eq!(j[0].pending(), 4);
        assert!(tickets.iter().all(|&t| !j[0].is_sent(t)));
        // Local traffic is not held up by the remote destination.
        assert_eq!(j[0].send_bytes(1, tag(9), b"x").unwrap(), SendStatus::Sent);
        let mut got = Vec::new();
        while got.len() < 6 {
            got.extend(drain(&mut j[2]).into_iter().map(|m| m.1));
            drain(&mut j[0]);
        }
        assert_eq!(got, (0..6).collect::<Vec<_>>());
        assert!(tickets.iter().all(|&t| j[0].is_sent(t)));
        assert_eq!(j[0].pending(), 0);
    }

    #[test]
    fn a_failed_remote_peer_fails_sends_and_checks_and_frees_its_queue() {
        let (mut j, wire) = job(1);
        j[0].send_bytes(2, tag(0), b"a").unwrap();
        let t = match j[0].send_bytes(2, tag(1), b"b").unwrap() {
            SendStatus::Queued(t) => t,
            SendStatus::Sent => panic!("the netmod had room for one packet only"),
        };
        wire.lock().unwrap().failed.insert(2);
        assert!(matches!(
            j[0].check_peer(2),
            Err(ChannelError::PeerFailed { rank: 2, .. })
        ));
        assert!(j[0].check_peer(1).is_ok());
        drain(&mut j[0]);
        assert!(j[0].is_sent(t), "a failed peer's queue is let go");
        assert_eq!(j[0].pending(), 0);
        // Later packets to it go nowhere, as they would into a dead local peer's queue.
        assert_eq!(j[0].send_bytes(2, tag(2), b"c").unwrap(), SendStatus::Sent);
        assert_eq!(j[0].pending(), 0);
    }

    #[test]
    fn flush_waits_for_the_network_to_deliver() {
        let (mut j, wire) = job(10);
        j[0].send_bytes(2, tag(0), b"a").unwrap();
        let e = j[0].flush(Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, ChannelError::FlushTimeout { pending: 1, .. }), "{e}");
        assert_eq!(drain(&mut j[2]).len(), 1);
        j[0].flush(Duration::from_secs(5)).unwrap();
        assert!(wire.lock().unwrap().queues[&(0, 2)].is_empty());
    }

    /// What arrives while a flush waits, from the network or from the node, is handed up
    /// by the next poll, before anything newer from the same sender.
    #[test]
    fn a_flush_keeps_what_arrives_meanwhile() {
        let (mut j, _wire) = job(10);
        j[2].send_bytes(0, tag(20), b"net").unwrap();
        j[1].send_bytes(0, tag(10), b"node").unwrap();
        j[0].send_bytes(2, tag(0), b"a").unwrap();
        let e = j[0].flush(Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, ChannelError::FlushTimeout { .. }), "{e}");
        j[1].send_bytes(0, tag(11), b"later").unwrap();
        assert!(
            !j[0].poll_from(1, |_| {}),
            "a held packet from rank 1 comes first"
        );
        let got = drain(&mut j[0]);
        let tags: Vec<(Rank, i32)> = got.iter().map(|m| (m.0, m.1)).collect();
        assert_eq!(tags, [(1, 10), (2, 20), (1, 11)], "{got:?}");
    }

    #[test]
    fn bad_values_are_refused_by_name_and_a_singleton_opens_no_netmod() {
        let boot = || Boot::singleton(Duration::from_secs(1));
        let e = NemesisChannel::from_boot_with(boot(), |k| (k == NO_SHM_VAR).then(|| "sometimes".into()))
            .unwrap_err();
        assert!(matches!(e, ChannelError::Config { var: NO_SHM_VAR, .. }), "{e}");
        // Alone, with shared memory off, there is no one to reach, so no netmod is
        // opened; but a netmod variable that could not work is refused here as it would
        // be on many nodes.
        let ch = NemesisChannel::from_boot_with(boot(), |k| match k {
            NO_SHM_VAR => Some("1".into()),
            "NEMESIS_NETMOD" => Some("udp".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((ch.size(), ch.transport()), (1, "shm"));
        let e = NemesisChannel::from_boot_with(boot(), |k| (k == "NEMESIS_NETMOD").then(|| "pigeon".into()))
            .unwrap_err();
        assert!(
            matches!(
                e,
                ChannelError::Config {
                    var: "NEMESIS_NETMOD",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn without_a_netmod_other_nodes_have_no_route() {
        let policy = WaitPolicy {
            spin: 1,
            yields: 1,
            slice: Duration::from_millis(1),
        };
        let seg = Arc::new(Segment::anonymous(1, Geometry::default()).unwrap());
        let shm = ShmChannel::from_segment(seg, 0, 2, &[0], 0, policy).unwrap();
        let mut ch = NemesisChannel::with_netmod(shm, None);
        assert_eq!(ch.transport(), "shm");
        let e = ch.send_bytes(1, tag(0), b"x").unwrap_err();
        assert!(matches!(e, ChannelError::NoRoute { rank: 1 }), "{e}");
        ch.wait(Some(Duration::from_millis(1))).unwrap();
    }

    /// Every route refuses a packet one byte over `max_payload_to(peer)` the same way,
    /// and takes one of exactly that size.
    #[test]
    fn every_route_refuses_a_packet_over_its_largest_the_same_way() {
        let (mut ch, _) = job(64);
        let h = Header::default();
        for me in 0..3u32 {
            for peer in 0..3u32 {
                let c = &mut ch[me as usize];
                let max = c.max_payload_to(peer);
                assert!(max >= c.max_payload(), "{me}->{peer}");
                c.send_bytes(peer, h, &vec![0u8; max])
                    .unwrap_or_else(|e| panic!("{me}->{peer}: {max} bytes refused: {e}"));
                match c.send_bytes(peer, h, &vec![0u8; max + 1]) {
                    Err(ChannelError::PacketTooLarge { len, max: m }) => {
                        assert_eq!((len, m), (max + 1, max), "{me}->{peer}")
                    }
                    other => panic!("{me}->{peer}: {other:?}"),
                }
            }
        }
        // Out of the job: refused, not routed.
        assert!(matches!(
            ch[0].send_bytes(3, h, b"x"),
            Err(ChannelError::InvalidRank { rank: 3, size: 3 })
        ));
        for c in ch.iter_mut() {
            drain(c);
        }
    }
}
