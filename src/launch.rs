//! Starting a job's processes on this node and watching them until they end.
//!
//! Used by `nemesis-run` and by the benchmarks that start their own partners. Every
//! child gets its rank through the environment (see [`crate::bootstrap`]) and a
//! parent-death signal, so no rank outlives a launcher that was killed. When one rank
//! fails the others are ended, and whatever shared-memory file of the job is left is
//! removed, whatever happened.

use crate::bootstrap::BootInfo;
use std::ffi::OsString;
use std::io::{self, BufRead, Write};
use std::ops::Range;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Ranks in the job.
    pub size: u32,
    /// The ranks to start here.
    pub ranks: Range<u32>,
    /// The job's identifier.
    pub job_id: u64,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// Prefix every output line with `[rank] `.
    pub label: bool,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    fn from_wait_status(st: libc::c_int) -> Self {
        if libc::WIFSIGNALED(st) {
            Self::Signal(libc::WTERMSIG(st))
        } else {
            Self::Code(libc::WEXITSTATUS(st))
        }
    }

    /// Whether it exited with status 0.
    pub fn success(self) -> bool {
        self == Self::Code(0)
    }

    /// The status a shell would report: the exit status, or 128 plus the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Code(c) => write!(f, "exited with status {c}"),
            Self::Signal(s) => write!(f, "was killed by signal {s} ({})", signal_name(s)),
        }
    }
}

/// The name of a common signal.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "unknown signal",
    }
}

/// Why a job could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {program:?} as rank {rank}: {source}")]
pub struct LaunchError {
    /// The program.
    pub program: OsString,
    /// The rank that failed to start.
    pub rank: u32,
    /// The error.
    #[source]
    pub source: io::Error,
}

#[derive(Debug)]
struct Proc {
    rank: u32,
    pid: libc::pid_t,
    exit: Option<Exit>,
}

/// Running processes of a job.
#[derive(Debug)]
pub struct Job {
    procs: Vec<Proc>,
    job_id: u64,
    forwarders: Vec<JoinHandle<()>>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The first rank that ended badly, and how.
    pub first_failure: Option<(u32, Exit)>,
    /// Every rank's end, in rank order.
    pub exits: Vec<(u32, Exit)>,
    /// The signal that interrupted the launcher, if one did.
    pub interrupted: Option<i32>,
    /// Whether the job ran out of time.
    pub timed_out: bool,
}

impl Outcome {
    /// The launcher's exit status: 124 after a timeout, 128 plus the signal after an
    /// interruption, else the first failure's status, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.timed_out {
            124
        } else if let Some(sig) = self.interrupted {
            128 + sig
        } else {
            self.first_failure.map_or(0, |(_, e)| e.shell_code().max(1))
        }
    }
}

/// How [`Job::watch`] behaves.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// Time between SIGTERM and SIGKILL when ending the job.
    pub grace: Duration,
    /// End the job after this long.
    pub timeout: Option<Duration>,
    /// Report the first failure and the ending on stderr, prefixed with this name.
    pub report: Option<&'static str>,
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::Relaxed);
}

/// Makes SIGINT, SIGTERM and SIGHUP end the watched job in order instead of killing the
/// launcher outright. For launchers only: it replaces the process's handlers.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
        // sigaction struct is fully initialised.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = note_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

impl Job {
    /// Starts `spec.ranks`. If one cannot be started, those already started are ended
    /// and reaped before the error is returned.
    pub fn spawn(spec: &Spec) -> Result<Self, LaunchError> {
        let mut job = Self {
            procs: Vec::new(),
            job_id: spec.job_id,
            forwarders: Vec::new(),
        };
        // SAFETY: getpid has no preconditions.
        let launcher = unsafe { libc::getpid() };
        for rank in spec.ranks.clone() {
            let mut cmd = Command::new(&spec.program);
            cmd.args(&spec.args);
            for (k, v) in BootInfo::env_for(rank, spec.size, spec.job_id) {
                cmd.env(k, v);
            }
            cmd.env("NEMESIS_LAUNCHER", "nemesis-run");
            cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
            if rank != spec.ranks.start {
                cmd.stdin(Stdio::null());
            }
            if spec.label {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            // SAFETY: the closure runs between fork and exec and only makes
            // async-signal-safe system calls.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The launcher may have died before the line above took effect.
                    if libc::getppid() != launcher {
                        libc::_exit(137);
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    if spec.label {
                        if let Some(out) = child.stdout.take() {
                            job.forwarders.push(forward(out, rank, false));
                        }
                        if let Some(err) = child.stderr.take() {
                            job.forwarders.push(forward(err, rank, true));
                        }
                    }
                    job.procs.push(Proc {
                        rank,
                        pid: child.id() as libc::pid_t,
                        exit: None,
                    });
                }
                Err(source) => {
                    job.end(Duration::from_secs(1));
                    job.join_forwarders();
                    return Err(LaunchError {
                        program: spec.program.clone(),
                        rank,
                        source,
                    });
                }
            }
        }
        Ok(job)
    }

    /// The job's identifier.
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// The pid of each started rank.
    pub fn pids(&self) -> Vec<(u32, i32)> {
        self.procs.iter().map(|p| (p.rank, p.pid)).collect()
    }

    /// Reaps whatever has ended, without waiting. Returns the ranks that ended badly.
    pub fn reap(&mut self) -> Vec<(u32, Exit)> {
        let mut bad = Vec::new();
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let mut st = 0;
            // SAFETY: `p.pid` is our child and `st` a valid out-pointer.
            let r = unsafe { libc::waitpid(p.pid, &mut st, libc::WNOHANG) };
            if r == p.pid {
                let e = Exit::from_wait_status(st);
                p.exit = Some(e);
                if !e.success() {
                    bad.push((p.rank, e));
                }
            } else if r < 0 {
                // Not our child any more (reaped elsewhere): treat as gone.
                p.exit = Some(Exit::Code(0));
            }
        }
        bad
    }

    /// Whether every rank has ended.
    pub fn finished(&self) -> bool {
        self.procs.iter().all(|p| p.exit.is_some())
    }

    fn signal_all(&self, sig: i32) {
        for p in self.procs.iter().filter(|p| p.exit.is_none()) {
            // SAFETY: sending a signal to our own unreaped child.
            unsafe { libc::kill(p.pid, sig) };
        }
    }

    /// Ends every rank still running: SIGTERM, then SIGKILL after `grace`.
    pub fn end(&mut self, grace: Duration) {
        self.signal_all(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while !self.finished() && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.finished() {
            self.signal_all(libc::SIGKILL);
            while !self.finished() {
                self.reap();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// Waits for the job: when a rank ends badly, or the launcher is signalled, or time
    /// runs out, the other ranks are ended. Afterwards the job's shared-memory files are
    /// removed.
    pub fn watch(mut self, w: Watch) -> Outcome {
        let start = Instant::now();
        let mut first_failure = None;
        let mut interrupted = None;
        let mut timed_out = false;
        while !self.finished() {
            if let Some(&(rank, exit)) = self.reap().first() {
                first_failure = Some((rank, exit));
                if let Some(name) = w.report {
                    let pid = self.procs.iter().find(|p| p.rank == rank).map_or(0, |p| p.pid);
                    let others = self.procs.iter().filter(|p| p.exit.is_none()).count();
                    eprintln!(
                        "{name}: rank {rank} (pid {pid}) {exit}; ending the other {others} running ranks"
                    );
                }
                break;
            }
            let sig = SIGNALLED.swap(0, Ordering::Relaxed);
            if sig != 0 {
                interrupted = Some(sig);
                if let Some(name) = w.report {
                    eprintln!("{name}: interrupted by {}; ending the job", signal_name(sig));
                }
                break;
            }
            if w.timeout.is_some_and(|t| start.elapsed() >= t) {
                timed_out = true;
                if let Some(name) = w.report {
                    eprintln!(
                        "{name}: the job ran out of time ({:?}); ending it",
                        w.timeout.unwrap_or_default()
                    );
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.end(w.grace);
        self.join_forwarders();
        cleanup_segments(self.job_id);
        let mut exits: Vec<_> = self
            .procs
            .iter()
            .map(|p| (p.rank, p.exit.unwrap_or(Exit::Code(0))))
            .collect();
        exits.sort_by_key(|e| e.0);
        Outcome {
            first_failure,
            exits,
            interrupted,
            timed_out,
        }
    }

    fn join_forwarders(&mut self) {
        for h in self.forwarders.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.finished() {
            self.end(Duration::from_millis(500));
        }
        cleanup_segments(self.job_id);
    }
}

/// Copies a child's output to ours, one line at a time, each prefixed with its rank.
fn forward(src: impl io::Read + Send + 'static, rank: u32, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = io::BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let prefix = format!("[{rank}] ");
                    let res = if to_stderr {
                        let mut e = io::stderr().lock();
                        e.write_all(prefix.as_bytes()).and_then(|_| e.write_all(&line))
                    } else {
                        let mut o = io::stdout().lock();
                        o.write_all(prefix.as_bytes())
                            .and_then(|_| o.write_all(&line))
                            .and_then(|_| o.flush())
                    };
                    if res.is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// Removes the shared-memory files a job left behind (normally none: the segment is
/// unlinked as soon as every process has attached). Returns how many it removed.
pub fn cleanup_segments(job_id: u64) -> usize {
    let dir = nemesis_shm::config::shm_dir();
    let prefix = nemesis_shm::config::job_prefix(job_id);
    let hidden = format!(".{prefix}");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&prefix) || name.starts_with(&hidden)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, n: u32) -> Spec {
        Spec {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            size: n,
            ranks: 0..n,
            job_id: crate::bootstrap::random_job_id(),
            env: Vec::new(),
            label: false,
        }
    }

    fn quick() -> Watch {
        Watch {
            grace: Duration::from_millis(200),
            timeout: Some(Duration::from_secs(60)),
            report: None,
        }
    }

    #[test]
    fn success_and_rank_environment() {
        let out = Job::spawn(&sh(
            r#"test "$NEMESIS_SIZE" = 3 && test "$NEMESIS_RANK" -lt 3"#,
            3,
        ))
        .unwrap()
        .watch(quick());
        assert_eq!(out.exit_code(), 0, "{out:?}");
        assert_eq!(out.exits.len(), 3);
    }

    #[test]
    fn first_failure_ends_the_rest() {
        let start = Instant::now();
        let out = Job::spawn(&sh(r#"if [ "$NEMESIS_RANK" = 1 ]; then exit 3; fi; sleep 30"#, 3))
            .unwrap()
            .watch(quick());
        assert_eq!(out.first_failure, Some((1, Exit::Code(3))));
        assert_eq!(out.exit_code(), 3);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sleepers were not ended"
        );
        assert!(
            out.exits
                .iter()
                .any(|&(r, e)| r == 0 && e == Exit::Signal(libc::SIGTERM))
        );
    }

    #[test]
    fn killed_rank_reports_its_signal() {
        let out = Job::spawn(&sh(
            r#"if [ "$NEMESIS_RANK" = 0 ]; then kill -9 $$; fi; sleep 30"#,
            2,
        ))
        .unwrap()
        .watch(quick());
        assert_eq!(out.first_failure, Some((0, Exit::Signal(9))));
        assert_eq!(out.exit_code(), 137);
    }

    #[test]
    fn timeout_ends_the_job() {
        let mut w = quick();
        w.timeout = Some(Duration::from_millis(100));
        let out = Job::spawn(&sh("sleep 30", 2)).unwrap().watch(w);
        assert!(out.timed_out);
        assert_eq!(out.exit_code(), 124);
    }

    #[test]
    fn missing_program_is_an_error() {
        let mut s = sh("true", 2);
        s.program = "/nonexistent/program".into();
        let e = Job::spawn(&s).unwrap_err();
        assert_eq!(e.rank, 0);
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn cleanup_removes_only_this_jobs_files() {
        let job = crate::bootstrap::random_job_id();
        let dir = nemesis_shm::config::shm_dir();
        let mine = dir.join(nemesis_shm::config::segment_name(job, 0));
        let other = dir.join(nemesis_shm::config::segment_name(job ^ 1, 0));
        std::fs::write(&mine, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        assert_eq!(cleanup_segments(job), 1);
        assert!(!mine.exists() && other.exists());
        std::fs::remove_file(other).unwrap();
    }
}
