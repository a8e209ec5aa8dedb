//! The hook through which a network module with RDMA (InfiniBand verbs RC) offers
//! large transfers: get and put on registered memory.
//!
//! A netmod implements [`Rdma`]. A sender registers its buffer and ships the
//! [`Remote`] key in its RTS; the receiver registers its own buffer, posts a get, and
//! tests it from the progress engine, then sends DONE — the same get mode that CMA uses
//! between local processes, with the NIC doing the copy. Put is the mirror image, with
//! the key in the CTS.

use crate::{LmtError, Seg};

/// What a peer needs to reach registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Address in the owner's space.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The access key of the registration.
    pub rkey: u32,
}

impl Remote {
    /// Bytes of [`Remote::encode`].
    pub const WIRE: usize = 20;

    /// Its form in a cookie.
    pub fn encode(&self) -> [u8; Self::WIRE] {
        let mut b = [0u8; Self::WIRE];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Reads a cookie from `peer`.
    pub fn decode(peer: u32, b: &[u8]) -> Result<Self, LmtError> {
        if b.len() != Self::WIRE {
            return Err(LmtError::BadCookie {
                peer,
                why: format!("an RDMA key of {} bytes, not {}", b.len(), Self::WIRE),
            });
        }
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Self {
            addr: w(0),
            len: w(8),
            rkey: u32::from_le_bytes(b[16..].try_into().expect("4 bytes")),
        })
    }
}

/// A registration of local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The netmod's handle.
    pub handle: u64,
    /// The local key.
    pub lkey: u32,
    /// What a peer needs to reach it.
    pub remote: Remote,
}

/// An operation posted and not yet known to be complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId(pub u64);

/// One-sided transfers on registered memory, as a network module offers them.
pub trait Rdma {
    /// Registers `seg` for local and remote access.
    ///
    /// # Errors
    /// The device refuses the registration (limits on pinned memory).
    fn register(&mut self, seg: Seg) -> Result<Registration, LmtError>;

    /// Ends a registration.
    fn deregister(&mut self, reg: &Registration);

    /// Posts a read of `remote` on `peer` into `local`, which `reg` covers.
    ///
    /// # Safety
    /// `local` must stay valid for writing, and unused, until the operation completes.
    ///
    /// # Errors
    /// A queue that cannot take the operation now, or a dead connection.
    unsafe fn get(
        &mut self,
        peer: u32,
        local: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, LmtError>;

    /// Posts a write of `local`, which `reg` covers, into `remote` on `peer`.
    ///
    /// # Safety
    /// `local` must stay valid for reading, and unchanged, until the operation completes.
    ///
    /// # Errors
    /// As for [`Rdma::get`].
    unsafe fn put(
        &mut self,
        peer: u32,
        local: Seg,
        reg: &Registration,
        remote: Remote,
    ) -> Result<OpId, LmtError>;

    /// Whether `op` is complete; an error if it failed.
    ///
    /// # Errors
    /// The completion reported a failure (a bad key, a dead peer).
    fn test(&mut self, op: OpId) -> Result<bool, LmtError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A device whose "peers" are this process: keys name registered local memory, and
    /// operations complete on the second test, as a real completion queue might.
    #[derive(Default)]
    struct Loopback {
        regs: HashMap<u32, Seg>,
        ops: HashMap<u64, u32>,
        next: u32,
    }

    impl Loopback {
        fn check(&self, remote: Remote, len: usize) -> Result<Seg, LmtError> {
            let bad = |why: &str| LmtError::BadCookie {
                peer: 0,
                why: why.into(),
            };
            let s = *self.regs.get(&remote.rkey).ok_or_else(|| bad("unknown key"))?;
            let start = remote
                .addr
                .checked_sub(s.ptr as u64)
                .ok_or_else(|| bad("below the region"))?;
            if start + len as u64 > s.len as u64 {
                return Err(bad("beyond the region"));
            }
            Ok(Seg {
                ptr: s.ptr.wrapping_add(start as usize),
                len,
            })
        }
    }

    impl Rdma for Loopback {
        fn register(&mut self, seg: Seg) -> Result<Registration, LmtError> {
            self.next += 1;
            self.regs.insert(self.next, seg);
            Ok(Registration {
                handle: self.next as u64,
                lkey: self.next,
                remote: Remote {
                    addr: seg.ptr as u64,
                    len: seg.len as u64,
                    rkey: self.next,
                },
            })
        }
        fn deregister(&mut self, reg: &Registration) {
            self.regs.remove(&reg.remote.rkey);
        }
        unsafe fn get(
            &mut self,
            _: u32,
            local: Seg,
            _: &Registration,
            remote: Remote,
        ) -> Result<OpId, LmtError> {
            let src = self.check(remote, local.len)?;
            // SAFETY: both regions are registered, live and `local.len` long.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr, local.ptr, local.len) };
            self.next += 1;
            self.ops.insert(self.next as u64, 2);
            Ok(OpId(self.next as u64))
        }
        unsafe fn put(
            &mut self,
            _: u32,
            local: Seg,
            _: &Registration,
            remote: Remote,
        ) -> Result<OpId, LmtError> {
            let dst = self.check(remote, local.len)?;
            // SAFETY: as in `get`.
            unsafe { std::ptr::copy_nonoverlapping(local.ptr, dst.ptr, local.len) };
            self.next += 1;
            self.ops.insert(self.next as u64, 2);
            Ok(OpId(self.next as u64))
        }
        fn test(&mut self, op: OpId) -> Result<bool, LmtError> {
            let left = self.ops.get_mut(&op.0).expect("a posted op");
            *left -= 1;
            Ok(*left == 0)
        }
    }

    /// The get mode as the two-sided layer drives it, over the hook.
    #[test]
    fn a_get_through_the_hook_moves_the_message_and_bad_keys_are_refused() {
        let mut dev = Loopback::default();
        let msg: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let sreg = dev.register(Seg::of(&msg)).unwrap();
        let cookie = sreg.remote.encode();

        let mut dst = vec![0u8; msg.len()];
        let rreg = dev.register(Seg::of_mut(&mut dst)).unwrap();
        let remote = Remote::decode(1, &cookie).unwrap();
        // SAFETY: `dst` is live and unused until the op completes below.
        let op = unsafe { dev.get(1, Seg::of_mut(&mut dst), &rreg, remote) }.unwrap();
        while !dev.test(op).unwrap() {}
        assert_eq!(dst, msg);

        let bad = Remote { rkey: 99, ..remote };
        // SAFETY: as above.
        assert!(unsafe { dev.get(1, Seg::of_mut(&mut dst), &rreg, bad) }.is_err());
        assert!(Remote::decode(1, &cookie[..5]).is_err());
        dev.deregister(&sreg);
        dev.deregister(&rreg);
    }
}
