//! What an arriving datagram means for a peer: its acknowledgement and sequence number
//! classified, its framing checked, and an in-order segment taken.

use super::config::Tuned;
use super::peer::{Peer, Reasm, Standing};
use super::wire::{FLAG_BYE, FLAG_FIRST, FLAG_LAST, FLAG_PING, FLAGS_CONTROL, Header, Kind, Start};
use crate::{DropReason, Envelope};

/// How an acknowledgement number relates to what we sent.
pub(super) enum AckClass {
    /// It acknowledges this many more segments (maybe 0).
    Progress(u32),
    /// Older than one we already took: it was overtaken.
    Stale,
    /// Beyond anything sent.
    Bogus,
}

pub(super) fn classify_ack<A>(p: &Peer<A>, ack: u32) -> AckClass {
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
pub(super) enum SeqClass {
    InOrder,
    Ahead,
    Duplicate,
    Outside,
}

pub(super) fn classify_seq(expected: u32, seq: u32, window: u32) -> SeqClass {
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
pub(super) fn framing(reasm: Option<&Reasm>, flags: u8, count: usize) -> Result<(), DropReason> {
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
pub(super) struct Verdict {
    /// Segments of ours it acknowledges; `None`: its ACK was overtaken.
    pub(super) acked: Option<u32>,
    /// NACK: segments to resend from the front of the queue.
    pub(super) resend: usize,
    /// DATA: where its segment falls.
    pub(super) class: SeqClass,
}

/// Checks a decoded datagram against `p`'s state without changing anything.
pub(super) fn verdict<A: Copy>(p: &Peer<A>, h: &Header, t: &Tuned) -> Result<Verdict, (DropReason, String)> {
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
pub(super) fn take_segment<A: Copy>(
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
