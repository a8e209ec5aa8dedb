//! What a stranger on the same machine tries against a job, each made to happen by a
//! second process and each failing the test if the attack succeeds: idle connections to
//! the ranks' listeners and a connection to `nemesis-run`'s PMI port (by a process of
//! user `nobody` where the test may change user, else of ours), and `kill -9` of the
//! launcher in the middle of start-up.

mod common;

use common::{child_args, child_main, leftovers, nemesis_run, shm_dir, text};
use nemesis::Op;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Waits for `path` to exist, up to `limit`.
fn wait_for(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Raises this process's soft descriptor limit to its hard limit, for the connections
/// the test holds.
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer; setrlimit reads what getrlimit wrote.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur
}

/// The stranger: opens `STRANGER_COUNT` connections spread over the addresses in
/// `STRANGER_ADDRS` and says nothing on them, or, with `STRANGER_PMI`, tries its attacks
/// on that PMI port and prints what each got. It holds its connections until its input
/// ends.
#[test]
#[ignore = "child process of the multi-process tests"]
fn child_stranger() {
    child_main(|| {
        use std::io::{BufRead, BufReader, Read, Write};
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if let Ok(port) = std::env::var("STRANGER_PMI") {
            let attempts: [&[u8]; 3] = [
                b"cmd=initack pmiid=0\n",
                b"cmd=auth tag=0000000000000000000000000000000000000000000000000000000000000000\n",
                b"cmd=get kvsname=x key=nem-key\n",
            ];
            for attempt in attempts {
                let s = TcpStream::connect(&port).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .map_err(|e| e.to_string())?;
                let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                let mut challenge = String::new();
                r.read_line(&mut challenge).map_err(|e| e.to_string())?;
                (&s).write_all(attempt).map_err(|e| e.to_string())?;
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                println!(
                    "stranger (uid {uid}) was challenged with {:?} and got {:?}",
                    challenge.trim_end(),
                    String::from_utf8_lossy(&rest)
                );
            }
            return Ok(());
        }
        let addrs: Vec<SocketAddr> = std::env::var("STRANGER_ADDRS")
            .map_err(|e| e.to_string())?
            .split(',')
            .map(|a| a.parse().map_err(|e| format!("{a}: {e}")))
            .collect::<Result<_, String>>()?;
        let n: usize = std::env::var("STRANGER_COUNT")
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|e| format!("STRANGER_COUNT: {e}"))?;
        let held: Vec<TcpStream> = (0..n)
            .map(|i| TcpStream::connect(addrs[i % addrs.len()]).map_err(|e| e.to_string()))
            .collect::<Result<_, String>>()?;
        println!("stranger (uid {uid}) holds {} connections", held.len());
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        drop(held);
        Ok(())
    });
}

/// The stranger's process, as user `nobody` where this test may change user (and
/// nobody may run this binary), else as ours.
fn stranger(env: &[(&str, String)]) -> std::process::Child {
    let make = |other_user: bool| {
        let mut c = Command::new(&child_args("stranger")[0]);
        c.args(&child_args("stranger")[1..])
            .env("NEM_TEST_CHILD", "1")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if other_user {
            use std::os::unix::process::CommandExt;
            c.uid(65534).gid(65534);
        }
        c
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match make(root).spawn() {
        Ok(c) => c,
        Err(e) if root => {
            eprintln!("the stranger runs as us: user nobody cannot run it here ({e})");
            make(false).spawn().unwrap()
        }
        Err(e) => panic!("cannot start the stranger: {e}"),
    }
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_flooded() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let c = w.comm();
        let (r, n) = (w.rank(), w.size());
        let dir = PathBuf::from(std::env::var("FLOOD_DIR").map_err(|e| e.to_string())?);
        let card = w.channel().netmod().ok_or("no netmod")?.business_card();
        let addr = nemesis::net::addr::decode_card("tcp", r, &card).map_err(|e| e.to_string())?;
        // Written whole under another name, then renamed: the reader sees all or nothing.
        let tmp = dir.join(format!(".card-{r}"));
        std::fs::write(&tmp, addr.to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, dir.join(format!("card-{r}"))).map_err(|e| e.to_string())?;
        // No rank has connected to another yet: the strangers come first.
        if !wait_for(&dir.join("go"), Duration::from_secs(120)) {
            return Err("no go".into());
        }
        let mut sum = [r as u64 + 1];
        w.allreduce(&c, &mut sum, Op::Sum).map_err(|e| e.to_string())?;
        let want = (n as u64) * (n as u64 + 1) / 2;
        if sum[0] != want {
            return Err(format!("allreduce gave {}, not {want}", sum[0]));
        }
        for _ in 0..20 {
            w.barrier(&c).map_err(|e| e.to_string())?;
        }
        println!("rank {r} came through");
        Ok(())
    });
}

/// A job of 4 ranks over tcp starts while this process holds 4,000 connections to the
/// ranks' listeners that never say a word, more than a rank may hold descriptors; the
/// job completes well within the network timeout.
#[test]
fn idle_connections_do_not_keep_a_tcp_job_from_starting() {
    let have = raise_fd_limit();
    if have < 4_500 {
        eprintln!("skipping: only {have} descriptors may be open here");
        return;
    }
    let shm = shm_dir("flood");
    let dir = shm_dir("flood-cards");
    let mut run = Command::new(nemesis_run());
    run.args(["-n", "4", "--timeout", "120", "--"])
        .args(child_args("flooded"))
        .env("NEM_TEST_CHILD", "1")
        .env("NEMESIS_SHM_DIR", &shm)
        .env("NEMESIS_NETMOD", "tcp")
        .env("NEMESIS_NO_SHM", "1")
        .env("FLOOD_DIR", &dir)
        // A peer that is kept waiting fails the job within 4 s.
        .env("NEMESIS_NET_TIMEOUT", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The ranks may hold fewer descriptors than there are strangers.
    // SAFETY: setrlimit is async-signal-safe and `lim` is a valid struct.
    unsafe {
        use std::os::unix::process::CommandExt;
        run.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 512,
                rlim_max: 512,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let job = run.spawn().unwrap();
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for r in 0..4 {
        let card = dir.join(format!("card-{r}"));
        if !wait_for(&card, Duration::from_secs(60)) {
            panic!(
                "rank {r} published no card: {}",
                text(&job.wait_with_output().unwrap())
            );
        }
        addrs.push(std::fs::read_to_string(&card).unwrap().parse().unwrap());
    }
    let list: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    let mut strange = stranger(&[
        ("STRANGER_ADDRS", list.join(",")),
        ("STRANGER_COUNT", "4000".into()),
    ]);
    // What it says once it holds them all (libtest says things around it).
    let mut said = String::new();
    {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(strange.stdout.as_mut().unwrap());
        while !said.contains("holds") {
            said.clear();
            if r.read_line(&mut said).unwrap() == 0 {
                break;
            }
        }
    }
    assert!(
        said.contains("holds 4000 connections"),
        "{said:?}: {:?}",
        strange.wait_with_output()
    );
    eprintln!("{}", said.trim_end());
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = job.wait_with_output().unwrap();
    drop(strange.stdin.take());
    let _ = strange.wait();
    common::assert_ranks_said(&out, "came through", 4, "a job flooded with idle connections");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sent no hello"),
        "the ranks did not count the strangers they closed:\n{stderr}"
    );
    assert!(leftovers(&shm).is_empty());
    let _ = std::fs::remove_dir_all(&shm);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "child process of the multi-process tests"]
fn child_waits_for_go() {
    child_main(|| {
        let mut w = nemesis::init().map_err(|e| e.to_string())?;
        let c = w.comm();
        let dir = PathBuf::from(std::env::var("ATTACK_DIR").map_err(|e| e.to_string())?);
        std::fs::write(dir.join(format!("ready-{}", w.rank())), b"").map_err(|e| e.to_string())?;
        if !wait_for(&dir.join("go"), Duration::from_secs(120)) {
            return Err("no go".into());
        }
        w.barrier(&c).map_err(|e| e.to_string())?;
        println!("rank {} came through", w.rank());
        Ok(())
    });
}

/// The value that follows `flag` on the command line of a process whose command line
/// also holds `with`, as `ps` shows it to anyone on the machine.
fn from_a_command_line(flag: &str, with: &str) -> Option<String> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.iter().any(|a| a.contains(with)) {
            continue;
        }
        if let Some(i) = args.iter().position(|a| a == flag) {
            return args.get(i + 1).cloned();
        }
    }
    None
}

/// Whether any process's command line holds a word that looks like a secret: 64
/// hexadecimal digits.
fn a_secret_on_a_command_line() -> Option<String> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        for a in raw.split(|&b| b == 0) {
            if a.len() >= 64 && a.windows(64).any(|w| w.iter().all(u8::is_ascii_hexdigit)) {
                return Some(String::from_utf8_lossy(a).into_owned());
            }
        }
    }
    None
}

/// A job across two "hosts" (both this one, through a launcher script) while a stranger
/// connects to the PMI port that `ps` shows and tries to take a rank's place, to answer
/// a challenge without the secret, and to read a key: each connection is closed without
/// a word, the job completes, and `nemesis-run` counts the refusals.
#[test]
fn a_stranger_at_the_pmi_port_gets_nothing() {
    let shm = shm_dir("pmi-attack");
    let dir = shm_dir("pmi-attack-files");
    let launcher = dir.join("launch");
    std::fs::write(&launcher, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
    std::fs::set_permissions(&launcher, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let job = Command::new(nemesis_run())
        .args([
            "-n",
            "2",
            "--timeout",
            "120",
            "--hosts",
            "h1,h2",
            "--pmi-addr",
            "127.0.0.1",
        ])
        .arg("--launcher")
        .arg(&launcher)
        .arg("--")
        .args(child_args("waits_for_go"))
        .env("NEM_TEST_CHILD", "1")
        .env("NEMESIS_SHM_DIR", &shm)
        .env("ATTACK_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for r in 0..2 {
        assert!(
            wait_for(&dir.join(format!("ready-{r}")), Duration::from_secs(60)),
            "rank {r} did not start: {}",
            text(&job.wait_with_output().unwrap())
        );
    }
    assert_eq!(a_secret_on_a_command_line(), None, "a secret is visible in ps");
    let port = from_a_command_line("--proxy-pmi", &shm.display().to_string()).expect("the PMI port, from ps");
    let o = stranger(&[("STRANGER_PMI", port)]).wait_with_output().unwrap();
    assert!(o.status.success(), "the stranger failed: {}", text(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    let tries: Vec<&str> = said
        .lines()
        .filter_map(|l| l.find("stranger (").map(|at| &l[at..]))
        .collect();
    assert_eq!(tries.len(), 3, "{said}");
    for t in &tries {
        eprintln!("{t}");
        assert!(t.contains("challenged with \"cmd=challenge nonce="), "{t}");
        assert!(t.ends_with("and got \"\""), "the stranger got an answer: {t}");
    }
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = job.wait_with_output().unwrap();
    common::assert_ranks_said(&out, "came through", 2, "a job whose PMI port was attacked");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(3 refused so far)"), "{stderr}");
    assert!(leftovers(&shm).is_empty());
    let _ = std::fs::remove_dir_all(&shm);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether a process of ours still runs with `marker` in its environment.
fn any_process_with(marker: &str) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        std::fs::read(e.path().join("environ"))
            .is_ok_and(|env| env.windows(marker.len()).any(|w| w == marker.as_bytes()))
    })
}

/// Waits, through inotify, until a file appears in `dir` or `limit` passes.
fn wait_for_a_file(dir: &Path, limit: Duration) -> bool {
    // SAFETY: plain system calls; the buffer is ours and as long as we say.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK);
        if fd < 0 {
            return false;
        }
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let ok = libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) >= 0;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let seen = ok && libc::poll(&mut pfd, 1, limit.as_millis() as i32) == 1;
        libc::close(fd);
        seen
    }
}

/// `kill -9` of `nemesis-run` 20 times during the start-up of a job of 8 ranks: half of
/// them the moment the node's segment file appears (the worst moment: the file exists
/// and not every rank has it yet), half at moments spread over a start-up. Then one job
/// runs to its end. Nothing is left in the shared-memory directory.
#[test]
fn killing_the_launcher_during_start_up_leaves_nothing() {
    let shm = shm_dir("kill9");
    let marker = format!("NEMESIS_SHM_DIR={}", shm.display());
    let hello = common::example("hello");
    let job = || {
        let mut c = Command::new(nemesis_run());
        c.args(["-n", "8", "--timeout", "60", "--"])
            .arg(&hello)
            .env("NEMESIS_SHM_DIR", &shm)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // All on one CPU, so that the ranks take turns attaching and the segment file
        // is there long enough for a kill to find it.
        // SAFETY: sched_setaffinity is async-signal-safe; the set is ours.
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(|| {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
        c
    };
    // How long a whole job takes here, to spread the kills over its start-up.
    let t = Instant::now();
    let o = job().output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let whole = t.elapsed();
    let mut left_by_kills = 0;
    for i in 0..20u32 {
        let mut c = job().spawn().unwrap();
        if i % 2 == 0 {
            wait_for_a_file(&shm, Duration::from_secs(10));
        } else {
            std::thread::sleep(whole * i / 20);
        }
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
        c.wait().unwrap();
        // Its ranks die with it (a parent-death signal); wait until they have.
        let start = Instant::now();
        while any_process_with(&marker) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "ranks outlived their launcher"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        left_by_kills += leftovers(&shm).len();
    }
    eprintln!("the kills left {left_by_kills} files in all");
    assert!(
        left_by_kills > 0,
        "no kill found the segment file there: the test missed the moment it aims at"
    );
    let o = job().output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        leftovers(&shm).is_empty(),
        "left behind: {:?}\n{}",
        leftovers(&shm),
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&shm);
}
