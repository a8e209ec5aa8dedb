//! Windows whose atomics the network card runs ([`Executor::Nic`]): every accumulate,
//! fetch-and-op and compare-and-swap on such a window, from every member and from its
//! owner too, is the device's 8-byte fetch-and-add or compare-and-swap, because a CPU
//! atomic on the same word would not be atomic with the device's. Operations the device
//! has no atomic for (a product, a maximum, a float sum, a replace) are a
//! compare-and-swap loop on the device. Locks are a counter word at each member that
//! the same atomics take and give back, so a target serves neither.
//!
//! [`Executor::Nic`]: super::Executor::Nic

use super::RmaError;
use super::access::Ops;
use super::elem::{self, AccOp};
use super::wire::Refusal;
use crate::channel::Channel;
use crate::p2p::World;
use bytemuck::Pod;
use nemesis_net::rdma::{OpId, RdmaError, Registration, Remote, Seg};
use nemesis_shm::variant::Sound;
use nemesis_shm::window::counter::{self, Word};
use std::cell::UnsafeCell;
use std::sync::Arc;

/// This member's lock word and the word results of its atomics land in, registered
/// with the device. Only the device writes them; they live as long as the window's
/// protocol slot, so an atomic abandoned by a failure still lands in live memory.
pub(crate) struct Words(UnsafeCell<[u64; 2]>);

// SAFETY: the words are written only by the device and read only through raw pointers
// after the completion of the atomic that wrote them; no reference to them is made.
unsafe impl Sync for Words {}
// SAFETY: as for `Sync`: nothing in them belongs to a thread.
unsafe impl Send for Words {}

impl Words {
    const LOCK: usize = 0;
    const RESULT: usize = 1;

    fn word(&self, i: usize) -> *mut u64 {
        // SAFETY: `i` is one of the two words.
        unsafe { self.0.get().cast::<u64>().add(i) }
    }
}

/// How this member reaches every member's memory and lock word through the device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    /// Its memory (none for a member without any).
    pub(crate) data: Option<Remote>,
    /// Its lock word.
    pub(crate) lock: Remote,
}

/// The device side of a window whose executor is the card.
pub(crate) struct NicWin {
    pub(crate) members: Vec<Member>,
    pub(crate) words: Arc<Words>,
    pub(crate) reg: Registration,
}

impl std::fmt::Debug for NicWin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicWin")
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

/// This member's words, registered: what a window made with [`super::Executor::Nic`]
/// tells the other members.
pub(crate) fn words<C: Channel>(world: &mut World<C>) -> Result<(Arc<Words>, Registration), String> {
    let words = Arc::new(Words(UnsafeCell::new([0; 2])));
    let rdma = world
        .core
        .ch
        .rdma()
        .ok_or("the channel's network module offers no RDMA")?;
    let seg = Seg {
        ptr: words.word(Words::LOCK).cast(),
        len: 16,
    };
    let reg = rdma.register(seg).map_err(|e| e.to_string())?;
    Ok((words, reg))
}

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
        ptr: words.word(Words::RESULT).cast(),
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
    super::window::rma(ops.world).card_atomics += 1;
    // SAFETY: the device wrote the word and reported it; the read is volatile because
    // the compiler does not see that write.
    Ok(unsafe { words.word(Words::RESULT).read_volatile() })
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

/// The words of this member's lock, for a test that it is left free.
#[cfg(test)]
pub(crate) fn lock_word(nic: &NicWin) -> u64 {
    // SAFETY: a volatile read of a word only the device writes.
    unsafe { nic.words.word(Words::LOCK).read_volatile() }
}

#[cfg(test)]
#[path = "nic_tests.rs"]
mod tests;
