//! Cross-process ping-pong through the channel, for 0 B to 4 KiB.
//!
//! The partner is this bench executable started again, and the two are pinned to two
//! CPUs when there are two. Reported times are one way: half the round trip.

use criterion::{BenchmarkId, Criterion, Throughput};
use nemesis_tools::measure::{self, Pair};
use std::time::Duration;

fn latency(c: &mut Criterion, pair: &mut Pair) {
    let mut g = c.benchmark_group("channel_one_way");
    for size in [0usize, 8, 64, 256, 1024, 4096] {
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|iters| pair.round_trips(size, iters).expect("ping-pong failed") / 2);
        });
    }
    g.finish();
}

fn main() {
    measure::serve_if_partner();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let mut pair = Pair::start(true).expect("starting the partner process");
    latency(&mut c, &mut pair);
    pair.finish().expect("stopping the partner process");
    c.final_summary();
}
