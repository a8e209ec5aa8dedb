//! One process's end of the shared-memory transport.
//!
//! A message to a local peer goes into the next box of the pair's ring of fastboxes when
//! it fits and the box is free, and otherwise into a cell taken from the sender's own
//! pool and enqueued on the receiver's receive queue. Both carry a per-pair sequence
//! number, and the receiver hands a message up only when its number is the next one due
//! from that sender, so fastbox and queue messages between a pair never overtake each
//! other.

use crate::queue::{Consumer, Pop, enqueue};
use crate::region::{CellAccess, CellMeta, Envelope, FboxAccess, Region};
use crate::sync::Ordering;
use crate::variant::{Sound, Variant};
use crate::wake::Wake;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// No fastbox and no cell are available for this destination right now. Nothing was
/// sent; try again after polling, which returns cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// A receive queue held something that no correct sender writes.
#[derive(Debug, thiserror::Error)]
#[error("corrupt cell {handle} in the receive queue of local process {me}: {what}")]
pub struct Corrupt {
    /// The receiving process.
    pub me: u32,
    /// The cell's handle.
    pub handle: u32,
    /// What was wrong.
    pub what: &'static str,
}

/// How many queue cells one poll hands up at most, so a flood cannot starve the caller.
const POLL_BUDGET: usize = 64;
/// How many fastbox messages from one peer one poll hands up at most.
const FBOX_RUN: usize = 64;
/// Set in a box's sequence word beside the number of the message due: no message, the
/// sender went on at the start of the ring's next lap (see [`short_past_lap`]).
const LAP_MARK: u64 = 1 << 63;

/// A process's end of the transport over a [`Region`].
pub struct Port<R: Region, V: Variant = Sound> {
    region: Arc<R>,
    book: Book<R>,
    /// How to wake a peer that watches its wake socket; `None`: no peer ever does.
    wake: Option<Arc<dyn Wake>>,
    _variant: PhantomData<V>,
}

impl<R: Region, V: Variant> std::fmt::Debug for Port<R, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("me", &self.book.me)
            .field("nprocs", &self.book.n)
            .field("free_cells", &self.book.stash.len())
            .finish_non_exhaustive()
    }
}

/// What we keep about one peer.
struct Peer<R: Region> {
    /// The peer's local index.
    index: u32,
    /// Our two rings of fastboxes with the peer; `None` when fastboxes are off.
    boxes: Option<Rings<R>>,
    /// The peer's queues and doorbell.
    slot: R::ProcKey,
    /// Next sequence number to send; numbers start at 1.
    send_seq: u64,
    /// Next sequence number due from the peer.
    recv_seq: u64,
    /// Cells sent to the peer and not yet seen back.
    inflight: u32,
}

/// Where we are in the ring of fastboxes we write to a peer and the one it writes to us.
struct Rings<R: Region> {
    out: R::FboxKey,
    inn: R::FboxKey,
    /// Boxes of `out` that we have filled.
    sent: u64,
    /// The peer's acknowledgement of `out` as we last read it: the sender reads the word
    /// again only when this says the ring is full.
    acked: u64,
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
}

impl<R: Region> Rings<R> {
    fn new(region: &R, me: u32, peer: u32) -> Self {
        let (out, inn) = (region.fbox_key(me, peer), region.fbox_key(peer, me));
        // SAFETY: keys just made by this region.
        let (out_next, in_next) = unsafe { (region.box_key(out, 0), region.box_key(inn, 0)) };
        Self {
            out,
            inn,
            sent: 0,
            acked: 0,
            taken: 0,
            out_next,
            in_next,
            streaming: false,
            streaming_long: false,
            lap_end: if region.fbox_lap() < region.fbox_slots() {
                u64::from(region.fbox_lap())
            } else {
                u64::MAX
            },
            read_ahead: crate::config::default_read_ahead(),
        }
    }
}

/// The private bookkeeping, apart from the region so both can be borrowed at once.
struct Book<R: Region> {
    me: u32,
    n: u32,
    /// Our own queues and doorbell.
    my: R::ProcKey,
    fbox_cap: usize,
    /// Boxes per ring.
    fbox_slots: u64,
    cell_cap: usize,
    cells_per_proc: u32,
    /// Every other local process, in order: process `p` is at `p - (p > me)`.
    peers: Box<[Peer<R>]>,
    rq: Consumer,
    fq: Consumer,
    /// Our own cells, taken off our free queue and ready to fill.
    stash: Vec<u32>,
    /// At most this many cells in flight to one peer, so one slow receiver cannot hold
    /// the whole pool and stall our traffic to everyone else.
    credit: u32,
    /// A send failed for want of a cell; wake-ups then also count returned cells.
    starved: bool,
}

impl<R: Region> Port<R, Sound> {
    /// The port of local process `me`.
    ///
    /// # Panics
    /// If `me` is not a process of the region.
    pub fn new(region: Arc<R>, me: u32) -> Self {
        Self::with_variant(region, me)
    }
}

impl<R: Region, V: Variant> Port<R, V> {
    /// The port of local process `me`, running protocol variant `V`.
    ///
    /// # Panics
    /// If `me` is not a process of the region.
    pub fn with_variant(region: Arc<R>, me: u32) -> Self {
        let n = region.nprocs();
        assert!(me < n, "local process {me} of {n}");
        let cells = region.cells_per_proc();
        let first = me * cells + 1;
        let credit = if n <= 2 { cells } else { (cells / 2).max(1) };
        let fbox_cap = region.fbox_capacity();
        let peers = (0..n)
            .filter(|&p| p != me)
            .map(|p| Peer {
                index: p,
                boxes: (fbox_cap > 0).then(|| Rings::new(&*region, me, p)),
                slot: region.proc_key(p),
                send_seq: 1,
                recv_seq: 1,
                inflight: 0,
            })
            .collect();
        let book = Book {
            me,
            n,
            my: region.proc_key(me),
            fbox_cap,
            fbox_slots: u64::from(region.fbox_slots()),
            cell_cap: region.cell_capacity(),
            cells_per_proc: cells,
            peers,
            rq: Consumer::new(),
            fq: Consumer::new(),
            stash: (first..first + cells).rev().collect(),
            credit,
            starved: false,
        };
        Self {
            region,
            book,
            wake: None,
            _variant: PhantomData,
        }
    }

    /// How to wake peers that sleep on their wake sockets ([`crate::wake`]).
    pub fn set_wake(&mut self, wake: Arc<dyn Wake>) {
        self.wake = Some(wake);
    }

    /// This process's local index.
    pub fn me(&self) -> u32 {
        self.book.me
    }

    /// The number of processes in the region.
    pub fn nprocs(&self) -> u32 {
        self.book.n
    }

    /// The region.
    pub fn region(&self) -> &Arc<R> {
        &self.region
    }

    /// The largest payload of one message.
    pub fn max_payload(&self) -> usize {
        self.book.cell_cap
    }

    /// The largest payload that can travel in one fastbox (longer ones, up to
    /// [`Port::max_payload`], take several).
    pub fn fbox_capacity(&self) -> usize {
        self.book.fbox_cap
    }

    /// Whether a receiver that has taken two messages in a row from a peer asks for the
    /// box four past the next ([`crate::config::read_ahead`]).
    pub fn set_read_ahead(&mut self, on: bool) {
        for r in self.book.peers.iter_mut().filter_map(|p| p.boxes.as_mut()) {
            r.read_ahead = on;
        }
    }

    /// Caps the cells in flight to any one peer (at least 1).
    pub fn set_credit(&mut self, cells: u32) {
        self.book.credit = cells.clamp(1, self.book.cells_per_proc);
    }

    /// The cap on cells in flight to one peer.
    pub fn credit(&self) -> u32 {
        self.book.credit
    }

    /// Sends a message of `len` bytes (the total of `payload`) to local process `dest`.
    ///
    /// # Panics
    /// If `dest` is this process or out of range, or `len` exceeds [`Port::max_payload`].
    /// Callers validate first. `len` must be the total length of `payload`.
    #[inline]
    pub fn try_send(&mut self, dest: u32, env: &Envelope, payload: &[&[u8]], len: usize) -> Result<(), Full> {
        if dest == self.book.me || dest >= self.book.n {
            bad_dest(dest, self.book.me, self.book.n);
        }
        // SAFETY: checked just above.
        unsafe { self.try_send_unchecked(dest, env, payload, len) }
    }

    /// [`Port::try_send`] without the check of `dest`, for callers that have made it.
    ///
    /// # Safety
    /// `dest` is a local process other than this one (`dest < nprocs`, `dest != me`).
    /// `len` must still be the total length of `payload`; it is checked against the
    /// capacities.
    #[inline]
    pub unsafe fn try_send_unchecked(
        &mut self,
        dest: u32,
        env: &Envelope,
        payload: &[&[u8]],
        len: usize,
    ) -> Result<(), Full> {
        // SAFETY: passed on from our caller.
        if unsafe { self.try_fbox_unchecked(dest, env, payload, len) } {
            return Ok(());
        }
        self.try_send_slow(dest, env, payload, len)
    }

    /// Sends through the next fastbox to `dest` if the message fits and the box is free;
    /// returns whether it did. The fast path of [`Port::try_send_unchecked`].
    ///
    /// # Safety
    /// As for [`Port::try_send_unchecked`].
    #[inline(always)]
    pub unsafe fn try_fbox_unchecked(
        &mut self,
        dest: u32,
        env: &Envelope,
        payload: &[&[u8]],
        len: usize,
    ) -> bool {
        let b = &mut self.book;
        let region = &*self.region;
        let wake = &self.wake;
        debug_assert!(dest < b.n && dest != b.me);
        debug_assert_eq!(len, payload.iter().map(|p| p.len()).sum::<usize>());
        // SAFETY: the caller guarantees `dest < n` and `dest != me`, so the position is
        // below `n - 1`, the length of `peers`.
        let peer = unsafe { b.peers.get_unchecked_mut(b.pos(dest)) };
        // `put_fbox` looks again; returning here first lays the one-box path out shorter.
        if peer.boxes.is_none() {
            return false;
        }
        len <= b.fbox_cap && put_fbox::<R, V>(region, wake, peer, b.fbox_slots, 1, env, payload, len)
    }

    /// Sends through fastboxes alone, never a cell: the next box, or the next boxes a
    /// message longer than one box spans. Returns whether it did; for a caller that would
    /// rather wait for the ring than take a cell.
    ///
    /// # Panics
    /// As for [`Port::try_send`].
    pub fn try_fbox(&mut self, dest: u32, env: &Envelope, payload: &[&[u8]], len: usize) -> bool {
        let b = &mut self.book;
        if dest == b.me || dest >= b.n {
            bad_dest(dest, b.me, b.n);
        }
        if len <= b.fbox_cap {
            // SAFETY: checked just above.
            return unsafe { self.try_fbox_unchecked(dest, env, payload, len) };
        }
        let pos = b.pos(dest);
        len <= b.cell_cap && self.try_span(pos, env, payload, len)
    }

    /// Puts a message longer than one box, and no longer than a cell's payload, into the
    /// boxes of our ring to the peer at `pos` of the book if they are free.
    #[inline(always)]
    fn try_span(&mut self, pos: usize, env: &Envelope, payload: &[&[u8]], len: usize) -> bool {
        let b = &mut self.book;
        put_fbox_span::<R, V>(
            &*self.region,
            &self.wake,
            &mut b.peers[pos],
            b.fbox_slots,
            env,
            payload,
            len,
        )
    }

    /// The path of [`Port::try_send`] after one fastbox: a message longer than one box
    /// into the next boxes of the ring if they are free, else a cell from our pool onto
    /// the receiver's queue. Kept out of line so the one-box path stays small. Public for
    /// a caller that has just tried that path ([`Port::try_fbox_unchecked`]): a second
    /// look would only read the receiver's acknowledgement once more.
    ///
    /// # Panics
    /// As for [`Port::try_send`].
    #[inline(never)]
    pub fn try_send_slow(
        &mut self,
        dest: u32,
        env: &Envelope,
        payload: &[&[u8]],
        len: usize,
    ) -> Result<(), Full> {
        let b = &mut self.book;
        if dest == b.me || dest >= b.n {
            bad_dest(dest, b.me, b.n);
        }
        let pos = b.pos(dest);
        assert!(
            len <= b.cell_cap,
            "{len} bytes do not fit a cell of {}",
            b.cell_cap
        );
        if len > b.fbox_cap {
            if let Some(r) = &mut b.peers[pos].boxes {
                // Set before the send can fail: a caller that finds no room is behind
                // its peer all the same.
                r.streaming_long = true;
            }
            if self.try_span(pos, env, payload, len) {
                return Ok(());
            }
        }
        let b = &mut self.book;
        let region = &*self.region;
        let seq = b.peers[pos].send_seq;
        let Some(h) = b.take_cell::<V>(region, dest) else {
            return Err(Full);
        };
        let meta = CellMeta {
            src: b.me as u16,
            dest: dest as u16,
            len: len as u32,
            seq: seq as u32,
            env: *env,
        };
        // SAFETY: `h` came from our stash, so it is ours and in no queue; `len` fits.
        unsafe { region.cell(h).write(&meta, payload) };
        let peer = &mut b.peers[pos];
        // SAFETY: a key of this region.
        enqueue::<V>(unsafe { region.recv_queue_of(peer.slot) }, region, h);
        peer.inflight += 1;
        peer.send_seq = seq + 1;
        // SAFETY: a key of this region.
        if unsafe { region.doorbell_of(peer.slot) }.ring() && V::WAKE_WATCHERS {
            wake_peer(&self.wake, peer.index);
        }
        Ok(())
    }

    /// Hands every message that is due to `f(src, env, payload)`, in place: the payload
    /// lives in the fastbox or cell and is released when `f` returns. Returns how many.
    #[inline]
    pub fn poll<F: FnMut(u32, &Envelope, &[u8])>(&mut self, mut f: F) -> Result<usize, Corrupt> {
        let b = &mut self.book;
        let region = &*self.region;
        let mut got = 0;
        // Peers have no boxes when fastboxes are off. A run of messages from one peer is
        // taken in one poll, up to a bound, so a stream pays the caller's poll once per
        // run rather than per message.
        for peer in b.peers.iter_mut() {
            got += take_run::<R, V, F>(region, peer, b.fbox_cap, b.fbox_slots, &mut f);
        }
        // SAFETY: a key of this region.
        if !b.rq.is_empty(unsafe { region.recv_queue_of(b.my) }) {
            // `f` moves into the out-of-line part: lent to it instead, it would have to
            // live in memory, and the fastbox path above would load it from there.
            return self.poll_queue_owned(f, got);
        }
        Ok(got)
    }

    /// [`Port::poll`]'s queue part, which takes the sink over.
    #[inline(never)]
    fn poll_queue_owned<F: FnMut(u32, &Envelope, &[u8])>(
        &mut self,
        mut f: F,
        got: usize,
    ) -> Result<usize, Corrupt> {
        Ok(got + self.poll_queue(&mut f)?)
    }

    /// Hands `f` the next message from local process `src` if it waits in the fastbox,
    /// and reports whether it did: cheaper than [`Port::poll`] for a caller that knows
    /// whom it waits for.
    #[inline]
    pub fn poll_fbox_of<F: FnMut(u32, &Envelope, &[u8])>(&mut self, src: u32, mut f: F) -> bool {
        let b = &mut self.book;
        if src == b.me {
            return false;
        }
        let pos = b.pos(src);
        match b.peers.get_mut(pos) {
            Some(peer) => take_fbox::<R, V, F>(&*self.region, peer, b.fbox_cap, b.fbox_slots, &mut f),
            None => false,
        }
    }

    /// The queue part of [`Port::poll`].
    #[inline(always)]
    fn poll_queue<F: FnMut(u32, &Envelope, &[u8])>(&mut self, f: &mut F) -> Result<usize, Corrupt> {
        let b = &mut self.book;
        let region = &*self.region;
        // SAFETY: a key of this region.
        let q = unsafe { region.recv_queue_of(b.my) };
        let mut got = 0;
        let mut cells = 0;
        while cells < POLL_BUDGET {
            let Some(h) = b.rq.peek(q) else { break };
            // SAFETY: `h` is at the head of our receive queue, acquired from its producer.
            let meta = unsafe { region.cell(h).meta() };
            b.check(h, &meta)?;
            let s = meta.src as u32;
            let pos = b.pos(s);
            let peer = &mut b.peers[pos];
            if V::SEQ_CHECK && meta.seq != peer.recv_seq as u32 {
                // Its predecessor went through the fastbox, which was published first.
                let due = peer.recv_seq;
                if take_fbox::<R, V, F>(region, peer, b.fbox_cap, b.fbox_slots, f) {
                    got += 1;
                    continue;
                }
                if peer.recv_seq != due {
                    // A lap's mark was its predecessor.
                    continue;
                }
                break;
            }
            match b.rq.pop::<V>(q, region) {
                Pop::Got(popped) => debug_assert_eq!(popped, h),
                Pop::Busy | Pop::Empty => break,
            }
            // SAFETY: we dequeued `h`; it is ours until we return it below.
            unsafe {
                region
                    .cell(h)
                    .read(meta.len as usize, |data| f(s, &meta.env, data))
            };
            let peer = &mut b.peers[pos];
            peer.recv_seq += 1;
            if let Some(r) = &mut peer.boxes {
                r.streaming = false;
                r.streaming_long = false;
            }
            // SAFETY: keys of this region.
            let watching = unsafe {
                enqueue::<V>(region.free_queue_of(peer.slot), region, h);
                region.doorbell_of(peer.slot).ring()
            };
            if watching && V::WAKE_WATCHERS {
                wake_peer(&self.wake, peer.index);
            }
            got += 1;
            cells += 1;
        }
        Ok(got)
    }

    /// Whether a poll would find something: a due fastbox message, a queued cell, or,
    /// after a failed send, a returned cell.
    pub fn has_work(&self) -> bool {
        let b = &self.book;
        let region = &*self.region;
        for peer in b.peers.iter() {
            if let Some(r) = &peer.boxes {
                let word = seq_in::<R>(region, r.in_next);
                // A lap's mark is work: the message after it may be in a cell.
                if word == peer.recv_seq || (V::WAKE_SEES_LAP_MARKS && word == peer.recv_seq | LAP_MARK) {
                    return true;
                }
            }
        }
        // SAFETY: keys of this region.
        unsafe {
            !b.rq.is_empty(region.recv_queue_of(b.my))
                || (b.starved && !b.fq.is_empty(region.free_queue_of(b.my)))
        }
    }

    /// Sleeps until another process hands this one work, or `timeout` passes.
    /// Returns at once if there is work already.
    pub fn sleep(&mut self, timeout: Option<Duration>) {
        // SAFETY: a key of this region.
        let bell = unsafe { self.region.doorbell_of(self.book.my) };
        let token = bell.announce();
        if V::WAKE_RECHECK && self.has_work() {
            bell.withdraw();
            return;
        }
        bell.sleep(token, timeout);
        bell.withdraw();
    }

    /// Announces that this process is about to sleep on its wake socket instead of its
    /// futex, so that senders wake it there. Returns false, having withdrawn, when there
    /// is work already; after true, sleep until the socket is readable, then
    /// [`Port::unwatch`].
    pub fn watch(&mut self) -> bool {
        // SAFETY: a key of this region.
        let bell = unsafe { self.region.doorbell_of(self.book.my) };
        bell.watch();
        if V::WAKE_RECHECK && self.has_work() {
            bell.unwatch();
            return false;
        }
        true
    }

    /// Withdraws a [`Port::watch`], after waking.
    pub fn unwatch(&mut self) {
        // SAFETY: a key of this region.
        unsafe { self.region.doorbell_of(self.book.my) }.unwatch();
    }

    /// Whether we have sent local process `dest` anything by fastbox since we last took
    /// a message from it: a stream one way, of whatever length, rather than an exchange.
    /// A hint, as [`Port::streams_to`] is.
    #[inline]
    pub fn sent_since_taken(&self, dest: u32) -> bool {
        self.rings_to(dest).is_some_and(|r| r.streaming)
    }

    /// The fastbox rings shared with local process `dest`: none for ourselves, past the
    /// processes, or without fastboxes.
    #[inline]
    fn rings_to(&self, dest: u32) -> Option<&Rings<R>> {
        let b = &self.book;
        if dest == b.me || dest >= b.n {
            return None;
        }
        b.peers[b.pos(dest)].boxes.as_ref()
    }

    /// Cells of ours that are neither in flight nor waiting in our free queue.
    pub fn free_cells(&self) -> usize {
        self.book.stash.len()
    }

    /// Whether we have sent local process `dest` a message longer than one fastbox since
    /// we last took a message from it: a stream of long messages one way rather than an
    /// exchange (a short message before a long one, a header before its payload, is
    /// not). A hint, read without touching shared memory; false without fastboxes, or
    /// for `dest` out of range.
    #[inline]
    pub fn streams_to(&self, dest: u32) -> bool {
        self.rings_to(dest).is_some_and(|r| r.streaming_long)
    }

    /// How many packets to local process `dest` (not this one) would get a cell now:
    /// the cells returned so far are taken back first, and `dest`'s credit counts.
    pub fn cells_for(&mut self, dest: u32) -> usize {
        let b = &mut self.book;
        if dest == b.me || dest >= b.n {
            return 0;
        }
        b.reclaim::<V>(&*self.region);
        let inflight = b.peers[b.pos(dest)].inflight;
        b.stash.len().min(b.credit.saturating_sub(inflight) as usize)
    }
}

/// Wakes local process `index` through its wake socket: its ring found it watching.
#[cold]
#[inline(never)]
fn wake_peer(wake: &Option<Arc<dyn Wake>>, index: u32) {
    if let Some(w) = wake {
        w.wake(index);
    }
}

#[cold]
#[inline(never)]
fn bad_dest(dest: u32, me: u32, n: u32) -> ! {
    panic!("local process {me} cannot send through the port to {dest} (of {n})")
}

/// Puts a message into the next `span` boxes of our ring to `peer` (which has boxes) if
/// they are free; returns whether it did.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn put_fbox<R: Region, V: Variant>(
    region: &R,
    wake: &Option<Arc<dyn Wake>>,
    peer: &mut Peer<R>,
    slots: u64,
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
        let Some(marks) = short_past_lap::<R, V>(region, r, slots, seq) else {
            return false;
        };
        seq += marks;
        peer.send_seq = seq;
        sent = r.sent;
    }
    if !room_for(region, r, sent, span, slots) {
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
    if sent + span < r.acked + slots {
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
fn put_fbox_span<R: Region, V: Variant>(
    region: &R,
    wake: &Option<Arc<dyn Wake>>,
    peer: &mut Peer<R>,
    slots: u64,
    env: &Envelope,
    payload: &[&[u8]],
    len: usize,
) -> bool {
    match region.fbox_span(len) {
        0 => false,
        span => put_fbox::<R, V>(region, wake, peer, slots, span, env, payload, len),
    }
}

/// Whether the `span` boxes of ring `r` from count `sent` are ours, by the
/// acknowledgement we hold or, when that says the ring is full, by the receiver's
/// word read again.
#[inline(always)]
fn room_for<R: Region>(region: &R, r: &mut Rings<R>, sent: u64, span: u64, slots: u64) -> bool {
    if sent + span - r.acked > slots {
        // SAFETY: every key in the book was made by `region`.
        r.acked = unsafe { region.fbox_ack_of(r.out) }.load(Ordering::Acquire);
        if sent + span - r.acked > slots {
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
fn short_past_lap<R: Region, V: Variant>(region: &R, r: &mut Rings<R>, slots: u64, seq: u64) -> Option<u64> {
    let lap = u64::from(region.fbox_lap());
    let sent = r.sent;
    if sent & (slots - 1) < lap {
        r.lap_end = (sent & !(slots - 1)) + lap;
        return Some(0);
    }
    if !room_for(region, r, sent, 1, slots) {
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
fn take_fbox<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    one: usize,
    slots: u64,
    f: &mut F,
) -> bool {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return false;
    };
    let due = *recv_seq;
    let word = seq_in::<R>(region, r.in_next);
    if word != due {
        // An older number is no message; a larger one only a lap's mark.
        if word < due || pass_lap_mark::<R, V>(region, r, recv_seq, slots, word).is_none() {
            return false;
        }
        if !due_in::<R>(region, r.in_next, due + 1) {
            return false;
        }
    }
    // SAFETY: the message now due was seen published there.
    unsafe { deliver::<R, V, F>(region, index, r, r.in_next, recv_seq, one, slots, f) };
    true
}

/// Delivers the messages that wait in the next boxes of the peer's ring to us, at most
/// [`FBOX_RUN`]; returns how many. [`take_fbox`] in a loop, with the next box and the
/// number due carried from one message to the next rather than loaded again: the look
/// that finds the ring empty after a message costs one load of a sequence word.
#[inline(always)]
fn take_run<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    peer: &mut Peer<R>,
    one: usize,
    slots: u64,
    f: &mut F,
) -> usize {
    let Some((index, r, recv_seq)) = receiving(peer) else {
        return 0;
    };
    let mut next = r.in_next;
    let mut due = *recv_seq;
    let mut run = 0;
    while run < FBOX_RUN {
        let word = seq_in::<R>(region, next);
        if word != due {
            // An older number is no message; a larger one only a lap's mark.
            if word < due {
                break;
            }
            match pass_lap_mark::<R, V>(region, r, recv_seq, slots, word) {
                Some(n) => next = n,
                None => break,
            }
            due += 1;
            continue;
        }
        // SAFETY: the Acquire load above saw the message `due` published there.
        next = unsafe { deliver::<R, V, F>(region, index, r, next, recv_seq, one, slots, f) };
        due += 1;
        run += 1;
        if run >= 2 && r.read_ahead {
            fetch_ahead(region, r);
        }
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
    slots: u64,
    word: u64,
) -> Option<R::BoxKey> {
    if word != *recv_seq | LAP_MARK {
        return None;
    }
    let next = next_lap(r.taken, slots);
    r.taken = next;
    // SAFETY: keys of this region.
    r.in_next = unsafe { region.box_key(r.inn, next) };
    *recv_seq += 1;
    // SAFETY: a key of this region.
    unsafe { region.fbox_ack_of(r.inn) }.store(next, V::FBOX_RETURN);
    Some(r.in_next)
}

/// Hands `f` the message due in box `at`, the next of ring `r`, from local process
/// `index`, and moves the ring and `recv_seq` past it; returns the box to look at next.
///
/// # Safety
/// `at` is `r.in_next`, where [`due_in`] saw message `*recv_seq`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn deliver<R: Region, V: Variant, F: FnMut(u32, &Envelope, &[u8])>(
    region: &R,
    index: u32,
    r: &mut Rings<R>,
    at: R::BoxKey,
    recv_seq: &mut u64,
    one: usize,
    slots: u64,
    f: &mut F,
) -> R::BoxKey {
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
    r.streaming = false;
    r.streaming_long = false;
    // SAFETY: keys of this region.
    let next = unsafe { region.box_key(r.inn, taken + span) };
    r.in_next = next;
    // SAFETY: a key of this region.
    unsafe { region.fbox_ack_of(r.inn) }.store(taken + span, V::FBOX_RETURN);
    // A reply is likely: take the line of the box it would go into now, as a single
    // box did when its acknowledgement shared the line with the reply, and, after a
    // message of many lines, ask for the rest of the lines a reply as long would write
    // (after a short one that cost more than it saved). `--cfg nemesis_no_reply_claim`
    // leaves both out.
    if cfg!(not(nemesis_no_reply_claim)) && r.sent < r.acked + slots {
        // SAFETY: a key of this region; by the acknowledgement we acquired, the box is
        // ours.
        let reply = unsafe { region.fbox_at(r.out_next) };
        // SAFETY: as above.
        unsafe { reply.claim() };
        if len >= REPLY_PREPARE_MIN {
            reply.prepare(len, true);
        }
    }
    next
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

impl<R: Region> Book<R> {
    /// Where local process `p` (not us) sits in `peers`.
    #[inline(always)]
    fn pos(&self, p: u32) -> usize {
        (p - u32::from(p > self.me)) as usize
    }

    /// Takes one of our cells for a message to `dest`, within its credit.
    #[inline]
    fn take_cell<V: Variant>(&mut self, region: &R, dest: u32) -> Option<u32> {
        let d = self.pos(dest);
        if self.peers[d].inflight >= self.credit || self.stash.is_empty() {
            self.reclaim::<V>(region);
        }
        if self.peers[d].inflight >= self.credit {
            self.starved = true;
            return None;
        }
        let h = self.stash.pop();
        self.starved = h.is_none();
        h
    }

    /// Moves returned cells from our free queue to the stash, crediting their receivers.
    fn reclaim<V: Variant>(&mut self, region: &R) {
        // SAFETY: a key of this region.
        let q = unsafe { region.free_queue_of(self.my) };
        while let Pop::Got(h) = self.fq.pop::<V>(q, region) {
            // SAFETY: the cell came back through our free queue (Acquire); it is ours.
            let dest = unsafe { region.cell(h).meta() }.dest as u32;
            if dest != self.me
                && let Some(p) = self.peers.get_mut(self.pos(dest))
            {
                p.inflight = p.inflight.saturating_sub(1);
            }
            self.stash.push(h);
        }
    }

    /// Rejects a cell whose control fields no correct sender writes.
    #[inline(always)]
    fn check(&self, h: u32, meta: &CellMeta) -> Result<(), Corrupt> {
        let what = if meta.src as u32 >= self.n || meta.src as u32 == self.me {
            "bad source"
        } else if (h - 1) / self.cells_per_proc != meta.src as u32 {
            "cell not owned by its source"
        } else if meta.len as usize > self.cell_cap {
            "length beyond the cell"
        } else {
            return Ok(());
        };
        Err(Corrupt {
            me: self.me,
            handle: h,
            what,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::heap::HeapRegion;

    fn pair(cells: u32, cell: usize, fbox: usize) -> (Port<HeapRegion>, Port<HeapRegion>) {
        let r = Arc::new(HeapRegion::new(2, cells, cell, fbox));
        (Port::new(r.clone(), 0), Port::new(r, 1))
    }

    fn drain(p: &mut Port<HeapRegion>) -> Vec<(u32, u64, Vec<u8>)> {
        let mut out = Vec::new();
        p.poll(|s, env, data| out.push((s, env[0], data.to_vec())))
            .unwrap();
        out
    }

    #[test]
    fn small_goes_by_fastbox_large_by_queue_in_order() {
        let (mut a, mut b) = pair(8, 256, 64);
        let big = vec![7u8; 200];
        for i in 0..6u64 {
            let data: &[u8] = if i % 2 == 0 { b"tiny" } else { &big };
            a.try_send(1, &[i, 0], &[data], data.len()).unwrap();
        }
        let got = drain(&mut b);
        // The fastbox held message 0 only; 2 and 4 took cells behind it, still in order.
        assert_eq!(
            got.iter().map(|m| m.1).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4, 5]
        );
        assert_eq!(got[1].2, big);
        assert_eq!(got[0].2, b"tiny");
    }

    #[test]
    fn a_ring_of_fastboxes_takes_a_run_before_cells_and_wraps_in_order() {
        let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 4));
        let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
        let m = [5u8; 16];
        for i in 0..4u64 {
            a.try_send(1, &[i, 0], &[&m], 16).unwrap();
        }
        assert_eq!(a.cells_for(1), 8, "four messages fit the ring of four boxes");
        a.try_send(1, &[4, 0], &[&m], 16).unwrap();
        assert_eq!(a.cells_for(1), 7, "the fifth took a cell");
        // Each poll takes the next box; the cell waits for its turn.
        let mut got = Vec::new();
        while got.len() < 5 {
            got.extend(drain(&mut b).into_iter().map(|m| m.1));
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        // The acknowledgement hands all four boxes back: the ring wraps, still in order.
        for i in 5..13u64 {
            a.try_send(1, &[i, 0], &[&m], 16).unwrap();
            if i == 8 {
                // One box per poll.
                assert_eq!((0..4).map(|_| drain(&mut b).len()).sum::<usize>(), 4);
            }
        }
        assert_eq!(a.cells_for(1), 8, "the wrap used boxes, not cells");
        let mut got = Vec::new();
        while got.len() < 4 {
            got.extend(drain(&mut b).into_iter().map(|m| (m.1, m.2)));
        }
        assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), vec![9, 10, 11, 12]);
        assert!(got.iter().all(|g| g.1 == m));
    }

    #[test]
    fn short_messages_keep_to_the_lap_and_long_ones_use_the_whole_ring() {
        // Eight boxes of 16 bytes, messages of one box in the first four of each lap.
        let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 8).with_fbox_lap(4));
        let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
        let (short, long) = ([1u8; 16], [2u8; 32]);
        for i in 0..4u64 {
            a.try_send(1, &[i, 0], &[&short], 16).unwrap();
        }
        assert_eq!(drain(&mut b).len(), 4);
        // Box 4 is past the lap: marked, and the message goes into box 0 of the next lap.
        a.try_send(1, &[4, 0], &[&short], 16).unwrap();
        assert_eq!(a.rings_to(1).map(|r| r.sent), Some(9));
        // Until the receiver passes the mark, boxes 4 to 7 count as the sender's.
        assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![4]);
        assert_eq!(b.rings_to(0).map(|r| r.taken), Some(9));
        // Two boxes each: 9-10, 11-12 and 13-14, past the lap; the ring holds them all.
        for i in 5..8u64 {
            a.try_send(1, &[i, 0], &[&long], 32).unwrap();
        }
        assert_eq!(a.cells_for(1), 8, "every message went by fastbox");
        assert_eq!(a.rings_to(1).map(|r| r.sent), Some(15));
        let got = drain(&mut b);
        assert_eq!(got.iter().map(|m| m.1).collect::<Vec<_>>(), vec![5, 6, 7]);
        assert!(got.iter().all(|m| m.2 == long));
        assert_eq!(b.rings_to(0).map(|r| r.taken), Some(15));
        // The next short one is past the lap again: the mark at 15, the message at 16.
        a.try_send(1, &[8, 0], &[&short], 16).unwrap();
        assert_eq!(a.rings_to(1).map(|r| r.sent), Some(17));
        assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![8]);
        assert_eq!(b.rings_to(0).map(|r| r.taken), Some(17));
    }

    #[test]
    fn a_message_by_cell_after_a_lap_mark_waits_for_the_mark() {
        let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 64, 16, 8).with_fbox_lap(4));
        let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
        let m = [3u8; 16];
        for i in 0..4u64 {
            a.try_send(1, &[i, 0], &[&m], 16).unwrap();
        }
        // The mark fits box 4, but box 0 of the next lap is not back yet: a cell.
        a.try_send(1, &[4, 0], &[&m], 16).unwrap();
        assert_eq!(a.cells_for(1), 7, "the fifth took a cell");
        assert!(b.has_work());
        let mut got = Vec::new();
        while got.len() < 5 {
            got.extend(drain(&mut b).into_iter().map(|m| m.1));
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert!(!b.has_work());
        // The next lap: box 0 is back.
        a.try_send(1, &[5, 0], &[&m], 16).unwrap();
        assert_eq!(a.cells_for(1), 8);
        assert_eq!(drain(&mut b).iter().map(|m| m.1).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn threads_stream_through_a_ring_in_order() {
        let r = Arc::new(HeapRegion::with_fbox_slots(2, 4, 256, 64, 8));
        let mut a = Port::new(r.clone(), 0);
        let mut b = Port::new(r, 1);
        const N: u64 = 20_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                let len = [0, 8, 64, 200][(i % 4) as usize];
                let data = vec![i as u8; len];
                while a.try_send(1, &[i, 0], &[&data], len).is_err() {
                    a.poll(|_, _, _| {}).unwrap();
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0;
        while next < N {
            b.poll(|_, env, data| {
                assert_eq!(env[0], next, "out of order");
                assert_eq!(data.len(), [0, 8, 64, 200][(next % 4) as usize]);
                assert!(data.iter().all(|&x| x == next as u8));
                next += 1;
            })
            .unwrap();
        }
        t.join().unwrap();
    }

    #[test]
    fn streams_to_says_whether_we_sent_a_long_message_since_we_last_took_one() {
        // Spans of at most 4 boxes of 64 bytes: 300 bytes take a cell.
        let r = Arc::new(HeapRegion::with_fbox_slots(2, 8, 512, 64, 4));
        let (mut a, mut b) = (Port::new(r.clone(), 0), Port::new(r, 1));
        let (short, long) = ([1u8; 8], [2u8; 100]);
        assert!(!a.streams_to(1), "nothing sent yet");
        assert!(!a.sent_since_taken(1));
        a.try_send(1, &[1, 0], &[&short], 8).unwrap();
        assert!(
            !a.streams_to(1),
            "a short message, as a header before its payload"
        );
        assert!(a.sent_since_taken(1), "but sent all the same");
        assert!(!a.sent_since_taken(0) && !a.sent_since_taken(5) && !b.sent_since_taken(0));
        a.try_send(1, &[2, 0], &[&long], 100).unwrap();
        assert!(a.streams_to(1), "a long one, by a span of boxes");
        assert!(!b.streams_to(0));
        assert!(
            !a.streams_to(0) && !a.streams_to(5),
            "not ourselves, not past the processes"
        );
        assert_eq!(drain(&mut b).len(), 2);
        assert!(a.streams_to(1), "the peer taking ours changes nothing here");
        b.try_send(0, &[3, 0], &[&short], 8).unwrap();
        assert_eq!(drain(&mut a).len(), 1);
        assert!(!a.streams_to(1), "we took one of the peer's by fastbox");
        assert!(!a.sent_since_taken(1));
        // A long one by cell starts a stream too, and one taken by cell ends it.
        let big = [3u8; 300];
        a.try_send(1, &[4, 0], &[&big], 300).unwrap();
        assert!(a.streams_to(1));
        b.try_send(0, &[5, 0], &[&big], 300).unwrap();
        let got = drain(&mut a);
        assert_eq!(got[0].2.len(), 300);
        assert!(!a.streams_to(1), "we took one of the peer's by cell");
    }

    #[test]
    fn cells_for_counts_what_a_run_of_packets_would_get() {
        let (mut a, mut b) = pair(3, 64, 0);
        let m = [1u8; 8];
        assert_eq!(a.cells_for(1), 3);
        assert_eq!(a.cells_for(0), 0, "not to ourselves");
        assert_eq!(a.cells_for(7), 0, "not past the processes");
        a.try_send(1, &[1, 0], &[&m], 8).unwrap();
        a.try_send(1, &[2, 0], &[&m], 8).unwrap();
        assert_eq!(a.cells_for(1), 1);
        assert_eq!(drain(&mut b).len(), 2);
        assert_eq!(a.cells_for(1), 3, "returned cells are taken back first");
    }

    #[test]
    fn full_when_cells_run_out_and_recovers_after_poll() {
        let (mut a, mut b) = pair(2, 64, 0);
        let m = [1u8; 8];
        a.try_send(1, &[1, 0], &[&m], 8).unwrap();
        a.try_send(1, &[2, 0], &[&m], 8).unwrap();
        assert_eq!(a.try_send(1, &[3, 0], &[&m], 8), Err(Full));
        assert!(!a.has_work());
        assert_eq!(drain(&mut b).len(), 2);
        assert!(a.has_work(), "returned cells count as work after a failed send");
        a.try_send(1, &[3, 0], &[&m], 8).unwrap();
        assert_eq!(drain(&mut b)[0].1, 3);
    }

    #[test]
    fn credit_keeps_cells_for_other_peers() {
        let r = Arc::new(HeapRegion::new(3, 4, 64, 0));
        let mut a = Port::new(r.clone(), 0);
        let mut c = Port::new(r, 2);
        assert_eq!(a.credit(), 2);
        let m = [0u8; 4];
        a.try_send(1, &[0; 2], &[&m], 4).unwrap();
        a.try_send(1, &[0; 2], &[&m], 4).unwrap();
        assert_eq!(a.try_send(1, &[0; 2], &[&m], 4), Err(Full), "peer 1 never polls");
        a.try_send(2, &[9, 0], &[&m], 4).unwrap();
        assert_eq!(drain(&mut c)[0].1, 9);
    }

    #[test]
    fn gathers_iovecs() {
        let (mut a, mut b) = pair(4, 64, 32);
        a.try_send(1, &[0; 2], &[b"ab", b"", b"cde"], 5).unwrap();
        a.try_send(1, &[0; 2], &[&[1; 40], &[2; 10]], 50).unwrap();
        let got = drain(&mut b);
        assert_eq!(got[0].2, b"abcde");
        assert_eq!(got[1].2.len(), 50);
        assert_eq!(got[1].2[45], 2);
    }

    #[test]
    fn threads_ping_pong_mixed_sizes() {
        let r = Arc::new(HeapRegion::new(2, 4, 512, 64));
        let mut a = Port::new(r.clone(), 0);
        let mut b = Port::new(r, 1);
        const N: u64 = 5000;
        let t = std::thread::spawn(move || {
            let mut next = 0u64;
            let mut echoes = std::collections::VecDeque::new();
            while next < N || !echoes.is_empty() {
                b.poll(|_, env, data| {
                    assert_eq!(env[0], next);
                    assert!(data.iter().all(|&x| x == next as u8));
                    next += 1;
                    echoes.push_back((env[0], data.to_vec()));
                })
                .unwrap();
                while let Some((i, d)) = echoes.front() {
                    if b.try_send(0, &[*i, 0], &[d], d.len()).is_err() {
                        break;
                    }
                    echoes.pop_front();
                }
                if !b.has_work() && echoes.is_empty() && next < N {
                    b.sleep(Some(Duration::from_millis(50)));
                }
            }
        });
        let mut back = 0u64;
        for i in 0..N {
            let len = [0usize, 8, 63, 64, 65, 300, 512][i as usize % 7];
            let d = vec![i as u8; len];
            while a.try_send(1, &[i, 0], &[&d], len).is_err() {
                a.poll(|_, env, _| {
                    assert_eq!(env[0], back);
                    back += 1;
                })
                .unwrap();
            }
        }
        while back < N {
            a.poll(|_, env, _| {
                assert_eq!(env[0], back);
                back += 1;
            })
            .unwrap();
        }
        t.join().unwrap();
    }

    #[test]
    fn corrupt_source_is_an_error_not_a_panic() {
        let (mut a, mut b) = pair(2, 64, 0);
        a.try_send(1, &[0; 2], &[b"x"], 1).unwrap();
        // Rewrite the cell's source as a broken peer would.
        let h = 1;
        let region = a.region().clone();
        // SAFETY: single-threaded test; nobody else touches the cell while we rewrite it.
        let mut meta = unsafe { region.cell(h).meta() };
        meta.src = 7;
        // SAFETY: as above.
        unsafe { region.cell(h).write(&meta, &[b"x"]) };
        let err = b.poll(|_, _, _| {}).unwrap_err();
        assert_eq!(err.what, "bad source");
    }
}
