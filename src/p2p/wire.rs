//! The two-sided protocol's packets: their kinds and the payloads of the control packets.
//!
//! Every kind is of [`ProtocolId::P2P`]. `aux` names the request a packet is for, on the
//! side that receives it:
//! - EAGER (aux 0): a whole message; context and tag are the message's.
//! - RTS, sender to receiver (aux: send id): the length (u64), the strategies offered
//!   (a bit set), and the cookie of the get strategies (CMA: the sender's pieces; RDMA:
//!   a key per piece of its registered buffer).
//! - CTS, receiver to sender (aux: send id): the receive id (u32), the strategy chosen
//!   (u8), and its cookie (a ring or pipe name, or the receiver's pieces for a put).
//! - DATA (aux: receive id): an offset (u64) and bytes, for chunks.
//! - DONE, receiver to sender (aux: send id): a status byte; the sender's buffer is free.
//! - FIN, sender to receiver (aux: receive id): a status byte; a put is complete, or the
//!   sender's side failed.
//! - REVOKE / REVOKED (aux: send id): a sender letting go of a request whose RTS offered
//!   its pages to be read in place asks the receiver not to, and waits for the answer.
//! - MEDIUM (aux: the message's length): the first packet of a medium message; context
//!   and tag are the message's. MDATA (aux 0): the next bytes of the medium message its
//!   source has under way (see `medium.rs`). A MEDIUM with flag [`PAIRED`] carries no
//!   bytes: they come through the buffer the two processes share.
//!
//! A get (CMA, RDMA) needs no CTS: the receiver reads as soon as it matches, then sends
//! DONE.
//! Nothing here trusts the peer: every parser says what is wrong instead of panicking.

use crate::channel::Header;
use crate::progress::ProtocolId;
use nemesis_lmt::{Strategies, Strategy};

pub(crate) const EAGER: u16 = ProtocolId::P2P.kind(0x01);
pub(crate) const RTS: u16 = ProtocolId::P2P.kind(0x02);
pub(crate) const CTS: u16 = ProtocolId::P2P.kind(0x03);
pub(crate) const DATA: u16 = ProtocolId::P2P.kind(0x04);
pub(crate) const DONE: u16 = ProtocolId::P2P.kind(0x05);
pub(crate) const FIN: u16 = ProtocolId::P2P.kind(0x06);
pub(crate) const REVOKE: u16 = ProtocolId::P2P.kind(0x07);
pub(crate) const REVOKED: u16 = ProtocolId::P2P.kind(0x08);
pub(crate) const MEDIUM: u16 = ProtocolId::P2P.kind(0x09);
pub(crate) const MDATA: u16 = ProtocolId::P2P.kind(0x0a);

/// MEDIUM's flag: the message's bytes come through the pair buffer.
pub(crate) const PAIRED: u16 = 1;

/// Status bytes of DONE and FIN.
pub(crate) const OK: u8 = 0;
pub(crate) const FAILED: u8 = 1;

/// The bytes of an RTS before the cookie.
pub(crate) const RTS_HEAD: usize = 9;

/// An eager message's header.
#[inline(always)]
pub(crate) fn eager(ctx: u32, tag: i32) -> Header {
    Header {
        kind: EAGER,
        context: ctx,
        tag,
        aux: 0,
        flags: 0,
    }
}

/// A control packet's header: only the kind and the request it is for.
pub(crate) fn ctrl(kind: u16, aux: u32) -> Header {
    Header {
        kind,
        aux,
        ..Header::default()
    }
}

/// What an RTS announces.
#[derive(Debug)]
pub(crate) struct Rts {
    pub send_id: u32,
    pub total: usize,
    pub offered: Strategies,
    pub cookie: Vec<u8>,
}

/// The RTS in `payload`, sent as request `send_id`.
pub(crate) fn parse_rts(send_id: u32, payload: &[u8]) -> Result<Rts, String> {
    let (Some(total), Some(&offered)) = (payload.get(..8).map(u64_at), payload.get(8)) else {
        return Err("a short RTS".into());
    };
    let offered = Strategies(offered);
    if !offered.has(Strategy::Chunks) || offered.0 >> Strategy::ALL.len() != 0 {
        return Err(format!("an RTS offering strategies {:#04x}", offered.0));
    }
    let Ok(total) = usize::try_from(total) else {
        return Err("an RTS longer than this machine can address".into());
    };
    Ok(Rts {
        send_id,
        total,
        offered,
        cookie: payload[RTS_HEAD..].to_vec(),
    })
}

/// The start of an RTS for `len` bytes: the strategy byte is filled in once the offer
/// is known, and the cookie follows.
pub(crate) fn rts_head(len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(RTS_HEAD);
    p.extend_from_slice(&(len as u64).to_le_bytes());
    p.push(0);
    p
}

/// A CTS payload.
pub(crate) fn cts(recv_id: u32, strategy: Strategy, cookie: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + cookie.len());
    p.extend_from_slice(&recv_id.to_le_bytes());
    p.push(strategy as u8);
    p.extend_from_slice(cookie);
    p
}

/// The receive id, strategy and cookie of a CTS.
pub(crate) fn parse_cts(payload: &[u8]) -> Result<(u32, Strategy, &[u8]), String> {
    match (
        payload
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))),
        payload.get(4).and_then(|&c| Strategy::from_code(c)),
    ) {
        (Some(recv_id), Some(strategy)) => Ok((recv_id, strategy, &payload[5..])),
        _ => Err("a short CTS, or one naming an unknown strategy".into()),
    }
}

/// The offset and bytes of a DATA packet.
pub(crate) fn parse_data(payload: &[u8]) -> Result<(u64, &[u8]), String> {
    match payload.get(..8) {
        Some(b) => Ok((u64_at(b), &payload[8..])),
        None => Err("a short DATA packet".into()),
    }
}

/// The status byte of a DONE or FIN; a missing byte is success, as older peers sent.
pub(crate) fn status(payload: &[u8]) -> u8 {
    payload.first().copied().unwrap_or(OK)
}

fn u64_at(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_refuse_short_and_odd_payloads() {
        assert!(parse_rts(1, &[0; 8]).is_err());
        let mut rts = rts_head(100);
        rts[8] = 0x80;
        assert!(parse_rts(1, &rts).unwrap_err().contains("0x80"));
        rts[8] = Strategies::CHUNKS.0;
        let r = parse_rts(7, &rts).unwrap();
        assert_eq!((r.send_id, r.total, r.cookie.len()), (7, 100, 0));
        assert!(parse_cts(&[1, 2, 3]).is_err());
        assert!(parse_cts(&[1, 0, 0, 0, 200]).is_err());
        let payload = cts(9, Strategy::Ring, b"x");
        let (id, s, c) = parse_cts(&payload).unwrap();
        assert_eq!((id, s, c), (9, Strategy::Ring, &b"x"[..]));
        assert!(parse_data(&[0; 7]).is_err());
        assert_eq!(parse_data(&[1, 0, 0, 0, 0, 0, 0, 0, 9]).unwrap(), (1, &[9u8][..]));
        assert_eq!(status(&[]), OK);
    }
}
