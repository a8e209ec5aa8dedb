//! Frames: what an established connection carries, a 24-byte header (payload length
//! u32, kind u32, envelope 2 × u64) and the payload.

use crate::{DropReason, Envelope};
use std::ops::Range;

/// Bytes in a frame header.
pub const FRAME_HEADER_LEN: usize = 24;

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
        /// Bytes the frame takes, header included.
        len_total: usize,
    },
    /// A header no sender of ours writes: the stream cannot be trusted any more.
    Bad(DropReason),
}

/// A frame header for `len` payload bytes.
pub fn encode_frame_header(kind: FrameKind, env: &Envelope, len: u32) -> [u8; FRAME_HEADER_LEN] {
    let kind: u32 = match kind {
        FrameKind::Packet => 0,
        FrameKind::Goodbye => 1,
    };
    let mut b = [0u8; FRAME_HEADER_LEN];
    b[..4].copy_from_slice(&len.to_le_bytes());
    b[4..8].copy_from_slice(&kind.to_le_bytes());
    b[8..16].copy_from_slice(&env[0].to_le_bytes());
    b[16..24].copy_from_slice(&env[1].to_le_bytes());
    b
}

/// The frame at the start of `buf`, whose payload may be at most `max_payload` bytes.
pub fn decode_frame(buf: &[u8], max_payload: usize) -> Frame {
    let (kind, env, len) = match decode_header(buf, max_payload) {
        Ok(Some(h)) => h,
        Ok(None) => return Frame::NeedMore,
        Err(r) => return Frame::Bad(r),
    };
    let len_total = FRAME_HEADER_LEN + len;
    if buf.len() < len_total {
        return Frame::NeedMore;
    }
    Frame::Packet {
        kind,
        env,
        payload: FRAME_HEADER_LEN..len_total,
        len_total,
    }
}

/// The kind, envelope and payload length the frame header at the start of `buf` says,
/// once it is all there: `None` before.
///
/// # Errors
/// A header no sender of ours writes.
pub fn decode_header(
    buf: &[u8],
    max_payload: usize,
) -> Result<Option<(FrameKind, Envelope, usize)>, DropReason> {
    let (Some(len), Some(kind), Some(e0), Some(e1)) =
        (u32_at(buf, 0), u32_at(buf, 4), u64_at(buf, 8), u64_at(buf, 16))
    else {
        return Ok(None);
    };
    let len = len as usize;
    if len > max_payload || len > usize::MAX - FRAME_HEADER_LEN {
        return Err(DropReason::Oversized);
    }
    let kind = match kind {
        0 => FrameKind::Packet,
        1 if len == 0 => FrameKind::Goodbye,
        _ => return Err(DropReason::Malformed),
    };
    Ok(Some((kind, [e0, e1], len)))
}

/// What a bad frame header says, for logs and failure reasons.
pub(super) fn describe_bad_frame(buf: &[u8], max_payload: usize) -> String {
    match (u32_at(buf, 0), u32_at(buf, 4)) {
        (Some(len), Some(_)) if len as usize > max_payload => {
            format!("a frame of {len} bytes, above the maximum of {max_payload}")
        }
        (Some(len), Some(kind)) => format!("a frame of kind {kind} with {len} bytes of payload"),
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

    fn frame(kind: FrameKind, env: Envelope, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = encode_frame_header(kind, &env, len).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn a_goodbye_carries_nothing() {
        let goodbye_with_payload = frame(FrameKind::Goodbye, [0, 0], 1, &[0]);
        assert_eq!(
            decode_frame(&goodbye_with_payload, 10),
            Frame::Bad(DropReason::Malformed)
        );
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128), max in 0usize..64) {
            let header = decode_header(&bytes, max);
            match decode_frame(&bytes, max) {
                Frame::Packet { kind, env, payload, len_total } => {
                    prop_assert_eq!(payload.start, FRAME_HEADER_LEN);
                    prop_assert_eq!(payload.end, len_total);
                    prop_assert!(len_total <= bytes.len() && payload.len() <= max);
                    prop_assert_eq!(header, Ok(Some((kind, env, payload.len()))));
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
            extra in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let (kind, payload) = if goodbye { (FrameKind::Goodbye, Vec::new()) } else { (FrameKind::Packet, payload) };
            let mut buf = frame(kind, env, payload.len() as u32, &payload);
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
                    prop_assert_eq!(header, Some((kind, env, payload.len())));
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
