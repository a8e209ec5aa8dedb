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
//!
//! Two-sided tagged messaging and collectives ([`World`], in [`p2p`]) are written against
//! the channel trait alone:
//!
//! ```no_run
//! use nemesis::{ANY_SOURCE, ANY_TAG, Op};
//! let mut world = nemesis::init()?;
//! let comm = world.comm();
//! let (me, n) = (world.rank(), world.size());
//! let (outbox, mut inbox) = (u64::from(me).to_le_bytes(), [0u8; 8]);
//! world.scope(|s| -> Result<(), nemesis::P2pError> {
//!     let r = s.irecv(&comm, ANY_SOURCE, ANY_TAG, &mut inbox)?;
//!     let w = s.isend(&comm, (me + 1) % n, 0, &outbox)?;
//!     s.waitall(vec![r, w])?;
//!     Ok(())
//! })?;
//! let mut sum = [f64::from(me)];
//! world.allreduce(&comm, &mut sum, Op::Sum)?;
//! # Ok::<(), nemesis::P2pError>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "async")]
pub mod aio;
pub mod bootstrap;
pub mod channel;
pub mod env;
pub mod op;
pub mod p2p;
pub mod progress;

#[cfg(test)]
mod testkit;

pub use bootstrap::{BootInfo, Rank};
pub use channel::{
    Channel, ChannelError, Header, NemesisChannel, Packet, SendStatus, SendTicket, ShmChannel, WaitPolicy,
};
pub use nemesis_lmt as lmt;
pub use nemesis_net as net;
pub use nemesis_shm as shm;
pub use op::{Op, Reducible};
pub use p2p::{ANY_SOURCE, ANY_TAG, Comm, OwnedBuf, OwnedRequest, P2pError, RequestSet, Status, World, init};
pub use progress::{Protocol, ProtocolId};
