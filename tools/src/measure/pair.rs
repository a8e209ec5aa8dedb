//! The pair of processes a measurement runs in: rank 0's side, which starts its partner
//! and drives it, and the buffers and plans it measures with.

use super::phases::{self, Steps};
use super::{
    CPU_VAR, Clock, KIND_ACK, Layer, MeasureError, OP_ECHO, OP_ECHO_P2P, OP_FLOOR, OP_PROBE, OP_QUIT,
    OP_SINK, OP_SINK_P2P, OP_TCP_CONNECT, OP_TCP_ECHO, OP_TCP_SINK, PHASES_TAG, ROLE_VAR, Result,
    SINK_OSU_BIT, SINK_PHASES_BIT, SINK_PINNED_BIT, SINK_SKEW_SHIFT, StreamPhases, Transport, args_bytes,
    checked_skew, ctrl, data, end_job, pair_cpus, pin_to, probe_segment, read_all, round_trip, set_lmt,
    settle, spin_recv, start_job,
};
use crate::launch::{Exit, Job};
use nemesis::channel::{Channel, NemesisChannel};
use nemesis::shm::Segment;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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
    /// Both sides time each window's steps ([`Pair::last_phases`]): a few clock reads
    /// a window, which the timed figure then includes.
    pub phases: bool,
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
            phases: false,
        }
    }
}

/// Two processes, this one rank 0, measuring the channel between them.
#[derive(Debug)]
pub struct Pair {
    pub(super) ch: NemesisChannel,
    pub(super) transport: Transport,
    pub(super) probe_seg: Arc<Segment>,
    /// A plain TCP connection to the partner, for the reference figures of the
    /// network transports; made on first use.
    pub(super) tcp: Option<TcpStream>,
    pub(super) job: Option<Job>,
    pub(super) clock: Clock,
    pub(super) pinned: Option<(usize, usize)>,
    pub(super) buf: Vec<u8>,
    /// What the streaming benchmarks send from and receive into.
    pub(super) bufs: BufKind,
    /// How far past a page boundary the two-sided receive buffers start (ping-pong and
    /// stream).
    pub(super) recv_skew: usize,
    /// What the sends of the last [`Pair::stream_p2p`] went by.
    pub(super) last_counts: nemesis::SendCounts,
    /// The step times of the last [`Pair::stream_p2p`] that asked for them.
    pub(super) last_phases: Option<StreamPhases>,
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
    pub(super) fn make_at(self, len: usize, skew: usize) -> Result<Buf> {
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
pub(super) enum Buf {
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
            last_phases: None,
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

    pub(super) fn alive_check(job: &mut Option<Job>) -> impl FnMut() -> Result<()> + '_ {
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
    pub(super) fn command(&mut self, op: u32, args: [u64; 3]) -> Result<()> {
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
            phases,
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
        let phases_bit = u64::from(phases) << SINK_PHASES_BIT;
        self.command(
            OP_SINK_P2P,
            [
                warmup + iters,
                window | code << 32 | osu_bit | pinned_bit | skew | phases_bit,
                // With the step times asked for, the warm-up's length too, for the
                // receiver to leave out.
                size as u64 | if phases { warmup << 32 } else { 0 },
            ],
        )?;
        let other = |e: nemesis::P2pError| MeasureError::Other(e.to_string());
        let mut msg_buf = self.bufs.make(size)?;
        msg_buf.fill(0x5a);
        let msg = &*msg_buf;
        let mut ack = [0u8; 4];
        let mut cfg = nemesis::p2p::Config::from_env(self.ch.max_payload()).map_err(other)?;
        if lmt.is_some() {
            // The world sees the strategy forced: no stream's way of its own either.
            cfg.medium_limit = 0;
        }
        if let Some(l) = stream_medium_limit {
            // A way forced: the sender's choice by time stays out of it.
            cfg.stream_medium_limit = l.min(cfg.medium_limit);
            cfg.stream_tune_limit = 0;
            cfg.stream_copies_limit = 0;
        }
        let mut w = nemesis::World::with_config(&mut self.ch, cfg).map_err(other)?;
        let c = w.comm();
        let mut steps = phases.then(|| Steps::new(iters));
        let mut start = Instant::now();
        for it in 0..warmup + iters {
            if it == warmup {
                start = Instant::now();
                if let Some(t) = steps.as_mut() {
                    t.clear();
                }
            }
            if let Some(t) = steps.as_mut() {
                t.start();
            }
            w.scope(|s| {
                // As osu_bw's array of requests: no growing while the window starts.
                let mut reqs = Vec::with_capacity(window as usize);
                for _ in 0..window {
                    reqs.push(s.isend(&c, 1, 1, msg)?);
                }
                if let Some(t) = steps.as_mut() {
                    t.mark(0);
                }
                s.waitall(reqs).map(|_| ())
            })
            .map_err(other)?;
            if let Some(t) = steps.as_mut() {
                t.mark(1);
            }
            w.recv(&c, 1, 2, &mut ack).map_err(other)?;
            if let Some(t) = steps.as_mut() {
                t.mark(2);
                t.end();
            }
        }
        let secs = start.elapsed().as_secs_f64();
        self.last_counts = w.send_counts();
        self.last_phases = match steps {
            Some(steps) => {
                let mut b = [0u8; 24];
                let st = w.recv(&c, 1, PHASES_TAG, &mut b).map_err(other)?;
                Some(StreamPhases::of(steps.medians(), phases::decode(&b, st.len)?))
            }
            None => None,
        };
        Ok(secs)
    }

    /// What the sends of the last [`Pair::stream_p2p`] went by (its warm-up included).
    pub fn last_send_counts(&self) -> nemesis::SendCounts {
        self.last_counts
    }

    /// The step times of the last [`Pair::stream_p2p`], if its plan asked for them.
    pub fn last_phases(&self) -> Option<StreamPhases> {
        self.last_phases
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

/// A buffer that starts on a page boundary, as benchmark buffers do (osu's too): a copy
/// whose destination is a few bytes ahead of its source modulo 4096 can be twenty times
/// slower (`nemesis_shm::copy`), and nemesis's own copies keep clear of that, but the
/// kernel's (CMA) do not, so heap buffers would measure the allocator rather than the
/// transport.
#[derive(Debug)]
pub struct PageAligned {
    pub(super) v: Vec<u8>,
    pub(super) off: usize,
    pub(super) len: usize,
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
