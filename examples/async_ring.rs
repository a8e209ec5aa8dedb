//! A tokio runtime on each rank: tasks pass tokens round a ring through futures, while
//! another task ticks on a timer, and the world is moved on by a task that sleeps on
//! its wait descriptor through tokio's `AsyncFd`: no progress thread, no spinning.
//!
//! ```text
//! cargo build --release --features async --example async_ring
//! target/release/nemesis-run -n 4 target/release/examples/async_ring [ROUNDS]
//! ```

use nemesis::{OwnedRequest, P2pError, World};
use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

/// Moves the world on whenever its descriptor says there may be work, and sleeps in
/// tokio's reactor otherwise.
async fn drive(world: Rc<RefCell<World>>, fd: AsyncFd<OwnedFd>) -> Result<(), P2pError> {
    loop {
        world.borrow_mut().progress()?;
        if world.borrow_mut().arm()? {
            match fd.readable().await {
                Ok(mut ready) => ready.clear_ready(),
                Err(e) => return Err(P2pError::InvalidArgument(format!("tokio: {e}"))),
            }
        } else {
            // Work that moves without packets, or packets already there: look again
            // once the other tasks have had a turn.
            tokio::task::yield_now().await;
        }
    }
}

async fn ring(world: Rc<RefCell<World>>, rounds: u64) -> Result<(), P2pError> {
    let (me, n, comm) = {
        let w = world.borrow();
        (w.rank(), w.size(), w.comm())
    };
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let start = Instant::now();
    for round in 0..rounds {
        // Both requests are futures; the driver task completes them.
        let incoming: OwnedRequest<Vec<u64>> = world.borrow_mut().irecv(&comm, prev, 0, vec![0u64; 1])?;
        let outgoing = world
            .borrow_mut()
            .isend(&comm, next, 0, vec![round * 1000 + u64::from(me)])?;
        let (_, token) = incoming.await?;
        outgoing.await?;
        if token[0] != round * 1000 + u64::from(prev) {
            return Err(P2pError::InvalidArgument(format!(
                "round {round}: token {}",
                token[0]
            )));
        }
    }
    if me == 0 {
        let t = start.elapsed();
        println!(
            "{rounds} rounds of {n} ranks in {t:.2?}: {:.1} us a round",
            t.as_secs_f64() * 1e6 / rounds as f64
        );
    }
    Ok(())
}

fn main() {
    let arg = std::env::args().nth(1);
    if matches!(arg.as_deref(), Some("-h" | "--help")) {
        println!("usage: async_ring [ROUNDS]   (ROUNDS > 0, default 1000)");
        return;
    }
    let rounds = match arg.map(|a| a.parse::<u64>()) {
        None => 1000,
        Some(Ok(r)) if r > 0 => r,
        Some(_) => {
            eprintln!("usage: async_ring [ROUNDS]   (ROUNDS > 0, default 1000)");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    let r = local.block_on(&rt, async move {
        let world = Rc::new(RefCell::new(nemesis::init()?));
        let tokio_err = |e: std::io::Error| P2pError::InvalidArgument(format!("tokio: {e}"));
        // A descriptor of our own for the same wait set, so its life is tokio's.
        let own = world
            .borrow()
            .wait_fd()
            .ok_or_else(|| P2pError::InvalidArgument("the channel has no wait descriptor".into()))?
            .try_clone_to_owned()
            .map_err(tokio_err)?;
        // SAFETY: the AsyncFd owns `own`, which stays open and the same for its life.
        let fd = unsafe { AsyncFd::register_with_interest(own, tokio::io::Interest::READABLE) }
            .map_err(|e| tokio_err(e.into()))?;
        let driver = tokio::task::spawn_local(drive(world.clone(), fd));
        // Other work of the same runtime goes on meanwhile.
        let ticks = tokio::task::spawn_local(async {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            loop {
                every.tick().await;
            }
        });
        let r = ring(world.clone(), rounds).await;
        // Everyone is done before anyone stops moving the world on.
        let comm = world.borrow().comm();
        let done = world.borrow_mut().isend(&comm, 0, 1, vec![0u8])?;
        let (me, n) = (world.borrow().rank(), world.borrow().size());
        if me == 0 {
            for src in 0..n {
                // The borrow ends before the await: the driver needs the world meanwhile.
                let r = world.borrow_mut().irecv(&comm, src, 1, vec![0u8])?;
                r.await?;
            }
        }
        done.await?;
        ticks.abort();
        driver.abort();
        r
    });
    if let Err(e) = r {
        eprintln!("async_ring: {e}");
        std::process::exit(1);
    }
}
