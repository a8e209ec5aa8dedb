//! nemesis under a real Slurm: `srun --mpi=pmi2` on the one-node cluster that
//! `scripts/slurm.sh start` makes (the test command starts it and sets `SLURM_CONF`).
//!
//! Where no cluster answers, the tests say so and pass, unless `NEM_TEST_SLURM=1` says
//! one must be there (the test command sets it).

mod common;

use common::*;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Whether a cluster answers; fails when one is required and none does.
fn cluster() -> bool {
    let up = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%T"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !up {
        assert!(
            std::env::var_os("NEM_TEST_SLURM").is_none(),
            "NEM_TEST_SLURM is set but no Slurm cluster answers (scripts/slurm.sh start)"
        );
        eprintln!("skipping: no Slurm cluster answers (scripts/slurm.sh start makes one)");
    }
    up
}

/// `srun ARGS`, bounded by a minute, with `env` added.
fn srun(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg("srun")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn hello_and_ring_under_srun_with_shared_memory_and_without() {
    if !cluster() {
        return;
    }
    let (hello, ring) = (example("hello"), example("ring"));
    let (hello, ring) = (hello.to_str().unwrap(), ring.to_str().unwrap());
    for (env, via) in [(&[][..], "via shm"), (&[("NEMESIS_NO_SHM", "1")][..], "via net")] {
        let o = srun(&["--mpi=pmi2", "-n", "2", hello], env);
        assert_ranks_said(&o, via, 2, &format!("hello {env:?}"));
        // More tasks than CPUs: Slurm wants --overcommit, as README says.
        let o = srun(&["--mpi=pmi2", "--overcommit", "-n", "4", ring, "200"], env);
        assert_ranks_said(&o, "800 hops", 1, &format!("ring {env:?}"));
    }
    let o = srun(
        &["--mpi=pmi2", "--overcommit", "-n", "3", ring, "100"],
        &[("NEMESIS_NO_SHM", "1"), ("NEMESIS_NETMOD", "udp")],
    );
    assert_ranks_said(&o, "300 hops", 1, "ring over udp");
}

#[test]
fn a_rank_that_fails_before_start_up_ends_the_job_with_kill_on_bad_exit() {
    if !cluster() {
        return;
    }
    let ring = example("ring");
    let script = format!(
        "if [ \"$SLURM_PROCID\" = 1 ]; then exit 3; fi; exec {} 1000",
        ring.display()
    );
    let t = Instant::now();
    let o = srun(
        &[
            "--mpi=pmi2",
            "--kill-on-bad-exit=1",
            "-n",
            "2",
            "bash",
            "-c",
            &script,
        ],
        &[],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the job did not end with its failed rank: {:?}\n{}",
        t.elapsed(),
        text(&o)
    );
}

#[test]
fn srun_without_pmi2_is_refused_instead_of_starting_singletons() {
    if !cluster() {
        return;
    }
    let hello = example("hello");
    let o = srun(&["--mpi=none", "-n", "2", hello.to_str().unwrap()], &[]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("srun --mpi=pmi2"), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("rank 0 of 1"),
        "{}",
        text(&o)
    );
}
