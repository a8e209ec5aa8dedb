//! Passes a token round the ranks with two-sided send and receive, and reports the
//! time per hop.
//!
//! ```text
//! target/release/nemesis-run -n 4 target/release/examples/ring [LAPS]
//! ```

use nemesis::P2pError;

fn run(laps: u64) -> Result<(), P2pError> {
    let mut world = nemesis::init()?;
    let comm = world.comm();
    let (me, n) = (world.rank(), world.size());
    if n < 2 {
        println!("a ring of one rank has nothing to pass");
        return Ok(());
    }
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    world.barrier(&comm)?;
    let start = std::time::Instant::now();
    let mut token = [0u8; 8];
    for lap in 0..laps {
        if me == 0 {
            world.send(&comm, next, 0, &lap.to_le_bytes())?;
        }
        let st = world.recv(&comm, prev, 0, &mut token)?;
        // Messages between a pair never overtake each other, so the laps come in order.
        if st.len != 8 || u64::from_le_bytes(token) != lap {
            eprintln!("ring: rank {me} got {token:?} ({} bytes) in lap {lap}", st.len);
            std::process::exit(1);
        }
        if me != 0 {
            world.send(&comm, next, 0, &token)?;
        }
    }
    if me == 0 {
        let hops = laps * u64::from(n);
        let t = start.elapsed();
        println!(
            "{laps} laps of {n} ranks: {hops} hops in {t:.3?}, {:.0} ns per hop",
            t.as_nanos() as f64 / hops as f64
        );
    }
    Ok(())
}

fn main() {
    let arg = std::env::args().nth(1);
    if matches!(arg.as_deref(), Some("-h" | "--help")) {
        println!("usage: ring [LAPS]   (LAPS > 0, default 1000)");
        return;
    }
    let laps = match arg.map(|a| a.parse::<u64>()) {
        None => 1000,
        Some(Ok(l)) if l > 0 => l,
        Some(_) => {
            eprintln!("usage: ring [LAPS]   (LAPS > 0, default 1000)");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(laps) {
        eprintln!("ring: {e}");
        std::process::exit(1);
    }
}
