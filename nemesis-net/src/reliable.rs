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

use crate::auth::JobKey;
use crate::{Accept, DropReason, Drops, Envelope, NetError, NetStats};
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::time::Duration;

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

    /// Receives one datagram into `buf`; `Ok(None)`: nothing waiting. A datagram longer
    /// than `buf` is cut to its length.
    ///
    /// # Errors
    /// Failures of the transport itself.
    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, Self::Addr)>>;

    /// Monotonic time, nanoseconds (real clock for UDP, virtual for the simulator).
    fn now(&self) -> u64;
}

/// First two bytes of every datagram ("NM" on the wire).
pub const MAGIC: u16 = u16::from_le_bytes(*b"NM");
/// The protocol version this module speaks.
pub const VERSION: u8 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 40;
/// Bytes a [`FLAG_FIRST`] segment adds after the header: envelope and total length.
pub const START_LEN: usize = 20;
/// The longest header, that of a first segment.
pub const MAX_HEADER_LEN: usize = HEADER_LEN + START_LEN;
/// The smallest datagram the layer works with: a first segment with a few bytes.
pub const MIN_DATAGRAM: usize = 64;

/// The segment opens a message: the envelope and total length follow the header.
pub const FLAG_FIRST: u8 = 1;
/// The segment closes a message.
pub const FLAG_LAST: u8 = 2;
/// An empty segment saying goodbye: the sender leaves the job.
pub const FLAG_BYE: u8 = 4;
/// An empty segment asking for an acknowledgement: is the peer still there?
pub const FLAG_PING: u8 = 8;
const FLAGS_ALL: u8 = FLAG_FIRST | FLAG_LAST | FLAG_BYE | FLAG_PING;
const FLAGS_CONTROL: u8 = FLAG_BYE | FLAG_PING;

/// Default of [`ReliableConfig::window`].
pub const DEFAULT_WINDOW: u32 = 64;
/// Largest [`ReliableConfig::window`]; keeps every window far from half the sequence
/// space, so wrapping comparisons stay unambiguous.
pub const MAX_WINDOW: u32 = 1 << 16;
/// Default of [`ReliableConfig::max_message`].
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 10;
/// Datagrams `poll` takes in one call at most, so that timers are not starved by a flood.
const RECEIVE_BUDGET: usize = 256;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A segment of a message, or a BYE or PING.
    Data = 1,
    /// A standalone acknowledgement.
    Ack = 2,
    /// A request to resend missing segments.
    Nack = 3,
}

/// What a first segment adds to the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// The message's envelope.
    pub env: Envelope,
    /// The message's length in bytes, all segments together.
    pub total: u32,
}

/// A decoded header (see the [module documentation](self) for the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram is.
    pub kind: Kind,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// The pair's token, [`JobKey::token`]`(src, dst)`: only a holder of the job's key
    /// can make it, and it admits no other pair's traffic.
    pub token: u64,
    /// Sender's rank.
    pub src: u32,
    /// Receiver's rank.
    pub dst: u32,
    /// DATA: the segment's number; NACK: the first missing one; ACK: 0.
    pub seq: u32,
    /// The next number the sender expects from the receiver.
    pub ack: u32,
    /// DATA: bytes of data; NACK: segments missing; ACK: 0.
    pub count: u32,
    /// Present exactly when `flags` has [`FLAG_FIRST`].
    pub start: Option<Start>,
}

impl Header {
    /// Bytes this header takes on the wire: [`HEADER_LEN`], or [`MAX_HEADER_LEN`] for a
    /// first segment.
    pub fn encoded_len(&self) -> usize {
        if self.start.is_some() {
            MAX_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }
}

/// Writes `h` to the front of `out` and returns how many bytes it took. The start fields
/// are written when `h.start` is set; keeping that consistent with [`FLAG_FIRST`] is the
/// caller's business ([`decode_header`] refuses a mismatch).
pub fn encode_header(h: &Header, out: &mut [u8; MAX_HEADER_LEN]) -> usize {
    out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    out[2] = VERSION;
    out[3] = h.kind as u8;
    out[4] = h.flags;
    out[5..8].fill(0);
    out[8..16].copy_from_slice(&h.token.to_le_bytes());
    out[16..20].copy_from_slice(&h.src.to_le_bytes());
    out[20..24].copy_from_slice(&h.dst.to_le_bytes());
    out[24..28].copy_from_slice(&h.seq.to_le_bytes());
    out[28..32].copy_from_slice(&h.ack.to_le_bytes());
    out[32..36].copy_from_slice(&h.count.to_le_bytes());
    out[36..40].fill(0);
    match h.start {
        Some(s) => {
            out[40..48].copy_from_slice(&s.env[0].to_le_bytes());
            out[48..56].copy_from_slice(&s.env[1].to_le_bytes());
            out[56..60].copy_from_slice(&s.total.to_le_bytes());
            MAX_HEADER_LEN
        }
        None => HEADER_LEN,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Decodes and checks the header of the datagram `buf`, whole: everything that can be
/// checked without knowing the receiver's state, including that the datagram is exactly
/// as long as the header says. Total: any input gives a header or a reason.
///
/// # Errors
/// The reason to drop the datagram.
pub fn decode_header(buf: &[u8]) -> Result<Header, DropReason> {
    use DropReason::{BadMagic, Malformed, Truncated};
    let Some(a) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(Truncated);
    };
    if u16::from_le_bytes([a[0], a[1]]) != MAGIC || a[2] != VERSION {
        return Err(BadMagic);
    }
    let kind = match a[3] {
        1 => Kind::Data,
        2 => Kind::Ack,
        3 => Kind::Nack,
        _ => return Err(Malformed),
    };
    let flags = a[4];
    if flags & !FLAGS_ALL != 0 || a[5..8] != [0; 3] || u32_at(a, 36) != 0 {
        return Err(Malformed);
    }
    let mut h = Header {
        kind,
        flags,
        token: u64_at(a, 8),
        src: u32_at(a, 16),
        dst: u32_at(a, 20),
        seq: u32_at(a, 24),
        ack: u32_at(a, 28),
        count: u32_at(a, 32),
        start: None,
    };
    let well_formed = match kind {
        Kind::Ack => flags == 0 && h.seq == 0 && h.count == 0,
        // The first missing segment is the next one expected: seq and ack agree.
        Kind::Nack => flags == 0 && h.count >= 1 && h.seq == h.ack,
        Kind::Data if flags & FLAGS_CONTROL != 0 => (flags == FLAG_BYE || flags == FLAG_PING) && h.count == 0,
        Kind::Data if flags & FLAG_FIRST != 0 => {
            let Some(b) = buf.first_chunk::<MAX_HEADER_LEN>() else {
                return Err(Truncated);
            };
            let s = Start {
                env: [u64_at(b, 40), u64_at(b, 48)],
                total: u32_at(b, 56),
            };
            h.start = Some(s);
            if flags & FLAG_LAST != 0 {
                h.count == s.total
            } else {
                h.count < s.total
            }
        }
        // Every segment after the first carries data.
        Kind::Data => h.count >= 1,
    };
    if !well_formed {
        return Err(Malformed);
    }
    let body = if kind == Kind::Data { h.count as usize } else { 0 };
    let want = h.encoded_len().saturating_add(body);
    match buf.len().cmp(&want) {
        std::cmp::Ordering::Less => Err(Truncated),
        std::cmp::Ordering::Greater => Err(Malformed),
        std::cmp::Ordering::Equal => Ok(h),
    }
}

/// Tunables of the reliability layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReliableConfig {
    /// Segments in flight per peer, 1 to [`MAX_WINDOW`]. Every rank must use the same.
    pub window: u32,
    /// Largest message, [`Reliable::max_payload`].
    pub max_message: usize,
    /// Retransmission timeout before any round trip has been measured.
    pub rto_initial: Duration,
    /// Least retransmission timeout, however short the round trip.
    pub rto_min: Duration,
    /// Most retransmission timeout, however far backed off.
    pub rto_max: Duration,
    /// Longest a received segment waits for its acknowledgement when no data goes back
    /// to carry it.
    pub ack_delay: Duration,
    /// Unacknowledged segments that make an ACK go at once; 0 for a quarter window.
    pub ack_every: u32,
    /// How long a peer may acknowledge nothing we sent before it counts as failed.
    pub timeout: Duration,
    /// The first sequence number in both directions; every rank must use the same. Tests
    /// set it near `u32::MAX` to make the numbers wrap.
    pub initial_seq: u32,
}

impl Default for ReliableConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_message: DEFAULT_MAX_MESSAGE,
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_secs(1),
            ack_delay: Duration::from_micros(200),
            ack_every: 0,
            timeout: crate::config::DEFAULT_NET_TIMEOUT,
            initial_seq: 0,
        }
    }
}

/// The configuration in the units the layer computes with.
#[derive(Debug, Clone)]
struct Tuned {
    me: u32,
    size: u32,
    key: JobKey,
    window: u32,
    max_message: usize,
    /// Data bytes in a first segment and in any other.
    first_room: usize,
    rest_room: usize,
    rto_initial: u64,
    rto_min: u64,
    rto_max: u64,
    ack_delay: u64,
    ack_every: u32,
    timeout: u64,
    /// Least silence before check_peer probes a peer, so a spinning waiter does not
    /// flood it.
    ping_every: u64,
    initial_seq: u32,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a peer can still be talked to.
#[derive(Debug)]
enum Standing {
    Active,
    /// Silent for too long; the reason as check_peer reports it.
    Failed(String),
    /// Said goodbye.
    Left,
}

/// An unacknowledged segment; its sequence number is its place in the queue.
#[derive(Debug)]
struct Seg {
    flags: u8,
    start: Option<Start>,
    data: Vec<u8>,
    /// When last sent (0 and `sends == 0`: not yet).
    sent_at: u64,
    sends: u32,
}

/// A segment that arrived ahead of a gap.
#[derive(Debug)]
struct Held {
    seq: u32,
    flags: u8,
    start: Option<Start>,
    data: Vec<u8>,
}

/// A message of several segments, being put together.
#[derive(Debug)]
struct Reasm {
    env: Envelope,
    total: usize,
    data: Vec<u8>,
}

/// Everything known about one peer.
#[derive(Debug)]
struct Peer<A> {
    addr: A,
    /// The tokens of our datagrams to it and of its datagrams to us.
    tok_out: u64,
    tok_in: u64,
    standing: Standing,
    // Sending.
    /// Sequence number of `queue[0]`, the oldest unacknowledged segment.
    una: u32,
    /// Segments at the front of `queue` sent at least once.
    sent: usize,
    queue: VecDeque<Seg>,
    srtt: Option<u64>,
    rttvar: u64,
    /// The timeout from the measured round trip, and the one in force (backed off).
    rto: u64,
    rto_cur: u64,
    /// Last acknowledgement that moved the window, or when the queue stopped being empty.
    progress_at: u64,
    /// Our goodbye's number while it is unacknowledged.
    bye: Option<u32>,
    // Receiving.
    expected: u32,
    held: Vec<Held>,
    reasm: Option<Reasm>,
    /// Segments taken in order and not acknowledged yet, and when the first of them came.
    rx_unacked: u32,
    rx_since: u64,
    /// The gap last NACKed (its first number) and when.
    nacked: Option<(u32, u64)>,
    heard_at: Option<u64>,
    /// In the endpoint's timer list.
    busy: bool,
}

impl<A: Copy> Peer<A> {
    fn new(addr: A, rank: u32, t: &Tuned) -> Self {
        Self {
            addr,
            tok_out: t.key.token(t.me, rank),
            tok_in: t.key.token(rank, t.me),
            standing: Standing::Active,
            una: t.initial_seq,
            sent: 0,
            queue: VecDeque::new(),
            srtt: None,
            rttvar: 0,
            rto: t.rto_initial,
            rto_cur: t.rto_initial,
            progress_at: 0,
            bye: None,
            expected: t.initial_seq,
            held: Vec::new(),
            reasm: None,
            rx_unacked: 0,
            rx_since: 0,
            nacked: None,
            heard_at: None,
            busy: false,
        }
    }

    fn active(&self) -> bool {
        matches!(self.standing, Standing::Active)
    }

    fn next_seq(&self) -> u32 {
        self.una.wrapping_add(self.queue.len() as u32)
    }

    /// About one round trip: the smoothed one, or the initial timeout before any.
    fn rtt(&self, t: &Tuned) -> u64 {
        self.srtt.unwrap_or(t.rto_initial)
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && self.rx_unacked == 0 && self.held.is_empty()
    }

    /// How long a receiver waits before asking again for a gap that a NACK did not fill:
    /// two round trips, or twice the least retransmission timeout before one is known. A
    /// receiver that only receives learns the round trip from its NACKs.
    fn renack_after(&self, t: &Tuned) -> u64 {
        self.srtt.unwrap_or(t.rto_min).saturating_mul(2).max(1_000)
    }

    /// Folds in a round-trip sample the usual way (RFC 6298).
    fn rtt_sample(&mut self, r: u64, t: &Tuned) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                self.rttvar = (self.rttvar.saturating_mul(3).saturating_add(s.abs_diff(r))) / 4;
                self.srtt = Some((s.saturating_mul(7).saturating_add(r)) / 8);
            }
        }
        let base = self.srtt.unwrap_or(r);
        self.rto = base
            .saturating_add(self.rttvar.saturating_mul(4).max(1_000))
            .clamp(t.rto_min, t.rto_max);
    }

    /// Adds an empty control segment.
    fn enqueue_control(&mut self, flag: u8, now: u64, backlog: &mut usize) -> u32 {
        if self.queue.is_empty() {
            self.progress_at = now;
        }
        let seq = self.next_seq();
        self.queue.push_back(Seg {
            flags: flag,
            start: None,
            data: Vec::new(),
            sent_at: 0,
            sends: 0,
        });
        *backlog += 1;
        seq
    }

    /// Forgets everything queued: the peer failed or left.
    fn discard(&mut self, backlog: &mut usize) {
        *backlog = backlog.saturating_sub(self.queue.len());
        self.una = self.next_seq();
        self.sent = 0;
        self.queue = VecDeque::new();
        self.bye = None;
        self.rto_cur = self.rto;
    }

    /// Fails the peer if it has acknowledged nothing for the timeout.
    fn expire(&mut self, t: &Tuned, now: u64, backlog: &mut usize) {
        if !self.active() || self.queue.is_empty() {
            return;
        }
        let silent = now.saturating_sub(self.progress_at);
        if silent >= t.timeout {
            self.standing = Standing::Failed(format!(
                "it acknowledged nothing for {:.3} s with {} segments outstanding ({} is {:.3} s)",
                Duration::from_nanos(silent).as_secs_f64(),
                self.queue.len(),
                crate::config::NET_TIMEOUT_VAR,
                Duration::from_nanos(t.timeout).as_secs_f64(),
            ));
            self.discard(backlog);
        }
    }

    /// Takes an acknowledgement of `n` more segments.
    fn acked(&mut self, n: u32, now: u64, t: &Tuned, backlog: &mut usize) {
        if n == 0 {
            return;
        }
        let old = self.una;
        let mut sample = None;
        for _ in 0..n {
            match self.queue.pop_front() {
                // Karn: a segment sent more than once gives no sample.
                Some(seg) => sample = (seg.sends == 1).then(|| now.saturating_sub(seg.sent_at)),
                None => break,
            }
        }
        self.una = self.una.wrapping_add(n);
        self.sent = self.sent.saturating_sub(n as usize);
        *backlog = backlog.saturating_sub(n as usize);
        if self.bye.is_some_and(|b| b.wrapping_sub(old) < n) {
            self.bye = None;
        }
        if let Some(r) = sample {
            self.rtt_sample(r, t);
        }
        self.rto_cur = self.rto;
        self.progress_at = now;
        if self.queue.is_empty() {
            self.queue = VecDeque::new();
        }
    }

    /// Counts a segment taken in order, for the ACK timer.
    fn took(&mut self, now: u64) {
        if self.rx_unacked == 0 {
            self.rx_since = now;
        }
        self.rx_unacked = self.rx_unacked.saturating_add(1);
        self.expected = self.expected.wrapping_add(1);
    }
}

/// How an acknowledgement number relates to what we sent.
enum AckClass {
    /// It acknowledges this many more segments (maybe 0).
    Progress(u32),
    /// Older than one we already took: it was overtaken.
    Stale,
    /// Beyond anything sent.
    Bogus,
}

fn classify_ack<A>(p: &Peer<A>, ack: u32) -> AckClass {
    let off = ack.wrapping_sub(p.una);
    if off as usize <= p.sent {
        AckClass::Progress(off)
    } else if off < 1 << 31 {
        AckClass::Bogus
    } else {
        AckClass::Stale
    }
}

/// How a data segment's number relates to the one expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeqClass {
    InOrder,
    Ahead,
    Duplicate,
    Outside,
}

fn classify_seq(expected: u32, seq: u32, window: u32) -> SeqClass {
    let ahead = seq.wrapping_sub(expected);
    if ahead == 0 {
        SeqClass::InOrder
    } else if ahead < window {
        SeqClass::Ahead
    } else if expected.wrapping_sub(seq) <= window {
        SeqClass::Duplicate
    } else {
        SeqClass::Outside
    }
}

/// Whether a segment fits the message in progress, if any.
fn framing(reasm: Option<&Reasm>, flags: u8, count: usize) -> Result<(), DropReason> {
    let opens = flags & (FLAG_FIRST | FLAGS_CONTROL) != 0;
    match reasm {
        None if opens => Ok(()),
        Some(r) if !opens => {
            let got = r.data.len().saturating_add(count);
            let last = flags & FLAG_LAST != 0;
            if (last && got == r.total) || (!last && got < r.total) {
                Ok(())
            } else {
                Err(DropReason::Malformed)
            }
        }
        _ => Err(DropReason::Malformed),
    }
}

/// What a datagram that passed every check asks for.
struct Verdict {
    /// Segments of ours it acknowledges; `None`: its ACK was overtaken.
    acked: Option<u32>,
    /// NACK: segments to resend from the front of the queue.
    resend: usize,
    /// DATA: where its segment falls.
    class: SeqClass,
}

/// Checks a decoded datagram against `p`'s state without changing anything.
fn verdict<A: Copy>(p: &Peer<A>, h: &Header, t: &Tuned) -> Result<Verdict, (DropReason, String)> {
    let acked = match classify_ack(p, h.ack) {
        AckClass::Progress(n) => Some(n),
        AckClass::Stale => None,
        AckClass::Bogus => {
            return Err((
                DropReason::BadSequence,
                format!(
                    "acknowledges {}, we sent up to {}",
                    h.ack,
                    p.una.wrapping_add(p.sent as u32)
                ),
            ));
        }
    };
    let mut v = Verdict {
        acked,
        resend: 0,
        class: SeqClass::Outside,
    };
    match h.kind {
        Kind::Ack => {}
        Kind::Nack => {
            // A stale NACK (its ack behind ours) names what has arrived since; the
            // queue of a peer that failed or left is gone.
            if let (true, Some(n)) = (p.active(), acked) {
                let outstanding = p.sent.saturating_sub(n as usize);
                if h.count as usize > outstanding {
                    return Err((
                        DropReason::BadSequence,
                        format!("NACKs {}+{}, only {outstanding} are out", h.seq, h.count),
                    ));
                }
                v.resend = h.count as usize;
            }
        }
        Kind::Data => {
            v.class = classify_seq(p.expected, h.seq, t.window);
            if v.class == SeqClass::Outside {
                return Err((
                    DropReason::BadSequence,
                    format!("segment {}, we expect {}", h.seq, p.expected),
                ));
            }
            if v.class == SeqClass::InOrder
                && let Err(r) = framing(p.reasm.as_ref(), h.flags, h.count as usize)
            {
                return Err((
                    r,
                    format!("segment {} (flags {:#x}) out of frame", h.seq, h.flags),
                ));
            }
        }
    }
    Ok(v)
}

/// Takes a segment that passed [`framing`], in order; returns the messages handed up.
fn take_segment<A: Copy>(
    p: &mut Peer<A>,
    rank: u32,
    flags: u8,
    start: Option<Start>,
    body: &[u8],
    sink: &mut dyn FnMut(u32, &Envelope, &[u8]),
    backlog: &mut usize,
) -> usize {
    if flags & FLAG_BYE != 0 {
        if p.active() {
            p.standing = Standing::Left;
        }
        p.discard(backlog);
        return 0;
    }
    if flags & FLAG_PING != 0 {
        return 0;
    }
    if let Some(s) = start {
        if flags & FLAG_LAST != 0 {
            sink(rank, &s.env, body);
            return 1;
        }
        let mut data = Vec::with_capacity(s.total as usize);
        data.extend_from_slice(body);
        p.reasm = Some(Reasm {
            env: s.env,
            total: s.total as usize,
            data,
        });
        return 0;
    }
    if let Some(r) = p.reasm.as_mut() {
        r.data.extend_from_slice(body);
    }
    if flags & FLAG_LAST != 0
        && let Some(r) = p.reasm.take()
    {
        sink(rank, &r.env, &r.data);
        return 1;
    }
    0
}

/// Sends a header-only datagram.
#[allow(clippy::too_many_arguments)]
fn send_control<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    to: (D::Addr, u64),
    kind: Kind,
    seq: u32,
    ack: u32,
    count: u32,
) -> io::Result<bool> {
    let h = Header {
        kind,
        flags: 0,
        token: to.1,
        src: t.me,
        dst: rank,
        seq,
        ack,
        count,
        start: None,
    };
    let mut b = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&h, &mut b);
    dg.send_to(&[&b[..n]], to.0)
}

/// Sends `p.queue[i]` with the current acknowledgement; `Ok(false)`: no room.
fn transmit<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    i: usize,
    now: u64,
) -> io::Result<bool> {
    let seq = p.una.wrapping_add(i as u32);
    let (addr, ack, token) = (p.addr, p.expected, p.tok_out);
    let Some(seg) = p.queue.get_mut(i) else {
        return Ok(false);
    };
    let h = Header {
        kind: Kind::Data,
        flags: seg.flags,
        token,
        src: t.me,
        dst: rank,
        seq,
        ack,
        count: seg.data.len() as u32,
        start: seg.start,
    };
    let mut b = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&h, &mut b);
    let head = &b[..n];
    let ok = if seg.data.is_empty() {
        dg.send_to(&[head], addr)?
    } else {
        dg.send_to(&[head, &seg.data], addr)?
    };
    if ok {
        seg.sent_at = now;
        seg.sends = seg.sends.saturating_add(1);
        // The segment carried our acknowledgement.
        p.rx_unacked = 0;
    }
    Ok(ok)
}

/// Sends the queued segments the window allows.
fn pump<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    let limit = p.queue.len().min(t.window as usize);
    while p.sent < limit {
        if !transmit(dg, t, rank, p, p.sent, now)? {
            *blocked = true;
            break;
        }
        p.sent += 1;
    }
    Ok(())
}

fn send_ack<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    if send_control(dg, t, rank, (p.addr, p.tok_out), Kind::Ack, 0, p.expected, 0)? {
        p.rx_unacked = 0;
    } else {
        *blocked = true;
        // Owed still: the ACK timer tries again.
        if p.rx_unacked == 0 {
            p.rx_unacked = 1;
            p.rx_since = now;
        }
    }
    Ok(())
}

/// Asks for the segments between the next expected one and the first one held, unless
/// that gap was asked for less than a round trip ago.
fn send_nack<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    let expected = p.expected;
    let Some(gap) = p
        .held
        .iter()
        .map(|h| h.seq.wrapping_sub(expected))
        .min()
        .filter(|&g| g > 0)
    else {
        // The next segment is held but could not be taken: only a good copy helps, and
        // the timer must not come back before a round trip.
        if !p.held.is_empty() {
            p.nacked = Some((expected, now));
        }
        return Ok(());
    };
    if p.nacked
        .is_some_and(|(s, at)| s == expected && now.saturating_sub(at) < p.renack_after(t))
    {
        return Ok(());
    }
    if send_control(
        dg,
        t,
        rank,
        (p.addr, p.tok_out),
        Kind::Nack,
        expected,
        expected,
        gap,
    )? {
        p.nacked = Some((expected, now));
        p.rx_unacked = 0;
    } else {
        *blocked = true;
    }
    Ok(())
}

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
    fn take(&mut self, mut n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
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
    rx: Vec<u8>,
    backlog: usize,
    closing: bool,
    /// A send found no room in the transport: waiting for it to drain helps.
    blocked: bool,
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
        if me >= size {
            return Err(NetError::InvalidRank { rank: me, size });
        }
        let bad = |var: &'static str, value: String, reason: &str| NetError::Config {
            var,
            value,
            reason: reason.into(),
        };
        if !(1..=MAX_WINDOW).contains(&cfg.window) {
            return Err(bad(
                "window",
                cfg.window.to_string(),
                &format!("expected 1 to {MAX_WINDOW} segments"),
            ));
        }
        let max_datagram = dg.max_datagram();
        if max_datagram < MIN_DATAGRAM {
            return Err(bad(
                "max_datagram",
                max_datagram.to_string(),
                &format!("the transport must carry at least {MIN_DATAGRAM} bytes"),
            ));
        }
        if cfg.max_message > u32::MAX as usize {
            return Err(bad(
                "max_message",
                cfg.max_message.to_string(),
                "a message's length must fit 32 bits",
            ));
        }
        let (rto_min, rto_max) = (ns(cfg.rto_min), ns(cfg.rto_max));
        if rto_min == 0 || rto_min > rto_max {
            return Err(bad(
                "rto_min",
                format!("{:?}..{:?}", cfg.rto_min, cfg.rto_max),
                "expected 0 < rto_min <= rto_max",
            ));
        }
        let timeout = ns(cfg.timeout);
        if timeout == 0 {
            return Err(bad("timeout", "0".into(), "expected a positive timeout"));
        }
        let ack_every = match cfg.ack_every {
            0 => (cfg.window / 4).max(1),
            n => n.min(cfg.window),
        };
        let t = Tuned {
            me,
            size,
            key,
            window: cfg.window,
            max_message: cfg.max_message,
            first_room: max_datagram - MAX_HEADER_LEN,
            rest_room: max_datagram - HEADER_LEN,
            rto_initial: ns(cfg.rto_initial).clamp(rto_min, rto_max),
            rto_min,
            rto_max,
            ack_delay: ns(cfg.ack_delay),
            ack_every,
            timeout,
            ping_every: timeout / 10,
            initial_seq: cfg.initial_seq,
        };
        let rx = vec![0; dg.max_receive().max(max_datagram).saturating_add(1)];
        Ok(Self {
            dg,
            t,
            resolve,
            peers: (0..size).map(|_| None).collect(),
            busy: Vec::with_capacity(size as usize),
            pings: Cell::new(Vec::new()),
            rx,
            backlog: 0,
            closing: false,
            blocked: false,
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
        p.queue.push_back(Seg {
            flags: FLAG_FIRST | if first == len { FLAG_LAST } else { 0 },
            start: Some(Start {
                env: *env,
                total: len as u32,
            }),
            data: parts.take(first),
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
                data: parts.take(k),
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
        let mut rx = std::mem::take(&mut self.rx);
        let got = self.receive(&mut rx, sink);
        self.rx = rx;
        let got = got.map_err(|e| NetError::io(format!("{name}: receiving"), e))?;
        self.timers()
            .map_err(|e| NetError::io(format!("{name}: sending"), e))?;
        Ok(got)
    }

    fn receive(&mut self, rx: &mut [u8], sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> io::Result<usize> {
        let mut got = 0;
        for _ in 0..RECEIVE_BUDGET {
            let Some((n, from)) = self.dg.recv_from(rx)? else {
                break;
            };
            let d = rx.get(..n).unwrap_or(rx);
            got += self.handle(d, from, sink)?;
        }
        Ok(got)
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
        let now = self.dg.now();
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
            ..
        } = self;
        let name = dg.name();
        p.heard_at = Some(now);
        if let Some(n) = acked {
            p.acked(n, now, t, backlog);
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
    fn timers(&mut self) -> io::Result<()> {
        let now = self.dg.now();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, SimNet, SimSocket};
    use proptest::prelude::*;

    const BASE: u32 = 100;
    const JOB: JobKey = JobKey::from_bytes([0xf1; crate::auth::KEY_LEN]);

    type Got = Vec<(u32, Envelope, Vec<u8>)>;

    fn endpoint(net: &SimNet, rank: u32, size: u32, cfg: ReliableConfig) -> Reliable<SimSocket> {
        let resolve = Box::new(move |r: u32| {
            if r < size {
                Ok(BASE + r)
            } else {
                Err(NetError::BadCard {
                    rank: r,
                    reason: "no such rank".into(),
                })
            }
        });
        Reliable::new(net.socket(BASE + rank), rank, size, JOB, cfg, resolve)
            .unwrap()
            .quiet()
    }

    fn small(window: u32, initial_seq: u32) -> ReliableConfig {
        ReliableConfig {
            window,
            initial_seq,
            max_message: 4096,
            ..ReliableConfig::default()
        }
    }

    /// Polls the live endpoints, then moves the clock to the next thing that happens.
    fn step(net: &SimNet, eps: &mut [Reliable<SimSocket>], got: &mut [Got], live: &[bool]) {
        for (i, ep) in eps.iter_mut().enumerate() {
            if live[i] {
                let g = &mut got[i];
                ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            }
        }
        let mut next = net.next_arrival();
        for (i, ep) in eps.iter().enumerate() {
            if live[i]
                && let Some(d) = ep.next_deadline()
            {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        if let Some(t) = next {
            net.advance_to(t.max(net.now()));
        }
    }

    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    /// Every endpoint sends `plan[src]` (destination, envelope, bytes) in order, retrying
    /// on Again; returns what each received.
    fn run(
        net: &SimNet,
        eps: &mut [Reliable<SimSocket>],
        plan: &[Vec<(u32, Envelope, Vec<u8>)>],
        limit_s: u64,
    ) -> Vec<Got> {
        let n = eps.len();
        let live = vec![true; n];
        let mut got: Vec<Got> = vec![Vec::new(); n];
        // Per sender and destination, the index of the next message to send.
        let mut queues: Vec<Vec<VecDeque<usize>>> = vec![vec![VecDeque::new(); n]; n];
        for (s, msgs) in plan.iter().enumerate() {
            for (i, m) in msgs.iter().enumerate() {
                queues[s][m.0 as usize].push_back(i);
            }
        }
        let want: usize = plan.iter().map(Vec::len).sum();
        let mut rounds = 0u64;
        loop {
            for (s, (ep, to_each)) in eps.iter_mut().zip(&mut queues).enumerate() {
                for q in to_each.iter_mut() {
                    while let Some(&i) = q.front() {
                        let (to, env, data) = &plan[s][i];
                        let halves = data.split_at(data.len() / 2);
                        match ep.send(*to, env, &[halves.0, halves.1]).unwrap() {
                            Accept::Sent => {
                                q.pop_front();
                            }
                            Accept::Again => break,
                        }
                    }
                }
            }
            let received: usize = got.iter().map(Vec::len).sum();
            let queued: usize = queues.iter().flatten().map(VecDeque::len).sum();
            if received == want && queued == 0 && eps.iter().all(|e| e.backlog() == 0) {
                break;
            }
            step(net, eps, &mut got, &live);
            rounds += 1;
            assert!(
                net.now() < limit_s * 1_000_000_000 && rounds < 2_000_000,
                "stuck at {} ns after {rounds} rounds: received {received} of {want}, backlogs {:?}, {:?}",
                net.now(),
                eps.iter().map(Reliable::backlog).collect::<Vec<_>>(),
                net.stats()
            );
        }
        got
    }

    fn check(plan: &[Vec<(u32, Envelope, Vec<u8>)>], got: &[Got]) {
        for (d, g) in got.iter().enumerate() {
            for (s, msgs) in plan.iter().enumerate() {
                let sent: Vec<(Envelope, &[u8])> = msgs
                    .iter()
                    .filter(|m| m.0 as usize == d)
                    .map(|m| (m.1, &m.2[..]))
                    .collect();
                let came: Vec<(Envelope, &[u8])> = g
                    .iter()
                    .filter(|m| m.0 as usize == s)
                    .map(|m| (m.1, &m.2[..]))
                    .collect();
                assert_eq!(came.len(), sent.len(), "{s} -> {d}: count");
                assert!(came == sent, "{s} -> {d}: contents or order differ");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn lossy_networks_deliver_exactly_once_in_order(
            seed in any::<u64>(),
            loss in 0.0..0.2f64,
            duplicate in 0.0..0.05f64,
            reorder in 0.0..0.3f64,
            delay_us in 1u64..2_000,
            jitter_us in 0u64..1_000,
            n in 2u32..=4,
            window in 2u32..=16,
            below_wrap in 0u32..48,
            max_datagram in 80usize..400,
            msgs in 1usize..40,
        ) {
            let net = SimNet::new(SimConfig {
                seed,
                loss,
                duplicate,
                reorder,
                delay: Duration::from_micros(delay_us),
                jitter: Duration::from_micros(jitter_us),
                max_datagram,
            });
            let cfg = ReliableConfig {
                timeout: Duration::from_secs(120),
                ..small(window, u32::MAX - below_wrap)
            };
            let mut eps: Vec<_> = (0..n).map(|r| endpoint(&net, r, n, cfg.clone())).collect();
            let rest = max_datagram - HEADER_LEN;
            let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
            let mut rnd = move || {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            };
            let plan: Vec<Vec<(u32, Envelope, Vec<u8>)>> = (0..n)
                .map(|s| {
                    (0..msgs)
                        .map(|_| {
                            let to = (s + 1 + (rnd() % u64::from(n - 1)) as u32) % n;
                            let len = (rnd() % (3 * rest as u64 + 1)) as usize;
                            let env = [rnd(), rnd()];
                            (to, env, bytes(rnd(), len))
                        })
                        .collect()
                })
                .collect();
            let got = run(&net, &mut eps, &plan, 600);
            check(&plan, &got);
            for ep in &eps {
                prop_assert_eq!(ep.backlog(), 0);
                for p in ep.peers.iter().flatten() {
                    prop_assert!(p.active());
                    // Nothing in flight keeps memory.
                    prop_assert!(p.queue.capacity() == 0 && p.held.capacity() == 0 && p.reasm.is_none());
                }
            }
        }

        #[test]
        fn decode_header_takes_anything(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_header(&buf);
        }

        #[test]
        fn decode_header_takes_mangled_headers(
            kind in 1u8..=3, flags in 0u8..16, count in 0u32..64, seq in any::<u32>(),
            cut in 0usize..130, byte in 0usize..60, val in any::<u8>(),
        ) {
            let h = Header {
                kind: [Kind::Data, Kind::Ack, Kind::Nack][kind as usize - 1],
                flags, token: 7, src: 1, dst: 2, seq, ack: seq, count,
                start: (flags & FLAG_FIRST != 0).then_some(Start { env: [1, 2], total: count }),
            };
            let mut b = [0u8; MAX_HEADER_LEN];
            let n = encode_header(&h, &mut b);
            let mut v = b[..n].to_vec();
            v.resize(n + count as usize, 0xab);
            v.truncate(cut);
            if let Some(x) = v.get_mut(byte) {
                *x = val;
            }
            let _ = decode_header(&v);
        }

        #[test]
        fn headers_round_trip(
            kind in 0usize..3, flag_pick in 0usize..6, token in any::<u64>(), src in any::<u32>(),
            dst in any::<u32>(), seq in any::<u32>(), ack in any::<u32>(), count in 1u32..300,
            env in any::<[u64; 2]>(), extra in 0u32..300,
        ) {
            let kind = [Kind::Data, Kind::Ack, Kind::Nack][kind];
            let (flags, count, start, seq, ack) = match kind {
                Kind::Ack => (0, 0, None, 0, ack),
                Kind::Nack => (0, count, None, seq, seq),
                Kind::Data => {
                    let flags = [0, FLAG_LAST, FLAG_FIRST, FLAG_FIRST | FLAG_LAST, FLAG_BYE, FLAG_PING][flag_pick];
                    let count = if flags & FLAGS_CONTROL != 0 { 0 } else { count };
                    let start = (flags & FLAG_FIRST != 0).then_some(Start {
                        env,
                        total: if flags & FLAG_LAST != 0 { count } else { count + 1 + extra },
                    });
                    (flags, count, start, seq, ack)
                }
            };
            let h = Header { kind, flags, token, src, dst, seq, ack, count, start };
            let mut b = [0u8; MAX_HEADER_LEN];
            let n = encode_header(&h, &mut b);
            prop_assert_eq!(n, h.encoded_len());
            let mut v = b[..n].to_vec();
            if kind == Kind::Data {
                v.resize(n + count as usize, 0x5a);
            }
            prop_assert_eq!(decode_header(&v), Ok(h));
            // One byte short, or one too many.
            prop_assert_eq!(decode_header(&v[..v.len() - 1]), Err(DropReason::Truncated));
            v.push(0);
            prop_assert_eq!(decode_header(&v), Err(DropReason::Malformed));
        }
    }

    fn net(seed: u64) -> SimNet {
        SimNet::new(SimConfig {
            seed,
            delay: Duration::from_micros(50),
            max_datagram: 200,
            ..SimConfig::default()
        })
    }

    /// Drives `eps` until `done` or `limit_ns` of virtual time.
    fn drive(
        net: &SimNet,
        eps: &mut [Reliable<SimSocket>],
        got: &mut [Got],
        live: &[bool],
        limit_ns: u64,
        mut done: impl FnMut(&[Reliable<SimSocket>], &[Got]) -> bool,
    ) {
        let end = net.now() + limit_ns;
        let mut rounds = 0;
        while !done(eps, got) {
            assert!(
                net.now() < end && rounds < 1_000_000,
                "not done by {} ns",
                net.now()
            );
            step(net, eps, got, live);
            rounds += 1;
        }
    }

    #[test]
    fn sequence_numbers_wrap() {
        let net = net(1);
        let cfg = small(4, u32::MAX - 2);
        let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
        let plan = vec![
            (0..12).map(|i| (1, [i, 0], bytes(i, 300))).collect(),
            (0..5).map(|i| (0, [i, 1], bytes(i, 10))).collect(),
        ];
        let got = run(&net, &mut eps, &plan, 10);
        check(&plan, &got);
        assert_eq!(eps[0].stats().packets_sent, 12);
        assert_eq!(eps[1].stats().packets_received, 12);
        assert_eq!(eps[0].stats().retransmits, 0);
        let p = eps[0].peers[1].as_deref().unwrap();
        assert!(p.una < 100, "wrapped: {}", p.una);
    }

    #[test]
    fn sends_are_checked() {
        let net = net(2);
        let mut a = endpoint(&net, 0, 3, small(4, 0));
        let e = [0, 0];
        assert!(matches!(
            a.send(3, &e, &[]),
            Err(NetError::InvalidRank { rank: 3, size: 3 })
        ));
        assert!(matches!(
            a.send(0, &e, &[]),
            Err(NetError::InvalidRank { rank: 0, .. })
        ));
        let big = vec![0u8; 4097];
        assert!(matches!(
            a.send(1, &e, &[&big]),
            Err(NetError::TooLarge { len: 4097, max: 4096 })
        ));
        assert_eq!(a.backlog(), 0);
        // A rank whose address cannot be had.
        let mut b = Reliable::new(
            net.socket(BASE + 7),
            0,
            2,
            JOB,
            small(4, 0),
            Box::new(|r| {
                Err(NetError::BadCard {
                    rank: r,
                    reason: "none".into(),
                })
            }),
        )
        .unwrap();
        assert!(matches!(
            b.send(1, &e, &[]),
            Err(NetError::BadCard { rank: 1, .. })
        ));
        assert!(b.check_peer(5).is_err());
        // Bad configurations.
        for cfg in [
            ReliableConfig {
                window: 0,
                ..ReliableConfig::default()
            },
            ReliableConfig {
                rto_min: Duration::ZERO,
                ..ReliableConfig::default()
            },
            ReliableConfig {
                timeout: Duration::ZERO,
                ..ReliableConfig::default()
            },
        ] {
            assert!(matches!(
                Reliable::new(net.socket(BASE + 8), 0, 2, JOB, cfg, Box::new(|_| Ok(0))),
                Err(NetError::Config { .. })
            ));
        }
        assert!(matches!(
            Reliable::new(
                net.socket(BASE + 8),
                2,
                2,
                JOB,
                ReliableConfig::default(),
                Box::new(|_| Ok(0))
            ),
            Err(NetError::InvalidRank { rank: 2, size: 2 })
        ));
    }

    #[test]
    fn back_pressure_takes_nothing_and_everything_arrives_later() {
        let net = net(3);
        let cfg = small(4, 10);
        let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
        let env = [9, 9];
        // 350 bytes are 3 segments of a 200-byte datagram.
        let msg = bytes(5, 350);
        let mut accepted = 0;
        let mut live = [true, false];
        let mut got = vec![Vec::new(), Vec::new()];
        loop {
            let before = eps[0].backlog();
            match eps[0].send(1, &env, &[&msg]).unwrap() {
                Accept::Sent => accepted += 1,
                Accept::Again => {
                    assert_eq!(eps[0].backlog(), before, "nothing taken on Again");
                    break;
                }
            }
            assert!(accepted < 10);
        }
        assert_eq!(accepted, 2, "a window of 4 takes two 3-segment messages");
        assert_eq!(eps[0].backlog(), 6);
        // The receiver is busy: time passes, nothing is lost, sends still bounce.
        for _ in 0..10 {
            step(&net, &mut eps, &mut got, &live);
        }
        assert_eq!(eps[0].send(1, &env, &[&msg]).unwrap(), Accept::Again);
        assert!(eps[0].stats().retransmits > 0);
        live[1] = true;
        let mut total = accepted;
        drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |eps, got| {
            got[1].len() == total && eps[0].backlog() == 0
        });
        while total < 6 {
            if eps[0].send(1, &env, &[&msg]).unwrap() == Accept::Sent {
                total += 1;
            }
            step(&net, &mut eps, &mut got, &live);
        }
        drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |eps, got| {
            got[1].len() == 6 && eps[0].backlog() == 0
        });
        assert!(got[1].iter().all(|(s, e, b)| *s == 0 && *e == env && *b == msg));
        assert!(
            eps[1].stats().duplicates > 0,
            "the early retransmissions were duplicates"
        );
    }

    #[test]
    fn a_vanished_peer_fails_after_the_timeout() {
        let net = net(4);
        let cfg = ReliableConfig {
            timeout: Duration::from_secs(2),
            ..small(8, 0)
        };
        let mut eps = vec![
            endpoint(&net, 0, 3, cfg.clone()),
            endpoint(&net, 1, 3, cfg.clone()),
        ];
        eps.push(endpoint(&net, 2, 3, cfg));
        let mut got = vec![Vec::new(); 3];
        let live = [true, true, true];
        eps[0].send(1, &[1, 1], &[b"hello"]).unwrap();
        drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, g| {
            g[1].len() == 1 && e[0].backlog() == 0
        });
        // Rank 1 vanishes; rank 0 has something outstanding to it.
        net.close(BASE + 1);
        let live = [true, false, true];
        let t0 = net.now();
        eps[0].send(1, &[2, 2], &[b"anyone?"]).unwrap();
        assert_eq!(eps[0].backlog(), 1);
        eps[0].check_peer(1).unwrap();
        drive(&net, &mut eps, &mut got, &live, 10_000_000_000, |e, _| {
            e[0].check_peer(1).is_err()
        });
        let waited = net.now() - t0;
        assert!(
            (2_000_000_000..2_100_000_000).contains(&waited),
            "failed after {waited} ns"
        );
        assert_eq!(eps[0].backlog(), 0, "its queue is discarded");
        let e = eps[0].send(1, &[3, 3], &[b"x"]).unwrap_err();
        assert!(
            matches!(&e, NetError::PeerFailed { rank: 1, reason } if reason.contains("acknowledged nothing")),
            "{e}"
        );
        // Backing off: a handful of resends in two seconds, not hundreds.
        let r = eps[0].stats().retransmits;
        assert!((4..=20).contains(&r), "{r} retransmits");

        // Rank 2 only waits to hear from rank 1: the probe finds it.
        let t1 = net.now();
        drive(&net, &mut eps, &mut got, &live, 10_000_000_000, |e, _| {
            e[2].check_peer(1).is_err()
        });
        let waited = net.now() - t1;
        assert!(waited <= 2_300_000_000, "found after {waited} ns");
        assert!(matches!(
            eps[2].check_peer(1),
            Err(NetError::PeerFailed { rank: 1, .. })
        ));
        // And the living are fine.
        eps[0].check_peer(2).unwrap();
        eps[2].check_peer(0).unwrap();
    }

    #[test]
    fn a_peer_that_stops_polling_fails_too() {
        let net = net(5);
        let cfg = ReliableConfig {
            timeout: Duration::from_millis(500),
            ..small(8, 0)
        };
        let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
        let mut got = vec![Vec::new(); 2];
        let live = [true, false];
        eps[0].send(1, &[1, 1], &[&[7u8; 500][..]]).unwrap();
        drive(&net, &mut eps, &mut got, &live, 2_000_000_000, |e, _| {
            e[0].check_peer(1).is_err()
        });
        assert!(got[1].is_empty());
        assert_eq!(eps[0].backlog(), 0);
    }

    #[test]
    fn goodbye_marks_the_peer_as_left() {
        let net = net(6);
        let cfg = small(4, 0);
        let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
        let mut got = vec![Vec::new(); 2];
        let live = [true, true];
        eps[0].send(1, &[1, 2], &[b"before"]).unwrap();
        eps[1].send(0, &[3, 4], &[b"reply"]).unwrap();
        drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, g| {
            g[0].len() == 1 && g[1].len() == 1 && e.iter().all(|e| e.backlog() == 0)
        });
        eps[0].begin_shutdown();
        assert!(!eps[0].shutdown_done());
        let e = eps[0].send(1, &[0, 0], &[]).unwrap_err();
        assert!(e.to_string().contains("shutting down"), "{e}");
        drive(&net, &mut eps, &mut got, &live, 1_000_000_000, |e, _| {
            e[0].shutdown_done()
        });
        let e = eps[1].check_peer(0).unwrap_err();
        assert!(
            matches!(&e, NetError::PeerFailed { rank: 0, reason } if reason.contains("left")),
            "{e}"
        );
        assert!(matches!(
            eps[1].send(0, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 0, .. })
        ));
        assert_eq!(eps[0].backlog(), 0);
        assert_eq!(eps[1].backlog(), 0);
        eps[1].begin_shutdown();
        assert!(eps[1].shutdown_done(), "no goodbye to a peer that left");
    }

    #[test]
    fn goodbyes_cross() {
        let net = SimNet::new(SimConfig {
            seed: 7,
            loss: 0.3,
            delay: Duration::from_micros(50),
            max_datagram: 200,
            ..SimConfig::default()
        });
        let cfg = small(4, 0);
        let mut eps = vec![endpoint(&net, 0, 2, cfg.clone()), endpoint(&net, 1, 2, cfg)];
        let mut got = vec![Vec::new(); 2];
        let live = [true, true];
        eps[0].send(1, &[1, 2], &[b"x"]).unwrap();
        eps[1].send(0, &[1, 2], &[b"y"]).unwrap();
        drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |e, _| {
            e.iter().all(|e| e.backlog() == 0)
        });
        eps[0].begin_shutdown();
        eps[1].begin_shutdown();
        drive(&net, &mut eps, &mut got, &live, 5_000_000_000, |e, _| {
            e.iter().all(Reliable::shutdown_done)
        });
    }

    /// A raw socket at rank 0's address, speaking to a real endpoint at rank 1.
    struct Raw {
        net: SimNet,
        sock: SimSocket,
        ep: Reliable<SimSocket>,
        got: Got,
    }

    impl Raw {
        fn new(window: u32, initial_seq: u32) -> Self {
            let net = net(8);
            let sock = net.socket(BASE);
            let ep = endpoint(&net, 1, 3, small(window, initial_seq));
            Self {
                net,
                sock,
                ep,
                got: Vec::new(),
            }
        }

        fn datagram(h: &Header, body: &[u8]) -> Vec<u8> {
            let mut b = [0u8; MAX_HEADER_LEN];
            let n = encode_header(h, &mut b);
            let mut v = b[..n].to_vec();
            v.extend_from_slice(body);
            v
        }

        fn data(seq: u32, ack: u32, flags: u8, total: u32, body: &[u8]) -> Vec<u8> {
            let h = Header {
                kind: Kind::Data,
                flags,
                token: JOB.token(0, 1),
                src: 0,
                dst: 1,
                seq,
                ack,
                count: body.len() as u32,
                start: (flags & FLAG_FIRST != 0).then_some(Start {
                    env: [seq as u64, 0],
                    total,
                }),
            };
            Self::datagram(&h, body)
        }

        /// Delivers `d` from `from` and polls the endpoint; returns what it sent back.
        fn feed(&mut self, from: u32, d: &[u8]) -> Vec<Header> {
            self.net.inject(from, BASE + 1, d);
            let g = &mut self.got;
            self.ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            self.replies()
        }

        /// Runs the endpoint's timers and forgets what it sent.
        fn settle(&mut self) {
            let g = &mut self.got;
            self.ep.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            self.replies();
        }

        fn replies(&mut self) -> Vec<Header> {
            self.net.advance_to(self.net.now() + 1_000_000);
            let mut out = Vec::new();
            let mut buf = [0u8; 512];
            while let Some((n, from)) = self.sock.recv_from(&mut buf).unwrap() {
                assert_eq!(from, BASE + 1);
                out.push(decode_header(&buf[..n]).unwrap());
            }
            out
        }
    }

    #[test]
    fn gaps_are_nacked_and_filled() {
        // A window of 16 acknowledges every 4 segments.
        let mut r = Raw::new(16, 5);
        // Segment 6 comes before 5: held, and 5 is asked for.
        let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
        assert!(r.got.is_empty());
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].kind, out[0].seq, out[0].count, out[0].ack),
            (Kind::Nack, 5, 1, 5)
        );
        // Not again for the same gap within a round trip.
        let out = r.feed(BASE, &Raw::data(8, 5, FLAG_FIRST | FLAG_LAST, 1, b"d"));
        assert!(out.is_empty(), "{out:?}");
        // The same held segment again is a duplicate.
        let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
        assert_eq!(r.ep.stats().duplicates, 1);
        assert_eq!(out.iter().filter(|h| h.kind == Kind::Ack).count(), 1);
        // The gap fills: 5 and 6 come out in order; 8 waits for 7, which is asked for.
        let out = r.feed(BASE, &Raw::data(5, 5, FLAG_FIRST | FLAG_LAST, 1, b"a"));
        let seen: Vec<&[u8]> = r.got.iter().map(|g| &g.2[..]).collect();
        assert_eq!(seen, [&b"a"[..], b"bb"]);
        assert!(
            out.iter()
                .any(|h| h.kind == Kind::Nack && h.seq == 7 && h.count == 1),
            "{out:?}"
        );
        let out = r.feed(BASE, &Raw::data(7, 5, FLAG_FIRST | FLAG_LAST, 1, b"c"));
        assert_eq!(r.got.len(), 4);
        assert_eq!(r.got[3].2, b"d");
        // Two segments since the NACK (which carried an ACK): the ACK waits.
        assert!(out.iter().all(|h| h.kind != Kind::Ack), "{out:?}");
        r.net.advance_to(r.ep.next_deadline().unwrap());
        r.ep.poll(&mut |_, _, _| {}).unwrap();
        let out = r.replies();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 9));
        assert!(r.ep.next_deadline().is_none());
        assert_eq!(r.ep.stats().drops.total(), 0);
    }

    #[test]
    fn a_gap_whose_nack_was_lost_is_asked_for_again_by_the_timer() {
        let mut r = Raw::new(16, 5);
        let out = r.feed(BASE, &Raw::data(6, 5, FLAG_FIRST | FLAG_LAST, 2, b"bb"));
        assert_eq!(out.iter().filter(|h| h.kind == Kind::Nack).count(), 1, "{out:?}");
        // That NACK is lost and nothing else comes: the receiver's timer asks again,
        // rather than leave the gap to the sender's retransmission timer.
        let due = r.ep.next_deadline().expect("a timer for the gap");
        r.net.advance_to(due);
        r.ep.poll(&mut |_, _, _| {}).unwrap();
        let out = r.replies();
        assert!(
            out.iter()
                .any(|h| h.kind == Kind::Nack && h.seq == 5 && h.count == 1),
            "{out:?}"
        );
        // Once the gap fills, no timer is left for it.
        r.feed(BASE, &Raw::data(5, 5, FLAG_FIRST | FLAG_LAST, 1, b"a"));
        assert_eq!(r.got.len(), 2);
        r.settle();
        r.net.advance_to(r.ep.next_deadline().unwrap_or(0));
        r.settle();
        assert!(r.ep.next_deadline().is_none());
    }

    #[test]
    fn multi_segment_messages_are_reassembled() {
        let mut r = Raw::new(8, 0);
        r.feed(BASE, &Raw::data(0, 0, FLAG_FIRST, 7, b"abc"));
        r.feed(BASE, &Raw::data(2, 0, FLAG_LAST, 0, b"g"));
        r.feed(BASE, &Raw::data(1, 0, 0, 0, b"def"));
        assert_eq!(r.got.len(), 1);
        assert_eq!((r.got[0].1, &r.got[0].2[..]), ([0, 0], &b"abcdefg"[..]));
        assert_eq!(r.ep.stats().drops.total(), 0);
    }

    #[test]
    fn a_nack_resends_at_once() {
        let net = net(9);
        let cfg = small(8, 0);
        let mut a = endpoint(&net, 0, 2, cfg);
        let mut raw = net.socket(BASE + 1);
        for i in 0..3u8 {
            a.send(1, &[i.into(), 0], &[&[i; 10]]).unwrap();
        }
        net.advance_to(net.now() + 1_000_000);
        let mut buf = [0u8; 512];
        let mut seqs = Vec::new();
        while let Some((n, _)) = raw.recv_from(&mut buf).unwrap() {
            seqs.push(decode_header(&buf[..n]).unwrap().seq);
        }
        assert_eq!(seqs, [0, 1, 2]);
        // "Got 0, missing 1 and 2"; long before the retransmission timer.
        let nack = Raw::datagram(
            &Header {
                kind: Kind::Nack,
                flags: 0,
                token: JOB.token(1, 0),
                src: 1,
                dst: 0,
                seq: 1,
                ack: 1,
                count: 2,
                start: None,
            },
            &[],
        );
        net.inject(BASE + 1, BASE, &nack);
        a.poll(&mut |_, _, _| {}).unwrap();
        assert_eq!(a.backlog(), 2);
        assert_eq!(a.stats().retransmits, 2);
        net.advance_to(net.now() + 100_000);
        let mut again = Vec::new();
        while let Some((n, _)) = raw.recv_from(&mut buf).unwrap() {
            let h = decode_header(&buf[..n]).unwrap();
            again.push((h.seq, buf[n - 1]));
        }
        assert_eq!(again, [(1, 1), (2, 2)]);
        // The same NACK again within a round trip resends nothing.
        net.inject(BASE + 1, BASE, &nack);
        a.poll(&mut |_, _, _| {}).unwrap();
        assert_eq!(a.stats().retransmits, 2);
        // A NACK for what was never sent is refused.
        let mut bogus = nack.clone();
        bogus[32..36].copy_from_slice(&5u32.to_le_bytes());
        net.inject(BASE + 1, BASE, &bogus);
        a.poll(&mut |_, _, _| {}).unwrap();
        assert_eq!(a.stats().drops.count(DropReason::BadSequence), 1);
        assert_eq!(a.stats().retransmits, 2);
    }

    #[test]
    fn bad_input_is_counted_and_changes_nothing() {
        use DropReason::*;
        let mut r = Raw::new(8, 1000);
        // A good first exchange: segment 1000 delivered.
        r.feed(BASE, &Raw::data(1000, 1000, FLAG_FIRST | FLAG_LAST, 2, b"ok"));
        assert_eq!(r.got.len(), 1);
        r.settle();
        let good = Raw::data(1001, 1000, FLAG_FIRST | FLAG_LAST, 3, b"yes");
        let hdr = |f: &dyn Fn(&mut Header)| {
            let mut h = decode_header(&good).unwrap();
            let token = h.token;
            f(&mut h);
            // A header bent elsewhere carries its pair's token, to reach the check meant.
            if h.token == token {
                h.token = JOB.token(h.src, h.dst);
            }
            Raw::datagram(&h, b"yes")
        };
        let mut oversized = Raw::data(1001, 1000, FLAG_FIRST | FLAG_LAST, 141, &[1; 141]);
        assert_eq!(oversized.len(), 201);
        let mut magic = good.clone();
        magic[0] ^= 0xff;
        let mut version = good.clone();
        version[2] = 9;
        let mut shorter = good.clone();
        shorter.pop();
        let cases: Vec<(DropReason, u32, Vec<u8>)> = vec![
            (Truncated, BASE, good[..20].to_vec()),
            (Truncated, BASE, shorter),
            (Oversized, BASE, std::mem::take(&mut oversized)),
            (BadMagic, BASE, magic),
            (BadMagic, BASE, version),
            (WrongJob, BASE, hdr(&|h| h.token ^= 1)),
            // Another pair's token: what a datagram captured elsewhere in the job carries.
            (WrongJob, BASE, hdr(&|h| h.token = JOB.token(1, 0))),
            (WrongJob, BASE, hdr(&|h| h.token = JOB.token(0, 2))),
            (BadRank, BASE, hdr(&|h| h.dst = 2)),
            (BadRank, BASE, hdr(&|h| h.src = 3)),
            (BadRank, BASE, hdr(&|h| h.src = 1)),
            // A valid header claiming to be rank 0, from elsewhere.
            (UnknownAddress, BASE + 50, good.clone()),
            // Rank 2's card resolves, but not to this address.
            (UnknownAddress, BASE + 50, hdr(&|h| h.src = 2)),
            // Rank 2 from its own address, but with a bogus ACK: no state is made for it.
            (
                BadSequence,
                BASE + 2,
                hdr(&|h| {
                    h.src = 2;
                    h.ack = 1001;
                }),
            ),
            (BadSequence, BASE, hdr(&|h| h.seq = 1001 + 8)),
            (BadSequence, BASE, hdr(&|h| h.seq = 1000 - 9)),
            (BadSequence, BASE, hdr(&|h| h.seq = 1001 + (1 << 31))),
            (BadSequence, BASE, hdr(&|h| h.ack = 1001)),
            (BadSequence, BASE, hdr(&|h| h.ack = 1000 + 1_000_000)),
            (Malformed, BASE, Raw::data(1001, 1000, 0, 0, b"mid")),
            (Malformed, BASE, Raw::data(1001, 1000, FLAG_LAST, 0, b"end")),
            (Malformed, BASE, hdr(&|h| h.flags |= 0x40)),
            (Malformed, BASE, hdr(&|h| h.flags = FLAG_BYE | FLAG_PING)),
            (Oversized, BASE, Raw::data(1001, 1000, FLAG_FIRST, 5000, b"big")),
        ];
        for (reason, from, d) in &cases {
            let before = r.ep.stats().drops.count(*reason);
            let total = r.ep.stats().drops.total();
            let out = r.feed(*from, d);
            assert!(out.is_empty(), "{reason}: answered {out:?}");
            assert_eq!(r.ep.stats().drops.count(*reason), before + 1, "{reason}: {d:?}");
            assert_eq!(r.ep.stats().drops.total(), total + 1);
            assert_eq!(r.got.len(), 1, "{reason}: delivered");
        }
        assert!(r.ep.peers[2].is_none(), "no state for a rank that never spoke");
        let p = r.ep.peers[0].as_deref().unwrap();
        assert_eq!(
            (p.expected, p.held.len(), p.una, p.reasm.is_none()),
            (1001, 0, 1000, true)
        );
        // The good segment still goes through.
        r.feed(BASE, &good);
        assert_eq!(r.got.len(), 2);
        assert_eq!(r.got[1].2, b"yes");
        // A message started, then a segment that claims to start another: refused; the
        // one in progress still completes.
        r.feed(BASE, &Raw::data(1002, 1000, FLAG_FIRST, 6, b"abc"));
        r.feed(BASE, &Raw::data(1003, 1000, FLAG_FIRST | FLAG_LAST, 1, b"z"));
        assert_eq!(r.ep.stats().drops.count(Malformed), 5);
        r.feed(BASE, &Raw::data(1003, 1000, 0, 0, b"defg"));
        assert_eq!(r.ep.stats().drops.count(Malformed), 6, "beyond its total");
        r.feed(BASE, &Raw::data(1003, 1000, FLAG_LAST, 0, b"def"));
        assert_eq!(r.got.len(), 3);
        assert_eq!(r.got[2].2, b"abcdef");
    }

    #[test]
    fn a_lost_ack_is_answered_on_the_duplicate() {
        let mut r = Raw::new(8, 0);
        let d = Raw::data(0, 0, FLAG_PING, 0, b"");
        let out = r.feed(BASE, &d);
        assert_eq!(out.len(), 1, "a probe is acknowledged at once");
        assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 1));
        let out = r.feed(BASE, &d);
        assert_eq!((out[0].kind, out[0].ack), (Kind::Ack, 1));
        assert_eq!(r.ep.stats().duplicates, 1);
        assert!(r.got.is_empty());
    }

    #[test]
    fn peer_state_is_small_and_fixed() {
        assert!(std::mem::size_of::<Peer<std::net::SocketAddr>>() < 320);
    }

    #[test]
    fn memory_per_peer_does_not_depend_on_the_number_of_peers() {
        // Message traffic to every peer, then quiet: the state left is one box a peer.
        for n in [3u32, 17] {
            let net = net(10);
            let cfg = small(4, 0);
            let mut eps: Vec<_> = (0..n).map(|r| endpoint(&net, r, n, cfg.clone())).collect();
            let plan: Vec<Vec<_>> = (0..n)
                .map(|s| {
                    (0..n)
                        .filter(|&d| d != s)
                        .map(|d| (d, [0, 0], bytes(u64::from(d), 500)))
                        .collect()
                })
                .collect();
            let got = run(&net, &mut eps, &plan, 10);
            check(&plan, &got);
            for ep in &mut eps {
                ep.poll(&mut |_, _, _| {}).unwrap();
                assert_eq!(ep.peers.iter().flatten().count() as u32, n - 1);
                assert!(ep.busy.is_empty());
                for p in ep.peers.iter().flatten() {
                    assert_eq!(p.queue.capacity() + p.held.capacity(), 0);
                    assert!(p.reasm.is_none());
                }
            }
        }
    }
}
