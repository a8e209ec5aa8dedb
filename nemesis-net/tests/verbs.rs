//! The netmod conformance suite (`tests/suite`) run against the verbs netmods. It needs a
//! verbs device: `scripts/verbs-test.sh` runs this binary in the Soft-RoCE VM. Elsewhere
//! every test returns at once saying why, except inside that VM (`RXE_VM` set), where a
//! missing device is a failure.

#![cfg(feature = "verbs")]

mod suite;

use nemesis_net::reliable::Datagram;
use nemesis_net::verbs::ud::{UdConfig, UdEndpoint, decode_card_as};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use suite::Kind;

/// Whether a verbs device is here; inside the VM there must be one.
fn here() -> bool {
    match nemesis_net::verbs::devices() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("RXE_VM").is_none(),
                "inside the Soft-RoCE VM there must be a device: {e}"
            );
            assert!(e.unavailable(), "{e}");
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// The VM's address (its RoCE v2 GID maps it), or loopback elsewhere.
fn addr() -> IpAddr {
    std::env::var("RXE_VM_IP")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Sends `junk` as one datagram from a queue pair of no job to the UD endpoint a ud or
/// rc card names (rc's takes connection requests).
fn inject(card: &[u8], junk: &[u8]) {
    let name = if card.starts_with(b"rc ") { "rc" } else { "ud" };
    let (to, _) = decode_card_as(name, 1, card).unwrap();
    let mut ep = UdEndpoint::open(&UdConfig::default(), addr()).unwrap();
    assert!(ep.send_to(&[junk], to).unwrap());
    // Most sends ask for no completion: give the device time to send it before the
    // queue pair goes.
    let end = Instant::now() + Duration::from_millis(200);
    while Instant::now() < end {
        let _ = ep.recv().unwrap();
    }
}

const UD: Kind = Kind {
    name: "ud",
    addr,
    here,
    inject,
    vars: &[],
};

const RC: Kind = Kind {
    name: "rc",
    addr,
    here,
    inject,
    vars: &[],
};

netmod_suite!(ud, super::UD);
netmod_suite!(rc, super::RC);

/// Run by `scripts/verbs-test.sh` as an unprivileged user under a small memory-lock
/// limit (`NEM_TEST_MEMLOCK=1`): registering more than the limit is refused with an
/// error that says what to do.
#[test]
fn registration_past_the_memory_lock_limit_names_ulimit() {
    if std::env::var_os("NEM_TEST_MEMLOCK").is_none() || !here() {
        return;
    }
    let cfg = UdConfig {
        recv_depth: 65536,
        ..UdConfig::default()
    };
    match UdEndpoint::open(&cfg, addr()) {
        Err(e @ nemesis_net::verbs::VerbsError::MemLock { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("ulimit -l"), "{msg}");
        }
        other => panic!("expected a memory-lock error, got {other:?}"),
    }
}
