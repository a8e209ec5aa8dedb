//! The other process managers: programs built against MPICH under `nemesis-run`, and
//! nemesis programs under MPICH's Hydra `mpiexec`, in both of its PMI modes.
//!
//! These need Debian's `mpich` and `libmpich-dev`, which `scripts/test.sh` installs.
//! Without them the tests say so and pass, except under CI, where they fail.

mod common;

use common::{example, nemesis_run, text};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The path of `tool`, or `None` (with a message) when it is not installed.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let msg =
            format!("{name} is not installed (apt-get install mpich libmpich-dev; scripts/test.sh does)");
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("skipping: {msg}");
    }
    found
}

/// Compiles the MPI test program with MPICH's compiler wrapper.
fn mpi_program() -> Option<PathBuf> {
    let mpicc = tool("mpicc.mpich")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mpi_hello.c");
    let out = std::env::temp_dir().join(format!("nemesis-mpi-hello-{}", std::process::id()));
    let o = Command::new(mpicc)
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "mpicc: {}", text(&o));
    Some(out)
}

fn all_ranks_said(out: &str, n: u32, f: impl Fn(u32) -> String) {
    for r in 0..n {
        assert!(out.contains(&f(r)), "rank {r} missing from:\n{out}");
    }
}

#[test]
fn mpich_programs_run_under_nemesis_run() {
    let Some(prog) = mpi_program() else { return };
    let o = Command::new(nemesis_run())
        .args(["-n", "4", "--timeout", "120"])
        .arg(&prog)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    all_ranks_said(&String::from_utf8_lossy(&o.stdout), 4, |r| {
        format!("mpi rank {r} of 4 token 42")
    });

    // MPI_Abort reaches nemesis-run through PMI abort and ends the job with its code.
    let o = Command::new(nemesis_run())
        .args(["-n", "3", "--timeout", "120"])
        .arg(&prog)
        .arg("abort")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rank 1 aborted the job with status 3"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_file(prog);
}

#[test]
fn nemesis_programs_run_under_hydra() {
    let Some(mpiexec) = tool("mpiexec.mpich") else {
        return;
    };
    let hello = example("hello");
    for mode in [&[][..], &["-pmi-port"][..]] {
        let o = Command::new(&mpiexec)
            .args(mode)
            .args(["-n", "4"])
            .arg(&hello)
            .output()
            .unwrap();
        assert!(o.status.success(), "{mode:?}: {}", text(&o));
        all_ranks_said(&String::from_utf8_lossy(&o.stdout), 4, |r| {
            format!("hello from rank {r} of 4 on ")
        });
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).matches("via shm").count(),
            4,
            "{}",
            text(&o)
        );
    }
}
