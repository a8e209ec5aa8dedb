//! The tcp netmod's decoders must never panic on what a connection sends: a stream of
//! frames is decoded the way a connection reads it, and the handshake messages alone.
//! A frame that decodes must lie inside the buffer, its padding within bounds, and encode
//! back to its header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis_net::tcp::{
    FRAME_ALIGN, FRAME_HEADER_LEN, Frame, decode_challenge, decode_frame, decode_header, decode_hello,
    decode_reply, encode_frame_header,
};

fuzz_target!(|data: &[u8]| {
    let _ = decode_challenge(data);
    let _ = decode_hello(data);
    let _ = decode_reply(data);
    // The first byte picks the largest payload the reader accepts.
    let Some((&pick, mut rest)) = data.split_first() else {
        return;
    };
    let max_payload = [0, 1, 24, 4096, 256 << 10][pick as usize % 5];
    loop {
        match decode_frame(rest, max_payload) {
            Frame::NeedMore | Frame::Bad(_) => break,
            Frame::Packet {
                kind,
                env,
                payload,
                len_total,
            } => {
                let head = decode_header(rest, max_payload).unwrap().unwrap();
                assert!(len_total <= rest.len() && len_total == head.total());
                assert_eq!(payload, head.payload_at()..head.payload_at() + head.len);
                assert!(head.lead < FRAME_ALIGN && head.trail < FRAME_ALIGN);
                assert!(payload.len() <= max_payload);
                let header = encode_frame_header(kind, &env, payload.len() as u32, head.lead, head.trail);
                assert_eq!(&rest[..FRAME_HEADER_LEN], &header[..]);
                rest = &rest[len_total..];
            }
        }
    }
});
