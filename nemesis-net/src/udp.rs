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
use crate::reliable::{Datagram, Reliable, ReliableConfig};
use crate::sys::Epoll;
use crate::{Accept, Cards, Envelope, Identity, NetError, NetStats, Netmod};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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

/// The UDP socket as a [`Datagram`] transport.
#[derive(Debug)]
struct UdpDatagram {
    sock: UdpSocket,
    max: usize,
    epoch: Instant,
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
        // SAFETY: sockaddr_storage is plain data, valid when all zero.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match to {
            SocketAddr::V4(a) => {
                // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
                let sin = unsafe { &mut *std::ptr::from_mut(&mut ss).cast::<libc::sockaddr_in>() };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
                let sin6 = unsafe { &mut *std::ptr::from_mut(&mut ss).cast::<libc::sockaddr_in6>() };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_scope_id = a.scope_id();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        // SAFETY: msghdr is plain data, valid when all zero.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = std::ptr::from_mut(&mut ss).cast();
        msg.msg_namelen = len as libc::socklen_t;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = parts.len() as _;
        // SAFETY: `msg` points at `ss` and at `iov`, whose first parts.len() entries
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

    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
        loop {
            match self.sock.recv_from(buf) {
                Ok((n, from)) => return Ok(Some((n, from))),
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(None),
                    // An earlier send's ICMP error, reported late: nothing to read.
                    io::ErrorKind::Interrupted
                    | io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable => continue,
                    _ => return Err(e),
                },
            }
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
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
#[derive(Debug)]
pub struct UdpNetmod {
    rel: Reliable<UdpDatagram>,
    card: Vec<u8>,
    shut: bool,
    /// Watches the socket for a waiter that sleeps on more than this netmod: for input,
    /// and for room while sends are blocked.
    epoll: Epoll,
    /// Whether `epoll` watches for room too.
    watch_out: bool,
}

impl UdpNetmod {
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
        };
        let mut cards = cards;
        let resolve = Box::new(move |rank: u32| {
            let card = cards.card(rank)?;
            addr::decode_card("udp", rank, &card)
        });
        let epoll = Epoll::new().map_err(|e| NetError::io("udp: epoll_create", e))?;
        epoll
            .ctl(libc::EPOLL_CTL_ADD, dg.sock.as_raw_fd(), libc::EPOLLIN as u32, 0)
            .map_err(|e| NetError::io("udp: epoll_ctl", e))?;
        let rel = Reliable::new(dg, id.rank, id.size, id.job_key.clone(), cfg.reliable, resolve)?;
        Ok(Self {
            rel,
            card: addr::encode_card("udp", local),
            shut: false,
            epoll,
            watch_out: false,
        })
    }

    /// The same netmod, logging no drops: for tests that misbehave on purpose.
    pub fn quiet(mut self) -> Self {
        self.rel = self.rel.quiet();
        self
    }

    /// The socket's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.rel.datagram().sock.local_addr().ok()
    }

    /// The largest datagram this netmod sends.
    pub fn max_datagram(&self) -> usize {
        self.rel.datagram().max
    }

    /// Polls and waits, discarding what arrives, until `done` or `deadline`.
    fn drive(&mut self, deadline: Instant, done: impl Fn(&Reliable<UdpDatagram>) -> bool) {
        let mut discard = |_: u32, _: &Envelope, _: &[u8]| {};
        while !done(&self.rel) {
            let now = Instant::now();
            if now >= deadline || self.rel.poll(&mut discard).is_err() {
                return;
            }
            if done(&self.rel) {
                return;
            }
            let left = deadline.saturating_duration_since(now);
            if self.wait(left.min(Duration::from_millis(50))).is_err() {
                return;
            }
        }
    }
}

impl Netmod for UdpNetmod {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn business_card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn max_payload(&self) -> usize {
        self.rel.max_payload()
    }

    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        self.rel.send(peer, env, payload)
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        self.rel.poll(sink)
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError> {
        if self.rel.ready() {
            return Ok(true);
        }
        let mut limit = timeout;
        if let Some(d) = self.rel.next_deadline() {
            let now = self.rel.datagram().now();
            limit = limit.min(Duration::from_nanos(d.saturating_sub(now)));
        }
        // poll(2) counts milliseconds: round up, so a timer is not polled for early.
        let ms = if limit.is_zero() {
            0
        } else {
            libc::c_int::try_from(limit.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
        };
        let mut events = libc::POLLIN;
        if self.rel.blocked() {
            events |= libc::POLLOUT;
        }
        let mut pfd = libc::pollfd {
            fd: self.rel.datagram().sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the live socket, and its count.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(NetError::io("udp: poll(2)", e));
        }
        Ok(rc > 0 || self.rel.ready())
    }

    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.epoll.as_fd())
    }

    fn wait_hint(&mut self) -> Result<crate::WaitHint, NetError> {
        let blocked = self.rel.blocked();
        if blocked != self.watch_out {
            let events = libc::EPOLLIN as u32 | if blocked { libc::EPOLLOUT as u32 } else { 0 };
            let fd = self.rel.datagram().sock.as_raw_fd();
            self.epoll
                .ctl(libc::EPOLL_CTL_MOD, fd, events, 0)
                .map_err(|e| NetError::io("udp: epoll_ctl", e))?;
            self.watch_out = blocked;
        }
        if self.wait(Duration::ZERO)? {
            return Ok(crate::WaitHint::Now);
        }
        let next = self.rel.next_deadline().map(|d| {
            let now = self.rel.datagram().now();
            Instant::now() + Duration::from_nanos(d.saturating_sub(now))
        });
        Ok(crate::WaitHint::Later(next))
    }

    fn backlog(&self) -> usize {
        self.rel.backlog()
    }

    fn writable(&self, peer: u32) -> bool {
        self.rel.writable(peer)
    }

    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        self.rel.check_peer(peer)
    }

    fn shutdown(&mut self, timeout: Duration) {
        if self.shut {
            return;
        }
        self.shut = true;
        let deadline = Instant::now() + timeout;
        self.drive(deadline, |r| r.backlog() == 0);
        self.rel.begin_shutdown();
        self.drive(deadline, Reliable::shutdown_done);
    }

    fn stats(&self) -> NetStats {
        self.rel.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DropReason;
    use crate::reliable::{FLAG_FIRST, FLAG_LAST, Header, Kind, MAX_HEADER_LEN, Start, encode_header};
    use std::net::Ipv4Addr;
    use std::sync::{Arc, Mutex};

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
