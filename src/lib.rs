//! nemesis: a communication subsystem in the style of MPICH's Nemesis.
//!
//! Processes on one node exchange packets through lock-free queues and per-pair
//! fastboxes in one shared segment ([`nemesis_shm`]). Everything above is written
//! against the small [`Channel`] trait.
//!
//! ```no_run
//! use nemesis::{Channel, Header, ShmChannel};
//! let mut ch = ShmChannel::init()?; // started by `nemesis-run -n 2`
//! if ch.rank() == 0 {
//!     ch.send_bytes(1, Header { tag: 7, ..Header::default() }, b"hello")?;
//! } else {
//!     ch.poll_wait(|p| println!("{} says {:?}", p.src, p.payload), None)?;
//! }
//! ch.flush(std::time::Duration::from_secs(10))?;
//! # Ok::<(), nemesis::ChannelError>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod bootstrap;
pub mod channel;
pub mod launch;
pub mod measure;

pub use bootstrap::{BootInfo, Rank};
pub use channel::{Channel, ChannelError, Header, Packet, SendStatus, SendTicket, ShmChannel, WaitPolicy};
pub use nemesis_shm as shm;
