//! Two-sided nemesis beside MPI peers, interleaved round by round in one run: the
//! peer's side is `scripts/peers/osu_peer.c` built with each MPI's `mpicc`, started by
//! a command line the caller gives, and read back as JSON lines in nemesis-bench's units.

use super::{MeasureError, Pair, Result, StreamPlan, Summary};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// One of the three measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Test {
    /// Ping-pong, p50 of the one-way time in ns (lower is better).
    Latency,
    /// osu_bw, MB/s (higher is better).
    Bandwidth,
    /// Small messages streamed, messages a second (higher is better).
    Rate,
    /// Barrier among a number of processes, through messages; ns per call (lower is
    /// better). Its "size" is the number of processes.
    Barrier,
    /// Allreduce of one `f64` summed, likewise.
    Allreduce,
}

impl Test {
    /// Its name in the JSON rows.
    pub fn name(self) -> &'static str {
        match self {
            Test::Latency => "latency",
            Test::Bandwidth => "bw",
            Test::Rate => "msgrate",
            Test::Barrier => "barrier",
            Test::Allreduce => "allreduce",
        }
    }

    /// Whether its "size" is a number of processes.
    pub fn is_collective(self) -> bool {
        matches!(self, Test::Barrier | Test::Allreduce)
    }

    /// The unit of its figures.
    pub fn unit(self) -> &'static str {
        match self {
            Test::Latency => "ns",
            Test::Bandwidth => "MB/s",
            Test::Rate => "msgs/s",
            Test::Barrier | Test::Allreduce => "ns",
        }
    }

    /// The peer program's mode, and the key of its figure.
    fn mode(self) -> (&'static str, &'static str) {
        match self {
            Test::Latency => ("lat", "p50_ns"),
            Test::Bandwidth => ("bw", "mb_s"),
            Test::Rate => ("rate", "msgs_per_s"),
            Test::Barrier | Test::Allreduce => ("coll", "ns"),
        }
    }
}

/// A peer: its name and the command that starts two ranks of `osu_peer`.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Shown in the tables and JSON rows.
    pub name: String,
    /// A shell command line; the mode and its arguments are appended.
    pub command: String,
    /// For the collectives: a command line with `{procs}` where the number of processes
    /// goes (and no binding to cores, since they outnumber them), if the peer runs them.
    pub coll: Option<String>,
}

/// How much each measurement does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Sizes of each test; an empty list skips the test.
    pub sizes: Vec<(Test, Vec<usize>)>,
    /// Round trips per latency size.
    pub lat_iters: u64,
    /// Messages per window of the streaming tests.
    pub window: u64,
    /// Timed windows of the message rate; bandwidth takes fewer for large sizes.
    pub rate_iters: u64,
    /// Calls per collective and process count.
    pub coll_iters: u64,
    /// How many more times a figure is taken when the CPUs moved while it was (for
    /// nemesis's), or when it was not taken at the placement nemesis's was (for a
    /// peer's): the last try stands.
    pub retries: u32,
    /// The machine's CPUs, which the collectives' processes may all use (the pair pins
    /// this process to one, and a job started from it would inherit that).
    pub cpus: Vec<usize>,
}

/// Untimed windows before a stream's timed ones: a tenth of them, and at least four, in
/// which nemesis's sender has tried both ways of a stream's longer messages
/// (`NEMESIS_STREAM_TUNE_LIMIT`) as a running program would have; the peers' program
/// takes as many.
pub fn stream_warmup(iters: u64) -> u64 {
    (iters / 10).max(4)
}

/// Bytes a latency round at a large size aims to move each way.
const LAT_ROUND_BYTES: u64 = 1 << 30;

/// Timed round trips of a latency round at `size`: at most `iters`, and fewer for large
/// messages, so that a round moves about 1 GiB each way, but at least 10 (or `iters`).
/// Below 100 KiB the default 10,000 hold.
pub fn lat_iters(size: usize, iters: u64) -> u64 {
    (LAT_ROUND_BYTES / size.max(1) as u64).max(10).min(iters)
}

/// Timed windows of a bandwidth round at `size`: about 256 MB, at least one window.
pub fn bw_iters(size: usize, window: u64) -> u64 {
    stream_windows(size, window, 200)
}

/// Timed windows of `window` messages of `size` bytes in a streaming round: at most
/// `most`, and fewer for large messages, so that a round moves about 256 MiB, but at
/// least one.
pub fn stream_windows(size: usize, window: u64, most: u64) -> u64 {
    ((256u64 << 20) / (size.max(1) as u64 * window)).clamp(1, most.max(1))
}

/// A probe below this many ns one way says the pair's two CPUs share a cache ("near"),
/// by default. The AMD guests show 25-55 ns then and 160-240 ns when they do not
/// ("far"), and nothing between; an Intel guest whose CPUs all share one cache showed
/// 45-110 ns, one placement, which a bound below that split in two.
pub const NEAR_BELOW_NS: f64 = 130.0;

/// The bound in use, in ns (an `f64`'s bits): [`NEAR_BELOW_NS`] unless
/// [`set_near_below_ns`] changed it.
static NEAR_BELOW: AtomicU64 = AtomicU64::new(NEAR_BELOW_NS.to_bits());

/// Sets the probe's bound between near and far for this process (`nemesis-bench
/// --near-below`), for a machine whose placements fall elsewhere.
pub fn set_near_below_ns(ns: f64) {
    NEAR_BELOW.store(ns.to_bits(), Ordering::Relaxed);
}

/// The probe's bound between near and far in use, in ns.
pub fn near_below_ns() -> f64 {
    f64::from_bits(NEAR_BELOW.load(Ordering::Relaxed))
}

/// Where the pair's two CPUs sat, by the placement probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// They share a cache.
    Near,
    /// They do not.
    Far,
}

impl Placement {
    /// The placement a probe of `ns` one way shows.
    pub fn of_probe(ns: f64) -> Self {
        if ns < near_below_ns() {
            Placement::Near
        } else {
            Placement::Far
        }
    }

    /// The placement through a figure taken between probes of `before` and `after` ns:
    /// none when the CPUs moved in between, since the figure may mix both.
    pub fn between(before: f64, after: f64) -> Option<Self> {
        let p = Self::of_probe(before);
        (p == Self::of_probe(after)).then_some(p)
    }

    /// Its name in tables and JSON rows.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Near => "near",
            Placement::Far => "far",
        }
    }
}

/// One figure and the placement it was taken at, if the probes around it agree (and
/// the processes were pinned: collectives are not).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// In its test's unit.
    pub value: f64,
    /// The placement throughout, if known.
    pub placement: Option<Placement>,
}

/// A figure's test, size, and whose it is.
pub type Key = (Test, usize, String);

/// Every figure of one round.
pub type Round = BTreeMap<Key, Figure>;

/// Name under which nemesis's own figures are kept.
pub const NEMESIS: &str = "nemesis";

/// Name under which nemesis's collectives through the node's shared blocks are kept,
/// beside its message-path figures (which are the ones compared).
pub const NEMESIS_NODE: &str = "nemesis-node-blocks";

/// Probes the pair's placement: the one-way ns, median of a short cache-line ping-pong
/// (about a millisecond), cheap enough to take around every figure.
fn probe_ns(pair: &mut Pair) -> Result<f64> {
    let clock = pair.clock();
    let mut rtt = Vec::new();
    pair.probe(500, 50, &mut rtt)?;
    Ok(Summary::of(&mut rtt.iter().map(|&t| clock.ns(t) / 2.0).collect::<Vec<_>>()).map_or(0.0, |s| s.p50))
}

/// Whether a peer's figure taken at `theirs` stands beside nemesis's taken at `ours`,
/// after `tries` retries of `retries`: when nemesis's placement is known, only one taken
/// at the same placement does, until the retries run out.
fn peer_figure_stands(ours: Option<Placement>, theirs: Option<Placement>, tries: u32, retries: u32) -> bool {
    ours.is_none() || theirs == ours || tries >= retries
}

/// nemesis's figure of `test` at `size`.
fn ours(pair: &mut Pair, test: Test, size: usize, plan: &Plan) -> Result<f64> {
    let clock = pair.clock();
    Ok(match test {
        Test::Latency => {
            let mut rtt = Vec::new();
            let iters = lat_iters(size, plan.lat_iters);
            pair.ping_pong_through(super::Layer::P2p, size, iters, iters / 10, &mut rtt)?;
            let mut half: Vec<f64> = rtt.iter().map(|&t| clock.ns(t) / 2.0).collect();
            Summary::of(&mut half).map_or(0.0, |s| s.p50)
        }
        Test::Bandwidth => {
            let iters = bw_iters(size, plan.window);
            let secs = pair.stream_p2p(StreamPlan {
                osu: true,
                ..StreamPlan::new(size, plan.window, iters, stream_warmup(iters))
            })?;
            (size as u64 * plan.window * iters) as f64 / secs / 1e6
        }
        Test::Rate => {
            let secs = pair.stream_p2p(StreamPlan::new(
                size,
                plan.window,
                plan.rate_iters,
                stream_warmup(plan.rate_iters),
            ))?;
            (plan.window * plan.rate_iters) as f64 / secs
        }
        Test::Barrier | Test::Allreduce => unreachable!("collectives are measured apart"),
    })
}

/// Measures one round: for each test and size, nemesis and then every peer, with a
/// placement probe before the first and after each, so that every figure knows the
/// placement it was taken at (taken again, up to `plan.retries` times, when that is
/// unknown or a peer's differs from nemesis's). `probe` gets the probe from the start
/// of the round.
pub fn round(pair: &mut Pair, peers: &[Peer], plan: &Plan, probe: &mut Vec<f64>) -> Result<Round> {
    let mut out = Round::new();
    let mut before = probe_ns(pair)?;
    probe.push(before);
    for (test, sizes) in &plan.sizes {
        if sizes.is_empty() {
            continue;
        }
        if test.is_collective() {
            // Both collectives in one job per process count, listed under the barrier.
            if *test == Test::Barrier {
                collectives(peers, plan, sizes, &mut out)?;
                before = probe_ns(pair)?;
            }
            continue;
        }
        for &size in sizes {
            // Again while the CPUs move during the figure.
            let mut tries = 0;
            let (value, placement) = loop {
                let v = ours(pair, *test, size, plan)?;
                let after = probe_ns(pair)?;
                let placement = Placement::between(before, after);
                before = after;
                if placement.is_some() || tries == plan.retries {
                    break (v, placement);
                }
                tries += 1;
            };
            out.insert((*test, size, NEMESIS.to_string()), Figure { value, placement });
            // Each peer a size at a time, so that its figure has probes of its own.
            let rest = match test {
                Test::Latency => {
                    let iters = lat_iters(size, plan.lat_iters);
                    format!("{} {}", iters, iters / 10)
                }
                Test::Bandwidth => format!("{} {}", plan.window, bw_iters(size, plan.window)),
                Test::Rate => format!("{} {}", plan.window, plan.rate_iters),
                Test::Barrier | Test::Allreduce => unreachable!("collectives are measured apart"),
            };
            for p in peers {
                // Again until taken at nemesis's placement, if it has one.
                let mut tries = 0;
                loop {
                    let got = run_peer(p, *test, &[size], &rest)?;
                    let after = probe_ns(pair)?;
                    let theirs = Placement::between(before, after);
                    before = after;
                    if peer_figure_stands(placement, theirs, tries, plan.retries) {
                        for (size, value) in got {
                            out.insert(
                                (*test, size, p.name.clone()),
                                Figure {
                                    value,
                                    placement: theirs,
                                },
                            );
                        }
                        break;
                    }
                    tries += 1;
                }
            }
        }
    }
    Ok(out)
}

/// Barrier and allreduce among each number of processes in `counts`: nemesis's through
/// messages (and, apart, through the node's blocks), then every peer that runs them.
fn collectives(peers: &[Peer], plan: &Plan, counts: &[usize], out: &mut Round) -> Result<()> {
    let pinned = super::allowed_cpus();
    super::set_cpus(&plan.cpus);
    let r = collectives_unpinned(peers, plan, counts, out);
    super::set_cpus(&pinned);
    r
}

/// [`collectives`], this process and every process it starts free to use the machine's
/// CPUs.
fn collectives_unpinned(peers: &[Peer], plan: &Plan, counts: &[usize], out: &mut Round) -> Result<()> {
    for &procs in counts {
        let ns = super::collectives(procs as u32, plan.coll_iters, 1)?
            .first()
            .map_or([0.0; 6], |r| r.ns);
        // COLL_ROWS: barrier node, barrier messages, allreduce node, allreduce messages.
        let unpinned = |value| Figure {
            value,
            placement: None,
        };
        out.insert((Test::Barrier, procs, NEMESIS.to_string()), unpinned(ns[1]));
        out.insert((Test::Allreduce, procs, NEMESIS.to_string()), unpinned(ns[3]));
        out.insert((Test::Barrier, procs, NEMESIS_NODE.to_string()), unpinned(ns[0]));
        out.insert(
            (Test::Allreduce, procs, NEMESIS_NODE.to_string()),
            unpinned(ns[2]),
        );
        for p in peers {
            let Some(template) = &p.coll else { continue };
            let line = format!(
                "{} coll 0 {} {}",
                template.replace("{procs}", &procs.to_string()),
                plan.coll_iters,
                (plan.coll_iters / 10).max(1)
            );
            for (test, v) in run_coll(&p.name, &line)? {
                out.insert((test, procs, p.name.clone()), unpinned(v));
            }
        }
    }
    Ok(())
}

/// Runs a peer's collectives command line and reads back each collective's ns per call.
fn run_coll(name: &str, line: &str) -> Result<Vec<(Test, f64)>> {
    let o = Command::new("sh")
        .arg("-c")
        .arg(line)
        .output()
        .map_err(|e| MeasureError::Other(format!("peer {name}: cannot run `{line}`: {e}")))?;
    if !o.status.success() {
        return Err(MeasureError::Other(format!(
            "peer {name}: `{line}` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let got: Vec<(Test, f64)> = text
        .lines()
        .filter_map(|l| {
            let test = if l.contains("\"collective\":\"barrier\"") {
                Test::Barrier
            } else if l.contains("\"collective\":\"allreduce\"") {
                Test::Allreduce
            } else {
                return None;
            };
            Some((test, field(l, "ns")?))
        })
        .collect();
    if got.len() != 2 {
        return Err(MeasureError::Other(format!(
            "peer {name}: `{line}` printed {} collectives, not 2: {}",
            got.len(),
            text.trim()
        )));
    }
    Ok(got)
}

/// Runs `peer` in `test`'s mode over `sizes` and reads back its figures.
fn run_peer(peer: &Peer, test: Test, sizes: &[usize], rest: &str) -> Result<Vec<(usize, f64)>> {
    let (mode, key) = test.mode();
    let list = sizes.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let line = format!("{} {mode} {list} {rest}", peer.command);
    let o = Command::new("sh")
        .arg("-c")
        .arg(&line)
        .output()
        .map_err(|e| MeasureError::Other(format!("peer {}: cannot run `{line}`: {e}", peer.name)))?;
    if !o.status.success() {
        return Err(MeasureError::Other(format!(
            "peer {}: `{line}` failed ({}): {}",
            peer.name,
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut got = Vec::new();
    for l in text.lines().filter(|l| l.starts_with('{')) {
        if let (Some(size), Some(v)) = (field(l, "size"), field(l, key)) {
            got.push((size as usize, v));
        }
    }
    if got.len() != sizes.len() {
        return Err(MeasureError::Other(format!(
            "peer {}: `{line}` printed {} figures for {} sizes: {}",
            peer.name,
            got.len(),
            sizes.len(),
            text.trim()
        )));
    }
    Ok(got)
}

/// The number after `"key":` in a flat JSON line.
fn field(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// The median of every figure over the rounds.
pub fn medians(rounds: &[Round]) -> BTreeMap<Key, f64> {
    let mut all: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    for r in rounds {
        for (k, f) in r {
            all.entry(k.clone()).or_default().push(f.value);
        }
    }
    all.into_iter().map(|(k, v)| (k, median(v))).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// nemesis / `peer` at `placement`, taken round by round from the rounds in which both
/// figures were taken there, so that a placement that changed between them cannot pass
/// for a difference between the two: the median ratio and how many rounds gave one.
pub fn matched_ratio(
    rounds: &[Round],
    test: Test,
    size: usize,
    peer: &str,
    placement: Placement,
) -> Option<(f64, usize)> {
    let ours = (test, size, NEMESIS.to_string());
    let theirs = (test, size, peer.to_string());
    let ratios: Vec<f64> = rounds
        .iter()
        .filter_map(|r| {
            let (a, b) = (r.get(&ours)?, r.get(&theirs)?);
            (a.placement == Some(placement) && b.placement == Some(placement)).then(|| a.value / b.value)
        })
        .collect();
    let n = ratios.len();
    (n > 0).then(|| (median(ratios), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_rounds_shrink_for_large_messages_only() {
        assert_eq!(lat_iters(0, 10_000), 10_000);
        assert_eq!(lat_iters(64 << 10, 10_000), 10_000);
        assert_eq!(lat_iters(1 << 20, 10_000), 1024);
        assert_eq!(lat_iters(1 << 30, 10_000), 10, "at least 10");
        assert_eq!(lat_iters(1 << 30, 3), 3, "never more than asked");
    }

    #[test]
    fn streaming_rounds_move_about_256_mib() {
        assert_eq!(stream_windows(8, 64, 2000), 2000, "small messages take all asked");
        assert_eq!(stream_windows(1 << 20, 64, 2000), 4);
        assert_eq!(stream_windows(16 << 20, 64, 200), 1, "at least one window");
        assert_eq!(bw_iters(64 << 10, 64), 64);
    }

    #[test]
    fn fields_of_a_peer_line() {
        let l = r#"{"bench":"latency","size":65536,"p50_ns":1875.5,"samples":100}"#;
        assert_eq!(field(l, "size"), Some(65536.0));
        assert_eq!(field(l, "p50_ns"), Some(1875.5));
        assert_eq!(field(l, "samples"), Some(100.0));
        assert_eq!(field(l, "mb_s"), None);
        assert_eq!(field(r#"{"size":x}"#, "size"), None);
    }

    #[test]
    fn medians_take_the_middle_round() {
        let k = (Test::Rate, 8, NEMESIS.to_string());
        let rounds: Vec<Round> = [3.0, 1.0, 2.0]
            .iter()
            .map(|&value| {
                Round::from([(
                    k.clone(),
                    Figure {
                        value,
                        placement: None,
                    },
                )])
            })
            .collect();
        assert_eq!(medians(&rounds)[&k], 2.0);
        assert_eq!(bw_iters(16 << 20, 64), 1);
        assert_eq!(bw_iters(1, 64), 200);
    }

    #[test]
    fn a_figure_across_a_move_has_no_placement() {
        assert_eq!(Placement::between(40.0, 45.0), Some(Placement::Near));
        assert_eq!(Placement::between(190.0, 210.0), Some(Placement::Far));
        assert_eq!(Placement::between(40.0, 200.0), None);
        assert_eq!(Placement::between(200.0, 40.0), None);
    }

    #[test]
    fn ratios_are_matched_round_by_round_at_one_placement() {
        use Placement::{Far, Near};
        let fig = |value, placement| Figure { value, placement };
        let round = |ours: Figure, theirs: Figure| {
            Round::from([
                ((Test::Bandwidth, 4096, NEMESIS.to_string()), ours),
                ((Test::Bandwidth, 4096, "mpi".to_string()), theirs),
            ])
        };
        let rounds = [
            // Both near: 0.5.
            round(fig(10.0, Some(Near)), fig(20.0, Some(Near))),
            // Ours near and theirs far: no ratio at either placement.
            round(fig(30.0, Some(Near)), fig(5.0, Some(Far))),
            // Both near: 2.0.
            round(fig(40.0, Some(Near)), fig(20.0, Some(Near))),
            // Both near: 1.0.
            round(fig(20.0, Some(Near)), fig(20.0, Some(Near))),
            // Both far: 1.5; and one that moved, which counts nowhere.
            round(fig(3.0, Some(Far)), fig(2.0, Some(Far))),
            round(fig(3.0, None), fig(1.0, Some(Far))),
        ];
        assert_eq!(
            matched_ratio(&rounds, Test::Bandwidth, 4096, "mpi", Near),
            Some((1.0, 3))
        );
        assert_eq!(
            matched_ratio(&rounds, Test::Bandwidth, 4096, "mpi", Far),
            Some((1.5, 1))
        );
        assert_eq!(matched_ratio(&rounds, Test::Bandwidth, 4096, "other", Near), None);
        assert_eq!(matched_ratio(&rounds, Test::Latency, 4096, "mpi", Near), None);
    }

    #[test]
    fn a_peer_figure_is_taken_again_until_its_placement_matches() {
        use Placement::{Far, Near};
        assert!(peer_figure_stands(Some(Near), Some(Near), 0, 2));
        assert!(!peer_figure_stands(Some(Near), Some(Far), 0, 2));
        assert!(!peer_figure_stands(Some(Far), None, 1, 2));
        assert!(peer_figure_stands(Some(Far), None, 2, 2), "the retries ran out");
        assert!(
            peer_figure_stands(None, Some(Far), 0, 2),
            "nemesis's placement unknown"
        );
        assert!(peer_figure_stands(Some(Near), Some(Far), 0, 0), "no retries");
    }
}
