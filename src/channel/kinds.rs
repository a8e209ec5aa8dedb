//! Protocol ids, the high byte of every packet's kind, and the error of claiming one or
//! of sending for it. They divide the channel's kinds among the layers above it, so they
//! live with the channel's header; the progress core, which dispatches by them, exports
//! them (`nemesis::progress`).

use crate::channel::Rank;

/// Which protocol a packet belongs to: the high byte of its header's `kind`.
///
/// | ids | owner |
/// |---|---|
/// | `0x00` | none: a packet of a program that drives the raw channel itself |
/// | `0x01` | [`ProtocolId::P2P`], two-sided messaging ([`crate::World`]) |
/// | `0x02` | [`ProtocolId::RMA`], one-sided operations |
/// | `0x03` | [`ProtocolId::SHMEM`], an OpenSHMEM-style facade |
/// | `0x04`–`0x7e` | reserved for nemesis |
/// | `0x7f` | [`ProtocolId::BENCH`], the benchmarks' own packets |
/// | `0x80`–`0xff` | users' own protocols: [`ProtocolId::user`] |
///
/// The low byte of `kind` is the protocol's own: a protocol has 256 packet kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtocolId(u8);

impl ProtocolId {
    /// Two-sided tagged messaging.
    pub const P2P: Self = Self(0x01);
    /// One-sided operations.
    pub const RMA: Self = Self(0x02);
    /// The OpenSHMEM-style facade.
    pub const SHMEM: Self = Self(0x03);
    /// The benchmarks' packets (`nemesis-bench`).
    pub const BENCH: Self = Self(0x7f);
    /// The first id of users' protocols.
    pub const USER_FIRST: u8 = 0x80;

    /// User protocol `n` (0 to 127), id `0x80 + n`; `None` past 127.
    pub const fn user(n: u8) -> Option<Self> {
        if n < 0x80 {
            Some(Self(Self::USER_FIRST + n))
        } else {
            None
        }
    }

    /// The protocol a packet of `kind` belongs to.
    #[inline(always)]
    pub const fn of(kind: u16) -> Self {
        Self((kind >> 8) as u8)
    }

    /// The header `kind` of this protocol's packet kind `k`.
    #[inline(always)]
    pub const fn kind(self, k: u8) -> u16 {
        (self.0 as u16) << 8 | k as u16
    }

    /// The id as a byte.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The id of byte `b`, for the table that keeps one slot per byte.
    pub(crate) const fn from_byte(b: u8) -> Self {
        Self(b)
    }

    /// Whether the id is in the users' range.
    pub const fn is_user(self) -> bool {
        self.0 >= Self::USER_FIRST
    }
}

impl std::fmt::Display for ProtocolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match *self {
            Self::P2P => "two-sided",
            Self::RMA => "one-sided",
            Self::SHMEM => "shmem",
            Self::BENCH => "benchmark",
            Self(0) => "raw",
            p if p.is_user() => return write!(f, "user protocol {} ({:#04x})", p.0 - Self::USER_FIRST, p.0),
            _ => "reserved",
        };
        write!(f, "{name} ({:#04x})", self.0)
    }
}

/// Why a protocol could not be registered, or a packet not sent for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Another protocol has the id.
    #[error("{0} is already registered")]
    Taken(ProtocolId),
    /// The id belongs to a layer that nemesis itself runs here.
    #[error("{0} is nemesis's own; users' protocols take ids 0x80 to 0xff (ProtocolId::user)")]
    Reserved(ProtocolId),
    /// A packet kind that does not fit the protocol's byte.
    #[error("packet kind {0:#x} is larger than a protocol's 0xff; the high byte is the protocol id")]
    Kind(u16),
    /// A destination outside the job.
    #[error("rank {rank} is out of range: the job has {size} ranks")]
    InvalidRank {
        /// The rank given.
        rank: Rank,
        /// Ranks in the job.
        size: u32,
    },
}
