//! The `rc` netmod's [`Rdma`]: RDMA read and write, and the device's 8-byte atomics,
//! on a peer's connected pair.
//!
//! Memory is registered on demand and deregistered when the caller is done with it. A
//! cache of registrations would save the registration on a buffer used again, but is
//! sound only with a hook that learns when memory is unmapped (the pages behind a cached
//! range may change); without one, every registration is the caller's.

use super::{Link, NO_SLOT, RcNetmod, SEND_DEPTH, SEQ_BITS};
use crate::rdma::{OpId, Rdma, RdmaError, Registration, Remote, Seg};
use crate::verbs::raw::{Mr, OneSided, Sge};
use std::collections::VecDeque;

impl RcNetmod {
    /// Posts one one-sided operation to `peer` between `local` and `remote`.
    fn one_sided(
        &mut self,
        peer: u32,
        op: OneSided,
        local: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, RdmaError> {
        if peer >= self.size {
            return Err(RdmaError::BadKey {
                peer,
                why: format!("rank {peer} is not a peer of this job of {}", self.size),
            });
        }
        if (local.len as u64) > remote.len {
            return Err(RdmaError::BadKey {
                peer,
                why: format!("{} bytes do not fit its region of {}", local.len, remote.len),
            });
        }
        let inside = reg.remote.addr <= local.ptr as u64
            && (local.ptr as u64).saturating_add(local.len as u64)
                <= reg.remote.addr.saturating_add(reg.remote.len);
        if !inside {
            return Err(RdmaError::BadKey {
                peer,
                why: "the local bytes lie outside their registration".into(),
            });
        }
        let failed = |why: String| RdmaError::Failed { peer, why };
        let p = self.make_peer(peer).map_err(|e| failed(e.to_string()))?;
        match &p.link {
            Link::Up => {}
            Link::Connecting { .. } => {
                // The connection request goes from the next poll.
                return Err(RdmaError::Again { peer });
            }
            Link::Failed(why) => return Err(failed(why.clone())),
            Link::Left => return Err(failed("it left the job".into())),
        }
        if p.posted.len() >= SEND_DEPTH as usize {
            let _ = self.reap();
            return Err(RdmaError::Again { peer });
        }
        let wr_id = (u64::from(peer) << SEQ_BITS) | (p.seq & ((1 << SEQ_BITS) - 1));
        let sge = Sge {
            addr: local.ptr,
            len: u32::try_from(local.len).map_err(|_| failed("more than 4 GiB at once".into()))?,
            lkey: reg.lkey,
        };
        // SAFETY: the caller keeps `local` as the trait's contract says, and it lies in
        // its registration (checked above).
        unsafe { p.qp.post_one_sided(wr_id, op, sge, remote.addr, remote.rkey) }
            .map_err(|e| failed(e.to_string()))?;
        p.posted.push_back(NO_SLOT);
        p.seq += 1;
        if matches!(op, OneSided::Read | OneSided::Write) {
            self.stats.rdma_bytes += local.len as u64;
        }
        self.ops.insert(wr_id, None);
        Ok(OpId(wr_id))
    }

    /// Keeps a new registration of `seg` under the next handle.
    fn keep(
        &mut self,
        seg: Seg,
        mr: Result<Mr, crate::verbs::VerbsError>,
    ) -> Result<Registration, RdmaError> {
        let mr = mr.map_err(|e| RdmaError::Register {
            bytes: seg.len,
            why: e.to_string(),
        })?;
        self.next_reg += 1;
        let reg = Registration {
            handle: self.next_reg,
            lkey: mr.lkey(),
            remote: Remote {
                addr: seg.ptr as u64,
                len: seg.len as u64,
                rkey: mr.rkey(),
            },
        };
        self.regs.insert(self.next_reg, mr);
        Ok(reg)
    }

    fn atomic(
        &mut self,
        peer: u32,
        op: OneSided,
        result: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, RdmaError> {
        if !self.atomics {
            return Err(RdmaError::NoAtomics);
        }
        if result.len != 8 || remote.len < 8 || remote.addr % 8 != 0 {
            return Err(RdmaError::BadKey {
                peer,
                why: "an atomic works on one aligned 8-byte word".into(),
            });
        }
        self.one_sided(peer, op, result, reg, Remote { len: 8, ..remote })
    }
}

impl Rdma for RcNetmod {
    fn has_atomics(&self) -> bool {
        self.atomics
    }

    fn register(&mut self, seg: Seg) -> Result<Registration, RdmaError> {
        // SAFETY: the trait's contract: the caller deregisters before freeing the bytes.
        let mr = unsafe { Mr::new(&self.pd, seg.ptr, seg.len) };
        self.keep(seg, mr)
    }

    fn register_read(&mut self, seg: Seg) -> Result<Registration, RdmaError> {
        // SAFETY: as in `register`.
        let mr = unsafe { Mr::read_only(&self.pd, seg.ptr, seg.len) };
        self.keep(seg, mr)
    }

    fn deregister(&mut self, reg: &Registration) {
        self.regs.remove(&reg.handle);
    }

    unsafe fn get(
        &mut self,
        peer: u32,
        local: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, RdmaError> {
        self.one_sided(peer, OneSided::Read, local, reg, remote)
    }

    unsafe fn put(
        &mut self,
        peer: u32,
        local: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, RdmaError> {
        self.one_sided(peer, OneSided::Write, local, reg, remote)
    }

    unsafe fn fetch_add(
        &mut self,
        peer: u32,
        result: Seg,
        reg: &Registration,
        remote: Remote,
        add: u64,
    ) -> Result<OpId, RdmaError> {
        self.atomic(peer, OneSided::FetchAdd(add), result, reg, remote)
    }

    unsafe fn compare_swap(
        &mut self,
        peer: u32,
        result: Seg,
        reg: &Registration,
        remote: Remote,
        compare: u64,
        swap: u64,
    ) -> Result<OpId, RdmaError> {
        self.atomic(peer, OneSided::CompareSwap(compare, swap), result, reg, remote)
    }

    fn test(&mut self, op: OpId) -> Result<bool, RdmaError> {
        let peer = (op.0 >> SEQ_BITS) as u32;
        let failed = |why: String| RdmaError::Failed { peer, why };
        if !self.ops.contains_key(&op.0) {
            return Err(failed(format!("operation {:#x} is not under way", op.0)));
        }
        if matches!(self.ops.get(&op.0), Some(None)) {
            // Send-side completions now; received packets wait for the next poll.
            self.reap().map_err(|e| failed(e.to_string()))?;
            let mut keep = VecDeque::new();
            while let Some(c) = self.stash.pop_front() {
                if c.recv {
                    keep.push_back(c);
                } else {
                    self.complete(c, &mut |_, _, _| {})
                        .map_err(|e| failed(e.to_string()))?;
                }
            }
            self.stash = keep;
        }
        match self.ops.get(&op.0) {
            Some(Some(_)) => match self.ops.remove(&op.0) {
                Some(Some(Ok(()))) => Ok(true),
                Some(Some(Err(why))) => Err(failed(why)),
                _ => Ok(false),
            },
            _ => Ok(false),
        }
    }
}
