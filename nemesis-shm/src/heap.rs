//! A [`Region`] in ordinary heap memory, for loom models and threaded tests.
//!
//! It runs the same protocol code as the shared segment; only the memory differs.

use crate::doorbell::Doorbell;
use crate::queue::{Links, QueueShared};
use crate::region::{CellAccess, CellMeta, Envelope, FboxAccess, Region, fbox_index, gather};
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, UnsafeCell};

/// A heap-backed region.
#[derive(Debug)]
pub struct HeapRegion {
    nprocs: u32,
    cells_per_proc: u32,
    cell_capacity: usize,
    fbox_capacity: usize,
    fbox_slots: u32,
    /// Boxes of a lap that a message of one box goes into ([`Region::fbox_lap`]).
    fbox_lap: u32,
    /// Most boxes one message takes.
    fbox_max_span: usize,
    recv: Vec<CachePadded<QueueShared>>,
    free: Vec<CachePadded<QueueShared>>,
    bells: Vec<CachePadded<Doorbell>>,
    lanes: Vec<HeapLane>,
    cells: Vec<HeapCell>,
}

/// One ordered pair's ring of fastboxes, with `max_span - 1` boxes after it for the rest
/// of a message that starts in the last one. A message longer than a box holds goes on
/// in the next boxes' payload areas, and, as in the segment, its bytes overwrite the
/// sequence words of the ring's boxes it runs into.
#[derive(Debug)]
struct HeapLane {
    ack: AtomicU64,
    boxes: Box<[HeapFbox]>,
}

#[derive(Debug)]
struct HeapFbox {
    seq: AtomicU64,
    data: UnsafeCell<(Envelope, usize, Box<[u8]>)>,
}

#[derive(Debug)]
struct HeapCell {
    next: AtomicU32,
    data: UnsafeCell<(CellMeta, Box<[u8]>)>,
}

// SAFETY: the unsynchronised contents (fastbox and cell data) are only accessed under
// the ownership rules of the fastbox and queue protocols, which hand them from one thread
// to another with Release/Acquire pairs, exactly as between processes.
unsafe impl Sync for HeapRegion {}
// SAFETY: nothing in the region is tied to the thread that made it.
unsafe impl Send for HeapRegion {}

impl HeapRegion {
    /// A region for `nprocs` processes with `cells_per_proc` cells of `cell_capacity`
    /// payload bytes each, and one fastbox of `fbox_capacity` bytes (0: none) per ordered
    /// pair.
    ///
    /// # Panics
    /// If `nprocs` is 0 or above 65535, or `fbox_capacity > cell_capacity`.
    pub fn new(nprocs: u32, cells_per_proc: u32, cell_capacity: usize, fbox_capacity: usize) -> Self {
        Self::with_fbox_slots(nprocs, cells_per_proc, cell_capacity, fbox_capacity, 1)
    }

    /// As [`HeapRegion::new`], with a ring of `fbox_slots` fastboxes per ordered pair.
    ///
    /// # Panics
    /// As for [`HeapRegion::new`], and if `fbox_slots` is not a power of two.
    pub fn with_fbox_slots(
        nprocs: u32,
        cells_per_proc: u32,
        cell_capacity: usize,
        fbox_capacity: usize,
        fbox_slots: u32,
    ) -> Self {
        assert!((1..=u16::MAX as u32).contains(&nprocs));
        assert!(fbox_capacity <= cell_capacity);
        assert!(fbox_slots.is_power_of_two());
        let n = nprocs as usize;
        let lanes = if fbox_capacity > 0 { n * (n - 1) } else { 0 };
        let max_span = if fbox_capacity > 0 {
            cell_capacity
                .div_ceil(fbox_capacity)
                .clamp(1, fbox_slots as usize)
        } else {
            1
        };
        Self {
            nprocs,
            cells_per_proc,
            cell_capacity,
            fbox_capacity,
            fbox_slots,
            fbox_lap: fbox_slots,
            fbox_max_span: max_span,
            recv: (0..n).map(|_| CachePadded(QueueShared::new())).collect(),
            free: (0..n).map(|_| CachePadded(QueueShared::new())).collect(),
            bells: (0..n).map(|_| CachePadded(Doorbell::new())).collect(),
            lanes: (0..lanes)
                .map(|_| HeapLane {
                    ack: AtomicU64::new(0),
                    boxes: (0..fbox_slots as usize + max_span - 1)
                        .map(|_| HeapFbox {
                            seq: AtomicU64::new(0),
                            data: UnsafeCell::new(([0; 2], 0, vec![0; fbox_capacity].into_boxed_slice())),
                        })
                        .collect(),
                })
                .collect(),
            cells: (0..n * cells_per_proc as usize)
                .map(|_| HeapCell {
                    next: AtomicU32::new(0),
                    data: UnsafeCell::new((CellMeta::default(), vec![0; cell_capacity].into_boxed_slice())),
                })
                .collect(),
        }
    }

    /// This region with messages of one box kept to the first `lap` boxes of each lap
    /// of a ring ([`Region::fbox_lap`]).
    ///
    /// # Panics
    /// If `lap` is not a power of two, or is larger than the ring.
    pub fn with_fbox_lap(mut self, lap: u32) -> Self {
        assert!(lap.is_power_of_two() && lap <= self.fbox_slots);
        self.fbox_lap = lap;
        self
    }
}

impl Links for HeapRegion {
    #[inline]
    fn link(&self, handle: u32) -> &AtomicU32 {
        &self.cells[handle as usize - 1].next
    }
}

/// A fastbox of a [`HeapRegion`]: box `at` of a ring of `slots`.
#[derive(Debug, Clone, Copy)]
pub struct HeapFboxRef<'a> {
    lane: &'a HeapLane,
    at: usize,
    slots: usize,
}

impl<'a> FboxAccess<'a> for HeapFboxRef<'a> {
    fn seq(self) -> &'a AtomicU64 {
        &self.lane.boxes[self.at].seq
    }
    unsafe fn write(self, env: &Envelope, payload: &[&[u8]], len: usize) {
        let bytes = payload.concat();
        assert_eq!(bytes.len(), len);
        let cap = self.lane.boxes[self.at].data.with(|p| {
            // SAFETY: the caller is the only writer and the reader is done with the box.
            let (_, _, buf) = unsafe { &*p };
            buf.len()
        });
        let mut chunks = bytes.chunks(cap.max(1));
        let first = chunks.next().unwrap_or(&[]);
        self.lane.boxes[self.at].data.with_mut(|p| {
            // SAFETY: as above.
            let (e, l, buf) = unsafe { &mut *p };
            *e = *env;
            *l = len;
            buf[..first.len()].copy_from_slice(first);
        });
        for (j, chunk) in chunks.enumerate() {
            let at = self.at + 1 + j;
            let b = &self.lane.boxes[at];
            b.data.with_mut(|p| {
                // SAFETY: the span's boxes are the caller's, as above.
                let (_, _, buf) = unsafe { &mut *p };
                buf[..chunk.len()].copy_from_slice(chunk);
            });
            if at < self.slots {
                // What the segment does to a box's sequence word that the bytes run over.
                let mut word = [0u8; 8];
                let n = chunk.len().min(8);
                word[..n].copy_from_slice(&chunk[..n]);
                b.seq.store(u64::from_le_bytes(word), Ordering::Relaxed);
            }
        }
    }
    unsafe fn claim(self) {
        self.lane.boxes[self.at].data.with_mut(|p| {
            // SAFETY: the caller owns the box, which its receiver does not read now.
            unsafe { (*p).1 = 0 };
        });
    }
    unsafe fn read<R>(self, short: usize, f: impl FnOnce(&Envelope, &[u8], bool) -> R) -> R {
        let (env, len, cap) = self.lane.boxes[self.at].data.with(|p| {
            // SAFETY: the caller acquired the message and the sender waits for our ack.
            let (e, l, buf) = unsafe { &*p };
            (*e, *l, buf.len())
        });
        if len <= cap {
            return self.lane.boxes[self.at].data.with(|p| {
                // SAFETY: as above.
                let (_, _, buf) = unsafe { &*p };
                f(&env, &buf[..len], len <= short)
            });
        }
        let mut bytes = Vec::with_capacity(len);
        let mut at = self.at;
        while bytes.len() < len {
            let want = (len - bytes.len()).min(cap);
            self.lane.boxes[at].data.with(|p| {
                // SAFETY: as above, for every box of the span.
                let (_, _, buf) = unsafe { &*p };
                bytes.extend_from_slice(&buf[..want])
            });
            at += 1;
        }
        f(&env, &bytes, len <= short)
    }
}

/// A cell of a [`HeapRegion`].
#[derive(Debug, Clone, Copy)]
pub struct HeapCellRef<'a>(&'a HeapCell);

impl<'a> CellAccess<'a> for HeapCellRef<'a> {
    unsafe fn write(self, meta: &CellMeta, payload: &[&[u8]]) {
        self.0.data.with_mut(|p| {
            // SAFETY: the caller owns the cell.
            let (m, buf) = unsafe { &mut *p };
            assert!(meta.len as usize <= buf.len());
            *m = *meta;
            // SAFETY: room checked above.
            unsafe { gather(buf.as_mut_ptr(), payload) };
        })
    }
    unsafe fn meta(self) -> CellMeta {
        // SAFETY: the cell was published to the caller.
        self.0.data.with(|p| unsafe { (*p).0 })
    }
    unsafe fn read<R>(self, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.0.data.with(|p| {
            // SAFETY: the cell was published to the caller.
            let (_, buf) = unsafe { &*p };
            f(&buf[..len.min(buf.len())])
        })
    }
}

impl Region for HeapRegion {
    type Fbox<'a> = HeapFboxRef<'a>;
    type Cell<'a> = HeapCellRef<'a>;
    type ProcKey = u32;
    type FboxKey = usize;
    type BoxKey = (usize, usize);

    fn nprocs(&self) -> u32 {
        self.nprocs
    }
    fn cells_per_proc(&self) -> u32 {
        self.cells_per_proc
    }
    fn cell_capacity(&self) -> usize {
        self.cell_capacity
    }
    fn fbox_capacity(&self) -> usize {
        self.fbox_capacity
    }
    fn fbox_slots(&self) -> u32 {
        self.fbox_slots
    }
    fn fbox_lap(&self) -> u32 {
        self.fbox_lap
    }
    fn fbox_span(&self, len: usize) -> u64 {
        if self.fbox_capacity == 0 {
            return 0;
        }
        let n = len.div_ceil(self.fbox_capacity).max(1);
        if n <= self.fbox_max_span { n as u64 } else { 0 }
    }
    fn proc_key(&self, p: u32) -> u32 {
        assert!(p < self.nprocs, "local process {p} of {}", self.nprocs);
        p
    }
    fn fbox_key(&self, from: u32, to: u32) -> usize {
        assert!(from != to && from < self.nprocs && to < self.nprocs && self.fbox_capacity > 0);
        fbox_index(self.nprocs, from, to)
    }
    unsafe fn recv_queue_of(&self, p: u32) -> &QueueShared {
        &self.recv[p as usize]
    }
    unsafe fn free_queue_of(&self, p: u32) -> &QueueShared {
        &self.free[p as usize]
    }
    unsafe fn doorbell_of(&self, p: u32) -> &Doorbell {
        &self.bells[p as usize]
    }
    unsafe fn box_key(&self, lane: usize, i: u64) -> (usize, usize) {
        (lane, (i & (self.fbox_slots as u64 - 1)) as usize)
    }
    unsafe fn next_box(&self, (lane, at): (usize, usize)) -> (usize, usize) {
        (lane, at + 1)
    }
    unsafe fn fbox_at(&self, (lane, at): (usize, usize)) -> HeapFboxRef<'_> {
        HeapFboxRef {
            lane: &self.lanes[lane],
            at,
            slots: self.fbox_slots as usize,
        }
    }
    unsafe fn fbox_ack_of(&self, lane: usize) -> &AtomicU64 {
        &self.lanes[lane].ack
    }
    fn cell(&self, handle: u32) -> HeapCellRef<'_> {
        HeapCellRef(&self.cells[handle as usize - 1])
    }
}
