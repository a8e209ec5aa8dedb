//! Starting sends and receives: the way each message takes (eager, through the pair
//! buffer, as packets, or by rendezvous) and the requests that need one.

use super::World;
use crate::channel::{Channel, Header};
use crate::p2p::comm::CommInner;
use crate::p2p::requests::{Bufs, Holder, RecvReq, Req, SState, SendReq};
use crate::p2p::stream_way::Way;
use crate::p2p::wire::{self, MDATA, MEDIUM, RTS};
use crate::p2p::{Locality, P2pError, Status};
use nemesis_lmt::{Lmt, Seg};
use std::sync::Arc;
use std::time::Instant;

impl<C: Channel> World<C> {
    /// Starts a send of the `len` bytes in `bufs` to member `dest` of `comm`: eager sends
    /// are complete on return (`None`); large ones return the request to wait for,
    /// whose buffer must stay lent until it completes. `owner`, for an owned request, is
    /// told when it ends.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_send_bufs(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        bufs: Bufs,
        len: usize,
        holder: Holder,
    ) -> Result<Option<u32>, P2pError> {
        let d = comm.world_of(dest)?;
        if len
            <= self
                .eager_to
                .get(d as usize)
                .copied()
                .unwrap_or(self.cfg.eager_limit)
        {
            self.send_eager(d, ctx, tag, &bufs, len)?;
            return Ok(None);
        }
        let local = self.locality.get(d as usize) == Some(&Locality::Local);
        if local && len <= self.cfg.eager_limit {
            // Above the pair eager limit: through the pair buffer when it answers (a
            // ping-pong, whose reply writes the lines its request came in on), else in
            // one packet.
            if !self.send_paired(d, ctx, tag, &bufs, len)? {
                self.send_eager(d, ctx, tag, &bufs, len)?;
            }
            return Ok(None);
        }
        // A message in a stream, which the rendezvous moves with one copy and a run of
        // packets with two, the faster where the CPUs share a cache: up to the stream
        // tune limit, the way this side's recent streams to the peer moved more. Above
        // it, up to the stream copies limit, by rendezvous with every strategy or with
        // own copies only, chosen the same way.
        let mut tuned = false;
        let mut copies_chosen = false;
        if local
            && len > self.cfg.stream_medium_limit
            && (self.cfg.stream_tune_limit > self.cfg.stream_medium_limit
                || self.cfg.stream_copies_limit > self.cfg.stream_medium_limit)
        {
            if self.core.ch.sent_since_taken(d) {
                self.ways.more(d, len, Instant::now);
            } else {
                self.ways.start(d, len, Instant::now());
            }
            tuned = len <= self.cfg.stream_tune_limit;
            copies_chosen = !tuned && len <= self.cfg.stream_copies_limit;
        }
        if tuned {
            // An answer still goes through the pair buffer; else the way chosen, and by
            // rendezvous when the cells have no room for the packets.
            if self.send_paired(d, ctx, tag, &bufs, len)? {
                return Ok(None);
            }
            // The rule's way first.
            let order = if len <= self.cfg.stream_packets_first {
                [Way::Packets, Way::Rendezvous]
            } else {
                [Way::Rendezvous, Way::Packets]
            };
            if self.ways.choose(d, len, order) == Way::Packets && self.run_fits(d, len) {
                self.send_medium(d, ctx, tag, &bufs, len)?;
                self.sent.stream_packets += 1;
                return Ok(None);
            }
        }
        let streamed = tuned
            || local
                && len <= self.cfg.medium_limit
                && len > self.cfg.stream_medium_limit
                && self.core.ch.streams_to(d);
        if len <= self.cfg.medium_limit && local && !streamed {
            if self.send_paired(d, ctx, tag, &bufs, len)? {
                return Ok(None);
            }
            if self.run_fits(d, len) {
                self.send_medium(d, ctx, tag, &bufs, len)?;
                return Ok(None);
            }
        }
        // Longer, an answer that fits the pair buffer still goes through it: without a
        // handshake, its bytes written into the lines the request came in on and read
        // out behind the writer, where a rendezvous pays a round trip first.
        if len > self.cfg.medium_limit && local && !tuned && self.send_paired(d, ctx, tag, &bufs, len)? {
            return Ok(None);
        }
        let own_copies =
            copies_chosen && self.ways.choose(d, len, [Way::Rendezvous, Way::OwnCopies]) == Way::OwnCopies;
        let mut rts = wire::rts_head(len);
        let nemesis_lmt::Offer {
            strategies: mut offered,
            mut held,
        } = self.core.ch.lmt().offer(d, bufs.segs(), len, &mut rts);
        if own_copies {
            offered = offered.without_kernel_copies();
        }
        if own_copies || rts.len() > self.core.ch.max_payload() {
            // Own copies only, or too many pieces to describe in one packet: no reading
            // in place.
            offered = offered.without_in_place();
            rts.truncate(wire::RTS_HEAD);
            if let Some(h) = held.take() {
                self.core.ch.lmt().end(&h);
            }
        }
        rts[8] = offered.0;
        let id = self.eng.reqs.insert(Req::Send(SendReq {
            bufs,
            len,
            dest: d,
            comm: super::super::comm::ReqComm::of(comm),
            state: SState::WaitCts,
            offered,
            used: None,
            held: held.map(Box::new),
            owned: None,
            result: Some(Ok(Status {
                source: dest,
                tag,
                len,
            })),
            detached: false,
            holder,
        }))?;
        let h = Header {
            kind: RTS,
            context: ctx,
            tag,
            aux: id,
            flags: 0,
        };
        if let Err(e) = self.core.ch.send_bytes(d, h, &rts) {
            if let Some(Req::Send(s)) = self.eng.reqs.remove(id) {
                if let Some(h) = s.held {
                    self.core.ch.lmt().end(&h);
                }
                // The buffer goes back with the error, not with a completion.
                drop(s.holder);
            }
            return Err(e.into());
        }
        self.sent.rendezvous += 1;
        self.sent.stream_own_copies += u64::from(own_copies);
        self.sent.stream_rendezvous += u64::from(streamed && len <= self.cfg.medium_limit);
        Ok(Some(id))
    }

    /// Sends `len` bytes of `bufs` to `d` in one packet.
    #[inline(always)]
    pub(crate) fn send_eager(
        &mut self,
        d: u32,
        ctx: u32,
        tag: i32,
        bufs: &Bufs,
        len: usize,
    ) -> Result<(), P2pError> {
        match bufs {
            Bufs::One(s) if !s.ptr.is_null() => {
                // SAFETY: the caller lends the buffer for this call.
                let data = unsafe { std::slice::from_raw_parts(s.ptr.cast_const(), s.len) };
                if self.core.ch.try_send_now(d, wire::eager(ctx, tag), data) {
                    return Ok(());
                }
                self.send_eager_slow(d, ctx, tag, data)
            }
            b => {
                self.core.ch.send(d, wire::eager(ctx, tag), &b.slices(0, len))?;
                Ok(())
            }
        }
    }

    /// An eager packet that the channel's quickest way did not take
    /// ([`Channel::try_send_now`]): through its full send, which queues it or says what
    /// went wrong. Out of line, and given the header's parts rather than the header, so
    /// that the common send keeps neither a result nor a header in memory.
    #[inline(never)]
    pub(crate) fn send_eager_slow(
        &mut self,
        d: u32,
        ctx: u32,
        tag: i32,
        data: &[u8],
    ) -> Result<(), P2pError> {
        self.core.ch.send_bytes(d, wire::eager(ctx, tag), data)?;
        Ok(())
    }

    /// Sends a medium message through the buffer shared with `d` if it fits, answers the
    /// last message through it and is free: a MEDIUM packet that says so, then the bytes
    /// into the buffer (see `medium.rs`). Complete on return, as an eager send is; false
    /// if the buffer could not be had. Whether the message answers is asked inline, the
    /// rest out of line: a stream's every send above the pair eager limit asks, and
    /// through the call alone osu_bw moved 13-44% less from 512 bytes to 2 KiB on a Zen 4
    /// guest.
    #[inline(always)]
    fn send_paired(&mut self, d: u32, ctx: u32, tag: i32, bufs: &Bufs, len: usize) -> Result<bool, P2pError> {
        if !self.eng.pairs.as_ref().is_some_and(|p| p.answers(d)) {
            return Ok(false);
        }
        self.send_paired_answer(d, ctx, tag, bufs, len)
    }

    /// [`World::send_paired`] for a message that answers.
    #[inline(never)]
    fn send_paired_answer(
        &mut self,
        d: u32,
        ctx: u32,
        tag: i32,
        bufs: &Bufs,
        len: usize,
    ) -> Result<bool, P2pError> {
        let Some(pb) = self.eng.pairs.as_ref().and_then(|p| p.with(d)) else {
            return Ok(false);
        };
        if len > pb.capacity() || !pb.try_claim() {
            return Ok(false);
        }
        let h = Header {
            kind: MEDIUM,
            context: ctx,
            tag,
            aux: len as u32,
            flags: wire::PAIRED,
        };
        if let Err(e) = self.core.ch.send_bytes(d, h, &[]) {
            pb.unclaim();
            return Err(e.into());
        }
        // SAFETY: the caller lends the buffers for this call and they hold `len` bytes;
        // we hold the pair buffer until the receiver frees it.
        unsafe { pb.fill(bufs.segs(), len) };
        self.sent.paired += 1;
        self.sent.paired_short += u64::from(len <= self.cfg.eager_limit);
        self.sent.paired_long += u64::from(len > self.cfg.medium_limit);
        Ok(true)
    }

    /// Whether the cells have room now for `len` bytes to rank `d` as a run of packets.
    fn run_fits(&mut self, d: u32, len: usize) -> bool {
        let packets = len.div_ceil(self.core.ch.max_payload_to(d));
        self.core.ch.room_for_run(d, packets)
    }

    /// Sends a medium message: its packets back to back, the first announcing the length
    /// (see `medium.rs`). Complete on return, as an eager send is.
    fn send_medium(&mut self, d: u32, ctx: u32, tag: i32, bufs: &Bufs, len: usize) -> Result<(), P2pError> {
        let max = self.core.ch.max_payload_to(d);
        let mut h = Header {
            kind: MEDIUM,
            context: ctx,
            tag,
            aux: len as u32,
            flags: 0,
        };
        let mut off = 0;
        while off < len {
            let n = max.min(len - off);
            match bufs {
                Bufs::One(s) if !s.ptr.is_null() => {
                    // SAFETY: the caller lends the buffer for this call; `off + n <= len`.
                    let data = unsafe { std::slice::from_raw_parts(s.ptr.cast_const().add(off), n) };
                    self.core.ch.send_bytes(d, h, data)?
                }
                b => self.core.ch.send(d, h, &b.slices(off, n))?,
            };
            h = wire::ctrl(MDATA, 0);
            off += n;
        }
        self.sent.medium_packets += 1;
        Ok(())
    }

    /// Starts a send of `buf`, lent for the request's life. An eager message to a member
    /// goes here, inline, as a blocking send's does; anything else through
    /// [`World::start_send_bufs`], out of line.
    #[inline(always)]
    pub(crate) fn start_send(
        &mut self,
        comm: &Arc<CommInner>,
        dest: u32,
        tag: i32,
        ctx: u32,
        buf: &[u8],
        holder: Holder,
    ) -> Result<Option<u32>, P2pError> {
        if let Some(d) = self.eager_dest(comm, dest, buf.len()) {
            self.send_eager(d, ctx, tag, &Bufs::One(Seg::of(buf)), buf.len())?;
            return Ok(None);
        }
        self.start_send_bufs(comm, dest, tag, ctx, Bufs::One(Seg::of(buf)), buf.len(), holder)
    }

    /// The world rank of `dest` of `comm` if a message of `len` bytes goes to it
    /// eagerly, whole, at once; `None` sends it through [`World::start_send_bufs`].
    #[inline(always)]
    pub(crate) fn eager_dest(&self, comm: &CommInner, dest: u32, len: usize) -> Option<u32> {
        let &d = comm.ranks.get(dest as usize)?;
        (len <= self.eager_to.get(d as usize).copied().unwrap_or(0)).then_some(d)
    }

    /// Starts a receive into `bufs` (lent to the engine until the request completes or is
    /// released). Returns the request, which may already be complete.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn start_recv(
        &mut self,
        comm: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        ctx: u32,
        bufs: impl FnOnce() -> Bufs,
        cap: usize,
        holder: impl FnOnce() -> Holder,
    ) -> Result<u32, P2pError> {
        let src = Self::src_sel(comm, src)?;
        let make = || RecvReq {
            holder: holder(),
            ..RecvReq::new(bufs(), cap, super::super::comm::ReqComm::of(comm), src)
        };
        let id = self.eng.start_recv(make, ctx, src, tag)?;
        self.settle()?;
        Ok(id)
    }

    /// Posts a scope's receive into the one buffer `buf` as a quick receive
    /// (`quick.rs`) if it can be one: on a communicator whose ranks are the world's,
    /// with nothing waiting to be matched. `None`: it must be a request of the table.
    #[inline(always)]
    pub(crate) fn start_recv_quick(
        &mut self,
        comm: &Arc<CommInner>,
        src: Option<u32>,
        tag: Option<i32>,
        buf: nemesis_lmt::Seg,
        scope: u64,
    ) -> Result<Option<u32>, P2pError> {
        if !comm.identity {
            return Ok(None);
        }
        let src = Self::src_sel(comm, src)?;
        Ok(self.eng.start_recv_quick(comm.ctx, src, tag, buf, scope))
    }
}
