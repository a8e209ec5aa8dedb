//! `nemesis-run`: starts the processes of a job, on this node or across hosts, and serves
//! them PMI-1.

use clap::Parser;
use nemesis::net::auth::JobKey;
use nemesis_tools::launch::hosts::{default_address, distribute, launcher_argv, parse_hosts};
use nemesis_tools::launch::server::{JobInfo, Listen, PmiServer, process_mapping};
use nemesis_tools::launch::{self, Job, Outcome, Pmi, Spec, Watch};
use std::ffi::OsString;
use std::net::{IpAddr, TcpListener};
use std::time::Duration;

const AFTER_HELP: &str = "\
Each process learns its rank, the job's size and its peers through PMI-1, which
nemesis-run serves: every process gets PMI_FD, PMI_RANK and PMI_SIZE. Programs built
against MPICH run under it too.

With --hosts, nemesis-run runs the launcher command once per host, as
  LAUNCHER HOST nemesis-run (proxy arguments) -- PROG ARGS...
the way Hydra's bootstrap-exec does, and writes a secret drawn for the job on the
command's standard input (so the launcher must pass its input through: ssh does,
`ssh -n` does not). The proxy starts that host's ranks and relays their PMI to
--pmi-addr, proving with the secret that it belongs to the job; a connection to that
port that cannot is refused and counted. nemesis-run must be at the same path on every
host. Every NEMESIS_* variable of nemesis-run's environment is passed on to the ranks on
every host.

Output goes straight to this terminal (or with --label line by line, each line prefixed
with its rank). When a process exits with a non-zero status or is killed, or calls PMI
abort, the others are sent SIGTERM, then SIGKILL after --grace seconds, and nemesis-run
exits with that first status (128 + the signal for a killed process). SIGINT, SIGTERM and
SIGHUP end the job the same way. No shared-memory file outlives the job.

Environment read by the processes (see README.md):
  NEMESIS_CELLS            cells per process (default 64)
  NEMESIS_CELL_SIZE        bytes per cell, header included (default 32896 up to 5
                           processes on the node, 8320 from 6)
  NEMESIS_FBOX_SIZE        bytes per fastbox, header included; 0 = none (default 1152)
  NEMESIS_FBOX_SLOTS       fastboxes per ordered pair, a power of two up to 4096 (default
                           2048 for 2 processes on the node, 1024 for 3, 512 for 4 and
                           5, 256 up to 15, fewer from 16)
  NEMESIS_PAIR_SIZE        bytes of the buffer each pair shares for medium messages; 0 =
                           none (default 1M, smaller with more processes)
  NEMESIS_SHM_DIR          directory of the shared segment (default /dev/shm)
  NEMESIS_STARTUP_TIMEOUT  seconds to wait for the other processes (default 60)
  NEMESIS_SPIN, NEMESIS_YIELDS  how long an idle process spins and yields before sleeping
  NEMESIS_NETMOD           tcp, udp, or ud (verbs builds): how ranks on different hosts
                           meet (default tcp)
  NEMESIS_NO_SHM=1         send to ranks on the same host through the netmod too
  NEMESIS_NET_ADDR, NEMESIS_NET_IFACE  the address or interface the netmod uses
  NEMESIS_NET_TIMEOUT      seconds without an answer before a peer counts as failed (10)
  NEMESIS_PMI_DEBUG=1      nemesis-run prints every PMI request and reply

Examples:
  nemesis-run -n 4 ./target/release/examples/hello
  nemesis-run -n 4 --hosts node1,node2 ./target/release/examples/hello
  nemesis-run -n 2 --hosts h1,h2 --launcher 'ip netns exec' --pmi-addr 10.0.0.1 ./hello";

/// Start N processes of a program as one nemesis job, on this node or across hosts.
#[derive(Parser, Debug)]
#[command(name = "nemesis-run", version, after_help = AFTER_HELP,
          override_usage = "nemesis-run -n <N> [OPTIONS] [--] <PROG> [ARGS]...")]
struct Args {
    /// Number of processes to start.
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=nemesis::bootstrap::MAX_RANKS as i64))]
    np: u32,

    /// Hosts to run on, comma-separated; `name:count` places `count` ranks on a host.
    /// Without counts the ranks are split into even blocks.
    #[arg(long, value_name = "LIST")]
    hosts: Option<String>,

    /// The command that runs a command on a host: it is given the host name and then
    /// the command.
    #[arg(long, value_name = "CMD", default_value = "ssh", requires = "hosts")]
    launcher: String,

    /// The address other hosts use to reach this nemesis-run. Defaults to this
    /// machine's first non-loopback IPv4 address.
    #[arg(long, value_name = "ADDR", requires = "hosts")]
    pmi_addr: Option<IpAddr>,

    // The help is an attribute, not a doc comment, which rustdoc would read as a link.
    #[arg(short, long, help = "Prefix every line of output with \"[rank] \"")]
    label: bool,

    /// Seconds between SIGTERM and SIGKILL when the job is being ended.
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = seconds)]
    grace: f64,

    /// End the job after this many seconds; nemesis-run then exits with 124.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    timeout: Option<f64>,

    /// Proxy mode: the PMI server to connect the ranks to (host:port).
    #[arg(long, hide = true, requires_all = ["proxy_kvsname", "proxy_size", "proxy_first"])]
    proxy_pmi: Option<String>,
    #[arg(long, hide = true)]
    proxy_kvsname: Option<String>,
    #[arg(long, hide = true)]
    proxy_size: Option<u32>,
    #[arg(long, hide = true)]
    proxy_first: Option<u32>,
    /// Proxy mode: the host, for messages.
    #[arg(long, hide = true)]
    proxy_host: Option<String>,
    /// Proxy mode: NAME=VALUE to set for the ranks (repeated).
    #[arg(long, hide = true, value_name = "NAME=VALUE")]
    proxy_env: Vec<String>,

    /// The program to start, then its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG"
    )]
    command: Vec<OsString>,
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

fn fail(msg: impl std::fmt::Display, code: i32) -> ! {
    eprintln!("nemesis-run: {msg}");
    std::process::exit(code);
}

fn main() {
    let args = Args::parse();
    let watch = Watch {
        grace: Duration::from_secs_f64(args.grace),
        timeout: args.timeout.map(Duration::from_secs_f64),
        report: Some("nemesis-run"),
    };
    launch::catch_signals();
    sweep(&args);
    let outcome = if let Some(pmi) = args.proxy_pmi.clone() {
        proxy(&args, pmi, watch)
    } else if let Some(hosts) = args.hosts.clone() {
        across_hosts(&args, &hosts, watch)
    } else {
        local(&args, watch)
    };
    std::process::exit(outcome.exit_code());
}

/// Removes what processes killed on this host left in the shared-memory directory (a
/// launcher killed during start-up, say): files of ours that no live process holds.
fn sweep(args: &Args) {
    let from_proxy_env = args
        .proxy_env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "NEMESIS_SHM_DIR")
        .map(|(_, v)| std::path::PathBuf::from(v));
    let dir = from_proxy_env.unwrap_or_else(nemesis::shm::config::shm_dir);
    let n = nemesis::shm::sweep(&dir);
    if n > 0 {
        eprintln!(
            "nemesis-run: removed {n} file{} that processes killed earlier left in {}",
            if n == 1 { "" } else { "s" },
            dir.display()
        );
    }
}

fn spec(args: &Args, size: u32, ranks: std::ops::Range<u32>, kvsname: String, pmi: Pmi) -> Spec {
    let mut command = args.command.iter().cloned();
    Spec {
        program: command.next().expect("clap requires a program"),
        args: command.collect(),
        size,
        ranks,
        kvsname,
        env: args
            .proxy_env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        label: args.label,
        pmi,
    }
}

fn start(spec: Spec) -> Job {
    let job_id = nemesis::bootstrap::job_id_of(&spec.kvsname);
    match Job::spawn(spec) {
        Ok(job) => job,
        Err(e) => {
            launch::cleanup_segments(job_id);
            fail(
                &e,
                if e.source.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                },
            );
        }
    }
}

fn local(args: &Args, watch: Watch) -> Outcome {
    let n = args.np;
    let pmi = Pmi::Serve {
        mapping: process_mapping(&[n]),
        self_rank: None,
    };
    start(spec(args, n, 0..n, launch::new_kvsname(), pmi)).watch(watch)
}

fn proxy(args: &Args, pmi: String, mut watch: Watch) -> Outcome {
    let (Some(kvsname), Some(size), Some(first)) =
        (args.proxy_kvsname.clone(), args.proxy_size, args.proxy_first)
    else {
        fail(
            "proxy mode needs --proxy-kvsname, --proxy-size and --proxy-first",
            2,
        );
    };
    let Some(end) = first.checked_add(args.np).filter(|&e| e <= size) else {
        fail(
            format!(
                "ranks {first}..{} do not fit a job of {size}",
                first as u64 + args.np as u64
            ),
            2,
        );
    };
    let host = args
        .proxy_host
        .clone()
        .unwrap_or_else(nemesis::bootstrap::host_name);
    watch.report = Some(Box::leak(format!("nemesis-run (host {host})").into_boxed_str()));
    let secret = read_secret(SECRET_WAIT).unwrap_or_else(|e| fail(e, 2));
    start(spec(
        args,
        size,
        first..end,
        kvsname,
        Pmi::Relay { addr: pmi, secret },
    ))
    .watch(watch)
}

/// How long a proxy waits for the job's secret on its standard input.
const SECRET_WAIT: Duration = Duration::from_secs(30);

/// Reads the job's secret, one line of hex, from standard input, a byte at a time so
/// that nothing after it is taken from what the first rank may read.
fn read_secret(wait: Duration) -> Result<JobKey, String> {
    let deadline = std::time::Instant::now() + wait;
    let mut line = Vec::new();
    let none = "no job secret on standard input: the launcher command must pass its input \
                through to the remote command (ssh does; `ssh -n` does not)";
    while line.last() != Some(&b'\n') {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc == 0 {
            return Err(format!("{none} (nothing came within {wait:?})"));
        }
        let mut b = [0u8; 1];
        match std::io::Read::read(&mut std::io::stdin().lock(), &mut b) {
            Ok(1) if line.len() < 256 => line.push(b[0]),
            Ok(_) => return Err(none.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{none}: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&line);
    JobKey::from_hex(text.trim_end()).map_err(|e| format!("the job secret on standard input: {e}"))
}

fn across_hosts(args: &Args, list: &str, watch: Watch) -> Outcome {
    let hosts = parse_hosts(list).unwrap_or_else(|e| fail(format!("--hosts: {e}"), 2));
    let ranges = distribute(args.np, &hosts).unwrap_or_else(|e| fail(format!("--hosts: {e}"), 2));
    let addr = args.pmi_addr.unwrap_or_else(default_address);
    let listener = TcpListener::bind((addr, 0)).unwrap_or_else(|e| {
        fail(
            format!("cannot listen on {addr} for the PMI server (see --pmi-addr): {e}"),
            1,
        )
    });
    let kvsname = launch::new_kvsname();
    let counts: Vec<u32> = ranges.iter().map(|r| r.end - r.start).collect();
    let debug = std::env::var_os("NEMESIS_PMI_DEBUG").is_some_and(|v| v != "0");
    let info = JobInfo {
        size: args.np,
        kvsname: kvsname.clone(),
        mapping: process_mapping(&counts),
        debug,
    };
    let secret = JobKey::random().unwrap_or_else(|e| fail(format!("cannot draw the job's secret: {e}"), 1));
    let listen = Listen::new(listener, secret.clone());
    let server = PmiServer::start(info, Vec::new(), Some(listen))
        .unwrap_or_else(|e| fail(format!("cannot start the PMI server: {e}"), 1));
    let port = server.addr().expect("listening").to_string();
    let exe =
        std::env::current_exe().unwrap_or_else(|e| fail(format!("cannot find my own executable: {e}"), 1));
    let mut members = Vec::new();
    for (host, r) in hosts.iter().zip(&ranges) {
        let mut remote: Vec<OsString> = vec![
            exe.clone().into(),
            "--proxy-pmi".into(),
            port.clone().into(),
            "--proxy-kvsname".into(),
            kvsname.clone().into(),
            "--proxy-size".into(),
            args.np.to_string().into(),
            "--proxy-first".into(),
            r.start.to_string().into(),
            "--proxy-host".into(),
            host.name.clone().into(),
            "-n".into(),
            (r.end - r.start).to_string().into(),
            "--grace".into(),
            args.grace.to_string().into(),
        ];
        if args.label {
            remote.push("--label".into());
        }
        // What a launcher such as ssh would not carry over.
        for (k, v) in std::env::vars_os() {
            if let (Some(k), Some(v)) = (k.to_str(), v.to_str())
                && k.starts_with("NEMESIS_")
            {
                remote.push("--proxy-env".into());
                remote.push(format!("{k}={v}").into());
            }
        }
        remote.push("--".into());
        remote.extend(args.command.iter().cloned());
        let argv = launcher_argv(&args.launcher, &host.name, &remote)
            .unwrap_or_else(|e| fail(format!("--launcher: {e}"), 2));
        let name = format!("host {} (ranks {}-{})", host.name, r.start, r.end - 1);
        members.push((r.start, name, argv));
    }
    let job = Job::spawn_hosts(&kvsname, server, &secret, members).unwrap_or_else(|e| {
        fail(
            format!(
                "cannot run the launcher command {:?}: {}",
                args.launcher, e.source
            ),
            127,
        )
    });
    job.watch(watch)
}
