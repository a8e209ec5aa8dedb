//! Who this process is in the job, and which processes share its node.
//!
//! There is one path: a PMI-1 process manager when the environment names one
//! (`PMI_FD`, or `PMI_PORT` with `PMI_ID`), as Hydra's `mpiexec`, Slurm's
//! `srun --mpi=pmi2` and `nemesis-run` all do; otherwise a singleton. Each rank
//! publishes its host identity in the key-value space, so locality needs nothing
//! launcher-specific, and node-local rank 0 publishes the name of the node's segment.
//! The connection stays open, so network modules can fetch business cards lazily.

mod pmi;
pub mod wire;

pub use pmi::{Maxes, PmiClient, PmiError};

use nemesis_net::auth::JobKey;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// Where this process is with its process manager: a process joins a job once, over
/// one connection, which the first channel's end finalizes (and whose descriptor it
/// closes, so it may name something else later).
static PMI_STATE: AtomicU8 = AtomicU8::new(NOT_JOINED);
const NOT_JOINED: u8 = 0;
const JOINED: u8 = 1;
const LEFT: u8 = 2;

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
    /// The process manager failed us.
    #[error(transparent)]
    Pmi(#[from] PmiError),
    /// This process already joined its job through the process manager, and still is.
    #[error(
        "this process has already joined its job: a process joins once; keep the first \
         World or channel (or pass it around) instead of calling init again"
    )]
    AlreadyJoined,
    /// This process joined its job and left it: its first channel finalized the
    /// connection to the process manager when it was dropped.
    #[error(
        "this process has already left its job: the connection to the process manager was \
         finalized when the first World or channel was dropped, and a process joins once; \
         keep that World or channel alive for as long as the process communicates"
    )]
    AlreadyLeft,
    /// The process was started by a launcher that nemesis cannot talk to: it would run
    /// as a singleton, one of many that each believe they are alone.
    #[error("{0}")]
    ForeignLauncher(String),
    /// The key-value space lacks what another rank should have put there.
    #[error("rank {rank}'s {what} is missing from the key-value space")]
    Missing {
        /// Whose.
        rank: Rank,
        /// What.
        what: &'static str,
    },
}

/// How the process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// By a PMI-1 process manager.
    Pmi,
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
    /// Ranks on this machine (one kernel), ours included: more than `local_ranks` when
    /// namespaces or containers make several nodes of one machine. They share its CPUs,
    /// which is what decides how a waiting process waits.
    pub machine_ranks: u32,
    /// What identifies our node: host name and network namespace.
    pub host: String,
    /// The name of our node's shared segment.
    pub segment: String,
    /// How long to wait for the other processes during start-up.
    pub startup_timeout: Duration,
    /// How we were started.
    pub launcher: Launcher,
}

impl BootInfo {
    /// A job of one.
    pub fn singleton(job_id: u64, startup_timeout: Duration) -> Self {
        Self {
            rank: 0,
            size: 1,
            job_id,
            local_ranks: vec![0],
            local_index: 0,
            machine_ranks: 1,
            host: host_identity(),
            segment: String::new(),
            startup_timeout,
            launcher: Launcher::Singleton,
        }
    }

    /// An identifier of our node's group: the lowest rank on it.
    pub fn node(&self) -> u32 {
        self.local_ranks.iter().copied().min().unwrap_or(self.rank)
    }
}

/// A process's place in the job, and its line to the process manager.
#[derive(Debug)]
pub struct Boot {
    /// Who and where we are.
    pub info: BootInfo,
    pmi: Option<PmiClient>,
}

/// The key-value name of a rank's host identity.
fn host_key(rank: Rank) -> String {
    format!("nem-host-{rank}")
}

/// The key-value name of a node's segment, by its leader.
fn segment_key(leader: Rank) -> String {
    format!("nem-seg-{leader}")
}

/// The key-value name of the job's network key, which rank 0 draws.
const JOB_KEY: &str = "nem-key";

impl Boot {
    /// Joins the job the environment describes, or starts a singleton. Warns once on
    /// standard error about `NEMESIS_*` variables nemesis does not read.
    ///
    /// # Errors
    /// A process manager that fails; a second join ([`BootError::AlreadyJoined`],
    /// [`BootError::AlreadyLeft`]); a launcher nemesis cannot talk to
    /// ([`BootError::ForeignLauncher`]); a bad `NEMESIS_STARTUP_TIMEOUT`.
    pub fn init() -> Result<Self, BootError> {
        crate::env::warn_unknown();
        let get = |k: &str| std::env::var(k).ok();
        let timeout = startup_timeout(get)?;
        let managed = get("PMI_FD").is_some() || get("PMI_PORT").is_some();
        if managed {
            match PMI_STATE.load(Ordering::Acquire) {
                JOINED => return Err(BootError::AlreadyJoined),
                LEFT => return Err(BootError::AlreadyLeft),
                _ => {}
            }
        }
        match PmiClient::from_env(timeout)? {
            Some(client) => {
                // The connection is ours now, whatever happens next.
                PMI_STATE.store(JOINED, Ordering::Release);
                Self::with_client(client, timeout)
            }
            None => {
                if let Some(why) = foreign_launcher(get) {
                    return Err(BootError::ForeignLauncher(why));
                }
                Ok(Self::singleton(timeout))
            }
        }
    }

    /// A job of one, whatever the environment says; `startup_timeout` is recorded for
    /// what the caller starts next.
    pub fn singleton(startup_timeout: Duration) -> Self {
        Self {
            info: BootInfo::singleton(random_job_id(), startup_timeout),
            pmi: None,
        }
    }

    /// Joins through a connected PMI client: `init`, host identities, locality, and the
    /// node's segment name. Two PMI barriers.
    pub fn with_client(mut pmi: PmiClient, timeout: Duration) -> Result<Self, BootError> {
        pmi.init()?;
        let (rank, size) = (pmi.rank(), pmi.size());
        if size > MAX_RANKS {
            return Err(BootError::Invalid {
                var: "PMI size",
                value: size.to_string(),
                reason: format!("at most {MAX_RANKS} ranks"),
            });
        }
        let host = host_identity();
        let machine = machine_identity();
        let mine = format!("{host}\n{machine}");
        pmi.put(&host_key(rank), &wire::hex(mine.as_bytes()))?;
        pmi.barrier()?;
        let mut local_ranks = Vec::new();
        let mut machine_ranks = 0;
        for r in 0..size {
            let other = if r == rank {
                mine.clone()
            } else {
                let v = pmi.get(&host_key(r))?.ok_or(BootError::Missing {
                    rank: r,
                    what: "host identity",
                })?;
                wire::unhex(&v)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(BootError::Missing {
                        rank: r,
                        what: "host identity (unreadable)",
                    })?
            };
            let (their_host, their_machine) = other.split_once('\n').unwrap_or((&other, ""));
            if their_host == host {
                local_ranks.push(r);
            }
            if (!machine.is_empty() && their_machine == machine) || their_host == host {
                machine_ranks += 1;
            }
        }
        let job_id = job_id_of(pmi.kvsname());
        let leader = local_ranks[0];
        let segment_name = nemesis_shm::config::segment_name(job_id, leader);
        if rank == leader {
            pmi.put(&segment_key(leader), &segment_name)?;
        }
        if rank == 0 {
            // Only the job's processes can read the key-value space, so a key drawn here
            // is theirs alone; connections and datagrams prove they hold it without
            // carrying it.
            let key = JobKey::random().map_err(|e| BootError::Invalid {
                var: "the kernel's random source",
                value: String::new(),
                reason: format!("cannot draw the job's network key: {e}"),
            })?;
            pmi.put(JOB_KEY, &key.to_hex())?;
        }
        pmi.barrier()?;
        let segment = pmi.get(&segment_key(leader))?.ok_or(BootError::Missing {
            rank: leader,
            what: "segment name",
        })?;
        // The name becomes a path: only the one name this job would make will do.
        if segment != segment_name {
            return Err(BootError::Invalid {
                var: "the node's segment name in the key-value space",
                value: segment.chars().take(200).collect(),
                reason: format!("this job names its segment {segment_name:?}"),
            });
        }
        let local_index = local_ranks.iter().position(|&r| r == rank).unwrap_or(0) as u32;
        let info = BootInfo {
            rank,
            size,
            job_id,
            local_ranks,
            local_index,
            machine_ranks,
            host,
            segment,
            startup_timeout: timeout,
            launcher: Launcher::Pmi,
        };
        Ok(Self { info, pmi: Some(pmi) })
    }

    /// Publishes `value` (any bytes) under our rank's `name`, for others to fetch after
    /// the next barrier.
    pub fn publish(&mut self, name: &str, value: &[u8]) -> Result<(), BootError> {
        match &mut self.pmi {
            Some(p) => Ok(p.put(&format!("{name}-{}", self.info.rank), &wire::hex(value))?),
            None => Ok(()),
        }
    }

    /// Fetches what `rank` published under `name`.
    pub fn fetch(&mut self, rank: Rank, name: &'static str) -> Result<Vec<u8>, BootError> {
        let p = self.pmi.as_mut().ok_or(BootError::Missing { rank, what: name })?;
        let v = p
            .get(&format!("{name}-{rank}"))?
            .ok_or(BootError::Missing { rank, what: name })?;
        wire::unhex(&v).ok_or(BootError::Missing { rank, what: name })
    }

    /// The job's network key: a secret that only the job's processes know, drawn by
    /// rank 0 at start-up. A singleton draws its own.
    pub fn job_key(&mut self) -> Result<JobKey, BootError> {
        let unreadable = BootError::Missing {
            rank: 0,
            what: "network key (not 64 hexadecimal digits)",
        };
        let Some(p) = self.pmi.as_mut() else {
            return JobKey::random().map_err(|_| unreadable);
        };
        let missing = BootError::Missing {
            rank: 0,
            what: "network key",
        };
        let v = p.get(JOB_KEY)?.ok_or(missing)?;
        JobKey::from_hex(&v).map_err(|_| unreadable)
    }

    /// Waits for every rank (a no-op for a singleton).
    pub fn barrier(&mut self) -> Result<(), BootError> {
        match &mut self.pmi {
            Some(p) => Ok(p.barrier()?),
            None => Ok(()),
        }
    }

    /// Asks the process manager to end the job with `code`.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), BootError> {
        match &mut self.pmi {
            Some(p) => Ok(p.abort(code, message)?),
            None => Ok(()),
        }
    }

    /// Says goodbye to the process manager; also done on drop. The process cannot join
    /// a job again after this.
    pub fn finalize(&mut self) -> Result<(), BootError> {
        match &mut self.pmi {
            Some(p) => {
                PMI_STATE.store(LEFT, Ordering::Release);
                Ok(p.finalize()?)
            }
            None => Ok(()),
        }
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        let _ = self.finalize();
    }
}

/// What makes two processes "on the same node": the host name and the network
/// namespace. Processes in different namespaces of one machine count as different
/// hosts, as they would be in containers.
pub fn host_identity() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for its length; gethostname NUL-terminates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if rc == 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown-host".into()
    };
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{name}/{netns}")
}

/// What makes two processes share CPUs: the running kernel's boot id, the same in every
/// namespace and container of one machine.
pub fn machine_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The short host name, for messages.
pub fn host_name() -> String {
    host_identity()
        .split('/')
        .next()
        .unwrap_or("unknown-host")
        .to_string()
}

/// The job identifier belonging to a key-value space name: every process of the job
/// derives the same one, and a launcher can derive it too.
pub fn job_id_of(kvsname: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in kvsname.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// Why the environment shows a launcher that started this process among others without
/// a PMI-1 connection nemesis can use, or `None`: Slurm's `srun` without `--mpi=pmi2`
/// (`--mpi=pmix`, `--mpi=none`, or a cluster whose `MpiDefault` is neither), or a PMIx
/// launcher such as Open MPI's `mpirun`.
pub fn foreign_launcher(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let count = |var| get(var).and_then(|v| v.trim().parse::<u32>().ok());
    let tasks = count("SLURM_STEP_NUM_TASKS").or_else(|| count("SLURM_NTASKS"));
    if get("SLURM_PROCID").is_some() && tasks.is_some_and(|n| n > 1) {
        return Some(format!(
            "started by Slurm's srun as one of {} tasks, but without the PMI-1 connection \
             nemesis needs (PMI_FD): run it with `srun --mpi=pmi2`, or set MpiDefault=pmi2 in \
             slurm.conf; under --mpi=pmix or --mpi=none every task would run alone",
            tasks.unwrap_or(0)
        ));
    }
    if let Some(v) = ["PMIX_RANK", "PMIX_NAMESPACE"]
        .into_iter()
        .find(|v| get(v).is_some())
    {
        return Some(format!(
            "started by a PMIx launcher ({v} is set), which nemesis cannot talk to: start it \
             with nemesis-run, MPICH's mpiexec (Hydra), or Slurm's `srun --mpi=pmi2`"
        ));
    }
    None
}

fn startup_timeout(get: impl Fn(&str) -> Option<String>) -> Result<Duration, BootError> {
    match get("NEMESIS_STARTUP_TIMEOUT") {
        None => Ok(DEFAULT_STARTUP_TIMEOUT),
        Some(v) => nemesis_shm::config::parse_seconds(&v).ok_or_else(|| BootError::Invalid {
            var: "NEMESIS_STARTUP_TIMEOUT",
            value: v.clone(),
            reason: "expected a positive number of seconds".into(),
        }),
    }
}

/// A job identifier that no other job on this machine is using.
pub fn random_job_id() -> u64 {
    nemesis_shm::config::random_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a process manager says to a job of one through start-up, with `segment` as
    /// the node's segment name and `key` as the network key.
    fn start_up(segment: &str, key: &str) -> Vec<Option<String>> {
        [
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024",
            "cmd=my_kvsname kvsname=kvs_hostile",
            "cmd=put_result rc=0",
            "cmd=barrier_out",
            "cmd=put_result rc=0",
            "cmd=put_result rc=0",
            "cmd=barrier_out",
            &format!("cmd=get_result rc=0 value={segment}"),
            &format!("cmd=get_result rc=0 value={key}"),
        ]
        .into_iter()
        .map(|l| Some(format!("{l}\n")))
        .collect()
    }

    fn boot(replies: Vec<Option<String>>) -> Result<Boot, BootError> {
        let sock = pmi::scripted(replies);
        Boot::with_client(
            PmiClient::from_socket(sock, 0, 1, Duration::from_secs(5)),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_segment_name_the_job_would_not_make_is_refused() {
        let ours = nemesis_shm::config::segment_name(job_id_of("kvs_hostile"), 0);
        let key = JobKey::random().unwrap().to_hex();
        let mut b = boot(start_up(&ours, &key)).unwrap();
        assert_eq!(b.info.segment, ours);
        assert_eq!(b.job_key().unwrap(), JobKey::from_hex(&key).unwrap());
        let other_job = nemesis_shm::config::segment_name(job_id_of("kvs_other"), 0);
        let other_node = nemesis_shm::config::segment_name(job_id_of("kvs_hostile"), 1);
        for hostile in [
            "../../x",
            "/etc/passwd",
            &format!("../{ours}"),
            &format!("{ours}/x"),
            &other_job,
            &other_node,
        ] {
            match boot(start_up(hostile, &key)) {
                Err(e @ BootError::Invalid { .. }) => {
                    assert!(e.to_string().contains("segment name"), "{e}")
                }
                other => panic!("{hostile:?} was taken: {other:?}"),
            }
        }
    }

    #[test]
    fn a_network_key_that_is_not_one_is_refused() {
        let ours = nemesis_shm::config::segment_name(job_id_of("kvs_hostile"), 0);
        let short = "ab".repeat(31);
        for hostile in ["0", "zz", short.as_str(), "../../x"] {
            let mut b = boot(start_up(&ours, hostile)).unwrap();
            assert!(
                matches!(b.job_key(), Err(BootError::Missing { rank: 0, .. })),
                "{hostile:?} was taken as a key"
            );
        }
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_nemesis_cannot_talk_to_are_named() {
        let srun = foreign_launcher(env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4")])).unwrap();
        assert!(srun.contains("--mpi=pmi2") && srun.contains("4 tasks"), "{srun}");
        let step = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ]);
        assert!(foreign_launcher(step).is_some());
        let pmix = foreign_launcher(env(&[("PMIX_RANK", "0")])).unwrap();
        assert!(
            pmix.contains("PMIX_RANK") && pmix.contains("nemesis-run"),
            "{pmix}"
        );
        // An salloc shell, a one-task step, or nothing at all: a singleton is right.
        assert_eq!(foreign_launcher(env(&[("SLURM_NTASKS", "4")])), None);
        assert_eq!(
            foreign_launcher(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")])),
            None
        );
        assert_eq!(foreign_launcher(env(&[])), None);
    }
}
