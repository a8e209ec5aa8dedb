//! What the protocol code needs from memory, whichever memory it is.
//!
//! The segment implements [`Region`] over one `mmap`; [`crate::heap::HeapRegion`]
//! implements it over ordinary allocations, for loom and for threaded tests. The port
//! logic is written once, against this trait.

use crate::doorbell::Doorbell;
use crate::queue::{Links, QueueShared};
use crate::sync::AtomicU64;

/// The 16-byte header of the layer above, carried without being looked at.
pub type Envelope = [u64; 2];

/// The control fields of a queue cell, written by the sender before it enqueues the cell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CellMeta {
    /// Local index of the sender, which owns the cell.
    pub src: u16,
    /// Local index of the receiver.
    pub dest: u16,
    /// Payload bytes.
    pub len: u32,
    /// Low 32 bits of the per-pair sequence number.
    pub seq: u32,
    /// The upper layer's header.
    pub env: Envelope,
}

/// One fastbox: a slot of the ring of boxes that one process writes and one other reads.
///
/// `seq` holds the per-pair sequence number of the message in the box and is written
/// only by the sender. The ring's acknowledgement word, written only by the receiver,
/// counts the boxes it has consumed: the sender fills box `i` (counted from 0, modulo the
/// ring) only once that count exceeds `i - slots`, and reads the word only when its last
/// reading says the ring is full, so a stream of small messages moves about one cache
/// line per message instead of a round trip.
///
/// A message longer than one box holds runs on into the following boxes, as many as
/// [`Region::fbox_span`] says; a ring has room after its last box for the rest of one
/// that starts there. The boxes it covers count as taken, and the receiver clears their
/// sequence words, which the payload overwrote, before it acknowledges them.
pub trait FboxAccess<'a>: Copy {
    /// The sequence word, which publishes the contents.
    fn seq(self) -> &'a AtomicU64;
    /// Writes a message into the box and the ones after it that its span covers.
    ///
    /// # Safety
    /// The caller is the ring's only sender, the receiver has acknowledged the messages
    /// these boxes held last, and `len` is the total length of `payload`, whose span
    /// ([`Region::fbox_span`]) is not 0.
    unsafe fn write(self, env: &Envelope, payload: &[&[u8]], len: usize);
    /// Asks the CPU for the lines a `len`-byte message in this box would be written to,
    /// for writing, without waiting for them (see `prefetch.rs`); from the second line on
    /// when `skip_first`, and then never the second alone. A hint only; a region whose
    /// boxes are not shared memory ignores it.
    #[inline(always)]
    fn prepare(self, len: usize, skip_first: bool) {
        let _ = (len, skip_first);
    }
    /// Asks the CPU for the box's first line, for reading, without waiting for it: a
    /// receiver that expects the next message there. A hint only.
    #[inline(always)]
    fn fetch(self) {}
    /// Writes to the box without publishing anything: a sender that expects to fill the
    /// box soon takes its cache line for writing now, off the path of the message.
    ///
    /// # Safety
    /// As for [`FboxAccess::write`].
    unsafe fn claim(self);
    /// Reads the message in the box in place: `f` gets its envelope, its bytes, and
    /// whether it is at most `short` bytes long. A length written larger than the
    /// longest message the ring takes is cut to it, so that a corrupt one cannot reach
    /// past the ring's room; one of at most `short` bytes (the payload one box holds,
    /// which most messages fit) is taken as it is, so that the common case tests the
    /// length once.
    ///
    /// # Safety
    /// The caller is the box's receiver, and has loaded `seq` with Acquire and found
    /// a message it has not acknowledged; `short` is at most the longest message.
    unsafe fn read<R>(self, short: usize, f: impl FnOnce(&Envelope, &[u8], bool) -> R) -> R;
}

/// One queue cell's contents.
pub trait CellAccess<'a>: Copy {
    /// Writes the control fields and the payload.
    ///
    /// # Safety
    /// The caller owns the cell (it is in no queue), and `meta.len` is the total length of
    /// `payload`, at most the region's cell capacity.
    unsafe fn write(self, meta: &CellMeta, payload: &[&[u8]]);
    /// Reads the control fields.
    ///
    /// # Safety
    /// The cell was published to the caller: the caller owns it or has acquired it from
    /// a queue, and no one else writes it meanwhile.
    unsafe fn meta(self) -> CellMeta;
    /// Reads the payload in place; `len` is clamped to the capacity.
    ///
    /// # Safety
    /// As for [`CellAccess::meta`].
    unsafe fn read<R>(self, len: usize, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// Memory laid out for `nprocs` processes: per process a receive queue, a free queue,
/// a doorbell and a pool of cells; per ordered pair a ring of fastboxes.
///
/// Process indices are node-local (`0..nprocs`). Cell handles are `index + 1`, and
/// process `p` owns handles `p * cells_per_proc + 1 ..= (p + 1) * cells_per_proc`.
///
/// The fast paths name per-process structures and fastboxes by keys: stable addresses
/// made once, checked when made, and then used without arithmetic or checks. The
/// index-based accessors panic on an index out of range.
pub trait Region: Links + Send + Sync {
    /// A fastbox.
    type Fbox<'a>: FboxAccess<'a>
    where
        Self: 'a;
    /// A cell.
    type Cell<'a>: CellAccess<'a>
    where
        Self: 'a;
    /// Names one process's queues and doorbell.
    type ProcKey: Copy + Send + Sync + std::fmt::Debug;
    /// Names one ordered pair's ring of fastboxes.
    type FboxKey: Copy + Send + Sync + std::fmt::Debug;
    /// Names one box of a ring, so that the box a process polls next is one load away.
    type BoxKey: Copy + Send + Sync + std::fmt::Debug;

    /// Number of processes.
    fn nprocs(&self) -> u32;
    /// Cells owned by each process.
    fn cells_per_proc(&self) -> u32;
    /// Largest payload of one cell.
    fn cell_capacity(&self) -> usize;
    /// Largest payload of one fastbox; 0 when fastboxes are off.
    fn fbox_capacity(&self) -> usize;
    /// A payload every fastbox of this kind of region holds, where it has fastboxes at
    /// all: a message of a length known when compiled, no longer than this, goes into a
    /// box without a look at [`Region::fbox_capacity`].
    const FBOX_CAPACITY_AT_LEAST: usize = 0;
    /// Fastboxes in each ordered pair's ring, a power of two.
    fn fbox_slots(&self) -> u32;
    /// The boxes at the start of each lap of a ring that messages of one box go into, a
    /// power of two no larger than [`Region::fbox_slots`]: a sender whose short message
    /// would go past them marks the box and goes on at the next lap's start, so that
    /// only messages of many boxes use the whole ring. A sender's choice; the receiver
    /// follows the marks.
    fn fbox_lap(&self) -> u32 {
        self.fbox_slots()
    }
    /// How many consecutive boxes a message of `len` payload bytes takes (at least 1), or
    /// 0 when it is too long for a fastbox.
    fn fbox_span(&self, len: usize) -> u64;
    /// The key of process `p`.
    fn proc_key(&self, p: u32) -> Self::ProcKey;
    /// The key of the ring of fastboxes written by `from` and read by `to`; fastboxes
    /// must be on.
    fn fbox_key(&self, from: u32, to: u32) -> Self::FboxKey;
    /// The receive queue of a process.
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn recv_queue_of(&self, k: Self::ProcKey) -> &QueueShared;
    /// The free queue of a process.
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn free_queue_of(&self, k: Self::ProcKey) -> &QueueShared;
    /// The doorbell of a process.
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn doorbell_of(&self, k: Self::ProcKey) -> &Doorbell;
    /// The key of box `i` of a ring, counted from the ring's start: the box at `i` modulo
    /// [`Region::fbox_slots`].
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn box_key(&self, k: Self::FboxKey, i: u64) -> Self::BoxKey;
    /// The key of the box right after `b` in its ring, without going round: a sender or
    /// receiver moving on by one box, where a multiply by the box's place would cost
    /// more. Past the ring's last box the key names no box, and must not be used until
    /// made again with [`Region::box_key`].
    ///
    /// # Safety
    /// `b` was made by this region.
    unsafe fn next_box(&self, b: Self::BoxKey) -> Self::BoxKey;
    /// Whether [`FboxAccess::prepare`] does anything here: a sender that knows it does
    /// not skips the work of asking.
    fn prepares(&self) -> bool {
        false
    }
    /// A box.
    ///
    /// # Safety
    /// `b` was made by this region.
    unsafe fn fbox_at(&self, b: Self::BoxKey) -> Self::Fbox<'_>;
    /// Box `i` of a ring (see [`Region::box_key`]).
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn fbox_of(&self, k: Self::FboxKey, i: u64) -> Self::Fbox<'_> {
        // SAFETY: passed on from our caller; the box key was just made by this region.
        unsafe { self.fbox_at(self.box_key(k, i)) }
    }
    /// The acknowledgement word of a ring: how many of its boxes the receiver has
    /// consumed.
    ///
    /// # Safety
    /// `k` was made by this region.
    unsafe fn fbox_ack_of(&self, k: Self::FboxKey) -> &AtomicU64;
    /// The cell with this handle.
    fn cell(&self, handle: u32) -> Self::Cell<'_>;

    /// The receive queue of process `p`.
    fn recv_queue(&self, p: u32) -> &QueueShared {
        // SAFETY: the key was just made by this region.
        unsafe { self.recv_queue_of(self.proc_key(p)) }
    }
    /// The free queue of process `p`.
    fn free_queue(&self, p: u32) -> &QueueShared {
        // SAFETY: as above.
        unsafe { self.free_queue_of(self.proc_key(p)) }
    }
    /// The doorbell of process `p`.
    fn doorbell(&self, p: u32) -> &Doorbell {
        // SAFETY: as above.
        unsafe { self.doorbell_of(self.proc_key(p)) }
    }
    /// Box `i` of the ring written by `from` and read by `to`.
    fn fbox(&self, from: u32, to: u32, i: u64) -> Self::Fbox<'_> {
        // SAFETY: as above.
        unsafe { self.fbox_of(self.fbox_key(from, to), i) }
    }
}

/// Index of the ring of fastboxes of the ordered pair (`from`, `to`) among `n * (n - 1)`, skipping
/// the diagonal.
#[inline(always)]
pub fn fbox_index(n: u32, from: u32, to: u32) -> usize {
    debug_assert!(from != to && from < n && to < n);
    (from as usize) * (n as usize - 1) + if to < from { to } else { to - 1 } as usize
}

/// Copies the slices of `payload` to `dst`.
///
/// # Safety
/// `dst` is valid for writes of the total length of `payload` and does not overlap it.
#[inline(always)]
pub(crate) unsafe fn gather(dst: *mut u8, payload: &[&[u8]]) {
    if let [one] = payload {
        // SAFETY: the caller guarantees room for the one part.
        unsafe { copy_bytes(one.as_ptr(), dst, one.len()) };
        return;
    }
    let mut off = 0;
    for part in payload {
        // SAFETY: the caller guarantees room for every part, laid end to end.
        unsafe { crate::copy::copy_large(part.as_ptr(), dst.add(off), part.len()) };
        off += part.len();
    }
}

/// Copies as much of `src` as fits into `dst` and returns how much that was: a receive
/// into a caller's buffer, inline for small sizes where a `memcpy` call costs more than
/// the copy.
#[inline(always)]
pub fn copy_into(dst: &mut [u8], src: &[u8]) -> usize {
    // A copy on each branch, of that branch's length, rather than one of the lesser:
    // where the buffer's length is known (a fixed-size one), a message that fills it is
    // copied by a constant length, in one move of its size.
    if src.len() >= dst.len() {
        let n = dst.len();
        // SAFETY: both slices hold at least `n` bytes, and a `&mut` cannot overlap a `&`.
        unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
        n
    } else {
        let n = src.len();
        // SAFETY: as above.
        unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
        n
    }
}

/// Copies `len` bytes, inline for small lengths, where a `memcpy` call would cost more
/// than the copy.
///
/// # Safety
/// `src` is valid for `len` bytes of reads, `dst` for `len` bytes of writes, and they do
/// not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    use core::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: every access below stays within `len` bytes of `src` and `dst`; the pairs
    // of accesses may overlap each other, which is fine for plain copies.
    unsafe {
        if len > 16 {
            crate::copy::copy_large(src, dst, len);
        } else if len >= 8 {
            let (a, b) = (rd(src.cast::<u64>()), rd(src.add(len - 8).cast::<u64>()));
            wr(dst.cast::<u64>(), a);
            wr(dst.add(len - 8).cast::<u64>(), b);
        } else if len >= 4 {
            let (a, b) = (rd(src.cast::<u32>()), rd(src.add(len - 4).cast::<u32>()));
            wr(dst.cast::<u32>(), a);
            wr(dst.add(len - 4).cast::<u32>(), b);
        } else {
            for i in 0..len {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn copy_bytes_every_small_length() {
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=40 {
            let mut dst = vec![0u8; 41];
            // SAFETY: both buffers hold at least `len` bytes and are distinct.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), len) };
            assert_eq!(&dst[..len], &src[..len], "len {len}");
            assert!(dst[len..].iter().all(|&b| b == 0), "len {len} wrote past the end");
        }
    }

    #[test]
    fn copy_into_copies_the_lesser_length() {
        let src: Vec<u8> = (1..=40).collect();
        for cap in [0, 1, 7, 8, 9, 16, 17, 40] {
            for len in 0..=40 {
                let mut dst = vec![0u8; cap + 1];
                let n = copy_into(&mut dst[..cap], &src[..len]);
                assert_eq!(n, len.min(cap), "cap {cap} len {len}");
                assert_eq!(&dst[..n], &src[..n], "cap {cap} len {len}");
                assert!(dst[n..].iter().all(|&b| b == 0), "cap {cap} len {len} wrote past");
            }
        }
        // A fixed-size buffer, as the constant-length branch serves.
        let mut eight = [0u8; 8];
        assert_eq!(copy_into(&mut eight, &src[..12]), 8);
        assert_eq!(&eight[..], &src[..8]);
    }

    #[test]
    fn gather_concatenates() {
        let mut dst = [0u8; 9];
        // SAFETY: 9 bytes of room for 9 bytes of parts.
        unsafe { gather(dst.as_mut_ptr(), &[b"ab", b"", b"cdefghi"]) };
        assert_eq!(&dst, b"abcdefghi");
    }
}
