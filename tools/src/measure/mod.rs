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
mod pair;
mod partner;
pub mod peers;
mod phases;
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
use pair::Buf;
pub use pair::{BufKind, PageAligned, Pair, StreamPlan};
pub use partner::serve_if_partner;
pub use phases::StreamPhases;
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
use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
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

/// Most bytes of receive buffers a bandwidth partner posts at once.
const SINK_BYTES: u64 = 256 << 20;

/// The bit of a two-sided sink's argument that asks for one receive buffer.
const SINK_OSU_BIT: u32 = 40;
/// In the sink's argument: its buffers are [`nemesis::Pinned`].
const SINK_PINNED_BIT: u32 = 41;
/// In the sink's argument, 12 bits from here: how far past a page boundary its buffers
/// start.
const SINK_SKEW_SHIFT: u32 = 42;

/// In the sink's argument: time each window's steps and send their medians back
/// (`phases.rs`).
const SINK_PHASES_BIT: u32 = 54;
/// The tag of the message that carries the receiver's step times.
const PHASES_TAG: i32 = 3;

/// `skew` if it is less than a page, as the sink's 12 bits and [`PageAligned::at`] need.
fn checked_skew(skew: usize) -> Result<usize> {
    if skew >= 4096 {
        return Err(MeasureError::Other(format!(
            "a receive skew of {skew} bytes: at most 4095"
        )));
    }
    Ok(skew)
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
