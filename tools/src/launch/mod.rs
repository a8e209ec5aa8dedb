//! Starting a job's processes and watching them until they end.
//!
//! Used by `nemesis-run` and by the benchmarks that start their own partners. Ranks learn
//! their place through PMI-1: every rank inherits one end of a socketpair (`PMI_FD`),
//! served by [`server::PmiServer`] in this process or, on another host, relayed by a
//! proxy that proves it belongs to the job ([`relay`]). Every child gets a parent-death
//! signal, so nothing outlives a launcher that was killed. When one member fails the
//! others are ended, and whatever shared-memory file of the job is left is removed,
//! whatever happened.

pub mod hosts;
pub mod kvs;
pub mod proof;
pub mod relay;
pub mod server;

use nemesis::bootstrap::job_id_of;
use nemesis::net::auth::JobKey;
use relay::Relay;
use server::{Event, JobInfo, PmiServer};
use std::ffi::OsString;
use std::io::{self, BufRead, Write};
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the ranks reach the process manager.
#[derive(Debug)]
pub enum Pmi {
    /// Serve PMI-1 in this process.
    Serve {
        /// MPICH's `PMI_process_mapping`.
        mapping: String,
        /// A rank that is this process itself: it is served but not started, and its
        /// socket is handed back by [`Job::take_self_pmi`].
        self_rank: Option<u32>,
    },
    /// Relay the ranks to the server at `addr` (`host:port`), proving membership with
    /// the job's secret.
    Relay {
        /// Where the server listens.
        addr: String,
        /// The job's secret.
        secret: JobKey,
    },
}

/// What to start.
#[derive(Debug)]
pub struct Spec {
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Ranks in the job.
    pub size: u32,
    /// The ranks to start here.
    pub ranks: Range<u32>,
    /// The job's key-value space; the job's identifier derives from it.
    pub kvsname: String,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// Prefix every output line with `[rank] `.
    pub label: bool,
    /// How ranks reach the process manager.
    pub pmi: Pmi,
}

/// A fresh key-value space name, unique on this machine.
pub fn new_kvsname() -> String {
    format!("nemesis-{:016x}", nemesis::bootstrap::random_job_id())
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
#[error("cannot start {program:?} as rank {rank}: {source}{}", limit_hint(.source))]
pub struct LaunchError {
    /// The program.
    pub program: OsString,
    /// The rank that failed to start.
    pub rank: u32,
    /// The error.
    #[source]
    pub source: io::Error,
}

/// What to change when a start failed on a per-user limit rather than on the program.
fn limit_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) => " (each rank holds descriptors here: raise `ulimit -n`, or start fewer ranks)",
        Some(libc::ENFILE) => " (the system's table of open files is full: start fewer ranks)",
        Some(libc::EAGAIN) => " (the process limit was reached: raise `ulimit -u`, or start fewer ranks)",
        _ => "",
    }
}

#[derive(Debug)]
struct Proc {
    /// A rank, or a host's first rank.
    id: u32,
    /// How messages name it: "rank 3", "host b (ranks 2-3)".
    name: String,
    pid: libc::pid_t,
    exit: Option<Exit>,
}

/// Running processes of a job.
#[derive(Debug)]
pub struct Job {
    procs: Vec<Proc>,
    job_id: u64,
    server: Option<PmiServer>,
    relay: Option<Relay>,
    self_pmi: Option<UnixStream>,
    forwarders: Vec<JoinHandle<()>>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The first member (rank, or host's first rank) that ended badly, and how. A rank
    /// that called PMI `abort` counts as having exited with its code.
    pub first_failure: Option<(u32, Exit)>,
    /// Every member's end, in order.
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

/// Makes `fd` survive `exec` in the child; run between fork and exec.
fn keep_across_exec(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own is async-signal-safe.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the child a process group of its own, so ending it ends whatever it started,
/// and a parent-death signal; run between fork and exec.
fn die_with(launcher: libc::pid_t) -> io::Result<()> {
    // SAFETY: setpgid, prctl and getppid are async-signal-safe system calls.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(io::Error::last_os_error());
        }
        // The launcher may have died before the line above took effect.
        if libc::getppid() != launcher {
            libc::_exit(137);
        }
    }
    Ok(())
}

impl Job {
    /// Starts `spec.ranks`, serving PMI-1 to them when the spec says so. If one cannot
    /// be started, those already started are ended and reaped before the error.
    pub fn spawn(spec: Spec) -> Result<Self, LaunchError> {
        let job_id = job_id_of(&spec.kvsname);
        let mut job = Self {
            procs: Vec::new(),
            job_id,
            server: None,
            relay: None,
            self_pmi: None,
            forwarders: Vec::new(),
        };
        let io_err = |rank, source| LaunchError {
            program: spec.program.clone(),
            rank,
            source,
        };
        // Sockets of the ranks: ours go to the server or the relay, theirs to the children.
        let mut theirs: Vec<(u32, OwnedFd)> = Vec::new();
        match spec.pmi {
            Pmi::Serve { mapping, self_rank } => {
                let mut ours = Vec::new();
                for rank in spec.ranks.clone().chain(self_rank) {
                    let (o, t) = server::rank_socket().map_err(|e| io_err(rank, e))?;
                    ours.push((rank, o));
                    if Some(rank) == self_rank {
                        job.self_pmi = Some(UnixStream::from(t));
                    } else {
                        theirs.push((rank, t));
                    }
                }
                let debug = std::env::var_os("NEMESIS_PMI_DEBUG").is_some_and(|v| v != "0");
                let info = JobInfo {
                    size: spec.size,
                    kvsname: spec.kvsname.clone(),
                    mapping,
                    debug,
                };
                job.server =
                    Some(PmiServer::start(info, ours, None).map_err(|e| io_err(spec.ranks.start, e))?);
            }
            Pmi::Relay { addr, secret } => {
                let timeout = nemesis::bootstrap::DEFAULT_STARTUP_TIMEOUT;
                let mut pairs = Vec::new();
                for rank in spec.ranks.clone() {
                    let (o, t) = server::rank_socket().map_err(|e| io_err(rank, e))?;
                    let conn = relay::connect(&addr, &secret, rank, timeout).map_err(|e| {
                        io_err(
                            rank,
                            io::Error::new(e.kind(), format!("the PMI server at {addr}: {e}")),
                        )
                    })?;
                    pairs.push((o, conn));
                    theirs.push((rank, t));
                }
                job.relay = Some(Relay::start(pairs).map_err(|e| io_err(spec.ranks.start, e))?);
            }
        }
        // SAFETY: getpid has no preconditions.
        let launcher = unsafe { libc::getpid() };
        for rank in spec.ranks.clone() {
            let mut cmd = Command::new(&spec.program);
            cmd.args(&spec.args);
            cmd.env("PMI_RANK", rank.to_string())
                .env("PMI_SIZE", spec.size.to_string());
            let Some(fd) = theirs
                .iter()
                .find(|(r, _)| *r == rank)
                .map(|(_, fd)| fd.as_raw_fd())
            else {
                unreachable!("every rank has a socket");
            };
            cmd.env("PMI_FD", fd.to_string())
                .env_remove("PMI_PORT")
                .env_remove("PMI_ID");
            cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
            // The first rank gets our input through a pipe: outside our process group it
            // may not read the terminal itself.
            cmd.stdin(if rank == spec.ranks.start {
                Stdio::piped()
            } else {
                Stdio::null()
            });
            if spec.label {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            // SAFETY: the closure runs between fork and exec and only makes
            // async-signal-safe system calls.
            unsafe {
                cmd.pre_exec(move || {
                    die_with(launcher)?;
                    keep_across_exec(fd)?;
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    if let Some(stdin) = child.stdin.take() {
                        forward_stdin(stdin);
                    }
                    if spec.label {
                        if let Some(out) = child.stdout.take() {
                            job.forwarders.push(forward(out, rank, false));
                        }
                        if let Some(err) = child.stderr.take() {
                            job.forwarders.push(forward(err, rank, true));
                        }
                    }
                    job.procs.push(Proc {
                        id: rank,
                        name: format!("rank {rank}"),
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

    /// Starts one command per host (a launcher such as ssh running a proxy), for a job
    /// whose PMI server is `server`. `hosts` gives each command, its first rank and the
    /// name messages use. Each command's standard input carries `secret`, in hex, on one
    /// line, and then ends: the proxy reads it there, where no `ps` shows it.
    pub fn spawn_hosts(
        kvsname: &str,
        server: PmiServer,
        secret: &JobKey,
        hosts: Vec<(u32, String, Vec<OsString>)>,
    ) -> Result<Self, LaunchError> {
        let mut job = Self {
            procs: Vec::new(),
            job_id: job_id_of(kvsname),
            server: Some(server),
            relay: None,
            self_pmi: None,
            forwarders: Vec::new(),
        };
        // SAFETY: getpid has no preconditions.
        let launcher = unsafe { libc::getpid() };
        let line = format!("{}\n", secret.to_hex());
        for (first, name, argv) in hosts {
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]).stdin(Stdio::piped());
            // SAFETY: as in `spawn`.
            unsafe { cmd.pre_exec(move || die_with(launcher)) };
            match cmd.spawn() {
                Ok(mut child) => {
                    // A launcher that does not read its input leaves the proxy without
                    // the secret, and the proxy says so; nothing waits here.
                    if let Some(mut stdin) = child.stdin.take() {
                        let _ = stdin.write_all(line.as_bytes());
                    }
                    job.procs.push(Proc {
                        id: first,
                        name,
                        pid: child.id() as libc::pid_t,
                        exit: None,
                    });
                }
                Err(source) => {
                    job.end(Duration::from_secs(1));
                    return Err(LaunchError {
                        program: argv[0].clone(),
                        rank: first,
                        source,
                    });
                }
            }
        }
        Ok(job)
    }

    /// This process's own PMI socket, when the spec served a rank of ours.
    pub fn take_self_pmi(&mut self) -> Option<UnixStream> {
        self.self_pmi.take()
    }

    /// The job's identifier.
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// The pid of each started rank.
    pub fn pids(&self) -> Vec<(u32, i32)> {
        self.procs.iter().map(|p| (p.id, p.pid)).collect()
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
                    bad.push((p.id, e));
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

    /// Signals the process group of every member still running.
    fn signal_all(&self, sig: i32) {
        for p in self.procs.iter().filter(|p| p.exit.is_none()) {
            // SAFETY: signalling the process group our own unreaped child leads.
            unsafe { libc::kill(-p.pid, sig) };
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
        // Whatever the members started and left behind goes too.
        for p in &self.procs {
            // SAFETY: the group was led by our child; signalling an empty group is harmless.
            unsafe { libc::kill(-p.pid, libc::SIGKILL) };
        }
    }

    /// Waits for the job: when a member ends badly, or a rank calls PMI `abort`, or the
    /// launcher is signalled, or time runs out, the other members are ended. Afterwards
    /// the job's shared-memory files on this host are removed.
    pub fn watch(mut self, w: Watch) -> Outcome {
        let start = Instant::now();
        let mut first_failure = None;
        let mut interrupted = None;
        let mut timed_out = false;
        while !self.finished() {
            if let Some(&(id, exit)) = self.reap().first() {
                first_failure = Some((id, exit));
                if let Some(name) = w.report {
                    let p = self.procs.iter().find(|p| p.id == id);
                    let (who, pid) = p.map_or((format!("rank {id}"), 0), |p| (p.name.clone(), p.pid));
                    let others = self.procs.iter().filter(|p| p.exit.is_none()).count();
                    eprintln!("{name}: {who} (pid {pid}) {exit}; ending the other {others} running");
                }
                break;
            }
            if let Some(Event::Abort { rank, code, message }) =
                self.server.as_ref().and_then(|s| s.try_event())
            {
                first_failure = Some((rank.unwrap_or(0), Exit::Code(code)));
                if let Some(name) = w.report {
                    let who = rank.map_or("a rank".into(), |r| format!("rank {r}"));
                    eprintln!("{name}: {who} aborted the job with status {code}: {message}");
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
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
        if let Some(mut r) = self.relay.take() {
            r.stop();
        }
        cleanup_segments(self.job_id);
        let mut exits: Vec<_> = self
            .procs
            .iter()
            .map(|p| (p.id, p.exit.unwrap_or(Exit::Code(0))))
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

/// Copies our standard input to the first rank's until either side closes. The thread
/// is left running: it may be blocked reading a terminal when the job ends.
fn forward_stdin(mut to: std::process::ChildStdin) {
    let _ = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let _ = io::copy(&mut io::stdin().lock(), &mut to);
    });
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
    let dir = nemesis::shm::config::shm_dir();
    let prefix = nemesis::shm::config::job_prefix(job_id);
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
            kvsname: new_kvsname(),
            env: Vec::new(),
            label: false,
            pmi: Pmi::Serve {
                mapping: server::process_mapping(&[n]),
                self_rank: None,
            },
        }
    }

    #[test]
    fn a_start_that_hit_a_limit_says_which() {
        let e = |errno| LaunchError {
            program: "true".into(),
            rank: 3,
            source: io::Error::from_raw_os_error(errno),
        };
        assert!(
            e(libc::EMFILE).to_string().contains("ulimit -n"),
            "{}",
            e(libc::EMFILE)
        );
        assert!(
            e(libc::EAGAIN).to_string().contains("ulimit -u"),
            "{}",
            e(libc::EAGAIN)
        );
        let plain = e(libc::ENOENT).to_string();
        assert!(
            plain.starts_with("cannot start \"true\" as rank 3: ") && !plain.contains("ulimit"),
            "{plain}"
        );
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
        let out = Job::spawn(sh(
            r#"test "$PMI_SIZE" = 3 && test "$PMI_RANK" -lt 3 && test -e /proc/self/fd/$PMI_FD"#,
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
        let out = Job::spawn(sh(r#"if [ "$PMI_RANK" = 1 ]; then exit 3; fi; sleep 30"#, 3))
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
        let out = Job::spawn(sh(r#"if [ "$PMI_RANK" = 0 ]; then kill -9 $$; fi; sleep 30"#, 2))
            .unwrap()
            .watch(quick());
        assert_eq!(out.first_failure, Some((0, Exit::Signal(9))));
        assert_eq!(out.exit_code(), 137);
    }

    #[test]
    fn timeout_ends_the_job() {
        let mut w = quick();
        w.timeout = Some(Duration::from_millis(100));
        let out = Job::spawn(sh("sleep 30", 2)).unwrap().watch(w);
        assert!(out.timed_out);
        assert_eq!(out.exit_code(), 124);
    }

    #[test]
    fn missing_program_is_an_error() {
        let mut s = sh("true", 2);
        s.program = "/nonexistent/program".into();
        let e = Job::spawn(s).unwrap_err();
        assert_eq!(e.rank, 0);
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn cleanup_removes_only_this_jobs_files() {
        let job = nemesis::bootstrap::random_job_id();
        let dir = nemesis::shm::config::shm_dir();
        let mine = dir.join(nemesis::shm::config::segment_name(job, 0));
        let other = dir.join(nemesis::shm::config::segment_name(job ^ 1, 0));
        std::fs::write(&mine, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        assert_eq!(cleanup_segments(job), 1);
        assert!(!mine.exists() && other.exists());
        std::fs::remove_file(other).unwrap();
    }
}
