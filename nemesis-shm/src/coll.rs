//! Collectives among the processes of one node, in shared memory.
//!
//! A [`Block`] serves one communicator whose members all share the node: a barrier
//! (a counter of arrivals and a generation that the last arrival advances), and a data
//! slot per member through which a small reduction is exchanged in a single barrier.
//! Slots are double-buffered by the parity of the generation: a member can run at most
//! one episode ahead of the slowest, so it never overwrites what another still reads.
//!
//! Waiters spin on the generation, then sleep on it as a futex. The generation word's
//! bit 0 says someone sleeps; arrivals and sleepers both change the word with RMWs, so
//! they are totally ordered and no wake-up is lost (as with the doorbells).

use crate::futex::Futex;
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, UnsafeCell};
use crate::variant::{Sound, Variant};
use std::marker::PhantomData;
use std::time::Duration;

/// Bytes of data one member can contribute to a node reduction.
pub const SLOT_BYTES: usize = 256;
/// Words of one slot: its signature, its length, then the data.
pub const SLOT_WORDS: usize = 2 + SLOT_BYTES / 8;
/// Blocks in a segment. Block 0 serves the world; the others are claimed by
/// communicators made later.
pub const BLOCKS: usize = 8;

const SLEEPING: u32 = 1;
const STEP: u32 = 2;

/// Who uses a block; cold, written when communicators come and go.
#[derive(Debug, Default)]
#[repr(C)]
struct Claim {
    /// Zero when free, else the key of the communicator that claimed it.
    owner: AtomicU64,
    /// Members that have not let it go yet.
    users: AtomicU32,
}

/// The shared head of a block. All zeroes is a free block.
#[derive(Debug, Default)]
#[repr(C)]
pub struct CollHead {
    claim: CachePadded<Claim>,
    /// Arrivals at the current barrier.
    arrived: CachePadded<AtomicU32>,
    /// The generation, shifted left by one; bit 0 is set while someone sleeps.
    gate: CachePadded<Futex>,
}

/// One block, seen from a member: its head and its slots, for up to `max` members.
#[derive(Debug)]
pub struct Block<'a, V: Variant = Sound> {
    head: &'a CollHead,
    words: &'a [UnsafeCell<u64>],
    max: usize,
    _v: PhantomData<V>,
}

impl<V: Variant> Clone for Block<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V: Variant> Copy for Block<'_, V> {}

/// Words of the slots of a block for `max` members.
pub const fn slot_words(max: usize) -> usize {
    2 * max * SLOT_WORDS
}

impl<'a> Block<'a> {
    /// A view of `head` and its slot words, for up to `max` members.
    ///
    /// # Panics
    /// If `words` is not `slot_words(max)` long: a layout bug, not an input.
    pub fn new(head: &'a CollHead, words: &'a [UnsafeCell<u64>], max: usize) -> Self {
        Self::with_variant(head, words, max)
    }
}

impl<'a, V: Variant> Block<'a, V> {
    /// As [`Block::new`], running the protocol variant `V`.
    pub fn with_variant(head: &'a CollHead, words: &'a [UnsafeCell<u64>], max: usize) -> Self {
        assert_eq!(words.len(), slot_words(max), "slot area of a collective block");
        Self {
            head,
            words,
            max,
            _v: PhantomData,
        }
    }

    /// Members the block has room for.
    pub fn capacity(&self) -> usize {
        self.max
    }

    /// Claims a free block for the communicator `key` (not zero) of `users` members,
    /// which join with [`Block::generation`] after learning of the claim.
    pub fn try_claim(&self, key: u64, users: u32) -> bool {
        debug_assert_ne!(key, 0);
        if self
            .head
            .claim
            .owner
            .compare_exchange(0, key, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.head.claim.users.store(users, Ordering::Relaxed);
        self.head.arrived.store(0, Ordering::Relaxed);
        // Publishes the resets to the members, who learn of the claim later through a
        // message that is itself ordered after this.
        self.head.claim.owner.store(key, Ordering::Release);
        true
    }

    /// Whether the block is claimed by `key`.
    pub fn owned_by(&self, key: u64) -> bool {
        self.head.claim.owner.load(Ordering::Acquire) == key
    }

    /// Lets the block go for one member; the last frees it. Returns whether it did.
    pub fn leave(&self) -> bool {
        if self.head.claim.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.head.claim.owner.store(0, Ordering::Release);
            return true;
        }
        false
    }

    /// The current generation: what a member joining now expects to see advance.
    pub fn generation(&self) -> u32 {
        self.head.gate.load(Ordering::Acquire) >> 1
    }

    /// Arrives at the barrier of generation `epoch` of `n` members. Returns true if this
    /// was the last arrival, which released the others.
    pub fn arrive(&self, n: u32) -> bool {
        let a = self.head.arrived.fetch_add(1, V::COLL_ARRIVE) + 1;
        if a < n {
            return false;
        }
        // Nobody arrives at the next barrier before seeing the generation advance, which
        // the RMW below publishes after this reset.
        self.head.arrived.store(0, Ordering::Relaxed);
        let mut old = self.head.gate.load(Ordering::Relaxed);
        if !V::COLL_RELEASE_RMW {
            self.head
                .gate
                .store((old & !SLEEPING).wrapping_add(STEP), Ordering::Release);
            if old & SLEEPING != 0 {
                self.head.gate.wake(u32::MAX);
            }
            return true;
        }
        loop {
            let new = (old & !SLEEPING).wrapping_add(STEP);
            match self
                .head
                .gate
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        if old & SLEEPING != 0 {
            self.head.gate.wake(u32::MAX);
        }
        true
    }

    /// Whether the barrier of generation `epoch` has released its members.
    #[inline]
    pub fn passed(&self, epoch: u32) -> bool {
        self.head.gate.load(Ordering::Acquire) >> 1 != epoch & (u32::MAX >> 1)
    }

    /// Sleeps until the barrier of generation `epoch` releases, or `timeout` passes.
    /// Spurious returns are possible.
    pub fn sleep(&self, epoch: u32, timeout: Option<Duration>) {
        let token = self.head.gate.fetch_or(SLEEPING, Ordering::AcqRel) | SLEEPING;
        if token >> 1 != epoch & (u32::MAX >> 1) {
            return;
        }
        self.head.gate.wait(token, timeout);
    }

    fn slot(self, epoch: u32, member: usize) -> &'a [UnsafeCell<u64>] {
        assert!(member < self.max, "member {member} of a block for {}", self.max);
        let start = ((epoch as usize & 1) * self.max + member) * SLOT_WORDS;
        &self.words[start..start + SLOT_WORDS]
    }

    /// Writes `member`'s contribution to the episode of generation `epoch`, before it
    /// arrives: a signature the others check, and up to [`SLOT_BYTES`] of data.
    ///
    /// # Panics
    /// If `data` is longer than a slot, or `member` is out of range.
    pub fn write_slot(&self, epoch: u32, member: usize, sig: u64, data: &[u8]) {
        assert!(
            data.len() <= SLOT_BYTES,
            "{} bytes for a slot of {SLOT_BYTES}",
            data.len()
        );
        let slot = self.slot(epoch, member);
        // Only `member` writes its slot, and only between the barrier that let everyone
        // finish reading this parity and its own next arrival.
        put(&slot[0], sig);
        put(&slot[1], data.len() as u64);
        for (w, chunk) in slot[2..].iter().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            put(w, u64::from_le_bytes(b));
        }
    }

    /// Reads `member`'s contribution to the episode of generation `epoch`, after the
    /// barrier released: its signature, and its data into the front of `out`. Returns
    /// the signature and the length it wrote, which may differ from `out`'s.
    pub fn read_slot(&self, epoch: u32, member: usize, out: &mut [u8]) -> (u64, usize) {
        let slot = self.slot(epoch, member);
        // The writer finished before it arrived, and the barrier's release ordered that
        // before this read; nobody writes this parity again until every member has
        // arrived once more, after reading.
        let sig = get(&slot[0]);
        let len = get(&slot[1]) as usize;
        let n = len.min(out.len()).min(SLOT_BYTES);
        for (w, chunk) in slot[2..].iter().zip(out[..n].chunks_mut(8)) {
            chunk.copy_from_slice(&get(w).to_le_bytes()[..chunk.len()]);
        }
        (sig, len)
    }
}

/// Writes a slot word; callers keep to the protocol in the module documentation.
#[inline(always)]
fn put(w: &UnsafeCell<u64>, v: u64) {
    // SAFETY: the slot protocol gives a word one writer, and orders its write by the
    // barrier before any read and after every earlier read of the same parity.
    w.with_mut(|p| unsafe { *p = v });
}

/// Reads a slot word; callers keep to the protocol in the module documentation.
#[inline(always)]
fn get(w: &UnsafeCell<u64>) -> u64 {
    // SAFETY: as in `put`: no write to this word can be concurrent with the read.
    w.with(|p| unsafe { *p })
}

/// A block on the heap, for the loom models and tests.
#[derive(Debug)]
pub struct HeapBlock {
    head: CollHead,
    words: Vec<UnsafeCell<u64>>,
    max: usize,
}

// SAFETY: the slot words are only touched through `Block`, whose protocol gives each
// word one writer at a time, ordered by the barrier before any reader (see the module
// documentation); the rest are atomics.
unsafe impl Sync for HeapBlock {}
// SAFETY: as for `Sync`; nothing in it is tied to a thread.
unsafe impl Send for HeapBlock {}

impl HeapBlock {
    /// A free block for up to `max` members.
    pub fn new(max: usize) -> Self {
        Self {
            head: CollHead::default(),
            words: (0..slot_words(max)).map(|_| UnsafeCell::new(0)).collect(),
            max,
        }
    }

    /// Its view.
    pub fn block(&self) -> Block<'_> {
        Block::new(&self.head, &self.words, self.max)
    }

    /// Its view, running the protocol variant `V`.
    pub fn block_with<V: Variant>(&self) -> Block<'_, V> {
        Block::with_variant(&self.head, &self.words, self.max)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Runs `f(member)` for `n` members on threads.
    fn members<T: Send + 'static>(
        n: usize,
        f: impl Fn(Block<'_>, usize) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let hb = Arc::new(HeapBlock::new(n));
        let f = Arc::new(f);
        let hs: Vec<_> = (0..n)
            .map(|m| {
                let (hb, f) = (hb.clone(), f.clone());
                std::thread::spawn(move || f(hb.block(), m))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn wait(b: Block<'_>, epoch: u32) {
        let mut spins = 0;
        while !b.passed(epoch) {
            spins += 1;
            if spins > 1000 {
                b.sleep(epoch, Some(Duration::from_millis(10)));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    #[test]
    fn nobody_leaves_a_barrier_before_everyone_arrived() {
        let count = Arc::new(AtomicU32::new(0));
        let c = count.clone();
        members(4, move |b, _| {
            let mut epoch = b.generation();
            for round in 1..=200u32 {
                c.fetch_add(1, Ordering::SeqCst);
                if !b.arrive(4) {
                    wait(b, epoch);
                }
                epoch = epoch.wrapping_add(1);
                assert!(c.load(Ordering::SeqCst) >= 4 * round, "left round {round} early");
                // A second barrier so nobody counts the next round before all checked.
                if !b.arrive(4) {
                    wait(b, epoch);
                }
                epoch = epoch.wrapping_add(1);
            }
        });
    }

    #[test]
    fn slots_carry_every_members_data_through_one_barrier() {
        let got = members(3, |b, m| {
            let mut epoch = b.generation();
            let mut sums = Vec::new();
            for round in 0..100u64 {
                let mine = (m as u64 + 1) * 1000 + round;
                b.write_slot(epoch, m, round, &mine.to_le_bytes());
                if !b.arrive(3) {
                    wait(b, epoch);
                }
                let mut sum = 0;
                for other in 0..3 {
                    let mut v = [0u8; 8];
                    let (sig, len) = b.read_slot(epoch, other, &mut v);
                    assert_eq!((sig, len), (round, 8));
                    sum += u64::from_le_bytes(v);
                }
                sums.push(sum);
                epoch = epoch.wrapping_add(1);
            }
            sums
        });
        let want: Vec<u64> = (0..100).map(|r| 6000 + 3 * r).collect();
        assert!(got.iter().all(|s| *s == want));
    }

    #[test]
    fn a_block_is_claimed_once_and_freed_by_its_last_user() {
        let hb = HeapBlock::new(2);
        let b = hb.block();
        assert!(b.try_claim(7, 2));
        assert!(!b.try_claim(8, 1));
        assert!(b.owned_by(7));
        assert!(!b.leave());
        assert!(b.leave());
        assert!(b.try_claim(8, 1));
    }

    #[test]
    fn odd_lengths_round_trip_and_short_buffers_get_a_prefix() {
        let hb = HeapBlock::new(1);
        let b = hb.block();
        let data: Vec<u8> = (0..SLOT_BYTES).map(|i| i as u8).collect();
        for len in [0, 1, 7, 9, 255, 256] {
            b.write_slot(0, 0, 5, &data[..len]);
            let mut out = vec![0u8; len];
            assert_eq!(b.read_slot(0, 0, &mut out), (5, len));
            assert_eq!(out, data[..len]);
        }
        let mut short = [0u8; 3];
        assert_eq!(b.read_slot(0, 0, &mut short), (5, 256));
        assert_eq!(short, [0, 1, 2]);
    }

    #[test]
    fn a_sleeper_is_woken_by_the_last_arrival() {
        let hb = Arc::new(HeapBlock::new(2));
        let h2 = hb.clone();
        let epoch = hb.block().generation();
        let t = std::thread::spawn(move || {
            let b = h2.block();
            if !b.arrive(2) {
                while !b.passed(epoch) {
                    b.sleep(epoch, Some(Duration::from_secs(30)));
                }
            }
        });
        std::thread::sleep(Duration::from_millis(30));
        let start = std::time::Instant::now();
        if !hb.block().arrive(2) {
            wait(hb.block(), epoch);
        }
        t.join().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sleeper was not woken"
        );
    }
}
