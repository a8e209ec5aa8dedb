//! `nemesis-bench latency`: one-way latency by ping-pong, beside the placement probe,
//! the floor and, through `World`, the channel underneath.

use super::{Json, LayerArg, pinning, placement, progress, progress_done, size, tend_others, transport};
use anyhow::{Context, Result};
use clap::Args;
use nemesis_tools::measure::{self, Pair, Summary, Transport};

#[derive(Args, Debug, Clone)]
pub(crate) struct LatencyArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64,256,1K,4K")]
    pub(crate) sizes: Vec<usize>,
    /// Most timed round trips per round, for each of the channel and the probe; fewer
    /// for large messages, so that a round moves about 1 GiB each way, but at least 10
    /// (osu_latency, too, takes fewer of its large sizes).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,
    /// Most untimed round trips before each round, and no more than the timed ones.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) warmup: u64,
    /// Rounds, alternating probe and channel.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// What to measure: the channel, or two-sided send and recv on top of it.
    #[arg(long, value_enum, default_value = "channel")]
    pub(crate) layer: LayerArg,
    /// Transports to compare, one pair of processes each, interleaved round by round:
    /// shm, tcp, udp, ud, rc (the network ones with shared memory turned off; tcp and
    /// udp on loopback; ud and rc on the verbs device, in a build with the `verbs`
    /// feature).
    #[arg(long, value_delimiter = ',', value_parser = transport, default_value = "shm")]
    pub(crate) transport: Vec<Transport>,
    /// With --layer p2p: receive buffers this many bytes past a page boundary (0 to
    /// 4095) on both sides, sends from one (each side echoes from its receive buffer),
    /// as a large buffer from malloc starts 16 bytes in. Named "recv_skew" in the JSON.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    pub(crate) recv_skew: u16,
}

pub(crate) fn latency(pairs: &mut [Pair], a: &LatencyArgs, json: bool) -> Result<()> {
    let p2p = a.layer == LayerArg::P2p;
    if a.recv_skew != 0 && !p2p {
        anyhow::bail!("--recv-skew: the channel's ping-pong has no receive buffer to place; use --layer p2p");
    }
    for p in pairs.iter_mut() {
        p.set_recv_skew(usize::from(a.recv_skew))?;
    }
    let net = pairs.iter().any(|p| p.transport() != Transport::Shm);
    if !json {
        outln!(
            "# nemesis {} latency, one way (half the round trip), {}",
            a.layer.name(),
            pinning(&pairs[0])
        );
        outln!("# probe: one cache line written by both processes in turn (the placement probe)");
        outln!("# floor: one line per direction, each written by one side (what a fastbox costs at best)");
        if p2p {
            outln!(
                "# channel: the same ping-pong through the channel underneath, a message above its \
                 largest packet as packets of that size; /chan = p2p / channel"
            );
        }
        if net {
            outln!(
                "# tcp: a plain TCP ping-pong on loopback between the same two processes (at least \
                 1 byte), blocking in read; /tcp = p50 / tcp"
            );
            outln!("# spin: the same with both sides polling a non-blocking socket, as the netmods do");
        }
        if a.recv_skew != 0 {
            outln!(
                "# receive buffers {} bytes past a page boundary, each side echoing from its own",
                a.recv_skew
            );
        }
        outln!("# all measured by the same two processes, interleaved round by round");
        out!(
            "# {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            "size",
            "transport",
            "p50 ns",
            "p99 ns",
            "mean ns",
            "probe ns",
            "floor ns",
            "ratio",
            "/floor"
        );
        if p2p {
            out!(" {:>9} {:>6}", "chan ns", "/chan");
        }
        if net {
            out!(" {:>9} {:>6} {:>9} {:>6}", "tcp ns", "/tcp", "spin ns", "/spin");
        }
        outln!("  placement");
    }
    for &size in &a.sizes {
        let iters = measure::peers::lat_iters(size, a.iters);
        let warmup = a.warmup.min(iters);
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
                out!(
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
                    Some(ch) => out!(" {:>9.1} {:>6.2}", ch.p50, c.p50 / ch.p50),
                    None if p2p => out!(" {:>9} {:>6}", "-", "-"),
                    None => {}
                }
                match (tc, sp) {
                    (Some(tc), Some(sp)) => out!(
                        " {:>9.1} {:>6.2} {:>9.1} {:>6.2}",
                        tc.p50,
                        c.p50 / tc.p50,
                        sp.p50,
                        c.p50 / sp.p50
                    ),
                    _ if net => out!(" {:>9} {:>6} {:>9} {:>6}", "-", "-", "-", "-"),
                    _ => {}
                }
                outln!("  {}", placement(p.p50));
            }
        }
    }
    Ok(())
}
