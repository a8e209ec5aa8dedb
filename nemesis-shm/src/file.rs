//! Files in shared memory that several processes map: made under a temporary name,
//! reserved with `posix_fallocate` (so a full tmpfs is an error now, not a SIGBUS
//! later), filled in, and only then published under their name, mode 0600.

use crate::error::ShmError;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// An `mmap` that is unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
}

// SAFETY: the mapping is plain memory; what lives in it says how it may be shared.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, or of anonymous shared memory.
    pub(crate) fn new(file: Option<&File>, len: usize, what: &str) -> Result<Self, ShmError> {
        let (flags, fd) = match file {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping at an address of the kernel's choosing; it aliases no
        // Rust object, and `fd` is open for the duration of the call.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::last_os("mmap", what));
        }
        Ok(Self {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nothing borrows it past our owner.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Why a file could not be made.
#[derive(Debug)]
pub(crate) enum CreateError {
    /// The file system has less room than the file needs.
    NoSpace {
        /// Bytes the file needs.
        needed: u64,
        /// Bytes the file system had.
        available: u64,
    },
    /// Anything else.
    Other(ShmError),
}

impl From<ShmError> for CreateError {
    fn from(e: ShmError) -> Self {
        Self::Other(e)
    }
}

/// Creates `dir/name` of `len` zeroed bytes, lets `fill` write into its mapping, and
/// publishes it under its name. Fails if the name exists.
pub(crate) fn create(
    dir: &Path,
    name: &str,
    len: usize,
    fill: impl FnOnce(&Mapping),
) -> Result<(Mapping, PathBuf), CreateError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let needed = len as u64;
    if let Some(available) = free_bytes(dir)
        && available < needed
    {
        return Err(CreateError::NoSpace { needed, available });
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| ShmError::io("create", tmp.display(), e))?;
    let cleanup = Unlinker(Some(tmp.clone()));
    // The umask may only have narrowed the mode; make it exactly owner-only.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ShmError::io("chmod", tmp.display(), e))?;
    // SAFETY: `file` is an open descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc == libc::ENOSPC || rc == libc::EFBIG {
        return Err(CreateError::NoSpace {
            needed,
            available: free_bytes(dir).unwrap_or(0),
        });
    } else if rc != 0 {
        let e = std::io::Error::from_raw_os_error(rc);
        return Err(ShmError::io("posix_fallocate", tmp.display(), e).into());
    }
    let map = Mapping::new(Some(&file), len, &tmp.display().to_string())?;
    fill(&map);
    std::fs::hard_link(&tmp, &path)
        .map_err(|e| ShmError::io("publish (is a job with the same id running?)", path.display(), e))?;
    drop(cleanup);
    Ok((map, path))
}

/// Opens and maps an existing file whole; returns the mapping and the file's size.
/// `Ok(None)` if it does not exist (yet).
pub(crate) fn open(path: &Path, min_len: usize) -> Result<Option<Mapping>, ShmError> {
    let shown = path.display().to_string();
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ShmError::io("open", &shown, e)),
    };
    let size = file
        .metadata()
        .map_err(|e| ShmError::io("stat", &shown, e))?
        .len() as usize;
    if size < min_len {
        return Err(ShmError::NotASegment {
            path: shown,
            why: "too short",
        });
    }
    Mapping::new(Some(&file), size, &shown).map(Some)
}

/// Bytes free for an unprivileged user on the file system of `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero bytes are a valid statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Removes a file on drop unless disarmed.
struct Unlinker(Option<PathBuf>);
impl Drop for Unlinker {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
