//! Operations on several blocks of a target's elements at once (MPI's non-contiguous
//! datatypes): an origin's pieces gathered into, or scattered from, a target's blocks.
//!
//! Members that map each other's memory copy block by block; a target reached by
//! messages gets one packet naming every block when they fit in one (`PUTV`, `GETV`),
//! so many small blocks cost one message, and a packet per block otherwise.

use super::RmaError;
use super::access::Ops;
use super::elem::AccOp;
use super::proto::Want;
use super::window::Route;
use super::wire;
use crate::channel::Channel;
use crate::op::Reducible;
use bytemuck::Pod;

/// A strided run of a target's elements: `count` blocks of `block` elements, the first
/// at displacement `disp`, each `stride` elements after the one before (MPI's vector
/// type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strided {
    /// The first block's displacement, in elements.
    pub disp: usize,
    /// Blocks.
    pub count: usize,
    /// Elements per block.
    pub block: usize,
    /// Elements from one block's start to the next's.
    pub stride: usize,
}

impl Strided {
    /// The blocks, as (displacement, elements) pairs.
    pub fn blocks(&self) -> Vec<(usize, usize)> {
        (0..self.count)
            .map(|i| (self.disp + i * self.stride, self.block))
            .collect()
    }
}

/// Pairs the origin's pieces with the target's blocks: each step a run of elements that
/// is contiguous on both sides, as (its elements, their displacement at the target).
fn segments<'a, T>(
    src: &'a [&'a [T]],
    blocks: &'a [(usize, usize)],
) -> impl Iterator<Item = (&'a [T], usize)> + 'a {
    let mut pieces = src.iter().copied().filter(|p| !p.is_empty());
    let mut cur: &[T] = &[];
    blocks.iter().flat_map(move |&(disp, len)| {
        let mut out = Vec::new();
        let mut at = 0;
        while at < len {
            if cur.is_empty() {
                match pieces.next() {
                    Some(p) => cur = p,
                    None => break,
                }
            }
            let n = cur.len().min(len - at);
            out.push((&cur[..n], disp + at));
            cur = &cur[n..];
            at += n;
        }
        out
    })
}

impl<'w, 'b, T: Pod, C: Channel> Ops<'w, 'b, T, C> {
    /// Checks every block and that `elems` elements fill them exactly; the target's
    /// route.
    fn check_blocks(&self, target: u32, blocks: &[(usize, usize)], elems: usize) -> Result<Route, RmaError> {
        let mut total = 0usize;
        let mut route = Route::Am;
        for &(disp, len) in blocks {
            route = self.check(target, disp, len)?.route;
            total = total
                .checked_add(len)
                .ok_or_else(|| RmaError::InvalidArgument("blocks that overflow".into()))?;
        }
        if blocks.is_empty() {
            route = self.check(target, 0, 0)?.route;
        }
        if total != elems {
            return Err(RmaError::InvalidArgument(format!(
                "{elems} elements for blocks of {total}"
            )));
        }
        Ok(route)
    }

    /// Whether one packet to world rank `w` carries `n` blocks and `bytes` bytes.
    fn one_packet(&self, w: u32, n: usize, bytes: usize) -> bool {
        n > 1
            && n <= wire::MAX_BLOCKS
            && wire::BLOCKS_HEAD + n * wire::BLOCK + bytes <= self.max_payload(w, 0)
    }

    /// Writes the elements of `src`'s pieces, in order, into member `target`'s `blocks`
    /// ((displacement, elements) pairs, e.g. from [`Strided::blocks`]).
    ///
    /// # Errors
    /// As for [`Ops::put`], and [`RmaError::InvalidArgument`] when the pieces and the
    /// blocks hold different numbers of elements.
    pub fn put_v(&mut self, src: &[&[T]], target: u32, blocks: &[(usize, usize)]) -> Result<(), RmaError> {
        let elems = src.iter().map(|p| p.len()).sum();
        let route = self.check_blocks(target, blocks, elems)?;
        let w = self.win.peers[target as usize].world;
        let bytes = elems * size_of::<T>();
        if matches!(route, Route::Am | Route::Rdma(_)) && self.one_packet(w, blocks.len(), bytes) {
            let size = size_of::<T>() as u64;
            let list: Vec<(u64, u64)> = blocks
                .iter()
                .map(|&(d, l)| (d as u64 * size, l as u64 * size))
                .collect();
            let head = wire::blocks(&list);
            let data: Vec<u8> = src
                .iter()
                .flat_map(|p| bytemuck::cast_slice::<T, u8>(p))
                .copied()
                .collect();
            self.send(w, wire::PUTV, 0, 0, &[&head, &data])?;
            self.issued(target, false);
            return Ok(());
        }
        for (piece, disp) in segments(src, blocks) {
            self.put(piece, target, disp)?;
        }
        Ok(())
    }

    /// Reads member `target`'s `blocks`, in order, into `dst`, which stays borrowed
    /// until the get completes.
    ///
    /// # Errors
    /// As for [`Ops::put_v`].
    pub fn get_v(
        &mut self,
        dst: &'b mut [T],
        target: u32,
        blocks: &[(usize, usize)],
    ) -> Result<(), RmaError> {
        let route = self.check_blocks(target, blocks, dst.len())?;
        let w = self.win.peers[target as usize].world;
        if matches!(route, Route::Am | Route::Rdma(_)) && self.one_packet(w, blocks.len(), 0) {
            let size = size_of::<T>() as u64;
            let list: Vec<(u64, u64)> = blocks
                .iter()
                .map(|&(d, l)| (d as u64 * size, l as u64 * size))
                .collect();
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
            let req = self.request(w, Want::Data(bytes.len()))?;
            self.send(w, wire::GETV, 0, req, &[&wire::blocks(&list)])?;
            self.issued(target, true);
            self.land(req, bytes.as_mut_ptr(), bytes.len());
            return Ok(());
        }
        let mut rest = dst;
        for &(disp, len) in blocks {
            let (part, tail) = rest.split_at_mut(len);
            rest = tail;
            self.get(part, target, disp)?;
        }
        Ok(())
    }

    /// Applies `op` with the elements of `src`'s pieces, in order, to member `target`'s
    /// `blocks`, each element atomically as [`Ops::accumulate`] does.
    ///
    /// # Errors
    /// As for [`Ops::put_v`], and as for [`Ops::accumulate`].
    pub fn accumulate_v(
        &mut self,
        src: &[&[T]],
        target: u32,
        blocks: &[(usize, usize)],
        op: AccOp,
    ) -> Result<(), RmaError>
    where
        T: Reducible,
    {
        let elems = src.iter().map(|p| p.len()).sum();
        self.check_blocks(target, blocks, elems)?;
        for (piece, disp) in segments(src, blocks) {
            self.accumulate(piece, target, disp, op)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_and_blocks_pair_up_into_runs_contiguous_on_both_sides() {
        let a = [1, 2, 3];
        let b = [4];
        let c = [5, 6];
        let src: [&[i32]; 4] = [&a, &[], &b, &c];
        let blocks = [(10, 2), (20, 3), (30, 1)];
        let runs: Vec<(Vec<i32>, usize)> = segments(&src, &blocks).map(|(p, d)| (p.to_vec(), d)).collect();
        assert_eq!(
            runs,
            [
                (vec![1, 2], 10),
                (vec![3], 20),
                (vec![4], 21),
                (vec![5], 22),
                (vec![6], 30)
            ]
        );
        let s = Strided {
            disp: 1,
            count: 3,
            block: 2,
            stride: 5,
        };
        assert_eq!(s.blocks(), [(1, 2), (6, 2), (11, 2)]);
    }
}
