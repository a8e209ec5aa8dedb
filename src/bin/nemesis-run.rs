//! `nemesis-run`: starts the processes of a job on this node.

use clap::Parser;
use nemesis::launch::{self, Job, Spec, Watch};
use std::ffi::OsString;
use std::time::Duration;

const AFTER_HELP: &str = "\
Each process gets NEMESIS_RANK, NEMESIS_SIZE and NEMESIS_JOBID in its environment.
Output goes straight to this terminal (or with --label through nemesis-run, one line
at a time). When a process exits with a non-zero status or is killed, the others are
sent SIGTERM, then SIGKILL after --grace seconds, and nemesis-run exits with that first
status (128 + the signal for a killed process). SIGINT, SIGTERM and SIGHUP end the job
the same way. No shared-memory file outlives the job.

Environment read by the processes (see README.md):
  NEMESIS_CELLS            cells per process (default 64)
  NEMESIS_CELL_SIZE        bytes per cell, header included (default 8192)
  NEMESIS_FBOX_SIZE        bytes per fastbox, header included; 0 = none (default 1152)
  NEMESIS_SHM_DIR          directory of the shared segment (default /dev/shm)
  NEMESIS_STARTUP_TIMEOUT  seconds to wait for the other processes (default 60)
  NEMESIS_SPIN, NEMESIS_YIELDS  how long an idle process spins and yields before sleeping

Example:
  nemesis-run -n 4 ./target/release/examples/hello";

/// Start N processes of a program on this node, as one nemesis job.
#[derive(Parser, Debug)]
#[command(name = "nemesis-run", version, after_help = AFTER_HELP,
          override_usage = "nemesis-run -n <N> [OPTIONS] [--] <PROG> [ARGS]...")]
struct Args {
    /// Number of processes to start.
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=nemesis::shm::config::MAX_LOCAL_PROCS as i64))]
    np: u32,

    /// Prefix every line of output with "[rank] ".
    #[arg(short, long)]
    label: bool,

    /// Seconds between SIGTERM and SIGKILL when the job is being ended.
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = seconds)]
    grace: f64,

    /// End the job after this many seconds; nemesis-run then exits with 124.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    timeout: Option<f64>,

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

fn main() {
    let args = Args::parse();
    let mut command = args.command.into_iter();
    let program = command.next().expect("clap requires a program");
    let spec = Spec {
        program,
        args: command.collect(),
        size: args.np,
        ranks: 0..args.np,
        job_id: nemesis::bootstrap::random_job_id(),
        env: Vec::new(),
        label: args.label,
    };
    launch::catch_signals();
    let job = match Job::spawn(&spec) {
        Ok(job) => job,
        Err(e) => {
            eprintln!("nemesis-run: {e}");
            launch::cleanup_segments(spec.job_id);
            std::process::exit(if e.source.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let outcome = job.watch(Watch {
        grace: Duration::from_secs_f64(args.grace),
        timeout: args.timeout.map(Duration::from_secs_f64),
        report: Some("nemesis-run"),
    });
    std::process::exit(outcome.exit_code());
}
