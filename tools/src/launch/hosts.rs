//! Jobs across hosts: which ranks go where, and the command that starts each group.
//!
//! For each host `nemesis-run` runs the launcher command (ssh by default) with the host
//! name and then a command that starts that host's ranks: `nemesis-run` again, as a
//! proxy, which starts the ranks and relays their PMI back to the first `nemesis-run`
//! ([`super::relay`]). This is how Hydra's bootstrap-exec works.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;

/// A host of the job, and how many ranks it takes when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The name the launcher command gets.
    pub name: String,
    /// Ranks for this host, when the list says (`name:count`).
    pub slots: Option<u32>,
}

/// Parses `a,b,c` or `a:2,b:2`.
pub fn parse_hosts(s: &str) -> Result<Vec<Host>, String> {
    let hosts: Vec<Host> = s
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| match h.rsplit_once(':') {
            Some((name, n)) if !name.is_empty() => match n.parse::<u32>() {
                Ok(c) if c > 0 => Ok(Host {
                    name: name.to_string(),
                    slots: Some(c),
                }),
                _ => Err(format!("bad rank count in {h:?}")),
            },
            Some(_) => Err(format!("bad host {h:?}")),
            None => Ok(Host {
                name: h.to_string(),
                slots: None,
            }),
        })
        .collect::<Result<_, _>>()?;
    if hosts.is_empty() {
        return Err("no hosts given".into());
    }
    Ok(hosts)
}

/// Which ranks each host runs: the counts given (which must add up to `n`), or else
/// blocks as even as possible.
pub fn distribute(n: u32, hosts: &[Host]) -> Result<Vec<Range<u32>>, String> {
    let counts: Vec<u32> = if hosts.iter().all(|h| h.slots.is_some()) {
        let c: Vec<u32> = hosts.iter().map(|h| h.slots.unwrap_or(0)).collect();
        let total: u64 = c.iter().map(|&x| x as u64).sum();
        if total != n as u64 {
            return Err(format!("the host list places {total} ranks, but -n is {n}"));
        }
        c
    } else if hosts.iter().any(|h| h.slots.is_some()) {
        return Err("give a rank count for every host or for none".into());
    } else {
        let h = hosts.len() as u32;
        if n < h {
            return Err(format!("{h} hosts but only {n} ranks"));
        }
        (0..h).map(|i| n / h + u32::from(i < n % h)).collect()
    };
    let mut start = 0;
    Ok(counts
        .into_iter()
        .map(|c| {
            let r = start..start + c;
            start += c;
            r
        })
        .collect())
}

/// The command line that runs `remote` on `host` through `launcher` (split on spaces).
/// For ssh, which hands its arguments to a remote shell, each argument is quoted.
pub fn launcher_argv(launcher: &str, host: &str, remote: &[OsString]) -> Result<Vec<OsString>, String> {
    let mut argv: Vec<OsString> = launcher.split_whitespace().map(OsString::from).collect();
    if argv.is_empty() {
        return Err("the launcher command is empty".into());
    }
    let via_shell = std::path::Path::new(&argv[0])
        .file_name()
        .is_some_and(|n| n == "ssh" || n == "rsh");
    argv.push(host.into());
    for a in remote {
        if via_shell {
            argv.push(shell_quote(&a.to_string_lossy()).into());
        } else {
            argv.push(a.clone());
        }
    }
    Ok(argv)
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The address remote ranks should use to reach this machine: its first non-loopback
/// IPv4 address, or the loopback address when it has none.
pub fn default_address() -> IpAddr {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    let mut found = None;
    let mut p = addrs;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned, which is valid until freed.
        let ifa = unsafe { &*p };
        // SAFETY: for AF_INET the address is a sockaddr_in.
        if !ifa.ifa_addr.is_null() && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET {
            // SAFETY: as above.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            if !ip.is_loopback() {
                found = Some(ip);
                break;
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `addrs` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(addrs) };
    IpAddr::V4(found.unwrap_or(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists() {
        let h = parse_hosts("a, b ,c").unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(distribute(7, &h).unwrap(), vec![0..3, 3..5, 5..7]);
        let h = parse_hosts("x:1,y:3").unwrap();
        assert_eq!(distribute(4, &h).unwrap(), vec![0..1, 1..4]);
        assert!(distribute(5, &h).is_err());
        assert!(distribute(1, &parse_hosts("a,b").unwrap()).is_err());
        assert!(parse_hosts("").is_err());
        assert!(parse_hosts("a:0").is_err());
        assert!(parse_hosts("a:x").is_err());
        assert!(distribute(3, &parse_hosts("a:1,b").unwrap()).is_err());
    }

    #[test]
    fn launcher_lines() {
        let remote: Vec<OsString> = vec!["prog".into(), "two words".into(), "it's".into()];
        let a = launcher_argv("ip netns exec", "h1", &remote).unwrap();
        assert_eq!(
            a,
            ["ip", "netns", "exec", "h1", "prog", "two words", "it's"].map(OsString::from)
        );
        let s = launcher_argv("ssh -x", "node7", &remote).unwrap();
        assert_eq!(s[3..], ["prog", "'two words'", r"'it'\''s'"].map(OsString::from));
        assert!(launcher_argv("  ", "h", &remote).is_err());
    }
}
