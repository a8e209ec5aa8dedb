//! Reliable, ordered messages over an unreliable datagram transport.
//!
//! The design is the one MVAPICH used over InfiniBand UD: one endpoint for every peer, a
//! sliding window of segments per peer, each segment stamped when it is sent and sent
//! again when its timer runs out, cumulative ACKs that are coalesced, and a NACK when
//! the receiver sees a gap, so that a lost segment is resent without waiting for the
//! timer. Everything happens inside [`Reliable::send`] and [`Reliable::poll`]: the timers
//! are deadlines that `poll` checks, and [`Reliable::next_deadline`] tells a waiter when
//! it must come back. There is no thread and so no lock.
//!
//! # Wire format
//!
//! Every datagram starts with a 40-byte header, little-endian:
//!
//! | offset | size | field                                                              |
//! |-------:|-----:|--------------------------------------------------------------------|
//! | 0      | 2    | magic, [`MAGIC`]                                                   |
//! | 2      | 1    | version, [`VERSION`]                                               |
//! | 3      | 1    | kind: 1 DATA, 2 ACK, 3 NACK                                        |
//! | 4      | 1    | flags: [`FLAG_FIRST`], [`FLAG_LAST`], [`FLAG_BYE`], [`FLAG_PING`]  |
//! | 5      | 3    | reserved, zero                                                     |
//! | 8      | 8    | token: [`JobKey::token`] of (source, destination)                  |
//! | 16     | 4    | source rank                                                        |
//! | 20     | 4    | destination rank                                                   |
//! | 24     | 4    | seq: DATA the segment's number, NACK the first missing one, ACK 0  |
//! | 28     | 4    | ack: the next number the sender of this datagram expects from us   |
//! | 32     | 4    | count: DATA the bytes of data, NACK how many are missing, ACK 0    |
//! | 36     | 4    | reserved, zero                                                     |
//!
//! A DATA segment with [`FLAG_FIRST`] then carries its message's envelope (16 bytes) and
//! total length (4 bytes), and every DATA segment ends with `count` bytes of data. The
//! `ack` field is valid on every kind, so data going one way acknowledges data coming
//! the other. [`FLAG_BYE`] and [`FLAG_PING`] mark empty, sequenced DATA segments: a
//! goodbye, and a probe that the peer must acknowledge.
//!
//! # Memory
//!
//! The state of a peer is made on first contact, in either direction, once its address
//! checks out. It is one boxed, fixed-size struct (under 320 bytes) plus what is in
//! flight: the copies of unacknowledged segments (at most a window and one message), the
//! segments received ahead of a gap (fewer than a window) and one message being
//! reassembled. All three are freed as soon as they empty, so once everything is
//! acknowledged a peer costs its box and nothing else, and nothing grows with the number
//! of peers or with the traffic so far. The endpoint keeps 12 bytes per rank of the job
//! (a slot and room in the timer list, both allocated up front) and one receive buffer.

mod config;
mod inbound;
mod outbound;
mod peer;
mod spare;
#[cfg(test)]
mod tests;
mod wire;

pub use config::{DEFAULT_MAX_MESSAGE, DEFAULT_WINDOW, MAX_WINDOW, ReliableConfig};
pub use wire::{
    FLAG_BYE, FLAG_FIRST, FLAG_LAST, FLAG_PING, HEADER_LEN, Header, Kind, MAGIC, MAX_HEADER_LEN,
    MIN_DATAGRAM, START_LEN, Start, VERSION, decode_header, encode_header,
};

use crate::auth::JobKey;
use crate::{Accept, DropReason, Drops, Envelope, NetError, NetStats};
use config::Tuned;
use inbound::{SeqClass, Verdict, framing, take_segment, verdict};
use outbound::{pump, send_ack, send_nack, transmit};
use peer::{Held, Peer, Seg, Standing};
use std::cell::Cell;
use std::fmt;
use std::io;
use wire::FLAGS_CONTROL;

/// A datagram transport: UDP, the simulator, later InfiniBand UD.
pub trait Datagram: Send {
    /// Where datagrams go to and come from.
    type Addr: Copy + Eq + std::hash::Hash + fmt::Debug + Send;

    /// Largest datagram this transport carries (our header included).
    fn max_datagram(&self) -> usize;

    /// Largest datagram taken from the wire; at least [`Datagram::max_datagram`]. UDP
    /// takes any size, because a peer on another host may see a larger MTU than ours.
    fn max_receive(&self) -> usize {
        self.max_datagram()
    }

    /// The netmod's name, for the drop log.
    fn name(&self) -> &'static str {
        "datagram"
    }

    /// Sends one datagram, the concatenation of `parts`; `Ok(false)`: no room now,
    /// nothing sent.
    ///
    /// # Errors
    /// Failures of the transport itself; a datagram lost on the way is not one.
    fn send_to(&mut self, parts: &[&[u8]], to: Self::Addr) -> io::Result<bool>;

    /// A received datagram, lent to the layer until [`Datagram::release`] gives it back:
    /// the transport's own buffer (a reused vector, a registered ring slot), so nothing
    /// is copied on the way up.
    type Rx: AsRef<[u8]>;

    /// Takes the next waiting datagram; `Ok(None)`: nothing waiting. A datagram longer
    /// than [`Datagram::max_receive`] may be cut, but never to that length or less, so
    /// that it still shows as too long.
    ///
    /// # Errors
    /// Failures of the transport itself.
    fn recv(&mut self) -> io::Result<Option<(Self::Rx, Self::Addr)>>;

    /// Takes back the buffer of a datagram [`Datagram::recv`] lent, for a later receive.
    fn release(&mut self, rx: Self::Rx) {
        drop(rx);
    }

    /// Monotonic time, nanoseconds (real clock for UDP, virtual for the simulator).
    fn now(&self) -> u64;

    /// A poll that receives nothing runs the timers only once in this many. Looking
    /// for a datagram on a socket is a system call that dwarfs reading the clock (1,
    /// every poll); on a completion queue it is a few loads, and the clock read of the
    /// timers was a third of a spinning receiver's loop (verbs ud). No timer is shorter
    /// than the delayed ACK's 200 us, which a few polls do not stretch.
    fn timer_stride(&self) -> u32 {
        1
    }
}

/// Datagrams `poll` takes in one call at most, so that timers are not starved by a flood.
const RECEIVE_BUDGET: usize = 256;

fn mark_busy<A>(busy: &mut Vec<u32>, p: &mut Peer<A>, rank: u32) {
    if !p.busy {
        p.busy = true;
        busy.push(rank);
    }
}

type Resolver<A> = Box<dyn FnMut(u32) -> Result<A, NetError> + Send>;

/// The peer's state, made (its address resolved) on first use.
fn peer_entry<'a, A: Copy>(
    peers: &'a mut [Option<Box<Peer<A>>>],
    resolve: &mut Resolver<A>,
    t: &Tuned,
    rank: u32,
) -> Result<&'a mut Peer<A>, NetError> {
    let bad = NetError::InvalidRank { rank, size: t.size };
    let slot = peers.get_mut(rank as usize).ok_or(bad)?;
    if slot.is_none() {
        let addr = resolve(rank)?;
        *slot = Some(Box::new(Peer::new(addr, rank, t)));
    }
    slot.as_deref_mut()
        .ok_or(NetError::InvalidRank { rank, size: t.size })
}

/// Copies a message's parts out in consecutive pieces.
struct Gather<'a, 'b> {
    parts: &'a [&'b [u8]],
    idx: usize,
    off: usize,
}

impl Gather<'_, '_> {
    /// The next `n` bytes, appended to `out`.
    fn take(&mut self, mut n: usize, mut out: Vec<u8>) -> Vec<u8> {
        while n > 0 {
            let Some(part) = self.parts.get(self.idx) else {
                break;
            };
            let rest = part.get(self.off..).unwrap_or_default();
            let k = rest.len().min(n);
            out.extend_from_slice(&rest[..k]);
            n -= k;
            self.off += k;
            if self.off >= part.len() {
                self.idx += 1;
                self.off = 0;
            }
        }
        out
    }
}

/// Reliable, ordered messages to every rank of a job over one datagram endpoint.
pub struct Reliable<D: Datagram> {
    dg: D,
    t: Tuned,
    resolve: Resolver<D::Addr>,
    /// By rank; `None` until first contact.
    peers: Vec<Option<Box<Peer<D::Addr>>>>,
    /// Peers with a timer to watch: something queued or an ACK owed. Its capacity is the
    /// job's size, so it never grows.
    busy: Vec<u32>,
    /// Peers check_peer wants probed at the next poll (a `Cell`: check_peer takes
    /// `&self`, and the endpoint must stay `Send`).
    pings: Cell<Vec<u32>>,
    backlog: usize,
    closing: bool,
    /// A send found no room in the transport: waiting for it to drain helps.
    blocked: bool,
    /// Allocations kept from one message to the next.
    spare: spare::Spare<peer::Seg>,
    /// Polls since the timers last ran.
    since_timers: u32,
    stats: NetStats,
}

impl<D: Datagram> fmt::Debug for Reliable<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reliable")
            .field("me", &self.t.me)
            .field("size", &self.t.size)
            .field("peers", &self.peers.iter().flatten().count())
            .field("backlog", &self.backlog)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

impl<D: Datagram> Reliable<D> {
    /// An endpoint for rank `me` of `size`, over `dg`. `resolve` gives a rank's address;
    /// it is asked once per peer, when we first send to it or first hear from it.
    ///
    /// # Errors
    /// `me` outside the job, or a configuration that cannot work.
    pub fn new(
        dg: D,
        me: u32,
        size: u32,
        key: JobKey,
        cfg: ReliableConfig,
        resolve: Box<dyn FnMut(u32) -> Result<D::Addr, NetError> + Send>,
    ) -> Result<Self, NetError> {
        let t = Tuned::new(me, size, key, &cfg, dg.max_datagram())?;
        Ok(Self {
            spare: spare::Spare::new(t.first_room),
            dg,
            t,
            resolve,
            peers: (0..size).map(|_| None).collect(),
            busy: Vec::with_capacity(size as usize),
            pings: Cell::new(Vec::new()),
            backlog: 0,
            closing: false,
            blocked: false,
            since_timers: 0,
            stats: NetStats::default(),
        })
    }

    /// The same endpoint, logging no drops: for tests that misbehave on purpose.
    pub fn quiet(mut self) -> Self {
        self.stats.drops = Drops::quiet();
        self
    }

    /// The transport.
    pub fn datagram(&self) -> &D {
        &self.dg
    }

    /// The transport, to change.
    pub fn datagram_mut(&mut self) -> &mut D {
        &mut self.dg
    }

    /// Largest message.
    pub fn max_payload(&self) -> usize {
        self.t.max_message
    }

    fn valid_peer(&self, peer: u32) -> Result<(), NetError> {
        if peer >= self.t.size || peer == self.t.me {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.t.size,
            });
        }
        Ok(())
    }

    /// Queues a message to `peer` and sends what the window allows, or answers
    /// [`Accept::Again`] without taking anything when `peer` already has a window of
    /// segments queued. A message is taken whole, so a queue may pass the window by one
    /// message.
    ///
    /// # Errors
    /// A bad rank or our own, a message above [`Reliable::max_payload`], a peer that
    /// failed or left, a rank whose address cannot be had, a send after
    /// [`Reliable::begin_shutdown`].
    pub fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        if self.closing {
            return Err(NetError::io(
                format!("{}: send to rank {peer}", self.dg.name()),
                io::Error::new(io::ErrorKind::NotConnected, "the endpoint is shutting down"),
            ));
        }
        self.valid_peer(peer)?;
        let max = self.t.max_message;
        let len = payload.iter().try_fold(0usize, |a, p| a.checked_add(p.len()));
        let len = match len {
            Some(l) if l <= max => l,
            other => {
                return Err(NetError::TooLarge {
                    len: other.unwrap_or(usize::MAX),
                    max,
                });
            }
        };
        let now = self.dg.now();
        let Self {
            dg,
            t,
            resolve,
            peers,
            busy,
            backlog,
            blocked,
            stats,
            spare,
            ..
        } = self;
        let p = peer_entry(peers, resolve, t, peer)?;
        p.expire(t, now, backlog);
        match &p.standing {
            Standing::Active => {}
            Standing::Failed(reason) => {
                return Err(NetError::PeerFailed {
                    rank: peer,
                    reason: reason.clone(),
                });
            }
            Standing::Left => return Err(left(peer)),
        }
        if p.queue.len() >= t.window as usize {
            return Ok(Accept::Again);
        }
        if p.queue.is_empty() {
            p.progress_at = now;
        }
        let mut parts = Gather {
            parts: payload,
            idx: 0,
            off: 0,
        };
        let first = len.min(t.first_room);
        spare.lend_queue(&mut p.queue);
        let data = parts.take(first, spare.buf(first));
        p.queue.push_back(Seg {
            flags: FLAG_FIRST | if first == len { FLAG_LAST } else { 0 },
            start: Some(Start {
                env: *env,
                total: len as u32,
            }),
            data,
            sent_at: 0,
            sends: 0,
        });
        let mut segs = 1;
        let mut left = len - first;
        while left > 0 {
            let k = left.min(t.rest_room);
            left -= k;
            p.queue.push_back(Seg {
                flags: if left == 0 { FLAG_LAST } else { 0 },
                start: None,
                data: parts.take(k, Vec::with_capacity(k)),
                sent_at: 0,
                sends: 0,
            });
            segs += 1;
        }
        *backlog += segs;
        stats.packets_sent += 1;
        mark_busy(busy, p, peer);
        // The message is ours now; a transport failure here shows at the next poll,
        // which sends what is left.
        if pump(dg, t, peer, p, now, blocked).is_err() {
            *blocked = true;
        }
        Ok(Accept::Sent)
    }

    /// Whether [`Reliable::send`] would take a message to `peer` now: its queue is below
    /// the window.
    pub fn writable(&self, peer: u32) -> bool {
        self.peers
            .get(peer as usize)
            .and_then(|p| p.as_deref())
            .is_none_or(|p| p.queue.len() < self.t.window as usize)
    }

    /// Receives, hands each complete message to `sink(src, env, payload)` in order, and
    /// runs the timers: retransmissions, delayed ACKs, probes, failures. Returns how many
    /// messages it handed up.
    ///
    /// # Errors
    /// Failures of the transport itself; a failing peer shows in
    /// [`Reliable::check_peer`] instead.
    pub fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        let name = self.dg.name();
        self.blocked = false;
        self.start_pings()
            .map_err(|e| NetError::io(format!("{name}: sending a probe"), e))?;
        // The clock is read once for what arrives and the timers after it.
        let mut now = None;
        let (got, seen) = self
            .receive(sink, &mut now)
            .map_err(|e| NetError::io(format!("{name}: receiving"), e))?;
        self.since_timers += 1;
        if seen > 0 || self.since_timers >= self.dg.timer_stride() || self.closing {
            self.since_timers = 0;
            let now = now.unwrap_or_else(|| self.dg.now());
            self.timers(now)
                .map_err(|e| NetError::io(format!("{name}: sending"), e))?;
        }
        Ok(got)
    }

    /// Handles what has arrived; returns the messages handed up and the datagrams seen.
    /// `now` is the time, read on the first datagram.
    fn receive(
        &mut self,
        sink: &mut dyn FnMut(u32, &Envelope, &[u8]),
        now: &mut Option<u64>,
    ) -> io::Result<(usize, usize)> {
        let (mut got, mut seen) = (0, 0);
        for _ in 0..RECEIVE_BUDGET {
            let Some((rx, from)) = self.dg.recv()? else {
                break;
            };
            seen += 1;
            let t = *now.get_or_insert_with(|| self.dg.now());
            let r = self.handle(rx.as_ref(), from, sink, t);
            self.dg.release(rx);
            got += r?;
        }
        Ok((got, seen))
    }

    fn drop_it(&mut self, reason: DropReason, detail: fmt::Arguments<'_>) -> io::Result<usize> {
        self.stats.drops.note(self.dg.name(), reason, detail);
        Ok(0)
    }

    /// Checks one datagram and, when it passes, acts on it.
    fn handle(
        &mut self,
        d: &[u8],
        from: D::Addr,
        sink: &mut dyn FnMut(u32, &Envelope, &[u8]),
        now: u64,
    ) -> io::Result<usize> {
        use DropReason::*;
        if d.len() > self.dg.max_receive() {
            return self.drop_it(Oversized, format_args!("{} bytes from {from:?}", d.len()));
        }
        let h = match decode_header(d) {
            Ok(h) => h,
            Err(r) => return self.drop_it(r, format_args!("{} bytes from {from:?}", d.len())),
        };
        let t = &self.t;
        if h.dst != t.me || h.src >= t.size || h.src == t.me {
            return self.drop_it(BadRank, format_args!("{} -> {} from {from:?}", h.src, h.dst));
        }
        let rank = h.src;
        let known = self
            .peers
            .get(rank as usize)
            .and_then(|s| s.as_deref())
            .map(|p| (p.addr, p.tok_in));
        let expected = match known {
            Some((_, tok)) => tok,
            None => t.key.token(rank, t.me),
        };
        if h.token != expected {
            return self.drop_it(
                WrongJob,
                format_args!("rank {} from {from:?} without the pair's token", h.src),
            );
        }
        if h.start.is_some_and(|s| s.total as usize > t.max_message) {
            return self.drop_it(
                Oversized,
                format_args!("a message of {:?} from {from:?}", h.start),
            );
        }
        // A peer first heard of now is stored only if its datagram passes.
        let mut fresh = None;
        match known.map(|(addr, _)| addr) {
            Some(a) if a == from => {}
            Some(a) => {
                return self.drop_it(
                    UnknownAddress,
                    format_args!("rank {rank} from {from:?}, but its card says {a:?}"),
                );
            }
            None => match (self.resolve)(rank) {
                Ok(a) if a == from => fresh = Some(Box::new(Peer::new(a, rank, &self.t))),
                Ok(a) => {
                    return self.drop_it(
                        UnknownAddress,
                        format_args!("rank {rank} from {from:?}, but its card says {a:?}"),
                    );
                }
                Err(e) => {
                    return self.drop_it(UnknownAddress, format_args!("rank {rank} from {from:?}: {e}"));
                }
            },
        }
        let Some(slot) = self.peers.get_mut(rank as usize) else {
            return Ok(0);
        };
        let checked = match (fresh.as_deref(), slot.as_deref()) {
            (Some(p), _) | (None, Some(p)) => verdict(p, &h, &self.t),
            (None, None) => return Ok(0),
        };
        let Verdict { acked, resend, class } = match checked {
            Ok(v) => v,
            Err((reason, detail)) => {
                return self.drop_it(reason, format_args!("rank {rank} from {from:?}: {detail}"));
            }
        };
        if fresh.is_some() {
            *slot = fresh;
        }
        let Some(p) = self.peers.get_mut(rank as usize).and_then(|s| s.as_deref_mut()) else {
            return Ok(0);
        };

        // The datagram is good.
        let Self {
            dg,
            t,
            busy,
            backlog,
            blocked,
            stats,
            spare,
            ..
        } = self;
        let name = dg.name();
        p.heard_at = Some(now);
        if let Some(n) = acked {
            p.acked(n, now, t, backlog, spare);
        }
        mark_busy(busy, p, rank);
        let mut got = 0;
        let mut ack_now = false;
        match h.kind {
            Kind::Ack => {}
            Kind::Nack => {
                let rtt = p.rtt(t);
                for i in 0..resend {
                    // At most once a round trip for each: an earlier resend may still
                    // be on its way.
                    let due = p
                        .queue
                        .get(i)
                        .is_some_and(|s| s.sends == 1 || now.saturating_sub(s.sent_at) >= rtt);
                    if due {
                        if transmit(dg, t, rank, p, i, now)? {
                            stats.retransmits += 1;
                        } else {
                            *blocked = true;
                            break;
                        }
                    }
                }
            }
            Kind::Data => {
                let body = d.get(h.encoded_len()..).unwrap_or_default();
                match class {
                    SeqClass::InOrder => {
                        // A NACKed gap filled: its round trip is a sample, which a
                        // receiver that sends nothing has no other way to get.
                        if let Some((s, at)) = p.nacked
                            && s == h.seq
                        {
                            p.rtt_sample(now.saturating_sub(at), t);
                            p.nacked = None;
                        }
                        got += take_segment(p, rank, h.flags, h.start, body, sink, backlog);
                        p.took(now);
                        ack_now |= h.flags & FLAGS_CONTROL != 0;
                        // The gap may have closed: take what waited behind it.
                        while let Some(i) = p.held.iter().position(|x| x.seq == p.expected) {
                            let x = p.held.swap_remove(i);
                            if let Err(r) = framing(p.reasm.as_ref(), x.flags, x.data.len()) {
                                // Kept, but cannot follow: wait for a good copy.
                                stats.drops.note(
                                    name,
                                    r,
                                    format_args!("rank {rank}: held segment {} out of frame", x.seq),
                                );
                                break;
                            }
                            got += take_segment(p, rank, x.flags, x.start, &x.data, sink, backlog);
                            p.took(now);
                            ack_now |= x.flags & FLAGS_CONTROL != 0;
                        }
                        if p.held.is_empty() {
                            p.held = Vec::new();
                        }
                    }
                    SeqClass::Ahead if !p.held.iter().any(|x| x.seq == h.seq) => {
                        p.held.push(Held {
                            seq: h.seq,
                            flags: h.flags,
                            start: h.start,
                            data: body.to_vec(),
                        });
                    }
                    _ => {
                        // Seen before: our ACK may have been lost.
                        stats.duplicates += 1;
                        ack_now = true;
                    }
                }
            }
        }
        if ack_now || p.rx_unacked >= t.ack_every {
            send_ack(dg, t, rank, p, now, blocked)?;
        }
        if !p.held.is_empty() {
            send_nack(dg, t, rank, p, now, blocked)?;
        }
        pump(dg, t, rank, p, now, blocked)?;
        stats.packets_received += got as u64;
        Ok(got)
    }

    /// Queues the probes check_peer asked for.
    fn start_pings(&mut self) -> io::Result<()> {
        let mut asks = self.pings.take();
        if asks.is_empty() {
            // The common case: no clock read.
            self.pings.set(asks);
            return Ok(());
        }
        let now = self.dg.now();
        let mut res = Ok(());
        for &rank in &asks {
            if self.closing || res.is_err() {
                break;
            }
            let Self {
                dg,
                t,
                resolve,
                peers,
                busy,
                backlog,
                blocked,
                ..
            } = self;
            // A card that cannot be had now is asked for again at the next check.
            let Ok(p) = peer_entry(peers, resolve, t, rank) else {
                continue;
            };
            if !p.active() || !p.queue.is_empty() {
                continue;
            }
            p.enqueue_control(FLAG_PING, now, backlog);
            mark_busy(busy, p, rank);
            res = pump(dg, t, rank, p, now, blocked);
        }
        asks.clear();
        self.pings.set(asks);
        res
    }

    /// Runs every busy peer's timers, and forgets the peers that have none left.
    fn timers(&mut self, now: u64) -> io::Result<()> {
        let Self {
            dg,
            t,
            peers,
            busy,
            backlog,
            blocked,
            stats,
            ..
        } = self;
        let mut i = 0;
        while let Some(&rank) = busy.get(i) {
            let Some(p) = peers.get_mut(rank as usize).and_then(|s| s.as_deref_mut()) else {
                busy.swap_remove(i);
                continue;
            };
            p.expire(t, now, backlog);
            let due = p.sent > 0
                && p.queue
                    .front()
                    .is_some_and(|s| now >= s.sent_at.saturating_add(p.rto_cur));
            if due {
                if transmit(dg, t, rank, p, 0, now)? {
                    stats.retransmits += 1;
                    p.rto_cur = p.rto_cur.saturating_mul(2).min(t.rto_max);
                } else {
                    *blocked = true;
                }
            }
            pump(dg, t, rank, p, now, blocked)?;
            if p.rx_unacked > 0 && now >= p.rx_since.saturating_add(t.ack_delay) {
                send_ack(dg, t, rank, p, now, blocked)?;
            }
            // A gap whose NACK or resend was lost: ask again, or it would wait for the
            // sender's timer, which only resends one segment at a time.
            if !p.held.is_empty() && p.active() {
                send_nack(dg, t, rank, p, now, blocked)?;
            }
            if p.idle() {
                p.busy = false;
                busy.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// When [`Reliable::poll`] must run next for a timer (a retransmission, a delayed
    /// ACK, a failure, a probe), in [`Datagram::now`] time; `None`: no timer runs.
    pub fn next_deadline(&self) -> Option<u64> {
        let asks = self.pings.take();
        let probe = !asks.is_empty();
        self.pings.set(asks);
        if probe {
            return Some(self.dg.now());
        }
        let t = &self.t;
        let mut best: Option<u64> = None;
        let mut at = |d: u64| best = Some(best.map_or(d, |b| b.min(d)));
        for &rank in &self.busy {
            let Some(p) = self.peers.get(rank as usize).and_then(|s| s.as_deref()) else {
                continue;
            };
            if p.active() && !p.queue.is_empty() {
                at(p.progress_at.saturating_add(t.timeout));
            }
            if p.sent > 0
                && let Some(s) = p.queue.front()
            {
                at(s.sent_at.saturating_add(p.rto_cur));
            }
            if p.rx_unacked > 0 {
                at(p.rx_since.saturating_add(t.ack_delay));
            }
            if !p.held.is_empty() && p.active() {
                at(p.nacked.map_or(0, |(_, n)| n.saturating_add(p.renack_after(t))));
            }
        }
        best
    }

    /// Whether a poll has work now: a timer is due.
    pub fn ready(&self) -> bool {
        self.next_deadline().is_some_and(|d| d <= self.dg.now())
    }

    /// Whether a send found the transport full; waiting for it to drain helps.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// Segments accepted and not yet acknowledged, every peer together, and the peers we
    /// owe an acknowledgement: a process that flushes before it stops polling must not
    /// leave a peer resending what it already has.
    pub fn backlog(&self) -> usize {
        let owed = self
            .busy
            .iter()
            .filter(|&&r| {
                self.peers
                    .get(r as usize)
                    .and_then(|p| p.as_deref())
                    .is_some_and(|p| p.rx_unacked > 0)
            })
            .count();
        self.backlog + owed
    }

    /// Fails if `peer` failed or left. A peer with nothing outstanding that has been
    /// silent a while is probed at the next poll, so that a caller who keeps checking
    /// (and polling) learns of a dead peer within about 1.1 times the timeout.
    ///
    /// # Errors
    /// [`NetError::PeerFailed`] saying why, or [`NetError::InvalidRank`].
    pub fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        if peer >= self.t.size {
            return Err(NetError::InvalidRank {
                rank: peer,
                size: self.t.size,
            });
        }
        if peer == self.t.me {
            return Ok(());
        }
        let now = self.dg.now();
        let probe = match self.peers.get(peer as usize).and_then(|s| s.as_deref()) {
            None => true,
            Some(p) => match &p.standing {
                Standing::Failed(reason) => {
                    return Err(NetError::PeerFailed {
                        rank: peer,
                        reason: reason.clone(),
                    });
                }
                Standing::Left => return Err(left(peer)),
                Standing::Active => {
                    p.queue.is_empty()
                        && p.heard_at
                            .is_none_or(|h| now.saturating_sub(h) >= self.t.ping_every)
                }
            },
        };
        if probe && !self.closing {
            let mut asks = self.pings.take();
            if !asks.contains(&peer) {
                asks.push(peer);
            }
            self.pings.set(asks);
        }
        Ok(())
    }

    /// Queues a goodbye to every peer we have talked to and that is still there; later
    /// sends fail. Polling sends the goodbyes and takes their acknowledgements.
    pub fn begin_shutdown(&mut self) {
        if self.closing {
            return;
        }
        self.closing = true;
        self.pings.set(Vec::new());
        let now = self.dg.now();
        let Self {
            dg,
            t,
            peers,
            busy,
            backlog,
            blocked,
            ..
        } = self;
        for (rank, slot) in peers.iter_mut().enumerate() {
            let Some(p) = slot.as_deref_mut() else {
                continue;
            };
            if !p.active() {
                continue;
            }
            let rank = rank as u32;
            p.bye = Some(p.enqueue_control(FLAG_BYE, now, backlog));
            mark_busy(busy, p, rank);
            if pump(dg, t, rank, p, now, blocked).is_err() {
                *blocked = true;
            }
        }
    }

    /// Whether every goodbye has been acknowledged, or its peer failed or left.
    pub fn shutdown_done(&self) -> bool {
        // A peer whose goodbye is unacknowledged has it queued, so it is busy.
        self.closing
            && self.busy.iter().all(|&r| {
                self.peers
                    .get(r as usize)
                    .and_then(|s| s.as_deref())
                    .is_none_or(|p| p.bye.is_none())
            })
    }

    /// Counters.
    pub fn stats(&self) -> NetStats {
        self.stats.clone()
    }
}

fn left(rank: u32) -> NetError {
    NetError::PeerFailed {
        rank,
        reason: "it left the job (it said goodbye)".into(),
    }
}
