//! The verbs netmods' decoders (an rc packet, an rc connection request, a ud or rc
//! business card) must never panic, and what they accept must encode back to the same
//! bytes: nothing they let through can be read two ways.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis_net::verbs_wire::{Request, decode_card_as, decode_packet, encode_card_as, encode_header};

fuzz_target!(|data: &[u8]| {
    if let Some((env, kind, payload)) = decode_packet(data) {
        let h = encode_header(&env, payload.len() as u32, kind);
        assert_eq!(&data[..h.len()], &h[..]);
    }
    if let Ok(r) = Request::decode(data) {
        assert_eq!(&r.encode()[..], data);
    }
    for netmod in ["ud", "rc"] {
        if let Ok((addr, mtu)) = decode_card_as(netmod, 0, data) {
            // Accepted cards decode to the same address again from their canonical form.
            let again = decode_card_as(netmod, 0, &encode_card_as(netmod, addr, mtu));
            assert_eq!(again.ok(), Some((addr, mtu)));
        }
    }
});
