//! Who this process is in the job, and how to find the processes on its node.
//!
//! `nemesis-run` hands each process its identity through the environment
//! (`NEMESIS_RANK`, `NEMESIS_SIZE`, `NEMESIS_JOBID`). Without those variables the process
//! is a singleton. Everything the rest of the crate needs is in [`BootInfo`], so another
//! way of starting (PMI) only has to produce one.

use std::time::Duration;

/// A process's index in the job.
pub type Rank = u32;

/// Most ranks in one job.
pub const MAX_RANKS: u32 = 1 << 20;

/// How long start-up waits for the other processes unless `NEMESIS_STARTUP_TIMEOUT` says.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why this process could not learn its place in the job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootError {
    /// A variable is set but its value is unusable.
    #[error("invalid {var}={value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Some launcher variables are set and others are missing.
    #[error("{var} is not set, but {other} is: start the program with nemesis-run, or set none of them")]
    Missing {
        /// The missing variable.
        var: &'static str,
        /// One that is set.
        other: &'static str,
    },
}

/// How the process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// By `nemesis-run`, or by a program that sets its variables.
    Env,
    /// Alone.
    Singleton,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    /// Our rank.
    pub rank: Rank,
    /// Ranks in the job.
    pub size: u32,
    /// The job's identifier, unique on the node for as long as the job runs.
    pub job_id: u64,
    /// The ranks on our node, in node-local order; ours is at `local_index`.
    pub local_ranks: Vec<Rank>,
    /// Our position in `local_ranks`.
    pub local_index: u32,
    /// How long to wait for the other processes during start-up.
    pub startup_timeout: Duration,
    /// How we were started.
    pub launcher: Launcher,
}

impl BootInfo {
    /// Reads the environment: the launcher's variables, or none for a singleton.
    pub fn from_env() -> Result<Self, BootError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`BootInfo::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, BootError> {
        let timeout = startup_timeout(&get)?;
        let vars = ["NEMESIS_RANK", "NEMESIS_SIZE", "NEMESIS_JOBID"];
        let set: Vec<_> = vars.iter().filter(|v| get(v).is_some()).collect();
        if set.is_empty() {
            return Ok(Self::singleton(random_job_id(), timeout));
        }
        for v in vars {
            if get(v).is_none() {
                return Err(BootError::Missing {
                    var: v,
                    other: set[0],
                });
            }
        }
        let size: u32 = parse(&get, "NEMESIS_SIZE", |s| s.parse().ok())?;
        if !(1..=MAX_RANKS).contains(&size) {
            return Err(invalid(
                &get,
                "NEMESIS_SIZE",
                format!("must be between 1 and {MAX_RANKS}"),
            ));
        }
        let rank: u32 = parse(&get, "NEMESIS_RANK", |s| s.parse().ok())?;
        if rank >= size {
            return Err(invalid(
                &get,
                "NEMESIS_RANK",
                format!("must be below NEMESIS_SIZE={size}"),
            ));
        }
        let job_id = parse(&get, "NEMESIS_JOBID", |s| u64::from_str_radix(s, 16).ok())?;
        // Every rank started through the environment is on this node for now.
        Ok(Self {
            rank,
            size,
            job_id,
            local_ranks: (0..size).collect(),
            local_index: rank,
            startup_timeout: timeout,
            launcher: Launcher::Env,
        })
    }

    /// A job of one.
    pub fn singleton(job_id: u64, startup_timeout: Duration) -> Self {
        Self {
            rank: 0,
            size: 1,
            job_id,
            local_ranks: vec![0],
            local_index: 0,
            startup_timeout,
            launcher: Launcher::Singleton,
        }
    }

    /// The environment variables that give a child process rank `rank` of this job.
    pub fn env_for(rank: Rank, size: u32, job_id: u64) -> [(&'static str, String); 3] {
        [
            ("NEMESIS_RANK", rank.to_string()),
            ("NEMESIS_SIZE", size.to_string()),
            ("NEMESIS_JOBID", format!("{job_id:016x}")),
        ]
    }

    /// An identifier of our node's group: the lowest rank on it.
    pub fn node(&self) -> u32 {
        self.local_ranks.iter().copied().min().unwrap_or(self.rank)
    }
}

fn invalid(get: &impl Fn(&str) -> Option<String>, var: &'static str, reason: String) -> BootError {
    BootError::Invalid {
        var,
        value: get(var).unwrap_or_default(),
        reason,
    }
}

fn parse<T>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    f: impl Fn(&str) -> Option<T>,
) -> Result<T, BootError> {
    let v = get(var).unwrap_or_default();
    f(v.trim()).ok_or_else(|| BootError::Invalid {
        var,
        value: v.clone(),
        reason: if var == "NEMESIS_JOBID" {
            "expected up to 16 hexadecimal digits".into()
        } else {
            "expected a whole number".into()
        },
    })
}

fn startup_timeout(get: &impl Fn(&str) -> Option<String>) -> Result<Duration, BootError> {
    match get("NEMESIS_STARTUP_TIMEOUT") {
        None => Ok(DEFAULT_STARTUP_TIMEOUT),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| BootError::Invalid {
                var: "NEMESIS_STARTUP_TIMEOUT",
                value: v.clone(),
                reason: "expected a positive number of seconds".into(),
            }),
    }
}

/// A job identifier that no other job on this machine is using: random bits from the
/// kernel, mixed with the pid and the clock in case the kernel has none to give.
pub fn random_job_id() -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn singleton_without_variables() {
        let b = BootInfo::from_lookup(env(&[])).unwrap();
        assert_eq!((b.rank, b.size, b.launcher), (0, 1, Launcher::Singleton));
    }

    #[test]
    fn reads_the_launcher_variables() {
        let b = BootInfo::from_lookup(env(&[
            ("NEMESIS_RANK", "2"),
            ("NEMESIS_SIZE", "4"),
            ("NEMESIS_JOBID", "00000000000000ff"),
            ("NEMESIS_STARTUP_TIMEOUT", "2.5"),
        ]))
        .unwrap();
        assert_eq!((b.rank, b.size, b.job_id, b.local_index), (2, 4, 255, 2));
        assert_eq!(b.startup_timeout, Duration::from_millis(2500));
        assert_eq!(b.local_ranks, vec![0, 1, 2, 3]);
    }

    #[test]
    fn bad_variables_are_typed_errors() {
        let base = [
            ("NEMESIS_RANK", "4"),
            ("NEMESIS_SIZE", "4"),
            ("NEMESIS_JOBID", "1"),
        ];
        let e = BootInfo::from_lookup(env(&base)).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_RANK=\"4\""), "{e}");
        let e = BootInfo::from_lookup(env(&[
            ("NEMESIS_RANK", "0"),
            ("NEMESIS_SIZE", "x"),
            ("NEMESIS_JOBID", "1"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            BootError::Invalid {
                var: "NEMESIS_SIZE",
                ..
            }
        ));
        let e = BootInfo::from_lookup(env(&[
            ("NEMESIS_RANK", "0"),
            ("NEMESIS_SIZE", "1"),
            ("NEMESIS_JOBID", "zz"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            BootError::Invalid {
                var: "NEMESIS_JOBID",
                ..
            }
        ));
        let e = BootInfo::from_lookup(env(&[("NEMESIS_RANK", "0")])).unwrap_err();
        assert!(matches!(e, BootError::Missing { .. }), "{e}");
        let e = BootInfo::from_lookup(env(&[("NEMESIS_STARTUP_TIMEOUT", "-1")])).unwrap_err();
        assert!(matches!(
            e,
            BootError::Invalid {
                var: "NEMESIS_STARTUP_TIMEOUT",
                ..
            }
        ));
    }

    #[test]
    fn job_ids_differ() {
        assert_ne!(random_job_id(), random_job_id());
    }
}
