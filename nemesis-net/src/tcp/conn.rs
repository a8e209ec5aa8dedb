//! One connection: where it is in its life, what it has read and not yet used, and the
//! queue of bytes owed to its peer.

use super::frame::{
    FRAME_ALIGN, FRAME_HEADER_LEN, Frame, FrameHead, FrameKind, decode_frame, decode_header,
    describe_bad_frame,
};
use super::handshake::{Challenge, Hello};
use super::{INITIAL_INPUT, READ_BUDGET};
use crate::{DropReason, Land, Sink};
use std::collections::VecDeque;
use std::io::{self, IoSliceMut, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Bytes waiting to be written to one peer, with the packet boundaries in them so that
/// the backlog counts packets.
#[derive(Debug, Default)]
pub(super) struct OutQueue {
    pub(super) buf: Vec<u8>,
    /// `buf[head..]` is still to be written.
    pub(super) head: usize,
    /// Bytes ever appended and ever written: positions in the peer's byte stream.
    pub(super) appended: u64,
    pub(super) removed: u64,
    /// Where each queued packet ends, in those positions.
    pub(super) ends: VecDeque<u64>,
}

impl OutQueue {
    pub(super) fn bytes(&self) -> usize {
        self.buf.len().saturating_sub(self.head)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes() == 0
    }

    pub(super) fn pending(&self) -> &[u8] {
        self.buf.get(self.head..).unwrap_or(&[])
    }

    /// Appends `head` and `rest` but their first `skip` bytes, the end of one packet when
    /// `packet`.
    pub(super) fn push(&mut self, head: &[u8], rest: &[&[u8]], tail: &[u8], mut skip: usize, packet: bool) {
        for part in std::iter::once(head)
            .chain(rest.iter().copied())
            .chain(std::iter::once(tail))
        {
            if let Some(tail) = part.get(skip..) {
                self.buf.extend_from_slice(tail);
                self.appended += tail.len() as u64;
                skip = 0;
            } else {
                skip -= part.len();
            }
        }
        if packet {
            self.ends.push_back(self.appended);
        }
    }

    /// Notes that `n` bytes were written; returns how many packets are now wholly out.
    pub(super) fn consume(&mut self, n: usize) -> usize {
        self.head = (self.head + n).min(self.buf.len());
        self.removed += n as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if self.head >= INITIAL_INPUT && self.head * 2 >= self.buf.len() {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        let mut done = 0;
        while self.ends.front().is_some_and(|&e| e <= self.removed) {
            self.ends.pop_front();
            done += 1;
        }
        done
    }

    /// Forgets everything; returns how many packets were not wholly written.
    pub(super) fn clear(&mut self) -> usize {
        let n = self.ends.len();
        self.removed = self.appended;
        self.buf = Vec::new();
        self.head = 0;
        self.ends.clear();
        n
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Ours, connect in progress.
    Connecting,
    /// Ours, connected, waiting for the acceptor's challenge.
    AwaitChallenge,
    /// Ours, hello sent, waiting for the reply.
    AwaitReply,
    /// Accepted by our listener, challenge sent, waiting for the hello.
    AwaitHello,
    /// Carrying frames.
    Up,
}

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    /// The other end, for messages.
    pub(super) addr: Option<SocketAddr>,
    /// The peer: known from the start for ours, from the hello for accepted ones.
    pub(super) peer: Option<u32>,
    pub(super) state: State,
    /// `input[start..end]` has been read and not yet used.
    pub(super) input: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Our challenge, hello or reply, still to be written before anything else.
    pub(super) hs_out: Vec<u8>,
    /// The challenge of this connection: ours when we accepted it, theirs when we dialed.
    pub(super) challenge: Option<Challenge>,
    /// The hello we sent, which the acceptor's reply must answer.
    pub(super) hello: Option<Hello>,
    /// When the handshake must be over.
    pub(super) deadline: Option<Instant>,
    /// The events registered with epoll.
    pub(super) events: u32,
    /// A write failed: the connection is going, and reading it will say how.
    pub(super) broken: bool,
    /// The last packet read was long enough to land: so may the next be.
    pub(super) long_last: bool,
    /// Padding that ends the last frame landed, still to be read and dropped.
    pub(super) skip: usize,
}

impl Conn {
    pub(super) fn who(&self) -> String {
        self.addr.map_or_else(|| "a connection".into(), |a| a.to_string())
    }

    /// Reads once into the free part of the input buffer, at most `most` bytes; 0 is the
    /// end of the stream.
    /// Also says whether the read filled that part, so that more may be waiting.
    pub(super) fn fill(&mut self, most: usize) -> io::Result<(usize, bool)> {
        let Some(room) = self.input.get_mut(self.end..).filter(|r| !r.is_empty()) else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let want = most.min(room.len());
        let n = (&self.stream).read(&mut room[..want])?;
        self.end += n;
        Ok((n, n == want))
    }

    /// The first index from `from` in the input buffer at whose address a byte that lies
    /// `phase` bytes past a multiple of [`FRAME_ALIGN`] in the sender's frames lies as far
    /// past one: reads there copy at the kernel's full speed (see `frame.rs`).
    pub(super) fn aligned_from(&self, from: usize, phase: usize) -> usize {
        from + phase.wrapping_sub(self.input.as_ptr() as usize + from) % FRAME_ALIGN
    }
}

/// What reading an established connection came to.
pub(super) enum Inbound {
    /// Everything readable for now was read and handed up.
    Drained,
    /// The peer said goodbye.
    Goodbye,
    /// The stream ended; `partial` when in the middle of a frame.
    Eof { partial: bool },
    /// The stream failed.
    Error(io::Error),
    /// A frame that cannot be trusted.
    Bad(DropReason, String),
}

/// Reads what `c` has, up to the read budget, and hands every whole packet from `rank` to
/// `sink` in place; a packet longer than [`LAND_MIN`] is first offered to a sink that
/// [lands](Sink::lands) while its payload arrives. Also counts the packets handed up and,
/// of those, the ones landed.
pub(super) fn read_frames(
    c: &mut Conn,
    max_payload: usize,
    rank: u32,
    sink: &mut dyn Sink,
) -> (Inbound, Handed) {
    let mut budget = READ_BUDGET;
    let mut handed = Handed::default();
    let lands = sink.lands();
    // A read that did not fill the buffer took everything the socket had: asking again
    // would only cost a system call to hear "would block". Epoll reports what comes next.
    let mut drained = false;
    loop {
        loop {
            if c.skip > 0 {
                let n = c.skip.min(c.end - c.start);
                c.start += n;
                c.skip -= n;
                if c.skip > 0 {
                    break;
                }
            }
            let avail = c.input.get(c.start..c.end).unwrap_or(&[]);
            match decode_frame(avail, max_payload) {
                Frame::NeedMore => {
                    let Some(head) = lands.then(|| arriving_packet(avail, max_payload)).flatten() else {
                        break;
                    };
                    c.long_last = true;
                    let mut land = ConnLand {
                        c: &mut *c,
                        head,
                        failed: None,
                    };
                    if sink.arriving(rank, &head.env, head.len, &mut land) {
                        handed.packets += 1;
                        handed.landed += 1;
                        continue;
                    }
                    if let Some(failed) = land.failed {
                        return (failed, handed);
                    }
                    break;
                }
                Frame::Packet {
                    kind,
                    env,
                    payload,
                    len_total,
                } => {
                    c.start += len_total;
                    c.long_last = payload.len() > LAND_MIN;
                    if kind == FrameKind::Goodbye {
                        return (Inbound::Goodbye, handed);
                    }
                    handed.packets += 1;
                    sink.packet(rank, &env, avail.get(payload).unwrap_or(&[]));
                }
                Frame::Bad(r) => return (Inbound::Bad(r, describe_bad_frame(avail, max_payload)), handed),
            }
        }
        // What is left begins a frame, or is the padding that ends one: its place in the
        // frame, modulo FRAME_ALIGN, is where the kernel holds it within its page.
        let phase = (FRAME_ALIGN - c.skip % FRAME_ALIGN) % FRAME_ALIGN;
        if c.start == c.end {
            c.start = c.aligned_from(0, phase);
            c.end = c.start;
        }
        // Room for the whole of the frame that has begun, from the front of the buffer.
        let need = match decode_header(c.input.get(c.start..c.end).unwrap_or(&[]), max_payload) {
            Ok(Some(h)) => h.total(),
            _ => FRAME_HEADER_LEN,
        };
        if c.input.len() - c.start < need || c.end == c.input.len() {
            if c.input.len() < need + FRAME_ALIGN {
                c.input.resize(need + FRAME_ALIGN, 0);
            }
            let to = c.aligned_from(0, phase);
            c.input.copy_within(c.start..c.end, to);
            c.end = to + (c.end - c.start);
            c.start = to;
        }
        if budget == 0 || drained {
            return (Inbound::Drained, handed);
        }
        // Before a frame's header is read, a sink that lands long packets has only the
        // first bytes read here after a long one, so that the rest of another long one
        // can go straight to it.
        let most = if lands && c.long_last && c.end - c.start < FRAME_HEADER_LEN {
            LAND_FIRST
        } else {
            usize::MAX
        };
        match c.fill(most) {
            Ok((0, _)) => {
                return (
                    Inbound::Eof {
                        partial: c.end > c.start || c.skip > 0,
                    },
                    handed,
                );
            }
            Ok((n, full)) => {
                budget = budget.saturating_sub(n);
                drained = !full;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (Inbound::Drained, handed),
            Err(e) => return (Inbound::Error(e), handed),
        }
    }
}

/// What [`read_frames`] handed up.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Handed {
    pub(super) packets: usize,
    pub(super) landed: usize,
}

/// Packets with more payload than this are offered to a landing sink while they arrive.
/// Landing saves a copy of the payload and costs a read: measured over loopback, 64 and
/// 128 KiB ping-pongs gained 8–15 %, 32 KiB nothing, and 16 KiB lost 5 %.
pub(super) const LAND_MIN: usize = 16 << 10;

/// After a packet that long, a landing sink has at most this much read before the next
/// header: the rest of a long packet then comes straight into its buffer, and a short
/// one still comes whole.
const LAND_FIRST: usize = 4 << 10;

/// How long a landing waits for the rest of a payload without a byte coming before it
/// gives up, leaving the packet to come the usual way.
const LAND_PATIENCE: Duration = Duration::from_micros(200);

/// The header of the packet that begins `avail`, whose padding before the payload has
/// come but not all of the payload, if it is long enough to land.
fn arriving_packet(avail: &[u8], max_payload: usize) -> Option<FrameHead> {
    match decode_header(avail, max_payload) {
        Ok(Some(h))
            if h.kind == FrameKind::Packet
                && h.len > LAND_MIN
                && (h.payload_at()..h.payload_at() + h.len).contains(&avail.len()) =>
        {
            Some(h)
        }
        _ => None,
    }
}

/// The rest of the frame at the front of a connection's input, for a [`Sink`].
struct ConnLand<'c> {
    c: &'c mut Conn,
    head: FrameHead,
    /// How the connection failed while landing.
    failed: Option<Inbound>,
}

impl Land for ConnLand<'_> {
    fn land(&mut self, buf: &mut [u8]) -> bool {
        let len = self.head.len;
        if buf.len() != len || self.failed.is_some() {
            return false;
        }
        let c = &mut *self.c;
        let at = c.start + self.head.payload_at();
        let had = c.end - at;
        buf[..had].copy_from_slice(&c.input[at..c.end]);
        let mut got = had;
        // What the reads bring past the packet goes behind it in the input buffer, at most
        // a header's worth and a little: a stream of long packets then costs a read each,
        // and the next one's payload still lands.
        // They go where their place in the frame puts them, as `read_frames` keeps them.
        let behind_at = Some(c.aligned_from(c.end, self.head.payload_at() + len))
            .filter(|&at| at <= c.input.len())
            .unwrap_or(c.end);
        let spare = c.input.len().saturating_sub(behind_at).min(LAND_FIRST);
        let mut past = 0;
        let mut last = Instant::now();
        let mut tries = 0u32;
        while got < len {
            let (rest, behind) = (&mut buf[got..], &mut c.input[behind_at..behind_at + spare]);
            match (&c.stream).read_vectored(&mut [IoSliceMut::new(rest), IoSliceMut::new(behind)]) {
                Ok(0) => {
                    self.failed = Some(Inbound::Eof { partial: true });
                    break;
                }
                Ok(n) => {
                    past = n.saturating_sub(len - got);
                    got = (got + n).min(len);
                    tries = 0;
                    last = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tries += 1;
                    if tries % 16 == 0 && last.elapsed() > LAND_PATIENCE {
                        break;
                    }
                    core::hint::spin_loop();
                }
                Err(e) => {
                    self.failed = Some(Inbound::Error(e));
                    break;
                }
            }
        }
        if got == len {
            c.start = behind_at;
            c.end = behind_at + past;
            c.skip = self.head.trail;
            return true;
        }
        // Not all of it came: what did is kept for the usual way, behind what was there.
        let more = got - had;
        if c.input.len() < c.end + more {
            c.input.resize(c.end + more, 0);
        }
        c.input[c.end..c.end + more].copy_from_slice(&buf[had..got]);
        c.end += more;
        false
    }
}
