//! The copy ring of a large-message transfer between two processes on a node: the
//! sender fills slots while the receiver drains them, so the two copies overlap.
//!
//! Each slot has a length word. Zero means the slot is the sender's to fill; otherwise
//! it holds that many bytes for the receiver. The sender stores the length with Release
//! after filling the slot, the receiver loads it with Acquire before copying out and
//! stores zero with Release after, so each slot's bytes have one owner at a time. Both
//! sides walk the slots in order and keep their place between transfers; a transfer is
//! the next `total` bytes, and only one is in the ring at a time.

use crate::sync::{AtomicU32, CachePadded, Ordering, PAD, UnsafeCell};
use crate::variant::{Sound, Variant};
use std::marker::PhantomData;

/// A piece of a message buffer: `len` bytes at `ptr`. Transfers take lists of them, so
/// a message made of several slices moves without being packed first.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    /// The first byte.
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

// SAFETY: a `Seg` is an address and a length; whoever dereferences it answers for the
// memory (see the `unsafe` functions that take them).
unsafe impl Send for Seg {}

impl Seg {
    /// The piece covering `s`, to read from.
    pub fn of(s: &[u8]) -> Self {
        Self {
            ptr: s.as_ptr().cast_mut(),
            len: s.len(),
        }
    }

    /// The piece covering `s`, to write into.
    pub fn of_mut(s: &mut [u8]) -> Self {
        Self {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }
}

/// A position inside a list of [`Seg`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegCursor {
    seg: usize,
    off: usize,
}

impl SegCursor {
    /// Walks `n` bytes of `segs` from the cursor in contiguous runs, handing each to `f`
    /// with its address and length; stops early at the end of the list.
    pub fn walk(&mut self, segs: &[Seg], mut n: usize, mut f: impl FnMut(*mut u8, usize)) {
        while n > 0 && self.seg < segs.len() {
            let s = segs[self.seg];
            let take = (s.len - self.off).min(n);
            if take > 0 {
                // SAFETY: `off + take <= len`, inside the piece; this only computes an
                // address, the caller of the unsafe transfer vouches for the memory.
                f(unsafe { s.ptr.add(self.off) }, take);
            }
            self.off += take;
            n -= take;
            if self.off == s.len {
                self.seg += 1;
                self.off = 0;
            }
        }
    }
}

/// The shape of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Slots in the ring.
    pub slots: u32,
    /// Bytes per slot, a multiple of 4096.
    pub slot_size: u32,
}

impl RingGeometry {
    /// Bytes of a ring file of this shape.
    pub fn bytes(&self) -> usize {
        Self::data_offset(self.slots) + self.slots as usize * self.slot_size as usize
    }

    fn data_offset(slots: u32) -> usize {
        (PAD + slots as usize * PAD).next_multiple_of(4096)
    }
}

/// A side's place in a ring, kept between transfers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Place {
    slot: u32,
}

/// One direction's ring, as either side sees it.
#[derive(Debug)]
pub struct Ring<'a, V: Variant = Sound> {
    lens: &'a [CachePadded<AtomicU32>],
    /// Stand-ins for the slots' bytes, so loom can check who touches them when.
    guards: &'a [UnsafeCell<()>],
    data: *mut u8,
    slot_size: usize,
    _v: PhantomData<V>,
}

impl<V: Variant> Clone for Ring<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V: Variant> Copy for Ring<'_, V> {}

impl<'a, V: Variant> Ring<'a, V> {
    /// A ring of `lens.len()` slots of `slot_size` bytes at `data`.
    ///
    /// # Safety
    /// `data` must be valid for `lens.len() * slot_size` bytes for `'a`, touched by
    /// nothing but rings over the same words, and `guards` as long as `lens`.
    pub unsafe fn from_raw(
        lens: &'a [CachePadded<AtomicU32>],
        guards: &'a [UnsafeCell<()>],
        data: *mut u8,
        slot_size: usize,
    ) -> Self {
        assert_eq!(lens.len(), guards.len());
        Self {
            lens,
            guards,
            data,
            slot_size,
            _v: PhantomData,
        }
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Sender: copies bytes `*done..total` of the message in `src` into free slots,
    /// advancing `*done`, `at` and `place`; returns without waiting when the ring is full.
    ///
    /// # Safety
    /// Every piece of `src` must be readable for its length, and `src` must hold at
    /// least `total` bytes; `at` must be where `*done` is in `src`.
    pub unsafe fn push(
        &self,
        place: &mut Place,
        src: &[Seg],
        at: &mut SegCursor,
        done: &mut usize,
        total: usize,
    ) {
        while *done < total {
            let slot = place.slot as usize;
            if self.lens[slot].load(Ordering::Acquire) != 0 {
                return;
            }
            let n = (total - *done).min(self.slot_size);
            // SAFETY: the slot is inside `data` (from_raw's contract), and it is ours:
            // its length was zero, stored by the receiver after its last read.
            let dst = unsafe { self.data.add(slot * self.slot_size) };
            self.guards[slot].with_mut(|_| {
                let mut put = 0;
                at.walk(src, n, |p, len| {
                    // SAFETY: `p` is readable for `len` (push's contract), and the
                    // destination has room: `put + len <= n <= slot_size`.
                    unsafe { crate::copy::copy_large(p, dst.add(put), len) };
                    put += len;
                });
            });
            self.lens[slot].store(n as u32, V::RING_PUBLISH);
            *done += n;
            place.slot = ((slot + 1) % self.lens.len()) as u32;
        }
    }

    /// Receiver: copies the next slots of the message into `dst` while they are full,
    /// advancing `*done` towards `total`, `at` and `place`. Bytes beyond the end of
    /// `dst` are drained and dropped. Returns without waiting when the ring is empty.
    ///
    /// # Safety
    /// Every piece of `dst` must be writable for its length and not otherwise in use;
    /// `at` must be where `*done` is in `dst` (or its end).
    pub unsafe fn pull(
        &self,
        place: &mut Place,
        dst: &[Seg],
        at: &mut SegCursor,
        done: &mut usize,
        total: usize,
    ) {
        while *done < total {
            let slot = place.slot as usize;
            let n = self.lens[slot].load(Ordering::Acquire) as usize;
            if n == 0 {
                return;
            }
            // A slot never holds more than the transfer still lacks or than fits: a
            // larger length is the peer's bug, and is clipped rather than trusted.
            let n = n.min(self.slot_size).min(total - *done);
            // SAFETY: as in `push`; the slot is ours until we store zero below.
            let src = unsafe { self.data.add(slot * self.slot_size) };
            self.guards[slot].with(|_| {
                let mut got = 0;
                at.walk(dst, n, |p, len| {
                    // SAFETY: `p` is writable for `len` (pull's contract) and the slot
                    // holds `n >= got + len` bytes.
                    unsafe { crate::copy::copy_large(src.add(got), p, len) };
                    got += len;
                });
            });
            self.lens[slot].store(0, V::RING_RETURN);
            *done += n;
            place.slot = ((slot + 1) % self.lens.len()) as u32;
        }
    }
}

/// A ring on the heap, for the loom models and tests.
#[derive(Debug)]
pub struct HeapRing {
    lens: Box<[CachePadded<AtomicU32>]>,
    guards: Box<[UnsafeCell<()>]>,
    data: Box<[core::cell::UnsafeCell<u8>]>,
    slot_size: usize,
}

// SAFETY: the bytes are only touched through `Ring`, whose protocol gives each slot one
// owner at a time; the rest are atomics.
unsafe impl Sync for HeapRing {}
// SAFETY: as for `Sync`.
unsafe impl Send for HeapRing {}

impl HeapRing {
    /// An empty ring of `slots` slots of `slot_size` bytes.
    pub fn new(slots: usize, slot_size: usize) -> Self {
        Self {
            lens: (0..slots).map(|_| CachePadded(AtomicU32::new(0))).collect(),
            guards: (0..slots).map(|_| UnsafeCell::new(())).collect(),
            data: (0..slots * slot_size)
                .map(|_| core::cell::UnsafeCell::new(0))
                .collect(),
            slot_size,
        }
    }

    /// Its view.
    pub fn ring<V: Variant>(&self) -> Ring<'_, V> {
        let data = core::cell::UnsafeCell::raw_get(self.data.as_ptr());
        // SAFETY: `data` holds `slots * slot_size` bytes owned by this ring, which only
        // rings over the same words touch.
        unsafe { Ring::from_raw(&self.lens, &self.guards, data, self.slot_size) }
    }
}

/// A ring in a file of the node's shared-memory directory, made by the receiver and
/// mapped by the sender.
#[cfg(not(loom))]
pub use file_ring::RingFile;

#[cfg(not(loom))]
mod file_ring {
    use super::*;
    use crate::error::ShmError;
    use crate::file::{self, CreateError, Mapping};
    use crate::sync::AtomicU64;
    use std::path::{Path, PathBuf};

    const MAGIC: u64 = u64::from_le_bytes(*b"NEMRING\x01");

    #[repr(C)]
    struct Head {
        magic: AtomicU64,
        slots: u32,
        slot_size: u32,
    }

    /// A mapped ring file.
    #[derive(Debug)]
    pub struct RingFile {
        map: Mapping,
        geo: RingGeometry,
        /// The slots' stand-in cells: zero-sized outside loom.
        guards: Box<[UnsafeCell<()>]>,
        path: PathBuf,
    }

    impl RingFile {
        /// Makes `dir/name` with an empty ring of shape `geo`.
        pub fn create(dir: &Path, name: &str, geo: RingGeometry) -> Result<Self, ShmError> {
            if geo.slots == 0 || geo.slot_size == 0 || geo.slot_size % 4096 != 0 {
                return Err(ShmError::Config {
                    var: "ring geometry",
                    value: format!("{} slots of {} bytes", geo.slots, geo.slot_size),
                    reason: "needs at least one slot, of a whole number of 4096-byte pages".into(),
                });
            }
            let fill = |m: &Mapping| {
                let h = m.base.as_ptr().cast::<Head>();
                // SAFETY: the mapping starts with a `Head` and nobody else sees it yet;
                // the magic goes last, with Release.
                unsafe {
                    (*h).slots = geo.slots;
                    (*h).slot_size = geo.slot_size;
                    (*h).magic.store(MAGIC, Ordering::Release);
                }
            };
            let (map, path) = match file::create(dir, name, geo.bytes(), fill) {
                Ok(m) => m,
                Err(CreateError::Other(e)) => return Err(e),
                Err(CreateError::NoSpace { needed, available }) => {
                    return Err(ShmError::Config {
                        var: "NEMESIS_LMT_RING_SLOTS",
                        value: format!("{} x {} bytes", geo.slots, geo.slot_size),
                        reason: format!(
                            "a copy ring needs {needed} bytes in {}, which has {available}; \
                             shrink the ring or choose another NEMESIS_LMT",
                            dir.display()
                        ),
                    });
                }
            };
            Ok(Self::from_map(map, geo, path))
        }

        /// Maps the ring `dir/name` made by the peer; `Ok(None)` if it is not there.
        pub fn open(dir: &Path, name: &str) -> Result<Option<Self>, ShmError> {
            let path = dir.join(name);
            let Some(map) = file::open(dir, name, PAD)? else {
                return Ok(None);
            };
            let shown = path.display().to_string();
            // SAFETY: the mapping is at least `PAD` bytes; the head's fields are plain
            // integers and an atomic, valid for any bytes.
            let h = unsafe { &*map.base.as_ptr().cast::<Head>() };
            if h.magic.load(Ordering::Acquire) != MAGIC {
                return Err(ShmError::NotASegment {
                    path: shown,
                    why: "not a copy ring",
                });
            }
            let geo = RingGeometry {
                slots: h.slots,
                slot_size: h.slot_size,
            };
            if geo.slots == 0 || geo.slot_size == 0 || geo.bytes() != map.len {
                return Err(ShmError::NotASegment {
                    path: shown,
                    why: "ring size does not match its head",
                });
            }
            Ok(Some(Self::from_map(map, geo, path)))
        }

        fn from_map(map: Mapping, geo: RingGeometry, path: PathBuf) -> Self {
            // A ring is made for a large transfer, which would otherwise take a fault on
            // each of its pages the first time round (on each side).
            map.populate();
            let guards = (0..geo.slots).map(|_| UnsafeCell::new(())).collect();
            Self {
                map,
                geo,
                guards,
                path,
            }
        }

        /// Removes the file's name; both mappings stay.
        pub fn unlink(&self) {
            let _ = std::fs::remove_file(&self.path);
        }

        /// Its shape.
        pub fn geometry(&self) -> RingGeometry {
            self.geo
        }

        /// The ring.
        pub fn ring(&self) -> Ring<'_> {
            let base = self.map.base.as_ptr();
            let n = self.geo.slots as usize;
            // SAFETY: the layout puts `n` padded length words after the head and the
            // slots' bytes at `data_offset`, all inside the mapping (checked against
            // the file's size); zeroed or peer-written words are valid atomics, and
            // only rings over this file touch the bytes.
            unsafe {
                let lens = std::slice::from_raw_parts(base.add(PAD).cast::<CachePadded<AtomicU32>>(), n);
                let data = base.add(RingGeometry::data_offset(self.geo.slots));
                Ring::from_raw(lens, &self.guards, data, self.geo.slot_size as usize)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Moves `total` bytes through `ring` from `src` pieces into `dst` pieces, the two
    /// sides on two threads.
    fn transfer(hr: Arc<HeapRing>, src: Vec<Vec<u8>>, mut dst: Vec<Vec<u8>>, total: usize) -> Vec<Vec<u8>> {
        let h2 = hr.clone();
        let sender = std::thread::spawn(move || {
            let ring = h2.ring::<Sound>();
            let segs: Vec<Seg> = src.iter().map(|s| Seg::of(s)).collect();
            let (mut place, mut at, mut done) = (Place::default(), SegCursor::default(), 0);
            while done < total {
                // SAFETY: the pieces are the live vectors above.
                unsafe { ring.push(&mut place, &segs, &mut at, &mut done, total) };
                std::hint::spin_loop();
            }
        });
        let ring = hr.ring::<Sound>();
        let segs: Vec<Seg> = dst.iter_mut().map(|d| Seg::of_mut(d)).collect();
        let (mut place, mut at, mut done) = (Place::default(), SegCursor::default(), 0);
        while done < total {
            // SAFETY: the pieces are the live vectors above, used by nothing else.
            unsafe { ring.pull(&mut place, &segs, &mut at, &mut done, total) };
            std::hint::spin_loop();
        }
        sender.join().unwrap();
        dst
    }

    #[test]
    fn a_message_larger_than_the_ring_arrives_whole() {
        let data = pattern(1_000_003, 7);
        let out = transfer(
            Arc::new(HeapRing::new(4, 4096)),
            vec![data.clone()],
            vec![vec![0; data.len()]],
            data.len(),
        );
        assert!(out[0] == data);
    }

    #[test]
    fn gather_and_scatter_lists_need_no_packing() {
        let data = pattern(50_000, 3);
        let src: Vec<Vec<u8>> = [1, 4095, 4097, 0, 20_000, 21_807]
            .iter()
            .scan(0, |at, &n| {
                let v = data[*at..*at + n].to_vec();
                *at += n;
                Some(v)
            })
            .collect();
        let dst = vec![vec![0u8; 7], vec![0u8; 33_333], vec![0u8; 16_660]];
        let out = transfer(Arc::new(HeapRing::new(3, 8192)), src, dst, data.len());
        assert!(out.concat() == data);
    }

    #[test]
    fn a_short_destination_keeps_its_prefix_and_the_rest_is_drained() {
        let data = pattern(30_000, 9);
        let hr = Arc::new(HeapRing::new(2, 4096));
        let out = transfer(hr.clone(), vec![data.clone()], vec![vec![0; 10_000]], data.len());
        assert!(out[0] == data[..10_000]);
        // The ring is empty and in step afterwards: the next transfer works.
        let next = pattern(9000, 1);
        let out = transfer(hr, vec![next.clone()], vec![vec![0; 9000]], 9000);
        assert!(out[0] == next);
    }

    #[test]
    fn a_ring_file_is_shared_between_mappings_and_checked_on_open() {
        let dir = std::env::temp_dir().join(format!("nemesis-ring-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let geo = RingGeometry {
            slots: 3,
            slot_size: 8192,
        };
        let a = RingFile::create(&dir, "nemesis-r", geo).unwrap();
        assert!(
            RingFile::create(&dir, "nemesis-r", geo).is_err(),
            "a second creation of one name"
        );
        let b = RingFile::open(&dir, "nemesis-r")
            .unwrap()
            .expect("the file is there");
        assert_eq!(b.geometry(), geo);
        a.unlink();
        assert!(RingFile::open(&dir, "nemesis-r").unwrap().is_none());
        std::fs::write(dir.join("nemesis-junk"), vec![0u8; 8192]).unwrap();
        assert!(RingFile::open(&dir, "nemesis-junk").is_err());
        assert!(
            RingFile::create(
                &dir,
                "nemesis-bad",
                RingGeometry {
                    slots: 2,
                    slot_size: 1000
                }
            )
            .is_err()
        );
        // Bytes pushed through one mapping come out of the other.
        let data = pattern(100_000, 5);
        let mut out = vec![0u8; data.len()];
        let (ra, rb) = (a.ring(), b.ring());
        let (mut pa, mut pb) = (Place::default(), Place::default());
        let (mut ca, mut cb) = (SegCursor::default(), SegCursor::default());
        let (mut sent, mut got) = (0, 0);
        let (src, dst) = ([Seg::of(&data)], [Seg::of_mut(&mut out)]);
        while got < data.len() {
            // SAFETY: the buffers are live locals, used by nothing else meanwhile.
            unsafe {
                ra.push(&mut pa, &src, &mut ca, &mut sent, data.len());
                rb.pull(&mut pb, &dst, &mut cb, &mut got, data.len());
            }
        }
        assert!(out == data);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
