//! Completion channels and queues: where finished work requests are reported.

use super::{Context, errno, rc_error};
use crate::verbs::VerbsError;
use rdma_mummy_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A completion channel: the descriptor a waiter sleeps on.
#[derive(Debug)]
pub struct Channel {
    ch: NonNull<ffi::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: as for Context.
unsafe impl Send for Channel {}
// SAFETY: as for Context.
unsafe impl Sync for Channel {}

impl Channel {
    /// A new channel on `ctx`, its descriptor non-blocking.
    ///
    /// # Errors
    /// The device refused one.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: a live context.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| VerbsError::call("ibv_create_comp_channel", errno()))?;
        let this = Self {
            ch,
            _ctx: Arc::clone(ctx),
        };
        let fd = this.raw_fd();
        // SAFETY: the channel's own live descriptor; only its flags change.
        let rc = unsafe {
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            )
        };
        if rc < 0 {
            return Err(VerbsError::call(
                "making the completion channel non-blocking",
                errno(),
            ));
        }
        Ok(Arc::new(this))
    }

    fn raw_fd(&self) -> RawFd {
        // SAFETY: a live channel; its descriptor does not change.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The descriptor, readable when an armed completion queue has an event.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor lives as long as the channel, which `self` borrows.
        unsafe { BorrowedFd::borrow_raw(self.raw_fd()) }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every queue on the channel holds an Arc of it, so none is left.
        unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

/// A work completion, as much of it as the netmods read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request's own number.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or why it failed.
    pub status: u32,
    /// Whether it completes a receive.
    pub recv: bool,
    /// Bytes received.
    pub byte_len: u32,
    /// The sending queue pair (UD receives).
    pub src_qp: u32,
    /// Our queue pair it belongs to (receives through a shared receive queue).
    pub qp_num: u32,
    /// Whether a GRH precedes the data (UD receives).
    pub grh: bool,
}

impl Completion {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The status's name, for messages.
    pub fn status_name(&self) -> String {
        // SAFETY: the call returns a static string for any status.
        let s = unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(self.status)) };
        s.to_string_lossy().into_owned()
    }
}

/// A completion queue on a channel.
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    channel: Arc<Channel>,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
}

// SAFETY: as for Context; polling needs `&mut self`.
unsafe impl Send for Cq {}

/// Events acknowledged at once: acknowledging takes a lock in the library.
const ACK_BATCH: u32 = 64;

impl Cq {
    /// A queue of `entries` on `channel`.
    ///
    /// # Errors
    /// The device refused one.
    pub fn new(ctx: &Arc<Context>, channel: &Arc<Channel>, entries: u32) -> Result<Self, VerbsError> {
        let n = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: a live context and channel; no user context pointer.
        let cq = unsafe { ffi::ibv_create_cq(ctx.as_ptr(), n, ptr::null_mut(), channel.ch.as_ptr(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::call("ibv_create_cq", errno()))?;
        Ok(Self {
            cq,
            channel: Arc::clone(channel),
            unacked: 0,
        })
    }

    /// Takes up to `max` completions (32 at most) into `out`; returns how many.
    ///
    /// # Errors
    /// The queue failed (overrun).
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, VerbsError> {
        const BATCH: usize = 32;
        let mut wc = [const { std::mem::MaybeUninit::<ffi::ibv_wc>::uninit() }; BATCH];
        let want = i32::try_from(max.min(BATCH)).unwrap_or(1);
        // SAFETY: a live queue, and room for `want` completions, which the call writes.
        let n = unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), want, wc.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(VerbsError::call("ibv_poll_cq", rc_error(-n)));
        }
        let n = (n as usize).min(BATCH);
        for w in &wc[..n] {
            // SAFETY: the call wrote the first `n` completions.
            let w = unsafe { w.assume_init_ref() };
            out.push(Completion {
                wr_id: w.wr_id,
                status: w.status,
                recv: w.opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0,
                byte_len: w.byte_len,
                src_qp: w.src_qp,
                qp_num: w.qp_num,
                grh: w.wc_flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0,
            });
        }
        Ok(n)
    }

    /// Arms the queue: the channel becomes readable at its next completion.
    ///
    /// # Errors
    /// The call failed.
    pub fn arm(&mut self) -> Result<(), VerbsError> {
        // SAFETY: a live queue.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_req_notify_cq", rc_error(rc)));
        }
        Ok(())
    }

    /// Takes the events waiting on the channel (it is non-blocking), acknowledging them in
    /// batches.
    ///
    /// # Errors
    /// Reading the channel failed other than by having nothing.
    pub fn take_events(&mut self) -> Result<(), VerbsError> {
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live channel; the call writes two pointers we only compare.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel.ch.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc != 0 {
                let e = errno();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(());
                }
                return Err(VerbsError::call("ibv_get_cq_event", e));
            }
            self.unacked += 1;
            if self.unacked >= ACK_BATCH {
                self.ack();
            }
        }
    }

    fn ack(&mut self) {
        if self.unacked > 0 {
            // SAFETY: a live queue, and events taken from its channel.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
    }

    /// The channel.
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    pub(super) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.cq.as_ptr()
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // Destroying a queue waits for every event taken from it to be acknowledged.
        self.ack();
        // SAFETY: its queue pairs are gone (their owners drop them first).
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}
