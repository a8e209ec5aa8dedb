//! Collectives of communicators whose members all share the node: they meet in a block
//! of the node's segment (see `nemesis_shm::coll`) instead of exchanging messages.
//!
//! A barrier is one arrival at the block's counter. A small allreduce writes each
//! member's data to its slot, arrives, and folds every slot in rank order, so every
//! member computes the same bits. Each slot also carries a signature (the collective,
//! operation, element type and episode) and a length, which every member checks: ranks
//! that disagree all get [`P2pError::CollectiveMismatch`] instead of hanging. An
//! allreduce too large for a slot still goes through the block once, to agree on that,
//! and then takes the message path.
//!
//! The world's communicator uses block 0; a communicator made later claims a free block
//! when it is created, and its last member to drop it frees it. When none is free it
//! uses messages.

use super::P2pError;
use crate::op::{Op, Reducible};
use nemesis_shm::Segment;
use nemesis_shm::coll::{self, Block, SLOT_BYTES};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest sleep between looks at the channel, which keeps messages moving while a
/// member waits for the others (a rendezvous a peer waits on, for one).
const SLICE: Duration = Duration::from_millis(1);
/// Marks a slot whose data did not fit: the data words hold the length instead.
const LARGE: u64 = 1 << 63;

/// A communicator's block, as one member holds it.
#[derive(Debug)]
pub(crate) struct NodeColl {
    seg: Arc<Segment>,
    index: usize,
    /// The generation of this member's next episode.
    epoch: AtomicU32,
    /// Whether dropping the communicator lets the block go (all but the world's).
    owned: bool,
    /// The member whose failure left the block's counts unusable, and why: every later
    /// collective reports it at once.
    failed: Mutex<Option<(u32, String)>>,
}

impl NodeColl {
    /// Joins block `index` of `seg`; the block's generation must not be able to move
    /// until this member arrives, which holds while every member is still joining.
    pub(crate) fn join(seg: Arc<Segment>, index: usize, owned: bool) -> Option<Self> {
        let epoch = seg.coll_block(index)?.generation();
        Some(Self {
            seg,
            index,
            epoch: AtomicU32::new(epoch),
            owned,
            failed: Mutex::new(None),
        })
    }

    /// Fails if a member was found dead in an earlier collective.
    fn usable(&self) -> Result<(), P2pError> {
        match &*self.failed.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some((rank, reason)) => Err(P2pError::PeerFailed {
                rank: *rank,
                reason: reason.clone(),
            }),
        }
    }

    fn block(&self) -> Block<'_> {
        self.seg
            .coll_block(self.index)
            .expect("the index was checked when joining")
    }
}

impl Drop for NodeColl {
    fn drop(&mut self) {
        if self.owned
            && let Some(b) = self.seg.coll_block(self.index)
        {
            b.leave();
        }
    }
}

/// A member's place in its communicator: all a block needs to know of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seat {
    /// The member's rank in the communicator.
    pub(crate) rank: u32,
    /// How many members the communicator has.
    pub(crate) size: u32,
}

/// What a member needs from its world while it waits in a block: messages keep moving,
/// and peers are checked now and then.
pub(crate) trait NodeWaiter {
    /// Moves every protocol on once.
    fn progress(&mut self) -> Result<(), P2pError>;
    /// Checks before yielding, and yields before sleeping, as the channel waits.
    fn spins_and_yields(&self) -> (u32, u32);
    /// How often to check the peers.
    fn failure_check(&self) -> Duration;
    /// A member of the communicator known to have failed.
    fn peer_failed(&mut self) -> Option<P2pError>;
}

/// The key of a communicator's block: its context and its first member's world rank,
/// which together tell apart the communicators one split makes.
pub(crate) fn block_key(ctx: u32, first: u32) -> u64 {
    (u64::from(ctx) << 32 | u64::from(first)) + 1
}

/// Claims a free block (never block 0) for a communicator of `members`.
pub(crate) fn claim(seg: &Segment, key: u64, members: u32) -> Option<usize> {
    (1..coll::BLOCKS).find(|&i| seg.coll_block(i).is_some_and(|b| b.try_claim(key, members)))
}

impl NodeColl {
    /// A barrier through the block.
    pub(crate) fn barrier(&self, seat: Seat, w: &mut impl NodeWaiter) -> Result<(), P2pError> {
        self.usable()?;
        let epoch = self.epoch.load(Ordering::Relaxed);
        if !self.block().arrive(seat.size) {
            self.wait(epoch, w)?;
        }
        self.epoch.store(epoch.wrapping_add(1), Ordering::Relaxed);
        Ok(())
    }

    /// An allreduce through the block. Returns false, having agreed with every member,
    /// when the data does not fit a slot and must go through messages.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allreduce<T: Reducible>(
        &self,
        seat: Seat,
        w: &mut impl NodeWaiter,
        data: &mut [T],
        op: Op,
        op_tag: i32,
        describe: impl Fn(i32) -> String,
    ) -> Result<bool, P2pError> {
        self.usable()?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let len = bytes.len();
        // The slots are words: elements must tile them. Every member has the same type
        // (the signature says so), so all decide alike.
        let fits = len <= SLOT_BYTES
            && SLOT_BYTES % std::mem::size_of::<T>().max(1) == 0
            && std::mem::align_of::<T>() <= 8;
        let epoch = self.epoch.load(Ordering::Relaxed);
        let b = self.block();
        let me = seat.rank as usize;
        // The episode, with a bit that a slot never written lacks.
        let stamp = (epoch & (u32::MAX >> 1)) | 1 << 31;
        let sig = u64::from(op_tag as u32) << 32 | u64::from(stamp);
        if fits {
            b.write_slot(epoch, me, sig, bytes);
        } else {
            b.write_slot(epoch, me, sig | LARGE, &(len as u64).to_le_bytes());
        }
        if !b.arrive(seat.size) {
            self.wait(epoch, w)?;
        }
        self.epoch.store(epoch.wrapping_add(1), Ordering::Relaxed);
        // Every member checks every slot, so all of them see any disagreement.
        let n = seat.size as usize;
        let mut acc = [0u64; SLOT_BYTES / 8];
        let mut other = [0u64; SLOT_BYTES / 8];
        for m in 0..n {
            let into: &mut [u8] =
                bytemuck::cast_slice_mut(if m == 0 { &mut acc[..] } else { &mut other[..] });
            let (their_sig, their_len) = b.read_slot(epoch, m, into);
            let their_len = if their_sig & LARGE != 0 {
                u64::from_le_bytes(into[..8].try_into().expect("eight bytes")) as usize
            } else {
                their_len
            };
            let their_sig = their_sig & !LARGE;
            if their_sig as u32 != stamp {
                return Err(P2pError::CollectiveMismatch(format!(
                    "{}: rank {m} is in another collective",
                    describe(op_tag)
                )));
            }
            if their_sig != sig & !LARGE || their_len != len {
                return Err(P2pError::CollectiveMismatch(format!(
                    "rank {m} is in {} with {their_len} bytes, this rank in {} with {len}",
                    describe((their_sig >> 32) as u32 as i32),
                    describe(op_tag)
                )));
            }
            if !fits || m == 0 {
                continue;
            }
            let k = data.len();
            let acc_t: &mut [T] = &mut bytemuck::cast_slice_mut(&mut acc[..])[..k];
            let other_t: &[T] = &bytemuck::cast_slice(&other[..])[..k];
            T::combine(op, acc_t, other_t)?;
        }
        if !fits {
            return Ok(false);
        }
        let k = data.len();
        data.copy_from_slice(&bytemuck::cast_slice(&acc[..])[..k]);
        Ok(true)
    }

    /// Waits for the block's barrier of `epoch` to release, keeping messages moving,
    /// and fails if a member dies.
    fn wait(&self, epoch: u32, w: &mut impl NodeWaiter) -> Result<(), P2pError> {
        let b = self.block();
        let (spins, yields) = w.spins_and_yields();
        let check = w.failure_check();
        let mut looks = 0u32;
        let mut last_check = Instant::now();
        while !b.passed(epoch) {
            looks += 1;
            if looks % 64 == 0 {
                w.progress()?;
            }
            if looks < spins {
                core::hint::spin_loop();
                continue;
            }
            if looks < spins.saturating_add(yields) {
                std::thread::yield_now();
                continue;
            }
            w.progress()?;
            b.sleep(epoch, Some(SLICE.min(check)));
            if last_check.elapsed() >= check {
                last_check = Instant::now();
                if let Some(e) = w.peer_failed() {
                    // This member has arrived and will never be released: the block's
                    // counts no longer add up for this communicator.
                    if let P2pError::PeerFailed { rank, reason } = &e {
                        *self.failed.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((*rank, reason.clone()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
