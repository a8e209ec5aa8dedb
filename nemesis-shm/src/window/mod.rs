//! The shared-memory side of one-sided windows: what the processes of a node that map
//! a window share, and the lock-free protocols they run on it.
//!
//! - [`atomic`]: element updates (accumulates, fetch-and-op, compare-and-swap) as CPU
//!   atomics, the one executor of every update of a window;
//! - [`lock`]: the fair reader-writer ticket lock of each target;
//! - [`counter`]: the counter-word lock of a window whose atomics run on the network
//!   card;
//! - [`pscw`]: the counters of post, start, complete and wait;
//! - `WinFile`: the file that holds them and the members' memory.
//!
//! The loom models in `loom-tests` run both locks, the counters and the updates.

pub mod atomic;
pub mod counter;
#[cfg(not(loom))]
mod file;
pub mod lock;
pub mod pscw;

#[cfg(not(loom))]
pub use file::{MAX_MEMBERS, WinFile};
