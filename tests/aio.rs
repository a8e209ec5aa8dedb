//! Async two-sided messaging between real processes (the `async` feature): ranks that
//! exchange messages through futures, then idle without spinning.
#![cfg(feature = "async")]

mod common;

use common::*;
use nemesis::aio::AsyncWorld;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// The smallest executor: runs `f` on this thread, parking it while `f` is pending. The
/// futures need nothing else from an executor.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// CPU time this process has used, every thread together.
fn cpu_time() -> Duration {
    // SAFETY: all zeros is a valid rusage, which getrusage fills in.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_async_then_idle() {
    child_main(|| {
        let e = |e: nemesis::P2pError| e.to_string();
        let w = AsyncWorld::new(nemesis::init().map_err(e)?).map_err(e)?;
        let c = w.comm();
        let (me, n) = (w.rank(), w.size());
        let idle_for = Duration::from_secs(2);
        block_on(async {
            // A ring of futures: many messages in flight at once, every size class.
            for round in 0..200u64 {
                let len = [8usize, 5000, 100_000][round as usize % 3];
                let incoming = w.irecv(&c, (me + n - 1) % n, 1, vec![0u8; len]).map_err(e)?;
                let out = vec![(round % 251) as u8; len];
                let sent = w.send(&c, (me + 1) % n, 1, out).await.map_err(e)?;
                let (st, got) = incoming.await.map_err(e)?;
                if st.len != len || got.iter().any(|&b| b != (round % 251) as u8) || sent.len() != len {
                    return Err(format!("round {round}: wrong message {st:?}"));
                }
            }
            // Idle: wait for a message rank 0 sends only after a while.
            let (t0, cpu0) = (Instant::now(), cpu_time());
            if me == 0 {
                std::thread::sleep(idle_for);
                for r in 1..n {
                    w.send(&c, r, 9, vec![1u8]).await.map_err(e)?;
                }
            } else {
                w.recv(&c, 0, 9, vec![0u8; 1]).await.map_err(e)?;
            }
            let (wall, cpu) = (t0.elapsed(), cpu_time() - cpu0);
            let ratio = cpu.as_secs_f64() / wall.as_secs_f64();
            println!("rank {me}: idle {wall:.2?} used {cpu:.3?} of CPU, ratio {ratio:.4}");
            if ratio > 0.2 {
                return Err(format!("rank {me} spun while idle: {cpu:?} of CPU in {wall:?}"));
            }
            Ok(())
        })?;
        println!("rank {me}: async done");
        Ok(())
    });
}

#[test]
fn async_ranks_exchange_messages_then_sleep_while_idle() {
    for n in [2, 4] {
        let dir = shm_dir(&format!("aio-{n}"));
        let o = run(n, "async_then_idle", &dir).output().unwrap();
        assert_ranks_said(&o, "async done", n as usize, &format!("{n} ranks"));
        assert!(leftovers(&dir).is_empty());
    }
    let dir = shm_dir("aio-net");
    let o = run(2, "async_then_idle", &dir)
        .env("NEMESIS_NO_SHM", "1")
        .output()
        .unwrap();
    assert_ranks_said(&o, "async done", 2, "over tcp");
}

#[test]
fn the_tokio_example_runs_on_shared_memory_and_each_netmod() {
    let ex = example_with("async_ring", &["async"]);
    let dir = shm_dir("aio-tokio");
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("shm", &[]),
        ("tcp", &[("NEMESIS_NO_SHM", "1")]),
        ("udp", &[("NEMESIS_NO_SHM", "1"), ("NEMESIS_NETMOD", "udp")]),
    ];
    for (what, env) in cases {
        let o = std::process::Command::new(nemesis_run())
            .args(["-n", "3", "--timeout", "120"])
            .arg(&ex)
            .arg("200")
            .env("NEMESIS_SHM_DIR", &dir)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert_ranks_said(&o, "200 rounds of 3 ranks", 1, what);
    }
    // Alone, every token goes to itself.
    let o = std::process::Command::new(&ex).arg("20").output().unwrap();
    assert_ranks_said(&o, "20 rounds of 1 ranks", 1, "a singleton");
}

#[test]
fn a_request_whose_world_is_dropped_ends_with_world_gone() {
    let w = AsyncWorld::new(nemesis::init().unwrap()).unwrap();
    let c = w.comm();
    // A singleton: nothing will ever send this.
    let never = w.irecv(&c, 0, 5, vec![0u8; 4]).unwrap();
    let other = w.clone();
    drop(w);
    assert!(!never.is_complete(), "a clone keeps the world");
    let world = other.into_world().expect("the last clone gives the world back");
    drop(world);
    let r = block_on(never);
    assert!(matches!(r, Err(nemesis::P2pError::WorldGone)), "{r:?}");
}
