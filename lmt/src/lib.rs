//! Large-message transfer (LMT) for nemesis.
//!
//! A message at or above the eager limit is not chopped through queue cells. The
//! sender sends a request-to-send (RTS) carrying a cookie that describes its buffer, the
//! receiver matches it and moves the data with one of the strategies here, and a DONE
//! packet ends the exchange. Depending on the strategy the receiver pulls the data (get),
//! the sender pushes it (put), or both take part (cooperative).
//!
//! This crate holds the trait; the strategies (single-copy CMA, a shared-memory copy
//! ring, vmsplice) implement it.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::fmt;

/// Who moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The sender writes into the receiver's buffer.
    Put,
    /// The receiver reads the sender's buffer.
    Get,
    /// Both sides take part, through an intermediate buffer.
    Cooperative,
}

/// Why a transfer failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum LmtError {
    /// The cookie names memory the peer does not own, or a length that does not match.
    BadCookie(String),
    /// The peer died during the transfer.
    PeerFailed {
        /// The peer's rank.
        rank: u32,
    },
    /// An operating-system error.
    Io(std::io::Error),
}

impl fmt::Display for LmtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadCookie(why) => write!(f, "bad LMT cookie: {why}"),
            Self::PeerFailed { rank } => write!(f, "peer {rank} failed during a large transfer"),
            Self::Io(e) => write!(f, "large transfer I/O: {e}"),
        }
    }
}

impl std::error::Error for LmtError {}

/// Progress of one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Bytes moved so far; call again.
    Partial(usize),
    /// All bytes moved.
    Done,
}

/// One large-message strategy.
pub trait Lmt {
    /// Short name, as in `NEMESIS_LMT`.
    fn name(&self) -> &'static str;
    /// Who moves the bytes.
    fn mode(&self) -> Mode;
    /// The sender's cookie for the RTS, describing `buf`.
    fn cookie(&mut self, peer: u32, buf: &[u8]) -> Result<Vec<u8>, LmtError>;
    /// Advances a receive of the data described by `cookie` into `dst`.
    fn recv(&mut self, peer: u32, cookie: &[u8], dst: &mut [u8]) -> Result<Progress, LmtError>;
    /// Advances the sender's side of a transfer, for put and cooperative strategies.
    fn send(&mut self, peer: u32, cookie: &[u8], src: &[u8]) -> Result<Progress, LmtError>;
    /// Fails every transfer with `peer`, which has died.
    fn peer_terminated(&mut self, peer: u32);
}
