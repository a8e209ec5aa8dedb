//! Protocol ids, the trait a protocol implements, and the table that dispatches to them.

use super::outbox::Outbox;
use crate::channel::{Packet, Rank};
use std::any::Any;

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

/// A protocol on the progress core: it is handed every packet of its id, in place,
/// whichever layer happens to be polling.
///
/// The handler runs inside the poll, so it cannot send through the channel directly: it
/// queues what it sends in the [`Outbox`], which goes out as soon as the poll returns.
/// Its state is reached outside the handler through
/// [`crate::progress::Core::protocol_mut`] (or [`crate::World::protocol_mut`]).
///
/// A closure `FnMut(Packet, &mut Outbox)` is a protocol too.
pub trait Protocol: Any + Send {
    /// Handles one packet of this protocol. `packet.payload` is lent until it returns.
    fn handle(&mut self, packet: Packet<'_>, out: &mut Outbox);
}

impl<F: FnMut(Packet<'_>, &mut Outbox) + Send + 'static> Protocol for F {
    fn handle(&mut self, packet: Packet<'_>, out: &mut Outbox) {
        self(packet, out)
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

/// How often a drop of an unregistered protocol's packet is reported: the first, then
/// every power of two, so a flood cannot fill the log.
fn report_due(count: u64) -> bool {
    count.is_power_of_two()
}

/// The registered protocols, by id, and what arrived for ids nobody registered.
pub(crate) struct Table {
    slots: Box<[Option<Box<dyn Protocol>>]>,
    dropped: Box<[u64]>,
    rank: Rank,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<u8> = (0..=255u8)
            .filter(|&i| self.slots[i as usize].is_some())
            .collect();
        f.debug_struct("Table")
            .field("registered", &ids)
            .finish_non_exhaustive()
    }
}

impl Table {
    pub(crate) fn new(rank: Rank) -> Self {
        Self {
            slots: (0..256).map(|_| None).collect(),
            dropped: vec![0; 256].into_boxed_slice(),
            rank,
        }
    }

    pub(crate) fn register(&mut self, id: ProtocolId, p: Box<dyn Protocol>) -> Result<(), RegistryError> {
        let slot = &mut self.slots[id.0 as usize];
        if slot.is_some() {
            return Err(RegistryError::Taken(id));
        }
        *slot = Some(p);
        Ok(())
    }

    pub(crate) fn unregister(&mut self, id: ProtocolId) -> Option<Box<dyn Protocol>> {
        self.slots[id.0 as usize].take()
    }

    pub(crate) fn get(&self, id: ProtocolId) -> Option<&dyn Protocol> {
        self.slots[id.0 as usize].as_deref()
    }

    pub(crate) fn get_mut(&mut self, id: ProtocolId) -> Option<&mut dyn Protocol> {
        match &mut self.slots[id.0 as usize] {
            Some(p) => Some(&mut **p),
            None => None,
        }
    }

    /// Hands `p` to its protocol, or counts and drops it.
    #[inline]
    pub(crate) fn dispatch(&mut self, p: Packet<'_>, out: &mut Outbox) {
        let id = ProtocolId::of(p.header.kind);
        match &mut self.slots[id.0 as usize] {
            Some(h) => {
                out.serving(id);
                h.handle(p, out);
            }
            None => self.drop_unknown(id, p.src),
        }
    }

    #[cold]
    #[inline(never)]
    fn drop_unknown(&mut self, id: ProtocolId, src: Rank) {
        let n = &mut self.dropped[id.0 as usize];
        *n += 1;
        if report_due(*n) {
            eprintln!(
                "nemesis: rank {} dropped {} packet(s) of {id}, which nothing here registered \
                 (the last from rank {src})",
                self.rank, *n
            );
        }
    }

    /// Packets dropped for want of a protocol, by id.
    pub(crate) fn dropped(&self) -> Vec<(ProtocolId, u64)> {
        (0..=255u8)
            .filter(|&i| self.dropped[i as usize] > 0)
            .map(|i| (ProtocolId(i), self.dropped[i as usize]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_kinds_and_name_themselves() {
        assert_eq!(ProtocolId::of(0x0105), ProtocolId::P2P);
        assert_eq!(ProtocolId::P2P.kind(5), 0x0105);
        assert_eq!(ProtocolId::user(0).unwrap().get(), 0x80);
        assert_eq!(ProtocolId::user(127).unwrap().get(), 0xff);
        assert_eq!(ProtocolId::user(128), None);
        assert!(
            ProtocolId::user(3)
                .unwrap()
                .to_string()
                .contains("user protocol 3")
        );
        assert!(ProtocolId::P2P.to_string().contains("two-sided"));
        assert!(!ProtocolId::BENCH.is_user());
    }
}
