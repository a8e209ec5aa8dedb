//! Two-sided tagged messaging on top of any [`Channel`](crate::Channel): what an MPI or PGAS runtime
//! needs from a transport.
//!
//! A [`World`] owns the channel. Messages are matched on context (communicator),
//! source (or any) and tag (or any), and messages between a pair never overtake each
//! other. Small messages travel eagerly in one packet; larger ones are announced (RTS),
//! accepted (CTS), moved, and acknowledged (DONE).
//!
//! # Threads
//!
//! A `World` is `Send` but not `Sync`: one thread uses it at a time, and it can be moved
//! to the thread that communicates, or kept behind a mutex that threads take in turn
//! (the lock is the caller's: the fast path pays for none). It keeps no global state,
//! so a runtime may own it like any other value. `Comm` handles are `Send` and `Sync`.
//!
//! ```
//! fn movable<T: Send>() {}
//! movable::<nemesis::World>();
//! movable::<nemesis::Comm>();
//! ```
//!
//! ```compile_fail
//! fn shareable<T: Sync>() {}
//! shareable::<nemesis::World>();
//! ```
//!
//! # Non-blocking operations and their buffers
//!
//! `isend` and `irecv` live in a [`Scope`], as threads do in `std::thread::scope`: the
//! buffers outlive the scope, and when the scope ends every request it made is finished
//! safely. The same happens to a request that is dropped unfinished:
//!
//! - a receive that no message has matched yet is cancelled;
//! - a receive whose data is still arriving keeps draining it, into nothing;
//! - a send that still needs its buffer first copies what remains of it, and then
//!   completes on its own.
//!
//! No message is lost or corrupted, and nothing touches a buffer after its request or
//! scope has let it go.
//!
//! # How a message travels, and where that lives
//!
//! - **Eager**: up to the largest packet to the peer, in one packet, matched on arrival
//!   or kept in the unexpected queue (`world/start.rs`, `matching.rs`).
//! - **Through the pair buffer**: within the node, a message above 2 KiB that answers
//!   its peer's last one, written into the buffer the two processes share, without a
//!   handshake (`world/start.rs`, `medium.rs`).
//! - **Medium**: within the node, up to the medium limit, a run of packets (MEDIUM, then
//!   MDATA) assembled per source (`medium.rs`); a stream's longer messages go this way
//!   or by rendezvous, whichever moved more lately (`stream_way.rs`).
//! - **Rendezvous**: anything longer, announced (RTS), accepted (CTS) with a
//!   large-message strategy of the LMT, moved, and acknowledged (DONE) (`rndv.rs`).
//!
//! The engine (`engine.rs`) owns the requests (`requests.rs`) and turns packets into
//! their progress. A [`World`] drives it: `world/wait.rs` is how a blocked call waits,
//! `world/blocking.rs` the blocking calls, and `world/fresh.rs` a blocked receive that
//! matches packets as they arrive, before they are queued. Requests made in a [`Scope`]
//! (`scope.rs`) or owned (`owned.rs`) lend their buffers to the engine; collectives
//! (`coll.rs`, `node.rs`) are built on the same calls.

mod coll;
mod comm;
mod compute;
mod engine;
mod matching;
mod medium;
mod node;
mod owned;
mod quick;
mod requests;
mod rndv;
mod scope;
mod stream_way;
mod wire;
mod world;

pub use crate::op::{Op, OpError, Reducible};
pub use comm::Comm;
pub use compute::RMA_PROGRESS_VAR;
pub use owned::{Completed, OwnedBuf, OwnedRequest, RequestSet};
pub use scope::{Done, Request, Scope};
pub use world::World;

use crate::channel::{ChannelError, NemesisChannel};
use std::time::Duration;

/// Matches a message from any source.
pub const ANY_SOURCE: Option<u32> = None;
/// Matches a message with any tag.
pub const ANY_TAG: Option<i32> = None;
/// The largest user tag; tags run from 0 to this.
pub const TAG_UB: i32 = i32::MAX;

/// What a completed receive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank in the communicator.
    pub source: u32,
    /// The message's tag.
    pub tag: i32,
    /// The message's length in bytes (before any truncation).
    pub len: usize,
}

/// Why a two-sided operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum P2pError {
    /// A rank outside the communicator.
    #[error("rank {rank} is not in a communicator of {size} ranks")]
    InvalidRank {
        /// The rank given.
        rank: u32,
        /// The communicator's size.
        size: u32,
    },
    /// A negative tag.
    #[error("tag {0} is invalid: user tags run from 0 to {TAG_UB}")]
    InvalidTag(i32),
    /// The message was longer than the buffer; the buffer holds its beginning.
    #[error("a message of {message_len} bytes was truncated to the {buffer_len}-byte buffer")]
    Truncated {
        /// The message's length.
        message_len: usize,
        /// The buffer's length.
        buffer_len: usize,
    },
    /// A request or communicator of another world.
    #[error("the {0} belongs to another world")]
    WrongWorld(&'static str),
    /// The peer died or left before the operation could complete.
    #[error("peer {rank} failed: {reason}")]
    PeerFailed {
        /// The peer's rank in the communicator.
        rank: u32,
        /// What is known.
        reason: String,
    },
    /// Ranks called a collective with arguments that cannot go together.
    #[error("collective arguments differ between ranks: {0}")]
    CollectiveMismatch(String),
    /// An argument that cannot work.
    #[error("{0}")]
    InvalidArgument(String),
    /// `waitany` was given no request that is still active.
    #[error("no active request to wait for")]
    NoActiveRequest,
    /// A peer sent what the protocol does not allow.
    #[error("protocol violation by rank {rank}: {what}")]
    Protocol {
        /// The peer's world rank.
        rank: u32,
        /// What was wrong.
        what: String,
    },
    /// The channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A large transfer failed on this side: a bad cookie from the peer, a refused
    /// system call, a peer that died in the middle.
    #[error("large transfer with rank {rank} failed: {source}")]
    Transfer {
        /// The peer's rank in the communicator.
        rank: u32,
        /// What went wrong.
        #[source]
        source: nemesis_lmt::LmtError,
    },
    /// The peer reported that its side of a large transfer failed.
    #[error("rank {rank} reported that its side of a large transfer failed")]
    RemoteTransfer {
        /// The peer's rank in the communicator.
        rank: u32,
    },
    /// The world of an owned request was dropped before the request finished.
    #[error("the request's world was dropped before the request finished")]
    WorldGone,
}

impl From<crate::progress::RegistryError> for P2pError {
    fn from(e: crate::progress::RegistryError) -> Self {
        P2pError::Channel(e.into())
    }
}

impl From<OpError> for P2pError {
    fn from(e: OpError) -> Self {
        P2pError::InvalidArgument(e.to_string())
    }
}

impl P2pError {
    /// The rank of the peer whose failure this is, if it is one: [`P2pError::PeerFailed`]
    /// or a [`ChannelError::PeerFailed`] underneath (a world rank there).
    pub fn failed_peer(&self) -> Option<u32> {
        match self {
            P2pError::PeerFailed { rank, .. } => Some(*rank),
            P2pError::Channel(ChannelError::PeerFailed { rank, .. }) => Some(*rank),
            _ => None,
        }
    }
}

/// The eager limit towards ranks on other nodes unless `NEMESIS_EAGER_LIMIT` says, and
/// never more than the netmod's largest packet: chosen by measurement (BENCHMARKS.md).
/// Over loopback tcp and udp an eager message of 64 and 128 KiB beat the rendezvous in
/// latency (by 2–3×) and in bandwidth.
pub const DEFAULT_NET_EAGER_LIMIT: usize = 128 << 10;

/// The medium limit unless `NEMESIS_MEDIUM_LIMIT` says: chosen by measurement (see
/// BENCHMARKS.md), as the size up to which a run of packets beats a rendezvous.
pub const DEFAULT_MEDIUM_LIMIT: usize = 128 << 10;

/// The pair eager limit on Intel CPUs unless `NEMESIS_PAIR_EAGER_LIMIT` says: a message
/// within the node longer than this, and no longer than the eager limit, goes through
/// the pair buffer when it answers the last message through it. In a ping-pong on the
/// Intel Xeon guest, 3 and 4 KiB took 10–20% less time one way this way than in one
/// packet, whose reply goes into boxes its peer read last; at 2 KiB the two were even
/// (BENCHMARKS.md).
pub const INTEL_PAIR_EAGER_LIMIT: usize = 2 << 10;

/// The pair eager limit on other CPUs unless `NEMESIS_PAIR_EAGER_LIMIT` says. On an AMD
/// EPYC (Zen 4) guest the pair buffer took a ping-pong of 512 bytes to 2 KiB one way in
/// 0.69–0.94 of a packet's time near and 0.38–0.80 far, and one of 384 bytes or less in
/// more (BENCHMARKS.md, "Answers through the pair buffer from 448 bytes on AMD").
pub const PAIR_EAGER_LIMIT_ELSEWHERE: usize = 448;

/// The pair eager limit unless `NEMESIS_PAIR_EAGER_LIMIT` says: by the CPU's maker,
/// whose caches the two ways were measured to suit differently.
pub fn default_pair_eager_limit() -> usize {
    if nemesis_shm::cpu::is_intel() {
        INTEL_PAIR_EAGER_LIMIT
    } else {
        PAIR_EAGER_LIMIT_ELSEWHERE
    }
}

/// The largest value `NEMESIS_MEDIUM_LIMIT` and `NEMESIS_STREAM_MEDIUM_LIMIT` take.
pub const MAX_MEDIUM_LIMIT: usize = medium::MEDIUM_MAX;

/// The medium limit while streaming to a peer unless `NEMESIS_STREAM_MEDIUM_LIMIT` says,
/// where a rendezvous just above it would copy by the kernel (CMA: the default order on
/// Intel CPUs, where CMA is permitted): one byte below the size from which automatic
/// selection takes CMA at all, so a stream's messages from 32 KiB go by rendezvous. In
/// osu_bw streams on the Intel Xeon guests a rendezvous, whose receiver copies once,
/// moved 1.1 times what a run of packets, copied in and out, did at 32 KiB (with cells of
/// 8320 bytes; even with 8192) and 1.3–1.8 times from 48 to 128 KiB; through the copy
/// ring it moved less (BENCHMARKS.md). Elsewhere the medium limit holds in a stream too.
pub const DEFAULT_STREAM_MEDIUM_LIMIT: usize = nemesis_lmt::policy::AUTO_CMA_MIN - 1;

/// The longest message a stream within the node may send as a run of packets, where its
/// sender found that way moved more than the rendezvous (`p2p/stream_way.rs`): as long
/// as the cells the default segment gives a process (64 of 8 KiB), which a run must find
/// free at once. Where a rendezvous above the stream medium limit would copy by the
/// kernel (the default order on Intel CPUs, CMA permitted), the default is 0 instead: on
/// the Intel Xeon guest (family 6, model 207) the rendezvous moved 1.2–1.8 times what
/// the packets did from 48 to 128 KiB, and the choice by time, which took packets for a
/// third to all of a 64 KiB stream's messages, moved 0.85–0.96 times what the rendezvous
/// alone did at 64 KiB, 0.90–0.96 at 128 KiB and 0.74–0.90 at 256 KiB, in turns in three
/// runs (BENCHMARKS.md).
pub const DEFAULT_STREAM_TUNE_LIMIT: usize = 512 << 10;

/// The longest message of a stream within the node whose rendezvous may offer only
/// nemesis's own copies (the copy ring, or chunks while it is busy), where its sender
/// found that moved more lately than the rendezvous with every strategy
/// (`p2p/stream_way.rs`); from just above the stream tune limit. On the 2-vCPU AMD EPYC
/// guest (family 25, model 1), osu_bw at 1 MiB moved a median 17.4 GB/s with the
/// choice against 15.4 without it, in 32 turns of each interleaved beside MPICH
/// ch3:nemesis (0.93× it with the CPUs sharing a cache became 1.03×), and in 22 turns
/// `nemesis-bench bw` into distinct buffers moved 9.9 against 9.4 near. Without a
/// shared cache own copies move a third of what `cma-split` (the first of the default
/// order there) does, and `bw` moved 9.3 against 9.6 with the choice. Up to 4 MiB since
/// 24 turns beside the limit of 1 MiB put osu_bw 32% higher at 2 MiB and 27% at 4 MiB
/// with the CPUs sharing a cache, level across caches, and `bw` within 7% either way
/// (BENCHMARKS.md, "Own copies up to 4 MiB"); an earlier run had found 2 MiB rounds of
/// `bw` halved across caches, which these did not repeat. Where the stream tune limit
/// is 0 (a rendezvous that copies by the kernel first, as on Intel CPUs) or a strategy
/// is forced, the default is 0.
pub const DEFAULT_STREAM_COPIES_LIMIT: usize = 4 << 20;

/// Tunables, from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Messages of at most this many bytes go eagerly (`NEMESIS_EAGER_LIMIT`); never more
    /// than the channel's largest packet.
    pub eager_limit: usize,
    /// The same for ranks on other nodes, whose netmod may carry larger packets than
    /// shared memory: `NEMESIS_EAGER_LIMIT` when set, else [`DEFAULT_NET_EAGER_LIMIT`];
    /// never more than the largest packet to the rank.
    pub net_eager_limit: usize,
    /// How often a blocked operation checks that its peers are alive
    /// (`NEMESIS_FAILURE_TIMEOUT`): a receive from a dead peer fails within about this.
    pub failure_check: Duration,
    /// Messages to a rank on this node longer than the eager limit and at most this many
    /// bytes go as a run of packets without a handshake (`NEMESIS_MEDIUM_LIMIT`; 0 turns
    /// it off; at most 1 MiB); larger ones by rendezvous.
    pub medium_limit: usize,
    /// The medium limit for a message sent while streaming to its peer, when we have sent
    /// it a packet longer than one fastbox since we last took one from it
    /// (`NEMESIS_STREAM_MEDIUM_LIMIT`; never more than `medium_limit`): a longer one goes by rendezvous, which moves a
    /// stream's bytes with one copy where a run of packets takes two, while an exchange
    /// keeps the run's lower latency. See [`DEFAULT_STREAM_MEDIUM_LIMIT`].
    pub stream_medium_limit: usize,
    /// A message sent while streaming to a rank on this node, longer than
    /// `stream_medium_limit` and at most this many bytes, goes as a run of packets or by
    /// rendezvous, whichever the sender's recent streams to that rank moved more
    /// (`NEMESIS_STREAM_TUNE_LIMIT`; 0, or with `medium_limit` 0, always by rendezvous;
    /// at most 1 MiB; unset, 0 where that rendezvous would copy by the kernel). See
    /// [`DEFAULT_STREAM_TUNE_LIMIT`].
    pub stream_tune_limit: usize,
    /// A message sent while streaming to a rank on this node, longer than
    /// `stream_tune_limit` (and `stream_medium_limit`) and at most this many bytes, goes
    /// by a rendezvous that offers every strategy, or only nemesis's own copies,
    /// whichever the sender's recent streams to that rank moved more
    /// (`NEMESIS_STREAM_COPIES_LIMIT`; 0 for never; unset, 0 where the stream tune limit
    /// is 0 or `NEMESIS_LMT` forces a strategy). See [`DEFAULT_STREAM_COPIES_LIMIT`].
    pub stream_copies_limit: usize,
    /// Up to this size, the choice by time tries a stream's messages as packets first:
    /// the stream medium limit the rule alone would have (`NEMESIS_STREAM_MEDIUM_LIMIT`'s
    /// default with `NEMESIS_STREAM_TUNE_LIMIT=0`). Derived, not read.
    pub stream_packets_first: usize,
    /// Within the node, a message longer than this and no longer than `eager_limit`
    /// goes through the buffer the pair shares when it is free and the message answers
    /// the last one through it, else in one packet (`NEMESIS_PAIR_EAGER_LIMIT`; at
    /// `eager_limit` or above, never). See [`default_pair_eager_limit`].
    pub pair_eager_limit: usize,
    /// Whether communicators whose members all share the node run barrier and small
    /// allreduce through the node's shared blocks (`NEMESIS_NODE_COLLECTIVES`, 1 or 0).
    /// Every rank must use the same setting.
    pub node_collectives: bool,
    /// Whether barrier and small allreduces through messages among 3 to 8 ranks gather
    /// at rank 0 and are released by it, instead of taking logarithmic rounds
    /// (`NEMESIS_FLAT_COLLECTIVES`: `None` for `auto`, where the node's processes
    /// outnumber its CPUs and each round waits for its peers to be scheduled). The
    /// members of a communicator agree on its first such collective: where any wants it,
    /// all take it.
    pub flat_collectives: Option<bool>,
}

impl Config {
    /// Reads the environment for a channel whose largest packet is `max_payload`.
    pub fn from_env(max_payload: usize) -> Result<Self, P2pError> {
        Self::from_lookup(max_payload, |k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    pub fn from_lookup(max_payload: usize, get: impl Fn(&str) -> Option<String>) -> Result<Self, P2pError> {
        let bad = |var: &'static str, v: &str, reason: &str| {
            P2pError::Channel(ChannelError::Config {
                var,
                value: v.to_string(),
                reason: reason.to_string(),
            })
        };
        let (eager_limit, net_eager_limit) = match get("NEMESIS_EAGER_LIMIT") {
            None => (max_payload, DEFAULT_NET_EAGER_LIMIT),
            Some(v) => {
                let n = nemesis_shm::config::parse_size(&v)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad("NEMESIS_EAGER_LIMIT", &v, "expected a size such as 8K"))?;
                (n.min(max_payload), n)
            }
        };
        // A medium size: at most the largest medium message.
        let medium_size = |var: &'static str| match get(var) {
            None => Ok(None),
            Some(v) => nemesis_shm::config::parse_size(&v)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= medium::MEDIUM_MAX)
                .map(Some)
                .ok_or_else(|| bad(var, &v, "expected a size from 0 to 1M")),
        };
        let medium_limit = medium_size("NEMESIS_MEDIUM_LIMIT")?.unwrap_or(DEFAULT_MEDIUM_LIMIT);
        // The large-message policy, read once; one that does not parse is the channel's
        // to report.
        let policy = nemesis_lmt::Policy::from_lookup(&get).ok();
        let copy_first = kernel_copy_first(policy.as_ref());
        let stream_tune_limit = match medium_size("NEMESIS_STREAM_TUNE_LIMIT")? {
            _ if medium_limit == 0 => 0,
            Some(n) => n,
            // Where a stream's rendezvous copies by the kernel, it moved more than the
            // packets at every size measured: see DEFAULT_STREAM_TUNE_LIMIT.
            None if copy_first => 0,
            None => DEFAULT_STREAM_TUNE_LIMIT,
        };
        let stream_copies_limit = match get("NEMESIS_STREAM_COPIES_LIMIT") {
            Some(v) => nemesis_shm::config::parse_size(&v)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad("NEMESIS_STREAM_COPIES_LIMIT", &v, "expected a size such as 4M"))?,
            None if stream_tune_limit == 0 || policy.is_some_and(|p| p.force.is_some()) => 0,
            None => DEFAULT_STREAM_COPIES_LIMIT,
        };
        let stream_packets_first = if copy_first {
            DEFAULT_STREAM_MEDIUM_LIMIT
        } else {
            medium_limit
        };
        let stream_medium_limit = match medium_size("NEMESIS_STREAM_MEDIUM_LIMIT")? {
            Some(n) => n,
            None if stream_tune_limit > DEFAULT_STREAM_MEDIUM_LIMIT => DEFAULT_STREAM_MEDIUM_LIMIT,
            None => stream_packets_first,
        }
        .min(medium_limit);
        let pair_eager_limit = match get("NEMESIS_PAIR_EAGER_LIMIT") {
            None => default_pair_eager_limit(),
            Some(v) => nemesis_shm::config::parse_size(&v)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad("NEMESIS_PAIR_EAGER_LIMIT", &v, "expected a size such as 2K"))?,
        };
        let failure_check = crate::progress::Config::from_lookup(&get)?.failure_check;
        let node_collectives = nemesis_shm::config::switch(&get, "NEMESIS_NODE_COLLECTIVES")
            .map_err(|v| {
                bad(
                    "NEMESIS_NODE_COLLECTIVES",
                    &v,
                    nemesis_shm::config::SWITCH_EXPECTED,
                )
            })?
            .unwrap_or(true);
        // A switch, or `auto` (as unset): the job's shape decides.
        let flat_collectives = nemesis_shm::config::switch(
            |k| get(k).filter(|v| !v.trim().eq_ignore_ascii_case("auto")),
            "NEMESIS_FLAT_COLLECTIVES",
        )
        .map_err(|v| {
            // The switch's own spellings, with `auto` first.
            let expected = nemesis_shm::config::SWITCH_EXPECTED;
            let reason = expected
                .strip_prefix("expected ")
                .map_or_else(|| expected.to_string(), |s| format!("expected auto, {s}"));
            bad("NEMESIS_FLAT_COLLECTIVES", &v, &reason)
        })?;
        Ok(Self {
            eager_limit,
            net_eager_limit,
            medium_limit,
            stream_medium_limit,
            stream_tune_limit,
            stream_copies_limit,
            stream_packets_first,
            pair_eager_limit,
            failure_check,
            node_collectives,
            flat_collectives,
        })
    }
}

/// Whether a message just above [`DEFAULT_STREAM_MEDIUM_LIMIT`] would go by a copy of
/// the kernel's (CMA), as the large-message policy `p` chooses, and whether this
/// process may use CMA: where the rendezvous's single copy is the ring's, or chunks',
/// it moved no more than a run of packets did. A policy that does not parse (`None`)
/// says no here; the channel reports it.
fn kernel_copy_first(p: Option<&nemesis_lmt::Policy>) -> bool {
    let Some(p) = p else {
        return false;
    };
    let first = p
        .force
        .or_else(|| p.auto_order(DEFAULT_STREAM_MEDIUM_LIMIT + 1).first().copied());
    first.is_some_and(nemesis_lmt::Strategy::needs_cma) && nemesis_lmt::cma::probe().is_ok()
}

/// How many of this process's two-sided sends went by each protocol other than the
/// eager one ([`World::send_counts`]): which paths a workload takes, for its owner and
/// for the tests. Counted where the slower paths start, so eager sends cost nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendCounts {
    /// Through the buffer the pair shares, announced by a packet without bytes.
    pub paired: u64,
    /// Of those, messages one packet would have carried: answers above the pair eager
    /// limit.
    pub paired_short: u64,
    /// Of those, answers above the medium limit, which would otherwise have gone by
    /// rendezvous.
    pub paired_long: u64,
    /// Medium messages as a run of packets.
    pub medium_packets: u64,
    /// By rendezvous (a handshake, then a large-message strategy).
    pub rendezvous: u64,
    /// Of those, messages within the medium limit that went so because their sender
    /// streamed to the peer (above the stream medium limit).
    pub stream_rendezvous: u64,
    /// Of the medium messages as a run of packets, those above the stream medium limit
    /// that went so because the sender's recent streams to the peer had moved more that
    /// way than by rendezvous (`NEMESIS_STREAM_TUNE_LIMIT`).
    pub stream_packets: u64,
    /// Of the messages by rendezvous, those whose offer held only nemesis's own copies,
    /// because the sender's recent streams to the peer had moved more that way
    /// (`NEMESIS_STREAM_COPIES_LIMIT`).
    pub stream_own_copies: u64,
}

/// Where a rank is, as seen from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locality {
    /// This process.
    Me,
    /// On this node: shared memory.
    Local,
    /// On another node: a network module.
    Remote,
}

/// Joins the job (see [`crate::bootstrap::Boot::init`]) and returns its world: shared
/// memory to the ranks on this node, the network module `NEMESIS_NETMOD` names to the
/// others. Started alone, the process is rank 0 of 1.
///
/// ```
/// let world = nemesis::init()?;
/// println!("rank {} of {}", world.rank(), world.size());
/// # Ok::<(), nemesis::P2pError>(())
/// ```
///
/// # Errors
/// A process manager that fails, a second join, a launcher nemesis cannot talk to, a
/// bad `NEMESIS_*` variable, or a segment that cannot be made or joined.
pub fn init() -> Result<World<NemesisChannel>, P2pError> {
    World::new(NemesisChannel::init()?)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod rdma_tests;
