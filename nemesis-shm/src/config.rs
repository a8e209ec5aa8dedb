//! The segment's geometry and where it lives, from documented environment variables.

use crate::error::ShmError;
use std::path::PathBuf;

/// Cells per process when `NEMESIS_CELLS` is unset.
pub const DEFAULT_CELLS: u32 = 64;
/// Bytes per cell, header included, when `NEMESIS_CELL_SIZE` is unset and the job is
/// too large for [`SMALL_JOB_CELL_SIZE`]: 8 KiB of payload
/// and the next multiple of 128 above it, so a message of 8 KiB goes in one packet and
/// one of 16 or 32 KiB in two or four, not three or five. Against cells of 8192 bytes,
/// osu_bw streams moved 5–17% more at 8 KiB and 3–11% more from 16 to 32 KiB on the
/// Intel Xeon guest (BENCHMARKS.md), and a ring of fastboxes still takes a packet in 8 boxes.
pub const DEFAULT_CELL_SIZE: u32 = 8320;
/// Bytes per cell when `NEMESIS_CELL_SIZE` is unset and the cells' growth over
/// [`DEFAULT_CELL_SIZE`] fits [`LARGE_CELL_BUDGET`]: 32 KiB of payload, so that a
/// message of 16 or 32 KiB goes in one packet, as MPICH's Nemesis sends those in one of
/// its cells. In six turns beside MPICH ch3:nemesis on an Intel Xeon guest, osu_bw
/// moved 1.24x its rate at 16 KiB and 1.05x at 32 KiB with these cells, against 1.03x
/// and 0.75x with cells of 8320 bytes; latency did not change. On an AMD EPYC guest,
/// 1.01x and 0.95x against 0.93x and 0.86x where the CPUs share a cache, and even
/// where they do not (BENCHMARKS.md).
pub const SMALL_JOB_CELL_SIZE: u32 = 32896;
/// Most bytes by which the default cells may grow a segment over cells of
/// [`DEFAULT_CELL_SIZE`]: with 64 cells a process, jobs of up to 5 processes on the
/// node, so that a job that fitted a small `/dev/shm` still does.
pub const LARGE_CELL_BUDGET: usize = 8 << 20;
/// [`Geometry::cell_size`] when the number of processes decides it.
pub const CELL_AUTO: u32 = 0;
/// Bytes per fastbox, header included, when `NEMESIS_FBOX_SIZE` is unset: room for
/// 1 KiB of payload.
pub const DEFAULT_FBOX_SIZE: u32 = 1152;
/// Fastboxes per ordered pair when `NEMESIS_FBOX_SLOTS` is unset, unless
/// [`FBOX_BUDGET`] asks for fewer: enough that a stream of small messages does not wait
/// for the receiver's acknowledgement of each one, and a ring of about 300 KiB. Streams
/// through a ring that small drew 4 KiB to 32 KiB messages at 9 GB/s on an Intel Xeon
/// guest, where a ring of 256 KiB or more moved 13 (a copy through a ring between two
/// threads, BENCHMARKS.md).
pub const DEFAULT_FBOX_SLOTS: u32 = 256;
/// Fastboxes per ordered pair when `NEMESIS_FBOX_SLOTS` is unset, largest first: the
/// first whose growth over [`DEFAULT_FBOX_SLOTS`] fits [`LARGE_FBOX_BUDGET`] (2048 for
/// 2 processes, 1024 for 3, 512 for 4 and 5). osu_bw from 4 to 32 KiB moved a sixth to
/// two fifths more through rings of 512 boxes than of 256 on a 2-vCPU AMD EPYC (Zen 3)
/// guest, and on a Zen 4 one 4 to 64 KiB a half to three quarters more through rings of
/// 1024 than of 512 and a fifth to three fifths more again through 2048, while 4096 did
/// no better than 2048. Short messages moved less through larger rings, which
/// [`FBOX_SHORT_LAP`] keeps from them.
pub const SMALL_JOB_FBOX_SLOTS: [u32; 3] = [2048, 1024, 512];
/// Most bytes by which [`SMALL_JOB_FBOX_SLOTS`] may grow a segment over rings of
/// [`DEFAULT_FBOX_SLOTS`]: jobs of up to 5 processes on the node, as for the cells.
pub const LARGE_FBOX_BUDGET: usize = 8 << 20;
/// Boxes at the start of each lap of a ring that messages of one box go into
/// ([`crate::Region::fbox_lap`]), where the ring has more: a stream of short messages
/// keeps to a ring of the default size, through which they moved the most, and
/// messages of many boxes have the whole ring.
pub const FBOX_SHORT_LAP: u32 = DEFAULT_FBOX_SLOTS;
/// Most bytes the default number of fastbox slots may take in one segment, rings whole;
/// with more processes the default halves until they fit (down to one slot per pair).
pub const FBOX_BUDGET: usize = 64 << 20;
/// Most fastboxes per ordered pair.
pub const MAX_FBOX_SLOTS: u32 = 4096;
/// Bytes of the buffer each pair of processes shares for medium messages when
/// `NEMESIS_PAIR_SIZE` is unset, unless [`LARGE_PAIR_BUDGET`] or [`PAIR_BUDGET`] asks for
/// less: the largest, as an answer up to its size goes through it without a handshake,
/// where a 256 KiB ping-pong took 9.2–11.1 µs one way against 13.3–16.4 by rendezvous
/// near, and 22–24 against 43–46 far, on a 2-vCPU AMD EPYC guest (BENCHMARKS.md).
pub const DEFAULT_PAIR_SIZE: u32 = MAX_PAIR_SIZE;
/// Most bytes the default pair buffers may take in one segment; with more processes the
/// default halves until they fit, and the buffers go when even the smallest would not.
pub const PAIR_BUDGET: usize = 32 << 20;
/// Most bytes default pair buffers larger than [`LARGE_PAIR_FROM`] may take: so that they
/// grow a segment by at most this over buffers of that size, and a job that fitted a
/// small `/dev/shm` still does.
pub const LARGE_PAIR_BUDGET: usize = 8 << 20;
/// The largest default pair buffer that [`PAIR_BUDGET`] alone bounds.
pub const LARGE_PAIR_FROM: u32 = 128 << 10;
/// Smallest pair buffer: two pieces, so that one message can take more than a packet.
pub const MIN_PAIR_SIZE: u32 = 2 * crate::pairbuf::PIECE as u32;
/// Largest pair buffer, the largest medium message.
pub const MAX_PAIR_SIZE: u32 = 1 << 20;
/// [`Geometry::pair_size`] when the number of processes decides it.
pub const PAIR_AUTO: u32 = u32::MAX;
/// Directory of the segment file when `NEMESIS_SHM_DIR` is unset.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";
/// Most processes one node's segment serves.
pub const MAX_LOCAL_PROCS: u32 = 4096;

/// Bytes at the start of a cell before its payload.
pub const CELL_HEADER: u32 = 32;
/// Bytes at the start of a fastbox before its payload.
pub const FBOX_HEADER: u32 = 32;
/// The smallest fastbox, header included, that [`Geometry::validate`] accepts.
pub const MIN_FBOX_SIZE: u32 = 128;
/// Bytes at the start of an ordered pair's ring of fastboxes, before its boxes: the
/// receiver's acknowledgement, on lines of its own.
pub const FBOX_RING_HEADER: u32 = 128;

/// How big the segment's pieces are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Cells owned by each process (`NEMESIS_CELLS`).
    pub cells_per_proc: u32,
    /// Bytes per cell, header included (`NEMESIS_CELL_SIZE`); [`CELL_AUTO`] lets
    /// [`Geometry::resolve`] choose by the number of processes.
    pub cell_size: u32,
    /// Bytes per fastbox, header included, or 0 for no fastboxes (`NEMESIS_FBOX_SIZE`).
    pub fbox_size: u32,
    /// Fastboxes per ordered pair of processes, a power of two; 0 lets
    /// [`Geometry::resolve`] choose by the number of processes (`NEMESIS_FBOX_SLOTS`).
    pub fbox_slots: u32,
    /// Bytes of the buffer each unordered pair of processes shares for medium messages,
    /// a multiple of [`crate::pairbuf::PIECE`], or 0 for none; [`PAIR_AUTO`] lets
    /// [`Geometry::resolve`] choose by the number of processes (`NEMESIS_PAIR_SIZE`).
    pub pair_size: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Self {
            cells_per_proc: DEFAULT_CELLS,
            cell_size: CELL_AUTO,
            fbox_size: DEFAULT_FBOX_SIZE,
            fbox_slots: 0,
            pair_size: PAIR_AUTO,
        }
    }
}

impl Geometry {
    /// Reads the environment, falling back to the defaults.
    pub fn from_env() -> Result<Self, ShmError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get`, falling back to the defaults.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ShmError> {
        let d = Self::default();
        let g = Self {
            cells_per_proc: size_var(&get, "NEMESIS_CELLS", d.cells_per_proc)?,
            cell_size: size_var(&get, "NEMESIS_CELL_SIZE", d.cell_size)?,
            fbox_size: size_var(&get, "NEMESIS_FBOX_SIZE", d.fbox_size)?,
            fbox_slots: size_var(&get, "NEMESIS_FBOX_SLOTS", d.fbox_slots)?,
            pair_size: size_var(&get, "NEMESIS_PAIR_SIZE", d.pair_size)?,
        };
        g.validate()?;
        Ok(g)
    }

    /// Checks the ranges and the relations between the fields.
    pub fn validate(&self) -> Result<(), ShmError> {
        let bad = |var, value: u32, reason: &str| {
            Err(ShmError::Config {
                var,
                value: value.to_string(),
                reason: reason.to_string(),
            })
        };
        if !(2..=1 << 20).contains(&self.cells_per_proc) {
            return bad(
                "NEMESIS_CELLS",
                self.cells_per_proc,
                "must be between 2 and 1048576",
            );
        }
        if self.cell_size != CELL_AUTO
            && (!(256..=16 << 20).contains(&self.cell_size) || self.cell_size % 128 != 0)
        {
            return bad(
                "NEMESIS_CELL_SIZE",
                self.cell_size,
                "must be 0 (chosen by the number of processes) or a multiple of 128 between 256 and 16M",
            );
        }
        if self.fbox_size != 0 {
            if !(MIN_FBOX_SIZE..=64 << 10).contains(&self.fbox_size) || self.fbox_size % 128 != 0 {
                return bad(
                    "NEMESIS_FBOX_SIZE",
                    self.fbox_size,
                    "must be 0 (no fastboxes) or a multiple of 128 between 128 and 64K",
                );
            }
            if self.fbox_capacity() > self.cell_capacity() {
                return bad(
                    "NEMESIS_FBOX_SIZE",
                    self.fbox_size,
                    "a fastbox may not hold more payload than a cell (NEMESIS_CELL_SIZE)",
                );
            }
        }
        if self.fbox_slots > MAX_FBOX_SLOTS || !(self.fbox_slots == 0 || self.fbox_slots.is_power_of_two()) {
            return bad(
                "NEMESIS_FBOX_SLOTS",
                self.fbox_slots,
                "must be 0 (chosen by the number of processes) or a power of two up to 4096",
            );
        }
        let piece = crate::pairbuf::PIECE as u32;
        if self.pair_size != PAIR_AUTO
            && self.pair_size != 0
            && (!(MIN_PAIR_SIZE..=MAX_PAIR_SIZE).contains(&self.pair_size) || self.pair_size % piece != 0)
        {
            return bad(
                "NEMESIS_PAIR_SIZE",
                self.pair_size,
                "must be 0 (no pair buffers) or a multiple of 8K between 16K and 1M",
            );
        }
        Ok(())
    }

    /// The geometry with the number of fastbox slots decided for `nprocs` processes: the
    /// one asked for, or else [`DEFAULT_FBOX_SLOTS`] halved until the rings of every
    /// ordered pair fit [`FBOX_BUDGET`], and the first of [`SMALL_JOB_FBOX_SLOTS`] whose
    /// growth over it fits [`LARGE_FBOX_BUDGET`] where the default fits.
    /// The cell size, too, is decided: the one asked for, or else
    /// [`SMALL_JOB_CELL_SIZE`] where its growth fits [`LARGE_CELL_BUDGET`], else
    /// [`DEFAULT_CELL_SIZE`].
    pub fn resolve(mut self, nprocs: u32) -> Self {
        if self.cell_size == CELL_AUTO {
            let growth = (SMALL_JOB_CELL_SIZE - DEFAULT_CELL_SIZE) as usize;
            let cells = nprocs as usize * self.cells_per_proc as usize;
            self.cell_size = if cells.saturating_mul(growth) <= LARGE_CELL_BUDGET {
                SMALL_JOB_CELL_SIZE
            } else {
                DEFAULT_CELL_SIZE
            };
        }
        if self.fbox_slots == 0 {
            let pairs = nprocs as usize * (nprocs as usize).saturating_sub(1);
            let mut k = DEFAULT_FBOX_SLOTS;
            loop {
                self.fbox_slots = k;
                if k == 1 || pairs.saturating_mul(self.fbox_ring_bytes()) <= FBOX_BUDGET {
                    break;
                }
                k /= 2;
            }
            if k == DEFAULT_FBOX_SLOTS {
                let ring = self.fbox_ring_bytes();
                let fits = |slots| {
                    let large = Self {
                        fbox_slots: slots,
                        ..self
                    };
                    pairs.saturating_mul(large.fbox_ring_bytes().saturating_sub(ring)) <= LARGE_FBOX_BUDGET
                };
                if let Some(&slots) = SMALL_JOB_FBOX_SLOTS.iter().find(|&&slots| fits(slots)) {
                    self.fbox_slots = slots;
                }
            }
        }
        if self.pair_size == PAIR_AUTO {
            let n = nprocs as usize;
            let pairs = n * n.saturating_sub(1) / 2;
            let budget = |size| {
                if size > LARGE_PAIR_FROM {
                    LARGE_PAIR_BUDGET
                } else {
                    PAIR_BUDGET
                }
            };
            let mut size = DEFAULT_PAIR_SIZE;
            while size >= MIN_PAIR_SIZE && pairs.saturating_mul(Self::pair_stride_of(size)) > budget(size) {
                size /= 2;
            }
            self.pair_size = if size >= MIN_PAIR_SIZE { size } else { 0 };
        }
        self
    }

    /// Bytes one pair's buffer takes in the segment, head included, once
    /// [`Geometry::resolve`]d; 0 when there are none.
    pub fn pair_stride(&self) -> usize {
        Self::pair_stride_of(self.pair_size)
    }

    fn pair_stride_of(size: u32) -> usize {
        if size == 0 {
            0
        } else {
            crate::sync::PAD + size as usize
        }
    }

    /// Payload bytes of one cell, once [`Geometry::resolve`]d (before, with the size
    /// left to it, those of the smaller size it may choose).
    pub fn cell_capacity(&self) -> usize {
        let size = if self.cell_size == CELL_AUTO {
            DEFAULT_CELL_SIZE
        } else {
            self.cell_size
        };
        (size - CELL_HEADER) as usize
    }

    /// Bytes of one ordered pair's ring of fastboxes, once [`Geometry::resolve`]d: the
    /// head, the boxes, and after them room for the rest of a message that starts in the
    /// last box and spans [`Geometry::fbox_max_span`] boxes; 0 when fastboxes are off.
    pub fn fbox_ring_bytes(&self) -> usize {
        if self.fbox_size == 0 {
            0
        } else {
            let boxes = self.fbox_slots as usize + self.fbox_max_span() as usize - 1;
            FBOX_RING_HEADER as usize + boxes * self.fbox_size as usize
        }
    }

    /// Most consecutive boxes of a ring one message may take, once
    /// [`Geometry::resolve`]d: as many as a cell's payload needs, and no more than the
    /// ring has. A message whose header and payload pass the end of a box runs on into
    /// the next ones.
    pub fn fbox_max_span(&self) -> u32 {
        if self.fbox_size == 0 {
            return 0;
        }
        let need = (self.cell_capacity() as u32 + FBOX_HEADER).div_ceil(self.fbox_size);
        need.min(self.fbox_slots.max(1))
    }

    /// Boxes of each lap of a ring that messages of one box go into, once
    /// [`Geometry::resolve`]d: [`FBOX_SHORT_LAP`], or the whole ring where it is smaller.
    pub fn fbox_lap(&self) -> u32 {
        self.fbox_slots.clamp(1, FBOX_SHORT_LAP)
    }

    /// Payload bytes of a message that takes [`Geometry::fbox_max_span`] boxes.
    pub fn fbox_span_capacity(&self) -> usize {
        (self.fbox_max_span() * self.fbox_size).saturating_sub(FBOX_HEADER) as usize
    }

    /// Payload bytes of one fastbox; 0 when fastboxes are off.
    pub fn fbox_capacity(&self) -> usize {
        self.fbox_size.saturating_sub(FBOX_HEADER) as usize
    }
}

/// Where the segment file goes (`NEMESIS_SHM_DIR`).
pub fn shm_dir() -> PathBuf {
    std::env::var_os("NEMESIS_SHM_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_SHM_DIR), PathBuf::from)
}

/// The segment file name of a node's group of processes in a job. Every name of a job
/// starts with [`job_prefix`], so a launcher can remove what a crash left behind.
pub fn segment_name(job_id: u64, node: u32) -> String {
    format!("{}{node}", job_prefix(job_id))
}

/// An identifier that no other job or segment on this machine is using: random bits
/// from the kernel, mixed with the pid and the clock in case the kernel has none to give.
pub fn random_id() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for 8 bytes of writes.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    let mut id = if got == 8 { u64::from_ne_bytes(buf) } else { 0 };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    id ^= t.rotate_left(17) ^ (std::process::id() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    id.max(1)
}

/// The prefix of every segment file name of a job.
pub fn job_prefix(job_id: u64) -> String {
    format!("nemesis-{job_id:016x}-")
}

/// Whether a receiver behind its sender reads ahead in the ring of fastboxes when
/// `NEMESIS_FBOX_READ_AHEAD` is unset: on Intel CPUs only. On an Intel Xeon guest it
/// took a fifth off a behind receiver's time; on a 2-vCPU AMD EPYC guest (family 25),
/// two-sided streams of 8 and 64 bytes moved 2-8% more without it where the CPUs share
/// a cache, in three interleaved runs, and about as much where they do not
/// (BENCHMARKS.md).
pub fn default_read_ahead() -> bool {
    crate::cpu::is_intel()
}

/// `NEMESIS_FBOX_READ_AHEAD` (1 or 0), read through `get`, or [`default_read_ahead`].
pub fn read_ahead(get: impl Fn(&str) -> Option<String>) -> Result<bool, ShmError> {
    const VAR: &str = "NEMESIS_FBOX_READ_AHEAD";
    let on = switch(&get, VAR).map_err(|value| ShmError::Config {
        var: VAR,
        value,
        reason: SWITCH_EXPECTED.into(),
    })?;
    Ok(on.unwrap_or_else(default_read_ahead))
}

/// What a bad value of a [`switch`] variable is told: the reason of each crate's
/// configuration error.
pub const SWITCH_EXPECTED: &str = "expected 1 or 0 (or on/off, yes/no, true/false)";

/// Variable `var`, read through `get`, as a switch: `1`, `on`, `yes` or `true` for on,
/// `0`, `off`, `no` or `false` for off, in any case, blanks around it ignored; `None`
/// when it is unset or empty, so that the caller's default holds. Any other value is
/// returned as the error, for the caller to name in its own error type with
/// [`SWITCH_EXPECTED`]. Every switch of the library is read here, so that all of them
/// take the same spellings.
pub fn switch(get: impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<bool>, String> {
    let Some(v) = get(var) else { return Ok(None) };
    match v.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "1" | "on" | "yes" | "true" => Ok(Some(true)),
        "0" | "off" | "no" | "false" => Ok(Some(false)),
        _ => Err(v.trim().to_string()),
    }
}

fn size_var(get: &impl Fn(&str) -> Option<String>, var: &'static str, default: u32) -> Result<u32, ShmError> {
    match get(var) {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(default),
        Some(v) => parse_size(&v)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ShmError::Config {
                var,
                value: v.clone(),
                reason: "expected a whole number, optionally with a K, M or G suffix".into(),
            }),
    }
}

/// Parses a positive, finite number of seconds such as `10` or `0.25`, below 10⁹ (beyond
/// which `Instant` arithmetic could overflow).
pub fn parse_seconds(s: &str) -> Option<std::time::Duration> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
        .map(std::time::Duration::from_secs_f64)
}

/// Parses `123`, `8K`, `8KiB`, `1M`, `2G` (binary multiples, case-insensitive).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn defaults_and_suffixes() {
        assert_eq!(Geometry::from_lookup(env(&[])).unwrap(), Geometry::default());
        let g = Geometry::from_lookup(env(&[("NEMESIS_CELL_SIZE", "16K"), ("NEMESIS_CELLS", "32")])).unwrap();
        assert_eq!((g.cells_per_proc, g.cell_size), (32, 16384));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("12x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn read_ahead_follows_the_variable_else_the_cpu() {
        const VAR: &str = "NEMESIS_FBOX_READ_AHEAD";
        assert_eq!(read_ahead(env(&[])).unwrap(), crate::cpu::is_intel());
        assert_eq!(read_ahead(env(&[(VAR, " ")])).unwrap(), crate::cpu::is_intel());
        assert!(read_ahead(env(&[(VAR, "1")])).unwrap());
        assert!(!read_ahead(env(&[(VAR, " 0 ")])).unwrap());
        for bad in ["sometimes", "2", "-1"] {
            let e = read_ahead(env(&[(VAR, bad)])).unwrap_err().to_string();
            assert!(e.contains(VAR) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_switch_is_1_or_0_and_unset_when_empty() {
        let on = ["1", " 1 ", "on", "ON", "yes", "True"];
        let off = ["0", "0\n", "off", "No", "false", "FALSE"];
        for (v, want) in on
            .map(|v| (v, Some(true)))
            .into_iter()
            .chain(off.map(|v| (v, Some(false))))
        {
            assert_eq!(switch(env(&[("S", v)]), "S"), Ok(want), "{v:?}");
        }
        for v in ["", "  "] {
            assert_eq!(switch(env(&[("S", v)]), "S"), Ok(None), "{v:?}");
        }
        assert_eq!(switch(env(&[]), "S"), Ok(None));
        for v in ["2", "01", "enabled", "y", "-1"] {
            assert_eq!(switch(env(&[("S", v)]), "S"), Err(v.to_string()));
        }
        assert_eq!(switch(env(&[("S", " maybe ")]), "S"), Err("maybe".to_string()));
        // Another variable's value is not read.
        assert_eq!(switch(env(&[("T", "x")]), "S"), Ok(None));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, val) in [
            ("NEMESIS_CELLS", "1"),
            ("NEMESIS_CELLS", "lots"),
            ("NEMESIS_CELL_SIZE", "1000"),
            ("NEMESIS_FBOX_SIZE", "100"),
            ("NEMESIS_CELL_SIZE", "99999999999999999999"),
            ("NEMESIS_PAIR_SIZE", "8192"),
            ("NEMESIS_PAIR_SIZE", "20000"),
            ("NEMESIS_PAIR_SIZE", "2097152"),
        ] {
            let err = Geometry::from_lookup(env(&[(var, val)])).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(var) && msg.contains(val), "{msg}");
        }
        let err = Geometry::from_lookup(env(&[("NEMESIS_CELL_SIZE", "256"), ("NEMESIS_FBOX_SIZE", "384")]))
            .unwrap_err();
        assert!(err.to_string().contains("more payload than a cell"), "{err}");
    }

    #[test]
    fn cells_grow_for_small_jobs_and_a_size_asked_for_is_kept() {
        let d = Geometry::default();
        assert_eq!(d.cell_size, CELL_AUTO);
        for n in 1..=5 {
            assert_eq!(d.resolve(n).cell_size, SMALL_JOB_CELL_SIZE, "{n} processes");
        }
        for n in [6, 64, MAX_LOCAL_PROCS] {
            assert_eq!(d.resolve(n).cell_size, DEFAULT_CELL_SIZE, "{n} processes");
        }
        // The budget counts cells, not processes: fewer cells each, more processes.
        let few = Geometry::from_lookup(env(&[("NEMESIS_CELLS", "16")])).unwrap();
        assert_eq!(few.resolve(21).cell_size, SMALL_JOB_CELL_SIZE);
        assert_eq!(few.resolve(22).cell_size, DEFAULT_CELL_SIZE);
        // A span of boxes holds a whole cell's payload, whichever size was chosen.
        for n in [2, 5, 6] {
            let g = d.resolve(n);
            assert!(g.fbox_span_capacity() >= g.cell_capacity(), "{n} processes");
        }
        let set = Geometry::from_lookup(env(&[("NEMESIS_CELL_SIZE", "8320")])).unwrap();
        assert_eq!(set.resolve(2).cell_size, 8320, "a size asked for is kept");
        let zero = Geometry::from_lookup(env(&[("NEMESIS_CELL_SIZE", "0")])).unwrap();
        assert_eq!(zero.resolve(2).cell_size, SMALL_JOB_CELL_SIZE, "0 chooses");
    }

    #[test]
    fn pair_buffers_default_by_process_count_and_can_be_set_or_turned_off() {
        let d = Geometry::default();
        assert_eq!(d.pair_size, PAIR_AUTO);
        assert_eq!(d.resolve(2).pair_size, DEFAULT_PAIR_SIZE);
        assert_eq!(d.resolve(2).pair_stride(), 128 + DEFAULT_PAIR_SIZE as usize);
        // Halved until every pair's buffer fits the budget.
        let by_count = [(4, 1 << 20), (5, 512 << 10), (6, 512 << 10), (7, 256 << 10)];
        let more = [(8, 256 << 10), (9, 128 << 10), (23, 128 << 10), (24, 64 << 10)];
        for (n, size) in by_count.into_iter().chain(more) {
            assert_eq!(d.resolve(n).pair_size, size, "{n} processes");
        }
        let off = Geometry::from_lookup(env(&[("NEMESIS_PAIR_SIZE", "0")])).unwrap();
        assert_eq!((off.resolve(2).pair_size, off.pair_stride()), (0, 0));
        let set = Geometry::from_lookup(env(&[("NEMESIS_PAIR_SIZE", "1M")])).unwrap();
        assert_eq!(set.resolve(200).pair_size, 1 << 20, "a size asked for is kept");
    }

    #[test]
    fn fastboxes_can_be_turned_off() {
        let g = Geometry::from_lookup(env(&[("NEMESIS_FBOX_SIZE", "0")])).unwrap();
        assert_eq!(g.fbox_capacity(), 0);
    }

    #[test]
    fn fastbox_slots_default_by_process_count_and_can_be_set() {
        let d = Geometry::default();
        assert_eq!(d.resolve(2).fbox_slots, 2048);
        // A ring of 2048 boxes of 1152 bytes has room for 28 more after it, for a message
        // of a cell's payload (32 KiB in a job this small) that starts in its last box:
        // 2.28 MiB with its head; the 2 rings of 2 processes grow by 3.9 MiB over rings
        // of 256. Among 3, the 6 rings would grow by 11.8 MiB, but by 5.1 MiB with rings
        // of 1024; among 4, the 12 would grow by 10.1 MiB with 1024, by 3.4 with 512.
        assert_eq!(d.resolve(2).fbox_ring_bytes(), 128 + 2076 * 1152);
        assert_eq!(d.resolve(3).fbox_slots, 1024);
        assert_eq!(d.resolve(3).fbox_ring_bytes(), 128 + 1052 * 1152);
        assert_eq!(d.resolve(4).fbox_slots, 512);
        assert_eq!(d.resolve(4).fbox_ring_bytes(), 128 + 540 * 1152);
        // Among 5, the 20 rings of 512 grow by 5.6 MiB.
        assert_eq!(d.resolve(5).fbox_slots, 512);
        // Among 6, 30 rings would grow by 8.4 MiB: 256 boxes, and 7 more with cells of
        // 8 KiB, 296 KiB.
        assert_eq!(d.resolve(6).fbox_slots, DEFAULT_FBOX_SLOTS);
        assert_eq!(d.resolve(6).fbox_ring_bytes(), 128 + 263 * 1152);
        // Messages of one box keep to the first 256 boxes of each lap, however large.
        assert_eq!(d.resolve(2).fbox_lap(), FBOX_SHORT_LAP);
        assert_eq!(d.resolve(6).fbox_lap(), FBOX_SHORT_LAP);
        assert_eq!(d.resolve(15).fbox_slots, 256);
        // 16 x 15 pairs of 296 KiB take 69 MiB.
        assert_eq!(d.resolve(16).fbox_slots, 128);
        assert_eq!(d.resolve(29).fbox_slots, 64);
        assert_eq!(d.resolve(30).fbox_slots, 32);
        assert_eq!(d.resolve(64).fbox_slots, 4);
        assert_eq!(d.resolve(64).fbox_max_span(), 4);
        assert_eq!(d.resolve(128).fbox_slots, 2);
        assert_eq!(d.resolve(4096).fbox_slots, 1);
        assert_eq!(d.resolve(4096).fbox_ring_bytes(), 128 + 1152);
        let g = Geometry::from_lookup(env(&[("NEMESIS_FBOX_SLOTS", "2")])).unwrap();
        assert_eq!(g.resolve(1000).fbox_slots, 2);
        assert_eq!(
            g.resolve(1000).fbox_lap(),
            2,
            "a lap is never longer than its ring"
        );
        for bad in ["3", "8192", "x"] {
            let err = Geometry::from_lookup(env(&[("NEMESIS_FBOX_SLOTS", bad)])).unwrap_err();
            assert!(err.to_string().contains("NEMESIS_FBOX_SLOTS"), "{err}");
        }
    }
}
