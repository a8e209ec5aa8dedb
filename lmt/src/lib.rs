//! Large-message transfer (LMT) for nemesis.
//!
//! A message above the eager limit is not chopped through queue cells. The sender sends
//! a request-to-send (RTS) naming the strategies it offers and, for those that need it, a
//! cookie describing its buffer. The receiver matches it, chooses a strategy, and either
//! starts at once (the receiver *gets*), or answers with a clear-to-send (CTS) naming the
//! strategy and carrying its own cookie (the sender *puts*, or both *cooperate* through
//! an intermediate buffer). A DONE packet ends the exchange. The two-sided layer owns
//! those packets; this crate owns the strategies behind the [`Lmt`] trait:
//!
//! | strategy   | mode        | copies | needs                                   |
//! |------------|-------------|--------|-----------------------------------------|
//! | `cma`      | get         | 1      | `process_vm_readv` permitted (ptrace)   |
//! | `cma-put`  | put         | 1      | `process_vm_writev` permitted           |
//! | `cma-split`| split       | 1      | both calls permitted                    |
//! | `ring`     | cooperative | 2      | room for a ring file in the shm dir     |
//! | `vmsplice` | cooperative | 1      | a FIFO in the shm dir                   |
//! | `chunks`   | cooperative | 2      | nothing: packets through queue cells    |
//! | `rdma`     | get         | 0      | a netmod with RDMA, peer on another node|
//!
//! `chunks` is carried out by the two-sided layer itself; it is always possible and is
//! what every other strategy falls back to. The first four move data between processes
//! of one node ([`LocalLmt`]); `rdma` moves it between nodes, the card reading the
//! sender's memory ([`rdma`]). [`Routes`] puts both behind one [`Lmt`], choosing by the
//! peer.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod cma;
mod iov;
pub mod local;
pub mod pipe;
pub mod policy;
pub mod rdma;
mod regcache;
mod routes;
mod stream;
pub mod tune;

pub use local::LocalLmt;
pub use nemesis_shm::ring::Seg;
pub use policy::{AutoBands, AutoOrder, Policy};
pub use regcache::RegCache;
pub use routes::Routes;

use std::fmt;

/// Who moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The sender writes into the receiver's buffer, described by the CTS cookie.
    Put,
    /// The receiver reads the sender's buffer, described by the RTS cookie.
    Get,
    /// Both sides take part, through an intermediate buffer.
    Cooperative,
    /// Both sides copy at once, each its own part: the receiver reads the first part of
    /// the sender's buffer (RTS cookie) while the sender writes the rest into the
    /// receiver's (CTS cookie). Each tells the other when its part is done.
    Split,
}

/// A way to move a large message. The discriminant is its code on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Strategy {
    /// Chunks through queue cells, done by the two-sided layer.
    Chunks = 0,
    /// The receiver reads the sender's memory with `process_vm_readv`.
    Cma = 1,
    /// The sender writes the receiver's memory with `process_vm_writev`.
    CmaPut = 2,
    /// A shared-memory copy ring per ordered pair.
    Ring = 3,
    /// The sender's pages spliced into a pipe, read by the receiver.
    Vmsplice = 4,
    /// The receiver's card reads the sender's registered memory (a peer on another
    /// node, through a netmod with RDMA).
    Rdma = 5,
    /// Both at once: the receiver reads the first half with `process_vm_readv` while
    /// the sender writes the second with `process_vm_writev`, so two CPUs copy; a
    /// receiver done with its half before the sender came reads the second half too
    /// (`nemesis_shm::split`).
    CmaSplit = 6,
}

impl Strategy {
    /// Every strategy, in wire-code order.
    pub const ALL: [Strategy; 7] = [
        Strategy::Chunks,
        Strategy::Cma,
        Strategy::CmaPut,
        Strategy::Ring,
        Strategy::Vmsplice,
        Strategy::Rdma,
        Strategy::CmaSplit,
    ];

    /// The strategy with wire code `code`.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }

    /// Its name, as in `NEMESIS_LMT`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Chunks => "chunks",
            Strategy::Cma => "cma",
            Strategy::CmaPut => "cma-put",
            Strategy::Ring => "ring",
            Strategy::Vmsplice => "vmsplice",
            Strategy::Rdma => "rdma",
            Strategy::CmaSplit => "cma-split",
        }
    }

    /// Who moves the bytes.
    pub fn mode(self) -> Mode {
        match self {
            Strategy::Cma | Strategy::Rdma => Mode::Get,
            Strategy::CmaPut => Mode::Put,
            Strategy::CmaSplit => Mode::Split,
            Strategy::Chunks | Strategy::Ring | Strategy::Vmsplice => Mode::Cooperative,
        }
    }

    /// Whether the sender's own pages are read after the sender handed them over, so a
    /// send that is let go early must not give its buffer back before the receiver is
    /// done (or has promised not to start).
    pub fn reads_in_place(self) -> bool {
        matches!(
            self,
            Strategy::Cma | Strategy::Vmsplice | Strategy::Rdma | Strategy::CmaSplit
        )
    }

    /// Whether it runs on cross-memory attach, which the system may refuse.
    pub fn needs_cma(self) -> bool {
        matches!(self, Strategy::Cma | Strategy::CmaPut | Strategy::CmaSplit)
    }

    /// Whether the kernel copies the bytes (CMA, and vmsplice's reads from the pipe)
    /// rather than nemesis's own copies.
    pub fn copies_in_kernel(self) -> bool {
        self.needs_cma() || self == Strategy::Vmsplice
    }

    /// Whether the sender hands its pages over in the RTS (a cookie naming them), so
    /// that a sender letting go of its request must take the offer back first.
    pub fn offered_in_place(self) -> bool {
        matches!(self, Strategy::Cma | Strategy::Rdma | Strategy::CmaSplit)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of strategies, as a sender offers them in its RTS (bit `1 << code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Strategies(pub u8);

impl Strategies {
    /// Only chunks.
    pub const CHUNKS: Strategies = Strategies(1);

    /// Whether `s` is in the set.
    pub fn has(self, s: Strategy) -> bool {
        self.0 & (1 << s as u8) != 0
    }

    /// The set with `s` added.
    #[must_use]
    pub fn with(self, s: Strategy) -> Self {
        Strategies(self.0 | 1 << s as u8)
    }

    /// The set without `s`.
    #[must_use]
    pub fn without(self, s: Strategy) -> Self {
        Strategies(self.0 & !(1 << s as u8))
    }

    /// The set without the strategies for which `drop` says so.
    fn without_all(self, drop: impl Fn(Strategy) -> bool) -> Self {
        Strategy::ALL
            .into_iter()
            .filter(|&s| drop(s))
            .fold(self, Strategies::without)
    }

    /// The set without the strategies whose RTS names the sender's pages.
    #[must_use]
    pub fn without_in_place(self) -> Self {
        self.without_all(Strategy::offered_in_place)
    }

    /// The set without the strategies that copy by the kernel: nemesis's own copies
    /// (the copy ring) and chunks.
    #[must_use]
    pub fn without_kernel_copies(self) -> Self {
        self.without_all(Strategy::copies_in_kernel)
    }

    /// Whether the set names the sender's pages.
    pub fn has_in_place(self) -> bool {
        Strategy::ALL
            .into_iter()
            .any(|s| s.offered_in_place() && self.has(s))
    }
}

/// What a sender offers for one message: the strategies, and what it holds for them
/// until the receiver is done (the registration of its buffer, for [`Strategy::Rdma`]),
/// to hand back with [`Lmt::end`] when the send ends, whichever way.
#[derive(Debug)]
pub struct Offer {
    /// The strategies offered.
    pub strategies: Strategies,
    /// What the sender holds until the send ends.
    pub held: Option<Xfer>,
}

impl Offer {
    /// Only chunks, holding nothing.
    pub const CHUNKS: Offer = Offer {
        strategies: Strategies::CHUNKS,
        held: None,
    };
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmtError {
    /// A cookie names memory the peer does not own, or lengths that do not match.
    #[error("bad large-message cookie from rank {peer}: {why}")]
    BadCookie {
        /// The peer.
        peer: u32,
        /// What is wrong.
        why: String,
    },
    /// The peer died during the transfer.
    #[error("rank {peer} failed during a large transfer: {why}")]
    PeerFailed {
        /// The peer.
        peer: u32,
        /// What was seen.
        why: String,
    },
    /// The system refused the strategy (ptrace policy, a seccomp filter); nothing moved.
    #[error("{strategy} to rank {peer} is not permitted: {why}")]
    NotPermitted {
        /// The peer.
        peer: u32,
        /// The strategy.
        strategy: Strategy,
        /// The system's answer.
        why: std::io::Error,
    },
    /// A forced strategy, or a tunable, that cannot be used.
    #[error("invalid {var}={value:?}: {reason}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another operating-system error.
    #[error("large transfer with rank {peer} ({strategy}): {source}")]
    Io {
        /// The peer.
        peer: u32,
        /// The strategy.
        strategy: Strategy,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The shared-memory layer failed (a ring file that cannot be made or mapped).
    #[error(transparent)]
    Shm(#[from] nemesis_shm::ShmError),
}

/// Which end of a transfer a [`Xfer`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The end whose buffer holds the message.
    Send,
    /// The end whose buffer takes it.
    Recv,
}

/// One side of one transfer in progress.
#[derive(Debug)]
pub struct Xfer {
    /// The other process (a rank of the channel).
    pub peer: u32,
    /// How the bytes move.
    pub strategy: Strategy,
    /// Which end this is.
    pub role: Role,
    /// Bytes of the message.
    pub total: usize,
    /// Bytes this side has moved.
    pub done: usize,
    /// Bytes this side must move: for a receive into a short buffer, only what fits
    /// (the rest is drained where the strategy must drain it).
    pub(crate) want: usize,
    /// Where `done` is in the local buffer list.
    pub(crate) at: nemesis_shm::ring::SegCursor,
    /// Bytes of the local buffer list to step over before the first move: the part the
    /// peer moves, for the sender of a split transfer, whose `done` starts there.
    pub(crate) skip: usize,
    /// For a split transfer, who moves the second half.
    pub(crate) split: SplitState,
    /// The peer's buffer, for get and put.
    pub(crate) remote: Vec<(u64, u64)>,
    /// Registrations and reads in flight, for [`Strategy::Rdma`].
    pub(crate) rdma: Option<Box<rdma::Held>>,
    /// When a receive that automatic selection may time began.
    pub(crate) stamp: Option<tune::Stamp>,
}

impl Xfer {
    pub(crate) fn new(peer: u32, strategy: Strategy, role: Role, total: usize) -> Self {
        Self {
            peer,
            strategy,
            role,
            total,
            done: 0,
            want: total,
            at: Default::default(),
            skip: 0,
            split: SplitState::default(),
            remote: Vec::new(),
            rdma: None,
            stamp: None,
        }
    }

    /// Whether this side has nothing left to do: for the receiver of a split transfer,
    /// its own part moved and the sender's part said to be done.
    pub fn is_complete(&self) -> bool {
        self.done >= self.want
            && (self.strategy.mode() != Mode::Split
                || self.split.exhausted && (self.role == Role::Send || self.split.peer_done))
    }

    /// Whether this side's own part is moved (or given up).
    pub fn own_part_done(&self) -> bool {
        self.done >= self.want
    }

    /// Records that the peer's part of a split transfer is done (its FIN came).
    pub fn peer_finished(&mut self) {
        self.split.peer_done = true;
    }

    /// Stops moving this side's part (a receive let go, or one whose own part failed):
    /// a split receive then takes every chunk its sender has not, moving none, and waits
    /// for the sender's word if it took any, since the sender may be writing into its
    /// buffer.
    pub fn give_up_own_part(&mut self) {
        self.want = self.done;
        self.split.gave_up = true;
    }

    /// For the sender of a split transfer, once complete: whether the receiver took every
    /// chunk, so that this side wrote nothing, sends no FIN, and waits for DONE.
    pub fn took_no_chunk(&self) -> bool {
        self.split.exhausted && self.split.took == 0
    }
}

/// Who moves the chunks of a split transfer's second half, as one side knows it
/// (`nemesis_shm::split`).
#[derive(Debug, Default)]
pub(crate) struct SplitState {
    /// The transfer's number in the receiver's word (0: none).
    pub id: u32,
    /// Which of the receiver's words.
    pub slot: usize,
    /// Where the second half starts, the bytes of each of its chunks, and how many.
    pub base: usize,
    pub chunk: usize,
    pub chunks: u32,
    /// Chunks this side took.
    pub took: u32,
    /// Every chunk is taken, by one side or the other.
    pub exhausted: bool,
    /// Receiver: every chunk is in (the sender took none, or its FIN came).
    pub peer_done: bool,
    /// Receiver: the sender took some, so its FIN is to come.
    pub peer_has_it: bool,
    /// Receiver: this side's part was given up (let go, or failed).
    pub gave_up: bool,
}

impl Xfer {
    /// Points this side at chunk `k` of its split transfer's second half: the moves
    /// resume there, past whatever the other side took in between.
    pub(crate) fn enter_chunk(&mut self, k: u32) {
        let start = self.split.base + k as usize * self.split.chunk;
        self.skip += start - self.done;
        self.done = start;
        self.want = (start + self.split.chunk).min(self.total);
        self.split.took += 1;
    }
}

/// Large-message transfer as the two-sided layer drives it.
///
/// The layer calls [`Lmt::offer`] to fill an RTS, [`Lmt::choose`] and
/// [`Lmt::start_recv`] when an RTS is matched, [`Lmt::start_send`] when a CTS comes, and
/// [`Lmt::progress`] on each side until the transfer is complete, then [`Lmt::end`].
pub trait Lmt {
    /// The strategies the sender offers for `len` bytes in `src` to `peer`; appends the
    /// cookie that the offered get strategies need to `cookie`. What the offer holds is
    /// handed back with [`Lmt::end`] once the send ends.
    fn offer(&mut self, peer: u32, src: &[Seg], len: usize, cookie: &mut Vec<u8>) -> Offer;

    /// The receiver's choice among `offered` for `len` bytes from `peer` into `dst`,
    /// with the sender's `rts_cookie`. A strategy whose intermediate buffer is in use by
    /// another transfer is not chosen.
    fn choose(
        &mut self,
        peer: u32,
        len: usize,
        offered: Strategies,
        rts_cookie: &[u8],
        dst: &[Seg],
    ) -> Strategy;

    /// Starts the receiving side of a transfer of `total` bytes with `strategy`, of
    /// which `cap` fit the buffer. `rts_cookie` is the sender's; what is appended to
    /// `cts_cookie` goes back in the CTS (for put, split and cooperative strategies).
    /// The transfer may name another strategy that the RTS cookie serves (a split
    /// transfer read whole, as `cma`, while another holds the receiver's word); the CTS
    /// then goes only if that strategy needs one.
    ///
    /// # Errors
    /// A malformed cookie, or a strategy that cannot run here.
    #[allow(clippy::too_many_arguments)]
    fn start_recv(
        &mut self,
        peer: u32,
        strategy: Strategy,
        rts_cookie: &[u8],
        total: usize,
        cap: usize,
        dst: &[Seg],
        cts_cookie: &mut Vec<u8>,
    ) -> Result<Xfer, LmtError>;

    /// Starts the sending side after a CTS naming `strategy` with `cts_cookie`.
    ///
    /// # Errors
    /// A malformed cookie, or an intermediate buffer that cannot be opened.
    fn start_send(
        &mut self,
        peer: u32,
        strategy: Strategy,
        cts_cookie: &[u8],
        total: usize,
    ) -> Result<Xfer, LmtError>;

    /// Moves what can move now without waiting; `Ok(true)` once this side is complete.
    ///
    /// # Safety
    /// `bufs` is the buffer the transfer was started with (the message for a sender,
    /// the receive buffer for a receiver), valid for reading (sender) or writing
    /// (receiver) for its whole length, and not otherwise in use. A receiver that was
    /// let go passes an empty list: the data is drained.
    ///
    /// # Errors
    /// A cookie naming memory the peer does not own, a dead peer, a refused system call.
    unsafe fn progress(&mut self, x: &mut Xfer, bufs: &[Seg]) -> Result<bool, LmtError>;

    /// Ends a transfer, complete or not, freeing what it held.
    fn end(&mut self, x: &Xfer);

    /// Forgets everything shared with `peer`, which has died.
    fn peer_terminated(&mut self, peer: u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_codes_round_trip_and_sets_hold_them() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::from_code(s as u8), Some(s));
            let set = Strategies::CHUNKS.with(s);
            assert!(set.has(s) && set.has(Strategy::Chunks));
            assert!(!set.without(s).has(s));
        }
        assert_eq!(Strategy::from_code(7), None);
        assert_eq!(Strategy::CmaSplit.mode(), Mode::Split);
        assert!(Strategy::CmaSplit.offered_in_place() && Strategy::CmaSplit.needs_cma());
        assert!(Strategy::Rdma.reads_in_place() && Strategy::Rdma.offered_in_place());
        let all = Strategies(0xff);
        assert!(!all.without_in_place().has_in_place() && all.has_in_place());
        let own = all.without_kernel_copies();
        for s in Strategy::ALL {
            assert_eq!(own.has(s), !s.copies_in_kernel(), "{s}");
        }
        assert!(own.has(Strategy::Ring) && own.has(Strategy::Chunks) && !own.has(Strategy::CmaSplit));
        assert_eq!(Strategy::CmaPut.mode(), Mode::Put);
    }
}
