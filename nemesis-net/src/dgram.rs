//! The netmod made of [`crate::reliable`] over one datagram endpoint for every peer: the
//! `udp` netmod is an instance of it, and so is verbs UD.
//!
//! What differs between the instances is the endpoint ([`Endpoint`]): how a datagram goes
//! out and comes in, the business card, and the descriptor a waiter sleeps on. The
//! reliability, the waiting and the goodbye are the same code for every instance.

use crate::reliable::{Datagram, Reliable};
use crate::sys::Epoll;
use crate::{Accept, Envelope, NetError, NetStats, Netmod, WaitHint};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// A datagram transport a netmod can be made of: one that publishes an address and that
/// a waiter can sleep on.
pub trait Endpoint: Datagram {
    /// The business card peers reach this endpoint by.
    fn card(&self) -> Vec<u8>;

    /// A descriptor that becomes ready when a datagram may have arrived or room may have
    /// come: the socket itself, or a completion channel.
    fn fd(&self) -> BorrowedFd<'_>;

    /// The readiness of [`Endpoint::fd`] that means a poll may find something, as
    /// `poll(2)` bits (input and output have the same bits in epoll), given whether a
    /// send found no room.
    fn readiness(&self, blocked: bool) -> i16 {
        if blocked {
            libc::POLLIN | libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Asks for the descriptor to become ready at the next event, before a waiter
    /// sleeps on it, and says whether one already waits that the descriptor will not
    /// show (then a poll must run instead of the sleep). A socket needs nothing; a
    /// completion queue must be armed and looked at once more.
    ///
    /// # Errors
    /// Failures of the transport itself.
    fn arm(&mut self) -> io::Result<bool> {
        Ok(false)
    }

    /// Whether a poll may find something now, found without sleeping or arming: a
    /// completion queue is looked at directly. `None`: the endpoint can tell only by its
    /// descriptor (a socket), which the caller then polls without waiting.
    ///
    /// # Errors
    /// Failures of the transport itself.
    fn look(&mut self) -> io::Result<Option<bool>> {
        Ok(None)
    }

    /// Takes the readiness the descriptor showed, so that the next sleep waits for a
    /// new event.
    ///
    /// # Errors
    /// Failures of the transport itself.
    fn woken(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reliable datagrams over an [`Endpoint`], as a [`Netmod`].
pub struct DgramNetmod<E: Endpoint> {
    rel: Reliable<E>,
    card: Vec<u8>,
    shut: bool,
    /// Watches the endpoint's descriptor for a waiter that sleeps on more than this
    /// netmod.
    epoll: Epoll,
    /// The readiness `epoll` watches for now.
    watching: i16,
}

impl<E: Endpoint> fmt::Debug for DgramNetmod<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DgramNetmod")
            .field("rel", &self.rel)
            .field("shut", &self.shut)
            .finish_non_exhaustive()
    }
}

impl<E: Endpoint> DgramNetmod<E> {
    /// The netmod over `rel`'s endpoint.
    ///
    /// # Errors
    /// An epoll instance that cannot be had.
    pub fn over(rel: Reliable<E>) -> Result<Self, NetError> {
        let name = rel.datagram().name();
        let epoll = Epoll::new().map_err(|e| NetError::io(format!("{name}: epoll_create"), e))?;
        let watching = rel.datagram().readiness(false);
        let fd = rel.datagram().fd().as_raw_fd();
        epoll
            .ctl(libc::EPOLL_CTL_ADD, fd, watching as u32, 0)
            .map_err(|e| NetError::io(format!("{name}: epoll_ctl"), e))?;
        Ok(Self {
            card: rel.datagram().card(),
            rel,
            shut: false,
            epoll,
            watching,
        })
    }

    /// The same netmod, logging no drops: for tests that misbehave on purpose.
    pub fn quiet(mut self) -> Self {
        self.rel = self.rel.quiet();
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &E {
        self.rel.datagram()
    }

    /// The largest datagram this netmod sends.
    pub fn max_datagram(&self) -> usize {
        self.rel.datagram().max_datagram()
    }

    /// Polls and waits, discarding what arrives, until `done` or `deadline`.
    fn drive(&mut self, deadline: Instant, done: impl Fn(&Reliable<E>) -> bool) {
        let mut discard = |_: u32, _: &Envelope, _: &[u8]| {};
        while !done(&self.rel) {
            let now = Instant::now();
            if now >= deadline || self.rel.poll(&mut discard).is_err() {
                return;
            }
            if done(&self.rel) {
                return;
            }
            let left = deadline.saturating_duration_since(now);
            if self.wait(left.min(Duration::from_millis(50))).is_err() {
                return;
            }
        }
    }

    /// How long a sleep of at most `timeout` may last before a timer falls due.
    fn until_timer(&self, timeout: Duration) -> Duration {
        match self.rel.next_deadline() {
            Some(d) => {
                let now = self.rel.datagram().now();
                timeout.min(Duration::from_nanos(d.saturating_sub(now)))
            }
            None => timeout,
        }
    }

    /// Waits at most `ms` milliseconds for the endpoint's descriptor, and takes the
    /// wake-up; whether a poll may find something.
    fn poll_fd(&mut self, ms: libc::c_int) -> Result<bool, NetError> {
        let ep = self.rel.datagram();
        let mut pfd = libc::pollfd {
            fd: ep.fd().as_raw_fd(),
            events: ep.readiness(self.rel.blocked()),
            revents: 0,
        };
        // SAFETY: one valid pollfd for the endpoint's live descriptor, and its count.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(self.io_error("poll(2)", e));
        }
        if rc > 0 {
            let woken = self.rel.datagram_mut().woken();
            woken.map_err(|e| self.io_error("taking a wake-up", e))?;
        }
        Ok(rc > 0 || self.rel.ready())
    }

    fn io_error(&self, what: &str, e: io::Error) -> NetError {
        NetError::io(format!("{}: {what}", self.rel.datagram().name()), e)
    }
}

impl<E: Endpoint> Netmod for DgramNetmod<E> {
    fn name(&self) -> &'static str {
        self.rel.datagram().name()
    }

    fn business_card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn max_payload(&self) -> usize {
        self.rel.max_payload()
    }

    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        self.rel.send(peer, env, payload)
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        self.rel.poll(sink)
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError> {
        if self.rel.ready() {
            return Ok(true);
        }
        let limit = self.until_timer(timeout);
        if limit.is_zero() {
            // A spinning waiter looks; it does not arm.
            let looked = self.rel.datagram_mut().look();
            if let Some(now) = looked.map_err(|e| self.io_error("looking for input", e))? {
                return Ok(now || self.rel.ready());
            }
            return self.poll_fd(0);
        }
        let armed = self.rel.datagram_mut().arm();
        if armed.map_err(|e| self.io_error("arming the wait", e))? {
            return Ok(true);
        }
        // poll(2) counts milliseconds: round up, so a timer is not polled for early.
        let ms = libc::c_int::try_from(limit.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX);
        self.poll_fd(ms)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn wait_hint(&mut self) -> Result<WaitHint, NetError> {
        let want = self.rel.datagram().readiness(self.rel.blocked());
        if want != self.watching {
            let fd = self.rel.datagram().fd().as_raw_fd();
            self.epoll
                .ctl(libc::EPOLL_CTL_MOD, fd, want as u32, 0)
                .map_err(|e| self.io_error("epoll_ctl", e))?;
            self.watching = want;
        }
        if self.rel.ready() {
            return Ok(WaitHint::Now);
        }
        // The waiter sleeps on the descriptor next: it must be armed.
        let armed = self.rel.datagram_mut().arm();
        if armed.map_err(|e| self.io_error("arming the wait", e))? || self.poll_fd(0)? {
            return Ok(WaitHint::Now);
        }
        let next = self.rel.next_deadline().map(|d| {
            let now = self.rel.datagram().now();
            Instant::now() + Duration::from_nanos(d.saturating_sub(now))
        });
        Ok(WaitHint::Later(next))
    }

    fn backlog(&self) -> usize {
        self.rel.backlog()
    }

    fn writable(&self, peer: u32) -> bool {
        self.rel.writable(peer)
    }

    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        self.rel.check_peer(peer)
    }

    fn shutdown(&mut self, timeout: Duration) {
        if self.shut {
            return;
        }
        self.shut = true;
        let deadline = Instant::now() + timeout;
        self.drive(deadline, |r| r.backlog() == 0);
        self.rel.begin_shutdown();
        self.drive(deadline, Reliable::shutdown_done);
    }

    fn stats(&self) -> NetStats {
        self.rel.stats()
    }
}
