//! The file of a window's memory on one node: a control block (each member's lock and
//! completion counter, and its row of exposure counters), then each member's memory,
//! page-aligned. The node's lowest member makes it; the others map it; once all have,
//! the maker unlinks it, so nothing is left behind however the processes end.

use super::lock::RwTicket;
use crate::error::{Bytes, ShmError};
use crate::file::{self, CreateError, Mapping};
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, PAD};
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

const MAGIC: u64 = u64::from_le_bytes(*b"NEMWIN\x00\x01");
/// Members' memory starts on a page, so that any element type is aligned.
const DATA_ALIGN: usize = 4096;
/// Most members one file serves.
pub const MAX_MEMBERS: usize = crate::config::MAX_LOCAL_PROCS as usize;

#[repr(C)]
struct Head {
    /// Stored last by the maker, with Release.
    magic: AtomicU64,
    members: u64,
    total: u64,
}

/// One member's synchronisation words, each on its own lines: the lock is taken by
/// every origin, the completion counter bumped by the origins of its exposure epochs.
#[repr(C)]
struct Sync {
    lock: CachePadded<RwTicket>,
    complete: CachePadded<AtomicU32>,
}

/// Where everything is, for `n` members of the given sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    members: usize,
    table: usize,
    sync: usize,
    exposure: usize,
    row: usize,
    data: Vec<(usize, usize)>,
    total: usize,
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

impl Layout {
    fn new(sizes: &[u64]) -> Option<Self> {
        let n = sizes.len();
        if n == 0 || n > MAX_MEMBERS {
            return None;
        }
        let table = PAD;
        let sync = round_up(table + 16 * n, PAD)?;
        let exposure = sync + n * size_of::<Sync>();
        let row = round_up(4 * n, PAD)?;
        let mut at = round_up(exposure + n * row, DATA_ALIGN)?;
        let mut data = Vec::with_capacity(n);
        for &s in sizes {
            let s = usize::try_from(s).ok()?;
            data.push((at, s));
            at = round_up(at.checked_add(s)?, DATA_ALIGN)?;
        }
        Some(Self {
            members: n,
            table,
            sync,
            exposure,
            row,
            data,
            total: at.max(DATA_ALIGN),
        })
    }
}

/// A mapped window file.
#[derive(Debug)]
pub struct WinFile {
    map: Mapping,
    layout: Layout,
    path: PathBuf,
}

impl WinFile {
    /// Makes `dir/name` for members whose memory is `sizes` bytes each, all zero.
    ///
    /// # Errors
    /// [`ShmError::Config`] naming `NEMESIS_SHM_DIR` when the directory has less room
    /// than the window needs (with both sizes), or too many members; the file system's.
    pub fn create(dir: &Path, name: &str, sizes: &[u64]) -> Result<Self, ShmError> {
        let layout = Layout::new(sizes).ok_or_else(|| ShmError::Config {
            var: "window size",
            value: format!("{} members of {:?} bytes", sizes.len(), sizes),
            reason: format!("a window file serves 1 to {MAX_MEMBERS} members and fits in memory"),
        })?;
        let fill = |m: &Mapping| {
            let base = m.base.as_ptr();
            // SAFETY: the mapping is `layout.total` bytes, zeroed, and seen by nobody
            // else yet; the head and the table are inside it, at their offsets, aligned.
            unsafe {
                let h = base.cast::<Head>();
                std::ptr::addr_of_mut!((*h).members).write(layout.members as u64);
                std::ptr::addr_of_mut!((*h).total).write(layout.total as u64);
                let t = base.add(layout.table).cast::<u64>();
                for (i, &(off, len)) in layout.data.iter().enumerate() {
                    t.add(2 * i).write(off as u64);
                    t.add(2 * i + 1).write(len as u64);
                }
                (*h).magic.store(MAGIC, Ordering::Release);
            }
        };
        let (map, path) = match file::create(dir, name, layout.total, fill) {
            Ok(m) => m,
            Err(CreateError::Other(e)) => return Err(e),
            Err(CreateError::NoSpace { needed, available }) => {
                return Err(ShmError::Config {
                    var: "NEMESIS_SHM_DIR",
                    value: dir.display().to_string(),
                    reason: format!(
                        "a window of {} on this node needs {} there, which has {} free; \
                         make the window smaller or point NEMESIS_SHM_DIR at a larger tmpfs",
                        Bytes(sizes.iter().sum()),
                        Bytes(needed),
                        Bytes(available)
                    ),
                });
            }
        };
        Ok(Self { map, layout, path })
    }

    /// Maps `dir/name`, made by another member for members of `sizes` bytes each;
    /// `Ok(None)` if it is not there.
    ///
    /// # Errors
    /// [`ShmError::NotASegment`] for a file that is not such a window, or one made for
    /// other sizes; the file system's.
    pub fn open(dir: &Path, name: &str, sizes: &[u64]) -> Result<Option<Self>, ShmError> {
        let path = dir.join(name);
        let shown = path.display().to_string();
        let not = |why| ShmError::NotASegment {
            path: shown.clone(),
            why,
        };
        let layout = Layout::new(sizes).ok_or_else(|| not("made for an impossible member list"))?;
        let Some(map) = file::open(dir, name, PAD)? else {
            return Ok(None);
        };
        // SAFETY: the mapping is at least `PAD` bytes; the head is plain integers and an
        // atomic, valid for any bytes.
        let h = unsafe { &*map.base.as_ptr().cast::<Head>() };
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(not("not a window"));
        }
        if map.len != layout.total || h.members != layout.members as u64 || h.total != layout.total as u64 {
            return Err(not("a window made for other members or sizes"));
        }
        // SAFETY: the table is inside the mapping (the layout fits `map.len`).
        let t = unsafe { map.base.as_ptr().add(layout.table).cast::<u64>() };
        for (i, &(off, len)) in layout.data.iter().enumerate() {
            // SAFETY: as above: entry `i` of `members` is inside the table.
            let (o, l) = unsafe { (t.add(2 * i).read(), t.add(2 * i + 1).read()) };
            if (o, l) != (off as u64, len as u64) {
                return Err(not("a window whose member table differs"));
            }
        }
        Ok(Some(Self { map, layout, path }))
    }

    /// Removes the file's name; every mapping stays.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Members it serves.
    pub fn members(&self) -> usize {
        self.layout.members
    }

    /// Bytes mapped.
    pub fn size_bytes(&self) -> usize {
        self.layout.total
    }

    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + size_of::<T>() <= self.layout.total);
        // SAFETY: every caller computes `off` from the layout, inside the mapping and
        // aligned for `T`; the control block holds only atomics, valid for any bytes.
        unsafe { &*self.map.base.as_ptr().add(off).cast::<T>() }
    }

    fn sync(&self, m: usize) -> &Sync {
        assert!(
            m < self.layout.members,
            "member {m} of a window of {}",
            self.layout.members
        );
        self.at(self.layout.sync + m * size_of::<Sync>())
    }

    /// Member `m`'s lock.
    ///
    /// # Panics
    /// If `m` is not a member: a caller's bug, never an input.
    pub fn lock(&self, m: usize) -> &RwTicket {
        &self.sync(m).lock
    }

    /// Member `m`'s completion counter, which its exposure epochs' origins bump.
    ///
    /// # Panics
    /// As for [`WinFile::lock`].
    pub fn complete(&self, m: usize) -> &AtomicU32 {
        &self.sync(m).complete
    }

    /// Origin `o`'s exposure counter for target `t`, which `t`'s posts bump.
    ///
    /// # Panics
    /// As for [`WinFile::lock`].
    pub fn exposure(&self, o: usize, t: usize) -> &AtomicU32 {
        let n = self.layout.members;
        assert!(o < n && t < n, "members {o} and {t} of a window of {n}");
        self.at(self.layout.exposure + o * self.layout.row + 4 * t)
    }

    /// Member `m`'s memory: where it starts in this mapping, and its length.
    ///
    /// # Panics
    /// As for [`WinFile::lock`].
    pub fn data(&self, m: usize) -> (NonNull<u8>, usize) {
        let (off, len) = self.layout.data[m];
        // SAFETY: the layout puts every member's memory inside the mapping.
        let p = unsafe { self.map.base.as_ptr().add(off) };
        (NonNull::new(p).expect("inside a mapping"), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nemesis-win-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn two_mappings_share_memory_and_words() {
        let dir = tmpdir("share");
        let sizes = [10u64, 0, 5000];
        let a = WinFile::create(&dir, "nemesis-w", &sizes).unwrap();
        assert!(
            WinFile::create(&dir, "nemesis-w", &sizes).is_err(),
            "a second creation"
        );
        assert!(
            WinFile::open(&dir, "nemesis-w", &[10, 0, 5001]).is_err(),
            "other sizes"
        );
        let b = WinFile::open(&dir, "nemesis-w", &sizes).unwrap().unwrap();
        a.unlink();
        assert!(WinFile::open(&dir, "nemesis-w", &sizes).unwrap().is_none());
        for (m, &size) in sizes.iter().enumerate() {
            let (p, len) = a.data(m);
            assert_eq!(len as u64, size);
            assert_eq!(p.as_ptr() as usize % DATA_ALIGN, 0);
            // SAFETY: the member's memory, used by nothing else in this test.
            unsafe { p.as_ptr().write_bytes(m as u8 + 1, len) };
        }
        let (p, len) = b.data(2);
        // SAFETY: as above.
        let seen = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
        assert!(seen.iter().all(|&x| x == 3));
        b.exposure(2, 1).fetch_add(5, Ordering::Relaxed);
        assert_eq!(a.exposure(2, 1).load(Ordering::Relaxed), 5);
        assert_eq!(a.exposure(1, 2).load(Ordering::Relaxed), 0);
        let t = a.lock(0).ticket();
        assert!(b.lock(0).writer_turn(t));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_window_larger_than_the_directory_names_the_size_and_the_variable() {
        let dir = tmpdir("big");
        let e = WinFile::create(&dir, "nemesis-huge", &[1 << 62]).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("NEMESIS_SHM_DIR") || s.contains("window size"), "{s}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
