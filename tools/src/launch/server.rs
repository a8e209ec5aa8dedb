//! A PMI-1 server: the process-manager side of the wire protocol, run by `nemesis-run`.
//!
//! Local ranks get one end of a socketpair each (`PMI_FD`): holding it is their proof of
//! membership. Other hosts' proxies connect over TCP, once per rank, and must prove they
//! hold the job's secret ([`super::proof`]) before anything else is answered; then they
//! introduce the rank with `initack` (`PMI_ID`), and a rank can be introduced once. One
//! thread polls every connection. It serves what MPICH's and nemesis's clients ask for:
//! init, maxes, kvs name, universe size, appnum, put, get (with `PMI_process_mapping`),
//! barrier, finalize and abort. Keys are written once, by their owner ([`super::kvs`]).
//!
//! Connections that have not proved themselves are bounded in number, per source and in
//! all ([`nemesis::net::gate`]), and in time ([`PROOF_TIMEOUT`]); each that fails is
//! closed and counted ([`PmiServer::refused`]).

use super::kvs::{self, Kvs};
use super::proof;
use nemesis::bootstrap::wire::{self, Line, MAX_LINE};
use nemesis::net::auth::{self, JobKey, NONCE_LEN};
use nemesis::net::gate::Gate;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a TCP connection has to prove that it belongs to the job.
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections accepted in one round of the loop: enough to drain a full listen queue.
const ACCEPTS_PER_ROUND: usize = 8192;

/// Something a rank asked of the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A rank called `abort`: the job must end with `code`.
    Abort {
        /// Who asked, when known.
        rank: Option<u32>,
        /// The exit status it asked for.
        code: i32,
        /// Its message.
        message: String,
    },
}

/// What the server knows of the job.
#[derive(Debug, Clone)]
pub struct JobInfo {
    /// Ranks in the job.
    pub size: u32,
    /// The key-value space's name.
    pub kvsname: String,
    /// MPICH's `PMI_process_mapping`, e.g. `(vector,(0,1,4))`.
    pub mapping: String,
    /// Print every request and reply on stderr.
    pub debug: bool,
}

/// A TCP listener for other hosts' proxies, and the secret they must prove they hold.
#[derive(Debug)]
pub struct Listen {
    /// Where proxies connect.
    pub listener: TcpListener,
    /// The job's secret.
    pub secret: JobKey,
    /// How long a connection has to prove itself ([`PROOF_TIMEOUT`] unless a test
    /// says).
    pub proof_timeout: Duration,
}

impl Listen {
    /// Proxies prove they hold `secret`, within [`PROOF_TIMEOUT`].
    pub fn new(listener: TcpListener, secret: JobKey) -> Self {
        Self {
            listener,
            secret,
            proof_timeout: PROOF_TIMEOUT,
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct PmiServer {
    thread: Option<JoinHandle<()>>,
    events: mpsc::Receiver<Event>,
    stop: Option<UnixStream>,
    addr: Option<SocketAddr>,
    refused: Arc<AtomicU64>,
}

impl PmiServer {
    /// Starts serving `conns` (rank, socket), and proven TCP connections on `listen`.
    pub fn start(job: JobInfo, conns: Vec<(u32, UnixStream)>, listen: Option<Listen>) -> io::Result<Self> {
        let (stop_tx, stop_rx) = UnixStream::pair()?;
        let addr = listen.as_ref().map(|l| l.listener.local_addr()).transpose()?;
        if let Some(l) = &listen {
            l.listener.set_nonblocking(true)?;
        }
        let (tx, events) = mpsc::channel();
        let refused = Arc::new(AtomicU64::new(0));
        let mut claimed = vec![false; job.size as usize];
        for (r, _) in &conns {
            if let Some(c) = claimed.get_mut(*r as usize) {
                *c = true;
            }
        }
        let mut state = State {
            job,
            kvs: Kvs::default(),
            conns: conns
                .into_iter()
                .enumerate()
                .map(|(id, (r, s))| Conn::new(id as u64, Sock::Unix(s), Some(r), Proof::Inherited))
                .collect(),
            listen,
            gate: Gate::default(),
            claimed,
            stop: stop_rx,
            events: tx,
            in_barrier: 0,
            refused: refused.clone(),
            next_id: 0,
        };
        state.next_id = state.conns.len() as u64;
        let thread = std::thread::Builder::new()
            .name("pmi-server".into())
            .spawn(move || state.run())?;
        Ok(Self {
            thread: Some(thread),
            events,
            stop: Some(stop_tx),
            addr,
            refused,
        })
    }

    /// The TCP address other hosts' proxies connect to, if listening.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// TCP connections refused so far: no proof, a wrong one, or a misbehaving rank.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The next event, if one is waiting.
    pub fn try_event(&self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// Stops serving and waits for the thread.
    pub fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PmiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    fn fd(&self) -> RawFd {
        match self {
            Self::Unix(s) => s.as_raw_fd(),
            Self::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(b),
            Self::Tcp(s) => s.read(b),
        }
    }
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.write_all(b),
            Self::Tcp(s) => s.write_all(b),
        }
    }
}

/// How a connection shows that it belongs to the job.
enum Proof {
    /// An inherited socketpair: holding it is the proof.
    Inherited,
    /// A TCP connection that was challenged with `nonce` and must answer by `deadline`.
    Awaiting {
        nonce: [u8; NONCE_LEN],
        deadline: Instant,
    },
    /// A TCP connection that answered its challenge.
    Proven,
}

struct Conn {
    /// For the gate.
    id: u64,
    sock: Sock,
    /// The peer's address, for messages (TCP only).
    from: Option<SocketAddr>,
    rank: Option<u32>,
    proof: Proof,
    buf: Vec<u8>,
    in_barrier: bool,
    closed: bool,
}

impl Conn {
    fn new(id: u64, sock: Sock, rank: Option<u32>, proof: Proof) -> Self {
        Self {
            id,
            sock,
            from: None,
            rank,
            proof,
            buf: Vec::new(),
            in_barrier: false,
            closed: false,
        }
    }
}

struct State {
    job: JobInfo,
    kvs: Kvs,
    conns: Vec<Conn>,
    listen: Option<Listen>,
    gate: Gate,
    /// Ranks already introduced: a `PMI_ID` is claimed once, ever.
    claimed: Vec<bool>,
    stop: UnixStream,
    events: mpsc::Sender<Event>,
    in_barrier: u32,
    refused: Arc<AtomicU64>,
    next_id: u64,
}

impl State {
    fn run(&mut self) {
        loop {
            self.conns.retain(|c| !c.closed);
            let mut fds = vec![libc::pollfd {
                fd: self.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if let Some(l) = &self.listen {
                fds.push(libc::pollfd {
                    fd: l.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let first_conn = fds.len();
            fds.extend(self.conns.iter().map(|c| libc::pollfd {
                fd: c.sock.fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let next_deadline = self
                .conns
                .iter()
                .filter_map(|c| match c.proof {
                    Proof::Awaiting { deadline, .. } => Some(deadline),
                    _ => None,
                })
                .min();
            let timeout = next_deadline.map_or(-1, |d| {
                let ms = d.saturating_duration_since(Instant::now()).as_millis() + 1;
                i32::try_from(ms).unwrap_or(i32::MAX)
            });
            // SAFETY: `fds` is a valid array of pollfd of the length given.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if rc < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if fds[0].revents != 0 {
                return; // the launcher dropped its end: stop
            }
            for (i, p) in fds[first_conn..].iter().enumerate() {
                if p.revents != 0 && !self.conns[i].closed {
                    self.service(i);
                }
            }
            self.expire();
            if first_conn == 2 && fds[1].revents & libc::POLLIN != 0 {
                self.accept_all();
            }
        }
    }

    /// Takes every waiting connection and challenges it; the gate may close older
    /// strangers to make room.
    fn accept_all(&mut self) {
        for _ in 0..ACCEPTS_PER_ROUND {
            let Some(l) = &self.listen else {
                return;
            };
            let proof_timeout = l.proof_timeout;
            let (mut s, from) = match l.listener.accept() {
                Ok(a) => a,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    let oldest = self.gate.oldest();
                    match oldest.and_then(|id| self.conns.iter().position(|c| c.id == id)) {
                        Some(i) => {
                            self.refuse(i, "closed to free a descriptor");
                            continue;
                        }
                        None => return,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => continue,
            };
            let _ = s.set_nodelay(true);
            let Ok(nonce) = auth::nonce() else {
                continue;
            };
            let Ok(line) = proof::challenge(&nonce).encode() else {
                continue;
            };
            if s.write_all(line.as_bytes()).is_err() {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let deadline = Instant::now() + proof_timeout;
            let mut c = Conn::new(id, Sock::Tcp(s), None, Proof::Awaiting { nonce, deadline });
            c.from = Some(from);
            self.conns.push(c);
            for old in self.gate.admit(id, Some(from.ip())) {
                if let Some(i) = self.conns.iter().position(|c| c.id == old) {
                    self.refuse(i, "closed to make room for newer connections");
                }
            }
        }
    }

    /// Closes the connections whose time to prove themselves is up.
    fn expire(&mut self) {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if let Proof::Awaiting { deadline, .. } = self.conns[i].proof
                && deadline <= now
                && !self.conns[i].closed
            {
                let t = self.listen.as_ref().map_or(PROOF_TIMEOUT, |l| l.proof_timeout);
                self.refuse(i, &format!("proved nothing within {t:?}"));
            }
        }
    }

    fn service(&mut self, i: usize) {
        let mut chunk = [0u8; 4096];
        let n = match self.conns[i].sock.read(&mut chunk) {
            Ok(0) | Err(_) => {
                if matches!(self.conns[i].proof, Proof::Awaiting { .. }) {
                    self.refuse(i, "closed before proving anything");
                } else {
                    self.close(i);
                }
                return;
            }
            Ok(n) => n,
        };
        self.conns[i].buf.extend_from_slice(&chunk[..n]);
        while let Some(nl) = self.conns[i].buf.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.conns[i].buf.drain(..=nl).collect();
            self.handle(i, &raw);
            if self.conns[i].closed {
                return;
            }
        }
        if self.conns[i].buf.len() > MAX_LINE {
            self.refuse(i, "a line longer than the PMI limit");
        }
    }

    fn close(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if c.closed {
            return;
        }
        c.closed = true;
        self.gate.leave(c.id);
        if c.in_barrier {
            c.in_barrier = false;
            self.in_barrier -= 1;
        }
    }

    /// Closes a connection that failed to prove itself or broke the rules, counting it.
    fn refuse(&mut self, i: usize, why: &str) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        // The first few, then every power of two: a flood is visible without flooding.
        if n <= 3 || n.is_power_of_two() {
            let who = match (self.conns[i].rank, self.conns[i].from) {
                (Some(r), _) => format!("rank {r}'s connection"),
                (None, Some(a)) => format!("a connection from {a}"),
                (None, None) => "a connection".into(),
            };
            eprintln!("nemesis-run: PMI: refused {who}: {why} ({n} refused so far)");
        }
        self.close(i);
    }

    fn log(&self, i: usize, what: &str) {
        let who = self.conns[i]
            .rank
            .map_or("a connection".to_string(), |r| format!("rank {r}"));
        eprintln!("nemesis-run: PMI: {who}: {what}");
    }

    fn reply(&mut self, i: usize, line: Line) {
        if self.job.debug {
            eprintln!(
                "nemesis-run: PMI -> {:?}: {}",
                self.conns[i].rank,
                line.encode().unwrap_or_default().trim_end()
            );
        }
        match line.encode() {
            Ok(text) => {
                if self.conns[i].sock.write_all(text.as_bytes()).is_err() {
                    self.close(i);
                }
            }
            Err(e) => self.log(i, &format!("cannot send a reply: {e}")),
        }
    }

    /// Checks a challenged connection's first line: its answer.
    fn prove(&mut self, i: usize, raw: &[u8]) {
        let Proof::Awaiting { nonce, .. } = self.conns[i].proof else {
            return;
        };
        let Some(secret) = self.listen.as_ref().map(|l| &l.secret) else {
            return;
        };
        let verdict = match wire::parse(raw) {
            Ok(line) => proof::check(secret, &nonce, &line),
            Err(_) => Err("it did not answer the challenge"),
        };
        match verdict {
            Ok(()) => {
                self.conns[i].proof = Proof::Proven;
                let id = self.conns[i].id;
                self.gate.leave(id);
            }
            Err(why) => self.refuse(i, why),
        }
    }

    fn handle(&mut self, i: usize, raw: &[u8]) {
        if matches!(self.conns[i].proof, Proof::Awaiting { .. }) {
            // Nothing is logged or answered before the proof: it may be a stranger's.
            self.prove(i, raw);
            return;
        }
        let line = match wire::parse(raw) {
            Ok(l) => l,
            Err(e) => {
                self.log(i, &format!("bad request: {e}"));
                self.reply(i, Line::new("error").with("rc", -1).with("msg", "bad_request"));
                return;
            }
        };
        if self.job.debug {
            eprintln!(
                "nemesis-run: PMI <- {:?}: {}",
                self.conns[i].rank,
                String::from_utf8_lossy(raw).trim_end()
            );
        }
        let ok = |cmd: &str| Line::new(cmd).with("rc", 0);
        if self.conns[i].rank.is_none() && line.cmd != "initack" {
            self.refuse(i, "a TCP connection must begin with initack");
            return;
        }
        match line.cmd.as_str() {
            "initack" => {
                let id = line.get("pmiid").and_then(|v| v.parse::<u32>().ok());
                let free = |r: u32| self.claimed.get(r as usize) == Some(&false);
                match id {
                    Some(r) if self.conns[i].rank.is_none() && free(r) => {
                        self.claimed[r as usize] = true;
                        self.conns[i].rank = Some(r);
                        self.reply(i, Line::new("initack"));
                        self.reply(i, Line::new("set").with("size", self.job.size));
                        self.reply(i, Line::new("set").with("rank", r));
                        self.reply(i, Line::new("set").with("debug", 0));
                    }
                    _ => {
                        let why = format!(
                            "initack with a pmiid that is out of range or already claimed: {:?}",
                            line.get("pmiid")
                        );
                        self.refuse(i, &why);
                    }
                }
            }
            "init" => {
                let v1 = line.get("pmi_version") == Some("1");
                let reply = Line::new("response_to_init")
                    .with("pmi_version", 1)
                    .with("pmi_subversion", 1)
                    .with("rc", if v1 { 0 } else { -1 });
                self.reply(i, reply);
            }
            "get_maxes" => {
                let l = ok("maxes")
                    .with("kvsname_max", 256)
                    .with("keylen_max", kvs::MAX_KEY)
                    .with("vallen_max", kvs::MAX_VALUE);
                self.reply(i, l);
            }
            "get_my_kvsname" => {
                let l = ok("my_kvsname").with("kvsname", &self.job.kvsname);
                self.reply(i, l);
            }
            "get_universe_size" => {
                let l = ok("universe_size").with("size", self.job.size);
                self.reply(i, l);
            }
            "get_appnum" => self.reply(i, ok("appnum").with("appnum", 0)),
            "put" => {
                let rank = self.conns[i].rank.unwrap_or(u32::MAX);
                let done = match (line.get("key"), line.get("value")) {
                    (Some(k), Some(v)) => self.kvs.put(rank, k, v),
                    _ => Err(kvs::PutError::BadSize),
                };
                let reply = match done {
                    Ok(()) => ok("put_result").with("msg", "success"),
                    Err(e) => {
                        self.log(i, &format!("put of {:?} refused: {}", line.get("key"), e.msg()));
                        Line::new("put_result").with("rc", -1).with("msg", e.msg())
                    }
                };
                self.reply(i, reply);
            }
            "get" => {
                let key = line.get("key").unwrap_or("");
                let value = if key == kvs::MAPPING {
                    Some(self.job.mapping.clone())
                } else {
                    self.kvs.get(key).map(str::to_string)
                };
                let reply = match value {
                    Some(v) => ok("get_result").with("msg", "success").with("value", v),
                    None => Line::new("get_result")
                        .with("rc", -1)
                        .with("msg", format!("key_{key}_not_found")),
                };
                self.reply(i, reply);
            }
            "barrier_in" => {
                if !self.conns[i].in_barrier {
                    self.conns[i].in_barrier = true;
                    self.in_barrier += 1;
                }
                if self.in_barrier == self.job.size {
                    for j in 0..self.conns.len() {
                        if self.conns[j].in_barrier && !self.conns[j].closed {
                            self.conns[j].in_barrier = false;
                            self.reply(j, ok("barrier_out"));
                        }
                    }
                    self.in_barrier = 0;
                }
            }
            "finalize" => self.reply(i, ok("finalize_ack")),
            "abort" => {
                let code = line.get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1);
                let message = line.get("message").unwrap_or("").replace('_', " ");
                let _ = self.events.send(Event::Abort {
                    rank: self.conns[i].rank,
                    code,
                    message,
                });
            }
            other => {
                self.log(i, &format!("unsupported command {other:?}"));
                let l = Line::new(&format!("{other}_result"))
                    .with("rc", -1)
                    .with("msg", "unsupported_command");
                self.reply(i, l);
            }
        }
    }
}

/// A socketpair for a rank: our end, and the end the rank inherits (close-on-exec off in
/// the child only, by the caller).
pub fn rank_socket() -> io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    Ok((ours, OwnedFd::from(theirs)))
}

/// MPICH's `PMI_process_mapping` for hosts holding `counts[i]` consecutive ranks each.
pub fn process_mapping(counts: &[u32]) -> String {
    let mut runs: Vec<(usize, usize, u32)> = Vec::new();
    for (node, &c) in counts.iter().enumerate() {
        match runs.last_mut() {
            Some((_, nodes, count)) if *count == c => *nodes += 1,
            _ => runs.push((node, 1, c)),
        }
    }
    let body: Vec<String> = runs.iter().map(|(s, n, c)| format!("({s},{n},{c})")).collect();
    format!("(vector,{})", body.join(","))
}

#[cfg(test)]
mod tests {
    use super::super::relay::{self, Relay};
    use super::*;
    use nemesis::bootstrap::{PmiClient, PmiError};
    use std::io::{BufRead, BufReader};

    const T: Duration = Duration::from_secs(10);

    fn job(size: u32) -> JobInfo {
        JobInfo {
            size,
            kvsname: "kvs_test".into(),
            mapping: process_mapping(&[size]),
            debug: false,
        }
    }

    /// A server for a job of `size` with no local ranks, listening on loopback.
    fn listening(size: u32, proof_timeout: Duration) -> (PmiServer, String, JobKey) {
        let secret = JobKey::random().unwrap();
        let mut l = Listen::new(TcpListener::bind("127.0.0.1:0").unwrap(), secret.clone());
        l.proof_timeout = proof_timeout;
        let srv = PmiServer::start(job(size), vec![], Some(l)).unwrap();
        let addr = srv.addr().unwrap().to_string();
        (srv, addr, secret)
    }

    /// A client for `rank` through a relay, as a proxy's rank has.
    fn relayed(addr: &str, secret: &JobKey, rank: u32, size: u32) -> (PmiClient, Relay) {
        let conn = relay::connect(addr, secret, rank, T).unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let r = Relay::start(vec![(ours, conn)]).unwrap();
        (PmiClient::from_socket(theirs, rank, size, T), r)
    }

    /// A stranger's connection, and the challenge it was given.
    fn stranger(addr: &str) -> (TcpStream, Line) {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut first = String::new();
        BufReader::new(&s).read_line(&mut first).unwrap();
        (s, wire::parse(first.as_bytes()).unwrap())
    }

    /// Whether the server closed `s` without another word.
    fn closed_silently(mut s: TcpStream) -> bool {
        let mut buf = [0u8; 256];
        matches!(s.read(&mut buf), Ok(0) | Err(_))
    }

    fn wait_refused(srv: &PmiServer, n: u64) {
        let start = Instant::now();
        while srv.refused() < n {
            assert!(start.elapsed() < T, "refused {} of {n}", srv.refused());
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn mapping_compresses_runs() {
        assert_eq!(process_mapping(&[4]), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[2, 2, 1]), "(vector,(0,2,2),(2,1,1))");
    }

    #[test]
    fn a_local_and_a_relayed_rank_put_barrier_and_get() {
        let (a_srv, a_cli) = UnixStream::pair().unwrap();
        let secret = JobKey::random().unwrap();
        let l = Listen::new(TcpListener::bind("127.0.0.1:0").unwrap(), secret.clone());
        let mut srv = PmiServer::start(job(2), vec![(0, a_srv)], Some(l)).unwrap();
        let addr = srv.addr().unwrap().to_string();
        let th = std::thread::spawn(move || {
            let (mut b, _relay) = relayed(&addr, &secret, 1, 2);
            b.init().unwrap();
            b.put("k1", "from-one").unwrap();
            b.barrier().unwrap();
            let got = b.get("k0").unwrap();
            b.finalize().unwrap();
            got
        });
        let mut a = PmiClient::from_socket(a_cli, 0, 2, T);
        a.init().unwrap();
        assert_eq!(a.kvsname(), "kvs_test");
        a.put("k0", "from-zero").unwrap();
        a.barrier().unwrap();
        assert_eq!(a.get("k1").unwrap().as_deref(), Some("from-one"));
        assert_eq!(a.get("nothing").unwrap(), None);
        assert_eq!(
            a.get("PMI_process_mapping").unwrap().as_deref(),
            Some("(vector,(0,1,2))")
        );
        assert_eq!(th.join().unwrap().as_deref(), Some("from-zero"));
        a.abort(3, "giving up now").unwrap();
        let start = Instant::now();
        let ev = loop {
            if let Some(e) = srv.try_event() {
                break e;
            }
            assert!(start.elapsed() < T, "no abort event");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(
            ev,
            Event::Abort {
                rank: Some(0),
                code: 3,
                message: "giving up now".into()
            }
        );
        assert_eq!(srv.refused(), 0);
        srv.stop();
    }

    #[test]
    fn a_connection_that_cannot_prove_itself_is_told_nothing_and_counted() {
        let (srv, addr, secret) = listening(2, Duration::from_millis(300));
        // Straight to business, as an MPICH client with PMI_PORT would.
        let (mut s, ch) = stranger(&addr);
        assert_eq!(ch.cmd, "challenge");
        s.write_all(b"cmd=initack pmiid=1\n").unwrap();
        assert!(closed_silently(s));
        // Another job's secret.
        let (mut s, ch) = stranger(&addr);
        let other = JobKey::random().unwrap();
        let answer = proof::answer(&other, &proof::nonce_of(&ch).unwrap());
        s.write_all(answer.encode().unwrap().as_bytes()).unwrap();
        assert!(closed_silently(s));
        // The right secret's answer to another challenge: a replay.
        let (mut s, _) = stranger(&addr);
        let replay = proof::answer(&secret, &[9; NONCE_LEN]);
        s.write_all(replay.encode().unwrap().as_bytes()).unwrap();
        assert!(closed_silently(s));
        // Garbage, and silence until the deadline.
        let (mut s, _) = stranger(&addr);
        s.write_all(&[0xff; 40]).unwrap();
        s.write_all(b"\n").unwrap();
        assert!(closed_silently(s));
        let (s, _) = stranger(&addr);
        assert!(closed_silently(s), "a silent connection outlived its deadline");
        wait_refused(&srv, 5);
        // None of them took rank 1's place: the real one still gets it.
        let (mut b, _relay) = relayed(&addr, &secret, 1, 2);
        b.init().unwrap();
        assert_eq!(srv.refused(), 5);
    }

    #[test]
    fn a_rank_is_introduced_once_ever() {
        let (srv, addr, secret) = listening(2, PROOF_TIMEOUT);
        assert!(
            relay::connect(&addr, &secret, 7, T).is_err(),
            "pmiid beyond the size"
        );
        let first = relay::connect(&addr, &secret, 1, T).unwrap();
        assert!(relay::connect(&addr, &secret, 1, T).is_err(), "pmiid taken");
        drop(first);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            relay::connect(&addr, &secret, 1, T).is_err(),
            "a pmiid taken again after its holder left"
        );
        assert_eq!(srv.refused(), 3);
        assert!(relay::connect(&addr, &secret, 0, T).is_ok());
    }

    #[test]
    fn a_rank_cannot_write_what_another_owns() {
        let (_srv, addr, secret) = listening(2, PROOF_TIMEOUT);
        let (mut a, _ra) = relayed(&addr, &secret, 0, 2);
        let (mut b, _rb) = relayed(&addr, &secret, 1, 2);
        a.init().unwrap();
        b.init().unwrap();
        a.put("nem-host-0", "mine").unwrap();
        a.put("shared", "first").unwrap();
        let refused = |r: Result<(), PmiError>| matches!(r, Err(PmiError::Refused { .. }));
        assert!(
            refused(b.put("nem-host-0", "evil")),
            "a nemesis key of another rank"
        );
        assert!(
            refused(b.put("nem-seg-0", "../../x")),
            "a key of another rank, not yet written"
        );
        assert!(refused(b.put("nem-key", "00")), "the network key is rank 0's");
        assert!(refused(b.put("shared", "second")), "a key its first writer owns");
        assert!(refused(a.put("shared", "changed")), "a key written once");
        assert!(refused(b.put("PMI_process_mapping", "(vector)")));
        assert_eq!(b.get("nem-host-0").unwrap().as_deref(), Some("mine"));
        assert_eq!(b.get("shared").unwrap().as_deref(), Some("first"));
    }

    #[test]
    fn silent_strangers_do_not_keep_a_proxy_out() {
        let (srv, addr, secret) = listening(1, PROOF_TIMEOUT);
        let strangers: Vec<TcpStream> = (0..600).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        let (mut c, _r) = relayed(&addr, &secret, 0, 1);
        c.init().unwrap();
        c.barrier().unwrap();
        wait_refused(&srv, 600 - nemesis::net::gate::PER_SOURCE as u64);
        drop(strangers);
    }
}
