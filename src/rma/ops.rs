//! The operations of an epoch, on one contiguous run of a target's elements: put, get
//! (also request-based, and completed in ranges as it arrives), accumulate,
//! get-accumulate, fetch-and-op and compare-and-swap, each by the route this process has
//! to the target.

use super::RmaError;
use super::access::Ops;
use super::elem::{self, AccOp};
use super::proto::{State, Want};
use super::window::{Route, rma};
use super::wire::{self, AccHead, Refusal};
use crate::channel::Channel;
use crate::op::Reducible;
use bytemuck::Pod;
use std::marker::PhantomData;
use std::ops::Range;

/// A get started with [`Ops::rget`]: the buffer it fills, lent back by [`Ops::wait`],
/// or in pieces by [`Ops::wait_range`] as they arrive.
#[must_use = "a get completes only when waited for, flushed, or its epoch ends"]
#[derive(Debug)]
pub struct Get<'b, T> {
    req: Option<u32>,
    ptr: *mut T,
    len: usize,
    _buf: PhantomData<&'b mut [T]>,
}

/// A request-based put ([`Ops::rput`]): complete at the origin from the start, since a
/// put's bytes are copied or sent before it returns; for code that keeps MPI's
/// `Rput` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put {
    bytes: usize,
}

impl Put {
    /// Whether the origin's buffer may be reused: always.
    pub fn is_complete(&self) -> bool {
        true
    }

    /// Bytes it put.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it put none.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl<T> Get<'_, T> {
    /// Elements asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it asked for none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Moves bytes to or from another local process by cross-memory attach; false when the
/// kernel refuses (the caller then sends a message instead).
fn cma(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> bool {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: within the caller's buffer of `len` bytes.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec covers the caller's live buffer; the remote one is
        // checked by the kernel against the peer's address space.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

impl<'w, 'b, T: Pod, C: Channel> Ops<'w, 'b, T, C> {
    // -----------------------------------------------------------------------------
    // Operations

    /// Writes `src` into member `target`'s memory at `disp`.
    ///
    /// # Errors
    /// [`RmaError::InvalidRank`], [`RmaError::NotInEpoch`], [`RmaError::OutOfBounds`],
    /// and the channel's.
    pub fn put(&mut self, src: &[T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, src.len())?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let off = disp * size_of::<T>();
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                // SAFETY: `check` put the bytes inside the member's memory, mapped here
                // for the window's life; they are written as raw bytes, never borrowed,
                // since others may access them under MPI's rules meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (a + off) as *mut u8, bytes.len()) };
                Ok(())
            }
            Route::Cma { pid, addr }
                if cma(
                    pid,
                    addr + off as u64,
                    bytes.as_ptr().cast_mut(),
                    bytes.len(),
                    true,
                ) =>
            {
                Ok(())
            }
            Route::Cma { .. } => {
                self.win.give_up_cma();
                self.am_put(target, p.world, off as u64, bytes)
            }
            Route::Rdma(_)
                if bytes.len() >= self.rdma_min()
                    && self.rdma_post(target, p, off, Some(bytes), bytes.len(), 0)? =>
            {
                Ok(())
            }
            Route::Rdma(_) | Route::Am => self.am_put(target, p.world, off as u64, bytes),
        }
    }

    /// As [`Ops::put`], returning a request (MPI's `Rput`), complete at the origin when
    /// it returns; completion at the target comes with a flush or the epoch's end.
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn rput(&mut self, src: &[T], target: u32, disp: usize) -> Result<Put, RmaError> {
        self.put(src, target, disp)?;
        Ok(Put {
            bytes: std::mem::size_of_val(src),
        })
    }

    /// Asks member `target` for `len` bytes at `off`, answering request `req`: by RDMA
    /// where the route has it and the get is large enough, else by a packet.
    fn get_by(
        &mut self,
        target: u32,
        p: super::window::Peer,
        off: usize,
        req: u32,
        len: usize,
    ) -> Result<(), RmaError> {
        if let Route::Rdma(_) = p.route
            && len >= self.rdma_min()
            && self.rdma_post(target, p, off, None, len, req)?
        {
            return Ok(());
        }
        self.send(p.world, wire::GET, 0, req, &[&wire::get(off as u64, len as u64)])?;
        self.issued(target, true);
        Ok(())
    }

    fn am_put(&mut self, target: u32, w: u32, off: u64, bytes: &[u8]) -> Result<(), RmaError> {
        let max = self.max_payload(w, wire::DISP_HEAD);
        for (i, chunk) in bytes.chunks(max).enumerate() {
            let head = wire::disp_head(off + (i * max) as u64);
            self.send(w, wire::PUT, 0, 0, &[&head, chunk])?;
            self.issued(target, false);
        }
        Ok(())
    }

    /// Reads member `target`'s memory at `disp` into `dst`, which stays borrowed until
    /// the get completes.
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn get(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.start_get(dst, target, disp).map(|_| ())
    }

    /// As [`Ops::get`], returning a request that [`Ops::wait`] or [`Ops::wait_range`]
    /// completes; a request-based get (MPI's `Rget`).
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn rget(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<Get<'b, T>, RmaError> {
        let (ptr, len) = (dst.as_mut_ptr(), dst.len());
        let req = self.start_get(dst, target, disp)?;
        Ok(Get {
            req,
            ptr,
            len,
            _buf: PhantomData,
        })
    }

    /// Reads the bytes at `off` of a member reached through memory straight into
    /// `bytes`; false for a member that must be asked (the caller asks it).
    fn read_direct(&mut self, p: super::window::Peer, off: usize, bytes: &mut [u8]) -> bool {
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                // SAFETY: as for `put`, reading.
                unsafe {
                    std::ptr::copy_nonoverlapping((a + off) as *const u8, bytes.as_mut_ptr(), bytes.len())
                };
                true
            }
            Route::Cma { pid, addr } => {
                let done = cma(pid, addr + off as u64, bytes.as_mut_ptr(), bytes.len(), false);
                if !done {
                    self.win.give_up_cma();
                }
                done
            }
            Route::Rdma(_) | Route::Am => false,
        }
    }

    fn start_get(&mut self, dst: &'b mut [T], target: u32, disp: usize) -> Result<Option<u32>, RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, dst.len())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let off = disp * size_of::<T>();
        if self.read_direct(p, off, bytes) || bytes.is_empty() {
            return Ok(None);
        }
        let req = self.request(p.world, Want::Data(bytes.len()))?;
        self.get_by(target, p, off, req, bytes.len())?;
        self.land(req, bytes.as_mut_ptr(), bytes.len());
        Ok(Some(req))
    }

    /// Reads member `target`'s memory at `disp` into `dst` and returns once it is there:
    /// a get and its completion in one call, so `dst` is borrowed for the call only.
    ///
    /// # Errors
    /// As for [`Ops::put`], and the target's refusal or failure.
    pub fn read(&mut self, dst: &mut [T], target: u32, disp: usize) -> Result<(), RmaError> {
        self.serve_others()?;
        let p = self.check(target, disp, dst.len())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let off = disp * size_of::<T>();
        if self.read_direct(p, off, bytes) {
            return Ok(());
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let req = self.request(p.world, Want::Data(bytes.len()))?;
        self.get_by(target, p, off, req, bytes.len())?;
        let got = self.wait_reqs(&[req])?;
        bytes.copy_from_slice(&got[0]);
        Ok(())
    }

    /// Completes a request-based get and lends its buffer back.
    ///
    /// # Errors
    /// The target's refusal, its failure, or the channel's.
    pub fn wait(&mut self, g: Get<'b, T>) -> Result<&'b mut [T], RmaError> {
        if let Some(req) = g.req {
            self.complete_landings(|l| l.req == req)?;
        }
        // SAFETY: the buffer was lent to the get for 'b and is complete: nothing writes
        // it any more, and the handle that held it is consumed.
        Ok(unsafe { std::slice::from_raw_parts_mut(g.ptr, g.len) })
    }

    /// Elements of a request-based get that have arrived, in order from the first.
    pub fn arrived(&mut self, g: &Get<'b, T>) -> usize {
        let Some(req) = g.req else { return g.len };
        let id = self.win.id;
        let bytes = rma(self.world)
            .slot(id)
            .and_then(|s| s.origin.pending.get(&req))
            .map(|p| p.got);
        let bytes = bytes.unwrap_or_else(|| self.landed(req).unwrap_or(g.len * size_of::<T>()));
        bytes / size_of::<T>()
    }

    /// Waits until elements `range` of a request-based get have arrived, and lends them:
    /// a consumer starts on the first part of a large get while the rest moves.
    ///
    /// # Errors
    /// [`RmaError::InvalidArgument`] for a range outside the get; otherwise as for
    /// [`Ops::wait`].
    pub fn wait_range<'g>(
        &mut self,
        g: &'g mut Get<'b, T>,
        range: Range<usize>,
    ) -> Result<&'g [T], RmaError> {
        if range.start > range.end || range.end > g.len {
            return Err(RmaError::InvalidArgument(format!(
                "elements {range:?} of a get of {}",
                g.len
            )));
        }
        if let Some(req) = g.req {
            let want = range.end * size_of::<T>();
            let id = self.win.id;
            self.wait_lending(&|| "the first part of a get".into(), |w| {
                super::window::poll_xfers(w, id);
                rma(w)
                    .slot(id)
                    .and_then(|s| s.origin.pending.get(&req))
                    .is_none_or(|p| p.state != State::Waiting || p.got >= want)
            })?;
            self.copy_arrived(req)?;
        }
        // SAFETY: these elements have been copied into the buffer lent to the get, and
        // later copies write only past them.
        Ok(unsafe { std::slice::from_raw_parts(g.ptr.add(range.start), range.len()) })
    }

    /// Applies `op` with `src` to member `target`'s elements at `disp`, element by
    /// element atomically: every update of a window's element, from any origin, is one
    /// CPU atomic operation (by the origin where it maps the memory, by the target
    /// otherwise), or on a window whose executor is the card one device atomic (or a
    /// loop of compare-and-swaps), so concurrent accumulates never lose one another.
    ///
    /// # Errors
    /// As for [`Ops::put`], and [`RmaError::InvalidArgument`] for a bitwise operation on
    /// a floating-point type.
    pub fn accumulate(&mut self, src: &[T], target: u32, disp: usize, op: AccOp) -> Result<(), RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, src.len())?;
        defined::<T>(op)?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let size = size_of::<T>();
        let off = disp * size;
        if self.win.nic.is_some() {
            for (i, x) in bytes.chunks_exact(size).enumerate() {
                self.nic_update(target, off + i * size, T::TYPE_CODE, op, x)?;
            }
            return Ok(());
        }
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = [0u8; 8];
                for (i, x) in bytes.chunks_exact(size).enumerate() {
                    // SAFETY: `check` put the elements inside the member's memory, which
                    // is aligned for `T` and mapped here; every update of it is atomic.
                    unsafe {
                        elem::update(
                            T::TYPE_CODE,
                            op,
                            (a + off + i * size) as *mut u8,
                            x,
                            &mut old[..size],
                        )
                    }
                    .map_err(|why| self.refusal(target, why, off, bytes.len()))?;
                }
                Ok(())
            }
            Route::Cma { .. } | Route::Rdma(_) | Route::Am => {
                let max = self.max_payload(p.world, wire::ACC_HEAD) / size * size;
                for (i, chunk) in bytes.chunks(max.max(size)).enumerate() {
                    let head = self.acc_head(off + i * max, op);
                    self.send(p.world, wire::ACC, 0, 0, &[&head, chunk])?;
                    self.issued(target, false);
                }
                Ok(())
            }
        }
    }

    fn acc_head(&self, off: usize, op: AccOp) -> [u8; wire::ACC_HEAD]
    where
        T: Reducible,
    {
        wire::acc_head(AccHead {
            disp: off as u64,
            tag: self.win.type_tag,
            code: T::TYPE_CODE,
            op: op.code(),
        })
    }

    fn refusal(&self, target: u32, why: Refusal, off: usize, len: usize) -> RmaError {
        RmaError::Refused {
            target,
            why,
            disp: off as u64,
            len: len as u64,
            others: 0,
        }
    }

    /// Applies `op` with `src` as [`Ops::accumulate`] does, and puts what the elements
    /// held before into `result` (as long as `src`), which stays borrowed until the
    /// operation completes. With [`AccOp::NoOp`] it is an atomic read.
    ///
    /// # Errors
    /// As for [`Ops::accumulate`], and [`RmaError::InvalidArgument`] for buffers of
    /// different lengths.
    pub fn get_accumulate(
        &mut self,
        src: &[T],
        result: &'b mut [T],
        target: u32,
        disp: usize,
        op: AccOp,
    ) -> Result<(), RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        if src.len() != result.len() {
            return Err(RmaError::InvalidArgument(format!(
                "a get-accumulate of {} elements into {}",
                src.len(),
                result.len()
            )));
        }
        let p = self.check(target, disp, src.len())?;
        defined::<T>(op)?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let out: &mut [u8] = bytemuck::cast_slice_mut(result);
        let size = size_of::<T>();
        let off = disp * size;
        if self.win.nic.is_some() {
            for (i, (x, o)) in bytes
                .chunks_exact(size)
                .zip(out.chunks_exact_mut(size))
                .enumerate()
            {
                o.copy_from_slice(&self.nic_update(target, off + i * size, T::TYPE_CODE, op, x)?);
            }
            return Ok(());
        }
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                for (i, (x, o)) in bytes
                    .chunks_exact(size)
                    .zip(out.chunks_exact_mut(size))
                    .enumerate()
                {
                    // SAFETY: as for `accumulate`.
                    unsafe { elem::update(T::TYPE_CODE, op, (a + off + i * size) as *mut u8, x, o) }
                        .map_err(|why| self.refusal(target, why, off, bytes.len()))?;
                }
                Ok(())
            }
            Route::Cma { .. } | Route::Rdma(_) | Route::Am => {
                let max = (self.max_payload(p.world, wire::ACC_HEAD) / size * size).max(size);
                for (i, (chunk, dst)) in bytes.chunks(max).zip(out.chunks_mut(max)).enumerate() {
                    let req = self.request(p.world, Want::Data(chunk.len()))?;
                    let head = self.acc_head(off + i * max, op);
                    self.send(p.world, wire::GACC, 0, req, &[&head, chunk])?;
                    self.issued(target, true);
                    self.land(req, dst.as_mut_ptr(), dst.len());
                }
                Ok(())
            }
        }
    }

    /// Applies `op` with `x` to one element of member `target` and returns what it held
    /// before; complete at the target when it returns.
    ///
    /// # Errors
    /// As for [`Ops::accumulate`].
    pub fn fetch_and_op(&mut self, x: T, target: u32, disp: usize, op: AccOp) -> Result<T, RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, 1)?;
        defined::<T>(op)?;
        let size = size_of::<T>();
        let off = disp * size;
        if self.win.nic.is_some() {
            let old = self.nic_update(target, off, T::TYPE_CODE, op, bytemuck::bytes_of(&x))?;
            return Ok(bytemuck::pod_read_unaligned(&old));
        }
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = T::zeroed();
                // SAFETY: as for `accumulate`.
                unsafe {
                    elem::update(
                        T::TYPE_CODE,
                        op,
                        (a + off) as *mut u8,
                        bytemuck::bytes_of(&x),
                        bytemuck::bytes_of_mut(&mut old),
                    )
                }
                .map_err(|why| self.refusal(target, why, off, size))?;
                Ok(old)
            }
            Route::Cma { .. } | Route::Rdma(_) | Route::Am => {
                let req = self.request(p.world, Want::Data(size))?;
                let head = self.acc_head(off, op);
                self.send(p.world, wire::GACC, 0, req, &[&head, bytemuck::bytes_of(&x)])?;
                self.issued(target, true);
                let got = self.wait_reqs(&[req])?;
                Ok(bytemuck::pod_read_unaligned(&got[0]))
            }
        }
    }

    /// Stores `swap` in one element of member `target` if it holds `compare` (compared
    /// bit for bit), and returns what it held before; complete at the target when it
    /// returns.
    ///
    /// # Errors
    /// As for [`Ops::put`].
    pub fn compare_and_swap(&mut self, compare: T, swap: T, target: u32, disp: usize) -> Result<T, RmaError>
    where
        T: Reducible,
    {
        self.serve_others()?;
        let p = self.check(target, disp, 1)?;
        let size = size_of::<T>();
        let off = disp * size;
        if self.win.nic.is_some() {
            let old = self.nic_compare_swap(
                target,
                off,
                bytemuck::bytes_of(&compare),
                bytemuck::bytes_of(&swap),
            )?;
            return Ok(bytemuck::pod_read_unaligned(&old));
        }
        match p.route {
            Route::Own(a) | Route::Shm(a) => {
                let mut old = T::zeroed();
                // SAFETY: as for `accumulate`.
                unsafe {
                    elem::compare_and_swap(
                        size,
                        (a + off) as *mut u8,
                        bytemuck::bytes_of(&compare),
                        bytemuck::bytes_of(&swap),
                        bytemuck::bytes_of_mut(&mut old),
                    )
                }
                .map_err(|why| self.refusal(target, why, off, size))?;
                Ok(old)
            }
            Route::Cma { .. } | Route::Rdma(_) | Route::Am => {
                let req = self.request(p.world, Want::Data(size))?;
                let head = wire::acc_head(AccHead {
                    disp: off as u64,
                    tag: self.win.type_tag,
                    code: T::TYPE_CODE,
                    op: 0,
                });
                self.send(
                    p.world,
                    wire::CAS,
                    0,
                    req,
                    &[&head, bytemuck::bytes_of(&compare), bytemuck::bytes_of(&swap)],
                )?;
                self.issued(target, true);
                let got = self.wait_reqs(&[req])?;
                Ok(bytemuck::pod_read_unaligned(&got[0]))
            }
        }
    }
}

/// Refuses, at the origin, an operation not defined for `T`.
fn defined<T: Reducible>(op: AccOp) -> Result<(), RmaError> {
    let float = matches!(T::TYPE_CODE, 9 | 10);
    if float && matches!(op, AccOp::BitAnd | AccOp::BitOr | AccOp::BitXor) {
        return Err(RmaError::InvalidArgument(format!(
            "{op:?} is not defined for {}",
            std::any::type_name::<T>()
        )));
    }
    Ok(())
}
