//! The one-sided layer's packets: what an origin asks of a target and what the target
//! answers, when the target's memory is not mapped by the origin.
//!
//! Every packet is of [`ProtocolId::RMA`](crate::ProtocolId::RMA); the low byte of its
//! header's `kind` says what it is. The header's `context` names the window, `aux` the
//! origin's request that a reply answers (0 when none), `flags` a lock's kind. Payloads
//! start with a little-endian head:
//!
//! | kind | payload |
//! |---|---|
//! | `PUT` | displacement `u64`, then the bytes |
//! | `GET` | displacement `u64`, length `u64` |
//! | `PUTV` | block count `u32`, 4 zero bytes, per block a displacement `u64` and a length `u64`, then the blocks' bytes back to back |
//! | `GETV` | block count `u32`, 4 zero bytes, per block a displacement `u64` and a length `u64`; answered by `RESULT`s of the blocks back to back |
//! | `ACC`, `GACC` | displacement `u64`, type tag `u32`, element code `u8`, operation `u8`, 2 zero bytes, then the elements |
//! | `CAS` | displacement `u64`, type tag `u32`, element code `u8`, 3 zero bytes, the compared element, the new one |
//! | `RESULT` | offset `u64` into what was asked for, then the bytes |
//! | `LOCK`, `UNLOCK` | none; `flags` is 1 (shared) or 2 (exclusive) |
//! | `GRANT`, `FLUSH`, `ACK`, `POST`, `COMPLETE`, `CREDIT` | none |
//! | `ERR` | reason `u8`, 7 zero bytes, displacement `u64`, length `u64` |
//!
//! A displacement is a byte offset into the target's window memory, or for a dynamic
//! window an address inside memory the target attached. Everything here is untrusted:
//! [`decode`] checks the shape of a packet, and the target checks what it names against
//! its window before it touches any memory.

use crate::channel::Header;

/// Writes bytes into the target's window.
pub const PUT: u8 = 1;
/// Asks for bytes of the target's window; answered by `RESULT`s.
pub const GET: u8 = 2;
/// Updates elements of the target's window.
pub const ACC: u8 = 3;
/// Updates elements and asks for what they held; answered by `RESULT`s.
pub const GACC: u8 = 4;
/// Compares one element and swaps it; answered by a `RESULT`.
pub const CAS: u8 = 5;
/// Bytes for a `GET`, `GACC` or `CAS`.
pub const RESULT: u8 = 6;
/// Asks for the target's lock; answered by `GRANT`.
pub const LOCK: u8 = 7;
/// The lock is the origin's.
pub const GRANT: u8 = 8;
/// Gives the lock back once everything before it is applied; answered by `ACK`.
pub const UNLOCK: u8 = 9;
/// Asks the target to answer once everything before it is applied; answered by `ACK`.
pub const FLUSH: u8 = 10;
/// Everything before the `UNLOCK` or `FLUSH` it answers is applied.
pub const ACK: u8 = 11;
/// The target has opened an exposure epoch to the origin.
pub const POST: u8 = 12;
/// The origin has ended its access epoch to the target.
pub const COMPLETE: u8 = 13;
/// The target refused a request.
pub const ERR: u8 = 14;
/// Writes bytes into several blocks of the target's window.
pub const PUTV: u8 = 15;
/// Asks for several blocks of the target's window; answered by `RESULT`s.
pub const GETV: u8 = 16;
/// The origin has taken a `RESULT` marked [`CREDIT_ME`]: the target may send another
/// piece of a large get.
pub const CREDIT: u8 = 17;

/// `flags` of a `RESULT` that is a piece of a large get, which the origin answers with
/// a `CREDIT`.
pub const CREDIT_ME: u16 = 1;

/// Most blocks one `PUTV` or `GETV` names.
pub const MAX_BLOCKS: usize = 4096;
/// Bytes of a `PUTV`'s or `GETV`'s head before its blocks.
pub const BLOCKS_HEAD: usize = 8;
/// Bytes per block in a `PUTV` or `GETV`.
pub const BLOCK: usize = 16;

/// `flags` of a shared lock.
pub const SHARED: u16 = 1;
/// `flags` of an exclusive lock.
pub const EXCLUSIVE: u16 = 2;

/// Bytes of a `PUT`'s or `RESULT`'s head.
pub const DISP_HEAD: usize = 8;
/// Bytes of an `ACC`'s, `GACC`'s or `CAS`'s head.
pub const ACC_HEAD: usize = 16;
/// Bytes of an `ERR`'s payload.
pub const ERR_LEN: usize = 24;

/// Why a target refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Refusal {
    /// Its bytes are not all inside the window (or any attached memory).
    OutOfBounds = 1,
    /// An update of an element at an address that is not a multiple of its size.
    Misaligned = 2,
    /// An element type other than the window's.
    WrongType = 3,
    /// A window the target does not have.
    UnknownWindow = 4,
    /// An operation not defined for the element type, or no operation at all.
    BadOp = 5,
    /// A packet whose shape is wrong.
    Malformed = 6,
    /// An unlock of a lock the origin does not hold.
    NotLocked = 7,
    /// An update or a lock by message on a window whose atomics the card runs, where
    /// the target's CPU must not touch a word the card updates.
    CardExecutes = 8,
}

impl Refusal {
    /// The reason of a code from the wire.
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::OutOfBounds,
            2 => Self::Misaligned,
            3 => Self::WrongType,
            4 => Self::UnknownWindow,
            5 => Self::BadOp,
            6 => Self::Malformed,
            7 => Self::NotLocked,
            8 => Self::CardExecutes,
            _ => return None,
        })
    }

    /// What it means, for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Self::OutOfBounds => "it reaches outside the target's window",
            Self::Misaligned => {
                "an element update at an address that is not a multiple of the element's size"
            }
            Self::WrongType => "an element type the target's window was not made for",
            Self::UnknownWindow => "the target has no such window",
            Self::BadOp => "an operation not defined for the element type",
            Self::Malformed => "a malformed request",
            Self::NotLocked => "an unlock of a lock the origin does not hold",
            Self::CardExecutes => {
                "an update or lock by message on a window whose atomics the network card runs"
            }
        }
    }
}

/// A packet whose shape is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed one-sided packet (kind {kind}): {why}")]
pub struct WireError {
    /// The packet's kind.
    pub kind: u8,
    /// What is wrong.
    pub why: &'static str,
}

/// The head of an element update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccHead {
    /// Where.
    pub disp: u64,
    /// The origin window's type tag.
    pub tag: u32,
    /// The element's code ([`crate::Reducible::TYPE_CODE`]).
    pub code: u8,
    /// The operation's code ([`super::AccOp::code`]).
    pub op: u8,
}

/// The blocks a `PUTV` or `GETV` names, lent from its payload: (displacement, length)
/// pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks<'a>(&'a [u8]);

impl<'a> Blocks<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.len() / BLOCK
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each block's displacement and length.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.0.chunks_exact(BLOCK).map(|b| (word(b, 0), word(b, 8)))
    }
}

/// A decoded packet; the bytes are lent from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Write `data` at `disp`.
    Put {
        /// Where.
        disp: u64,
        /// What.
        data: &'a [u8],
    },
    /// Write `data`, back to back, into `blocks`.
    PutV {
        /// Where.
        blocks: Blocks<'a>,
        /// What: as long as the blocks together.
        data: &'a [u8],
    },
    /// Read `blocks`, to be answered back to back.
    GetV {
        /// Where.
        blocks: Blocks<'a>,
    },
    /// Read `len` bytes at `disp`.
    Get {
        /// Where.
        disp: u64,
        /// How many.
        len: u64,
    },
    /// Update elements; `fetch` when the old values are asked for.
    Acc {
        /// Where and how.
        head: AccHead,
        /// The operands.
        data: &'a [u8],
        /// Whether the old values go back.
        fetch: bool,
    },
    /// Compare and swap one element.
    Cas {
        /// Where and which type (`op` is 0).
        head: AccHead,
        /// The element compared with.
        compare: &'a [u8],
        /// The element stored if equal.
        swap: &'a [u8],
    },
    /// Bytes answering a request, from `offset` on.
    Result {
        /// Where they go in what was asked for.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// A lock request, shared or exclusive.
    Lock {
        /// Shared if false.
        exclusive: bool,
    },
    /// A lock is granted.
    Grant,
    /// A lock is given back.
    Unlock {
        /// Shared if false.
        exclusive: bool,
    },
    /// Answer once everything before is applied.
    Flush,
    /// Everything before is applied.
    Ack,
    /// An exposure epoch opened.
    Post,
    /// An access epoch ended.
    Complete,
    /// A piece of a large get was taken.
    Credit,
    /// A refusal.
    Err {
        /// Why, if the code is known.
        why: Option<Refusal>,
        /// The displacement of the refused request.
        disp: u64,
        /// Its length.
        len: u64,
    },
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes a packet of kind `kind` (the low byte of the header's) with `payload`.
///
/// # Errors
/// [`WireError`] for an unknown kind or a payload of the wrong shape.
pub fn decode<'a>(kind: u8, h: &Header, payload: &'a [u8]) -> Result<Msg<'a>, WireError> {
    let bad = |why| Err(WireError { kind, why });
    let need = |n: usize| -> Result<(), WireError> {
        if payload.len() < n {
            Err(WireError {
                kind,
                why: "shorter than its head",
            })
        } else {
            Ok(())
        }
    };
    let empty = || -> Result<(), WireError> {
        if payload.is_empty() {
            Ok(())
        } else {
            Err(WireError {
                kind,
                why: "a payload where none belongs",
            })
        }
    };
    let lock_kind = || match h.flags {
        SHARED => Ok(false),
        EXCLUSIVE => Ok(true),
        _ => Err(WireError {
            kind,
            why: "a lock that is neither shared nor exclusive",
        }),
    };
    let acc_head = || AccHead {
        disp: word(payload, 0),
        tag: u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")),
        code: payload[12],
        op: payload[13],
    };
    Ok(match kind {
        PUT => {
            need(DISP_HEAD)?;
            Msg::Put {
                disp: word(payload, 0),
                data: &payload[DISP_HEAD..],
            }
        }
        PUTV | GETV => {
            need(BLOCKS_HEAD)?;
            let n = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
            if n == 0 || n > MAX_BLOCKS {
                return bad("a block list of 0 or more than MAX_BLOCKS blocks");
            }
            let end = BLOCKS_HEAD + n * BLOCK;
            need(end)?;
            let blocks = Blocks(&payload[BLOCKS_HEAD..end]);
            let data = &payload[end..];
            if kind == GETV {
                if !data.is_empty() {
                    return bad("a payload after a get's blocks");
                }
                Msg::GetV { blocks }
            } else {
                let mut total = 0u64;
                for (_, len) in blocks.iter() {
                    total = match total.checked_add(len) {
                        Some(t) => t,
                        None => return bad("block lengths that overflow"),
                    };
                }
                if total != data.len() as u64 {
                    return bad("blocks that do not add up to the bytes that follow");
                }
                Msg::PutV { blocks, data }
            }
        }
        GET => {
            if payload.len() != 16 {
                return bad("a get is 16 bytes");
            }
            Msg::Get {
                disp: word(payload, 0),
                len: word(payload, 8),
            }
        }
        ACC | GACC => {
            need(ACC_HEAD)?;
            Msg::Acc {
                head: acc_head(),
                data: &payload[ACC_HEAD..],
                fetch: kind == GACC,
            }
        }
        CAS => {
            need(ACC_HEAD)?;
            let rest = &payload[ACC_HEAD..];
            if rest.is_empty() || rest.len() % 2 != 0 {
                return bad("a compare-and-swap carries two elements of one size");
            }
            let (compare, swap) = rest.split_at(rest.len() / 2);
            Msg::Cas {
                head: acc_head(),
                compare,
                swap,
            }
        }
        RESULT => {
            need(DISP_HEAD)?;
            Msg::Result {
                offset: word(payload, 0),
                data: &payload[DISP_HEAD..],
            }
        }
        LOCK => {
            empty()?;
            Msg::Lock {
                exclusive: lock_kind()?,
            }
        }
        UNLOCK => {
            empty()?;
            Msg::Unlock {
                exclusive: lock_kind()?,
            }
        }
        GRANT | FLUSH | ACK | POST | COMPLETE | CREDIT => {
            empty()?;
            match kind {
                GRANT => Msg::Grant,
                FLUSH => Msg::Flush,
                ACK => Msg::Ack,
                POST => Msg::Post,
                CREDIT => Msg::Credit,
                _ => Msg::Complete,
            }
        }
        ERR => {
            if payload.len() != ERR_LEN {
                return bad("a refusal is 24 bytes");
            }
            Msg::Err {
                why: Refusal::from_code(payload[0]),
                disp: word(payload, 8),
                len: word(payload, 16),
            }
        }
        _ => return bad("an unknown kind"),
    })
}

/// The head of a `PUT` or `RESULT`.
pub fn disp_head(disp: u64) -> [u8; DISP_HEAD] {
    disp.to_le_bytes()
}

/// The payload of a `GET`.
pub fn get(disp: u64, len: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&disp.to_le_bytes());
    b[8..].copy_from_slice(&len.to_le_bytes());
    b
}

/// The head of an `ACC`, `GACC` or `CAS` (`op` 0).
pub fn acc_head(h: AccHead) -> [u8; ACC_HEAD] {
    let mut b = [0u8; ACC_HEAD];
    b[..8].copy_from_slice(&h.disp.to_le_bytes());
    b[8..12].copy_from_slice(&h.tag.to_le_bytes());
    b[12] = h.code;
    b[13] = h.op;
    b
}

/// The head and block list of a `PUTV` or `GETV` naming `blocks`.
pub fn blocks(blocks: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCKS_HEAD + BLOCK * blocks.len());
    b.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    for &(d, l) in blocks {
        b.extend_from_slice(&d.to_le_bytes());
        b.extend_from_slice(&l.to_le_bytes());
    }
    b
}

/// The payload of an `ERR`.
pub fn err(why: Refusal, disp: u64, len: u64) -> [u8; ERR_LEN] {
    let mut b = [0u8; ERR_LEN];
    b[0] = why as u8;
    b[8..16].copy_from_slice(&disp.to_le_bytes());
    b[16..].copy_from_slice(&len.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_packet_decodes_as_it_was_made_and_bad_shapes_are_refused() {
        let h = Header::default();
        let mut put = disp_head(40).to_vec();
        put.extend_from_slice(b"abc");
        assert_eq!(
            decode(PUT, &h, &put),
            Ok(Msg::Put {
                disp: 40,
                data: b"abc"
            })
        );
        assert_eq!(decode(GET, &h, &get(8, 16)), Ok(Msg::Get { disp: 8, len: 16 }));
        let head = AccHead {
            disp: 16,
            tag: 0xdead_beef,
            code: 8,
            op: 1,
        };
        let mut acc = acc_head(head).to_vec();
        acc.extend_from_slice(&5u64.to_le_bytes());
        assert_eq!(
            decode(GACC, &h, &acc),
            Ok(Msg::Acc {
                head,
                data: &5u64.to_le_bytes(),
                fetch: true
            })
        );
        let mut cas = acc_head(head).to_vec();
        cas.extend_from_slice(&[1, 2]);
        assert!(matches!(
            decode(CAS, &h, &cas),
            Ok(Msg::Cas {
                compare: [1],
                swap: [2],
                ..
            })
        ));
        cas.push(3);
        assert!(decode(CAS, &h, &cas).is_err(), "two elements of one size");
        let lock = Header {
            flags: EXCLUSIVE,
            ..h
        };
        assert_eq!(decode(LOCK, &lock, &[]), Ok(Msg::Lock { exclusive: true }));
        assert!(decode(LOCK, &h, &[]).is_err(), "a lock of no kind");
        assert!(decode(GRANT, &h, &[0]).is_err());
        assert_eq!(
            decode(ERR, &h, &err(Refusal::OutOfBounds, 9, 10)),
            Ok(Msg::Err {
                why: Some(Refusal::OutOfBounds),
                disp: 9,
                len: 10
            })
        );
        for k in [PUT, RESULT, ACC, GACC, CAS] {
            assert!(decode(k, &h, &[0; 3]).is_err(), "kind {k} shorter than its head");
        }
        assert!(decode(GET, &h, &[0; 17]).is_err());
        let mut pv = blocks(&[(8, 2), (40, 1)]);
        pv.extend_from_slice(b"xyz");
        match decode(PUTV, &h, &pv) {
            Ok(Msg::PutV { blocks: b, data }) => {
                assert_eq!(b.iter().collect::<Vec<_>>(), [(8, 2), (40, 1)]);
                assert_eq!(data, b"xyz");
            }
            other => panic!("{other:?}"),
        }
        pv.push(b'!');
        assert!(decode(PUTV, &h, &pv).is_err(), "more bytes than the blocks hold");
        assert!(
            decode(PUTV, &h, &blocks(&[(0, u64::MAX), (0, 2)])).is_err(),
            "an overflow"
        );
        assert!(decode(GETV, &h, &blocks(&[])).is_err(), "no blocks");
        assert!(matches!(
            decode(GETV, &h, &blocks(&[(0, 4)])),
            Ok(Msg::GetV { .. })
        ));
        assert!(decode(0, &h, &[]).is_err());
        assert!(decode(200, &h, &[]).is_err());
    }
}
