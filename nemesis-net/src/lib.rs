//! Network modules of nemesis.
//!
//! A netmod moves packets between processes on different nodes. The channel in the
//! `nemesis` crate sends to a remote peer through [`Netmod::send`] under the same rule as
//! to a local one: the send is accepted, or the netmod answers "again" and the channel
//! keeps the packet in its per-destination pending list. Connections are lazy: a netmod
//! asks its [`Cards`] for a peer's business card the first time it needs the peer.
//!
//! Two modules run on any IP network:
//!
//! - [`tcp`]: one connection per peer, length-prefixed frames, `writev`, epoll;
//! - [`udp`]: one socket for every peer, made reliable by [`reliable`], a sliding window
//!   per peer with cumulative, coalesced ACKs, NACKs on gaps and retransmission from a
//!   monotonic clock, all driven by polling: no thread.
//!
//! Two more run on InfiniBand verbs, behind the `verbs` feature (module `verbs`): `ud`, the same
//! reliability layer over one UD queue pair for every peer, and `rc`, a connected queue
//! pair per peer with RDMA ([`rdma`]).
//!
//! The reliability layer is generic over its transport ([`reliable::Datagram`]), and so is
//! the netmod made of it ([`dgram::DgramNetmod`], over a [`dgram::Endpoint`]): `udp` is one
//! instance, `ud` another. A transport lends each received datagram in place
//! rather than copying it out. [`sim`] is a seeded, lossy, reordering, duplicating network
//! for the layer's tests.
//!
//! Everything that arrives from the wire is untrusted: frames and datagrams are decoded
//! and checked before use, and whatever fails a check is dropped or refused with a
//! counted reason ([`Drops`]), never a panic.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod addr;
pub mod auth;
pub mod config;
pub mod dgram;
mod drops;
pub mod gate;
pub mod landing;
pub mod pinned;
pub mod rdma;
pub mod reliable;
pub mod sim;
pub mod sys;
pub mod tcp;
pub mod udp;
#[cfg(feature = "verbs")]
pub mod verbs;
pub mod verbs_wire;

pub use drops::{DropReason, Drops};
pub use landing::{Land, Sink};
pub use rdma::Rdma;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// Whether a poll may find something, as a waiter that sleeps on more than one netmod
/// asks (the channel's wait, or an event loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitHint {
    /// A poll may find something now.
    Now,
    /// Nothing until the netmod's wait descriptor is ready, or the instant (its next
    /// timer) passes.
    Later(Option<Instant>),
}

/// The 16-byte header of the layer above, carried without being looked at.
pub type Envelope = [u64; 2];

/// Whether a netmod took a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// The packet is the netmod's now; the caller's buffers are free.
    Sent,
    /// No room now; nothing was taken. Try again after polling.
    Again,
}

/// Why a netmod operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The peer is gone: its connection closed, or it stopped answering.
    #[error("peer {rank} failed: {reason}")]
    PeerFailed {
        /// The peer's rank.
        rank: u32,
        /// Why it is considered failed.
        reason: String,
    },
    /// A business card could not be had or understood.
    #[error("bad business card of rank {rank}: {reason}")]
    BadCard {
        /// The peer's rank.
        rank: u32,
        /// What is wrong.
        reason: String,
    },
    /// A rank outside the job.
    #[error("rank {rank} is out of range: the job has {size} ranks")]
    InvalidRank {
        /// The rank given.
        rank: u32,
        /// Ranks in the job.
        size: u32,
    },
    /// A payload larger than one packet of this netmod.
    #[error("packet of {len} bytes is larger than the netmod's maximum of {max} bytes")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest payload.
        max: usize,
    },
    /// A configuration variable is unusable.
    #[error("invalid {var}={value:?}: {reason}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A verbs device could not be used.
    #[cfg(feature = "verbs")]
    #[error(transparent)]
    Verbs(Box<verbs::VerbsError>),
    /// An operating-system error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What failed, for the message.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl NetError {
    /// An [`NetError::Io`] saying what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

/// Where a netmod finds peers' business cards: the process manager's key-value space
/// in a job, a table in tests. Asked once per peer, on first contact.
pub trait Cards: Send {
    /// `rank`'s business card.
    ///
    /// # Errors
    /// [`NetError::BadCard`] when the card cannot be had.
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError>;
}

/// A fixed table of cards, for tests and for jobs that know every address up front.
impl Cards for Vec<Vec<u8>> {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        self.get(rank as usize)
            .filter(|c| !c.is_empty())
            .cloned()
            .ok_or_else(|| NetError::BadCard {
                rank,
                reason: "no card in the table".into(),
            })
    }
}

/// Who this process is to the network: what every netmod is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Our rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// A secret shared by the job's processes. Connections and datagrams prove they
    /// hold it without carrying it ([`auth`]); whatever cannot is refused, so two jobs
    /// never mix and a stranger cannot join.
    pub job_key: auth::JobKey,
    /// The address to bind and publish (see [`addr::choose`]).
    pub addr: std::net::IpAddr,
}

/// Opens the netmod called `name` (one of [`config::NETMODS`]) for `id`, reading its
/// tunables through `get`.
///
/// # Errors
/// An unknown name, a bad tunable, or a socket that cannot be made.
pub fn open(
    name: &str,
    id: Identity,
    cards: Box<dyn Cards>,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<dyn Netmod>, NetError> {
    match name {
        "tcp" => Ok(Box::new(tcp::TcpNetmod::new(
            id,
            cards,
            tcp::TcpConfig::from_lookup(get)?,
        )?)),
        "udp" => Ok(Box::new(udp::UdpNetmod::new(
            id,
            cards,
            udp::UdpConfig::from_lookup(get)?,
        )?)),
        #[cfg(feature = "verbs")]
        "ud" => Ok(Box::new(verbs::hybrid::Hybrid::new(
            id,
            cards,
            verbs::ud::UdConfig::from_lookup(get)?,
            verbs::hybrid::Hybrid::rdma_config(get)?,
        )?)),
        #[cfg(feature = "verbs")]
        "rc" => Ok(Box::new(verbs::rc::RcNetmod::new(
            id,
            cards,
            verbs::rc::RcConfig::from_lookup(get)?,
        )?)),
        other => Err(NetError::Config {
            var: config::NETMOD_VAR,
            value: other.into(),
            reason: config::unknown_netmod(other),
        }),
    }
}

/// Checks every network variable as opening a netmod would, without opening one: a job
/// on one node refuses a bad value exactly as a job on many does.
///
/// # Errors
/// The first unusable variable, named.
pub fn check_config(get: &dyn Fn(&str) -> Option<String>) -> Result<(), NetError> {
    config::netmod(get)?;
    tcp::TcpConfig::from_lookup(get)?;
    udp::UdpConfig::from_lookup(get)?;
    #[cfg(feature = "verbs")]
    verbs::hybrid::check_config(get)?;
    #[cfg(feature = "verbs")]
    verbs::rc::RcConfig::from_lookup(get)?;
    addr::choose(get, true)?;
    Ok(())
}

/// Counters a netmod keeps, for benchmarks and diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets handed to the wire, first transmissions only.
    pub packets_sent: u64,
    /// Packets handed up by `poll`.
    pub packets_received: u64,
    /// Of those, packets whose payload was read straight into the receiver's buffer
    /// (tcp; see [`landing`]).
    pub packets_landed: u64,
    /// Segments sent again (udp).
    pub retransmits: u64,
    /// Duplicate segments received and dropped (udp).
    pub duplicates: u64,
    /// Bytes asked for by RDMA reads and writes posted ([`Rdma::get`], [`Rdma::put`]).
    pub rdma_bytes: u64,
    /// Peers with a connected pair that RDMA can use (rc's queue pairs; ud's, made on
    /// demand), now.
    pub rdma_pairs: u64,
    /// What was dropped or refused from the wire, and why.
    pub drops: Drops,
}

/// A network module.
///
/// Every method returns at once except [`Netmod::wait`]. Progress (reading, writing
/// queued bytes, timers) happens in [`Netmod::poll`] and nowhere else: a netmod has no
/// thread.
pub trait Netmod: Send + std::fmt::Debug {
    /// Short name, as in `NEMESIS_NETMOD` (`tcp`, `udp`, ...).
    fn name(&self) -> &'static str;

    /// This process's address, published for others to connect with.
    fn business_card(&self) -> Vec<u8>;

    /// Largest payload of one packet.
    fn max_payload(&self) -> usize;

    /// Sends a packet to `peer`, or answers [`Accept::Again`] without taking it. Packets
    /// to one peer arrive in the order they were accepted, exactly once.
    ///
    /// # Errors
    /// A bad rank, a payload above [`Netmod::max_payload`], a peer known to have failed,
    /// a card that cannot be had.
    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError>;

    /// Makes progress and hands each arrived packet to `sink(src, env, payload)` in
    /// place; returns how many it handed up. A failing peer does not make `poll` fail: it
    /// is reported by [`Netmod::check_peer`] and by sends to it.
    ///
    /// # Errors
    /// Only failures of the netmod itself (its socket or epoll instance).
    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError>;

    /// [`Netmod::poll`], offering a long packet to `sink` while its payload arrives, so
    /// that it can be written straight into the receiver's buffer (see [`landing`]). The
    /// default offers none.
    ///
    /// # Errors
    /// As for [`Netmod::poll`].
    fn poll_landing(&mut self, sink: &mut dyn Sink) -> Result<usize, NetError> {
        self.poll(&mut |src, env, payload| sink.packet(src, env, payload))
    }

    /// Blocks until a poll may find something (input, room for queued output, or a timer
    /// due) or `timeout` passes, and says whether a poll may find something. With
    /// `Duration::ZERO` it only looks, which is how a spinning waiter asks. May return
    /// early.
    ///
    /// # Errors
    /// As for [`Netmod::poll`].
    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError>;

    /// A descriptor that is readable while a poll may find something (input, room for
    /// queued output), for a waiter that sleeps on more than this netmod. `None`: the
    /// netmod has none, and such a waiter must look at it now and then.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Whether a poll may find something now and, if not, when the netmod's next timer
    /// falls due: what a waiter that sleeps on [`Netmod::wait_fd`] needs besides it.
    ///
    /// # Errors
    /// As for [`Netmod::poll`].
    fn wait_hint(&mut self) -> Result<WaitHint, NetError> {
        Ok(if self.wait(Duration::ZERO)? {
            WaitHint::Now
        } else {
            WaitHint::Later(None)
        })
    }

    /// Packets accepted but not yet known to have left for good: queued for the socket,
    /// or (udp) sent and not yet acknowledged.
    fn backlog(&self) -> usize;

    /// Whether a packet to `peer` would go to the wire now rather than be copied into a
    /// queue: a sender of many large pieces waits for this instead of having its pieces
    /// copied.
    fn writable(&self, peer: u32) -> bool {
        let _ = peer;
        true
    }

    /// Fails if `peer` is known to have failed or left.
    ///
    /// A peer that has been silent may be dead without anyone noticing: a netmod that
    /// cannot tell otherwise (no connection yet, or nothing unacknowledged) asks it for a
    /// sign of life at its next poll, so that a caller who keeps checking learns of a
    /// dead peer within [`config::NET_TIMEOUT_VAR`]'s bound.
    ///
    /// # Errors
    /// [`NetError::PeerFailed`] saying why.
    fn check_peer(&self, peer: u32) -> Result<(), NetError>;

    /// Sends what is queued, says goodbye to the peers, and closes, waiting at most
    /// `timeout` for the peers to take what is owed to them. Called once, before the
    /// netmod is dropped; sends after it fail.
    fn shutdown(&mut self, timeout: Duration);

    /// Counters.
    fn stats(&self) -> NetStats;

    /// RDMA, when the netmod offers it.
    fn rdma(&mut self) -> Option<&mut dyn Rdma> {
        None
    }
}
