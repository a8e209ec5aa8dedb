//! `nemesis-bench bw` and `msgrate`: windows of messages streamed and acknowledged,
//! counted in bytes or in messages.

use super::{
    Json, LayerArg, Ratio, median, pinning, placement, progress, progress_done, size, tend_others, transport,
};
use anyhow::Result;
use clap::Args;
use nemesis::Channel as _;
use nemesis_tools::measure::{self, Pair, StreamPhases, StreamPlan, Transport};

#[derive(Args, Debug, Clone)]
pub(crate) struct StreamArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "64,1K,4K,16K,64K")]
    pub(crate) sizes: Vec<usize>,
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window: u64,
    /// Timed windows per round.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,
    /// Untimed windows before each round.
    #[arg(long, default_value_t = 20)]
    pub(crate) warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct BwArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size,
          default_value = "1K,4K,16K,64K,256K,1M,4M,16M,64M")]
    pub(crate) sizes: Vec<usize>,
    /// Large-message strategies to compare, interleaved round by round: auto, chunks,
    /// cma, cma-put, cma-split, ring, vmsplice (within the node), rdma (between nodes, where the
    /// netmod has RDMA), as NEMESIS_LMT. Ignored with --layer channel.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub(crate) lmt: Vec<String>,
    /// Messages per window.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window: u64,
    /// Most timed windows per round; fewer for large messages, so that a round moves
    /// about 256 MiB, but never fewer than one window (one window of 64 messages of
    /// 16 MiB is 1 GiB).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,
    /// Most untimed windows before each round.
    #[arg(long, default_value_t = 10)]
    pub(crate) warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// What to measure: two-sided messaging (with its large-message transfer), or raw
    /// packets through the channel (messages above one packet go as several).
    #[arg(long, value_enum, default_value = "p2p")]
    pub(crate) layer: LayerArg,
    /// Transports to compare, one pair of processes each, interleaved round by round:
    /// shm, tcp, udp, ud, rc (the network ones with shared memory turned off; tcp and
    /// udp on loopback; ud and rc on the verbs device, in a build with the `verbs`
    /// feature).
    #[arg(long, value_delimiter = ',', value_parser = transport, default_value = "shm")]
    pub(crate) transport: Vec<Transport>,
    /// One receive buffer, as osu_bw's receiver has, instead of one per message of the
    /// window: the window's receives are all posted into it (`Scope::irecv_raw`). Named
    /// "recv_buffers" in the JSON.
    #[arg(long)]
    pub(crate) osu: bool,
    /// What the messages are sent from and received into, compared round by round:
    /// heap (ordinary memory, registered for RDMA per message) or pinned
    /// (nemesis::Pinned buffers, whose registrations are kept). Named "buffers" in the
    /// JSON.
    #[arg(long, value_delimiter = ',', value_parser = buf_kind, default_value = "heap")]
    pub(crate) buffers: Vec<measure::BufKind>,
    /// Receive buffers this many bytes past a page boundary (0 to 4095; heap buffers
    /// only), where the send buffer starts on one, as osu_bw's both do. A large buffer
    /// from malloc starts 16 bytes in: copies whose destination is a few bytes ahead of
    /// the source within a page can be many times slower on some CPUs (CMA's on AMD Zen
    /// 3). Named "recv_skew" in the JSON.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..4096))]
    pub(crate) recv_skew: u16,
}

fn buf_kind(s: &str) -> Result<measure::BufKind, String> {
    match s.trim() {
        "heap" => Ok(measure::BufKind::Heap),
        "pinned" => Ok(measure::BufKind::Pinned),
        other => Err(format!("{other:?}: expected heap or pinned")),
    }
}

/// Bytes the memcpy figure beside a bandwidth round moves, as much as the round
/// ([`measure::peers::stream_windows`]).
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
        stream_own_copies,
    } = c;
    to.paired += paired;
    to.paired_short += paired_short;
    to.paired_long += paired_long;
    to.medium_packets += medium_packets;
    to.rendezvous += rendezvous;
    to.stream_rendezvous += stream_rendezvous;
    to.stream_packets += stream_packets;
    to.stream_own_copies += stream_own_copies;
}

/// What a stream of `size`-byte messages went by, from its sender's counts (`sent`):
/// `eager`, `medium` (runs of packets or the pair buffer), the rendezvous `strategy`,
/// or `medium+` the strategy where it took both (a stream's way chosen by time, or
/// packets while the cells had room). A rendezvous that offered only own copies
/// (`SendCounts::stream_own_copies`) is `ring+chunks`, and `+ring` after the strategy
/// where only some did. A strategy forced (not `auto`) is named.
fn used_by(
    size: usize,
    eager: usize,
    medium: usize,
    auto: bool,
    sent: nemesis::SendCounts,
    strategy: &str,
) -> String {
    let packets = sent.medium_packets + sent.paired;
    let strategy = match sent.stream_own_copies {
        0 => strategy.to_string(),
        n if n == sent.rendezvous => "ring+chunks".into(),
        _ => format!("{strategy}+ring"),
    };
    let strategy = strategy.as_str();
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

pub(crate) fn bandwidth_p2p(pairs: &mut [Pair], a: &BwArgs, json: bool) -> Result<()> {
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
        outln!(
            "# nemesis two-sided bandwidth in MB/s (10^6 bytes/s), window of {} non-blocking sends, {}",
            a.window,
            pinning(&pairs[0])
        );
        if a.osu {
            outln!("# receiver: one buffer, the window's receives all posted into it (osu_bw's shape)");
        } else {
            outln!("# receiver: the window pre-posted into distinct buffers (--osu: one buffer)");
        }
        if a.recv_skew != 0 {
            let slow = if nemesis::lmt::cma::skew_slows_kernel_copies() {
                "slow"
            } else {
                "not slow"
            };
            outln!(
                "# receive buffers {} bytes past a page boundary, send buffers on one; this CPU's kernel copies are {slow} so",
                a.recv_skew
            );
        }
        outln!(
            "# used: what the sender's messages went by: eager, medium (runs of packets or the pair buffer), the rendezvous strategy, or medium+ it for some of each"
        );
        outln!("# memcpy: one thread copying the same size between two reused buffers, same run");
        outln!("# probe: the cache-line ping-pong of the same pair (near: the CPUs share a cache)");
        if net {
            outln!(
                "# tcp: the same windows over a plain blocking TCP socket on loopback, same pair; /tcp = MB/s / tcp"
            );
            outln!(
                "# the network transports move large messages in chunks, or by RDMA read where the netmod has it (rc, ud); of --lmt they take auto, chunks and rdma"
            );
        }
        out!(
            "# {:>7} {:>9} {:>9} {:>16} {:>7} {:>10} {:>12} {:>6} {:>9}",
            "size",
            "transport",
            "lmt",
            "used",
            "buffers",
            "MB/s",
            "memcpy MB/s",
            "ratio",
            "probe ns"
        );
        if net {
            out!(" {:>10} {:>6}", "tcp MB/s", "/tcp");
        }
        outln!("  placement");
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
        let iters = measure::peers::stream_windows(size, a.window, a.iters);
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
                        .u("sent_stream_own_copies", sent[k][i].stream_own_copies)
                        .u("sent_rendezvous", sent[k][i].rendezvous);
                    if let Some(tcp) = tcp {
                        row = row.f("tcp_mb_s", tcp).f("tcp_ratio", mb / tcp);
                    }
                    row.print();
                } else {
                    out!(
                        "{size:>9} {transport:>9} {name:>9} {used:>16} {:>7} {mb:>10.0} {memcpy:>12.0} {:>6.2} {probe_ns:>9.0}",
                        bufs.name(),
                        Ratio(mb / memcpy)
                    );
                    match tcp {
                        Some(tcp) => out!(" {tcp:>10.0} {:>6.2}", mb / tcp),
                        None if net => out!(" {:>10} {:>6}", "-", "-"),
                        None => {}
                    }
                    outln!("  {}", placement(probe_ns));
                }
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub(crate) struct RateArgs {
    /// Message sizes.
    #[arg(long, value_delimiter = ',', value_parser = size, default_value = "0,8,64")]
    pub(crate) sizes: Vec<usize>,
    /// What to measure: two-sided isend/irecv/waitall (with the channel's own rate beside
    /// it, interleaved round by round), or raw packets through the channel.
    #[arg(long, value_enum, default_value = "p2p")]
    pub(crate) layer: LayerArg,
    /// Also time each step of a two-sided window on both sides (the sender's isends,
    /// its waitall and its wait for the acknowledgement; the receiver's irecvs, its
    /// waitall and the acknowledgement), per window, the median over each round's
    /// windows and then over the rounds. It adds a few clock reads to every window, so
    /// the rates printed beside them are taken with them.
    #[arg(long)]
    pub(crate) phases: bool,
    #[command(flatten)]
    pub(crate) rest: RateRest,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct RateRest {
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window: u64,
    /// Most timed windows per round; fewer above 2 KiB, so that a round moves about
    /// 256 MiB, as in bw (a message rate is for small messages).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,
    /// Most untimed windows before each round, and no more than the timed ones.
    #[arg(long, default_value_t = 100)]
    pub(crate) warmup: u64,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rounds: u32,
    /// Do not pin the two processes to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
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

pub(crate) fn bandwidth(pair: &mut Pair, a: &StreamArgs, json: bool) -> Result<()> {
    if !json {
        outln!(
            "# nemesis channel bandwidth (window of {} messages), {}",
            a.window,
            pinning(pair)
        );
        outln!("# {:>7} {:>10}", "size", "MB/s");
    }
    for &size in &a.sizes {
        // Large sizes get fewer windows, so a round moves about 256 MiB.
        let iters = measure::peers::stream_windows(size, a.window, a.iters);
        let s = stream_median(pair, "bw", size, a.window, iters, a.warmup.min(iters), a.rounds)?;
        let bytes = (size as u64 * a.window * iters) as f64;
        let mb = bytes / s / 1e6;
        if json {
            Json::row("bw", "channel", pair.transport().name(), size)
                .f("mb_s", mb)
                .u("window", a.window)
                .print();
        } else {
            outln!("{size:>9} {mb:>10.0}");
        }
    }
    Ok(())
}

/// Each step's median over the rounds.
fn phase_medians(rounds: &[StreamPhases]) -> StreamPhases {
    let m = |f: fn(&StreamPhases) -> f64| median(rounds.iter().map(f).collect());
    StreamPhases {
        send_isends_ns: m(|p| p.send_isends_ns),
        send_waitall_ns: m(|p| p.send_waitall_ns),
        send_ack_wait_ns: m(|p| p.send_ack_wait_ns),
        recv_irecvs_ns: m(|p| p.recv_irecvs_ns),
        recv_waitall_ns: m(|p| p.recv_waitall_ns),
        recv_ack_ns: m(|p| p.recv_ack_ns),
    }
}

pub(crate) fn msgrate(pair: &mut Pair, a: &RateArgs, json: bool) -> Result<()> {
    let r = &a.rest;
    let p2p = a.layer == LayerArg::P2p;
    if !json {
        outln!(
            "# nemesis {} message rate in messages/s, window of {} messages, {}",
            a.layer.name(),
            r.window,
            pinning(pair)
        );
        if p2p {
            outln!("# two-sided: isend x window, the receiver's irecvs pre-posted, waitall on both sides");
            outln!("# channel: raw packets of the same size through the channel underneath, interleaved");
            outln!(
                "# {:>7} {:>14} {:>14} {:>7} {:>9}  placement",
                "size",
                "p2p msgs/s",
                "channel msgs/s",
                "/chan",
                "probe ns"
            );
        } else {
            outln!("# {:>7} {:>14} {:>9}  placement", "size", "msgs/s", "probe ns");
        }
    }
    let clock = pair.clock();
    for &size in &a.sizes {
        let (mut p2p_secs, mut chan_secs, mut probe) = (Vec::new(), Vec::new(), Vec::new());
        let mut steps: Vec<StreamPhases> = Vec::new();
        let iters = measure::peers::stream_windows(size, r.window, r.iters);
        let warmup = r.warmup.min(iters);
        for round in 0..r.rounds {
            progress(&format!("msgrate {size} B: round {}/{}", round + 1, r.rounds));
            let mut rtt = Vec::new();
            pair.probe(2_000, 200, &mut rtt)?;
            probe.push(median(rtt.iter().map(|&t| clock.ns(t) / 2.0).collect()));
            if p2p {
                let plan = StreamPlan {
                    phases: a.phases,
                    ..StreamPlan::new(size, r.window, iters, warmup)
                };
                p2p_secs.push(pair.stream_p2p(plan)?);
                steps.extend(pair.last_phases());
            }
            chan_secs.push(pair.stream(size, r.window, iters, warmup)?);
        }
        progress_done();
        let msgs = (r.window * iters) as f64;
        let chan = msgs / median(chan_secs);
        let probe_ns = median(probe);
        if p2p {
            let rate = msgs / median(p2p_secs);
            let phases = (!steps.is_empty()).then(|| phase_medians(&steps));
            if json {
                let mut row = Json::row("msgrate", "p2p", pair.transport().name(), size)
                    .f("msgs_per_s", rate)
                    .f("channel_msgs_per_s", chan)
                    .f("channel_ratio", rate / chan)
                    .f("probe_ns", probe_ns)
                    .s("placement", placement(probe_ns))
                    .u("window", r.window);
                for (key, ns) in phases.iter().flat_map(StreamPhases::named) {
                    row = row.f(key, ns);
                }
                row.print();
            } else {
                outln!(
                    "{size:>9} {rate:>14.0} {chan:>14.0} {:>7.2} {probe_ns:>9.0}  {}",
                    rate / chan,
                    placement(probe_ns)
                );
                if let Some(p) = phases {
                    outln!(
                        "#   per window, ns: sender isends {:.0}, waitall {:.0}, ack wait {:.0}; \
                         receiver irecvs {:.0}, waitall {:.0}, ack {:.0}",
                        p.send_isends_ns,
                        p.send_waitall_ns,
                        p.send_ack_wait_ns,
                        p.recv_irecvs_ns,
                        p.recv_waitall_ns,
                        p.recv_ack_ns
                    );
                }
            }
        } else if json {
            Json::row("msgrate", "channel", pair.transport().name(), size)
                .f("msgs_per_s", chan)
                .f("probe_ns", probe_ns)
                .s("placement", placement(probe_ns))
                .u("window", r.window)
                .print();
        } else {
            outln!("{size:>9} {chan:>14.0} {probe_ns:>9.0}  {}", placement(probe_ns));
        }
    }
    Ok(())
}
