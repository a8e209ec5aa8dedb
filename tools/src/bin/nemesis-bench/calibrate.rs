//! `nemesis-bench calibrate`: every large-message strategy this machine permits, and
//! a stream's medium messages as packets against the rendezvous, measured in turns,
//! with the settings to export.

use super::{Json, SizeList, median, placement, progress, progress_done, size, size_list};
use anyhow::Result;
use clap::Args;
use nemesis_tools::measure::{self, Pair, StreamPlan};

#[derive(Args, Debug, Clone)]
pub(crate) struct CalibrateArgs {
    /// Message sizes (each above the medium limit goes by rendezvous anyway; the
    /// strategies are forced at every size).
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "256K,1M,4M,16M")]
    pub(crate) sizes: Vec<usize>,
    /// Messages per window.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window: u64,
    /// Rounds; the median of each figure is used.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// Medium message sizes streamed both ways, as runs of packets and by rendezvous
    /// (with the order automatic selection has now), for NEMESIS_STREAM_MEDIUM_LIMIT; or
    /// "none".
    #[arg(long, value_parser = size_list, default_value = "32K,48K,64K,128K")]
    pub(crate) stream_sizes: SizeList,
}

/// Measures every permitted strategy and prints the orders automatic selection should
/// try them in: at each size, by the geometric mean over the two receive shapes of each
/// one's bandwidth as a fraction of the best; a new size band starts at each measured
/// size where another strategy comes first.
pub(crate) fn calibrate(a: &CalibrateArgs, json: bool) -> Result<()> {
    use nemesis::lmt::Strategy;
    let mut pair = Pair::start(!a.no_pin)?;
    let cma = nemesis::lmt::cma::probe().is_ok();
    let strategies: Vec<Strategy> = Strategy::ALL
        .into_iter()
        .filter(|&s| !matches!(s, Strategy::Chunks | Strategy::Rdma) && (cma || !s.needs_cma()))
        .chain([Strategy::Chunks])
        .collect();
    let clock = pair.clock();
    let shapes = [false, true];
    // (size, osu, strategy) -> seconds per round
    let mut secs: std::collections::BTreeMap<(usize, bool, usize), Vec<f64>> = Default::default();
    let mut stream_secs = secs.clone();
    let mut probe = Vec::new();
    for r in 0..a.rounds {
        let mut rtt = Vec::new();
        pair.probe(2_000, 200, &mut rtt)?;
        probe.push(median(rtt.iter().map(|&t| clock.ns(t) / 2.0).collect()));
        for &size in &a.sizes {
            let iters = measure::peers::bw_iters(size, a.window);
            for osu in shapes {
                for (i, &s) in strategies.iter().enumerate() {
                    progress(&format!(
                        "calibrate {size} B {}: round {}/{}",
                        s.name(),
                        r + 1,
                        a.rounds
                    ));
                    let t = pair.stream_p2p(StreamPlan {
                        lmt: Some(s),
                        osu,
                        ..StreamPlan::new(size, a.window, iters, (iters / 10).max(1))
                    })?;
                    secs.entry((size, osu, i)).or_default().push(t);
                }
            }
        }
        for &size in &a.stream_sizes.0 {
            let iters = measure::peers::bw_iters(size, a.window);
            for osu in shapes {
                // 0: runs of packets (the limit at its most); 1: the rendezvous.
                for (k, limit) in [usize::MAX, 0].into_iter().enumerate() {
                    progress(&format!(
                        "calibrate {size} B streamed {}: round {}/{}",
                        if k == 0 { "as packets" } else { "by rendezvous" },
                        r + 1,
                        a.rounds
                    ));
                    let t = pair.stream_p2p(StreamPlan {
                        osu,
                        stream_medium_limit: Some(limit),
                        ..StreamPlan::new(size, a.window, iters, (iters / 10).max(1))
                    })?;
                    stream_secs.entry((size, osu, k)).or_default().push(t);
                }
            }
        }
    }
    progress_done();
    pair.finish()?;
    let probe_ns = median(probe);
    let mut score = vec![0.0f64; strategies.len()];
    // Per size: the sum over receive shapes of ln(fraction of the best), per strategy.
    let mut by_size: Vec<(usize, Vec<f64>)> = Vec::new();
    let mut cells = 0;
    if !json {
        outln!(
            "# large-message strategies on {}, MB/s, window {}, {} rounds interleaved, probe {probe_ns:.0} ns ({})",
            measure::cpu_model(),
            a.window,
            a.rounds,
            placement(probe_ns)
        );
        out!("# {:>9} {:>9}", "size", "recv bufs");
        for s in &strategies {
            out!(" {:>9}", s.name());
        }
        outln!("  best");
    }
    for &size in &a.sizes {
        let iters = measure::peers::bw_iters(size, a.window);
        let bytes = (size as u64 * a.window * iters) as f64;
        for osu in shapes {
            let mb: Vec<f64> = (0..strategies.len())
                .map(|i| bytes / median(secs.remove(&(size, osu, i)).unwrap_or_default()) / 1e6)
                .collect();
            let best = mb.iter().copied().fold(0.0, f64::max);
            let at = mb.iter().position(|&m| m == best).unwrap_or(0);
            if by_size.last().is_none_or(|(s, _)| *s != size) {
                by_size.push((size, vec![0.0; strategies.len()]));
            }
            let here = &mut by_size.last_mut().expect("pushed above").1;
            for (i, m) in mb.iter().enumerate() {
                let l = (m / best).max(1e-9).ln();
                score[i] += l;
                here[i] += l;
            }
            cells += 1;
            let bufs = if osu { "one" } else { "distinct" };
            if json {
                for (s, m) in strategies.iter().zip(&mb) {
                    Json::new("calibrate")
                        .u("size", size as u64)
                        .s("recv_buffers", bufs)
                        .s("strategy", s.name())
                        .f("mb_s", *m)
                        .print();
                }
            } else {
                out!("{size:>11} {bufs:>9}");
                for m in &mb {
                    out!(" {m:>9.0}");
                }
                outln!("  {}", strategies[at].name());
            }
        }
    }
    let mut ranked: Vec<(f64, Strategy)> = score
        .iter()
        .map(|&s| (s / cells.max(1) as f64).exp())
        .zip(strategies.iter().copied())
        .collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0));
    // Chunks is always the fallback, never named in the order.
    let order: Vec<&str> = ranked
        .iter()
        .filter(|(_, s)| *s != Strategy::Chunks)
        .map(|(_, s)| s.name())
        .collect();
    // More bands than the variable takes (many sizes): one order for all.
    let bands = lmt_bands(&strategies, by_size).unwrap_or_else(|| order.join(","));
    if json {
        let mut row = Json::new("calibrate").s("recommended", &bands);
        for (g, s) in &ranked {
            row = row.f(&format!("{}_of_best", s.name().replace('-', "_")), *g);
        }
        row.f("probe_ns", probe_ns)
            .s("placement", placement(probe_ns))
            .print();
    } else {
        out!("# each as a fraction of the best (geometric mean):");
        for (g, s) in &ranked {
            out!(" {} {g:.2}", s.name());
        }
        outln!();
        outln!("# one order for every size: {}", order.join(","));
        outln!("NEMESIS_LMT_AUTO={bands}");
    }
    if !a.stream_sizes.0.is_empty() {
        stream_limit(a, stream_secs, json);
    }
    Ok(())
}

/// Reports the streams of medium messages that [`calibrate`] timed (`(size, osu, 0 for
/// packets or 1 for the rendezvous)` to seconds per round) and the
/// `NEMESIS_STREAM_MEDIUM_LIMIT` that follows: the largest size measured below which
/// the rendezvous wins at every larger size, by the geometric mean over the two receive
/// shapes of its bandwidth over the packets'.
fn stream_limit(
    a: &CalibrateArgs,
    mut secs: std::collections::BTreeMap<(usize, bool, usize), Vec<f64>>,
    json: bool,
) {
    let mut sizes = a.stream_sizes.0.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if !json {
        outln!(
            "# medium messages streamed, MB/s, window {}: runs of packets against the rendezvous",
            a.window
        );
        outln!(
            "# {:>9} {:>9} {:>9} {:>10}",
            "size",
            "recv bufs",
            "packets",
            "rendezvous"
        );
    }
    // Per size: the rendezvous's gain over the packets, geometric mean over the shapes.
    let mut gain = Vec::new();
    for &size in &sizes {
        let iters = measure::peers::bw_iters(size, a.window);
        let bytes = (size as u64 * a.window * iters) as f64;
        let mut ln = 0.0;
        for osu in [false, true] {
            let mb = [0, 1].map(|k| bytes / median(secs.remove(&(size, osu, k)).unwrap_or_default()) / 1e6);
            ln += (mb[1] / mb[0]).max(1e-9).ln();
            let bufs = if osu { "one" } else { "distinct" };
            if json {
                Json::new("calibrate_stream")
                    .u("size", size as u64)
                    .s("recv_buffers", bufs)
                    .f("packets_mb_s", mb[0])
                    .f("rendezvous_mb_s", mb[1])
                    .print();
            } else {
                outln!("{size:>11} {bufs:>9} {:>9.0} {:>10.0}", mb[0], mb[1]);
            }
        }
        gain.push((ln / 2.0).exp());
    }
    // The rendezvous from the first size of the winning run that reaches the largest;
    // none: the medium limit holds in a stream too (the variable's largest value).
    let from = gain.iter().rposition(|&g| g <= 1.0).map_or(0, |i| i + 1);
    let limit = match from {
        i if i == sizes.len() => nemesis::p2p::MAX_MEDIUM_LIMIT,
        0 => sizes[0].saturating_sub(1),
        i => sizes[i - 1],
    };
    if json {
        Json::new("calibrate_stream")
            .u("recommended_stream_medium_limit", limit as u64)
            .print();
    } else {
        out!("# the rendezvous over the packets (geometric mean):");
        for (s, g) in sizes.iter().zip(&gain) {
            out!(" {s} {g:.2}");
        }
        outln!();
        outln!(
            "# with NEMESIS_STREAM_TUNE_LIMIT above it (512K by default; 0 where a rendezvous \
             would copy by the kernel), a stream's messages from this limit up to that one go \
             the way that moved more lately: the value sets where that choice begins"
        );
        outln!("NEMESIS_STREAM_MEDIUM_LIMIT={limit}");
    }
}

/// The `NEMESIS_LMT_AUTO` value that follows from per-size scores (`(size, Σ ln
/// fraction of the best per strategy)`, sizes ascending): a band starts at each size
/// whose best named strategy differs from the one before, and each band's order ranks
/// the strategies by their scores over its sizes. Chunks, the fallback, is never named.
fn lmt_bands(strategies: &[nemesis::lmt::Strategy], mut by_size: Vec<(usize, Vec<f64>)>) -> Option<String> {
    use nemesis::lmt::Strategy;
    use nemesis::lmt::{AutoBands, AutoOrder};
    by_size.sort_by_key(|(s, _)| *s);
    let rank = |score: &[f64]| -> Vec<Strategy> {
        let mut r: Vec<(f64, Strategy)> = score
            .iter()
            .copied()
            .zip(strategies.iter().copied())
            .filter(|(_, s)| *s != Strategy::Chunks)
            .collect();
        r.sort_by(|x, y| y.0.total_cmp(&x.0));
        r.into_iter().map(|(_, s)| s).take(5).collect()
    };
    // (first size, summed scores of the band's sizes)
    let mut bands: Vec<(usize, Vec<f64>)> = Vec::new();
    for (size, score) in by_size {
        let first = rank(&score).first().copied();
        match bands.last_mut() {
            Some((_, sum)) if rank(sum).first().copied() == first => {
                for (t, s) in sum.iter_mut().zip(&score) {
                    *t += s;
                }
            }
            _ => bands.push((if bands.is_empty() { 0 } else { size }, score)),
        }
    }
    let orders: Vec<(usize, AutoOrder)> = bands
        .iter()
        .filter_map(|(from, sum)| AutoOrder::new(&rank(sum)).map(|o| (*from, o)))
        .collect();
    AutoBands::new(&orders).map(|b| b.to_string())
}
