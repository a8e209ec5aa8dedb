//! The tcp netmod: one connection per peer, length-prefixed frames, `writev`, epoll.
//!
//! # Wire format (little-endian)
//!
//! A connection starts with a handshake that proves, both ways, that each end holds the
//! job's key, without sending it ([`handshake`]). The accepting side sends a
//! [`Challenge`] ([`CHALLENGE_LEN`] bytes: [`MAGIC`], a nonce). The connecting side
//! answers a [`Hello`] ([`HELLO_LEN`] bytes: [`MAGIC`], from u32, to u32, max payload
//! u32, reserved u32 = 0, its own nonce, and an HMAC-SHA-256 tag over these and the
//! challenge). The accepting side checks it and either closes the connection without a
//! word (another job or a forgery, a wrong rank, a different max payload) or answers a
//! [`Reply`] ([`REPLY_LEN`] bytes: [`MAGIC`], code u32, its rank u32, a tag over these,
//! the hello and the challenge), which the connecting side checks in turn. Code 0
//! accepts the connection; code 1 says that another connection between the two carries
//! their traffic. Nothing else is written on a connection before it is accepted.
//!
//! After the handshake both directions carry frames: a [`FRAME_HEADER_LEN`]-byte header
//! (payload length u32, kind u32, envelope 2 × u64) and the payload. Kind 0 is a packet,
//! kind 1 ([`FrameKind::Goodbye`], no payload) says the sender is leaving the job.
//!
//! # Connections
//!
//! A connection to a peer is made the first time it is needed (a send, or a
//! [`Netmod::check_peer`] about a peer we have never talked to). When two processes
//! connect to each other at once, the connection made by the lower rank wins: each side
//! can decide that alone, so both keep the same one. Packets wait in a queue per peer,
//! not per connection, so they leave in order over whichever connection wins.
//!
//! Connections that have not proved themselves are bounded in number, per source and in
//! all, and in time ([`crate::gate`]); the listener's queue is drained at every poll, so a peer
//! of the job never waits behind strangers that connect and say nothing.

mod conn;
mod connect;
mod frame;
pub mod handshake;
mod sock;

use conn::{Conn, Inbound, OutQueue, State, read_frames};
pub use frame::{FRAME_HEADER_LEN, Frame, FrameKind, decode_frame, encode_frame_header};
pub use handshake::{
    CHALLENGE_LEN, Challenge, HELLO_LEN, Hello, MAGIC, REPLY_LEN, Reply, ReplyCode, decode_challenge,
    decode_hello, decode_reply,
};
use sock::{connect_nonblocking, not_now, send_vectored, tune};

use crate::gate;
use crate::sys::{Epoll, cvt, millis};
use crate::{Accept, Cards, DropReason, Drops, Envelope, Identity, NetError, NetStats, Netmod, addr, config};
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The largest payload of one packet, as a size (`K`, `M` suffixes allowed). Every rank
/// must use the same value: the handshake refuses a peer with another.
pub const MAX_PAYLOAD_VAR: &str = "NEMESIS_TCP_MAX_PAYLOAD";
/// Bytes that may wait in the queue to one peer before sends to it answer "again".
pub const QUEUE_LIMIT_VAR: &str = "NEMESIS_TCP_QUEUE_LIMIT";
/// The default of [`MAX_PAYLOAD_VAR`].
pub const DEFAULT_MAX_PAYLOAD: usize = 256 << 10;
/// The default of [`QUEUE_LIMIT_VAR`].
pub const DEFAULT_QUEUE_LIMIT: usize = 4 << 20;
/// How long an accepted connection may take to prove itself with its hello.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest max payload: it bounds every connection's input buffer.
pub const MAX_MAX_PAYLOAD: usize = 64 << 20;

/// What a netmod's drops are counted under.
const NAME: &str = "tcp";
/// The epoll token of the listener; connections count up from 0.
const LISTENER: u64 = u64::MAX;
/// A connection's input buffer to begin with; it grows to hold a whole frame.
const INITIAL_INPUT: usize = 64 << 10;
/// Bytes read from one connection in one poll, so that a busy peer cannot starve the
/// others; the rest waits for the next poll (epoll is level-triggered).
const READ_BUDGET: usize = 1 << 20;
/// Connections accepted in one poll: enough to drain a full listen queue, so that a
/// peer's connection is reached in the poll after it arrives, whatever came before it.
const ACCEPTS_PER_POLL: usize = 8192;
/// Events taken from epoll at a time.
const EVENTS: usize = 64;
/// Slices handed to one `sendmsg`: what does not fit is queued.
const MAX_IOV: usize = 64;
/// Redialing backs off from this ...
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// ... to this.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest timeout a configuration may give: beyond it `Instant` arithmetic could
/// overflow, and nobody waits that long.
const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);
/// How often `shutdown` looks again while waiting for queues to drain.
const SHUTDOWN_TICK: Duration = Duration::from_millis(20);

/// The tunables of the tcp netmod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// How long a connection may take to come up (retrying all the while) before the peer
    /// counts as failed; also sets the keepalive that finds peers on dead nodes.
    pub timeout: Duration,
    /// The largest payload of one packet.
    pub max_payload: usize,
    /// Bytes that may wait in one peer's queue; past it, sends answer [`Accept::Again`].
    pub queue_limit: usize,
    /// How long an accepted connection may take to prove itself with its hello.
    pub handshake_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            timeout: config::DEFAULT_NET_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl TcpConfig {
    /// The configuration the environment asks for.
    ///
    /// # Errors
    /// As for [`TcpConfig::from_lookup`].
    pub fn from_env() -> Result<Self, NetError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The configuration that `get` describes: [`config::NET_TIMEOUT_VAR`],
    /// [`MAX_PAYLOAD_VAR`] and [`QUEUE_LIMIT_VAR`], each optional.
    ///
    /// # Errors
    /// A value that is not usable, naming its variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let timeout = config::seconds(&get, config::NET_TIMEOUT_VAR, config::DEFAULT_NET_TIMEOUT)?;
        let max_payload = config::size(
            &get,
            MAX_PAYLOAD_VAR,
            DEFAULT_MAX_PAYLOAD as u64,
            1 << 10,
            MAX_MAX_PAYLOAD as u64,
        )?;
        let queue_limit = config::size(
            &get,
            QUEUE_LIMIT_VAR,
            DEFAULT_QUEUE_LIMIT as u64,
            4 << 10,
            1 << 30,
        )?;
        Ok(Self {
            timeout,
            // Both are bounded above by values that fit a usize.
            max_payload: max_payload as usize,
            queue_limit: queue_limit as usize,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// Refuses values the netmod cannot work with, whoever built the configuration.
    fn validate(&self) -> Result<(), NetError> {
        let bad = |var: &'static str, value: String, reason: &str| NetError::Config {
            var,
            value,
            reason: reason.into(),
        };
        if self.max_payload == 0 || self.max_payload > MAX_MAX_PAYLOAD {
            return Err(bad(
                "TcpConfig::max_payload",
                self.max_payload.to_string(),
                &format!("expected 1 to {MAX_MAX_PAYLOAD} bytes"),
            ));
        }
        if self.queue_limit == 0 {
            return Err(bad(
                "TcpConfig::queue_limit",
                "0".into(),
                "expected at least one byte",
            ));
        }
        for (var, t) in [
            ("TcpConfig::timeout", self.timeout),
            ("TcpConfig::handshake_timeout", self.handshake_timeout),
        ] {
            if t.is_zero() || t > MAX_TIMEOUT {
                return Err(bad(var, format!("{t:?}"), "expected a positive duration"));
            }
        }
        Ok(())
    }
}

/// `now + d`, or a point far enough away when that cannot be represented.
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(MAX_TIMEOUT))
        .unwrap_or(now)
}

/// What we know of one peer.
#[derive(Debug, Default)]
struct Peer {
    /// Its address, or why its card is unusable; asked once.
    card: Option<Result<SocketAddr, String>>,
    /// The connection that carries its traffic.
    up: Option<u64>,
    /// Our connection to it, while not yet accepted.
    dialing: Option<u64>,
    /// When to dial again.
    retry_at: Option<Instant>,
    /// When we began trying to connect; the peer fails `timeout` after it.
    first_dial: Option<Instant>,
    backoff: Duration,
    /// Why the last attempt failed.
    last_error: Option<String>,
    /// Why it counts as failed; for good.
    failed: Option<String>,
    out: OutQueue,
}

impl Peer {
    /// Whether it has, or is getting, a connection.
    fn in_touch(&self) -> bool {
        self.up.is_some() || self.dialing.is_some() || self.retry_at.is_some()
    }
}

/// Something due at a time: checked when due, ignored when stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A connection's handshake deadline.
    Conn(u64),
    /// A peer's next dial.
    Redial(u32),
}

/// The tcp netmod.
pub struct TcpNetmod {
    id: Identity,
    cfg: TcpConfig,
    cards: Box<dyn Cards>,
    listener: Option<TcpListener>,
    local: SocketAddr,
    epoll: Epoll,
    events: Vec<libc::epoll_event>,
    /// Events a `wait` found and left in `events` for the next poll, which then need
    /// not ask epoll again: a waiter that spins on `wait` pays one system call less per
    /// packet. Still true when the poll comes (level-triggered, and only we read).
    found: usize,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    peers: HashMap<u32, Peer>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Peers that `check_peer` wants a connection to, taken by the next poll. A `Cell`
    /// because `check_peer` has `&self`; the netmod stays `Send`.
    probes: Cell<Vec<u32>>,
    /// Accepted connections that have not proved themselves yet.
    gate: gate::Gate,
    /// Packets accepted and not yet wholly written.
    backlog: usize,
    stats: NetStats,
    closed: bool,
}

impl fmt::Debug for TcpNetmod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpNetmod")
            .field("rank", &self.id.rank)
            .field("size", &self.id.size)
            .field("local", &self.local)
            .field("connections", &self.conns.len())
            .field("unproven", &self.gate.len())
            .field("backlog", &self.backlog)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl TcpNetmod {
    /// Binds a listener at `id.addr`, any port, with an epoll instance; the card names
    /// the bound address.
    ///
    /// # Errors
    /// A rank outside the job, an unusable configuration, or a socket that cannot be made.
    pub fn new(id: Identity, cards: Box<dyn Cards>, cfg: TcpConfig) -> Result<Self, NetError> {
        if id.rank >= id.size {
            return Err(NetError::InvalidRank {
                rank: id.rank,
                size: id.size,
            });
        }
        cfg.validate()?;
        let io = |what: &str| {
            let what = format!("tcp: {what} at {}", id.addr);
            move |e| NetError::io(what, e)
        };
        let listener = TcpListener::bind(SocketAddr::new(id.addr, 0)).map_err(io("binding a listener"))?;
        // std listens with a short backlog; a job connects many peers to us at once.
        // SAFETY: a plain system call on our socket, with no pointers.
        cvt(unsafe { libc::listen(listener.as_raw_fd(), libc::SOMAXCONN) }).map_err(io("listening"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("making the listener non-blocking"))?;
        let local = listener
            .local_addr()
            .map_err(io("reading the listener's address"))?;
        let epoll = Epoll::new().map_err(io("creating an epoll instance"))?;
        epoll
            .ctl(
                libc::EPOLL_CTL_ADD,
                listener.as_raw_fd(),
                libc::EPOLLIN as u32,
                LISTENER,
            )
            .map_err(io("registering the listener"))?;
        Ok(Self {
            id,
            cfg,
            cards,
            listener: Some(listener),
            local,
            epoll,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS],
            found: 0,
            conns: HashMap::new(),
            next_conn: 0,
            peers: HashMap::new(),
            timers: BinaryHeap::new(),
            probes: Cell::new(Vec::new()),
            gate: gate::Gate::default(),
            backlog: 0,
            stats: NetStats::default(),
            closed: false,
        })
    }

    /// Drops are counted but not logged (tests that misbehave on purpose). Call it
    /// before use: it starts the counters afresh.
    pub fn quiet(mut self) -> Self {
        self.stats.drops = Drops::quiet();
        self
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn peer(&mut self, rank: u32) -> &mut Peer {
        self.peers.entry(rank).or_default()
    }

    /// `rank`'s address, from its card, which is asked for once.
    fn card_of(&mut self, rank: u32) -> Result<SocketAddr, NetError> {
        let known = self.peers.get(&rank).and_then(|p| p.card.clone());
        let card = match known {
            Some(c) => c,
            None => {
                let c = self
                    .cards
                    .card(rank)
                    .and_then(|bytes| addr::decode_card(NAME, rank, &bytes))
                    .map_err(|e| match e {
                        NetError::BadCard { reason, .. } => reason,
                        other => other.to_string(),
                    });
                self.peer(rank).card = Some(c.clone());
                c
            }
        };
        card.map_err(|reason| NetError::BadCard { rank, reason })
    }

    /// Registers a connection with epoll and keeps it.
    fn add_conn(
        &mut self,
        stream: TcpStream,
        addr: Option<SocketAddr>,
        peer: Option<u32>,
        state: State,
        deadline: Instant,
    ) -> io::Result<u64> {
        let cid = self.next_conn;
        self.next_conn += 1;
        let events = if state == State::Connecting {
            libc::EPOLLOUT
        } else {
            libc::EPOLLIN
        } as u32;
        self.epoll
            .ctl(libc::EPOLL_CTL_ADD, stream.as_raw_fd(), events, cid)?;
        self.timers.push(Reverse((deadline, Timer::Conn(cid))));
        self.conns.insert(
            cid,
            Conn {
                stream,
                addr,
                peer,
                state,
                input: vec![0; INITIAL_INPUT],
                start: 0,
                end: 0,
                hs_out: Vec::new(),
                challenge: None,
                hello: None,
                deadline: Some(deadline),
                events,
                broken: false,
            },
        );
        Ok(cid)
    }

    /// Closes a connection (closing the descriptor takes it out of the epoll set) and
    /// forgets it in its peer.
    fn close_conn(&mut self, cid: u64) {
        let Some(c) = self.conns.remove(&cid) else {
            return;
        };
        self.gate.leave(cid);
        if let Some(p) = c.peer.and_then(|r| self.peers.get_mut(&r)) {
            if p.up == Some(cid) {
                p.up = None;
            }
            if p.dialing == Some(cid) {
                p.dialing = None;
            }
        }
    }

    /// Marks `rank` failed for good: its connections close and its queue is discarded.
    fn fail_peer(&mut self, rank: u32, reason: String) {
        let p = self.peers.entry(rank).or_default();
        if p.failed.is_some() {
            return;
        }
        let lost = p.out.clear();
        let conns = [p.up.take(), p.dialing.take()];
        p.retry_at = None;
        p.failed = Some(if lost > 0 {
            format!("{reason}; {lost} packets queued to it were discarded")
        } else {
            reason
        });
        self.backlog = self.backlog.saturating_sub(lost);
        for cid in conns.into_iter().flatten() {
            self.conns.remove(&cid);
        }
    }

    /// Starts a connection to `rank`.
    ///
    /// # Errors
    /// Its card cannot be had; any other failure is the peer's or is retried.
    fn dial(&mut self, rank: u32) -> Result<(), NetError> {
        let addr = self.card_of(rank)?;
        let now = Instant::now();
        let timeout = self.cfg.timeout;
        let first = *self.peer(rank).first_dial.get_or_insert(now);
        match connect_nonblocking(addr) {
            Ok(stream) => {
                match self.add_conn(
                    stream,
                    Some(addr),
                    Some(rank),
                    State::Connecting,
                    after(first, timeout),
                ) {
                    Ok(cid) => self.peer(rank).dialing = Some(cid),
                    Err(e) => self.redial_later(rank, format!("registering a connection to {addr}: {e}")),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                self.fail_peer(rank, format!("nobody listens at {addr} (connection refused)"));
            }
            Err(e) => self.redial_later(rank, format!("connecting to {addr}: {e}")),
        }
        Ok(())
    }

    /// Dials `rank` again after a backoff, or fails it once `timeout` has passed since
    /// the first attempt.
    fn redial_later(&mut self, rank: u32, why: String) {
        let now = Instant::now();
        let timeout = self.cfg.timeout;
        let p = self.peer(rank);
        if p.failed.is_some() || p.up.is_some() {
            return;
        }
        let first = *p.first_dial.get_or_insert(now);
        if now.saturating_duration_since(first) >= timeout {
            self.fail_peer(rank, format!("no connection came up within {timeout:?}: {why}"));
            return;
        }
        p.backoff = if p.backoff.is_zero() {
            MIN_BACKOFF
        } else {
            p.backoff.saturating_mul(2).min(MAX_BACKOFF)
        };
        let at = after(now, p.backoff).min(after(first, timeout));
        p.retry_at = Some(at);
        p.last_error = Some(why);
        self.timers.push(Reverse((at, Timer::Redial(rank))));
    }

    /// Asks for epoll's attention to writability only while there is something to write.
    fn update_interest(&mut self, cid: u64) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let queued = c.state == State::Up
            && c.peer
                .and_then(|r| self.peers.get(&r))
                .is_some_and(|p| !p.out.is_empty());
        let want = match c.state {
            State::Connecting => libc::EPOLLOUT as u32,
            _ if !c.broken && (queued || !c.hs_out.is_empty()) => (libc::EPOLLIN | libc::EPOLLOUT) as u32,
            _ => libc::EPOLLIN as u32,
        };
        if want != c.events
            && self
                .epoll
                .ctl(libc::EPOLL_CTL_MOD, c.stream.as_raw_fd(), want, cid)
                .is_ok()
        {
            c.events = want;
        }
    }

    /// Writes what a connection owes: its handshake bytes, then, once up, its peer's queue.
    fn flush_conn(&mut self, cid: u64) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        while !c.broken && !c.hs_out.is_empty() {
            match (&c.stream).write(&c.hs_out) {
                Ok(0) => break,
                Ok(n) => drop(c.hs_out.drain(..n.min(c.hs_out.len()))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => c.broken = true,
            }
        }
        if c.state == State::Up && c.hs_out.is_empty() {
            if let Some(p) = c.peer.and_then(|r| self.peers.get_mut(&r)) {
                while !c.broken && !p.out.is_empty() {
                    match (&c.stream).write(p.out.pending()) {
                        Ok(0) => break,
                        Ok(n) => self.backlog = self.backlog.saturating_sub(p.out.consume(n)),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => c.broken = true,
                    }
                }
            }
        }
        self.update_interest(cid);
    }

    /// Whether `rank` already has a connection, so that whatever befalls another
    /// attempt of ours does not matter.
    fn superseded(&self, rank: u32) -> bool {
        self.peers.get(&rank).is_some_and(|p| p.up.is_some())
    }

    /// Makes `cid` the connection of `rank`, writes what is queued and reads what came.
    fn become_up(&mut self, cid: u64, rank: u32, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> usize {
        let p = self.peer(rank);
        p.up = Some(cid);
        if p.dialing == Some(cid) {
            p.dialing = None;
        }
        p.retry_at = None;
        p.first_dial = None;
        p.backoff = Duration::ZERO;
        p.last_error = None;
        if let Some(c) = self.conns.get_mut(&cid) {
            c.state = State::Up;
            c.peer = Some(rank);
            c.deadline = None;
            tune(&c.stream, self.cfg.timeout);
        }
        self.flush_conn(cid);
        self.read_up(cid, sink)
    }

    /// Reads an established connection and hands up its packets.
    fn read_up(&mut self, cid: u64, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> usize {
        let max = self.cfg.max_payload;
        let Some(c) = self.conns.get_mut(&cid) else {
            return 0;
        };
        let Some(rank) = c.peer else {
            return 0;
        };
        let mut handed = 0;
        let outcome = read_frames(c, max, &mut |env, payload| {
            handed += 1;
            sink(rank, env, payload);
        });
        self.stats.packets_received += handed as u64;
        let reason = match outcome {
            Inbound::Drained => return handed,
            Inbound::Goodbye => "it left the job (it said goodbye)".to_string(),
            Inbound::Eof { partial: false } => "its connection closed without a goodbye".to_string(),
            Inbound::Eof { partial: true } => {
                self.stats.drops.note(
                    NAME,
                    DropReason::Truncated,
                    format!("rank {rank}'s connection ended in the middle of a frame"),
                );
                "its connection ended in the middle of a frame".to_string()
            }
            Inbound::Error(e) => format!("its connection was lost: {e}"),
            Inbound::Bad(r, what) => {
                self.stats.drops.note(NAME, r, format!("rank {rank} sent {what}"));
                format!("it sent {what} ({r}); its stream cannot be trusted")
            }
        };
        self.close_conn(cid);
        self.fail_peer(rank, reason);
        handed
    }

    /// Handles what epoll said about one connection.
    fn on_event(&mut self, cid: u64, flags: u32, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> usize {
        let Some(c) = self.conns.get(&cid) else {
            return 0;
        };
        let readable = flags & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        let writable = flags & libc::EPOLLOUT as u32 != 0;
        match c.state {
            State::Connecting => {
                if readable || writable {
                    self.on_connected(cid);
                }
                0
            }
            state => {
                if writable {
                    self.flush_conn(cid);
                }
                if !readable {
                    return 0;
                }
                match state {
                    State::AwaitChallenge => {
                        self.on_challenge(cid);
                        // The reply may have come with the challenge's round trip.
                        0
                    }
                    State::AwaitReply => self.on_reply(cid, sink),
                    State::AwaitHello => self.on_hello(cid, sink),
                    _ => self.read_up(cid, sink),
                }
            }
        }
    }

    /// Handles what is due.
    fn run_timers(&mut self) {
        let now = Instant::now();
        while let Some(&Reverse((at, timer))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            match timer {
                Timer::Conn(cid) => self.conn_timer(cid, now),
                Timer::Redial(rank) => self.redial_timer(rank, now),
            }
        }
    }

    fn conn_timer(&mut self, cid: u64, now: Instant) {
        let Some(c) = self.conns.get(&cid) else {
            return;
        };
        if c.state == State::Up || c.deadline.is_none_or(|d| d > now) {
            return;
        }
        let who = c.who();
        let (state, peer) = (c.state, c.peer);
        self.close_conn(cid);
        match (state, peer) {
            (State::AwaitHello, _) => self.stats.drops.note(
                NAME,
                DropReason::BadHandshake,
                format!("{who} proved nothing within {:?}", self.cfg.handshake_timeout),
            ),
            (_, Some(rank)) if !self.superseded(rank) => {
                let what = match state {
                    State::Connecting => "connecting did not complete",
                    State::AwaitChallenge => "it did not challenge us",
                    _ => "it did not answer our hello",
                };
                let timeout = self.cfg.timeout;
                self.fail_peer(
                    rank,
                    format!("no connection came up within {timeout:?}: {who}: {what}"),
                );
            }
            _ => {}
        }
    }

    fn redial_timer(&mut self, rank: u32, now: Instant) {
        let timeout = self.cfg.timeout;
        let Some(p) = self.peers.get_mut(&rank) else {
            return;
        };
        if p.retry_at.is_none_or(|t| t > now) {
            return;
        }
        p.retry_at = None;
        if p.failed.is_some() || p.up.is_some() || p.dialing.is_some() {
            return;
        }
        if p.first_dial
            .is_some_and(|f| now.saturating_duration_since(f) >= timeout)
        {
            let why = p.last_error.take().unwrap_or_default();
            self.fail_peer(rank, format!("no connection came up within {timeout:?}: {why}"));
        } else if let Err(e) = self.dial(rank) {
            self.fail_peer(rank, e.to_string());
        }
    }

    /// Connects to the peers `check_peer` asked about, so that a dead one is found.
    fn run_probes(&mut self) {
        for rank in self.probes.take() {
            if self
                .peers
                .get(&rank)
                .is_some_and(|p| p.failed.is_some() || p.in_touch())
            {
                continue;
            }
            if let Err(e) = self.dial(rank) {
                self.fail_peer(rank, e.to_string());
            }
        }
    }

    /// Writes `header` and `payload` to `rank`'s connection now if nothing is ahead of
    /// them; `None` when they must be queued.
    fn write_now(&mut self, rank: u32, header: &[u8], payload: &[&[u8]]) -> Option<usize> {
        let p = self.peers.get(&rank)?;
        let cid = p.up.filter(|_| p.out.is_empty())?;
        let c = self
            .conns
            .get_mut(&cid)
            .filter(|c| c.hs_out.is_empty() && !c.broken)?;
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        for (slot, part) in iov
            .iter_mut()
            .zip(std::iter::once(header).chain(payload.iter().copied()))
        {
            *slot = IoSlice::new(part);
            n += 1;
        }
        Some(match send_vectored(&c.stream, &iov[..n]) {
            Ok(n) => n,
            Err(e) if not_now(&e) => 0,
            Err(_) => {
                // Reading the connection at the next poll says what became of it.
                c.broken = true;
                0
            }
        })
    }

    /// Sends what is queued and says goodbye; see [`Netmod::shutdown`].
    fn close_all(&mut self, timeout: Duration) {
        self.found = 0;
        let deadline = after(Instant::now(), timeout);
        let mut discard = |_: u32, _: &Envelope, _: &[u8]| {};
        while self.backlog > 0 {
            if self.poll(&mut discard).is_err() || self.backlog == 0 {
                break;
            }
            let now = Instant::now();
            if now >= deadline || self.wait((deadline - now).min(SHUTDOWN_TICK)).is_err() {
                break;
            }
        }
        self.listener = None;
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        let goodbye = encode_frame_header(FrameKind::Goodbye, &[0, 0], 0);
        for cid in ids {
            let Some(c) = self.conns.get(&cid) else {
                continue;
            };
            if c.state != State::Up {
                self.close_conn(cid);
                continue;
            }
            let clean = !c.broken
                && c.hs_out.is_empty()
                && c.peer
                    .and_then(|r| self.peers.get(&r))
                    .is_some_and(|p| p.out.is_empty());
            if clean {
                let _ = (&c.stream).write(&goodbye);
            }
            let _ = c.stream.shutdown(Shutdown::Write);
        }
        // Read until each peer closes, so that nothing unread makes our close a reset
        // that could destroy what we sent before the peer read it.
        let mut scratch = vec![0u8; INITIAL_INPUT];
        loop {
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            for cid in ids {
                let Some(c) = self.conns.get(&cid) else {
                    continue;
                };
                let done = loop {
                    match (&c.stream).read(&mut scratch) {
                        Ok(0) => break true,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break e.kind() != io::ErrorKind::WouldBlock,
                    }
                };
                if done {
                    self.conns.remove(&cid);
                }
            }
            let now = Instant::now();
            if self.conns.is_empty() || now >= deadline {
                break;
            }
            let ms = millis((deadline - now).min(SHUTDOWN_TICK));
            if self.epoll.wait(&mut self.events, ms).is_err() {
                break;
            }
        }
        self.conns.clear();
        for p in self.peers.values_mut() {
            p.out.clear();
            p.up = None;
            p.dialing = None;
            p.retry_at = None;
        }
        self.backlog = 0;
        self.timers.clear();
        self.closed = true;
    }
}

impl Netmod for TcpNetmod {
    fn name(&self) -> &'static str {
        NAME
    }

    fn business_card(&self) -> Vec<u8> {
        addr::encode_card(NAME, self.local)
    }

    fn max_payload(&self) -> usize {
        self.cfg.max_payload
    }

    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        if self.closed {
            return Err(NetError::io(
                format!("tcp: sending to rank {peer}"),
                io::Error::new(io::ErrorKind::NotConnected, "the netmod has been shut down"),
            ));
        }
        // Our own rank is not a destination: the layer above loops back itself.
        if peer >= self.id.size || peer == self.id.rank {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.id.size,
            });
        }
        let len = payload.iter().fold(0usize, |a, p| a.saturating_add(p.len()));
        if len > self.cfg.max_payload {
            return Err(NetError::TooLarge {
                len,
                max: self.cfg.max_payload,
            });
        }
        if let Some(reason) = self.peers.get(&peer).and_then(|p| p.failed.clone()) {
            return Err(NetError::PeerFailed { rank: peer, reason });
        }
        // validate() bounds max_payload, hence len, by MAX_MAX_PAYLOAD.
        let header = encode_frame_header(FrameKind::Packet, env, len as u32);
        if let Some(written) = self.write_now(peer, &header, payload) {
            if written < FRAME_HEADER_LEN + len {
                let p = self.peer(peer);
                p.out.push(&header, payload, written, true);
                let up = p.up;
                self.backlog += 1;
                if let Some(cid) = up {
                    self.update_interest(cid);
                }
            }
            self.stats.packets_sent += 1;
            return Ok(Accept::Sent);
        }
        let queue_limit = self.cfg.queue_limit;
        let p = self.peer(peer);
        if p.out.bytes() >= queue_limit {
            return Ok(Accept::Again);
        }
        if !p.in_touch() {
            self.dial(peer)?;
            if let Some(reason) = self.peers.get(&peer).and_then(|p| p.failed.clone()) {
                return Err(NetError::PeerFailed { rank: peer, reason });
            }
        }
        self.peer(peer).out.push(&header, payload, 0, true);
        self.backlog += 1;
        self.stats.packets_sent += 1;
        Ok(Accept::Sent)
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        if self.closed {
            return Ok(0);
        }
        self.run_probes();
        let n = match std::mem::take(&mut self.found) {
            0 => self
                .epoll
                .wait(&mut self.events, 0)
                .map_err(|e| NetError::io("tcp: epoll_wait", e))?,
            found => found,
        };
        let mut handed = 0;
        for i in 0..n {
            let Some(&ev) = self.events.get(i) else {
                break;
            };
            let (flags, token) = (ev.events, ev.u64);
            if token == LISTENER {
                self.accept_all();
            } else {
                handed += self.on_event(token, flags, sink);
            }
        }
        // After the events: a reply that came in time is not lost to a late poll.
        self.run_timers();
        Ok(handed)
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError> {
        if self.closed {
            return Ok(false);
        }
        // poll hands up every whole frame it reads, so none is ever left buffered.
        let probes = self.probes.take();
        let probing = !probes.is_empty();
        self.probes.set(probes);
        let now = Instant::now();
        let next = self.timers.peek().map(|Reverse((t, _))| *t);
        if probing || self.found > 0 || next.is_some_and(|t| t <= now) {
            return Ok(true);
        }
        let t = next.map_or(timeout, |n| timeout.min(n - now));
        let n = self
            .epoll
            .wait(&mut self.events, millis(t))
            .map_err(|e| NetError::io("tcp: epoll_wait", e))?;
        self.found = n;
        Ok(n > 0 || next.is_some_and(|t| t <= Instant::now()))
    }

    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.epoll.as_fd())
    }

    fn wait_hint(&mut self) -> Result<crate::WaitHint, NetError> {
        if self.wait(Duration::ZERO)? {
            return Ok(crate::WaitHint::Now);
        }
        let next = self.timers.peek().map(|Reverse((t, _))| *t);
        Ok(crate::WaitHint::Later(if self.closed { None } else { next }))
    }

    fn backlog(&self) -> usize {
        self.backlog
    }

    /// Not while bytes wait for the connection, or for it to come up: a new packet would
    /// only be copied behind them.
    fn writable(&self, peer: u32) -> bool {
        match self.peers.get(&peer) {
            Some(p) if p.failed.is_none() && p.in_touch() => p.up.is_some() && p.out.is_empty(),
            _ => true,
        }
    }

    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        if peer >= self.id.size {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.id.size,
            });
        }
        if peer == self.id.rank {
            return Ok(());
        }
        let p = self.peers.get(&peer);
        if let Some(reason) = p.and_then(|p| p.failed.clone()) {
            return Err(NetError::PeerFailed { rank: peer, reason });
        }
        if !self.closed && !p.is_some_and(Peer::in_touch) {
            let mut probes = self.probes.take();
            if !probes.contains(&peer) {
                probes.push(peer);
            }
            self.probes.set(probes);
        }
        Ok(())
    }

    fn shutdown(&mut self, timeout: Duration) {
        if !self.closed {
            self.close_all(timeout);
        }
    }

    fn stats(&self) -> NetStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{JobKey, KEY_LEN, NONCE_LEN};
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::{Arc, Mutex};

    const KEY: JobKey = JobKey::from_bytes([0x5e; KEY_LEN]);
    const LONG: Duration = Duration::from_secs(10);

    /// A card table that the netmods share, filled once they are bound.
    #[derive(Clone, Default)]
    struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Cards for Table {
        fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
            self.0.lock().unwrap().card(rank)
        }
    }

    impl Table {
        fn set(&self, rank: u32, card: Vec<u8>) {
            self.0.lock().unwrap()[rank as usize] = card;
        }
    }

    fn ident(rank: u32, size: u32) -> Identity {
        Identity {
            rank,
            size,
            job_key: KEY,
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    fn small() -> TcpConfig {
        TcpConfig {
            max_payload: 64 << 10,
            ..TcpConfig::default()
        }
    }

    /// Netmods for ranks `0..n` of a job of `size`, knowing each other's cards; the
    /// other ranks' cards are the test's to set.
    fn job(n: u32, size: u32, cfg: &TcpConfig) -> (Vec<TcpNetmod>, Table) {
        let table = Table(Arc::new(Mutex::new(vec![Vec::new(); size as usize])));
        let nms: Vec<TcpNetmod> = (0..n)
            .map(|r| {
                TcpNetmod::new(ident(r, size), Box::new(table.clone()), cfg.clone())
                    .unwrap()
                    .quiet()
            })
            .collect();
        for (r, nm) in (0..).zip(&nms) {
            table.set(r, nm.business_card());
        }
        (nms, table)
    }

    type Got = Vec<(u32, Envelope, Vec<u8>)>;

    fn poll_all(nms: &mut [TcpNetmod], got: &mut [Got]) {
        for (nm, g) in nms.iter_mut().zip(got.iter_mut()) {
            nm.poll(&mut |src, env, p| g.push((src, *env, p.to_vec())))
                .unwrap();
        }
    }

    /// Polls every netmod in turn until `done` holds or 10 s pass; says whether it held.
    fn pump(
        nms: &mut [TcpNetmod],
        got: &mut [Got],
        mut done: impl FnMut(&[TcpNetmod], &[Got]) -> bool,
    ) -> bool {
        let end = Instant::now() + LONG;
        loop {
            poll_all(nms, got);
            if done(nms, got) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Sends, polling everyone while the netmod answers "again".
    fn send_all(
        nms: &mut [TcpNetmod],
        got: &mut [Got],
        from: usize,
        to: u32,
        env: Envelope,
        payload: &[&[u8]],
    ) {
        let end = Instant::now() + LONG;
        while nms[from].send(to, &env, payload).unwrap() == Accept::Again {
            assert!(Instant::now() < end, "rank {from} could not send to {to}");
            poll_all(nms, got);
        }
    }

    fn pattern(src: u32, dst: u32, seq: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i * 31 + seq * 7 + u64::from(src) * 3 + u64::from(dst)) as u8)
            .collect()
    }

    /// Every netmod has exactly one connection per peer it talked to, and it is up.
    fn settled(nms: &[TcpNetmod]) -> bool {
        nms.iter().all(|nm| {
            nm.conns.values().all(|c| c.state == State::Up)
                && nm.peers.values().all(|p| p.dialing.is_none())
                && nm.backlog() == 0
        })
    }

    fn failure(nm: &TcpNetmod, peer: u32) -> String {
        match nm.check_peer(peer) {
            Err(NetError::PeerFailed { rank, reason }) => {
                assert_eq!(rank, peer);
                reason
            }
            other => panic!("rank {peer}: {other:?}"),
        }
    }

    #[test]
    fn netmod_is_send() {
        fn send<T: Send>() {}
        send::<TcpNetmod>();
    }

    #[test]
    fn ordered_delivery_among_two_and_three() {
        for n in [2u32, 3] {
            let cfg = TcpConfig::default();
            let max = cfg.max_payload;
            let (mut nms, _cards) = job(n, n, &cfg);
            let mut got = vec![Got::new(); n as usize];
            let sizes = [0, 1, 1000, max, 0, 77, max - 1];
            let rounds = 3;
            for round in 0..rounds {
                for src in 0..n {
                    for dst in (0..n).filter(|&d| d != src) {
                        for (i, &len) in sizes.iter().enumerate() {
                            let seq = (round * sizes.len() + i) as u64;
                            let data = pattern(src, dst, seq, len);
                            let env = [seq, (u64::from(src) << 32) | u64::from(dst)];
                            let (a, rest) = data.split_at(len / 3);
                            let (b, c) = rest.split_at(rest.len() / 2);
                            let parts: Vec<&[u8]> = if i % 2 == 0 {
                                vec![&data]
                            } else {
                                vec![a, &[], b, c]
                            };
                            send_all(&mut nms, &mut got, src as usize, dst, env, &parts);
                        }
                    }
                }
            }
            let per = rounds * sizes.len();
            let want = per * (n as usize - 1);
            assert!(pump(&mut nms, &mut got, |nms, g| g
                .iter()
                .all(|g| g.len() == want)
                && settled(nms)));
            // Exactly once: more polls bring nothing more.
            for _ in 0..20 {
                poll_all(&mut nms, &mut got);
            }
            for dst in 0..n {
                assert_eq!(got[dst as usize].len(), want);
                for src in (0..n).filter(|&s| s != dst) {
                    let from: Vec<_> = got[dst as usize].iter().filter(|(s, ..)| *s == src).collect();
                    assert_eq!(from.len(), per);
                    for (k, (_, env, payload)) in (0u64..).zip(from) {
                        assert_eq!(*env, [k, (u64::from(src) << 32) | u64::from(dst)]);
                        let len = sizes[k as usize % sizes.len()];
                        assert!(*payload == pattern(src, dst, k, len), "{src}->{dst} #{k}");
                    }
                }
                let s = nms[dst as usize].stats();
                assert_eq!(s.packets_sent, want as u64);
                assert_eq!(s.packets_received, want as u64);
                assert_eq!(s.drops.total(), 0);
                assert_eq!(nms[dst as usize].conns.len(), n as usize - 1);
            }
            // More slices than one sendmsg takes: the rest is queued, in order.
            let data = pattern(0, 1, 99, 1000);
            let slices: Vec<&[u8]> = data.chunks(7).collect();
            assert!(slices.len() > MAX_IOV);
            send_all(&mut nms, &mut got, 0, 1, [99, 99], &slices);
            assert!(pump(&mut nms, &mut got, |_, g| g[1].len() == want + 1));
            assert_eq!(got[1][want], (0, [99, 99], data));
            let nm = &mut nms[0];
            assert!(matches!(nm.send(n, &[0, 0], &[]), Err(NetError::InvalidRank { rank, .. }) if rank == n));
            assert!(matches!(
                nm.send(0, &[0, 0], &[]),
                Err(NetError::InvalidRank { rank: 0, .. })
            ));
            let big = vec![0u8; max];
            assert!(matches!(
                nm.send(1, &[0, 0], &[&big, b"x"]),
                Err(NetError::TooLarge { len, max: m }) if len == max + 1 && m == max
            ));
            assert_eq!(nm.name(), "tcp");
            assert_eq!(nm.max_payload(), max);
            assert_eq!(
                addr::decode_card("tcp", 0, &nm.business_card()).unwrap(),
                nm.local_addr()
            );
        }
    }

    #[test]
    fn simultaneous_connects_keep_one_connection() {
        for _ in 0..5 {
            let (mut nms, _cards) = job(2, 2, &small());
            let mut got = vec![Got::new(); 2];
            let count = 20u64;
            // Both send before either polls: both dial.
            for k in 0..count {
                for src in 0..2u32 {
                    let p = pattern(src, 1 - src, k, 100 + k as usize);
                    send_all(
                        &mut nms,
                        &mut got,
                        src as usize,
                        1 - src,
                        [k, u64::from(src)],
                        &[&p],
                    );
                }
            }
            assert!(
                nms.iter()
                    .all(|nm| nm.peers.values().all(|p| p.dialing.is_some()))
            );
            assert!(pump(&mut nms, &mut got, |nms, g| {
                g.iter().all(|g| g.len() == count as usize) && settled(nms)
            }));
            for _ in 0..20 {
                poll_all(&mut nms, &mut got);
            }
            for dst in 0..2u32 {
                let src = 1 - dst;
                let g = &got[dst as usize];
                assert_eq!(g.len(), count as usize);
                for (k, (s, env, p)) in (0u64..).zip(g) {
                    assert_eq!((*s, *env), (src, [k, u64::from(src)]));
                    assert!(*p == pattern(src, dst, k, 100 + k as usize));
                }
                let nm = &nms[dst as usize];
                assert_eq!(nm.conns.len(), 1, "rank {dst}: {:?}", nm.conns);
                let up = nm.peers[&src].up.unwrap();
                assert_eq!(nm.conns[&up].state, State::Up);
                assert_eq!(nm.stats().drops.total(), 0);
            }
            // Rank 0's connection won: it is the one that reaches rank 1's listener.
            let winner = |nm: &TcpNetmod, peer: u32| nm.conns[&nm.peers[&peer].up.unwrap()].addr;
            assert_eq!(winner(&nms[0], 1), Some(nms[1].local_addr()));
            assert_ne!(winner(&nms[1], 0), Some(nms[0].local_addr()));
        }
    }

    /// Reads `n` bytes from `s`, polling the netmods meanwhile.
    fn read_pumping(nms: &mut [TcpNetmod], got: &mut [Got], s: &mut TcpStream, n: usize) -> Vec<u8> {
        s.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; n];
        let mut have = 0;
        assert!(pump(nms, got, |_, _| {
            if let Ok(k) = s.read(&mut buf[have..]) {
                have += k;
            }
            have == n
        }));
        s.set_nonblocking(false).unwrap();
        buf
    }

    /// Reads the challenge a netmod sends on `s`, polling it meanwhile.
    fn read_challenge(nms: &mut [TcpNetmod], got: &mut [Got], s: &mut TcpStream) -> Challenge {
        decode_challenge(&read_pumping(nms, got, s, CHALLENGE_LEN)).unwrap()
    }

    fn hello(key: &JobKey, from: u32, to: u32, max_payload: usize, ch: &Challenge) -> [u8; HELLO_LEN] {
        Hello::new(key, from, to, max_payload as u32, [9; NONCE_LEN], ch).encode()
    }

    #[test]
    fn bad_handshakes_are_refused_and_counted() {
        let cfg = TcpConfig {
            handshake_timeout: Duration::from_millis(300),
            ..small()
        };
        let max = cfg.max_payload;
        let (mut nms, _cards) = job(2, 2, &cfg);
        let mut got = vec![Got::new(); 2];
        let other = JobKey::from_bytes([0xee; KEY_LEN]);
        let stale = Challenge {
            nonce: [1; NONCE_LEN],
        };
        type Make = fn(&JobKey, &JobKey, &Challenge, &Challenge, usize) -> Vec<u8>;
        let cases: [Make; 8] = [
            // Another job's key, and a hello replayed from another connection.
            |_, other, ch, _, max| hello(other, 1, 0, max, ch).to_vec(),
            |key, _, _, stale, max| hello(key, 1, 0, max, stale).to_vec(),
            |key, _, ch, _, max| {
                let mut b = hello(key, 1, 0, max, ch);
                b[0] ^= 0xff;
                b.to_vec()
            },
            |key, _, ch, _, max| hello(key, 1, 1, max, ch).to_vec(),
            |key, _, ch, _, max| hello(key, 5, 0, max, ch).to_vec(),
            |key, _, ch, _, max| hello(key, 0, 0, max, ch).to_vec(),
            |key, _, ch, _, max| hello(key, 1, 0, max + 1, ch).to_vec(),
            // Silence, until the handshake timeout.
            |_, _, _, _, _| Vec::new(),
        ];
        let mut raws = Vec::new();
        for make in cases {
            let mut s = TcpStream::connect(nms[0].local_addr()).unwrap();
            let ch = read_challenge(&mut nms, &mut got, &mut s);
            s.write_all(&make(&KEY, &other, &ch, &stale, max)).unwrap();
            raws.push(s);
        }
        let want = [
            (DropReason::WrongJob, 2),
            (DropReason::BadMagic, 1),
            (DropReason::BadRank, 3),
            (DropReason::BadHandshake, 2),
        ];
        nms[0].send(1, &[1, 2], &[b"good"]).unwrap();
        assert!(pump(&mut nms, &mut got, |nms, g| {
            let d = nms[0].stats().drops;
            want.iter().all(|&(r, n)| d.count(r) == n) && g[1].len() == 1
        }));
        assert_eq!(nms[0].stats().drops.total(), 8);
        // A refused connector is told nothing: the connection just ends.
        for mut s in raws {
            s.set_read_timeout(Some(LONG)).unwrap();
            let mut buf = [0u8; 64];
            assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
        }
        assert!(nms[0].conns.values().all(|c| c.state == State::Up));
        assert_eq!(nms[0].gate.len(), 0);
        // The good peer is unaffected, both ways.
        nms[1].send(0, &[3, 4], &[b"back"]).unwrap();
        assert!(pump(&mut nms, &mut got, |_, g| g[0].len() == 1));
        assert_eq!(got[0][0], (1, [3, 4], b"back".to_vec()));
        assert_eq!(got[1][0], (0, [1, 2], b"good".to_vec()));
        assert!(nms[0].check_peer(1).is_ok() && nms[1].check_peer(0).is_ok());
    }

    #[test]
    fn strangers_that_say_nothing_do_not_keep_a_peer_out() {
        let (mut nms, _cards) = job(2, 2, &small());
        let mut got = vec![Got::new(); 2];
        // More silent connections than the gate holds, all before the peer's.
        let strangers: Vec<TcpStream> = (0..gate::TOTAL + 200)
            .map(|_| TcpStream::connect(nms[1].local_addr()).unwrap())
            .collect();
        nms[0].send(1, &[5, 6], &[b"through"]).unwrap();
        assert!(pump(&mut nms, &mut got, |_, g| g[1].len() == 1));
        assert_eq!(got[1][0], (0, [5, 6], b"through".to_vec()));
        assert!(nms[1].gate.len() <= gate::PER_SOURCE, "{}", nms[1].gate.len());
        assert!(nms[1].stats().drops.count(DropReason::BadHandshake) >= 200);
        drop(strangers);
    }

    /// A raw client that passes the handshake with `nms[0]` as `from`.
    fn raw_peer(nms: &mut [TcpNetmod], got: &mut [Got], from: u32) -> TcpStream {
        let max = nms[0].max_payload();
        let mut s = TcpStream::connect(nms[0].local_addr()).unwrap();
        let ch = read_challenge(nms, got, &mut s);
        let h = Hello::new(&KEY, from, 0, max as u32, [9; NONCE_LEN], &ch);
        s.write_all(&h.encode()).unwrap();
        let reply = decode_reply(&read_pumping(nms, got, &mut s, REPLY_LEN)).unwrap();
        assert_eq!((reply.code, reply.rank), (ReplyCode::Accepted, 0));
        assert!(reply.proves(&KEY, &h, &ch));
        s
    }

    fn frame(kind: FrameKind, env: Envelope, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = encode_frame_header(kind, &env, len).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn bad_frames_fail_only_their_peer() {
        let max = small().max_payload as u32;
        let cases: [(Vec<u8>, DropReason, &str); 3] = [
            (
                frame(FrameKind::Packet, [0, 0], max + 1, &[]),
                DropReason::Oversized,
                "above the maximum",
            ),
            (
                {
                    let mut f = frame(FrameKind::Packet, [0, 0], 0, &[]);
                    f[4] = 7;
                    f
                },
                DropReason::Malformed,
                "kind 7",
            ),
            (
                frame(FrameKind::Packet, [0, 0], 100, &[5; 50]),
                DropReason::Truncated,
                "middle of a frame",
            ),
        ];
        for (bytes, reason, says) in cases {
            let (mut nms, _cards) = job(2, 3, &small());
            let mut got = vec![Got::new(); 2];
            let mut raw = raw_peer(&mut nms, &mut got, 2);
            raw.write_all(&frame(FrameKind::Packet, [9, 9], 2, b"hi"))
                .unwrap();
            raw.write_all(&bytes).unwrap();
            // The truncated frame ends with the connection; the others stay open, and the
            // netmod must give up on them by itself.
            let _open = (reason != DropReason::Truncated).then_some(raw);
            assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(2).is_err()));
            assert_eq!(nms[0].stats().drops.count(reason), 1, "{reason}");
            assert_eq!(nms[0].stats().drops.total(), 1);
            let why = failure(&nms[0], 2);
            assert!(why.contains(says), "{why}");
            // What came before the bad frame was handed up.
            assert_eq!(got[0], vec![(2, [9, 9], b"hi".to_vec())]);
            assert!(matches!(
                nms[0].send(2, &[0, 0], &[]),
                Err(NetError::PeerFailed { rank: 2, .. })
            ));
            // The others are fine.
            nms[0].send(1, &[7, 7], &[b"still"]).unwrap();
            nms[1].send(0, &[8, 8], &[b"here"]).unwrap();
            assert!(pump(&mut nms, &mut got, |_, g| g[0].len() == 2 && g[1].len() == 1));
            assert_eq!(got[0][1], (1, [8, 8], b"here".to_vec()));
            assert!(nms[0].check_peer(1).is_ok());
        }
    }

    #[test]
    fn a_bad_reply_fails_the_peer() {
        type Answer = fn(&Hello, &Challenge) -> Vec<u8>;
        let cases: [(bool, Answer, DropReason, &str); 4] = [
            (
                true,
                |h, ch| Reply::new(&KEY, ReplyCode::Accepted, 7, h, ch).encode().to_vec(),
                DropReason::BadRank,
                "business card",
            ),
            (
                true,
                |h, ch| {
                    let other = JobKey::from_bytes([0xee; KEY_LEN]);
                    Reply::new(&other, ReplyCode::Accepted, 1, h, ch)
                        .encode()
                        .to_vec()
                },
                DropReason::WrongJob,
                "does not hold the job's key",
            ),
            (
                true,
                |_, _| format!("{:<1$}", "HTTP/1.1 400 Bad Request", REPLY_LEN).into_bytes(),
                DropReason::BadMagic,
                "not a tcp netmod",
            ),
            // A server that speaks first, but not a challenge.
            (false, |_, _| Vec::new(), DropReason::BadMagic, "not a tcp netmod"),
        ];
        for (challenges, answer, reason, says) in cases {
            let (mut nms, cards) = job(1, 2, &small());
            let mut got = vec![Got::new(); 1];
            let fake = TcpListener::bind("127.0.0.1:0").unwrap();
            fake.set_nonblocking(true).unwrap();
            cards.set(1, addr::encode_card("tcp", fake.local_addr().unwrap()));
            assert_eq!(nms[0].send(1, &[1, 1], &[b"lost"]).unwrap(), Accept::Sent);
            let mut conn = None;
            assert!(pump(&mut nms, &mut got, |_, _| {
                conn = conn.take().or_else(|| fake.accept().ok().map(|(s, _)| s));
                conn.is_some()
            }));
            let mut s = conn.unwrap();
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(LONG)).unwrap();
            if challenges {
                let ch = Challenge {
                    nonce: [4; NONCE_LEN],
                };
                s.write_all(&ch.encode()).unwrap();
                let hello = decode_hello(&read_pumping(&mut nms, &mut got, &mut s, HELLO_LEN)).unwrap();
                assert_eq!(
                    (hello.from, hello.to, hello.max_payload),
                    (0, 1, small().max_payload as u32)
                );
                assert!(hello.proves(&KEY, &ch));
                s.write_all(&answer(&hello, &ch)).unwrap();
            } else {
                s.write_all(&format!("{:<1$}", "SSH-2.0-OpenSSH", CHALLENGE_LEN).into_bytes())
                    .unwrap();
            }
            assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
            assert_eq!(nms[0].stats().drops.count(reason), 1);
            let why = failure(&nms[0], 1);
            assert!(why.contains(says) && why.contains("1 packets queued"), "{why}");
            assert_eq!(nms[0].backlog(), 0);
        }
    }

    #[test]
    fn a_peer_that_goes_away_fails() {
        // Dropped without a goodbye.
        let (mut nms, _cards) = job(2, 2, &small());
        let mut got = vec![Got::new(); 2];
        nms[0].send(1, &[1, 0], &[b"a"]).unwrap();
        nms[1].send(0, &[1, 1], &[b"b"]).unwrap();
        assert!(pump(&mut nms, &mut got, |_, g| g.iter().all(|g| g.len() == 1)));
        drop(nms.pop());
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
        let why = failure(&nms[0], 1);
        assert!(!why.contains("left"), "{why}");
        assert!(matches!(
            nms[0].send(1, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 1, .. })
        ));

        // Shut down: what it sent still arrives, then it has left.
        let (mut nms, _cards) = job(2, 2, &small());
        let mut got = vec![Got::new(); 2];
        nms[0].send(1, &[0, 0], &[b"a"]).unwrap();
        assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 1 && settled(nms)));
        let count = 50u64;
        let mut nm1 = nms.pop().unwrap();
        for k in 0..count {
            let p = pattern(1, 0, k, 10_000);
            assert_eq!(nm1.send(0, &[k, 1], &[&p]).unwrap(), Accept::Sent);
        }
        let leaving = std::thread::spawn(move || {
            let t = Instant::now();
            nm1.shutdown(Duration::from_secs(30));
            (nm1, t.elapsed())
        });
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
        let (mut nm1, took) = leaving.join().unwrap();
        // It did not wait out its timeout: our close told it we had read everything.
        assert!(took < LONG, "{took:?}");
        assert_eq!(got[0].len(), count as usize);
        for (k, (src, env, p)) in (0u64..).zip(&got[0]) {
            assert_eq!((*src, *env), (1, [k, 1]));
            assert!(*p == pattern(1, 0, k, 10_000));
        }
        let why = failure(&nms[0], 1);
        assert!(why.contains("left"), "{why}");
        assert!(matches!(
            nms[0].send(1, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 1, .. })
        ));
        let e = nm1.send(0, &[0, 0], &[]).unwrap_err();
        assert!(e.to_string().contains("shut down"), "{e}");
        assert_eq!(nm1.backlog(), 0);
        assert_eq!(nm1.poll(&mut |_, _, _| panic!("after shutdown")).unwrap(), 0);
    }

    #[test]
    fn back_pressure_takes_nothing_on_again() {
        let cfg = TcpConfig {
            queue_limit: 64 << 10,
            ..small()
        };
        let (mut nms, _cards) = job(2, 2, &cfg);
        let mut got = vec![Got::new(); 2];
        let len = 16 << 10;
        let mut seq = 0u64;
        let send = |nm: &mut TcpNetmod, seq: u64| nm.send(1, &[seq, 0], &[&pattern(0, 1, seq, len)]).unwrap();
        // No connection yet, and nobody polls: only the queue takes packets, until the
        // limit. 4 of 16 KiB + 24 bytes pass 64 KiB.
        while send(&mut nms[0], seq) == Accept::Sent {
            seq += 1;
            assert!(seq < 100);
        }
        assert_eq!(seq, 4);
        assert_eq!(nms[0].backlog(), 4);
        assert_eq!(nms[0].stats().packets_sent, 4);
        assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 4 && settled(nms)));
        // Up now; the receiver stops polling and the sender fills the socket, then the queue.
        let mut again = false;
        for _ in 0..100_000 {
            nms[0].poll(&mut |_, _, _| {}).unwrap();
            if send(&mut nms[0], seq) == Accept::Again {
                again = true;
                break;
            }
            seq += 1;
        }
        assert!(again, "never pushed back");
        assert!(nms[0].backlog() > 0);
        assert!(nms[0].peers[&1].out.bytes() >= cfg.queue_limit);
        let accepted = seq;
        assert_eq!(nms[0].stats().packets_sent, accepted);
        // The refused packet goes once the receiver reads.
        send_all(&mut nms, &mut got, 0, 1, [seq, 0], &[&pattern(0, 1, seq, len)]);
        let total = accepted as usize + 1;
        assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == total
            && nms[0].backlog() == 0));
        for (k, (src, env, p)) in (0u64..).zip(&got[1]) {
            assert_eq!((*src, *env), (0, [k, 0]));
            assert!(*p == pattern(0, 1, k, len), "#{k}");
        }
        for _ in 0..20 {
            poll_all(&mut nms, &mut got);
        }
        assert_eq!(got[1].len(), total);
    }

    #[test]
    fn probes_find_dead_peers() {
        let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (mut nms, cards) = job(1, 3, &small());
        cards.set(1, addr::encode_card("tcp", dead));
        let mut got = vec![Got::new(); 1];
        assert!(nms[0].check_peer(1).is_ok());
        assert!(nms[0].wait(Duration::ZERO).unwrap(), "a probe is due");
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(1).is_err()));
        let why = failure(&nms[0], 1);
        assert!(why.contains("refused"), "{why}");
        assert!(matches!(
            nms[0].send(1, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 1, .. })
        ));

        // Rank 2 has no card: sends say so; a probe marks it failed.
        assert!(matches!(
            nms[0].send(2, &[0, 0], &[]),
            Err(NetError::BadCard { rank: 2, .. })
        ));
        assert!(matches!(
            nms[0].send(2, &[0, 0], &[]),
            Err(NetError::BadCard { rank: 2, .. })
        ));
        assert!(nms[0].check_peer(2).is_ok());
        assert!(pump(&mut nms, &mut got, |nms, _| nms[0].check_peer(2).is_err()));
        assert!(failure(&nms[0], 2).contains("card"));
        assert_eq!(nms[0].backlog(), 0);
        assert!(matches!(
            nms[0].check_peer(3),
            Err(NetError::InvalidRank { rank: 3, size: 3 })
        ));
        assert!(nms[0].check_peer(0).is_ok());
    }

    #[test]
    fn wait_says_when_there_is_something() {
        let (mut nms, _cards) = job(2, 2, &small());
        let mut got = vec![Got::new(); 2];
        nms[0].send(1, &[1, 1], &[b"first"]).unwrap();
        assert!(pump(&mut nms, &mut got, |nms, g| g[1].len() == 1 && settled(nms)));
        assert!(!nms[1].wait(Duration::ZERO).unwrap());
        assert!(!nms[1].wait(Duration::from_millis(50)).unwrap());
        assert_eq!(nms[0].send(1, &[2, 2], &[b"second"]).unwrap(), Accept::Sent);
        let t = Instant::now();
        assert!(nms[1].wait(LONG).unwrap());
        assert!(t.elapsed() < LONG);
        poll_all(&mut nms, &mut got);
        assert_eq!(got[1][1], (0, [2, 2], b"second".to_vec()));
    }

    #[test]
    fn config_from_the_environment() {
        let none = |_: &str| None;
        assert_eq!(TcpConfig::from_lookup(none).unwrap(), TcpConfig::default());
        let c = TcpConfig::from_lookup(|k| match k {
            "NEMESIS_NET_TIMEOUT" => Some("2.5".into()),
            "NEMESIS_TCP_MAX_PAYLOAD" => Some("1M".into()),
            "NEMESIS_TCP_QUEUE_LIMIT" => Some("64K".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!((c.max_payload, c.queue_limit), (1 << 20, 64 << 10));
        for (var, bad) in [
            (MAX_PAYLOAD_VAR, "0"),
            (MAX_PAYLOAD_VAR, "1G"),
            (QUEUE_LIMIT_VAR, "lots"),
            (config::NET_TIMEOUT_VAR, "-1"),
        ] {
            let e = TcpConfig::from_lookup(|k| (k == var).then(|| bad.to_string())).unwrap_err();
            assert!(e.to_string().contains(var), "{e}");
        }
        let bad = TcpConfig {
            max_payload: 0,
            ..TcpConfig::default()
        };
        assert!(TcpNetmod::new(ident(0, 1), Box::new(Table::default()), bad).is_err());
        assert!(matches!(
            TcpNetmod::new(ident(2, 2), Box::new(Table::default()), TcpConfig::default()),
            Err(NetError::InvalidRank { rank: 2, size: 2 })
        ));
    }
}
