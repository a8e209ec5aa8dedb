//! Windows: made collectively over a communicator, in three flavours, each member
//! reached by the fastest route this process has to it.

use super::RmaError;
use super::nic::{self, NicWin};
use super::proto::{Keep, Rma};
use super::target::{Memory, TargetWin};
use crate::channel::Channel;
use crate::op::Op;
use crate::p2p::{Comm, Locality, World};
use crate::progress::ProtocolId;
use bytemuck::Pod;
use nemesis_net::rdma::{Registration, Remote, Seg};
use nemesis_shm::window::WinFile;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where a window's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// Allocated by nemesis in shared memory ([`Window::allocate`]).
    Allocate,
    /// The caller's vector ([`Window::create`]).
    Create,
    /// Attached and detached later ([`Window::dynamic`]).
    Dynamic,
}

impl Flavor {
    fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// Who runs a window's atomic updates (accumulates, get-accumulates, fetch-and-op and
/// compare-and-swap): one executor per window, never two on the same word, since a
/// CPU atomic and a network card's atomic on one word are not atomic with each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Executor {
    /// The CPU: by the origin where it maps the member's memory, by the member's
    /// progress core otherwise. Locks are the node's ticket locks or the target's queue.
    #[default]
    Cpu,
    /// The network card's 8-byte atomics, for every member and its owner alike, so a
    /// target takes no part in updates or locks (a counter word at each member). Needs
    /// a network module whose RDMA has atomics reaching every member (`rc`) and 8-byte
    /// elements; [`Window::local_atomics`] gives no view of such a window.
    Nic,
}

impl Executor {
    fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// How this process reaches a member's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Our own memory, at this address.
    Own(usize),
    /// Mapped here, at this address.
    Shm(usize),
    /// Another process of this node, by cross-memory attach.
    Cma {
        /// Its process id.
        pid: i32,
        /// Where its memory starts in its address space.
        addr: u64,
    },
    /// Another node whose network module offers RDMA: large puts and gets by the
    /// device, the rest by messages.
    Rdma(Remote),
    /// Messages served by the member's progress core.
    Am,
}

/// One member of a window, as this process sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    /// Its world rank.
    pub(crate) world: u32,
    /// Bytes of its memory (0 for a dynamic window, whose memory is checked by the
    /// member itself).
    pub(crate) len: u64,
    pub(crate) route: Route,
    /// Its index in this node's window file, if it maps one with us.
    pub(crate) member: Option<usize>,
}

/// The caller's vector of a created window, kept where nothing moves it until the
/// window gives it back.
struct Owned {
    addr: usize,
    vec: Mutex<Option<Box<dyn Any + Send>>>,
}

/// A window of elements of `T` over a communicator: each member's memory, and the
/// routes to it. Made with [`Window::allocate`], [`Window::create`] or
/// [`Window::dynamic`]; reached through epochs; ended with [`Window::free`]. A window
/// dropped without `free` keeps its memory until its world is dropped.
pub struct Window<T: Pod> {
    pub(crate) world: u64,
    pub(crate) id: u32,
    pub(crate) comm: Comm,
    flavor: Flavor,
    pub(crate) type_tag: u32,
    pub(crate) me: u32,
    pub(crate) peers: Vec<Peer>,
    pub(crate) file: Option<Arc<WinFile>>,
    /// Our index in the node's window file.
    pub(crate) member: Option<usize>,
    /// Our own memory: its address and bytes.
    local: (usize, usize),
    /// Every member maps the window file: locks are its tickets, a fence its barrier.
    pub(crate) shm_sync: bool,
    owned: Option<Arc<Owned>>,
    /// Cross-memory attach failed once: members on the node are reached by messages.
    cma_off: AtomicBool,
    /// The last liveness check of members reached through memory, in milliseconds of
    /// the coarse monotonic clock.
    checked_ms: AtomicU64,
    /// The members' world ranks, for failure checks.
    worlds: Vec<u32>,
    /// This member's memory registered with the network module's RDMA, if it is.
    rdma_reg: Option<Registration>,
    /// The device's view of every member, for a window whose atomics it runs.
    pub(crate) nic: Option<NicWin>,
    /// Some member is reached by RDMA: transfers may be under way.
    pub(crate) by_rdma: bool,
    _t: PhantomData<T>,
}

impl<T: Pod> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.id)
            .field("flavor", &self.flavor)
            .field("rank", &self.me)
            .field("members", &self.peers.len())
            .field("shm_sync", &self.shm_sync)
            .finish_non_exhaustive()
    }
}

/// Milliseconds of the coarse monotonic clock: a few nanoseconds to read, where a
/// precise clock costs tens, and precise enough for checks a second apart.
fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A tag that differs between element types (their name and size), so members that
/// made a window of different types are caught, and so is a packet for another type.
pub(crate) fn type_tag<T>() -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in std::any::type_name::<T>()
        .bytes()
        .chain((size_of::<T>() as u64).to_le_bytes())
    {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// The one-sided protocol of `world`, registered on first use.
pub(crate) fn rma<C: Channel>(world: &mut World<C>) -> &mut Rma {
    if world.core.protocol::<Rma>(ProtocolId::RMA).is_none() {
        let max_to = (0..world.size())
            .map(|r| world.channel().max_payload_to(r))
            .collect();
        let p = Rma::new(world.rank(), max_to, rdma_min_from_env());
        // The id is reserved for this layer: nobody else can have taken it.
        let _ = world.core.register(ProtocolId::RMA, p);
    }
    world
        .core
        .protocol_mut::<Rma>(ProtocolId::RMA)
        .expect("registered just now")
}

/// The variable that sets the smallest put or get that goes by RDMA.
pub const RDMA_MIN_VAR: &str = "NEMESIS_RMA_RDMA_MIN";

/// Below this, a put or get to a member reached by RDMA goes as a packet: registering
/// the bytes costs more than the packet (`NEMESIS_RMA_RDMA_MIN`).
pub const DEFAULT_RDMA_MIN: usize = 16 << 10;

/// `NEMESIS_RMA_RDMA_MIN`, or the default; an unreadable value is named once and the
/// default used (the world has already started).
fn rdma_min_from_env() -> usize {
    match std::env::var(RDMA_MIN_VAR) {
        Err(_) => DEFAULT_RDMA_MIN,
        Ok(v) => nemesis_shm::config::parse_size(&v)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or_else(|| {
                eprintln!("nemesis: {RDMA_MIN_VAR}={v:?} is not a size; using {DEFAULT_RDMA_MIN}");
                DEFAULT_RDMA_MIN
            }),
    }
}

/// Moves window `id`'s RDMA transfers on, if the channel has RDMA.
pub(crate) fn poll_xfers<C: Channel>(world: &mut World<C>, id: u32) {
    let core = &mut world.core;
    let Some(rdma) = core.ch.rdma() else { return };
    let proto: Option<&mut dyn std::any::Any> = core
        .table
        .get_mut(ProtocolId::RMA)
        .map(|p| p as &mut dyn std::any::Any);
    if let Some(s) = proto
        .and_then(|p| p.downcast_mut::<Rma>())
        .and_then(|r| r.slot_mut(id))
        && !s.origin.xfers.is_empty()
    {
        s.origin.poll_xfers(rdma);
    }
}

/// Agrees whether every member succeeded: `Ok` if all did, else the error of the
/// lowest member that failed, in full here and named elsewhere.
fn agree<C: Channel>(
    world: &mut World<C>,
    comm: &Comm,
    mine: Option<RmaError>,
    what: &str,
    bytes: u64,
) -> Result<(), RmaError> {
    agree_with(world, comm, mine, |r| RmaError::Memory {
        bytes,
        reason: format!("rank {r} could not {what}"),
    })
}

/// As [`agree`], naming the lowest member that failed with `theirs`.
fn agree_with<C: Channel>(
    world: &mut World<C>,
    comm: &Comm,
    mine: Option<RmaError>,
    theirs: impl FnOnce(u32) -> RmaError,
) -> Result<(), RmaError> {
    let mut v = [if mine.is_some() { comm.rank() } else { u32::MAX }];
    world.allreduce(comm, &mut v, Op::Min)?;
    match (v[0], mine) {
        (u32::MAX, _) => Ok(()),
        (_, Some(e)) => Err(e),
        (r, None) => Err(theirs(r)),
    }
}

impl<T: Pod> Window<T> {
    /// Makes a window of `len` elements at every member, allocated by nemesis in a file
    /// of the node's shared-memory directory (`NEMESIS_SHM_DIR`) that every member on
    /// the node maps. Collective over `comm`; `len` may differ between members.
    ///
    /// # Errors
    /// [`RmaError::Memory`] when the directory cannot hold the window (with the sizes
    /// and the variable), [`RmaError::CollectiveMismatch`] when members disagree on the
    /// flavour or the element type, and the collectives' errors.
    pub fn allocate<C: Channel>(world: &mut World<C>, comm: &Comm, len: usize) -> Result<Self, RmaError>
    where
        T: Send,
    {
        Self::allocate_with(world, comm, len, Executor::Cpu)
    }

    /// As [`Window::allocate`], with its atomics run by `executor`.
    ///
    /// # Errors
    /// As for [`Window::allocate`], and [`RmaError::InvalidArgument`] where `executor`
    /// cannot run them (no RDMA atomics, elements not of 8 bytes).
    pub fn allocate_with<C: Channel>(
        world: &mut World<C>,
        comm: &Comm,
        len: usize,
        executor: Executor,
    ) -> Result<Self, RmaError>
    where
        T: Send,
    {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| RmaError::InvalidArgument(format!("a window of {len} elements overflows")))?;
        Self::make(world, comm, Flavor::Allocate, bytes as u64, None, executor)
    }

    /// Makes a window over `mem`, which the window owns until [`Window::free`] gives it
    /// back (so no other process can write into memory the program reuses). Collective
    /// over `comm`.
    ///
    /// # Errors
    /// As for [`Window::allocate`].
    pub fn create<C: Channel>(world: &mut World<C>, comm: &Comm, mem: Vec<T>) -> Result<Self, RmaError>
    where
        T: Send,
    {
        Self::create_with(world, comm, mem, Executor::Cpu)
    }

    /// As [`Window::create`], with its atomics run by `executor`.
    ///
    /// # Errors
    /// As for [`Window::allocate_with`].
    pub fn create_with<C: Channel>(
        world: &mut World<C>,
        comm: &Comm,
        mem: Vec<T>,
        executor: Executor,
    ) -> Result<Self, RmaError>
    where
        T: Send,
    {
        let bytes = (mem.len() * size_of::<T>()) as u64;
        Self::make(world, comm, Flavor::Create, bytes, Some(mem), executor)
    }

    /// Makes a window without memory: each member attaches and detaches its own later
    /// ([`Window::attach`]), and displacements name attached memory ([`Region::disp`]).
    /// Collective over `comm`.
    ///
    /// # Errors
    /// As for [`Window::allocate`].
    pub fn dynamic<C: Channel>(world: &mut World<C>, comm: &Comm) -> Result<Self, RmaError>
    where
        T: Send,
    {
        Self::make(world, comm, Flavor::Dynamic, 0, None, Executor::Cpu)
    }

    fn make<C: Channel>(
        world: &mut World<C>,
        comm: &Comm,
        flavor: Flavor,
        bytes: u64,
        mem: Option<Vec<T>>,
        executor: Executor,
    ) -> Result<Self, RmaError>
    where
        T: Send,
    {
        let size = size_of::<T>();
        if size == 0 {
            return Err(RmaError::InvalidArgument(
                "a window's element type must have a size".into(),
            ));
        }
        world.check_comm(comm)?;
        let (n, me, my_world) = (comm.size() as usize, comm.rank(), world.rank());
        let tag = type_tag::<T>();
        let next = rma(world).next_id;
        let mut id = [next];
        world.allreduce(comm, &mut id, Op::Max)?;
        let id = id[0];
        rma(world).next_id = id.wrapping_add(1).max(1);
        // Members on this node, in communicator order; the first makes the file.
        let locality = world.locality().to_vec();
        let node: Vec<u32> = (0..n as u32)
            .filter(|&r| {
                let w = comm.world_rank(r).expect("a member");
                w == my_world || locality[w as usize] == Locality::Local
            })
            .collect();
        let leader = node[0] == me;
        let nonce = if leader && flavor == Flavor::Allocate {
            crate::bootstrap::random_job_id()
        } else {
            0
        };
        let owned = mem.map(|v| {
            let addr = v.as_ptr() as usize;
            Arc::new(Owned {
                addr,
                vec: Mutex::new(Some(Box::new(v))),
            })
        });
        let base = owned.as_ref().map_or(0, |o| o.addr as u64);
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        let rec = [
            u64::from(my_world),
            flavor.code(),
            size as u64,
            u64::from(tag),
            bytes,
            pid,
            base,
            nonce,
            executor.code(),
        ];
        let mut all = vec![0u64; 9 * n];
        world.allgather(comm, &rec, &mut all)?;
        let field = |r: usize, i: usize| all[9 * r + i];
        for r in 0..n {
            if field(r, 1) != flavor.code() || field(r, 2) != size as u64 || field(r, 3) != u64::from(tag) {
                return Err(RmaError::CollectiveMismatch(format!(
                    "rank {me} made a {flavor:?} window of {} ({size} bytes), rank {r} a window of flavour {} with {}-byte elements of another type",
                    std::any::type_name::<T>(),
                    field(r, 1),
                    field(r, 2)
                )));
            }
            if field(r, 8) != executor.code() {
                return Err(RmaError::CollectiveMismatch(format!(
                    "rank {me} made a window whose atomics the {executor:?} runs, rank {r} one another runs"
                )));
            }
        }
        // Only `allocate_with` and `create_with` take an executor: a dynamic window's
        // memory comes later, and is never registered.
        let nic_on = executor == Executor::Nic;
        if nic_on {
            let why = if size != 8 {
                Some(format!(
                    "the card's atomics work on 8-byte elements, not {size}-byte {}",
                    std::any::type_name::<T>()
                ))
            } else if !world.core.ch.rdma().is_some_and(|r| r.has_atomics()) {
                Some("the channel's network module has no RDMA atomics (the rc netmod on a device with them has)".into())
            } else {
                None
            };
            let mine = why.map(|w| {
                RmaError::InvalidArgument(format!(
                    "rank {me} cannot make a window whose atomics the card runs: {w}"
                ))
            });
            agree_with(world, comm, mine, |r| {
                RmaError::InvalidArgument(format!(
                    "rank {r} cannot make a window whose atomics the card runs"
                ))
            })?;
        }
        // Memory.
        let my_index = node.iter().position(|&r| r == me);
        let mut file = None;
        if flavor == Flavor::Allocate {
            let sizes: Vec<u64> = node.iter().map(|&r| field(r as usize, 4)).collect();
            let name = format!("nemesis-win-{:016x}", field(node[0] as usize, 7));
            let dir = nemesis_shm::config::shm_dir();
            let node_bytes: u64 = sizes.iter().sum();
            let mut err = None;
            if leader {
                match WinFile::create(&dir, &name, &sizes) {
                    Ok(f) => file = Some(Arc::new(f)),
                    Err(e) => {
                        err = Some(RmaError::Memory {
                            bytes: node_bytes,
                            reason: e.to_string(),
                        })
                    }
                }
            }
            agree(world, comm, err, "make its node's window file", node_bytes)?;
            let mut err = None;
            if !leader {
                match WinFile::open(&dir, &name, &sizes) {
                    Ok(Some(f)) => file = Some(Arc::new(f)),
                    Ok(None) => {
                        err = Some(RmaError::Memory {
                            bytes: node_bytes,
                            reason: format!("the window file {name} is not in {}", dir.display()),
                        })
                    }
                    Err(e) => {
                        err = Some(RmaError::Memory {
                            bytes: node_bytes,
                            reason: e.to_string(),
                        })
                    }
                }
            }
            let r = agree(world, comm, err, "map its node's window file", node_bytes);
            if leader && let Some(f) = &file {
                f.unlink();
            }
            r?;
        }
        // This member's own memory, and its RDMA key for members on other nodes.
        let own: (usize, usize) = match (flavor, &file, my_index) {
            (Flavor::Allocate, Some(f), Some(m)) => {
                let (p, l) = f.data(m);
                (p.as_ptr() as usize, l)
            }
            (Flavor::Create, _, _) => (base as usize, bytes as usize),
            _ => (0, 0),
        };
        // Per member: its memory's address, length and key (plus one; zero for none),
        // and its lock word's address and key, for a window whose atomics the card runs.
        const K: usize = 5;
        let mut rdma_reg = None;
        let mut words = None;
        let mut keys = vec![0u64; K * n];
        if flavor != Flavor::Dynamic && world.core.ch.rdma().is_some() {
            let far = (0..n).any(|r| locality[field(r, 0) as usize] == Locality::Remote);
            let mut mine = [0u64; K];
            let mut err = None;
            if (far || nic_on) && own.1 > 0 {
                let seg = Seg {
                    ptr: own.0 as *mut u8,
                    len: own.1,
                };
                match world.core.ch.rdma().map(|r| r.register(seg)) {
                    Some(Ok(reg)) => {
                        mine[..3].copy_from_slice(&[
                            reg.remote.addr,
                            reg.remote.len,
                            u64::from(reg.remote.rkey) + 1,
                        ]);
                        rdma_reg = Some(reg);
                    }
                    Some(Err(e)) if nic_on => {
                        err = Some(RmaError::Memory {
                            bytes: own.1 as u64,
                            reason: format!("the device would not register it: {e}"),
                        })
                    }
                    Some(Err(e)) => eprintln!(
                        "nemesis: rank {my_world}'s part of window {id} is reached by messages, not RDMA: {e}"
                    ),
                    None => {}
                }
            }
            if nic_on && err.is_none() {
                match nic::words(world) {
                    Ok((w, reg)) => {
                        mine[3] = reg.remote.addr;
                        mine[4] = u64::from(reg.remote.rkey) + 1;
                        words = Some((w, reg));
                    }
                    Err(why) => {
                        err = Some(RmaError::Memory {
                            bytes: 16,
                            reason: format!("the device would not register its lock word: {why}"),
                        })
                    }
                }
            }
            if nic_on
                && let Err(e) = agree(
                    world,
                    comm,
                    err,
                    "register its memory with the device",
                    own.1 as u64,
                )
            {
                if let Some(r) = world.core.ch.rdma() {
                    for reg in rdma_reg.iter().chain(words.iter().map(|(_, reg)| reg)) {
                        r.deregister(reg);
                    }
                }
                return Err(e);
            }
            world.allgather(comm, &mine, &mut keys)?;
        }
        let cma = flavor == Flavor::Create && n > 1 && nemesis_lmt::cma::probe().is_ok();
        let peers: Vec<Peer> = (0..n)
            .map(|r| {
                let w = field(r, 0) as u32;
                let member = node
                    .iter()
                    .position(|&m| m as usize == r)
                    .filter(|_| file.is_some());
                let route = match flavor {
                    Flavor::Dynamic => Route::Am,
                    Flavor::Allocate => match (&file, member) {
                        (Some(f), Some(m)) => {
                            let a = f.data(m).0.as_ptr() as usize;
                            if r == me as usize {
                                Route::Own(a)
                            } else {
                                Route::Shm(a)
                            }
                        }
                        _ => Route::Am,
                    },
                    Flavor::Create if r == me as usize => Route::Own(base as usize),
                    Flavor::Create if cma && locality[w as usize] == Locality::Local => Route::Cma {
                        pid: field(r, 5) as i32,
                        addr: field(r, 6),
                    },
                    Flavor::Create => Route::Am,
                };
                let route = match route {
                    Route::Am if keys[K * r + 2] != 0 && locality[w as usize] == Locality::Remote => {
                        Route::Rdma(Remote {
                            addr: keys[K * r],
                            len: keys[K * r + 1],
                            rkey: (keys[K * r + 2] - 1) as u32,
                        })
                    }
                    other => other,
                };
                Peer {
                    world: w,
                    len: field(r, 4),
                    route,
                    member,
                }
            })
            .collect();
        let by_rdma = peers.iter().any(|p| matches!(p.route, Route::Rdma(_)));
        let local = match peers[me as usize].route {
            Route::Own(a) => (a, bytes as usize),
            _ => (0, 0),
        };
        let memory = match flavor {
            Flavor::Dynamic => Memory::Dynamic {
                pieces: Default::default(),
            },
            _ => Memory::Flat {
                base: local.0,
                len: local.1,
            },
        };
        let mut keep: Vec<Keep> = Vec::new();
        if let Some(f) = &file {
            keep.push(f.clone());
        }
        if let Some(o) = &owned {
            keep.push(o.clone());
        }
        let nic = words.map(|(w, reg)| {
            keep.push(w.clone());
            let members = (0..n)
                .map(|r| nic::Member {
                    data: (keys[K * r + 2] != 0).then(|| Remote {
                        addr: keys[K * r],
                        len: keys[K * r + 1],
                        rkey: (keys[K * r + 2] - 1) as u32,
                    }),
                    lock: Remote {
                        addr: keys[K * r + 3],
                        len: 8,
                        rkey: keys[K * r + 4].saturating_sub(1) as u32,
                    },
                })
                .collect();
            NicWin {
                members,
                words: w,
                reg,
            }
        });
        let target = TargetWin::new(memory, tag, size);
        let target = if nic.is_some() {
            target.with_card_atomics()
        } else {
            target
        };
        rma(world).add(id, n, target, keep);
        // Nobody sends a request before every member has registered the window.
        if let Err(e) = world.barrier(comm) {
            rma(world).remove(id);
            return Err(e.into());
        }
        Ok(Self {
            world: world.id,
            id,
            comm: comm.clone(),
            flavor,
            type_tag: tag,
            me,
            shm_sync: flavor == Flavor::Allocate && file.is_some() && node.len() == n,
            worlds: peers.iter().map(|p| p.world).collect(),
            peers,
            file,
            member: my_index.filter(|_| flavor == Flavor::Allocate),
            local,
            owned,
            cma_off: AtomicBool::new(false),
            checked_ms: AtomicU64::new(coarse_ms()),
            rdma_reg,
            nic,
            by_rdma,
            _t: PhantomData,
        })
    }

    /// Ends the window: collective over its communicator, after every member has closed
    /// its epochs. Gives back the vector of a created window.
    ///
    /// # Errors
    /// [`RmaError::Wrong`] for a world other than the window's, and the barrier's.
    pub fn free<C: Channel>(self, world: &mut World<C>) -> Result<Option<Vec<T>>, RmaError> {
        self.check_world(world)?;
        world.barrier(&self.comm)?;
        // A forgotten epoch may have left transfers under way: the device must be done
        // with their buffers before they go.
        let id = self.id;
        world.wait_until(
            &|| "the window's RDMA transfers".into(),
            &self.worlds,
            true,
            |w| {
                poll_xfers(w, id);
                rma(w).slot(id).is_none_or(|s| s.origin.xfers.is_empty())
            },
        )?;
        if let Some(r) = world.core.ch.rdma() {
            for reg in self.rdma_reg.iter().chain(self.nic.iter().map(|n| &n.reg)) {
                r.deregister(reg);
            }
        }
        drop(rma(world).remove(self.id));
        let Some(owned) = self.owned else {
            return Ok(None);
        };
        let owned = match Arc::try_unwrap(owned) {
            Ok(o) => o,
            Err(_) => return Err(RmaError::Wrong("the window's memory is still in use")),
        };
        let v = owned.vec.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok(v.and_then(|b| b.downcast::<Vec<T>>().ok()).map(|b| *b))
    }

    pub(crate) fn check_world<C: Channel>(&self, world: &World<C>) -> Result<(), RmaError> {
        if world.id != self.world {
            return Err(RmaError::Wrong("the window belongs to another world"));
        }
        Ok(())
    }

    /// Its flavour.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Who runs its atomics.
    pub fn executor(&self) -> Executor {
        if self.nic.is_some() {
            Executor::Nic
        } else {
            Executor::Cpu
        }
    }

    /// Its communicator.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// Elements of this member's memory (0 for a dynamic window).
    pub fn len(&self) -> usize {
        self.local.1 / size_of::<T>()
    }

    /// Whether this member's memory is empty.
    pub fn is_empty(&self) -> bool {
        self.local.1 == 0
    }

    /// Elements of member `rank`'s memory, as the window was made (0 for a dynamic
    /// window).
    pub fn len_of(&self, rank: u32) -> Option<usize> {
        self.peers
            .get(rank as usize)
            .map(|p| p.len as usize / size_of::<T>())
    }

    /// This member's memory seen as atomics, which others may update meanwhile: how a
    /// program reads and writes its own window outside an exclusive self-lock. `None`
    /// for a dynamic window.
    pub fn local_atomics(&self) -> Option<&[T::Atomic]>
    where
        T: AtomicElem,
    {
        if self.flavor == Flavor::Dynamic || self.nic.is_some() {
            return None;
        }
        let (addr, bytes) = self.local;
        if bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: `AtomicElem` promises the atomic twin has `T`'s size and alignment;
        // the memory is this window's own, aligned for `T`, and stays mapped (or
        // allocated) while the window lives; every access through these is atomic.
        Some(unsafe { std::slice::from_raw_parts(addr as *const T::Atomic, bytes / size_of::<T>()) })
    }

    /// Where this member's memory starts (null for a dynamic window). Reading or
    /// writing through it races with other members' operations unless the program
    /// synchronises them (an exclusive self-lock, a fence).
    pub fn local_ptr(&self) -> *mut T {
        self.local.0 as *mut T
    }

    /// Where member `rank`'s memory is mapped in this process, and its elements: for
    /// members of an allocated window on this node (MPI's shared query).
    pub fn peer_ptr(&self, rank: u32) -> Option<(*mut T, usize)> {
        let p = self.peers.get(rank as usize)?;
        match p.route {
            Route::Own(a) | Route::Shm(a) if self.flavor == Flavor::Allocate => {
                Some((a as *mut T, p.len as usize / size_of::<T>()))
            }
            _ => None,
        }
    }

    /// Attaches `mem` to this member's part of a dynamic window; others reach it at
    /// [`Region::disp`] (which this member tells them, by a message for instance).
    ///
    /// # Errors
    /// [`RmaError::Wrong`] for a window that is not dynamic or of another world;
    /// [`RmaError::InvalidArgument`] for empty memory.
    pub fn attach<C: Channel>(&self, world: &mut World<C>, mem: Vec<T>) -> Result<Region, RmaError>
    where
        T: Send,
    {
        self.check_world(world)?;
        if self.flavor != Flavor::Dynamic {
            return Err(RmaError::Wrong("only a dynamic window takes attached memory"));
        }
        if mem.is_empty() {
            return Err(RmaError::InvalidArgument(
                "attached memory must not be empty".into(),
            ));
        }
        let addr = mem.as_ptr() as u64;
        let len = mem.len();
        let slot = rma(world)
            .slot_mut(self.id)
            .ok_or(RmaError::Wrong("the window was freed"))?;
        if let Memory::Dynamic { pieces } = &mut slot.target.mem {
            pieces.insert(addr, len * size_of::<T>());
        }
        slot.attached.insert(addr, Box::new(mem));
        Ok(Region {
            addr,
            len,
            elem: size_of::<T>(),
        })
    }

    /// Detaches memory attached with [`Window::attach`] and gives it back. Requests
    /// that reach it afterwards are refused.
    ///
    /// # Errors
    /// [`RmaError::Wrong`] for memory this window does not hold.
    pub fn detach<C: Channel>(&self, world: &mut World<C>, region: Region) -> Result<Vec<T>, RmaError> {
        self.check_world(world)?;
        let slot = rma(world)
            .slot_mut(self.id)
            .ok_or(RmaError::Wrong("the window was freed"))?;
        let mem = slot
            .attached
            .remove(&region.addr)
            .ok_or(RmaError::Wrong("memory this window did not attach"))?;
        if let Memory::Dynamic { pieces } = &mut slot.target.mem {
            pieces.remove(&region.addr);
        }
        // Large gets still being answered from it end now, refused.
        let gone = slot
            .target
            .cancel_gets(region.addr as usize, region.len * size_of::<T>());
        for (origin, req) in gone {
            let h = crate::channel::Header {
                kind: u16::from(super::wire::ERR),
                context: self.id,
                aux: req,
                ..Default::default()
            };
            let why = super::wire::err(super::wire::Refusal::OutOfBounds, region.addr, 0);
            world.core.send(ProtocolId::RMA, origin, h, &[&why])?;
        }
        mem.downcast::<Vec<T>>()
            .map(|b| *b)
            .map_err(|_| RmaError::Wrong("memory of another element type"))
    }

    /// Whether members reached through memory are due a liveness check: once every
    /// `every`, since a check costs a system call and a put into mapped memory none.
    pub(crate) fn liveness_due(&self, every: std::time::Duration) -> bool {
        let now = coarse_ms();
        let last = self.checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < every.as_millis() as u64 {
            return false;
        }
        self.checked_ms.store(now, Ordering::Relaxed);
        true
    }

    /// Whether cross-memory attach has failed here once.
    pub(crate) fn cma_off(&self) -> bool {
        self.cma_off.load(Ordering::Relaxed)
    }

    /// Gives cross-memory attach up: the kernel refused it (a seccomp filter, a
    /// ptrace scope changed since start-up); messages reach the same memory.
    pub(crate) fn give_up_cma(&self) {
        if !self.cma_off.swap(true, Ordering::Relaxed) {
            eprintln!(
                "nemesis: rank {} reaches window {}'s members on this node by messages: cross-memory attach was refused",
                self.me, self.id
            );
        }
    }

    /// The world ranks of the members, for failure checks.
    pub(crate) fn world_ranks(&self) -> &[u32] {
        &self.worlds
    }
}

/// Memory attached to a dynamic window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    addr: u64,
    len: usize,
    elem: usize,
}

impl Region {
    /// The displacement, in elements, at which others reach the memory's first element.
    pub fn disp(&self) -> usize {
        (self.addr / self.elem as u64) as usize
    }

    /// Its elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has none (never: empty memory is not attached).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An element type with an atomic twin of the same size and alignment, through which a
/// member reads and writes its own window while others may update it.
///
/// # Safety
/// `Atomic` must have the size and alignment of `Self`, and hold the same values.
pub unsafe trait AtomicElem: Pod {
    /// The atomic twin.
    type Atomic: Sync;
}

macro_rules! atomic_elem {
    ($($t:ty => $a:ty),*) => {$(
        // SAFETY: the standard library's atomic integers have their integer's size and
        // alignment on every target that has them.
        unsafe impl AtomicElem for $t {
            type Atomic = $a;
        }
    )*};
}

atomic_elem!(
    u8 => std::sync::atomic::AtomicU8,
    u16 => std::sync::atomic::AtomicU16,
    u32 => std::sync::atomic::AtomicU32,
    u64 => std::sync::atomic::AtomicU64,
    usize => std::sync::atomic::AtomicUsize,
    i8 => std::sync::atomic::AtomicI8,
    i16 => std::sync::atomic::AtomicI16,
    i32 => std::sync::atomic::AtomicI32,
    i64 => std::sync::atomic::AtomicI64,
    isize => std::sync::atomic::AtomicIsize
);
