//! Buffers whose RDMA registrations may be kept from one message to the next.
//!
//! Registering memory with a device pins its pages and costs a system call and a walk
//! of every page; a cache that keeps registrations of user buffers is how RDMA
//! transports avoid paying that per message. But a registration names physical pages:
//! once the buffer is freed and its addresses reused, a kept registration would move
//! the old pages' bytes. Without a hook that sees memory unmapped, only memory whose
//! lifetime the library knows can be cached. [`Pinned`] is such memory (as
//! `MPI_Alloc_mem`'s is): mapped by this module and listed while it lives, so a cache
//! can tell, by [`region_of`] and [`generation`], that a registration still names it.

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The live buffers: start address -> (length, id).
static LIVE: Mutex<BTreeMap<usize, (usize, u64)>> = Mutex::new(BTreeMap::new());
/// Ids handed out; never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Bumped whenever a buffer goes, so caches know to look for registrations to drop.
static GONE: AtomicU64 = AtomicU64::new(0);

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, (usize, u64)>> {
    // Every update leaves the map whole: a panic elsewhere cannot poison it half done.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A zeroed, page-aligned buffer owned by this library, whose registrations with an
/// RDMA device are kept until it is dropped: large messages sent from it or received
/// into it, again and again, are registered once. Derefs to `[u8]`.
///
/// ```
/// let mut b = nemesis_net::pinned::Pinned::new(1 << 20)?;
/// b[0] = 7;
/// assert_eq!((b.len(), b[0], b[1]), (1 << 20, 7, 0));
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped: at least one page.
    mapped: usize,
}

// SAFETY: it owns its mapping as a `Box<[u8]>` owns its allocation.
unsafe impl Send for Pinned {}
// SAFETY: shared access only reads, through `&[u8]`.
unsafe impl Sync for Pinned {}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Pinned {
    /// `len` zero bytes.
    ///
    /// # Errors
    /// The system refused the mapping (no memory, or a limit on mappings).
    pub fn new(len: usize) -> io::Result<Self> {
        let mapped = len.max(1);
        // SAFETY: an anonymous private mapping at an address the kernel chooses; no
        // existing memory is named.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        live().insert(ptr.as_ptr() as usize, (len, id));
        Ok(Self { ptr, len, mapped })
    }
}

impl std::ops::Deref for Pinned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable and owned by `self`; shared borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Pinned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, writable, and borrowed uniquely through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        live().remove(&(self.ptr.as_ptr() as usize));
        GONE.fetch_add(1, Ordering::Release);
        // SAFETY: the mapping made in `new`, unmapped once; nothing borrows it now. A
        // registration still kept of it pins its pages, which are no longer ours.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// A live [`Pinned`] buffer: where it starts, its length, and its id (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Its first byte.
    pub start: usize,
    /// Its length.
    pub len: usize,
    /// Its id.
    pub id: u64,
}

/// The live [`Pinned`] buffer that holds all of `len` bytes at `ptr`, if one does.
pub fn region_of(ptr: *const u8, len: usize) -> Option<Region> {
    let at = ptr as usize;
    let map = live();
    let (&start, &(rlen, id)) = map.range(..=at).next_back()?;
    let end = at.checked_add(len)?;
    (end <= start + rlen).then_some(Region { start, len: rlen, id })
}

/// Whether the buffer `r` describes still lives.
pub fn is_live(r: &Region) -> bool {
    live().get(&r.start).is_some_and(|&(_, id)| id == r.id)
}

/// A count that changes whenever a [`Pinned`] buffer goes: a cache that saw the same
/// count last time has nothing to drop.
pub fn generation() -> u64 {
    GONE.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_found_while_they_live_and_never_after() {
        let mut a = Pinned::new(10_000).unwrap();
        assert!(a.iter().all(|&b| b == 0));
        a[9_999] = 1;
        let r = region_of(a.as_ptr().wrapping_add(100), 9_900).unwrap();
        assert_eq!((r.start, r.len), (a.as_ptr() as usize, 10_000));
        assert!(is_live(&r));
        // Past its end, or ordinary memory: not pinned.
        assert_eq!(region_of(a.as_ptr().wrapping_add(100), 9_901), None);
        let heap = [0u8; 100];
        assert_eq!(region_of(heap.as_ptr(), 100), None);
        let g = generation();
        drop(a);
        assert!(!is_live(&r) && generation() != g);
        // A buffer made where the last one was is another region.
        let b = Pinned::new(10_000).unwrap();
        if let Some(r2) = region_of(b.as_ptr(), 1) {
            assert_ne!(r2.id, r.id);
        }
        let empty = Pinned::new(0).unwrap();
        assert!(empty.is_empty());
    }
}
