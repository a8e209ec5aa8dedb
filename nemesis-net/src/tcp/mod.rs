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
//! (payload length u32, kind and padding u32, envelope 2 × u64), padding, the payload and
//! padding again, so that the kernel's copies of a long payload keep its alignment (see
//! `frame.rs`). Kind 0 is a packet, kind 1 ([`FrameKind::Goodbye`], no payload, no
//! padding) says the sender is leaving the job.
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
mod settings;
mod sock;
#[cfg(test)]
mod tests;

use conn::{Conn, Inbound, OutQueue, State, read_frames};
pub use frame::{
    ALIGN_FROM, FRAME_ALIGN, FRAME_HEADER_LEN, Frame, FrameHead, FrameKind, decode_frame, decode_header,
    encode_frame_header, frame_pads,
};
pub use handshake::{
    CHALLENGE_LEN, Challenge, HELLO_LEN, Hello, MAGIC, REPLY_LEN, Reply, ReplyCode, decode_challenge,
    decode_hello, decode_reply,
};
pub use settings::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_PAYLOAD, DEFAULT_QUEUE_LIMIT, MAX_MAX_PAYLOAD, MAX_PAYLOAD_VAR,
    QUEUE_LIMIT_VAR, TcpConfig,
};
use sock::{connect_nonblocking, not_now, send_vectored, tune};

use crate::gate;
use crate::sys::{Epoll, cvt, millis};
use crate::{Accept, Cards, DropReason, Drops, Envelope, Identity, NetError, NetStats, Netmod, Sink, addr};
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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
/// Zeros for the padding that ends a frame.
static PADDING: [u8; FRAME_ALIGN] = [0; FRAME_ALIGN];

/// Where the longest of `payload`'s slices lies, and how far into the payload it
/// begins: the part whose copies the frame's padding aligns.
fn bulk(payload: &[&[u8]]) -> (usize, usize) {
    let (mut best, mut at, mut off, mut pos) = (0, 0, 0, 0);
    for p in payload {
        if p.len() > best {
            (best, at, off) = (p.len(), p.as_ptr() as usize, pos);
        }
        pos += p.len();
    }
    (at, off)
}
/// Redialing backs off from this ...
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// ... to this.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest timeout a configuration may give: beyond it `Instant` arithmetic could
/// overflow, and nobody waits that long.
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);
/// How often `shutdown` looks again while waiting for queues to drain.
const SHUTDOWN_TICK: Duration = Duration::from_millis(20);

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
                long_last: false,
                skip: 0,
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
    fn become_up(&mut self, cid: u64, rank: u32, sink: &mut dyn Sink) -> usize {
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
    fn read_up(&mut self, cid: u64, sink: &mut dyn Sink) -> usize {
        let max = self.cfg.max_payload;
        let Some(c) = self.conns.get_mut(&cid) else {
            return 0;
        };
        let Some(rank) = c.peer else {
            return 0;
        };
        let (outcome, handed) = read_frames(c, max, rank, sink);
        self.stats.packets_received += handed.packets as u64;
        self.stats.packets_landed += handed.landed as u64;
        let handed = handed.packets;
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
    fn on_event(&mut self, cid: u64, flags: u32, sink: &mut dyn Sink) -> usize {
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
        // Most polls have no timer: they do not read the clock.
        if self.timers.is_empty() {
            return;
        }
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
    fn write_now(&mut self, rank: u32, header: &[u8], payload: &[&[u8]], tail: &[u8]) -> Option<usize> {
        let p = self.peers.get(&rank)?;
        let cid = p.up.filter(|_| p.out.is_empty())?;
        let c = self
            .conns
            .get_mut(&cid)
            .filter(|c| c.hs_out.is_empty() && !c.broken)?;
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        for (slot, part) in iov.iter_mut().zip(
            std::iter::once(header)
                .chain(payload.iter().copied())
                .chain(std::iter::once(tail)),
        ) {
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
        let goodbye = encode_frame_header(FrameKind::Goodbye, &[0, 0], 0, 0, 0);
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
        let (at, off) = bulk(payload);
        let (lead, trail) = frame_pads(at, off, len);
        let mut head = [0u8; FRAME_HEADER_LEN + FRAME_ALIGN];
        head[..FRAME_HEADER_LEN].copy_from_slice(&encode_frame_header(
            FrameKind::Packet,
            env,
            len as u32,
            lead,
            trail,
        ));
        let (head, tail) = (&head[..FRAME_HEADER_LEN + lead], &PADDING[..trail]);
        if let Some(written) = self.write_now(peer, head, payload, tail) {
            if written < head.len() + len + trail {
                let p = self.peer(peer);
                p.out.push(head, payload, tail, written, true);
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
        self.peer(peer).out.push(head, payload, tail, 0, true);
        self.backlog += 1;
        self.stats.packets_sent += 1;
        Ok(Accept::Sent)
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        self.poll_landing(&mut |src, env: &Envelope, payload: &[u8]| sink(src, env, payload))
    }

    fn poll_landing(&mut self, sink: &mut dyn Sink) -> Result<usize, NetError> {
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
        // The next timer and the time now, read only when there is one.
        let next = self.timers.peek().map(|&Reverse((t, _))| (t, Instant::now()));
        if probing || self.found > 0 || next.is_some_and(|(t, now)| t <= now) {
            return Ok(true);
        }
        let t = next.map_or(timeout, |(t, now)| timeout.min(t - now));
        let n = self
            .epoll
            .wait(&mut self.events, millis(t))
            .map_err(|e| NetError::io("tcp: epoll_wait", e))?;
        self.found = n;
        Ok(n > 0 || next.is_some_and(|(t, _)| t <= Instant::now()))
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
