//! What the multi-process test binaries share: starting `nemesis-run` on a child role
//! of the test binary itself, private shared-memory directories, examples, and output.
#![allow(dead_code)]

pub mod faults;
pub mod rma;
pub mod stress;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// `nemesis-run`, built (or found up to date) by the cargo that built this test: it
/// belongs to the `nemesis-tools` crate, so cargo does not hand its path to our tests.
pub fn nemesis_run() -> &'static Path {
    static RUN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let profile_dir = profile_dir();
        if prebuilt() {
            return profile_dir.join("nemesis-run");
        }
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "--quiet", "-p", "nemesis-tools", "--bin", "nemesis-run"]);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "building nemesis-run");
        profile_dir.join("nemesis-run")
    })
}

/// Whether the programs the tests start were built beforehand (`NEM_TEST_PREBUILT=1`):
/// inside the Soft-RoCE VM, where cargo is slow, the host builds them first.
fn prebuilt() -> bool {
    std::env::var_os("NEM_TEST_PREBUILT").is_some_and(|v| v == "1")
}

/// The target directory of this test binary's profile (`target/debug` or `target/release`).
fn profile_dir() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    deps.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The arguments that make this test binary run only the ignored test `child_{role}`.
pub fn child_args(role: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap().display().to_string();
    vec![
        exe,
        "--exact".into(),
        format!("child_{role}"),
        "--ignored".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

/// `nemesis-run -n N` of a child role, with a private shared-memory directory.
pub fn run(n: u32, role: &str, shm: &Path) -> Command {
    let mut c = Command::new(nemesis_run());
    c.args(["-n", &n.to_string(), "--timeout", "300", "--"])
        .args(child_args(role));
    c.env("NEM_TEST_CHILD", "1").env("NEMESIS_SHM_DIR", shm);
    c
}

/// As [`run`], started with its output piped back to us.
pub fn start(n: u32, role: &str, shm: &Path) -> Child {
    run(n, role, shm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A fresh directory for a test's segments.
pub fn shm_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nemesis-mp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Files left in `dir`.
pub fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A process's status and output, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts that a job succeeded and that `line` appears `n` times in its output, once for
/// each rank that finished its part; `what` names the run in the message.
pub fn assert_ranks_said(o: &Output, line: &str, n: usize, what: &str) {
    assert!(o.status.success(), "{what}: {}", text(o));
    let said = String::from_utf8_lossy(&o.stdout).matches(line).count();
    assert_eq!(said, n, "{what}: {n} ranks should say {line:?}\n{}", text(o));
}

/// Children only: runs `f` and fails the child process (not a panic, which libtest
/// would report as a failed test and exit 101 anyway) with its message.
pub fn child_main(f: impl FnOnce() -> Result<(), String>) {
    if std::env::var_os("NEM_TEST_CHILD").is_none() {
        return;
    }
    if let Err(e) = f() {
        eprintln!("child error: {e}");
        std::process::exit(1);
    }
}

/// An example program, built (or found up to date) by the cargo that built this test.
pub fn example(name: &str) -> PathBuf {
    example_with(name, &[])
}

/// As [`example`], built with the crate's `features`.
pub fn example_with(name: &str, features: &[&str]) -> PathBuf {
    example_of("nemesis", name, features)
}

/// An example program of the tools crate (`tools/examples`), built as [`example`] is.
pub fn tool_example(name: &str) -> PathBuf {
    example_of("nemesis-tools", name, &[])
}

/// Example `name` of `package`, built with `features` unless prebuilt.
fn example_of(package: &str, name: &str, features: &[&str]) -> PathBuf {
    let profile_dir = profile_dir();
    if prebuilt() {
        return profile_dir.join("examples").join(name);
    }
    let mut c = Command::new(env!("CARGO"));
    c.args(["build", "--quiet", "-p", package, "--example", name]);
    if !features.is_empty() {
        c.args(["--features", &features.join(",")]);
    }
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        c.arg("--release");
    }
    assert!(c.status().unwrap().success(), "building example {name}");
    profile_dir.join("examples").join(name)
}
