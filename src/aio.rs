//! Async two-sided messaging, for any executor (the `async` feature).
//!
//! An [`OwnedRequest`] is a future: it is ready once its request has finished. Something
//! must move the world on meanwhile, and [`AsyncWorld`] does it without the executor's
//! help: it keeps the [`World`] behind a mutex and runs a progress thread that polls it
//! and, when nothing is left to do, sleeps on its wait descriptor
//! ([`World::wait_fd`]), so an idle rank takes no CPU. Finishing a request wakes the task
//! that awaits it. No executor's reactor is needed, so the futures work under tokio,
//! async-std, smol or a hand-written `block_on` alike.
//!
//! ```no_run
//! # async fn run() -> Result<(), nemesis::P2pError> {
//! use nemesis::aio::AsyncWorld;
//! let world = AsyncWorld::new(nemesis::init()?)?;
//! let comm = world.comm();
//! let (me, n) = (world.rank(), world.size());
//! let incoming = world.irecv(&comm, (me + n - 1) % n, 0, vec![0u8; 8])?;
//! world.send(&comm, (me + 1) % n, 0, u64::from(me).to_le_bytes().to_vec()).await?;
//! let (status, buf) = incoming.await?;
//! # let _ = (status, buf);
//! # Ok(()) }
//! ```
//!
//! A program that runs its own event loop can do without the thread: register
//! [`World::wait_fd`] with its reactor (tokio's `AsyncFd`, mio) and call
//! [`World::progress`] and [`World::arm`] from a task, as `examples/async_ring.rs` shows.

use crate::channel::{Channel, NemesisChannel};
use crate::p2p::{Comm, OwnedBuf, OwnedRequest, P2pError, Status, World};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest sleep of the progress thread when the world has no wait descriptor.
const BLIND_SLEEP: Duration = Duration::from_millis(1);

struct Shared<C: Channel> {
    world: Mutex<World<C>>,
    stop: AtomicBool,
    /// Written to interrupt the progress thread's sleep: an operation was started.
    kick: OwnedFd,
    /// The first error the progress thread met; it stops then.
    fault: Mutex<Option<P2pError>>,
}

/// A [`World`] moved on by a progress thread, for async code. Cheap to clone; the last
/// clone to go stops the thread and drops the world, which ends the requests still out
/// with [`P2pError::WorldGone`].
pub struct AsyncWorld<C: Channel + Send + 'static = NemesisChannel> {
    inner: Arc<Inner<C>>,
}

/// What the clones share: the world (also held by the thread) and the thread.
struct Inner<C: Channel + Send + 'static> {
    shared: Option<Arc<Shared<C>>>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Channel + Send + 'static> Inner<C> {
    fn shared(&self) -> &Shared<C> {
        self.shared.as_ref().expect("present until dropped")
    }

    /// Stops the thread; the world stays.
    fn stop(&mut self) {
        if let Some(s) = &self.shared {
            s.stop.store(true, Ordering::Release);
            kick(s);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<C: Channel + Send + 'static> Drop for Inner<C> {
    fn drop(&mut self) {
        self.stop();
    }
}

impl<C: Channel + Send + 'static> Clone for AsyncWorld<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Channel + Send + 'static> std::fmt::Debug for AsyncWorld<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWorld").finish_non_exhaustive()
    }
}

impl<C: Channel + Send + 'static> AsyncWorld<C> {
    /// Takes `world` over and starts its progress thread.
    ///
    /// # Errors
    /// [`P2pError::InvalidArgument`] when the thread or its wake-up descriptor cannot be
    /// made.
    pub fn new(world: World<C>) -> Result<Self, P2pError> {
        // SAFETY: a plain system call with no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(P2pError::InvalidArgument(format!(
                "an eventfd for the progress thread: {}",
                std::io::Error::last_os_error()
            )));
        }
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            stop: AtomicBool::new(false),
            // SAFETY: `fd` was just made and nothing else owns it.
            kick: unsafe { OwnedFd::from_raw_fd(fd) },
            fault: Mutex::new(None),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nemesis-progress".into())
            .spawn(move || drive(&s))
            .map_err(|e| P2pError::InvalidArgument(format!("starting the progress thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                shared: Some(shared),
                thread: Some(thread),
            }),
        })
    }

    /// The world, for blocking calls and collectives; the progress thread waits
    /// meanwhile. Keep the guard short: no task's request moves on while it is held,
    /// except through the caller's own calls.
    pub fn lock(&self) -> MutexGuard<'_, World<C>> {
        self.inner
            .shared()
            .world
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Our rank in the job.
    pub fn rank(&self) -> u32 {
        self.lock().rank()
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.lock().size()
    }

    /// The communicator of every rank.
    pub fn comm(&self) -> Comm {
        self.lock().comm()
    }

    /// Starts sending `buf`; await the request for its status and the buffer back.
    ///
    /// # Errors
    /// As for [`World::isend`], and the progress thread's error.
    pub fn isend<B: OwnedBuf>(
        &self,
        comm: &Comm,
        dest: u32,
        tag: i32,
        buf: B,
    ) -> Result<OwnedRequest<B>, P2pError> {
        self.check()?;
        let r = self.lock().isend(comm, dest, tag, buf);
        self.kick();
        r
    }

    /// Starts receiving into `buf`; await the request for the status and the buffer.
    ///
    /// # Errors
    /// As for [`World::irecv`], and the progress thread's error.
    pub fn irecv<B: OwnedBuf>(
        &self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: B,
    ) -> Result<OwnedRequest<B>, P2pError> {
        self.check()?;
        let r = self.lock().irecv(comm, src, tag, buf);
        self.kick();
        r
    }

    /// Sends `buf` and gives it back once it may be reused.
    ///
    /// # Errors
    /// As for [`AsyncWorld::isend`], or why the send failed.
    pub async fn send<B: OwnedBuf>(&self, comm: &Comm, dest: u32, tag: i32, buf: B) -> Result<B, P2pError> {
        let (_, b) = self.isend(comm, dest, tag, buf)?.await?;
        Ok(b)
    }

    /// Receives a message into `buf`.
    ///
    /// # Errors
    /// As for [`AsyncWorld::irecv`], or why the receive failed.
    pub async fn recv<B: OwnedBuf>(
        &self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: B,
    ) -> Result<(Status, B), P2pError> {
        self.irecv(comm, src, tag, buf)?.await
    }

    /// Stops the progress thread and hands the world back, if this is the last clone.
    ///
    /// # Errors
    /// The handle itself, when other clones still exist.
    pub fn into_world(self) -> Result<World<C>, Self> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|inner| Self { inner })?;
        inner.stop();
        let shared = inner.shared.take().expect("present until dropped");
        match Arc::try_unwrap(shared) {
            Ok(s) => Ok(s.world.into_inner().unwrap_or_else(|p| p.into_inner())),
            Err(_) => unreachable!("the thread has ended and held the only other reference"),
        }
    }

    fn check(&self) -> Result<(), P2pError> {
        match &*self
            .inner
            .shared()
            .fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
        {
            None => Ok(()),
            Some(e) => Err(P2pError::InvalidArgument(format!(
                "the progress thread stopped: {e}"
            ))),
        }
    }

    /// Interrupts the progress thread's sleep, so it looks at what was just started.
    fn kick(&self) {
        kick(self.inner.shared());
    }
}

fn kick<C: Channel>(s: &Shared<C>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an 8-byte buffer for an eventfd; a full counter only means a kick waits.
    unsafe { libc::write(s.kick.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// The progress thread: polls while there is work, sleeps on the world's descriptor and
/// the kick while there is none, and checks the peers of the requests still out now and
/// then, so a dead peer fails them.
fn drive<C: Channel>(s: &Shared<C>) {
    let mut last_check = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        let mut w = s.world.lock().unwrap_or_else(|p| p.into_inner());
        let step = w.progress().and_then(|n| {
            let period = w.config().failure_check;
            if last_check.elapsed() >= period {
                last_check = Instant::now();
                w.check_owned_peers();
            }
            Ok(if n > 0 { None } else { Some((w.arm()?, period)) })
        });
        let fd = w.wait_fd().map(|f| f.as_raw_fd());
        drop(w);
        match step {
            Err(e) => {
                *s.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                return;
            }
            Ok(None) => {}
            Ok(Some((armed, period))) => sleep(s, fd.filter(|_| armed), armed, period),
        }
    }
}

/// Sleeps until `fd` or the kick is readable, for at most `period`; without a
/// descriptor, for a short while.
fn sleep<C: Channel>(s: &Shared<C>, fd: Option<i32>, armed: bool, period: Duration) {
    let kick = s.kick.as_raw_fd();
    let mut fds = [
        libc::pollfd {
            fd: kick,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let limit = match (fd, armed) {
        (Some(_), true) => period,
        (None, true) => BLIND_SLEEP,
        // Work that moves without packets (a large transfer): look again at once.
        (_, false) => {
            std::thread::yield_now();
            return;
        }
    };
    let n = if fd.is_some() { 2 } else { 1 };
    // SAFETY: `n` valid pollfds; a negative fd is ignored by poll.
    unsafe { libc::poll(fds.as_mut_ptr(), n, nemesis_net::sys::millis(limit)) };
    let mut buf = [0u8; 8];
    // SAFETY: an 8-byte buffer; the eventfd is non-blocking.
    unsafe { libc::read(kick, buf.as_mut_ptr().cast(), 8) };
}
