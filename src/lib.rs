//! nemesis: a communication subsystem in the style of MPICH's Nemesis, for the Rust
//! runtimes and SPMD programs that embed it as their transport.
//!
//! Processes on one node exchange packets through lock-free queues and per-pair
//! fastboxes in one shared segment ([`nemesis_shm`]); processes on different nodes
//! through a network module ([`nemesis_net`]). Everything above is written against the
//! small [`Channel`] trait, and served by one progress core ([`progress`]) that every
//! protocol on a channel shares: two-sided messaging ([`World`], in [`p2p`]) is one, a
//! runtime's own protocol another.
//!
//! Start a job with `nemesis-run -n 4 PROGRAM` (crate `nemesis-tools`), MPICH's
//! `mpiexec`, or Slurm's `srun --mpi=pmi2`; a program started alone is rank 0 of 1, which
//! is how these examples run as tests.
//!
//! ```
//! use nemesis::Op;
//! let mut world = nemesis::init()?; // rank, size and peers from the process manager
//! let comm = world.comm();
//! let (me, n) = (world.rank(), world.size());
//! // Pass our rank to the next rank round a ring (alone, to ourselves).
//! world.send(&comm, (me + 1) % n, 0, &u64::from(me).to_le_bytes())?;
//! let mut got = [0u8; 8];
//! let st = world.recv(&comm, (me + n - 1) % n, 0, &mut got)?;
//! assert_eq!(u64::from_le_bytes(got), u64::from(st.source));
//! let mut sum = [f64::from(me)];
//! world.allreduce(&comm, &mut sum, Op::Sum)?;
//! assert_eq!(sum[0], f64::from(n * (n - 1) / 2));
//! # Ok::<(), nemesis::P2pError>(())
//! ```
//!
//! Non-blocking operations come two ways: scoped requests borrow their buffers for the
//! life of a [`p2p::Scope`]; owned requests ([`OwnedRequest`]) own theirs, are `Send`,
//! and can be kept anywhere, waited on in sets ([`RequestSet`]), or awaited as futures
//! (the `async` feature, [`aio`](crate#async)).
//!
//! ```
//! let mut world = nemesis::init()?;
//! let comm = world.comm();
//! let (me, n) = (world.rank(), world.size());
//! let (outbox, mut inbox) = (u64::from(me).to_le_bytes(), [0u8; 8]);
//! world.scope(|s| -> Result<(), nemesis::P2pError> {
//!     let r = s.irecv(&comm, nemesis::ANY_SOURCE, nemesis::ANY_TAG, &mut inbox)?;
//!     let w = s.isend(&comm, (me + 1) % n, 0, &outbox)?;
//!     s.waitall(vec![r, w])?;
//!     Ok(())
//! })?;
//! # Ok::<(), nemesis::P2pError>(())
//! ```
//!
//! # Async
//!
//! With the cargo feature `async`, [`OwnedRequest`] is a future, and `aio::AsyncWorld`
//! moves a world on from a progress thread, so the futures work on any executor.

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
pub mod rma;

#[cfg(test)]
mod testkit;

pub use bootstrap::{BootInfo, Rank};
pub use channel::{
    Channel, ChannelError, Header, Land, NemesisChannel, Packet, PacketSink, SendStatus, SendTicket,
    ShmChannel, WaitPolicy,
};
pub use nemesis_lmt as lmt;
pub use nemesis_net as net;
pub use nemesis_net::pinned::Pinned;
pub use nemesis_shm as shm;
pub use op::{Op, Reducible};
pub use p2p::{
    ANY_SOURCE, ANY_TAG, Comm, OwnedBuf, OwnedRequest, P2pError, RequestSet, SendCounts, Status, World, init,
};
pub use progress::{Protocol, ProtocolId};
