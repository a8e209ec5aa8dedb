//! Jobs across hosts. Two "hosts" are two network namespaces joined by a veth pair,
//! made and removed by each test; the launcher command is `ip netns exec`. Only
//! addresses inside those namespaces are used. Where `ip netns` is not permitted the
//! tests say so and pass.

mod common;

use common::{RUN, example, text};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Two namespaces, `a` at 10.X.Y.1 and `b` at 10.X.Y.2, joined by veth `va`–`vb`.
struct Hosts {
    a: String,
    b: String,
    va: String,
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
            addr_a: format!("10.{}.{}.1", 100 + id % 100, n % 250),
            addr_b: format!("10.{}.{}.2", 100 + id % 100, n % 250),
        };
        let vb = format!("nvb{id}x{n}");
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
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.a,
            RUN,
            "-n",
            &n.to_string(),
            "--timeout",
            "120",
        ])
        .args([
            "--hosts",
            hosts,
            "--launcher",
            "ip netns exec",
            "--pmi-addr",
            &self.addr_a,
            "--",
        ]);
        c
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
