//! A proxy's line to the PMI server of `nemesis-run` on another host, for its ranks.
//!
//! Each rank gets a socketpair (`PMI_FD`), as local ranks do, so programs built against
//! MPICH work unchanged; the proxy opens one TCP connection per rank to the server,
//! proves that it holds the job's secret ([`super::proof`]), introduces the rank with
//! `initack`, and then copies bytes both ways until either side closes. The ranks never
//! see the secret, and the server never hears from anyone who does not hold it.

use super::proof;
use nemesis::bootstrap::wire::{self, Line, MAX_LINE};
use nemesis::net::auth::JobKey;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connects to the server at `addr` as rank `pmiid`: waits for its challenge, answers
/// it, introduces the rank and reads the server's greeting (`initack`, then `size`,
/// `rank` and `debug`). Retries refused connections until `timeout`, for a server that is
/// not listening yet.
///
/// # Errors
/// No server in time, a server that refuses us, or one that does not speak PMI-1.
pub fn connect(addr: &str, secret: &JobKey, pmiid: u32, timeout: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> = addr.to_socket_addrs()?.collect();
    let mut delay = Duration::from_millis(10);
    let mut s = loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
        let mut got = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(s) => {
                    got = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        match got {
            Some(s) => break s,
            None if last.kind() == io::ErrorKind::ConnectionRefused && Instant::now() + delay < deadline => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            None => return Err(last),
        }
    };
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let first = read_line(&mut s)?;
    let nonce =
        proof::nonce_of(&first).ok_or_else(|| bad(format!("the server did not challenge us: {first:?}")))?;
    let hello = [
        proof::answer(secret, &nonce),
        Line::new("initack").with("pmiid", pmiid),
    ];
    for l in hello {
        let text = l.encode().map_err(|e| bad(e.to_string()))?;
        s.write_all(text.as_bytes())?;
    }
    let expect = |l: &Line, cmd: &str| {
        if l.cmd == cmd {
            Ok(())
        } else {
            Err(bad(format!(
                "the server refused rank {pmiid} (answered {l:?}, not {cmd}); see its log"
            )))
        }
    };
    expect(&read_line(&mut s)?, "initack")?;
    for _ in 0..3 {
        expect(&read_line(&mut s)?, "set")?;
    }
    s.set_read_timeout(None)?;
    Ok(s)
}

/// Reads one line, a byte at a time, so that nothing after it is taken from the stream.
fn read_line(s: &mut TcpStream) -> io::Result<Line> {
    let mut raw = Vec::new();
    let mut b = [0u8; 1];
    while raw.last() != Some(&b'\n') {
        if raw.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a line over the PMI limit",
            ));
        }
        match s.read(&mut b) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection (a wrong secret or rank? see its log)",
                ));
            }
            Ok(_) => raw.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    wire::parse(&raw).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Copies bytes between each rank's socket and its connection to the server.
#[derive(Debug)]
pub struct Relay {
    thread: Option<JoinHandle<()>>,
    stop: Option<UnixStream>,
}

impl Relay {
    /// Starts copying between each pair: (the rank's end, its connection).
    pub fn start(pairs: Vec<(UnixStream, TcpStream)>) -> io::Result<Self> {
        let (stop_tx, stop_rx) = UnixStream::pair()?;
        let thread = std::thread::Builder::new()
            .name("pmi-relay".into())
            .spawn(move || pump(pairs, stop_rx))?;
        Ok(Self {
            thread: Some(thread),
            stop: Some(stop_tx),
        })
    }

    /// Stops copying and closes every connection.
    pub fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop();
    }
}

fn pump(mut pairs: Vec<(UnixStream, TcpStream)>, stop: UnixStream) {
    let mut buf = vec![0u8; 64 << 10];
    while !pairs.is_empty() {
        let mut fds = vec![libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for (rank, server) in &pairs {
            for fd in [rank.as_raw_fd(), server.as_raw_fd()] {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        // SAFETY: `fds` is a valid array of pollfd of the length given.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        let mut gone = Vec::new();
        for (k, (rank, server)) in pairs.iter_mut().enumerate() {
            let (from_rank, from_server) = (fds[1 + 2 * k].revents, fds[2 + 2 * k].revents);
            let ok = (from_rank == 0 || copy(&mut *rank, &mut *server, &mut buf))
                && (from_server == 0 || copy(&mut *server, &mut *rank, &mut buf));
            if !ok {
                // Either side's end ends both: the server sees the rank leave, or the
                // rank sees its process manager go.
                let _ = server.shutdown(Shutdown::Both);
                let _ = rank.shutdown(Shutdown::Both);
                gone.push(k);
            }
        }
        for k in gone.into_iter().rev() {
            pairs.swap_remove(k);
        }
    }
}

/// Copies what `from` has now to `to`; false when either has ended.
fn copy(mut from: impl Read, mut to: impl Write, buf: &mut [u8]) -> bool {
    match from.read(buf) {
        Ok(0) => false,
        Ok(n) => to.write_all(&buf[..n]).is_ok(),
        Err(e) => matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock),
    }
}
