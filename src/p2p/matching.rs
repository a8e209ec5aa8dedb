//! MPI's matching: the posted receives and the unexpected messages, each searched in
//! the order it was made, so that messages between a pair never overtake each other.

use super::wire::Rts;
use std::collections::VecDeque;

/// Whether a receive of (`ctx`, `src`, `tag`) selects a message of (`p_ctx`, `p_src`,
/// `p_tag`); `None` is a wildcard.
#[inline(always)]
pub(crate) fn selected(
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
    p_ctx: u32,
    p_src: u32,
    p_tag: i32,
) -> bool {
    ctx == p_ctx && src.is_none_or(|s| s == p_src) && tag.is_none_or(|t| t == p_tag)
}

/// A receive waiting for its message.
#[derive(Debug)]
pub(crate) struct Posted {
    pub id: u32,
    pub ctx: u32,
    pub src: Option<u32>,
    pub tag: Option<i32>,
}

/// What an unexpected message carries.
#[derive(Debug)]
pub(crate) enum Body {
    Eager(Vec<u8>),
    Rts(Rts),
}

/// A message that arrived before a receive selected it.
#[derive(Debug)]
pub(crate) struct Unexpected {
    pub src: u32,
    pub ctx: u32,
    pub tag: i32,
    pub body: Body,
}

impl Unexpected {
    pub(crate) fn len(&self) -> usize {
        match &self.body {
            Body::Eager(d) => d.len(),
            Body::Rts(r) => r.total,
        }
    }
}

/// The two queues.
#[derive(Debug, Default)]
pub(crate) struct Matching {
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
}

impl Matching {
    /// Whether a blocking receive of (`ctx`, `src`, `tag`) may match fresh packets
    /// directly: nothing is posted before it, and nothing waiting matches it.
    #[inline(always)]
    pub(crate) fn bypass(&self, ctx: u32, src: Option<u32>, tag: Option<i32>) -> bool {
        self.posted.is_empty() && (self.unexpected.is_empty() || !self.waits_for(ctx, src, tag))
    }

    /// Whether an unexpected message waits that a receive of (`ctx`, `src`, `tag`)
    /// selects. Out of line, so that the common case (none waits) does not prepare the
    /// search's arguments in memory.
    #[inline(never)]
    fn waits_for(&self, ctx: u32, src: Option<u32>, tag: Option<i32>) -> bool {
        self.unexpected
            .iter()
            .any(|u| selected(ctx, src, tag, u.ctx, u.src, u.tag))
    }

    /// Whether nothing is posted and nothing waits unexpected.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queued() == 0
    }

    /// Nought when nothing is posted and nothing waits unexpected: the two lengths
    /// or-ed, so that the test is one branch.
    #[inline(always)]
    pub(crate) fn queued(&self) -> usize {
        self.posted.len() | self.unexpected.len()
    }

    /// Takes the earliest posted receive that selects a message of (`ctx`, `src`, `tag`).
    #[inline]
    pub(crate) fn take_posted(&mut self, ctx: u32, src: u32, tag: i32) -> Option<Posted> {
        let first = self.posted.front()?;
        if selected(first.ctx, first.src, first.tag, ctx, src, tag) {
            // Streams match their receives in the order they were posted.
            return self.posted.pop_front();
        }
        let i = self
            .posted
            .iter()
            .position(|q| selected(q.ctx, q.src, q.tag, ctx, src, tag))?;
        self.posted.remove(i)
    }

    /// Takes the earliest unexpected message that a receive of (`ctx`, `src`, `tag`)
    /// selects.
    #[inline]
    pub(crate) fn take_unexpected(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
    ) -> Option<Unexpected> {
        if self.unexpected.is_empty() {
            return None;
        }
        let i = self
            .unexpected
            .iter()
            .position(|u| selected(ctx, src, tag, u.ctx, u.src, u.tag))?;
        self.unexpected.remove(i)
    }

    /// The earliest unexpected message that a receive of (`ctx`, `src`, `tag`) selects.
    pub(crate) fn peek_unexpected(
        &self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
    ) -> Option<&Unexpected> {
        self.unexpected
            .iter()
            .find(|u| selected(ctx, src, tag, u.ctx, u.src, u.tag))
    }

    #[inline]
    pub(crate) fn post(&mut self, p: Posted) {
        self.posted.push_back(p);
    }

    pub(crate) fn arrived(&mut self, u: Unexpected) {
        self.unexpected.push_back(u);
    }

    /// Withdraws posted receive `id`; says whether it was posted.
    pub(crate) fn cancel(&mut self, id: u32) -> bool {
        match self.posted.iter().position(|q| q.id == id) {
            Some(i) => {
                self.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// Takes the in-place offer (CMA, RDMA) out of the unexpected RTS of `src`'s send
    /// `send_id`, if there is one; says whether there was.
    pub(crate) fn revoke(&mut self, src: u32, send_id: u32) -> bool {
        for u in self.unexpected.iter_mut() {
            if let Body::Rts(r) = &mut u.body
                && u.src == src
                && r.send_id == send_id
            {
                r.offered = r.offered.without_in_place();
                r.cookie.clear();
                return true;
            }
        }
        false
    }
}
