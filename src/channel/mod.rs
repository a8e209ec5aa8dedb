//! The channel trait: the one seam that everything above the transports is written
//! against.
//!
//! A channel knows who this process is and how many there are, whether a peer shares the
//! node, how to send a packet (a 16-byte [`Header`] and a payload) to a peer without
//! blocking and without dropping it, and how to hand arrived packets upward in place.
//! The two-sided and one-sided layers use nothing else, so they work over shared memory,
//! network modules or a test double alike.

pub(crate) mod kinds;
mod nemesis;
mod pending;
mod shm;
mod wait;
mod waitset;

pub use crate::bootstrap::Rank;
pub use nemesis::{NO_SHM_VAR, NemesisChannel};
pub use nemesis_net::Land;
pub use shm::ShmChannel;
pub use wait::{WaitPolicy, outnumber, usable_cpus};

use nemesis_shm::pairbuf::PairBufs;
use nemesis_shm::{Envelope, Segment};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fixed header of every packet. The channel carries it without interpreting it;
/// the layers above give the fields their meaning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the packet is, in the sending layer's terms.
    pub kind: u16,
    /// Layer-defined flags.
    pub flags: u16,
    /// Matching context (communicator), or any layer-defined word.
    pub context: u32,
    /// Message tag, or any layer-defined word.
    pub tag: i32,
    /// A spare word.
    pub aux: u32,
}

impl Header {
    /// Packs the header into the transport's 16 bytes.
    #[inline(always)]
    pub const fn to_envelope(self) -> Envelope {
        [
            self.kind as u64 | (self.flags as u64) << 16 | (self.context as u64) << 32,
            self.tag as u32 as u64 | (self.aux as u64) << 32,
        ]
    }

    /// Unpacks a header packed by [`Header::to_envelope`].
    #[inline(always)]
    pub const fn from_envelope(e: &Envelope) -> Self {
        Self {
            kind: e[0] as u16,
            flags: (e[0] >> 16) as u16,
            context: (e[0] >> 32) as u32,
            tag: e[1] as u32 as i32,
            aux: (e[1] >> 32) as u32,
        }
    }
}

/// An arrived packet, lent to the receiver: the payload still lives in the transport's
/// memory and is released when the sink returns.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The sender's rank.
    pub src: Rank,
    /// The sender's header.
    pub header: Header,
    /// The payload.
    pub payload: &'a [u8],
}

/// What [`Channel::poll_landing`] hands packets to: a receiver that may know, from a
/// long packet's header alone, where its payload goes, and have it written there while
/// it arrives instead of copying it out of the transport's memory afterwards. Every
/// closure that takes a [`Packet`] is one that never does.
pub trait PacketSink {
    /// An arrived packet, lent in place.
    fn packet(&mut self, p: Packet<'_>);

    /// A packet from `src` whose `len` payload bytes are still arriving: the sink may
    /// call `land.land(buf)` with a buffer of exactly `len` bytes and return what it
    /// returned. `true`: the payload is in `buf`, and the packet is delivered. `false`:
    /// the packet comes through [`PacketSink::packet`] once whole (or its sender's
    /// failure is reported as any other). Only transports that read a stream offer
    /// packets this way, and only to a sink that [lands](PacketSink::lands).
    #[inline(always)]
    fn arriving(&mut self, src: Rank, header: &Header, len: usize, land: &mut dyn Land) -> bool {
        let _ = (src, header, len, land);
        false
    }

    /// Whether the sink takes packets through [`PacketSink::arriving`].
    #[inline(always)]
    fn lands(&self) -> bool {
        false
    }
}

impl<F: FnMut(Packet<'_>)> PacketSink for F {
    #[inline(always)]
    fn packet(&mut self, p: Packet<'_>) {
        self(p)
    }
}

/// What became of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// The packet is in the transport.
    Sent,
    /// The transport had no room: the packet was copied into the destination's pending
    /// list, which polling drains in order. The caller's buffer is free either way.
    Queued(SendTicket),
}

/// Names a queued send, to ask whether it has reached the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTicket {
    pub(crate) peer: u32,
    pub(crate) n: u64,
    /// Whether it waits for a network module rather than shared memory.
    pub(crate) net: bool,
}

/// Why a channel operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// A rank outside the job.
    #[error("rank {rank} is out of range: the job has {size} ranks (0 to {})", size.saturating_sub(1))]
    InvalidRank {
        /// The rank given.
        rank: Rank,
        /// Ranks in the job.
        size: u32,
    },
    /// A payload larger than one packet may carry.
    #[error(
        "packet of {len} bytes is larger than the maximum of {max} bytes to that peer \
         (through shared memory: NEMESIS_CELL_SIZE less the cell header); send large messages in pieces"
    )]
    PacketTooLarge {
        /// The payload's length.
        len: usize,
        /// The largest payload.
        max: usize,
    },
    /// The peer has died or left.
    #[error("peer {rank} failed: {reason}")]
    PeerFailed {
        /// The peer.
        rank: Rank,
        /// What is known.
        reason: String,
    },
    /// A peer on another node, with no network module to reach it.
    #[error("no route to rank {rank}: it is on another node and no network module is configured")]
    NoRoute {
        /// The peer.
        rank: Rank,
    },
    /// A configuration variable is unusable.
    #[error("invalid {var}={value:?}: {reason}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Queued sends did not drain in time.
    #[error("{pending} queued sends did not reach the transport within {waited:?}")]
    FlushTimeout {
        /// Sends still queued.
        pending: usize,
        /// How long was waited.
        waited: Duration,
    },
    /// Start-up could not place the process in the job.
    #[error(transparent)]
    Boot(#[from] crate::bootstrap::BootError),
    /// The shared segment could not be made or joined.
    #[error(transparent)]
    Shm(#[from] nemesis_shm::ShmError),
    /// The shared segment holds something no correct peer writes.
    #[error(transparent)]
    Corrupt(#[from] nemesis_shm::port::Corrupt),
    /// The large-message strategies could not be set up.
    #[error(transparent)]
    Lmt(#[from] nemesis_lmt::LmtError),
    /// The network module failed.
    #[error(transparent)]
    Net(nemesis_net::NetError),
    /// A protocol could not be registered, or a packet not sent for it.
    #[error(transparent)]
    Registry(#[from] kinds::RegistryError),
}

/// A transport between the ranks of a job: who we are, whether a peer shares our node,
/// sends that never block and never drop, and polls that hand packets up in place.
///
/// ```
/// use nemesis::{Channel, Header, NemesisChannel};
/// let mut ch = NemesisChannel::init()?; // alone: rank 0 of 1, sending to itself
/// let next = (ch.rank() + 1) % ch.size();
/// ch.send_bytes(next, Header { tag: 7, ..Header::default() }, b"hello")?;
/// let mut got = Vec::new();
/// // The payload is lent in place, straight from the fastbox, cell or network buffer.
/// ch.poll_wait(|p| got.extend_from_slice(p.payload), None)?;
/// assert_eq!(got, b"hello");
/// ch.flush(std::time::Duration::from_secs(10))?;
/// # Ok::<(), nemesis::ChannelError>(())
/// ```
pub trait Channel {
    /// Our rank.
    fn rank(&self) -> Rank;

    /// Ranks in the job.
    fn size(&self) -> u32;

    /// Whether `peer` shares our node. False for ranks out of range.
    fn is_local(&self, peer: Rank) -> bool;

    /// The largest payload of one packet, to any peer.
    fn max_payload(&self) -> usize;

    /// The largest payload of one packet to `peer`, which may be more than
    /// [`Channel::max_payload`] (a network module may carry larger packets than a
    /// cell): what large messages are cut into.
    #[inline]
    fn max_payload_to(&self, peer: Rank) -> usize {
        let _ = peer;
        self.max_payload()
    }

    /// Sends `payload`, the concatenation of the slices, to `peer`. Never blocks and
    /// never drops: when the transport has no room the packet is queued for `peer`, and
    /// traffic to other peers is not held up by it. A packet to a peer that has failed
    /// goes nowhere; [`Channel::check_peer`] is how a sender learns of the failure.
    fn send(&mut self, peer: Rank, header: Header, payload: &[&[u8]]) -> Result<SendStatus, ChannelError>;

    /// Whether a queued send has reached the transport.
    fn is_sent(&self, ticket: SendTicket) -> bool;

    /// Sends still queued.
    fn pending(&self) -> usize;

    /// Whether a packet to `peer` would go to the transport now, not into a pending
    /// list: a sender of a long run of packets (the pieces of a large message) waits for
    /// this, so its pieces are not copied.
    #[inline]
    fn room_for(&self, peer: Rank) -> bool {
        let _ = peer;
        self.pending() == 0
    }

    /// Whether a run of `packets` packets to `peer` would all go to the transport now:
    /// a sender that puts a message's packets back to back (a medium message) asks
    /// first, so that none of them waits in a pending list as a copy.
    #[inline]
    fn room_for_run(&mut self, peer: Rank, packets: usize) -> bool {
        let _ = packets;
        self.room_for(peer)
    }

    /// Whether we have sent `peer` a long packet since we last took one from it, as far
    /// as the transport knows cheaply: a stream of long messages one way rather than an
    /// exchange. A hint for choosing between protocols; the default knows nothing and
    /// says false.
    #[inline]
    fn streams_to(&self, peer: Rank) -> bool {
        let _ = peer;
        false
    }

    /// Whether we have sent `peer` anything since we last took a packet from it, as far
    /// as the transport knows cheaply: [`Channel::streams_to`] for packets of any
    /// length, so that a stream of rendezvous (whose packets are short) counts. The
    /// default knows nothing and says false.
    #[inline]
    fn sent_since_taken(&self, peer: Rank) -> bool {
        let _ = peer;
        false
    }

    /// Makes progress: moves queued sends on, and hands every arrived packet to `sink` in
    /// place. Returns how many packets it handed up.
    fn poll<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError>;

    /// [`Channel::poll`], offering `sink` each long packet from a stream transport while
    /// its payload arrives (see [`PacketSink`]). The default offers none.
    #[inline(always)]
    fn poll_landing<S: PacketSink>(&mut self, sink: &mut S) -> Result<usize, ChannelError> {
        self.poll(|p| sink.packet(p))
    }

    /// Hands `sink` the next packet from `peer` if the transport can find it without
    /// looking anywhere else, and says whether it did: a shortcut for a receiver that
    /// knows whom it waits for. `false` says nothing about what else has arrived, and
    /// moves nothing else on; [`Channel::poll`] does that.
    #[inline]
    fn poll_from<F: FnMut(Packet<'_>)>(&mut self, peer: Rank, sink: F) -> bool {
        let _ = (peer, sink);
        false
    }

    /// [`Channel::poll_from`] for a packet that `want(header, payload length)` accepts:
    /// one it does not is left where it is, for the next poll, and the call says false.
    /// For a receiver whose sink is cheap only for the packet it expects. The default
    /// finds nothing.
    #[inline]
    fn poll_from_if<W, F>(&mut self, peer: Rank, want: W, sink: F) -> bool
    where
        W: FnOnce(&Header, usize) -> bool,
        F: FnMut(Packet<'_>),
    {
        let _ = (peer, want, sink);
        false
    }

    /// Waits until a poll may find something, or `timeout` passes: first spinning, then
    /// yielding, then asleep until a peer rings. May return early.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), ChannelError>;

    /// Fails if `peer` is known to have died or left.
    fn check_peer(&self, peer: Rank) -> Result<(), ChannelError>;

    /// A descriptor that is readable when a poll may find work: shared-memory traffic,
    /// the network module's sockets, its timers. It lets an event loop (epoll, mio,
    /// tokio's `AsyncFd`) sleep on the channel with everything else it waits for:
    ///
    /// 1. call [`Channel::arm`]; if it says false, there is work: poll now;
    /// 2. otherwise sleep until the descriptor is readable;
    /// 3. poll (which withdraws what `arm` announced), and start again.
    ///
    /// It costs the senders nothing while nobody is armed. `None`: the channel has no
    /// descriptor, and a waiter uses [`Channel::wait`].
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Prepares a sleep on [`Channel::wait_fd`]: announces it to the local peers, and
    /// says whether the caller may sleep (true) or must poll, because work is already
    /// there (false).
    ///
    /// # Errors
    /// The network module's failure.
    fn arm(&mut self) -> Result<bool, ChannelError> {
        Ok(false)
    }

    /// How a waiting process of this channel waits, when the channel knows better than
    /// its count of local ranks (how many processes share these CPUs).
    fn wait_policy(&self) -> Option<WaitPolicy> {
        None
    }

    /// The node's shared segment, if every rank that [`Channel::is_local`] reports maps
    /// it: collectives among local ranks meet in its blocks instead of sending messages.
    fn node_segment(&self) -> Option<Arc<Segment>> {
        None
    }

    /// The buffers this process shares with each local peer for medium messages (see
    /// `nemesis_shm::pairbuf`), if the node's segment has them.
    fn pair_bufs(&self) -> Option<PairBufs> {
        None
    }

    /// The large-message strategies towards the peers this channel reaches: those of
    /// the node, RDMA read to other nodes where the network module offers it, and
    /// chunks through packets for everything else.
    fn lmt(&mut self) -> nemesis_lmt::Routes<'_> {
        nemesis_lmt::Routes::none()
    }

    /// One-sided access to registered memory of the peers the network module reaches,
    /// if it offers it (InfiniBand verbs `rc`): what one-sided operations use to reach
    /// windows on other nodes without their owners' part.
    fn rdma(&mut self) -> Option<&mut dyn nemesis_net::Rdma> {
        None
    }

    /// Sends one contiguous payload.
    #[inline]
    fn send_bytes(&mut self, peer: Rank, header: Header, payload: &[u8]) -> Result<SendStatus, ChannelError> {
        self.send(peer, header, &[payload])
    }

    /// Sends one contiguous payload if the transport takes it at once by its quickest
    /// way (the next fastbox, with nothing queued for `peer`), and says whether it did.
    /// False means nothing was sent or queued: the caller sends the packet with
    /// [`Channel::send_bytes`], which reports what went wrong if anything did. A layer's
    /// fast path asks this first, so that its common packet carries no result through
    /// memory. The default takes nothing.
    #[inline]
    fn try_send_now(&mut self, peer: Rank, header: Header, payload: &[u8]) -> bool {
        let _ = (peer, header, payload);
        false
    }

    /// Polls until at least one packet arrived or `timeout` passed; returns how many.
    fn poll_wait<F: FnMut(Packet<'_>)>(
        &mut self,
        mut sink: F,
        timeout: Option<Duration>,
    ) -> Result<usize, ChannelError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let n = self.poll(&mut sink)?;
            if n > 0 {
                return Ok(n);
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(0),
                },
            };
            self.wait(left)?;
        }
    }

    /// Drives progress until every queued send has reached the transport (for a
    /// network, until the peer has it for good), or `timeout` passes. Packets that
    /// arrive meanwhile are kept, in order, and handed up first by the next poll:
    /// a flush loses nothing.
    ///
    /// # Errors
    /// [`ChannelError::FlushTimeout`] with what is still owed, or the transport's error.
    fn flush(&mut self, timeout: Duration) -> Result<(), ChannelError>;
}

/// A packet a flush took in: its sender, header and payload, kept for the next poll.
pub(crate) type Kept = (Rank, Header, Vec<u8>);

/// How long a flush sleeps at most between looks at what it owes.
const FLUSH_LOOK: Duration = Duration::from_millis(10);

/// The loop of a channel's [`Channel::flush`]: polls and waits until `owed` is 0 or
/// `timeout` passes, pushing every packet that arrives onto `kept`. They are kept apart
/// until the end, so that the waits in between sleep instead of finding them.
pub(crate) fn drive_until_delivered<C: Channel>(
    ch: &mut C,
    timeout: Duration,
    owed: impl Fn(&C) -> usize,
    kept: &mut Vec<Kept>,
) -> Result<(), ChannelError> {
    let deadline = Instant::now() + timeout;
    loop {
        if owed(ch) == 0 {
            return Ok(());
        }
        ch.poll(|p| kept.push((p.src, p.header, p.payload.to_vec())))?;
        let now = Instant::now();
        if now >= deadline {
            return Err(ChannelError::FlushTimeout {
                pending: owed(ch),
                waited: timeout,
            });
        }
        ch.wait(Some((deadline - now).min(FLUSH_LOOK)))?;
    }
}

/// A borrowed channel is a channel: a [`crate::World`] can borrow one for a while and
/// hand it back.
impl<C: Channel + ?Sized> Channel for &mut C {
    #[inline(always)]
    fn rank(&self) -> Rank {
        (**self).rank()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        (**self).size()
    }
    #[inline(always)]
    fn is_local(&self, peer: Rank) -> bool {
        (**self).is_local(peer)
    }
    #[inline(always)]
    fn max_payload(&self) -> usize {
        (**self).max_payload()
    }
    #[inline(always)]
    fn max_payload_to(&self, peer: Rank) -> usize {
        (**self).max_payload_to(peer)
    }
    #[inline(always)]
    fn send(&mut self, peer: Rank, header: Header, payload: &[&[u8]]) -> Result<SendStatus, ChannelError> {
        (**self).send(peer, header, payload)
    }
    // Every provided method a channel may override is forwarded: left to its default,
    // a borrowed channel would lose the override (a fast one-payload send, a flush
    // that also waits for the network).
    #[inline(always)]
    fn send_bytes(&mut self, peer: Rank, header: Header, payload: &[u8]) -> Result<SendStatus, ChannelError> {
        (**self).send_bytes(peer, header, payload)
    }
    #[inline(always)]
    fn try_send_now(&mut self, peer: Rank, header: Header, payload: &[u8]) -> bool {
        (**self).try_send_now(peer, header, payload)
    }
    fn poll_wait<F: FnMut(Packet<'_>)>(
        &mut self,
        sink: F,
        timeout: Option<Duration>,
    ) -> Result<usize, ChannelError> {
        (**self).poll_wait(sink, timeout)
    }
    fn flush(&mut self, timeout: Duration) -> Result<(), ChannelError> {
        (**self).flush(timeout)
    }
    #[inline(always)]
    fn is_sent(&self, ticket: SendTicket) -> bool {
        (**self).is_sent(ticket)
    }
    #[inline(always)]
    fn pending(&self) -> usize {
        (**self).pending()
    }
    #[inline(always)]
    fn room_for(&self, peer: Rank) -> bool {
        (**self).room_for(peer)
    }
    #[inline(always)]
    fn room_for_run(&mut self, peer: Rank, packets: usize) -> bool {
        (**self).room_for_run(peer, packets)
    }
    #[inline(always)]
    fn streams_to(&self, peer: Rank) -> bool {
        (**self).streams_to(peer)
    }
    #[inline(always)]
    fn sent_since_taken(&self, peer: Rank) -> bool {
        (**self).sent_since_taken(peer)
    }
    #[inline(always)]
    fn poll<F: FnMut(Packet<'_>)>(&mut self, sink: F) -> Result<usize, ChannelError> {
        (**self).poll(sink)
    }
    #[inline(always)]
    fn poll_landing<S: PacketSink>(&mut self, sink: &mut S) -> Result<usize, ChannelError> {
        (**self).poll_landing(sink)
    }
    #[inline(always)]
    fn poll_from<F: FnMut(Packet<'_>)>(&mut self, peer: Rank, sink: F) -> bool {
        (**self).poll_from(peer, sink)
    }
    #[inline(always)]
    fn poll_from_if<W, F>(&mut self, peer: Rank, want: W, sink: F) -> bool
    where
        W: FnOnce(&Header, usize) -> bool,
        F: FnMut(Packet<'_>),
    {
        (**self).poll_from_if(peer, want, sink)
    }
    #[inline(always)]
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        (**self).wait(timeout)
    }
    #[inline(always)]
    fn check_peer(&self, peer: Rank) -> Result<(), ChannelError> {
        (**self).check_peer(peer)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).wait_fd()
    }
    fn wait_policy(&self) -> Option<WaitPolicy> {
        (**self).wait_policy()
    }
    fn arm(&mut self) -> Result<bool, ChannelError> {
        (**self).arm()
    }
    fn node_segment(&self) -> Option<Arc<Segment>> {
        (**self).node_segment()
    }
    fn pair_bufs(&self) -> Option<PairBufs> {
        (**self).pair_bufs()
    }
    fn lmt(&mut self) -> nemesis_lmt::Routes<'_> {
        (**self).lmt()
    }
    fn rdma(&mut self) -> Option<&mut dyn nemesis_net::Rdma> {
        (**self).rdma()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: 0xabcd,
            flags: 0x1234,
            context: 0xdead_beef,
            tag: -7,
            aux: u32::MAX,
        };
        assert_eq!(Header::from_envelope(&h.to_envelope()), h);
        assert_eq!(
            Header::from_envelope(&Header::default().to_envelope()),
            Header::default()
        );
    }

    /// A channel that overrides the provided methods and says which ran.
    #[derive(Default)]
    struct Overrides {
        ran: Vec<&'static str>,
    }

    impl Channel for Overrides {
        fn rank(&self) -> Rank {
            0
        }
        fn size(&self) -> u32 {
            1
        }
        fn is_local(&self, _: Rank) -> bool {
            true
        }
        fn max_payload(&self) -> usize {
            64
        }
        fn send(&mut self, _: Rank, _: Header, _: &[&[u8]]) -> Result<SendStatus, ChannelError> {
            self.ran.push("send");
            Ok(SendStatus::Sent)
        }
        fn send_bytes(&mut self, _: Rank, _: Header, _: &[u8]) -> Result<SendStatus, ChannelError> {
            self.ran.push("send_bytes");
            Ok(SendStatus::Sent)
        }
        fn try_send_now(&mut self, _: Rank, _: Header, _: &[u8]) -> bool {
            self.ran.push("try_send_now");
            true
        }
        fn is_sent(&self, _: SendTicket) -> bool {
            true
        }
        fn pending(&self) -> usize {
            0
        }
        fn poll<F: FnMut(Packet<'_>)>(&mut self, _: F) -> Result<usize, ChannelError> {
            Ok(0)
        }
        fn poll_landing<S: PacketSink>(&mut self, _: &mut S) -> Result<usize, ChannelError> {
            self.ran.push("poll_landing");
            Ok(0)
        }
        fn poll_wait<F: FnMut(Packet<'_>)>(
            &mut self,
            _: F,
            _: Option<Duration>,
        ) -> Result<usize, ChannelError> {
            self.ran.push("poll_wait");
            Ok(0)
        }
        fn wait(&mut self, _: Option<Duration>) -> Result<(), ChannelError> {
            Ok(())
        }
        fn check_peer(&self, _: Rank) -> Result<(), ChannelError> {
            Ok(())
        }
        fn flush(&mut self, _: Duration) -> Result<(), ChannelError> {
            self.ran.push("flush");
            Ok(())
        }
    }

    /// Goes through whatever channel type it is given, as a `World<C>` does.
    fn use_generically<C: Channel>(mut ch: C) {
        assert!(ch.try_send_now(0, Header::default(), b"x"));
        ch.send_bytes(0, Header::default(), b"x").unwrap();
        ch.poll_wait(|_| {}, Some(Duration::ZERO)).unwrap();
        ch.poll_landing(&mut |_: Packet<'_>| {}).unwrap();
        ch.flush(Duration::ZERO).unwrap();
    }

    #[test]
    fn a_borrowed_channel_keeps_its_overrides() {
        let mut ch = Overrides::default();
        use_generically(&mut ch);
        assert_eq!(
            ch.ran,
            ["try_send_now", "send_bytes", "poll_wait", "poll_landing", "flush"]
        );
    }
}
