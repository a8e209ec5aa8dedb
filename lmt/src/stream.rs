//! The ends of a per-pair copy ring: the receiver makes the ring file, the sender maps
//! it and removes its name, and both keep their place in it between transfers.

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

    /// Fills free slots from `src`.
    ///
    /// # Safety
    /// `src` must be readable and hold `x.total` bytes.
    pub(crate) unsafe fn push(&mut self, x: &mut Xfer, src: &[Seg]) {
        let ring = self.file.ring();
        // SAFETY: the caller's contract; `x.at` tracks `x.done` in `src`.
        unsafe { ring.push(&mut self.place, src, &mut x.at, &mut x.done, x.total) };
    }

    /// Drains full slots into `dst` (and past its end, into nothing).
    ///
    /// # Safety
    /// `dst` must be writable and not otherwise in use.
    pub(crate) unsafe fn pull(&mut self, x: &mut Xfer, dst: &[Seg]) {
        let ring = self.file.ring();
        // SAFETY: the caller's contract; `x.at` tracks `x.done` in `dst`.
        unsafe { ring.pull(&mut self.place, dst, &mut x.at, &mut x.done, x.total) };
    }

    pub(crate) fn unlink(&self) {
        self.file.unlink();
    }
}
