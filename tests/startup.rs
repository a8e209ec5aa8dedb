//! Start-up and shut-down mistakes that must not pass in silence: a second init, a
//! launcher nemesis cannot talk to, misspelt or bad variables, sends still queued when a
//! channel is dropped, and a blocked call that nobody will satisfy.

mod common;

use common::*;
use nemesis::{Channel, Header, NemesisChannel, P2pError};
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Children

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_init_twice() {
    child_main(|| {
        let w = nemesis::init().map_err(|e| e.to_string())?;
        match nemesis::init() {
            Err(e) => println!("while joined: {e}"),
            Ok(_) => return Err("a second init while the first world lives succeeded".into()),
        }
        drop(w);
        match nemesis::init() {
            Err(e) => println!("after leaving: {e}"),
            Ok(_) => return Err("an init after the first world finalized succeeded".into()),
        }
        Ok(())
    });
}

/// Rank 0 queues far more than shared memory holds and drops its channel at once; rank
/// 1 (unless told to leave) counts what arrives.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_flood_and_drop() {
    child_main(|| {
        let mut ch = NemesisChannel::init().map_err(|e| e.to_string())?;
        let leave = std::env::var("RECEIVER_LEAVES").is_ok();
        let h = Header {
            kind: nemesis::ProtocolId::user(0).unwrap().kind(1),
            ..Header::default()
        };
        let payload = vec![7u8; 4000];
        if ch.rank() == 0 {
            // Wait for rank 1's hello, so it is there (or gone) before the flood.
            ch.poll_wait(|_| {}, Some(Duration::from_secs(30)))
                .map_err(|e| e.to_string())?;
            for _ in 0..1000 {
                ch.send_bytes(1, h, &payload).map_err(|e| e.to_string())?;
            }
            println!("rank 0 queued {} of 1000", ch.pending());
            drop(ch);
            println!("rank 0 dropped its channel");
            return Ok(());
        }
        ch.send_bytes(0, h, b"hello").map_err(|e| e.to_string())?;
        ch.flush(Duration::from_secs(30)).map_err(|e| e.to_string())?;
        if leave {
            std::process::exit(0);
        }
        // Late, so rank 0 drops its channel with most of the flood still queued.
        std::thread::sleep(Duration::from_millis(500));
        let mut got = 0;
        let end = Instant::now() + Duration::from_secs(60);
        while got < 1000 && Instant::now() < end {
            got += ch
                .poll_wait(
                    |p| assert_eq!(p.payload.len(), 4000),
                    Some(Duration::from_secs(1)),
                )
                .map_err(|e| e.to_string())?;
        }
        println!("rank 1 got {got} of 1000");
        Ok(())
    });
}

/// Rank 0 blocks in a receive that rank 1 satisfies only after a while.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_late_sender() {
    child_main(|| {
        let e = |e: P2pError| e.to_string();
        let mut w = nemesis::init().map_err(e)?;
        let c = w.comm();
        if w.rank() == 0 {
            let mut b = [0u8; 4];
            w.recv(&c, 1, 3, &mut b).map_err(e)?;
        } else {
            std::thread::sleep(Duration::from_millis(1500));
            w.send(&c, 0, 3, b"late").map_err(e)?;
        }
        println!("rank {} done", w.rank());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------
// Tests

#[test]
fn a_second_init_says_the_process_already_joined_or_left() {
    let dir = shm_dir("init-twice");
    let o = run(2, "init_twice", &dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.matches("while joined: this process has already joined")
            .count(),
        2,
        "{}",
        text(&o)
    );
    assert_eq!(
        out.matches("after leaving: this process has already left")
            .count(),
        2,
        "{}",
        text(&o)
    );
}

#[test]
fn a_launcher_nemesis_cannot_talk_to_is_refused_with_what_to_do() {
    let hello = example("hello");
    let cases: [(&[(&str, &str)], &str); 2] = [
        (&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4")], "srun --mpi=pmi2"),
        (&[("PMIX_RANK", "0"), ("PMIX_NAMESPACE", "job")], "nemesis-run"),
    ];
    for (env, expect) in cases {
        let o = Command::new(&hello).envs(env.iter().copied()).output().unwrap();
        assert!(!o.status.success(), "{env:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(expect),
            "{env:?}: {}",
            text(&o)
        );
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("rank 0 of 1"),
            "{}",
            text(&o)
        );
    }
    // An allocation's shell, where SLURM_NTASKS is set but no task was launched.
    let o = Command::new(&hello).env("SLURM_NTASKS", "4").output().unwrap();
    assert_ranks_said(&o, "hello from rank 0 of 1", 1, "a singleton in an allocation");
}

#[test]
fn a_misspelt_variable_is_named_with_the_one_meant() {
    let o = Command::new(example("hello"))
        .env("NEMESIS_CELL", "4")
        .output()
        .unwrap();
    assert_ranks_said(&o, "hello from rank 0 of 1", 1, "the job still runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("NEMESIS_CELL is not a variable nemesis reads (did you mean NEMESIS_CELLS?)")
            .count(),
        1,
        "{err}"
    );
}

#[test]
fn network_variables_are_checked_on_one_node_as_on_many() {
    let dir = shm_dir("net-vars");
    for (var, value) in [
        ("NEMESIS_NETMOD", "quic"),
        ("NEMESIS_UDP_WINDOW", "1"),
        ("NEMESIS_NET_IFACE", "no-such0"),
    ] {
        let o = Command::new(nemesis_run())
            .args(["-n", "2"])
            .arg(example("hello"))
            .env("NEMESIS_SHM_DIR", &dir)
            .env(var, value)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{var}={value}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(var),
            "{var}: {}",
            text(&o)
        );
        let o = Command::new(example("hello")).env(var, value).output().unwrap();
        assert!(
            !o.status.success(),
            "a singleton with {var}={value}: {}",
            text(&o)
        );
    }
}

#[test]
fn the_read_ahead_variable_is_taken_or_refused_by_name() {
    let dir = shm_dir("read-ahead");
    for value in ["0", "1", "on"] {
        let o = Command::new(nemesis_run())
            .args(["-n", "2"])
            .arg(example("hello"))
            .env("NEMESIS_SHM_DIR", &dir)
            .env("NEMESIS_FBOX_READ_AHEAD", value)
            .output()
            .unwrap();
        assert_ranks_said(&o, "of 2", 2, &format!("NEMESIS_FBOX_READ_AHEAD={value}"));
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("not a variable"),
            "{}",
            text(&o)
        );
    }
    let o = Command::new(nemesis_run())
        .args(["-n", "2"])
        .arg(example("hello"))
        .env("NEMESIS_SHM_DIR", &dir)
        .env("NEMESIS_FBOX_READ_AHEAD", "sometimes")
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("NEMESIS_FBOX_READ_AHEAD")
            && err.contains("sometimes")
            && err.contains("expected 1 or 0"),
        "{}",
        text(&o)
    );
}

#[test]
fn dropping_a_channel_delivers_what_it_queued_or_says_what_it_could_not() {
    let dir = shm_dir("flood");
    for net in [false, true] {
        let mut c = run(2, "flood_and_drop", &dir);
        if net {
            c.env("NEMESIS_NO_SHM", "1");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("rank 1 got 1000 of 1000"), "net {net}: {}", text(&o));
        if !net {
            assert!(
                !out.contains("rank 0 queued 0 of"),
                "nothing was left queued: {}",
                text(&o)
            );
        }
    }
    // Nobody to deliver to: the drop gives up after its bound and says so.
    let t = Instant::now();
    let o = run(2, "flood_and_drop", &dir)
        .env("RECEIVER_LEAVES", "1")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("rank 0 dropped its channel"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("undelivered"),
        "{}",
        text(&o)
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "the drop's flush is bounded"
    );
}

#[test]
fn a_long_blocked_call_says_once_what_it_waits_for() {
    let dir = shm_dir("wait-warn");
    let o = run(2, "late_sender", &dir)
        .env("NEMESIS_WAIT_WARN", "0.4")
        .output()
        .unwrap();
    assert_ranks_said(&o, "done", 2, "the late message comes");
    let err = String::from_utf8_lossy(&o.stderr);
    let warning = "rank 0 has waited";
    assert_eq!(err.matches(warning).count(), 1, "{err}");
    assert!(
        err.contains("recv from rank 1 with tag 3 on communicator 0"),
        "{err}"
    );
    // Off by default.
    let o = run(2, "late_sender", &dir).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("has waited"),
        "{}",
        text(&o)
    );
}
