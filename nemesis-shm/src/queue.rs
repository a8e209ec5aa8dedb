//! The Nemesis lock-free MPSC queue, used both as a receive queue and as a free queue.
//!
//! Elements are cells named by a handle, `index + 1`, so 0 means "none" and no pointer
//! ever lives in shared memory. Producers are wait-free: one swap on the tail and one
//! store. The single consumer keeps a private shadow head, so while the queue is
//! non-empty it touches the shared head line once per batch, not once per element.

use crate::sync::{self, AtomicU32, Ordering};
use crate::variant::Variant;

/// The shared part of a queue: written by producers and cleared by the consumer.
#[derive(Debug, Default)]
#[repr(C)]
pub struct QueueShared {
    head: AtomicU32,
    tail: AtomicU32,
}

impl QueueShared {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Finds the link word of a cell.
pub trait Links {
    /// The `next` word of the cell with this handle (`index + 1`, never 0).
    fn link(&self, handle: u32) -> &AtomicU32;
}

/// The consumer's private state: the shadow head.
#[derive(Debug, Default)]
pub struct Consumer {
    shadow: u32,
}

/// What a dequeue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pop {
    /// The queue is empty.
    Empty,
    /// The head element's successor is being linked by a producer that has swapped the
    /// tail but not yet stored the link. The element stays at the head; try again later.
    Busy,
    /// The handle of the dequeued cell, which now belongs to the caller.
    Got(u32),
}

/// How many times the consumer re-reads a missing link before yielding once and then
/// reporting [`Pop::Busy`].
#[cfg(not(loom))]
const LINK_SPINS: u32 = 64;
#[cfg(loom)]
const LINK_SPINS: u32 = 1;

/// Appends the cell `handle`, which the caller owns, to the queue.
#[inline]
pub fn enqueue<V: Variant>(q: &QueueShared, links: &impl Links, handle: u32) {
    debug_assert_ne!(handle, 0);
    // The cell is still ours, so a relaxed reset is published by the swap below.
    links.link(handle).store(0, Ordering::Relaxed);
    let prev = q.tail.swap(handle, V::TAIL_SWAP);
    if prev == 0 {
        q.head.store(handle, V::HEAD_STORE);
    } else {
        links.link(prev).store(handle, V::LINK_STORE);
    }
}

impl Consumer {
    /// A consumer of an empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// The element at the head, if any, without removing it. Its contents are visible.
    #[inline]
    pub fn peek(&mut self, q: &QueueShared) -> Option<u32> {
        if self.shadow == 0 {
            let head = q.head.load(Ordering::Acquire);
            if head == 0 {
                return None;
            }
            self.shadow = head;
            // No producer stores `head` again until our CAS empties the tail, which is
            // ordered after this store.
            q.head.store(0, Ordering::Relaxed);
        }
        Some(self.shadow)
    }

    /// Whether the queue holds anything, as far as the consumer can tell right now.
    #[inline]
    pub fn is_empty(&self, q: &QueueShared) -> bool {
        // One test of both, not two: a poll asks this every time, and the load of the
        // head costs no more than the branch it would skip.
        (self.shadow | q.head.load(Ordering::Acquire)) == 0
    }

    /// Removes the head element.
    #[inline]
    pub fn pop<V: Variant>(&mut self, q: &QueueShared, links: &impl Links) -> Pop {
        let Some(e) = self.peek(q) else {
            return Pop::Empty;
        };
        let next = links.link(e).load(Ordering::Acquire);
        if next != 0 {
            self.shadow = next;
            return Pop::Got(e);
        }
        // `e` looks like the last element. Empty the queue only if no producer has
        // swapped the tail since; otherwise one is about to link e's successor.
        if V::TAIL_CAS {
            if q.tail
                .compare_exchange(e, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.shadow = 0;
                return Pop::Got(e);
            }
        } else {
            q.tail.store(0, Ordering::Release);
            self.shadow = 0;
            return Pop::Got(e);
        }
        for _ in 0..LINK_SPINS {
            sync::spin_hint();
            let next = links.link(e).load(Ordering::Acquire);
            if next != 0 {
                self.shadow = next;
                return Pop::Got(e);
            }
        }
        sync::yield_now();
        let next = links.link(e).load(Ordering::Acquire);
        if next != 0 {
            self.shadow = next;
            return Pop::Got(e);
        }
        Pop::Busy
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::variant::Sound;
    use std::sync::Arc;

    struct Arena(Vec<AtomicU32>);
    impl Links for Arena {
        fn link(&self, handle: u32) -> &AtomicU32 {
            &self.0[handle as usize - 1]
        }
    }

    fn arena(n: usize) -> Arena {
        Arena((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    #[test]
    fn fifo_and_empty_transitions() {
        let a = arena(8);
        let q = QueueShared::new();
        let mut c = Consumer::new();
        assert_eq!(c.pop::<Sound>(&q, &a), Pop::Empty);
        for round in 0..3 {
            for h in 1..=8 {
                enqueue::<Sound>(&q, &a, h);
            }
            assert!(!c.is_empty(&q), "round {round}");
            for h in 1..=8 {
                assert_eq!(c.peek(&q), Some(h));
                assert_eq!(c.pop::<Sound>(&q, &a), Pop::Got(h));
            }
            assert!(c.is_empty(&q));
            assert_eq!(c.pop::<Sound>(&q, &a), Pop::Empty);
        }
    }

    #[test]
    fn busy_while_link_missing_then_recovers() {
        let a = arena(4);
        let q = QueueShared::new();
        let mut c = Consumer::new();
        enqueue::<Sound>(&q, &a, 1);
        // A producer that has swapped the tail but not yet linked cell 1 to cell 2.
        let prev = q.tail.swap(2, Ordering::AcqRel);
        assert_eq!(prev, 1);
        assert_eq!(c.pop::<Sound>(&q, &a), Pop::Busy);
        assert_eq!(c.peek(&q), Some(1), "the element stays at the head");
        a.link(1).store(2, Ordering::Release);
        assert_eq!(c.pop::<Sound>(&q, &a), Pop::Got(1));
        assert_eq!(c.pop::<Sound>(&q, &a), Pop::Got(2));
        assert_eq!(c.pop::<Sound>(&q, &a), Pop::Empty);
    }

    #[test]
    fn threads_no_loss_no_duplicate_fifo_per_producer() {
        const PER: u32 = 20_000;
        const PRODUCERS: u32 = 3;
        // Each producer owns a disjoint range of handles and recycles them through a
        // private channel from the consumer, as the free queue does across processes.
        let a = Arc::new(arena((PRODUCERS * 16) as usize));
        let q = Arc::new(QueueShared::new());
        let order = Arc::new((0..PRODUCERS * 16).map(|_| AtomicU32::new(0)).collect::<Vec<_>>());
        let mut returns = Vec::new();
        let mut handles = Vec::new();
        for p in 0..PRODUCERS {
            let (tx, rx) = std::sync::mpsc::channel::<u32>();
            returns.push(tx);
            let (a, q, order) = (a.clone(), q.clone(), order.clone());
            handles.push(std::thread::spawn(move || {
                let mut free: Vec<u32> = (p * 16 + 1..=p * 16 + 16).collect();
                for i in 0..PER {
                    let h = loop {
                        if let Some(h) = free.pop() {
                            break h;
                        }
                        free.push(rx.recv().unwrap());
                    };
                    order[h as usize - 1].store(i, Ordering::Relaxed);
                    enqueue::<Sound>(&q, &*a, h);
                }
            }));
        }
        let mut c = Consumer::new();
        let mut next = vec![0u32; PRODUCERS as usize];
        let mut got = 0;
        while got < PER * PRODUCERS {
            match c.pop::<Sound>(&q, &*a) {
                Pop::Got(h) => {
                    let p = (h - 1) / 16;
                    let i = order[h as usize - 1].load(Ordering::Relaxed);
                    assert_eq!(i, next[p as usize], "producer {p} out of order");
                    next[p as usize] += 1;
                    got += 1;
                    // The producer may already be done; its recycling channel is then gone.
                    let _ = returns[p as usize].send(h);
                }
                Pop::Empty | Pop::Busy => std::hint::spin_loop(),
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.pop::<Sound>(&q, &*a), Pop::Empty);
    }
}
