//! What the unit tests of several modules share: worlds that are threads of this
//! process, on one anonymous segment.

use crate::channel::{Channel, NemesisChannel, ShmChannel, WaitPolicy};
use crate::p2p::{Config, World};
use nemesis_lmt::Strategy;
use nemesis_net::{Accept, NetError, NetStats, Netmod};
use nemesis_shm::Envelope;
use nemesis_shm::{Geometry, Segment};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
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
                    // The strategy moves every message above the eager limit (the world
                    // sees it forced, and offers no stream way of its own).
                    cfg.medium_limit = 0;
                }
                tweak(&mut cfg);
                f(World::with_config(NemesisChannel::with_netmod(ch, None), cfg).unwrap())
            })
        })
        .collect();
    join_ranks(handles)
}

/// Runs `f(world)` as each rank of a job on "nodes" of the sizes in `nodes`: the ranks
/// of a node share an anonymous segment, and every rank has a netmod on one in-memory
/// wire, which carries whatever goes between nodes. Ranks are numbered node by node.
pub(crate) fn job_nodes<T: Send + 'static>(
    nodes: &[u32],
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_nodes_with(nodes, false, f)
}

/// As [`job_nodes`], the netmod offering RDMA ([`MemRdma`]) when `rdma`.
pub(crate) fn job_nodes_with<T: Send + 'static>(
    nodes: &[u32],
    rdma: bool,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_nodes_full(nodes, rdma.then(Default::default), None, f)
}

/// Two ranks on two nodes whose netmod offers RDMA, every large message between them
/// moved by strategy `force` (rdma, or chunks); returns what each rank returned and
/// what the job's RDMA did.
pub(crate) fn job_between_nodes<T: Send + 'static>(
    force: Strategy,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> (Vec<T>, Arc<RdmaCounters>) {
    let c = Arc::new(RdmaCounters::default());
    (job_nodes_full(&[1, 1], Some(c.clone()), Some(force), f), c)
}

/// What the in-memory RDMA of a job did, and what it refuses.
#[derive(Debug, Default)]
pub(crate) struct RdmaCounters {
    /// Bytes moved by reads.
    pub(crate) read: std::sync::atomic::AtomicU64,
    /// Registrations refused when set, as past a memory-lock limit.
    pub(crate) refuse: std::sync::atomic::AtomicBool,
    /// Registrations made.
    pub(crate) registered: std::sync::atomic::AtomicU64,
    /// Registrations made and not yet ended.
    pub(crate) live: std::sync::atomic::AtomicI64,
}

/// As [`job_nodes_with`], the netmod offering RDMA when `rdma` is given (which counts
/// what it does), with every large message moved by strategy `force` where it can be.
pub(crate) fn job_nodes_full<T: Send + 'static>(
    nodes: &[u32],
    rdma: Option<Arc<RdmaCounters>>,
    force: Option<Strategy>,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let regs = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let next = Arc::new(std::sync::atomic::AtomicU32::new(1));
    let n: u32 = nodes.iter().sum();
    let wire = Arc::new(Mutex::new(Wire {
        cap: 1 << 20,
        ..Wire::default()
    }));
    let f = Arc::new(f);
    let mut handles = Vec::new();
    let mut first = 0;
    for &size in nodes {
        let seg = Arc::new(Segment::anonymous(size, Geometry::default()).unwrap());
        let ranks: Vec<u32> = (first..first + size).collect();
        for (i, &r) in ranks.iter().enumerate() {
            let (seg, ranks, f, wire) = (seg.clone(), ranks.clone(), f.clone(), wire.clone());
            let mem_rdma = rdma.clone().map(|counters| MemRdma {
                regs: regs.clone(),
                next: next.clone(),
                ops: Default::default(),
                counters,
            });
            handles.push(std::thread::spawn(move || {
                let policy = WaitPolicy {
                    spin: 200,
                    yields: 50,
                    slice: Duration::from_millis(20),
                };
                let mut shm = ShmChannel::from_segment(seg, r, n, &ranks, i as u32, policy).unwrap();
                if force.is_some() {
                    let lmt = shm.local_lmt();
                    lmt.set_policy(nemesis_lmt::Policy {
                        force,
                        ..lmt.policy()
                    })
                    .unwrap();
                }
                let net: Box<dyn Netmod> = Box::new(MemNet {
                    me: r,
                    wire,
                    rdma: mem_rdma,
                });
                let ch = NemesisChannel::with_netmod(shm, Some(net));
                let mut cfg = Config::from_lookup(ch.max_payload(), |_| None).unwrap();
                if force.is_some() {
                    // The strategy moves every message above a cell, to every rank.
                    cfg.medium_limit = 0;
                    cfg.net_eager_limit = cfg.eager_limit;
                }
                f(World::with_config(ch, cfg).unwrap())
            }));
        }
        first += size;
    }
    join_ranks(handles)
}

/// Joins the ranks' threads, in rank order. A rank that panics fails the test at once
/// with its own message: the others may be blocked waiting for it, and joining them
/// first would hang the test instead.
fn join_ranks<T>(handles: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    let mut handles: Vec<Option<std::thread::JoinHandle<T>>> = handles.into_iter().map(Some).collect();
    let mut out: Vec<Option<T>> = handles.iter().map(|_| None).collect();
    let mut left = handles.len();
    while left > 0 {
        let mut joined = false;
        for (slot, h) in out.iter_mut().zip(handles.iter_mut()) {
            if h.as_ref().is_some_and(|h| h.is_finished()) {
                match h.take().expect("checked above").join() {
                    Ok(v) => *slot = Some(v),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
                left -= 1;
                joined = true;
            }
        }
        if !joined {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    out.into_iter().map(|v| v.expect("every rank joined")).collect()
}

pub(crate) fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
        .collect()
}

/// Packets in flight from one rank to another.
pub(crate) type Queue = VecDeque<(Envelope, Vec<u8>)>;

/// A network in memory: a queue per ordered pair, each holding at most `cap`
/// packets, and ranks that can be marked failed.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    pub(crate) queues: std::collections::HashMap<(u32, u32), Queue>,
    pub(crate) cap: usize,
    pub(crate) failed: HashSet<u32>,
}

#[derive(Debug)]
pub(crate) struct MemNet {
    pub(crate) me: u32,
    pub(crate) wire: Arc<Mutex<Wire>>,
    /// One-sided access to the other ranks' registered memory, when the job has it.
    pub(crate) rdma: Option<MemRdma>,
}

/// RDMA between ranks that are threads of this process: a key names registered memory
/// anywhere in the process, operations copy at once and complete on their second test,
/// as a completion queue's might come later.
#[derive(Debug)]
pub(crate) struct MemRdma {
    /// Registered memory of every rank, by key: (address, length).
    regs: Arc<Mutex<std::collections::HashMap<u32, (usize, usize)>>>,
    next: Arc<std::sync::atomic::AtomicU32>,
    /// Operations posted here, and the tests each needs before it is complete.
    ops: std::collections::HashMap<u64, u32>,
    counters: Arc<RdmaCounters>,
}

impl MemRdma {
    fn check(
        &self,
        remote: nemesis_net::rdma::Remote,
        len: usize,
    ) -> Result<usize, nemesis_net::rdma::RdmaError> {
        let bad = |why: &str| nemesis_net::rdma::RdmaError::BadKey {
            peer: 0,
            why: why.into(),
        };
        let regs = self.regs.lock().unwrap();
        let &(ptr, size) = regs.get(&remote.rkey).ok_or_else(|| bad("unknown key"))?;
        let start = remote
            .addr
            .checked_sub(ptr as u64)
            .ok_or_else(|| bad("below the region"))?;
        if start + len as u64 > size as u64 {
            return Err(bad("beyond the region"));
        }
        Ok(ptr + start as usize)
    }

    /// Runs `f` on the registered, aligned word an atomic names and puts what it held
    /// into `result`: every atomic of the job goes through here, so they are atomic with
    /// one another as a card's are.
    ///
    /// # Safety
    /// `result` is 8 writable bytes until the operation completes (the trait's contract).
    unsafe fn atomic(
        &mut self,
        remote: nemesis_net::rdma::Remote,
        result: nemesis_net::rdma::Seg,
        f: impl FnOnce(&std::sync::atomic::AtomicU64) -> u64,
    ) -> Result<nemesis_net::rdma::OpId, nemesis_net::rdma::RdmaError> {
        let at = self.check(remote, 8)?;
        if at % 8 != 0 || result.len != 8 {
            return Err(nemesis_net::rdma::RdmaError::BadKey {
                peer: 0,
                why: "an atomic works on one aligned 8-byte word".into(),
            });
        }
        // SAFETY: registered memory, aligned, alive while registered (the caller's
        // contract), and in a window whose words only these atomics update.
        let old = f(unsafe { std::sync::atomic::AtomicU64::from_ptr(at as *mut u64) });
        // SAFETY: the caller's contract: `result` is 8 writable bytes.
        unsafe { result.ptr.cast::<u64>().write_unaligned(old) };
        Ok(self.post())
    }

    fn post(&mut self) -> nemesis_net::rdma::OpId {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u64;
        self.ops.insert(n, 2);
        nemesis_net::rdma::OpId(n)
    }
}

impl nemesis_net::Rdma for MemRdma {
    fn register(
        &mut self,
        seg: nemesis_net::rdma::Seg,
    ) -> Result<nemesis_net::rdma::Registration, nemesis_net::rdma::RdmaError> {
        if self.counters.refuse.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(nemesis_net::rdma::RdmaError::Register {
                bytes: seg.len,
                why: "refused by the test (as past ulimit -l)".into(),
            });
        }
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.regs.lock().unwrap().insert(key, (seg.ptr as usize, seg.len));
        self.counters
            .registered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.counters
            .live
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(nemesis_net::rdma::Registration {
            handle: u64::from(key),
            lkey: key,
            remote: nemesis_net::rdma::Remote {
                addr: seg.ptr as u64,
                len: seg.len as u64,
                rkey: key,
            },
        })
    }
    fn deregister(&mut self, reg: &nemesis_net::rdma::Registration) {
        if self.regs.lock().unwrap().remove(&reg.remote.rkey).is_some() {
            self.counters
                .live
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    unsafe fn get(
        &mut self,
        _: u32,
        local: nemesis_net::rdma::Seg,
        _: &nemesis_net::rdma::Registration,
        remote: nemesis_net::rdma::Remote,
    ) -> Result<nemesis_net::rdma::OpId, nemesis_net::rdma::RdmaError> {
        let src = self.check(remote, local.len)?;
        // SAFETY: both regions are registered and live (the caller's contract), and
        // `local.len` long.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, local.ptr, local.len) };
        self.counters
            .read
            .fetch_add(local.len as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(self.post())
    }
    unsafe fn put(
        &mut self,
        _: u32,
        local: nemesis_net::rdma::Seg,
        _: &nemesis_net::rdma::Registration,
        remote: nemesis_net::rdma::Remote,
    ) -> Result<nemesis_net::rdma::OpId, nemesis_net::rdma::RdmaError> {
        let dst = self.check(remote, local.len)?;
        // SAFETY: as in `get`.
        unsafe { std::ptr::copy_nonoverlapping(local.ptr, dst as *mut u8, local.len) };
        Ok(self.post())
    }
    unsafe fn fetch_add(
        &mut self,
        _: u32,
        result: nemesis_net::rdma::Seg,
        _: &nemesis_net::rdma::Registration,
        remote: nemesis_net::rdma::Remote,
        add: u64,
    ) -> Result<nemesis_net::rdma::OpId, nemesis_net::rdma::RdmaError> {
        // SAFETY: the trait's contract on `result`.
        unsafe {
            self.atomic(remote, result, |w| {
                w.fetch_add(add, std::sync::atomic::Ordering::AcqRel)
            })
        }
    }
    unsafe fn compare_swap(
        &mut self,
        _: u32,
        result: nemesis_net::rdma::Seg,
        _: &nemesis_net::rdma::Registration,
        remote: nemesis_net::rdma::Remote,
        compare: u64,
        swap: u64,
    ) -> Result<nemesis_net::rdma::OpId, nemesis_net::rdma::RdmaError> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        // SAFETY: as in `fetch_add`.
        unsafe {
            self.atomic(remote, result, |w| {
                match w.compare_exchange(compare, swap, AcqRel, Acquire) {
                    Ok(v) | Err(v) => v,
                }
            })
        }
    }
    fn has_atomics(&self) -> bool {
        true
    }
    fn test(&mut self, op: nemesis_net::rdma::OpId) -> Result<bool, nemesis_net::rdma::RdmaError> {
        let left = self
            .ops
            .get_mut(&op.0)
            .ok_or(nemesis_net::rdma::RdmaError::Failed {
                peer: 0,
                why: "an operation not under way".into(),
            })?;
        *left -= 1;
        if *left == 0 {
            self.ops.remove(&op.0);
            return Ok(true);
        }
        Ok(false)
    }
}

impl Netmod for MemNet {
    fn name(&self) -> &'static str {
        "mem"
    }
    fn business_card(&self) -> Vec<u8> {
        Vec::new()
    }
    fn max_payload(&self) -> usize {
        100_000
    }
    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        let mut w = self.wire.lock().unwrap();
        if w.failed.contains(&peer) {
            return Err(NetError::PeerFailed {
                rank: peer,
                reason: "marked failed".into(),
            });
        }
        let cap = w.cap;
        let q = w.queues.entry((self.me, peer)).or_default();
        if q.len() >= cap {
            return Ok(Accept::Again);
        }
        q.push_back((*env, payload.concat()));
        Ok(Accept::Sent)
    }
    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        let mut got = Vec::new();
        for ((from, to), q) in self.wire.lock().unwrap().queues.iter_mut() {
            if *to == self.me {
                got.extend(q.drain(..).map(|(e, d)| (*from, e, d)));
            }
        }
        for (from, e, d) in &got {
            sink(*from, e, d);
        }
        Ok(got.len())
    }
    fn wait(&mut self, _: Duration) -> Result<bool, NetError> {
        let w = self.wire.lock().unwrap();
        Ok(w.queues
            .iter()
            .any(|((_, to), q)| *to == self.me && !q.is_empty()))
    }
    fn backlog(&self) -> usize {
        let w = self.wire.lock().unwrap();
        // As a real netmod does, nothing is owed to a failed peer.
        w.queues
            .iter()
            .filter(|((from, to), _)| *from == self.me && !w.failed.contains(to))
            .map(|(_, q)| q.len())
            .sum()
    }
    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        if self.wire.lock().unwrap().failed.contains(&peer) {
            return Err(NetError::PeerFailed {
                rank: peer,
                reason: "marked failed".into(),
            });
        }
        Ok(())
    }
    fn shutdown(&mut self, _: Duration) {}
    fn stats(&self) -> NetStats {
        NetStats::default()
    }
    fn rdma(&mut self) -> Option<&mut dyn nemesis_net::Rdma> {
        self.rdma.as_mut().map(|r| r as &mut dyn nemesis_net::Rdma)
    }
}
