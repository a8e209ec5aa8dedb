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

/// Called on a branch that is rarely taken, so that the compiler lays the common path
/// out straight, without jumps around what it skips (as `std::hint::cold_path` does,
/// which is newer than the crates' oldest Rust).
///
/// Generic over the region, so that each crate that instantiates the fast paths has its
/// own copy and calls it directly: called in another crate, its address would be loaded
/// from the global offset table, and where a loop calls it, before the loop.
#[cold]
#[inline(never)]
fn rare<R: Region>() {}

/// Where we are in the ring of fastboxes we write to a peer and the one it writes to us.
pub(super) struct Rings<R: Region> {
    out: R::FboxKey,
    inn: R::FboxKey,
    /// Boxes of `out` that we have filled.
    sent: u64,
    /// The count below which a message of one box goes straight into `out_next`: the
    /// lesser of `room_end` and `lap_end`, so that the one-box send makes one comparison
    /// and its cold path ([`put_cold`]) does the rest. Below it, `out_next` is box `sent`.
    one_end: u64,
    /// `one_end` where the region's [`FboxAccess::prepare`] does something, else 0: the
    /// send's one test for whether the next box is ours and worth preparing.
    prep_end: u64,
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
    /// [`Region::fbox_lap`] boxes ([`short_past_lap`]), or, where the lap is the whole
    /// ring, goes round to the ring's first box.
    lap_end: u64,
    /// A receiver behind its sender reads ahead in `inn` ([`fetch_ahead`]); looked at
    /// only then, here rather than in the book so that the one-message poll does not
    /// carry it.
    read_ahead: bool,
    /// Whether the region's boxes take [`FboxAccess::prepare`] (`prep_end`).
    prepares: bool,
    /// Boxes per ring less one: the receiver's test for the ring's last box, and the
    /// slot count of the cold paths (a full ring, a lap's end).
    mask: u64,
}

impl<R: Region> Rings<R> {
    pub(super) fn new(region: &R, me: u32, peer: u32) -> Self {
        let (out, inn) = (region.fbox_key(me, peer), region.fbox_key(peer, me));
        // SAFETY: keys just made by this region.
        let (out_next, in_next) = unsafe { (region.box_key(out, 0), region.box_key(inn, 0)) };
        let slots = u64::from(region.fbox_slots());
        let mut r = Self {
            out,
            inn,
            sent: 0,
            one_end: 0,
            prep_end: 0,
            room_end: slots,
            taken: 0,
            out_next,
            in_next,
            streaming: false,
            streaming_long: false,
            lap_end: u64::from(region.fbox_lap()).min(slots),
            read_ahead: crate::config::default_read_ahead(),
            prepares: region.prepares(),
            mask: slots - 1,
        };
        r.set_limits(region);
        r
    }

    /// Boxes per ring.
    #[inline(always)]
    fn slots(&self) -> u64 {
        self.mask + 1
    }

    /// After `sent`, `room_end` or `lap_end` moved: the one-box send's limits, and the
    /// box it fills next.
    fn set_limits(&mut self, region: &R) {
        self.one_end = self.room_end.min(self.lap_end);
        self.prep_end = if self.prepares { self.one_end } else { 0 };
        // SAFETY: a key of this region.
        self.out_next = unsafe { region.box_key(self.out, self.sent) };
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

/// Puts a message of one box into the next box of our ring to `peer` (which has boxes)
/// if it is below the ring's limits (`one_end`): one comparison, the box's stores and
/// the doorbell. Returns whether it did; where it did not, [`put_cold`] may still.
#[inline(always)]
pub(super) fn put_fbox<R: Region, V: Variant>(
    region: &R,
    wake: &Option<Arc<dyn Wake>>,
    peer: &mut Peer<R>,
    env: &Envelope,
    payload: &[&[u8]],
    len: usize,
) -> bool {
    let Some(r) = &mut peer.boxes else {
        return false;
    };
    let sent = r.sent;
    if sent >= r.one_end {
        rare::<R>();
        // The caller's slow path tries [`put_cold`]: a call from here would make the
        // caller keep the message's envelope and parts in memory for it.
        return false;
    }
    let seq = peer.send_seq;
    let at = r.out_next;
    // SAFETY: a key of this region.
    let out = unsafe { region.fbox_at(at) };
    // SAFETY: we are this ring's only sender; below `one_end` the box at `sent` is ours
    // (the receiver's acknowledgement, acquired earlier, counts past it) and `out_next`
    // names it; a message of one box has a span of 1.
    unsafe { out.write(env, payload, len) };
    out.seq().store(seq, V::FBOX_PUBLISH);
    r.sent = sent + 1;
    // SAFETY: a key of this region. Below `one_end` the next box is in the same lap of
    // the ring (`lap_end` comes no later than the ring's end); at it, the cold path makes
    // the key again.
    let next = unsafe { region.next_box(at) };
    r.out_next = next;
    if sent + 1 < r.prep_end {
        // The next box is ours: take the lines a message like this one would write,
        // while the caller goes on. Not the line of its sequence word when we took a
        // message from the peer since our last send: that looks like a ping-pong, whose
        // receiver reads that word right after this message, and would wait for it to
        // come back.
        // SAFETY: a key of this region.
        unsafe { region.fbox_at(next) }.prepare(len, !r.streaming);
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
        span => put_cold::<R, V>(region, wake, peer, span, env, payload, len),
    }
}

/// Puts a message into the next `span` boxes of our ring to `peer` if they are free,
/// where [`put_fbox`]'s one comparison did not do: a message of many boxes, a lap's
/// end, or a ring that looked full. Returns whether it did; either way the ring's
/// limits are made again.
#[inline(never)]
pub(super) fn put_cold<R: Region, V: Variant>(
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
    if span == 1 && r.sent >= r.lap_end {
        let Some(marks) = short_past_lap::<R, V>(region, r, seq) else {
            r.set_limits(region);
            return false;
        };
        seq += marks;
        peer.send_seq = seq;
    }
    let sent = r.sent;
    if !room_for(region, r, sent, span) {
        r.set_limits(region);
        return false;
    }
    // SAFETY: a key of this region.
    let out = unsafe { region.fbox_of(r.out, sent) };
    // SAFETY: we are this ring's only sender; the receiver has consumed the messages
    // these `span` boxes held last (its acknowledgement, acquired above or earlier,
    // counts past them); `span` is the span of `len`.
    unsafe { out.write(env, payload, len) };
    out.seq().store(seq, V::FBOX_PUBLISH);
    r.sent = sent + span;
    r.set_limits(region);
    if sent + span < r.room_end {
        // As in [`put_fbox`].
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

/// Whether the `span` boxes of ring `r` from count `sent` are ours, by the
/// acknowledgement we hold or, when that says the ring is full, by the receiver's
/// word read again.
#[inline(always)]
fn room_for<R: Region>(region: &R, r: &mut Rings<R>, sent: u64, span: u64) -> bool {
    if sent + span > r.room_end {
        // SAFETY: every key in the book was made by `region`.
        r.room_end = unsafe { region.fbox_ack_of(r.out) }.load(Ordering::Acquire) + r.slots();
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
/// boxes have already carried the ring into a new lap, or the lap is the whole ring and
/// the ring has gone round, only the lap's end moves. Returns how many numbers the
/// marks took (0 or 1), or `None`, having done nothing, when the box for the mark is
/// not free yet.
fn short_past_lap<R: Region, V: Variant>(region: &R, r: &mut Rings<R>, seq: u64) -> Option<u64> {
    let slots = r.slots();
    let lap = u64::from(region.fbox_lap()).min(slots);
    let sent = r.sent;
    if sent & r.mask < lap {
        r.lap_end = (sent & !r.mask) + lap;
        return Some(0);
    }
    if !room_for(region, r, sent, 1) {
        return None;
    }
    // SAFETY: a key of this region; the box is ours by the acknowledgement above.
    unsafe { region.fbox_of(r.out, sent) }
        .seq()
        .store(seq | LAP_MARK, V::FBOX_PUBLISH);
    let next = next_lap(sent, slots);
    r.sent = next;
    r.lap_end = next + lap;
    Some(1)
}

/// The shortest message after which a receiver prepares the lines of a reply as long
/// (see [`take_fbox`]): measured, 1 KiB ping-pongs gained a sixth through the channel
/// (a sixteenth through `World`), 64 and 256-byte ones lost a few percent.
const REPLY_PREPARE_MIN: usize = 512;

/// Where a receiver stands in the ring it reads, carried in registers while it takes
/// messages and written back to its [`Rings`] and the number due once it stops.
struct Reading<R: Region> {
    /// The box it looks at next.
    at: R::BoxKey,
    /// The number of the message due.
    due: u64,
    /// Boxes consumed.
    taken: u64,
}

impl<R: Region> Clone for Reading<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Region> Copy for Reading<R> {}

impl<R: Region> Reading<R> {
    #[inline(always)]
    fn of(r: &Rings<R>, due: u64) -> Self {
        Self {
            at: r.in_next,
            due,
            taken: r.taken,
        }
    }

    #[inline(always)]
    fn store(self, r: &mut Rings<R>, recv_seq: &mut u64) {
        r.in_next = self.at;
        r.taken = self.taken;
        *recv_seq = self.due;
    }
}

/// Delivers the message in the next box of the peer's ring to us if it is the one due.
#[inline(always)]
pub(super) fn take_fbox<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    f: &mut F,
) -> bool {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return false;
    };
    let Some(mut at) = first_due::<R, V>(region, r, recv_seq) else {
        return false;
    };
    // SAFETY: the message due was seen published there.
    let len = unsafe { deliver::<R, V, F>(region, index, r, recv_seq, &mut at, f, true) };
    after_taking(region, r, len);
    true
}

/// [`take_fbox`] for a message that `want` accepts, given its envelope and length: one
/// it does not stays in its box, due, for the next poll. For a caller whose sink is
/// cheap only for the messages it expects, and which would otherwise have to carry
/// everything any message might need.
#[inline(always)]
pub(super) fn take_fbox_if<R: Region, V: Variant, W, F>(
    region: &R,
    peer: &mut Peer<R>,
    want: W,
    f: &mut F,
) -> bool
where
    W: FnOnce(&Envelope, usize) -> bool,
    F: FnMut(u32, &Envelope, &[u8]),
{
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return false;
    };
    let Some(mut at) = first_due::<R, V>(region, r, recv_seq) else {
        return false;
    };
    // SAFETY: the message due was seen published there; reading it acknowledges nothing.
    let wanted = unsafe {
        region
            .fbox_at(at.at)
            .read(region.fbox_capacity(), |env, data, _| want(env, data.len()))
    };
    if !wanted {
        rare::<R>();
        // The lap marks passed on the way were handed back to the sender.
        if at.due != *recv_seq {
            at.store(r, recv_seq);
        }
        return false;
    }
    // SAFETY: as above.
    let len = unsafe { deliver::<R, V, F>(region, index, r, recv_seq, &mut at, f, true) };
    after_taking(region, r, len);
    true
}

/// Delivers the messages that wait in the next boxes of the peer's ring to us, at most
/// [`FBOX_RUN`]; returns how many. [`take_fbox`] in a loop, with the next box, the number
/// due and the count of boxes taken carried from one message to the next rather than
/// kept in memory: the look that finds the ring empty after a message costs one load of
/// a sequence word. What a reply would want is done once for the run
/// ([`after_taking`]), not once a message.
#[inline(always)]
pub(super) fn take_run<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    f: &mut F,
) -> usize {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return 0;
    };
    take_run_from::<R, V, F>(region, index, r, recv_seq, f)
}

/// [`take_run`] from the rings `r` of peer `index`, from which message `*recv_seq` is
/// due.
#[inline(always)]
pub(super) fn take_run_from<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    index: u32,
    r: &mut Rings<R>,
    recv_seq: &mut u64,
    f: &mut F,
) -> usize {
    let Some(mut at) = first_due::<R, V>(region, r, recv_seq) else {
        return 0;
    };
    // SAFETY: the message due was seen published there.
    let mut len = unsafe { deliver::<R, V, F>(region, index, r, recv_seq, &mut at, f, false) };
    let mut run = 1;
    while run < FBOX_RUN {
        let word = seq_in::<R>(region, at.at);
        // An older number is no message (the common end of a run, tested first); a
        // larger one only a lap's mark.
        if word < at.due {
            break;
        }
        if word != at.due {
            // `pass_lap_mark` is cold, which makes this branch so: a call to `rare` here
            // would have its address loaded before the loop, on every run.
            match pass_lap_mark::<R, V>(region, r, at, word) {
                Some(past) => at = past,
                None => break,
            }
            continue;
        }
        if r.read_ahead {
            // A second message in a row: we are behind the sender.
            fetch_ahead(region, r, at.taken);
        }
        // SAFETY: the Acquire load above saw the message due published there.
        len = unsafe { deliver::<R, V, F>(region, index, r, recv_seq, &mut at, f, false) };
        run += 1;
    }
    at.store(r, recv_seq);
    after_taking(region, r, len);
    run
}

/// Where the reading of ring `r` stands once past any lap marks, if the message due
/// (`*recv_seq`) waits in the box there; `None` if it does not, with the marks passed
/// written back.
#[inline(always)]
fn first_due<R: Region, V: Variant>(region: &R, r: &mut Rings<R>, recv_seq: &mut u64) -> Option<Reading<R>> {
    let mut at = Reading::of(r, *recv_seq);
    loop {
        let word = seq_in::<R>(region, at.at);
        if word == at.due {
            return Some(at);
        }
        // An older number is no message; a larger one only a lap's mark.
        let past = if word < at.due {
            None
        } else {
            pass_lap_mark::<R, V>(region, r, at, word)
        };
        match past {
            Some(past) => at = past,
            None => {
                if at.due != *recv_seq {
                    at.store(r, recv_seq);
                }
                return None;
            }
        }
    }
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

/// Where the next box holds `word` in place of the message due, and that is the mark of
/// a lap's end ([`short_past_lap`]): hands the boxes passed over back to the sender and
/// returns the reading moved past the mark, to the start of the ring's next lap. `None`
/// for any other word. By value, so that the caller's reading stays in registers.
#[cold]
#[inline(never)]
fn pass_lap_mark<R: Region, V: Variant>(
    region: &R,
    r: &Rings<R>,
    at: Reading<R>,
    word: u64,
) -> Option<Reading<R>> {
    if word != at.due | LAP_MARK {
        return None;
    }
    let taken = next_lap(at.taken, r.slots());
    // SAFETY: a key of this region.
    unsafe { region.fbox_ack_of(r.inn) }.store(taken, V::FBOX_RETURN);
    Some(Reading {
        // SAFETY: a key of this region.
        at: unsafe { region.box_key(r.inn, taken) },
        due: at.due + 1,
        taken,
    })
}

/// Hands `f` the message due in box `at.at` of ring `r`, from local process `index`,
/// moves the reading past it, and hands its boxes back to the sender; returns the
/// message's length. The same message's [`after_taking`] is the caller's, once for a
/// run. With `write_back`, the reading is stored to `r` and `recv_seq` as soon as it is
/// known, before `f` runs, so that nothing of ours lives across a sink that needs every
/// register (a blocking receive's match); without, the caller carries it on.
///
/// # Safety
/// `at` is where the reading of `r` stands, and its sequence word, loaded with Acquire,
/// showed message `at.due`.
#[inline(always)]
unsafe fn deliver<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    index: u32,
    r: &mut Rings<R>,
    recv_seq: &mut u64,
    at: &mut Reading<R>,
    f: &mut F,
    write_back: bool,
) -> usize {
    // Read from the region where it is at hand, rather than carried in a register.
    let one = region.fbox_capacity();
    let here = at.at;
    let taken = at.taken;
    // SAFETY: a key of this region.
    let inbox = unsafe { region.fbox_at(here) };
    // SAFETY: the Acquire load saw the message due, which we have not acknowledged, so
    // the sender leaves its boxes alone until our acknowledgement below counts them.
    unsafe {
        inbox.read(
            one,
            #[inline(always)]
            |env, data, short| {
                let len = data.len();
                at.due += 1;
                if short {
                    at.taken = taken + 1;
                    at.at = if (taken + 1) & r.mask != 0 {
                        // One box, and not the ring's last: the next box is the one after it.
                        region.next_box(here)
                    } else {
                        rare::<R>();
                        region.box_key(r.inn, taken + 1)
                    };
                    if write_back {
                        at.store(r, recv_seq);
                    }
                }
                f(index, env, data);
                if !short {
                    // After `f`: the sequence words cleared lie in the message's bytes.
                    let span = clear_span::<R, V>(region, r.inn, taken, len);
                    at.taken = taken + span;
                    at.at = region.box_key(r.inn, taken + span);
                    if write_back {
                        at.store(r, recv_seq);
                    }
                }
                region.fbox_ack_of(r.inn).store(at.taken, V::FBOX_RETURN);
                len
            },
        )
    }
}

/// After one message or a run of them, the last `len` bytes long: notes an exchange
/// rather than a stream, and, where we had sent the peer something since we last took
/// one of its messages (an exchange, so a reply is likely), takes the line of the box
/// the reply would go into, as a single box did when its acknowledgement shared the
/// line with the reply; after a message of many lines it also asks for the rest of the
/// lines a reply as long would write (after a short one that cost more than it saved).
/// A receiver that has only been taking has claimed that box already, at the take that
/// ended its last exchange, and claiming it again would only take the line back from
/// a sender that looked at it. `--cfg nemesis_no_reply_claim` leaves the reply out.
#[inline(always)]
fn after_taking<R: Region>(region: &R, r: &mut Rings<R>, len: usize) {
    let exchange = r.streaming;
    r.took_one();
    if cfg!(not(nemesis_no_reply_claim)) && exchange && r.sent < r.one_end {
        // SAFETY: a key of this region; below `one_end` it names box `sent`, which by
        // the acknowledgement we acquired is ours.
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

/// Asks for the first line of the box [`AHEAD`] boxes past the next one of the peer's
/// ring, whose reading has taken `taken` boxes, for reading. Only a receiver that has
/// taken two messages in a row in one poll does: it is behind its sender, whose boxes
/// ahead are written, and each message it takes costs enough that the miss on the next
/// box's sequence word would not overlap with the one before. A receiver that keeps up
/// does not, so as not to take lines its sender is writing. Only where
/// [`crate::config::read_ahead`] says so: it paid on an Intel guest and cost two-sided
/// streams 2-8% on an AMD one.
#[inline(always)]
fn fetch_ahead<R: Region>(region: &R, r: &Rings<R>, taken: u64) {
    // SAFETY: a key of this region; the index is masked into the ring, and the box is
    // only fetched, not read.
    unsafe { region.fbox_at(region.box_key(r.inn, taken + AHEAD)) }.fetch();
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
