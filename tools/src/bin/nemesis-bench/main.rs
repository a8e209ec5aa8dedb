//! `nemesis-bench`: osu-style measurements of the nemesis channel.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use nemesis_tools::measure::{self, Layer, Pair, Transport};
use std::fmt::Write as _;
use std::io::IsTerminal;

#[macro_use]
mod out;

mod calibrate;
mod latency;
mod memory;
mod peers;
mod rma;
mod stream;

use calibrate::{CalibrateArgs, calibrate};
use latency::{LatencyArgs, latency};
use memory::{MemoryArgs, memory};
use peers::{PeersArgs, peers};
use stream::{BwArgs, RateArgs, StreamArgs, bandwidth, bandwidth_p2p, msgrate};

const AFTER_HELP: &str = "\
Every measurement starts its own partner process from this executable; no set-up is
needed. The two processes are pinned to two CPUs when there are two. Beside each
latency the same pair measures a cache-line ping-pong (the probe) on a line of the same
segment, interleaved round by round, and reports the ratio: on machines whose cores
move about (near/far placement) the ratio is the comparable figure.

With no subcommand it prints the latency and bandwidth tables. --json prints one JSON
object per line instead of tables.

Sizes accept K, M and G suffixes (binary), up to 1G. Messages larger than one packet (see
NEMESIS_CELL_SIZE) are sent as several packets.";

/// Measure nemesis: latency, bandwidth, message rate, oversubscription and memory.
#[derive(Parser, Debug)]
#[command(name = "nemesis-bench", version, after_help = AFTER_HELP)]
struct Cli {
    /// Print one JSON object per line instead of tables.
    #[arg(long, global = true)]
    json: bool,

    /// The cache-line probe's one-way time, in ns, below which a pair's CPUs count as
    /// sharing a cache ("near") and at or above which as not ("far"). The default fits
    /// the AMD guests (25-55 ns near, 160-240 far) and an Intel guest whose CPUs share
    /// one cache (45-110 ns, all near).
    #[arg(long, global = true, value_name = "NS", default_value_t = measure::peers::NEAR_BELOW_NS,
          value_parser = near_below)]
    near_below: f64,

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
struct RequestsArgs {
    /// Receives outstanding at once.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "1K,10K,100K")]
    counts: Vec<usize>,
    /// Rounds per count; the best is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
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
    // At most 1 GiB: a usize on every target.
    Ok(n as usize)
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
        outln!("{}}}", self.0);
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ring(a: &RingArgs, json: bool) -> Result<()> {
    let machine = measure::allowed_cpus();
    let cpus = machine.len();
    let pin = !a.no_pin;
    // The probe's pair runs between the ring's rounds, while the ring's processes sleep.
    let mut probe_pair = Pair::start(pin)?;
    let clock = probe_pair.clock();
    if !json {
        outln!(
            "# token round a ring of processes, {} hops a round, {} rounds, {cpus} usable cpus, {}",
            a.messages,
            a.rounds,
            if pin {
                "rank r pinned to the (r mod cpus)-th cpu"
            } else {
                "not pinned"
            }
        );
        outln!("# probe: the cache-line ping-pong of a pair on the first two cpus, before each round");
        outln!(
            "# {:>5} {:>12} {:>12} {:>12} {:>9} {:>7}  placement",
            "procs",
            "ns/hop p50",
            "ns/hop min",
            "ns/hop max",
            "probe ns",
            "ratio"
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
            outln!(
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
        outln!(
            "# {} calls per round, median of {} rounds, {cpus} usable cpus",
            a.iters,
            a.rounds
        );
        outln!(
            "# node: through the node's shared blocks; messages: dissemination / recursive doubling, or flat where the processes outnumber the CPUs (NEMESIS_FLAT_COLLECTIVES: one exchange among 3 or 4, gathered at rank 0 among 5 to 8); fence: of a window in shared memory"
        );
        outln!(
            "# {:>5} {:>10} {:>9} {:>10} {:>10} {:>10}",
            "procs",
            "collective",
            "path",
            "median ns",
            "min ns",
            "max ns"
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
                outln!("{n:>7} {name:>10} {path:>9} {med:>10.0} {min:>10.0} {max:>10.0}");
            }
        }
    }
    Ok(())
}

fn requests(a: &RequestsArgs, json: bool) -> Result<()> {
    if !json {
        outln!(
            "# {:>9} {:>8} {:>16} {:>18} {:>12}",
            "api",
            "count",
            "post ns/request",
            "finish ns/request",
            "empty tests"
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
                outln!(
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
            if a.phases && a.layer == LayerArg::Channel {
                anyhow::bail!("--phases times the steps of a two-sided window; --layer channel has none");
            }
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
                outln!();
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

/// `--near-below`: a time in ns above zero.
fn near_below(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(ns) if ns.is_finite() && ns > 0.0 => Ok(ns),
        _ => Err(format!("\"{s}\" is not a time in ns above zero")),
    }
}

fn main() {
    measure::serve_if_partner();
    let cli = Cli::parse();
    measure::peers::set_near_below_ns(cli.near_below);
    if let Err(e) = run(cli) {
        eprintln!("nemesis-bench: {e:#}");
        std::process::exit(1);
    }
}
