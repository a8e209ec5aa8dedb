//! The progress core: one loop that owns a channel and hands every arrived packet to the
//! protocol it belongs to, whichever layer is polling.
//!
//! Every packet names its protocol in the high byte of its header's `kind`
//! ([`ProtocolId`]). Two-sided messaging ([`crate::World`]) is one protocol; a runtime's
//! own protocol is another, registered with [`Core::register`] (or
//! [`crate::World::register`]) and handed exactly its packets, in place. A blocking call
//! of any layer polls through the core, so every protocol moves on while the process
//! waits in any of them: a runtime's handler runs while the process waits in
//! `World::recv`, and two-sided traffic moves while it waits in
//! [`crate::World::progress_until`].
//!
//! A packet whose protocol nobody registered is counted and dropped, and the first of
//! them (then every power of two) is reported on standard error with the protocol named;
//! the other protocols go on.
//!
//! ```
//! use nemesis::progress::{Outbox, ProtocolId};
//! use nemesis::{Header, Packet};
//! use std::sync::{Arc, Mutex};
//!
//! let mut world = nemesis::init()?;
//! let tasks = ProtocolId::user(0).unwrap();
//! let got = Arc::new(Mutex::new(Vec::new()));
//! let sink = got.clone();
//! // Every packet of `tasks` lands here, whichever call is polling.
//! world.register(tasks, move |p: Packet<'_>, _: &mut Outbox| {
//!     sink.lock().unwrap().push((p.src, p.payload.to_vec()));
//! })?;
//! let next = (world.rank() + 1) % world.size();
//! world.send_packet(tasks, next, Header::default(), b"a task")?;
//! world.progress_until(None, |_| !got.lock().unwrap().is_empty())?;
//! # Ok::<(), nemesis::P2pError>(())
//! ```

mod idle;
mod outbox;
mod protocol;

pub use crate::channel::kinds::{ProtocolId, RegistryError};
pub(crate) use idle::{Idle, Tick};
pub use outbox::Outbox;
pub use protocol::Protocol;
pub(crate) use protocol::Table;

use crate::channel::{Channel, ChannelError, Header, Packet, Rank, SendStatus, WaitPolicy, usable_cpus};
use std::time::{Duration, Instant};

/// The variable that makes a long-blocked call say what it waits for.
pub const WAIT_WARN_VAR: &str = "NEMESIS_WAIT_WARN";
/// The variable that sets how often a blocked call checks that its peers live.
pub const FAILURE_TIMEOUT_VAR: &str = "NEMESIS_FAILURE_TIMEOUT";

/// Tunables of the core, from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How often a blocked call checks that the peers it waits on are alive
    /// (`NEMESIS_FAILURE_TIMEOUT`, default 1 s): it fails within about twice this.
    pub failure_check: Duration,
    /// After how long a blocked call says, once, on standard error what it waits for
    /// (`NEMESIS_WAIT_WARN`, off by default), so a deadlock is visible.
    pub wait_warn: Option<Duration>,
}

impl Config {
    /// Reads the environment.
    ///
    /// # Errors
    /// [`ChannelError::Config`] naming a variable whose value is not a positive number of
    /// seconds.
    pub fn from_env() -> Result<Self, ChannelError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    ///
    /// # Errors
    /// As for [`Config::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ChannelError> {
        let secs = |var: &'static str| -> Result<Option<Duration>, ChannelError> {
            match get(var) {
                None => Ok(None),
                Some(v) => nemesis_shm::config::parse_seconds(&v)
                    .filter(|d| d.as_secs_f64() < 1e6)
                    .map(Some)
                    .ok_or_else(|| ChannelError::Config {
                        var,
                        value: v.clone(),
                        reason: "expected a positive number of seconds".into(),
                    }),
            }
        };
        Ok(Self {
            failure_check: secs(FAILURE_TIMEOUT_VAR)?.unwrap_or(Duration::from_secs(1)),
            wait_warn: secs(WAIT_WARN_VAR)?,
        })
    }
}

/// The progress core over channel `C`: the channel, the registered protocols, and the
/// outbox their handlers send through. [`crate::World`] has one; a runtime that does not
/// use two-sided messaging can use one alone.
#[derive(Debug)]
pub struct Core<C: Channel> {
    pub(crate) ch: C,
    pub(crate) table: Table,
    pub(crate) out: Outbox,
    pub(crate) cfg: Config,
    /// Whether a waiter that must keep polling spins (every local process has a CPU) or
    /// yields (they outnumber the CPUs).
    spin_pause: bool,
    /// Polls a blocked call makes back to back before it waits ([`idle::TIGHT_POLLS`],
    /// or the policy's spins if fewer).
    tight_polls: u32,
}

impl<C: Channel> Core<C> {
    /// A core over `ch`, configured from the environment.
    ///
    /// # Errors
    /// A bad `NEMESIS_FAILURE_TIMEOUT`, `NEMESIS_WAIT_WARN`, `NEMESIS_SPIN` or
    /// `NEMESIS_YIELDS`.
    pub fn new(ch: C) -> Result<Self, ChannelError> {
        Self::with_config(ch, Config::from_env()?)
    }

    /// A core over `ch` with explicit tunables.
    ///
    /// # Errors
    /// A bad `NEMESIS_SPIN` or `NEMESIS_YIELDS`.
    pub fn with_config(ch: C, cfg: Config) -> Result<Self, ChannelError> {
        let local = (0..ch.size())
            .filter(|&r| r == ch.rank() || ch.is_local(r))
            .count() as u32;
        let policy = WaitPolicy::from_env(local, usable_cpus())?;
        Ok(Self {
            table: Table::new(ch.rank()),
            out: Outbox::new(ch.size()),
            ch,
            cfg,
            spin_pause: policy.spin >= 1000,
            tight_polls: policy.spin.min(idle::TIGHT_POLLS),
        })
    }

    /// A clock for a blocked call, which polls back to back as the wait policy allows.
    #[inline]
    pub(crate) fn idle(&self) -> Idle {
        Idle::new(self.tight_polls)
    }

    /// Our rank.
    pub fn rank(&self) -> Rank {
        self.ch.rank()
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.ch.size()
    }

    /// The channel underneath. Poll only through the core: a poll of the channel itself
    /// would take packets that belong to the protocols.
    pub fn channel(&self) -> &C {
        &self.ch
    }

    /// The tunables in force.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// Registers protocol `p` under `id`: from now on it is handed every packet of `id`.
    ///
    /// # Errors
    /// [`RegistryError::Taken`] when `id` has a protocol already.
    pub fn register<P: Protocol>(&mut self, id: ProtocolId, p: P) -> Result<(), RegistryError> {
        self.table.register(id, Box::new(p))
    }

    /// Takes the protocol under `id` out; its packets are dropped (and counted) again.
    pub fn unregister(&mut self, id: ProtocolId) -> Option<Box<dyn Protocol>> {
        self.table.unregister(id)
    }

    /// The protocol under `id`, if it is a `P`.
    pub fn protocol<P: Protocol>(&self, id: ProtocolId) -> Option<&P> {
        let p: &dyn std::any::Any = self.table.get(id)?;
        p.downcast_ref()
    }

    /// The protocol under `id`, if it is a `P`, to reach its state between packets.
    pub fn protocol_mut<P: Protocol>(&mut self, id: ProtocolId) -> Option<&mut P> {
        let p: &mut dyn std::any::Any = self.table.get_mut(id)?;
        p.downcast_mut()
    }

    /// Sends a packet of protocol `id` to `dest`: `header.kind` is the protocol's own
    /// kind (0 to 0xff), and the id goes in its high byte. Never blocks and never drops,
    /// as [`Channel::send`].
    ///
    /// # Errors
    /// [`RegistryError::Kind`] (as [`ChannelError::Registry`]) for a kind above 0xff, and
    /// whatever the channel refuses: a bad rank, a packet over
    /// [`Channel::max_payload_to`].
    pub fn send(
        &mut self,
        id: ProtocolId,
        dest: Rank,
        header: Header,
        payload: &[&[u8]],
    ) -> Result<SendStatus, ChannelError> {
        if header.kind > 0xff {
            return Err(RegistryError::Kind(header.kind).into());
        }
        let header = Header {
            kind: id.kind(header.kind as u8),
            ..header
        };
        self.ch.send(dest, header, payload)
    }

    /// Polls the channel once: every arrived packet goes to its protocol, and what the
    /// handlers queued is sent. Returns how many packets arrived.
    ///
    /// # Errors
    /// The channel's, or the first send from an outbox that the channel refused.
    pub fn progress(&mut self) -> Result<usize, ChannelError> {
        let Self { ch, table, out, .. } = self;
        let n = ch.poll(|p| table.dispatch(p, out))?;
        self.flush_outbox()?;
        Ok(n)
    }

    /// Polls until `done` says so or `timeout` passes (`None`: no limit), waiting the
    /// channel's way in between; returns whether `done` said so. `done` sees the core,
    /// so it can look at a protocol's state.
    ///
    /// # Errors
    /// As for [`Core::progress`].
    pub fn progress_until(
        &mut self,
        timeout: Option<Duration>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<bool, ChannelError> {
        drive_until(self, timeout, done)
    }

    /// A descriptor that is readable when a poll may find work (see
    /// [`Channel::wait_fd`]): sleep on it after [`Core::arm`] said so.
    pub fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.ch.wait_fd()
    }

    /// Prepares a sleep on [`Core::wait_fd`]: false when there is work to poll first.
    ///
    /// # Errors
    /// The channel's.
    pub fn arm(&mut self) -> Result<bool, ChannelError> {
        if !self.out.is_empty() {
            return Ok(false);
        }
        self.ch.arm()
    }

    /// Packets dropped because no protocol was registered for them, by protocol.
    pub fn dropped(&self) -> Vec<(ProtocolId, u64)> {
        self.table.dropped()
    }

    /// Sends what the handlers queued.
    #[inline]
    pub(crate) fn flush_outbox(&mut self) -> Result<(), ChannelError> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.out.flush(&mut self.ch)
    }

    /// One wait of a blocked call, after its tight polls found nothing: a pause when it
    /// must keep polling (`busy`), else the channel's wait, for at most `limit` and the
    /// failure-check period. Says once what the call waits for (`what`) when
    /// `NEMESIS_WAIT_WARN` is due, and whether the caller should check its peers.
    pub(crate) fn idle_wait(
        &mut self,
        idle: &mut Idle,
        busy: bool,
        limit: Option<Duration>,
        what: &dyn Fn() -> String,
    ) -> Result<Tick, ChannelError> {
        if busy {
            self.busy_pause();
        } else {
            let t = limit.map_or(self.cfg.failure_check, |l| l.min(self.cfg.failure_check));
            self.ch.wait(Some(t))?;
        }
        let (tick, warn) = idle.after_wait(self.cfg.failure_check, self.cfg.wait_warn);
        if warn {
            eprintln!(
                "nemesis: rank {} has waited {:.1} s in {} ({WAIT_WARN_VAR} is set)",
                self.ch.rank(),
                idle.waited().as_secs_f64(),
                what()
            );
        }
        Ok(tick)
    }

    /// A pause between polls while data moves without packets: a CPU hint when every
    /// local process has a CPU, a yield when they outnumber the CPUs.
    pub(crate) fn busy_pause(&self) {
        if self.spin_pause {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
    }

    /// Hands every packet of `p` to its protocol: for a layer that polls the channel
    /// itself and meets packets that are not its own.
    #[inline]
    pub(crate) fn split(&mut self) -> (&mut C, Others<'_>) {
        (
            &mut self.ch,
            Others {
                table: &mut self.table,
                out: &mut self.out,
            },
        )
    }
}

/// What [`drive_until`] moves on: a core, with whatever polls it.
pub(crate) trait Driven {
    /// The channel of the core.
    type Ch: Channel;
    /// What a poll fails with.
    type Error: From<ChannelError>;
    /// Polls once, moving every protocol on; how many packets came.
    fn poll_once(&mut self) -> Result<usize, Self::Error>;
    /// Whether work moves without packets, so waiting must not sleep.
    fn busy(&mut self) -> bool;
    /// The core.
    fn core_mut(&mut self) -> &mut Core<Self::Ch>;
    /// What a wait warning calls the call.
    const NAME: &'static str;
}

impl<C: Channel> Driven for Core<C> {
    type Ch = C;
    type Error = ChannelError;
    fn poll_once(&mut self) -> Result<usize, ChannelError> {
        self.progress()
    }
    fn busy(&mut self) -> bool {
        false
    }
    fn core_mut(&mut self) -> &mut Core<C> {
        self
    }
    const NAME: &'static str = "Core::progress_until";
}

/// Polls `d` until `done` says so or `timeout` passes, waiting the channel's way in
/// between; returns whether `done` said so.
pub(crate) fn drive_until<D: Driven>(
    d: &mut D,
    timeout: Option<Duration>,
    mut done: impl FnMut(&mut D) -> bool,
) -> Result<bool, D::Error> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut idle = d.core_mut().idle();
    loop {
        if done(d) {
            return Ok(true);
        }
        d.poll_once()?;
        if done(d) {
            return Ok(true);
        }
        if idle.tight() {
            continue;
        }
        let left = match deadline {
            None => None,
            Some(t) => match t.checked_duration_since(Instant::now()) {
                Some(l) if !l.is_zero() => Some(l),
                _ => return Ok(done(d)),
            },
        };
        let busy = d.busy();
        d.core_mut()
            .idle_wait(&mut idle, busy, left, &|| D::NAME.into())?;
    }
}

/// The protocols other than the one polling: what a layer that polls the channel itself
/// hands the packets it does not own.
pub(crate) struct Others<'a> {
    table: &'a mut Table,
    out: &'a mut Outbox,
}

impl Others<'_> {
    /// Hands `p` to its protocol, or counts and drops it.
    #[inline]
    pub(crate) fn dispatch(&mut self, p: Packet<'_>) {
        self.table.dispatch(p, self.out)
    }
}

#[cfg(test)]
mod tests;
