//! Timing barrier, a small allreduce and a one-sided fence among the processes of a
//! node, through the node's shared blocks and through messages, round by round in the
//! same processes.

use super::{MeasureError, ROLE_VAR, Result, end_job, start_job};
use nemesis::Channel;
use nemesis::channel::NemesisChannel;
use nemesis::p2p::{Config, Op, World};
use nemesis::rma::{Assert, RmaError, Window};
use std::time::Instant;

fn rma(e: RmaError) -> MeasureError {
    MeasureError::Other(e.to_string())
}

const COLL_VAR: &str = "NEMESIS_MEASURE_COLL";

/// The collectives timed, in the order of [`CollRound::ns`]. A fence is of a window
/// allocated in shared memory with nothing to complete: what it costs beyond the
/// barrier it ends with.
pub const COLL_ROWS: [(&str, &str); 6] = [
    ("barrier", "node"),
    ("barrier", "messages"),
    ("allreduce", "node"),
    ("allreduce", "messages"),
    ("fence", "node"),
    ("fence", "messages"),
];

/// One round: nanoseconds per call of each of [`COLL_ROWS`], as rank 0 saw them.
#[derive(Debug, Clone, Copy)]
pub struct CollRound {
    /// Per row of [`COLL_ROWS`].
    pub ns: [f64; 6],
}

/// Times `iters` barriers and `iters` 8-byte allreduces (one `f64` summed) among
/// `procs` processes, `rounds` times, through the node blocks and through messages.
pub fn collectives(procs: u32, iters: u64, rounds: u32) -> Result<Vec<CollRound>> {
    if procs < 2 {
        return Err(MeasureError::Other(
            "collectives need at least 2 processes".into(),
        ));
    }
    let env = vec![
        (ROLE_VAR.into(), "coll".into()),
        (COLL_VAR.into(), format!("{iters},{rounds}").into()),
    ];
    let (job, mut ch) = start_job(procs, env)?;
    // A partner that dies makes the collectives fail with `PeerFailed`.
    let rows = run(&mut ch, iters, rounds)?;
    end_job(job, std::time::Duration::from_secs(60))?;
    Ok(rows)
}

/// The part of a rank started by [`collectives`].
pub(super) fn coll_rank() -> Result<()> {
    let v = std::env::var(COLL_VAR).map_err(|_| MeasureError::Other(format!("{COLL_VAR} is not set")))?;
    let parsed = v
        .split_once(',')
        .and_then(|(i, r)| Some((i.parse().ok()?, r.parse().ok()?)));
    let (iters, rounds) = parsed.ok_or_else(|| MeasureError::Other(format!("{COLL_VAR}={v:?}")))?;
    let mut ch = NemesisChannel::init()?;
    run(&mut ch, iters, rounds)?;
    Ok(())
}

fn run(ch: &mut NemesisChannel, iters: u64, rounds: u32) -> Result<Vec<CollRound>> {
    let base = Config::from_env(ch.max_payload())?;
    let warmup = (iters / 10).max(10);
    let mut out = Vec::new();
    for _ in 0..rounds {
        let mut ns = [0.0; 6];
        for (i, node) in [true, false].into_iter().enumerate() {
            let mut w = World::with_config(
                &mut *ch,
                Config {
                    node_collectives: node,
                    ..base
                },
            )?;
            let c = w.comm();
            for _ in 0..warmup {
                w.barrier(&c)?;
            }
            let t = Instant::now();
            for _ in 0..iters {
                w.barrier(&c)?;
            }
            ns[i] = t.elapsed().as_nanos() as f64 / iters as f64;
            let mut x = [1.0f64];
            for _ in 0..warmup {
                w.allreduce(&c, &mut x, Op::Sum)?;
            }
            w.barrier(&c)?;
            let t = Instant::now();
            for _ in 0..iters {
                x[0] = 1.0;
                w.allreduce(&c, &mut x, Op::Sum)?;
            }
            ns[2 + i] = t.elapsed().as_nanos() as f64 / iters as f64;
            if x[0] != f64::from(w.size()) {
                return Err(MeasureError::Protocol(format!(
                    "allreduce gave {}, not {}",
                    x[0],
                    w.size()
                )));
            }
            let win = Window::<u64>::allocate(&mut w, &c, 1).map_err(rma)?;
            let mut ep = win.fence(&mut w, Assert::NONE).map_err(rma)?;
            for _ in 0..warmup {
                ep = ep.fence(Assert::NONE).map_err(rma)?;
            }
            let t = Instant::now();
            for _ in 0..iters {
                ep = ep.fence(Assert::NONE).map_err(rma)?;
            }
            ns[4 + i] = t.elapsed().as_nanos() as f64 / iters as f64;
            ep.end(Assert::NONE).map_err(rma)?;
            win.free(&mut w).map_err(rma)?;
            // Everyone finishes with this world before anyone makes the next.
            w.barrier(&c)?;
        }
        out.push(CollRound { ns });
    }
    Ok(out)
}
