//! The datagram header: its fields, and its encoding and checked decoding (the layout is
//! in the [parent module's documentation](super)).

use crate::{DropReason, Envelope};

/// First two bytes of every datagram ("NM" on the wire).
pub const MAGIC: u16 = u16::from_le_bytes(*b"NM");
/// The protocol version this module speaks.
pub const VERSION: u8 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 40;
/// Bytes a [`FLAG_FIRST`] segment adds after the header: envelope and total length.
pub const START_LEN: usize = 20;
/// The longest header, that of a first segment.
pub const MAX_HEADER_LEN: usize = HEADER_LEN + START_LEN;
/// The smallest datagram the layer works with: a first segment with a few bytes.
pub const MIN_DATAGRAM: usize = 64;

/// The segment opens a message: the envelope and total length follow the header.
pub const FLAG_FIRST: u8 = 1;
/// The segment closes a message.
pub const FLAG_LAST: u8 = 2;
/// An empty segment saying goodbye: the sender leaves the job.
pub const FLAG_BYE: u8 = 4;
/// An empty segment asking for an acknowledgement: is the peer still there?
pub const FLAG_PING: u8 = 8;
pub(super) const FLAGS_ALL: u8 = FLAG_FIRST | FLAG_LAST | FLAG_BYE | FLAG_PING;
pub(super) const FLAGS_CONTROL: u8 = FLAG_BYE | FLAG_PING;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A segment of a message, or a BYE or PING.
    Data = 1,
    /// A standalone acknowledgement.
    Ack = 2,
    /// A request to resend missing segments.
    Nack = 3,
}

/// What a first segment adds to the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// The message's envelope.
    pub env: Envelope,
    /// The message's length in bytes, all segments together.
    pub total: u32,
}

/// A decoded header (see the [module documentation](super) for the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram is.
    pub kind: Kind,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// The pair's token, [`JobKey::token`](crate::auth::JobKey::token)`(src, dst)`: only a holder of the job's key
    /// can make it, and it admits no other pair's traffic.
    pub token: u64,
    /// Sender's rank.
    pub src: u32,
    /// Receiver's rank.
    pub dst: u32,
    /// DATA: the segment's number; NACK: the first missing one; ACK: 0.
    pub seq: u32,
    /// The next number the sender expects from the receiver.
    pub ack: u32,
    /// DATA: bytes of data; NACK: segments missing; ACK: 0.
    pub count: u32,
    /// Present exactly when `flags` has [`FLAG_FIRST`].
    pub start: Option<Start>,
}

impl Header {
    /// Bytes this header takes on the wire: [`HEADER_LEN`], or [`MAX_HEADER_LEN`] for a
    /// first segment.
    pub fn encoded_len(&self) -> usize {
        if self.start.is_some() {
            MAX_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }
}

/// Writes `h` to the front of `out` and returns how many bytes it took. The start fields
/// are written when `h.start` is set; keeping that consistent with [`FLAG_FIRST`] is the
/// caller's business ([`decode_header`] refuses a mismatch).
pub fn encode_header(h: &Header, out: &mut [u8; MAX_HEADER_LEN]) -> usize {
    out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    out[2] = VERSION;
    out[3] = h.kind as u8;
    out[4] = h.flags;
    out[5..8].fill(0);
    out[8..16].copy_from_slice(&h.token.to_le_bytes());
    out[16..20].copy_from_slice(&h.src.to_le_bytes());
    out[20..24].copy_from_slice(&h.dst.to_le_bytes());
    out[24..28].copy_from_slice(&h.seq.to_le_bytes());
    out[28..32].copy_from_slice(&h.ack.to_le_bytes());
    out[32..36].copy_from_slice(&h.count.to_le_bytes());
    out[36..40].fill(0);
    match h.start {
        Some(s) => {
            out[40..48].copy_from_slice(&s.env[0].to_le_bytes());
            out[48..56].copy_from_slice(&s.env[1].to_le_bytes());
            out[56..60].copy_from_slice(&s.total.to_le_bytes());
            MAX_HEADER_LEN
        }
        None => HEADER_LEN,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Decodes and checks the header of the datagram `buf`, whole: everything that can be
/// checked without knowing the receiver's state, including that the datagram is exactly
/// as long as the header says. Total: any input gives a header or a reason.
///
/// # Errors
/// The reason to drop the datagram.
pub fn decode_header(buf: &[u8]) -> Result<Header, DropReason> {
    use DropReason::{BadMagic, Malformed, Truncated};
    let Some(a) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(Truncated);
    };
    if u16::from_le_bytes([a[0], a[1]]) != MAGIC || a[2] != VERSION {
        return Err(BadMagic);
    }
    let kind = match a[3] {
        1 => Kind::Data,
        2 => Kind::Ack,
        3 => Kind::Nack,
        _ => return Err(Malformed),
    };
    let flags = a[4];
    if flags & !FLAGS_ALL != 0 || a[5..8] != [0; 3] || u32_at(a, 36) != 0 {
        return Err(Malformed);
    }
    let mut h = Header {
        kind,
        flags,
        token: u64_at(a, 8),
        src: u32_at(a, 16),
        dst: u32_at(a, 20),
        seq: u32_at(a, 24),
        ack: u32_at(a, 28),
        count: u32_at(a, 32),
        start: None,
    };
    let well_formed = match kind {
        Kind::Ack => flags == 0 && h.seq == 0 && h.count == 0,
        // The first missing segment is the next one expected: seq and ack agree.
        Kind::Nack => flags == 0 && h.count >= 1 && h.seq == h.ack,
        Kind::Data if flags & FLAGS_CONTROL != 0 => (flags == FLAG_BYE || flags == FLAG_PING) && h.count == 0,
        Kind::Data if flags & FLAG_FIRST != 0 => {
            let Some(b) = buf.first_chunk::<MAX_HEADER_LEN>() else {
                return Err(Truncated);
            };
            let s = Start {
                env: [u64_at(b, 40), u64_at(b, 48)],
                total: u32_at(b, 56),
            };
            h.start = Some(s);
            if flags & FLAG_LAST != 0 {
                h.count == s.total
            } else {
                h.count < s.total
            }
        }
        // Every segment after the first carries data.
        Kind::Data => h.count >= 1,
    };
    if !well_formed {
        return Err(Malformed);
    }
    let body = if kind == Kind::Data { h.count as usize } else { 0 };
    let want = h.encoded_len().saturating_add(body);
    match buf.len().cmp(&want) {
        std::cmp::Ordering::Less => Err(Truncated),
        std::cmp::Ordering::Greater => Err(Malformed),
        std::cmp::Ordering::Equal => Ok(h),
    }
}
