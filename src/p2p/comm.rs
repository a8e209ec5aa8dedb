//! Communicators: a group of ranks with a matching context of their own.
//!
//! Every communicator has two contexts: an even one for user messages and the odd one
//! after it for its collectives, so neither can match the other's messages, and no
//! message of one communicator can match a receive on another.

use super::P2pError;
use super::node::NodeColl;
use std::sync::Arc;

/// Marks a rank that is not in the communicator in `of_world`.
const NONE: u32 = u32::MAX;

/// A group of ranks that communicate in their own context. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Comm {
    pub(crate) inner: Arc<CommInner>,
}

#[derive(Debug)]
pub(crate) struct CommInner {
    /// The world this communicator belongs to.
    pub world: u64,
    /// Context of user messages; collectives use `ctx + 1`.
    pub ctx: u32,
    /// Communicator rank to world rank.
    pub ranks: Vec<u32>,
    /// World rank to communicator rank, or `NONE`.
    pub of_world: Vec<u32>,
    /// Our rank in the communicator.
    pub rank: u32,
    /// Whether every member shares this node.
    pub all_local: bool,
    /// Whether communicator ranks are world ranks (the world communicator).
    pub identity: bool,
    /// The node block its collectives meet in, when every member shares the node.
    pub node: Option<NodeColl>,
    /// Whether its small collectives through messages go through rank 0, once the
    /// members have agreed (`World::flat`).
    pub flat: std::sync::OnceLock<bool>,
}

impl Comm {
    pub(crate) fn new(
        world: u64,
        ctx: u32,
        ranks: Vec<u32>,
        me_world: u32,
        world_size: u32,
        all_local: bool,
        node: Option<NodeColl>,
    ) -> Self {
        let mut of_world = vec![NONE; world_size as usize];
        for (i, &r) in ranks.iter().enumerate() {
            of_world[r as usize] = i as u32;
        }
        let rank = of_world[me_world as usize];
        debug_assert_ne!(rank, NONE, "we are a member");
        let identity =
            ranks.len() == world_size as usize && ranks.iter().enumerate().all(|(i, &r)| i as u32 == r);
        Self {
            inner: Arc::new(CommInner {
                world,
                ctx,
                ranks,
                of_world,
                rank,
                all_local,
                identity,
                node,
                flat: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Our rank in the communicator.
    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> u32 {
        self.inner.ranks.len() as u32
    }

    /// The world rank of communicator rank `r`.
    pub fn world_rank(&self, r: u32) -> Option<u32> {
        self.inner.ranks.get(r as usize).copied()
    }

    /// Whether every member shares this node.
    pub fn all_local(&self) -> bool {
        self.inner.all_local
    }
}

/// A request's communicator. One whose ranks are the world's is not counted: a
/// request on it needs no shared reference, and so no atomic operation to make or drop.
#[derive(Debug, Clone)]
pub(crate) enum ReqComm {
    /// A communicator whose ranks are the world's.
    Identity,
    /// Any other.
    Other(Arc<CommInner>),
}

impl ReqComm {
    #[inline]
    pub fn of(c: &Arc<CommInner>) -> Self {
        if c.identity {
            ReqComm::Identity
        } else {
            ReqComm::Other(c.clone())
        }
    }

    /// The communicator rank of world rank `w`, if a member.
    #[inline]
    pub fn rank_of(&self, w: u32) -> Option<u32> {
        match self {
            ReqComm::Identity => Some(w),
            ReqComm::Other(c) => c.rank_of(w),
        }
    }

    /// The communicator itself, or `None` for the world's ranks.
    pub fn inner(&self) -> Option<&Arc<CommInner>> {
        match self {
            ReqComm::Identity => None,
            ReqComm::Other(c) => Some(c),
        }
    }
}

impl CommInner {
    /// This member's place, as the node block knows it.
    pub(crate) fn seat(&self) -> super::node::Seat {
        super::node::Seat {
            rank: self.rank,
            size: self.ranks.len() as u32,
        }
    }

    /// The world rank of member `r`, or an error naming it.
    #[inline]
    pub fn world_of(&self, r: u32) -> Result<u32, P2pError> {
        // A match, not `ok_or`: the error is built only when it is returned.
        match self.ranks.get(r as usize) {
            Some(&w) => Ok(w),
            None => Err(P2pError::InvalidRank {
                rank: r,
                size: self.ranks.len() as u32,
            }),
        }
    }

    /// The communicator rank of world rank `w`, which a matched message came from, so
    /// is a member.
    #[inline(always)]
    pub fn member(&self, w: u32) -> u32 {
        if self.identity {
            w
        } else {
            self.rank_of(w).unwrap_or(w)
        }
    }

    /// The communicator rank of world rank `w`, if a member.
    #[inline]
    pub fn rank_of(&self, w: u32) -> Option<u32> {
        self.of_world.get(w as usize).copied().filter(|&r| r != NONE)
    }
}
