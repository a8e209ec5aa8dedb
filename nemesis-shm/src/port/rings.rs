//! The rings of fastboxes between a pair of local processes: where each side stands in
//! the ring it writes and the one it reads ([`Rings`]), and the protocol that moves them:
//! a message into the next boxes, laps for short messages, and the receiver's takes,
//! acknowledgements and read-ahead. The port owns a [`Rings`] per peer and sends and
//! polls through the functions here.

use super::{Peer, wake_peer};
use crate::region::{Envelope, FboxAccess, Region};
use crate::sync::Ordering;
use crate::variant::Variant;
use crate::wake::Wake;
use std::sync::Arc;

/// How many fastbox messages from one peer one poll hands up at most.
const FBOX_RUN: usize = 64;
/// Set in a box's sequence word beside the number of the message due: no message, the
/// sender went on at the start of the ring's next lap (see [`short_past_lap`]).
const LAP_MARK: u64 = 1 << 63;

/// Where we are in the ring of fastboxes we write to a peer and the one it writes to us.
pub(super) struct Rings<R: Region> {
    out: R::FboxKey,
    inn: R::FboxKey,
    /// Boxes of `out` that we have filled.
    sent: u64,
    /// The count of `out` up to which its boxes are ours: the peer's acknowledgement as
    /// we last read it, plus the ring's boxes. The sender reads the word again only when
    /// a message would go past this; kept as the sum so each check is one comparison.
    room_end: u64,
    /// Boxes of `inn` that we have consumed.
    taken: u64,
    /// The box of `out` we fill next, and the box of `inn` we look at next, kept so that
    /// a poll is one load from the book and one from the box.
    out_next: R::BoxKey,
    in_next: R::BoxKey,
    /// We have sent to the peer by fastbox since we last took a message from it, by
    /// fastbox or cell: a stream rather than a ping-pong, which decides how much of the
    /// next box a send prepares.
    streaming: bool,
    /// We have sent the peer a message longer than one box since we last took one from
    /// it: a stream of long messages (see [`Port::streams_to`]). Beside `streaming`, so
    /// a receive clears both with one store.
    streaming_long: bool,
    /// The count of `out` from which a message of one box goes past its lap's first
    /// [`Region::fbox_lap`] boxes ([`short_past_lap`]); never when the lap is the ring.
    lap_end: u64,
    /// A receiver behind its sender reads ahead in `inn` ([`fetch_ahead`]); looked at
    /// only then, here rather than in the book so that the one-message poll does not
    /// carry it.
    read_ahead: bool,
    /// Boxes per ring: read only off the one-box paths (a full ring, a lap's end), so
    /// kept here rather than passed down every call.
    slots: u64,
}

impl<R: Region> Rings<R> {
    pub(super) fn new(region: &R, me: u32, peer: u32) -> Self {
        let (out, inn) = (region.fbox_key(me, peer), region.fbox_key(peer, me));
        // SAFETY: keys just made by this region.
        let (out_next, in_next) = unsafe { (region.box_key(out, 0), region.box_key(inn, 0)) };
        let slots = u64::from(region.fbox_slots());
        Self {
            out,
            inn,
            sent: 0,
            room_end: slots,
            taken: 0,
            out_next,
            in_next,
            streaming: false,
            streaming_long: false,
            lap_end: if u64::from(region.fbox_lap()) < slots {
                u64::from(region.fbox_lap())
            } else {
                u64::MAX
            },
            read_ahead: crate::config::default_read_ahead(),
            slots,
        }
    }

    /// Whether we have sent the peer anything by fastbox since we last took a message
    /// from it (see [`super::Port::sent_since_taken`]).
    #[inline]
    pub(super) fn sent_since_taken(&self) -> bool {
        self.streaming
    }

    /// Whether we have sent the peer a message longer than one box since we last took
    /// one from it (see [`super::Port::streams_to`]).
    #[inline]
    pub(super) fn streams_long(&self) -> bool {
        self.streaming_long
    }

    /// A message longer than one box is on its way to the peer.
    pub(super) fn sending_long(&mut self) {
        self.streaming_long = true;
    }

    /// We took a message from the peer, by box or cell: an exchange rather than a stream.
    #[inline(always)]
    pub(super) fn took_one(&mut self) {
        self.streaming = false;
        self.streaming_long = false;
    }

    /// Whether a receiver behind its sender reads ahead ([`fetch_ahead`]).
    pub(super) fn set_read_ahead(&mut self, on: bool) {
        self.read_ahead = on;
    }

    /// Boxes of the ring we write that we have filled: only tests ask.
    #[cfg(test)]
    pub(super) fn sent(&self) -> u64 {
        self.sent
    }

    /// Boxes of the ring we read that we have consumed: only tests ask.
    #[cfg(test)]
    pub(super) fn taken(&self) -> u64 {
        self.taken
    }
}

/// Puts a message into the next `span` boxes of our ring to `peer` (which has boxes) if
/// they are free; returns whether it did.
#[inline(always)]
pub(super) fn put_fbox<R: Region, V: Variant>(
    region: &R,
    wake: &Option<Arc<dyn Wake>>,
    peer: &mut Peer<R>,
    span: u64,
    env: &Envelope,
    payload: &[&[u8]],
    len: usize,
) -> bool {
    let Some(r) = &mut peer.boxes else {
        return false;
    };
    let mut seq = peer.send_seq;
    let mut sent = r.sent;
    if span == 1 && sent >= r.lap_end {
        let Some(marks) = short_past_lap::<R, V>(region, r, seq) else {
            return false;
        };
        seq += marks;
        peer.send_seq = seq;
        sent = r.sent;
    }
    if !room_for(region, r, sent, span) {
        return false;
    }
    // SAFETY: a key of this region.
    let out = unsafe { region.fbox_at(r.out_next) };
    // SAFETY: we are this ring's only sender; the receiver has consumed the messages
    // these `span` boxes held last (its acknowledgement, acquired above or earlier,
    // counts past them); `span` is the span of `len`.
    unsafe { out.write(env, payload, len) };
    out.seq().store(seq, V::FBOX_PUBLISH);
    r.sent = sent + span;
    // SAFETY: a key of this region.
    r.out_next = unsafe { region.box_key(r.out, sent + span) };
    if sent + span < r.room_end {
        // The next box is ours (by the acknowledgement we hold): take the lines a
        // message like this one would write, while the caller goes on. Not the line of
        // its sequence word when we took a message from the peer since our last send:
        // that looks like a ping-pong, whose receiver reads that word right after this
        // message, and would wait for it to come back.
        // SAFETY: a key of this region.
        unsafe { region.fbox_at(r.out_next) }.prepare(len, !r.streaming);
    }
    r.streaming = true;
    peer.send_seq = seq + 1;
    // SAFETY: a key of this region.
    if unsafe { region.doorbell_of(peer.slot) }.ring() && V::WAKE_WATCHERS {
        wake_peer(wake, peer.index);
    }
    true
}

/// [`put_fbox`] for a message longer than one box holds and no longer than a cell's
/// payload.
#[inline(always)]
pub(super) fn put_fbox_span<R: Region, V: Variant>(
    region: &R,
    wake: &Option<Arc<dyn Wake>>,
    peer: &mut Peer<R>,
    env: &Envelope,
    payload: &[&[u8]],
    len: usize,
) -> bool {
    match region.fbox_span(len) {
        0 => false,
        span => put_fbox::<R, V>(region, wake, peer, span, env, payload, len),
    }
}

/// Whether the `span` boxes of ring `r` from count `sent` are ours, by the
/// acknowledgement we hold or, when that says the ring is full, by the receiver's
/// word read again.
#[inline(always)]
fn room_for<R: Region>(region: &R, r: &mut Rings<R>, sent: u64, span: u64) -> bool {
    if sent + span > r.room_end {
        // SAFETY: every key in the book was made by `region`.
        r.room_end = unsafe { region.fbox_ack_of(r.out) }.load(Ordering::Acquire) + r.slots;
        if sent + span > r.room_end {
            return false;
        }
    }
    true
}

/// The count at which the lap after the one of `count` starts, in a ring of `slots`.
#[inline(always)]
fn next_lap(count: u64, slots: u64) -> u64 {
    (count | (slots - 1)) + 1
}

/// A message of one box at `r.sent`, which has reached `r.lap_end`: past the first
/// [`Region::fbox_lap`] boxes of its lap, the sender marks the next box as the lap's end
/// and moves the ring on to the start of the next lap, so that a stream of short
/// messages goes round the first boxes of the ring only, whose lines stay in the
/// caches, and the rest is for messages of many boxes. The mark takes number `seq`, so
/// the receiver meets it in order; it carries nothing to read. Where messages of many
/// boxes have already carried the ring into a new lap, only the lap's end moves.
/// Returns how many numbers the marks took (0 or 1), or `None`, having done nothing,
/// when the box for the mark is not free yet.
#[cold]
#[inline(never)]
fn short_past_lap<R: Region, V: Variant>(region: &R, r: &mut Rings<R>, seq: u64) -> Option<u64> {
    let slots = r.slots;
    let lap = u64::from(region.fbox_lap());
    let sent = r.sent;
    if sent & (slots - 1) < lap {
        r.lap_end = (sent & !(slots - 1)) + lap;
        return Some(0);
    }
    if !room_for(region, r, sent, 1) {
        return None;
    }
    // SAFETY: a key of this region; the box is ours by the acknowledgement above.
    unsafe { region.fbox_at(r.out_next) }
        .seq()
        .store(seq | LAP_MARK, V::FBOX_PUBLISH);
    let next = next_lap(sent, slots);
    r.sent = next;
    r.lap_end = next + lap;
    // SAFETY: a key of this region.
    r.out_next = unsafe { region.box_key(r.out, next) };
    Some(1)
}

/// The shortest message after which a receiver prepares the lines of a reply as long
/// (see [`take_fbox`]): measured, 1 KiB ping-pongs gained a sixth through the channel
/// (a sixteenth through `World`), 64 and 256-byte ones lost a few percent.
const REPLY_PREPARE_MIN: usize = 512;

/// Delivers the message in the next box of the peer's ring to us if it is the one due.
/// `one` is the payload one box holds.
#[inline(always)]
pub(super) fn take_fbox<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    one: usize,
    f: &mut F,
) -> bool {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return false;
    };
    let due = *recv_seq;
    let word = seq_in::<R>(region, r.in_next);
    if word != due {
        // An older number is no message; a larger one only a lap's mark.
        if word < due || pass_lap_mark::<R, V>(region, r, recv_seq, word).is_none() {
            return false;
        }
        if !due_in::<R>(region, r.in_next, due + 1) {
            return false;
        }
    }
    // SAFETY: the message now due was seen published there.
    let (len, _) = unsafe { deliver::<R, V, F>(region, index, r, r.in_next, recv_seq, one, f) };
    after_taking(region, r, len);
    true
}

/// Delivers the messages that wait in the next boxes of the peer's ring to us, at most
/// [`FBOX_RUN`]; returns how many. [`take_fbox`] in a loop, with the next box and the
/// number due carried from one message to the next rather than loaded again: the look
/// that finds the ring empty after a message costs one load of a sequence word. What a
/// reply would want is done once for the run ([`after_taking`]), not once a message.
#[inline(always)]
pub(super) fn take_run<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    one: usize,
    f: &mut F,
) -> usize {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return 0;
    };
    let mut next = r.in_next;
    let mut due = *recv_seq;
    let mut run = 0;
    let mut len = 0;
    while run < FBOX_RUN {
        let word = seq_in::<R>(region, next);
        if word != due {
            // An older number is no message; a larger one only a lap's mark.
            if word < due {
                break;
            }
            match pass_lap_mark::<R, V>(region, r, recv_seq, word) {
                Some(n) => next = n,
                None => break,
            }
            due += 1;
            continue;
        }
        // SAFETY: the Acquire load above saw the message `due` published there.
        (len, next) = unsafe { deliver::<R, V, F>(region, index, r, next, recv_seq, one, f) };
        due += 1;
        run += 1;
        if run >= 2 && r.read_ahead {
            fetch_ahead(region, r);
        }
    }
    if run > 0 {
        after_taking(region, r, len);
    }
    run
}

/// What taking a message from `peer` moves on: its index, its rings and the number due
/// from it; `None` when fastboxes are off.
#[inline(always)]
fn receiving<R: Region>(peer: &mut Peer<R>) -> Option<(u32, &mut Rings<R>, &mut u64)> {
    let Peer {
        index,
        boxes: Some(r),
        recv_seq,
        ..
    } = peer
    else {
        return None;
    };
    Some((*index, r, recv_seq))
}

/// Whether box `at` holds message `due`; an Acquire load, after which its contents may be
/// read.
#[inline(always)]
fn due_in<R: Region>(region: &R, at: R::BoxKey, due: u64) -> bool {
    seq_in::<R>(region, at) == due
}

/// Whether the next box of `r` holds message `due`, or, where `V` counts them, a lap's
/// mark in its place: either is work for a poll, since the message after a mark may wait
/// in a cell.
#[inline]
pub(super) fn holds_due<R: Region, V: Variant>(region: &R, r: &Rings<R>, due: u64) -> bool {
    let word = seq_in::<R>(region, r.in_next);
    word == due || (V::WAKE_SEES_LAP_MARKS && word == due | LAP_MARK)
}

/// The sequence word of box `at`, loaded with Acquire: the number of the message in it,
/// or of a lap's mark with [`LAP_MARK`], or an older one.
#[inline(always)]
fn seq_in<R: Region>(region: &R, at: R::BoxKey) -> u64 {
    // SAFETY: a key of this region.
    unsafe { region.fbox_at(at) }.seq().load(Ordering::Acquire)
}

/// Where the next box of ring `r` holds `word` in place of the message due, and that is
/// the mark of a lap's end ([`short_past_lap`]): moves the ring and `recv_seq` past it,
/// to the start of the ring's next lap, hands the boxes passed over back to the sender,
/// and returns the box to look at next. `None` for any other word.
#[cold]
#[inline(never)]
fn pass_lap_mark<R: Region, V: Variant>(
    region: &R,
    r: &mut Rings<R>,
    recv_seq: &mut u64,
    word: u64,
) -> Option<R::BoxKey> {
    if word != *recv_seq | LAP_MARK {
        return None;
    }
    let next = next_lap(r.taken, r.slots);
    r.taken = next;
    // SAFETY: keys of this region.
    r.in_next = unsafe { region.box_key(r.inn, next) };
    *recv_seq += 1;
    // SAFETY: a key of this region.
    unsafe { region.fbox_ack_of(r.inn) }.store(next, V::FBOX_RETURN);
    Some(r.in_next)
}

/// Hands `f` the message due in box `at`, the next of ring `r`, from local process
/// `index`, moves the ring (`r.taken`, `r.in_next`) and `recv_seq` past it, and hands
/// its boxes back to the sender; returns the message's length and the box to look at
/// next. The same message's [`after_taking`] is the caller's, once for a run.
///
/// # Safety
/// `at` is `r.in_next`, where [`due_in`] saw message `*recv_seq`.
#[inline(always)]
unsafe fn deliver<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    index: u32,
    r: &mut Rings<R>,
    at: R::BoxKey,
    recv_seq: &mut u64,
    one: usize,
    f: &mut F,
) -> (usize, R::BoxKey) {
    // SAFETY: a key of this region.
    let inbox = unsafe { region.fbox_at(at) };
    // SAFETY: the Acquire load saw the message due, which we have not acknowledged, so
    // the sender leaves its boxes alone until our acknowledgement below counts them.
    let len = unsafe {
        inbox.read(|env, data| {
            f(index, env, data);
            data.len()
        })
    };
    let taken = r.taken;
    let span = if len <= one {
        1
    } else {
        clear_span::<R, V>(region, r.inn, taken, len)
    };
    *recv_seq += 1;
    r.taken = taken + span;
    // SAFETY: keys of this region.
    let next = unsafe { region.box_key(r.inn, taken + span) };
    r.in_next = next;
    // SAFETY: a key of this region.
    unsafe { region.fbox_ack_of(r.inn) }.store(taken + span, V::FBOX_RETURN);
    (len, next)
}

/// After one message or a run of them, the last `len` bytes long: notes an exchange
/// rather than a stream, and, a reply being likely, takes the line of the box it would
/// go into, as a single box did when its acknowledgement shared the line with the
/// reply; after a message of many lines it also asks for the rest of the lines a reply
/// as long would write (after a short one that cost more than it saved). `--cfg
/// nemesis_no_reply_claim` leaves the reply out.
#[inline(always)]
fn after_taking<R: Region>(region: &R, r: &mut Rings<R>, len: usize) {
    r.took_one();
    if cfg!(not(nemesis_no_reply_claim)) && r.sent < r.room_end {
        // SAFETY: a key of this region; by the acknowledgement we acquired, the box is
        // ours.
        let reply = unsafe { region.fbox_at(r.out_next) };
        // SAFETY: as above.
        unsafe { reply.claim() };
        if len >= REPLY_PREPARE_MIN {
            reply.prepare(len, true);
        }
    }
}

/// How many boxes past the next one a receiver that is behind asks for.
const AHEAD: u64 = 4;

/// Asks for the first line of the box [`AHEAD`] boxes past the next one of `peer`'s
/// ring, for reading. Only a receiver that has taken two messages in a row in one poll
/// does: it is behind its sender, whose boxes ahead are written, and each message it
/// takes costs enough that the miss on the next box's sequence word would not overlap
/// with the one before. A receiver that keeps up does not, so as not to take lines its
/// sender is writing. Only where [`crate::config::read_ahead`] says so: it paid on an
/// Intel guest and cost two-sided streams 2-8% on an AMD one.
#[inline(always)]
fn fetch_ahead<R: Region>(region: &R, r: &Rings<R>) {
    // SAFETY: a key of this region; the index is masked into the ring, and the box is
    // only fetched, not read.
    unsafe { region.fbox_at(region.box_key(r.inn, r.taken + AHEAD)) }.fetch();
}

/// Clears the sequence words of the boxes of ring `inn` that the message of `len` bytes
/// in box `taken` ran over, so that what its bytes left there is never taken for a
/// message; returns the message's span. Inline: a call here would make the one-box path
/// keep its state in memory across it.
#[inline(always)]
fn clear_span<R: Region, V: Variant>(region: &R, inn: R::FboxKey, taken: u64, len: usize) -> u64 {
    // The length was clamped to the longest span when read.
    let span = region.fbox_span(len).max(1);
    let slots = u64::from(region.fbox_slots());
    let first = taken & (slots - 1);
    if V::FBOX_CLEAR_SPAN {
        // Boxes past the ring's end are room for the rest of a message only, never read
        // for a sequence word.
        for j in 1..span.min(slots - first) {
            // SAFETY: a key of this region.
            unsafe { region.fbox_of(inn, taken + j) }
                .seq()
                .store(0, Ordering::Relaxed);
        }
    }
    span
}
