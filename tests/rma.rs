//! One-sided operations between processes started by `nemesis-run`: the checks of
//! `tests/common/rma.rs` over shared memory and over each netmod with shared memory off,
//! a target that dies inside an epoch, and a target served while it computes. Across
//! hosts, see `tests/hosts.rs`.
//!
//! Each child role is an ignored test of this binary (see `tests/common`).

mod common;

use common::*;
use nemesis::rma::{LockKind, RmaError, Window};
use std::time::{Duration, Instant};

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_rma_suite() {
    child_main(common::rma::child);
}

/// Rank 0 locks rank 1, which then dies (`LEAVE=exit`) or leaves (`LEAVE=drop`); rank
/// 0's flush or unlock fails with `PeerFailed` within a bound set by
/// `NEMESIS_FAILURE_TIMEOUT`.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_rma_dead_target() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let comm = w.comm();
        let win = Window::<u64>::allocate(&mut w, &comm, 8).map_err(|e| e.to_string())?;
        if w.rank() == 1 {
            let mut go = [0u8];
            w.recv(&comm, 0, 1, &mut go).map_err(|e| e.to_string())?;
            match std::env::var("LEAVE").as_deref() {
                Ok("exit") => std::process::exit(0),
                _ => {
                    std::mem::forget(win);
                    drop(w);
                    return Ok(());
                }
            }
        }
        let limit = w.config().failure_check * 5 + Duration::from_secs(2);
        let mut ep = win
            .lock(&mut w, 1, LockKind::Exclusive)
            .map_err(|e| e.to_string())?;
        ep.put(&[1], 1, 0).map_err(|e| e.to_string())?;
        ep.world().send(&comm, 1, 1, &[1]).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let err = loop {
            let r = ep.put(&[2], 1, 1).and_then(|_| ep.flush(1));
            if let Err(e) = r {
                break e;
            }
            if t.elapsed() > limit {
                return Err(format!("flush kept succeeding {limit:?} after the target died"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        match err {
            RmaError::PeerFailed { rank: 1, reason } if t.elapsed() < limit => {
                println!("flush: rank 1 failed ({reason}) after {:.2?}", t.elapsed());
            }
            other => {
                return Err(format!(
                    "expected PeerFailed within {limit:?}, got {other} after {:?}",
                    t.elapsed()
                ));
            }
        }
        // Unlocking a dead target ends too, one way or the other, within the bound.
        let t = Instant::now();
        let _ = ep.unlock();
        if t.elapsed() > limit {
            return Err(format!("unlock of a dead target took {:?}", t.elapsed()));
        }
        println!("dead target reported");
        Ok(())
    });
}

/// Rank 1 computes inside `World::compute`, watching its window; rank 0 locks it and
/// puts. With `NEMESIS_RMA_PROGRESS=thread` the put lands during the computation.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_rma_computing_target() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let comm = w.comm();
        let win = Window::<u64>::allocate(&mut w, &comm, 1).map_err(|e| e.to_string())?;
        if w.rank() == 1 {
            let mine = win.local_atomics().expect("allocated");
            let t0 = Instant::now();
            let seen = w.compute(|| {
                while t0.elapsed() < Duration::from_secs(60) {
                    if mine[0].load(std::sync::atomic::Ordering::Acquire) == 42 {
                        return true;
                    }
                    std::hint::spin_loop();
                }
                false
            });
            if !seen {
                return Err("the put did not land while the target computed".into());
            }
            println!("served while computing after {:.2?}", t0.elapsed());
        } else {
            let mut ep = win
                .lock(&mut w, 1, LockKind::Exclusive)
                .map_err(|e| e.to_string())?;
            ep.put(&[42], 1, 0).map_err(|e| e.to_string())?;
            ep.unlock().map_err(|e| e.to_string())?;
        }
        w.barrier(&comm).map_err(|e| e.to_string())?;
        win.free(&mut w).map_err(|e| e.to_string())?;
        println!("computing target done");
        Ok(())
    });
}

#[test]
fn mpich_style_checks_between_processes_on_one_node() {
    let dir = shm_dir("rma-shm");
    let o = run(4, "rma_suite", &dir).output().unwrap();
    assert_ranks_said(&o, "rma suite done", 4, "shm");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("linked_list"), "{}", text(&o));
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

/// The netmods, as `NEMESIS_NETMOD` names them.
const NETMODS: [&str; 2] = ["tcp", "udp"];

fn run_net(n: u32, role: &str, dir: &std::path::Path, netmod: &str) -> std::process::Command {
    let mut c = run(n, role, dir);
    c.env("NEMESIS_NO_SHM", "1").env("NEMESIS_NETMOD", netmod);
    c
}

#[test]
fn mpich_style_checks_over_each_netmod() {
    for netmod in NETMODS {
        let dir = shm_dir(&format!("rma-{netmod}"));
        let o = run_net(3, "rma_suite", &dir, netmod).output().unwrap();
        assert_ranks_said(&o, "rma suite done", 3, netmod);
        assert!(leftovers(&dir).is_empty());
    }
}

#[test]
fn a_target_that_dies_in_an_epoch_fails_flush_within_the_bound() {
    let dir = shm_dir("rma-dead");
    let mut runs: Vec<(&str, std::process::Command)> = Vec::new();
    for leave in ["exit", "drop"] {
        let mut c = run(2, "rma_dead_target", &dir);
        c.env("LEAVE", leave);
        runs.push(("shm", c));
        for netmod in NETMODS {
            let mut c = run_net(2, "rma_dead_target", &dir, netmod);
            c.env("LEAVE", leave).env("NEMESIS_NET_TIMEOUT", "0.5");
            runs.push((netmod, c));
        }
    }
    for (what, mut c) in runs {
        let o = c.env("NEMESIS_FAILURE_TIMEOUT", "0.2").output().unwrap();
        assert!(o.status.success(), "{what}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("dead target reported"), "{what}: {}", text(&o));
    }
}

#[test]
fn a_computing_target_is_served_by_its_helper_thread() {
    let dir = shm_dir("rma-compute");
    for netmod in NETMODS {
        let o = run_net(2, "rma_computing_target", &dir, netmod)
            .env("NEMESIS_RMA_PROGRESS", "thread")
            .output()
            .unwrap();
        assert_ranks_said(&o, "computing target done", 2, netmod);
    }
}
