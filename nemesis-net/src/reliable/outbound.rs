//! Putting segments and control datagrams on the transport.

use super::Datagram;
use super::config::Tuned;
use super::peer::Peer;
use super::wire::{Header, Kind, MAX_HEADER_LEN, encode_header};
use std::io;

/// Sends a header-only datagram.
#[allow(clippy::too_many_arguments)]
pub(super) fn send_control<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    to: (D::Addr, u64),
    kind: Kind,
    seq: u32,
    ack: u32,
    count: u32,
) -> io::Result<bool> {
    let h = Header {
        kind,
        flags: 0,
        token: to.1,
        src: t.me,
        dst: rank,
        seq,
        ack,
        count,
        start: None,
    };
    let mut b = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&h, &mut b);
    dg.send_to(&[&b[..n]], to.0)
}

/// Sends `p.queue[i]` with the current acknowledgement; `Ok(false)`: no room.
pub(super) fn transmit<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    i: usize,
    now: u64,
) -> io::Result<bool> {
    let seq = p.una.wrapping_add(i as u32);
    let (addr, ack, token) = (p.addr, p.expected, p.tok_out);
    let Some(seg) = p.queue.get_mut(i) else {
        return Ok(false);
    };
    let h = Header {
        kind: Kind::Data,
        flags: seg.flags,
        token,
        src: t.me,
        dst: rank,
        seq,
        ack,
        count: seg.data.len() as u32,
        start: seg.start,
    };
    let mut b = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&h, &mut b);
    let head = &b[..n];
    let ok = if seg.data.is_empty() {
        dg.send_to(&[head], addr)?
    } else {
        dg.send_to(&[head, &seg.data], addr)?
    };
    if ok {
        seg.sent_at = now;
        seg.sends = seg.sends.saturating_add(1);
        // The segment carried our acknowledgement.
        p.rx_unacked = 0;
    }
    Ok(ok)
}

/// Sends the queued segments the window allows.
pub(super) fn pump<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    let limit = p.queue.len().min(t.window as usize);
    while p.sent < limit {
        if !transmit(dg, t, rank, p, p.sent, now)? {
            *blocked = true;
            break;
        }
        p.sent += 1;
    }
    Ok(())
}

pub(super) fn send_ack<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    if send_control(dg, t, rank, (p.addr, p.tok_out), Kind::Ack, 0, p.expected, 0)? {
        p.rx_unacked = 0;
    } else {
        *blocked = true;
        // Owed still: the ACK timer tries again.
        if p.rx_unacked == 0 {
            p.rx_unacked = 1;
            p.rx_since = now;
        }
    }
    Ok(())
}

/// Asks for the segments between the next expected one and the first one held, unless
/// that gap was asked for less than a round trip ago.
pub(super) fn send_nack<D: Datagram>(
    dg: &mut D,
    t: &Tuned,
    rank: u32,
    p: &mut Peer<D::Addr>,
    now: u64,
    blocked: &mut bool,
) -> io::Result<()> {
    let expected = p.expected;
    let Some(gap) = p
        .held
        .iter()
        .map(|h| h.seq.wrapping_sub(expected))
        .min()
        .filter(|&g| g > 0)
    else {
        // The next segment is held but could not be taken: only a good copy helps, and
        // the timer must not come back before a round trip.
        if !p.held.is_empty() {
            p.nacked = Some((expected, now));
        }
        return Ok(());
    };
    if p.nacked
        .is_some_and(|(s, at)| s == expected && now.saturating_sub(at) < p.renack_after(t))
    {
        return Ok(());
    }
    if send_control(
        dg,
        t,
        rank,
        (p.addr, p.tok_out),
        Kind::Nack,
        expected,
        expected,
        gap,
    )? {
        p.nacked = Some((expected, now));
        p.rx_unacked = 0;
    } else {
        *blocked = true;
    }
    Ok(())
}
