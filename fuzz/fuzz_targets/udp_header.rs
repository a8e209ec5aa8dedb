//! The reliable datagram layer's header decoder must never panic on a datagram, and a
//! header it accepts must encode back to the same bytes: nothing it lets through can be
//! read two ways.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis_net::reliable::{MAX_HEADER_LEN, decode_header, encode_header};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = decode_header(data) {
        let mut out = [0u8; MAX_HEADER_LEN];
        let n = encode_header(&h, &mut out);
        assert_eq!(n, h.encoded_len());
        assert_eq!(&data[..n], &out[..n]);
    }
});
