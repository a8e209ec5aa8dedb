//! The trait a protocol implements, and the table that dispatches to them.

use super::outbox::Outbox;
use crate::channel::kinds::{ProtocolId, RegistryError};
use crate::channel::{Packet, Rank};
use std::any::Any;

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
        let slot = &mut self.slots[id.get() as usize];
        if slot.is_some() {
            return Err(RegistryError::Taken(id));
        }
        *slot = Some(p);
        Ok(())
    }

    pub(crate) fn unregister(&mut self, id: ProtocolId) -> Option<Box<dyn Protocol>> {
        self.slots[id.get() as usize].take()
    }

    pub(crate) fn get(&self, id: ProtocolId) -> Option<&dyn Protocol> {
        self.slots[id.get() as usize].as_deref()
    }

    pub(crate) fn get_mut(&mut self, id: ProtocolId) -> Option<&mut dyn Protocol> {
        match &mut self.slots[id.get() as usize] {
            Some(p) => Some(&mut **p),
            None => None,
        }
    }

    /// Hands `p` to its protocol, or counts and drops it.
    #[inline]
    pub(crate) fn dispatch(&mut self, p: Packet<'_>, out: &mut Outbox) {
        let id = ProtocolId::of(p.header.kind);
        match &mut self.slots[id.get() as usize] {
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
        let n = &mut self.dropped[id.get() as usize];
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
            .map(|i| (ProtocolId::from_byte(i), self.dropped[i as usize]))
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
