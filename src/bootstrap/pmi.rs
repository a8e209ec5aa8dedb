//! A PMI-1 client, speaking the wire protocol directly.
//!
//! Hydra (`mpiexec`) and `nemesis-run` hand each process a connected socket in `PMI_FD`;
//! Hydra with `-pmi-port` gives `PMI_PORT=host:port` and `PMI_ID` instead; Slurm's
//! `srun --mpi=pmi2` serves the same PMI-1 commands on `PMI_FD`. Every reply is parsed
//! generically and its `rc` checked; every failure names the command.

use super::wire::{self, Line, MAX_LINE, WireError};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Why a PMI exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmiError {
    /// The process manager closed the connection.
    #[error("PMI {command}: the process manager closed the connection")]
    Closed {
        /// The command in flight.
        command: &'static str,
    },
    /// No reply in time.
    #[error(
        "PMI {command}: no reply within {timeout:?} (a process that never reached it?); \
         NEMESIS_STARTUP_TIMEOUT sets the limit"
    )]
    Timeout {
        /// The command in flight.
        command: &'static str,
        /// How long was waited.
        timeout: Duration,
    },
    /// A reply that does not parse, or is not the reply to the command.
    #[error("PMI {command}: bad reply {reply:?}: {why}")]
    Garbage {
        /// The command in flight.
        command: &'static str,
        /// The reply, or its start.
        reply: String,
        /// What is wrong with it.
        why: String,
    },
    /// The process manager answered with a non-zero `rc`.
    #[error("PMI {command} failed: rc={rc}{}", if msg.is_empty() { String::new() } else { format!(" ({msg})") })]
    Refused {
        /// The command.
        command: &'static str,
        /// The return code.
        rc: i64,
        /// The process manager's message.
        msg: String,
    },
    /// A key or value the wire or the process manager cannot carry.
    #[error("PMI {command}: {why}")]
    TooLong {
        /// The command.
        command: &'static str,
        /// What exceeds which limit.
        why: String,
    },
    /// A system call failed.
    #[error("PMI {command}: {source}")]
    Io {
        /// The command in flight.
        command: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A PMI environment variable is unusable.
    #[error("invalid {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.set_read_timeout(t),
            Self::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(buf),
            Self::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.write(buf),
            Self::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The limits the process manager advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Maxes {
    /// Longest kvs name.
    pub kvsname: usize,
    /// Longest key.
    pub key: usize,
    /// Longest value.
    pub value: usize,
}

/// A connection to the process manager.
pub struct PmiClient {
    stream: Stream,
    buf: Vec<u8>,
    rank: u32,
    size: u32,
    kvsname: String,
    maxes: Maxes,
    timeout: Duration,
    finalized: bool,
}

impl std::fmt::Debug for PmiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmiClient")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("kvsname", &self.kvsname)
            .finish_non_exhaustive()
    }
}

fn env_u32(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Result<Option<u32>, PmiError> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| PmiError::Env {
            var,
            value: v.clone(),
            reason: "expected a whole number".into(),
        }),
    }
}

impl PmiClient {
    /// Connects as the environment says: `PMI_FD`, else `PMI_PORT` (with `PMI_ID`), else
    /// `None`, a singleton. `timeout` bounds every wait for a reply.
    pub fn from_env(timeout: Duration) -> Result<Option<Self>, PmiError> {
        Self::from_lookup(|k| std::env::var(k).ok(), timeout)
    }

    /// As [`PmiClient::from_env`], reading variables through `get`.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> Result<Option<Self>, PmiError> {
        if let Some(fd) = get("PMI_FD") {
            let fd: RawFd = fd
                .trim()
                .parse()
                .ok()
                .filter(|&f: &RawFd| f >= 0)
                .ok_or_else(|| PmiError::Env {
                    var: "PMI_FD",
                    value: fd.clone(),
                    reason: "expected a file descriptor number".into(),
                })?;
            let size = env_u32(&get, "PMI_SIZE")?.unwrap_or(1);
            let rank = env_u32(&get, "PMI_RANK")?.unwrap_or(0);
            if size == 0 || rank >= size {
                return Err(PmiError::Env {
                    var: "PMI_RANK",
                    value: rank.to_string(),
                    reason: format!("must be below PMI_SIZE={size}"),
                });
            }
            // SAFETY: F_GETFD only asks about the descriptor.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(PmiError::Env {
                    var: "PMI_FD",
                    value: fd.to_string(),
                    reason: "not an open file descriptor".into(),
                });
            }
            // Our children must not inherit the process manager's socket.
            // SAFETY: the descriptor is open (checked above).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            // SAFETY: the process manager gave this descriptor to us alone; we own it now.
            let stream = Stream::Unix(unsafe { UnixStream::from_raw_fd(fd) });
            return Ok(Some(Self::with_stream(stream, rank, size, timeout)));
        }
        if let Some(port) = get("PMI_PORT") {
            let id = get("PMI_ID");
            return Self::connect_port(&port, id.as_deref(), timeout).map(Some);
        }
        Ok(None)
    }

    /// A client over an already connected socket (`PMI_FD` mode).
    pub fn from_socket(sock: UnixStream, rank: u32, size: u32, timeout: Duration) -> Self {
        Self::with_stream(Stream::Unix(sock), rank, size, timeout)
    }

    fn with_stream(stream: Stream, rank: u32, size: u32, timeout: Duration) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            rank,
            size,
            kvsname: String::new(),
            maxes: Maxes {
                kvsname: 256,
                key: 64,
                value: 1024,
            },
            timeout,
            finalized: false,
        }
    }

    /// Connects to `host:port` and introduces itself with `PMI_ID`, learning rank and size.
    pub fn connect_port(port: &str, id: Option<&str>, timeout: Duration) -> Result<Self, PmiError> {
        let command = "connect";
        let Some(id) = id else {
            return Err(PmiError::Env {
                var: "PMI_ID",
                value: String::new(),
                reason: "PMI_PORT is set but PMI_ID is not".into(),
            });
        };
        let id: u32 = id.trim().parse().map_err(|_| PmiError::Env {
            var: "PMI_ID",
            value: id.to_string(),
            reason: "expected a whole number".into(),
        })?;
        let bad = |reason: String| PmiError::Env {
            var: "PMI_PORT",
            value: port.to_string(),
            reason,
        };
        let addrs: Vec<_> = port
            .to_socket_addrs()
            .map_err(|e| bad(format!("cannot resolve it: {e}")))?
            .collect();
        // The server may not be listening yet, or the network not up yet: retry what
        // can pass, until the deadline.
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(10);
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, timeout) {
                    Ok(s) => return Self::introduce(s, id, timeout),
                    Err(e) => last = Some(e),
                }
            }
            let Some(source) = last else {
                return Err(bad("it resolves to no address".into()));
            };
            let transient = matches!(
                source.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted
            );
            if !transient || Instant::now() + delay >= deadline {
                return Err(PmiError::Io { command, source });
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }

    /// Says `initack` on a fresh TCP connection and learns rank and size.
    fn introduce(tcp: TcpStream, id: u32, timeout: Duration) -> Result<Self, PmiError> {
        let _ = tcp.set_nodelay(true);
        let mut c = Self::with_stream(Stream::Tcp(tcp), 0, 1, timeout);
        let command = "initack";
        c.send(command, &Line::new("initack").with("pmiid", id))?;
        c.expect(command, "initack")?;
        let (mut size, mut rank) = (None, None);
        while size.is_none() || rank.is_none() {
            let l = c.expect(command, "set")?;
            let num = |v: Option<&str>| v.and_then(|s| s.parse::<u32>().ok());
            if let Some(v) = l.get("size") {
                size = num(Some(v));
            } else if let Some(v) = l.get("rank") {
                rank = num(Some(v));
            }
            if l.get("size").is_some() && size.is_none() || l.get("rank").is_some() && rank.is_none() {
                return Err(PmiError::Garbage {
                    command,
                    reply: format!("{l:?}"),
                    why: "not a number".into(),
                });
            }
        }
        c.expect(command, "set")?; // debug=
        let (size, rank) = (size.unwrap_or(1), rank.unwrap_or(0));
        if size == 0 || rank >= size {
            return Err(PmiError::Garbage {
                command,
                reply: format!("size={size} rank={rank}"),
                why: "rank beyond size".into(),
            });
        }
        c.rank = rank;
        c.size = size;
        Ok(c)
    }

    /// Our rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The job's key-value space, known after [`PmiClient::init`].
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// The limits advertised by the process manager.
    pub fn maxes(&self) -> Maxes {
        self.maxes
    }

    fn send(&mut self, command: &'static str, line: &Line) -> Result<(), PmiError> {
        let text = line.encode().map_err(|e| match e {
            WireError::TooLong(n) => PmiError::TooLong {
                command,
                why: format!("a line of {n} bytes, over {MAX_LINE}"),
            },
            other => PmiError::TooLong {
                command,
                why: other.to_string(),
            },
        })?;
        self.stream
            .write_all(text.as_bytes())
            .map_err(|source| match source.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => PmiError::Closed { command },
                _ => PmiError::Io { command, source },
            })
    }

    /// Reads one reply line.
    fn recv(&mut self, command: &'static str) -> Result<Line, PmiError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let raw: Vec<u8> = self.buf.drain(..=nl).collect();
                return wire::parse(&raw).map_err(|e| PmiError::Garbage {
                    command,
                    reply: String::from_utf8_lossy(&raw[..raw.len().min(120)])
                        .trim_end()
                        .to_string(),
                    why: e.to_string(),
                });
            }
            if self.buf.len() > MAX_LINE {
                return Err(PmiError::Garbage {
                    command,
                    reply: String::from_utf8_lossy(&self.buf[..120]).into_owned(),
                    why: format!("no newline within {MAX_LINE} bytes"),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PmiError::Timeout {
                    command,
                    timeout: self.timeout,
                });
            }
            self.stream
                .set_timeout(Some(left))
                .map_err(|source| PmiError::Io { command, source })?;
            let mut chunk = [0u8; 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(PmiError::Closed { command }),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(PmiError::Closed { command });
                }
                Err(source) => return Err(PmiError::Io { command, source }),
            }
        }
    }

    /// Reads the reply, which must be `reply`, and checks its `rc` when it has one.
    fn expect(&mut self, command: &'static str, reply: &str) -> Result<Line, PmiError> {
        let l = self.recv(command)?;
        if l.cmd != reply {
            return Err(PmiError::Garbage {
                command,
                reply: format!("cmd={} ...", l.cmd),
                why: format!("expected cmd={reply}"),
            });
        }
        if let Some(rc) = l.get("rc") {
            let rc: i64 = rc.parse().map_err(|_| PmiError::Garbage {
                command,
                reply: format!("rc={rc}"),
                why: "rc is not a number".into(),
            })?;
            if rc != 0 {
                let msg = l.get("msg").unwrap_or("").to_string();
                return Err(PmiError::Refused { command, rc, msg });
            }
        }
        Ok(l)
    }

    fn request(&mut self, command: &'static str, line: Line, reply: &str) -> Result<Line, PmiError> {
        self.send(command, &line)?;
        self.expect(command, reply)
    }

    /// `init`, then `get_maxes` and `get_my_kvsname`.
    pub fn init(&mut self) -> Result<(), PmiError> {
        let l = self.request(
            "init",
            Line::new("init").with("pmi_version", 1).with("pmi_subversion", 1),
            "response_to_init",
        )?;
        if l.get("pmi_version").is_some_and(|v| v != "1") {
            return Err(PmiError::Garbage {
                command: "init",
                reply: format!("{l:?}"),
                why: "not PMI version 1".into(),
            });
        }
        let l = self.request("get_maxes", Line::new("get_maxes"), "maxes")?;
        let num = |k: &str, d: usize| l.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
        self.maxes = Maxes {
            kvsname: num("kvsname_max", 256),
            key: num("keylen_max", 64),
            value: num("vallen_max", 1024),
        };
        let l = self.request("get_my_kvsname", Line::new("get_my_kvsname"), "my_kvsname")?;
        self.kvsname = l
            .get("kvsname")
            .filter(|k| !k.is_empty())
            .ok_or_else(|| PmiError::Garbage {
                command: "get_my_kvsname",
                reply: format!("{l:?}"),
                why: "no kvsname".into(),
            })?
            .to_string();
        Ok(())
    }

    fn check_sizes(&self, command: &'static str, key: &str, value: Option<&str>) -> Result<(), PmiError> {
        if key.len() > self.maxes.key {
            return Err(PmiError::TooLong {
                command,
                why: format!("key {key:?} is longer than {} bytes", self.maxes.key),
            });
        }
        if let Some(v) = value {
            if v.len() > self.maxes.value {
                return Err(PmiError::TooLong {
                    command,
                    why: format!("a value of {} bytes, over {}", v.len(), self.maxes.value),
                });
            }
        }
        Ok(())
    }

    /// Stores `value` under `key`; others see it after the next barrier.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        self.check_sizes("put", key, Some(value))?;
        let line = Line::new("put")
            .with("kvsname", &self.kvsname)
            .with("key", key)
            .with("value", value);
        self.request("put", line, "put_result").map(|_| ())
    }

    /// The value under `key`; `None` when the process manager says it has none.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        self.check_sizes("get", key, None)?;
        let line = Line::new("get").with("kvsname", &self.kvsname).with("key", key);
        self.send("get", &line)?;
        let l = self.recv("get")?;
        if l.cmd != "get_result" {
            return Err(PmiError::Garbage {
                command: "get",
                reply: format!("cmd={} ...", l.cmd),
                why: "expected cmd=get_result".into(),
            });
        }
        let rc = match l.get("rc") {
            None => 0,
            Some(r) => r.parse::<i64>().map_err(|_| PmiError::Garbage {
                command: "get",
                reply: format!("rc={r}"),
                why: "rc is not a number".into(),
            })?,
        };
        // A missing key is rc=-1 from Hydra, rc=1 from Slurm, found=FALSE in PMI 1.2.
        if rc != 0 || l.get("found") == Some("FALSE") {
            return Ok(None);
        }
        Ok(l.get("value").map(str::to_string))
    }

    /// Waits until every rank of the job has entered the barrier.
    pub fn barrier(&mut self) -> Result<(), PmiError> {
        self.request("barrier", Line::new("barrier_in"), "barrier_out")
            .map(|_| ())
    }

    /// Says goodbye to the process manager.
    pub fn finalize(&mut self) -> Result<(), PmiError> {
        if !self.finalized {
            self.finalized = true;
            self.request("finalize", Line::new("finalize"), "finalize_ack")?;
        }
        Ok(())
    }

    /// Asks the process manager to end the whole job with `code`. No reply comes.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), PmiError> {
        let msg: String = message
            .chars()
            .map(|c| if c.is_whitespace() || c == '=' { '_' } else { c })
            .take(200)
            .collect();
        let mut line = Line::new("abort").with("exitcode", code);
        if !msg.is_empty() {
            line = line.with("message", msg);
        }
        self.send("abort", &line)
    }
}

/// A process manager that answers each request with the next scripted reply (`None`:
/// say nothing; "CLOSE": hang up), for tests of what a client makes of what it hears.
#[cfg(test)]
pub(crate) fn scripted<S: AsRef<str> + Send + 'static>(replies: Vec<Option<S>>) -> UnixStream {
    use std::io::{BufRead, BufReader};
    let (ours, theirs) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        let mut r = BufReader::new(theirs.try_clone().unwrap());
        let mut w = theirs;
        for reply in replies {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            match reply.as_ref().map(AsRef::as_ref) {
                Some("CLOSE") => return,
                Some(text) => {
                    let _ = w.write_all(text.as_bytes());
                }
                None => {}
            }
        }
        // Keep the socket open until the client gives up.
        let mut sink = String::new();
        let _ = r.read_line(&mut sink);
    });
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    const INIT_OK: [Option<&str>; 3] = [
        Some("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"),
        Some("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=40\n"),
        Some("cmd=my_kvsname kvsname=kvs_1\n"),
    ];

    fn client(replies: Vec<Option<&'static str>>) -> PmiClient {
        PmiClient::from_socket(scripted(replies), 0, 2, Duration::from_millis(300))
    }

    fn after_init(more: &[Option<&'static str>]) -> PmiClient {
        let mut c = client(INIT_OK.iter().copied().chain(more.iter().copied()).collect());
        c.init().unwrap();
        c
    }

    #[test]
    fn init_accepts_replies_without_rc() {
        let c = after_init(&[]);
        assert_eq!(c.kvsname(), "kvs_1");
        assert_eq!(c.maxes().value, 40);
    }

    #[test]
    fn garbage_is_an_error_naming_the_command() {
        let e = client(vec![Some("hello there\n")]).init().unwrap_err();
        assert!(matches!(e, PmiError::Garbage { command: "init", .. }), "{e}");
        let e = client(vec![Some("cmd=put_result rc=0\n")]).init().unwrap_err();
        assert!(e.to_string().contains("expected cmd=response_to_init"), "{e}");
        let e = client(vec![Some("cmd=response_to_init rc=zero\n")])
            .init()
            .unwrap_err();
        assert!(matches!(e, PmiError::Garbage { command: "init", .. }), "{e}");
        let long: &'static str = Box::leak("x".repeat(3000).into_boxed_str());
        let e = client(vec![Some(long)]).init().unwrap_err();
        assert!(e.to_string().contains("no newline"), "{e}");
    }

    #[test]
    fn early_close_and_refusal() {
        let e = client(vec![Some("CLOSE")]).init().unwrap_err();
        assert!(matches!(e, PmiError::Closed { command: "init" }), "{e}");
        let e = client(vec![Some("cmd=response_to_init rc=-1 msg=go_away\n")])
            .init()
            .unwrap_err();
        assert!(
            matches!(e, PmiError::Refused { command: "init", rc: -1, ref msg } if msg == "go_away"),
            "{e}"
        );
        let mut c = after_init(&[Some("cmd=put_result rc=5 msg=full\n")]);
        let e = c.put("k", "v").unwrap_err();
        assert!(e.to_string().starts_with("PMI put failed: rc=5"), "{e}");
    }

    #[test]
    fn a_barrier_nobody_completes_times_out() {
        let mut c = after_init(&[None]);
        let start = Instant::now();
        let e = c.barrier().unwrap_err();
        assert!(
            matches!(
                e,
                PmiError::Timeout {
                    command: "barrier",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waited far beyond the timeout"
        );
        assert!(e.to_string().contains("NEMESIS_STARTUP_TIMEOUT"));
    }

    #[test]
    fn missing_keys_in_every_dialect() {
        let mut c = after_init(&[
            Some("cmd=get_result rc=-1 msg=key_a_not_found value=unknown\n"),
            Some("cmd=get_result rc=1\n"),
            Some("cmd=get_result found=FALSE\n"),
            Some("cmd=get_result rc=0 value=here\n"),
        ]);
        assert_eq!(c.get("a").unwrap(), None);
        assert_eq!(c.get("b").unwrap(), None);
        assert_eq!(c.get("c").unwrap(), None);
        assert_eq!(c.get("d").unwrap().as_deref(), Some("here"));
    }

    #[test]
    fn limits_and_unsendable_values() {
        let mut c = after_init(&[]);
        assert!(matches!(
            c.put("k", &"v".repeat(41)),
            Err(PmiError::TooLong { command: "put", .. })
        ));
        assert!(matches!(
            c.put(&"k".repeat(65), "v"),
            Err(PmiError::TooLong { .. })
        ));
        assert!(matches!(c.put("k", "a b"), Err(PmiError::TooLong { .. })));
    }

    #[test]
    fn bad_environment() {
        let t = Duration::from_millis(100);
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(
            PmiClient::from_lookup(env(&[]), t).unwrap().is_none(),
            "no PMI: a singleton"
        );
        let e = PmiClient::from_lookup(env(&[("PMI_FD", "abc")]), t).unwrap_err();
        assert!(matches!(e, PmiError::Env { var: "PMI_FD", .. }), "{e}");
        let e = PmiClient::from_lookup(env(&[("PMI_FD", "9999")]), t).unwrap_err();
        assert!(e.to_string().contains("not an open file descriptor"), "{e}");
        let e = PmiClient::from_lookup(env(&[("PMI_FD", "0"), ("PMI_RANK", "5"), ("PMI_SIZE", "2")]), t)
            .unwrap_err();
        assert!(matches!(e, PmiError::Env { var: "PMI_RANK", .. }), "{e}");
        let e = PmiClient::from_lookup(env(&[("PMI_PORT", "no-such-host.invalid:1"), ("PMI_ID", "0")]), t)
            .unwrap_err();
        assert!(matches!(e, PmiError::Env { var: "PMI_PORT", .. }), "{e}");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port: &'static str = Box::leak(l.local_addr().unwrap().to_string().into_boxed_str());
        let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([("PMI_PORT", port)]));
        let e = PmiClient::from_lookup(env(pairs), t).unwrap_err();
        assert!(matches!(e, PmiError::Env { var: "PMI_ID", .. }), "{e}");
    }
}
