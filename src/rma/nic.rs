//! Windows whose atomics the network card runs ([`Executor::Nic`]): every accumulate,
//! fetch-and-op and compare-and-swap on such a window, from every member and from its
//! owner too, is the device's 8-byte fetch-and-add or compare-and-swap, because a CPU
//! atomic on the same word would not be atomic with the device's. Operations the device
//! has no atomic for (a product, a maximum, a float sum, a replace) are a
//! compare-and-swap loop on the device. Locks are a counter word at each member that
//! the same atomics take and give back, so a target serves neither.
//!
//! This file holds what the window keeps for that: the registered words and each
//! member's; `nic_ops.rs` runs the operations on them.
//!
//! [`Executor::Nic`]: super::Executor::Nic

use crate::channel::Channel;
use crate::p2p::World;
use nemesis_net::rdma::{Registration, Remote, Seg};
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
    /// This member's lock word.
    pub(super) fn lock(&self) -> *mut u64 {
        self.0.get().cast::<u64>()
    }

    /// Where the old value of this member's last atomic lands.
    pub(super) fn result(&self) -> *mut u64 {
        // SAFETY: the second of the two words.
        unsafe { self.0.get().cast::<u64>().add(1) }
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
        ptr: words.lock().cast(),
        len: 16,
    };
    let reg = rdma.register(seg).map_err(|e| e.to_string())?;
    Ok((words, reg))
}

/// The words of this member's lock, for a test that it is left free.
#[cfg(test)]
pub(crate) fn lock_word(nic: &NicWin) -> u64 {
    // SAFETY: a volatile read of a word only the device writes.
    unsafe { nic.words.lock().read_volatile() }
}

#[cfg(test)]
#[path = "nic_tests.rs"]
mod tests;
