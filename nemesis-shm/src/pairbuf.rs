//! The buffer that two processes of a node share for medium messages, one per unordered
//! pair, used by whichever side claims it.
//!
//! Why both directions share one: a line written by one process and read by the other
//! crosses between their caches once, but a sender that writes lines its peer read last
//! must first take them back, a second crossing. In a ping-pong the reply goes out
//! through the lines the request came in on, which the replier has just read: a 64 KiB
//! ping-pong of two copies took 5.9 µs this way and 7.8 µs through a buffer per direction
//! on the Intel Xeon guest (BENCHMARKS.md).
//!
//! The protocol, one message at a time:
//! - `holder` is 0 when the buffer is free, else the claimer's local index plus one. A
//!   sender claims it with a compare-and-swap (Acquire, so it sees the last reader done).
//! - The sender announces the message in the channel, then writes it piece by piece,
//!   storing after each piece the bytes written so far in `written` (Release).
//! - The receiver copies each piece out once `written` (Acquire) covers it. With the
//!   whole message copied it stores `written = 0`, then `holder = 0` (Release), which
//!   hands the buffer to the next claimer after its last read.
//!
//! A sender that finds the buffer held sends through the channel instead; nobody waits
//! for it.

use crate::ring::{Seg, SegCursor};
use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};
use crate::variant::{Sound, Variant};
use std::marker::PhantomData;

/// Bytes a sender writes before it publishes them: a receiver copies a piece out while
/// the next is written.
pub const PIECE: usize = 8 << 10;

/// The head of a pair's buffer, on a line pair of its own; the bytes follow.
#[repr(C)]
#[derive(Debug)]
pub struct PairHead {
    holder: AtomicU32,
    /// The holder value of the last claimer: which way the last message went.
    last: AtomicU32,
    written: AtomicU64,
    _rest: [u64; 14],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<PairHead>() == crate::sync::PAD);

/// One pair's buffer, as one of its two processes sees it.
#[derive(Debug)]
pub struct PairBuf<'a, V: Variant = Sound> {
    head: &'a PairHead,
    /// Stand-ins for the pieces' bytes, so loom can check who touches them when.
    guards: &'a [UnsafeCell<()>],
    data: *mut u8,
    /// Our `holder` value and the peer's.
    me: u32,
    peer: u32,
    _v: PhantomData<V>,
}

impl<'a, V: Variant> PairBuf<'a, V> {
    /// The buffer of `guards.len()` pieces at `data` with head `head`, seen by the
    /// process whose holder value is `me`; `peer` is the other's.
    ///
    /// # Safety
    /// `data` must be valid for `guards.len() * PIECE` bytes for `'a`, and touched by
    /// nothing but views of the same buffer; `me` and `peer` must be distinct and not 0.
    pub unsafe fn from_raw(
        head: &'a PairHead,
        guards: &'a [UnsafeCell<()>],
        data: *mut u8,
        me: u32,
        peer: u32,
    ) -> Self {
        debug_assert!(me != 0 && peer != 0 && me != peer);
        Self {
            head,
            guards,
            data,
            me,
            peer,
            _v: PhantomData,
        }
    }

    /// Bytes one message may take.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.guards.len() * PIECE
    }

    /// Sender: takes the buffer if it is free.
    #[inline]
    pub fn try_claim(&self) -> bool {
        let won = self
            .head
            .holder
            .compare_exchange(0, self.me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if won {
            self.head.last.store(self.me, Ordering::Relaxed);
        }
        won
    }

    /// Whether the last message through the buffer came from the peer, so that a
    /// message now answers it through lines this side has just read. After one of our
    /// own, a stream, the lines were read by the peer last: a sender gains nothing from
    /// the buffer then, and the fastboxes, whose lines it asks for ahead, serve it
    /// better. A hint: read without ordering.
    #[inline]
    pub fn answers(&self) -> bool {
        self.head.last.load(Ordering::Relaxed) != self.me
    }

    /// Sender: gives back a buffer claimed for a message that was never announced.
    pub fn unclaim(&self) {
        self.head.holder.store(0, Ordering::Release);
    }

    /// Receiver: whether the peer holds the buffer, as the announcement of a message in
    /// it says.
    #[inline]
    pub fn held_by_peer(&self) -> bool {
        self.head.holder.load(Ordering::Relaxed) == self.peer
    }

    /// Sender, holding the buffer: copies the first `total` bytes of `src` in, publishing
    /// each piece as it lands.
    ///
    /// # Safety
    /// Every piece of `src` must be readable for its length and hold `total` bytes in
    /// all; the caller must hold the buffer.
    pub unsafe fn fill(&self, src: &[Seg], total: usize) {
        assert!(
            total <= self.capacity(),
            "{total} bytes in a pair buffer of {}",
            self.capacity()
        );
        let mut at = SegCursor::default();
        let mut done = 0;
        while done < total {
            let n = (total - done).min(PIECE);
            // SAFETY: `done + n <= total <= capacity`, inside `data` (from_raw's contract);
            // the bytes are ours while we hold the buffer and have not published them.
            let dst = unsafe { self.data.add(done) };
            self.guards[done / PIECE].with_mut(|_| {
                let mut put = 0;
                at.walk(src, n, |p, len| {
                    // SAFETY: `p` is readable for `len` (fill's contract), and the piece
                    // has room: `put + len <= n <= PIECE`.
                    unsafe { crate::copy::copy_large(p, dst.add(put), len) };
                    put += len;
                });
            });
            done += n;
            self.head.written.store(done as u64, V::PAIR_PUBLISH);
        }
    }

    /// Receiver: bytes of the announced message published so far, never more than fit.
    #[inline]
    pub fn written(&self) -> usize {
        (self.head.written.load(Ordering::Acquire) as usize).min(self.capacity())
    }

    /// Receiver: hands `f` the published bytes from `from` up to `to`, a piece at a
    /// time. `from` must be where an earlier call ended (or 0), `to` at most what
    /// [`PairBuf::written`] returned.
    ///
    /// # Safety
    /// The peer must hold the buffer for the message being read, and have published
    /// `to` bytes of it.
    pub unsafe fn read(&self, mut from: usize, to: usize, mut f: impl FnMut(&[u8])) {
        let to = to.min(self.capacity());
        while from < to {
            let k = from / PIECE;
            let end = ((k + 1) * PIECE).min(to);
            self.guards[k].with(|_| {
                // SAFETY: `from..end` is inside `data` and published: the peer writes no
                // published byte until we hand the buffer back.
                f(unsafe { std::slice::from_raw_parts(self.data.add(from), end - from) })
            });
            from = end;
        }
    }

    /// Receiver: hands `f` what is published of the announced `total`-byte message from
    /// byte `got` on, a piece at a time, and frees the buffer once the whole message is
    /// read; returns how many of its bytes are read now. A message already read whole
    /// (`got == total`) is left alone: the buffer was freed then, and may be another's.
    ///
    /// # Safety
    /// The peer must have claimed the buffer for this message and announced it, and
    /// `got` must be what the last call returned (or 0).
    pub unsafe fn drain(&self, got: usize, total: usize, f: impl FnMut(&[u8])) -> usize {
        if got >= total {
            return got;
        }
        let upto = self.written().min(total);
        if upto > got {
            // SAFETY: the peer holds the buffer for the message (our contract) and has
            // published `upto` bytes of it.
            unsafe { self.read(got, upto, f) };
        }
        let got = upto.max(got);
        if got == total {
            self.release();
        }
        got
    }

    /// Receiver, after its last read of the message: frees the buffer.
    pub fn release(&self) {
        self.head.written.store(0, Ordering::Relaxed);
        self.head.holder.store(0, V::PAIR_RELEASE);
    }
}

/// A pair buffer on the heap, for the loom models and tests.
#[derive(Debug)]
pub struct HeapPair {
    head: Box<PairHead>,
    guards: Box<[UnsafeCell<()>]>,
    data: Box<[core::cell::UnsafeCell<u8>]>,
}

// SAFETY: the bytes are only touched through `PairBuf`, whose protocol gives them one
// owner at a time; the rest are atomics.
unsafe impl Sync for HeapPair {}
// SAFETY: as for `Sync`.
unsafe impl Send for HeapPair {}

impl HeapPair {
    /// A free buffer of `pieces` pieces.
    pub fn new(pieces: usize) -> Self {
        Self {
            head: Box::new(PairHead {
                holder: AtomicU32::new(0),
                last: AtomicU32::new(0),
                written: AtomicU64::new(0),
                _rest: [0; 14],
            }),
            guards: (0..pieces).map(|_| UnsafeCell::new(())).collect(),
            data: (0..pieces * PIECE)
                .map(|_| core::cell::UnsafeCell::new(0))
                .collect(),
        }
    }

    /// Process `side`'s view (0 or 1).
    pub fn view<V: Variant>(&self, side: u32) -> PairBuf<'_, V> {
        let data = core::cell::UnsafeCell::raw_get(self.data.as_ptr());
        // SAFETY: `data` holds `pieces * PIECE` bytes owned by this buffer, which only
        // views of it touch; the holder values 1 and 2 differ and are not 0.
        unsafe { PairBuf::from_raw(&self.head, &self.guards, data, side + 1, 2 - side) }
    }
}

/// Where the pair buffers of one process's peers are: the node's segment, and which
/// local process each rank is.
#[cfg(not(loom))]
#[derive(Debug, Clone)]
pub struct PairBufs {
    seg: std::sync::Arc<crate::Segment>,
    me: u32,
    /// Rank to local index, `u32::MAX` for ourselves and ranks elsewhere.
    local_of: std::sync::Arc<[u32]>,
}

#[cfg(not(loom))]
impl PairBufs {
    /// The buffers of local process `me` of `seg`, whose peers' local indices `local_of`
    /// gives by rank (`u32::MAX` for none); `None` when the segment has none.
    pub fn new(seg: std::sync::Arc<crate::Segment>, me: u32, local_of: Vec<u32>) -> Option<Self> {
        if seg.geometry().pair_size == 0 {
            return None;
        }
        Some(Self {
            seg,
            me,
            local_of: local_of.into(),
        })
    }

    /// The buffer shared with `rank`, if it is a local peer.
    #[inline]
    pub fn with(&self, rank: u32) -> Option<PairBuf<'_>> {
        let peer = *self.local_of.get(rank as usize)?;
        self.seg.pair_buf(self.me, peer)
    }

    /// Whether a message to `rank` now would answer the last one through the buffer
    /// the two share ([`PairBuf::answers`]); false where they share none.
    #[inline]
    pub fn answers(&self, rank: u32) -> bool {
        self.with(rank).is_some_and(|pb| pb.answers())
    }

    /// Bytes one message may take.
    pub fn capacity(&self) -> usize {
        self.seg.geometry().pair_size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_at_a_time_and_the_buffer_goes_back() {
        let hp = HeapPair::new(3);
        let (a, b) = (hp.view::<Sound>(0), hp.view::<Sound>(1));
        assert_eq!(a.capacity(), 3 * PIECE);
        assert!(!b.held_by_peer());
        assert!(a.answers() && b.answers(), "nothing went through it yet");
        assert!(a.try_claim());
        assert!(!a.answers() && b.answers(), "the last message is ours");
        assert!(!a.try_claim(), "held by us already");
        assert!(!b.try_claim(), "held by the peer");
        assert!(b.held_by_peer());
        let msg: Vec<u8> = (0..2 * PIECE + 100).map(|i| (i % 251) as u8).collect();
        // SAFETY: `msg` lives across the call and holds the bytes; `a` holds the buffer.
        unsafe {
            a.fill(
                &[Seg::of(&msg[..PIECE + 3]), Seg::of(&msg[PIECE + 3..])],
                msg.len(),
            )
        };
        assert_eq!(b.written(), msg.len());
        let mut got = Vec::new();
        let mut pieces = 0;
        // SAFETY: the peer holds the buffer and published every byte.
        unsafe {
            b.read(0, PIECE + 1, |s| {
                got.extend_from_slice(s);
                pieces += 1;
            })
        };
        assert_eq!(pieces, 2, "a read stops at the pieces' edges");
        // SAFETY: as above.
        unsafe { b.read(PIECE + 1, msg.len(), |s| got.extend_from_slice(s)) };
        assert_eq!(got, msg);
        b.release();
        assert_eq!(b.written(), 0);
        assert!(b.try_claim(), "the reader may reply through it");
        assert!(a.held_by_peer());
        b.unclaim();
        assert!(a.try_claim());
    }

    #[test]
    fn a_drain_frees_the_buffer_once_the_message_is_read_and_never_again() {
        let hp = HeapPair::new(2);
        let (a, b) = (hp.view::<Sound>(0), hp.view::<Sound>(1));
        let msg: Vec<u8> = (0..PIECE + 10).map(|i| (i % 253) as u8).collect();
        let mut got = Vec::new();
        assert!(a.try_claim());
        // SAFETY: the peer claimed the buffer for this message.
        let n = unsafe { b.drain(0, msg.len(), |s| got.extend_from_slice(s)) };
        assert_eq!(n, 0, "nothing published yet");
        // SAFETY: `msg` holds the bytes; `a` holds the buffer.
        unsafe { a.fill(&[Seg::of(&msg)], msg.len()) };
        // SAFETY: as above; `n` is what the last drain returned.
        let n = unsafe { b.drain(n, msg.len(), |s| got.extend_from_slice(s)) };
        assert_eq!((n, &got), (msg.len(), &msg));
        assert!(b.try_claim(), "freed once read whole");
        // SAFETY: as above.
        let again = unsafe { b.drain(n, msg.len(), |_| panic!("read twice")) };
        assert_eq!(again, msg.len());
        assert!(
            a.held_by_peer(),
            "a second drain did not free the new holder's buffer"
        );
    }

    #[test]
    #[should_panic(expected = "in a pair buffer of")]
    fn a_message_larger_than_the_buffer_is_refused() {
        let hp = HeapPair::new(1);
        let a = hp.view::<Sound>(0);
        assert!(a.try_claim());
        let msg = vec![0u8; PIECE + 1];
        // SAFETY: `msg` holds the bytes.
        unsafe { a.fill(&[Seg::of(&msg)], msg.len()) };
    }
}
