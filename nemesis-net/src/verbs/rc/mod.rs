//! The `rc` netmod: one reliable-connected queue pair per peer, made on first contact,
//! every pair receiving through one shared receive queue.
//!
//! The device delivers every packet once and in order, so there is no window, no timer
//! and no acknowledgement here: a packet is a 24-byte header (envelope, length, kind) and
//! its payload, sent inline up to the device's inline limit and from a registered slot
//! above it, into a slot of the shared receive ring. A receiver out of slots makes the
//! sender's device retry without end (`rnr_retry` 7: it is alive and will post more);
//! a sender out of slots or queue answers "again".
//!
//! **Connecting.** Each rank has a UD endpoint for connection requests, and its card
//! (`rc <gid> <ud qpn> <mtu>`) names it. To reach a peer, a rank makes a pair for it and
//! sends CONNECT (its pair's number and first packet number) over UD, again every 50 ms
//! until the peer answers ACCEPT with its own; the peer makes its pair on the request.
//! Two ranks that connect to each other at once each have one pair for the other, so
//! each request is simply accepted. Requests carry the pair's token of the job key
//! ([`crate::auth::JobKey::token`]), so a stranger's are dropped and counted.
//!
//! **Failures.** A pair gives up on a dead peer after its retries, timed so that it
//! does within `NEMESIS_NET_TIMEOUT` (`retry_cnt` 6 and the longest ACK timeout that
//! fits: 1.1 s a try for the default 10 s, 134 ms for 1 s), and every send then
//! completes in error:
//! the peer counts as failed, with the status named. `check_peer` sends a probe to a
//! peer it has not heard from, so a caller who keeps checking learns of a death; a peer
//! that never answers its connection request fails after `NEMESIS_NET_TIMEOUT`.
//!
//! Variables, besides the device's (see [`super`]):
//!
//! - `NEMESIS_RC_EAGER` ([`EAGER_VAR`]): bytes of a receive slot, the largest packet
//!   with its header (1K to 1M, default 8K);
//! - `NEMESIS_RC_RECV_DEPTH` ([`RECV_DEPTH_VAR`]): slots in the shared receive ring,
//!   16 to 65536, default 256.

mod rdma;
mod settings;

pub use settings::{DEFAULT_EAGER, DEFAULT_RECV_DEPTH, EAGER_VAR, RECV_DEPTH_VAR, RcConfig};

use super::VerbsError;
use super::raw::{
    Channel, Completion, Context, Cq, Mr, Pd, Qp, QpCap, RcPath, Region, Sge, Srq, ack_timeout_for,
};
use super::ud::{UdConfig, UdEndpoint};
use crate::auth::JobKey;
use crate::dgram::Endpoint;
use crate::reliable::Datagram;
use crate::sys::Epoll;
use crate::verbs_wire::{
    HEADER_LEN, KIND_BYE, KIND_DATA, KIND_PING, Request, RequestKind, UdAddr, decode_card_as, decode_packet,
    encode_card_as, encode_header,
};
use crate::{Accept, Cards, DropReason, Envelope, Identity, NetError, NetStats, Netmod, WaitHint, config};
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registered send slots, every peer together.
const SEND_SLOTS: u32 = 128;
/// Sends in flight on one pair at most.
const SEND_DEPTH: u32 = 64;
/// How often a connection request is sent again while unanswered.
const RECONNECT: Duration = Duration::from_millis(50);

/// Where the connection to a peer stands.
#[derive(Debug)]
enum Link {
    /// Our request is out; since when, and when last sent.
    Connecting { since: Instant, sent: Instant },
    /// Connected to the peer's pair.
    Up,
    /// Gone wrong; why, as `check_peer` says it.
    Failed(String),
    /// Said goodbye.
    Left,
}

/// One peer: its pair, and the sends on it not known to be complete.
struct Peer {
    qp: Qp,
    link: Link,
    /// Our first packet number, and the peer's pair once known.
    psn: u32,
    remote: Option<u32>,
    /// The peer's connection endpoint, from its card.
    ctl: UdAddr,
    /// Its path MTU, from its card.
    mtu: usize,
    /// Slots (or [`NO_SLOT`]) of the sends posted, oldest first.
    posted: VecDeque<u32>,
    seq: u64,
    heard: Instant,
    pinged: Option<Instant>,
    /// For this process's own rank: the pair at the other end of a loopback
    /// connection, which answers RDMA and atomics on our own memory, so the card is
    /// the one executor of a word even for its owner.
    _mirror: Option<Qp>,
}

const NO_SLOT: u32 = u32::MAX;
/// A send's request number: the peer's rank above this many bits, its count below.
const SEQ_BITS: u32 = 40;

/// The `rc` netmod.
///
/// Fields are dropped in order: the pairs before the shared receive queue, the queues
/// before the pools their requests name.
pub struct RcNetmod {
    peers: Vec<Option<Box<Peer>>>,
    srq: Srq,
    cq: Cq,
    recv: Region,
    send: Region,
    ctl: UdEndpoint,
    pd: Arc<Pd>,
    epoll: Epoll,
    by_qpn: HashMap<u32, u32>,
    free_send: Vec<u32>,
    stash: VecDeque<Completion>,
    scratch: Vec<Completion>,
    me: u32,
    size: u32,
    key: JobKey,
    cards: Box<dyn Cards>,
    port: u8,
    sgid_index: u8,
    mtu: usize,
    slot: usize,
    inline: usize,
    timeout: Duration,
    /// Peers `check_peer` wants looked at in the next poll (it has only `&self`).
    asks: Cell<Vec<u32>>,
    /// RDMA: registrations by handle, and one-sided operations posted (`None`) or done.
    regs: HashMap<u64, Mr>,
    next_reg: u64,
    ops: HashMap<u64, Option<Result<(), String>>>,
    atomics: bool,
    card: Vec<u8>,
    closing: bool,
    shut: bool,
    stats: NetStats,
}

impl fmt::Debug for RcNetmod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcNetmod")
            .field("me", &self.me)
            .field("size", &self.size)
            .field("peers", &self.peers.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

fn verbs_io(e: VerbsError) -> io::Error {
    io::Error::other(e.to_string())
}

impl RcNetmod {
    /// Opens the device, posts the receive ring and makes the netmod; `cards` gives the
    /// peers' connection endpoints, asked once per peer.
    ///
    /// # Errors
    /// No device, a port that is down, no usable GID, memory that cannot be registered.
    pub fn new(id: Identity, cards: Box<dyn Cards>, cfg: RcConfig) -> Result<Self, NetError> {
        if id.rank >= id.size {
            return Err(NetError::InvalidRank {
                rank: id.rank,
                size: id.size,
            });
        }
        let ucfg = UdConfig {
            device: cfg.device.clone(),
            port: cfg.port,
            gid_index: cfg.gid_index,
            recv_depth: 64,
            ..UdConfig::default()
        };
        let ctl = UdEndpoint::open(&ucfg, id.addr)?;
        let ctx = Context::open(cfg.device.as_deref())?;
        let dev = ctx.device_info()?;
        let pd = Pd::new(&ctx)?;
        let channel = Channel::new(&ctx)?;
        let recv_depth = cfg.recv_depth.min(dev.max_qp_wr.max(16));
        let cq = Cq::new(
            &ctx,
            &channel,
            (recv_depth + 2 * SEND_SLOTS + 64).min(dev.max_cqe.max(64)),
        )?;
        let mut srq = Srq::new(&pd, recv_depth)?;
        let slot = cfg.eager;
        let recv = Region::new(&pd, slot * srq.depth as usize, false)?;
        let send = Region::new(&pd, slot * SEND_SLOTS as usize, false)?;
        for s in 0..srq.depth {
            let off = s as usize * slot;
            // SAFETY: the slot lies inside the region, which outlives the queue (field
            // order), and nothing else touches it while posted.
            unsafe { srq.post_recv(u64::from(s), recv.ptr().add(off), slot as u32, recv.lkey()) }?;
        }
        let epoll = Epoll::new().map_err(|e| NetError::io("rc: epoll_create", e))?;
        for fd in [ctl.fd().as_raw_fd(), cq.channel().fd().as_raw_fd()] {
            epoll
                .ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, 0)
                .map_err(|e| NetError::io("rc: epoll_ctl", e))?;
        }
        // The inline limit a pair is granted; asked of a first pair, so that sends know it.
        let probe = Qp::rc(&pd, &cq, &srq, qp_cap(), cfg.port)?;
        let inline = probe.cap.inline as usize;
        drop(probe);
        Ok(Self {
            peers: (0..id.size).map(|_| None).collect(),
            srq,
            cq,
            recv,
            send,
            card: encode_card_as("rc", ctl.addr(), ctl.mtu()),
            port: ctl.port(),
            sgid_index: ctl.gid_index(),
            mtu: ctl.mtu(),
            ctl,
            pd,
            epoll,
            by_qpn: HashMap::new(),
            free_send: (0..SEND_SLOTS).rev().collect(),
            stash: VecDeque::with_capacity(recv_depth as usize + 2 * SEND_SLOTS as usize),
            scratch: Vec::with_capacity(32),
            me: id.rank,
            size: id.size,
            key: id.job_key,
            cards,
            slot,
            inline,
            timeout: cfg.timeout,
            asks: Cell::new(Vec::new()),
            regs: HashMap::new(),
            next_reg: 0,
            ops: HashMap::new(),
            atomics: dev.atomics,
            closing: false,
            shut: false,
            stats: NetStats::default(),
        })
    }

    fn note(&mut self, reason: DropReason, detail: fmt::Arguments<'_>) {
        self.stats.drops.note("rc", reason, detail);
    }

    fn valid(&self, peer: u32) -> Result<(), NetError> {
        if peer >= self.size || peer == self.me {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Makes the peer's pair, from its card; it is not connected yet (our own rank's is:
    /// a loopback pair, for RDMA only).
    fn make_peer(&mut self, rank: u32) -> Result<&mut Peer, NetError> {
        if rank == self.me && self.peers[rank as usize].is_none() {
            self.make_loopback()?;
        }
        if self.peers[rank as usize].is_none() {
            let (ctl, mtu) = decode_card_as("rc", rank, &self.cards.card(rank)?)?;
            let qp = Qp::rc(&self.pd, &self.cq, &self.srq, qp_cap(), self.port)?;
            self.by_qpn.insert(qp.qpn(), rank);
            let now = Instant::now();
            let psn = (self.key.token(self.me, rank) as u32) & 0x00ff_ffff;
            self.peers[rank as usize] = Some(Box::new(Peer {
                qp,
                link: Link::Connecting {
                    since: now,
                    sent: now.checked_sub(RECONNECT).unwrap_or(now),
                },
                psn,
                remote: None,
                ctl,
                mtu,
                posted: VecDeque::new(),
                seq: 0,
                heard: now,
                pinged: None,
                _mirror: None,
            }));
        }
        self.peers[rank as usize]
            .as_deref_mut()
            .ok_or(NetError::InvalidRank {
                rank,
                size: self.size,
            })
    }

    /// Connects two pairs of ours to each other: the first posts RDMA and atomics on
    /// this process's memory, the second answers them. No packet goes on it.
    fn make_loopback(&mut self) -> Result<(), NetError> {
        let qp = Qp::rc(&self.pd, &self.cq, &self.srq, qp_cap(), self.port)?;
        let mirror = Qp::rc(&self.pd, &self.cq, &self.srq, qp_cap(), self.port)?;
        let ctl = self.ctl.addr();
        let psn = (self.key.token(self.me, self.me) as u32) & 0x00ff_ffff;
        let path = |qpn| RcPath {
            qpn,
            gid: ctl.gid,
            sgid_index: self.sgid_index,
            port: self.port,
            mtu: self.mtu,
            our_psn: psn,
            their_psn: psn,
            timeout: ack_timeout_for(self.timeout),
        };
        let link = match qp
            .connect(path(mirror.qpn()))
            .and_then(|()| mirror.connect(path(qp.qpn())))
        {
            Ok(()) => Link::Up,
            Err(e) => Link::Failed(format!("its loopback connection could not be made: {e}")),
        };
        let now = Instant::now();
        self.peers[self.me as usize] = Some(Box::new(Peer {
            qp,
            link,
            psn,
            remote: Some(mirror.qpn()),
            ctl,
            mtu: self.mtu,
            posted: VecDeque::new(),
            seq: 0,
            heard: now,
            pinged: None,
            _mirror: Some(mirror),
        }));
        Ok(())
    }

    /// Sends a connection message to `rank`; a transport with no room now is retried by
    /// the timer.
    fn send_ctl(&mut self, kind: RequestKind, rank: u32) -> io::Result<()> {
        let Some(p) = self.peers[rank as usize].as_deref() else {
            return Ok(());
        };
        let m = Request {
            kind,
            src: self.me,
            dst: rank,
            qpn: p.qp.qpn(),
            psn: p.psn,
            token: self.key.token(self.me, rank),
        }
        .encode();
        let to = p.ctl;
        self.ctl.send_to(&[&m], to).map(drop)
    }

    /// Connects the peer's pair to `remote` (its pair and first packet number).
    fn connect(&mut self, rank: u32, remote: u32, their_psn: u32) {
        let (port, sgid_index, mtu) = (self.port, self.sgid_index, self.mtu);
        let Some(p) = self.peers[rank as usize].as_deref_mut() else {
            return;
        };
        let path = RcPath {
            qpn: remote,
            gid: p.ctl.gid,
            sgid_index,
            port,
            mtu: mtu.min(p.mtu),
            our_psn: p.psn,
            their_psn,
            timeout: ack_timeout_for(self.timeout),
        };
        match p.qp.connect(path) {
            Ok(()) => {
                p.link = Link::Up;
                p.remote = Some(remote);
                p.heard = Instant::now();
            }
            Err(e) => p.link = Link::Failed(format!("its connection could not be made: {e}")),
        }
    }

    /// Takes one connection message.
    fn on_ctl(&mut self, d: &[u8], from: UdAddr) -> io::Result<()> {
        use DropReason::*;
        let Request {
            kind,
            src,
            dst,
            qpn,
            psn,
            token,
        } = match Request::decode(d) {
            Ok(r) => r,
            Err(why) => {
                self.note(why, format_args!("{} bytes from {from:?}", d.len()));
                return Ok(());
            }
        };
        if src >= self.size || src == self.me || dst != self.me {
            self.note(BadRank, format_args!("{src} -> {dst} from {from:?}"));
            return Ok(());
        }
        if token != self.key.token(src, self.me) {
            self.note(
                WrongJob,
                format_args!("rank {src} from {from:?} without the pair's token"),
            );
            return Ok(());
        }
        let known = match self.make_peer(src) {
            Ok(p) => p.ctl,
            Err(e) => {
                self.note(UnknownAddress, format_args!("rank {src} from {from:?}: {e}"));
                return Ok(());
            }
        };
        if known != from {
            self.note(
                UnknownAddress,
                format_args!("rank {src} from {from:?}, its card says {known:?}"),
            );
            return Ok(());
        }
        let Some(p) = self.peers[src as usize].as_deref() else {
            return Ok(());
        };
        match (&p.link, p.remote) {
            (Link::Connecting { .. }, _) => self.connect(src, qpn, psn),
            (Link::Up, Some(r)) if r == qpn => {}
            (Link::Up, _) => {
                self.note(
                    BadSequence,
                    format_args!("rank {src} asks to connect pair {qpn} anew"),
                );
                return Ok(());
            }
            _ => return Ok(()),
        }
        if kind == RequestKind::Connect {
            self.send_ctl(RequestKind::Accept, src)?;
        }
        Ok(())
    }

    /// Runs the connection timers and the probes `check_peer` asked for.
    fn timers(&mut self) -> io::Result<()> {
        let now = Instant::now();
        let mut asks = self.asks.take();
        for &rank in &asks {
            if self.closing {
                break;
            }
            if self.peers[rank as usize].is_none() {
                if let Err(e) = self.make_peer(rank) {
                    self.note(DropReason::UnknownAddress, format_args!("rank {rank}: {e}"));
                }
                continue;
            }
            let ping_every = self.timeout / 10;
            let due = self.peers[rank as usize].as_deref().is_some_and(|p| {
                matches!(p.link, Link::Up)
                    && p.posted.is_empty()
                    && now.duration_since(p.heard) >= ping_every
                    && p.pinged.is_none_or(|t| now.duration_since(t) >= ping_every)
            });
            if due && self.post(rank, KIND_PING, &[0, 0], &[]).is_ok_and(|sent| sent) {
                if let Some(p) = self.peers[rank as usize].as_deref_mut() {
                    p.pinged = Some(now);
                }
            }
        }
        asks.clear();
        self.asks.set(asks);
        for rank in 0..self.size {
            let Some(p) = self.peers[rank as usize].as_deref_mut() else {
                continue;
            };
            if let Link::Connecting { since, sent } = p.link {
                if now.duration_since(since) >= self.timeout {
                    p.link = Link::Failed(format!(
                        "it did not answer our connection requests for {:.3} s ({} is {:.3} s)",
                        now.duration_since(since).as_secs_f64(),
                        config::NET_TIMEOUT_VAR,
                        self.timeout.as_secs_f64()
                    ));
                } else if now.duration_since(sent) >= RECONNECT && !self.closing {
                    p.link = Link::Connecting { since, sent: now };
                    self.send_ctl(RequestKind::Connect, rank)?;
                }
            }
        }
        Ok(())
    }

    /// Takes completions into the stash.
    fn reap(&mut self) -> io::Result<usize> {
        self.scratch.clear();
        let n = self.cq.poll(&mut self.scratch, 32).map_err(verbs_io)?;
        self.stash.extend(self.scratch.drain(..));
        Ok(n)
    }

    /// Acts on one completion; returns the packets it handed up.
    fn complete(&mut self, c: Completion, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> io::Result<usize> {
        if !c.recv {
            let rank = (c.wr_id >> SEQ_BITS) as u32;
            let seq = c.wr_id & ((1 << SEQ_BITS) - 1);
            let failed = (!c.ok()).then(|| c.status_name());
            let Some(p) = self.peers.get_mut(rank as usize).and_then(|p| p.as_deref_mut()) else {
                return Ok(0);
            };
            let first = p.seq - p.posted.len() as u64;
            let done = (seq + 1).saturating_sub(first).min(p.posted.len() as u64);
            for s in p.posted.drain(..done as usize) {
                if s != NO_SLOT {
                    self.free_send.push(s);
                }
            }
            if let Some(status) = &failed
                && matches!(p.link, Link::Up)
            {
                p.link = Link::Failed(format!("a send to it failed: {status}"));
            }
            if let Some(op) = self.ops.get_mut(&c.wr_id) {
                *op = Some(failed.map_or(Ok(()), Err));
            }
            return Ok(0);
        }
        let s = u32::try_from(c.wr_id).unwrap_or(u32::MAX);
        if s >= self.srq.depth {
            return Err(io::Error::other(format!("a receive completion names slot {s}")));
        }
        let off = s as usize * self.slot;
        let mut got = 0;
        let rank = self.by_qpn.get(&c.qp_num).copied();
        if !c.ok() {
            // A pair that went into error flushes nothing of a shared queue; a failed
            // receive is the peer's failure, which its sends report.
        } else if let Some(rank) = rank {
            let len = (c.byte_len as usize).min(self.slot);
            // SAFETY: the slot lies inside the region and is not posted until below, so
            // the device does not write it while this slice lives.
            let d = unsafe { std::slice::from_raw_parts(self.recv.ptr().add(off), len) };
            match decode_packet(d) {
                Some((env, KIND_DATA, payload)) => {
                    sink(rank, &env, payload);
                    got = 1;
                }
                Some((_, KIND_BYE, _)) => {
                    if let Some(p) = self.peers[rank as usize].as_deref_mut()
                        && matches!(p.link, Link::Up)
                    {
                        p.link = Link::Left;
                    }
                }
                Some(_) => {}
                None => self.note(
                    DropReason::Malformed,
                    format_args!("{len} bytes from rank {rank}"),
                ),
            }
            if let Some(p) = self.peers[rank as usize].as_deref_mut() {
                p.heard = Instant::now();
            }
        } else {
            self.note(
                DropReason::BadRank,
                format_args!("a packet on unknown pair {}", c.qp_num),
            );
        }
        // SAFETY: as in `new`: inside the region, which outlives the queue.
        unsafe {
            self.srq.post_recv(
                u64::from(s),
                self.recv.ptr().add(off),
                self.slot as u32,
                self.recv.lkey(),
            )
        }
        .map_err(verbs_io)?;
        self.stats.packets_received += got as u64;
        Ok(got)
    }

    /// Posts a packet to an connected peer; `Ok(false)`: no room now.
    fn post(&mut self, rank: u32, kind: u32, env: &Envelope, payload: &[&[u8]]) -> io::Result<bool> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let head = encode_header(env, len as u32, kind);
        let total = HEADER_LEN + len;
        let full = |p: &Peer| p.posted.len() >= SEND_DEPTH as usize;
        if self.peers[rank as usize].as_deref().is_none_or(full) {
            self.reap()?;
            if self.peers[rank as usize].as_deref().is_none_or(full) {
                return Ok(false);
            }
        }
        let mut sges = [Sge {
            addr: std::ptr::null(),
            len: 0,
            lkey: 0,
        }; 4];
        let inline = total <= self.inline && payload.len() < sges.len();
        let (slot, count) = if inline {
            sges[0] = Sge {
                addr: head.as_ptr(),
                len: HEADER_LEN as u32,
                lkey: 0,
            };
            for (s, p) in sges[1..].iter_mut().zip(payload) {
                *s = Sge {
                    addr: p.as_ptr(),
                    len: p.len() as u32,
                    lkey: 0,
                };
            }
            (NO_SLOT, 1 + payload.len())
        } else {
            let Some(slot) = self.free_send.pop() else {
                self.reap()?;
                return Ok(false);
            };
            let base = slot as usize * self.slot;
            let mut at = 0;
            for piece in std::iter::once(&head[..]).chain(payload.iter().copied()) {
                // SAFETY: the slot lies inside the send region (slots * slot bytes), the
                // packet fits a slot (checked by `send`), and a free slot is named by no
                // posted send.
                unsafe {
                    std::ptr::copy_nonoverlapping(piece.as_ptr(), self.send.ptr().add(base + at), piece.len())
                };
                at += piece.len();
            }
            sges[0] = Sge {
                // SAFETY: inside the region, as above.
                addr: unsafe { self.send.ptr().add(base) },
                len: total as u32,
                lkey: self.send.lkey(),
            };
            (slot, 1)
        };
        let Some(p) = self.peers[rank as usize].as_deref_mut() else {
            return Ok(false);
        };
        let wr_id = (u64::from(rank) << SEQ_BITS) | (p.seq & ((1 << SEQ_BITS) - 1));
        // Every send is signalled, so the backlog is exact and a goodbye is known to be
        // delivered. SAFETY: inline, the bytes are copied during the call; otherwise they
        // are in a send slot that stays ours until this send's completion.
        let posted = unsafe { p.qp.post_send(wr_id, &sges[..count], None, inline, true) };
        match posted {
            Ok(()) => {
                p.posted.push_back(slot);
                p.seq += 1;
                Ok(true)
            }
            Err(e) => {
                if slot != NO_SLOT {
                    self.free_send.push(slot);
                }
                if let Some(p) = self.peers[rank as usize].as_deref_mut() {
                    p.link = Link::Failed(format!("posting a send failed: {e}"));
                }
                Ok(true)
            }
        }
    }

    /// Whether something is under way that polls move on: a connection being made, a
    /// one-sided operation or a send not yet complete, completions taken and not
    /// handled. Otherwise only a peer's connection request can come, which a poll now
    /// and then finds in time (requests are resent every 50 ms).
    pub fn busy(&self) -> bool {
        !self.stash.is_empty()
            || !self.ops.is_empty()
            || self
                .peers
                .iter()
                .flatten()
                .any(|p| matches!(p.link, Link::Connecting { .. }) || !p.posted.is_empty())
    }

    /// Whether a poll has work now, without sleeping.
    fn look(&mut self) -> Result<bool, NetError> {
        if !self.stash.is_empty() {
            return Ok(true);
        }
        self.reap()
            .map_err(|e| NetError::io("rc: polling completions", e))?;
        let ctl = self
            .ctl
            .look()
            .map_err(|e| NetError::io("rc: polling requests", e))?;
        Ok(!self.stash.is_empty() || ctl == Some(true))
    }

    /// Arms both queues before a sleep; whether something came meanwhile.
    fn arm(&mut self) -> Result<bool, NetError> {
        self.cq
            .arm()
            .map_err(|e| NetError::io("rc: arming", verbs_io(e)))?;
        let ctl = self.ctl.arm().map_err(|e| NetError::io("rc: arming", e))?;
        Ok(self.look()? || ctl)
    }

    /// The next connection timer, if a connection is under way.
    fn next_timer(&self) -> Option<Instant> {
        self.peers
            .iter()
            .flatten()
            .filter_map(|p| match p.link {
                Link::Connecting { sent, .. } => Some(sent + RECONNECT),
                _ => None,
            })
            .min()
    }

    fn take_events(&mut self) -> Result<(), NetError> {
        self.cq
            .take_events()
            .map_err(|e| NetError::io("rc: events", verbs_io(e)))?;
        self.ctl.woken().map_err(|e| NetError::io("rc: events", e))
    }
}

fn qp_cap() -> QpCap {
    QpCap {
        send: SEND_DEPTH,
        recv: 0,
        send_sge: 4,
        inline: 256,
    }
}

fn left(rank: u32) -> NetError {
    NetError::PeerFailed {
        rank,
        reason: "it left the job (it said goodbye)".into(),
    }
}

impl Netmod for RcNetmod {
    fn name(&self) -> &'static str {
        "rc"
    }

    fn business_card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn max_payload(&self) -> usize {
        self.slot - HEADER_LEN
    }

    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        if self.closing {
            return Err(NetError::io(
                format!("rc: send to rank {peer}"),
                io::Error::new(io::ErrorKind::NotConnected, "the netmod is shutting down"),
            ));
        }
        self.valid(peer)?;
        let max = self.max_payload();
        let len = payload.iter().try_fold(0usize, |a, p| a.checked_add(p.len()));
        match len {
            Some(l) if l <= max => {}
            other => {
                return Err(NetError::TooLarge {
                    len: other.unwrap_or(usize::MAX),
                    max,
                });
            }
        }
        let p = self.make_peer(peer)?;
        match &p.link {
            Link::Up => {}
            Link::Connecting { .. } => {
                self.timers().map_err(|e| NetError::io("rc: connecting", e))?;
                return Ok(Accept::Again);
            }
            Link::Failed(reason) => {
                return Err(NetError::PeerFailed {
                    rank: peer,
                    reason: reason.clone(),
                });
            }
            Link::Left => return Err(left(peer)),
        }
        if self
            .post(peer, KIND_DATA, env, payload)
            .map_err(|e| NetError::io("rc: sending", e))?
        {
            self.stats.packets_sent += 1;
            Ok(Accept::Sent)
        } else {
            Ok(Accept::Again)
        }
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        for _ in 0..64 {
            let Some((rx, from)) = self
                .ctl
                .recv()
                .map_err(|e| NetError::io("rc: receiving requests", e))?
            else {
                break;
            };
            let r = self.on_ctl(rx.as_ref(), from);
            self.ctl.release(rx);
            r.map_err(|e| NetError::io("rc: answering a request", e))?;
        }
        self.timers().map_err(|e| NetError::io("rc: connecting", e))?;
        let mut got = 0;
        for _ in 0..256 {
            if self.stash.is_empty()
                && self
                    .reap()
                    .map_err(|e| NetError::io("rc: polling completions", e))?
                    == 0
            {
                break;
            }
            while let Some(c) = self.stash.pop_front() {
                got += self
                    .complete(c, sink)
                    .map_err(|e| NetError::io("rc: receiving", e))?;
            }
        }
        Ok(got)
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError> {
        if self.look()? {
            return Ok(true);
        }
        let limit = match self.next_timer() {
            Some(t) => timeout.min(t.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        if limit.is_zero() {
            return Ok(false);
        }
        if self.arm()? {
            return Ok(true);
        }
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        let n = self
            .epoll
            .wait(&mut ev, crate::sys::millis(limit))
            .map_err(|e| NetError::io("rc: epoll_wait", e))?;
        if n > 0 {
            self.take_events()?;
        }
        Ok(n > 0 || self.look()?)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn wait_hint(&mut self) -> Result<WaitHint, NetError> {
        if self.arm()? {
            return Ok(WaitHint::Now);
        }
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        if self
            .epoll
            .wait(&mut ev, 0)
            .map_err(|e| NetError::io("rc: epoll_wait", e))?
            > 0
        {
            self.take_events()?;
            return Ok(WaitHint::Now);
        }
        Ok(WaitHint::Later(self.next_timer()))
    }

    fn backlog(&self) -> usize {
        self.peers.iter().flatten().map(|p| p.posted.len()).sum()
    }

    fn writable(&self, peer: u32) -> bool {
        self.peers
            .get(peer as usize)
            .and_then(|p| p.as_deref())
            .is_some_and(|p| matches!(p.link, Link::Up) && p.posted.len() < SEND_DEPTH as usize)
    }

    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        if peer >= self.size {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.size,
            });
        }
        if peer == self.me {
            return Ok(());
        }
        match self.peers[peer as usize].as_deref().map(|p| &p.link) {
            Some(Link::Failed(reason)) => {
                return Err(NetError::PeerFailed {
                    rank: peer,
                    reason: reason.clone(),
                });
            }
            Some(Link::Left) => return Err(left(peer)),
            _ => {}
        }
        if !self.closing {
            let mut asks = self.asks.take();
            if !asks.contains(&peer) {
                asks.push(peer);
            }
            self.asks.set(asks);
        }
        Ok(())
    }

    fn shutdown(&mut self, timeout: Duration) {
        if self.shut {
            return;
        }
        self.shut = true;
        let deadline = Instant::now() + timeout;
        let mut discard = |_: u32, _: &Envelope, _: &[u8]| {};
        // What is queued goes first, then a goodbye to every connected peer.
        let mut owed: Vec<u32> = (0..self.size)
            .filter(|&r| r != self.me)
            .filter(|&r| {
                self.peers[r as usize]
                    .as_deref()
                    .is_some_and(|p| matches!(p.link, Link::Up))
            })
            .collect();
        self.closing = true;
        while Instant::now() < deadline {
            owed.retain(|&r| {
                let up = self.peers[r as usize]
                    .as_deref()
                    .is_some_and(|p| matches!(p.link, Link::Up));
                up && !self.post(r, KIND_BYE, &[0, 0], &[]).unwrap_or(true)
            });
            let busy = self
                .peers
                .iter()
                .flatten()
                .any(|p| matches!(p.link, Link::Up) && !p.posted.is_empty());
            if owed.is_empty() && !busy {
                break;
            }
            if self.poll(&mut discard).is_err() {
                break;
            }
            let _ = self.wait(Duration::from_millis(5));
        }
    }

    fn stats(&self) -> NetStats {
        let mut s = self.stats.clone();
        s.rdma_pairs = self
            .peers
            .iter()
            .enumerate()
            .filter(|(r, p)| {
                *r != self.me as usize && p.as_deref().is_some_and(|p| matches!(p.link, Link::Up))
            })
            .count() as u64;
        s
    }

    fn rdma(&mut self) -> Option<&mut dyn crate::Rdma> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_peer_is_given_up_within_the_net_timeout() {
        for (secs, t) in [(10.0, 18), (1.0, 15), (0.5, 14), (0.001, 12), (1e6, 20)] {
            assert_eq!(ack_timeout_for(Duration::from_secs_f64(secs)), t, "{secs} s");
        }
        // Seven tries of the chosen timeout fit the default bound.
        let t = ack_timeout_for(config::DEFAULT_NET_TIMEOUT);
        assert!(7.0 * 4.096e-6 * f64::from(1u32 << t) <= 10.0);
    }
}
