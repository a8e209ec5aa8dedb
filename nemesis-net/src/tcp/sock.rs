//! The socket calls the netmod makes: non-blocking connect and accept, `sendmsg` without
//! SIGPIPE, and the options every established connection gets.

use crate::sys::{RawAddr, cvt};
use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Whether an I/O error only says "not now".
pub(super) fn not_now(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// Starts connecting to `addr` without waiting: the connection completes, or fails, when
/// epoll says the socket is writable.
pub(super) fn connect_nonblocking(addr: SocketAddr) -> io::Result<TcpStream> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: a plain system call with no pointers.
    let fd = cvt(unsafe { libc::socket(family, flags, 0) })?;
    // SAFETY: `fd` was just made and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = RawAddr::new(addr);
    // SAFETY: `sa` is a live socket address and its length says how long.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), sa.as_ptr(), sa.len()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // An interrupted connect goes on in the background, as one in progress does.
        if !matches!(e.raw_os_error(), Some(libc::EINPROGRESS | libc::EINTR)) {
            return Err(e);
        }
    }
    Ok(TcpStream::from(fd))
}

/// A connection waiting on `l`, non-blocking from the start.
pub(super) fn accept_nonblocking(l: &TcpListener) -> io::Result<TcpStream> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: null address pointers are allowed: we do not ask for the peer's address.
    let fd = cvt(unsafe { libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), flags) })?;
    // SAFETY: `fd` was just made and nothing else owns it.
    Ok(TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `writev` without SIGPIPE: a peer that vanished is an error, not a signal that kills
/// an embedding program which has not ignored it.
pub(super) fn send_vectored(s: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data, and all zeroes is an empty message with no address.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr().cast_mut().cast();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` names the slices of `iov`, which IoSlice lays out as iovecs and which
    // outlive the call; the kernel only reads them.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sets an integer socket option.
pub(super) fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length says so.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(rc).map(drop)
}

/// No Nagle delay (a small packet is what someone waits for), and keepalive probes, so
/// that a peer whose node died is found within about `timeout` even when we have nothing
/// to send it. Best effort: a connection works without either.
pub(super) fn tune(s: &TcpStream, timeout: Duration) {
    let _ = s.set_nodelay(true);
    let fd = s.as_raw_fd();
    let secs = timeout.as_secs().max(2);
    let idle = libc::c_int::try_from(secs / 2).unwrap_or(libc::c_int::MAX);
    let interval = libc::c_int::try_from((secs / 6).max(1)).unwrap_or(libc::c_int::MAX);
    let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    let _ = set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle);
    let _ = set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval);
    let _ = set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}
