//! How a process with nothing to do waits: spin, then yield, then sleep.
//!
//! Spinning is what keeps latency near the hardware's, but a spinning process takes a
//! core. When there are more local processes than cores, the process that holds the work
//! may be the one a spinner keeps off the CPU, so the defaults then go to sleep almost at
//! once and let the futex wake-up hand the core over.

use super::ChannelError;
use std::time::Duration;

/// The waiting strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Checks for work before yielding (`NEMESIS_SPIN`); it also bounds the polls a
    /// blocked call makes back to back before it waits.
    pub spin: u32,
    /// Yields before sleeping (`NEMESIS_YIELDS`).
    pub yields: u32,
    /// The longest single sleep; `wait` without a timeout returns after it, so callers
    /// can look at their peers' health.
    pub slice: Duration,
}

impl WaitPolicy {
    /// The defaults for `local` processes on a node with `cpus` usable CPUs, overridden
    /// by `NEMESIS_SPIN` and `NEMESIS_YIELDS`.
    pub fn from_env(local: u32, cpus: u32) -> Result<Self, ChannelError> {
        Self::from_lookup(local, cpus, |k| std::env::var(k).ok())
    }

    /// As [`WaitPolicy::from_env`], reading variables through `get`.
    pub fn from_lookup(
        local: u32,
        cpus: u32,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ChannelError> {
        let oversubscribed = outnumber(local, cpus);
        // Measured with `nemesis-bench ring`: 8 processes on 2 CPUs pass a token in about
        // 7 us a hop when waiters yield before sleeping, and about 22 us when they go to
        // sleep at once, since a wake-up across CPUs costs about 20 us on a VM. Spinning
        // first does not pay: with 16 checks before the first yield, barrier and allreduce
        // among 8 processes through messages took 12-15% longer than with none, and the
        // ring no less (BENCHMARKS.md).
        let mut p = if oversubscribed {
            Self {
                spin: 0,
                yields: 1000,
                slice: Duration::from_secs(1),
            }
        } else {
            Self {
                spin: 20_000,
                yields: 16,
                slice: Duration::from_secs(1),
            }
        };
        for (var, field) in [("NEMESIS_SPIN", &mut p.spin), ("NEMESIS_YIELDS", &mut p.yields)] {
            if let Some(v) = get(var) {
                *field = v.trim().parse().map_err(|_| ChannelError::Config {
                    var,
                    value: v.clone(),
                    reason: "expected a whole number".into(),
                })?;
            }
        }
        Ok(p)
    }
}

/// Whether `local` processes outnumber `cpus` CPUs: the rule behind every default that
/// changes when they do (waiting, large-message strategies, collectives).
pub fn outnumber(local: u32, cpus: u32) -> bool {
    local > cpus.max(1)
}

/// CPUs the local processes may share, as far as this process can tell: the CPUs it
/// may run on, or, when it is bound to a single CPU, the CPUs online. A launcher that
/// binds each rank to one CPU (`mpiexec -bind-to core`, `srun --cpu-bind=cores`) gives
/// each its own, and counting only that one would take every such job for
/// oversubscribed, and make every wait yield instead of spin.
pub fn usable_cpus() -> u32 {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    cpus_for_policy(allowed, affinity_cpus(), online_cpus())
}

/// The rule of [`usable_cpus`]: `allowed` (the affinity mask and any CPU quota), unless
/// the affinity mask holds exactly one CPU (`affinity`), then `online`.
fn cpus_for_policy(allowed: u32, affinity: Option<u32>, online: Option<u32>) -> u32 {
    match (affinity, online) {
        (Some(1), Some(n)) if n > 1 => n,
        _ => allowed.max(1),
    }
}

/// CPUs in this process's affinity mask.
fn affinity_cpus() -> Option<u32> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    // SAFETY: `set` was filled in by the kernel.
    (rc == 0).then(|| unsafe { libc::CPU_COUNT(&set) } as u32)
}

/// CPUs online on this machine.
fn online_cpus() -> Option<u32> {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    (n > 0).then_some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_bound_to_one_cpu_counts_the_cpus_online() {
        assert_eq!(cpus_for_policy(1, Some(1), Some(16)), 16, "bound by a launcher");
        assert_eq!(cpus_for_policy(4, Some(4), Some(16)), 4, "a set of CPUs to share");
        assert_eq!(cpus_for_policy(1, Some(8), Some(16)), 1, "a CPU quota of one");
        assert_eq!(cpus_for_policy(1, Some(1), Some(1)), 1);
        assert_eq!(cpus_for_policy(2, None, None), 2, "nothing more known");
        // Two processes bound one CPU each on a 2-CPU machine do not oversubscribe it.
        let p = WaitPolicy::from_lookup(2, cpus_for_policy(1, Some(1), Some(2)), |_| None).unwrap();
        assert!(p.spin > 0, "{p:?}");
    }

    #[test]
    fn oversubscription_sleeps_sooner() {
        let none = |_: &str| None;
        let fit = WaitPolicy::from_lookup(2, 2, none).unwrap();
        let over = WaitPolicy::from_lookup(8, 2, none).unwrap();
        assert!(over.spin < fit.spin);
        let set = WaitPolicy::from_lookup(2, 2, |k| (k == "NEMESIS_SPIN").then(|| "5".into())).unwrap();
        assert_eq!(set.spin, 5);
        let bad = WaitPolicy::from_lookup(2, 2, |k| (k == "NEMESIS_YIELDS").then(|| "-1".into()));
        assert!(matches!(
            bad,
            Err(ChannelError::Config {
                var: "NEMESIS_YIELDS",
                ..
            })
        ));
    }
}
