//! What the verbs netmods put on the wire and in their business cards: the `rc` packet
//! header, `rc`'s connection requests, and the cards of `ud` and `rc`. Nothing here needs
//! a device, so it is built (and fuzzed) without the `verbs` feature; every decoder is
//! total: any bytes give a value or a reason.

use crate::{DropReason, Envelope, NetError};
use std::fmt;

/// Where a UD datagram goes to or comes from: a port's GID and a queue pair.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdAddr {
    /// The port's GID.
    pub gid: [u8; 16],
    /// The queue pair's number.
    pub qpn: u32,
}

impl fmt::Debug for UdAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:#x}", gid_text(&self.gid), self.qpn)
    }
}

fn gid_text(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

fn gid_parse(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(g)
}

/// Encodes a business card.
pub fn encode_card(addr: UdAddr, mtu: usize) -> Vec<u8> {
    encode_card_as("ud", addr, mtu)
}

/// Decodes rank `rank`'s business card.
///
/// # Errors
/// [`NetError::BadCard`] saying what is wrong.
pub fn decode_card(rank: u32, card: &[u8]) -> Result<(UdAddr, usize), NetError> {
    decode_card_as("ud", rank, card)
}

/// A card of the verbs netmod `netmod`: its UD endpoint's address and MTU.
pub fn encode_card_as(netmod: &str, addr: UdAddr, mtu: usize) -> Vec<u8> {
    format!("{netmod} {} {} {mtu}", gid_text(&addr.gid), addr.qpn).into_bytes()
}

/// Decodes rank `rank`'s card of the verbs netmod `netmod`.
///
/// # Errors
/// [`NetError::BadCard`] saying what is wrong.
pub fn decode_card_as(netmod: &str, rank: u32, card: &[u8]) -> Result<(UdAddr, usize), NetError> {
    let bad = |reason: &str| NetError::BadCard {
        rank,
        reason: reason.into(),
    };
    let s = std::str::from_utf8(card).map_err(|_| bad("not text"))?;
    let mut it = s.split_ascii_whitespace();
    if it.next() != Some(netmod) {
        return Err(NetError::BadCard {
            rank,
            reason: format!("not a {netmod} card (another netmod's?)"),
        });
    }
    let gid = it
        .next()
        .and_then(gid_parse)
        .ok_or_else(|| bad("no GID of 32 hex digits"))?;
    let qpn = it
        .next()
        .and_then(|q| q.parse::<u32>().ok())
        .filter(|q| *q < 1 << 24)
        .ok_or_else(|| bad("no queue pair number"))?;
    let mtu = it
        .next()
        .and_then(|m| m.parse::<usize>().ok())
        .filter(|m| (256..=4096).contains(m))
        .ok_or_else(|| bad("no MTU of 256 to 4096"))?;
    if it.next().is_some() {
        return Err(bad("trailing words"));
    }
    Ok((UdAddr { gid, qpn }, mtu))
}

/// A `ud` card followed, on a second line, by the `rc` card of the endpoint its RDMA
/// pairs connect through (see `verbs::hybrid`).
pub fn join_cards(ud: &[u8], rc: &[u8]) -> Vec<u8> {
    let mut c = ud.to_vec();
    c.push(b'\n');
    c.extend_from_slice(rc);
    c
}

/// A `ud` card's own part, and the `rc` card after it if there is one.
pub fn split_card(card: &[u8]) -> (&[u8], Option<&[u8]>) {
    match card.iter().position(|&b| b == b'\n') {
        Some(i) => (&card[..i], Some(&card[i + 1..])),
        None => (card, None),
    }
}

/// The GID of an IPv4 address as RoCE v2 maps it: `::ffff:a.b.c.d`.
pub fn mapped(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// Whether a GID maps an IPv4 address (RoCE v2 over IPv4).
pub fn is_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]
}

/// Bytes of an `rc` packet's header: envelope (2 × u64), payload length (u32), kind (u32).
pub const HEADER_LEN: usize = 24;
/// A packet that carries a message.
pub const KIND_DATA: u32 = 0;
/// An empty packet saying goodbye.
pub const KIND_BYE: u32 = 1;
/// An empty packet asking only to be delivered: is the peer still there?
pub const KIND_PING: u32 = 2;

/// The header of a packet of `kind` carrying `len` bytes with `env`.
pub fn encode_header(env: &Envelope, len: u32, kind: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&env[0].to_le_bytes());
    h[8..16].copy_from_slice(&env[1].to_le_bytes());
    h[16..20].copy_from_slice(&len.to_le_bytes());
    h[20..24].copy_from_slice(&kind.to_le_bytes());
    h
}

/// A packet's envelope, kind and payload, if its header is sound: a known kind, a
/// length that is the payload's, and no payload on a goodbye or a probe.
pub fn decode_packet(d: &[u8]) -> Option<(Envelope, u32, &[u8])> {
    let h = d.get(..HEADER_LEN)?;
    let w64 = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
    let w32 = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
    let (len, kind) = (w32(16) as usize, w32(20));
    let payload = d.get(HEADER_LEN..)?;
    (payload.len() == len && kind <= KIND_PING && (kind == KIND_DATA || len == 0)).then_some((
        [w64(0), w64(8)],
        kind,
        payload,
    ))
}

/// Bytes of a connection request or answer.
pub const REQUEST_LEN: usize = 32;
const REQUEST_MAGIC: [u8; 2] = *b"NR";

/// What a connection message asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// "Connect your pair for me to mine."
    Connect = 1,
    /// "Done; here is mine."
    Accept = 2,
}

/// A connection message of `rc`, sent over its UD endpoint.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 2 | magic "NR" |
/// | 2 | 1 | kind: 1 CONNECT, 2 ACCEPT |
/// | 3 | 1 | zero |
/// | 4 | 4 | source rank |
/// | 8 | 4 | destination rank |
/// | 12 | 4 | the source's queue pair for the destination |
/// | 16 | 4 | its first packet number (24 bits) |
/// | 20 | 8 | the pair's token of the job key |
/// | 28 | 4 | zero |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// What it asks.
    pub kind: RequestKind,
    /// Sender's rank.
    pub src: u32,
    /// Receiver's rank.
    pub dst: u32,
    /// The sender's pair.
    pub qpn: u32,
    /// The sender's first packet number.
    pub psn: u32,
    /// [`crate::auth::JobKey::token`]`(src, dst)`.
    pub token: u64,
}

impl Request {
    /// Its bytes.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut m = [0u8; REQUEST_LEN];
        m[0..2].copy_from_slice(&REQUEST_MAGIC);
        m[2] = self.kind as u8;
        m[4..8].copy_from_slice(&self.src.to_le_bytes());
        m[8..12].copy_from_slice(&self.dst.to_le_bytes());
        m[12..16].copy_from_slice(&self.qpn.to_le_bytes());
        m[16..20].copy_from_slice(&self.psn.to_le_bytes());
        m[20..28].copy_from_slice(&self.token.to_le_bytes());
        m
    }

    /// Decodes and checks one message, whole.
    ///
    /// # Errors
    /// The reason to drop it.
    pub fn decode(d: &[u8]) -> Result<Self, DropReason> {
        let Some(d) = d.first_chunk::<REQUEST_LEN>().filter(|_| d.len() == REQUEST_LEN) else {
            return Err(DropReason::Truncated);
        };
        let kind = match d[2] {
            1 => RequestKind::Connect,
            2 => RequestKind::Accept,
            _ => return Err(DropReason::BadMagic),
        };
        if d[0..2] != REQUEST_MAGIC || d[3] != 0 || d[28..32] != [0; 4] {
            return Err(DropReason::BadMagic);
        }
        let w = |at: usize| u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]]);
        if w(16) >= 1 << 24 || w(12) >= 1 << 24 {
            return Err(DropReason::Malformed);
        }
        Ok(Self {
            kind,
            src: w(4),
            dst: w(8),
            qpn: w(12),
            psn: w(16),
            token: u64::from_le_bytes(d[20..28].try_into().unwrap_or([0; 8])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_and_bad_ones_are_refused() {
        let mut d = encode_header(&[7, 8], 3, KIND_DATA).to_vec();
        d.extend_from_slice(b"abc");
        assert_eq!(decode_packet(&d), Some(([7, 8], KIND_DATA, &b"abc"[..])));
        let bye = encode_header(&[0, 0], 0, KIND_BYE);
        assert_eq!(decode_packet(&bye), Some(([0, 0], KIND_BYE, &b""[..])));
        // A length that disagrees, an unknown kind, a goodbye with data, a stub.
        let mut bad = d.clone();
        bad[16] = 4;
        assert_eq!(decode_packet(&bad), None);
        let mut bad = d.clone();
        bad[20] = 9;
        assert_eq!(decode_packet(&bad), None);
        let mut bad = d.clone();
        bad[20] = KIND_BYE as u8;
        assert_eq!(decode_packet(&bad), None);
        assert_eq!(decode_packet(&d[..10]), None);
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let r = Request {
            kind: RequestKind::Accept,
            src: 3,
            dst: 1,
            qpn: 0x11,
            psn: 0xabcdef,
            token: 0x1234_5678_9abc_def0,
        };
        let b = r.encode();
        assert_eq!(Request::decode(&b), Ok(r));
        assert_eq!(Request::decode(&b[..31]), Err(DropReason::Truncated));
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(Request::decode(&long), Err(DropReason::Truncated));
        for (at, v, why) in [
            (0, b'X', DropReason::BadMagic),
            (2, 9, DropReason::BadMagic),
            (3, 1, DropReason::BadMagic),
            (31, 1, DropReason::BadMagic),
            (19, 1, DropReason::Malformed),
        ] {
            let mut bad = b;
            bad[at] = v;
            assert_eq!(Request::decode(&bad), Err(why), "byte {at}");
        }
    }

    #[test]
    fn cards_round_trip_and_bad_ones_are_refused() {
        let a = UdAddr {
            gid: mapped([10, 77, 0, 1]),
            qpn: 0x11,
        };
        let c = encode_card(a, 1024);
        assert_eq!(
            std::str::from_utf8(&c).unwrap(),
            "ud 00000000000000000000ffff0a4d0001 17 1024"
        );
        assert_eq!(decode_card(3, &c).unwrap(), (a, 1024));
        assert_eq!(
            decode_card_as("rc", 3, &encode_card_as("rc", a, 4096)).unwrap(),
            (a, 4096)
        );
        assert!(decode_card_as("rc", 3, &c).is_err(), "a ud card is no rc card");
        assert!(is_mapped(&a.gid) && !is_mapped(&[0xfe; 16]));
        for bad in [
            &b""[..],
            b"udp 127.0.0.1:5",
            b"ud 0000 17 1024",
            b"ud 00000000000000000000ffff0a4d0001 x 1024",
            b"ud 00000000000000000000ffff0a4d0001 16777216 1024",
            b"ud 00000000000000000000ffff0a4d0001 17 100",
            b"ud 00000000000000000000ffff0a4d0001 17 1024 more",
            b"ud 0000000000000000000\xffffff0a4d0001 17 1024",
        ] {
            assert!(
                matches!(decode_card(3, bad), Err(NetError::BadCard { rank: 3, .. })),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
