//! Which local address a netmod binds and publishes, the MTU behind it, and the business
//! card that carries it to the peers.
//!
//! `NEMESIS_NET_ADDR` names an address, `NEMESIS_NET_IFACE` an interface. Without them a
//! job whose peers all share this host uses loopback, and any other job the first IPv4
//! address of an interface that is up and not loopback, as Hydra's default does.
//!
//! A card is text, `NETMOD ADDRESS:PORT` (`tcp 10.0.0.2:41234`, `udp [fe80::1]:5000`), so
//! that it reads well in a process manager's debug output.

use crate::NetError;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The longest card [`decode_card`] looks at.
const MAX_CARD: usize = 128;

/// The business card of a `netmod` listening at `addr`.
pub fn encode_card(netmod: &str, addr: SocketAddr) -> Vec<u8> {
    format!("{netmod} {addr}").into_bytes()
}

/// The address in `rank`'s card, which must be a card of `netmod`.
///
/// # Errors
/// [`NetError::BadCard`] for a card of another netmod, or one that does not parse.
pub fn decode_card(netmod: &str, rank: u32, card: &[u8]) -> Result<SocketAddr, NetError> {
    let bad = |reason: String| NetError::BadCard { rank, reason };
    if card.len() > MAX_CARD {
        return Err(bad(format!("{} bytes long, more than any card", card.len())));
    }
    let text = std::str::from_utf8(card).map_err(|_| bad("not text".into()))?;
    let (kind, addr) = text
        .split_once(' ')
        .ok_or_else(|| bad(format!("{text:?} is not \"NETMOD ADDRESS:PORT\"")))?;
    if kind != netmod {
        return Err(bad(format!(
            "it is a {kind:?} card, but this process uses {netmod:?}: every rank must set the same NEMESIS_NETMOD"
        )));
    }
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| bad(format!("{addr:?} is not an address and port: {e}")))?;
    let broadcast = matches!(addr.ip(), IpAddr::V4(v4) if v4.is_broadcast());
    if addr.port() == 0 || addr.ip().is_unspecified() || addr.ip().is_multicast() || broadcast {
        return Err(bad(format!("{addr} cannot be reached")));
    }
    Ok(addr)
}

/// An address of a local interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// The interface's name.
    pub iface: String,
    /// The address.
    pub addr: IpAddr,
    /// Whether the interface is up.
    pub up: bool,
    /// Whether it is a loopback interface.
    pub loopback: bool,
}

/// Every address of every local interface, in the kernel's order.
///
/// # Errors
/// `getifaddrs` failed.
pub fn interfaces() -> Result<Vec<IfAddr>, NetError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(NetError::io("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points at a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so this is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let iface = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(IfAddr {
            iface,
            addr,
            up: flags & libc::IFF_UP as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The address to bind and publish. `all_on_this_host`: every peer shares our host, so
/// loopback reaches them all.
///
/// # Errors
/// A bad `NEMESIS_NET_ADDR` or `NEMESIS_NET_IFACE`, or an interface without an address.
pub fn choose(get: impl Fn(&str) -> Option<String>, all_on_this_host: bool) -> Result<IpAddr, NetError> {
    if let Some(v) = get("NEMESIS_NET_ADDR") {
        return v.trim().parse::<IpAddr>().map_err(|e| NetError::Config {
            var: "NEMESIS_NET_ADDR",
            value: v.clone(),
            reason: format!("expected an IP address: {e}"),
        });
    }
    let ifs = interfaces()?;
    if let Some(name) = get("NEMESIS_NET_IFACE") {
        let name = name.trim().to_string();
        let mine: Vec<&IfAddr> = ifs.iter().filter(|i| i.iface == name).collect();
        return mine
            .iter()
            .find(|i| i.addr.is_ipv4())
            .or_else(|| mine.first())
            .map(|i| i.addr)
            .ok_or_else(|| NetError::Config {
                var: "NEMESIS_NET_IFACE",
                value: name.clone(),
                reason: format!("no such interface with an address; there are: {}", names(&ifs)),
            });
    }
    if all_on_this_host {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    Ok(ifs
        .iter()
        .find(|i| i.up && !i.loopback && i.addr.is_ipv4())
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |i| i.addr))
}

fn names(ifs: &[IfAddr]) -> String {
    let mut v: Vec<&str> = ifs.iter().map(|i| i.iface.as_str()).collect();
    v.dedup();
    v.join(", ")
}

/// The MTU of the interface that holds `addr`; loopback's for unspecified or loopback
/// addresses. `None` when no interface holds it.
pub fn mtu_of(addr: IpAddr) -> Option<usize> {
    let ifs = interfaces().ok()?;
    let iface = if addr.is_unspecified() || addr.is_loopback() {
        ifs.iter().find(|i| i.loopback)?
    } else {
        ifs.iter().find(|i| i.addr == addr)?
    };
    iface_mtu(&iface.iface)
}

/// An interface's MTU, by `SIOCGIFMTU`.
fn iface_mtu(name: &str) -> Option<usize> {
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
        return None;
    }
    for (d, &s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming the interface; the kernel fills ifru_mtu.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds the MTU.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).ok().filter(|&m| m > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_round_trip_and_bad_ones_are_refused() {
        for a in ["10.1.2.3:4000", "[fe80::1]:5000", "127.0.0.1:65535"] {
            let addr: SocketAddr = a.parse().unwrap();
            let card = encode_card("tcp", addr);
            assert_eq!(decode_card("tcp", 3, &card).unwrap(), addr);
        }
        let card = encode_card("udp", "10.0.0.1:9".parse().unwrap());
        let e = decode_card("tcp", 3, &card).unwrap_err();
        assert!(matches!(e, NetError::BadCard { rank: 3, .. }) && e.to_string().contains("NEMESIS_NETMOD"));
        for bad in [
            &b"tcp"[..],
            b"tcp 10.0.0.1",
            b"tcp 10.0.0.1:0",
            b"tcp 0.0.0.0:80",
            b"tcp 224.0.0.1:80",
            b"tcp \xff:1",
            b"",
            &[b'x'; 500],
            // What a hostile key-value space might hold instead of a card.
            b"tcp 255.255.255.255:80",
            b"tcp ../../x:1",
            b"tcp 10.0.0.1:80 extra",
            b"tcp  10.0.0.1:80",
            b"tcp 10.0.0.1:80\n",
            b"tcp 10.0.0.1:99999",
            b"tcp [fe80::1%eth0]:80",
            b"tcp host.example:80",
            b"tcp\t10.0.0.1:80",
        ] {
            assert!(
                decode_card("tcp", 1, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn loopback_is_listed_and_has_an_mtu() {
        let ifs = interfaces().unwrap();
        assert!(ifs.iter().any(|i| i.loopback && i.addr.is_loopback()), "{ifs:?}");
        let mtu = mtu_of(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert!(mtu >= 1280, "loopback MTU {mtu}");
    }

    #[test]
    fn choice_follows_the_variables() {
        let none = |_: &str| None;
        assert_eq!(choose(none, true).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let a = choose(|k| (k == "NEMESIS_NET_ADDR").then(|| "10.1.2.3".into()), false).unwrap();
        assert_eq!(a, "10.1.2.3".parse::<IpAddr>().unwrap());
        let e = choose(|k| (k == "NEMESIS_NET_ADDR").then(|| "ten".into()), false).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_NET_ADDR"), "{e}");
        let e = choose(
            |k| (k == "NEMESIS_NET_IFACE").then(|| "no-such-if0".into()),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("NEMESIS_NET_IFACE"), "{e}");
        let lo = interfaces().unwrap().into_iter().find(|i| i.loopback).unwrap();
        let a = choose(|k| (k == "NEMESIS_NET_IFACE").then(|| lo.iface.clone()), false).unwrap();
        assert!(a.is_loopback());
    }
}
