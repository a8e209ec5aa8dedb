//! Frames: what an established connection carries, a 24-byte header (payload length
//! u32, kind and padding u32, envelope 2 × u64), up to 63 bytes of padding, the payload,
//! and up to 63 bytes of padding again.
//!
//! The padding is for the kernel's copies. On some CPUs (AMD Zen 3 among them) the
//! `rep movsb` that copies between user memory and a socket's buffers runs at a
//! twentieth of its speed when the destination lies 1 to 31 bytes past the source,
//! modulo a page: measured here, 64 KiB in 30 µs instead of 1.5. The kernel fills a
//! socket's pages from their start, one frame after another, so a frame whose length
//! is a multiple of [`FRAME_ALIGN`] starts on such a boundary, and padding before the
//! payload puts it at the same place within 64 bytes as the sender's buffer: the
//! sender's copy then never meets the slow case, nor the receiver's when its buffer
//! shares the sender's alignment.

use crate::{DropReason, Envelope};
use std::ops::Range;

/// Bytes in a frame header.
pub const FRAME_HEADER_LEN: usize = 24;

/// Every frame but a goodbye takes a multiple of this many bytes, and the padding
/// before its payload is less than it.
pub const FRAME_ALIGN: usize = 64;

/// Payloads from this long on are placed by [`frame_pads`]; shorter ones follow the
/// header at once, where a slow copy costs little.
pub const ALIGN_FROM: usize = 1024;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A packet for the layer above.
    Packet,
    /// The sender is leaving the job; no payload, and nothing follows.
    Goodbye,
}

/// What [`decode_frame`] found at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Not a whole frame yet.
    NeedMore,
    /// A whole frame (a packet or a goodbye, as `kind` says).
    Packet {
        /// Packet or goodbye.
        kind: FrameKind,
        /// The envelope.
        env: Envelope,
        /// Where the payload lies in the buffer.
        payload: Range<usize>,
        /// Bytes the frame takes, header and padding included.
        len_total: usize,
    },
    /// A header no sender of ours writes: the stream cannot be trusted any more.
    Bad(DropReason),
}

/// What a frame header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Packet or goodbye.
    pub kind: FrameKind,
    /// The envelope.
    pub env: Envelope,
    /// Payload bytes.
    pub len: usize,
    /// Padding between the header and the payload.
    pub lead: usize,
    /// Padding after the payload.
    pub trail: usize,
}

impl FrameHead {
    /// Where the payload starts, from the start of the frame.
    pub fn payload_at(&self) -> usize {
        FRAME_HEADER_LEN + self.lead
    }

    /// Bytes the whole frame takes.
    pub fn total(&self) -> usize {
        self.payload_at() + self.len + self.trail
    }
}

/// The padding (before, after) for a frame of `len` payload bytes whose bulk lies at
/// address `at` and begins `off` bytes into the payload: the bulk's place in the frame
/// matches `at` modulo [`FRAME_ALIGN`] (from [`ALIGN_FROM`] bytes on), and the frame
/// takes a multiple of it.
pub fn frame_pads(at: usize, off: usize, len: usize) -> (usize, usize) {
    let lead = if len >= ALIGN_FROM {
        at.wrapping_sub(FRAME_HEADER_LEN + off) % FRAME_ALIGN
    } else {
        0
    };
    let trail = (FRAME_ALIGN - (FRAME_HEADER_LEN + lead + len) % FRAME_ALIGN) % FRAME_ALIGN;
    (lead, trail)
}

/// A frame header for `len` payload bytes with `lead` and `trail` bytes of padding
/// (each less than [`FRAME_ALIGN`]).
pub fn encode_frame_header(
    kind: FrameKind,
    env: &Envelope,
    len: u32,
    lead: usize,
    trail: usize,
) -> [u8; FRAME_HEADER_LEN] {
    debug_assert!(lead < FRAME_ALIGN && trail < FRAME_ALIGN);
    let kind: u32 = match kind {
        FrameKind::Packet => 0,
        FrameKind::Goodbye => 1,
    };
    let word = kind | (lead as u32 & 0xff) << 8 | (trail as u32 & 0xff) << 16;
    let mut b = [0u8; FRAME_HEADER_LEN];
    b[..4].copy_from_slice(&len.to_le_bytes());
    b[4..8].copy_from_slice(&word.to_le_bytes());
    b[8..16].copy_from_slice(&env[0].to_le_bytes());
    b[16..24].copy_from_slice(&env[1].to_le_bytes());
    b
}

/// The frame at the start of `buf`, whose payload may be at most `max_payload` bytes.
pub fn decode_frame(buf: &[u8], max_payload: usize) -> Frame {
    let h = match decode_header(buf, max_payload) {
        Ok(Some(h)) => h,
        Ok(None) => return Frame::NeedMore,
        Err(r) => return Frame::Bad(r),
    };
    let len_total = h.total();
    if buf.len() < len_total {
        return Frame::NeedMore;
    }
    Frame::Packet {
        kind: h.kind,
        env: h.env,
        payload: h.payload_at()..h.payload_at() + h.len,
        len_total,
    }
}

/// What the frame header at the start of `buf` says, once it is all there: `None`
/// before.
///
/// # Errors
/// A header no sender of ours writes.
pub fn decode_header(buf: &[u8], max_payload: usize) -> Result<Option<FrameHead>, DropReason> {
    let (Some(len), Some(word), Some(e0), Some(e1)) =
        (u32_at(buf, 0), u32_at(buf, 4), u64_at(buf, 8), u64_at(buf, 16))
    else {
        return Ok(None);
    };
    let len = len as usize;
    // max_payload is bounded far below usize::MAX, so the total cannot overflow.
    if len > max_payload || len > usize::MAX / 2 {
        return Err(DropReason::Oversized);
    }
    let (lead, trail) = ((word >> 8 & 0xff) as usize, (word >> 16 & 0xff) as usize);
    if word >> 24 != 0 || lead >= FRAME_ALIGN || trail >= FRAME_ALIGN {
        return Err(DropReason::Malformed);
    }
    let kind = match word & 0xff {
        0 => FrameKind::Packet,
        1 if len == 0 && lead == 0 && trail == 0 => FrameKind::Goodbye,
        _ => return Err(DropReason::Malformed),
    };
    Ok(Some(FrameHead {
        kind,
        env: [e0, e1],
        len,
        lead,
        trail,
    }))
}

/// What a bad frame header says, for logs and failure reasons.
pub(super) fn describe_bad_frame(buf: &[u8], max_payload: usize) -> String {
    match (u32_at(buf, 0), u32_at(buf, 4)) {
        (Some(len), Some(_)) if len as usize > max_payload => {
            format!("a frame of {len} bytes, above the maximum of {max_payload}")
        }
        (Some(len), Some(word)) => format!(
            "a frame of kind {} with {len} bytes of payload, padded by {} and {}",
            word & 0xff,
            word >> 8 & 0xff,
            word >> 16
        ),
        _ => "a frame too short to read".into(),
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(
        kind: FrameKind,
        env: Envelope,
        len: u32,
        (lead, trail): (usize, usize),
        payload: &[u8],
    ) -> Vec<u8> {
        let mut v = encode_frame_header(kind, &env, len, lead, trail).to_vec();
        v.resize(v.len() + lead, 0xee);
        v.extend_from_slice(payload);
        v.resize(v.len() + trail, 0xee);
        v
    }

    #[test]
    fn a_goodbye_carries_nothing() {
        let goodbye_with_payload = frame(FrameKind::Goodbye, [0, 0], 1, (0, 0), &[0]);
        assert_eq!(
            decode_frame(&goodbye_with_payload, 10),
            Frame::Bad(DropReason::Malformed)
        );
        let padded_goodbye = frame(FrameKind::Goodbye, [0, 0], 0, (0, 8), &[]);
        assert_eq!(
            decode_frame(&padded_goodbye, 10),
            Frame::Bad(DropReason::Malformed)
        );
    }

    #[test]
    fn padding_past_its_bounds_is_refused() {
        let mut h = encode_frame_header(FrameKind::Packet, &[1, 2], 4, 0, 0);
        for (word, ok) in [
            (63 << 8, true),
            (64 << 8, false),
            (63 << 16, true),
            (64 << 16, false),
            (1 << 24, false),
        ] {
            h[4..8].copy_from_slice(&(word as u32).to_le_bytes());
            assert_eq!(decode_header(&h, 10).is_ok(), ok, "kind word {word:#x}");
        }
    }

    #[test]
    fn pads_place_the_bulk_as_its_buffer_lies_and_round_the_frame() {
        for at in 0..200usize {
            for off in [0, 8, 100] {
                for len in [0, 1, 100, ALIGN_FROM - 1, ALIGN_FROM, 65_536, 65_537] {
                    let (lead, trail) = frame_pads(at, off, len);
                    assert!(lead < FRAME_ALIGN && trail < FRAME_ALIGN);
                    assert_eq!((FRAME_HEADER_LEN + lead + len + trail) % FRAME_ALIGN, 0);
                    if len >= ALIGN_FROM {
                        assert_eq!((FRAME_HEADER_LEN + lead + off) % FRAME_ALIGN, at % FRAME_ALIGN);
                    } else {
                        assert_eq!(lead, 0);
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 0usize..64) {
            let header = decode_header(&bytes, max);
            match decode_frame(&bytes, max) {
                Frame::Packet { kind, env, payload, len_total } => {
                    let h = header.unwrap().unwrap();
                    prop_assert_eq!((h.kind, h.env, h.len), (kind, env, payload.len()));
                    prop_assert_eq!(payload.start, h.payload_at());
                    prop_assert_eq!(len_total, h.total());
                    prop_assert!(len_total <= bytes.len() && payload.len() <= max);
                }
                Frame::Bad(r) => prop_assert_eq!(header, Err(r)),
                Frame::NeedMore => prop_assert!(header.is_ok()),
            }
        }

        #[test]
        fn frames_decode_to_what_was_encoded(
            env in any::<[u64; 2]>(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            goodbye in any::<bool>(),
            pads in (0..FRAME_ALIGN, 0..FRAME_ALIGN),
            extra in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let (kind, payload, pads) = if goodbye {
                (FrameKind::Goodbye, Vec::new(), (0, 0))
            } else {
                (FrameKind::Packet, payload, pads)
            };
            let mut buf = frame(kind, env, payload.len() as u32, pads, &payload);
            let whole = buf.len();
            buf.extend_from_slice(&extra);
            match decode_frame(&buf, 300) {
                Frame::Packet { kind: k, env: e, payload: range, len_total } => {
                    prop_assert_eq!((k, e, len_total), (kind, env, whole));
                    prop_assert_eq!(&buf[range], &payload[..]);
                }
                other => prop_assert!(false, "{:?}", other),
            }
            for cut in 0..whole {
                prop_assert_eq!(decode_frame(&buf[..cut], 300), Frame::NeedMore);
                // The header alone says the frame once it is all there.
                let header = decode_header(&buf[..cut], 300).unwrap();
                if cut >= FRAME_HEADER_LEN {
                    let h = header.unwrap();
                    prop_assert_eq!((h.kind, h.env, h.len, (h.lead, h.trail)), (kind, env, payload.len(), pads));
                } else {
                    prop_assert_eq!(header, None);
                }
            }
            if !payload.is_empty() {
                prop_assert_eq!(decode_frame(&buf, payload.len() - 1), Frame::Bad(DropReason::Oversized));
            }
        }
    }
}
