//! One connection: where it is in its life, what it has read and not yet used, and the
//! queue of bytes owed to its peer.

use super::frame::{FRAME_HEADER_LEN, Frame, FrameKind, decode_frame, describe_bad_frame, u32_at};
use super::handshake::{Challenge, Hello};
use super::{INITIAL_INPUT, READ_BUDGET};
use crate::{DropReason, Envelope};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

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
    pub(super) fn push(&mut self, head: &[u8], rest: &[&[u8]], mut skip: usize, packet: bool) {
        for part in std::iter::once(head).chain(rest.iter().copied()) {
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
}

impl Conn {
    pub(super) fn who(&self) -> String {
        self.addr.map_or_else(|| "a connection".into(), |a| a.to_string())
    }

    /// Reads once into the free part of the input buffer; 0 is the end of the stream.
    /// Also says whether the read filled that part, so that more may be waiting.
    pub(super) fn fill(&mut self) -> io::Result<(usize, bool)> {
        let Some(room) = self.input.get_mut(self.end..).filter(|r| !r.is_empty()) else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let want = room.len();
        let n = (&self.stream).read(room)?;
        self.end += n;
        Ok((n, n == want))
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

/// Reads what `c` has, up to the read budget, and hands every whole packet to
/// `sink` in place.
pub(super) fn read_frames(
    c: &mut Conn,
    max_payload: usize,
    sink: &mut dyn FnMut(&Envelope, &[u8]),
) -> Inbound {
    let mut budget = READ_BUDGET;
    // A read that did not fill the buffer took everything the socket had: asking again
    // would only cost a system call to hear "would block". Epoll reports what comes next.
    let mut drained = false;
    loop {
        loop {
            let avail = c.input.get(c.start..c.end).unwrap_or(&[]);
            match decode_frame(avail, max_payload) {
                Frame::NeedMore => break,
                Frame::Packet {
                    kind,
                    env,
                    payload,
                    len_total,
                } => {
                    c.start += len_total;
                    if kind == FrameKind::Goodbye {
                        return Inbound::Goodbye;
                    }
                    sink(&env, avail.get(payload).unwrap_or(&[]));
                }
                Frame::Bad(r) => return Inbound::Bad(r, describe_bad_frame(avail, max_payload)),
            }
        }
        if c.start == c.end {
            c.start = 0;
            c.end = 0;
        }
        // Room for the whole of the frame that has begun, from the front of the buffer.
        let need = match u32_at(c.input.get(c.start..c.end).unwrap_or(&[]), 0) {
            Some(len) => FRAME_HEADER_LEN + len as usize,
            None => FRAME_HEADER_LEN,
        };
        if c.input.len() - c.start < need || c.end == c.input.len() {
            c.input.copy_within(c.start..c.end, 0);
            c.end -= c.start;
            c.start = 0;
            if c.input.len() < need {
                c.input.resize(need, 0);
            }
        }
        if budget == 0 || drained {
            return Inbound::Drained;
        }
        match c.fill() {
            Ok((0, _)) => {
                return Inbound::Eof {
                    partial: c.end > c.start,
                };
            }
            Ok((n, full)) => {
                budget = budget.saturating_sub(n);
                drained = !full;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Inbound::Drained,
            Err(e) => return Inbound::Error(e),
        }
    }
}
