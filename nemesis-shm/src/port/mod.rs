//! One process's end of the shared-memory transport.
//!
//! A message to a local peer goes into the next box of the pair's ring of fastboxes when
//! it fits and the box is free, and otherwise into a cell taken from the sender's own
//! pool and enqueued on the receiver's receive queue. Both carry a per-pair sequence
//! number, and the receiver hands a message up only when its number is the next one due
//! from that sender, so fastbox and queue messages between a pair never overtake each
//! other.

use crate::queue::{Consumer, Pop, enqueue};
use crate::region::{CellAccess, CellMeta, Envelope, Region};
use crate::variant::{Sound, Variant};
use crate::wake::Wake;
use rings::{
    Rings, holds_due, put_cold, put_fbox, put_fbox_span, take_fbox, take_fbox_if, take_run, take_run_from,
};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

mod rings;

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

/// A local peer that has rings of fastboxes with us, named by its place among the
/// port's peers ([`Port::lane`]): what a caller that sends to or polls one peer at a
/// time keeps per peer, so that each call goes to the peer's rings without checking
/// the index again. Kept as the offset in bytes of the end of the peer's record (its
/// place plus one, times the record's size), so that an `Option<Lane>` is four bytes and
/// the record is one add away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane(std::num::NonZeroU32);

impl Lane {
    /// The lane to the peer at `pos` among peers whose records are `size` bytes long.
    #[inline(always)]
    fn new(pos: usize, size: usize) -> Option<Self> {
        let end = u32::try_from((pos + 1) * size).ok()?;
        std::num::NonZeroU32::new(end).map(Lane)
    }

    /// The offset of the record's end.
    #[inline(always)]
    fn end(self) -> usize {
        self.0.get() as usize
    }
}

/// How many queue cells one poll hands up at most, so a flood cannot starve the caller.
const POLL_BUDGET: usize = 64;

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

/// The private bookkeeping, apart from the region so both can be borrowed at once.
struct Book<R: Region> {
    me: u32,
    n: u32,
    /// Our own queues and doorbell.
    my: R::ProcKey,
    fbox_cap: usize,
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
            r.set_read_ahead(on);
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
        let b = &self.book;
        debug_assert!(dest < b.n && dest != b.me);
        // SAFETY: the caller guarantees `dest < n` and `dest != me`.
        match unsafe { b.lane_at(b.pos(dest)) } {
            // SAFETY: a lane of this port.
            Some(lane) => unsafe { self.try_fbox_lane(lane, env, payload, len) },
            None => false,
        }
    }

    /// The lane to local process `dest`: `None` for ourselves, past the processes, or
    /// without fastboxes.
    #[inline]
    pub fn lane(&self, dest: u32) -> Option<Lane> {
        let b = &self.book;
        if dest == b.me || dest >= b.n {
            return None;
        }
        // SAFETY: checked just above.
        unsafe { b.lane_at(b.pos(dest)) }
    }

    /// [`Port::try_fbox_unchecked`] through a lane: the next fastbox to its peer, if the
    /// message fits and the box is free; returns whether it went.
    ///
    /// # Safety
    /// `lane` came from this port's [`Port::lane`]. `len` is the total length of
    /// `payload`.
    #[inline(always)]
    pub unsafe fn try_fbox_lane(
        &mut self,
        lane: Lane,
        env: &Envelope,
        payload: &[&[u8]],
        len: usize,
    ) -> bool {
        let b = &mut self.book;
        debug_assert_eq!(len, payload.iter().map(|p| p.len()).sum::<usize>());
        let cap = b.fbox_cap;
        // SAFETY: passed on from our caller.
        let peer = unsafe { b.lane_peer(lane) };
        // A length known when compiled and below every box's capacity needs no load: a
        // lane has boxes.
        (len <= R::FBOX_CAPACITY_AT_LEAST || len <= cap)
            && put_fbox::<R, V>(&*self.region, &self.wake, peer, env, payload, len)
    }

    /// [`Port::poll_fbox_of`] through a lane: hands `f` the next message from its peer
    /// if it waits in the fastbox, and reports whether it did.
    ///
    /// # Safety
    /// `lane` came from this port's [`Port::lane`].
    #[inline]
    pub unsafe fn poll_fbox_lane<F: FnMut(u32, &Envelope, &[u8])>(&mut self, lane: Lane, mut f: F) -> bool {
        // SAFETY: passed on from our caller.
        let peer = unsafe { self.book.lane_peer(lane) };
        take_fbox::<R, V, F>(&*self.region, peer, &mut f)
    }

    /// [`Port::poll_fbox_lane`] for a message that `want(env, len)` accepts; one it does
    /// not stays due, for the next poll, and the call says false.
    ///
    /// # Safety
    /// `lane` came from this port's [`Port::lane`].
    #[inline]
    pub unsafe fn poll_fbox_lane_if<W, F>(&mut self, lane: Lane, want: W, mut f: F) -> bool
    where
        W: FnOnce(&Envelope, usize) -> bool,
        F: FnMut(u32, &Envelope, &[u8]),
    {
        // SAFETY: passed on from our caller.
        let peer = unsafe { self.book.lane_peer(lane) };
        take_fbox_if::<R, V, W, F>(&*self.region, peer, want, &mut f)
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
        let pos = b.pos(dest);
        if len <= b.fbox_cap {
            // SAFETY: checked just above.
            return unsafe { self.try_fbox_unchecked(dest, env, payload, len) }
                || self.try_one_cold(pos, env, payload, len);
        }
        len <= b.cell_cap && self.try_span(pos, env, payload, len)
    }

    /// Puts a message of one box into our ring to the peer at `pos` of the book where the
    /// one-box path's single comparison said no: past a lap's end, or a ring that looked
    /// full ([`put_cold`]).
    #[inline(always)]
    fn try_one_cold(&mut self, pos: usize, env: &Envelope, payload: &[&[u8]], len: usize) -> bool {
        let b = &mut self.book;
        put_cold::<R, V>(&*self.region, &self.wake, &mut b.peers[pos], 1, env, payload, len)
    }

    /// Puts a message longer than one box, and no longer than a cell's payload, into the
    /// boxes of our ring to the peer at `pos` of the book if they are free.
    #[inline(always)]
    fn try_span(&mut self, pos: usize, env: &Envelope, payload: &[&[u8]], len: usize) -> bool {
        let b = &mut self.book;
        put_fbox_span::<R, V>(&*self.region, &self.wake, &mut b.peers[pos], env, payload, len)
    }

    /// The path of [`Port::try_send`] after the one-box path's single comparison: a
    /// message of one box past a lap's end or into a ring that looked full, or one longer
    /// than a box, into the next boxes of the ring if they are free, else a cell from our
    /// pool onto the receiver's queue. Kept out of line so the one-box path stays small.
    /// Public for a caller that has just tried that path ([`Port::try_fbox_unchecked`]).
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
                r.sending_long();
            }
            if self.try_span(pos, env, payload, len) {
                return Ok(());
            }
        } else if self.try_one_cold(pos, env, payload, len) {
            return Ok(());
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
        // A pair's port has its own poll, without the loop ([`Port::poll_pair`]).
        for peer in b.peers.iter_mut() {
            got += take_run::<R, V, F>(region, peer, &mut f);
        }
        self.then_queue(f, got)
    }

    /// Whether the port is a pair's: one peer, with fastboxes. It stays so, which is
    /// what lets a caller that asked once use [`Port::poll_pair`].
    pub fn is_pair(&self) -> bool {
        matches!(&self.book.peers[..], [peer] if peer.boxes.is_some())
    }

    /// [`Port::poll`] for a pair's port, without the count of peers or the test for
    /// fastboxes on the way to the one ring: a caller that asked [`Port::is_pair`] once
    /// tests its own flag instead, with the others it tests anyway.
    ///
    /// # Safety
    /// [`Port::is_pair`] said true of this port.
    #[inline]
    pub unsafe fn poll_pair<F: FnMut(u32, &Envelope, &[u8])>(&mut self, mut f: F) -> Result<usize, Corrupt> {
        let b = &mut self.book;
        debug_assert!(matches!(&b.peers[..], [peer] if peer.boxes.is_some()));
        // SAFETY: a pair's port has one peer (our caller's guarantee).
        let Peer {
            index,
            boxes,
            recv_seq,
            ..
        } = unsafe { b.peers.get_unchecked_mut(0) };
        // SAFETY: and that peer has boxes.
        let r = unsafe { boxes.as_mut().unwrap_unchecked() };
        let got = take_run_from::<R, V, F>(&*self.region, *index, r, recv_seq, &mut f);
        self.then_queue(f, got)
    }

    /// The end of a poll, after the fastboxes handed up `got` messages: the receive
    /// queue, if it holds anything.
    #[inline(always)]
    fn then_queue<F: FnMut(u32, &Envelope, &[u8])>(&mut self, f: F, got: usize) -> Result<usize, Corrupt> {
        let b = &self.book;
        // SAFETY: a key of this region.
        if !b.rq.is_empty(unsafe { self.region.recv_queue_of(b.my) }) {
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
    pub fn poll_fbox_of<F: FnMut(u32, &Envelope, &[u8])>(&mut self, src: u32, f: F) -> bool {
        match self.lane(src) {
            // SAFETY: a lane of this port.
            Some(lane) => unsafe { self.poll_fbox_lane(lane, f) },
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
                if take_fbox::<R, V, F>(region, peer, f) {
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
                r.took_one();
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
            if let Some(r) = &peer.boxes
                && holds_due::<R, V>(region, r, peer.recv_seq)
            {
                return true;
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
        self.rings_to(dest).is_some_and(|r| r.sent_since_taken())
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
        self.rings_to(dest).is_some_and(|r| r.streams_long())
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

impl<R: Region> Book<R> {
    /// Where local process `p` (not us) sits in `peers`.
    #[inline(always)]
    fn pos(&self, p: u32) -> usize {
        (p - u32::from(p > self.me)) as usize
    }

    /// The lane to the peer at `pos` of `peers`, if it has rings.
    ///
    /// # Safety
    /// `pos` is below the number of peers.
    #[inline(always)]
    unsafe fn lane_at(&self, pos: usize) -> Option<Lane> {
        debug_assert!(pos < self.peers.len());
        // SAFETY: passed on from our caller.
        unsafe { self.peers.get_unchecked(pos) }.boxes.as_ref()?;
        // At most 4095 records of well under a kilobyte: the offset fits.
        Lane::new(pos, size_of::<Peer<R>>())
    }

    /// The peer that `lane` names, which has rings.
    ///
    /// # Safety
    /// `lane` came from [`Book::lane_at`] of this book.
    #[inline(always)]
    unsafe fn lane_peer(&mut self, lane: Lane) -> &mut Peer<R> {
        let size = size_of::<Peer<R>>();
        debug_assert!(lane.end() % size == 0 && lane.end() / size <= self.peers.len());
        debug_assert!(self.peers[lane.end() / size - 1].boxes.is_some());
        // SAFETY: a lane names one of the peers (the end of its record is at least one
        // record into the slice, and at most its end), only one with rings, and the
        // peers never change.
        let peer = unsafe { &mut *self.peers.as_mut_ptr().byte_add(lane.end()).sub(1) };
        // SAFETY: as above.
        unsafe { std::hint::assert_unchecked(peer.boxes.is_some()) };
        peer
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
mod tests;
