//! The `ud` netmod: [`crate::reliable`] over one unreliable-datagram queue pair for every
//! peer, the design of MVAPICH's UD transport.
//!
//! One queue pair, one completion queue and two registered pools serve the whole job:
//! receives land in a ring of slots of the path MTU plus the 40-byte global route header
//! the device writes first, and are handed up in place and posted again once the
//! reliability layer is done with them; sends of up to the device's inline limit are
//! posted inline, larger ones are copied into a slot of a send pool. A peer costs an
//! address handle (shared by the ranks of its host), made on its first datagram and kept,
//! and the reliability layer's state.
//!
//! The business card is `ud <gid, 32 hex digits> <queue pair number> <mtu>`. The device
//! drops a datagram larger than the receiver's slots without a word and reports success,
//! so every rank must use the same datagram size: a peer whose card says otherwise is
//! refused with an error that names [`MTU_VAR`].
//!
//! Variables, besides the device's (see [`super`]):
//!
//! - `NEMESIS_UD_MTU` ([`MTU_VAR`]): datagrams of at most this many bytes instead of the
//!   port's active MTU (256 to 4096).
//! - `NEMESIS_UD_WINDOW` ([`WINDOW_VAR`]): segments in flight per peer, 2 to 65536,
//!   default 64.
//! - `NEMESIS_UD_RECV_DEPTH` ([`RECV_DEPTH_VAR`]): receive slots posted, 16 to 65536,
//!   default 512. UD has no flow control: a datagram that finds no posted slot is lost
//!   (and resent by the reliability layer), so this is the burst a rank absorbs.
//! - `NEMESIS_NET_TIMEOUT`: as for udp.

use super::raw::{Ah, Channel, Completion, Context, Cq, Pd, Qp, QpCap, Region, Sge, UdDest};
use super::{GID_INDEX_VAR, PORT_VAR, VerbsError};
use crate::dgram::{DgramNetmod, Endpoint};
use crate::reliable::{Datagram, Reliable, ReliableConfig};
use crate::verbs_wire::{UdAddr, encode_card, is_mapped, mapped};
use crate::{Cards, Identity, NetError, config};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// Overrides the datagram size.
pub const MTU_VAR: &str = "NEMESIS_UD_MTU";
/// Segments in flight per peer.
pub const WINDOW_VAR: &str = "NEMESIS_UD_WINDOW";
/// Receive slots posted.
pub const RECV_DEPTH_VAR: &str = "NEMESIS_UD_RECV_DEPTH";
/// Default of [`RECV_DEPTH_VAR`].
pub const DEFAULT_RECV_DEPTH: u32 = 512;
/// Sends posted at once.
const SEND_DEPTH: u32 = 128;
/// The queue key every rank uses ("NMUD"); the reliability layer's tokens keep jobs apart.
const QKEY: u32 = 0x4e4d_5544;
/// Bytes of the global route header in front of every received datagram.
pub const GRH_LEN: usize = 40;
/// Hosts whose address handles the table holds before it first grows.
const AH_HOSTS: usize = 16;
/// Pieces an inline send gathers at most.
const MAX_PARTS: usize = 4;
/// One send in this many asks for a completion: completions come in order on a queue
/// pair, so one completion retires every send posted before it, and the device and the
/// poller skip the others' work.
const SIGNAL_EVERY: u64 = 16;
/// In the posted list: a send that was inline (no slot to give back).
const NO_SLOT: u32 = u32::MAX;
/// Polls that find no datagram run the reliability layer's timers once in this many
/// ([`Datagram::timer_stride`]): looking at the completion queue costs a few loads, and
/// the clock read of the timers made a spinning receiver's loop half as long again.
const TIMER_STRIDE: u32 = 8;

/// Hashes a GID for the address-handle table: every send looks its handle up, and a
/// GID (from the cards, never from the wire) needs no protection against chosen keys,
/// so two multiplies instead of SipHash (a tenth of a send's instructions).
#[derive(Default)]
struct GidHasher(u64);

impl std::hash::Hasher for GidHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = (self.0 ^ u64::from_le_bytes(w)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// Address handles by GID.
type AhTable = HashMap<[u8; 16], Ah, BuildHasherDefault<GidHasher>>;

/// The address handle of `gid` in `ahs`, made unless there is one; `None` if it cannot
/// be made.
fn ah_for<'a>(ahs: &'a mut AhTable, pd: &Arc<Pd>, port: u8, sgid_index: u8, gid: [u8; 16]) -> Option<&'a Ah> {
    use std::collections::hash_map::Entry;
    match ahs.entry(gid) {
        Entry::Occupied(e) => Some(e.into_mut()),
        Entry::Vacant(e) => {
            let ah = Ah::new(pd, port, sgid_index, gid).ok()?;
            Some(e.insert(ah))
        }
    }
}

/// How the `ud` netmod is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdConfig {
    /// The reliability layer's tunables.
    pub reliable: ReliableConfig,
    /// The device; `None`: the first.
    pub device: Option<String>,
    /// Its port.
    pub port: u8,
    /// The GID index; `None`: chosen (see [`super`]).
    pub gid_index: Option<u32>,
    /// Datagram size; `None`: the port's active MTU.
    pub mtu: Option<usize>,
    /// Receive slots posted.
    pub recv_depth: u32,
}

impl Default for UdConfig {
    fn default() -> Self {
        Self {
            reliable: ReliableConfig::default(),
            device: None,
            port: 1,
            gid_index: None,
            mtu: None,
            recv_depth: DEFAULT_RECV_DEPTH,
        }
    }
}

impl UdConfig {
    /// The configuration the variables read through `get` ask for.
    ///
    /// # Errors
    /// A variable that cannot be used.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let mut c = Self::default();
        c.reliable.window = config::size(&get, WINDOW_VAR, 64, 2, 1 << 16)? as u32;
        c.reliable.timeout = config::seconds(&get, config::NET_TIMEOUT_VAR, config::DEFAULT_NET_TIMEOUT)?;
        c.device = get(super::DEVICE_VAR).filter(|d| !d.trim().is_empty());
        c.port = config::size(&get, PORT_VAR, 1, 1, 255)? as u8;
        if get(GID_INDEX_VAR).is_some() {
            c.gid_index = Some(config::size(&get, GID_INDEX_VAR, 0, 0, 65535)? as u32);
        }
        if get(MTU_VAR).is_some() {
            c.mtu = Some(config::size(&get, MTU_VAR, 0, 256, 4096)? as usize);
        }
        c.recv_depth = config::size(&get, RECV_DEPTH_VAR, DEFAULT_RECV_DEPTH.into(), 16, 65536)? as u32;
        Ok(c)
    }
}

pub use crate::verbs_wire::decode_card;

/// Chooses the GID: the one asked for, the one of the job's address, the first RoCE v2
/// one that maps an IPv4 address, or (InfiniBand) the first.
fn choose_gid(
    ctx: &Context,
    port: u8,
    gids: u32,
    want: Option<u32>,
    addr: IpAddr,
) -> Result<(u32, [u8; 16]), VerbsError> {
    let no = |detail: String| VerbsError::NoGid {
        device: ctx.name().to_string(),
        port,
        detail,
    };
    if let Some(i) = want {
        let (g, _) = ctx
            .gid(port, i)
            .map_err(|_| no(format!("index {i} cannot be read")))?;
        if g == [0; 16] {
            return Err(no(format!("index {i} is empty")));
        }
        return Ok((i, g));
    }
    let mut table = ctx.gid_table(port, gids)?;
    table.retain(|(_, g, _)| *g != [0; 16]);
    table.sort_by_key(|e| e.0);
    let of_addr = match addr {
        IpAddr::V4(a) => mapped(a.octets()),
        IpAddr::V6(a) => a.octets(),
    };
    if let Some(&(i, g, _)) = table.iter().find(|(_, g, v2)| *v2 && *g == of_addr) {
        return Ok((i, g));
    }
    if let Some(&(i, g, _)) = table.iter().find(|(_, g, v2)| *v2 && is_mapped(g)) {
        return Ok((i, g));
    }
    if let Some(&(i, g, _)) = table.first() {
        return Ok((i, g));
    }
    Err(no(format!("none of its {gids} entries is set")))
}

/// The source of a datagram whose slot began with `grh`, from queue pair `qpn`: the GID
/// in the route header, or with `ipv4` (RoCE v2 over IPv4) the mapped source address of
/// the IPv4 header that stands in its last 20 bytes.
fn source_of(grh: &[u8], qpn: u32, ipv4: bool) -> Option<UdAddr> {
    let gid = if ipv4 {
        let ip = grh.get(20..40)?;
        if ip[0] >> 4 != 4 {
            return None;
        }
        mapped(ip[12..16].try_into().ok()?)
    } else {
        grh.get(8..24)?.try_into().ok()?
    };
    Some(UdAddr { gid, qpn })
}

/// A received datagram, in its slot of the receive pool until released.
pub struct UdRx {
    pool: Arc<Region>,
    off: usize,
    len: usize,
    slot: u32,
}

impl fmt::Debug for UdRx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdRx")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}

impl AsRef<[u8]> for UdRx {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the bytes lie inside the pool (checked against the slot's size when
        // the datagram was taken), the pool lives as long as this Arc, and the slot is
        // posted again only when this value is released, so the device does not write
        // them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.pool.ptr().add(self.off), self.len) }
    }
}

/// One UD queue pair as a [`Datagram`] endpoint.
///
/// Fields are dropped in order: the queue pair before the address handles and the
/// pools its requests name, the completion queue after the pair.
pub struct UdEndpoint {
    qp: Qp,
    /// Address handles by GID: the ranks of one host share theirs.
    ahs: AhTable,
    cq: Cq,
    recv: Arc<Region>,
    send: Region,
    channel: Arc<Channel>,
    pd: Arc<Pd>,
    port: u8,
    sgid_index: u8,
    me: UdAddr,
    /// Our GID maps an IPv4 address: sources are read from the IPv4 header that RoCE v2
    /// puts where the global route header would be.
    ipv4: bool,
    mtu: usize,
    /// Bytes of one receive slot.
    slot: usize,
    free_send: Vec<u32>,
    /// Sends posted and not known to be complete, oldest first: their slots, or
    /// [`NO_SLOT`].
    posted: VecDeque<u32>,
    /// Sends posted so far; a send's request number is its place in this count.
    seq: u64,
    ready: VecDeque<Completion>,
    scratch: Vec<Completion>,
    /// A failure found where it could not be returned (re-posting in `release`).
    broken: Option<io::Error>,
    card: Vec<u8>,
}

impl fmt::Debug for UdEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdEndpoint")
            .field("me", &self.me)
            .field("mtu", &self.mtu)
            .field("hosts", &self.ahs.len())
            .finish_non_exhaustive()
    }
}

impl UdEndpoint {
    /// Opens the device and makes the endpoint; `addr` is the job's address, for the GID.
    ///
    /// # Errors
    /// No device, a port that is down, no usable GID, memory that cannot be registered.
    pub fn open(cfg: &UdConfig, addr: IpAddr) -> Result<Self, VerbsError> {
        let ctx = Context::open(cfg.device.as_deref())?;
        let port = ctx.port_info(cfg.port)?;
        if port.state != rdma_mummy_sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(VerbsError::PortDown {
                device: ctx.name().to_string(),
                port: cfg.port,
                state: port.state,
            });
        }
        let dev = ctx.device_info()?;
        let (gid_index, gid) = choose_gid(&ctx, cfg.port, port.gids, cfg.gid_index, addr)?;
        let mtu = cfg.mtu.map_or(port.mtu, |m| m.min(port.mtu));
        if mtu < crate::reliable::MIN_DATAGRAM {
            return Err(VerbsError::call(
                "reading the port's MTU",
                io::Error::other(format!("{mtu} bytes is too small")),
            ));
        }
        let pd = Pd::new(&ctx)?;
        let channel = Channel::new(&ctx)?;
        let recv_depth = cfg.recv_depth.min(dev.max_qp_wr.max(16));
        let send_depth = SEND_DEPTH.min(dev.max_qp_wr.max(16));
        let cq = Cq::new(&ctx, &channel, (recv_depth + send_depth).min(dev.max_cqe.max(32)))?;
        let want = QpCap {
            send: send_depth,
            recv: recv_depth,
            send_sge: 4.min(dev.max_sge.max(1)),
            inline: 256,
        };
        let qp = Qp::ud(&pd, &cq, want, cfg.port, QKEY)?;
        // Slots for what the port can deliver, so that a datagram above our size (a peer
        // that sets NEMESIS_UD_MTU otherwise) arrives whole and is dropped as too long.
        let slot = port.mtu.max(mtu) + GRH_LEN;
        let recv = Arc::new(Region::new(&pd, slot * qp.cap.recv as usize, false)?);
        let send = Region::new(&pd, mtu * qp.cap.send as usize, false)?;
        let me = UdAddr { gid, qpn: qp.qpn() };
        let mut ep = Self {
            free_send: (0..qp.cap.send).rev().collect(),
            posted: VecDeque::with_capacity(qp.cap.send as usize),
            seq: 0,
            qp,
            // Room for a few hosts from the start: a peer costs its handle, not a table.
            ahs: HashMap::with_capacity_and_hasher(AH_HOSTS, Default::default()),
            cq,
            recv,
            send,
            channel,
            pd,
            port: cfg.port,
            sgid_index: u8::try_from(gid_index).map_err(|_| VerbsError::NoGid {
                device: ctx.name().to_string(),
                port: cfg.port,
                detail: format!("index {gid_index} is beyond what an address handle can name"),
            })?,
            me,
            ipv4: is_mapped(&gid),
            mtu,
            slot,
            // Every posted slot may complete before the first is handed up.
            ready: VecDeque::with_capacity(recv_depth as usize + 32),
            scratch: Vec::with_capacity(32),
            broken: None,
            card: encode_card(me, mtu),
        };
        for s in 0..ep.qp.cap.recv {
            ep.post_slot(s)
                .map_err(|e| VerbsError::call("posting the receive ring", e))?;
        }
        Ok(ep)
    }

    /// Our address.
    pub fn addr(&self) -> UdAddr {
        self.me
    }

    /// The largest datagram.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The index of our GID on the port.
    pub fn gid_index(&self) -> u8 {
        self.sgid_index
    }

    /// The port.
    pub fn port(&self) -> u8 {
        self.port
    }

    fn post_slot(&mut self, s: u32) -> io::Result<()> {
        let off = s as usize * self.slot;
        if off + self.slot > self.recv.len() {
            return Err(io::Error::other(format!("receive slot {s} outside the pool")));
        }
        // SAFETY: the slot lies inside the pool (checked above); it is not lent out (a
        // slot is posted at start, or again when its datagram is released), and the pool
        // outlives the pair (field order, and the Arc).
        let r = unsafe {
            self.qp.post_recv(
                u64::from(s),
                self.recv.ptr().add(off),
                self.slot as u32,
                self.recv.lkey(),
            )
        };
        r.map_err(|e| io::Error::other(e.to_string()))
    }

    /// Takes completions: receives wait in `ready`, sends give their slots back.
    fn reap(&mut self) -> io::Result<usize> {
        self.scratch.clear();
        let n = self
            .cq
            .poll(&mut self.scratch, 32)
            .map_err(|e| io::Error::other(e.to_string()))?;
        for c in self.scratch.drain(..) {
            if c.recv {
                self.ready.push_back(c);
            } else {
                // Send `wr_id` and every one before it are done. A failed UD send is a
                // datagram lost on the way: the reliability layer resends it, and fails
                // the peer if that lasts.
                let first = self.seq - self.posted.len() as u64;
                let done = c
                    .wr_id
                    .saturating_add(1)
                    .saturating_sub(first)
                    .min(self.posted.len() as u64);
                for slot in self.posted.drain(..done as usize) {
                    if slot != NO_SLOT {
                        self.free_send.push(slot);
                    }
                }
            }
        }
        Ok(n)
    }
}

impl Datagram for UdEndpoint {
    type Addr = UdAddr;
    type Rx = UdRx;

    fn max_datagram(&self) -> usize {
        self.mtu
    }

    fn max_receive(&self) -> usize {
        self.slot - GRH_LEN
    }

    fn name(&self) -> &'static str {
        "ud"
    }

    fn send_to(&mut self, parts: &[&[u8]], to: UdAddr) -> io::Result<bool> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.mtu {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a datagram of {len} bytes is larger than the path MTU of {}",
                    self.mtu
                ),
            ));
        }
        let room = self.qp.cap.send as usize;
        if self.posted.len() >= room {
            self.reap()?;
            if self.posted.len() >= room {
                return Ok(false);
            }
        }
        let inline = len <= self.qp.cap.inline as usize
            && parts.len() <= (self.qp.cap.send_sge as usize).min(MAX_PARTS);
        let mut sges = [Sge {
            addr: std::ptr::null(),
            len: 0,
            lkey: 0,
        }; MAX_PARTS];
        let (posted_slot, count) = if inline {
            for (s, p) in sges.iter_mut().zip(parts) {
                *s = Sge {
                    addr: p.as_ptr(),
                    len: p.len() as u32,
                    lkey: 0,
                };
            }
            (NO_SLOT, parts.len())
        } else {
            let Some(slot) = self.free_send.pop() else {
                self.reap()?;
                return Ok(false);
            };
            let base = slot as usize * self.mtu;
            let mut at = 0;
            for p in parts {
                // SAFETY: the slot lies inside the send pool (slots * mtu bytes) and
                // `len <= mtu`; a free slot is named by no posted send.
                unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.send.ptr().add(base + at), p.len()) };
                at += p.len();
            }
            sges[0] = Sge {
                // SAFETY: inside the pool, as above.
                addr: unsafe { self.send.ptr().add(base) },
                len: len as u32,
                lkey: self.send.lkey(),
            };
            (slot, 1)
        };
        let slot = (posted_slot != NO_SLOT).then_some(posted_slot);
        let seq = self.seq;
        // Signalled: every SIGNAL_EVERY-th send, one that fills the queue, and one that
        // takes one of the last slots, so that room always comes back.
        let signaled = seq % SIGNAL_EVERY == SIGNAL_EVERY - 1
            || self.posted.len() + 1 >= room
            || (slot.is_some() && self.free_send.len() < SIGNAL_EVERY as usize);
        let Some(ah) = ah_for(&mut self.ahs, &self.pd, self.port, self.sgid_index, to.gid) else {
            // No way to that GID: as good as lost; the timers fail the peer if it lasts.
            if let Some(s) = slot {
                self.free_send.push(s);
            }
            return Ok(true);
        };
        let dest = UdDest {
            ah,
            qpn: to.qpn,
            qkey: QKEY,
        };
        // SAFETY: inline, the bytes are copied during the call; otherwise they are in
        // a send slot that stays ours until a completion at or after this send gives it
        // back, and the pool outlives the pair.
        let posted = unsafe {
            self.qp
                .post_send(seq, &sges[..count], Some(dest), inline, signaled)
        };
        match posted {
            Ok(()) => {
                self.posted.push_back(posted_slot);
                self.seq += 1;
                Ok(true)
            }
            Err(e) => {
                if let Some(s) = slot {
                    self.free_send.push(s);
                }
                Err(io::Error::other(e.to_string()))
            }
        }
    }

    fn recv(&mut self) -> io::Result<Option<(UdRx, UdAddr)>> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        loop {
            let Some(c) = self.ready.pop_front() else {
                if self.reap()? == 0 {
                    return Ok(None);
                }
                continue;
            };
            let s = u32::try_from(c.wr_id).unwrap_or(u32::MAX);
            if s >= self.qp.cap.recv {
                return Err(io::Error::other(format!("a receive completion names slot {s}")));
            }
            if c.status == rdma_mummy_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                return Err(io::Error::other(format!(
                    "the queue pair failed: {}",
                    c.status_name()
                )));
            }
            let off = s as usize * self.slot;
            // Any other failed receive is one datagram's (a stranger's too long for the
            // slot, say): handed up empty, counted as truncated, its slot posted again.
            let len = if c.ok() {
                (c.byte_len as usize).min(self.slot)
            } else {
                0
            };
            let whole = UdRx {
                pool: Arc::clone(&self.recv),
                off,
                len,
                slot: s,
            };
            let from = if c.grh && len >= GRH_LEN {
                source_of(&whole.as_ref()[..GRH_LEN], c.src_qp, self.ipv4)
            } else {
                None
            };
            // A datagram whose source cannot be read is handed up empty: the reliability
            // layer counts it as truncated and drops it.
            let (rx, from) = match from {
                Some(f) => (
                    UdRx {
                        off: off + GRH_LEN,
                        len: len - GRH_LEN,
                        ..whole
                    },
                    f,
                ),
                None => (
                    UdRx { len: 0, ..whole },
                    UdAddr {
                        gid: [0; 16],
                        qpn: c.src_qp,
                    },
                ),
            };
            return Ok(Some((rx, from)));
        }
    }

    fn release(&mut self, rx: UdRx) {
        let s = rx.slot;
        drop(rx);
        if let Err(e) = self.post_slot(s)
            && self.broken.is_none()
        {
            self.broken = Some(e);
        }
    }

    fn now(&self) -> u64 {
        crate::sys::monotonic_ns()
    }

    fn timer_stride(&self) -> u32 {
        TIMER_STRIDE
    }
}

impl Endpoint for UdEndpoint {
    fn card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.channel.fd()
    }

    fn readiness(&self, _blocked: bool) -> i16 {
        // Sends are signalled: room comes as a completion, like input.
        libc::POLLIN
    }

    fn arm(&mut self) -> io::Result<bool> {
        if !self.ready.is_empty() {
            return Ok(true);
        }
        self.cq.arm().map_err(|e| io::Error::other(e.to_string()))?;
        // A completion that came before the arm raises no event: look once more.
        let before = self.posted.len();
        self.reap()?;
        Ok(!self.ready.is_empty() || self.posted.len() < before)
    }

    fn look(&mut self) -> io::Result<Option<bool>> {
        let before = self.posted.len();
        if self.ready.is_empty() {
            self.reap()?;
        }
        Ok(Some(!self.ready.is_empty() || self.posted.len() < before))
    }

    fn woken(&mut self) -> io::Result<()> {
        self.cq.take_events().map_err(|e| io::Error::other(e.to_string()))
    }
}

/// The `ud` netmod.
pub type UdNetmod = DgramNetmod<UdEndpoint>;

impl DgramNetmod<UdEndpoint> {
    /// Opens the device and makes the netmod; `cards` gives the peers' addresses, asked
    /// once per peer.
    ///
    /// # Errors
    /// As [`UdEndpoint::open`], or a configuration that cannot work.
    pub fn new(id: Identity, cards: Box<dyn Cards>, cfg: UdConfig) -> Result<Self, NetError> {
        let ep = UdEndpoint::open(&cfg, id.addr)?;
        let mtu = ep.mtu();
        let mut cards = cards;
        let resolve = Box::new(move |rank: u32| {
            let (addr, theirs) = decode_card(rank, &cards.card(rank)?)?;
            if theirs != mtu {
                return Err(NetError::BadCard {
                    rank,
                    reason: format!(
                        "its datagrams are {theirs} bytes and ours {mtu}: every rank must use the same \
                         (set {MTU_VAR} to the smaller everywhere)"
                    ),
                });
            }
            Ok(addr)
        });
        let rel = Reliable::new(ep, id.rank, id.size, id.job_key.clone(), cfg.reliable, resolve)?;
        Self::over(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_variables() {
        let c = UdConfig::from_lookup(|_| None).unwrap();
        assert_eq!(c, UdConfig::default());
        let vars = [
            (WINDOW_VAR, "16"),
            (MTU_VAR, "1024"),
            (RECV_DEPTH_VAR, "64"),
            (super::super::DEVICE_VAR, "rxe0"),
            (PORT_VAR, "2"),
            (GID_INDEX_VAR, "1"),
        ];
        let get = |k: &str| vars.iter().find(|(v, _)| *v == k).map(|(_, x)| (*x).to_string());
        let c = UdConfig::from_lookup(get).unwrap();
        assert_eq!(
            (
                c.reliable.window,
                c.mtu,
                c.recv_depth,
                c.device.as_deref(),
                c.port,
                c.gid_index
            ),
            (16, Some(1024), 64, Some("rxe0"), 2, Some(1))
        );
        for (var, v) in [
            (MTU_VAR, "100"),
            (RECV_DEPTH_VAR, "1"),
            (PORT_VAR, "0"),
            (WINDOW_VAR, "1"),
        ] {
            let get = |k: &str| (k == var).then(|| v.to_string());
            assert!(
                matches!(UdConfig::from_lookup(get), Err(NetError::Config { .. })),
                "{var}={v}"
            );
        }
    }

    #[test]
    fn sources_are_read_from_the_route_header() {
        // An IPv4 header in the last 20 bytes, source 10.77.0.2.
        let mut grh = [0u8; GRH_LEN];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[10, 77, 0, 2]);
        let from = source_of(&grh, 9, true).unwrap();
        assert_eq!(
            from,
            UdAddr {
                gid: mapped([10, 77, 0, 2]),
                qpn: 9
            }
        );
        assert!(is_mapped(&from.gid));
        // Not an IPv4 header: no source.
        grh[20] = 0x60;
        assert_eq!(source_of(&grh, 9, true), None);
        // InfiniBand: the source GID at bytes 8..24.
        grh[8..24].copy_from_slice(&[0xfe; 16]);
        assert_eq!(
            source_of(&grh, 5, false),
            Some(UdAddr {
                gid: [0xfe; 16],
                qpn: 5
            })
        );
        assert!(!is_mapped(&[0xfe; 16]));
        assert_eq!(source_of(&grh[..30], 5, true), None);
    }

    #[test]
    fn a_machine_without_rdma_is_told_so() {
        match super::super::devices() {
            Ok(names) => assert!(!names.is_empty()),
            Err(e) => {
                assert!(e.unavailable(), "{e}");
                assert!(
                    std::env::var_os("RXE_VM").is_none(),
                    "no RDMA device inside the Soft-RoCE VM: {e}"
                );
                let msg = e.to_string();
                assert!(msg.contains("no RDMA") && msg.contains("NEMESIS_NETMOD"), "{msg}");
            }
        }
    }
}
