//! A PMI-1 server: the process-manager side of the wire protocol, run by `nemesis-run`.
//!
//! Local ranks get one end of a socketpair each (`PMI_FD`); ranks on other hosts connect
//! over TCP and introduce themselves with `initack` (`PMI_PORT`, `PMI_ID`). One thread
//! polls every connection. It serves what MPICH's and nemesis's clients ask for: init,
//! maxes, kvs name, universe size, appnum, put, get (with `PMI_process_mapping`),
//! barrier, finalize and abort.

use nemesis::bootstrap::wire::{self, Line, MAX_LINE};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread::JoinHandle;

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

/// A running server.
#[derive(Debug)]
pub struct PmiServer {
    thread: Option<JoinHandle<()>>,
    events: mpsc::Receiver<Event>,
    stop: Option<UnixStream>,
    addr: Option<SocketAddr>,
}

impl PmiServer {
    /// Starts serving `conns` (rank, socket), and TCP connections on `listener`.
    pub fn start(
        job: JobInfo,
        conns: Vec<(u32, UnixStream)>,
        listener: Option<TcpListener>,
    ) -> io::Result<Self> {
        let (stop_tx, stop_rx) = UnixStream::pair()?;
        let addr = listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let (tx, events) = mpsc::channel();
        let mut state = State {
            job,
            kvs: HashMap::new(),
            conns: conns
                .into_iter()
                .map(|(r, s)| Conn::new(Sock::Unix(s), Some(r)))
                .collect(),
            listener,
            stop: stop_rx,
            events: tx,
            in_barrier: 0,
        };
        let thread = std::thread::Builder::new()
            .name("pmi-server".into())
            .spawn(move || state.run())?;
        Ok(Self {
            thread: Some(thread),
            events,
            stop: Some(stop_tx),
            addr,
        })
    }

    /// The TCP address ranks on other hosts connect to, if listening.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
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

struct Conn {
    sock: Sock,
    rank: Option<u32>,
    buf: Vec<u8>,
    in_barrier: bool,
    closed: bool,
}

impl Conn {
    fn new(sock: Sock, rank: Option<u32>) -> Self {
        Self {
            sock,
            rank,
            buf: Vec::new(),
            in_barrier: false,
            closed: false,
        }
    }
}

struct State {
    job: JobInfo,
    kvs: HashMap<String, String>,
    conns: Vec<Conn>,
    listener: Option<TcpListener>,
    stop: UnixStream,
    events: mpsc::Sender<Event>,
    in_barrier: u32,
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
            if let Some(l) = &self.listener {
                fds.push(libc::pollfd {
                    fd: l.as_raw_fd(),
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
            // SAFETY: `fds` is a valid array of pollfd of the length given.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if rc < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if fds[0].revents != 0 {
                return; // the launcher dropped its end: stop
            }
            if first_conn == 2 && fds[1].revents & libc::POLLIN != 0 {
                if let Some(Ok((s, _))) = self.listener.as_ref().map(|l| l.accept()) {
                    let _ = s.set_nodelay(true);
                    self.conns.push(Conn::new(Sock::Tcp(s), None));
                }
            }
            for (i, p) in fds[first_conn..].iter().enumerate() {
                if p.revents != 0 {
                    self.service(i);
                }
            }
        }
    }

    fn service(&mut self, i: usize) {
        let mut chunk = [0u8; 4096];
        let n = match self.conns[i].sock.read(&mut chunk) {
            Ok(0) | Err(_) => {
                self.close(i);
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
            self.log(i, "a line longer than the PMI limit; closing the connection");
            self.close(i);
        }
    }

    fn close(&mut self, i: usize) {
        let c = &mut self.conns[i];
        c.closed = true;
        if c.in_barrier {
            c.in_barrier = false;
            self.in_barrier -= 1;
        }
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

    fn handle(&mut self, i: usize, raw: &[u8]) {
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
            self.log(i, "a TCP connection must begin with initack");
            self.close(i);
            return;
        }
        match line.cmd.as_str() {
            "initack" => {
                let id = line.get("pmiid").and_then(|v| v.parse::<u32>().ok());
                let taken = |r| self.conns.iter().any(|c| c.rank == Some(r) && !c.closed);
                match id {
                    Some(r) if r < self.job.size && self.conns[i].rank.is_none() && !taken(r) => {
                        self.conns[i].rank = Some(r);
                        self.reply(i, Line::new("initack"));
                        self.reply(i, Line::new("set").with("size", self.job.size));
                        self.reply(i, Line::new("set").with("rank", r));
                        self.reply(i, Line::new("set").with("debug", 0));
                    }
                    _ => {
                        self.log(
                            i,
                            &format!("initack with a bad or taken pmiid {:?}", line.get("pmiid")),
                        );
                        self.close(i);
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
                    .with("keylen_max", 64)
                    .with("vallen_max", 1024);
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
            "put" => match (line.get("key"), line.get("value")) {
                (Some(k), Some(v)) if k.len() <= 64 && v.len() <= 1024 => {
                    self.kvs.insert(k.to_string(), v.to_string());
                    self.reply(i, ok("put_result").with("msg", "success"));
                }
                _ => self.reply(
                    i,
                    Line::new("put_result")
                        .with("rc", -1)
                        .with("msg", "bad_key_or_value"),
                ),
            },
            "get" => {
                let key = line.get("key").unwrap_or("");
                let value = if key == "PMI_process_mapping" {
                    Some(self.job.mapping.clone())
                } else {
                    self.kvs.get(key).cloned()
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
    use super::*;
    use nemesis::bootstrap::PmiClient;
    use std::time::Duration;

    fn job(size: u32) -> JobInfo {
        JobInfo {
            size,
            kvsname: "kvs_test".into(),
            mapping: process_mapping(&[size]),
            debug: false,
        }
    }

    #[test]
    fn mapping_compresses_runs() {
        assert_eq!(process_mapping(&[4]), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[2, 2, 1]), "(vector,(0,2,2),(2,1,1))");
    }

    #[test]
    fn clients_put_barrier_get_over_sockets_and_tcp() {
        let (a_srv, a_cli) = UnixStream::pair().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut srv = PmiServer::start(job(2), vec![(0, a_srv)], Some(l)).unwrap();
        let port = srv.addr().unwrap().to_string();
        let t = Duration::from_secs(10);
        let th = std::thread::spawn(move || {
            let mut b = PmiClient::connect_port(&port, Some("1"), t).unwrap();
            assert_eq!((b.rank(), b.size()), (1, 2));
            b.init().unwrap();
            b.put("k1", "from-one").unwrap();
            b.barrier().unwrap();
            let got = b.get("k0").unwrap();
            b.finalize().unwrap();
            got
        });
        let mut a = PmiClient::from_socket(a_cli, 0, 2, t);
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
        let start = std::time::Instant::now();
        let ev = loop {
            if let Some(e) = srv.try_event() {
                break e;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no abort event");
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
        srv.stop();
    }

    #[test]
    fn tcp_connection_must_introduce_itself() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let srv = PmiServer::start(job(2), vec![], Some(l)).unwrap();
        let port = srv.addr().unwrap().to_string();
        let t = Duration::from_secs(5);
        assert!(
            PmiClient::connect_port(&port, Some("7"), t).is_err(),
            "pmiid beyond the size"
        );
        let _one = PmiClient::connect_port(&port, Some("1"), t).unwrap();
        assert!(
            PmiClient::connect_port(&port, Some("1"), t).is_err(),
            "pmiid taken"
        );
    }
}
