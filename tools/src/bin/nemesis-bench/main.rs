//! `nemesis-bench`: osu-style measurements of the nemesis channel.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use nemesis::Channel as _;
use nemesis::shm::{Geometry, Segment};
use nemesis_tools::measure::{self, Layer, Pair, StreamPlan, Summary, Transport};
use std::fmt::Write as _;
use std::io::IsTerminal;

mod rma;

const AFTER_HELP: &str = "\
Every measurement starts its own partner process from this executable; no set-up is
needed. The two processes are pinned to two CPUs when there are two. Beside each
latency the same pair measures a cache-line ping-pong (the probe) on a line of the same
segment, interleaved round by round, and reports the ratio: on machines whose cores
move about (near/far placement) the ratio is the comparable figure.

With no subcommand it prints the latency and bandwidth tables. --json prints one JSON
object per line instead of tables.

Sizes accept K, M and G suffixes (binary). Messages larger than one packet (see
NEMESIS_CELL_SIZE) are sent as several packets.";

/// Measure nemesis: latency, bandwidth, message rate, oversubscription and memory.
#[derive(Parser, Debug)]
#[command(name = "nemesis-bench", version, after_help = AFTER_HELP)]
struct Cli {
    /// Print one JSON object per line instead of tables.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// One-way latency by ping-pong, next to the cache-line probe.
    Latency(LatencyArgs),
    /// Streaming bandwidth (osu_bw: windows of messages, each window acknowledged),
    /// through two-sided messaging and its large-message strategies, next to memcpy.
    Bw(BwArgs),
    /// Message rate: windows of small non-blocking sends, as bw streams them, counted in
    /// messages; two-sided by default, next to the channel's own rate.
    Msgrate(RateArgs),
    /// A token passed round a ring of processes, which may outnumber the CPUs.
    Ring(RingArgs),
    /// Barrier, 8-byte allreduce and one-sided fence among processes, through the
    /// node's shared blocks and through messages, interleaved round by round.
    Coll(CollArgs),
    /// Size of the shared segment for a number of processes, with the current settings,
    /// and the udp layer's heap per peer, measured in the simulator.
    Memory(MemoryArgs),
    /// Time per request of finishing many outstanding receives with test_some over a
    /// request set, and with a scoped waitall (two threads of this process).
    Requests(RequestsArgs),
    /// Measures every large-message strategy this machine permits, both receive shapes,
    /// interleaved round by round, and prints the NEMESIS_LMT_AUTO value to set: the
    /// strategies best first, by size band where the leader changes with the size. Then
    /// medium messages streamed as runs of packets against the rendezvous, and the
    /// NEMESIS_STREAM_MEDIUM_LIMIT value to set (up to which a stream's messages go as
    /// packets; above it, up to NEMESIS_STREAM_TUNE_LIMIT, the sender chooses by time).
    Calibrate(CalibrateArgs),
    /// Two-sided nemesis beside MPI peers, interleaved round by round: latency, osu_bw
    /// bandwidth (one receive buffer) and message rate, with nemesis/peer ratios.
    /// scripts/peers.sh builds the peers and calls this.
    Peers(PeersArgs),
    /// One-sided operations (osu_put/get/acc/fop/cas_latency, lock and unlock, get
    /// bandwidth) with flush or fence, beside the two-sided ping-pong and the probe of
    /// the same pair, interleaved round by round.
    Rma(rma::RmaArgs),
}

#[derive(Args, Debug, Clone)]
struct CalibrateArgs {
    /// Message sizes (each above the medium limit goes by rendezvous anyway; the
    /// strategies are forced at every size).
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "256K,1M,4M,16M")]
    sizes: Vec<usize>,
    /// Messages per window.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Rounds; the median of each figure is used.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Medium message sizes streamed both ways, as runs of packets and by rendezvous
    /// (with the order automatic selection has now), for NEMESIS_STREAM_MEDIUM_LIMIT; or
    /// "none".
    #[arg(long, value_parser = size_list, default_value = "32K,48K,64K,128K")]
    stream_sizes: SizeList,
}

/// Measures every permitted strategy and prints the orders automatic selection should
/// try them in: at each size, by the geometric mean over the two receive shapes of each
/// one's bandwidth as a fraction of the best; a new size band starts at each measured
/// size where another strategy comes first.
fn calibrate(a: &CalibrateArgs, json: bool) -> Result<()> {
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
        println!(
            "# large-message strategies on {}, MB/s, window {}, {} rounds interleaved, probe {probe_ns:.0} ns ({})",
            measure::cpu_model(),
            a.window,
            a.rounds,
            placement(probe_ns)
        );
        print!("# {:>9} {:>9}", "size", "recv bufs");
        for s in &strategies {
            print!(" {:>9}", s.name());
        }
        println!("  best");
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
                print!("{size:>11} {bufs:>9}");
                for m in &mb {
                    print!(" {m:>9.0}");
                }
                println!("  {}", strategies[at].name());
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
        print!("# each as a fraction of the best (geometric mean):");
        for (g, s) in &ranked {
            print!(" {} {g:.2}", s.name());
        }
        println!();
        println!("# one order for every size: {}", order.join(","));
        println!("NEMESIS_LMT_AUTO={bands}");
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
        println!(
            "# medium messages streamed, MB/s, window {}: runs of packets against the rendezvous",
            a.window
        );
        println!(
            "# {:>9} {:>9} {:>9} {:>10}",
            "size", "recv bufs", "packets", "rendezvous"
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
                println!("{size:>11} {bufs:>9} {:>9.0} {:>10.0}", mb[0], mb[1]);
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
        print!("# the rendezvous over the packets (geometric mean):");
        for (s, g) in sizes.iter().zip(&gain) {
            print!(" {s} {g:.2}");
        }
        println!();
        println!(
            "# with NEMESIS_STREAM_TUNE_LIMIT above it (512K by default; 0 where a rendezvous \
             would copy by the kernel), a stream's messages from this limit up to that one go \
             the way that moved more lately: the value sets where that choice begins"
        );
        println!("NEMESIS_STREAM_MEDIUM_LIMIT={limit}");
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

#[derive(Args, Debug, Clone)]
struct PeersArgs {
    /// A peer: NAME=COMMAND, where COMMAND starts two ranks of scripts/peers/osu_peer.c
    /// built with that MPI (for example "mpich=mpiexec.mpich -n 2 -bind-to core
    /// ./osu_peer"). The mode and its arguments are appended. Give it once per peer.
    #[arg(long = "peer", value_parser = peer_arg, required = true)]
    peers: Vec<measure::peers::Peer>,
    /// Latency sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "8,64,1K,4K,16K,64K")]
    lat_sizes: SizeList,
    /// Bandwidth sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "4K,64K,1M,4M,16M")]
    bw_sizes: SizeList,
    /// Message rate sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "8,64")]
    rate_sizes: SizeList,
    /// Most round trips per latency size and round, for nemesis and the peers alike;
    /// fewer for large messages, so that a round moves about 1 GiB each way (at least 10).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..))]
    lat_iters: u64,
    /// Messages per window of the streaming tests.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Timed windows of the message rate per round.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(10..))]
    rate_iters: u64,
    /// Rounds; the median of each figure is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin nemesis's two processes to CPUs (the peers' commands pin their own).
    #[arg(long)]
    no_pin: bool,
    /// What carries nemesis's messages: shm, or tcp or udp on loopback with shared
    /// memory turned off (give the peers their own network transport to compare).
    #[arg(long, value_parser = transport, default_value = "shm")]
    transport: Transport,
    /// The collectives of a peer given by --peer: NAME=COMMAND, where COMMAND starts
    /// `{procs}` ranks of osu_peer (unbound: they outnumber the CPUs), for example
    /// "openmpi=mpiexec.openmpi --oversubscribe --bind-to none -n {procs} ./osu_peer".
    #[arg(long = "peer-coll", value_parser = peer_arg)]
    peer_coll: Vec<measure::peers::Peer>,
    /// Process counts of the barrier and allreduce (through messages), or "none".
    #[arg(long, value_parser = size_list, default_value = "4,8")]
    coll_procs: SizeList,
    /// Calls per collective, process count and round.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(10..))]
    coll_iters: u64,
    /// How many more times to take a figure whose CPUs moved while it was taken
    /// (nemesis's), or that was not taken at the placement nemesis's was (a peer's), so
    /// that more rounds give a near or far ratio. 0 takes each once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..10))]
    retries: u32,
}

fn peer_arg(s: &str) -> Result<measure::peers::Peer, String> {
    match s.split_once('=') {
        Some((name, command)) if !name.trim().is_empty() && !command.trim().is_empty() => {
            if name.trim() == measure::peers::NEMESIS {
                return Err(format!("a peer cannot be called {}", measure::peers::NEMESIS));
            }
            Ok(measure::peers::Peer {
                name: name.trim().to_string(),
                command: command.trim().to_string(),
                coll: None,
            })
        }
        _ => Err(format!("expected NAME=COMMAND, got {s:?}")),
    }
}

fn peers(a: &PeersArgs, json: bool) -> Result<()> {
    use measure::peers::{self as p, Test};
    let mut names: Vec<&str> = Vec::new();
    for peer in &a.peers {
        if names.contains(&peer.name.as_str()) {
            anyhow::bail!("--peer {} given twice", peer.name);
        }
        names.push(&peer.name);
    }
    let mut peers = a.peers.clone();
    for c in &a.peer_coll {
        let Some(peer) = peers.iter_mut().find(|p| p.name == c.name) else {
            anyhow::bail!("--peer-coll {}: no --peer of that name", c.name);
        };
        if !c.command.contains("{procs}") {
            anyhow::bail!(
                "--peer-coll {}: the command has no {{procs}} for the process count",
                c.name
            );
        }
        peer.coll = Some(c.command.clone());
    }
    let coll_procs = if peers.iter().any(|p| p.coll.is_some()) {
        a.coll_procs.0.clone()
    } else {
        Vec::new()
    };
    if coll_procs.iter().any(|&n| n < 2) {
        anyhow::bail!("--coll-procs: collectives need at least 2 processes");
    }
    let plan = p::Plan {
        sizes: vec![
            (Test::Latency, a.lat_sizes.0.clone()),
            (Test::Bandwidth, a.bw_sizes.0.clone()),
            (Test::Rate, a.rate_sizes.0.clone()),
            (Test::Barrier, coll_procs.clone()),
            (Test::Allreduce, coll_procs),
        ],
        lat_iters: a.lat_iters,
        window: a.window,
        rate_iters: a.rate_iters,
        coll_iters: a.coll_iters,
        retries: a.retries,
        cpus: measure::allowed_cpus(),
    };
    let mut pair = Pair::start_over(!a.no_pin, a.transport)?;
    let mut rounds = Vec::new();
    let mut probe = Vec::new();
    for r in 0..a.rounds {
        progress(&format!("peers: round {}/{}", r + 1, a.rounds));
        rounds.push(p::round(&mut pair, &peers, &plan, &mut probe)?);
    }
    progress_done();
    let pinned = pinning(&pair);
    pair.finish()?;
    let med = p::medians(&rounds);
    let probe_ns = median(probe.clone());
    let near = probe.iter().filter(|&&x| placement(x) == "near").count();
    let cpu = measure::cpu_model();
    if !json {
        println!(
            "# two-sided nemesis over {} beside MPI peers on {cpu}, {pinned}, {} rounds interleaved",
            a.transport.name(),
            a.rounds
        );
        println!(
            "# placement probe {probe_ns:.0} ns one way (median; {near} of {} rounds near)",
            probe.len()
        );
        println!(
            "# latency: p50 one way, lower is better; bw (osu_bw, one receive buffer) and msgrate: higher is better"
        );
        println!(
            "# barrier, allreduce (8 B): ns per call through messages, size = processes on these cpus, lower is better;"
        );
        println!("#   node: nemesis's through the node's shared blocks instead, for reference");
        println!("# ratio: nemesis / peer, of the medians over all rounds;");
        println!("#   near, far: the median of nemesis / peer over the rounds in which both figures were");
        println!("#   taken at that placement (probed before and after each), and in how many (\"0.85 3\")");
        print!("# {:>7} {:>9} {:>7} {:>12}", "test", "size", "unit", "nemesis");
        for n in &names {
            print!(" {:>12} {:>7} {:>9} {:>9}", n, "ratio", "near", "far");
        }
        println!();
    }
    for (test, sizes) in &plan.sizes {
        for &size in sizes {
            let ours = med[&(*test, size, p::NEMESIS.to_string())];
            let node = med.get(&(*test, size, p::NEMESIS_NODE.to_string()));
            if json {
                for n in &names {
                    let Some(&theirs) = med.get(&(*test, size, n.to_string())) else {
                        continue;
                    };
                    let row = Json::new("peers")
                        .s("test", test.name())
                        .s("transport", a.transport.name())
                        .u("size", size as u64)
                        .s("unit", test.unit())
                        .f("nemesis", ours)
                        .s("peer", n)
                        .f("peer_value", theirs)
                        .f("ratio", ours / theirs);
                    let row = [p::Placement::Near, p::Placement::Far]
                        .into_iter()
                        .fold(row, |row, at| {
                            match p::matched_ratio(&rounds, *test, size, n, at) {
                                Some((r, k)) => row
                                    .f(&format!("{}_ratio", at.name()), r)
                                    .u(&format!("{}_rounds", at.name()), k as u64),
                                None => row.u(&format!("{}_rounds", at.name()), 0),
                            }
                        });
                    let row = row
                        .f("probe_ns", probe_ns)
                        .s("placement", placement(probe_ns))
                        .u("rounds", a.rounds as u64)
                        .s("cpu", &cpu);
                    let row = match node {
                        Some(&v) => row.f("nemesis_node_ns", v),
                        None => row,
                    };
                    row.print();
                }
            } else {
                print!("{:>9} {:>9} {:>7} {:>12.1}", test.name(), size, test.unit(), ours);
                for n in &names {
                    match med.get(&(*test, size, n.to_string())) {
                        Some(&theirs) => {
                            print!(" {theirs:>12.1} {:>7.2}", ours / theirs);
                            for at in [p::Placement::Near, p::Placement::Far] {
                                match p::matched_ratio(&rounds, *test, size, n, at) {
                                    Some((r, k)) => print!(" {:>9}", format!("{r:.2} {k}")),
                                    None => print!(" {:>9}", "-"),
                                }
                            }
                        }
                        None => print!(" {:>12} {:>7} {:>9} {:>9}", "-", "-", "-", "-"),
                    }
                }
                if let Some(v) = node {
                    print!("  node {v:.1}");
                }
                println!();
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
struct RequestsArgs {
    /// Receives outstanding at once.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "1K,10K,100K")]
    counts: Vec<usize>,
    /// Rounds per count; the best is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

#[derive(Args, Debug, Clone)]
struct LatencyArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64,256,1K,4K")]
    sizes: Vec<usize>,
    /// Most timed round trips per round, for each of the channel and the probe; fewer
    /// for large messages, so that a round moves about 1 GiB each way, but at least 10
    /// (osu_latency, too, takes fewer of its large sizes).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Most untimed round trips before each round, and no more than the timed ones.
    #[arg(long, default_value_t = 1_000)]
    warmup: u64,
    /// Rounds, alternating probe and channel.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// What to measure: the channel, or two-sided send and recv on top of it.
    #[arg(long, value_enum, default_value = "channel")]
    layer: LayerArg,
    /// Transports to compare, one pair of processes each, interleaved round by round:
    /// shm, tcp, udp, ud, rc (the network ones with shared memory turned off; tcp and
    /// udp on loopback; ud and rc on the verbs device, in a build with the `verbs`
    /// feature).
    #[arg(long, value_delimiter = ',', value_parser = transport, default_value = "shm")]
    transport: Vec<Transport>,
    /// With --layer p2p: receive buffers this many bytes past a page boundary (0 to
    /// 4095) on both sides, sends from one (each side echoes from its receive buffer),
    /// as a large buffer from malloc starts 16 bytes in. Named "recv_skew" in the JSON.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    recv_skew: u16,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LayerArg {
    Channel,
    P2p,
}

impl LayerArg {
    fn layer(self) -> Layer {
        match self {
            Self::Channel => Layer::Channel,
            Self::P2p => Layer::P2p,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::P2p => "p2p",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct StreamArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "64,1K,4K,16K,64K")]
    sizes: Vec<usize>,
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Timed windows per round.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed windows before each round.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Args, Debug, Clone)]
struct BwArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size,
          default_value = "1K,4K,16K,64K,256K,1M,4M,16M,64M")]
    sizes: Vec<usize>,
    /// Large-message strategies to compare, interleaved round by round: auto, chunks,
    /// cma, cma-put, cma-split, ring, vmsplice (within the node), rdma (between nodes, where the
    /// netmod has RDMA), as NEMESIS_LMT. Ignored with --layer channel.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    lmt: Vec<String>,
    /// Messages per window.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Most timed windows per round; fewer for large messages, so that a round moves
    /// about 256 MiB, but never fewer than one window (one window of 64 messages of
    /// 16 MiB is 1 GiB).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Most untimed windows before each round.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// What to measure: two-sided messaging (with its large-message transfer), or raw
    /// packets through the channel (messages above one packet go as several).
    #[arg(long, value_enum, default_value = "p2p")]
    layer: LayerArg,
    /// Transports to compare, one pair of processes each, interleaved round by round:
    /// shm, tcp, udp, ud, rc (the network ones with shared memory turned off; tcp and
    /// udp on loopback; ud and rc on the verbs device, in a build with the `verbs`
    /// feature).
    #[arg(long, value_delimiter = ',', value_parser = transport, default_value = "shm")]
    transport: Vec<Transport>,
    /// One receive buffer, as osu_bw's receiver has, instead of one per message of the
    /// window: the window's receives are all posted into it (`Scope::irecv_raw`). Named
    /// "recv_buffers" in the JSON.
    #[arg(long)]
    osu: bool,
    /// What the messages are sent from and received into, compared round by round:
    /// heap (ordinary memory, registered for RDMA per message) or pinned
    /// (nemesis::Pinned buffers, whose registrations are kept). Named "buffers" in the
    /// JSON.
    #[arg(long, value_delimiter = ',', value_parser = buf_kind, default_value = "heap")]
    buffers: Vec<measure::BufKind>,
    /// Receive buffers this many bytes past a page boundary (0 to 4095; heap buffers
    /// only), where the send buffer starts on one, as osu_bw's both do. A large buffer
    /// from malloc starts 16 bytes in: copies whose destination is a few bytes ahead of
    /// the source within a page can be many times slower on some CPUs (CMA's on AMD Zen
    /// 3). Named "recv_skew" in the JSON.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    recv_skew: u16,
}

fn buf_kind(s: &str) -> Result<measure::BufKind, String> {
    match s.trim() {
        "heap" => Ok(measure::BufKind::Heap),
        "pinned" => Ok(measure::BufKind::Pinned),
        other => Err(format!("{other:?}: expected heap or pinned")),
    }
}

/// Bytes a bandwidth round aims to move.
const BW_ROUND_BYTES: u64 = 256 << 20;

/// Adds the sends of one run to those of the runs before, every count.
fn add_counts(to: &mut nemesis::SendCounts, c: nemesis::SendCounts) {
    let nemesis::SendCounts {
        paired,
        paired_short,
        paired_long,
        medium_packets,
        rendezvous,
        stream_rendezvous,
        stream_packets,
    } = c;
    to.paired += paired;
    to.paired_short += paired_short;
    to.paired_long += paired_long;
    to.medium_packets += medium_packets;
    to.rendezvous += rendezvous;
    to.stream_rendezvous += stream_rendezvous;
    to.stream_packets += stream_packets;
}

/// What a stream of `size`-byte messages went by, from its sender's counts (`sent`):
/// `eager`, `medium` (runs of packets or the pair buffer), the rendezvous `strategy`,
/// or `medium+` the strategy where it took both (a stream's way chosen by time, or
/// packets while the cells had room). A strategy forced (not `auto`) is named.
fn used_by(
    size: usize,
    eager: usize,
    medium: usize,
    auto: bool,
    sent: nemesis::SendCounts,
    strategy: &str,
) -> String {
    let packets = sent.medium_packets + sent.paired;
    match (packets, sent.rendezvous) {
        _ if size <= eager => "eager".into(),
        _ if !auto => strategy.into(),
        (0, 0) if size <= medium => "medium".into(),
        (0, 0) => strategy.into(),
        (_, 0) => "medium".into(),
        (0, _) => strategy.into(),
        _ => format!("medium+{strategy}"),
    }
}

/// Single-thread memcpy bandwidth for `size`-byte copies between two buffers that are
/// reused, as the benchmark's own buffers are: MB/s (10^6 bytes a second).
fn memcpy_mb_s(size: usize) -> f64 {
    let mut src = measure::PageAligned::new(size.max(1));
    src.fill(0x5a);
    let mut dst = measure::PageAligned::new(size.max(1));
    dst.copy_from_slice(&src);
    let reps = (BW_ROUND_BYTES / size.max(1) as u64).clamp(4, 1 << 20);
    let t = std::time::Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&*src));
        std::hint::black_box(&mut *dst);
    }
    (reps * size as u64) as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn strategy_arg(name: &str) -> Result<Option<nemesis::lmt::Strategy>> {
    match name.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        n => nemesis::lmt::Strategy::ALL
            .into_iter()
            .find(|s| s.name() == n)
            .map(Some)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--lmt {n}: expected auto, chunks, cma, cma-put, cma-split, ring, vmsplice or rdma"
                )
            }),
    }
}

fn bandwidth_p2p(pairs: &mut [Pair], a: &BwArgs, json: bool) -> Result<()> {
    let lmts = a
        .lmt
        .iter()
        .map(|n| strategy_arg(n))
        .collect::<Result<Vec<_>>>()?;
    // Each pair's eager and medium limits: a larger eager limit through a netmod, which
    // carries larger packets, and medium messages within the node only.
    let limits: Vec<(usize, usize)> = pairs
        .iter_mut()
        .map(|p| {
            let ch = p.channel();
            let cfg = nemesis::p2p::Config::from_env(ch.max_payload())?;
            Ok(match p.transport() {
                Transport::Shm => (cfg.eager_limit, cfg.medium_limit),
                _ => (cfg.net_eager_limit.min(p.channel().max_payload_to(1)), 0),
            })
        })
        .collect::<Result<_>>()?;
    for p in pairs.iter_mut() {
        p.set_recv_skew(usize::from(a.recv_skew))?;
    }
    let net = pairs.iter().any(|p| p.transport() != Transport::Shm);
    if !json {
        println!(
            "# nemesis two-sided bandwidth in MB/s (10^6 bytes/s), window of {} non-blocking sends, {}",
            a.window,
            pinning(&pairs[0])
        );
        if a.osu {
            println!("# receiver: one buffer, the window's receives all posted into it (osu_bw's shape)");
        } else {
            println!("# receiver: the window pre-posted into distinct buffers (--osu: one buffer)");
        }
        if a.recv_skew != 0 {
            let slow = if nemesis::lmt::cma::skew_slows_kernel_copies() {
                "slow"
            } else {
                "not slow"
            };
            println!(
                "# receive buffers {} bytes past a page boundary, send buffers on one; this CPU's kernel copies are {slow} so",
                a.recv_skew
            );
        }
        println!(
            "# used: what the sender's messages went by: eager, medium (runs of packets or the pair buffer), the rendezvous strategy, or medium+ it for some of each"
        );
        println!("# memcpy: one thread copying the same size between two reused buffers, same run");
        println!("# probe: the cache-line ping-pong of the same pair (near: the CPUs share a cache)");
        if net {
            println!(
                "# tcp: the same windows over a plain blocking TCP socket on loopback, same pair; /tcp = MB/s / tcp"
            );
            println!(
                "# the network transports move large messages in chunks, or by RDMA read where the netmod has it (rc, ud); of --lmt they take auto, chunks and rdma"
            );
        }
        print!(
            "# {:>7} {:>9} {:>9} {:>16} {:>7} {:>10} {:>12} {:>6} {:>9}",
            "size", "transport", "lmt", "used", "buffers", "MB/s", "memcpy MB/s", "ratio", "probe ns"
        );
        if net {
            print!(" {:>10} {:>6}", "tcp MB/s", "/tcp");
        }
        println!("  placement");
    }
    // Per pair: the strategies it compares (between nodes: chunks, or RDMA read), each
    // with every kind of buffer.
    let plans: Vec<Vec<(Option<nemesis::lmt::Strategy>, measure::BufKind)>> = pairs
        .iter_mut()
        .map(|p| {
            let lmts: Vec<Option<nemesis::lmt::Strategy>> = if p.transport() == Transport::Shm {
                lmts.clone()
            } else {
                use nemesis::lmt::Strategy::{Chunks, Rdma};
                let rdma = p.channel().rdma().is_some();
                lmts.iter()
                    .copied()
                    .filter(|s| matches!(s, None | Some(Chunks)) || (rdma && *s == Some(Rdma)))
                    .collect()
            };
            lmts.iter()
                .flat_map(|&l| a.buffers.iter().map(move |&b| (l, b)))
                .collect()
        })
        .collect();
    for &size in &a.sizes {
        let iters = (BW_ROUND_BYTES / (size.max(1) as u64 * a.window)).clamp(1, a.iters);
        let warmup = a.warmup.min(iters);
        let mut secs: Vec<Vec<Vec<f64>>> = plans.iter().map(|l| vec![Vec::new(); l.len()]).collect();
        let mut sent: Vec<Vec<nemesis::SendCounts>> =
            plans.iter().map(|l| vec![Default::default(); l.len()]).collect();
        let mut tcp_secs = vec![Vec::new(); pairs.len()];
        let mut probe = vec![Vec::new(); pairs.len()];
        let mut copy = Vec::new();
        for r in 0..a.rounds {
            for k in 0..pairs.len() {
                tend_others(pairs, k)?;
                let pair = &mut pairs[k];
                let t = pair.transport().name();
                pair.probe(2_000, 200, &mut probe[k])?;
                for (i, &(lmt, bufs)) in plans[k].iter().enumerate() {
                    let name = lmt.map_or("auto", |s| s.name());
                    progress(&format!(
                        "bw {size} B {t} {name} {}: round {}/{}",
                        bufs.name(),
                        r + 1,
                        a.rounds
                    ));
                    pair.set_buffers(bufs);
                    secs[k][i].push(pair.stream_p2p(StreamPlan {
                        lmt,
                        osu: a.osu,
                        ..StreamPlan::new(size, a.window, iters, warmup)
                    })?);
                    add_counts(&mut sent[k][i], pair.last_send_counts());
                }
                pair.set_buffers(measure::BufKind::Heap);
                if pair.transport() != Transport::Shm {
                    progress(&format!("bw {size} B plain tcp: round {}/{}", r + 1, a.rounds));
                    tcp_secs[k].push(pair.tcp_stream(size, a.window, iters, warmup)?);
                }
            }
            copy.push(memcpy_mb_s(size));
        }
        progress_done();
        let memcpy = median(copy);
        let bytes = (size as u64 * a.window * iters) as f64;
        for (k, pair) in pairs.iter_mut().enumerate() {
            let clock = pair.clock();
            let probe_ns = median(probe[k].iter().map(|&t| clock.ns(t) / 2.0).collect());
            let tcp =
                (!tcp_secs[k].is_empty()).then(|| bytes / median(std::mem::take(&mut tcp_secs[k])) / 1e6);
            let transport = pair.transport().name();
            for (i, &(lmt, bufs)) in plans[k].iter().enumerate() {
                let mb = bytes / median(std::mem::take(&mut secs[k][i])) / 1e6;
                let name = lmt.map_or("auto", |s| s.name());
                let (eager, medium) = limits[k];
                // Buffers whose offsets slow the kernel's copies take the ring, or chunks
                // while the ring is busy (`LocalLmt::kernel_skew_slow`).
                let skewed = pair.transport() == Transport::Shm
                    && nemesis::shm::copy::meets_slow_case(
                        std::ptr::null(),
                        std::ptr::null::<u8>().wrapping_add(usize::from(a.recv_skew)),
                        size,
                    )
                    && pair.kernel_skew_slow();
                let strategy = if lmt.is_none() && skewed {
                    "ring+chunks"
                } else {
                    lmt.unwrap_or_else(|| pair.auto_lmt(size)).name()
                };
                let used = used_by(size, eager, medium, lmt.is_none(), sent[k][i], strategy);
                if json {
                    let mut row = Json::row("bw", "p2p", transport, size)
                        .s("lmt", name)
                        .s("used", &used)
                        .s("recv_buffers", if a.osu { "one" } else { "distinct" })
                        .s("buffers", bufs.name())
                        .u("recv_skew", u64::from(a.recv_skew))
                        .f("mb_s", mb)
                        .f("memcpy_mb_s", memcpy)
                        .f("ratio", mb / memcpy)
                        .f("probe_ns", probe_ns)
                        .s("placement", placement(probe_ns))
                        .u("window", a.window)
                        .u("sent_paired", sent[k][i].paired)
                        .u("sent_packets", sent[k][i].medium_packets)
                        .u("sent_stream_packets", sent[k][i].stream_packets)
                        .u("sent_rendezvous", sent[k][i].rendezvous);
                    if let Some(tcp) = tcp {
                        row = row.f("tcp_mb_s", tcp).f("tcp_ratio", mb / tcp);
                    }
                    row.print();
                } else {
                    print!(
                        "{size:>9} {transport:>9} {name:>9} {used:>16} {:>7} {mb:>10.0} {memcpy:>12.0} {:>6.2} {probe_ns:>9.0}",
                        bufs.name(),
                        Ratio(mb / memcpy)
                    );
                    match tcp {
                        Some(tcp) => print!(" {tcp:>10.0} {:>6.2}", mb / tcp),
                        None if net => print!(" {:>10} {:>6}", "-", "-"),
                        None => {}
                    }
                    println!("  {}", placement(probe_ns));
                }
            }
        }
    }
    Ok(())
}

/// Lets every pair but `k` make progress, so that the idle ones stay healthy while `k`
/// is measured.
fn tend_others(pairs: &mut [Pair], k: usize) -> Result<()> {
    for (i, p) in pairs.iter_mut().enumerate() {
        if i != k {
            p.tend()?;
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
struct RateArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64")]
    sizes: Vec<usize>,
    /// What to measure: two-sided isend/irecv/waitall (with the channel's own rate beside
    /// it, interleaved round by round), or raw packets through the channel.
    #[arg(long, value_enum, default_value = "p2p")]
    layer: LayerArg,
    #[command(flatten)]
    rest: RateRest,
}

#[derive(Args, Debug, Clone)]
struct RateRest {
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Most timed windows per round; fewer above 2 KiB, so that a round moves about
    /// 256 MiB, as in bw (a message rate is for small messages).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Most untimed windows before each round, and no more than the timed ones.
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Args, Debug, Clone)]
struct RingArgs {
    /// Ring sizes to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "2,8",
          value_parser = clap::value_parser!(u32).range(2..=nemesis::shm::config::MAX_LOCAL_PROCS as i64))]
    procs: Vec<u32>,
    /// Hops the token makes in each round.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Rounds per ring, each after a placement probe; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Do not pin the ring's processes to CPUs.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Args, Debug, Clone)]
struct CollArgs {
    /// Process counts to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "2,4",
          value_parser = clap::value_parser!(u32).range(2..=nemesis::shm::config::MAX_LOCAL_PROCS as i64))]
    procs: Vec<u32>,
    /// Calls of each collective per round.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

#[derive(Args, Debug, Clone)]
struct MemoryArgs {
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32,64,128",
          value_parser = clap::value_parser!(u32).range(1..=nemesis::shm::config::MAX_LOCAL_PROCS as i64))]
    procs: Vec<u32>,
    /// Peer counts for the udp layer's heap per peer, measured in the simulator; "none"
    /// (or empty) to skip it.
    #[arg(long, default_value = "2,64", value_parser = udp_peer_list)]
    udp_peers: CountList,
    /// Rounds of messages the measured udp endpoint exchanges with each peer.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    udp_rounds: u32,
    /// Peer counts for the ud netmod's memory per peer, measured on the verbs device
    /// (every netmod in this process; needs the `verbs` feature and a device); empty to
    /// skip it.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    ud_peers: Vec<u32>,
    /// The same for the rc netmod.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    rc_peers: Vec<u32>,
}

fn transport(s: &str) -> Result<Transport, String> {
    Transport::from_name(s.trim())
        .ok_or_else(|| format!("{s:?} is not a transport (shm, tcp, udp, ud or rc)"))
}

/// One pair per transport, pinned alike.
fn pairs(transports: &[Transport], pin: bool) -> Result<Vec<Pair>> {
    let mut seen = Vec::new();
    for &t in transports {
        if seen.contains(&t) {
            anyhow::bail!("--transport {} is given twice", t.name());
        }
        seen.push(t);
    }
    let cpus = if pin { measure::pair_cpus() } else { None };
    transports
        .iter()
        .map(|&t| Pair::start_on(cpus, t).with_context(|| format!("starting the {} pair", t.name())))
        .collect()
}

fn finish(pairs: Vec<Pair>) -> Result<()> {
    for p in pairs {
        p.finish()?;
    }
    Ok(())
}

/// A comma-separated list of sizes that may be empty ("none" or "").
#[derive(Debug, Clone)]
struct SizeList(Vec<usize>);

fn size_list(s: &str) -> Result<SizeList, String> {
    match s.trim() {
        "" | "none" => Ok(SizeList(Vec::new())),
        list => list.split(',').map(size).collect::<Result<_, _>>().map(SizeList),
    }
}

/// A comma-separated list of counts that may be empty ("none" or "").
#[derive(Debug, Clone)]
struct CountList(Vec<u32>);

fn udp_peer_list(s: &str) -> Result<CountList, String> {
    match s.trim() {
        "" | "none" => Ok(CountList(Vec::new())),
        list => list
            .split(',')
            .map(|c| match c.trim().parse::<u32>() {
                Ok(n) if (1..=4096).contains(&n) => Ok(n),
                _ => Err(format!("{c:?} is not a peer count between 1 and 4096")),
            })
            .collect::<Result<_, _>>()
            .map(CountList),
    }
}

/// The largest message size the benchmarks take: each side holds at least one buffer
/// this long, and a larger one is more likely a slip than a measurement.
const MAX_SIZE: u64 = 1 << 30;

fn size(s: &str) -> Result<usize, String> {
    let n = nemesis::shm::config::parse_size(s)
        .ok_or_else(|| format!("{s:?} is not a size (examples: 0, 64, 4K, 1M)"))?;
    if n > MAX_SIZE {
        return Err(format!(
            "{s:?} is larger than 1G, the largest message size nemesis-bench measures"
        ));
    }
    usize::try_from(n).map_err(|_| format!("{s:?} does not fit this machine's address space"))
}

/// A ratio for a table: "-" where it has no value (a bandwidth of 0-byte messages).
struct Ratio(f64);

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            std::fmt::Display::fmt(&self.0, f)
        } else {
            f.pad("-")
        }
    }
}

/// A flat JSON object, built in order.
struct Json(String);

impl Json {
    fn new(bench: &str) -> Self {
        Self(format!("{{\"bench\":\"{bench}\""))
    }
    /// A row about messages of `size` bytes between the pair, through `layer` and
    /// `transport`.
    fn row(bench: &str, layer: &str, transport: &str, size: usize) -> Self {
        Self::new(bench)
            .s("layer", layer)
            .s("transport", transport)
            .u("size", size as u64)
    }
    fn s(mut self, k: &str, v: &str) -> Self {
        let _ = write!(
            self.0,
            ",\"{k}\":\"{}\"",
            v.replace('\\', "\\\\").replace('"', "\\\"")
        );
        self
    }
    fn u(mut self, k: &str, v: u64) -> Self {
        let _ = write!(self.0, ",\"{k}\":{v}");
        self
    }
    fn f(mut self, k: &str, v: f64) -> Self {
        let _ = if v.is_finite() {
            write!(self.0, ",\"{k}\":{v:.3}")
        } else {
            write!(self.0, ",\"{k}\":null")
        };
        self
    }
    fn print(self) {
        println!("{}}}", self.0);
    }
}

fn progress(msg: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K{msg}");
    }
}

fn progress_done() {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
}

fn placement(probe_ns: f64) -> &'static str {
    measure::peers::Placement::of_probe(probe_ns).name()
}

fn pinning(pair: &Pair) -> String {
    match pair.pinned() {
        Some((a, b)) => format!("pinned to cpus {a} and {b}"),
        None => "not pinned".into(),
    }
}

fn latency(pairs: &mut [Pair], a: &LatencyArgs, json: bool) -> Result<()> {
    let p2p = a.layer == LayerArg::P2p;
    if a.recv_skew != 0 && !p2p {
        anyhow::bail!("--recv-skew: the channel's ping-pong has no receive buffer to place; use --layer p2p");
    }
    for p in pairs.iter_mut() {
        p.set_recv_skew(usize::from(a.recv_skew))?;
    }
    let net = pairs.iter().any(|p| p.transport() != Transport::Shm);
    if !json {
        println!(
            "# nemesis {} latency, one way (half the round trip), {}",
            a.layer.name(),
            pinning(&pairs[0])
        );
        println!("# probe: one cache line written by both processes in turn (the placement probe)");
        println!("# floor: one line per direction, each written by one side (what a fastbox costs at best)");
        if p2p {
            println!(
                "# channel: the same ping-pong through the channel underneath, a message above its \
                 largest packet as packets of that size; /chan = p2p / channel"
            );
        }
        if net {
            println!(
                "# tcp: a plain TCP ping-pong on loopback between the same two processes (at least \
                 1 byte), blocking in read; /tcp = p50 / tcp"
            );
            println!("# spin: the same with both sides polling a non-blocking socket, as the netmods do");
        }
        if a.recv_skew != 0 {
            println!(
                "# receive buffers {} bytes past a page boundary, each side echoing from its own",
                a.recv_skew
            );
        }
        println!("# all measured by the same two processes, interleaved round by round");
        print!(
            "# {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "size", "transport", "p50 ns", "p99 ns", "mean ns", "probe ns", "floor ns", "ratio", "/floor"
        );
        if p2p {
            print!(" {:>9} {:>6}", "chan ns", "/chan");
        }
        if net {
            print!(" {:>9} {:>6} {:>9} {:>6}", "tcp ns", "/tcp", "spin ns", "/spin");
        }
        println!("  placement");
    }
    for &size in &a.sizes {
        let n = pairs.len();
        let (mut lat, mut probe, mut floor, mut chan, mut tcp, mut spin) = (
            vec![Vec::new(); n],
            vec![Vec::new(); n],
            vec![Vec::new(); n],
            vec![Vec::new(); n],
            vec![Vec::new(); n],
            vec![Vec::new(); n],
        );
        for r in 0..a.rounds {
            for k in 0..n {
                tend_others(pairs, k)?;
                let pair = &mut pairs[k];
                let t = pair.transport().name();
                progress(&format!("latency {size} B {t}: round {}/{}", r + 1, a.rounds));
                let iters = measure::peers::lat_iters(size, a.iters);
                let warmup = a.warmup.min(iters);
                pair.probe(a.iters, a.warmup, &mut probe[k])?;
                pair.ping_pong_through(a.layer.layer(), size, iters, warmup, &mut lat[k])?;
                if p2p {
                    pair.ping_pong(size, iters, warmup, &mut chan[k])?;
                }
                pair.floor(a.iters, a.warmup, &mut floor[k])?;
                if pair.transport() != Transport::Shm {
                    pair.tcp_ping_pong(size, iters, warmup, false, &mut tcp[k])?;
                    pair.tcp_ping_pong(size, iters, warmup, true, &mut spin[k])?;
                }
            }
        }
        progress_done();
        for (k, pair) in pairs.iter().enumerate() {
            let clock = pair.clock();
            let half = |v: &mut Vec<u64>| {
                std::mem::take(v)
                    .into_iter()
                    .map(|t| clock.ns(t) / 2.0)
                    .collect::<Vec<_>>()
            };
            let c = Summary::of(&mut half(&mut lat[k])).context("no samples")?;
            let p = Summary::of(&mut half(&mut probe[k])).context("no samples")?;
            let f = Summary::of(&mut half(&mut floor[k])).context("no samples")?;
            let ch = if p2p {
                Summary::of(&mut half(&mut chan[k]))
            } else {
                None
            };
            let tc = Summary::of(&mut half(&mut tcp[k]));
            let sp = Summary::of(&mut half(&mut spin[k]));
            let ratio = c.p50 / p.p50;
            let transport = pair.transport().name();
            if json {
                let mut row = Json::row("latency", a.layer.name(), transport, size)
                    .f("p50_ns", c.p50)
                    .f("p99_ns", c.p99)
                    .f("mean_ns", c.mean)
                    .f("tmean_ns", c.tmean)
                    .f("min_ns", c.min)
                    .f("probe_ns", p.p50)
                    .f("ratio", ratio)
                    .f("floor_ns", f.p50)
                    .f("floor_ratio", c.p50 / f.p50)
                    .u("recv_skew", u64::from(a.recv_skew));
                if let Some(ch) = ch {
                    row = row
                        .f("channel_ns", ch.p50)
                        .f("channel_ratio", c.p50 / ch.p50)
                        .f("channel_tmean_ns", ch.tmean)
                        .f("channel_tmean_ratio", c.tmean / ch.tmean);
                }
                if let (Some(tc), Some(sp)) = (tc, sp) {
                    row = row
                        .f("tcp_ns", tc.p50)
                        .f("tcp_ratio", c.p50 / tc.p50)
                        .f("tcp_spin_ns", sp.p50)
                        .f("tcp_spin_ratio", c.p50 / sp.p50);
                }
                row.s("placement", placement(p.p50))
                    .u("samples", c.count as u64)
                    .print();
            } else {
                print!(
                    "{:>9} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2}",
                    size,
                    transport,
                    c.p50,
                    c.p99,
                    c.mean,
                    p.p50,
                    f.p50,
                    ratio,
                    c.p50 / f.p50
                );
                // A missing channel figure (no samples) says so in its columns, so that
                // the rest stay under their headings.
                match ch {
                    Some(ch) => print!(" {:>9.1} {:>6.2}", ch.p50, c.p50 / ch.p50),
                    None if p2p => print!(" {:>9} {:>6}", "-", "-"),
                    None => {}
                }
                match (tc, sp) {
                    (Some(tc), Some(sp)) => print!(
                        " {:>9.1} {:>6.2} {:>9.1} {:>6.2}",
                        tc.p50,
                        c.p50 / tc.p50,
                        sp.p50,
                        c.p50 / sp.p50
                    ),
                    _ if net => print!(" {:>9} {:>6} {:>9} {:>6}", "-", "-", "-", "-"),
                    _ => {}
                }
                println!("  {}", placement(p.p50));
            }
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Streams `rounds` times and returns the median seconds of the timed windows.
#[allow(clippy::too_many_arguments)]
fn stream_median(
    pair: &mut Pair,
    what: &str,
    size: usize,
    window: u64,
    iters: u64,
    warmup: u64,
    rounds: u32,
) -> Result<f64> {
    let mut secs = Vec::new();
    for r in 0..rounds {
        progress(&format!("{what} {size} B: round {}/{rounds}", r + 1));
        secs.push(pair.stream(size, window, iters, warmup)?);
    }
    progress_done();
    Ok(median(secs))
}

fn bandwidth(pair: &mut Pair, a: &StreamArgs, json: bool) -> Result<()> {
    if !json {
        println!(
            "# nemesis channel bandwidth (window of {} messages), {}",
            a.window,
            pinning(pair)
        );
        println!("# {:>7} {:>10}", "size", "MB/s");
    }
    for &size in &a.sizes {
        // Large sizes get fewer windows, so a round moves about BW_ROUND_BYTES.
        let iters = (BW_ROUND_BYTES / (size.max(1) as u64 * a.window)).clamp(1, a.iters);
        let s = stream_median(pair, "bw", size, a.window, iters, a.warmup.min(iters), a.rounds)?;
        let bytes = (size as u64 * a.window * iters) as f64;
        let mb = bytes / s / 1e6;
        if json {
            Json::row("bw", "channel", pair.transport().name(), size)
                .f("mb_s", mb)
                .u("window", a.window)
                .print();
        } else {
            println!("{size:>9} {mb:>10.0}");
        }
    }
    Ok(())
}

fn msgrate(pair: &mut Pair, a: &RateArgs, json: bool) -> Result<()> {
    let r = &a.rest;
    let p2p = a.layer == LayerArg::P2p;
    if !json {
        println!(
            "# nemesis {} message rate in messages/s, window of {} messages, {}",
            a.layer.name(),
            r.window,
            pinning(pair)
        );
        if p2p {
            println!("# two-sided: isend x window, the receiver's irecvs pre-posted, waitall on both sides");
            println!("# channel: raw packets of the same size through the channel underneath, interleaved");
            println!(
                "# {:>7} {:>14} {:>14} {:>7} {:>9}  placement",
                "size", "p2p msgs/s", "channel msgs/s", "/chan", "probe ns"
            );
        } else {
            println!("# {:>7} {:>14} {:>9}  placement", "size", "msgs/s", "probe ns");
        }
    }
    let clock = pair.clock();
    for &size in &a.sizes {
        let (mut p2p_secs, mut chan_secs, mut probe) = (Vec::new(), Vec::new(), Vec::new());
        let iters = (BW_ROUND_BYTES / (size.max(1) as u64 * r.window)).clamp(1, r.iters);
        let warmup = r.warmup.min(iters);
        for round in 0..r.rounds {
            progress(&format!("msgrate {size} B: round {}/{}", round + 1, r.rounds));
            let mut rtt = Vec::new();
            pair.probe(2_000, 200, &mut rtt)?;
            probe.push(median(rtt.iter().map(|&t| clock.ns(t) / 2.0).collect()));
            if p2p {
                p2p_secs.push(pair.stream_p2p(StreamPlan::new(size, r.window, iters, warmup))?);
            }
            chan_secs.push(pair.stream(size, r.window, iters, warmup)?);
        }
        progress_done();
        let msgs = (r.window * iters) as f64;
        let chan = msgs / median(chan_secs);
        let probe_ns = median(probe);
        if p2p {
            let rate = msgs / median(p2p_secs);
            if json {
                Json::row("msgrate", "p2p", pair.transport().name(), size)
                    .f("msgs_per_s", rate)
                    .f("channel_msgs_per_s", chan)
                    .f("channel_ratio", rate / chan)
                    .f("probe_ns", probe_ns)
                    .s("placement", placement(probe_ns))
                    .u("window", r.window)
                    .print();
            } else {
                println!(
                    "{size:>9} {rate:>14.0} {chan:>14.0} {:>7.2} {probe_ns:>9.0}  {}",
                    rate / chan,
                    placement(probe_ns)
                );
            }
        } else if json {
            Json::row("msgrate", "channel", pair.transport().name(), size)
                .f("msgs_per_s", chan)
                .f("probe_ns", probe_ns)
                .s("placement", placement(probe_ns))
                .u("window", r.window)
                .print();
        } else {
            println!("{size:>9} {chan:>14.0} {probe_ns:>9.0}  {}", placement(probe_ns));
        }
    }
    Ok(())
}

fn ring(a: &RingArgs, json: bool) -> Result<()> {
    let machine = measure::allowed_cpus();
    let cpus = machine.len();
    let pin = !a.no_pin;
    // The probe's pair runs between the ring's rounds, while the ring's processes sleep.
    let mut probe_pair = Pair::start(pin)?;
    let clock = probe_pair.clock();
    if !json {
        println!(
            "# token round a ring of processes, {} hops a round, {} rounds, {cpus} usable cpus, {}",
            a.messages,
            a.rounds,
            if pin {
                "rank r pinned to the (r mod cpus)-th cpu"
            } else {
                "not pinned"
            }
        );
        println!("# probe: the cache-line ping-pong of a pair on the first two cpus, before each round");
        println!(
            "# {:>5} {:>12} {:>12} {:>12} {:>9} {:>7}  placement",
            "procs", "ns/hop p50", "ns/hop min", "ns/hop max", "probe ns", "ratio"
        );
    }
    for &n in &a.procs {
        let mut ring = measure::Ring::start(n, a.messages, a.rounds, &machine, pin)?;
        let (mut hops, mut probes) = (Vec::new(), Vec::new());
        for r in 0..a.rounds {
            progress(&format!("ring of {n}: round {}/{}", r + 1, a.rounds));
            let mut rtt = Vec::new();
            probe_pair.probe(2_000, 200, &mut rtt)?;
            probes.push(median(rtt.iter().map(|&t| clock.ns(t) / 2.0).collect()));
            let t = ring.round()?;
            hops.push(t.as_secs_f64() * 1e9 / a.messages as f64);
        }
        ring.finish()?;
        progress_done();
        let probe_ns = median(probes);
        let (min, max) = (
            hops.iter().copied().fold(f64::INFINITY, f64::min),
            hops.iter().copied().fold(0.0, f64::max),
        );
        let p50 = median(hops);
        if json {
            Json::new("ring")
                .u("procs", n as u64)
                .u("messages", a.messages)
                .u("rounds", a.rounds as u64)
                .u("cpus", cpus as u64)
                .s("pinned", if pin { "yes" } else { "no" })
                .f("per_hop_ns", p50)
                .f("per_hop_min_ns", min)
                .f("per_hop_max_ns", max)
                .f("probe_ns", probe_ns)
                .f("ratio", p50 / probe_ns)
                .s("placement", placement(probe_ns))
                .print();
        } else {
            println!(
                "{n:>7} {p50:>12.0} {min:>12.0} {max:>12.0} {probe_ns:>9.0} {:>7.2}  {}",
                p50 / probe_ns,
                placement(probe_ns)
            );
        }
    }
    probe_pair.finish()?;
    Ok(())
}

fn coll(a: &CollArgs, json: bool) -> Result<()> {
    let cpus = measure::allowed_cpus().len();
    if !json {
        println!(
            "# {} calls per round, median of {} rounds, {cpus} usable cpus",
            a.iters, a.rounds
        );
        println!(
            "# node: through the node's shared blocks; messages: dissemination / recursive doubling, or flat where the processes outnumber the CPUs (NEMESIS_FLAT_COLLECTIVES: one exchange among 3 or 4, gathered at rank 0 among 5 to 8); fence: of a window in shared memory"
        );
        println!(
            "# {:>5} {:>10} {:>9} {:>10} {:>10} {:>10}",
            "procs", "collective", "path", "median ns", "min ns", "max ns"
        );
    }
    for &n in &a.procs {
        progress(&format!("collectives among {n}"));
        let rounds = measure::collectives(n, a.iters, a.rounds)?;
        progress_done();
        for (i, (name, path)) in measure::COLL_ROWS.iter().enumerate() {
            let mut v: Vec<f64> = rounds.iter().map(|r| r.ns[i]).collect();
            v.sort_by(f64::total_cmp);
            let (med, min, max) = (v[v.len() / 2], v[0], v[v.len() - 1]);
            if json {
                Json::new("coll")
                    .s("collective", name)
                    .s("path", path)
                    .s("transport", "shm")
                    .u("procs", n as u64)
                    .u("size", if *name == "allreduce" { 8 } else { 0 })
                    .u("iters", a.iters)
                    .u("cpus", cpus as u64)
                    .f("median_ns", med)
                    .f("min_ns", min)
                    .f("max_ns", max)
                    .print();
            } else {
                println!("{n:>7} {name:>10} {path:>9} {med:>10.0} {min:>10.0} {max:>10.0}");
            }
        }
    }
    Ok(())
}

fn memory(a: &MemoryArgs, json: bool) -> Result<()> {
    let geo = Geometry::from_env()?;
    if !json {
        println!(
            "# shared segment size: {} cells of {} B per process, fastboxes of {} B in a ring per ordered pair, \
             a buffer per unordered pair for medium messages",
            geo.cells_per_proc, geo.cell_size, geo.fbox_size
        );
        println!(
            "# {:>5} {:>14} {:>11} {:>16} {:>12} {:>12}",
            "procs", "segment", "MiB", "per process", "fbox slots", "pair buffer"
        );
    }
    for &n in &a.procs {
        let bytes = Segment::bytes_for(n, geo)? as u64;
        let resolved = geo.resolve(n);
        let pair_bytes = 2 * resolved.fbox_ring_bytes() as u64;
        if json {
            Json::new("memory")
                .u("procs", n as u64)
                .u("segment_bytes", bytes)
                .u("per_process_bytes", bytes / n as u64)
                .u(
                    "cells_bytes_per_process",
                    geo.cells_per_proc as u64 * geo.cell_size as u64,
                )
                .u("fastbox_slots", u64::from(resolved.fbox_slots))
                .u("fastbox_bytes_per_pair", pair_bytes)
                .u("pair_buffer_bytes", u64::from(resolved.pair_size))
                .print();
        } else {
            println!(
                "{n:>7} {bytes:>14} {:>11.1} {:>16} {:>12} {:>12}",
                bytes as f64 / 1048576.0,
                bytes / n as u64,
                resolved.fbox_slots,
                resolved.pair_size
            );
        }
    }
    udp_memory(a, json)?;
    ud_memory(a, json)
}

/// The memory the ud netmod keeps per peer, on the verbs device.
#[cfg(not(feature = "verbs"))]
fn ud_memory(a: &MemoryArgs, _json: bool) -> Result<()> {
    if !a.ud_peers.is_empty() || !a.rc_peers.is_empty() {
        anyhow::bail!("--ud-peers, --rc-peers: this nemesis-bench was built without the `verbs` feature");
    }
    Ok(())
}

/// The memory the ud netmod keeps per peer, from [`measure::ud_memory`].
#[cfg(feature = "verbs")]
fn ud_memory(a: &MemoryArgs, json: bool) -> Result<()> {
    if a.ud_peers.is_empty() && a.rc_peers.is_empty() {
        return Ok(());
    }
    let addr = nemesis::net::addr::choose(|k: &str| std::env::var(k).ok(), false)?;
    if !json {
        println!();
        println!(
            "# verbs netmods on the device: one netmod exchanges {} rounds of 100- and",
            a.udp_rounds
        );
        println!(
            "# 20000-byte (rc: 8168-byte) messages with each peer, all in this process, then is dropped;"
        );
        println!(
            "# per peer: what it gives back less an idle netmod's, Rust heap and the verbs library's C heap"
        );
        println!(
            "# {:>7} {:>5} {:>12} {:>14} {:>16}",
            "netmod", "peers", "idle B", "per peer B", "per peer C B"
        );
    }
    let runs = a
        .ud_peers
        .iter()
        .map(|&p| ("ud", p))
        .chain(a.rc_peers.iter().map(|&p| ("rc", p)));
    for (netmod, peers) in runs {
        progress(&format!("{netmod} memory with {peers} peers"));
        let m = measure::ud_memory(netmod, peers, a.udp_rounds, addr, &counting::live)?;
        progress_done();
        if json {
            Json::new("memory")
                .s("transport", m.netmod)
                .u("peers", u64::from(m.peers))
                .u("messages_per_peer", m.messages_per_peer)
                .u("idle_bytes", m.idle_bytes as u64)
                .f("per_peer_bytes", m.per_peer_bytes)
                .f("per_peer_c_bytes", m.per_peer_c_bytes)
                .print();
        } else {
            println!(
                "{:>9} {:>5} {:>12} {:>14.1} {:>16.1}",
                m.netmod, m.peers, m.idle_bytes, m.per_peer_bytes, m.per_peer_c_bytes
            );
        }
    }
    Ok(())
}

fn requests(a: &RequestsArgs, json: bool) -> Result<()> {
    if !json {
        println!(
            "# {:>9} {:>8} {:>16} {:>18} {:>12}",
            "api", "count", "post ns/request", "finish ns/request", "empty tests"
        );
    }
    for &count in &a.counts {
        if count == 0 || count > 1 << 20 {
            anyhow::bail!("--counts: {count} requests; choose 1 to 1M");
        }
        for api in measure::Api::ALL {
            let r = measure::requests(api, count, a.rounds)?;
            if json {
                Json::new("requests")
                    .s("api", api.name())
                    .u("count", count as u64)
                    .f("post_ns_per_request", r.post_ns)
                    .f("finish_ns_per_request", r.finish_ns)
                    .u("empty_tests", r.empty_tests)
                    .print();
            } else {
                println!(
                    "{:>11} {count:>8} {:>16.1} {:>18.1} {:>12}",
                    api.name(),
                    r.post_ns,
                    r.finish_ns,
                    r.empty_tests
                );
            }
        }
    }
    Ok(())
}

/// The heap the udp layer keeps per peer, from [`measure::udp_memory`] weighed by this
/// binary's counting allocator.
fn udp_memory(a: &MemoryArgs, json: bool) -> Result<()> {
    if a.udp_peers.0.is_empty() {
        return Ok(());
    }
    if !json {
        println!();
        println!(
            "# udp reliability layer, in the simulator: one endpoint exchanges {} rounds of {:?}-byte",
            a.udp_rounds,
            measure::UDP_MEMORY_SIZES
        );
        println!("# messages with each peer, then everything is acknowledged and the endpoint is dropped;");
        println!(
            "# the heap it gives back is its size. idle: an endpoint of the same job that talked to no one"
        );
        println!(
            "# {:>5} {:>14} {:>12} {:>14}",
            "peers", "endpoint B", "idle B", "per peer B"
        );
    }
    for &peers in &a.udp_peers.0 {
        progress(&format!("udp memory with {peers} peers"));
        let m = measure::udp_memory(peers, a.udp_rounds, &counting::live)?;
        progress_done();
        if json {
            Json::new("memory")
                .s("transport", "udp")
                .u("peers", u64::from(m.peers))
                .u("messages_per_peer", m.messages_per_peer)
                .u("endpoint_bytes", m.endpoint_bytes as u64)
                .u("idle_bytes", m.idle_bytes as u64)
                .f("per_peer_bytes", m.per_peer_bytes)
                .print();
        } else {
            println!(
                "{:>7} {:>14} {:>12} {:>14.1}",
                m.peers, m.endpoint_bytes, m.idle_bytes, m.per_peer_bytes
            );
        }
    }
    Ok(())
}

/// A global allocator that counts live bytes, so `memory` can weigh what a structure
/// holds. Two relaxed atomic operations per allocation; nothing measured for speed
/// allocates in its timed loop.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static LIVE: AtomicUsize = AtomicUsize::new(0);

    /// Bytes allocated and not yet freed.
    pub fn live() -> usize {
        LIVE.load(Ordering::Relaxed)
    }

    struct Counting;

    // SAFETY: every call is passed to the system allocator unchanged; the counter only
    // observes the sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: our caller upholds `alloc`'s contract, which we pass on.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as for `alloc`.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator, hence from the system's, with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as for `dealloc`, and `new_size` is the caller's valid request.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                LIVE.fetch_add(new_size, Ordering::Relaxed);
                LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            }
            p
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Some(Cmd::Latency(a)) => {
            let mut pairs = pairs(&a.transport, !a.no_pin)?;
            latency(&mut pairs, &a, cli.json)?;
            finish(pairs)?;
        }
        Some(Cmd::Bw(a)) => {
            let mut pairs = pairs(&a.transport, !a.no_pin)?;
            if a.layer == LayerArg::Channel {
                let s = StreamArgs {
                    sizes: a.sizes.clone(),
                    window: a.window,
                    iters: a.iters,
                    warmup: a.warmup,
                    rounds: a.rounds,
                    no_pin: a.no_pin,
                };
                for k in 0..pairs.len() {
                    tend_others(&mut pairs, k)?;
                    bandwidth(&mut pairs[k], &s, cli.json)?;
                }
            } else {
                bandwidth_p2p(&mut pairs, &a, cli.json)?;
            }
            finish(pairs)?;
        }
        Some(Cmd::Msgrate(a)) => {
            let mut pair = Pair::start(!a.rest.no_pin)?;
            msgrate(&mut pair, &a, cli.json)?;
            pair.finish()?;
        }
        Some(Cmd::Ring(a)) => ring(&a, cli.json)?,
        Some(Cmd::Coll(a)) => coll(&a, cli.json)?,
        Some(Cmd::Memory(a)) => memory(&a, cli.json)?,
        Some(Cmd::Requests(a)) => requests(&a, cli.json)?,
        Some(Cmd::Peers(a)) => peers(&a, cli.json)?,
        Some(Cmd::Rma(a)) => rma::rma(&a, cli.json)?,
        Some(Cmd::Calibrate(a)) => calibrate(&a, cli.json)?,
        None => {
            let lat = LatencyArgs::parse_defaults();
            let bw = BwArgs::parse_defaults();
            let mut pairs = pairs(&[Transport::Shm], true)?;
            latency(&mut pairs, &lat, cli.json)?;
            if !cli.json {
                println!();
            }
            bandwidth_p2p(&mut pairs, &bw, cli.json)?;
            finish(pairs)?;
        }
    }
    Ok(())
}

trait Defaults: Sized {
    fn parse_defaults() -> Self;
}

impl<T: Args> Defaults for T {
    fn parse_defaults() -> Self {
        #[derive(Parser)]
        struct Wrap<A: Args> {
            #[command(flatten)]
            inner: A,
        }
        Wrap::<T>::try_parse_from(["nemesis-bench"])
            .expect("defaults parse")
            .inner
    }
}

fn main() {
    measure::serve_if_partner();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("nemesis-bench: {e:#}");
        std::process::exit(1);
    }
}
