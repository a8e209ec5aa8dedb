//! The node's shared segment: one mapping holding every process's queues, doorbell and
//! cells, the ring of fastboxes of every ordered pair, the blocks of node collectives and
//! the buffer every unordered pair shares for medium messages.
//!
//! Node-local process 0 creates the file under a temporary name, reserves its full size
//! with `posix_fallocate` (so a full /dev/shm is an error now, not a SIGBUS later),
//! writes the header and only then links it under its real name. The others attach and
//! check the header, everyone meets at a barrier in the segment, and the creator unlinks
//! the file: from then on a crash of any process leaves nothing behind.

use crate::coll::{self, Block, CollHead};
use crate::config::{CELL_HEADER, FBOX_HEADER, FBOX_RING_HEADER, Geometry, MAX_LOCAL_PROCS, MIN_FBOX_SIZE};
use crate::doorbell::Doorbell;
use crate::error::{Bytes, ShmError};
use crate::file::{self, CreateError, Mapping};
use crate::pairbuf::{PIECE, PairBuf, PairHead};
use crate::queue::{Links, QueueShared};
use crate::region::{CellAccess, CellMeta, Envelope, FboxAccess, Region, gather};
use crate::split::SplitWord;
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, PAD, UnsafeCell};
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::ptr::{NonNull, addr_of, addr_of_mut};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// The first word of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NEMESIS\x01");
/// Bumped whenever the meaning of the layout changes without its shape changing.
pub const LAYOUT_VERSION: u32 = 6;

#[repr(C)]
struct SegHeader {
    /// Stored last by the creator, with Release.
    magic: AtomicU64,
    version: u32,
    nprocs: u32,
    layout_hash: u64,
    job_id: u64,
    total_size: u64,
    cells_per_proc: u32,
    cell_size: u32,
    fbox_size: u32,
    fbox_slots: u32,
    node: u32,
    pair_size: u32,
    /// Names the wake sockets of the segment's processes (see `crate::wake`).
    wake_key: u64,
}

#[repr(C)]
struct Control {
    header: CachePadded<SegHeader>,
    /// Processes that have arrived at the start-up barrier.
    barrier: CachePadded<AtomicU32>,
    /// Lines for the benchmarks' probes: the placement probe bounces `probe[0]` between
    /// two processes; the single-writer floor has each write one of the two.
    probe: [CachePadded<AtomicU64>; 2],
}

#[repr(C)]
struct ProcInfo {
    pid: AtomicU32,
    state: AtomicU32,
    _pad: [u64; 7],
    /// The words of its split transfers (`crate::split`), on lines of their own: its
    /// senders write them.
    split: [SplitWord; crate::split::SLOTS],
}

const ABSENT: u32 = 0;
const ATTACHED: u32 = 1;
const LEFT: u32 = 2;

/// Everything per process except its cells; each part on its own pair of lines because
/// different processes write them.
#[repr(C)]
struct ProcSlot {
    bell: CachePadded<Doorbell>,
    recv: CachePadded<QueueShared>,
    free: CachePadded<QueueShared>,
    info: CachePadded<ProcInfo>,
}

#[repr(C)]
struct CellHeader {
    next: AtomicU32,
    src: u16,
    dest: u16,
    len: u32,
    seq: u32,
    env: Envelope,
}

/// The start of one ordered pair's ring of fastboxes, on lines of its own because the
/// receiver writes it and the sender rarely reads it; the boxes follow.
#[repr(C)]
struct LaneHead {
    ack: AtomicU64,
    _pad: [u64; 15],
}

#[repr(C)]
struct FboxHead {
    seq: AtomicU64,
    len: u32,
    _pad: u32,
    env: Envelope,
}

const _: () = {
    assert!(size_of::<CellHeader>() == CELL_HEADER as usize);
    assert!(size_of::<FboxHead>() == FBOX_HEADER as usize);
    assert!(size_of::<LaneHead>() == FBOX_RING_HEADER as usize);
    assert!(size_of::<SegHeader>() <= 128);
    assert!(size_of::<Control>() == 4 * 128);
    assert!(size_of::<ProcSlot>() == 8 * 128);
    assert!(offset_of!(ProcSlot, recv) == 128);
    assert!(offset_of!(FboxHead, env) + size_of::<Envelope>() == FBOX_HEADER as usize);
};

/// A fingerprint of every shared structure's shape. Builds that disagree refuse to share
/// a segment rather than corrupt it.
pub const LAYOUT_HASH: u64 = {
    let parts: [usize; 31] = [
        LAYOUT_VERSION as usize,
        size_of::<SegHeader>(),
        offset_of!(SegHeader, nprocs),
        offset_of!(SegHeader, layout_hash),
        offset_of!(SegHeader, job_id),
        offset_of!(SegHeader, total_size),
        offset_of!(SegHeader, fbox_size),
        offset_of!(SegHeader, fbox_slots),
        offset_of!(SegHeader, wake_key),
        offset_of!(SegHeader, pair_size),
        size_of::<PairHead>(),
        size_of::<Control>(),
        offset_of!(Control, barrier),
        offset_of!(Control, probe),
        size_of::<ProcSlot>(),
        offset_of!(ProcSlot, free),
        offset_of!(ProcSlot, info),
        offset_of!(ProcInfo, split),
        size_of::<Doorbell>(),
        size_of::<QueueShared>(),
        size_of::<CellHeader>(),
        offset_of!(CellHeader, len),
        offset_of!(CellHeader, seq),
        offset_of!(CellHeader, env),
        size_of::<FboxHead>(),
        size_of::<LaneHead>(),
        offset_of!(FboxHead, env),
        size_of::<CollHead>(),
        coll::BLOCKS,
        coll::SLOT_WORDS,
        size_of::<UnsafeCell<u64>>(),
    ];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < parts.len() {
        let mut v = parts[i] as u64;
        let mut b = 0;
        while b < 8 {
            h ^= v & 0xff;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
            v >>= 8;
            b += 1;
        }
        i += 1;
    }
    h
};

const PAGE: usize = 4096;

/// Where each region of the segment starts.
#[derive(Debug, Clone, Copy)]
struct Layout {
    nprocs: u32,
    geo: Geometry,
    procs: usize,
    fboxes: usize,
    /// The collective blocks, each a head and its slots.
    colls: usize,
    coll_stride: usize,
    /// The pair buffers, one per unordered pair.
    pairs: usize,
    cells: usize,
    total_cells: usize,
    total: usize,
}

impl Layout {
    fn new(nprocs: u32, geo: Geometry) -> Result<Self, ShmError> {
        geo.validate()?;
        let geo = geo.resolve(nprocs);
        if !(1..=MAX_LOCAL_PROCS).contains(&nprocs) {
            return Err(ShmError::Config {
                var: "local process count",
                value: nprocs.to_string(),
                reason: format!("must be between 1 and {MAX_LOCAL_PROCS}"),
            });
        }
        let too_large = || ShmError::Config {
            var: "segment size",
            value: format!("{nprocs} processes, {geo:?}"),
            reason: "does not fit the address space; lower NEMESIS_CELLS or NEMESIS_CELL_SIZE".into(),
        };
        let n = nprocs as usize;
        let procs = size_of::<Control>();
        let fboxes = procs + n * size_of::<ProcSlot>();
        let fbox_bytes = (n * (n - 1))
            .checked_mul(geo.fbox_ring_bytes())
            .ok_or_else(too_large)?;
        let colls = (fboxes + fbox_bytes).next_multiple_of(PAD);
        let coll_stride = (size_of::<CollHead>() + coll::slot_words(n) * size_of::<UnsafeCell<u64>>())
            .next_multiple_of(PAD);
        let pairs = (colls + coll::BLOCKS * coll_stride).next_multiple_of(PAGE);
        let pair_bytes = (n * (n - 1) / 2)
            .checked_mul(geo.pair_stride())
            .ok_or_else(too_large)?;
        let cells = (pairs + pair_bytes).next_multiple_of(PAGE);
        let total_cells = n
            .checked_mul(geo.cells_per_proc as usize)
            .filter(|&c| c < u32::MAX as usize)
            .ok_or_else(too_large)?;
        let total = total_cells
            .checked_mul(geo.cell_size as usize)
            .and_then(|b| b.checked_add(cells))
            .and_then(|b| b.checked_next_multiple_of(PAGE))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        Ok(Self {
            nprocs,
            geo,
            procs,
            fboxes,
            colls,
            coll_stride,
            pairs,
            cells,
            total_cells,
            total,
        })
    }
}

/// Addresses the fast paths need, so each access is one bounds check and one
/// multiply-add.
#[derive(Debug, Clone, Copy)]
struct Hot {
    slots: *mut u8,
    nprocs: usize,
    fboxes: *mut u8,
    lane_stride: usize,
    nlanes: usize,
    fbox_stride: usize,
    fbox_mask: u64,
    fbox_max_span: u64,
    fbox_span_capacity: usize,
    cells: *mut u8,
    cell_stride: usize,
    ncells: usize,
    cell_capacity: usize,
    fbox_capacity: usize,
    prefetchw: crate::prefetch::Prefetchw,
}

#[cold]
#[inline(never)]
fn out_of_range(what: &str, i: usize, n: usize) -> ! {
    panic!("{what} {i} out of range (0..{n})")
}

/// What is known of a local process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// It has not attached yet.
    Absent,
    /// It attached and its pid is alive.
    Alive {
        /// Its pid.
        pid: u32,
    },
    /// It detached cleanly.
    Left,
    /// It attached and its pid is gone.
    Dead {
        /// Its pid.
        pid: u32,
    },
}

/// How to find or make a node's segment.
#[derive(Debug, Clone)]
pub struct JoinSpec {
    /// The directory of the file (`NEMESIS_SHM_DIR`).
    pub dir: PathBuf,
    /// The file name, unique to the job and node.
    pub name: String,
    /// The job.
    pub job_id: u64,
    /// An identifier of the node's group, recorded in the header.
    pub node: u32,
    /// Processes on the node.
    pub nprocs: u32,
    /// The geometry the creator uses; the others adopt the creator's.
    pub geometry: Geometry,
    /// How long to wait for the file and for the barrier.
    pub timeout: Duration,
}

/// A mapped segment.
pub struct Segment {
    map: Mapping,
    layout: Layout,
    /// Where the hot regions start, and their strides, computed once from the layout.
    hot: Hot,
    path: Option<PathBuf>,
    /// The file still has a name that only its creator should remove.
    linked: AtomicBool,
    /// Our local index once registered, else `u32::MAX`.
    me: std::sync::atomic::AtomicU32,
    /// The pieces' stand-in cells of every pair buffer, zero-sized outside loom.
    pair_guards: Box<[UnsafeCell<()>]>,
}

// SAFETY: the mapping is shared memory whose every concurrently used field is an atomic;
// the rest is accessed under the ownership rules of the queue and fastbox protocols,
// which hold across threads as they do across processes.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("path", &self.path)
            .field("nprocs", &self.layout.nprocs)
            .field("bytes", &self.layout.total)
            .field("geometry", &self.layout.geo)
            .finish()
    }
}

impl Segment {
    /// Bytes of the segment for `nprocs` processes with geometry `geo`.
    pub fn bytes_for(nprocs: u32, geo: Geometry) -> Result<usize, ShmError> {
        Ok(Layout::new(nprocs, geo)?.total)
    }

    /// A segment in anonymous shared memory, for processes that are threads of this
    /// one, or for children forked after this call.
    pub fn anonymous(nprocs: u32, geo: Geometry) -> Result<Self, ShmError> {
        let layout = Layout::new(nprocs, geo)?;
        let map = Mapping::new(None, layout.total, "anonymous segment")?;
        let seg = Self::from_parts(map, layout, None);
        seg.write_header(0, 0);
        Ok(seg)
    }

    /// Creates, joins and, once everyone has joined, unlinks a node's segment, as local
    /// process `local`: process 0 creates it, the others attach.
    pub fn join(spec: &JoinSpec, local: u32) -> Result<Self, ShmError> {
        let deadline = Instant::now() + spec.timeout;
        let seg = if local == 0 {
            Self::create(spec)?
        } else {
            Self::attach(spec, deadline)?
        };
        if local >= seg.layout.nprocs {
            return Err(ShmError::Config {
                var: "local rank",
                value: local.to_string(),
                reason: format!("the node has {} processes", seg.layout.nprocs),
            });
        }
        seg.register(local);
        seg.barrier(deadline, spec.timeout)?;
        if local == 0 {
            seg.unlink()?;
        }
        Ok(seg)
    }

    /// Creates the file, reserves it, writes the header and publishes it under its name.
    /// First it removes what killed processes left in the directory ([`crate::sweep`]),
    /// whichever launcher started this job.
    pub fn create(spec: &JoinSpec) -> Result<Self, ShmError> {
        let layout = Layout::new(spec.nprocs, spec.geometry)?;
        crate::sweep(&spec.dir);
        // The header goes in before the file has its name; its magic is stored last.
        let write = |m: &Mapping| Self::write_header_at(m.base.as_ptr(), &layout, spec.job_id, spec.node);
        let (map, path) = match file::create(&spec.dir, &spec.name, layout.total, write) {
            Ok(m) => m,
            Err(CreateError::NoSpace { needed, available }) => {
                return Err(no_space(&spec.dir, needed, available, layout.geo));
            }
            Err(CreateError::Other(e)) => return Err(e),
        };
        let seg = Self::from_parts(map, layout, Some(path));
        seg.linked.store(true, Ordering::Relaxed);
        Ok(seg)
    }

    /// Waits for the creator's file to appear, maps it and checks its header.
    pub fn attach(spec: &JoinSpec, deadline: Instant) -> Result<Self, ShmError> {
        let path = spec.dir.join(&spec.name);
        let shown = path.display().to_string();
        let mut delay = Duration::from_micros(200);
        let map = loop {
            match file::open(&spec.dir, &spec.name, size_of::<Control>())? {
                Some(m) => break m,
                None if Instant::now() >= deadline => {
                    return Err(ShmError::Timeout {
                        what: format!("{shown} to be created by local process 0"),
                        waited: spec.timeout,
                    });
                }
                None => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(20));
                }
            }
        };
        let size = map.len;
        // SAFETY: the mapping is at least one `Control` long and page-aligned; the header's
        // fields are plain integers and atomics, valid for any bytes.
        let h = unsafe { &*map.base.as_ptr().cast::<SegHeader>() };
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(ShmError::NotASegment {
                path: shown,
                why: "bad magic number",
            });
        }
        // SAFETY: the creator wrote these before publishing the magic (Release, Acquired above).
        let (version, hash, job, nprocs, geo, total) = unsafe {
            (
                addr_of!(h.version).read(),
                addr_of!(h.layout_hash).read(),
                addr_of!(h.job_id).read(),
                addr_of!(h.nprocs).read(),
                Geometry {
                    cells_per_proc: addr_of!(h.cells_per_proc).read(),
                    cell_size: addr_of!(h.cell_size).read(),
                    fbox_size: addr_of!(h.fbox_size).read(),
                    fbox_slots: addr_of!(h.fbox_slots).read(),
                    pair_size: addr_of!(h.pair_size).read(),
                },
                addr_of!(h.total_size).read(),
            )
        };
        if version != LAYOUT_VERSION || hash != LAYOUT_HASH {
            return Err(ShmError::LayoutMismatch {
                path: shown,
                ours_version: LAYOUT_VERSION,
                ours_hash: LAYOUT_HASH,
                theirs_version: version,
                theirs_hash: hash,
            });
        }
        if job != spec.job_id {
            return Err(ShmError::WrongJob {
                path: shown,
                what: format!("job {job:#018x}, not job {:#018x}", spec.job_id),
            });
        }
        if nprocs != spec.nprocs {
            return Err(ShmError::WrongJob {
                path: shown,
                what: format!("{nprocs} local processes, but this node has {}", spec.nprocs),
            });
        }
        let layout = Layout::new(nprocs, geo)?;
        if layout.total != size || total as usize != size {
            return Err(ShmError::NotASegment {
                path: shown,
                why: "size does not match its header",
            });
        }
        Ok(Self::from_parts(map, layout, Some(path)))
    }

    fn from_parts(map: Mapping, layout: Layout, path: Option<PathBuf>) -> Self {
        let base = map.base.as_ptr();
        let n = layout.nprocs as usize;
        // SAFETY: every offset is inside the mapping by construction of the layout.
        let hot = unsafe {
            Hot {
                slots: base.add(layout.procs),
                nprocs: n,
                fboxes: base.add(layout.fboxes),
                lane_stride: layout.geo.fbox_ring_bytes(),
                nlanes: if layout.geo.fbox_size == 0 { 0 } else { n * (n - 1) },
                fbox_stride: layout.geo.fbox_size as usize,
                fbox_mask: u64::from(layout.geo.fbox_slots) - 1,
                fbox_max_span: u64::from(layout.geo.fbox_max_span()),
                fbox_span_capacity: layout.geo.fbox_span_capacity(),
                cells: base.add(layout.cells),
                cell_stride: layout.geo.cell_size as usize,
                ncells: layout.total_cells,
                cell_capacity: layout.geo.cell_capacity(),
                fbox_capacity: layout.geo.fbox_capacity(),
                prefetchw: crate::prefetch::Prefetchw::detect(),
            }
        };
        Self {
            map,
            layout,
            hot,
            path,
            linked: AtomicBool::new(false),
            me: std::sync::atomic::AtomicU32::new(u32::MAX),
            pair_guards: (0..layout.geo.pair_size as usize / PIECE)
                .map(|_| UnsafeCell::new(()))
                .collect(),
        }
    }

    fn control(&self) -> &Control {
        // SAFETY: the mapping starts with a `Control`, whose fields are valid for any bytes.
        unsafe { &*self.map.base.as_ptr().cast::<Control>() }
    }

    fn write_header(&self, job_id: u64, node: u32) {
        Self::write_header_at(self.map.base.as_ptr(), &self.layout, job_id, node);
    }

    /// Writes the header of a segment of `l` mapped at `base`, magic last (Release).
    fn write_header_at(base: *mut u8, l: &Layout, job_id: u64, node: u32) {
        let h: *mut SegHeader = base.cast();
        // SAFETY: nobody else can see the segment yet; the fields are in bounds of a
        // mapping at least one `Control` long.
        unsafe {
            addr_of_mut!((*h).version).write(LAYOUT_VERSION);
            addr_of_mut!((*h).nprocs).write(l.nprocs);
            addr_of_mut!((*h).layout_hash).write(LAYOUT_HASH);
            addr_of_mut!((*h).job_id).write(job_id);
            addr_of_mut!((*h).total_size).write(l.total as u64);
            addr_of_mut!((*h).cells_per_proc).write(l.geo.cells_per_proc);
            addr_of_mut!((*h).cell_size).write(l.geo.cell_size);
            addr_of_mut!((*h).fbox_size).write(l.geo.fbox_size);
            addr_of_mut!((*h).fbox_slots).write(l.geo.fbox_slots);
            addr_of_mut!((*h).pair_size).write(l.geo.pair_size);
            addr_of_mut!((*h).node).write(node);
            addr_of_mut!((*h).wake_key).write(crate::config::random_id());
            (*h).magic.store(MAGIC, Ordering::Release);
        }
    }

    #[inline(always)]
    fn slot(&self, p: u32) -> &ProcSlot {
        let h = &self.hot;
        if p as usize >= h.nprocs {
            out_of_range("local process", p as usize, h.nprocs);
        }
        // SAFETY: in bounds by the check and the layout; a slot is atomics only.
        unsafe { &*h.slots.add(p as usize * size_of::<ProcSlot>()).cast::<ProcSlot>() }
    }

    /// Publishes our pid as local process `local`.
    pub fn register(&self, local: u32) {
        let info = &self.slot(local).info;
        info.pid.store(std::process::id(), Ordering::Relaxed);
        info.state.store(ATTACHED, Ordering::Release);
        self.me.store(local, Ordering::Relaxed);
    }

    /// Publishes our pid as local process `local` of a segment that was not joined
    /// (an anonymous one, shared by threads or forked children), so that peers can
    /// find it; unlike [`Segment::register`] it leaves the segment's own index alone.
    pub fn publish_pid(&self, local: u32) {
        if local < self.layout.nprocs {
            let info = &self.slot(local).info;
            info.pid.store(std::process::id(), Ordering::Relaxed);
            info.state.store(ATTACHED, Ordering::Release);
        }
    }

    /// Waits until every process has arrived, failing if one died or time ran out.
    pub fn barrier(&self, deadline: Instant, timeout: Duration) -> Result<(), ShmError> {
        let n = self.layout.nprocs;
        let count = &self.control().barrier;
        count.fetch_add(1, Ordering::AcqRel);
        let mut delay = Duration::from_micros(20);
        loop {
            if count.load(Ordering::Acquire) >= n {
                return Ok(());
            }
            for p in 0..n {
                if let PeerState::Dead { pid } = self.peer_state(p) {
                    return Err(ShmError::PeerDied { local: p, pid });
                }
            }
            if Instant::now() >= deadline {
                let missing: Vec<u32> = (0..n)
                    .filter(|&p| self.peer_state(p) == PeerState::Absent)
                    .collect();
                return Err(ShmError::Timeout {
                    what: format!("local processes {missing:?} to attach to the segment"),
                    waited: timeout,
                });
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(2));
        }
    }

    /// Removes the file's name; the mapping stays. Only the creator's call does anything.
    pub fn unlink(&self) -> Result<(), ShmError> {
        if let Some(p) = &self.path {
            if self.linked.swap(false, Ordering::AcqRel) {
                std::fs::remove_file(p).map_err(|e| ShmError::io("unlink", p.display(), e))?;
            }
        }
        Ok(())
    }

    /// Word `i` of the split transfers local process `p` receives (`crate::split`);
    /// `None` past [`crate::split::SLOTS`].
    pub fn split_word(&self, p: u32, i: usize) -> Option<&SplitWord> {
        self.slot(p).info.split.get(i)
    }

    /// What is known of local process `p`.
    pub fn peer_state(&self, p: u32) -> PeerState {
        let info = &self.slot(p).info;
        match info.state.load(Ordering::Acquire) {
            ABSENT => PeerState::Absent,
            LEFT => PeerState::Left,
            _ => {
                let pid = info.pid.load(Ordering::Relaxed);
                // SAFETY: signal 0 only checks that the process exists.
                let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
                if rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
                    PeerState::Alive { pid }
                } else {
                    PeerState::Dead { pid }
                }
            }
        }
    }

    /// The file, for named segments.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Bytes mapped.
    pub fn size_bytes(&self) -> usize {
        self.layout.total
    }

    /// The key that names the wake sockets of the segment's processes: drawn by the
    /// creator, the same for every process that maps it.
    pub fn wake_key(&self) -> u64 {
        let h: *const SegHeader = self.map.base.as_ptr().cast();
        // SAFETY: the header is at the start of the mapping, written before the magic
        // was published (Release), which attaching processes acquired; it never changes.
        unsafe { addr_of!((*h).wake_key).read() }
    }

    /// The geometry in force (the creator's).
    pub fn geometry(&self) -> Geometry {
        self.layout.geo
    }

    /// Collective block `i` (below [`coll::BLOCKS`]), with room for every local process.
    pub fn coll_block(&self, i: usize) -> Option<Block<'_>> {
        if i >= coll::BLOCKS {
            return None;
        }
        let l = &self.layout;
        let n = l.nprocs as usize;
        // SAFETY: block `i` lies inside the mapping by construction of the layout, at a
        // 128-byte boundary; zeroed memory is a valid `CollHead` and valid `u64` words,
        // and every word is only used through `Block`'s protocol.
        let (head, words) = unsafe {
            let at = self.map.base.as_ptr().add(l.colls + i * l.coll_stride);
            let head = &*at.cast::<CollHead>();
            let words = std::slice::from_raw_parts(
                at.add(size_of::<CollHead>()).cast::<UnsafeCell<u64>>(),
                coll::slot_words(n),
            );
            (head, words)
        };
        Some(Block::new(head, words, n))
    }

    /// The buffer local processes `me` and `peer` share for medium messages, as `me`
    /// sees it; `None` when the segment has none, or for a process and itself.
    #[inline]
    pub fn pair_buf(&self, me: u32, peer: u32) -> Option<PairBuf<'_>> {
        let l = &self.layout;
        let n = l.nprocs as usize;
        let (a, b) = (me.min(peer) as usize, me.max(peer) as usize);
        if l.geo.pair_size == 0 || a == b || b >= n {
            return None;
        }
        // Pairs (a, b) with a < b in order: those of every smaller a, then b's place.
        let i = a * (2 * n - a - 1) / 2 + (b - a - 1);
        let stride = l.geo.pair_stride();
        // SAFETY: pair `i` lies inside the mapping by construction of the layout, at a
        // 128-byte boundary, its bytes after its head; zeroed memory is a free
        // `PairHead`; only views of this pair touch its bytes; the holder values are
        // distinct and not 0.
        unsafe {
            let at = self.map.base.as_ptr().add(l.pairs + i * stride);
            Some(PairBuf::from_raw(
                &*at.cast::<PairHead>(),
                &self.pair_guards,
                at.add(size_of::<PairHead>()),
                me + 1,
                peer + 1,
            ))
        }
    }

    /// Cache lines reserved for measuring the raw line-transfer time between two
    /// processes, next to which message latencies are reported.
    pub fn probe_lines(&self) -> [&AtomicU64; 2] {
        let p = &self.control().probe;
        [&p[0], &p[1]]
    }

    #[inline(always)]
    fn cell_ptr(&self, handle: u32) -> *mut CellHeader {
        let h = &self.hot;
        let i = (handle as usize).wrapping_sub(1);
        if i >= h.ncells {
            out_of_range("cell index", i, h.ncells);
        }
        // SAFETY: in bounds by the check and the layout.
        unsafe { h.cells.add(i * h.cell_stride).cast() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let me = self.me.load(Ordering::Relaxed);
        if me != u32::MAX {
            self.slot(me).info.state.store(LEFT, Ordering::Release);
        }
        // A creator that never reached the barrier leaves no file behind.
        let _ = self.unlink();
    }
}

fn no_space(dir: &Path, needed: u64, available: u64, geo: Geometry) -> ShmError {
    ShmError::NoSpace {
        dir: dir.display().to_string(),
        needed: Bytes(needed),
        available: Bytes(available),
        shortfall: Bytes(needed.saturating_sub(available)),
        cells: geo.cells_per_proc,
        cell_size: geo.cell_size,
        fbox_size: geo.fbox_size,
        pair_size: geo.pair_size,
    }
}

impl Links for Segment {
    #[inline(always)]
    fn link(&self, handle: u32) -> &AtomicU32 {
        // SAFETY: `cell_ptr` checked the handle; `next` is an atomic valid for any bytes.
        unsafe { &(*self.cell_ptr(handle)).next }
    }
}

/// A fastbox of a [`Segment`]. The segment's hot fields are read where a step needs
/// them, not copied in when the box is named: the claim of a reply's box then loads
/// nothing for a prepare it rarely makes.
#[derive(Debug, Clone, Copy)]
pub struct SegFbox<'a> {
    head: *mut FboxHead,
    hot: &'a Hot,
}

impl<'a> FboxAccess<'a> for SegFbox<'a> {
    #[inline(always)]
    fn seq(self) -> &'a AtomicU64 {
        // SAFETY: the head lies inside the segment, which outlives 'a.
        unsafe { &(*self.head).seq }
    }
    #[inline(always)]
    unsafe fn write(self, env: &Envelope, payload: &[&[u8]], len: usize) {
        let h = self.head;
        // SAFETY: the caller is the only writer of the span now, and the span's boxes,
        // contiguous (the ring has room after its last box), hold `len` after the header.
        unsafe {
            addr_of_mut!((*h).len).write(len as u32);
            addr_of_mut!((*h).env).write(*env);
            gather(h.cast::<u8>().add(FBOX_HEADER as usize), payload);
        }
    }
    #[inline(always)]
    fn prepare(self, len: usize, skip_first: bool) {
        let lines = (FBOX_HEADER as usize + len.min(self.hot.fbox_span_capacity)).div_ceil(64);
        let skip = usize::from(skip_first);
        // A prefetch of the second line alone (a message of two lines, its first left to
        // the receiver) made 40 to 96-byte ping-pongs 1.4-1.8 times slower than none or
        // than one of the second and third lines together, near and far, on a Zen 4
        // guest (BENCHMARKS.md, "Two-line ping-pongs"); why was not found.
        let lines = if skip_first && lines == 2 { 3 } else { lines };
        crate::prefetch::for_write(
            self.hot.prefetchw,
            self.head.cast::<u8>().wrapping_add(skip * 64),
            lines - skip,
        );
    }
    #[inline(always)]
    fn fetch(self) {
        crate::prefetch::for_read(self.head.cast::<u8>());
    }
    #[inline(always)]
    unsafe fn claim(self) {
        // SAFETY: the caller owns the box; its receiver reads the length only after the
        // sequence word publishes a message, which this does not.
        unsafe { addr_of_mut!((*self.head).len).write(0) };
    }
    #[inline(always)]
    unsafe fn read<R>(self, short: usize, f: impl FnOnce(&Envelope, &[u8], bool) -> R) -> R {
        let h = self.head;
        // SAFETY: the caller acquired the message; the sender leaves it alone until acked.
        // The length is clamped to the longest span (which `short` is not above), so a
        // corrupt one cannot reach past the ring's room.
        unsafe {
            let env = addr_of!((*h).env).read();
            let raw = addr_of!((*h).len).read() as usize;
            let at = h.cast::<u8>().add(FBOX_HEADER as usize);
            if raw <= short {
                f(&env, core::slice::from_raw_parts(at, raw), true)
            } else {
                let len = raw.min(self.hot.fbox_span_capacity);
                f(&env, core::slice::from_raw_parts(at, len), false)
            }
        }
    }
}

/// A cell of a [`Segment`].
#[derive(Debug, Clone, Copy)]
pub struct SegCell<'a> {
    cell: *mut CellHeader,
    cap: usize,
    _seg: PhantomData<&'a Segment>,
}

impl<'a> CellAccess<'a> for SegCell<'a> {
    #[inline(always)]
    unsafe fn write(self, meta: &CellMeta, payload: &[&[u8]]) {
        let c = self.cell;
        // SAFETY: the caller owns the cell and `meta.len` fits its payload area.
        unsafe {
            addr_of_mut!((*c).src).write(meta.src);
            addr_of_mut!((*c).dest).write(meta.dest);
            addr_of_mut!((*c).len).write(meta.len);
            addr_of_mut!((*c).seq).write(meta.seq);
            addr_of_mut!((*c).env).write(meta.env);
            gather(c.cast::<u8>().add(CELL_HEADER as usize), payload);
        }
    }
    #[inline(always)]
    unsafe fn meta(self) -> CellMeta {
        let c = self.cell;
        // SAFETY: the cell was published to the caller and nobody writes it meanwhile.
        unsafe {
            CellMeta {
                src: addr_of!((*c).src).read(),
                dest: addr_of!((*c).dest).read(),
                len: addr_of!((*c).len).read(),
                seq: addr_of!((*c).seq).read(),
                env: addr_of!((*c).env).read(),
            }
        }
    }
    #[inline(always)]
    unsafe fn read<R>(self, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: as for `meta`; the slice stays inside the cell.
        let data = unsafe {
            core::slice::from_raw_parts(
                self.cell.cast::<u8>().add(CELL_HEADER as usize),
                len.min(self.cap),
            )
        };
        f(data)
    }
}

/// Names a process's slot in a [`Segment`].
#[derive(Debug, Clone, Copy)]
pub struct SlotKey(NonNull<ProcSlot>);
// SAFETY: an address into shared memory; using it requires the segment (see Region).
unsafe impl Send for SlotKey {}
// SAFETY: as above.
unsafe impl Sync for SlotKey {}

/// Names one fastbox in a [`Segment`].
#[derive(Debug, Clone, Copy)]
pub struct BoxKey(NonNull<FboxHead>);
// SAFETY: an address into shared memory; using it requires the segment (see Region).
unsafe impl Send for BoxKey {}
// SAFETY: as above.
unsafe impl Sync for BoxKey {}

/// Names an ordered pair's ring of fastboxes in a [`Segment`]: the address of its first
/// box, so that naming a box is a multiply and an add; the ring's head (its
/// acknowledgement) sits just before it.
#[derive(Debug, Clone, Copy)]
pub struct FboxKey(NonNull<u8>);
// SAFETY: an address into shared memory; using it requires the segment (see Region).
unsafe impl Send for FboxKey {}
// SAFETY: as above.
unsafe impl Sync for FboxKey {}

impl Region for Segment {
    // The smallest box `Geometry::validate` lets through, less its header.
    const FBOX_CAPACITY_AT_LEAST: usize = (MIN_FBOX_SIZE - FBOX_HEADER) as usize;
    type Fbox<'a> = SegFbox<'a>;
    type Cell<'a> = SegCell<'a>;
    type ProcKey = SlotKey;
    type FboxKey = FboxKey;
    type BoxKey = BoxKey;

    #[inline(always)]
    fn nprocs(&self) -> u32 {
        self.layout.nprocs
    }
    #[inline(always)]
    fn cells_per_proc(&self) -> u32 {
        self.layout.geo.cells_per_proc
    }
    #[inline(always)]
    fn cell_capacity(&self) -> usize {
        self.hot.cell_capacity
    }
    #[inline(always)]
    fn fbox_capacity(&self) -> usize {
        self.hot.fbox_capacity
    }
    #[inline(always)]
    fn fbox_slots(&self) -> u32 {
        self.layout.geo.fbox_slots
    }
    fn fbox_lap(&self) -> u32 {
        self.layout.geo.fbox_lap()
    }
    #[inline(always)]
    fn fbox_span(&self, len: usize) -> u64 {
        let h = &self.hot;
        if h.fbox_stride == 0 {
            return 0;
        }
        let n = (len + FBOX_HEADER as usize).div_ceil(h.fbox_stride) as u64;
        if n <= h.fbox_max_span { n } else { 0 }
    }
    fn proc_key(&self, p: u32) -> SlotKey {
        SlotKey(NonNull::from(self.slot(p)))
    }
    fn fbox_key(&self, from: u32, to: u32) -> FboxKey {
        let h = &self.hot;
        let n = h.nprocs as u32;
        assert!(
            from != to && from < n && to < n,
            "no fastbox from {from} to {to} of {n}"
        );
        let index = crate::region::fbox_index(n, from, to);
        if index >= h.nlanes {
            out_of_range("fastbox ring", index, h.nlanes);
        }
        // SAFETY: in bounds by the check and the layout: the boxes follow the ring's head.
        let first = unsafe { h.fboxes.add(index * h.lane_stride + size_of::<LaneHead>()) };
        FboxKey(NonNull::new(first).expect("mapping is not null"))
    }
    #[inline(always)]
    unsafe fn recv_queue_of(&self, k: SlotKey) -> &QueueShared {
        // SAFETY: the caller passes a key of this segment, which outlives the borrow.
        unsafe { &k.0.as_ref().recv }
    }
    #[inline(always)]
    unsafe fn free_queue_of(&self, k: SlotKey) -> &QueueShared {
        // SAFETY: as above.
        unsafe { &k.0.as_ref().free }
    }
    #[inline(always)]
    unsafe fn doorbell_of(&self, k: SlotKey) -> &Doorbell {
        // SAFETY: as above.
        unsafe { &k.0.as_ref().bell }
    }
    #[inline(always)]
    unsafe fn box_key(&self, k: FboxKey, i: u64) -> BoxKey {
        let h = &self.hot;
        let at = (i & h.fbox_mask) as usize * h.fbox_stride;
        // SAFETY: the caller passes a key of this segment, the ring's first box; the mask
        // keeps the index inside the ring.
        BoxKey(unsafe { k.0.add(at).cast() })
    }
    #[inline(always)]
    unsafe fn next_box(&self, b: BoxKey) -> BoxKey {
        // SAFETY: `b` is a box of one of the segment's rings, so one stride on is still in
        // the mapping: the next box, the ring's room for a long message's rest, the next
        // ring's head, or the collective blocks after the last ring. Past the ring's last
        // box the key is never used as a box until made again (the trait's contract).
        BoxKey(unsafe { b.0.byte_add(self.hot.fbox_stride) })
    }
    #[inline(always)]
    fn prepares(&self) -> bool {
        self.hot.prefetchw.yes()
    }
    #[inline(always)]
    unsafe fn fbox_at(&self, b: BoxKey) -> SegFbox<'_> {
        SegFbox {
            head: b.0.as_ptr(),
            hot: &self.hot,
        }
    }
    #[inline(always)]
    unsafe fn fbox_ack_of(&self, k: FboxKey) -> &AtomicU64 {
        // SAFETY: the caller passes a key of this segment, which outlives the borrow; the
        // ring's head lies just before its first box.
        unsafe { &k.0.sub(size_of::<LaneHead>()).cast::<LaneHead>().as_ref().ack }
    }
    #[inline(always)]
    fn cell(&self, handle: u32) -> SegCell<'_> {
        SegCell {
            cell: self.cell_ptr(handle),
            cap: self.hot.cell_capacity,
            _seg: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests;
