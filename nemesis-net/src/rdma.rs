//! The hook through which a network module with RDMA (InfiniBand verbs RC) offers
//! one-sided access to registered memory: get and put for large transfers, and 8-byte
//! fetch-and-add and compare-and-swap for the one-sided layer.
//!
//! A netmod implements [`Rdma`] ([`crate::Netmod::rdma`]). For a large message a sender
//! registers its buffer and ships the [`Remote`] key in its RTS; the receiver registers
//! its own buffer, posts a get, and tests it from the progress engine, then sends DONE:
//! the same get mode that CMA uses between local processes, with the NIC doing the copy.
//! Put is the mirror image, with the key in the CTS. It lives here, beside the netmods,
//! so that both they and the large-message layer above can name it.

pub use nemesis_shm::ring::Seg;

/// Why an RDMA operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// A key from a peer that cannot be used.
    #[error("bad RDMA key from rank {peer}: {why}")]
    BadKey {
        /// The peer.
        peer: u32,
        /// What is wrong.
        why: String,
    },
    /// Memory could not be registered (usually the memory-lock limit, named).
    #[error("registering {bytes} bytes: {why}")]
    Register {
        /// Bytes asked for.
        bytes: usize,
        /// Why, with what to do.
        why: String,
    },
    /// The operation cannot go now: the peer is not connected yet, or its queue is
    /// full. Try again after polling.
    #[error("no room for an RDMA operation to rank {peer} now")]
    Again {
        /// The peer.
        peer: u32,
    },
    /// The device has no atomics.
    #[error("this device does no RDMA atomics")]
    NoAtomics,
    /// The operation, or the peer, failed.
    #[error("RDMA to rank {peer} failed: {why}")]
    Failed {
        /// The peer.
        peer: u32,
        /// Why, as the completion says.
        why: String,
    },
}

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

    /// Reads a key from `peer`.
    ///
    /// # Errors
    /// [`RdmaError::BadKey`] when it is not one.
    pub fn decode(peer: u32, b: &[u8]) -> Result<Self, RdmaError> {
        if b.len() != Self::WIRE {
            return Err(RdmaError::BadKey {
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
    /// Registers `seg` for local and remote access: peers may read, write and update it.
    ///
    /// # Errors
    /// The device refuses the registration (limits on pinned memory).
    fn register(&mut self, seg: Seg) -> Result<Registration, RdmaError>;

    /// Registers `seg` for peers to read only: a send buffer lent for a large message,
    /// which a peer must not be able to change (and which may lie in read-only pages).
    ///
    /// # Errors
    /// As for [`Rdma::register`].
    fn register_read(&mut self, seg: Seg) -> Result<Registration, RdmaError> {
        self.register(seg)
    }

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
    ) -> Result<OpId, RdmaError>;

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
    ) -> Result<OpId, RdmaError>;

    /// Posts an atomic add of `add` to the 8-byte word `remote` on `peer`; the word's
    /// value before lands in `result` (8 bytes that `reg` covers).
    ///
    /// # Safety
    /// `result` must stay valid for writing, and unused, until the operation completes.
    ///
    /// # Errors
    /// As for [`Rdma::get`], [`RdmaError::NoAtomics`], or a word that is not 8 bytes
    /// and aligned.
    unsafe fn fetch_add(
        &mut self,
        peer: u32,
        result: Seg,
        reg: &Registration,
        remote: Remote,
        add: u64,
    ) -> Result<OpId, RdmaError>;

    /// Posts an atomic compare-and-swap of the 8-byte word `remote` on `peer`: it becomes
    /// `swap` if it was `compare`; its value before lands in `result`.
    ///
    /// # Safety
    /// As for [`Rdma::fetch_add`].
    ///
    /// # Errors
    /// As for [`Rdma::fetch_add`].
    unsafe fn compare_swap(
        &mut self,
        peer: u32,
        result: Seg,
        reg: &Registration,
        remote: Remote,
        compare: u64,
        swap: u64,
    ) -> Result<OpId, RdmaError>;

    /// Whether [`Rdma::fetch_add`] and [`Rdma::compare_swap`] run here: on every
    /// member, this process's own rank included, so that the device can be the one
    /// executor of a word.
    fn has_atomics(&self) -> bool {
        false
    }

    /// Whether `op` is complete; an error if it failed.
    ///
    /// # Errors
    /// The completion reported a failure (a bad key, a dead peer).
    fn test(&mut self, op: OpId) -> Result<bool, RdmaError>;
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
        fn check(&self, remote: Remote, len: usize) -> Result<Seg, RdmaError> {
            let bad = |why: &str| RdmaError::BadKey {
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
        fn register(&mut self, seg: Seg) -> Result<Registration, RdmaError> {
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
        ) -> Result<OpId, RdmaError> {
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
        ) -> Result<OpId, RdmaError> {
            let dst = self.check(remote, local.len)?;
            // SAFETY: as in `get`.
            unsafe { std::ptr::copy_nonoverlapping(local.ptr, dst.ptr, local.len) };
            self.next += 1;
            self.ops.insert(self.next as u64, 2);
            Ok(OpId(self.next as u64))
        }
        unsafe fn fetch_add(
            &mut self,
            _: u32,
            result: Seg,
            _: &Registration,
            remote: Remote,
            add: u64,
        ) -> Result<OpId, RdmaError> {
            let w = self.check(remote, 8)?;
            // SAFETY: both are registered, live and 8 bytes long; unaligned access is
            // used, as a test needs no atomicity.
            unsafe {
                let old = w.ptr.cast::<u64>().read_unaligned();
                w.ptr.cast::<u64>().write_unaligned(old.wrapping_add(add));
                result.ptr.cast::<u64>().write_unaligned(old);
            }
            self.next += 1;
            self.ops.insert(self.next as u64, 1);
            Ok(OpId(self.next as u64))
        }
        unsafe fn compare_swap(
            &mut self,
            _: u32,
            result: Seg,
            _: &Registration,
            remote: Remote,
            compare: u64,
            swap: u64,
        ) -> Result<OpId, RdmaError> {
            let w = self.check(remote, 8)?;
            // SAFETY: as in `fetch_add`.
            unsafe {
                let old = w.ptr.cast::<u64>().read_unaligned();
                if old == compare {
                    w.ptr.cast::<u64>().write_unaligned(swap);
                }
                result.ptr.cast::<u64>().write_unaligned(old);
            }
            self.next += 1;
            self.ops.insert(self.next as u64, 1);
            Ok(OpId(self.next as u64))
        }
        fn test(&mut self, op: OpId) -> Result<bool, RdmaError> {
            let left = self.ops.get_mut(&op.0).expect("a posted op");
            *left -= 1;
            Ok(*left == 0)
        }
    }

    /// The get mode as the two-sided layer drives it, over the hook.
    #[test]
    fn a_get_through_the_hook_moves_the_message_and_bad_keys_are_refused() {
        let mut dev = Loopback::default();
        let mut msg: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        // Writable: the atomics below change its first word.
        let sreg = dev.register(Seg::of_mut(&mut msg)).unwrap();
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

        // The atomics, on the first word of the message.
        let mut out = [0u8; 8];
        let oreg = dev.register(Seg::of_mut(&mut out)).unwrap();
        let word = Remote { len: 8, ..remote };
        let before = u64::from_le_bytes(msg[..8].try_into().unwrap());
        // SAFETY: `out` is live and unused until each op completes.
        let op = unsafe { dev.fetch_add(1, Seg::of_mut(&mut out), &oreg, word, 5) }.unwrap();
        while !dev.test(op).unwrap() {}
        assert_eq!(u64::from_le_bytes(out), before);
        // SAFETY: as above.
        let op = unsafe { dev.compare_swap(1, Seg::of_mut(&mut out), &oreg, word, before + 5, 7) }.unwrap();
        while !dev.test(op).unwrap() {}
        assert_eq!(u64::from_le_bytes(out), before + 5);
        // SAFETY: as above.
        let op = unsafe { dev.fetch_add(1, Seg::of_mut(&mut out), &oreg, word, 0) }.unwrap();
        while !dev.test(op).unwrap() {}
        assert_eq!(u64::from_le_bytes(out), 7);
        dev.deregister(&sreg);
        dev.deregister(&rreg);
    }
}
