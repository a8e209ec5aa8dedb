//! The `ud` netmod as a job opens it: reliable datagrams over one UD queue pair for
//! every peer ([`UdNetmod`]), and beside them an `rc` netmod that carries no packets but
//! offers [`Rdma`], its pairs made on demand: only the peers a large message is read from
//! (or by) cost a connection, so the many a rank exchanges only small messages with stay
//! at the datagram netmod's constant memory.
//!
//! The business card is the `ud` card with the `rc` card of the RDMA side on a second
//! line ([`join_cards`]). `NEMESIS_UD_RDMA=0` ([`RDMA_VAR`]) leaves the RDMA side out;
//! a device that cannot open it leaves it out too, and says so once.

use super::rc::{RcConfig, RcNetmod};
use super::ud::{UdConfig, UdNetmod};
use crate::rdma::Rdma;
use crate::sys::Epoll;
use crate::verbs_wire::{join_cards, split_card};
use crate::{Accept, Cards, Envelope, Identity, NetError, NetStats, Netmod, WaitHint};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether `ud` opens its RDMA side (1, the default) or not (0).
pub const RDMA_VAR: &str = "NEMESIS_UD_RDMA";

/// The `ud` netmod with its RDMA side.
#[derive(Debug)]
pub struct Hybrid {
    ud: UdNetmod,
    rc: Option<RcNetmod>,
    card: Vec<u8>,
    /// Both netmods' wait descriptors, for a waiter that sleeps on this one.
    epoll: Epoll,
    /// Polls since the RDMA side was last polled while it had nothing under way.
    idle: u32,
    /// A wait saw the RDMA side ready: the next poll looks at it.
    rdma_ready: bool,
}

/// While the RDMA side has nothing under way, it is polled once in this many polls:
/// all that can come is a peer's connection request, and each poll of it costs as much
/// as one of the datagrams (three completion queues instead of one), which a spinning
/// receiver's latency pays.
const RDMA_IDLE_POLL: u32 = 16;

/// The job's source of cards, shared by both sides.
type Source = Arc<Mutex<Box<dyn Cards>>>;

/// A peer's card for one side: the first line of its `ud` card for the datagrams, the
/// second for the RDMA side.
struct Side {
    source: Source,
    rdma: bool,
}

impl Cards for Side {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        let card = self
            .source
            .lock()
            .map_err(|_| NetError::BadCard {
                rank,
                reason: "the card table is poisoned".into(),
            })?
            .card(rank)?;
        match (split_card(&card), self.rdma) {
            ((ud, _), false) => Ok(ud.to_vec()),
            ((_, Some(rc)), true) => Ok(rc.to_vec()),
            ((_, None), true) => Err(NetError::BadCard {
                rank,
                reason: format!("its ud card names no RDMA endpoint (is {RDMA_VAR}=0 there?)"),
            }),
        }
    }
}

impl Hybrid {
    /// Opens the datagram netmod and, unless `rdma` is false, the RDMA side.
    ///
    /// # Errors
    /// As [`UdNetmod::new`]; the RDMA side failing to open is not an error (it is said
    /// on standard error, and large messages go by packets).
    pub fn new(
        id: Identity,
        cards: Box<dyn Cards>,
        cfg: UdConfig,
        rdma: Option<RcConfig>,
    ) -> Result<Self, NetError> {
        let source: Source = Arc::new(Mutex::new(cards));
        let side = |rdma| {
            Box::new(Side {
                source: source.clone(),
                rdma,
            })
        };
        let ud = UdNetmod::new(id.clone(), side(false), cfg)?;
        let rc = match rdma {
            None => None,
            Some(rcfg) => match RcNetmod::new(id, side(true), rcfg) {
                Ok(rc) => Some(rc),
                Err(e) => {
                    eprintln!("nemesis: ud opens no RDMA side ({e}); large messages go by packets");
                    None
                }
            },
        };
        let card = match &rc {
            Some(rc) => join_cards(&ud.business_card(), &rc.business_card()),
            None => ud.business_card(),
        };
        let epoll = Epoll::new().map_err(|e| NetError::io("ud: epoll_create", e))?;
        // Tokens: 0 the datagrams, 1 the RDMA side.
        let fds = [ud.wait_fd(), rc.as_ref().and_then(|r| r.wait_fd())];
        for (token, fd) in fds.into_iter().enumerate() {
            if let Some(fd) = fd {
                epoll
                    .ctl(
                        libc::EPOLL_CTL_ADD,
                        fd.as_raw_fd(),
                        libc::EPOLLIN as u32,
                        token as u64,
                    )
                    .map_err(|e| NetError::io("ud: epoll_ctl", e))?;
            }
        }
        Ok(Self {
            ud,
            rc,
            card,
            epoll,
            idle: 0,
            rdma_ready: false,
        })
    }

    /// The configuration of the RDMA side the variables read through `get` ask for, or
    /// `None` when it is turned off: small rings, as it carries no packets.
    ///
    /// # Errors
    /// A variable that cannot be used.
    pub fn rdma_config(get: impl Fn(&str) -> Option<String>) -> Result<Option<RcConfig>, NetError> {
        let on = nemesis_shm::config::switch(&get, RDMA_VAR).map_err(|value| NetError::Config {
            var: RDMA_VAR,
            value,
            reason: nemesis_shm::config::SWITCH_EXPECTED.into(),
        })?;
        if on == Some(false) {
            return Ok(None);
        }
        let mut c = RcConfig::from_lookup(&get)?;
        c.eager = 1 << 10;
        c.recv_depth = 16;
        Ok(Some(c))
    }

    /// The RDMA side, if a poll is to look at it now: while it has something under
    /// way, when a wait saw it ready, else once in [`RDMA_IDLE_POLL`] polls.
    fn rdma_due(&mut self) -> Option<&mut RcNetmod> {
        let rc = self.rc.as_mut()?;
        self.idle += 1;
        if self.rdma_ready || self.idle >= RDMA_IDLE_POLL || rc.busy() {
            self.idle = 0;
            self.rdma_ready = false;
            return Some(rc);
        }
        None
    }
}

/// The earlier of two wait hints.
fn sooner(a: WaitHint, b: WaitHint) -> WaitHint {
    match (a, b) {
        (WaitHint::Now, _) | (_, WaitHint::Now) => WaitHint::Now,
        (WaitHint::Later(x), WaitHint::Later(y)) => WaitHint::Later(match (x, y) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }),
    }
}

impl Netmod for Hybrid {
    fn name(&self) -> &'static str {
        "ud"
    }

    fn business_card(&self) -> Vec<u8> {
        self.card.clone()
    }

    fn max_payload(&self) -> usize {
        self.ud.max_payload()
    }

    fn send(&mut self, peer: u32, env: &Envelope, payload: &[&[u8]]) -> Result<Accept, NetError> {
        self.ud.send(peer, env, payload)
    }

    fn poll(&mut self, sink: &mut dyn FnMut(u32, &Envelope, &[u8])) -> Result<usize, NetError> {
        let mut n = self.ud.poll(sink)?;
        if let Some(rc) = self.rdma_due() {
            // Connection requests and RDMA completions; it carries no packets of ours.
            n += rc.poll(sink)?;
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, NetError> {
        let Some(rc) = self.rc.as_mut() else {
            return self.ud.wait(timeout);
        };
        if self.ud.wait(Duration::ZERO)? {
            return Ok(true);
        }
        if timeout.is_zero() {
            // A spinning waiter: the RDMA side only while it has something under way
            // (the polls look at it now and then regardless).
            if rc.busy() && rc.wait(Duration::ZERO)? {
                self.rdma_ready = true;
                return Ok(true);
            }
            return Ok(false);
        }
        if rc.wait(Duration::ZERO)? {
            self.rdma_ready = true;
            return Ok(true);
        }
        let theirs = rc.wait_hint()?;
        if matches!(theirs, WaitHint::Now) {
            self.rdma_ready = true;
            return Ok(true);
        }
        let until = match sooner(self.ud.wait_hint()?, theirs) {
            WaitHint::Now => return Ok(true),
            WaitHint::Later(t) => t,
        };
        let limit = until.map_or(timeout, |t| {
            timeout.min(t.saturating_duration_since(Instant::now()))
        });
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        let n = self
            .epoll
            .wait(&mut ev, crate::sys::millis(limit))
            .map_err(|e| NetError::io("ud: epoll_wait", e))?;
        if ev[..n].iter().any(|e| e.u64 == 1) {
            self.rdma_ready = true;
        }
        Ok(n > 0)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.rc {
            Some(_) => Some(self.epoll.as_fd()),
            None => self.ud.wait_fd(),
        }
    }

    fn wait_hint(&mut self) -> Result<WaitHint, NetError> {
        let hint = self.ud.wait_hint()?;
        match self.rc.as_mut() {
            Some(rc) => {
                let theirs = rc.wait_hint()?;
                if matches!(theirs, WaitHint::Now) {
                    self.rdma_ready = true;
                }
                Ok(sooner(hint, theirs))
            }
            None => Ok(hint),
        }
    }

    fn backlog(&self) -> usize {
        self.ud.backlog() + self.rc.as_ref().map_or(0, |r| r.backlog())
    }

    fn writable(&self, peer: u32) -> bool {
        self.ud.writable(peer)
    }

    fn check_peer(&self, peer: u32) -> Result<(), NetError> {
        self.ud.check_peer(peer)
    }

    fn shutdown(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.ud.shutdown(timeout);
        if let Some(rc) = self.rc.as_mut() {
            rc.shutdown(deadline.saturating_duration_since(Instant::now()));
        }
    }

    fn stats(&self) -> NetStats {
        let mut s = self.ud.stats();
        if let Some(rc) = &self.rc {
            let r = rc.stats();
            s.rdma_bytes += r.rdma_bytes;
            s.rdma_pairs += r.rdma_pairs;
            s.drops.merge(&r.drops);
        }
        s
    }

    fn rdma(&mut self) -> Option<&mut dyn Rdma> {
        self.rc.as_mut().map(|r| r as &mut dyn Rdma)
    }
}

/// Reads the datagram netmod's and the RDMA side's variables as opening `ud` does.
///
/// # Errors
/// The first unusable variable, named.
pub fn check_config(get: &dyn Fn(&str) -> Option<String>) -> Result<(), NetError> {
    UdConfig::from_lookup(get)?;
    Hybrid::rdma_config(get)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rdma_side_is_configured_small_or_turned_off() {
        let c = Hybrid::rdma_config(|_| None).unwrap().unwrap();
        assert_eq!((c.eager, c.recv_depth), (1 << 10, 16));
        assert!(
            Hybrid::rdma_config(|k| (k == RDMA_VAR).then(|| "0".into()))
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            Hybrid::rdma_config(|k| (k == RDMA_VAR).then(|| "sometimes".into())),
            Err(NetError::Config { var: RDMA_VAR, .. })
        ));
    }

    #[test]
    fn each_side_reads_its_line_of_the_card_and_a_card_without_an_rdma_line_is_named() {
        let cards: Vec<Vec<u8>> = vec![join_cards(b"ud a", b"rc b"), b"ud c".to_vec()];
        let source: Source = Arc::new(Mutex::new(Box::new(cards)));
        let mut ud = Side {
            source: source.clone(),
            rdma: false,
        };
        let mut rc = Side { source, rdma: true };
        assert_eq!(ud.card(0).unwrap(), b"ud a");
        assert_eq!(rc.card(0).unwrap(), b"rc b");
        assert_eq!(ud.card(1).unwrap(), b"ud c");
        match rc.card(1) {
            Err(NetError::BadCard { rank: 1, reason }) => assert!(reason.contains(RDMA_VAR), "{reason}"),
            other => panic!("expected a bad card, got {other:?}"),
        }
    }

    #[test]
    fn hints_take_the_sooner() {
        let t = Instant::now();
        let later = t + Duration::from_secs(1);
        assert!(matches!(
            sooner(WaitHint::Now, WaitHint::Later(None)),
            WaitHint::Now
        ));
        assert!(matches!(
            sooner(WaitHint::Later(Some(later)), WaitHint::Later(Some(t))),
            WaitHint::Later(Some(x)) if x == t
        ));
        assert!(matches!(
            sooner(WaitHint::Later(None), WaitHint::Later(Some(t))),
            WaitHint::Later(Some(x)) if x == t
        ));
    }
}
