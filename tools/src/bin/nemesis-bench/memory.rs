//! `nemesis-bench memory`: the shared segment's size for a number of processes, and
//! the network layers' heap per peer.

use super::{Json, progress, progress_done};
use anyhow::Result;
use clap::Args;
use nemesis::shm::{Geometry, Segment};
use nemesis_tools::measure::{self};

#[derive(Args, Debug, Clone)]
pub(crate) struct MemoryArgs {
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32,64,128",
          value_parser = clap::value_parser!(u32).range(1..=nemesis::shm::config::MAX_LOCAL_PROCS as i64))]
    pub(crate) procs: Vec<u32>,
    /// Peer counts for the udp layer's heap per peer, measured in the simulator; "none"
    /// (or empty) to skip it.
    #[arg(long, default_value = "2,64", value_parser = udp_peer_list)]
    pub(crate) udp_peers: CountList,
    /// Rounds of messages the measured udp endpoint exchanges with each peer.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) udp_rounds: u32,
    /// Peer counts for the ud netmod's memory per peer, measured on the verbs device
    /// (every netmod in this process; needs the `verbs` feature and a device); empty to
    /// skip it.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) ud_peers: Vec<u32>,
    /// The same for the rc netmod.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) rc_peers: Vec<u32>,
}

/// A comma-separated list of counts that may be empty ("none" or "").
#[derive(Debug, Clone)]
pub(crate) struct CountList(Vec<u32>);

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

pub(crate) fn memory(a: &MemoryArgs, json: bool) -> Result<()> {
    let geo = Geometry::from_env()?;
    if !json {
        outln!(
            "# shared segment size: {} cells per process ({}), fastboxes of {} B in a ring per ordered pair, \
             a buffer per unordered pair for medium messages",
            geo.cells_per_proc,
            if geo.cell_size == nemesis::shm::config::CELL_AUTO {
                "cell size by the number of processes".to_string()
            } else {
                format!("{} B each", geo.cell_size)
            },
            geo.fbox_size
        );
        outln!(
            "# {:>5} {:>14} {:>11} {:>16} {:>8} {:>12} {:>12}",
            "procs",
            "segment",
            "MiB",
            "per process",
            "cell",
            "fbox slots",
            "pair buffer"
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
                    geo.cells_per_proc as u64 * resolved.cell_size as u64,
                )
                .u("cell_size", u64::from(resolved.cell_size))
                .u("fastbox_slots", u64::from(resolved.fbox_slots))
                .u("fastbox_bytes_per_pair", pair_bytes)
                .u("pair_buffer_bytes", u64::from(resolved.pair_size))
                .print();
        } else {
            outln!(
                "{n:>7} {bytes:>14} {:>11.1} {:>16} {:>8} {:>12} {:>12}",
                bytes as f64 / 1048576.0,
                bytes / n as u64,
                resolved.cell_size,
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
        outln!();
        outln!(
            "# verbs netmods on the device: one netmod exchanges {} rounds of 100- and",
            a.udp_rounds
        );
        outln!("# 20000-byte (rc: 8168-byte) messages with each peer, all in this process, then is dropped;");
        outln!(
            "# per peer: what it gives back less an idle netmod's, Rust heap and the verbs library's C heap"
        );
        outln!(
            "# {:>7} {:>5} {:>12} {:>14} {:>16}",
            "netmod",
            "peers",
            "idle B",
            "per peer B",
            "per peer C B"
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
            outln!(
                "{:>9} {:>5} {:>12} {:>14.1} {:>16.1}",
                m.netmod,
                m.peers,
                m.idle_bytes,
                m.per_peer_bytes,
                m.per_peer_c_bytes
            );
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
        outln!();
        outln!(
            "# udp reliability layer, in the simulator: one endpoint exchanges {} rounds of {:?}-byte",
            a.udp_rounds,
            measure::UDP_MEMORY_SIZES
        );
        outln!("# messages with each peer, then everything is acknowledged and the endpoint is dropped;");
        outln!(
            "# the heap it gives back is its size. idle: an endpoint of the same job that talked to no one"
        );
        outln!(
            "# {:>5} {:>14} {:>12} {:>14}",
            "peers",
            "endpoint B",
            "idle B",
            "per peer B"
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
            outln!(
                "{:>7} {:>14} {:>12} {:>14.1}",
                m.peers,
                m.endpoint_bytes,
                m.idle_bytes,
                m.per_peer_bytes
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
