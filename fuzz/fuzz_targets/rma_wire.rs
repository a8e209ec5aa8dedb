//! One-sided packets from the wire: the decoder never panics, and a target serving any
//! packet writes nothing outside its window and answers only with packets that decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis::Header;
use nemesis::rma::{serve_bytes, wire};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let kind = data[0];
    let h = Header {
        flags: u16::from_le_bytes([data[1], data[2]]),
        aux: u32::from_le_bytes([data[3], data[4], data[5], data[6]]),
        ..Header::default()
    };
    // Which element size the window has: 1, 2, 4 or 8 bytes.
    let elem = 1usize << (data[7] % 4);
    let payload = &data[8..];
    let _ = wire::decode(kind, &h, payload);
    // 64 bytes of window between two guards, all 8-byte aligned.
    let mut mem = vec![0xa5a5_a5a5_a5a5_a5a5u64; 32 + 8 + 32];
    let bytes: &mut [u8] = bytemuck_free_cast(&mut mem);
    let (front, rest) = bytes.split_at_mut(256);
    let (window, back) = rest.split_at_mut(64);
    // Element codes whose size matches, tagged 7: requests with another tag are refused.
    let replies = serve_bytes(window, elem, 7, h, kind, payload);
    assert!(front.iter().all(|&b| b == 0xa5), "a write before the window");
    assert!(back.iter().all(|&b| b == 0xa5), "a write after the window");
    for (k, p) in replies {
        assert!(
            wire::decode(k, &Header::default(), &p).is_ok(),
            "a reply of kind {k} that does not decode"
        );
    }
});

/// The bytes of `v`.
fn bytemuck_free_cast(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64s are plain bytes; the slice covers exactly their memory.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 8) }
}
