//! The allocations a peer's sending queue lets go of, kept by the endpoint for the next
//! message: a ping-pong would otherwise allocate and free a queue and a segment's bytes
//! for every message (a fifth of a verbs ud round trip's instructions). What is kept is
//! bounded and made up front, so it is the endpoint's fixed cost, not a peer's: an idle
//! peer still holds no queue.

use std::collections::VecDeque;

/// Segment buffers kept at most.
const BUFS: usize = 4;
/// Segments the kept queue has room for; a larger one given back is shrunk to this.
const QUEUE: usize = 4;

/// Kept for queues of `T`: the peers' segments (a type of its own here, so that the
/// peers' module alone knows what a segment is).
#[derive(Debug)]
pub(super) struct Spare<T> {
    queue: Option<VecDeque<T>>,
    bufs: Vec<Vec<u8>>,
    /// Bytes of a segment's payload at most: the capacity of every kept buffer.
    room: usize,
}

impl<T> Spare<T> {
    /// Spares for segments of at most `room` bytes, made now.
    pub(super) fn new(room: usize) -> Self {
        Self {
            queue: Some(VecDeque::with_capacity(QUEUE)),
            bufs: (0..BUFS).map(|_| Vec::with_capacity(room)).collect(),
            room,
        }
    }

    /// An empty buffer for `n` payload bytes: a kept one if one is large enough.
    pub(super) fn buf(&mut self, n: usize) -> Vec<u8> {
        match self.bufs.pop() {
            Some(b) if b.capacity() >= n => b,
            Some(b) => {
                self.bufs.push(b);
                Vec::with_capacity(n)
            }
            None => Vec::with_capacity(n),
        }
    }

    /// Takes back the buffer of a segment that is done with.
    pub(super) fn give(&mut self, mut b: Vec<u8>) {
        if self.bufs.len() < BUFS && b.capacity() == self.room {
            b.clear();
            self.bufs.push(b);
        }
    }

    /// Gives `q`, a peer's queue about to take a segment, the kept allocation if it
    /// has none.
    pub(super) fn lend_queue(&mut self, q: &mut VecDeque<T>) {
        if q.capacity() == 0
            && let Some(k) = self.queue.take()
        {
            *q = k;
        }
    }

    /// Takes the allocation of `q`, a peer's queue that has just emptied, so that an idle
    /// peer holds none: kept if none is, shrunk to the kept size.
    pub(super) fn take_queue(&mut self, q: &mut VecDeque<T>) {
        let mut q = std::mem::take(q);
        if self.queue.is_none() && q.capacity() > 0 {
            q.clear();
            q.shrink_to(QUEUE);
            self.queue = Some(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_and_a_queue_go_round_and_stay_bounded() {
        let mut s = Spare::<u64>::new(100);
        let b = s.buf(50);
        assert_eq!((b.capacity(), s.bufs.len()), (100, BUFS - 1));
        let big = s.buf(500);
        assert!(big.capacity() >= 500 && s.bufs.len() == BUFS - 1);
        s.give(big);
        assert_eq!(s.bufs.len(), BUFS - 1, "a buffer of another size is not kept");
        s.give(b);
        s.give(Vec::with_capacity(100));
        assert_eq!(s.bufs.len(), BUFS, "never more than BUFS");
        let mut q = VecDeque::new();
        s.lend_queue(&mut q);
        assert!(q.capacity() >= QUEUE && s.queue.is_none());
        let mut other = VecDeque::new();
        s.lend_queue(&mut other);
        assert_eq!(other.capacity(), 0, "one kept queue, lent once");
        q.reserve(1000);
        s.take_queue(&mut q);
        assert_eq!(q.capacity(), 0, "the peer keeps none");
        assert!(s.queue.as_ref().is_some_and(|k| k.capacity() < 1000));
    }
}
