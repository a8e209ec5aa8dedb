//! `nemesis-bench`: osu-style measurements of the nemesis channel.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use nemesis::Channel as _;
use nemesis::measure::{self, Layer, Pair, Summary};
use nemesis::shm::{Geometry, Segment};
use std::fmt::Write as _;
use std::io::IsTerminal;

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
    /// Message rate: as bw, counting messages.
    Msgrate(RateArgs),
    /// A token passed round a ring of processes, which may outnumber the CPUs.
    Ring(RingArgs),
    /// Barrier and 8-byte allreduce among processes, through the node's shared blocks
    /// and through messages, interleaved round by round.
    Coll(CollArgs),
    /// Size of the shared segment for a number of processes, with the current settings.
    Memory(MemoryArgs),
}

#[derive(Args, Debug, Clone)]
struct LatencyArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64,256,1K,4K")]
    sizes: Vec<usize>,
    /// Timed round trips per round, for each of the channel and the probe.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed round trips before each round.
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
    /// cma, cma-put, ring, vmsplice (as NEMESIS_LMT). Ignored with --layer channel.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    lmt: Vec<String>,
    /// Messages per window.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Most timed windows per round; fewer for large messages, so that a round moves
    /// about 256 MiB.
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
}

/// Bytes a bandwidth round aims to move.
const BW_ROUND_BYTES: u64 = 256 << 20;

/// Single-thread memcpy bandwidth for `size`-byte copies between two buffers that are
/// reused, as the benchmark's own buffers are: MiB/s.
fn memcpy_mib_s(size: usize) -> f64 {
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
    (reps * size as u64) as f64 / t.elapsed().as_secs_f64() / 1048576.0
}

fn strategy_arg(name: &str) -> Result<Option<nemesis_lmt::Strategy>> {
    match name.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        n => nemesis_lmt::Strategy::ALL
            .into_iter()
            .find(|s| s.name() == n)
            .map(Some)
            .ok_or_else(|| {
                anyhow::anyhow!("--lmt {n}: expected auto, chunks, cma, cma-put, ring or vmsplice")
            }),
    }
}

fn bandwidth_p2p(pair: &mut Pair, a: &BwArgs, json: bool) -> Result<()> {
    let lmts = a
        .lmt
        .iter()
        .map(|n| strategy_arg(n))
        .collect::<Result<Vec<_>>>()?;
    let eager = nemesis::p2p::Config::from_env(pair.channel().max_payload())?.eager_limit;
    if !json {
        println!(
            "# nemesis two-sided bandwidth (window of {} non-blocking sends), {}",
            a.window,
            pinning(pair)
        );
        println!("# memcpy: one thread copying the same size between two reused buffers, same run");
        println!("# probe: the cache-line ping-pong of the same pair (near: the CPUs share a cache)");
        println!(
            "# {:>7} {:>9} {:>9} {:>10} {:>12} {:>6} {:>9}  placement",
            "size", "lmt", "used", "MiB/s", "memcpy MiB/s", "ratio", "probe ns"
        );
    }
    for &size in &a.sizes {
        let iters = (BW_ROUND_BYTES / (size.max(1) as u64 * a.window)).clamp(1, a.iters);
        let warmup = a.warmup.min(iters);
        let mut secs = vec![Vec::new(); lmts.len()];
        let mut copy = Vec::new();
        let mut probe = Vec::new();
        for r in 0..a.rounds {
            pair.probe(2_000, 200, &mut probe)?;
            for (i, &lmt) in lmts.iter().enumerate() {
                let name = lmt.map_or("auto", |s| s.name());
                progress(&format!("bw {size} B {name}: round {}/{}", r + 1, a.rounds));
                secs[i].push(pair.stream_p2p(size, a.window, iters, warmup, lmt)?);
            }
            copy.push(memcpy_mib_s(size));
        }
        progress_done();
        let memcpy = median(copy);
        let clock = pair.clock();
        let probe_ns = median(probe.into_iter().map(|t| clock.ns(t) / 2.0).collect());
        let bytes = (size as u64 * a.window * iters) as f64;
        for (i, &lmt) in lmts.iter().enumerate() {
            let mib = bytes / median(std::mem::take(&mut secs[i])) / 1048576.0;
            let name = lmt.map_or("auto", |s| s.name());
            let used = if size <= eager {
                "eager"
            } else {
                lmt.unwrap_or_else(|| pair.auto_lmt(size)).name()
            };
            if json {
                Json::row("bw", "p2p", size)
                    .s("lmt", name)
                    .s("used", used)
                    .f("mib_s", mib)
                    .f("memcpy_mib_s", memcpy)
                    .f("ratio", mib / memcpy)
                    .f("probe_ns", probe_ns)
                    .s("placement", placement(probe_ns))
                    .u("window", a.window)
                    .print();
            } else {
                println!(
                    "{size:>9} {name:>9} {used:>9} {mib:>10.0} {memcpy:>12.0} {:>6.2} {probe_ns:>9.0}  {}",
                    mib / memcpy,
                    placement(probe_ns)
                );
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
struct RateArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64")]
    sizes: Vec<usize>,
    #[command(flatten)]
    rest: RateRest,
}

#[derive(Args, Debug, Clone)]
struct RateRest {
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Timed windows per round.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed windows before each round.
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
    /// Hops the token makes in each ring.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
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
}

fn size(s: &str) -> Result<usize, String> {
    nemesis::shm::config::parse_size(s)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is not a size (examples: 0, 64, 4K, 1M)"))
}

/// A flat JSON object, built in order.
struct Json(String);

impl Json {
    fn new(bench: &str) -> Self {
        Self(format!("{{\"bench\":\"{bench}\""))
    }
    /// A row about messages of `size` bytes between the pair, through `layer`.
    fn row(bench: &str, layer: &str, size: usize) -> Self {
        Self::new(bench)
            .s("layer", layer)
            .s("transport", "shm")
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
    // The machines this was built on show ~25-35 ns when both vCPUs share a cache and
    // ~160-190 ns when they do not; nothing falls between.
    if probe_ns < 80.0 { "near" } else { "far" }
}

fn pinning(pair: &Pair) -> String {
    match pair.pinned() {
        Some((a, b)) => format!("pinned to cpus {a} and {b}"),
        None => "not pinned".into(),
    }
}

fn latency(pair: &mut Pair, a: &LatencyArgs, json: bool) -> Result<()> {
    let clock = pair.clock();
    let p2p = a.layer == LayerArg::P2p;
    if !json {
        println!(
            "# nemesis {} latency, one way (half the round trip), {}",
            a.layer.name(),
            pinning(pair)
        );
        println!("# probe: one cache line written by both processes in turn (the placement probe)");
        println!("# floor: one line per direction, each written by one side (what a fastbox costs at best)");
        if p2p {
            println!("# channel: the same ping-pong through the channel underneath; /chan = p2p / channel");
        }
        println!("# all measured by the same two processes, interleaved round by round");
        print!(
            "# {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "size", "p50 ns", "p99 ns", "mean ns", "probe ns", "floor ns", "ratio", "/floor"
        );
        if p2p {
            print!(" {:>9} {:>6}", "chan ns", "/chan");
        }
        println!("  placement");
    }
    for &size in &a.sizes {
        let (mut lat, mut probe, mut floor, mut chan) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in 0..a.rounds {
            progress(&format!("latency {size} B: round {}/{}", r + 1, a.rounds));
            pair.probe(a.iters, a.warmup, &mut probe)?;
            pair.ping_pong_through(a.layer.layer(), size, a.iters, a.warmup, &mut lat)?;
            if p2p {
                pair.ping_pong(size, a.iters, a.warmup, &mut chan)?;
            }
            pair.floor(a.iters, a.warmup, &mut floor)?;
        }
        progress_done();
        let half = |v: Vec<u64>| v.into_iter().map(|t| clock.ns(t) / 2.0).collect::<Vec<_>>();
        let c = Summary::of(&mut half(lat)).context("no samples")?;
        let p = Summary::of(&mut half(probe)).context("no samples")?;
        let f = Summary::of(&mut half(floor)).context("no samples")?;
        let ch = if p2p { Summary::of(&mut half(chan)) } else { None };
        let ratio = c.p50 / p.p50;
        if json {
            let mut row = Json::row("latency", a.layer.name(), size)
                .f("p50_ns", c.p50)
                .f("p99_ns", c.p99)
                .f("mean_ns", c.mean)
                .f("min_ns", c.min)
                .f("probe_ns", p.p50)
                .f("ratio", ratio)
                .f("floor_ns", f.p50)
                .f("floor_ratio", c.p50 / f.p50);
            if let Some(ch) = ch {
                row = row.f("channel_ns", ch.p50).f("channel_ratio", c.p50 / ch.p50);
            }
            row.s("placement", placement(p.p50))
                .u("samples", c.count as u64)
                .print();
        } else {
            print!(
                "{:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2}",
                size,
                c.p50,
                c.p99,
                c.mean,
                p.p50,
                f.p50,
                ratio,
                c.p50 / f.p50
            );
            if let Some(ch) = ch {
                print!(" {:>9.1} {:>6.2}", ch.p50, c.p50 / ch.p50);
            }
            println!("  {}", placement(p.p50));
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
        println!("# {:>7} {:>10} {:>10}", "size", "MB/s", "MiB/s");
    }
    for &size in &a.sizes {
        // Large sizes get fewer windows, so a round moves about BW_ROUND_BYTES.
        let iters = (BW_ROUND_BYTES / (size.max(1) as u64 * a.window)).clamp(1, a.iters);
        let s = stream_median(pair, "bw", size, a.window, iters, a.warmup.min(iters), a.rounds)?;
        let bytes = (size as u64 * a.window * iters) as f64;
        let (mb, mib) = (bytes / s / 1e6, bytes / s / (1024.0 * 1024.0));
        if json {
            Json::row("bw", "channel", size)
                .f("mb_s", mb)
                .f("mib_s", mib)
                .u("window", a.window)
                .print();
        } else {
            println!("{size:>9} {mb:>10.0} {mib:>10.0}");
        }
    }
    Ok(())
}

fn msgrate(pair: &mut Pair, sizes: &[usize], a: &RateRest, json: bool) -> Result<()> {
    if !json {
        println!(
            "# nemesis channel message rate (window of {} messages), {}",
            a.window,
            pinning(pair)
        );
        println!("# {:>7} {:>14}", "size", "messages/s");
    }
    for &size in sizes {
        let s = stream_median(pair, "msgrate", size, a.window, a.iters, a.warmup, a.rounds)?;
        let rate = (a.window * a.iters) as f64 / s;
        if json {
            Json::row("msgrate", "channel", size)
                .f("msgs_per_s", rate)
                .u("window", a.window)
                .print();
        } else {
            println!("{size:>9} {rate:>14.0}");
        }
    }
    Ok(())
}

fn ring(a: &RingArgs, json: bool) -> Result<()> {
    let cpus = measure::allowed_cpus().len();
    if !json {
        println!(
            "# token round a ring of processes, {} hops, {cpus} usable cpus",
            a.messages
        );
        println!("# {:>5} {:>10} {:>12}", "procs", "seconds", "ns per hop");
    }
    for &n in &a.procs {
        progress(&format!("ring of {n}"));
        let r = measure::ring(n, a.messages)?;
        progress_done();
        let secs = r.elapsed.as_secs_f64();
        let per_hop = secs * 1e9 / a.messages as f64;
        if json {
            Json::new("ring")
                .u("procs", n as u64)
                .u("messages", a.messages)
                .u("cpus", cpus as u64)
                .f("seconds", secs)
                .f("per_hop_ns", per_hop)
                .print();
        } else {
            println!("{n:>7} {secs:>10.4} {per_hop:>12.0}");
        }
    }
    Ok(())
}

fn coll(a: &CollArgs, json: bool) -> Result<()> {
    let cpus = measure::allowed_cpus().len();
    if !json {
        println!(
            "# {} calls per round, median of {} rounds, {cpus} usable cpus",
            a.iters, a.rounds
        );
        println!("# node: through the node's shared blocks; messages: dissemination / recursive doubling");
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
    let pair_bytes = 2 * geo.fbox_size as u64;
    if !json {
        println!(
            "# shared segment size: {} cells of {} B per process, fastboxes of {} B",
            geo.cells_per_proc, geo.cell_size, geo.fbox_size
        );
        println!(
            "# {:>5} {:>14} {:>11} {:>16}",
            "procs", "segment", "MiB", "per process"
        );
    }
    for &n in &a.procs {
        let bytes = Segment::bytes_for(n, geo)? as u64;
        if json {
            Json::new("memory")
                .u("procs", n as u64)
                .u("segment_bytes", bytes)
                .u("per_process_bytes", bytes / n as u64)
                .u(
                    "cells_bytes_per_process",
                    geo.cells_per_proc as u64 * geo.cell_size as u64,
                )
                .u("fastbox_bytes_per_pair", pair_bytes)
                .print();
        } else {
            println!(
                "{n:>7} {bytes:>14} {:>11.1} {:>16}",
                bytes as f64 / 1048576.0,
                bytes / n as u64
            );
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Some(Cmd::Latency(a)) => {
            let mut pair = Pair::start(!a.no_pin)?;
            latency(&mut pair, &a, cli.json)?;
            pair.finish()?;
        }
        Some(Cmd::Bw(a)) => {
            let mut pair = Pair::start(!a.no_pin)?;
            if a.layer == LayerArg::Channel {
                let s = StreamArgs {
                    sizes: a.sizes.clone(),
                    window: a.window,
                    iters: a.iters,
                    warmup: a.warmup,
                    rounds: a.rounds,
                    no_pin: a.no_pin,
                };
                bandwidth(&mut pair, &s, cli.json)?;
            } else {
                bandwidth_p2p(&mut pair, &a, cli.json)?;
            }
            pair.finish()?;
        }
        Some(Cmd::Msgrate(a)) => {
            let mut pair = Pair::start(!a.rest.no_pin)?;
            msgrate(&mut pair, &a.sizes, &a.rest, cli.json)?;
            pair.finish()?;
        }
        Some(Cmd::Ring(a)) => ring(&a, cli.json)?,
        Some(Cmd::Coll(a)) => coll(&a, cli.json)?,
        Some(Cmd::Memory(a)) => memory(&a, cli.json)?,
        None => {
            let lat = LatencyArgs::parse_defaults();
            let bw = BwArgs::parse_defaults();
            let mut pair = Pair::start(true)?;
            latency(&mut pair, &lat, cli.json)?;
            if !cli.json {
                println!();
            }
            bandwidth_p2p(&mut pair, &bw, cli.json)?;
            pair.finish()?;
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
