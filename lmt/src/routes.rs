//! The strategies towards every peer a channel reaches, behind one [`Lmt`]: those of
//! the node ([`LocalLmt`]) for its processes, RDMA read ([`crate::rdma`]) for the others
//! when the network module offers it, and chunks for what neither carries.

use crate::{Lmt, LmtError, LocalLmt, Offer, Policy, RegCache, Seg, Strategies, Strategy, Xfer, rdma};
use nemesis_net::rdma::Rdma;

/// A channel's large-message strategies for one call of the layer above, borrowed from
/// the parts that own them.
pub struct Routes<'a> {
    local: Option<&'a mut LocalLmt>,
    rdma: Option<&'a mut dyn Rdma>,
    cache: Option<&'a mut RegCache>,
    policy: Policy,
}

impl std::fmt::Debug for Routes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("local", &self.local.is_some())
            .field("rdma", &self.rdma.is_some())
            .finish()
    }
}

impl<'a> Routes<'a> {
    /// The node's strategies `local` and, to other nodes, RDMA through `rdma`, keeping
    /// registrations of pinned buffers in `cache`; both follow the local strategies'
    /// policy (`NEMESIS_LMT`, `NEMESIS_LMT_RDMA_MIN`).
    pub fn new(
        local: Option<&'a mut LocalLmt>,
        rdma: Option<&'a mut dyn Rdma>,
        cache: Option<&'a mut RegCache>,
    ) -> Self {
        let policy = local.as_ref().map(|l| l.policy()).unwrap_or_default();
        Self {
            local,
            rdma,
            cache,
            policy,
        }
    }

    /// Only chunks: a channel with no strategy of its own.
    pub fn none() -> Self {
        Self {
            local: None,
            rdma: None,
            cache: None,
            policy: Policy::default(),
        }
    }

    /// The strategy the policy forces on every large message (`NEMESIS_LMT` naming one,
    /// or set by [`LocalLmt::set_policy`]), if it does.
    pub fn forced(&self) -> Option<Strategy> {
        self.policy.force
    }

    /// From how many bytes a message to another node goes by RDMA read of itself (not
    /// forced), if the netmod offers RDMA: the layer above sends smaller ones eagerly,
    /// and no larger ones.
    pub fn rdma_threshold(&self) -> Option<usize> {
        match (self.rdma.is_some(), self.policy.force) {
            (true, None) => self.policy.rdma_min,
            _ => None,
        }
    }

    fn is_local(&self, peer: u32) -> bool {
        self.local.as_ref().is_some_and(|l| l.is_local(peer))
    }

    fn unavailable(peer: u32, s: Strategy) -> LmtError {
        LmtError::BadCookie {
            peer,
            why: format!("{s} is not available to this peer on this channel"),
        }
    }
}

impl Lmt for Routes<'_> {
    fn offer(&mut self, peer: u32, src: &[Seg], len: usize, cookie: &mut Vec<u8>) -> Offer {
        if self.is_local(peer) {
            return match self.local.as_deref_mut() {
                Some(l) => l.offer(peer, src, len, cookie),
                None => Offer::CHUNKS,
            };
        }
        match self.rdma.as_deref_mut() {
            Some(r) if self.policy.rdma_for(len) => {
                match rdma::offer(r, self.cache.as_deref_mut(), peer, src, len, cookie) {
                    Some(x) => Offer {
                        strategies: Strategies::CHUNKS.with(Strategy::Rdma),
                        held: Some(x),
                    },
                    None => Offer::CHUNKS,
                }
            }
            _ => Offer::CHUNKS,
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
        if self.is_local(peer) {
            return match self.local.as_deref_mut() {
                Some(l) => l.choose(peer, len, offered, rts_cookie, dst),
                None => Strategy::Chunks,
            };
        }
        // The sender applied the size threshold; a forced other strategy says chunks.
        let forced_other = self.policy.force.is_some_and(|s| s != Strategy::Rdma);
        if offered.has(Strategy::Rdma) && self.rdma.is_some() && !forced_other {
            Strategy::Rdma
        } else {
            Strategy::Chunks
        }
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
        match (strategy, self.rdma.as_deref_mut(), self.local.as_deref_mut()) {
            (Strategy::Rdma, Some(r), _) => {
                rdma::start_recv(r, self.cache.as_deref_mut(), peer, rts_cookie, total, cap, dst)
            }
            (Strategy::Rdma, None, _) | (_, _, None) => Err(Self::unavailable(peer, strategy)),
            (_, _, Some(l)) => l.start_recv(peer, strategy, rts_cookie, total, cap, dst, cts_cookie),
        }
    }

    fn start_send(
        &mut self,
        peer: u32,
        strategy: Strategy,
        cts_cookie: &[u8],
        total: usize,
    ) -> Result<Xfer, LmtError> {
        match (strategy, self.local.as_deref_mut()) {
            (Strategy::Rdma, _) | (_, None) => Err(Self::unavailable(peer, strategy)),
            (_, Some(l)) => l.start_send(peer, strategy, cts_cookie, total),
        }
    }

    unsafe fn progress(&mut self, x: &mut Xfer, bufs: &[Seg]) -> Result<bool, LmtError> {
        match (x.strategy, self.rdma.as_deref_mut(), self.local.as_deref_mut()) {
            // SAFETY: the caller's contract, passed on.
            (Strategy::Rdma, Some(r), _) => unsafe { rdma::progress(r, x, bufs) },
            (Strategy::Rdma, None, _) | (_, _, None) => Err(Self::unavailable(x.peer, x.strategy)),
            // SAFETY: as above.
            (_, _, Some(l)) => unsafe { l.progress(x, bufs) },
        }
    }

    fn end(&mut self, x: &Xfer) {
        match (x.strategy, self.rdma.as_deref_mut(), self.local.as_deref_mut()) {
            (Strategy::Rdma, Some(r), _) => rdma::end(r, x),
            (Strategy::Rdma, None, _) | (_, _, None) => {}
            (_, _, Some(l)) => l.end(x),
        }
    }

    fn peer_terminated(&mut self, peer: u32) {
        if let Some(l) = self.local.as_deref_mut() {
            l.peer_terminated(peer);
        }
    }
}
