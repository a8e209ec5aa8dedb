//! Packets produced while the channel is polling, sent once the poll returns.

use crate::channel::kinds::{ProtocolId, RegistryError};
use crate::channel::{Channel, ChannelError, Header, Rank};

#[derive(Debug)]
struct Queued {
    dest: Rank,
    header: Header,
    payload: Vec<u8>,
}

/// Where a protocol's handler puts what it sends: a handler runs inside the channel's
/// poll, which has the channel borrowed, so its packets are copied here and leave as
/// soon as the poll returns, in the order they were queued.
#[derive(Debug)]
pub struct Outbox {
    pkts: Vec<Queued>,
    /// The protocol whose handler is running, whose id [`Outbox::send`] stamps.
    proto: ProtocolId,
    size: u32,
}

impl Outbox {
    pub(crate) fn new(size: u32) -> Self {
        Self {
            pkts: Vec::new(),
            proto: ProtocolId::of(0),
            size,
        }
    }

    pub(crate) fn serving(&mut self, id: ProtocolId) {
        self.proto = id;
    }

    /// Queues a packet to `dest`. `header.kind` is the protocol's own kind (0 to 0xff);
    /// its high byte is set to the id of the protocol being served.
    ///
    /// # Errors
    /// [`RegistryError::Kind`] for a kind above 0xff, [`RegistryError::InvalidRank`] for a
    /// rank outside the job; nothing is queued.
    pub fn send(&mut self, dest: Rank, header: Header, payload: &[u8]) -> Result<(), RegistryError> {
        if header.kind > 0xff {
            return Err(RegistryError::Kind(header.kind));
        }
        if dest >= self.size {
            return Err(RegistryError::InvalidRank {
                rank: dest,
                size: self.size,
            });
        }
        let header = Header {
            kind: self.proto.kind(header.kind as u8),
            ..header
        };
        self.push(dest, header, payload);
        Ok(())
    }

    /// Queues a packet whose header is complete: for nemesis's own protocols.
    pub(crate) fn push(&mut self, dest: Rank, header: Header, payload: &[u8]) {
        self.push_vec(dest, header, payload.to_vec());
    }

    /// As [`Outbox::push`], with a payload the caller built.
    pub(crate) fn push_vec(&mut self, dest: Rank, header: Header, payload: Vec<u8>) {
        self.pkts.push(Queued {
            dest,
            header,
            payload,
        });
    }

    /// Whether nothing is queued.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.pkts.is_empty()
    }

    /// Packets queued.
    pub fn len(&self) -> usize {
        self.pkts.len()
    }

    /// Sends what is queued, in order. A packet the channel refuses is dropped and the
    /// first such error returned after the others went.
    pub(crate) fn flush<C: Channel>(&mut self, ch: &mut C) -> Result<(), ChannelError> {
        let mut first = None;
        for q in self.pkts.drain(..) {
            if let Err(e) = ch.send_bytes(q.dest, q.header, &q.payload) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}
