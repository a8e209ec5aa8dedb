//! Multi-process tests: real processes started by `nemesis-run`, talking through the
//! shared segment, and the faults the launcher must survive.
//!
//! Each child role is an ignored test of this binary, which `nemesis-run` starts with
//! `--exact child_… --ignored`; `NEM_TEST_CHILD` tells it that it is a child.

mod common;

use common::*;
use nemesis::{Channel, ChannelError, Header, SendStatus, ShmChannel};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Reads `count` "ready RANK PID" reports from a child's stdout; returns them.
fn wait_ready(child: &mut Child, count: usize) -> Vec<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // libtest prints "test child_… ... " without a newline, so the marker may
        // come in the middle of a line.
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(at) = line.find("ready ")
                && tx.send(line[at..].to_string()).is_err()
            {
                break;
            }
        }
    });
    (0..count)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(120))
                .expect("children never got ready")
        })
        .collect()
}

fn pid_of_rank(lines: &[String], rank: u32) -> i32 {
    lines
        .iter()
        .find_map(|l| {
            let mut w = l.split_whitespace().skip(1);
            let r: u32 = w.next()?.parse().ok()?;
            let pid: i32 = w.next()?.parse().ok()?;
            (r == rank).then_some(pid)
        })
        .expect("rank reported its pid")
}

fn tag(t: i32) -> Header {
    Header {
        tag: t,
        kind: 1,
        ..Header::default()
    }
}

// ---------------------------------------------------------------------------------
// Children

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_all_to_all() {
    child_main(|| {
        let mut ch = ShmChannel::init().map_err(|e| e.to_string())?;
        let (me, n) = (ch.rank(), ch.size());
        // Bad input is a typed error and sends nothing.
        match ch.send_bytes(n, tag(0), b"x") {
            Err(ChannelError::InvalidRank { rank, size }) if rank == n && size == n => {}
            other => return Err(format!("send to rank {n}: {other:?}")),
        }
        let too_big = vec![0u8; ch.max_payload() + 1];
        match ch.send_bytes((me + 1) % n, tag(0), &too_big) {
            Err(ChannelError::PacketTooLarge { .. }) => {}
            other => return Err(format!("oversized send: {other:?}")),
        }
        const PER_PEER: i32 = 400;
        let max = ch.max_payload();
        let size_of = |src: u32, i: i32| {
            [0usize, 1, 8, 24, 25, 100, 1000, 1112, 1113, 5000, max][(i as usize + src as usize) % 11]
        };
        let byte_of = |src: u32, i: i32| (src as i32 * 31 + i) as u8;
        let mut next = vec![0i32; n as usize];
        let mut got = 0;
        let want = (n - 1) as i32 * PER_PEER;
        let mut err = None;
        for i in 0..PER_PEER {
            for peer in (0..n).filter(|&p| p != me) {
                let data = vec![byte_of(me, i); size_of(me, i)];
                match ch.send_bytes(peer, tag(i), &data).map_err(|e| e.to_string())? {
                    SendStatus::Sent | SendStatus::Queued(_) => {}
                }
            }
            got += ch
                .poll(|p| {
                    let s = p.src as usize;
                    let i = next[s];
                    if p.header.tag != i
                        || p.payload.len() != size_of(p.src, i)
                        || p.payload.iter().any(|&b| b != byte_of(p.src, i))
                    {
                        err.get_or_insert(format!(
                            "from {}: got tag {} len {}, expected {i}",
                            p.src,
                            p.header.tag,
                            p.payload.len()
                        ));
                    }
                    next[s] += 1;
                })
                .map_err(|e| e.to_string())? as i32;
        }
        while got < want {
            got += ch
                .poll_wait(
                    |p| {
                        let s = p.src as usize;
                        let i = next[s];
                        if p.header.tag != i || p.payload.iter().any(|&b| b != byte_of(p.src, i)) {
                            err.get_or_insert(format!(
                                "from {}: got tag {}, expected {i}",
                                p.src, p.header.tag
                            ));
                        }
                        next[s] += 1;
                    },
                    Some(Duration::from_secs(60)),
                )
                .map_err(|e| e.to_string())? as i32;
        }
        if let Some(e) = err {
            return Err(e);
        }
        ch.flush(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        println!("rank {me}: received {got} messages in order");
        Ok(())
    });
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_ring() {
    child_main(|| {
        let mut ch = ShmChannel::init().map_err(|e| e.to_string())?;
        let (r, n) = (ch.rank() as u64, ch.size() as u64);
        let m: u64 = std::env::var("RING_MESSAGES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000);
        // Hop h goes to rank h % n; rank r receives hops r, r + n, ...
        let mine = if r == 0 {
            m / n
        } else {
            m / n + u64::from(m % n >= r)
        };
        let mut expect = if r == 0 { n } else { r };
        if r == 0 {
            ch.send_bytes(1, tag(0), &1u64.to_le_bytes())
                .map_err(|e| e.to_string())?;
        }
        for _ in 0..mine {
            let mut hop = None;
            while hop.is_none() {
                ch.poll_wait(
                    |p| hop = Some(u64::from_le_bytes(p.payload.try_into().unwrap())),
                    Some(Duration::from_secs(60)),
                )
                .map_err(|e| e.to_string())?;
            }
            let h = hop.unwrap();
            if h != expect {
                return Err(format!("rank {r}: hop {h}, expected {expect}"));
            }
            expect += n;
            if h < m {
                ch.send_bytes(((h + 1) % n) as u32, tag(0), &(h + 1).to_le_bytes())
                    .map_err(|e| e.to_string())?;
            }
        }
        ch.flush(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        Ok(())
    });
}

/// Attaches, reports its pid, then keeps exchanging with its neighbours until killed.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_spin() {
    child_main(|| {
        let mut ch = ShmChannel::init().map_err(|e| e.to_string())?;
        println!("ready {} {}", ch.rank(), std::process::id());
        let next = (ch.rank() + 1) % ch.size();
        loop {
            ch.send_bytes(next, tag(0), b"tick").map_err(|e| e.to_string())?;
            ch.poll_wait(|_| {}, Some(Duration::from_millis(100)))
                .map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Rank 1 never talks to the process manager; rank 0 waits for it at the PMI barrier.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_never_init() {
    child_main(|| {
        let rank: u32 = std::env::var("PMI_RANK").unwrap().parse().unwrap();
        if rank == 1 {
            std::thread::sleep(Duration::from_secs(60));
        }
        ShmChannel::init().map_err(|e| e.to_string())?;
        Ok(())
    });
}

/// Reports its pid after the PMI exchange; ranks other than 0 then wait before
/// attaching, so the test can kill one while rank 0 holds the segment and waits at the
/// segment's barrier.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_slow_start() {
    child_main(|| {
        let boot = nemesis::bootstrap::Boot::init().map_err(|e| e.to_string())?;
        let rank = boot.info.rank;
        println!("ready {rank} {}", std::process::id());
        if rank != 0 {
            std::thread::sleep(Duration::from_secs(30));
        }
        let _ch = ShmChannel::from_boot(boot).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_init_only() {
    child_main(|| {
        let ch = ShmChannel::init().map_err(|e| e.to_string())?;
        let code: i32 = std::env::var("EXIT_RANK_1")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if ch.rank() == 1 && code != 0 {
            std::process::exit(code);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------
// Tests

/// The line-stream example measures each size asked for both ways and says so in JSON,
/// and refuses a size it cannot stream with its usage.
#[test]
fn line_stream_reports_each_size_both_ways_and_refuses_bad_sizes() {
    let o = Command::new(tool_example("line_stream"))
        .args(["--sizes", "32,64", "--records", "4096", "--rounds", "1", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for size in [32, 64] {
        let row = out
            .lines()
            .find(|l| l.contains(&format!("\"record_bytes\":{size},")))
            .unwrap_or_else(|| panic!("no row for {size} bytes: {}", text(&o)));
        for key in ["\"records_per_s\":", "\"locked_add_records_per_s\":"] {
            let v: f64 = row
                .split(key)
                .nth(1)
                .and_then(|r| r.split([',', '}']).next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {row}"));
            assert!(v > 0.0, "{row}");
        }
    }
    let o = Command::new(tool_example("line_stream"))
        .args(["--sizes", "12"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("12 is not a multiple of 8"),
        "{}",
        text(&o)
    );
}

#[test]
fn examples_run_under_the_launcher() {
    let dir = shm_dir("examples");
    let o = Command::new(nemesis_run())
        .args(["-n", "4"])
        .arg(example("hello"))
        .env("NEMESIS_SHM_DIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in 0..4 {
        assert!(out.contains(&format!("hello from rank {r} of 4 on ")), "{out}");
    }
    let o = Command::new(nemesis_run())
        .args(["-n", "3"])
        .arg(example("ring"))
        .arg("200")
        .env("NEMESIS_SHM_DIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("600 hops"),
        "{}",
        text(&o)
    );
    // Six ranks as 2x3 tiles, checked against one process bit for bit.
    let o = Command::new(nemesis_run())
        .args(["-n", "6"])
        .arg(example("halo"))
        .args(["--tile", "12", "--iters", "60", "--check"])
        .env("NEMESIS_SHM_DIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("matches a single-process run"),
        "{}",
        text(&o)
    );
    // Alone, the example runs as a singleton.
    let o = Command::new(example("hello")).output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("hello from rank 0 of 1"),
        "{}",
        text(&o)
    );
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn help_describes_usage_and_environment() {
    let o = Command::new(nemesis_run()).arg("--help").output().unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("-n <N>") && s.contains("NEMESIS_CELLS") && s.contains("--label"),
        "{s}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["-n", "0", "true"][..],
        &["-n", "two", "true"],
        &["-n", "2"],
        &["-n", "2", "--grace", "soon", "true"],
    ] {
        let o = Command::new(nemesis_run()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
    let o = Command::new(nemesis_run())
        .args(["-n", "2", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/program"));
}

#[test]
fn four_ranks_exchange_all_to_all_in_order() {
    let dir = shm_dir("a2a");
    let o = run(4, "all_to_all", &dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .matches("messages in order")
            .count(),
        4,
        "{}",
        text(&o)
    );
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn eight_ranks_pass_ten_thousand_messages_round_a_ring() {
    let dir = shm_dir("ring");
    let o = run(8, "ring", &dir)
        .env("RING_MESSAGES", "10000")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn first_failing_status_is_the_launchers() {
    let dir = shm_dir("status");
    let o = run(3, "init_only", &dir)
        .env("EXIT_RANK_1", "7")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rank 1"),
        "{}",
        text(&o)
    );
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn rank_killed_mid_run_ends_the_job_and_leaves_no_file() {
    let dir = shm_dir("kill");
    let mut c = start(4, "spin", &dir);
    let ready = wait_ready(&mut c, 4);
    // After start-up the segment is already unlinked.
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    let victim = pid_of_rank(&ready, 2);
    // SAFETY: sending SIGKILL to a child of ours that reported its pid.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let o = c.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 2") && err.contains("SIGKILL"), "{err}");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn rank_killed_during_start_up_leaves_no_file() {
    let dir = shm_dir("startkill");
    let mut c = start(3, "slow_start", &dir);
    let ready = wait_ready(&mut c, 3);
    // Rank 0 creates the segment and waits at the barrier for the others.
    let start = Instant::now();
    while leftovers(&dir).is_empty() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!leftovers(&dir).is_empty(), "rank 0 never created the segment");
    // SAFETY: as above.
    unsafe { libc::kill(pid_of_rank(&ready, 2), libc::SIGKILL) };
    let o = c.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn sigterm_to_the_launcher_ends_the_job() {
    let dir = shm_dir("term");
    let mut c = start(2, "spin", &dir);
    wait_ready(&mut c, 2);
    // SAFETY: signalling our own child, the launcher.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let o = c.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("interrupted by SIGTERM"));
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn too_little_shared_memory_is_a_clear_error() {
    // A segment far beyond any /dev/shm: refused up front, naming the variables.
    let dir = shm_dir("nospace");
    let o = run(2, "init_only", &dir)
        .env("NEMESIS_CELLS", "1000000")
        .env("NEMESIS_CELL_SIZE", "16M")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not enough room") && err.contains("short by") && err.contains("NEMESIS_CELLS"),
        "{err}"
    );
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn a_full_tmpfs_is_a_clear_error() {
    let dir = shm_dir("tmpfs");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "none"])
        .arg(&dir)
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipping: cannot mount a small tmpfs here (needs root)");
        return;
    }
    let o = run(2, "init_only", &dir).output().unwrap();
    let listed = leftovers(&dir);
    let _ = Command::new("umount").arg(&dir).status();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not enough room") && err.contains("NEMESIS_SHM_DIR"),
        "{err}"
    );
    assert!(listed.is_empty(), "{listed:?}");
}

#[test]
fn a_rank_that_never_comes_times_out() {
    let dir = shm_dir("timeout");
    let o = run(2, "never_init", &dir)
        .env("NEMESIS_STARTUP_TIMEOUT", "0.5")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("PMI barrier") && err.contains("NEMESIS_STARTUP_TIMEOUT"),
        "{err}"
    );
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn bad_launcher_variables_are_reported() {
    for (var, value, expect) in [
        ("PMI_FD", "abc", "PMI_FD"),
        ("PMI_FD", "987", "not an open file descriptor"),
        ("PMI_PORT", "nowhere.invalid:1", "PMI_PORT"),
    ] {
        let mut c = Command::new(&child_args("init_only")[0]);
        c.args(&child_args("init_only")[1..]);
        let o = c
            .env("NEM_TEST_CHILD", "1")
            .env(var, value)
            .env("PMI_ID", "0")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(expect),
            "{}",
            text(&o)
        );
    }
    let mut c = Command::new(&child_args("init_only")[0]);
    c.args(&child_args("init_only")[1..]);
    let o = c
        .env("NEM_TEST_CHILD", "1")
        .env("NEMESIS_STARTUP_TIMEOUT", "soon")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NEMESIS_STARTUP_TIMEOUT=\"soon\""),
        "{}",
        text(&o)
    );
}

#[test]
fn a_proxy_without_the_job_secret_says_so_and_starts_nothing() {
    let dir = shm_dir("no-secret");
    let mark = dir.join("started");
    for input in [&b""[..], b"not a secret\n", b"abcd\n"] {
        let mut c = Command::new(nemesis_run())
            .args([
                "--proxy-pmi",
                "127.0.0.1:1",
                "--proxy-kvsname",
                "kvs_x",
                "--proxy-size",
                "1",
                "--proxy-first",
                "0",
                "-n",
                "1",
                "--",
                "touch",
            ])
            .arg(&mark)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        c.stdin.take().unwrap().write_all(input).unwrap();
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("secret"),
            "{}",
            text(&o)
        );
        assert!(!mark.exists(), "a rank was started without the secret");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
