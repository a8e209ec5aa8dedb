//! Large messages to peers on other nodes by RDMA read, through a network module that
//! offers [`Rdma`] (InfiniBand verbs `rc`, and `ud` with its on-demand RC pairs).
//!
//! The get mode that CMA uses between local processes, with the card doing the copy:
//! the sender registers its buffer for reading only and ships one key per piece in its
//! RTS (read back by [`decode`]); the receiver registers its own buffer, posts reads of
//! at most [`RDMA_STEP`] bytes, [`RDMA_DEPTH`] at a time, and sends DONE once they are
//! all complete; the sender deregisters on DONE. Registrations belong to the transfer
//! (an [`Xfer`] on each side) and end with it, so nothing is left registered behind a
//! buffer its owner may free, except a [`Pinned`](nemesis_net::pinned::Pinned) buffer's,
//! which [`crate::RegCache`] keeps.

use crate::regcache::RegCache;
use crate::{LmtError, Role, Seg, Strategy, Xfer};
use nemesis_net::rdma::{OpId, Rdma, RdmaError, Registration, Remote};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Bytes one read moves at most, so a large message is several reads in flight and a
/// transfer's first bytes land before its last are asked for.
pub const RDMA_STEP: usize = 1 << 20;

/// Reads in flight per transfer at most; the card works on several at once.
pub const RDMA_DEPTH: usize = 4;

/// Most pieces of a send buffer offered for reading (one key each in the RTS); a
/// message in more goes another way.
pub const MAX_KEYS: usize = 8;

/// How long ending a transfer waits for its reads still in flight before it takes the
/// registrations back regardless (the device then refuses those reads).
const END_WAIT: Duration = Duration::from_secs(10);

/// One piece of the local buffer: its registration (none for an empty piece), the
/// bytes of it the transfer uses, and whether the registration is the cache's.
#[derive(Debug)]
struct Piece {
    reg: Option<Registration>,
    len: usize,
    kept: bool,
}

/// What one side of an RDMA transfer holds.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The local buffer's pieces, in order.
    pieces: Vec<Piece>,
    /// The sender's pieces (receiver only).
    remote: Vec<Remote>,
    /// Reads in flight, oldest first, with their lengths.
    ops: VecDeque<(OpId, usize)>,
    /// Bytes asked for so far.
    posted: usize,
    /// Where the next read lands: the piece of the local buffer, and the offset in it.
    at: (usize, usize),
}

/// Registers `seg` for reading (`write`: for the device to write it): the cache's kept
/// registration for a [`Pinned`](nemesis_net::pinned::Pinned) buffer, else a new one.
fn register(
    rdma: &mut dyn Rdma,
    cache: Option<&mut RegCache>,
    seg: Seg,
    write: bool,
) -> Result<Piece, RdmaError> {
    if let Some(kept) = cache.and_then(|c| c.get(rdma, seg, write)) {
        return kept.map(|reg| Piece {
            reg: Some(reg),
            len: seg.len,
            kept: true,
        });
    }
    let reg = if write {
        rdma.register(seg)
    } else {
        rdma.register_read(seg)
    }?;
    Ok(Piece {
        reg: Some(reg),
        len: seg.len,
        kept: false,
    })
}

/// Registers `src` (`len` bytes) on `rdma` for reading and appends its keys to `cookie`:
/// a key count, then each key. `None` (and nothing appended or left registered) when
/// the buffer has too many pieces or the device refuses it.
pub(crate) fn offer(
    rdma: &mut dyn Rdma,
    mut cache: Option<&mut RegCache>,
    peer: u32,
    src: &[Seg],
    len: usize,
    cookie: &mut Vec<u8>,
) -> Option<Xfer> {
    let segs: Vec<Seg> = src.iter().copied().filter(|s| s.len > 0).collect();
    if segs.is_empty() || segs.len() > MAX_KEYS || segs.iter().map(|s| s.len).sum::<usize>() != len {
        return None;
    }
    let mut held = Held::default();
    for s in &segs {
        match register(rdma, cache.as_deref_mut(), *s, false) {
            Ok(p) => held.pieces.push(p),
            Err(e) => {
                refused_once(&e);
                release(rdma, &held.pieces);
                return None;
            }
        }
    }
    cookie.push(held.pieces.len() as u8);
    for (s, p) in segs.iter().zip(&held.pieces) {
        let key = Remote {
            addr: s.ptr as u64,
            len: s.len as u64,
            rkey: p.reg.map_or(0, |r| r.remote.rkey),
        };
        cookie.extend_from_slice(&key.encode());
    }
    let mut x = Xfer::new(peer, Strategy::Rdma, Role::Send, len);
    // The sender moves nothing: the receiver reads.
    x.want = 0;
    x.rdma = Some(Box::new(held));
    Some(x)
}

/// Says once per process that registration was refused, so that a memory-lock limit
/// that sends every large message the slow way is not silent.
fn refused_once(e: &RdmaError) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("nemesis: large messages to other nodes go by packets, not RDMA: {e}");
    });
}

/// The keys a peer's cookie lists, checked to cover exactly `total` bytes.
///
/// # Errors
/// [`LmtError::BadCookie`] for anything else.
pub fn decode(peer: u32, cookie: &[u8], total: usize) -> Result<Vec<Remote>, LmtError> {
    let bad = |why: String| LmtError::BadCookie { peer, why };
    let (&n, keys) = cookie
        .split_first()
        .ok_or_else(|| bad("an empty RDMA cookie".into()))?;
    let n = n as usize;
    if n == 0 || n > MAX_KEYS || keys.len() != n * Remote::WIRE {
        return Err(bad(format!(
            "an RDMA cookie of {} bytes claims {n} keys",
            cookie.len()
        )));
    }
    let remote = keys
        .chunks(Remote::WIRE)
        .map(|k| Remote::decode(peer, k).map_err(|e| bad(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sum = 0u64;
    for r in &remote {
        if r.addr.checked_add(r.len).is_none() {
            return Err(bad(format!(
                "a piece of {} bytes at {:#x} wraps the address space",
                r.len, r.addr
            )));
        }
        sum = sum.saturating_add(r.len);
    }
    if sum != total as u64 {
        return Err(bad(format!(
            "the keys cover {sum} bytes, the message has {total}"
        )));
    }
    Ok(remote)
}

/// Starts the receiving side: registers the first `min(total, cap)` bytes of `dst`.
///
/// # Errors
/// A bad cookie; a registration the device refuses ([`LmtError::NotPermitted`], so the
/// caller can fall back to chunks before anything moved).
pub(crate) fn start_recv(
    rdma: &mut dyn Rdma,
    mut cache: Option<&mut RegCache>,
    peer: u32,
    cookie: &[u8],
    total: usize,
    cap: usize,
    dst: &[Seg],
) -> Result<Xfer, LmtError> {
    let remote = decode(peer, cookie, total)?;
    let mut x = Xfer::new(peer, Strategy::Rdma, Role::Recv, total);
    x.want = total.min(cap);
    let mut held = Held {
        remote,
        ..Held::default()
    };
    let mut room = x.want;
    for s in dst {
        if room == 0 {
            break;
        }
        let len = s.len.min(room);
        room -= len;
        if len == 0 {
            // Keeps the registrations in step with the pieces.
            held.pieces.push(Piece {
                reg: None,
                len: 0,
                kept: false,
            });
            continue;
        }
        match register(rdma, cache.as_deref_mut(), Seg { ptr: s.ptr, len }, true) {
            Ok(p) => held.pieces.push(p),
            Err(e) => {
                release(rdma, &held.pieces);
                return Err(LmtError::NotPermitted {
                    peer,
                    strategy: Strategy::Rdma,
                    why: std::io::Error::other(e.to_string()),
                });
            }
        }
    }
    x.rdma = Some(Box::new(held));
    Ok(x)
}

/// Deregisters what the transfer registered itself (not the cache's).
fn release(rdma: &mut dyn Rdma, pieces: &[Piece]) {
    for p in pieces.iter().filter(|p| !p.kept) {
        if let Some(r) = &p.reg {
            rdma.deregister(r);
        }
    }
}

fn lmt_error(peer: u32, e: RdmaError) -> LmtError {
    match e {
        RdmaError::BadKey { why, .. } => LmtError::BadCookie { peer, why },
        other => LmtError::PeerFailed {
            peer,
            why: other.to_string(),
        },
    }
}

/// Posts the reads that fit and takes those that completed, in order; `Ok(true)` once
/// every byte has landed. With `bufs` empty (a receive let go) it posts nothing more
/// and completes once the reads in flight have.
///
/// # Safety
/// `bufs` is the buffer the transfer was started with, valid for writing and unused
/// until the transfer ends.
pub(crate) unsafe fn progress(rdma: &mut dyn Rdma, x: &mut Xfer, bufs: &[Seg]) -> Result<bool, LmtError> {
    let peer = x.peer;
    let Some(h) = x.rdma.as_deref_mut() else {
        return Ok(x.is_complete());
    };
    if x.role == Role::Send {
        return Ok(true);
    }
    if bufs.is_empty() {
        x.want = x.done + h.ops.iter().map(|o| o.1).sum::<usize>();
    }
    while !bufs.is_empty() && h.ops.len() < RDMA_DEPTH && h.posted < x.want {
        let (piece, off) = h.at;
        let Some(p) = h.pieces.get(piece) else {
            return Err(LmtError::BadCookie {
                peer,
                why: format!("no buffer left at byte {} of {}", h.posted, x.want),
            });
        };
        let here = p.len.saturating_sub(off);
        let Some(reg) = p.reg.filter(|_| here > 0) else {
            h.at = (piece + 1, 0);
            continue;
        };
        // The sender's piece holding byte `posted`.
        let (mut r, mut base) = (None, 0usize);
        for k in &h.remote {
            if h.posted < base + k.len as usize {
                r = Some(*k);
                break;
            }
            base += k.len as usize;
        }
        let Some(r) = r else {
            return Err(LmtError::BadCookie {
                peer,
                why: format!("the keys end before byte {}", h.posted),
            });
        };
        let into_r = h.posted - base;
        let n = here
            .min(r.len as usize - into_r)
            .min(x.want - h.posted)
            .min(RDMA_STEP);
        let Some(b) = bufs.get(piece) else {
            return Err(LmtError::BadCookie {
                peer,
                why: "a receive buffer of fewer pieces than it was started with".into(),
            });
        };
        let local = Seg {
            ptr: b.ptr.wrapping_add(off),
            len: n,
        };
        let from = Remote {
            addr: r.addr + into_r as u64,
            len: n as u64,
            rkey: r.rkey,
        };
        // SAFETY: `local` lies in the registered part of the receive buffer, which the
        // caller keeps writable and unused until the transfer ends; `end` waits for the
        // reads in flight before it deregisters.
        match unsafe { rdma.get(peer, local, &reg, from) } {
            Ok(op) => {
                h.ops.push_back((op, n));
                h.posted += n;
                h.at = (piece, off + n);
            }
            Err(RdmaError::Again { .. }) => break,
            Err(e) => return Err(lmt_error(peer, e)),
        }
    }
    while let Some(&(op, n)) = h.ops.front() {
        match rdma.test(op) {
            Ok(true) => {
                h.ops.pop_front();
                x.done += n;
            }
            Ok(false) => break,
            Err(e) => {
                h.ops.pop_front();
                return Err(lmt_error(peer, e));
            }
        }
    }
    Ok(x.is_complete())
}

/// Ends a transfer: waits (for a bounded time) for reads still in flight, so that a
/// live pair is not failed by a registration taken from under them, then deregisters.
pub(crate) fn end(rdma: &mut dyn Rdma, x: &Xfer) {
    let Some(h) = x.rdma.as_deref() else {
        return;
    };
    let deadline = Instant::now() + END_WAIT;
    for &(op, _) in &h.ops {
        while matches!(rdma.test(op), Ok(false)) && Instant::now() < deadline {
            std::hint::spin_loop();
        }
    }
    release(rdma, &h.pieces);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_round_trip_and_bad_ones_are_refused() {
        let keys = [
            Remote {
                addr: 0x1000,
                len: 300,
                rkey: 7,
            },
            Remote {
                addr: 0x9000,
                len: 700,
                rkey: 8,
            },
        ];
        let mut c = vec![2u8];
        for k in &keys {
            c.extend_from_slice(&k.encode());
        }
        assert_eq!(decode(3, &c, 1000).unwrap(), keys);
        let wraps = Remote {
            addr: u64::MAX - 10,
            len: 1000,
            rkey: 1,
        };
        let mut w = vec![1u8];
        w.extend_from_slice(&wraps.encode());
        for (bad, total) in [
            (&c[..], 999),
            (&c[..c.len() - 1], 1000),
            (&[][..], 0),
            (&[0u8][..], 0),
            (&[9u8; 181][..], 0),
            (&w[..], 1000),
        ] {
            let e = decode(3, bad, total).unwrap_err();
            assert!(matches!(e, LmtError::BadCookie { peer: 3, .. }), "{e}");
        }
    }
}
