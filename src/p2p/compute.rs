//! Computing while the world is served: a target of one-sided operations over the
//! network (and every other protocol on the core) moves on only when the process calls
//! into nemesis. [`World::compute`] lends the world to a helper thread while the caller
//! computes, when `NEMESIS_RMA_PROGRESS=thread` asks for it.
//!
//! The helper borrows the world for the length of the call, as a scoped thread does, so
//! it never runs while the caller uses the world: no lock on any fast path. It polls,
//! and when there is nothing to do it sleeps on the world's wait descriptor (the
//! doorbell's wake socket, the network module's sockets and timers), so an idle target
//! takes no CPU; a kick wakes it when the computation ends.

use super::{P2pError, World};
use crate::channel::{Channel, ChannelError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The variable that turns the helper on: `thread`, or `none` (the default).
pub const RMA_PROGRESS_VAR: &str = "NEMESIS_RMA_PROGRESS";

/// Longest sleep of the helper when the world has no wait descriptor.
const BLIND_SLEEP: Duration = Duration::from_millis(1);

/// Whether `NEMESIS_RMA_PROGRESS` asks for the helper.
pub(crate) fn helper_from_env() -> Result<bool, P2pError> {
    match std::env::var(RMA_PROGRESS_VAR).as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("none") | Ok("0") => Ok(false),
        Ok("thread") => Ok(true),
        Ok(v) => Err(ChannelError::Config {
            var: RMA_PROGRESS_VAR,
            value: v.into(),
            reason: "expected thread or none".into(),
        }
        .into()),
    }
}

impl<C: Channel + Send> World<C> {
    /// Runs `f`, a computation that does not use the world, while a helper thread serves
    /// the world: one-sided requests from other nodes, lock grants, every protocol
    /// registered on the core, and two-sided traffic. Without `NEMESIS_RMA_PROGRESS=thread`
    /// (or with [`World::set_helper`] off) it just runs `f`, and the world is served at
    /// the next call.
    ///
    /// Starting and ending the helper costs a thread; wrap computations long enough to
    /// be worth it (tens of microseconds and more). A failure the helper meets is
    /// reported by the next call that moves the world on.
    pub fn compute<R>(&mut self, f: impl FnOnce() -> R) -> R {
        if !self.helper || self.size() == 1 {
            return f();
        }
        // SAFETY: a plain system call with no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return f();
        }
        // SAFETY: `fd` was just made and nothing else owns it.
        let kick = unsafe { OwnedFd::from_raw_fd(fd) };
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let world = &mut *self;
            let (stop, kick) = (&stop, &kick);
            let helper = s.spawn(move || serve(world, stop, kick));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            stop.store(true, Ordering::Release);
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live local to our own eventfd.
            unsafe { libc::write(kick.as_raw_fd(), (&raw const one).cast(), 8) };
            let _ = helper.join();
            match r {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// Turns the helper of [`World::compute`] on or off, whatever
    /// `NEMESIS_RMA_PROGRESS` said.
    pub fn set_helper(&mut self, on: bool) {
        self.helper = on;
    }
}

/// The helper: moves the world on until told to stop, asleep when there is nothing to do.
fn serve<C: Channel>(w: &mut World<C>, stop: &AtomicBool, kick: &OwnedFd) {
    while !stop.load(Ordering::Acquire) {
        match w.progress() {
            Ok(n) if n > 0 => continue,
            Ok(_) => {}
            Err(e) => {
                w.eng.defer(e);
                return;
            }
        }
        match w.arm() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                w.eng.defer(e);
                return;
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        let mut fds = [
            libc::pollfd {
                fd: kick.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: w.wait_fd().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = if fds[1].fd < 0 {
            BLIND_SLEEP.as_millis() as i32
        } else {
            -1
        };
        // SAFETY: two live pollfds; a negative descriptor is ignored by poll.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
    }
}

#[cfg(test)]
mod tests {
    use crate::rma::{LockKind, Window};
    use crate::testkit::job_nodes;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// Rank 1 computes, watching its own window; rank 0 puts into it meanwhile. Returns
    /// whether rank 1 saw the put before its computation gave up.
    fn put_during_compute(helper: bool, give_up: Duration) -> bool {
        let seen = job_nodes(&[1, 1], move |mut w| {
            w.set_helper(helper);
            let comm = w.comm();
            let win = Window::<u64>::allocate(&mut w, &comm, 1).unwrap();
            let mut seen = false;
            if w.rank() == 1 {
                let mine = win.local_atomics().unwrap();
                let t0 = Instant::now();
                seen = w.compute(|| {
                    while t0.elapsed() < give_up {
                        if mine[0].load(Ordering::Acquire) == 5 {
                            return true;
                        }
                        std::hint::spin_loop();
                    }
                    false
                });
            } else {
                let mut ep = win.lock(&mut w, 1, LockKind::Exclusive).unwrap();
                ep.put(&[5], 1, 0).unwrap();
                ep.unlock().unwrap();
            }
            w.barrier(&comm).unwrap();
            win.free(&mut w).unwrap();
            seen
        });
        seen[1]
    }

    #[test]
    fn a_computing_rank_is_served_by_its_helper() {
        assert!(
            put_during_compute(true, Duration::from_secs(60)),
            "the put waited for the computation"
        );
    }

    #[test]
    fn without_the_helper_a_computing_rank_is_served_afterwards() {
        assert!(!put_during_compute(false, Duration::from_millis(300)));
    }
}
