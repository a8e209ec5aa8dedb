//! The verbs netmods' decoders (an rc packet, an rc connection request, a ud or rc
//! business card, a ud card carrying its RDMA endpoint's) must never panic, and what
//! they accept must encode back to the same bytes: nothing they let through can be read
//! two ways.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nemesis_net::verbs_wire::{
    Request, decode_card_as, decode_packet, encode_card_as, encode_header, join_cards, split_card,
};

fuzz_target!(|data: &[u8]| {
    if let Some((env, kind, payload)) = decode_packet(data) {
        let h = encode_header(&env, payload.len() as u32, kind);
        assert_eq!(&data[..h.len()], &h[..]);
    }
    if let Ok(r) = Request::decode(data) {
        assert_eq!(&r.encode()[..], data);
    }
    // A ud card may carry the rc card of its RDMA pairs on a second line.
    let (ud, rc) = split_card(data);
    if let Some(rc) = rc {
        assert_eq!(join_cards(ud, rc), data);
    }
    for (netmod, card) in [("ud", ud), ("rc", rc.unwrap_or(data)), ("rc", data)] {
        if let Ok((addr, mtu)) = decode_card_as(netmod, 0, card) {
            // Accepted cards decode to the same address again from their canonical form.
            let again = decode_card_as(netmod, 0, &encode_card_as(netmod, addr, mtu));
            assert_eq!(again.ok(), Some((addr, mtu)));
        }
    }
});
