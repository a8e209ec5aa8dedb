//! The ends of a per-pair copy ring: the receiver makes the ring file, the sender maps
//! it and removes its name, and both keep their place in it between transfers.

use crate::policy::CMA_STEP;
use crate::{LmtError, Seg, Xfer};
use nemesis_shm::ring::{Place, RingFile, RingGeometry};
use std::path::Path;

/// One end of a ring.
#[derive(Debug)]
pub(crate) struct RingEnd {
    file: RingFile,
    place: Place,
    /// The file's name, which each CTS for the ring carries: kept rather than made for
    /// every transfer, whose handshake runs with caches the last copy emptied.
    name: Box<str>,
}

impl RingEnd {
    /// The receiver's end: makes `dir/name`.
    pub(crate) fn create(dir: &Path, name: &str, geo: RingGeometry) -> Result<Self, LmtError> {
        Ok(Self {
            file: RingFile::create(dir, name, geo)?,
            place: Place::default(),
            name: name.into(),
        })
    }

    /// The file's name (as made; the sender removes it once mapped).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The sender's end: maps `dir/name` and removes the name.
    pub(crate) fn open(dir: &Path, name: &str, peer: u32) -> Result<Self, LmtError> {
        let file = RingFile::open(dir, name)?.ok_or_else(|| LmtError::BadCookie {
            peer,
            why: format!("no copy ring {name} in {}", dir.display()),
        })?;
        file.unlink();
        Ok(Self {
            file,
            place: Place::default(),
            name: name.into(),
        })
    }

    /// Fills free slots from `src`, at most a step's worth ([`step_end`]).
    ///
    /// # Safety
    /// `src` must be readable and hold `x.total` bytes.
    pub(crate) unsafe fn push(&mut self, x: &mut Xfer, src: &[Seg]) {
        let ring = self.file.ring();
        let end = step_end(x.done, x.total, ring.slot_size());
        // SAFETY: the caller's contract; `x.at` tracks `x.done` in `src`.
        unsafe { ring.push(&mut self.place, src, &mut x.at, &mut x.done, end) };
    }

    /// Drains full slots into `dst` (and past its end, into nothing), at most a step's
    /// worth ([`step_end`]).
    ///
    /// # Safety
    /// `dst` must be writable and not otherwise in use.
    pub(crate) unsafe fn pull(&mut self, x: &mut Xfer, dst: &[Seg]) {
        let ring = self.file.ring();
        let end = step_end(x.done, x.total, ring.slot_size());
        // SAFETY: the caller's contract; `x.at` tracks `x.done` in `dst`.
        unsafe { ring.pull(&mut self.place, dst, &mut x.at, &mut x.done, end) };
    }

    pub(crate) fn unlink(&self) {
        self.file.unlink();
    }
}

/// Where one call's copying through the ring stops: whole slots up to [`CMA_STEP`]
/// bytes past `done`, or the message's end, `total`. Unbounded, a receiver whose sender
/// keeps the ring full never found it empty, and one progress call took the whole
/// message (512 MiB, tens of milliseconds), with no look at anything else meanwhile.
/// Every slot but a message's last holds a whole slot's bytes, so a bound of whole
/// slots past `done` never cuts one short.
fn step_end(done: usize, total: usize, slot_size: usize) -> usize {
    let slots = (CMA_STEP / slot_size.max(1)).max(1);
    total.min(done.saturating_add(slots * slot_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_whole_slots_up_to_the_cma_step_or_the_message_end() {
        let slot = 64 << 10;
        assert_eq!(step_end(0, 512 << 20, slot), CMA_STEP);
        assert_eq!(step_end(3 * slot, 512 << 20, slot), 3 * slot + CMA_STEP);
        assert_eq!(step_end(0, 100_000, slot), 100_000, "the end of a short message");
        // A slot larger than the step still moves, one a call.
        assert_eq!(step_end(0, 64 << 20, 8 << 20), 8 << 20);
        // A step of whole slots where the step is not a multiple of the slot.
        assert_eq!(step_end(0, 64 << 20, 3 << 20), 3 << 20);
        assert_eq!(step_end(usize::MAX - 1, usize::MAX, slot), usize::MAX);
    }
}
