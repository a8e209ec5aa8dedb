//! A blocked receive that matches packets as they arrive, before they are queued.

use super::dispatch;
use crate::channel::{Header, Land, Packet, PacketSink};
use crate::p2p::engine::Engine;
use crate::p2p::matching::Body;
use crate::p2p::wire::{self, EAGER, MDATA, MEDIUM, RTS, Rts};
use crate::progress::Others;

/// What a [`Fresh`] receive found: the sender's world rank, the tag and the length.
#[derive(Debug)]
pub(super) enum Found {
    /// An eager message, copied into the buffer.
    Eager { src: u32, tag: i32, len: usize },
    /// An RTS (boxed, so the eager case stays small).
    Rts { src: u32, tag: i32, rts: Box<Rts> },
}

/// A blocked receive from a named source looks at that source's fastbox alone, and at
/// everything on every this many rounds.
pub(super) const FULL_POLL_EVERY: u32 = 8;

/// Matches any source in a [`Fresh`] receive; world ranks are below it.
pub(super) const FRESH_ANY_SRC: u32 = u32::MAX;
/// Matches any tag in a [`Fresh`] receive; tags are not negative.
pub(super) const FRESH_ANY_TAG: i32 = -1;

/// A medium message that a [`Fresh`] receive is taking: its packets from `src` go
/// straight into the receive's buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Arriving {
    pub(super) src: u32,
    pub(super) tag: i32,
    pub(super) total: usize,
    pub(super) got: usize,
    /// Whether the bytes come through the pair buffer rather than MDATA packets.
    pub(super) paired: bool,
}

impl Arriving {
    /// The whole message, found.
    pub(super) fn found(&self) -> Found {
        Found::Eager {
            src: self.src,
            tag: self.tag,
            len: self.total,
        }
    }
}

/// A [`Fresh`] receive polling: every packet goes to [`Fresh::offer`], and a long one
/// from a stream transport may be written straight into its buffer ([`Fresh::land`]).
pub(super) struct FreshSink<'a, 'b, 'o> {
    pub(super) f: &'a mut Fresh<'b>,
    pub(super) eng: &'a mut Engine,
    pub(super) others: &'a mut Others<'o>,
}

impl PacketSink for FreshSink<'_, '_, '_> {
    #[inline(always)]
    fn packet(&mut self, p: Packet<'_>) {
        self.f.offer(self.eng, self.others, p);
    }
    fn arriving(&mut self, src: u32, header: &Header, len: usize, land: &mut dyn Land) -> bool {
        self.f.land(self.eng, src, header, len, land)
    }
    #[inline(always)]
    fn lands(&self) -> bool {
        true
    }
}

/// A blocking `recv` with nothing else posted, offered each fresh packet first.
pub(super) struct Fresh<'b> {
    pub(super) ctx: u32,
    pub(super) src: u32,
    pub(super) tag: i32,
    pub(super) buf: &'b mut [u8],
    pub(super) found: Option<Found>,
    pub(super) arriving: Option<Arriving>,
}

impl Fresh<'_> {
    /// Whether a message of `h` from `src` is one this receive selects, and it has none
    /// yet.
    #[inline(always)]
    fn waits_for(&self, src: u32, h: &Header) -> bool {
        self.found.is_none()
            && self.arriving.is_none()
            && h.context == self.ctx
            && (self.src == FRESH_ANY_SRC || self.src == src)
            && (self.tag == FRESH_ANY_TAG || self.tag == h.tag)
    }

    /// Finds the medium message under way once all of it is in the buffer.
    #[inline(always)]
    fn take_whole(&mut self) {
        if let Some(a) = self.arriving
            && a.got == a.total
        {
            self.found = Some(a.found());
            self.arriving = None;
        }
    }

    /// Has an eager message that is still arriving written straight into the buffer if
    /// it is the first that matches and fits; says whether it was. Only for a receive
    /// that names the source: a landing that gives up has written part of the buffer,
    /// and no other message than this one may then complete the receive.
    #[cold]
    fn land(&mut self, eng: &Engine, src: u32, h: &Header, len: usize, land: &mut dyn Land) -> bool {
        let mine = h.kind == EAGER
            && self.src == src
            && len <= self.buf.len()
            && !eng.medium.interrupted_by(src)
            && self.waits_for(src, h);
        if !mine || !land.land(&mut self.buf[..len]) {
            return false;
        }
        self.found = Some(Found::Eager { src, tag: h.tag, len });
        true
    }

    /// Takes `p` if it is the first that matches; hands anything else on. The medium
    /// protocol's rarer steps are functions that are given fields, never `self`, so that
    /// the receive's state stays in registers on the eager path.
    #[inline(always)]
    pub(super) fn offer(&mut self, eng: &mut Engine, others: &mut Others<'_>, p: Packet<'_>) {
        let h = p.header;
        if let Some(a) = self.arriving
            && a.src == p.src
        {
            if a.paired {
                self.arriving = None;
                self.found = paired_interrupted(eng, others, a, &mut *self.buf, self.ctx, p);
                return;
            }
            self.arriving = medium_next(eng, a, &mut *self.buf, p);
            self.take_whole();
            return;
        }
        // A message the engine is taking from this source through the pair buffer comes
        // before this packet: the engine finishes it first.
        let behind = eng.medium.interrupted_by(p.src);
        if !behind && (h.kind == EAGER || h.kind == RTS || h.kind == MEDIUM) && self.waits_for(p.src, &h) {
            if h.kind == EAGER {
                let n = p.payload.len().min(self.buf.len());
                nemesis_shm::region::copy_into(&mut self.buf[..n], &p.payload[..n]);
                self.found = Some(Found::Eager {
                    src: p.src,
                    tag: h.tag,
                    len: p.payload.len(),
                });
            } else if h.kind == MEDIUM {
                self.arriving = medium_first(eng, &mut *self.buf, p);
                self.take_whole();
            } else if let Some(rts) = eng.parse_rts(p.src, h.aux, p.payload) {
                self.found = Some(Found::Rts {
                    src: p.src,
                    tag: h.tag,
                    rts: Box::new(rts),
                });
            }
            return;
        }
        let late = (h.kind == MDATA || behind) && self.found.is_none() && self.arriving.is_none();
        dispatch(eng, others, p);
        if late {
            let src = (self.src != FRESH_ANY_SRC).then_some(self.src);
            let tag = (self.tag != FRESH_ANY_TAG).then_some(self.tag);
            if let Some(found) = take_late(eng, self.ctx, src, tag, &mut *self.buf) {
                self.found = Some(found);
            }
        }
    }
}

/// A packet came from the source of the message `a` that a blocking receive into `buf`
/// takes through the pair buffer: the message was written whole before the packet was
/// sent, so it is taken now (and returned, found), and the packet goes on as any other.
/// Given fields, not the receive, so that the receive's state stays in registers.
#[cold]
#[inline(never)]
pub(super) fn paired_interrupted(
    eng: &mut Engine,
    others: &mut Others<'_>,
    mut a: Arriving,
    buf: &mut [u8],
    ctx: u32,
    p: Packet<'_>,
) -> Option<Found> {
    let found = if pull_fresh(eng, &mut a, buf) {
        Some(a.found())
    } else {
        eng.discard_medium(a.src, ctx, a.tag, a.total, a.got, true);
        eng.fault(p.src, super::super::medium::PAIRED_BROKEN_OFF);
        None
    };
    dispatch(eng, others, p);
    found
}

/// Copies what the pair buffer holds of the message `a` that a blocking receive into
/// `buf` takes, and frees the buffer once the message is whole; says whether it is.
pub(super) fn pull_fresh(eng: &Engine, a: &mut Arriving, buf: &mut [u8]) -> bool {
    let Some(pb) = eng.pairs.as_ref().and_then(|p| p.with(a.src)) else {
        return false;
    };
    let mut at = a.got;
    // SAFETY: the peer held the buffer when it announced the message (checked then) and
    // keeps it until we free it; `a.got` is what the last drain returned.
    a.got = unsafe {
        pb.drain(a.got, a.total, |s| {
            if at < buf.len() {
                let n = s.len().min(buf.len() - at);
                nemesis_shm::region::copy_into(&mut buf[at..at + n], &s[..n]);
            }
            at += s.len();
        })
    };
    a.got == a.total
}

/// After the engine took the last packet of a medium message it had gathered aside:
/// if that message waits unexpected and selects a blocking receive of (`ctx`, `src`,
/// `tag`), it is that receive's, for nothing that selected it was waiting when the
/// receive began. Eager bytes are copied into `buf`.
#[cold]
#[inline(never)]
pub(super) fn take_late(
    eng: &mut Engine,
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
    buf: &mut [u8],
) -> Option<Found> {
    let u = eng.matching.take_unexpected(ctx, src, tag)?;
    Some(match u.body {
        Body::Eager(data) => {
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            Found::Eager {
                src: u.src,
                tag: u.tag,
                len: data.len(),
            }
        }
        Body::Rts(rts) => Found::Rts {
            src: u.src,
            tag: u.tag,
            rts: Box::new(rts),
        },
    })
}

/// The first packet of a medium message for a blocking receive into `buf`: its bytes
/// copied, and what is still to come; `None` (and a fault) if it is malformed.
#[cold]
#[inline(never)]
pub(super) fn medium_first(eng: &mut Engine, buf: &mut [u8], p: Packet<'_>) -> Option<Arriving> {
    let total = p.header.aux as usize;
    if let Err(what) = eng.medium.check_first(p.src, total, p.payload.len()) {
        eng.fault(p.src, what);
        return None;
    }
    let paired = p.header.flags & wire::PAIRED != 0;
    if paired && let Err(what) = eng.check_paired(p.src, total, p.payload.len()) {
        eng.fault(p.src, what);
        return None;
    }
    let n = p.payload.len().min(buf.len());
    nemesis_shm::region::copy_into(&mut buf[..n], &p.payload[..n]);
    let mut a = Arriving {
        src: p.src,
        tag: p.header.tag,
        total,
        got: p.payload.len(),
        paired,
    };
    if paired {
        eng.medium.paired_taken += 1;
        pull_fresh(eng, &mut a, buf);
    }
    Some(a)
}

/// The next packet from the source of the medium message `a` that a blocking receive
/// into `buf` is taking: its next bytes, copied, and what is still to come. `None` (and
/// a fault) if it is anything but the message's next MDATA: the rest can no longer be
/// told apart.
#[inline(never)]
pub(super) fn medium_next(
    eng: &mut Engine,
    mut a: Arriving,
    buf: &mut [u8],
    p: Packet<'_>,
) -> Option<Arriving> {
    if p.header.kind != MDATA || a.got + p.payload.len() > a.total {
        eng.fault(p.src, "a medium message broken off or overrun");
        return None;
    }
    let at = a.got;
    a.got += p.payload.len();
    if at < buf.len() {
        let n = p.payload.len().min(buf.len() - at);
        nemesis_shm::region::copy_into(&mut buf[at..at + n], &p.payload[..n]);
    }
    Some(a)
}
