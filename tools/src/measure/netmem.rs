//! How much memory the reliable datagram layer keeps per peer, measured in the
//! simulator: one endpoint talks to many, then is dropped, and the heap it gives back
//! is its footprint.
//!
//! The caller supplies the allocator's count of live bytes (a binary wraps the global
//! allocator); nothing here estimates sizes from types.

use super::{MeasureError, Result};
use nemesis::net::Envelope;
use nemesis::net::reliable::{Reliable, ReliableConfig};
use nemesis::net::sim::{SimConfig, SimNet, SimSocket};
use std::time::Duration;

/// Bytes of each message the measured endpoint sends: one that fits a datagram and one
/// of many segments.
pub const UDP_MEMORY_SIZES: [usize; 2] = [100, 20_000];

/// What one endpoint of a job of `peers + 1` ranks holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdpMemory {
    /// Peers it talked to.
    pub peers: u32,
    /// Messages it exchanged with each (both ways together).
    pub messages_per_peer: u64,
    /// Heap of the endpoint once everything was acknowledged.
    pub endpoint_bytes: usize,
    /// Heap of an endpoint of the same job that has talked to no one.
    pub idle_bytes: usize,
    /// What each peer it talked to adds: `(endpoint - idle) / peers`.
    pub per_peer_bytes: f64,
}

type Endpoint = Reliable<SimSocket>;

fn endpoint(net: &SimNet, rank: u32, size: u32) -> Result<Endpoint> {
    let cfg = ReliableConfig {
        timeout: Duration::from_secs(60),
        ..ReliableConfig::default()
    };
    Reliable::new(
        net.socket(rank),
        rank,
        size,
        nemesis::net::auth::JobKey::from_bytes([0x6e; 32]),
        cfg,
        Box::new(Ok),
    )
    .map_err(|e| MeasureError::Other(format!("simulated endpoint {rank}: {e}")))
}

/// Rank 0 of a job of `peers + 1` sends `rounds` rounds of [`UDP_MEMORY_SIZES`] messages
/// to every other rank, each echoes them back, and once everything is acknowledged rank
/// 0's endpoint is weighed by dropping it. `live` is the allocator's count of live bytes.
pub fn udp_memory(peers: u32, rounds: u32, live: &dyn Fn() -> usize) -> Result<UdpMemory> {
    if peers == 0 {
        return Err(MeasureError::Other("the endpoint needs at least one peer".into()));
    }
    let size = peers + 1;
    let net = SimNet::new(SimConfig::default());
    let mut others = (1..size)
        .map(|r| endpoint(&net, r, size))
        .collect::<Result<Vec<_>>>()?;

    // An endpoint of the same job that talks to no one.
    let before = live();
    let idle = endpoint(&net, 0, size)?;
    let idle_bytes = live().saturating_sub(before);
    drop(idle);

    let mut me = endpoint(&net, 0, size)?;
    let per_peer = rounds as u64 * UDP_MEMORY_SIZES.len() as u64;
    let want = per_peer * peers as u64;
    let payload = vec![0x5au8; UDP_MEMORY_SIZES[1]];
    let fail = |e: nemesis::net::NetError| MeasureError::Other(format!("simulated exchange: {e}"));
    // Messages still to send: ours, and each peer's echoes.
    let mut mine: Vec<(u32, usize)> = (0..rounds)
        .flat_map(|_| (1..size).flat_map(|p| UDP_MEMORY_SIZES.map(|s| (p, s))))
        .collect();
    mine.reverse();
    let mut echoes: Vec<Vec<(Envelope, usize)>> = vec![Vec::new(); peers as usize];
    let mut back = 0u64;
    let mut steps = 0u64;
    loop {
        while let Some(&(p, len)) = mine.last() {
            match me.send(p, &[len as u64, 0], &[&payload[..len]]).map_err(fail)? {
                nemesis::net::Accept::Sent => {
                    mine.pop();
                }
                nemesis::net::Accept::Again => break,
            }
        }
        me.poll(&mut |_, _, _| back += 1).map_err(fail)?;
        for (i, o) in others.iter_mut().enumerate() {
            let q = &mut echoes[i];
            o.poll(&mut |_, env, data| q.push((*env, data.len())))
                .map_err(fail)?;
            while let Some(&(env, len)) = q.first() {
                match o.send(0, &env, &[&payload[..len]]).map_err(fail)? {
                    nemesis::net::Accept::Sent => {
                        q.remove(0);
                    }
                    nemesis::net::Accept::Again => break,
                }
            }
        }
        let quiet = me.backlog() == 0 && others.iter().all(|o| o.backlog() == 0);
        let next = [net.next_arrival(), me.next_deadline()]
            .into_iter()
            .chain(others.iter().map(|o| o.next_deadline()))
            .flatten()
            .min();
        if back == want && mine.is_empty() && quiet && next.is_none() {
            break;
        }
        steps += 1;
        let Some(t) = next.filter(|_| steps < 10_000_000) else {
            return Err(MeasureError::Other(format!(
                "the simulated exchange stalled ({back} of {want} echoes)"
            )));
        };
        net.advance_to(t);
    }
    let before = live();
    drop(me);
    let endpoint_bytes = before.saturating_sub(live());
    Ok(UdpMemory {
        peers,
        messages_per_peer: 2 * per_peer,
        endpoint_bytes,
        idle_bytes,
        per_peer_bytes: endpoint_bytes.saturating_sub(idle_bytes) as f64 / peers as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_settles_and_is_weighed() {
        // Without a counting allocator the weights are meaningless; the exchange is not.
        let m = udp_memory(3, 2, &|| 0).unwrap();
        assert_eq!((m.peers, m.messages_per_peer), (3, 8));
        assert!(udp_memory(0, 1, &|| 0).is_err());
    }
}
