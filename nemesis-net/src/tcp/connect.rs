//! Making connections: accepting and challenging strangers behind the gate, answering a
//! challenge, checking a hello and a reply. What a connection proves is in
//! [`super::handshake`]; this is when and what follows.

use super::conn::{Conn, State};
use super::handshake::{
    CHALLENGE_LEN, Challenge, HELLO_LEN, Hello, REPLY_LEN, Reply, ReplyCode, decode_challenge, decode_hello,
    decode_reply,
};
use super::sock::{accept_nonblocking, not_now};
use super::{ACCEPTS_PER_POLL, MAX_PAYLOAD_VAR, NAME, TcpNetmod, after};
use crate::{DropReason, Sink, auth};
use std::io::Write;
use std::ops::Range;
use std::time::Instant;

impl TcpNetmod {
    /// Takes every connection waiting on the listener and challenges it at once. Each
    /// waits for its hello behind the gate, which may close older strangers to let it in.
    pub(super) fn accept_all(&mut self) {
        for _ in 0..ACCEPTS_PER_POLL {
            let Some(l) = &self.listener else {
                return;
            };
            let stream = match accept_nonblocking(l) {
                Ok(s) => s,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::EINTR)) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: a stranger's goes, so that the next try can
                    // succeed; with none to close, try again at the next poll.
                    match self.gate.oldest() {
                        Some(old) => {
                            self.refuse_waiting(old, "closed to free a descriptor");
                            continue;
                        }
                        None => return,
                    }
                }
                // Nothing waiting: done until the next poll.
                Err(_) => return,
            };
            let challenge = match auth::nonce() {
                Ok(nonce) => Challenge { nonce },
                Err(_) => continue, // no randomness: the connector retries
            };
            let addr = stream.peer_addr().ok();
            // An empty socket buffer always takes these few bytes; if not, the
            // connection is already gone.
            if !matches!((&stream).write(&challenge.encode()), Ok(CHALLENGE_LEN)) {
                continue;
            }
            let deadline = after(Instant::now(), self.cfg.handshake_timeout);
            // A connection epoll cannot watch is closed at once; its peer retries.
            let Ok(cid) = self.add_conn(stream, addr, None, State::AwaitHello, deadline) else {
                continue;
            };
            if let Some(c) = self.conns.get_mut(&cid) {
                c.challenge = Some(challenge);
            }
            for old in self.gate.admit(cid, addr.map(|a| a.ip())) {
                self.refuse_waiting(old, "closed to make room for newer connections");
            }
        }
    }

    /// Closes a connection that never proved itself, counting why.
    fn refuse_waiting(&mut self, cid: u64, why: &str) {
        if let Some(c) = self.conns.get(&cid) {
            let detail = format!("{} sent no hello and was {why}", c.who());
            self.stats.drops.note(NAME, DropReason::BadHandshake, detail);
        }
        self.close_conn(cid);
    }

    /// Our connect finished, well or not: on success, wait for the challenge.
    pub(super) fn on_connected(&mut self, cid: u64) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let err = match c.stream.take_error() {
            Ok(e) => e,
            Err(e) => Some(e),
        };
        let (Some(rank), who) = (c.peer, c.who()) else {
            return;
        };
        if let Some(e) = err {
            self.close_conn(cid);
            if self.superseded(rank) {
                return;
            }
            if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                self.fail_peer(rank, format!("nobody listens at {who} (connection refused)"));
            } else {
                self.redial_later(rank, format!("connecting to {who}: {e}"));
            }
            return;
        }
        c.state = State::AwaitChallenge;
        self.update_interest(cid);
    }

    /// Reads what a connection in the handshake sent, until `need` bytes are there.
    /// `Err` says how it ended; `Ok(None)`: not yet.
    fn read_handshake(&mut self, cid: u64, need: usize) -> Result<Option<Range<usize>>, String> {
        let Some(c) = self.conns.get_mut(&cid) else {
            return Ok(None);
        };
        match c.fill(usize::MAX).map(|(n, _)| n) {
            Ok(0) if c.end > c.start => return Err("closed in the middle of the handshake".into()),
            Ok(0) => return Err("closed the connection".into()),
            Err(e) if !not_now(&e) => return Err(e.to_string()),
            _ => {}
        }
        if c.end - c.start < need {
            return Ok(None);
        }
        let r = c.start..c.start + need;
        c.start += need;
        Ok(Some(r))
    }

    /// Our connection has something to read: the acceptor's challenge, we hope. We
    /// answer it with our hello.
    pub(super) fn on_challenge(&mut self, cid: u64) {
        let (rank, who) = match self.conns.get(&cid) {
            Some(Conn { peer: Some(r), .. }) => (*r, self.conns[&cid].who()),
            _ => return,
        };
        let range = match self.read_handshake(cid, CHALLENGE_LEN) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(how) => {
                // Closed by a listener too busy with strangers, or by one that is not of
                // this job: neither is final yet.
                self.close_conn(cid);
                self.redial_later(rank, format!("{who} {how} before challenging us"));
                return;
            }
        };
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let challenge = match decode_challenge(&c.input[range]) {
            Ok(ch) => ch,
            Err(r) => {
                self.stats
                    .drops
                    .note(NAME, r, format!("{who} did not open with a challenge"));
                self.close_conn(cid);
                if !self.superseded(rank) {
                    self.fail_peer(
                        rank,
                        format!("the process at {who} is not a tcp netmod of this job (it opened with {r})"),
                    );
                }
                return;
            }
        };
        let Ok(nonce) = auth::nonce() else {
            self.close_conn(cid);
            self.redial_later(rank, "no randomness for a nonce".into());
            return;
        };
        // validate() bounds the max payload by MAX_MAX_PAYLOAD.
        let hello = Hello::new(
            &self.id.job_key,
            self.id.rank,
            rank,
            self.cfg.max_payload as u32,
            nonce,
            &challenge,
        );
        c.hs_out = hello.encode().to_vec();
        c.challenge = Some(challenge);
        c.hello = Some(hello);
        c.state = State::AwaitReply;
        self.flush_conn(cid);
    }

    /// An accepted connection has something to read: its hello, we hope.
    pub(super) fn on_hello(&mut self, cid: u64, sink: &mut dyn Sink) -> usize {
        let Some(who) = self.conns.get(&cid).map(Conn::who) else {
            return 0;
        };
        let range = match self.read_handshake(cid, HELLO_LEN) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(how) => {
                let reason = if how.contains("middle") {
                    DropReason::Truncated
                } else {
                    DropReason::BadHandshake
                };
                self.stats
                    .drops
                    .note(NAME, reason, format!("{who} {how} before its hello"));
                self.close_conn(cid);
                return 0;
            }
        };
        let Some(c) = self.conns.get_mut(&cid) else {
            return 0;
        };
        let hello = decode_hello(&c.input[range]);
        let Some(challenge) = c.challenge else {
            return 0;
        };
        let (me, size, key) = (self.id.rank, self.id.size, &self.id.job_key);
        let refused = match hello {
            Err(r) => Err((r, format!("{who} sent a bad hello"))),
            Ok(h) if !h.proves(key, &challenge) => Err((
                DropReason::WrongJob,
                format!(
                    "{who} (saying it is rank {}) does not hold the job's key: another job, or a forgery",
                    h.from
                ),
            )),
            Ok(h) if h.to != me || h.from >= size || h.from == me => Err((
                DropReason::BadRank,
                format!(
                    "{who} says it is rank {} calling rank {}; we are rank {me} of {size}",
                    h.from, h.to
                ),
            )),
            Ok(h) if h.max_payload as usize != self.cfg.max_payload => Err((
                DropReason::BadHandshake,
                format!(
                    "{who} (rank {}) uses a max payload of {} bytes, we {}: every rank must set the same {MAX_PAYLOAD_VAR}",
                    h.from, h.max_payload, self.cfg.max_payload
                ),
            )),
            Ok(h) => Ok(h),
        };
        let hello = match refused {
            Ok(h) => h,
            Err((reason, detail)) => {
                // A refused connector is told nothing.
                self.stats.drops.note(NAME, reason, detail);
                self.close_conn(cid);
                return 0;
            }
        };
        // It proved itself: it no longer waits at the gate.
        self.gate.leave(cid);
        let from = hello.from;
        let p = self.peers.entry(from).or_default();
        if p.failed.is_some() {
            self.close_conn(cid);
            return 0;
        }
        // The lower rank's connection wins: both ends can tell which that is alone.
        let code = if p.up.is_some() || (p.dialing.is_some() && from > me) {
            ReplyCode::Duplicate
        } else {
            ReplyCode::Accepted
        };
        let reply = Reply::new(&self.id.job_key, code, me, &hello, &challenge).encode();
        if code == ReplyCode::Duplicate {
            let _ = (&c.stream).write(&reply);
            self.close_conn(cid);
            return 0;
        }
        c.hs_out = reply.to_vec();
        self.become_up(cid, from, sink)
    }

    /// Our connection has something to read: the reply to our hello, we hope.
    pub(super) fn on_reply(&mut self, cid: u64, sink: &mut dyn Sink) -> usize {
        let (rank, who) = match self.conns.get(&cid) {
            Some(Conn { peer: Some(r), .. }) => (*r, self.conns[&cid].who()),
            _ => return 0,
        };
        let range = match self.read_handshake(cid, REPLY_LEN) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(how) => {
                // Refused (another job or configuration: see its log), or it gave up on a
                // hello that came too late. Neither is final yet.
                self.close_conn(cid);
                self.redial_later(rank, format!("{who} {how} during the handshake"));
                return 0;
            }
        };
        let Some(c) = self.conns.get(&cid) else {
            return 0;
        };
        let (Some(hello), Some(challenge)) = (c.hello, c.challenge) else {
            return 0;
        };
        let reply = decode_reply(&c.input[range]);
        let refused = match reply {
            Err(r) => Err((
                r,
                format!("the process at {who} is not a tcp netmod of this job (its reply was {r})"),
            )),
            Ok(r) if !r.proves(&self.id.job_key, &hello, &challenge) => Err((
                DropReason::WrongJob,
                format!("the process at {who} does not hold the job's key: another job, or a forgery"),
            )),
            Ok(r) if r.rank != rank => Err((
                DropReason::BadRank,
                format!(
                    "the process at {who} is rank {}: rank {rank}'s business card is wrong",
                    r.rank
                ),
            )),
            Ok(r) => Ok(r),
        };
        match refused {
            Err((r, why)) => {
                self.stats
                    .drops
                    .note(NAME, r, format!("{who} answered our hello badly: {why}"));
                self.close_conn(cid);
                if !self.superseded(rank) {
                    self.fail_peer(rank, why);
                }
                0
            }
            Ok(Reply {
                code: ReplyCode::Duplicate,
                ..
            }) => {
                // Its own connection to us wins; it is on its way.
                self.close_conn(cid);
                self.redial_later(rank, format!("{who} kept answering that another connection wins"));
                0
            }
            Ok(_) if self.superseded(rank) => {
                self.close_conn(cid);
                0
            }
            Ok(_) => self.become_up(cid, rank, sink),
        }
    }
}
