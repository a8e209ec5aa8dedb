//! The one-sided operations of a window whose atomics the network card runs
//! (`nic.rs`): each is the device's 8-byte fetch-and-add or compare-and-swap on a
//! member's word, or a compare-and-swap loop of them, waited for in the caller's epoch.

use super::RmaError;
use super::access::Ops;
use super::elem::{self, AccOp};
use super::wire::Refusal;
use crate::channel::Channel;
use bytemuck::Pod;
use nemesis_net::rdma::{OpId, RdmaError, Remote, Seg};
use nemesis_shm::variant::Sound;
use nemesis_shm::window::counter::{self, Word};

/// One atomic of the device.
#[derive(Debug, Clone, Copy)]
enum Atomic {
    Add(u64),
    Swap { compare: u64, swap: u64 },
}

/// Runs `a` on member `target`'s word `at` by the device and waits for its completion;
/// returns what the word held before.
fn run<T: Pod, C: Channel>(
    ops: &mut Ops<'_, '_, T, C>,
    target: u32,
    at: Remote,
    a: Atomic,
) -> Result<u64, RmaError> {
    let nic = ops.win.nic.as_ref().expect("a window whose executor is the card");
    let (reg, words) = (nic.reg, nic.words.clone());
    let result = Seg {
        ptr: words.result().cast(),
        len: 8,
    };
    let w = ops.win.peers[target as usize].world;
    let peers = [w];
    let mut posted: Option<OpId> = None;
    let mut failed: Option<RdmaError> = None;
    let r = ops
        .world
        .wait_until(&|| format!("an atomic at rank {target}"), &peers, true, |world| {
            let Some(rdma) = world.core.ch.rdma() else {
                failed = Some(RdmaError::NoAtomics);
                return true;
            };
            let op = match posted {
                Some(op) => op,
                None => {
                    // SAFETY: the result word is registered by `reg`, kept alive by
                    // the window's slot (and `words` here), and nothing else uses it
                    // until this atomic completes: the window's operations run one
                    // at a time, under the world's borrow.
                    let p = unsafe {
                        match a {
                            Atomic::Add(x) => rdma.fetch_add(w, result, &reg, at, x),
                            Atomic::Swap { compare, swap } => {
                                rdma.compare_swap(w, result, &reg, at, compare, swap)
                            }
                        }
                    };
                    match p {
                        Ok(op) => {
                            posted = Some(op);
                            op
                        }
                        Err(RdmaError::Again { .. }) => return false,
                        Err(e) => {
                            failed = Some(e);
                            return true;
                        }
                    }
                }
            };
            match rdma.test(op) {
                Ok(done) => done,
                Err(e) => {
                    failed = Some(e);
                    true
                }
            }
        });
    if let Err(e) = r {
        return Err(ops.fail(e));
    }
    if let Some(e) = failed {
        return Err(RmaError::Rdma {
            target,
            why: e.to_string(),
        });
    }
    ops.rma().card_atomics += 1;
    // SAFETY: the device wrote the word and reported it; the read is volatile because
    // the compiler does not see that write.
    Ok(unsafe { words.result().read_volatile() })
}

/// A member's word `off` bytes into its memory.
fn element<T: Pod, C: Channel>(ops: &Ops<'_, '_, T, C>, target: u32, off: usize) -> Result<Remote, RmaError> {
    let nic = ops.win.nic.as_ref().expect("a window whose executor is the card");
    let data = nic.members[target as usize].data.ok_or(RmaError::OutOfBounds {
        target,
        disp: off / 8,
        count: 1,
        len: 0,
    })?;
    Ok(Remote {
        addr: data.addr + off as u64,
        len: 8,
        rkey: data.rkey,
    })
}

impl<T: Pod, C: Channel> Ops<'_, '_, T, C> {
    /// Applies `op` with `x` to the element `off` bytes into member `target`'s memory,
    /// by the device; returns what it held before.
    pub(super) fn nic_update(
        &mut self,
        target: u32,
        off: usize,
        code: u8,
        op: AccOp,
        x: &[u8],
    ) -> Result<[u8; 8], RmaError> {
        let at = element(self, target, off)?;
        let operand = u64::from_ne_bytes(x.try_into().map_err(|_| {
            RmaError::InvalidArgument("the card runs atomics on 8-byte elements only".into())
        })?);
        let float = matches!(code, 9 | 10);
        let old = match op {
            AccOp::NoOp => run(self, target, at, Atomic::Add(0))?,
            AccOp::Sum if !float => run(self, target, at, Atomic::Add(operand))?,
            _ => {
                // Read, combine here, and swap in if nobody changed it meanwhile.
                let mut now = run(self, target, at, Atomic::Add(0))?;
                loop {
                    let mut new = now;
                    let mut scratch = [0u8; 8];
                    // SAFETY: `new` is a local, aligned word of this thread.
                    unsafe { elem::update(code, op, (&raw mut new).cast(), x, &mut scratch) }.map_err(
                        |why| RmaError::Refused {
                            target,
                            why,
                            disp: off as u64,
                            len: 8,
                            others: 0,
                        },
                    )?;
                    let seen = run(
                        self,
                        target,
                        at,
                        Atomic::Swap {
                            compare: now,
                            swap: new,
                        },
                    )?;
                    if seen == now {
                        break now;
                    }
                    now = seen;
                }
            }
        };
        Ok(old.to_ne_bytes())
    }

    /// Compare-and-swap of the element `off` bytes into member `target`'s memory, by
    /// the device; returns what it held before.
    pub(super) fn nic_compare_swap(
        &mut self,
        target: u32,
        off: usize,
        compare: &[u8],
        swap: &[u8],
    ) -> Result<[u8; 8], RmaError> {
        let at = element(self, target, off)?;
        let word = |b: &[u8]| {
            b.try_into()
                .map(u64::from_ne_bytes)
                .map_err(|_| RmaError::Refused {
                    target,
                    why: Refusal::Malformed,
                    disp: off as u64,
                    len: b.len() as u64,
                    others: 0,
                })
        };
        let (compare, swap) = (word(compare)?, word(swap)?);
        Ok(run(self, target, at, Atomic::Swap { compare, swap })?.to_ne_bytes())
    }

    /// Takes member `target`'s lock word, waiting while others hold it.
    pub(super) fn nic_lock(&mut self, target: u32, exclusive: bool) -> Result<(), RmaError> {
        let mut w = LockWord { ops: self, target };
        if exclusive {
            if counter::try_exclusive_at_once(&mut w)? {
                return Ok(());
            }
            counter::announce(&mut w)?;
            loop {
                match counter::try_exclusive(&mut w) {
                    Ok(true) => return Ok(()),
                    Ok(false) => w.pause()?,
                    Err(e) => {
                        // Leave the word as we found it if the target can still be
                        // reached; otherwise its failure ends the job anyway.
                        let _ = counter::withdraw(&mut w);
                        return Err(e);
                    }
                }
            }
        }
        while !counter::try_shared::<Sound, _>(&mut w)? {
            w.pause()?;
        }
        Ok(())
    }

    /// Gives member `target`'s lock word back.
    pub(super) fn nic_unlock(&mut self, target: u32, exclusive: bool) -> Result<(), RmaError> {
        let mut w = LockWord { ops: self, target };
        if exclusive {
            counter::release_exclusive(&mut w)
        } else {
            counter::release_shared(&mut w)
        }
    }
}

/// A member's lock word, as the counter lock sees it.
struct LockWord<'o, 'w, 'b, T: Pod, C: Channel> {
    ops: &'o mut Ops<'w, 'b, T, C>,
    target: u32,
}

impl<T: Pod, C: Channel> LockWord<'_, '_, '_, T, C> {
    fn at(&self) -> Remote {
        let nic = self
            .ops
            .win
            .nic
            .as_ref()
            .expect("a window whose executor is the card");
        nic.members[self.target as usize].lock
    }

    /// Lets others go on before the next try: a turn of progress, then the processor.
    fn pause(&mut self) -> Result<(), RmaError> {
        if let Err(e) = self.ops.world.progress() {
            return Err(self.ops.fail(e));
        }
        std::thread::yield_now();
        Ok(())
    }
}

impl<T: Pod, C: Channel> Word for LockWord<'_, '_, '_, T, C> {
    type Error = RmaError;

    fn fetch_add(&mut self, add: u64) -> Result<u64, RmaError> {
        let at = self.at();
        run(self.ops, self.target, at, Atomic::Add(add))
    }

    fn compare_swap(&mut self, compare: u64, swap: u64) -> Result<u64, RmaError> {
        let at = self.at();
        run(self.ops, self.target, at, Atomic::Swap { compare, swap })
    }
}
