//! Network modules of nemesis.
//!
//! A netmod moves packets between processes on different nodes. The channel in the
//! `nemesis` crate sends to a remote peer through [`Netmod::send`] under the same rule as
//! to a local one: the send is accepted, or the netmod answers "again" and the channel
//! keeps the packet in its per-destination pending list. Connections are lazy: a netmod
//! learns a peer's address from its business card the first time it sends to it.
//!
//! This crate holds the trait; the tcp, reliable-datagram and verbs modules implement it.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::fmt;

/// The 16-byte header of the layer above, carried without being looked at.
pub type Envelope = [u64; 2];

/// Whether a netmod took a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// The packet is the netmod's now.
    Sent,
    /// No room now; nothing was taken. Try again after polling.
    Again,
}

/// Why a netmod operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum NetError {
    /// The peer is gone: its connection closed, or it stopped answering.
    PeerFailed {
        /// The peer's rank.
        rank: u32,
        /// Why it is considered failed.
        reason: String,
    },
    /// A business card could not be understood.
    BadCard {
        /// The peer's rank.
        rank: u32,
        /// What is wrong.
        reason: String,
    },
    /// An operating-system error.
    Io(std::io::Error),
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PeerFailed { rank, reason } => write!(f, "peer {rank} failed: {reason}"),
            Self::BadCard { rank, reason } => write!(f, "bad business card of rank {rank}: {reason}"),
            Self::Io(e) => write!(f, "network I/O: {e}"),
        }
    }
}

impl std::error::Error for NetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Remote memory access a netmod can offer to large-message transfer and one-sided
/// operations, when its hardware does RDMA.
pub trait Rdma {
    /// Registers `len` bytes at `addr` for remote access; returns a key the peer uses.
    fn register(&mut self, addr: *mut u8, len: usize) -> Result<u64, NetError>;
    /// Forgets a registration.
    fn deregister(&mut self, key: u64) -> Result<(), NetError>;
    /// Reads `dst.len()` bytes of `peer`'s registered memory at (`key`, `offset`) into
    /// `dst`; completion is reported by `poll`.
    fn get(&mut self, peer: u32, key: u64, offset: u64, dst: &mut [u8]) -> Result<Accept, NetError>;
    /// Writes `src` into `peer`'s registered memory at (`key`, `offset`).
    fn put(&mut self, peer: u32, key: u64, offset: u64, src: &[u8]) -> Result<Accept, NetError>;
}

/// A network module.
pub trait Netmod {
    /// Short name, as in `NEMESIS_NETMOD` (`tcp`, `udp`, ...).
    fn name(&self) -> &'static str;
    /// This process's address, published for others to connect with.
    fn business_card(&self) -> Vec<u8>;
    /// Records `peer`'s business card; the connection is made on first use.
    fn set_card(&mut self, peer: u32, card: &[u8]) -> Result<(), NetError>;
    /// Largest payload of one packet.
    fn max_payload(&self) -> usize;
    /// Sends a packet to `peer`, or answers [`Accept::Again`] without taking it.
    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError>;
    /// Makes progress and hands each arrived packet to `sink(src, env, payload)`.
    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError>;
    /// RDMA, when the netmod offers it.
    fn rdma(&mut self) -> Option<&mut dyn Rdma> {
        None
    }
}
