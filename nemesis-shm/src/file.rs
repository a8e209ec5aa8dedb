//! Files in shared memory that several processes map: made under a temporary name,
//! reserved with `posix_fallocate` (so a full tmpfs is an error now, not a SIGBUS
//! later), filled in, and only then published under their name, mode 0600.
//!
//! A name may come from another process (the key-value space, a peer's message), so
//! it is checked before any path is made of it ([`check_name`]), and a file is opened
//! only if it is a regular file, not a link, owned by us and closed to everyone else:
//! in a directory anyone may write to, another user can make a file of any name first.
//!
//! Every process that has such a file open holds a shared `flock` on it, from before the
//! file has a name (it is made unnamed, `O_TMPFILE`, and linked in when ready) until the
//! process ends, however it ends. So a file of ours that nobody holds is residue of
//! processes that died before they could remove it, and [`sweep`] removes it: a launcher
//! killed in the middle of start-up leaves nothing that the next start-up keeps.

use crate::error::ShmError;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// An `mmap` that is unmapped on drop, and the file it maps, held open (and locked
/// shared) for as long as the mapping lives.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
    _file: Option<File>,
}

// SAFETY: the mapping is plain memory; what lives in it says how it may be shared.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, or of anonymous shared memory.
    pub(crate) fn new(file: Option<File>, len: usize, what: &str) -> Result<Self, ShmError> {
        let (flags, fd) = match &file {
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
            _file: file,
        })
    }
}

impl Mapping {
    /// Maps every page now, writable, so that the first transfers through it take no
    /// page faults. Best effort: a kernel before 5.14 leaves them to fault in as used.
    pub(crate) fn populate(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: advice on our own mapping, which it neither moves nor changes.
        unsafe {
            libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_POPULATE_WRITE)
        };
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

/// Longest file name this makes or opens.
const MAX_NAME: usize = 200;

/// Refuses a name that is not a plain file name of ours: every one starts with
/// `nemesis-` and holds only letters, digits, `-`, `_` and `.` (no separators, no
/// `..`), so a name from elsewhere can reach no other file.
pub fn check_name(name: &str) -> Result<(), ShmError> {
    let bad = |reason: &str| ShmError::Config {
        var: "shared-memory file name",
        value: name.chars().take(MAX_NAME).collect(),
        reason: reason.into(),
    };
    if !name.starts_with("nemesis-") || name.len() > MAX_NAME {
        return Err(bad("not a name nemesis makes: it must start with \"nemesis-\""));
    }
    if name.contains("..")
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(bad(
            "a file name holds only letters, digits, '-', '_' and '.', and no '..'",
        ));
    }
    Ok(())
}

/// Creates `dir/name` of `len` zeroed bytes, lets `fill` write into its mapping, and
/// publishes it under its name. Fails if the name exists. The file is locked shared
/// before it has a name.
pub(crate) fn create(
    dir: &Path,
    name: &str,
    len: usize,
    fill: impl FnOnce(&Mapping),
) -> Result<(Mapping, PathBuf), CreateError> {
    check_name(name)?;
    let path = dir.join(name);
    let needed = len as u64;
    if let Some(available) = free_bytes(dir)
        && available < needed
    {
        return Err(CreateError::NoSpace { needed, available });
    }
    // Unnamed until linked in, where the kernel allows; else under a hidden name.
    let (file, tmp) = match unnamed(dir) {
        Ok(f) => (f, None),
        Err(_) => {
            let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)
                .map_err(|e| ShmError::io("create", tmp.display(), e))?;
            (f, Some(tmp))
        }
    };
    let cleanup = Unlinker(tmp.clone());
    let shown = tmp.as_ref().unwrap_or(&path).display().to_string();
    hold(&file).map_err(|e| ShmError::io("flock", &shown, e))?;
    // The umask may only have narrowed the mode; make it exactly owner-only.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ShmError::io("chmod", &shown, e))?;
    // SAFETY: `file` is an open descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc == libc::ENOSPC || rc == libc::EFBIG {
        return Err(CreateError::NoSpace {
            needed,
            available: free_bytes(dir).unwrap_or(0),
        });
    } else if rc != 0 {
        let e = std::io::Error::from_raw_os_error(rc);
        return Err(ShmError::io("posix_fallocate", &shown, e).into());
    }
    let fd = file.as_raw_fd();
    let map = Mapping::new(Some(file), len, &shown)?;
    fill(&map);
    let published = match &tmp {
        Some(t) => std::fs::hard_link(t, &path),
        None => link_unnamed(fd, &path),
    };
    published.map_err(|e| ShmError::io("publish (is a job with the same id running?)", path.display(), e))?;
    drop(cleanup);
    Ok((map, path))
}

/// An unnamed regular file in `dir`, mode 0600.
fn unnamed(dir: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
}

/// Gives the unnamed file open at `fd` the name `path` (the way `open(2)` documents for
/// processes without CAP_DAC_READ_SEARCH).
fn link_unnamed(fd: RawFd, path: &Path) -> std::io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{fd}")).map_err(std::io::Error::other)?;
    let to = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: both are NUL-terminated paths; the descriptors are the special AT_FDCWD.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes a shared lock on `file`, the mark of a live user, waiting out a sweep that
/// holds it exclusively.
fn hold(file: &File) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Opens and maps the existing file `dir/name` whole. `Ok(None)` if it does not exist
/// (yet).
pub(crate) fn open(dir: &Path, name: &str, min_len: usize) -> Result<Option<Mapping>, ShmError> {
    check_name(name)?;
    let path = dir.join(name);
    let shown = path.display().to_string();
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ShmError::NotASegment {
                path: shown,
                why: "a symbolic link",
            });
        }
        Err(e) => return Err(ShmError::io("open", &shown, e)),
    };
    let meta = file.metadata().map_err(|e| ShmError::io("stat", &shown, e))?;
    check_ours(&meta, &shown)?;
    hold(&file).map_err(|e| ShmError::io("flock", &shown, e))?;
    let size = meta.len() as usize;
    if size < min_len {
        return Err(ShmError::NotASegment {
            path: shown,
            why: "too short",
        });
    }
    Mapping::new(Some(file), size, &shown).map(Some)
}

/// Files of a pipe or of the fallback way of making a file are briefly named before
/// their maker locks them; a sweep leaves them alone until they are this old.
const YOUNG: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes the files of ours in `dir` (named `nemesis-*`, or `.nemesis-*` while being
/// made) that no live process holds: what processes killed before they could clean up
/// left behind. Returns how many it removed. Other users' files, links, and whatever
/// cannot be opened are left alone.
pub fn sweep(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.as_bytes();
            n.starts_with(b"nemesis-") || n.starts_with(b".nemesis-")
        })
        .filter(|e| sweep_one(&e.path()))
        .count()
}

/// Removes `path` if it is ours and nobody holds it.
fn sweep_one(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return false;
    }
    let hidden = path.file_name().is_some_and(|n| n.as_bytes().starts_with(b"."));
    let kind = meta.file_type();
    if !(kind.is_file() || kind.is_fifo()) {
        return false;
    }
    if (kind.is_fifo() || hidden)
        && meta
            .modified()
            .is_ok_and(|m| m.elapsed().unwrap_or_default() < YOUNG)
    {
        return false;
    }
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false; // someone alive holds it
    }
    // Remove it only if the name still means this file.
    let same = std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
    same && std::fs::remove_file(path).is_ok()
}

/// Refuses a file that is not a regular file of ours that only we may use.
fn check_ours(meta: &std::fs::Metadata, shown: &str) -> Result<(), ShmError> {
    use std::os::unix::fs::MetadataExt;
    let not = |why| {
        Err(ShmError::NotASegment {
            path: shown.to_string(),
            why,
        })
    };
    if !meta.file_type().is_file() {
        return not("not a regular file");
    }
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return not("owned by another user");
    }
    if meta.mode() & 0o077 != 0 {
        return not("open to other users (a file of ours is mode 0600)");
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nemesis-file-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn only_plain_names_of_ours_pass() {
        for good in [
            "nemesis-00000000000000ab-0",
            "nemesis-x-lmt-ring-0-1",
            "nemesis-a_b.c",
        ] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = format!("nemesis-{}", "a".repeat(300));
        for bad in [
            "../../x",
            "nemesis-../x",
            "nemesis-a/b",
            "nemesis-..",
            "/dev/shm/nemesis-1",
            "nemesis-a b",
            "nemesis-a\0b",
            "nemesis-\u{e9}",
            "x-nemesis-1",
            "",
            long.as_str(),
        ] {
            assert!(
                matches!(check_name(bad), Err(ShmError::Config { .. })),
                "{bad:?} passed"
            );
        }
        let dir = tmpdir("names");
        assert!(matches!(
            open(&dir, "../../etc/passwd", 1),
            Err(ShmError::Config { .. })
        ));
        assert!(create(&dir, "../escape", 4096, |_| {}).is_err());
        assert!(!dir.parent().unwrap().join("escape").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_a_regular_file_of_ours_closed_to_others_is_opened() {
        let dir = tmpdir("ours");
        let (_m, path) = create(&dir, "nemesis-good", 4096, |_| {}).unwrap();
        assert!(open(&dir, "nemesis-good", 1).unwrap().is_some());
        assert!(open(&dir, "nemesis-absent", 1).unwrap().is_none());
        // A link to our own good file is still refused: a link is never followed.
        std::os::unix::fs::symlink(&path, dir.join("nemesis-link")).unwrap();
        let e = open(&dir, "nemesis-link", 1).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A file others may read or write.
        std::fs::write(dir.join("nemesis-open"), [0u8; 4096]).unwrap();
        std::fs::set_permissions(dir.join("nemesis-open"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = open(&dir, "nemesis-open", 1).unwrap_err();
        assert!(e.to_string().contains("other users"), "{e}");
        // Not a regular file.
        std::fs::create_dir(dir.join("nemesis-dir")).unwrap();
        assert!(open(&dir, "nemesis-dir", 1).is_err());
        // Another user's file, where this test may make one.
        let theirs = dir.join("nemesis-theirs");
        std::fs::write(&theirs, [0u8; 4096]).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
        if std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).is_ok() {
            let e = open(&dir, "nemesis-theirs", 1).unwrap_err();
            assert!(e.to_string().contains("another user"), "{e}");
        } else {
            eprintln!("skipping the other user's file: cannot change a file's owner here");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_sweep_removes_only_what_nobody_holds() {
        let dir = tmpdir("sweep");
        let (held, _) = create(&dir, "nemesis-held", 4096, |_| {}).unwrap();
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(), ["nemesis-held"], "a name other than the file's was left");
        // What a killed process leaves: a file of ours with no holder.
        std::fs::write(dir.join("nemesis-dead"), b"x").unwrap();
        // A hidden file being made, too young to judge; a link; someone else's name.
        std::fs::write(dir.join(".nemesis-young.1.tmp"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("nemesis-dead"), dir.join("nemesis-link")).unwrap();
        std::fs::write(dir.join("other-program"), b"x").unwrap();
        let opened = open(&dir, "nemesis-held", 1).unwrap().unwrap();
        assert_eq!(sweep(&dir), 1);
        assert_eq!(
            names(),
            [
                ".nemesis-young.1.tmp",
                "nemesis-held",
                "nemesis-link",
                "other-program"
            ]
        );
        // Its last holder gone, the file goes at the next sweep.
        drop(held);
        assert_eq!(sweep(&dir), 0, "one holder is left");
        drop(opened);
        assert_eq!(sweep(&dir), 1);
        assert!(!dir.join("nemesis-held").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
