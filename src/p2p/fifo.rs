//! A first-in, first-out queue of small copyable entries on a ring whose size is a power
//! of two, for the posted receives: a stream takes one from the front and puts one at
//! the back for every message, and a mask finds a place where `VecDeque` compares and
//! subtracts on each end.

/// The queue. Entries past `len` are stale copies, never read.
#[derive(Debug)]
pub(crate) struct Fifo<T: Copy + Default> {
    ring: Box<[T]>,
    /// Where the front is, before the mask: it only grows, and wraps with the usize.
    head: usize,
    len: usize,
}

impl<T: Copy + Default> Default for Fifo<T> {
    fn default() -> Self {
        Self {
            ring: Box::default(),
            head: 0,
            len: 0,
        }
    }
}

/// The ring's size at the first entry.
const FIRST: usize = 16;

impl<T: Copy + Default> Fifo<T> {
    #[inline(always)]
    fn slot(&self, i: usize) -> usize {
        // The ring is empty only while `len` is 0, and no caller asks then.
        self.head.wrapping_add(i) & (self.ring.len() - 1)
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The earliest entry.
    #[inline(always)]
    pub(crate) fn front(&self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        Some(&self.ring[self.slot(0)])
    }

    /// Takes the earliest entry.
    #[inline(always)]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.ring[self.slot(0)];
        self.head = self.head.wrapping_add(1);
        self.len -= 1;
        Some(v)
    }

    /// Adds an entry after every other.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, v: T) {
        if self.len == self.ring.len() {
            self.grow();
        }
        let at = self.slot(self.len);
        self.ring[at] = v;
        self.len += 1;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let size = (self.ring.len() * 2).max(FIRST);
        let mut ring = vec![T::default(); size].into_boxed_slice();
        for (i, v) in ring.iter_mut().take(self.len).enumerate() {
            *v = self.ring[self.slot(i)];
        }
        self.ring = ring;
        self.head = 0;
    }

    /// The entries, earliest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.len).map(|i| &self.ring[self.slot(i)])
    }

    /// Takes the entry `i` places from the front; the later ones move up.
    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let v = self.ring[self.slot(i)];
        for j in i..self.len - 1 {
            let (to, from) = (self.slot(j), self.slot(j + 1));
            self.ring[to] = self.ring[from];
        }
        self.len -= 1;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Pop,
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => any::<u32>().prop_map(Op::Push),
            2 => Just(Op::Pop),
            1 => (0usize..40).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Every sequence of operations leaves the same entries, in the same order, as
        /// `VecDeque` does, across growth and wrapping.
        #[test]
        fn behaves_as_a_vecdeque(ops in proptest::collection::vec(op(), 0..300)) {
            let mut f = Fifo::<u32>::default();
            let mut model = VecDeque::new();
            for o in ops {
                match o {
                    Op::Push(v) => {
                        f.push_back(v);
                        model.push_back(v);
                    }
                    Op::Pop => prop_assert_eq!(f.pop_front(), model.pop_front()),
                    Op::Remove(i) => prop_assert_eq!(f.remove(i), model.remove(i)),
                }
                prop_assert_eq!(f.len(), model.len());
                prop_assert_eq!(f.is_empty(), model.is_empty());
                prop_assert_eq!(f.front(), model.front());
                prop_assert!(f.iter().eq(model.iter()));
            }
        }
    }

    #[test]
    fn an_empty_queue_gives_nothing() {
        let mut f = Fifo::<u8>::default();
        assert_eq!(f.pop_front(), None);
        assert_eq!(f.front(), None);
        assert_eq!(f.remove(0), None);
        assert_eq!(f.iter().count(), 0);
        f.push_back(1);
        assert_eq!(f.remove(1), None, "past the end");
        assert_eq!(f.pop_front(), Some(1));
        assert_eq!(f.pop_front(), None);
    }
}
