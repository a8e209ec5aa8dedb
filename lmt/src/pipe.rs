//! Single-copy transfer through a pipe: the sender splices its own pages into the pipe
//! with `vmsplice` (the kernel keeps references, it copies nothing), and the receiver
//! `read`s them into its buffer. The pipe is a FIFO per ordered pair, made by the
//! receiver in the shared-memory directory and unlinked by the sender once open.
//!
//! Until the receiver has read them, the pipe refers to the sender's pages, so the
//! sender must keep its buffer unchanged until DONE.

use crate::iov;
use crate::{LmtError, Seg, Strategy, Xfer};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Pipe capacity asked for; the kernel caps it at `fs.pipe-max-size`.
const PIPE_BYTES: i32 = 1 << 20;

/// Bytes one step moves at most, as [`crate::policy::CMA_STEP`] for CMA: while the other
/// side keeps up, the pipe never fills or empties, and a step would run on until the
/// whole message had moved, holding up the progress call (a `test`) that made it.
const STEP_BYTES: usize = crate::policy::CMA_STEP;

fn io_err(peer: u32, e: io::Error) -> LmtError {
    LmtError::Io {
        peer,
        strategy: Strategy::Vmsplice,
        source: e,
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("a NUL byte in the path"))
}

/// The receiving end.
#[derive(Debug)]
pub struct PipeIn {
    fd: OwnedFd,
    path: PathBuf,
    scratch: Vec<u8>,
}

impl PipeIn {
    /// Makes the FIFO `dir/name` and opens it for reading. It is opened read-write, so
    /// a read before the sender opens it finds it empty rather than at its end.
    pub fn create(dir: &Path, name: &str, peer: u32) -> Result<Self, LmtError> {
        let path = dir.join(name);
        let c = cpath(&path).map_err(|e| io_err(peer, e))?;
        // SAFETY: `c` is a NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(io_err(peer, io::Error::last_os_error()));
        }
        // SAFETY: as above; the flags are plain open flags.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(io_err(peer, e));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A shared lock for as long as we hold it: a sweep removes only what nobody holds.
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) } != 0 {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(io_err(peer, e));
        }
        // A larger pipe means fewer turns; a smaller one still works.
        // SAFETY: fcntl on an open descriptor with an integer argument.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        Ok(Self {
            fd,
            path,
            scratch: Vec::new(),
        })
    }

    /// The FIFO's file name.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Reads what the pipe holds of `x`, into `dst` while it lasts, then into scratch.
    ///
    /// # Safety
    /// `dst` must be valid for writing for its whole length and not otherwise in use.
    pub(crate) unsafe fn step(&mut self, x: &mut Xfer, dst: &[Seg]) -> Result<(), LmtError> {
        let stop = x.total.min(x.done + STEP_BYTES);
        while x.done < stop {
            let left = stop - x.done;
            let (v, n) = iov::local(dst, x.at, left);
            let got = if n > 0 {
                // SAFETY: the pieces are inside `dst` (the caller's contract).
                unsafe { libc::readv(self.fd.as_raw_fd(), v.as_ptr(), v.len() as _) }
            } else {
                // The buffer is full (a truncated or dropped receive): drain.
                self.scratch.resize(left.min(1 << 16), 0);
                // SAFETY: the scratch vector is ours and this long.
                unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        self.scratch.as_mut_ptr().cast(),
                        self.scratch.len(),
                    )
                }
            };
            if got < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(());
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_err(x.peer, e));
            }
            let got = got as usize;
            if got == 0 {
                return Ok(());
            }
            if n > 0 {
                iov::advance(dst, &mut x.at, got);
            }
            x.done += got;
        }
        Ok(())
    }
}

impl Drop for PipeIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The sending end.
#[derive(Debug)]
pub struct PipeOut {
    fd: OwnedFd,
}

impl PipeOut {
    /// Opens the receiver's FIFO `dir/name` for writing and removes its name.
    pub fn open(dir: &Path, name: &str, peer: u32) -> Result<Self, LmtError> {
        nemesis_shm::check_name(name).map_err(|e| LmtError::BadCookie {
            peer,
            why: e.to_string(),
        })?;
        let path = dir.join(name);
        let c = cpath(&path).map_err(|e| io_err(peer, e))?;
        // SAFETY: a NUL-terminated path and plain flags. O_NONBLOCK fails with ENXIO,
        // rather than waiting, if the reader is gone; O_NOFOLLOW refuses a link.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(io_err(peer, io::Error::last_os_error()));
        }
        // SAFETY: just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat fills the buffer on success.
        let ok = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } == 0;
        // SAFETY: initialised by the successful fstat.
        let st = ok.then(|| unsafe { st.assume_init() });
        // In a directory anyone may write to, only a pipe of ours, closed to others, will do.
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !st.is_some_and(|st| {
            st.st_mode & libc::S_IFMT == libc::S_IFIFO && st.st_uid == me && st.st_mode & 0o077 == 0
        }) {
            return Err(LmtError::BadCookie {
                peer,
                why: format!("{} is not a pipe of ours, closed to other users", path.display()),
            });
        }
        let _ = std::fs::remove_file(&path);
        Ok(Self { fd })
    }

    /// Splices as much of `x` as the pipe takes now.
    ///
    /// # Safety
    /// `src` must be valid for reading for its whole length, and stay unchanged until
    /// the receiver has read it.
    pub(crate) unsafe fn step(&mut self, x: &mut Xfer, src: &[Seg]) -> Result<(), LmtError> {
        let stop = x.total.min(x.done + STEP_BYTES);
        while x.done < stop {
            let (v, n) = iov::local(src, x.at, stop - x.done);
            if n == 0 {
                return Err(LmtError::BadCookie {
                    peer: x.peer,
                    why: format!("the send buffer ends at byte {} of {}", x.done, x.total),
                });
            }
            // SAFETY: the pieces are inside `src` (the caller's contract); the kernel
            // only takes references to the pages.
            let put =
                unsafe { libc::vmsplice(self.fd.as_raw_fd(), v.as_ptr(), v.len(), libc::SPLICE_F_NONBLOCK) };
            if put < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    Some(libc::EPIPE) => Err(LmtError::PeerFailed {
                        peer: x.peer,
                        why: "the pipe has no reader".into(),
                    }),
                    _ => Err(io_err(x.peer, e)),
                };
            }
            iov::advance(src, &mut x.at, put as usize);
            x.done += put as usize;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A sender whose receiver keeps draining the pipe still returns from one step
    /// after at most [`STEP_BYTES`]; the receiver's steps are bounded alike, and the
    /// message arrives whole over the steps.
    #[test]
    fn one_step_moves_a_bounded_part_while_the_other_side_keeps_up() {
        let dir = std::env::temp_dir().join(format!("nemesis-pipe-step-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let len = 8 * STEP_BYTES + 3;
        let msg: Vec<u8> = (0..len).map(|j| (j % 251) as u8).collect();
        let mut rx = PipeIn::create(&dir, "nemesis-test-pipe-step", 0).unwrap();
        let mut tx = PipeOut::open(&dir, &rx.name(), 1).unwrap();
        let sending = AtomicBool::new(true);
        let got = std::thread::scope(|sc| {
            let reader = sc.spawn(|| {
                let mut buf = vec![0u8; len];
                let mut x = Xfer::new(0, Strategy::Vmsplice, Role::Recv, len);
                let mut most = 0;
                while x.done < len {
                    let before = x.done;
                    // SAFETY: `buf` is ours and as long as the message.
                    unsafe { rx.step(&mut x, &[Seg::of_mut(&mut buf)]).unwrap() };
                    most = most.max(x.done - before);
                    if !sending.load(Ordering::Relaxed) && x.done == before {
                        std::thread::yield_now();
                    }
                }
                (buf, most)
            });
            let mut x = Xfer::new(1, Strategy::Vmsplice, Role::Send, len);
            let mut most = 0;
            while x.done < len {
                let before = x.done;
                // SAFETY: `msg` outlives the transfer and is not changed.
                unsafe { tx.step(&mut x, &[Seg::of(&msg)]).unwrap() };
                most = most.max(x.done - before);
            }
            sending.store(false, Ordering::Relaxed);
            let (buf, rmost) = reader.join().unwrap();
            assert!(most <= STEP_BYTES, "a send step moved {most} bytes");
            assert!(rmost <= STEP_BYTES, "a receive step moved {rmost} bytes");
            buf
        });
        assert!(got == msg);
        drop((tx, rx));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
