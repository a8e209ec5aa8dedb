//! The `udp` netmod: [`crate::reliable`] over one UDP socket for every peer.
//!
//! The socket is non-blocking and bound to the job's address on a port the kernel picks;
//! the business card publishes it. Datagrams are sized to the MTU of the interface that
//! holds the address, so they are never fragmented on the first hop.
//!
//! Variables:
//!
//! - `NEMESIS_UDP_MTU` ([`MTU_VAR`]): the MTU to size datagrams for, in bytes (K, M
//!   suffixes allowed, 128 to 1M), instead of the interface's; datagrams are the MTU less
//!   the IP and UDP headers (28 bytes for IPv4, 48 for IPv6), at most 65507 bytes. Tests
//!   set it to split messages into many datagrams on loopback.
//! - `NEMESIS_UDP_WINDOW` ([`WINDOW_VAR`]): segments in flight per peer, 2 to 65536,
//!   default 64. Every rank must use the same.
//! - `NEMESIS_NET_TIMEOUT` ([`crate::config::NET_TIMEOUT_VAR`]): seconds a peer may leave
//!   our data unacknowledged before it counts as failed, default 10.

use crate::addr;
use crate::config;
use crate::dgram::{DgramNetmod, Endpoint};
use crate::reliable::{Datagram, Reliable, ReliableConfig};
use crate::sys::RawAddr;
use crate::{Cards, Identity, NetError};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Instant;

/// Overrides the MTU that datagrams are sized for.
pub const MTU_VAR: &str = "NEMESIS_UDP_MTU";
/// Segments in flight per peer.
pub const WINDOW_VAR: &str = "NEMESIS_UDP_WINDOW";
/// Default of [`WINDOW_VAR`].
pub const DEFAULT_WINDOW: u32 = 64;
/// Default of [`UdpConfig::socket_buffer`]: room for a window to every few peers at once.
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;
/// The largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65507;
/// The MTU assumed when no interface holds the address.
const FALLBACK_MTU: usize = 1500;

/// How the `udp` netmod is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// The reliability layer's tunables.
    pub reliable: ReliableConfig,
    /// The MTU to size datagrams for; `None`: the interface's ([`MTU_VAR`]).
    pub mtu: Option<usize>,
    /// `SO_RCVBUF` and `SO_SNDBUF` to ask for; the kernel may grant less.
    pub socket_buffer: usize,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            reliable: ReliableConfig {
                window: DEFAULT_WINDOW,
                ..ReliableConfig::default()
            },
            mtu: None,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
        }
    }
}

impl UdpConfig {
    /// The configuration the environment asks for.
    ///
    /// # Errors
    /// A variable that cannot be used.
    pub fn from_env() -> Result<Self, NetError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The configuration the variables read through `get` ask for.
    ///
    /// # Errors
    /// A variable that cannot be used.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let mut cfg = Self::default();
        cfg.reliable.window = config::size(&get, WINDOW_VAR, DEFAULT_WINDOW.into(), 2, 1 << 16)? as u32;
        cfg.reliable.timeout = config::seconds(&get, config::NET_TIMEOUT_VAR, config::DEFAULT_NET_TIMEOUT)?;
        if get(MTU_VAR).is_some() {
            cfg.mtu = Some(config::size(&get, MTU_VAR, 0, 128, 1 << 20)? as usize);
        }
        Ok(cfg)
    }
}

/// The UDP socket as a [`Datagram`] endpoint.
#[derive(Debug)]
pub struct UdpDatagram {
    sock: UdpSocket,
    max: usize,
    epoch: Instant,
    card: Vec<u8>,
    /// The receive buffer while no datagram holds it.
    spare: Option<Vec<u8>>,
}

/// A datagram received into the endpoint's buffer.
#[derive(Debug)]
pub struct UdpRx {
    buf: Vec<u8>,
    len: usize,
}

impl AsRef<[u8]> for UdpRx {
    fn as_ref(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&self.buf)
    }
}

impl UdpDatagram {
    /// Sends the parts with one `sendmsg`, gathering them without a copy.
    fn send_gathered(&self, parts: &[&[u8]], to: SocketAddr) -> io::Result<usize> {
        const MAX_PARTS: usize = 8;
        if parts.len() > MAX_PARTS {
            return self.sock.send_to(&parts.concat(), to);
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_PARTS];
        for (v, p) in iov.iter_mut().zip(parts) {
            // sendmsg only reads through iov_base; the cast to *mut is what iovec wants.
            v.iov_base = p.as_ptr().cast_mut().cast();
            v.iov_len = p.len();
        }
        let addr = RawAddr::new(to);
        // SAFETY: msghdr is plain data, valid when all zero.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // sendmsg only reads the name; the cast to *mut is what msghdr wants.
        msg.msg_name = addr.as_ptr().cast_mut().cast();
        msg.msg_namelen = addr.len();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = parts.len() as _;
        // SAFETY: `msg` points at `addr` and at `iov`, whose first parts.len() entries
        // describe live slices; all outlive the call, and the kernel only reads them.
        let n = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Datagram for UdpDatagram {
    type Addr = SocketAddr;

    fn max_datagram(&self) -> usize {
        self.max
    }

    fn max_receive(&self) -> usize {
        MAX_UDP_PAYLOAD.max(self.max)
    }

    fn name(&self) -> &'static str {
        "udp"
    }

    fn send_to(&mut self, parts: &[&[u8]], to: SocketAddr) -> io::Result<bool> {
        loop {
            let r = match parts {
                [one] => self.sock.send_to(one, to),
                _ => self.send_gathered(parts, to),
            };
            return match r {
                Ok(_) => Ok(true),
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => Ok(false),
                    // The way to the peer is broken: as good as lost on the way; the
                    // timers resend, and fail the peer if it lasts.
                    io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::NetworkDown
                    | io::ErrorKind::AddrNotAvailable => Ok(true),
                    // The kernel's queue is full for now.
                    _ if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(false),
                    _ => Err(e),
                },
            };
        }
    }

    type Rx = UdpRx;

    fn recv(&mut self) -> io::Result<Option<(UdpRx, SocketAddr)>> {
        // One byte more than the largest datagram taken, so a longer one shows as such.
        let want = self.max_receive() + 1;
        let mut buf = self.spare.take().unwrap_or_default();
        buf.resize(want, 0);
        loop {
            match self.sock.recv_from(&mut buf) {
                Ok((len, from)) => return Ok(Some((UdpRx { buf, len }, from))),
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => {
                        self.spare = Some(buf);
                        return Ok(None);
                    }
                    // An earlier send's ICMP error, reported late: nothing to read.
                    io::ErrorKind::Interrupted
                    | io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable => continue,
                    _ => {
                        self.spare = Some(buf);
                        return Err(e);
                    }
                },
            }
        }
    }

    fn release(&mut self, rx: UdpRx) {
        self.spare = Some(rx.buf);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Endpoint for UdpDatagram {
    fn card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Asks for a socket buffer size; the kernel grants what its limits allow, silently.
fn ask_buffer(sock: &UdpSocket, opt: libc::c_int, bytes: usize) {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the live socket's, and the option value is a c_int
    // whose size is passed; the kernel only reads it.
    let _ = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// The `udp` netmod.
pub type UdpNetmod = DgramNetmod<UdpDatagram>;

impl DgramNetmod<UdpDatagram> {
    /// Binds a socket at `id.addr` and makes the netmod; `cards` gives the peers'
    /// addresses, asked once per peer.
    ///
    /// # Errors
    /// A socket that cannot be had, or a configuration that cannot work.
    pub fn new(id: Identity, cards: Box<dyn Cards>, cfg: UdpConfig) -> Result<Self, NetError> {
        let sock = UdpSocket::bind(SocketAddr::new(id.addr, 0))
            .map_err(|e| NetError::io(format!("udp: binding a socket at {}", id.addr), e))?;
        sock.set_nonblocking(true)
            .map_err(|e| NetError::io("udp: making the socket non-blocking", e))?;
        ask_buffer(&sock, libc::SO_RCVBUF, cfg.socket_buffer);
        ask_buffer(&sock, libc::SO_SNDBUF, cfg.socket_buffer);
        let local = sock
            .local_addr()
            .map_err(|e| NetError::io("udp: reading the socket's address", e))?;
        let mtu = cfg.mtu.or_else(|| addr::mtu_of(id.addr)).unwrap_or(FALLBACK_MTU);
        let overhead = match id.addr {
            IpAddr::V4(_) => 28,
            IpAddr::V6(_) => 48,
        };
        let max = mtu.saturating_sub(overhead).min(MAX_UDP_PAYLOAD);
        if max < crate::reliable::MIN_DATAGRAM {
            return Err(NetError::Config {
                var: MTU_VAR,
                value: mtu.to_string(),
                reason: format!(
                    "datagrams of {max} bytes are too small; at least {} are needed",
                    crate::reliable::MIN_DATAGRAM + overhead
                ),
            });
        }
        let dg = UdpDatagram {
            sock,
            max,
            epoch: Instant::now(),
            card: addr::encode_card("udp", local),
            spare: None,
        };
        let mut cards = cards;
        let resolve = Box::new(move |rank: u32| {
            let card = cards.card(rank)?;
            addr::decode_card("udp", rank, &card)
        });
        let rel = Reliable::new(dg, id.rank, id.size, id.job_key.clone(), cfg.reliable, resolve)?;
        Self::over(rel)
    }

    /// The socket's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoint().sock.local_addr().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reliable::{FLAG_FIRST, FLAG_LAST, Header, Kind, MAX_HEADER_LEN, Start, encode_header};
    use crate::{Accept, DropReason, Envelope, Netmod};
    use std::net::Ipv4Addr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const JOB: crate::auth::JobKey = crate::auth::JobKey::from_bytes([0xfe; crate::auth::KEY_LEN]);

    /// Cards every netmod of a test shares, filled in once all are bound.
    #[derive(Clone, Default)]
    struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Cards for Table {
        fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
            self.0.lock().unwrap().card(rank)
        }
    }

    fn job(n: u32, cfg: &UdpConfig) -> Vec<UdpNetmod> {
        job_at(n, cfg, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    fn job_at(n: u32, cfg: &UdpConfig, addr: IpAddr) -> Vec<UdpNetmod> {
        let table = Table::default();
        let nms: Vec<UdpNetmod> = (0..n)
            .map(|rank| {
                let id = Identity {
                    rank,
                    size: n,
                    job_key: JOB,
                    addr,
                };
                UdpNetmod::new(id, Box::new(table.clone()), cfg.clone())
                    .unwrap()
                    .quiet()
            })
            .collect();
        *table.0.lock().unwrap() = nms.iter().map(Netmod::business_card).collect();
        nms
    }

    type Got = Vec<(u32, Envelope, Vec<u8>)>;

    /// Polls every netmod until `done`, waiting a little when nothing happens.
    fn pump(
        nms: &mut [UdpNetmod],
        got: &mut [Got],
        secs: u64,
        mut done: impl FnMut(&[UdpNetmod], &[Got]) -> bool,
    ) {
        let end = Instant::now() + Duration::from_secs(secs);
        while !done(nms, got) {
            assert!(Instant::now() < end, "not done in {secs} s");
            let mut any = 0;
            for (i, nm) in nms.iter_mut().enumerate() {
                let g = &mut got[i];
                any += nm.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            }
            if any == 0 {
                nms[0].wait(Duration::from_millis(1)).unwrap();
            }
        }
    }

    fn payload(seed: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(31) ^ seed) as u8).collect()
    }

    #[test]
    fn config_from_variables() {
        let c = UdpConfig::from_lookup(|_| None).unwrap();
        assert_eq!(c, UdpConfig::default());
        assert_eq!((c.reliable.window, c.mtu), (64, None));
        let c = UdpConfig::from_lookup(|k| match k {
            "NEMESIS_UDP_MTU" => Some("9000".into()),
            "NEMESIS_UDP_WINDOW" => Some("8".into()),
            "NEMESIS_NET_TIMEOUT" => Some("0.25".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.mtu, Some(9000));
        assert_eq!(c.reliable.window, 8);
        assert_eq!(c.reliable.timeout, Duration::from_millis(250));
        for (k, v) in [
            ("NEMESIS_UDP_MTU", "12"),
            ("NEMESIS_UDP_WINDOW", "1"),
            ("NEMESIS_UDP_WINDOW", "100000"),
            ("NEMESIS_NET_TIMEOUT", "never"),
        ] {
            let e = UdpConfig::from_lookup(|q| (q == k).then(|| v.to_string())).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    #[test]
    fn two_netmods_exchange_both_ways_in_order() {
        let cfg = UdpConfig {
            mtu: Some(1500),
            ..UdpConfig::default()
        };
        let mut nms = job(2, &cfg);
        assert_eq!(nms[0].name(), "udp");
        assert_eq!(nms[0].max_datagram(), 1472);
        let max = nms[0].max_payload();
        assert_eq!(max, 64 << 10);
        let sizes = [0, 1, 1411, 1412, 1413, 5000, 30_000, max - 1, max];
        let mut plan: Vec<Vec<(u32, Envelope, Vec<u8>)>> = vec![Vec::new(), Vec::new()];
        for round in 0..4 {
            for (i, &len) in sizes.iter().enumerate() {
                for s in 0..2u32 {
                    let k = round * 100 + i;
                    plan[s as usize].push((1 - s, [k as u64, u64::from(s)], payload(k, len)));
                }
            }
        }
        let mut next = [0usize; 2];
        let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
        let total = plan[0].len();
        let end = Instant::now() + Duration::from_secs(30);
        while got[0].len() < total || got[1].len() < total {
            assert!(
                Instant::now() < end,
                "stuck: {:?} {:?}",
                got[0].len(),
                got[1].len()
            );
            for s in 0..2 {
                while let Some((to, env, data)) = plan[s].get(next[s]) {
                    let (a, b) = data.split_at(data.len() / 3);
                    match nms[s].send(*to, env, &[a, b]).unwrap() {
                        Accept::Sent => next[s] += 1,
                        Accept::Again => break,
                    }
                }
            }
            for (i, nm) in nms.iter_mut().enumerate() {
                let g = &mut got[i];
                nm.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            }
            nms[0].wait(Duration::from_millis(1)).unwrap();
        }
        for d in 0..2 {
            let want: Vec<(u32, Envelope, Vec<u8>)> = plan[1 - d]
                .iter()
                .map(|(_, e, b)| ((1 - d) as u32, *e, b.clone()))
                .collect();
            assert!(got[d] == want, "rank {d} got something else");
        }
        pump(&mut nms, &mut got, 10, |n, _| n.iter().all(|n| n.backlog() == 0));
        let s = nms[0].stats();
        assert_eq!(s.packets_sent, total as u64);
        assert_eq!(s.packets_received, total as u64);
        assert_eq!(s.drops.total(), 0);
        // Too large, and bad ranks.
        let big = vec![0u8; max + 1];
        assert!(matches!(
            nms[0].send(1, &[0, 0], &[&big]),
            Err(NetError::TooLarge { .. })
        ));
        assert!(matches!(
            nms[0].send(2, &[0, 0], &[]),
            Err(NetError::InvalidRank { .. })
        ));
        nms[0].check_peer(1).unwrap();
    }

    #[test]
    fn three_netmods_all_to_all() {
        let cfg = UdpConfig {
            mtu: Some(1280),
            reliable: ReliableConfig {
                window: 8,
                ..UdpConfig::default().reliable
            },
            ..UdpConfig::default()
        };
        let mut nms = job(3, &cfg);
        let mut got: Vec<Got> = vec![Vec::new(); 3];
        let mut plan = Vec::new();
        for s in 0..3u32 {
            for k in 0..30usize {
                let to = (s + 1 + (k % 2) as u32) % 3;
                plan.push((s, to, [k as u64, u64::from(s)], payload(k, k * 700)));
            }
        }
        let mut next = 0;
        let end = Instant::now() + Duration::from_secs(30);
        while got.iter().map(Vec::len).sum::<usize>() < plan.len() {
            assert!(Instant::now() < end, "stuck");
            while let Some((s, to, env, data)) = plan.get(next) {
                if nms[*s as usize].send(*to, env, &[data]).unwrap() == Accept::Again {
                    break;
                }
                next += 1;
            }
            for (i, nm) in nms.iter_mut().enumerate() {
                let g = &mut got[i];
                nm.poll(&mut |s, e, b| g.push((s, *e, b.to_vec()))).unwrap();
            }
            nms[0].wait(Duration::from_millis(1)).unwrap();
        }
        for (d, g) in got.iter().enumerate() {
            let want: Vec<(u32, Envelope, Vec<u8>)> = plan
                .iter()
                .filter(|p| p.1 as usize == d)
                .map(|p| (p.0, p.2, p.3.clone()))
                .collect();
            let mut have = g.clone();
            // Order holds per sender; the interleaving of senders is free.
            have.sort_by_key(|x| x.0);
            let mut want = want;
            want.sort_by_key(|x| x.0);
            assert!(have == want, "rank {d}");
        }
    }

    #[test]
    fn strangers_are_dropped() {
        let mut nms = job(2, &UdpConfig::default());
        let target: SocketAddr = addr::decode_card("udp", 0, &nms[0].business_card()).unwrap();
        let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
        let datagram = |token| {
            let h = Header {
                kind: Kind::Data,
                flags: FLAG_FIRST | FLAG_LAST,
                token,
                src: 1,
                dst: 0,
                seq: 0,
                ack: 0,
                count: 2,
                start: Some(Start {
                    env: [1, 2],
                    total: 2,
                }),
            };
            let mut b = [0u8; MAX_HEADER_LEN];
            let n = encode_header(&h, &mut b);
            let mut v = b[..n].to_vec();
            v.extend_from_slice(b"hi");
            v
        };
        raw.send_to(&datagram(JOB.token(1, 0) ^ 1), target).unwrap();
        // The token of the other direction, as a captured datagram of rank 0's carries.
        raw.send_to(&datagram(JOB.token(0, 1)), target).unwrap();
        // Well formed, from rank 1, but not from rank 1's address.
        raw.send_to(&datagram(JOB.token(1, 0)), target).unwrap();
        let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
        pump(&mut nms, &mut got, 10, |n, _| n[0].stats().drops.total() == 3);
        let d = nms[0].stats().drops;
        assert_eq!(d.count(DropReason::WrongJob), 2);
        assert_eq!(d.count(DropReason::UnknownAddress), 1);
        assert!(got[0].is_empty());
        // The real rank 1 still gets through, with the same sequence number.
        nms[1].send(0, &[1, 2], &[b"hi"]).unwrap();
        pump(&mut nms, &mut got, 10, |_, g| g[0].len() == 1);
        assert_eq!(got[0][0], (1, [1, 2], b"hi".to_vec()));
    }

    #[test]
    fn shutdown_says_goodbye() {
        let mut nms = job(2, &UdpConfig::default());
        let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
        nms[0].send(1, &[5, 5], &[&payload(1, 3000)]).unwrap();
        pump(&mut nms, &mut got, 10, |_, g| g[1].len() == 1);
        let mut b = nms.pop().unwrap();
        let mut a = nms.pop().unwrap();
        let t = std::thread::spawn(move || {
            a.shutdown(Duration::from_secs(10));
            a
        });
        let end = Instant::now() + Duration::from_secs(10);
        let e = loop {
            b.poll(&mut |_, _, _| {}).unwrap();
            if let Err(e) = b.check_peer(0) {
                break e;
            }
            assert!(Instant::now() < end, "no goodbye");
            b.wait(Duration::from_millis(5)).unwrap();
        };
        assert!(
            matches!(&e, NetError::PeerFailed { rank: 0, reason } if reason.contains("left")),
            "{e}"
        );
        let mut a = t.join().unwrap();
        assert_eq!(a.backlog(), 0);
        assert!(a.send(1, &[0, 0], &[]).is_err());
        b.shutdown(Duration::from_secs(1));
    }

    #[test]
    fn a_dropped_peer_fails_after_the_timeout() {
        let mut cfg = UdpConfig::default();
        cfg.reliable.timeout = Duration::from_millis(300);
        let mut nms = job(3, &cfg);
        let mut got: Vec<Got> = vec![Vec::new(); 3];
        nms[0].send(1, &[1, 1], &[b"x"]).unwrap();
        pump(&mut nms, &mut got, 10, |n, g| {
            g[1].len() == 1 && n[0].backlog() == 0
        });
        // Rank 1 goes away without a word.
        drop(nms.remove(1));
        let start = Instant::now();
        nms[0].send(1, &[2, 2], &[b"are you there"]).unwrap();
        let e = loop {
            for nm in nms.iter_mut() {
                nm.poll(&mut |_, _, _| {}).unwrap();
            }
            if let Err(e) = nms[0].check_peer(1) {
                break e;
            }
            assert!(start.elapsed() < Duration::from_secs(10));
            nms[0].wait(Duration::from_millis(20)).unwrap();
        };
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(matches!(&e, NetError::PeerFailed { rank: 1, .. }), "{e}");
        assert!(matches!(
            nms[0].send(1, &[0, 0], &[]),
            Err(NetError::PeerFailed { rank: 1, .. })
        ));
        assert_eq!(nms[0].backlog(), 0);
        // The one only waiting on rank 1 finds out through the probe. nms[1] is rank 2.
        let start = Instant::now();
        let e = loop {
            nms[1].poll(&mut |_, _, _| {}).unwrap();
            if let Err(e) = nms[1].check_peer(1) {
                break e;
            }
            assert!(start.elapsed() < Duration::from_secs(10));
            nms[1].wait(Duration::from_millis(20)).unwrap();
        };
        assert!(matches!(&e, NetError::PeerFailed { rank: 1, .. }), "{e}");
        nms[1].check_peer(0).unwrap();
    }

    #[test]
    fn ipv6_works_where_there_is_one() {
        let lo6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        if UdpSocket::bind(SocketAddr::new(lo6, 0)).is_err() {
            eprintln!("no IPv6 loopback here; skipped");
            return;
        }
        let cfg = UdpConfig {
            mtu: Some(1500),
            ..UdpConfig::default()
        };
        let mut nms = job_at(2, &cfg, lo6);
        assert_eq!(nms[0].max_datagram(), 1452);
        let msg = payload(3, 10_000);
        nms[0].send(1, &[6, 6], &[&msg[..10], &msg[10..]]).unwrap();
        let mut got: Vec<Got> = vec![Vec::new(), Vec::new()];
        pump(&mut nms, &mut got, 10, |n, g| {
            g[1].len() == 1 && n[0].backlog() == 0
        });
        assert_eq!(got[1][0], (0, [6, 6], msg));
    }

    #[test]
    fn wait_looks_and_waits() {
        let mut nms = job(2, &UdpConfig::default());
        let t = Instant::now();
        assert!(!nms[0].wait(Duration::ZERO).unwrap());
        assert!(!nms[0].wait(Duration::from_millis(30)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(25));
        nms[1].send(0, &[0, 0], &[b"wake"]).unwrap();
        assert!(nms[0].wait(Duration::from_secs(5)).unwrap());
        let mut n = 0;
        let end = Instant::now() + Duration::from_secs(5);
        while n == 0 && Instant::now() < end {
            n += nms[0].poll(&mut |_, _, _| {}).unwrap();
        }
        assert_eq!(n, 1);
        // An ACK is owed: the timer makes wait return.
        assert!(nms[0].wait(Duration::from_secs(5)).unwrap());
    }
}
