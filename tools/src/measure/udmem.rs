//! How much memory a verbs netmod (ud or rc) keeps per peer, measured on a real verbs
//! device: one netmod of a job exchanges messages with every other, each in this
//! process, and once everything is acknowledged it is dropped; what it gives back, less
//! what a netmod of the same job that talked to no one holds, is what its peers cost.
//!
//! Two heaps are weighed: Rust's, through the caller's count of live bytes (the
//! reliability layer's peer state, the address-handle cache), and the C heap through
//! `mallinfo2` (what the verbs library and its provider allocate: an address handle per
//! peer, rc's queue pairs). Queue memory the kernel maps into the process (an rc pair's
//! rings) and the kernel's own objects are in neither.

use super::{MeasureError, Result};
use nemesis::net::{Accept, Cards, Envelope, Identity, NetError, Netmod};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the measured netmod holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdMemory {
    /// The netmod, `ud` or `rc`.
    pub netmod: &'static str,
    /// Peers it talked to.
    pub peers: u32,
    /// Messages it exchanged with each (both ways together).
    pub messages_per_peer: u64,
    /// Rust heap per peer.
    pub per_peer_bytes: f64,
    /// C heap (the verbs library and provider) per peer.
    pub per_peer_c_bytes: f64,
    /// Rust heap of a netmod that talked to no one (its rings).
    pub idle_bytes: usize,
}

#[derive(Clone, Default)]
struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

impl Cards for Table {
    fn card(&mut self, rank: u32) -> std::result::Result<Vec<u8>, NetError> {
        self.0
            .lock()
            .map_err(|_| NetError::BadCard {
                rank,
                reason: "poisoned".into(),
            })?
            .card(rank)
    }
}

/// Bytes of the C heap in use.
fn c_heap() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

fn open(netmod: &str, table: &Table, rank: u32, size: u32, addr: IpAddr) -> Result<Box<dyn Netmod>> {
    let id = Identity {
        rank,
        size,
        job_key: nemesis::net::auth::JobKey::from_bytes([0x75; 32]),
        addr,
    };
    let get = |k: &str| match k {
        "NEMESIS_NET_TIMEOUT" => Some("60".to_string()),
        _ => std::env::var(k).ok(),
    };
    nemesis::net::open(netmod, id, Box::new(table.clone()), &get)
        .map_err(|e| MeasureError::Other(format!("opening {netmod} rank {rank}: {e}")))
}

/// Rank 0 of a job of `peers + 1` ranks sends `rounds` rounds of a 100-byte and a
/// 20,000-byte message (at most the netmod's largest) to every other rank, each echoes them; then it is weighed.
/// `live` is the allocator's count of live Rust bytes; `addr` picks the device's GID.
pub fn ud_memory(
    netmod: &'static str,
    peers: u32,
    rounds: u32,
    addr: IpAddr,
    live: &dyn Fn() -> usize,
) -> Result<UdMemory> {
    if peers == 0 {
        return Err(MeasureError::Other("the netmod needs at least one peer".into()));
    }
    let size = peers + 1;
    let table = Table::default();
    let mut others = (1..size)
        .map(|r| open(netmod, &table, r, size, addr))
        .collect::<Result<Vec<_>>>()?;
    let (r0, c0) = (live(), c_heap());
    let idle = open(netmod, &table, 0, size, addr)?;
    let (idle_bytes, idle_c) = (live().saturating_sub(r0), c_heap().saturating_sub(c0));
    drop(idle);

    let (r1, c1) = (live(), c_heap());
    let mut me = open(netmod, &table, 0, size, addr)?;
    let mut cards = vec![me.business_card()];
    cards.extend(others.iter().map(|o| o.business_card()));
    *table
        .0
        .lock()
        .map_err(|_| MeasureError::Other("poisoned".into()))? = cards;
    // A message of one packet and one of many (or, for rc, its largest packet).
    let sizes = [100usize, 20_000.min(me.max_payload())];
    let payload = vec![0x5a; sizes[1]];
    let mut mine: Vec<(u32, usize)> = (0..rounds)
        .flat_map(|_| (1..size).flat_map(|p| sizes.map(|s| (p, s))))
        .collect();
    mine.reverse();
    let want = mine.len() as u64;
    let mut echoes: Vec<Vec<(Envelope, usize)>> = vec![Vec::new(); peers as usize];
    let mut back = 0u64;
    let fail = |e: NetError| MeasureError::Other(format!("{netmod} exchange: {e}"));
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        while let Some(&(p, len)) = mine.last() {
            match me.send(p, &[len as u64, 0], &[&payload[..len]]).map_err(fail)? {
                Accept::Sent => {
                    mine.pop();
                }
                Accept::Again => break,
            }
        }
        me.poll(&mut |_, _, _| back += 1).map_err(fail)?;
        for (i, o) in others.iter_mut().enumerate() {
            let q = &mut echoes[i];
            o.poll(&mut |_, env, data| q.push((*env, data.len())))
                .map_err(fail)?;
            while let Some(&(env, len)) = q.first() {
                match o.send(0, &env, &[&payload[..len]]).map_err(fail)? {
                    Accept::Sent => {
                        q.remove(0);
                    }
                    Accept::Again => break,
                }
            }
        }
        let quiet = me.backlog() == 0 && others.iter().all(|o| o.backlog() == 0);
        if back == want && mine.is_empty() && quiet {
            break;
        }
        if Instant::now() > end {
            return Err(MeasureError::Other(format!(
                "the {netmod} exchange stalled ({back} of {want} echoes)"
            )));
        }
    }
    // Whatever the last polls left owed (delayed acknowledgements) settles.
    let settle = Instant::now() + Duration::from_millis(50);
    while Instant::now() < settle {
        me.poll(&mut |_, _, _| {}).map_err(fail)?;
        for o in &mut others {
            o.poll(&mut |_, _, _| {}).map_err(fail)?;
        }
    }
    let (r2, c2) = (live(), c_heap());
    drop(me);
    let (r3, c3) = (live(), c_heap());
    let endpoint = r2.saturating_sub(r3);
    let endpoint_c = c2.saturating_sub(c3).saturating_sub(endpoint);
    let _ = (r1, c1);
    let idle_c_only = idle_c.saturating_sub(idle_bytes);
    Ok(UdMemory {
        netmod,
        peers,
        messages_per_peer: 2 * rounds as u64 * sizes.len() as u64,
        per_peer_bytes: endpoint.saturating_sub(idle_bytes) as f64 / peers as f64,
        per_peer_c_bytes: endpoint_c.saturating_sub(idle_c_only) as f64 / peers as f64,
        idle_bytes,
    })
}
