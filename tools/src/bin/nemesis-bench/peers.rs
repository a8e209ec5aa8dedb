//! `nemesis-bench peers`: two-sided nemesis beside MPI peers, interleaved round by
//! round, with nemesis/peer ratios.

use super::{Json, SizeList, median, pinning, placement, progress, progress_done, size_list, transport};
use anyhow::Result;
use clap::Args;
use nemesis_tools::measure::{self, Pair, Transport};

#[derive(Args, Debug, Clone)]
pub(crate) struct PeersArgs {
    /// A peer: NAME=COMMAND, where COMMAND starts two ranks of scripts/peers/osu_peer.c
    /// built with that MPI (for example "mpich=mpiexec.mpich -n 2 -bind-to core
    /// ./osu_peer"). The mode and its arguments are appended. Give it once per peer.
    #[arg(long = "peer", value_parser = peer_arg, required = true)]
    pub(crate) peers: Vec<measure::peers::Peer>,
    /// Latency sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "8,64,1K,4K,16K,64K")]
    pub(crate) lat_sizes: SizeList,
    /// Bandwidth sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "4K,64K,1M,4M,16M")]
    pub(crate) bw_sizes: SizeList,
    /// Message rate sizes, or "none".
    #[arg(long, value_parser = size_list, default_value = "8,64")]
    pub(crate) rate_sizes: SizeList,
    /// Most round trips per latency size and round, for nemesis and the peers alike;
    /// fewer for large messages, so that a round moves about 1 GiB each way (at least 10).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) lat_iters: u64,
    /// Messages per window of the streaming tests.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window: u64,
    /// Timed windows of the message rate per round.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) rate_iters: u64,
    /// Rounds; the median of each figure is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin nemesis's two processes to CPUs (the peers' commands pin their own).
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// What carries nemesis's messages: shm, or tcp or udp on loopback with shared
    /// memory turned off (give the peers their own network transport to compare).
    #[arg(long, value_parser = transport, default_value = "shm")]
    pub(crate) transport: Transport,
    /// The collectives of a peer given by --peer: NAME=COMMAND, where COMMAND starts
    /// `{procs}` ranks of osu_peer (unbound: they outnumber the CPUs), for example
    /// "openmpi=mpiexec.openmpi --oversubscribe --bind-to none -n {procs} ./osu_peer".
    #[arg(long = "peer-coll", value_parser = peer_arg)]
    pub(crate) peer_coll: Vec<measure::peers::Peer>,
    /// Process counts of the barrier and allreduce (through messages), or "none".
    #[arg(long, value_parser = size_list, default_value = "4,8")]
    pub(crate) coll_procs: SizeList,
    /// Calls per collective, process count and round.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) coll_iters: u64,
    /// How many more times to take a figure whose CPUs moved while it was taken
    /// (nemesis's), or that was not taken at the placement nemesis's was (a peer's), so
    /// that more rounds give a near or far ratio. 0 takes each once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..10))]
    pub(crate) retries: u32,
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

pub(crate) fn peers(a: &PeersArgs, json: bool) -> Result<()> {
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
        outln!(
            "# two-sided nemesis over {} beside MPI peers on {cpu}, {pinned}, {} rounds interleaved",
            a.transport.name(),
            a.rounds
        );
        outln!(
            "# placement probe {probe_ns:.0} ns one way (median; {near} of {} rounds near)",
            probe.len()
        );
        outln!(
            "# latency: p50 one way, lower is better; bw (osu_bw, one receive buffer) and msgrate: higher is better"
        );
        outln!(
            "# barrier, allreduce (8 B): ns per call through messages, size = processes on these cpus, lower is better;"
        );
        outln!("#   node: nemesis's through the node's shared blocks instead, for reference");
        outln!("# ratio: nemesis / peer, of the medians over all rounds;");
        outln!("#   near, far: the median of nemesis / peer over the rounds in which both figures were");
        outln!("#   taken at that placement (probed before and after each), and in how many (\"0.85 3\")");
        out!("# {:>7} {:>9} {:>7} {:>12}", "test", "size", "unit", "nemesis");
        for n in &names {
            out!(" {:>12} {:>7} {:>9} {:>9}", n, "ratio", "near", "far");
        }
        outln!();
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
                out!("{:>9} {:>9} {:>7} {:>12.1}", test.name(), size, test.unit(), ours);
                for n in &names {
                    match med.get(&(*test, size, n.to_string())) {
                        Some(&theirs) => {
                            out!(" {theirs:>12.1} {:>7.2}", ours / theirs);
                            for at in [p::Placement::Near, p::Placement::Far] {
                                match p::matched_ratio(&rounds, *test, size, n, at) {
                                    Some((r, k)) => out!(" {:>9}", format!("{r:.2} {k}")),
                                    None => out!(" {:>9}", "-"),
                                }
                            }
                        }
                        None => out!(" {:>12} {:>7} {:>9} {:>9}", "-", "-", "-", "-"),
                    }
                }
                if let Some(v) = node {
                    out!("  node {v:.1}");
                }
                outln!();
            }
        }
    }
    Ok(())
}
