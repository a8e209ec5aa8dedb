//! Compile-time knobs of the lock-free protocols.
//!
//! Production code always uses [`Sound`]. The loom models also instantiate the same code
//! with deliberately broken variants, to show that each model can fail: a model that
//! passes on broken code proves nothing.

use crate::sync::Ordering;

/// The orderings and steps that the protocols' correctness rests on.
pub trait Variant: 'static {
    /// Store of a queue link `prev.next = e` by a producer.
    const LINK_STORE: Ordering = Ordering::Release;
    /// Store of `head = e` by a producer that found the queue empty.
    const HEAD_STORE: Ordering = Ordering::Release;
    /// The producers' swap on the tail.
    const TAIL_SWAP: Ordering = Ordering::AcqRel;
    /// Whether the consumer CASes the tail before treating the last element as last.
    const TAIL_CAS: bool = true;
    /// Store of a fastbox's sequence word, which publishes its contents.
    const FBOX_PUBLISH: Ordering = Ordering::Release;
    /// Store of a ring of fastboxes' acknowledgement word by the receiver, which hands
    /// the boxes it counts back to the sender after the receiver's last read of them.
    const FBOX_RETURN: Ordering = Ordering::Release;
    /// Whether the receiver of a message that ran over several fastboxes clears the
    /// sequence words its bytes overwrote before it hands the boxes back.
    const FBOX_CLEAR_SPAN: bool = true;
    /// Whether the receiver holds back a queue cell until its per-pair sequence is due.
    const SEQ_CHECK: bool = true;
    /// Whether a sleeper looks for work again after announcing that it sleeps.
    const WAKE_RECHECK: bool = true;
    /// Whether that look counts a lap's mark in the next fastbox as work: the message
    /// after the mark was published with it, wherever it went.
    const WAKE_SEES_LAP_MARKS: bool = true;
    /// Whether a sender whose ring finds the receiver watching its wake socket wakes it
    /// there.
    const WAKE_WATCHERS: bool = true;
    /// A member's RMW arriving at a node barrier, which orders its slot before the
    /// release.
    const COLL_ARRIVE: Ordering = Ordering::AcqRel;
    /// Whether the last arrival at a node barrier advances the generation with an RMW,
    /// which cannot miss a sleeper's announcement.
    const COLL_RELEASE_RMW: bool = true;
    /// The store of a copy-ring slot's length by the sender, which publishes its bytes.
    const RING_PUBLISH: Ordering = Ordering::Release;
    /// The store that empties a copy-ring slot, which hands it back to the sender after
    /// the receiver's last read of it.
    const RING_RETURN: Ordering = Ordering::Release;
    /// The store of a pair buffer's written count by the sender, which publishes the
    /// bytes it counts.
    const PAIR_PUBLISH: Ordering = Ordering::Release;
    /// The store that frees a pair buffer, which hands it to the next claimer after the
    /// receiver's last read.
    const PAIR_RELEASE: Ordering = Ordering::Release;
    /// The increments that release a window's reader-writer lock, which publish what
    /// the holder wrote to the next holder.
    const RMA_LOCK_RELEASE: Ordering = Ordering::Release;
    /// The increments of post and complete, which publish a window's memory from the
    /// target to its origins and the origins' updates back to the target.
    const RMA_PSCW_PUBLISH: Ordering = Ordering::Release;
    /// Whether an element update runs as one atomic read-modify-write rather than a
    /// load and a store.
    const RMA_ATOMIC_RMW: bool = true;
    /// Whether a reader of a counter-word lock backs out when a writer holds or waits.
    const RMA_COUNTER_READER_DEFERS: bool = true;
    /// Whether a side of a split transfer takes the next chunk with a compare-and-swap,
    /// which the other side's take cannot slip between.
    const SPLIT_TAKE_RMW: bool = true;
}

/// The correct protocol.
#[derive(Debug)]
pub enum Sound {}
impl Variant for Sound {}

/// Broken: a split transfer's sides take chunks with a load and a store, so both may
/// take the same chunk and move it at once.
#[cfg(loom)]
#[derive(Debug)]
pub enum SplitTakeByStore {}
#[cfg(loom)]
impl Variant for SplitTakeByStore {
    const SPLIT_TAKE_RMW: bool = false;
}

/// Broken: a producer links a new cell with a Relaxed store, so the consumer may read
/// the cell before its contents.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedLink {}
#[cfg(loom)]
impl Variant for RelaxedLink {
    const LINK_STORE: Ordering = Ordering::Relaxed;
}

/// Broken: the empty-to-non-empty transition publishes `head` with a Relaxed store.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedHead {}
#[cfg(loom)]
impl Variant for RelaxedHead {
    const HEAD_STORE: Ordering = Ordering::Relaxed;
}

/// Broken: the consumer takes the apparent last element without the CAS on the tail,
/// so it loses the race with a producer's swap.
#[cfg(loom)]
#[derive(Debug)]
pub enum NoTailCas {}
#[cfg(loom)]
impl Variant for NoTailCas {
    const TAIL_CAS: bool = false;
}

/// Broken: every queue publication is Relaxed, so a freed cell can be reused while its
/// previous reader still reads it.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedQueue {}
#[cfg(loom)]
impl Variant for RelaxedQueue {
    const LINK_STORE: Ordering = Ordering::Relaxed;
    const HEAD_STORE: Ordering = Ordering::Relaxed;
    const TAIL_SWAP: Ordering = Ordering::Relaxed;
}

/// Broken: the fastbox sequence word is stored Relaxed.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedFbox {}
#[cfg(loom)]
impl Variant for RelaxedFbox {
    const FBOX_PUBLISH: Ordering = Ordering::Relaxed;
}

/// Broken: the receiver acknowledges fastboxes with a Relaxed store, so the sender may
/// refill a box while the receiver still reads it.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedFboxReturn {}
#[cfg(loom)]
impl Variant for RelaxedFboxReturn {
    const FBOX_RETURN: Ordering = Ordering::Relaxed;
}

/// Broken: the receiver of a message longer than one fastbox hands its boxes back with
/// the message's bytes still where the next messages' sequence words go, so a byte
/// pattern can pass for a message that was never sent.
#[cfg(loom)]
#[derive(Debug)]
pub enum NoSpanClear {}
#[cfg(loom)]
impl Variant for NoSpanClear {
    const FBOX_CLEAR_SPAN: bool = false;
}

/// Broken: queue cells are delivered without waiting for an earlier fastbox message.
#[cfg(loom)]
#[derive(Debug)]
pub enum NoSeqCheck {}
#[cfg(loom)]
impl Variant for NoSeqCheck {
    const SEQ_CHECK: bool = false;
}

/// Broken: the sleeper goes to sleep without looking for work after announcing it.
#[cfg(loom)]
#[derive(Debug)]
pub enum NoWakeRecheck {}
#[cfg(loom)]
impl Variant for NoWakeRecheck {
    const WAKE_RECHECK: bool = false;
}

/// Broken: the sleeper's look for work passes over a lap's mark, so a message that
/// follows one and whose doorbell rang before the sleeper announced itself is missed.
#[cfg(loom)]
#[derive(Debug)]
pub enum BlindToLapMarks {}
#[cfg(loom)]
impl Variant for BlindToLapMarks {
    const WAKE_SEES_LAP_MARKS: bool = false;
}

/// Broken: a sender wakes a futex sleeper but not a process that watches its wake
/// socket.
#[cfg(loom)]
#[derive(Debug)]
pub enum NoWatcherWake {}
#[cfg(loom)]
impl Variant for NoWatcherWake {
    const WAKE_WATCHERS: bool = false;
}

/// Broken: arrivals at a node barrier are Relaxed, so the last member reads slots it
/// has not synchronised with.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedArrive {}
#[cfg(loom)]
impl Variant for RelaxedArrive {
    const COLL_ARRIVE: Ordering = Ordering::Relaxed;
}

/// Broken: the last arrival at a node barrier loads the generation word and stores the
/// next, so a sleeper announcing in between is neither seen nor woken.
#[cfg(loom)]
#[derive(Debug)]
pub enum PlainRelease {}
#[cfg(loom)]
impl Variant for PlainRelease {
    const COLL_RELEASE_RMW: bool = false;
}

/// Broken: the sender of a copy ring publishes a slot with a Relaxed store, so the
/// receiver may copy the slot out before its contents.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedRing {}
#[cfg(loom)]
impl Variant for RelaxedRing {
    const RING_PUBLISH: Ordering = Ordering::Relaxed;
}

/// Broken: the receiver of a copy ring empties a slot with a Relaxed store, so the
/// sender may refill it while the receiver still reads it.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedRingReturn {}
#[cfg(loom)]
impl Variant for RelaxedRingReturn {
    const RING_RETURN: Ordering = Ordering::Relaxed;
}

/// Broken: the sender through a pair buffer publishes its bytes with a Relaxed store, so
/// the receiver may copy them out before they land.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedPairPublish {}
#[cfg(loom)]
impl Variant for RelaxedPairPublish {
    const PAIR_PUBLISH: Ordering = Ordering::Relaxed;
}

/// Broken: the receiver frees a pair buffer with a Relaxed store, so the next claimer
/// may write it while the receiver still reads it.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedPairRelease {}
#[cfg(loom)]
impl Variant for RelaxedPairRelease {
    const PAIR_RELEASE: Ordering = Ordering::Relaxed;
}

/// Broken: a window's lock is released with Relaxed increments, so the next holder may
/// read the window before the last holder's writes.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedLockRelease {}
#[cfg(loom)]
impl Variant for RelaxedLockRelease {
    const RMA_LOCK_RELEASE: Ordering = Ordering::Relaxed;
}

/// Broken: a reader of a counter-word lock goes in whatever the writers' fields say,
/// so it may read while a writer writes.
#[cfg(loom)]
#[derive(Debug)]
pub enum BlindReader {}
#[cfg(loom)]
impl Variant for BlindReader {
    const RMA_COUNTER_READER_DEFERS: bool = false;
}

/// Broken: post and complete count with Relaxed increments, so a target may read its
/// window before an origin's puts, or an origin write it before the target's post.
#[cfg(loom)]
#[derive(Debug)]
pub enum RelaxedPscw {}
#[cfg(loom)]
impl Variant for RelaxedPscw {
    const RMA_PSCW_PUBLISH: Ordering = Ordering::Relaxed;
}

/// Broken: an element update loads the word and stores the result, so two concurrent
/// updates can lose one.
#[cfg(loom)]
#[derive(Debug)]
pub enum LoadStoreUpdate {}
#[cfg(loom)]
impl Variant for LoadStoreUpdate {
    const RMA_ATOMIC_RMW: bool = false;
}
