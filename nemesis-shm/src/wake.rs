//! Waking a process that sleeps on a file descriptor rather than on its doorbell's
//! futex: one that waits for shared memory and sockets at once, or whose event loop
//! (epoll, mio, tokio) owns the sleep.
//!
//! Each such process binds a datagram socket in the abstract namespace, named by the
//! segment's wake key and its local index, so it leaves no file behind. It sets the
//! doorbell's watching bit before it sleeps (see [`crate::doorbell`]); a sender whose
//! ring finds that bit sends it one byte. Nothing of this costs a sender anything while
//! nobody watches: the bit is tested with the sleeping bit, in the ring's one RMW.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

/// How a sender wakes local process `local` when its ring finds it watching.
pub trait Wake: Send + Sync + std::fmt::Debug {
    /// Wakes local process `local`; spurious and repeated wake-ups are harmless.
    fn wake(&self, local: u32);
}

/// The abstract socket address of local process `local` of the segment whose wake key is
/// `key`, and its length.
fn address(key: u64, local: u32) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all zeros is a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // A leading NUL puts the name in the abstract namespace: no file, gone with the socket.
    let name = format!("\0nemesis-wake-{key:016x}-{local}");
    for (d, s) in a.sun_path.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + name.len();
    (a, len as libc::socklen_t)
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain system call with no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A process's own wake socket: readable when a sender woke it.
#[derive(Debug)]
pub struct WakeSocket {
    fd: OwnedFd,
}

impl WakeSocket {
    /// Binds the wake socket of local process `local` of the segment with wake key `key`.
    ///
    /// # Errors
    /// The socket's, e.g. `AddrInUse` when that process already has one.
    pub fn bind(key: u64, local: u32) -> io::Result<Self> {
        let fd = socket()?;
        let (a, len) = address(key, local);
        // SAFETY: `a` is a live sockaddr_un of `len` meaningful bytes.
        let rc = unsafe { libc::bind(fd.as_raw_fd(), (&raw const a).cast(), len) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Empties the socket, so it is readable again only after the next wake-up.
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                return;
            }
        }
    }
}

impl AsFd for WakeSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wakes the processes of one segment through their wake sockets. The sending socket is
/// made on first use, so a job whose processes never watch never makes one.
#[derive(Debug)]
pub struct SocketWake {
    key: u64,
    fd: OnceLock<Option<OwnedFd>>,
}

impl SocketWake {
    /// Wakes the processes of the segment with wake key `key`.
    pub fn new(key: u64) -> Self {
        Self {
            key,
            fd: OnceLock::new(),
        }
    }
}

impl Wake for SocketWake {
    fn wake(&self, local: u32) {
        let Some(fd) = self.fd.get_or_init(|| socket().ok()) else {
            return;
        };
        let (a, len) = address(self.key, local);
        // A full socket already holds a wake-up, and a socket that is gone belongs to a
        // process that no longer watches: both errors are ignored.
        // SAFETY: a one-byte buffer and a live sockaddr_un of `len` meaningful bytes.
        unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                (&raw const a).cast(),
                len,
            )
        };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn readable(fd: BorrowedFd<'_>, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    #[test]
    fn a_wake_makes_the_socket_readable_until_drained() {
        let key = 0x5eed_0000_0000_0000 | u64::from(std::process::id());
        let s = WakeSocket::bind(key, 3).unwrap();
        assert!(!readable(s.as_fd(), 0));
        let w = SocketWake::new(key);
        w.wake(3);
        w.wake(3);
        assert!(readable(s.as_fd(), 1000));
        s.drain();
        assert!(!readable(s.as_fd(), 0));
        // Another index, or a process with no socket: nothing happens, nothing fails.
        w.wake(4);
        assert!(!readable(s.as_fd(), 0));
        assert_eq!(
            WakeSocket::bind(key, 3).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }
}
