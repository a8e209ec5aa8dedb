//! One-sided communication (RMA): windows of memory that other ranks put into, get
//! from, and update atomically, inside epochs that say when it happens.
//!
//! A [`Window`] is made collectively over a communicator, in one of three flavours:
//!
//! - [`Window::allocate`]: nemesis allocates the memory, in a file of the node's
//!   shared-memory directory that every member on the node maps; a put or get to a
//!   member on the node is a copy, an update a CPU atomic, and the target takes no part;
//! - [`Window::create`]: the memory is a vector the caller hands over (and gets back
//!   from [`Window::free`]); members on the node put and get by cross-memory attach,
//!   updates go to the owner as messages;
//! - [`Window::dynamic`]: memory is attached and detached later, and reached by
//!   messages.
//!
//! Members on other nodes (or every member, with `NEMESIS_NO_SHM=1`) are reached by
//! messages that the target's progress core serves whichever nemesis call it is in
//! ([`crate::World::compute`] serves them while it computes, too).
//!
//! Operations exist only on epochs, which borrow the world and the window:
//!
//! | epoch | opened by | closed by |
//! |---|---|---|
//! | [`FenceEpoch`] | [`Window::fence`] (collective) | [`FenceEpoch::fence`], [`FenceEpoch::end`] |
//! | [`AccessEpoch`] | [`Window::start`] | [`AccessEpoch::complete`] |
//! | [`ExposureEpoch`] | [`Window::post`] | [`ExposureEpoch::wait`] |
//! | [`LockEpoch`] | [`Window::lock`], [`Window::lock_all`] | [`LockEpoch::unlock`] |
//!
//! so an operation outside an epoch does not compile. Displacements count elements of
//! the window's type; a get's buffer stays borrowed until the epoch (or its request)
//! completes it.
//!
//! ```
//! use nemesis::rma::{AccOp, LockKind, Window};
//! let mut world = nemesis::init()?;
//! let comm = world.comm();
//! let (me, n) = (world.rank(), world.size());
//! let win = Window::<u64>::allocate(&mut world, &comm, 4)?;
//! // Everyone adds its rank to element 0 of rank 0, and reads rank 0's element 1.
//! let mut seen = [0u64; 1];
//! let mut ep = win.lock(&mut world, 0, LockKind::Shared)?;
//! ep.accumulate(&[u64::from(me)], 0, 0, AccOp::Sum)?;
//! ep.get(&mut seen, 0, 1)?;
//! ep.unlock()?;
//! world.barrier(&comm)?;
//! let mut total = [0u64];
//! let mut ep = win.lock(&mut world, 0, LockKind::Shared)?;
//! ep.get(&mut total, 0, 0)?;
//! ep.unlock()?;
//! assert_eq!(total[0], u64::from(n * (n - 1) / 2));
//! win.free(&mut world)?;
//! # Ok::<(), nemesis::rma::RmaError>(())
//! ```

mod access;
mod blocks;
mod elem;
mod epoch;
mod idmap;
mod nic;
mod nic_ops;
mod ops;
mod proto;
mod target;
mod window;
pub mod wire;

pub use access::Ops;
pub use blocks::Strided;
pub use elem::AccOp;
pub use epoch::{AccessEpoch, ExposureEpoch, FenceEpoch, LockEpoch};
pub use ops::{Get, Put};
#[doc(hidden)]
pub use target::serve_bytes;
pub use window::{AtomicElem, DEFAULT_RDMA_MIN, Executor, Flavor, RDMA_MIN_VAR, Region, Window};

use crate::p2p::P2pError;
use wire::Refusal;

/// How a lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// Several origins at once.
    Shared,
    /// One origin alone.
    Exclusive,
}

/// What the caller promises about an epoch, so that synchronisation can be skipped
/// (MPI's `MPI_MODE_*` assertions). Combine with `|`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Assert(u8);

impl Assert {
    /// No promise.
    pub const NONE: Self = Self(0);
    /// No other origin holds or asks for a conflicting lock: lock and unlock take none.
    pub const NOCHECK: Self = Self(1);
    /// No operation of the epoch that a fence closes needs completing: the fence skips
    /// counting them.
    pub const NOPRECEDE: Self = Self(2);
    /// No epoch follows the fence.
    pub const NOSUCCEED: Self = Self(4);

    /// Whether `other`'s promises are all among these.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Assert {
    type Output = Self;
    fn bitor(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}

/// Why a one-sided operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RmaError {
    /// A target rank outside the window's communicator.
    #[error("rank {rank} is not in a window of {size} ranks")]
    InvalidRank {
        /// The rank given.
        rank: u32,
        /// Members of the window.
        size: u32,
    },
    /// An access that does not lie inside the target's window.
    #[error("{count} elements at displacement {disp} reach outside rank {target}'s window of {len} elements")]
    OutOfBounds {
        /// The target (communicator rank).
        target: u32,
        /// The displacement, in elements.
        disp: usize,
        /// Elements accessed.
        count: usize,
        /// Elements in the target's window.
        len: usize,
    },
    /// An operation on a target the epoch does not reach: not in its group, or not
    /// locked by it.
    #[error("rank {target} is not a target of this epoch ({why})")]
    NotInEpoch {
        /// The target (communicator rank).
        target: u32,
        /// Why.
        why: &'static str,
    },
    /// Buffers of lengths that cannot go together.
    #[error("{0}")]
    InvalidArgument(String),
    /// The target refused a request: what it found wrong.
    #[error(
        "rank {target} refused a request of {len} bytes at displacement {disp}: {}{}",
        why.describe(),
        if *others > 0 { format!(" (and {others} more requests were refused since the last synchronisation)") } else { String::new() }
    )]
    Refused {
        /// The target (communicator rank).
        target: u32,
        /// Why.
        why: Refusal,
        /// The displacement the target saw (bytes, or an address in a dynamic window).
        disp: u64,
        /// The length the target saw, in bytes.
        len: u64,
        /// Further refusals reported with this one (their details are not kept).
        others: usize,
    },
    /// A target that broke the protocol answering a request.
    #[error("rank {target} broke the one-sided protocol: {what}")]
    Protocol {
        /// The target (communicator rank).
        target: u32,
        /// What was wrong.
        what: String,
    },
    /// The network module's RDMA failed a transfer (or could not register memory).
    #[error("an RDMA transfer with rank {target} failed: {why}")]
    Rdma {
        /// The target (communicator rank).
        target: u32,
        /// What the device said.
        why: String,
    },
    /// A member died or left.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The member (communicator rank).
        rank: u32,
        /// What is known.
        reason: String,
    },
    /// Members made a window with arguments that cannot go together.
    #[error("window arguments differ between ranks: {0}")]
    CollectiveMismatch(String),
    /// The window's memory could not be had.
    #[error("a window of {bytes} bytes could not get its memory: {reason}")]
    Memory {
        /// Bytes asked for.
        bytes: u64,
        /// Why, with the variable to change where one decides it.
        reason: String,
    },
    /// A window, or memory, of another world or window.
    #[error("{0}")]
    Wrong(&'static str),
    /// The layers underneath failed.
    #[error(transparent)]
    P2p(#[from] P2pError),
}

/// One-sided packets this process dropped because they named no window or request of
/// its, or were malformed: bad input from the wire, counted (and reported on standard
/// error, the first and then every power of two).
pub fn stray_packets<C: crate::Channel>(world: &crate::World<C>) -> u64 {
    world
        .core()
        .protocol::<proto::Rma>(crate::ProtocolId::RMA)
        .map_or(0, proto::Rma::strays)
}

/// Puts and gets this process has made by the network module's RDMA (the `rc` netmod's
/// reads and writes) rather than by packets: those of at least `NEMESIS_RMA_RDMA_MIN`
/// bytes (16 KiB by default) to members on other nodes.
pub fn rdma_transfers<C: crate::Channel>(world: &crate::World<C>) -> u64 {
    world
        .core()
        .protocol::<proto::Rma>(crate::ProtocolId::RMA)
        .map_or(0, proto::Rma::xfers_done)
}

/// Atomics the network card has run for this process's operations on windows made
/// with [`Executor::Nic`] (each update, each try of a compare-and-swap loop, each step
/// of a lock).
pub fn card_atomics<C: crate::Channel>(world: &crate::World<C>) -> u64 {
    world
        .core()
        .protocol::<proto::Rma>(crate::ProtocolId::RMA)
        .map_or(0, |r| r.card_atomics)
}

impl From<crate::channel::ChannelError> for RmaError {
    fn from(e: crate::channel::ChannelError) -> Self {
        RmaError::P2p(e.into())
    }
}

impl From<crate::progress::RegistryError> for RmaError {
    fn from(e: crate::progress::RegistryError) -> Self {
        RmaError::P2p(e.into())
    }
}

#[cfg(test)]
mod tests;
