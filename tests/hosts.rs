//! Jobs across hosts. Two "hosts" are two network namespaces joined by a veth pair,
//! made and removed by each test; the launcher command is `ip netns exec`. Only
//! addresses inside those namespaces are used. Where `ip netns` is not permitted the
//! tests say so and pass.

mod common;

use common::{assert_ranks_said, child_args, child_main, example, nemesis_run, text};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Two namespaces, `a` at 10.X.Y.1 and `b` at 10.X.Y.2, joined by veth `va`–`vb`.
struct Hosts {
    a: String,
    b: String,
    va: String,
    vb: String,
    addr_a: String,
    addr_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new() -> Option<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = std::process::id() % 10_000;
        let h = Self {
            a: format!("nmA{id}x{n}"),
            b: format!("nmB{id}x{n}"),
            va: format!("nva{id}x{n}"),
            vb: format!("nvb{id}x{n}"),
            addr_a: format!("10.{}.{}.1", 100 + id % 100, n % 250),
            addr_b: format!("10.{}.{}.2", 100 + id % 100, n % 250),
        };
        let vb = h.vb.clone();
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", &h.a])?;
            ip(&["netns", "add", &h.b])?;
            ip(&["link", "add", &h.va, "type", "veth", "peer", "name", &vb])?;
            ip(&["link", "set", &h.va, "netns", &h.a])?;
            ip(&["link", "set", &vb, "netns", &h.b])?;
            ip(&[
                "-n",
                &h.a,
                "addr",
                "add",
                &format!("{}/24", h.addr_a),
                "dev",
                &h.va,
            ])?;
            ip(&["-n", &h.b, "addr", "add", &format!("{}/24", h.addr_b), "dev", &vb])?;
            for (ns, dev) in [(&h.a, &h.va), (&h.b, &vb)] {
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        // Wait until both ends of the link are up, so that routes exist.
        let up = |ns: &str, dev: &str| {
            Command::new("ip")
                .args(["-n", ns, "-o", "link", "show", "dev", dev])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("state UP"))
        };
        let wait_up = || {
            let start = std::time::Instant::now();
            while !(up(&h.a, &h.va) && up(&h.b, &vb)) {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    return Err("the veth link did not come up".to_string());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(())
        };
        match setup().and_then(|_| wait_up()) {
            Ok(()) => Some(h),
            Err(e) => {
                eprintln!("skipping: cannot make network namespaces here ({e})");
                None
            }
        }
    }

    /// `nemesis-run` started inside host `a`, spreading ranks over `hosts`.
    fn run(&self, n: u32, hosts: &str) -> Command {
        self.run_with(n, hosts, "ip netns exec")
    }

    /// As [`Hosts::run`], with another launcher command.
    fn run_with(&self, n: u32, hosts: &str, launcher: &str) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.a,
            nemesis_run().to_str().unwrap(),
            "-n",
            &n.to_string(),
            "--timeout",
            "120",
        ])
        .args([
            "--hosts",
            hosts,
            "--launcher",
            launcher,
            "--pmi-addr",
            &self.addr_a,
            "--",
        ]);
        c
    }
}

impl Hosts {
    /// Makes the link lossy for udp: each end drops about 5 % of the datagrams it
    /// receives and sends about 1 % of its datagrams twice. `Err` says why it cannot.
    fn impair(&self) -> Result<(), String> {
        for (ns, dev) in [(&self.a, &self.va), (&self.b, &self.vb)] {
            let rules = format!(
                "table netdev nemesis_impair {{\n\
                 chain lossy {{ type filter hook ingress device \"{dev}\" priority 0; \
                 meta l4proto udp numgen random mod 100 < 5 counter drop; }}\n\
                 chain twice {{ type filter hook egress device \"{dev}\" priority 0; \
                 meta l4proto udp numgen random mod 100 < 1 counter dup to \"{dev}\"; }}\n}}\n"
            );
            let mut c = Command::new("ip")
                .args(["netns", "exec", ns, "nft", "-f", "-"])
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("nft: {e}"))?;
            use std::io::Write as _;
            c.stdin
                .take()
                .expect("piped")
                .write_all(rules.as_bytes())
                .map_err(|e| format!("nft: {e}"))?;
            let o = c.wait_with_output().map_err(|e| format!("nft: {e}"))?;
            if !o.status.success() {
                return Err(format!("nft: {}", String::from_utf8_lossy(&o.stderr).trim()));
            }
        }
        Ok(())
    }

    /// Datagrams the impairment dropped and duplicated so far, both ends together.
    fn impaired(&self) -> (u64, u64) {
        let (mut dropped, mut doubled) = (0, 0);
        for ns in [&self.a, &self.b] {
            let o = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns,
                    "nft",
                    "list",
                    "table",
                    "netdev",
                    "nemesis_impair",
                ])
                .output()
                .unwrap();
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let n = line
                    .split("counter packets ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if line.contains("drop") {
                    dropped += n;
                } else if line.contains("dup to") {
                    doubled += n;
                }
            }
        }
        (dropped, doubled)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Removing the namespaces removes the veth pair too.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

#[test]
fn hello_across_two_hosts_with_nemesis_run() {
    let Some(h) = Hosts::new() else { return };
    let o = h
        .run(4, &format!("{},{}", h.a, h.b))
        .arg(example("hello"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in 0..4 {
        assert!(out.contains(&format!("hello from rank {r} of 4 on ")), "{out}");
    }
    // Each rank has a peer on the other host, so none is purely shared-memory.
    assert_eq!(out.matches("via net").count(), 4, "{out}");
}

#[test]
fn uneven_counts_and_labels() {
    let Some(h) = Hosts::new() else { return };
    let o = h
        .run(3, &format!("{}:1,{}:2", h.a, h.b))
        .args([
            "sh",
            "-c",
            r#"echo "rank $PMI_RANK in $(ip -br addr show | grep -o '10\.[0-9.]*')""#,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("rank 0 in {}", h.addr_a)), "{out}");
    let b = &h.addr_b;
    assert!(
        out.contains(&format!("rank 1 in {b}")) && out.contains(&format!("rank 2 in {b}")),
        "{out}"
    );
}

#[test]
fn a_failing_rank_on_another_host_ends_the_job() {
    let Some(h) = Hosts::new() else { return };
    let o = h
        .run(4, &format!("{},{}", h.a, h.b))
        .args(["sh", "-c", r#"if [ "$PMI_RANK" = 3 ]; then exit 7; fi; sleep 60"#])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("host {} (ranks 2-3)", h.b)) && err.contains("rank 3"),
        "{err}"
    );
}

#[test]
fn a_host_the_launcher_cannot_reach_is_named() {
    let Some(h) = Hosts::new() else { return };
    let o = h
        .run(4, &format!("{},no-such-host", h.a))
        .arg("true")
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("host no-such-host (ranks 2-3)"),
        "{}",
        text(&o)
    );
}

#[test]
fn hello_across_two_hosts_with_hydra() {
    let Some(mpiexec) = ["/usr/bin/mpiexec.mpich", "/usr/bin/mpiexec.hydra"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        assert!(std::env::var_os("CI").is_none(), "mpiexec.mpich is not installed");
        eprintln!("skipping: mpiexec.mpich is not installed");
        return;
    };
    let Some(h) = Hosts::new() else { return };
    // Hydra's launcher runs `EXEC [options] HOST COMMAND`; this one runs it in the
    // namespace of that name.
    let wrapper = std::env::temp_dir().join(format!("nemesis-netns-exec-{}", std::process::id()));
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\nhost=$1; shift\nexec ip netns exec \"$host\" sh -c \"$*\"\n",
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&wrapper).status().unwrap();
    let o = Command::new("timeout")
        .args(["120", "ip", "netns", "exec", &h.a])
        .arg(mpiexec)
        .args([
            "-n",
            "2",
            "-hosts",
            &format!("{},{}", h.a, h.b),
            "-launcher",
            "rsh",
            "-launcher-exec",
        ])
        .arg(&wrapper)
        .args(["-iface", &h.va])
        .arg(example("hello"))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&wrapper);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("hello from rank 0 of 2") && out.contains("hello from rank 1 of 2"),
        "{out}"
    );
    assert_eq!(out.matches("via net").count(), 2, "{out}");
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_stress() {
    child_main(common::stress::child);
}

/// The netmods, as `NEMESIS_NETMOD` names them.
const NETMODS: [&str; 2] = ["tcp", "udp"];

/// The ranks say hello, meet at a barrier, and pass a token round, over each netmod.
#[test]
fn hello_and_ring_across_two_hosts_over_each_netmod() {
    let Some(h) = Hosts::new() else { return };
    let hosts = format!("{},{}", h.a, h.b);
    for netmod in NETMODS {
        let o = h
            .run(4, &hosts)
            .env("NEMESIS_NETMOD", netmod)
            .arg(example("hello"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{netmod}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).matches("via net").count(),
            4,
            "{netmod}: {}",
            text(&o)
        );
        let o = h
            .run(4, &hosts)
            .env("NEMESIS_NETMOD", netmod)
            .args([example("ring").as_os_str(), "300".as_ref()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{netmod}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("300 laps of 4 ranks"),
            "{netmod}: {}",
            text(&o)
        );
    }
}

/// The randomised two-sided stress test, two ranks on each host: shared memory within
/// a host, the netmod between them.
fn stress(h: &Hosts, netmod: &str, rounds: u32) -> std::process::Output {
    h.run(4, &format!("{},{}", h.a, h.b))
        .env("NEMESIS_NETMOD", netmod)
        .env("NEM_TEST_CHILD", "1")
        .env("STRESS_SEED", "23")
        .env("STRESS_ROUNDS", rounds.to_string())
        .args(child_args("stress"))
        .output()
        .unwrap()
}

#[test]
fn stress_across_two_hosts_over_each_netmod() {
    let Some(h) = Hosts::new() else { return };
    for netmod in NETMODS {
        let o = stress(&h, netmod, 30);
        assert_ranks_said(&o, "messages checked", 4, netmod);
    }
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_rma_suite() {
    child_main(common::rma::child);
}

/// The one-sided checks, two ranks on each host: members on a host reach each other's
/// memory directly (or by cross-memory attach), members on the other by messages, and
/// updates of one word from both kinds of origin stay atomic.
#[test]
fn one_sided_checks_across_two_hosts_over_each_netmod() {
    let Some(h) = Hosts::new() else { return };
    for netmod in NETMODS {
        let o = h
            .run(4, &format!("{},{}", h.a, h.b))
            .env("NEMESIS_NETMOD", netmod)
            .env("NEM_TEST_CHILD", "1")
            .args(child_args("rma_suite"))
            .output()
            .unwrap();
        assert_ranks_said(&o, "rma suite done", 4, netmod);
    }
}

/// udp over a link that loses about 5 % of the datagrams and duplicates about 1 %:
/// every message still arrives, once and in order.
#[test]
fn udp_across_a_lossy_duplicating_link() {
    let Some(h) = Hosts::new() else { return };
    if let Err(e) = h.impair() {
        assert!(std::env::var_os("CI").is_none(), "cannot impair the link: {e}");
        eprintln!("skipping: cannot impair the link ({e})");
        return;
    }
    let o = h
        .run(4, &format!("{},{}", h.a, h.b))
        .env("NEMESIS_NETMOD", "udp")
        .args([example("ring").as_os_str(), "300".as_ref()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("300 laps of 4 ranks"),
        "{}",
        text(&o)
    );
    let o = stress(&h, "udp", 20);
    assert_ranks_said(&o, "messages checked", 4, "udp over a lossy link");
    let (dropped, doubled) = h.impaired();
    assert!(
        dropped > 0 && doubled > 0,
        "the link was not impaired: {dropped} dropped, {doubled} doubled"
    );
    eprintln!("the impaired link dropped {dropped} and doubled {doubled} datagrams");
}

/// A launcher that starts the proxy with an empty environment, as ssh would start it
/// without the caller's variables: the NEMESIS_* ones still reach the ranks.
#[test]
fn nemesis_variables_reach_ranks_whose_launcher_drops_the_environment() {
    let Some(h) = Hosts::new() else { return };
    let o = h
        .run_with(
            2,
            &format!("{},{}", h.a, h.b),
            "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ip netns exec",
        )
        .args([
            "sh",
            "-c",
            r#"echo "rank $PMI_RANK sees ${NEMESIS_FORWARD_TEST:-nothing} and ${OTHER_VAR:-nothing}""#,
        ])
        .env("NEMESIS_FORWARD_TEST", "hi there")
        .env("OTHER_VAR", "x")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} sees hi there and nothing")),
            "{out}"
        );
    }
}
