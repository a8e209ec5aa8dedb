//! `nemesis-bench rma`: one-sided operations, osu-style, beside the two-sided ping-pong
//! and the placement probe of the same pair, interleaved round by round.

use super::{Json, median, pairs, pinning, placement, progress, progress_done, size, tend_others, transport};
use anyhow::{Context, Result};
use clap::Args;
use nemesis::rma::Executor;
use nemesis_tools::measure::{
    self, CRUNCH_PASSES, GET_WINDOW, Layer, OVERLAP_PART, RmaOp, RmaSync, StreamPlan, Summary, Transport,
    crunch,
};

#[derive(Args, Debug, Clone)]
pub(crate) struct RmaArgs {
    /// Operations: put, get, acc (put, get and accumulate of --sizes bytes), fop
    /// (8-byte fetch-and-add), cas (8-byte compare-and-swap), lock (exclusive lock and
    /// unlock), get_bw (windows of 16 gets of --bw-size bytes, beside two-sided
    /// bandwidth), overlap (one get of --bw-size bytes consumed in 64 KiB parts as they
    /// arrive, each crunched meanwhile, against the same get waited for whole first).
    #[arg(long, value_delimiter = ',', value_parser = op, default_value = "put,get,acc,fop,cas,lock,get_bw,overlap")]
    ops: Vec<RmaOp>,
    /// How put, get and acc are completed: flush (each followed by a flush, inside one
    /// lock epoch) and fence (each followed by a fence of both processes).
    #[arg(long, value_delimiter = ',', value_parser = sync, default_value = "flush,fence")]
    sync: Vec<RmaSync>,
    /// Sizes of put, get and acc.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "8")]
    sizes: Vec<usize>,
    /// Bytes of each get of get_bw, and of each message of the two-sided bandwidth
    /// beside it.
    #[arg(long, value_parser = size, default_value = "4M")]
    bw_size: usize,
    /// Timed operations per round (of each test, of the probe and of the ping-pong).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed operations before each.
    #[arg(long, default_value_t = 1_000)]
    warmup: u64,
    /// Rounds; each figure is the median over them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Transports to compare, one pair each, interleaved round by round: shm (members
    /// map each other's memory), tcp, udp (every operation a message, shared memory
    /// off).
    #[arg(long, value_delimiter = ',', value_parser = transport, default_value = "shm")]
    transport: Vec<Transport>,
    /// Who runs the atomics and locks of acc, fop, cas and lock, each timed for every
    /// one named: cpu (the origin's CPU atomics on mapped memory, else the target's
    /// progress core), nic (the card's atomics; needs --transport rc).
    #[arg(long, value_delimiter = ',', value_parser = executor, default_value = "cpu")]
    executor: Vec<Executor>,
}

fn executor(s: &str) -> Result<Executor, String> {
    match s.trim() {
        "cpu" => Ok(Executor::Cpu),
        "nic" => Ok(Executor::Nic),
        _ => Err(format!("{s:?} is not cpu or nic")),
    }
}

fn executor_name(e: Executor) -> &'static str {
    match e {
        Executor::Nic => "nic",
        _ => "cpu",
    }
}

fn op(s: &str) -> Result<RmaOp, String> {
    match s.trim() {
        "overlap" => Ok(RmaOp::GetPipelined),
        "get_pipelined" | "get_serial" => Err(format!("{s:?}: ask for overlap, which times both")),
        t => RmaOp::from_name(t)
            .ok_or_else(|| format!("{s:?} is not one of put, get, acc, fop, cas, lock, get_bw, overlap")),
    }
}

fn sync(s: &str) -> Result<RmaSync, String> {
    match s.trim() {
        "flush" => Ok(RmaSync::Flush),
        "fence" => Ok(RmaSync::Fence),
        _ => Err(format!("{s:?} is not flush or fence")),
    }
}

/// One timed test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Test {
    op: RmaOp,
    sync: RmaSync,
    size: usize,
    executor: Executor,
}

/// Gets of `size` bytes in a round of get_bw: about 256 MiB, at most `iters` windows.
fn bw_windows(size: usize, iters: u64) -> u64 {
    ((256u64 << 20) / (size.max(1) * GET_WINDOW) as u64).clamp(2, iters.max(2))
}

pub(crate) fn rma(a: &RmaArgs, json: bool) -> Result<()> {
    let mut tests = Vec::new();
    for &op in &a.ops {
        // Only updates and locks have an executor to choose.
        let executors: &[Executor] = if matches!(op, RmaOp::Acc | RmaOp::Fop | RmaOp::Cas | RmaOp::Lock) {
            &a.executor
        } else {
            &[Executor::Cpu]
        };
        for &executor in executors {
            let mut push = |op, sync, size| {
                tests.push(Test {
                    op,
                    sync,
                    size,
                    executor,
                })
            };
            match op {
                RmaOp::Put | RmaOp::Get | RmaOp::Acc => {
                    for &sync in &a.sync {
                        for &size in &a.sizes {
                            push(op, sync, size);
                        }
                    }
                }
                RmaOp::Fop | RmaOp::Cas => push(op, RmaSync::Flush, 8),
                RmaOp::Lock => push(op, RmaSync::Flush, 0),
                RmaOp::GetBw => push(op, RmaSync::Flush, a.bw_size),
                RmaOp::GetPipelined | RmaOp::GetSerial => {
                    for op in [RmaOp::GetSerial, RmaOp::GetPipelined] {
                        push(op, RmaSync::Flush, a.bw_size);
                    }
                }
            }
        }
    }
    let mut pairs = pairs(&a.transport, !a.no_pin)?;
    let n = pairs.len();
    // Per pair: probe one way, two-sided 8-byte round trip, each test's p50 or seconds,
    // and two-sided bandwidth seconds, one entry per round.
    let (mut probe, mut rtt) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    let mut timed: Vec<std::collections::BTreeMap<Test, Vec<Summary>>> = vec![Default::default(); n];
    let mut p2p_bw: Vec<Vec<f64>> = vec![Vec::new(); n];
    let with_bw = tests.iter().any(|t| t.op == RmaOp::GetBw);
    let with_overlap = tests.iter().any(|t| t.op == RmaOp::GetPipelined);
    let mut crunch_ns: Vec<Vec<f64>> = vec![Vec::new(); n];
    for r in 0..a.rounds {
        for k in 0..n {
            tend_others(&mut pairs, k)?;
            let pair = &mut pairs[k];
            let clock = pair.clock();
            let t = pair.transport().name();
            progress(&format!("rma {t}: round {}/{}", r + 1, a.rounds));
            let ns = |v: Vec<u64>, half: bool| -> Vec<f64> {
                v.into_iter()
                    .map(|x| clock.ns(x) / if half { 2.0 } else { 1.0 })
                    .collect()
            };
            let mut v = Vec::new();
            pair.probe(a.iters, a.warmup, &mut v)?;
            probe[k].push(Summary::of(&mut ns(v, true)).context("no probe samples")?.p50);
            let mut v = Vec::new();
            pair.ping_pong_through(Layer::P2p, 8, a.iters, a.warmup, &mut v)?;
            rtt[k].push(
                Summary::of(&mut ns(v, false))
                    .context("no ping-pong samples")?
                    .p50,
            );
            for &test in &tests {
                let (iters, warmup) = if test.op == RmaOp::GetBw {
                    let w = bw_windows(test.size, a.iters);
                    (w, (w / 4).max(1))
                } else if matches!(test.op, RmaOp::GetPipelined | RmaOp::GetSerial) {
                    let w = bw_windows(test.size, a.iters) * GET_WINDOW as u64;
                    (w, (w / 4).max(1))
                } else {
                    (a.iters, a.warmup)
                };
                let mut v = Vec::new();
                pair.rma(
                    test.op,
                    test.sync,
                    test.executor,
                    test.size,
                    iters,
                    warmup,
                    &mut v,
                )
                .with_context(|| {
                    format!(
                        "{} {} ({} executor) over {t}",
                        test.op.name(),
                        test.sync.name(),
                        executor_name(test.executor)
                    )
                })?;
                let s = Summary::of(&mut ns(v, false)).context("no samples")?;
                timed[k].entry(test).or_default().push(s);
            }
            if with_overlap {
                crunch_ns[k].push(crunch_time(a.bw_size));
            }
            if with_bw {
                let w = bw_windows(a.bw_size, a.iters);
                let secs =
                    pair.stream_p2p(StreamPlan::new(a.bw_size, GET_WINDOW as u64, w, (w / 4).max(1)))?;
                p2p_bw[k].push((a.bw_size * GET_WINDOW) as f64 * w as f64 / secs / 1e6);
            }
        }
    }
    progress_done();
    let cpu = measure::cpu_model();
    if !json {
        outln!(
            "# nemesis one-sided operations on {cpu}, {}, {} rounds interleaved, medians of per-round p50",
            pinning(&pairs[0]),
            a.rounds
        );
        outln!("# origin rank 0, target rank 1 (waiting in a barrier); ns per operation with its completion");
        outln!(
            "# probe: one cache line written by both in turn, one way; p2p rtt: two-sided 8-byte send+recv round trip"
        );
        outln!(
            "# {:>6} {:>5} {:>8} {:>9} {:>9} {:>9} {:>7} {:>9} {:>7}  placement",
            "op",
            "sync",
            "size",
            "transport",
            "ns",
            "probe ns",
            "/probe",
            "p2p rtt",
            "/rtt"
        );
    }
    for (k, pair) in pairs.iter().enumerate() {
        let transport = pair.transport().name();
        let probe_ns = median(probe[k].clone());
        let rtt_ns = median(rtt[k].clone());
        for (test, sums) in &timed[k] {
            if test.op == RmaOp::GetSerial {
                continue;
            }
            if test.op == RmaOp::GetPipelined {
                let pipe = median(sums.iter().map(|s| s.p50).collect());
                let serial_test = Test {
                    op: RmaOp::GetSerial,
                    ..*test
                };
                let serial = median(timed[k][&serial_test].iter().map(|s| s.p50).collect());
                let compute = median(crunch_ns[k].clone());
                let get = (serial - compute).max(1.0);
                let overlap = (serial - pipe) / get.min(compute);
                if json {
                    Json::new("rma")
                        .s("op", "overlap")
                        .s("transport", transport)
                        .u("size", test.size as u64)
                        .u("part", OVERLAP_PART as u64)
                        .f("serial_ns", serial)
                        .f("pipelined_ns", pipe)
                        .f("compute_ns", compute)
                        .f("get_ns", get)
                        .f("overlap", overlap)
                        .f("probe_ns", probe_ns)
                        .s("placement", placement(probe_ns))
                        .s("cpu", &cpu)
                        .print();
                } else {
                    outln!(
                        "# overlap {} over {transport}: whole then crunched {:.0} us, in {} KiB parts as they arrive {:.0} us; \
                         crunching alone {:.0} us, the get alone {:.0} us: {:.0} % of the shorter hidden",
                        test.size,
                        serial / 1e3,
                        OVERLAP_PART >> 10,
                        pipe / 1e3,
                        compute / 1e3,
                        get / 1e3,
                        100.0 * overlap
                    );
                }
                continue;
            }
            if test.op == RmaOp::GetBw {
                let bytes = (test.size * GET_WINDOW) as f64;
                let mb = median(sums.iter().map(|s| bytes / s.p50 * 1e3).collect());
                let theirs = median(p2p_bw[k].clone());
                if json {
                    Json::new("rma")
                        .s("op", test.op.name())
                        .s("transport", transport)
                        .u("size", test.size as u64)
                        .f("mb_s", mb)
                        .f("p2p_mb_s", theirs)
                        .f("p2p_ratio", mb / theirs)
                        .f("probe_ns", probe_ns)
                        .s("placement", placement(probe_ns))
                        .s("cpu", &cpu)
                        .print();
                } else {
                    outln!(
                        "{:>8} {:>5} {:>8} {:>9} {:>9.0} MB/s beside two-sided {:.0} MB/s: {:.2}  {}",
                        test.op.name(),
                        "-",
                        test.size,
                        transport,
                        mb,
                        theirs,
                        mb / theirs,
                        placement(probe_ns)
                    );
                }
                continue;
            }
            let p50 = median(sums.iter().map(|s| s.p50).collect());
            let tmean = median(sums.iter().map(|s| s.tmean).collect());
            let sync = if matches!(test.op, RmaOp::Fop | RmaOp::Cas | RmaOp::Lock) {
                "-"
            } else {
                test.sync.name()
            };
            let name = match test.executor {
                Executor::Nic => format!("{}@nic", test.op.name()),
                _ => test.op.name().to_string(),
            };
            if json {
                Json::new("rma")
                    .s("op", test.op.name())
                    .s("sync", sync)
                    .s("executor", executor_name(test.executor))
                    .s("transport", transport)
                    .u("size", test.size as u64)
                    .f("p50_ns", p50)
                    .f("tmean_ns", tmean)
                    .f("probe_ns", probe_ns)
                    .f("probe_ratio", p50 / probe_ns)
                    .f("p2p_rtt_ns", rtt_ns)
                    .f("p2p_rtt_ratio", p50 / rtt_ns)
                    .s("placement", placement(probe_ns))
                    .u("rounds", u64::from(a.rounds))
                    .s("cpu", &cpu)
                    .print();
            } else {
                outln!(
                    "{:>8} {:>5} {:>8} {:>9} {:>9.1} {:>9.1} {:>7.2} {:>9.1} {:>7.2}  {}",
                    name,
                    sync,
                    test.size,
                    transport,
                    p50,
                    probe_ns,
                    p50 / probe_ns,
                    rtt_ns,
                    p50 / rtt_ns,
                    placement(probe_ns)
                );
            }
        }
    }
    for p in pairs {
        p.finish()?;
    }
    Ok(())
}

/// Nanoseconds [`crunch`] takes over `bytes` bytes in parts, here, with the data in
/// memory: the computation of the overlap tests alone (median of 5).
fn crunch_time(bytes: usize) -> f64 {
    let data: Vec<u64> = (0..bytes.div_ceil(8) as u64).collect();
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            for p in data.chunks(OVERLAP_PART / 8) {
                crunch(p, CRUNCH_PASSES);
            }
            t.elapsed().as_nanos() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}
