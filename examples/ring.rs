//! Passes a token round the ranks through the channel and reports the time per hop.
//!
//! ```text
//! target/release/nemesis-run -n 4 target/release/examples/ring [LAPS]
//! ```

use nemesis::{Channel, ChannelError, Header, ShmChannel};
use std::time::{Duration, Instant};

fn run(laps: u64) -> Result<(), ChannelError> {
    let mut ch = ShmChannel::init()?;
    let (me, n) = (ch.rank(), ch.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let token = Header {
        kind: 1,
        ..Header::default()
    };
    let start = Instant::now();
    for lap in 0..laps {
        if me == 0 {
            ch.send_bytes(next, token, &lap.to_le_bytes())?;
        }
        let mut got = None;
        while got.is_none() {
            ch.poll_wait(
                |p| got = Some((p.src, p.payload.to_vec())),
                Some(Duration::from_secs(1)),
            )?;
            if got.is_none() {
                ch.check_peer(prev)?;
            }
        }
        let (src, value) = got.expect("received");
        assert_eq!(
            (src, value.as_slice()),
            (prev, &lap.to_le_bytes()[..]),
            "token out of order"
        );
        if me != 0 {
            ch.send_bytes(next, token, &value)?;
        }
    }
    ch.flush(Duration::from_secs(10))?;
    if me == 0 {
        let hops = laps * n as u64;
        let t = start.elapsed();
        println!(
            "{laps} laps of {n} ranks: {hops} hops in {t:.3?}, {:.0} ns per hop",
            t.as_nanos() as f64 / hops as f64
        );
    }
    Ok(())
}

fn main() {
    let laps = match std::env::args().nth(1).map(|a| a.parse::<u64>()) {
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
