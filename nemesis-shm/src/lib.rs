//! The shared-memory substrate of nemesis.
//!
//! One segment per node holds, for each process, a receive queue, a free queue, a
//! doorbell and a pool of cells, and for each ordered pair of processes a ring of fastboxes.
//! Queues are Nemesis lock-free MPSC queues linked by offsets, so each process may map the
//! segment at its own address. The crate knows nothing of tags, networks or what ranks
//! mean: it moves opaque headers and payloads between local process indices.
//!
//! The lock-free protocols are written against [`region::Region`], so the loom models in
//! `loom-tests` check the very code that runs over the segment.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod coll;
pub mod config;
pub mod copy;
pub mod cpu;
pub mod doorbell;
pub mod error;
#[cfg(not(loom))]
mod file;
pub mod futex;
pub mod heap;
pub mod pairbuf;
pub mod port;
#[cfg(not(loom))]
mod prefetch;
pub mod queue;
pub mod region;
pub mod ring;
#[cfg(not(loom))]
pub mod segment;
pub mod split;
pub mod sync;
pub mod variant;
pub mod wake;
pub mod window;

pub use config::Geometry;
pub use error::ShmError;
#[cfg(not(loom))]
pub use file::{check_name, sweep};
pub use port::{Full, Lane, Port};
pub use region::{Envelope, Region};
#[cfg(not(loom))]
pub use segment::{JoinSpec, PeerState, Segment};
