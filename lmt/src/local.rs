//! The strategies between processes of one node, behind the [`Lmt`] trait.

use crate::policy::CMA_STEP;
use crate::stream::RingEnd;
use crate::tune::Tuner;
use crate::{Lmt, Role};
use crate::{LmtError, Mode, Offer, Policy, Seg, SplitState, Strategies, Strategy, Xfer, cma, pipe};
use nemesis_shm::split::{self, SLOTS as SPLIT_SLOTS, Side, SplitClaim};
use nemesis_shm::variant::Sound;
use nemesis_shm::{PeerState, Segment};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

/// A receiving end of an intermediate buffer, and whether a transfer holds it.
#[derive(Debug)]
struct Claimed<T> {
    end: T,
    busy: bool,
}

/// Large-message transfer between processes that share a node's segment.
#[derive(Debug)]
pub struct LocalLmt {
    me: u32,
    policy: Policy,
    /// Why CMA cannot be used here, if it cannot.
    cma_refused: Option<String>,
    /// Whether the kernel's copies meet the slow case of a destination just ahead of
    /// its source (`cma::skew_slows_kernel_copies`), measured once; `None` until then,
    /// as it is not measured while a strategy is forced.
    kernel_skew_slow: Option<bool>,
    seg: Arc<Segment>,
    /// The segment index of each rank, or `u32::MAX` for a rank elsewhere.
    local_of: Vec<u32>,
    pids: Vec<u32>,
    dir: PathBuf,
    /// Every file this makes starts with it (the job's prefix, so a launcher can
    /// remove what a crash leaves).
    prefix: String,
    ring_in: HashMap<u32, Claimed<RingEnd>>,
    ring_out: HashMap<u32, RingEnd>,
    pipe_in: HashMap<u32, Claimed<pipe::PipeIn>>,
    pipe_out: HashMap<u32, pipe::PipeOut>,
    /// Intermediate buffers left in an unknown state by an abandoned transfer, or that
    /// could not be made: not used again with that peer.
    broken: HashSet<(u32, Strategy)>,
    /// The node's processes outnumber its CPUs (see [`LocalLmt::set_cpus_shared`]).
    cpus_shared: bool,
    /// The number of this process's last split transfer as a receiver.
    last_split: u32,
    /// Which of its split-transfer words its receives hold, a bit each.
    split_slots: u64,
    /// What this side's receives took, for automatic selection.
    tuner: Tuner,
}

/// Claims `peer`'s receiving end in `ends`, made with `make` on first use: `Some(true)`
/// when claimed, `Some(false)` when another transfer holds it, `None` when it cannot be
/// made.
fn claim_in<T>(
    ends: &mut HashMap<u32, Claimed<T>>,
    peer: u32,
    make: impl FnOnce() -> Result<T, LmtError>,
) -> Option<bool> {
    match ends.get_mut(&peer) {
        Some(c) if c.busy => Some(false),
        Some(c) => {
            c.busy = true;
            Some(true)
        }
        None => {
            let end = make().ok()?;
            ends.insert(peer, Claimed { end, busy: true });
            Some(true)
        }
    }
}

/// Refuses a policy that forces CMA where it is refused (`cma_refused` says why).
fn check_forced(policy: Policy, cma_refused: Option<&str>) -> Result<(), LmtError> {
    match (policy.force, cma_refused) {
        (Some(s), Some(why)) if s.needs_cma() => Err(LmtError::Config {
            var: "NEMESIS_LMT",
            value: s.name().into(),
            reason: format!("cross-memory attach is not permitted here ({why}); use auto or ring"),
        }),
        _ => Ok(()),
    }
}

/// What a node's strategies answer for [`Strategy::Rdma`], which goes between nodes.
fn not_here(peer: u32) -> LmtError {
    LmtError::BadCookie {
        peer,
        why: "rdma moves data between nodes, not between processes of one node".into(),
    }
}

/// Bytes of each chunk of a split transfer's second half, at least: small enough that
/// the receiver, done with its half, shares what its sender has not reached, large
/// enough that a system call's cost stays small beside its copy.
const SPLIT_CHUNK: usize = 128 << 10;

/// The state of split transfer `id` of `total` bytes in word `slot`, cut as both sides
/// cut it: the second half starts at a page near the middle (the receiver reads the
/// bytes before it) and is cut into chunks of at least [`SPLIT_CHUNK`] bytes.
fn split_state(id: u32, slot: usize, total: usize) -> SplitState {
    let base = (total / 2) & !4095;
    let rest = total - base;
    let chunk = SPLIT_CHUNK
        .max(rest.div_ceil(split::MAX_CHUNKS as usize))
        .next_multiple_of(4096);
    SplitState {
        id,
        slot,
        base,
        chunk,
        chunks: rest.div_ceil(chunk) as u32,
        ..SplitState::default()
    }
}

/// Files this makes are named `<prefix>lmt-<kind>-<from>-<to>`.
fn file_name(prefix: &str, kind: &str, from: u32, to: u32) -> String {
    format!("{prefix}lmt-{kind}-{from}-{to}")
}

impl LocalLmt {
    /// The strategies for rank `me`, whose segment is `seg` and whose ranks sit at the
    /// segment indices `local_of` (`u32::MAX` for a rank on another node). Files go in
    /// `dir`, named from `prefix`.
    ///
    /// # Errors
    /// A forced strategy that this system does not permit.
    pub fn new(
        me: u32,
        seg: Arc<Segment>,
        local_of: Vec<u32>,
        dir: PathBuf,
        prefix: String,
        policy: Policy,
    ) -> Result<Self, LmtError> {
        let cma_refused = cma::probe().err().map(|e| e.to_string());
        check_forced(policy, cma_refused.as_deref())?;
        let pids = vec![0; local_of.len()];
        let mut lmt = Self {
            me,
            policy,
            cma_refused,
            kernel_skew_slow: None,
            seg,
            local_of,
            pids,
            dir,
            prefix,
            ring_in: HashMap::new(),
            ring_out: HashMap::new(),
            pipe_in: HashMap::new(),
            pipe_out: HashMap::new(),
            broken: HashSet::new(),
            cpus_shared: false,
            last_split: 0,
            split_slots: 0,
            tuner: Tuner::default(),
        };
        lmt.time_kernel_copies();
        Ok(lmt)
    }

    /// Tells automatic selection that the node's processes outnumber its CPUs. It then
    /// tries the strategies that never wait for the peer (cma, cma-put, cma-split, whose
    /// receiver takes what its sender has not) before those through an intermediate
    /// buffer (the ring, vmsplice), whose two sides must take turns on it: with two
    /// processes on one CPU, 256 KiB messages moved at 1.05 GB/s by CMA and by
    /// cma-split, and 0.08 by the ring (BENCHMARKS.md).
    pub fn set_cpus_shared(&mut self, shared: bool) {
        self.cpus_shared = shared;
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Switches policy, as a benchmark comparing strategies does between runs. Both
    /// sides of a transfer must switch together, with no transfer in flight.
    ///
    /// # Errors
    /// A forced strategy that this system does not permit.
    pub fn set_policy(&mut self, policy: Policy) -> Result<(), LmtError> {
        check_forced(policy, self.cma_refused.as_deref())?;
        self.policy = policy;
        self.time_kernel_copies();
        Ok(())
    }

    /// Times the kernel's copies once automatic selection, the only one that asks, is
    /// in force: a forced strategy is taken either way.
    fn time_kernel_copies(&mut self) {
        if self.policy.force.is_none() && self.kernel_skew_slow.is_none() {
            self.kernel_skew_slow = Some(self.cma_refused.is_none() && cma::skew_slows_kernel_copies());
        }
    }

    /// The strategy automatic selection gives a message of `len` bytes to a local peer
    /// whose intermediate buffers are free, whatever this side's policy forces.
    pub fn auto_choice(&self, len: usize) -> Strategy {
        self.auto_order(len)
            .into_iter()
            .find(|&s| self.permitted(s))
            .unwrap_or(Strategy::Chunks)
    }

    /// The automatic order for `len` bytes, with the one-sided strategies first where
    /// the CPUs are shared.
    fn auto_order(&self, len: usize) -> Vec<Strategy> {
        let mut order = self.policy.auto_order(len).to_vec();
        if self.cpus_shared {
            // Stable: each group keeps the policy's order.
            order.sort_by_key(|s| s.mode() == Mode::Cooperative);
        }
        order
    }

    /// Whether this CPU's kernel copies were found many times slower with the
    /// destination a few bytes ahead of the source within a page; where they were,
    /// automatic selection takes only nemesis's own copies (the ring, else chunks) for
    /// such a pair of buffers. Not looked for (false) where the policy forces a strategy.
    pub fn kernel_skew_slow(&self) -> bool {
        self.kernel_skew_slow == Some(true)
    }

    /// Overrides what [`LocalLmt::kernel_skew_slow`] found, for tests of selection.
    pub fn set_kernel_skew_slow(&mut self, slow: bool) {
        self.kernel_skew_slow = Some(slow);
    }

    /// Why CMA is not used here, or `None` if it is available.
    pub fn cma_refused(&self) -> Option<&str> {
        self.cma_refused.as_deref()
    }

    /// Whether `peer` is another process of this node.
    pub fn is_local(&self, peer: u32) -> bool {
        peer != self.me && self.local_of.get(peer as usize).is_some_and(|&i| i != u32::MAX)
    }

    fn pid(&mut self, peer: u32) -> Result<i32, LmtError> {
        let known = self.pids.get(peer as usize).copied().unwrap_or(0);
        if known != 0 {
            return Ok(known as i32);
        }
        let failed = |why: String| LmtError::PeerFailed { peer, why };
        let idx = *self
            .local_of
            .get(peer as usize)
            .filter(|&&i| i != u32::MAX)
            .ok_or_else(|| failed("not on this node".into()))?;
        match self.seg.peer_state(idx) {
            PeerState::Alive { pid } => {
                self.pids[peer as usize] = pid;
                Ok(pid as i32)
            }
            other => Err(failed(format!("its process is {other:?}"))),
        }
    }

    /// Word `slot` of the split transfers that local rank `rank` receives.
    fn split_word(&self, rank: u32, slot: usize) -> Option<SplitClaim<'_>> {
        let idx = *self.local_of.get(rank as usize)?;
        if idx == u32::MAX {
            return None;
        }
        self.seg.split_word(idx, slot).map(|w| w.view::<Sound>())
    }

    /// Whether this system lets `s` run at all.
    fn permitted(&self, s: Strategy) -> bool {
        !s.needs_cma() || self.cma_refused.is_none()
    }

    /// Whether `s` can carry a transfer with `peer` as far as this side knows.
    fn possible(&self, peer: u32, s: Strategy) -> bool {
        self.permitted(s) && !self.broken.contains(&(peer, s))
    }

    /// The strategies that this side's policy would use for `len` bytes, best first.
    fn preferred(&self, len: usize) -> Vec<Strategy> {
        match self.policy.force {
            // Between nodes only: here, chunks.
            Some(Strategy::Rdma) => Vec::new(),
            Some(s) => vec![s],
            None => self.auto_order(len),
        }
    }

    /// Claims the receiving end of `s` with `peer`, making it on first use.
    fn claim(&mut self, peer: u32, s: Strategy) -> bool {
        let (dir, me, geo) = (&self.dir, self.me, self.policy.ring);
        let ok = match s {
            Strategy::Ring => claim_in(&mut self.ring_in, peer, || {
                RingEnd::create(dir, &file_name(&self.prefix, "ring", peer, me), geo)
            }),
            Strategy::Vmsplice => claim_in(&mut self.pipe_in, peer, || {
                pipe::PipeIn::create(dir, &file_name(&self.prefix, "pipe", peer, me), peer)
            }),
            _ => Some(true),
        };
        if ok.is_none() {
            self.broken.insert((peer, s));
        }
        ok == Some(true)
    }

    /// Checks a file name that came from the peer in a CTS: it must be the one name the
    /// peer makes for this pair, in this job, so nothing else can be opened through it.
    fn peer_file(&self, peer: u32, cookie: &[u8], kind: &str) -> Result<String, LmtError> {
        let want = file_name(&self.prefix, kind, self.me, peer);
        match std::str::from_utf8(cookie) {
            Ok(n) if n == want => Ok(want),
            _ => Err(LmtError::BadCookie {
                peer,
                why: format!(
                    "{:?} does not name a {kind} of this pair",
                    String::from_utf8_lossy(cookie)
                ),
            }),
        }
    }

    fn forget(&mut self, peer: u32, s: Strategy) {
        self.broken.insert((peer, s));
        match s {
            Strategy::Ring => {
                if let Some(c) = self.ring_in.remove(&peer) {
                    c.end.unlink();
                }
                self.ring_out.remove(&peer);
            }
            Strategy::Vmsplice => {
                self.pipe_in.remove(&peer);
                self.pipe_out.remove(&peer);
            }
            _ => {}
        }
    }

    /// [`Lmt::start_recv`], but for the timing.
    #[allow(clippy::too_many_arguments)]
    fn begin_recv(
        &mut self,
        peer: u32,
        strategy: Strategy,
        rts_cookie: &[u8],
        total: usize,
        cap: usize,
        dst: &[Seg],
        cts_cookie: &mut Vec<u8>,
    ) -> Result<Xfer, LmtError> {
        let mut x = Xfer::new(peer, strategy, Role::Recv, total);
        match strategy {
            Strategy::Chunks => {}
            Strategy::Cma => {
                x.remote = cma::decode(peer, rts_cookie, total)?;
                x.want = total.min(cap);
            }
            Strategy::CmaPut => {
                if !cma::encode(&cma::first(dst, cap.min(total)), cts_cookie) {
                    return Err(LmtError::Config {
                        var: "NEMESIS_LMT",
                        value: "cma-put".into(),
                        reason: format!("a receive buffer in more than {} pieces", cma::MAX_COOKIE_PIECES),
                    });
                }
                x.want = 0;
            }
            Strategy::CmaSplit => {
                let refuse = |why: &str| LmtError::NotPermitted {
                    peer,
                    strategy,
                    why: std::io::Error::other(why.to_string()),
                };
                // A message longer than the buffer would have the sender write past it:
                // the caller moves it another way.
                if cap < total {
                    return Err(refuse("a receive buffer shorter than the message"));
                }
                x.remote = cma::decode(peer, rts_cookie, total)?;
                // A word of ours settles who moves each chunk of the second half; with
                // all of them held by other split transfers, this one is read whole, as
                // by cma, and the sender only waits for DONE.
                self.last_split = self.last_split.wrapping_add(1).max(1);
                let id = self.last_split;
                // A word left open by a transfer this process abandoned (a world dropped
                // mid-transfer) stays held, and the next is tried.
                let slot = loop {
                    let slot = (!self.split_slots).trailing_zeros() as usize;
                    match self.split_word(self.me, slot) {
                        None => {
                            x.strategy = Strategy::Cma;
                            x.want = total;
                            return Ok(x);
                        }
                        Some(w) if w.open(id) => break slot,
                        Some(_) => self.split_slots |= 1 << slot,
                    }
                };
                let state = split_state(id, slot, total);
                cts_cookie.extend_from_slice(&(state.base as u64).to_le_bytes());
                cts_cookie.extend_from_slice(&id.to_le_bytes());
                cts_cookie.extend_from_slice(&(slot as u32).to_le_bytes());
                if !cma::encode(&cma::first(dst, total), cts_cookie) {
                    if let Some(w) = self.split_word(self.me, slot) {
                        w.close(id);
                    }
                    return Err(refuse("a receive buffer in too many pieces"));
                }
                self.split_slots |= 1 << slot;
                x.want = state.base;
                x.split = state;
            }
            Strategy::Ring => {
                // Made by `choose`'s claim, under the one name `peer_file` accepts.
                let name = self.ring_in.get(&peer).map_or("", |c| c.end.name());
                cts_cookie.extend_from_slice(name.as_bytes());
            }
            Strategy::Vmsplice => {
                let name = self.pipe_in.get(&peer).map(|c| c.end.name()).unwrap_or_default();
                cts_cookie.extend_from_slice(name.as_bytes());
            }
            Strategy::Rdma => return Err(not_here(peer)),
        }
        Ok(x)
    }
}

impl Lmt for LocalLmt {
    fn offer(&mut self, peer: u32, src: &[Seg], len: usize, cookie: &mut Vec<u8>) -> Offer {
        let mut set = Strategies::CHUNKS;
        if !self.is_local(peer) {
            return Offer::CHUNKS;
        }
        // The cookie naming the sender's pages, which every in-place offer shares:
        // `None` until made, `Some(false)` when the buffer has too many pieces.
        let mut named = None;
        for s in self.preferred(len) {
            if !self.possible(peer, s) {
                continue;
            }
            if s.offered_in_place() && !*named.get_or_insert_with(|| cma::encode(src, cookie)) {
                continue;
            }
            set = set.with(s);
        }
        Offer {
            strategies: set,
            held: None,
        }
    }

    fn choose(
        &mut self,
        peer: u32,
        len: usize,
        offered: Strategies,
        rts_cookie: &[u8],
        dst: &[Seg],
    ) -> Strategy {
        if !self.is_local(peer) {
            return Strategy::Chunks;
        }
        let mut order = self.preferred(len);
        if self.policy.force.is_none()
            && self.kernel_skew_slow()
            && cma::meets_slow_case(peer, rts_cookie, dst, len)
        {
            // Our own copies only: the ring, or chunks when it is busy (a window of
            // receives), each faster than the kernel's copies here.
            order.retain(|s| !s.copies_in_kernel());
        }
        order.retain(|&s| offered.has(s) && self.possible(peer, s));
        if self.policy.force.is_none() && self.policy.tune && !self.cpus_shared {
            // Where the processes outnumber the CPUs, the order is kept: a look at the
            // ring there costs a dozen transfers' time.
            self.tuner.rank(peer, len, &mut order);
        }

        for s in order {
            if self.claim(peer, s) {
                return s;
            }
        }
        Strategy::Chunks
    }

    fn start_recv(
        &mut self,
        peer: u32,
        strategy: Strategy,
        rts_cookie: &[u8],
        total: usize,
        cap: usize,
        dst: &[Seg],
        cts_cookie: &mut Vec<u8>,
    ) -> Result<Xfer, LmtError> {
        let mut x = self.begin_recv(peer, strategy, rts_cookie, total, cap, dst, cts_cookie)?;
        if strategy != Strategy::Chunks {
            x.stamp = Some(self.tuner.begin());
        }
        Ok(x)
    }

    fn start_send(
        &mut self,
        peer: u32,
        strategy: Strategy,
        cts_cookie: &[u8],
        total: usize,
    ) -> Result<Xfer, LmtError> {
        let mut x = Xfer::new(peer, strategy, Role::Send, total);
        match strategy {
            Strategy::Chunks => {}
            Strategy::Cma => x.want = 0,
            Strategy::CmaPut => {
                let sum = cts_cookie
                    .get(4..)
                    .map(|p| {
                        p.chunks(16)
                            .filter_map(|c| c.get(8..16))
                            .map(|l| u64::from_le_bytes(l.try_into().expect("8 bytes")))
                            .fold(0u64, u64::saturating_add)
                    })
                    .unwrap_or(0);
                if sum > total as u64 {
                    return Err(LmtError::BadCookie {
                        peer,
                        why: format!("a receive buffer of {sum} bytes for a message of {total}"),
                    });
                }
                x.remote = cma::decode(peer, cts_cookie, sum as usize)?;
                x.want = sum as usize;
            }
            Strategy::CmaSplit => {
                let bad = |why: String| LmtError::BadCookie { peer, why };
                let head = cts_cookie
                    .get(..16)
                    .ok_or_else(|| bad("a split CTS cookie shorter than its head".into()))?;
                let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
                let split = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
                let (id, slot) = (word(8), word(12) as usize);
                let state = split_state(id, slot, total);
                if split != state.base as u64 || slot >= SPLIT_SLOTS || id == 0 {
                    return Err(bad(format!(
                        "a split of {total} bytes at byte {split}, number {id}, word {slot}; \
                         this side cuts it at {} and the receiver has {SPLIT_SLOTS} words",
                        state.base
                    )));
                }
                x.remote = cma::decode(peer, &cts_cookie[16..], total)?;
                x.split = state;
                x.want = 0;
            }
            Strategy::Ring => {
                if !self.ring_out.contains_key(&peer) {
                    let name = self.peer_file(peer, cts_cookie, "ring")?;
                    let end = RingEnd::open(&self.dir, &name, peer)?;
                    self.ring_out.insert(peer, end);
                }
            }
            Strategy::Vmsplice => {
                if !self.pipe_out.contains_key(&peer) {
                    let name = self.peer_file(peer, cts_cookie, "pipe")?;
                    let end = pipe::PipeOut::open(&self.dir, &name, peer)?;
                    self.pipe_out.insert(peer, end);
                }
            }
            Strategy::Rdma => return Err(not_here(peer)),
        }
        Ok(x)
    }

    unsafe fn progress(&mut self, x: &mut Xfer, bufs: &[Seg]) -> Result<bool, LmtError> {
        let missing = |what: &str| LmtError::PeerFailed {
            peer: x.peer,
            why: format!("its {what} was abandoned"),
        };
        match (x.strategy, x.role) {
            (Strategy::Chunks, _) => {}
            (Strategy::Rdma, _) => return Err(not_here(x.peer)),
            (Strategy::CmaSplit, role) => {
                let (side, owner) = match role {
                    Role::Recv => (Side::Receiver, self.me),
                    Role::Send => (Side::Sender, x.peer),
                };
                // Done with what it holds (its half, or a chunk), a side takes the next
                // chunk; one that gave up takes every one left and moves none.
                while x.own_part_done() && !x.split.exhausted {
                    let (id, chunks) = (x.split.id, x.split.chunks);
                    let Some(w) = self.split_word(owner, x.split.slot) else {
                        x.split.exhausted = true;
                        break;
                    };
                    match w.take(id, chunks, side) {
                        Some(_) if x.split.gave_up => {}
                        Some(k) => x.enter_chunk(k),
                        None => x.split.exhausted = true,
                    }
                }
                if !x.own_part_done() {
                    let pid = self.pid(x.peer)?;
                    // SAFETY: `bufs` is the transfer's buffer (progress's contract).
                    unsafe { cma::step(pid, x, bufs, CMA_STEP)? };
                }
                if role == Role::Recv && x.split.exhausted && !x.split.peer_done && !x.split.peer_has_it {
                    // Every chunk is taken, so the word no longer changes: the sender's
                    // FIN is to come only if it took some.
                    let took = self
                        .split_word(self.me, x.split.slot)
                        .map_or(0, |w| w.sender_took(x.split.id));
                    if took == 0 {
                        x.split.peer_done = true;
                    } else {
                        x.split.peer_has_it = true;
                    }
                }
            }
            (Strategy::Cma | Strategy::CmaPut, _) => {
                if !x.own_part_done() {
                    let pid = self.pid(x.peer)?;
                    // SAFETY: `bufs` is the transfer's buffer (progress's contract).
                    unsafe { cma::step(pid, x, bufs, CMA_STEP)? };
                }
            }
            (Strategy::Ring, Role::Send) => {
                let end = self.ring_out.get_mut(&x.peer).ok_or_else(|| missing("ring"))?;
                // SAFETY: as above.
                unsafe { end.push(x, bufs) };
            }
            (Strategy::Ring, Role::Recv) => {
                let c = self.ring_in.get_mut(&x.peer).ok_or_else(|| missing("ring"))?;
                // SAFETY: as above.
                unsafe { c.end.pull(x, bufs) };
            }
            (Strategy::Vmsplice, Role::Send) => {
                let end = self.pipe_out.get_mut(&x.peer).ok_or_else(|| missing("pipe"))?;
                // SAFETY: as above; the sender keeps its buffer until DONE.
                unsafe { end.step(x, bufs)? };
            }
            (Strategy::Vmsplice, Role::Recv) => {
                let c = self.pipe_in.get_mut(&x.peer).ok_or_else(|| missing("pipe"))?;
                // SAFETY: as above.
                unsafe { c.end.step(x, bufs)? };
            }
        }
        Ok(x.is_complete())
    }

    fn end(&mut self, x: &Xfer) {
        if let Some(stamp) = x.stamp {
            let moved = x.is_complete() && !x.split.gave_up;
            self.tuner.end(stamp, x.peer, x.total, x.strategy, moved);
        }
        if x.strategy == Strategy::CmaSplit && x.role == Role::Recv && x.split.id != 0 {
            if let Some(w) = self.split_word(self.me, x.split.slot) {
                w.close(x.split.id);
            }
            self.split_slots &= !(1 << x.split.slot);
            return;
        }
        if x.strategy.mode() != Mode::Cooperative || x.strategy == Strategy::Chunks {
            return;
        }
        if !x.is_complete() {
            self.forget(x.peer, x.strategy);
            return;
        }
        if x.role == Role::Recv {
            let busy = match x.strategy {
                Strategy::Ring => self.ring_in.get_mut(&x.peer).map(|c| &mut c.busy),
                Strategy::Vmsplice => self.pipe_in.get_mut(&x.peer).map(|c| &mut c.busy),
                _ => None,
            };
            if let Some(b) = busy {
                *b = false;
            }
        }
    }

    fn peer_terminated(&mut self, peer: u32) {
        self.tuner.forget(peer);
        self.forget(peer, Strategy::Ring);
        self.forget(peer, Strategy::Vmsplice);
        if let Some(p) = self.pids.get_mut(peer as usize) {
            *p = 0;
        }
    }
}

impl Drop for LocalLmt {
    fn drop(&mut self) {
        for c in self.ring_in.values() {
            c.end.unlink();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nemesis_shm::Geometry;

    fn pair(dir: &std::path::Path) -> (LocalLmt, LocalLmt) {
        let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
        seg.publish_pid(0);
        seg.publish_pid(1);
        let prefix = format!("nemesis-test{}-", std::process::id());
        let make = |me| {
            let p = Policy::default();
            LocalLmt::new(me, seg.clone(), vec![0, 1], dir.to_path_buf(), prefix.clone(), p).unwrap()
        };
        (make(0), make(1))
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nemesis-lmt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Runs one transfer of `msg` from `tx` (rank 0) to `rx` (rank 1) with `s`, both
    /// sides driven in turn as two progress engines would; returns what arrived.
    fn transfer(tx: &mut LocalLmt, rx: &mut LocalLmt, s: Strategy, msg: &[u8]) -> Vec<u8> {
        let mut cookie = Vec::new();
        let offered = tx.offer(1, &[Seg::of(msg)], msg.len(), &mut cookie).strategies;
        assert!(offered.has(s), "{s} not offered");
        let mut dst = vec![0u8; msg.len()];
        let dsegs = [Seg::of_mut(&mut dst)];
        let mut cts = Vec::new();
        let mut rxx = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &dsegs, &mut cts)
            .unwrap();
        let mut txx = tx.start_send(1, s, &cts, msg.len()).unwrap();
        let ssegs = [Seg::of(msg)];
        let (mut sent, mut got) = (false, false);
        while !(sent && got) {
            // SAFETY: both buffers are live for the whole transfer and used by nothing else.
            unsafe {
                sent = sent || tx.progress(&mut txx, &ssegs).unwrap();
                got = got || rx.progress(&mut rxx, &dsegs).unwrap();
            }
        }
        tx.end(&txx);
        rx.end(&rxx);
        dst
    }

    #[test]
    fn the_ring_carries_one_message_after_another_and_leaves_no_file() {
        let dir = tmpdir("ring");
        let (mut tx, mut rx) = pair(&dir);
        for (i, len) in [3 << 20, 100_000, (1 << 20) + 1].into_iter().enumerate() {
            let msg: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            assert_eq!(
                rx.choose(0, len, Strategies::CHUNKS.with(Strategy::Ring), &[], &[]),
                Strategy::Ring
            );
            // Claimed until the transfer ends: a second message cannot have it.
            assert_eq!(
                rx.choose(0, len, Strategies::CHUNKS.with(Strategy::Ring), &[], &[]),
                Strategy::Chunks
            );
            assert!(transfer(&mut tx, &mut rx, Strategy::Ring, &msg) == msg);
        }
        // The sender removed the ring's name once it had mapped it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn the_kernel_copies_are_timed_only_for_automatic_selection() {
        let dir = tmpdir("skew");
        let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
        let forced = Policy {
            force: Some(Strategy::Ring),
            ..Policy::default()
        };
        let mut lmt = LocalLmt::new(0, seg, vec![0, 1], dir, "nemesis-test-skew-".into(), forced).unwrap();
        assert!(lmt.kernel_skew_slow.is_none() && !lmt.kernel_skew_slow());
        lmt.set_policy(forced).unwrap();
        assert!(lmt.kernel_skew_slow.is_none());
        // Automatic from now on: timed then.
        lmt.set_policy(Policy::default()).unwrap();
        assert!(lmt.kernel_skew_slow.is_some());
        if lmt.cma_refused().is_some() {
            assert!(!lmt.kernel_skew_slow());
        }
    }

    #[test]
    fn vmsplice_and_cma_carry_a_message() {
        let dir = tmpdir("pipe");
        let (mut tx, mut rx) = pair(&dir);
        let msg: Vec<u8> = (0..(2 << 20) + 5).map(|j| (j % 253) as u8).collect();
        for s in [Strategy::Vmsplice, Strategy::Cma, Strategy::CmaPut] {
            if s != Strategy::Vmsplice && tx.cma_refused().is_some() {
                continue;
            }
            let p = Policy {
                force: Some(s),
                ..Policy::default()
            };
            tx.set_policy(p).unwrap();
            rx.set_policy(p).unwrap();
            assert_eq!(rx.choose(0, msg.len(), Strategies::CHUNKS.with(s), &[], &[]), s);
            assert!(transfer(&mut tx, &mut rx, s, &msg) == msg, "{s}");
        }
        drop((tx, rx));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn a_split_transfer_s_chunks_go_to_whichever_side_comes_first() {
        let dir = tmpdir("split");
        let (mut tx, mut rx) = pair(&dir);
        if tx.cma_refused().is_some() {
            eprintln!("skipping: CMA is not permitted here");
            return;
        }
        let s = Strategy::CmaSplit;
        // Named, as the default order has it on Intel CPUs only.
        let p = Policy {
            force: Some(s),
            ..Policy::default()
        };
        tx.set_policy(p).unwrap();
        rx.set_policy(p).unwrap();
        let msg: Vec<u8> = (0..(3 << 20) + 77).map(|j| (j % 251) as u8).collect();
        let mut cookie = Vec::new();
        assert!(
            tx.offer(1, &[Seg::of(&msg)], msg.len(), &mut cookie)
                .strategies
                .has(s)
        );
        let ssegs = [Seg::of(&msg)];

        // Both sides at work, in turn: the receiver reads its half, the sender takes
        // chunks of the second from the start, the receiver the rest. Into two pieces,
        // so that the cut and the pieces' seam differ.
        let mut a = vec![0u8; 1_000_001];
        let mut b = vec![0u8; msg.len() - a.len()];
        let dsegs = [Seg::of_mut(&mut a), Seg::of_mut(&mut b)];
        let mut cts = Vec::new();
        let mut rxx = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &dsegs, &mut cts)
            .unwrap();
        let mut txx = tx.start_send(1, s, &cts, msg.len()).unwrap();
        let (mut sent, mut got) = (false, false);
        while !(sent && got) {
            // SAFETY: both buffers are live for the whole transfer and used by nothing else.
            unsafe {
                if !sent && tx.progress(&mut txx, &ssegs).unwrap() {
                    sent = true;
                    // Its FIN.
                    rxx.peer_finished();
                }
                got = got || rx.progress(&mut rxx, &dsegs).unwrap();
            }
        }
        assert!(!txx.took_no_chunk());
        let (mine, theirs) = (rxx.split.took, txx.split.took);
        assert!(
            mine > 0 && theirs > 0 && mine + theirs == rxx.split.chunks,
            "{mine} + {theirs}"
        );
        tx.end(&txx);
        rx.end(&rxx);
        assert!(a[..] == msg[..a.len()] && b[..] == msg[a.len()..]);

        // A sender that has not come by then: the receiver takes every chunk and is done
        // without it; the sender, coming late, writes nothing and sends no FIN.
        let mut c = vec![0u8; msg.len()];
        let csegs = [Seg::of_mut(&mut c)];
        let mut cts1 = Vec::new();
        let mut rxx = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &csegs, &mut cts1)
            .unwrap();
        // A second at the same time has a word of its own.
        let mut d = vec![0u8; msg.len()];
        let dsegs2 = [Seg::of_mut(&mut d)];
        let mut cts2 = Vec::new();
        let mut second = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &dsegs2, &mut cts2)
            .unwrap();
        assert_eq!(second.strategy, s);
        assert_ne!(second.split.slot, rxx.split.slot);
        // SAFETY: as above.
        unsafe {
            while !rx.progress(&mut rxx, &csegs).unwrap() {}
            while !rx.progress(&mut second, &dsegs2).unwrap() {}
        }
        let mut late = tx.start_send(1, s, &cts1, msg.len()).unwrap();
        // SAFETY: as above; nothing is written.
        assert!(unsafe { tx.progress(&mut late, &ssegs) }.unwrap());
        assert!(late.took_no_chunk());
        rx.end(&rxx);
        rx.end(&second);
        assert!(c == msg && d == msg);
        // With every word held, a split receive is read whole, as by cma, with no CTS.
        rx.split_slots = !0;
        let mut cts3 = Vec::new();
        let whole = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &csegs, &mut cts3)
            .unwrap();
        assert_eq!((whole.strategy, cts3.len()), (Strategy::Cma, 0));
        rx.split_slots = 0;
        // A word left open (by a transfer of an earlier world) is passed over.
        assert!(rx.seg.split_word(1, 0).unwrap().view::<Sound>().open(999));
        let mut cts4 = Vec::new();
        let next = rx
            .start_recv(0, s, &cookie, msg.len(), msg.len(), &csegs, &mut cts4)
            .unwrap();
        assert_eq!((next.strategy, next.split.slot), (s, 1));
        rx.end(&next);

        // A receive buffer shorter than the message is refused before anything moves.
        let mut short = vec![0u8; 100];
        let e = rx
            .start_recv(
                0,
                s,
                &cookie,
                msg.len(),
                100,
                &[Seg::of_mut(&mut short)],
                &mut Vec::new(),
            )
            .unwrap_err();
        assert!(matches!(e, LmtError::NotPermitted { .. }), "{e}");
        // A CTS whose cut, word or pieces lie is a bad cookie.
        let mut past = ((msg.len() / 2 + 4096) as u64).to_le_bytes().to_vec();
        past.extend_from_slice(&cts[8..]);
        let mut no_word = cts[..12].to_vec();
        no_word.extend_from_slice(&(SPLIT_SLOTS as u32).to_le_bytes());
        no_word.extend_from_slice(&cts[16..]);
        for bad in [&cts[..5], &past[..], &no_word[..], &cts[..cts.len() - 1]] {
            let e = tx.start_send(1, s, bad, msg.len()).unwrap_err();
            assert!(matches!(e, LmtError::BadCookie { peer: 1, .. }), "{e}");
        }
    }

    #[test]
    fn a_pair_of_buffers_that_slows_kernel_copies_takes_only_our_own_copies() {
        let policy = |auto: &'static str| {
            Policy::from_lookup(|k| (k == "NEMESIS_LMT_AUTO").then(|| auto.to_string())).unwrap()
        };
        let (with_ring, without) = (
            policy("cma-split,vmsplice,ring,cma"),
            policy("cma-split,vmsplice,cma"),
        );
        let all = Strategy::ALL
            .into_iter()
            .fold(Strategies::CHUNKS, Strategies::with);
        let len = 1 << 20;
        let src = vec![0u8; len + 4096];
        let src = &src[src.as_ptr().align_offset(4096)..][..len];
        let mut cookie = Vec::new();
        assert!(cma::encode(&[Seg::of(src)], &mut cookie));
        let mut dst = vec![0u8; len + 8192];
        let at = dst.as_ptr().align_offset(4096);
        let cases = [
            (with_ring, true, 16, None, Strategy::Ring),
            (without, true, 16, None, Strategy::Chunks),
            (with_ring, true, 0, None, Strategy::CmaSplit),
            (with_ring, true, 64, None, Strategy::CmaSplit),
            (with_ring, false, 16, None, Strategy::CmaSplit),
            // A forced strategy is what it is.
            (with_ring, true, 16, Some(Strategy::CmaSplit), Strategy::CmaSplit),
        ];
        for (i, (p, slow, skew, force, want)) in cases.into_iter().enumerate() {
            // A fresh pair each time, its ring unclaimed.
            let dir = tmpdir(&format!("skew{i}"));
            let (_tx, mut rx) = pair(&dir);
            if rx.cma_refused().is_some() {
                eprintln!("skipping: CMA is not permitted here");
                return;
            }
            rx.set_policy(Policy { force, ..p }).unwrap();
            rx.set_kernel_skew_slow(slow);
            let d = Seg::of_mut(&mut dst[at + skew..at + skew + len]);
            assert_eq!(
                rx.choose(0, len, all, &cookie, &[d]),
                want,
                "kernel copies slow: {slow}, destination {skew} bytes ahead, forced {force:?}"
            );
        }
    }

    #[test]
    fn automatic_selection_tries_each_strategy_then_takes_the_one_its_transfers_found_fastest() {
        use Strategy::{Cma, Ring};
        let dir = tmpdir("tune");
        let (mut tx, mut rx) = pair(&dir);
        if rx.cma_refused().is_some() {
            eprintln!("skipping: CMA is not permitted here");
            return;
        }
        let order =
            |o: &str| Policy::from_lookup(|k| (k == "NEMESIS_LMT_AUTO").then(|| o.to_string())).unwrap();
        rx.set_policy(order("ring,cma")).unwrap();
        tx.set_policy(order("ring,cma")).unwrap();
        let len = 256 << 10;
        let msg: Vec<u8> = (0..len).map(|j| (j % 251) as u8).collect();
        let offered = Strategies::CHUNKS.with(Ring).with(Cma);
        // The faster by the figures as they stand: each transfer updates its own, so
        // after the tries the answer can change from one choice to the next.
        let faster = |rx: &LocalLmt| {
            let took = |s| rx.tuner.figure(0, len, s).expect("timed");
            if took(Ring) <= took(Cma) { Ring } else { Cma }
        };
        let (mut chosen, mut want) = (Vec::new(), Vec::new());
        for i in 0..12 {
            if i >= 8 {
                want.push(faster(&rx));
            }
            let s = rx.choose(0, len, offered, &[], &[]);
            assert!(transfer(&mut tx, &mut rx, s, &msg) == msg, "{s}");
            chosen.push(s);
        }
        // Each in the policy's order: a first try, untimed, then three timed; then the
        // faster each time.
        assert_eq!(chosen[..8], [Ring, Ring, Ring, Ring, Cma, Cma, Cma, Cma]);
        assert_eq!(chosen[8..], want[..], "{chosen:?}");
        let fast = faster(&rx);
        let slow = if fast == Ring { Cma } else { Ring };
        // Put last by the policy, the faster is still taken first; with NEMESIS_LMT_TUNE
        // off, the policy's order holds.
        let slow_first = order(&format!("{slow},{fast}"));
        rx.set_policy(slow_first).unwrap();
        assert_eq!(rx.choose(0, len, offered, &[], &[]), fast);
        // Lets the ring go again, as a transfer's end does.
        rx.end(&Xfer::new(0, fast, Role::Recv, 0));
        rx.set_policy(Policy {
            tune: false,
            ..slow_first
        })
        .unwrap();
        assert_eq!(rx.choose(0, len, offered, &[], &[]), slow);
    }

    #[test]
    fn shared_cpus_put_the_one_sided_strategies_first() {
        let dir = tmpdir("shared");
        let (_tx, mut rx) = pair(&dir);
        let auto = "ring,cma-split,vmsplice,cma-put,cma";
        let p = Policy::from_lookup(|k| (k == "NEMESIS_LMT_AUTO").then(|| auto.to_string())).unwrap();
        rx.set_policy(p).unwrap();
        use Strategy::{Cma, CmaPut, CmaSplit, Ring, Vmsplice};
        assert_eq!(rx.auto_order(1 << 20), [Ring, CmaSplit, Vmsplice, CmaPut, Cma]);
        rx.set_cpus_shared(true);
        assert_eq!(rx.auto_order(1 << 20), [CmaSplit, CmaPut, Cma, Ring, Vmsplice]);
        let all = Strategy::ALL
            .into_iter()
            .fold(Strategies::CHUNKS, Strategies::with);
        let want = if rx.cma_refused().is_some() {
            Ring
        } else {
            CmaSplit
        };
        assert_eq!(rx.choose(0, 1 << 20, all, &[], &[]), want);
        // A forced strategy is what it is.
        rx.set_policy(Policy {
            force: Some(Ring),
            ..p
        })
        .unwrap();
        assert_eq!(rx.preferred(1 << 20), [Ring]);
    }

    #[test]
    fn a_cts_naming_a_file_outside_the_pair_is_refused() {
        let dir = tmpdir("name");
        let (mut tx, _rx) = pair(&dir);
        let theirs = tx.peer_file(1, b"", "ring").unwrap_err().to_string();
        let good = file_name(&tx.prefix, "ring", 0, 1);
        assert!(theirs.contains("does not name"), "{theirs}");
        let other_job = good.replacen("nemesis-", "nemesis-0", 1);
        let up = format!("../{good}");
        for bad in [
            &b"../../etc/passwd"[..],
            b"nemesis-x-lmt-ring-0-2",
            b"nemesis-x-lmt-ring-0-1",
            other_job.as_bytes(),
            up.as_bytes(),
            b"\xff",
            b"",
        ] {
            let e = tx.start_send(1, Strategy::Ring, bad, 100).unwrap_err();
            assert!(matches!(e, LmtError::BadCookie { peer: 1, .. }), "{e}");
        }
        // A name of the right shape that does not exist is refused too, not created.
        let e = tx
            .start_send(1, Strategy::Ring, b"nemesis-none-lmt-ring-0-1", 100)
            .unwrap_err();
        assert!(matches!(e, LmtError::BadCookie { .. }), "{e}");
    }

    #[test]
    fn forcing_cma_where_it_is_refused_is_a_config_error_and_nothing_else_is() {
        for s in [Strategy::Cma, Strategy::CmaPut, Strategy::CmaSplit] {
            let p = Policy {
                force: Some(s),
                ..Policy::default()
            };
            let e = check_forced(p, Some("kernel.yama.ptrace_scope is 2")).unwrap_err();
            assert!(
                matches!(
                    e,
                    LmtError::Config {
                        var: "NEMESIS_LMT",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("ptrace_scope is 2"), "{e}");
            assert!(check_forced(p, None).is_ok());
        }
        for force in [
            None,
            Some(Strategy::Ring),
            Some(Strategy::Vmsplice),
            Some(Strategy::Chunks),
        ] {
            let p = Policy {
                force,
                ..Policy::default()
            };
            assert!(check_forced(p, Some("refused")).is_ok());
        }
    }
}
