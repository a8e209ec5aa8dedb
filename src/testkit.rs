//! What the unit tests of several modules share: worlds that are threads of this
//! process, on one anonymous segment.

use crate::channel::{Channel, NemesisChannel, ShmChannel, WaitPolicy};
use crate::p2p::{Config, World};
use nemesis_lmt::Strategy;
use nemesis_shm::{Geometry, Segment};
use std::sync::Arc;
use std::time::Duration;

/// Runs `f(world)` as each of `n` ranks, each on its own thread; returns their results.
pub(crate) fn job<T: Send + 'static>(n: u32, f: impl Fn(World) -> T + Send + Sync + 'static) -> Vec<T> {
    job_with(n, Geometry::default(), |_| {}, f)
}

/// As [`job`], with the tunables changed by `tweak`.
pub(crate) fn job_with<T: Send + 'static>(
    n: u32,
    geo: Geometry,
    tweak: impl Fn(&mut Config) + Send + Sync + 'static,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_full(n, geo, None, None, tweak, f)
}

/// As [`job`], with every large message moved by strategy `force`.
pub(crate) fn job_forced<T: Send + 'static>(
    n: u32,
    force: Strategy,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_full(n, Geometry::default(), Some(force), None, |_| {}, f)
}

/// As [`job`], with copy rings of the shape `ring`.
pub(crate) fn job_ring<T: Send + 'static>(
    n: u32,
    ring: nemesis_shm::ring::RingGeometry,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_full(n, Geometry::default(), None, Some(ring), |_| {}, f)
}

pub(crate) fn job_full<T: Send + 'static>(
    n: u32,
    geo: Geometry,
    force: Option<Strategy>,
    ring: Option<nemesis_shm::ring::RingGeometry>,
    tweak: impl Fn(&mut Config) + Send + Sync + 'static,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let tweak = Arc::new(tweak);
    let seg = Arc::new(Segment::anonymous(n, geo).unwrap());
    let ranks: Vec<u32> = (0..n).collect();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (seg, ranks, f, tweak) = (seg.clone(), ranks.clone(), f.clone(), tweak.clone());
            std::thread::spawn(move || {
                let policy = WaitPolicy {
                    spin: 200,
                    yields: 50,
                    slice: Duration::from_millis(20),
                };
                let mut ch = ShmChannel::from_segment(seg, r, n, &ranks, r, policy).unwrap();
                if force.is_some() || ring.is_some() {
                    let lmt = ch.local_lmt();
                    let old = lmt.policy();
                    let p = nemesis_lmt::Policy {
                        force,
                        ring: ring.unwrap_or(old.ring),
                        ..old
                    };
                    lmt.set_policy(p).unwrap();
                }
                let mut cfg = Config::from_lookup(ch.max_payload(), |_| None).unwrap();
                if force.is_some() {
                    // The strategy moves every message above the eager limit.
                    cfg.medium_limit = 0;
                }
                tweak(&mut cfg);
                f(World::with_config(NemesisChannel::with_netmod(ch, None), cfg).unwrap())
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

pub(crate) fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
        .collect()
}
