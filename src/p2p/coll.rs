//! Collectives, built on point-to-point messages in each communicator's collective
//! context, with algorithms whose depth grows with the logarithm of the size:
//!
//! | collective | algorithm |
//! |---|---|
//! | barrier | dissemination; flat among 3 to 8 ranks on shared CPUs (one exchange among 3 or 4) |
//! | bcast, reduce | binomial tree |
//! | allreduce | recursive doubling, with the usual fold for sizes that are not powers of two; flat up to 4 KiB among 3 to 8 ranks on shared CPUs (one exchange among 3 or 4) |
//! | gather | binomial tree of contiguous blocks |
//! | allgather | ring |
//! | alltoall | pairwise exchange |
//!
//! *Flat*: every rank sends to rank 0, which answers each once it has heard from all;
//! among 3 or 4 ranks, every rank sends to every other instead, and each combines what
//! it heard in rank order. Where the node's processes outnumber its CPUs, each of a
//! logarithmic algorithm's rounds waits for its peers to be scheduled; gathered at one
//! rank, each process runs about twice. Among 8 processes on 2 CPUs a barrier took 6.3–6.6 µs that way against
//! 11.5–12.3 by dissemination, an 8-byte allreduce 6.5 against 13.6–16.6
//! (BENCHMARKS.md). Where each process has a CPU, the rounds are cheaper than rank 0's
//! turn through every message. A communicator's members agree once, on its first
//! barrier or allreduce through messages, by an exchange of votes (`World::flat_vote`):
//! all take the flat forms where any wants them.
//!
//! Every collective message's tag encodes the collective, the operation and the element
//! type, and receivers take the next collective message from the expected peer and check
//! its tag and length: ranks that disagree get [`P2pError::CollectiveMismatch`] where a
//! plain tag match would hang.

use super::comm::{Comm, CommInner};
use super::node::{self, NodeColl};
use super::requests::{Holder, Req};
use super::world::BlockWait;
use super::{P2pError, Status, World};
use crate::channel::Channel;
use crate::op::{Op, Reducible};
use bytemuck::Pod;
use std::sync::Arc;

/// Which collective a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Barrier = 1,
    Bcast = 2,
    Reduce = 3,
    Allreduce = 4,
    Gather = 5,
    Allgather = 6,
    Alltoall = 7,
    Split = 8,
    Attach = 9,
}

fn tag(kind: Kind, op: i32, ty: u8) -> i32 {
    (kind as i32) << 20 | op << 12 | (ty as i32) << 4
}

fn describe(tag: i32) -> String {
    let kinds = [
        "?",
        "barrier",
        "bcast",
        "reduce",
        "allreduce",
        "gather",
        "allgather",
        "alltoall",
        "split",
        "attach",
    ];
    let k = kinds.get((tag >> 20) as usize).copied().unwrap_or("?");
    format!(
        "{k} (op {}, element type {})",
        (tag >> 12) & 0xff,
        (tag >> 4) & 0xff
    )
}

/// The communicator sizes at which small collectives may be flat: measured from 4 to 8
/// on shared CPUs; with 2 ranks, dissemination is one exchange.
const FLAT_RANKS: std::ops::RangeInclusive<u32> = 3..=8;

/// The sizes at which the flat forms are one exchange, every rank sending to every
/// other, rather than gathered at rank 0: each process then runs once and checks, where
/// the gathered form runs rank 0 between the others' turns. Among 3 and 4 processes on
/// 2 CPUs a barrier took 4.0–5.0 and 5.4–5.9 µs that way against 5.8–7.3 and 7.5–8.5
/// gathered (with the sends blocking, as a first version had them; 3.4–4.2 and 5.0–6.5
/// against 6.4–7.1 and 6.4–7.9 as they are); among 8, whose 56 messages cost more than
/// the turns they save, 19–24 against 18–19, and among 5 and 6 the two were even
/// (BENCHMARKS.md).
const EXCHANGE_RANKS: std::ops::RangeInclusive<u32> = 3..=4;

/// The largest allreduce that goes flat, in bytes: the root combines every rank's data
/// in turn.
const FLAT_ALLREDUCE_MAX: usize = 4096;

/// The low bits of a flat collective's answer from rank 0 (a collective's own tags keep
/// them clear): the result, or word that the members' calls did not match.
const FLAT_RELEASE: i32 = 1;
const FLAT_BROKEN: i32 = 2;

impl<C: Channel> World<C> {
    /// Whether small collectives on `c` are flat, agreed on first use: a dissemination
    /// exchange of every member's vote, which, as in the barrier, hears from every rank.
    fn flat(&mut self, c: &Arc<CommInner>) -> Result<bool, P2pError> {
        if let Some(&f) = c.flat.get() {
            return Ok(f);
        }
        let mut vote = [0u8];
        if FLAT_RANKS.contains(&(c.ranks.len() as u32)) {
            vote[0] = u8::from(self.flat_vote);
            self.disseminate(c, tag(Kind::Barrier, 1, 0), &mut vote, |v, heard| {
                v[0] |= heard[0]
            })?;
        }
        let _ = c.flat.set(vote[0] != 0);
        Ok(vote[0] != 0)
    }

    /// The dissemination pattern: in rounds at distances 1, 2, 4…, each rank sends `mine`
    /// to the rank that far ahead and hands what comes from the rank that far behind to
    /// `fold`. After the last round every rank has heard, through others, from all.
    fn disseminate(
        &mut self,
        c: &Arc<CommInner>,
        t: i32,
        mine: &mut [u8],
        mut fold: impl FnMut(&mut [u8], &[u8]),
    ) -> Result<(), P2pError> {
        let (r, n) = (c.rank, c.ranks.len() as u32);
        let mut heard = vec![0u8; mine.len()];
        let mut dist = 1;
        while dist < n {
            self.coll_sendrecv(c, (r + dist) % n, (r + n - dist) % n, t, mine, &mut heard)?;
            fold(mine, &heard);
            dist <<= 1;
        }
        Ok(())
    }

    /// The flat form for `c`'s size: one exchange among [`EXCHANGE_RANKS`], else
    /// gathered at rank 0.
    fn flat_form<T: Pod>(
        &mut self,
        c: &Arc<CommInner>,
        t: i32,
        data: &mut [T],
        fold: impl FnMut(&mut [T], &[T]) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        if EXCHANGE_RANKS.contains(&(c.ranks.len() as u32)) {
            self.flat_exchange(c, t, data, fold)
        } else {
            self.flat_gather_release(c, t, data, fold)
        }
    }

    /// The gathered form: every other rank sends its `data` to rank 0 with tag `t`; rank 0
    /// hands each rank's, in rank order, to `fold` with its own, then sends every rank
    /// the result, which lands in their `data`. A rank whose message does not match is
    /// reported at rank 0, which then releases the others with word of it, so that every
    /// rank fails rather than some waiting for ever.
    fn flat_gather_release<T: Pod>(
        &mut self,
        c: &Arc<CommInner>,
        t: i32,
        data: &mut [T],
        mut fold: impl FnMut(&mut [T], &[T]) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        let n = c.ranks.len() as u32;
        if c.rank != 0 {
            self.coll_send(c, 0, t, bytemuck::cast_slice(data))?;
            let st = self
                .recv_in(c, c.ctx + 1, Some(0), None, bytemuck::cast_slice_mut(data))
                .map_err(|e| Self::too_long(e, 0, t))?;
            if st.tag & 0xf == FLAT_BROKEN {
                return Err(P2pError::CollectiveMismatch(format!(
                    "{}: rank 0 found that the members' calls differ",
                    describe(t)
                )));
            }
            return Self::check_coll(st, 0, t | FLAT_RELEASE, std::mem::size_of_val(data));
        }
        let mut theirs = vec![T::zeroed(); data.len()];
        let mut broken = None;
        for p in 1..n {
            match self.coll_recv(c, p, t, bytemuck::cast_slice_mut(&mut theirs)) {
                Ok(()) if broken.is_none() => fold(data, &theirs)?,
                Ok(()) => {}
                Err(e @ P2pError::CollectiveMismatch(_)) => {
                    broken.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        let release = t | if broken.is_some() {
            FLAT_BROKEN
        } else {
            FLAT_RELEASE
        };
        for p in 1..n {
            self.coll_send(c, p, release, bytemuck::cast_slice(data))?;
        }
        broken.map_or(Ok(()), Err)
    }

    /// The one-round form: every rank starts sending its `data` to every other rank with
    /// tag `t`, takes every other rank's, and hands them all, in rank order from rank
    /// 0's, to `fold`: every rank computes the same bits, and hears from every rank
    /// itself, so a mismatch fails at every rank that sees it, without word from anyone.
    /// The sends do not block, so that a rendezvous among them cannot wait in a circle.
    fn flat_exchange<T: Pod>(
        &mut self,
        c: &Arc<CommInner>,
        t: i32,
        data: &mut [T],
        mut fold: impl FnMut(&mut [T], &[T]) -> Result<(), P2pError>,
    ) -> Result<(), P2pError> {
        let (me, n) = (c.rank as usize, c.ranks.len());
        let len = data.len();
        // Eager sends finish at once and leave nothing to wait for: no list is made
        // for them.
        let mut sends = Vec::new();
        let mut res = Ok(());
        let bytes: &[u8] = bytemuck::cast_slice(data);
        for k in 1..n {
            let dest = ((me + k) % n) as u32;
            if self.try_eager_now(c, c.ctx + 1, dest, t, bytes) {
                continue;
            }
            match self.start_send(c, dest, t, c.ctx + 1, bytes, Holder::Call) {
                Ok(id) => sends.extend(id),
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        let mut all = vec![T::zeroed(); len * n];
        let mut broken = None;
        if res.is_ok() {
            for p in (0..n).filter(|&p| p != me) {
                let theirs = &mut all[p * len..(p + 1) * len];
                match self.coll_recv(c, p as u32, t, bytemuck::cast_slice_mut(theirs)) {
                    Ok(()) => {}
                    Err(e @ P2pError::CollectiveMismatch(_)) => {
                        broken.get_or_insert(e);
                    }
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                }
            }
        }
        if res.is_ok() {
            res = self.wait_all_ids(&sends);
        }
        // Nothing the engine holds may outlive `data`.
        for id in sends {
            if res.is_err() || !self.eng.reqs.get(id).is_some_and(Req::is_done) {
                self.release(id);
            } else if let Err(e) = self.eng.finish(id) {
                res = res.and(Err(e));
            }
        }
        res?;
        if let Some(e) = broken {
            return Err(e);
        }
        if len > 0 {
            all[me * len..(me + 1) * len].copy_from_slice(data);
            data.copy_from_slice(&all[..len]);
            for theirs in all[len..].chunks_exact(len) {
                fold(data, theirs)?;
            }
        }
        Ok(())
    }

    fn coll_send(&mut self, c: &Arc<CommInner>, dest: u32, tag: i32, data: &[u8]) -> Result<(), P2pError> {
        self.send_in(c, c.ctx + 1, dest, tag, data)
    }

    /// Receives exactly `buf.len()` bytes of the collective `tag` from `src`.
    fn coll_recv(&mut self, c: &Arc<CommInner>, src: u32, tag: i32, buf: &mut [u8]) -> Result<(), P2pError> {
        let st = self
            .recv_in(c, c.ctx + 1, Some(src), None, buf)
            .map_err(|e| Self::too_long(e, src, tag))?;
        Self::check_coll(st, src, tag, buf.len())
    }

    /// A collective message longer than expected is a mismatch between the ranks.
    fn too_long(e: P2pError, src: u32, tag: i32) -> P2pError {
        match e {
            P2pError::Truncated {
                message_len,
                buffer_len,
            } => P2pError::CollectiveMismatch(format!(
                "{}: rank {src} sent {message_len} bytes, this rank expected {buffer_len}",
                describe(tag)
            )),
            other => other,
        }
    }

    fn check_coll(st: Status, src: u32, tag: i32, want: usize) -> Result<(), P2pError> {
        if st.tag != tag {
            return Err(P2pError::CollectiveMismatch(format!(
                "rank {src} is in {}, this rank in {}",
                describe(st.tag),
                describe(tag)
            )));
        }
        if st.len != want {
            return Err(P2pError::CollectiveMismatch(format!(
                "{}: rank {src} sent {} bytes, this rank expected {want}",
                describe(tag),
                st.len
            )));
        }
        Ok(())
    }

    fn coll_sendrecv(
        &mut self,
        c: &Arc<CommInner>,
        dest: u32,
        src: u32,
        tag: i32,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), P2pError> {
        let st = self
            .sendrecv_in(c, c.ctx + 1, dest, tag, send, Some(src), None, recv)
            .map_err(|e| Self::too_long(e, src, tag))?;
        Self::check_coll(st, src, tag, recv.len())
    }

    fn check_root(c: &CommInner, root: u32) -> Result<(), P2pError> {
        if root as usize >= c.ranks.len() {
            return Err(P2pError::InvalidRank {
                rank: root,
                size: c.ranks.len() as u32,
            });
        }
        Ok(())
    }

    /// Returns once every rank of `comm` has called it.
    pub fn barrier(&mut self, comm: &Comm) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        if let Some(nc) = &c.node {
            return nc.barrier(c.seat(), &mut BlockWait::new(self, c));
        }
        if self.flat(c)? {
            return self.flat_form::<u8>(c, tag(Kind::Barrier, 2, 0), &mut [], |_, _| Ok(()));
        }
        self.disseminate(c, tag(Kind::Barrier, 0, 0), &mut [], |_, _| {})
    }

    /// Copies `data` from `root` to every rank; all must pass the same length.
    pub fn bcast<T: Pod>(&mut self, comm: &Comm, root: u32, data: &mut [T]) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        Self::check_root(c, root)?;
        let t = tag(Kind::Bcast, 0, 0);
        self.bcast_bytes(c, root, t, bytemuck::cast_slice_mut(data))
    }

    fn bcast_bytes(
        &mut self,
        c: &Arc<CommInner>,
        root: u32,
        t: i32,
        data: &mut [u8],
    ) -> Result<(), P2pError> {
        let n = c.ranks.len() as u32;
        let vr = (c.rank + n - root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                self.coll_recv(c, (vr - mask + root) % n, t, data)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                self.coll_send(c, (vr + mask + root) % n, t, data)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// Combines every rank's `send` with `op`; the result lands in `recv` at `root`
    /// (`recv` is not touched elsewhere and may be empty there).
    pub fn reduce<T: Reducible>(
        &mut self,
        comm: &Comm,
        root: u32,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        Self::check_root(c, root)?;
        if c.rank == root && recv.len() != send.len() {
            return Err(P2pError::InvalidArgument(format!(
                "reduce: the root's receive buffer holds {} elements, the send buffer {}",
                recv.len(),
                send.len()
            )));
        }
        T::combine(op, &mut [], &[])?;
        let t = tag(Kind::Reduce, op.code(), T::TYPE_CODE);
        let n = c.ranks.len() as u32;
        let vr = (c.rank + n - root) % n;
        let mut acc = send.to_vec();
        let mut tmp = vec![T::zeroed(); send.len()];
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let partner = vr | mask;
                if partner < n {
                    self.coll_recv(c, (partner + root) % n, t, bytemuck::cast_slice_mut(&mut tmp))?;
                    T::combine(op, &mut acc, &tmp)?;
                }
            } else {
                self.coll_send(c, (vr - mask + root) % n, t, bytemuck::cast_slice(&acc))?;
                break;
            }
            mask <<= 1;
        }
        if c.rank == root {
            recv.copy_from_slice(&acc);
        }
        Ok(())
    }

    /// Combines every rank's `data` with `op`, in place, on every rank.
    pub fn allreduce<T: Reducible>(&mut self, comm: &Comm, data: &mut [T], op: Op) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        T::combine(op, &mut [], &[])?;
        let t = tag(Kind::Allreduce, op.code(), T::TYPE_CODE);
        if let Some(nc) = &c.node
            && nc.allreduce(c.seat(), &mut BlockWait::new(self, c), data, op, t, describe)?
        {
            return Ok(());
        }
        if std::mem::size_of_val(data) <= FLAT_ALLREDUCE_MAX && self.flat(c)? {
            // Every rank combines in rank order (or rank 0 does, and sends every rank the
            // result): the same bits everywhere.
            return self.flat_form(c, t, data, |acc, theirs| Ok(T::combine(op, acc, theirs)?));
        }
        let (r, n) = (c.rank, c.ranks.len() as u32);
        let mut tmp = vec![T::zeroed(); data.len()];
        let p2 = if n.is_power_of_two() {
            n
        } else {
            n.next_power_of_two() / 2
        };
        let rem = n - p2;
        // Fold the ranks beyond the largest power of two into their even neighbours.
        let newrank = if r < 2 * rem {
            if r % 2 == 0 {
                self.coll_send(c, r + 1, t, bytemuck::cast_slice(data))?;
                None
            } else {
                self.coll_recv(c, r - 1, t, bytemuck::cast_slice_mut(&mut tmp))?;
                T::combine(op, data, &tmp)?;
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        if let Some(nr) = newrank {
            let mut mask = 1;
            while mask < p2 {
                let np = nr ^ mask;
                let partner = if np < rem { np * 2 + 1 } else { np + rem };
                self.coll_sendrecv(
                    c,
                    partner,
                    partner,
                    t,
                    bytemuck::cast_slice(data),
                    bytemuck::cast_slice_mut(&mut tmp),
                )?;
                T::combine(op, data, &tmp)?;
                mask <<= 1;
            }
        }
        if r < 2 * rem {
            if r % 2 == 0 {
                self.coll_recv(c, r + 1, t, bytemuck::cast_slice_mut(data))?;
            } else {
                self.coll_send(c, r - 1, t, bytemuck::cast_slice(data))?;
            }
        }
        Ok(())
    }

    /// Collects every rank's `send` at `root`, in rank order, into `recv` (which must
    /// hold `size * send.len()` elements at the root, and is not touched elsewhere).
    pub fn gather<T: Pod>(
        &mut self,
        comm: &Comm,
        root: u32,
        send: &[T],
        recv: &mut [T],
    ) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        Self::check_root(c, root)?;
        let n = c.ranks.len() as u32;
        let block = std::mem::size_of_val(send);
        if c.rank == root && recv.len() != send.len() * n as usize {
            return Err(P2pError::InvalidArgument(format!(
                "gather: the root needs room for {} elements, it gave {}",
                send.len() * n as usize,
                recv.len()
            )));
        }
        let t = tag(Kind::Gather, 0, 0);
        let vr = (c.rank + n - root) % n;
        // Blocks of ranks vr, vr+1, ... (relative to the root), as the subtree grows.
        let mut acc = bytemuck::cast_slice::<T, u8>(send).to_vec();
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let partner = vr | mask;
                if partner < n {
                    let count = mask.min(n - partner) as usize;
                    let start = acc.len();
                    acc.resize(start + count * block, 0);
                    self.coll_recv(c, (partner + root) % n, t, &mut acc[start..])?;
                }
            } else {
                self.coll_send(c, (vr - mask + root) % n, t, &acc)?;
                break;
            }
            mask <<= 1;
        }
        if c.rank == root {
            let out: &mut [u8] = bytemuck::cast_slice_mut(recv);
            for v in 0..n as usize {
                let rank = (v + root as usize) % n as usize;
                out[rank * block..(rank + 1) * block].copy_from_slice(&acc[v * block..(v + 1) * block]);
            }
        }
        Ok(())
    }

    /// Every rank gets every rank's `send`, in rank order, in `recv` (`size * send.len()`
    /// elements).
    pub fn allgather<T: Pod>(&mut self, comm: &Comm, send: &[T], recv: &mut [T]) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        let (r, n) = (c.rank as usize, c.ranks.len());
        if recv.len() != send.len() * n {
            return Err(P2pError::InvalidArgument(format!(
                "allgather: the receive buffer needs {} elements, it has {}",
                send.len() * n,
                recv.len()
            )));
        }
        let t = tag(Kind::Allgather, 0, 0);
        let block = std::mem::size_of_val(send);
        let out: &mut [u8] = bytemuck::cast_slice_mut(recv);
        out[r * block..(r + 1) * block].copy_from_slice(bytemuck::cast_slice(send));
        let (right, left) = (((r + 1) % n) as u32, ((r + n - 1) % n) as u32);
        let mut tmp = vec![0u8; block];
        for step in 0..n.saturating_sub(1) {
            let send_block = (r + n - step) % n;
            let recv_block = (r + n - step - 1) % n;
            let outgoing = out[send_block * block..(send_block + 1) * block].to_vec();
            self.coll_sendrecv(c, right, left, t, &outgoing, &mut tmp)?;
            out[recv_block * block..(recv_block + 1) * block].copy_from_slice(&tmp);
        }
        Ok(())
    }

    /// Block `i` of every rank's `send` goes to rank `i`, into block `j` (for sender `j`)
    /// of its `recv`. Both hold `size` equal blocks.
    pub fn alltoall<T: Pod>(&mut self, comm: &Comm, send: &[T], recv: &mut [T]) -> Result<(), P2pError> {
        let c = self.check_comm(comm)?;
        let (r, n) = (c.rank as usize, c.ranks.len());
        if send.len() != recv.len() || send.len() % n != 0 {
            return Err(P2pError::InvalidArgument(format!(
                "alltoall: send ({}) and receive ({}) must hold the same number of elements, a multiple of {n}",
                send.len(),
                recv.len()
            )));
        }
        let t = tag(Kind::Alltoall, 0, 0);
        let block = std::mem::size_of_val(send) / n;
        let src_bytes: &[u8] = bytemuck::cast_slice(send);
        let out: &mut [u8] = bytemuck::cast_slice_mut(recv);
        out[r * block..(r + 1) * block].copy_from_slice(&src_bytes[r * block..(r + 1) * block]);
        for i in 1..n {
            let dest = (r + i) % n;
            let src = (r + n - i) % n;
            self.coll_sendrecv(
                c,
                dest as u32,
                src as u32,
                t,
                &src_bytes[dest * block..(dest + 1) * block],
                &mut out[src * block..(src + 1) * block],
            )?;
        }
        Ok(())
    }

    /// A new communicator with the same ranks and a context of its own.
    pub fn dup(&mut self, comm: &Comm) -> Result<Comm, P2pError> {
        let c = self.check_comm(comm)?.clone();
        let ctx = self.agree_context(comm)?;
        self.make_comm(ctx, c.ranks.clone(), c.all_local)
    }

    /// Splits `comm` into one communicator per `color`, ordered by `key` then by rank;
    /// ranks passing `None` get no communicator.
    pub fn split(&mut self, comm: &Comm, color: Option<u32>, key: i32) -> Result<Option<Comm>, P2pError> {
        let c = self.check_comm(comm)?.clone();
        let ctx = self.agree_context(comm)?;
        let n = c.ranks.len();
        let mine = [color.unwrap_or(u32::MAX) as i64, key as i64];
        let mut all = vec![0i64; 2 * n];
        let t = tag(Kind::Split, 0, 0);
        // An allgather with its own tag, so a mismatch with another collective shows.
        {
            let block = 16;
            let out: &mut [u8] = bytemuck::cast_slice_mut(&mut all);
            let r = c.rank as usize;
            out[r * block..(r + 1) * block].copy_from_slice(bytemuck::cast_slice(&mine));
            let (right, left) = (((r + 1) % n) as u32, ((r + n - 1) % n) as u32);
            let mut tmp = [0u8; 16];
            for step in 0..n.saturating_sub(1) {
                let sb = (r + n - step) % n;
                let rb = (r + n - step - 1) % n;
                let outgoing = out[sb * block..(sb + 1) * block].to_vec();
                self.coll_sendrecv(&c, right, left, t, &outgoing, &mut tmp)?;
                out[rb * block..(rb + 1) * block].copy_from_slice(&tmp);
            }
        }
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|&i| all[2 * i] == color as i64)
            .map(|i| (all[2 * i + 1], i))
            .collect();
        members.sort();
        let ranks: Vec<u32> = members.iter().map(|&(_, i)| c.ranks[i]).collect();
        let all_local = ranks
            .iter()
            .all(|&w| self.locality()[w as usize] != super::Locality::Remote);
        self.make_comm(ctx, ranks, all_local).map(Some)
    }

    /// Builds a communicator of `ranks` in context `ctx`, with a node block for its
    /// collectives when every member shares the node and one is free. Collective over
    /// `ranks`: its first member claims the block and tells the others.
    fn make_comm(&mut self, ctx: u32, ranks: Vec<u32>, all_local: bool) -> Result<Comm, P2pError> {
        let (me, size) = (self.rank(), self.size());
        let plain = Comm::new(self.id, ctx, ranks.clone(), me, size, all_local, None);
        let Some(seg) = self.node_seg.clone().filter(|_| all_local && ranks.len() > 1) else {
            return Ok(plain);
        };
        let key = node::block_key(ctx, ranks[0]);
        let mut index = [u32::MAX];
        if plain.rank() == 0
            && let Some(i) = node::claim(&seg, key, ranks.len() as u32)
        {
            index[0] = i as u32;
        }
        let c = plain.inner.clone();
        self.bcast_bytes(
            &c,
            0,
            tag(Kind::Attach, 0, 0),
            bytemuck::cast_slice_mut(&mut index),
        )?;
        if index[0] == u32::MAX {
            return Ok(plain);
        }
        let i = index[0] as usize;
        if !seg.coll_block(i).is_some_and(|b| b.owned_by(key)) {
            return Err(P2pError::Protocol {
                rank: ranks[0],
                what: format!("it named node block {i}, which the communicator does not own"),
            });
        }
        let node = NodeColl::join(seg, i, true);
        Ok(Comm::new(self.id, ctx, ranks, me, size, all_local, node))
    }

    /// Agrees with the members of `comm` on a context that none of them uses yet.
    fn agree_context(&mut self, comm: &Comm) -> Result<u32, P2pError> {
        let mut next = [self.next_ctx];
        self.allreduce(comm, &mut next, Op::Max)?;
        let k = next[0];
        if k >= u32::MAX / 2 - 1 {
            return Err(P2pError::InvalidArgument("no communicator contexts left".into()));
        }
        self.next_ctx = k + 1;
        Ok(2 * k)
    }

    /// Sends a slice of plain values.
    pub fn send_slice<T: Pod>(
        &mut self,
        comm: &Comm,
        dest: u32,
        tag: i32,
        data: &[T],
    ) -> Result<(), P2pError> {
        self.send(comm, dest, tag, bytemuck::cast_slice(data))
    }

    /// Receives a slice of plain values; the message must be a whole number of them.
    pub fn recv_slice<T: Pod>(
        &mut self,
        comm: &Comm,
        src: impl Into<Option<u32>>,
        tag: impl Into<Option<i32>>,
        buf: &mut [T],
    ) -> Result<Status, P2pError> {
        let st = self.recv(comm, src, tag, bytemuck::cast_slice_mut(buf))?;
        if st.len % std::mem::size_of::<T>().max(1) != 0 {
            return Err(P2pError::InvalidArgument(format!(
                "a message of {} bytes is not a whole number of {}-byte elements",
                st.len,
                std::mem::size_of::<T>()
            )));
        }
        Ok(st)
    }
}
