//! Registrations kept from one large message to the next, for memory whose lifetime
//! the library knows ([`Pinned`] buffers): registered whole on first use, reused while
//! the buffer lives, and given back once it has gone. Other memory is registered per
//! transfer (see [`crate::rdma`]): without a hook on unmapping, a kept registration of
//! it could outlive the pages it names.
//!
//! [`Pinned`]: nemesis_net::pinned::Pinned

use nemesis_net::pinned::{self, Region};
use nemesis_net::rdma::{Rdma, RdmaError, Registration, Seg};

/// One netmod's kept registrations.
#[derive(Debug, Default)]
pub struct RegCache {
    kept: Vec<Kept>,
    /// [`pinned::generation`] when gone buffers were last looked for.
    seen: u64,
}

#[derive(Debug)]
struct Kept {
    region: Region,
    /// For peers to read (a send buffer's key), and for the device to write.
    read: Option<Registration>,
    write: Option<Registration>,
}

impl RegCache {
    /// The kept registration of the [`Pinned`](nemesis_net::pinned::Pinned) buffer
    /// holding `seg`, made now if it is the first use: for peers to read it, or (with
    /// `write`) for the device to write it. `None` when `seg` is not in such a buffer.
    pub(crate) fn get(
        &mut self,
        rdma: &mut dyn Rdma,
        seg: Seg,
        write: bool,
    ) -> Option<Result<Registration, RdmaError>> {
        self.forget_gone(rdma);
        let region = pinned::region_of(seg.ptr, seg.len)?;
        let i = match self.kept.iter().position(|k| k.region == region) {
            Some(i) => i,
            None => {
                self.kept.push(Kept {
                    region,
                    read: None,
                    write: None,
                });
                self.kept.len() - 1
            }
        };
        let k = &mut self.kept[i];
        let slot = if write { &mut k.write } else { &mut k.read };
        if let Some(r) = slot {
            return Some(Ok(*r));
        }
        let whole = Seg {
            ptr: region.start as *mut u8,
            len: region.len,
        };
        let made = if write {
            rdma.register(whole)
        } else {
            rdma.register_read(whole)
        };
        Some(made.inspect(|r| *slot = Some(*r)))
    }

    /// Gives back the registrations of buffers that have gone.
    fn forget_gone(&mut self, rdma: &mut dyn Rdma) {
        let now = pinned::generation();
        if now == self.seen {
            return;
        }
        self.seen = now;
        self.kept.retain(|k| {
            let live = pinned::is_live(&k.region);
            if !live {
                for r in [&k.read, &k.write].into_iter().flatten() {
                    rdma.deregister(r);
                }
            }
            live
        });
    }
}
