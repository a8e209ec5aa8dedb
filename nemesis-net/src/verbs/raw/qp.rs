//! Queue pairs, shared receive queues and address handles: where work requests are
//! posted.

use super::{Cq, OneSided, Pd, errno, rc_error};
use crate::verbs::VerbsError;
use rdma_mummy_sys as ffi;
use std::io;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Posts one receive of `len` bytes at `addr` with key `lkey` through `post` (a pair's
/// receive queue, or a shared one), which gets the request and the place for a bad one.
fn post_one_recv(
    what: &'static str,
    wr_id: u64,
    addr: *mut u8,
    len: u32,
    lkey: u32,
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> i32,
) -> Result<(), VerbsError> {
    let mut sge = ffi::ibv_sge {
        addr: addr as u64,
        length: len,
        lkey,
    };
    let mut wr = ffi::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = ptr::null_mut();
    let rc = post(&mut wr, &mut bad);
    if rc != 0 {
        return Err(VerbsError::call(what, rc_error(rc)));
    }
    Ok(())
}

/// A scatter-gather element: bytes of a registered region, or of any memory when the
/// request is inline.
#[derive(Debug, Clone, Copy)]
pub struct Sge {
    /// The first byte.
    pub addr: *const u8,
    /// Bytes.
    pub len: u32,
    /// The region's key (ignored inline).
    pub lkey: u32,
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle.
    pub ah: &'a Ah,
    /// The queue pair's number.
    pub qpn: u32,
    /// The queue key.
    pub qkey: u32,
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    /// What the device granted.
    pub cap: QpCap,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context; posting needs `&mut self`.
unsafe impl Send for Qp {}

/// What a queue pair was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send requests at once.
    pub send: u32,
    /// Receive requests at once.
    pub recv: u32,
    /// Scatter-gather elements of a send.
    pub send_sge: u32,
    /// Bytes a send may carry inline.
    pub inline: u32,
}

impl Qp {
    /// A UD queue pair on `cq` (sends and receives), brought to RTS with queue key
    /// `qkey` on `port`.
    ///
    /// # Errors
    /// The device refused the pair or a state change.
    pub fn ud(pd: &Arc<Pd>, cq: &Cq, cap: QpCap, port: u8, qkey: u32) -> Result<Self, VerbsError> {
        let qp = Self::create(pd, cq, None, cap, ffi::ibv_qp_type::IBV_QPT_UD)?;
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        qp.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
        )?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        qp.modify(&mut a, m::IBV_QP_STATE)?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        qp.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_SQ_PSN)?;
        Ok(qp)
    }

    /// An RC queue pair on `cq`, receiving through `srq`, in INIT on `port` with every
    /// remote access allowed; [`Qp::connect`] brings it to RTS.
    ///
    /// # Errors
    /// The device refused the pair or the state change.
    pub fn rc(pd: &Arc<Pd>, cq: &Cq, srq: &Srq, cap: QpCap, port: u8) -> Result<Self, VerbsError> {
        let qp = Self::create(pd, cq, Some(srq), cap, ffi::ibv_qp_type::IBV_QPT_RC)?;
        use ffi::ibv_access_flags as acc;
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = acc::IBV_ACCESS_LOCAL_WRITE.0
            | acc::IBV_ACCESS_REMOTE_WRITE.0
            | acc::IBV_ACCESS_REMOTE_READ.0
            | acc::IBV_ACCESS_REMOTE_ATOMIC.0;
        qp.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
        )?;
        Ok(qp)
    }

    /// Brings an RC pair from INIT to RTS, connected to `to`. Its ACK timeout and
    /// [`RETRY_CNT`] make a dead peer an error completion (on rxe a `timeout` of 0 or a
    /// `retry_cnt` of 7 mean "retry forever"); a receiver out of buffers is retried
    /// without end (`rnr_retry` 7), as it is alive.
    ///
    /// # Errors
    /// The device refused a state change.
    pub fn connect(&self, to: RcPath) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_enum(to.mtu);
        a.dest_qp_num = to.qpn;
        a.rq_psn = to.their_psn;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ffi::ibv_gid { raw: to.gid };
        a.ah_attr.grh.sgid_index = to.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = to.port;
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
        )?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = to.our_psn;
        a.timeout = to.timeout;
        a.retry_cnt = RETRY_CNT;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn create(
        pd: &Arc<Pd>,
        cq: &Cq,
        srq: Option<&Srq>,
        cap: QpCap,
        ty: ffi::ibv_qp_type::Type,
    ) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.srq = srq.map_or(ptr::null_mut(), |s| s.srq.as_ptr());
        init.qp_type = ty;
        init.cap.max_send_wr = cap.send;
        init.cap.max_recv_wr = cap.recv;
        init.cap.max_send_sge = cap.send_sge;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = cap.inline;
        // SAFETY: a live domain and queue; `init` is read and its `cap` written back.
        let mut qp = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut init) };
        if qp.is_null() && cap.inline > 0 {
            // Some devices refuse any inline data: ask again without.
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut init) };
        }
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::call("ibv_create_qp", errno()))?;
        Ok(Self {
            qp,
            cap: QpCap {
                send: init.cap.max_send_wr,
                recv: init.cap.max_recv_wr,
                send_sge: init.cap.max_send_sge,
                inline: init.cap.max_inline_data,
            },
            _pd: Arc::clone(pd),
        })
    }

    fn modify(&self, a: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> Result<(), VerbsError> {
        // SAFETY: a live pair and a live attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), a, i32::try_from(mask.0).unwrap_or(0)) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_modify_qp", rc_error(rc)));
        }
        Ok(())
    }

    /// The pair's number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: a live pair; the number does not change.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// Posts one receive of `len` bytes at `addr` of a region with key `lkey`.
    ///
    /// # Safety
    /// The bytes must stay allocated and registered, and be neither read nor written by
    /// anyone else, until the receive completes or the pair is destroyed.
    pub unsafe fn post_recv(
        &mut self,
        wr_id: u64,
        addr: *mut u8,
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        let qp = self.qp.as_ptr();
        // SAFETY: a live pair; the request is read during the call; the caller keeps the
        // bytes as the contract says.
        post_one_recv("ibv_post_recv", wr_id, addr, len, lkey, |wr, bad| unsafe {
            ffi::ibv_post_recv(qp, wr, bad)
        })
    }

    /// Posts one signalled one-sided operation between `local` and `remote_addr` of the
    /// peer's registration `rkey`.
    ///
    /// # Safety
    /// `local` must lie in a registration and stay valid (for writing, unless a
    /// [`OneSided::Write`]) and unused until the operation completes.
    ///
    /// # Errors
    /// The queue refused it.
    pub unsafe fn post_one_sided(
        &mut self,
        wr_id: u64,
        op: OneSided,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<(), VerbsError> {
        let mut sge = ffi::ibv_sge {
            addr: local.addr as u64,
            length: local.len,
            lkey: local.lkey,
        };
        // SAFETY: plain data (pointers may be null), valid when all zero.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        use ffi::ibv_wr_opcode as o;
        match op {
            OneSided::Read | OneSided::Write => {
                wr.opcode = if op == OneSided::Read {
                    o::IBV_WR_RDMA_READ
                } else {
                    o::IBV_WR_RDMA_WRITE
                };
                wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
            }
            OneSided::FetchAdd(add) => {
                wr.opcode = o::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            OneSided::CompareSwap(compare, swap) => {
                wr.opcode = o::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live pair; the request and its element are read during the call;
        // the caller keeps the local bytes as the contract says.
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_send", rc_error(rc)));
        }
        Ok(())
    }

    /// Posts one send of `sges`, to `to` on a UD pair (`None` on a connected one);
    /// inline when `inline` (the bytes are copied during the call, any memory will do);
    /// with a completion when `signaled` (an error always makes one).
    ///
    /// # Safety
    /// Unless inline, the bytes must stay allocated, registered and unchanged until the
    /// send completes or the pair is destroyed.
    pub unsafe fn post_send(
        &mut self,
        wr_id: u64,
        sges: &[Sge],
        to: Option<UdDest<'_>>,
        inline: bool,
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let mut list = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 4];
        if sges.len() > list.len() {
            return Err(VerbsError::call(
                "ibv_post_send",
                io::Error::new(io::ErrorKind::InvalidInput, "more than 4 pieces"),
            ));
        }
        for (l, s) in list.iter_mut().zip(sges) {
            *l = ffi::ibv_sge {
                addr: s.addr as u64,
                length: s.len,
                lkey: s.lkey,
            };
        }
        // SAFETY: plain data (pointers may be null), valid when all zero.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = sges.len() as i32;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        if signaled {
            wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if let Some(to) = to {
            wr.wr.ud = ffi::ud_t {
                ah: to.ah.ah.as_ptr(),
                remote_qpn: to.qpn,
                remote_qkey: to.qkey,
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live pair and address handle; the request and list are read during
        // the call; the caller keeps the bytes as the contract says.
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_send", rc_error(rc)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: a live pair, destroyed once; what its requests named is freed only
        // after this (its owner keeps the pair before the memory).
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// Where an RC pair connects to, and the packet numbers each side starts from.
#[derive(Debug, Clone, Copy)]
pub struct RcPath {
    /// The peer's pair.
    pub qpn: u32,
    /// The peer's port GID.
    pub gid: [u8; 16],
    /// Our GID's index and port.
    pub sgid_index: u8,
    /// Our port.
    pub port: u8,
    /// The path MTU in bytes (256 to 4096).
    pub mtu: usize,
    /// The first packet number we send, and the first the peer sends.
    pub our_psn: u32,
    /// See `our_psn`.
    pub their_psn: u32,
    /// The ACK timeout's exponent: 4.096 µs × 2^`timeout` (see [`ack_timeout_for`]).
    pub timeout: u8,
}

/// Retries of an unacknowledged RC packet; rxe takes 7 for "forever".
pub const RETRY_CNT: u8 = 6;

/// The largest ACK-timeout exponent (12 to 20) with which a pair gives up on a silent
/// peer, after its first try and [`RETRY_CNT`] more, within `within`: 4.096 µs × 2^t
/// per try. Longer tries spare a slow but live peer spurious retransmissions; the bound
/// keeps a dead one found in time.
pub fn ack_timeout_for(within: std::time::Duration) -> u8 {
    let tries = f64::from(RETRY_CNT) + 1.0;
    (12..=20)
        .rev()
        .find(|&t| tries * 4.096e-6 * f64::from(1u32 << t) <= within.as_secs_f64())
        .unwrap_or(12)
}

/// An `ibv_mtu` for a size in bytes (the largest not above it).
fn mtu_enum(bytes: usize) -> ffi::ibv_mtu::Type {
    match bytes {
        4096.. => ffi::ibv_mtu::IBV_MTU_4096,
        2048.. => ffi::ibv_mtu::IBV_MTU_2048,
        1024.. => ffi::ibv_mtu::IBV_MTU_1024,
        512.. => ffi::ibv_mtu::IBV_MTU_512,
        _ => ffi::ibv_mtu::IBV_MTU_256,
    }
}

/// A shared receive queue: one ring of receives for every RC pair.
#[derive(Debug)]
pub struct Srq {
    srq: NonNull<ffi::ibv_srq>,
    /// Receives it holds at most.
    pub depth: u32,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context; posting needs `&mut self`.
unsafe impl Send for Srq {}

impl Srq {
    /// A queue of `depth` receives on `pd`.
    ///
    /// # Errors
    /// The device refused it.
    pub fn new(pd: &Arc<Pd>, depth: u32) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut init: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = depth;
        init.attr.max_sge = 1;
        // SAFETY: a live domain and attribute struct; `attr` is written back.
        let srq = unsafe { ffi::ibv_create_srq(pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| VerbsError::call("ibv_create_srq", errno()))?;
        Ok(Self {
            srq,
            depth: init.attr.max_wr.max(1),
            _pd: Arc::clone(pd),
        })
    }

    /// Posts one receive of `len` bytes at `addr` of a region with key `lkey`.
    ///
    /// # Safety
    /// As for [`Qp::post_recv`]: the bytes must stay allocated, registered and
    /// untouched until the receive completes or the queue is destroyed.
    pub unsafe fn post_recv(
        &mut self,
        wr_id: u64,
        addr: *mut u8,
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        let srq = self.srq.as_ptr();
        // SAFETY: a live queue; the request is read during the call; the caller keeps
        // the bytes as the contract says.
        post_one_recv("ibv_post_srq_recv", wr_id, addr, len, lkey, |wr, bad| unsafe {
            ffi::ibv_post_srq_recv(srq, wr, bad)
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: a live queue, destroyed once, after the pairs that use it (their
        // owner keeps them before it).
        unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// An address handle: the way to one remote port, for UD sends.
#[derive(Debug)]
pub struct Ah {
    ah: NonNull<ffi::ibv_ah>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context.
unsafe impl Send for Ah {}

impl Ah {
    /// The way to `gid` from our `port` and GID `sgid_index` (RoCE and routed IB need the
    /// global header; it does no harm on a subnet).
    ///
    /// # Errors
    /// The device refused it (an unreachable GID).
    pub fn new(pd: &Arc<Pd>, port: u8, sgid_index: u8, gid: [u8; 16]) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.grh.dgid = ffi::ibv_gid { raw: gid };
        a.grh.sgid_index = sgid_index;
        a.grh.hop_limit = 64;
        a.port_num = port;
        // SAFETY: a live domain and attribute struct.
        let ah = unsafe { ffi::ibv_create_ah(pd.as_ptr(), &mut a) };
        let ah = NonNull::new(ah).ok_or_else(|| VerbsError::call("ibv_create_ah", errno()))?;
        Ok(Self {
            ah,
            _pd: Arc::clone(pd),
        })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: a live handle, destroyed once; a send naming it has completed or its
        // pair is gone (the endpoint drops its pair first).
        unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}
