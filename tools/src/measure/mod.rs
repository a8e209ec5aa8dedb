//! Measuring the channel between processes, for `nemesis-bench` and the criterion
//! benches.
//!
//! A measurement runs in a pair: this process is rank 0 and starts its partner, rank 1,
//! by executing its own executable again with [`ROLE_VAR`] set, so no set-up is needed.
//! Rank 0 drives; the partner obeys control packets. Beside every latency, the same two
//! processes measure a cache-line ping-pong (the "probe") on a line of the same segment:
//! the hardware's floor, which makes figures from different placements comparable.

mod clock;
mod coll;
mod early;
mod netmem;
pub mod peers;
mod pin;
mod requests;
mod ring;
mod rma;
mod stats;
#[cfg(feature = "verbs")]
mod udmem;

pub use clock::Clock;
pub use coll::{COLL_ROWS, CollRound, collectives};
pub use netmem::{UDP_MEMORY_SIZES, UdpMemory, udp_memory};
pub use pin::{allowed_cpus, pair_cpus, pin_to, set_cpus};
pub use requests::{Api, RequestsRow, requests};
pub use ring::Ring;
pub use rma::{CRUNCH_PASSES, GET_WINDOW, OVERLAP_PART, RmaOp, RmaSync, crunch};
pub use stats::Summary;
#[cfg(feature = "verbs")]
pub use udmem::{UdMemory, ud_memory};

use crate::launch::server::process_mapping;
use crate::launch::{Exit, Job, LaunchError, Pmi, Spec, Watch, new_kvsname};
use nemesis::ProtocolId;
use nemesis::bootstrap::{Boot, BootError, PmiClient};
use nemesis::channel::{Channel, ChannelError, Header, NO_SHM_VAR, NemesisChannel, Packet, ShmChannel};
use nemesis::shm::Segment;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Set in a partner's environment to the role it plays: `partner` or `ring`.
pub const ROLE_VAR: &str = "NEMESIS_MEASURE_ROLE";
const CPU_VAR: &str = "NEMESIS_MEASURE_CPU";
const RING_VAR: &str = "NEMESIS_MEASURE_RING";

/// The measurement's own packets, of the benchmarks' protocol, so that a world on the
/// same channel never takes them for its own.
const KIND_CTRL: u16 = ProtocolId::BENCH.kind(0x01);
const KIND_DATA: u16 = ProtocolId::BENCH.kind(0x02);
const KIND_ACK: u16 = ProtocolId::BENCH.kind(0x03);
const KIND_DONE: u16 = ProtocolId::BENCH.kind(0x04);

const OP_ECHO: u32 = 1;
const OP_PROBE: u32 = 2;
const OP_SINK: u32 = 3;
const OP_QUIT: u32 = 4;
const OP_FLOOR: u32 = 5;
const OP_ECHO_P2P: u32 = 6;
const OP_SINK_P2P: u32 = 7;
const OP_TCP_CONNECT: u32 = 8;
const OP_TCP_ECHO: u32 = 9;
const OP_TCP_SINK: u32 = 10;
const OP_RMA: u32 = 11;

/// Which transport carries a pair's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The node's shared segment.
    Shm,
    /// The tcp netmod, shared memory turned off (`NEMESIS_NO_SHM=1`).
    Tcp,
    /// The udp netmod, shared memory turned off.
    Udp,
    /// The ud netmod (InfiniBand verbs), shared memory turned off; needs a build with
    /// the `verbs` feature.
    Ud,
    /// The rc netmod (InfiniBand verbs), likewise.
    Rc,
}

impl Transport {
    /// Every transport, by name.
    pub const ALL: [Transport; 5] = [
        Transport::Shm,
        Transport::Tcp,
        Transport::Udp,
        Transport::Ud,
        Transport::Rc,
    ];

    /// Its name, as in the JSON rows and `NEMESIS_NETMOD`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Ud => "ud",
            Transport::Rc => "rc",
        }
    }

    /// The transport called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The variables that force it on both processes of a pair.
    fn env(self) -> Vec<(OsString, OsString)> {
        match self {
            Transport::Shm => Vec::new(),
            net => vec![
                (NO_SHM_VAR.into(), "1".into()),
                (nemesis::net::config::NETMOD_VAR.into(), net.name().into()),
            ],
        }
    }
}

/// Which layer a latency measurement goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// The channel: [`Channel::send`] and [`Channel::poll`].
    Channel,
    /// Two-sided messaging: [`nemesis::World::send`] and [`nemesis::World::recv`].
    P2p,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeasureError {
    /// The channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// Start-up failed.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// The partner could not be started.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// A partner ended before its time.
    #[error("partner rank {rank} {exit}")]
    PartnerDied {
        /// Its rank.
        rank: u32,
        /// How it ended.
        exit: Exit,
    },
    /// A packet broke the measurement protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Two-sided messaging failed.
    #[error(transparent)]
    P2p(#[from] nemesis::p2p::P2pError),
    /// Something else.
    #[error("{0}")]
    Other(String),
}

type Result<T> = std::result::Result<T, MeasureError>;

/// The CPU this runs on, as `lscpu` names it, with its family (Zen 4 is 25, Zen 5 is
/// 26): figures are compared only between runs on the same model.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    match (field("model name"), field("cpu family")) {
        (Some(m), Some(f)) => format!("{m} (family {f})"),
        (Some(m), None) => m,
        _ => "an unknown CPU".into(),
    }
}

/// If this process was started as a measurement partner, plays its role and exits.
/// Call it first thing in `main` of any program that uses [`Pair`] or [`Ring`].
pub fn serve_if_partner() {
    let Ok(role) = std::env::var(ROLE_VAR) else { return };
    let r = match role.as_str() {
        "partner" => partner(),
        "ring" => ring::rank(),
        "coll" => coll::coll_rank(),
        other => Err(MeasureError::Other(format!("unknown {ROLE_VAR}={other:?}"))),
    };
    match r {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("nemesis measurement {role}: {e}");
            std::process::exit(1);
        }
    }
}

fn ctrl(op: u32) -> Header {
    Header {
        kind: KIND_CTRL,
        aux: op,
        ..Header::default()
    }
}

fn data() -> Header {
    Header {
        kind: KIND_DATA,
        ..Header::default()
    }
}

fn args_bytes(a: [u64; 3]) -> [u8; 24] {
    let mut b = [0u8; 24];
    for (i, v) in a.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

fn args_of(p: &[u8]) -> Result<[u64; 3]> {
    if p.len() != 24 {
        return Err(MeasureError::Protocol(format!(
            "control packet of {} bytes",
            p.len()
        )));
    }
    let word = |i: usize| u64::from_le_bytes(p[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Ok([word(0), word(1), word(2)])
}

/// Sends `msg` to `to` as packets of at most `max` bytes: a message longer than one
/// packet goes as the channel's own chunks, as `bw --layer channel` sends it. What waits
/// for room is flushed before each piece; nothing may come back meanwhile.
fn send_pieces(ch: &mut NemesisChannel, to: u32, msg: &[u8], max: usize) -> Result<()> {
    for piece in msg.chunks(max.max(1)) {
        while ch.pending() > 0 {
            let mut stray = 0;
            ch.poll(|_| stray += 1)?;
            if stray > 0 {
                return Err(MeasureError::Protocol(format!(
                    "{stray} packets arrived while a message was being sent"
                )));
            }
        }
        ch.send_bytes(to, data(), piece)?;
    }
    Ok(())
}

/// Spins on `poll` until packets holding `want` bytes in all arrived, copying each after
/// the last into `buf` (as much as fits). Calls `alive` now and then.
fn recv_pieces(
    ch: &mut NemesisChannel,
    buf: &mut [u8],
    want: usize,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<usize> {
    let mut got = 0usize;
    let mut spins = 0u32;
    while got < want {
        let n = ch.poll(|p: Packet<'_>| {
            let end = (got + p.payload.len()).min(buf.len());
            if got < end {
                buf[got..end].copy_from_slice(&p.payload[..end - got]);
            }
            got += p.payload.len();
        })?;
        if n == 0 {
            spins = spins.wrapping_add(1);
            if spins % (1 << 20) == 0 {
                alive()?;
            }
        }
    }
    if got != want {
        return Err(MeasureError::Protocol(format!(
            "{got} bytes arrived for a message of {want}"
        )));
    }
    Ok(got)
}

/// One round trip of `msg` to the echo that [`Pair`]'s ping-pongs start: in one packet
/// into `buf`, or, when `back` is there (as long as `msg`), as packets of at most `max`
/// bytes into it. Returns the length of the echo.
fn round_trip(
    ch: &mut NemesisChannel,
    msg: &[u8],
    buf: &mut [u8],
    back: Option<&mut [u8]>,
    max: usize,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<usize> {
    match back {
        Some(back) => {
            send_pieces(ch, 1, msg, max)?;
            recv_pieces(ch, back, msg.len(), alive)
        }
        None => {
            ch.send_bytes(1, data(), msg)?;
            Ok(spin_recv(ch, buf, alive)?.1)
        }
    }
}

/// Spins on `poll` until exactly one packet arrives, copying its payload into `buf`.
/// Calls `alive` now and then, so a dead peer ends the wait.
#[inline]
fn spin_recv(
    ch: &mut NemesisChannel,
    buf: &mut [u8],
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<(Header, usize)> {
    let mut got: Option<(Header, usize)> = None;
    let mut extra = 0usize;
    let mut spins = 0u32;
    loop {
        let n = ch.poll(|p: Packet<'_>| {
            if got.is_some() {
                extra += 1;
                return;
            }
            let len = p.payload.len().min(buf.len());
            buf[..len].copy_from_slice(&p.payload[..len]);
            got = Some((p.header, p.payload.len()));
        })?;
        if n > 0 {
            if extra > 0 {
                return Err(MeasureError::Protocol(format!(
                    "{extra} unexpected extra packets"
                )));
            }
            return got.ok_or_else(|| MeasureError::Protocol("no packet".into()));
        }
        spins = spins.wrapping_add(1);
        if spins % (1 << 20) == 0 {
            alive()?;
        }
    }
}

/// Waits (spin, yield, sleep) until packets arrive, and appends every one that a poll
/// hands up to `into`, in order.
fn blocking_recv(
    ch: &mut NemesisChannel,
    into: &mut early::Stash,
    peers_alive: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let mut last_check = Instant::now();
    loop {
        ch.poll(|p| into.push_back((p.header, p.payload.to_vec())))?;
        if !into.is_empty() {
            return Ok(());
        }
        ch.wait(Some(Duration::from_secs(1)))?;
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            peers_alive()?;
        }
    }
}

/// Lets the network deliver what this side owes, acknowledgements included, before a
/// phase in which it does not poll (a probe on cache lines, plain TCP): a reliable
/// datagram netmod resends only from a poll, so a lost packet would otherwise stall the
/// pair. Bounded; what is still owed then is settled at the next poll.
fn settle(ch: &mut NemesisChannel) -> Result<()> {
    match ch.flush(SETTLE) {
        Ok(()) | Err(ChannelError::FlushTimeout { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How long [`settle`] waits at most.
const SETTLE: Duration = Duration::from_secs(1);

/// The segment whose cache lines the placement probe uses: the channel's own when the
/// partner shares it, or else the node's segment joined just for the probe (the
/// channel goes through the network and made none).
fn probe_segment(ch: &NemesisChannel) -> Result<Arc<Segment>> {
    if ch.shm().has_local_peers() {
        return Ok(ch.shm().segment().clone());
    }
    let info = ch
        .boot_info()
        .ok_or_else(|| MeasureError::Other("a probe needs a channel made at start-up".into()))?;
    let spec = ShmChannel::node_spec(info)?;
    let seg = Segment::join(&spec, info.local_index).map_err(ChannelError::from)?;
    Ok(Arc::new(seg))
}

/// Reads the variables of `env` first, then the process's own: how rank 0 of a pair
/// sees the variables its partner is started with.
fn overlay(env: &[(OsString, OsString)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |k| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .or_else(|| std::env::var(k).ok())
    }
}

/// What [`Pair::stream_p2p`] streams.
#[derive(Debug, Clone, Copy)]
pub struct StreamPlan {
    /// Bytes of each message.
    pub size: usize,
    /// Non-blocking sends per window.
    pub window: u64,
    /// Timed windows.
    pub iters: u64,
    /// Untimed windows before them.
    pub warmup: u64,
    /// The large-message strategy of both sides: `None`, automatic (medium messages
    /// included); a strategy named forces the rendezvous.
    pub lmt: Option<nemesis::lmt::Strategy>,
    /// The receiver pre-posts the window into one buffer, as osu_bw's does, instead of
    /// distinct ones.
    pub osu: bool,
    /// The sender's medium limit in a stream; `None`, as the environment says.
    pub stream_medium_limit: Option<usize>,
}

impl StreamPlan {
    /// `warmup + iters` windows of `window` messages of `size` bytes, with the
    /// automatic strategy, into distinct buffers.
    pub fn new(size: usize, window: u64, iters: u64, warmup: u64) -> Self {
        Self {
            size,
            window,
            iters,
            warmup,
            lmt: None,
            osu: false,
            stream_medium_limit: None,
        }
    }
}

/// Two processes, this one rank 0, measuring the channel between them.
#[derive(Debug)]
pub struct Pair {
    ch: NemesisChannel,
    transport: Transport,
    probe_seg: Arc<Segment>,
    /// A plain TCP connection to the partner, for the reference figures of the
    /// network transports; made on first use.
    tcp: Option<TcpStream>,
    job: Option<Job>,
    clock: Clock,
    pinned: Option<(usize, usize)>,
    buf: Vec<u8>,
    /// What the streaming benchmarks send from and receive into.
    bufs: BufKind,
    /// How far past a page boundary the two-sided receive buffers start (ping-pong and
    /// stream).
    recv_skew: usize,
    /// What the sends of the last [`Pair::stream_p2p`] went by.
    last_counts: nemesis::SendCounts,
}

/// Memory the streaming benchmarks send from and receive into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufKind {
    /// Ordinary memory (page-aligned): a large message to another node is registered
    /// for RDMA each time.
    #[default]
    Heap,
    /// [`nemesis::Pinned`] buffers, whose registrations are kept.
    Pinned,
}

impl BufKind {
    /// Its name, as `--buffers` takes it.
    pub fn name(self) -> &'static str {
        match self {
            BufKind::Heap => "heap",
            BufKind::Pinned => "pinned",
        }
    }

    fn make(self, len: usize) -> Result<Buf> {
        self.make_at(len, 0)
    }

    /// A buffer of `len` bytes, `skew` bytes past a page boundary (heap only).
    fn make_at(self, len: usize, skew: usize) -> Result<Buf> {
        Ok(match self {
            BufKind::Heap => Buf::Heap(PageAligned::at(len, skew)),
            BufKind::Pinned if skew != 0 => {
                return Err(MeasureError::Other(
                    "pinned buffers start on a page boundary".into(),
                ));
            }
            BufKind::Pinned => Buf::Pinned(
                nemesis::Pinned::new(len)
                    .map_err(|e| MeasureError::Other(format!("a pinned buffer: {e}")))?,
            ),
        })
    }
}

/// A buffer of a [`BufKind`].
enum Buf {
    Heap(PageAligned),
    Pinned(nemesis::Pinned),
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Buf::Heap(b) => b,
            Buf::Pinned(b) => b,
        }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Heap(b) => b,
            Buf::Pinned(b) => b,
        }
    }
}

impl Pair {
    /// Starts the partner from this executable and joins it over shared memory. With
    /// `pin`, and two CPUs to choose from, each side runs on a CPU of its own.
    pub fn start(pin: bool) -> Result<Self> {
        Self::start_over(pin, Transport::Shm)
    }

    /// As [`Pair::start`], with the messages going over `transport`.
    pub fn start_over(pin: bool, transport: Transport) -> Result<Self> {
        Self::start_on(if pin { pair_cpus() } else { None }, transport)
    }

    /// As [`Pair::start_over`], pinning rank 0 and the partner to the CPUs `pinned`
    /// names. Pairs started one after the other must be given the same CPUs: once rank
    /// 0 is pinned, it would find only its own CPU to choose from.
    pub fn start_on(pinned: Option<(usize, usize)>, transport: Transport) -> Result<Self> {
        let mut env = vec![(ROLE_VAR.into(), "partner".into())];
        if let Some((_, c1)) = pinned {
            env.push((CPU_VAR.into(), c1.to_string().into()));
        }
        env.extend(transport.env());
        let (job, ch) = start_job(2, env)?;
        let probe_seg = probe_segment(&ch)?;
        if let Some((c0, _)) = pinned {
            pin_to(c0).map_err(|e| MeasureError::Other(format!("pinning to cpu {c0}: {e}")))?;
        }
        let clock = Clock::calibrate();
        // Over a netmod a packet may be longer than a cell.
        let max = ch.max_payload_to(1);
        Ok(Self {
            ch,
            transport,
            probe_seg,
            tcp: None,
            job: Some(job),
            clock,
            pinned,
            buf: vec![0; max.max(24)],
            bufs: BufKind::Heap,
            recv_skew: 0,
            last_counts: nemesis::SendCounts::default(),
        })
    }

    /// Has the two-sided benchmarks receive into buffers `skew` bytes past a page
    /// boundary, where they send from one: a copy whose destination is a few bytes
    /// ahead of its source within a page can be many times slower (`nemesis_shm::copy`).
    /// In the ping-pong both sides receive so, and each echoes from its receive buffer.
    ///
    /// # Errors
    /// A skew of a page or more.
    pub fn set_recv_skew(&mut self, skew: usize) -> Result<()> {
        self.recv_skew = checked_skew(skew)?;
        Ok(())
    }

    /// Has the streaming benchmarks send from and receive into `kind` of memory.
    pub fn set_buffers(&mut self, kind: BufKind) {
        self.bufs = kind;
    }

    /// The transport the pair's messages take.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The CPUs of rank 0 and rank 1, when pinned.
    pub fn pinned(&self) -> Option<(usize, usize)> {
        self.pinned
    }

    /// The channel to the partner.
    pub fn channel(&mut self) -> &mut NemesisChannel {
        &mut self.ch
    }

    /// The clock used for samples.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn alive_check(job: &mut Option<Job>) -> impl FnMut() -> Result<()> + '_ {
        move || match job.as_mut().and_then(|j| j.reap().into_iter().next()) {
            Some((rank, exit)) => Err(MeasureError::PartnerDied { rank, exit }),
            None if job.as_ref().is_some_and(|j| j.finished()) => Err(MeasureError::PartnerDied {
                rank: 1,
                exit: Exit::Code(0),
            }),
            None => Ok(()),
        }
    }

    /// Sends a control packet and waits for the partner to acknowledge it.
    fn command(&mut self, op: u32, args: [u64; 3]) -> Result<()> {
        self.ch.send_bytes(1, ctrl(op), &args_bytes(args))?;
        let mut alive = Self::alive_check(&mut self.job);
        let (h, _) = spin_recv(&mut self.ch, &mut self.buf, &mut alive)?;
        if h.kind != KIND_ACK || h.aux != op {
            return Err(MeasureError::Protocol(format!(
                "expected the ack of op {op}, got {h:?}"
            )));
        }
        settle(&mut self.ch)
    }

    /// `warmup + iters` ping-pongs of `size` bytes through `layer`; pushes the round-trip
    /// time of each of the last `iters`, in ticks, onto `rtt`.
    pub fn ping_pong_through(
        &mut self,
        layer: Layer,
        size: usize,
        iters: u64,
        warmup: u64,
        rtt: &mut Vec<u64>,
    ) -> Result<()> {
        match layer {
            Layer::Channel => self.ping_pong(size, iters, warmup, rtt),
            Layer::P2p => self.ping_pong_p2p(size, iters, warmup, rtt),
        }
    }

    fn ping_pong_p2p(&mut self, size: usize, iters: u64, warmup: u64, rtt: &mut Vec<u64>) -> Result<()> {
        self.command(OP_ECHO_P2P, [warmup + iters, size as u64, self.recv_skew as u64])?;
        let mut msg = PageAligned::new(size);
        msg.fill(0xa5);
        let mut buf = PageAligned::at(size, self.recv_skew);
        let clock = self.clock;
        let mut w = nemesis::World::new(&mut self.ch).map_err(|e| MeasureError::Other(e.to_string()))?;
        let c = w.comm();
        for i in 0..warmup + iters {
            let t0 = clock.now();
            w.send(&c, 1, 0, &msg)
                .map_err(|e| MeasureError::Other(e.to_string()))?;
            let st = w
                .recv(&c, 1, 0, &mut buf)
                .map_err(|e| MeasureError::Other(e.to_string()))?;
            let t1 = clock.now();
            if st.len != size {
                return Err(MeasureError::Protocol(format!(
                    "echo of {} bytes, sent {size}",
                    st.len
                )));
            }
            if i >= warmup {
                rtt.push(t1.wrapping_sub(t0));
            }
        }
        Ok(())
    }

    /// `warmup + iters` ping-pongs of `size` bytes through the channel; pushes the
    /// round-trip time of each of the last `iters`, in ticks, onto `rtt`.
    ///
    /// A message longer than the channel's largest packet to the peer goes as packets of
    /// that size, and the echo returns once all of them came.
    pub fn ping_pong(&mut self, size: usize, iters: u64, warmup: u64, rtt: &mut Vec<u64>) -> Result<()> {
        let max = self.ch.max_payload_to(1);
        let pieces = size > max;
        self.command(OP_ECHO, [warmup + iters, if pieces { size as u64 } else { 0 }, 0])?;
        let msg = vec![0xa5u8; size];
        let mut back = vec![0u8; if pieces { size } else { 0 }];
        let clock = self.clock;
        let mut alive = Self::alive_check(&mut self.job);
        for i in 0..warmup + iters {
            let t0 = clock.now();
            let echo = pieces.then_some(&mut back[..]);
            let len = round_trip(&mut self.ch, &msg, &mut self.buf, echo, max, &mut alive)?;
            let t1 = clock.now();
            if len != size {
                return Err(MeasureError::Protocol(format!(
                    "echo of {len} bytes, sent {size}"
                )));
            }
            if i >= warmup {
                rtt.push(t1.wrapping_sub(t0));
            }
        }
        Ok(())
    }

    /// `iters` ping-pongs of `size` bytes, timed as a whole: for harnesses such as
    /// criterion that want the total.
    pub fn round_trips(&mut self, size: usize, iters: u64) -> Result<Duration> {
        let max = self.ch.max_payload_to(1);
        let pieces = size > max;
        self.command(OP_ECHO, [iters, if pieces { size as u64 } else { 0 }, 0])?;
        let msg = vec![0xa5u8; size];
        let mut back = vec![0u8; if pieces { size } else { 0 }];
        let mut alive = Self::alive_check(&mut self.job);
        let start = Instant::now();
        for _ in 0..iters {
            let echo = pieces.then_some(&mut back[..]);
            round_trip(&mut self.ch, &msg, &mut self.buf, echo, max, &mut alive)?;
        }
        Ok(start.elapsed())
    }

    /// `warmup + iters` round trips of one cache line between the two processes, both
    /// writing it, with nothing else: the placement probe. Pushes round-trip ticks onto
    /// `rtt`.
    pub fn probe(&mut self, iters: u64, warmup: u64, rtt: &mut Vec<u64>) -> Result<()> {
        self.line_ping_pong(OP_PROBE, iters, warmup, rtt)
    }

    /// As [`Pair::probe`], but each direction has a line of its own, written only by its
    /// sender: the floor for any transport whose lines have single writers, as this
    /// one's fastboxes do.
    pub fn floor(&mut self, iters: u64, warmup: u64, rtt: &mut Vec<u64>) -> Result<()> {
        self.line_ping_pong(OP_FLOOR, iters, warmup, rtt)
    }

    fn line_ping_pong(&mut self, op: u32, iters: u64, warmup: u64, rtt: &mut Vec<u64>) -> Result<()> {
        let seg = self.probe_seg.clone();
        let [ping_line, pong_line] = seg.probe_lines();
        let pong_line = if op == OP_PROBE { ping_line } else { pong_line };
        let base = ping_line
            .load(Ordering::Acquire)
            .max(pong_line.load(Ordering::Acquire));
        self.command(op, [warmup + iters, base, 0])?;
        let clock = self.clock;
        let mut alive = Self::alive_check(&mut self.job);
        for i in 0..warmup + iters {
            let (ping, pong) = (base + 2 * i + 1, base + 2 * i + 2);
            let t0 = clock.now();
            ping_line.store(ping, Ordering::Release);
            let mut spins = 0u32;
            while pong_line.load(Ordering::Acquire) != pong {
                core::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins % (1 << 22) == 0 {
                    alive()?;
                }
            }
            let t1 = clock.now();
            if i >= warmup {
                rtt.push(t1.wrapping_sub(t0));
            }
        }
        Ok(())
    }

    /// osu_bw-style streaming: `warmup + iters` windows of `window` messages of `size`
    /// bytes, each window acknowledged by the partner. Messages above one packet go as
    /// several packets. Returns the seconds the last `iters` windows took.
    pub fn stream(&mut self, size: usize, window: u64, iters: u64, warmup: u64) -> Result<f64> {
        let max = self.ch.max_payload();
        let pieces = size.div_ceil(max).max(1) as u64;
        let per_window = window * pieces;
        self.command(OP_SINK, [(warmup + iters) * per_window, per_window, 0])?;
        let msg = vec![0x5au8; size];
        let mut alive = Self::alive_check(&mut self.job);
        let mut start = Instant::now();
        for it in 0..warmup + iters {
            if it == warmup {
                start = Instant::now();
            }
            for _ in 0..window {
                let mut chunks = msg.chunks(max);
                let first: &[u8] = chunks.next().unwrap_or(&[]);
                for piece in std::iter::once(first).chain(chunks) {
                    while self.ch.pending() > 0 {
                        // Nothing is due back before the window's ack.
                        let mut stray = 0;
                        self.ch.poll(|_| stray += 1)?;
                        if stray > 0 {
                            return Err(MeasureError::Protocol(format!(
                                "{stray} stray packets within a window"
                            )));
                        }
                    }
                    self.ch.send_bytes(1, data(), piece)?;
                }
            }
            let (h, _) = spin_recv(&mut self.ch, &mut self.buf, &mut alive)?;
            if h.kind != KIND_ACK {
                return Err(MeasureError::Protocol(format!(
                    "expected a window ack, got {h:?}"
                )));
            }
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// osu_bw-style streaming through two-sided messaging, as `plan` says: windows of
    /// non-blocking sends, each window acknowledged by a message back. Returns the
    /// seconds the timed windows took.
    pub fn stream_p2p(&mut self, plan: StreamPlan) -> Result<f64> {
        let StreamPlan {
            size,
            window,
            iters,
            warmup,
            lmt,
            osu,
            stream_medium_limit,
        } = plan;
        if self.bufs == BufKind::Pinned && self.recv_skew != 0 {
            return Err(MeasureError::Other(
                "a receive skew with pinned buffers: they start on a page boundary".into(),
            ));
        }
        let code = lmt.map_or(0, |s| s as u64 + 1);
        set_lmt(&mut self.ch, code)?;
        let osu_bit = u64::from(osu) << SINK_OSU_BIT;
        let pinned_bit = u64::from(self.bufs == BufKind::Pinned) << SINK_PINNED_BIT;
        let skew = (self.recv_skew as u64) << SINK_SKEW_SHIFT;
        self.command(
            OP_SINK_P2P,
            [
                warmup + iters,
                window | code << 32 | osu_bit | pinned_bit | skew,
                size as u64,
            ],
        )?;
        let other = |e: nemesis::P2pError| MeasureError::Other(e.to_string());
        let mut msg_buf = self.bufs.make(size)?;
        msg_buf.fill(0x5a);
        let msg = &*msg_buf;
        let mut ack = [0u8; 4];
        let mut cfg = nemesis::p2p::Config::from_env(self.ch.max_payload()).map_err(other)?;
        if lmt.is_some() {
            cfg.medium_limit = 0;
            cfg.stream_tune_limit = 0;
        }
        if let Some(l) = stream_medium_limit {
            // A way forced: the sender's choice by time stays out of it.
            cfg.stream_medium_limit = l.min(cfg.medium_limit);
            cfg.stream_tune_limit = 0;
        }
        let mut w = nemesis::World::with_config(&mut self.ch, cfg).map_err(other)?;
        let c = w.comm();
        let mut start = Instant::now();
        for it in 0..warmup + iters {
            if it == warmup {
                start = Instant::now();
            }
            w.scope(|s| {
                // As osu_bw's array of requests: no growing while the window starts.
                let mut reqs = Vec::with_capacity(window as usize);
                for _ in 0..window {
                    reqs.push(s.isend(&c, 1, 1, msg)?);
                }
                s.waitall(reqs).map(|_| ())
            })
            .map_err(other)?;
            w.recv(&c, 1, 2, &mut ack).map_err(other)?;
        }
        let secs = start.elapsed().as_secs_f64();
        self.last_counts = w.send_counts();
        Ok(secs)
    }

    /// What the sends of the last [`Pair::stream_p2p`] went by (its warm-up included).
    pub fn last_send_counts(&self) -> nemesis::SendCounts {
        self.last_counts
    }

    /// Whether this CPU's kernel copies were found slow with the destination a few bytes
    /// ahead of the source in its page (`nemesis::lmt::LocalLmt::kernel_skew_slow`).
    pub fn kernel_skew_slow(&mut self) -> bool {
        self.ch.shm_mut().local_lmt().kernel_skew_slow()
    }

    /// The strategy automatic selection gives a message of `size` bytes between the two
    /// (above the eager limit).
    pub fn auto_lmt(&mut self, size: usize) -> nemesis::lmt::Strategy {
        use nemesis::Channel;
        if self.transport != Transport::Shm {
            let policy = self.ch.shm_mut().local_lmt().policy();
            return if self.ch.rdma().is_some() && policy.rdma_for(size) {
                nemesis::lmt::Strategy::Rdma
            } else {
                nemesis::lmt::Strategy::Chunks
            };
        }
        self.ch.shm_mut().local_lmt().auto_choice(size)
    }

    /// Connects the plain TCP socket of the reference figures, once.
    fn plain_tcp(&mut self) -> Result<&mut TcpStream> {
        if self.tcp.is_none() {
            let io = |what: &str, e: std::io::Error| MeasureError::Other(format!("plain tcp: {what}: {e}"));
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| io("bind", e))?;
            let port = l.local_addr().map_err(|e| io("local address", e))?.port();
            self.command(OP_TCP_CONNECT, [u64::from(port), 0, 0])?;
            let (s, _) = l.accept().map_err(|e| io("accept", e))?;
            s.set_nodelay(true).map_err(|e| io("TCP_NODELAY", e))?;
            self.tcp = Some(s);
        }
        Ok(self.tcp.as_mut().expect("connected above"))
    }

    /// The reference for the network transports: `warmup + iters` ping-pongs of
    /// `size` bytes (at least 1) over a plain TCP socket on loopback between the same two
    /// processes, both sides blocking in `read`, or with `spin` both polling a
    /// non-blocking socket as the netmods do. Pushes round-trip ticks onto `rtt`.
    pub fn tcp_ping_pong(
        &mut self,
        size: usize,
        iters: u64,
        warmup: u64,
        spin: bool,
        rtt: &mut Vec<u64>,
    ) -> Result<()> {
        let size = size.max(1);
        self.plain_tcp()?;
        self.command(OP_TCP_ECHO, [warmup + iters, size as u64, u64::from(spin)])?;
        let clock = self.clock;
        let s = self.tcp.as_mut().expect("connected");
        let io = |e: std::io::Error| MeasureError::Other(format!("plain tcp ping-pong: {e}"));
        s.set_nonblocking(spin).map_err(io)?;
        let msg = vec![0xa5u8; size];
        let mut back = vec![0u8; size];
        for i in 0..warmup + iters {
            let t0 = clock.now();
            s.write_all(&msg).map_err(io)?;
            read_all(s, &mut back).map_err(io)?;
            let t1 = clock.now();
            if i >= warmup {
                rtt.push(t1.wrapping_sub(t0));
            }
        }
        s.set_nonblocking(false).map_err(io)
    }

    /// The reference for the network transports: osu_bw-style streaming over a plain
    /// blocking TCP socket, `warmup + iters` windows of `window` messages of `size`
    /// bytes, each window acknowledged by 4 bytes back. Returns the seconds of the last
    /// `iters` windows.
    pub fn tcp_stream(&mut self, size: usize, window: u64, iters: u64, warmup: u64) -> Result<f64> {
        self.plain_tcp()?;
        self.command(OP_TCP_SINK, [warmup + iters, window, size as u64])?;
        let s = self.tcp.as_mut().expect("connected");
        let mut msg = PageAligned::new(size);
        msg.fill(0x5a);
        let mut ack = [0u8; 4];
        let io = |e: std::io::Error| MeasureError::Other(format!("plain tcp stream: {e}"));
        let mut start = Instant::now();
        for it in 0..warmup + iters {
            if it == warmup {
                start = Instant::now();
            }
            for _ in 0..window {
                s.write_all(&msg).map_err(io)?;
            }
            s.read_exact(&mut ack).map_err(io)?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Lets the pair's channel make progress between its measurements, while another
    /// pair is measured: acknowledgements a reliable datagram netmod owes go out, so the
    /// partner does not take us for dead. Nothing should arrive.
    pub fn tend(&mut self) -> Result<()> {
        let mut stray = 0;
        self.ch.poll(|_| stray += 1)?;
        if stray > 0 {
            return Err(MeasureError::Protocol(format!(
                "{stray} stray packets between measurements"
            )));
        }
        Ok(())
    }

    /// Tells the partner to quit and waits for it.
    pub fn finish(mut self) -> Result<()> {
        self.ch.send_bytes(1, ctrl(OP_QUIT), &args_bytes([0; 3]))?;
        self.ch.flush(Duration::from_secs(10))?;
        end_job(
            self.job.take().expect("job present until finish"),
            Duration::from_secs(30),
        )
    }
}

/// The partner's side: obey control packets until told to quit.
fn partner() -> Result<()> {
    if let Some(cpu) = std::env::var(CPU_VAR).ok().and_then(|c| c.parse().ok()) {
        pin_to(cpu).map_err(|e| MeasureError::Other(format!("pinning to cpu {cpu}: {e}")))?;
    }
    let mut ch = NemesisChannel::init()?;
    let probe_seg = probe_segment(&ch)?;
    let mut buf = vec![0u8; ch.max_payload_to(0).max(24)];
    let mut tcp: Option<TcpStream> = None;
    // Our parent's death kills us (parent-death signal); nothing else to watch.
    let mut alive = || Ok(());
    let policy = ch.shm().wait_policy();
    // Between measurements, sleep at once rather than spin or yield: another pair may
    // be measuring on the same CPU.
    let idle = nemesis::WaitPolicy {
        spin: 0,
        yields: 0,
        ..policy
    };
    // Commands not obeyed yet, in order: those a world of the partner's took while it
    // ran, and any that came in one poll with another.
    let mut early = early::Stash::new();
    loop {
        if early.is_empty() {
            ch.shm_mut().set_wait_policy(idle);
            let got = blocking_recv(&mut ch, &mut early, &mut alive);
            ch.shm_mut().set_wait_policy(policy);
            got?;
        }
        let Some((h, data)) = early.pop_front() else {
            continue;
        };
        let len = data.len().min(buf.len());
        buf[..len].copy_from_slice(&data[..len]);
        if h.kind != KIND_CTRL {
            return Err(MeasureError::Protocol(format!(
                "expected a control packet, got {h:?}"
            )));
        }
        let [count, arg, _] = args_of(&buf[..len])?;
        let ack = Header {
            kind: KIND_ACK,
            aux: h.aux,
            ..Header::default()
        };
        match h.aux {
            // `arg`: 0 for messages of one packet, echoed packet by packet; else the
            // length of a message sent as several, echoed once all of it came.
            OP_ECHO if arg > 0 => {
                ch.send_bytes(0, ack, &[])?;
                let mut msg = vec![0u8; arg as usize];
                let max = ch.max_payload_to(0);
                for _ in 0..count {
                    recv_pieces(&mut ch, &mut msg, arg as usize, &mut alive)?;
                    send_pieces(&mut ch, 0, &msg, max)?;
                }
            }
            OP_ECHO => {
                ch.send_bytes(0, ack, &[])?;
                for _ in 0..count {
                    let (h, len) = spin_recv(&mut ch, &mut buf, &mut alive)?;
                    ch.send_bytes(0, h, &buf[..len])?;
                }
            }
            OP_ECHO_P2P => {
                ch.send_bytes(0, ack, &[])?;
                let skew = args_of(&buf[..len])?[2] as usize;
                early::with_world(&mut ch, &mut early, |w| {
                    let c = w.comm();
                    let mut big = PageAligned::at(arg as usize, skew);
                    for _ in 0..count {
                        let st = w
                            .recv(&c, 0, 0, &mut big)
                            .map_err(|e| MeasureError::Other(e.to_string()))?;
                        w.send(&c, 0, 0, &big[..st.len])
                            .map_err(|e| MeasureError::Other(e.to_string()))?;
                    }
                    Ok(())
                })?;
            }
            OP_PROBE | OP_FLOOR => {
                let seg = probe_seg.clone();
                let [ping_line, pong_line] = seg.probe_lines();
                let pong_line = if h.aux == OP_PROBE { ping_line } else { pong_line };
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
                for i in 0..count {
                    while ping_line.load(Ordering::Acquire) != arg + 2 * i + 1 {
                        core::hint::spin_loop();
                    }
                    pong_line.store(arg + 2 * i + 2, Ordering::Release);
                }
            }
            OP_SINK => {
                ch.send_bytes(0, ack, &[])?;
                let (total, per_ack) = (count, arg.max(1));
                let mut seen = 0u64;
                while seen < total {
                    let before = seen;
                    ch.poll(|p| {
                        let n = p.payload.len().min(buf.len());
                        buf[..n].copy_from_slice(&p.payload[..n]);
                        seen += 1;
                    })?;
                    if seen / per_ack > before / per_ack {
                        ch.send_bytes(0, ack, &[])?;
                    }
                }
            }
            OP_SINK_P2P => {
                let (window, code, size) = (arg & 0xffff_ffff, arg >> 32 & 0xff, args_of(&buf[..len])?[2]);
                let osu = arg >> SINK_OSU_BIT & 1 == 1;
                let skew = (arg >> SINK_SKEW_SHIFT & 0xfff) as usize;
                let kind = if arg >> SINK_PINNED_BIT & 1 == 1 {
                    BufKind::Pinned
                } else {
                    BufKind::Heap
                };
                set_lmt(&mut ch, code)?;
                ch.send_bytes(0, ack, &[])?;
                let other = |e: nemesis::P2pError| MeasureError::Other(e.to_string());
                early::with_world(&mut ch, &mut early, |w| {
                    let c = w.comm();
                    // As osu_bw does, the window's receives are posted before any arrives, so a
                    // rendezvous's handshakes overlap; as many buffers as fit SINK_BYTES.
                    let depth = (SINK_BYTES / size.max(1)).clamp(1, window) as usize;
                    let depth = if osu { 1 } else { depth };
                    let mut sinks: Vec<Buf> = (0..depth)
                        .map(|_| kind.make_at(size as usize, skew))
                        .collect::<Result<_>>()?;
                    for _ in 0..count {
                        if osu {
                            // osu_bw's receiver: the whole window posted into one buffer.
                            let (p, n) = (sinks[0].as_mut_ptr(), size as usize);
                            w.scope(|s| {
                                // As osu_bw's array of requests, made before the window,
                                // and as the sender's: collected from an iterator of
                                // results, the requests were moved three times each.
                                let mut reqs = Vec::with_capacity(window as usize);
                                for _ in 0..window {
                                    // SAFETY: the buffer outlives the scope, and only these
                                    // receives touch it until the scope ends.
                                    reqs.push(unsafe { s.irecv_raw(&c, 0, 1, p, n) }?);
                                }
                                s.waitall(reqs).map(|_| ())
                            })
                            .map_err(other)?;
                            w.send(&c, 0, 2, &[0; 4]).map_err(other)?;
                            continue;
                        }
                        let mut left = window as usize;
                        while left > 0 {
                            let k = left.min(depth);
                            w.scope(|s| {
                                let mut reqs = Vec::with_capacity(k);
                                for b in &mut sinks[..k] {
                                    reqs.push(s.irecv(&c, 0, 1, &mut b[..])?);
                                }
                                s.waitall(reqs).map(|_| ())
                            })
                            .map_err(other)?;
                            left -= k;
                        }
                        w.send(&c, 0, 2, &[0; 4]).map_err(other)?;
                    }
                    Ok(())
                })?;
            }
            OP_TCP_CONNECT => {
                let s = TcpStream::connect((Ipv4Addr::LOCALHOST, count as u16))
                    .and_then(|s| s.set_nodelay(true).map(|_| s))
                    .map_err(|e| MeasureError::Other(format!("plain tcp connect: {e}")))?;
                tcp = Some(s);
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
            }
            OP_TCP_ECHO | OP_TCP_SINK => {
                let s = tcp
                    .as_mut()
                    .ok_or_else(|| MeasureError::Protocol("plain tcp is not connected".into()))?;
                let [_, arg2, arg3] = args_of(&buf[..len])?;
                ch.send_bytes(0, ack, &[])?;
                settle(&mut ch)?;
                let io = |e: std::io::Error| MeasureError::Other(format!("plain tcp: {e}"));
                if h.aux == OP_TCP_ECHO {
                    let mut m = vec![0u8; arg as usize];
                    s.set_nonblocking(arg3 != 0).map_err(io)?;
                    for _ in 0..count {
                        read_all(s, &mut m).map_err(io)?;
                        s.write_all(&m).map_err(io)?;
                    }
                    s.set_nonblocking(false).map_err(io)?;
                } else {
                    let (window, size) = (arg2, arg3 as usize);
                    let mut m = PageAligned::new(size);
                    for _ in 0..count {
                        for _ in 0..window {
                            s.read_exact(&mut m).map_err(io)?;
                        }
                        s.write_all(&[0; 4]).map_err(io)?;
                    }
                }
            }
            OP_RMA => {
                let code = args_of(&buf[..len])?[2];
                ch.send_bytes(0, ack, &[])?;
                rma::serve(&mut ch, &mut early, count, arg, code)?;
            }
            OP_QUIT => {
                ch.flush(Duration::from_secs(10))?;
                return Ok(());
            }
            op => return Err(MeasureError::Protocol(format!("unknown op {op}"))),
        }
    }
}

/// Fills `buf` from `s`, spinning while a non-blocking socket has nothing yet.
fn read_all(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => core::hint::spin_loop(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Most bytes of receive buffers a bandwidth partner posts at once.
const SINK_BYTES: u64 = 256 << 20;

/// The bit of a two-sided sink's argument that asks for one receive buffer.
const SINK_OSU_BIT: u32 = 40;
/// In the sink's argument: its buffers are [`nemesis::Pinned`].
const SINK_PINNED_BIT: u32 = 41;
/// In the sink's argument, 12 bits from here: how far past a page boundary its buffers
/// start.
const SINK_SKEW_SHIFT: u32 = 42;

/// `skew` if it is less than a page, as the sink's 12 bits and [`PageAligned::at`] need.
fn checked_skew(skew: usize) -> Result<usize> {
    if skew >= 4096 {
        return Err(MeasureError::Other(format!(
            "a receive skew of {skew} bytes: at most 4095"
        )));
    }
    Ok(skew)
}

/// A buffer that starts on a page boundary, as benchmark buffers do (osu's too): a copy
/// whose destination is a few bytes ahead of its source modulo 4096 can be twenty times
/// slower (`nemesis_shm::copy`), and nemesis's own copies keep clear of that, but the
/// kernel's (CMA) do not, so heap buffers would measure the allocator rather than the
/// transport.
#[derive(Debug)]
pub struct PageAligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl PageAligned {
    /// `len` zero bytes on a page boundary.
    pub fn new(len: usize) -> Self {
        Self::at(len, 0)
    }

    /// `len` zero bytes starting `skew` bytes (below 4096) past a page boundary: where
    /// a benchmark asks for buffers as an allocator might place them.
    pub fn at(len: usize, skew: usize) -> Self {
        let v = vec![0u8; len + 8192];
        let off = v.as_ptr().align_offset(4096).min(4096) + skew % 4096;
        Self { v, off, len }
    }
}

impl std::ops::Deref for PageAligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Sets the large-message policy of `ch` from a strategy code (0: automatic, else the
/// wire code plus one), keeping the rest of the policy.
fn set_lmt(ch: &mut NemesisChannel, code: u64) -> Result<()> {
    let force = match code {
        0 => None,
        c => Some(
            u8::try_from(c - 1)
                .ok()
                .and_then(nemesis::lmt::Strategy::from_code)
                .ok_or_else(|| MeasureError::Protocol(format!("unknown strategy code {c}")))?,
        ),
    };
    let lmt = ch.shm_mut().local_lmt();
    let p = nemesis::lmt::Policy {
        force,
        ..lmt.policy()
    };
    lmt.set_policy(p).map_err(|e| MeasureError::Other(e.to_string()))
}

/// Starts ranks `1..size` of a job from this executable, with `env`, and joins it as
/// rank 0 through the same PMI path as they do.
fn start_job(size: u32, env: Vec<(OsString, OsString)>) -> Result<(Job, NemesisChannel)> {
    let exe = std::env::current_exe().map_err(|e| MeasureError::Other(format!("current_exe: {e}")))?;
    let spec = Spec {
        program: exe.into_os_string(),
        args: Vec::new(),
        size,
        ranks: 1..size,
        kvsname: new_kvsname(),
        env: env.clone(),
        label: false,
        pmi: Pmi::Serve {
            mapping: process_mapping(&[size]),
            self_rank: Some(0),
        },
    };
    let mut job = Job::spawn(spec)?;
    let sock = job
        .take_self_pmi()
        .ok_or_else(|| MeasureError::Other("no PMI socket for rank 0".into()))?;
    let timeout = Duration::from_secs(60);
    let boot = Boot::with_client(PmiClient::from_socket(sock, 0, size, timeout), timeout)?;
    Ok((job, NemesisChannel::from_boot_with(boot, overlay(&env))?))
}

/// Waits up to `timeout` for the partners of a job to exit, and fails if one did not
/// exit cleanly.
fn end_job(job: Job, timeout: Duration) -> Result<()> {
    let out = job.watch(Watch {
        grace: Duration::from_secs(5),
        timeout: Some(timeout),
        report: None,
    });
    match out.first_failure {
        Some((rank, exit)) => Err(MeasureError::PartnerDied { rank, exit }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nemesis::WaitPolicy;
    use nemesis::shm::Geometry;

    /// Two channels over one anonymous segment of this process.
    fn pair() -> (NemesisChannel, NemesisChannel) {
        let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
        let policy = WaitPolicy {
            spin: 64,
            yields: 16,
            slice: Duration::from_millis(1),
        };
        let mk = |r| {
            let shm = ShmChannel::from_segment(seg.clone(), r, 2, &[0, 1], r, policy);
            NemesisChannel::with_netmod(shm.unwrap(), None)
        };
        (mk(0), mk(1))
    }

    fn never_dead() -> Result<()> {
        Ok(())
    }

    /// A message longer than a packet goes as several and comes back whole; more bytes
    /// than the message, or a packet from the peer while ours wait for room, are
    /// protocol errors.
    #[test]
    fn a_message_in_pieces_arrives_whole_and_strays_are_errors() {
        let (mut a, mut b) = pair();
        let max = a.max_payload_to(1);
        let msg: Vec<u8> = (0..3 * max + 17).map(|i| i as u8).collect();
        send_pieces(&mut a, 1, &msg, max).unwrap();
        let mut got = vec![0u8; msg.len()];
        let n = recv_pieces(&mut b, &mut got, msg.len(), &mut never_dead).unwrap();
        assert_eq!((n, &got), (msg.len(), &msg));

        b.send_bytes(0, data(), &[1; 100]).unwrap();
        b.send_bytes(0, data(), &[2; 100]).unwrap();
        let mut short = vec![0u8; 150];
        let e = recv_pieces(&mut a, &mut short, 150, &mut never_dead).unwrap_err();
        assert!(
            matches!(e, MeasureError::Protocol(ref m) if m.contains("200 bytes arrived for a message of 150")),
            "{e}"
        );

        // Fill every box and cell to b, so that a's sends wait; then b sends a packet.
        while a.pending() == 0 {
            a.send_bytes(1, data(), &msg[..max]).unwrap();
        }
        b.send_bytes(0, data(), &[3; 8]).unwrap();
        let e = send_pieces(&mut a, 1, &msg, max).unwrap_err();
        assert!(
            matches!(e, MeasureError::Protocol(ref m) if m.contains("arrived while a message was being sent")),
            "{e}"
        );
        // Drained, so that neither end waits at its drop for what it still holds.
        loop {
            let took = b.poll(|_| {}).unwrap() + a.poll(|_| {}).unwrap();
            if took == 0 && a.pending() == 0 {
                break;
            }
        }
    }

    #[test]
    fn a_receive_skew_is_less_than_a_page_and_places_the_buffer_so() {
        assert_eq!(checked_skew(0).unwrap(), 0);
        assert_eq!(checked_skew(4095).unwrap(), 4095);
        let e = checked_skew(4096).unwrap_err();
        assert!(
            matches!(e, MeasureError::Other(ref m) if m.contains("at most 4095")),
            "{e}"
        );
        for skew in [0, 16, 4095] {
            let b = PageAligned::at(1000, skew);
            assert_eq!(b.as_ptr() as usize % 4096, skew);
            assert_eq!(b.len(), 1000);
        }
    }
}
