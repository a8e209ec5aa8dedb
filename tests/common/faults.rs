//! Faults in the middle of an exchange, as child processes of the multi-process tests
//! run them over every transport.

use nemesis::P2pError;
use std::time::{Duration, Instant};

/// The message's length (`DIES_LEN`, 512 MiB by default) and how long after it starts
/// the process dies (`DIES_AFTER_MS`, 5 ms by default).
fn dies_when() -> (usize, Duration) {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    (
        var("DIES_LEN").map_or(512 << 20, |n: u64| n as usize),
        Duration::from_millis(var("DIES_AFTER_MS").unwrap_or(5)),
    )
}

/// Rank 0 starts a large send and exits part way through it, without a goodbye; rank
/// 1's receive fails with the peer's failure within a bound set by
/// `NEMESIS_FAILURE_TIMEOUT`, whatever strategy (`NEMESIS_LMT`) moves it. The message
/// is `DIES_LEN` bytes (512 MiB by default); the sender dies `DIES_AFTER_MS`
/// milliseconds (5 by default) after starting it.
pub fn dies_mid_transfer() -> Result<(), String> {
    let (len, after) = dies_when();
    // Written before the job starts, on each rank, as the sender's data or the
    // receiver's buffer: filled later, 64 MiB kept the sender from answering its
    // peer's first connection request within a short NEMESIS_NET_TIMEOUT in an
    // emulated VM.
    let mut buf = vec![7u8; len];
    let mut w = nemesis::init().map_err(|e| e.to_string())?;
    let c = w.comm();
    if w.rank() == 0 {
        let data = buf;
        let mut go = [0u8; 1];
        w.recv(&c, 1, 9, &mut go).map_err(|e| e.to_string())?;
        w.scope(|s| {
            let mut r = s.isend(&c, 1, 1, &data).map_err(|e| e.to_string())?;
            let t = Instant::now();
            while t.elapsed() < after {
                if s.test(&mut r).map_err(|e| e.to_string())? {
                    return Err("the whole message moved before the sender could die".to_string());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            std::process::exit(0)
        })?;
        return Ok(());
    }
    // From the sender's death, which comes `after` the wait begins at the earliest.
    let limit = w.config().failure_check * 5 + Duration::from_secs(2) + after;
    w.scope(|s| {
        let r = s.irecv(&c, 0, 1, &mut buf).map_err(|e| e.to_string())?;
        s.world().send(&c, 0, 9, &[1]).map_err(|e| e.to_string())?;
        let t = Instant::now();
        match s.wait(r) {
            Err(P2pError::PeerFailed { rank: 0, reason }) if t.elapsed() < limit => {
                println!(
                    "receive failed: rank 0 failed ({reason}) after {:.2?}",
                    t.elapsed()
                );
                Ok(())
            }
            Err(P2pError::Transfer { rank: 0, source }) if t.elapsed() < limit => {
                println!(
                    "receive failed: the transfer failed ({source}) after {:.2?}",
                    t.elapsed()
                );
                Ok(())
            }
            Err(e) => Err(format!("unexpected error after {:.2?}: {e}", t.elapsed())),
            Ok(st) => Err(format!(
                "a receive of {} bytes completed from a dead sender",
                st.status().len
            )),
        }
    })
}

/// The mirror of [`dies_mid_transfer`]: rank 1 posts a large receive and exits part way
/// through it; rank 0's send fails with the peer's failure within the same bound,
/// whatever strategy moves it, including those in which the sender writes into the
/// receiver's memory (`cma-put`, `cma-split`).
pub fn receiver_dies_mid_transfer() -> Result<(), String> {
    let (len, after) = dies_when();
    // Written before the job starts, as in `dies_mid_transfer`.
    let mut buf = vec![7u8; len];
    let mut w = nemesis::init().map_err(|e| e.to_string())?;
    let c = w.comm();
    if w.rank() == 1 {
        w.scope(|s| {
            let mut r = s.irecv(&c, 0, 1, &mut buf).map_err(|e| e.to_string())?;
            s.world().send(&c, 0, 9, &[1]).map_err(|e| e.to_string())?;
            let t = Instant::now();
            while t.elapsed() < after {
                if s.test(&mut r).map_err(|e| e.to_string())? {
                    return Err("the whole message moved before the receiver could die".to_string());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            std::process::exit(0)
        })?;
        return Ok(());
    }
    let limit = w.config().failure_check * 5 + Duration::from_secs(2) + after;
    let data = buf;
    let mut go = [0u8; 1];
    w.scope(|s| {
        let r = s.isend(&c, 1, 1, &data).map_err(|e| e.to_string())?;
        s.world().recv(&c, 1, 9, &mut go).map_err(|e| e.to_string())?;
        let t = Instant::now();
        match s.wait(r) {
            Err(P2pError::PeerFailed { rank: 1, reason }) if t.elapsed() < limit => {
                println!("send failed: rank 1 failed ({reason}) after {:.2?}", t.elapsed());
                Ok(())
            }
            Err(P2pError::Transfer { rank: 1, source }) if t.elapsed() < limit => {
                println!(
                    "send failed: the transfer failed ({source}) after {:.2?}",
                    t.elapsed()
                );
                Ok(())
            }
            Err(e) => Err(format!("unexpected error after {:.2?}: {e}", t.elapsed())),
            Ok(_) => Err("a send of the whole message completed to a dead receiver".to_string()),
        }
    })
}
