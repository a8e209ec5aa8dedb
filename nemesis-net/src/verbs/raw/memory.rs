//! Registered memory: regions of our own, and registrations of the caller's memory.

use super::{Pd, errno};
use crate::verbs::VerbsError;
use rdma_mummy_sys as ffi;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// Memory of our own, registered with the device: the pools work requests name.
///
/// The bytes live in a heap block the region owns and never moves; the device may write
/// them at any time while a receive naming them is posted, so they are reached only
/// through raw pointers ([`Region::ptr`]) by code that knows nothing is posted there.
#[derive(Debug)]
pub struct Region {
    mr: NonNull<ffi::ibv_mr>,
    mem: NonNull<u8>,
    len: usize,
    _pd: Arc<Pd>,
}

// SAFETY: the region is a registration and a heap block; both may move between threads.
unsafe impl Send for Region {}
// SAFETY: `&Region` hands out only raw pointers and keys.
unsafe impl Sync for Region {}

const REGION_ALIGN: usize = 4096;

impl Region {
    /// `len` zeroed bytes, page-aligned, registered on `pd` for local writes (and for
    /// remote access when `remote`).
    ///
    /// # Errors
    /// No memory, or a registration refused; past the memory-lock limit that is
    /// [`VerbsError::MemLock`], which names `ulimit -l`.
    pub fn new(pd: &Arc<Pd>, len: usize, remote: bool) -> Result<Self, VerbsError> {
        let len = len.max(1);
        let layout = std::alloc::Layout::from_size_align(len, REGION_ALIGN)
            .map_err(|e| VerbsError::call("laying out a region", io::Error::other(e)))?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| VerbsError::call("allocating a region", io::ErrorKind::OutOfMemory.into()))?;
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        // SAFETY: a live domain and `len` bytes we own until after deregistration.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.as_ptr(),
                mem.as_ptr().cast(),
                len,
                i32::try_from(access).unwrap_or(i32::MAX),
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let e = errno();
            // SAFETY: allocated above with this layout, and registered nowhere.
            unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
            return Err(
                if e.raw_os_error() == Some(libc::ENOMEM) || e.raw_os_error() == Some(libc::EPERM) {
                    VerbsError::MemLock {
                        bytes: len,
                        source: e,
                    }
                } else {
                    VerbsError::call("ibv_reg_mr", e)
                },
            );
        };
        Ok(Self {
            mr,
            mem,
            len,
            _pd: Arc::clone(pd),
        })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: a region has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key local work requests name it by.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration; the key does not change.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The key remote work requests name it by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: a live registration, deregistered once; its owner destroyed the queue
        // pairs that could name it first (see the module documentation).
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        let layout =
            std::alloc::Layout::from_size_align(self.len, REGION_ALIGN).expect("checked at allocation");
        // SAFETY: allocated in `new` with this layout, no longer registered.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), layout) };
    }
}

/// A registration of memory the caller owns (a user's buffer), for RDMA: local and
/// remote reads, writes and atomics. Deregistered on drop.
#[derive(Debug)]
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: a registration handle; the library locks internally.
unsafe impl Send for Mr {}

impl Mr {
    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must stay allocated until the registration is dropped and every
    /// operation naming it has completed.
    ///
    /// # Errors
    /// The registration was refused; past the memory-lock limit that is
    /// [`VerbsError::MemLock`].
    pub unsafe fn new(pd: &Arc<Pd>, ptr: *mut u8, len: usize) -> Result<Self, VerbsError> {
        use ffi::ibv_access_flags as acc;
        let access = acc::IBV_ACCESS_LOCAL_WRITE.0
            | acc::IBV_ACCESS_REMOTE_WRITE.0
            | acc::IBV_ACCESS_REMOTE_READ.0
            | acc::IBV_ACCESS_REMOTE_ATOMIC.0;
        // SAFETY: the caller's contract.
        unsafe { Self::with_access(pd, ptr, len, access) }
    }

    /// Registers `len` bytes at `ptr` for peers to read only: the device never writes
    /// them, so they may be read-only pages.
    ///
    /// # Safety
    /// As for [`Mr::new`].
    ///
    /// # Errors
    /// As for [`Mr::new`].
    pub unsafe fn read_only(pd: &Arc<Pd>, ptr: *mut u8, len: usize) -> Result<Self, VerbsError> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        // SAFETY: the caller's contract.
        unsafe { Self::with_access(pd, ptr, len, access) }
    }

    /// # Safety
    /// As for [`Mr::new`].
    unsafe fn with_access(pd: &Arc<Pd>, ptr: *mut u8, len: usize, access: u32) -> Result<Self, VerbsError> {
        // SAFETY: a live domain; the caller keeps the bytes as the contract says.
        let mr = unsafe { ffi::ibv_reg_mr(pd.as_ptr(), ptr.cast(), len.max(1), access as i32) };
        match NonNull::new(mr) {
            Some(mr) => Ok(Self {
                mr,
                _pd: Arc::clone(pd),
            }),
            None => {
                let e = errno();
                Err(if matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) {
                    VerbsError::MemLock {
                        bytes: len,
                        source: e,
                    }
                } else {
                    VerbsError::call("ibv_reg_mr", e)
                })
            }
        }
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration; the key does not change.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: a live registration, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A one-sided operation on a connected pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneSided {
    /// Read the remote bytes into the local ones.
    Read,
    /// Write the local bytes into the remote ones.
    Write,
    /// Add to the remote 8-byte word; its old value lands locally.
    FetchAdd(u64),
    /// Swap the remote word for the second value if it equals the first; its old value
    /// lands locally.
    CompareSwap(u64, u64),
}
