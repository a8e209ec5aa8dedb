//! The netmod conformance suite (`tests/suite`) run against the verbs netmods. It needs a
//! verbs device: `scripts/verbs-test.sh` runs this binary in the Soft-RoCE VM. Elsewhere
//! every test returns at once saying why, except inside that VM (`RXE_VM` set), where a
//! missing device is a failure.

#![cfg(feature = "verbs")]

mod suite;

use nemesis_net::reliable::Datagram;
use nemesis_net::verbs::ud::{UdConfig, UdEndpoint};
use nemesis_net::verbs_wire::decode_card_as;
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
    // A ud card carries its RDMA side's card on a second line.
    let (card, _) = nemesis_net::verbs_wire::split_card(card);
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

/// rc's RDMA: a get and a put between two ranks' registered buffers, and the device's
/// atomics on a word of one; a wrong key fails the operation, with the status named.
#[test]
fn rc_reads_writes_and_atomics_through_the_rdma_hook() {
    use nemesis_net::rdma::{Remote, Seg};
    if !here() {
        return;
    }
    let mut nms = suite::job(&RC, 2, &[]);
    // Connect: one packet, each side polling.
    let end = Instant::now() + Duration::from_secs(30);
    let mut arrived = 0;
    while nms[0].send(1, &[0, 0], &[b"hello"]).unwrap() != nemesis_net::Accept::Sent {
        assert!(Instant::now() < end, "never connected");
        for m in &mut nms {
            m.poll(&mut |_, _, _| {}).unwrap();
        }
    }
    while arrived == 0 {
        assert!(Instant::now() < end, "the packet never came");
        nms[0].poll(&mut |_, _, _| {}).unwrap();
        arrived += nms[1].poll(&mut |_, _, _| {}).unwrap();
    }
    let (a, b) = nms.split_at_mut(1);
    let (a, b) = (
        a[0].rdma().expect("rc offers RDMA"),
        b[0].rdma().expect("rc offers RDMA"),
    );

    let mut theirs: Vec<u64> = (0..8192).map(|i| i * 3).collect();
    let their_bytes = theirs.len() * 8;
    let treg = b
        .register(Seg {
            ptr: theirs.as_mut_ptr().cast(),
            len: their_bytes,
        })
        .unwrap();
    let remote = Remote::decode(1, &treg.remote.encode()).unwrap();
    let mut mine = vec![0u64; 8192];
    let mreg = a
        .register(Seg {
            ptr: mine.as_mut_ptr().cast(),
            len: their_bytes,
        })
        .unwrap();
    let mine_seg = Seg {
        ptr: mine.as_mut_ptr().cast(),
        len: their_bytes,
    };
    let wait = |r: &mut dyn nemesis_net::Rdma, op| {
        let end = Instant::now() + Duration::from_secs(30);
        while !r.test(op).unwrap() {
            assert!(Instant::now() < end, "an RDMA operation never completed");
        }
    };
    // SAFETY: `mine` is registered, live and untouched until the get completes.
    let op = unsafe { a.get(1, mine_seg, &mreg, remote) }.unwrap();
    wait(&mut *a, op);
    assert!(
        mine.iter().enumerate().all(|(i, &v)| v == i as u64 * 3),
        "the get moved the wrong bytes"
    );

    for v in mine.iter_mut() {
        *v = 7;
    }
    // SAFETY: as above, for the put.
    let op = unsafe { a.put(1, mine_seg, &mreg, remote) }.unwrap();
    wait(&mut *a, op);
    // SAFETY: the device wrote `theirs`; the write completed, so reading it is ordered
    // after (the pointer read keeps the compiler from assuming it unchanged).
    let seen: Vec<u64> = (0..theirs.len())
        .map(|i| unsafe { theirs.as_ptr().add(i).read_volatile() })
        .collect();
    assert!(seen.iter().all(|&v| v == 7), "the put did not land");

    let word = Seg {
        ptr: mine.as_mut_ptr().cast(),
        len: 8,
    };
    let at = |i: u64| Remote {
        addr: remote.addr + 8 * i,
        len: 8,
        ..remote
    };
    // SAFETY: `mine[0]` is registered and unused until each operation completes.
    let op = unsafe { a.fetch_add(1, word, &mreg, at(5), 10) }.unwrap();
    wait(&mut *a, op);
    assert_eq!(mine[0], 7, "fetch-and-add returns the old value");
    // SAFETY: as above.
    let op = unsafe { a.compare_swap(1, word, &mreg, at(5), 17, 99) }.unwrap();
    wait(&mut *a, op);
    assert_eq!(mine[0], 17, "compare-and-swap returns the old value");
    // SAFETY: as above.
    let op = unsafe { a.compare_swap(1, word, &mreg, at(5), 17, 1) }.unwrap();
    wait(&mut *a, op);
    assert_eq!(mine[0], 99, "a failed compare leaves the word");
    // SAFETY: reading the device's writes after their completion.
    assert_eq!(unsafe { theirs.as_ptr().add(5).read_volatile() }, 99);
    // A rank's atomics on its own memory go through its loopback pair, so the device is
    // the one executor of the word for its owner too.
    assert!(a.has_atomics() && b.has_atomics());
    let mut scratch = vec![0u64; 1];
    let own = Seg {
        ptr: scratch.as_mut_ptr().cast(),
        len: 8,
    };
    let sreg = b.register(own).unwrap();
    // SAFETY: `scratch` is registered and unused until the operation completes.
    let op = unsafe { b.fetch_add(1, own, &sreg, at(5), 1) }.unwrap();
    wait(&mut *b, op);
    assert_eq!(scratch[0], 99, "a loopback fetch-and-add returns the old value");
    // SAFETY: as above.
    assert_eq!(unsafe { theirs.as_ptr().add(5).read_volatile() }, 100);
    b.deregister(&sreg);
    // A misaligned word is refused before anything is posted.
    let odd = Remote {
        addr: remote.addr + 4,
        ..at(0)
    };
    // SAFETY: nothing is posted.
    let refused = unsafe { a.fetch_add(1, word, &mreg, odd, 1) };
    assert!(refused.is_err());

    // A wrong key: the operation fails, named, and so does the connection.
    let bad = Remote {
        rkey: remote.rkey ^ 0x5a5a,
        ..remote
    };
    // SAFETY: as for the get.
    let op = unsafe { a.get(1, mine_seg, &mreg, bad) }.unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let err = loop {
        assert!(Instant::now() < end, "a get with a wrong key never failed");
        match a.test(op) {
            Ok(false) => {}
            Ok(true) => panic!("a get with a wrong key succeeded"),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("rank 1"), "{err}");
    a.deregister(&mreg);
    b.deregister(&treg);
    drop(theirs);
}

/// A GID index that names no GID is refused with an error naming the variable that
/// chooses one.
#[test]
fn an_unset_gid_is_named() {
    if !here() {
        return;
    }
    let cfg = UdConfig {
        gid_index: Some(500),
        ..UdConfig::default()
    };
    match UdEndpoint::open(&cfg, addr()) {
        Err(e @ nemesis_net::verbs::VerbsError::NoGid { .. }) => {
            assert!(e.to_string().contains("NEMESIS_VERBS_GID_INDEX"), "{e}");
        }
        other => panic!("expected a missing GID, got {other:?}"),
    }
}

/// ud's RDMA side: no pair until a read needs one, then one to that peer only; the
/// sender's buffer registered for reading only; and none of it with `NEMESIS_UD_RDMA=0`.
#[test]
fn ud_reads_over_a_pair_made_for_that_peer_only() {
    use nemesis_net::rdma::{RdmaError, Seg};
    if !here() {
        return;
    }
    let off = suite::job(&UD, 2, &[("NEMESIS_UD_RDMA", "0")]);
    assert!(off.into_iter().all(|mut m| m.rdma().is_none()));

    let mut nms = suite::job(&UD, 3, &[]);
    // Small packets between every two: datagrams only.
    let end = Instant::now() + Duration::from_secs(30);
    let mut got = 0;
    for from in 0..3u32 {
        for to in (0..3u32).filter(|&t| t != from) {
            while nms[from as usize].send(to, &[0, 0], &[b"small"]).unwrap() != nemesis_net::Accept::Sent {
                assert!(Instant::now() < end, "a datagram was never taken");
                for m in &mut nms {
                    m.poll(&mut |_, _, _| {}).unwrap();
                }
            }
        }
    }
    while got < 6 {
        assert!(Instant::now() < end, "the datagrams never came");
        for m in &mut nms {
            got += m.poll(&mut |_, _, _| {}).unwrap();
        }
    }
    assert!(
        nms.iter().all(|m| m.stats().rdma_pairs == 0),
        "a pair before any RDMA"
    );

    let theirs: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let treg = nms[1]
        .rdma()
        .expect("ud offers RDMA")
        .register_read(Seg::of(&theirs))
        .unwrap();
    let mut mine = vec![0u8; theirs.len()];
    let seg = Seg::of_mut(&mut mine);
    let mreg = nms[0].rdma().unwrap().register(seg).unwrap();
    // The first tries find the pair connecting: "again" while every rank polls.
    let op = loop {
        assert!(Instant::now() < end, "the pair never connected");
        // SAFETY: `mine` is registered, live and untouched until the get completes.
        match unsafe { nms[0].rdma().unwrap().get(1, seg, &mreg, treg.remote) } {
            Ok(op) => break op,
            Err(RdmaError::Again { .. }) => {
                for m in &mut nms {
                    m.poll(&mut |_, _, _| {}).unwrap();
                }
            }
            Err(e) => panic!("{e}"),
        }
    };
    while !nms[0].rdma().unwrap().test(op).unwrap() {
        assert!(Instant::now() < end, "the read never completed");
        for m in &mut nms[1..] {
            m.poll(&mut |_, _, _| {}).unwrap();
        }
    }
    assert!(mine == theirs, "the read moved the wrong bytes");
    let pairs: Vec<u64> = nms.iter().map(|m| m.stats().rdma_pairs).collect();
    assert_eq!(pairs, [1, 1, 0], "one pair, between the two ranks that needed it");
    assert_eq!(nms[0].stats().rdma_bytes, theirs.len() as u64);
    nms[0].rdma().unwrap().deregister(&mreg);
    nms[1].rdma().unwrap().deregister(&treg);
}
