//! Errors of the shared-memory substrate.

use std::fmt;
use std::io;
use std::time::Duration;

/// A byte count printed for people: exact bytes and a binary-prefixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {} ({} bytes)", UNITS[u], self.0)
        }
    }
}

/// Why the segment could not be made, joined or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// An environment variable or parameter is out of range or unparsable.
    #[error("invalid {var}={value:?}: {reason}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The shared-memory file system cannot hold the segment.
    #[error(
        "not enough room in {dir} for the shared segment: it needs {needed}, but only {available} \
         is free (short by {shortfall}). Shrink it with NEMESIS_CELLS (now {cells}), \
         NEMESIS_CELL_SIZE (now {cell_size}), NEMESIS_FBOX_SIZE (now {fbox_size}) or \
         NEMESIS_PAIR_SIZE (now {pair_size}), or point NEMESIS_SHM_DIR at a larger tmpfs"
    )]
    NoSpace {
        /// The directory.
        dir: String,
        /// Bytes the segment needs.
        needed: Bytes,
        /// Bytes free.
        available: Bytes,
        /// The difference.
        shortfall: Bytes,
        /// Current cell count per process.
        cells: u32,
        /// Current cell size.
        cell_size: u32,
        /// Current fastbox size.
        fbox_size: u32,
        /// Current pair buffer size.
        pair_size: u32,
    },
    /// The segment was made by a build with another shared-memory layout.
    #[error(
        "{path}: shared-memory layout mismatch: this build has layout version {ours_version} \
         (hash {ours_hash:#018x}), the segment has version {theirs_version} (hash \
         {theirs_hash:#018x}); every process of a job must run the same nemesis build"
    )]
    LayoutMismatch {
        /// The segment file.
        path: String,
        /// Our layout version.
        ours_version: u32,
        /// Our layout hash.
        ours_hash: u64,
        /// The segment's layout version.
        theirs_version: u32,
        /// The segment's layout hash.
        theirs_hash: u64,
    },
    /// The file is not a nemesis segment.
    #[error("{path} is not a nemesis shared-memory segment ({why})")]
    NotASegment {
        /// The file.
        path: String,
        /// What gave it away.
        why: &'static str,
    },
    /// The segment belongs to another job or another process count.
    #[error("{path} was made for {what}")]
    WrongJob {
        /// The file.
        path: String,
        /// What differs, with both values.
        what: String,
    },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file or object.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Start-up did not complete in time.
    #[error(
        "timed out after {waited:?} waiting for {what}; raise NEMESIS_STARTUP_TIMEOUT if the \
         node is just slow"
    )]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// A local process exited during start-up.
    #[error("local process {local} (pid {pid}) exited during start-up")]
    PeerDied {
        /// Its local index.
        local: u32,
        /// Its pid.
        pid: u32,
    },
}

// Only the segment, which loom builds leave out, makes I/O errors.
#[cfg(not(loom))]
impl ShmError {
    pub(crate) fn io(op: &'static str, path: impl fmt::Display, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_string(),
            source,
        }
    }

    pub(crate) fn last_os(op: &'static str, path: impl fmt::Display) -> Self {
        Self::io(op, path, io::Error::last_os_error())
    }
}
