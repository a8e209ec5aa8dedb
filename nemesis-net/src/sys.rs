//! System-call helpers shared by the netmods and by the channel's wait: one epoll
//! wrapper, and the conversion of a C return code.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `rc`, or the error it stands for.
pub(crate) fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// An epoll instance, closed on drop. It is itself a descriptor that is readable while
/// any descriptor it watches is ready, so it nests in another epoll, mio or tokio.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    /// A new, empty instance.
    ///
    /// # Errors
    /// The system call's.
    pub fn new() -> io::Result<Self> {
        // SAFETY: a plain system call with no pointers.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just made and nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `epoll_ctl(op, fd)` with `events`, and `token` as the event's data.
    ///
    /// # Errors
    /// The system call's.
    pub fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a live epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) }).map(drop)
    }

    /// Fills `buf` with ready events, waiting at most `ms` milliseconds (-1: no limit);
    /// an interrupted wait found nothing.
    ///
    /// # Errors
    /// The system call's.
    pub fn wait(&self, buf: &mut [libc::epoll_event], ms: libc::c_int) -> io::Result<usize> {
        let max = libc::c_int::try_from(buf.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `buf` is valid for writes of `max` events for the duration of the call.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), buf.as_mut_ptr(), max, ms) };
        match cvt(n) {
            Ok(n) => Ok((n as usize).min(buf.len())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Milliseconds for epoll or poll, rounded up so that a short wait does not become a
/// spin.
pub fn millis(t: Duration) -> libc::c_int {
    libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX)
}

/// The monotonic clock in nanoseconds, read directly: what `Instant::elapsed` gives,
/// without its checked subtraction, for a transport that reads the clock on every poll.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A socket address in the form the kernel takes, with its length.
pub(crate) struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    pub(crate) fn new(addr: std::net::SocketAddr) -> Self {
        use std::net::SocketAddr;
        // SAFETY: sockaddr_storage is plain data, valid when all zero.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr,
                // and `storage` is a live local.
                unsafe {
                    std::ptr::from_mut(&mut storage)
                        .cast::<libc::sockaddr_in>()
                        .write(sin)
                };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: as above, for a sockaddr_in6.
                unsafe {
                    std::ptr::from_mut(&mut storage)
                        .cast::<libc::sockaddr_in6>()
                        .write(sin6)
                };
                size_of::<libc::sockaddr_in6>()
            }
        };
        Self {
            storage,
            len: len as libc::socklen_t,
        }
    }

    /// The address, for calls that take a `const sockaddr *`.
    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        std::ptr::from_ref(&self.storage).cast()
    }

    /// Its length, for the same calls.
    pub(crate) fn len(&self) -> libc::socklen_t {
        self.len
    }
}
