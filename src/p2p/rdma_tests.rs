//! Large messages between nodes by RDMA read, over the in-memory RDMA of the test kit:
//! which messages take it, what a refused registration or a bad key does.

use super::tests::raw_rts;
use super::*;
use crate::testkit::{RdmaCounters, job_nodes_full, pattern};
use nemesis_lmt::{LmtError, Strategy};
use nemesis_net::rdma::Remote;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Ranks 0 and 1 on one node, rank 2 on another; the netmod offers RDMA.
fn mixed<T: Send + 'static>(
    counters: &Arc<RdmaCounters>,
    f: impl Fn(World) -> T + Send + Sync + 'static,
) -> Vec<T> {
    job_nodes_full(&[2, 1], Some(counters.clone()), None, f)
}

#[test]
fn large_messages_to_other_nodes_are_read_by_rdma_and_those_within_the_node_are_not() {
    let c = Arc::new(RdmaCounters::default());
    // Above the in-memory netmod's packet (100,000 bytes), so not eager.
    let big = 300_000;
    mixed(&c, move |mut w| {
        let comm = w.comm();
        match w.rank() {
            0 => {
                w.send(&comm, 1, 0, &pattern(1, big)).unwrap();
                w.send(&comm, 2, 0, &pattern(2, big)).unwrap();
                // In pieces, each its own key.
                let m = pattern(3, big);
                let (a, b) = m.split_at(1000);
                w.send_iov(&comm, 2, 1, &[a, &[], b]).unwrap();
                let mut back = vec![0u8; big];
                w.recv(&comm, 2, 2, &mut back).unwrap();
                assert!(back == pattern(4, big));
            }
            1 => {
                let mut got = vec![0u8; big];
                w.recv(&comm, 0, 0, &mut got).unwrap();
                assert!(got == pattern(1, big));
            }
            _ => {
                let mut got = vec![0u8; big];
                w.recv(&comm, 0, 0, &mut got).unwrap();
                assert!(got == pattern(2, big));
                // Into pieces.
                let (mut x, mut y) = (vec![0u8; 77], vec![0u8; big - 77]);
                w.recv_iov(&comm, 0, 1, &mut [&mut x, &mut y]).unwrap();
                assert!(x[..] == pattern(3, big)[..77] && y[..] == pattern(3, big)[77..]);
                w.send(&comm, 0, 2, &pattern(4, big)).unwrap();
            }
        }
    });
    assert_eq!(
        c.read.load(Ordering::Relaxed),
        3 * big as u64,
        "three messages between nodes"
    );
}

#[test]
fn below_the_threshold_or_with_registration_refused_messages_go_by_packets_intact() {
    let c = Arc::new(RdmaCounters::default());
    let big = 300_000;
    let counters = c.clone();
    job_nodes_full(&[1, 1], Some(c.clone()), None, move |mut w| {
        let comm = w.comm();
        let lmt = w.channel_mut().shm_mut().local_lmt();
        let p = lmt.policy();
        // Above this message: packets.
        lmt.set_policy(nemesis_lmt::Policy {
            rdma_min: Some(big + 1),
            ..p
        })
        .unwrap();
        if w.rank() == 0 {
            w.send(&comm, 1, 0, &pattern(1, big)).unwrap();
            w.barrier(&comm).unwrap();
            w.channel_mut()
                .shm_mut()
                .local_lmt()
                .set_policy(nemesis_lmt::Policy {
                    rdma_min: Some(0),
                    ..p
                })
                .unwrap();
            // Every registration refused: the sender offers only packets.
            counters.refuse.store(true, Ordering::Relaxed);
            w.send(&comm, 1, 1, &pattern(2, big)).unwrap();
            counters.refuse.store(false, Ordering::Relaxed);
            // Registered here, refused at the receiver once it has the RTS.
            let third = pattern(3, big);
            w.scope(|sc| {
                let r = sc.isend(&comm, 1, 2, &third).unwrap();
                sc.world().send(&comm, 1, 9, &[1]).unwrap();
                sc.wait(r).unwrap();
            });
        } else {
            let mut got = vec![0u8; big];
            w.recv(&comm, 0, 0, &mut got).unwrap();
            assert!(got == pattern(1, big));
            assert_eq!(counters.read.load(Ordering::Relaxed), 0, "below the threshold");
            w.barrier(&comm).unwrap();
            w.recv(&comm, 0, 1, &mut got).unwrap();
            assert!(got == pattern(2, big));
            let mut go = [0u8; 1];
            w.recv(&comm, 0, 9, &mut go).unwrap();
            counters.refuse.store(true, Ordering::Relaxed);
            w.recv(&comm, 0, 2, &mut got).unwrap();
            assert!(got == pattern(3, big));
            counters.refuse.store(false, Ordering::Relaxed);
        }
    });
    assert_eq!(c.read.load(Ordering::Relaxed), 0);
}

#[test]
fn a_key_to_memory_never_registered_or_of_the_wrong_length_fails_that_receive_only() {
    let c = Arc::new(RdmaCounters::default());
    let len = 200_000u64;
    job_nodes_full(&[1, 1], Some(c.clone()), None, move |mut w| {
        let comm = w.comm();
        if w.rank() == 0 {
            let key = |rkey, len| {
                let mut k = vec![1u8];
                k.extend_from_slice(
                    &Remote {
                        addr: 4096,
                        len,
                        rkey,
                    }
                    .encode(),
                );
                k
            };
            raw_rts(&mut w, 1, 2001, len, Strategy::Rdma, &key(0xdead, len));
            raw_rts(&mut w, 1, 2002, len, Strategy::Rdma, &key(0xdead, len - 1));
            raw_rts(&mut w, 1, 2003, len, Strategy::Rdma, &[3, 1, 2]);
            let mut go = [0u8; 1];
            w.recv(&comm, 1, 9, &mut go).unwrap();
            w.send(&comm, 1, 5, &pattern(7, len as usize)).unwrap();
        } else {
            for what in ["unknown key", "cover 199999 bytes", "claims 3 keys"] {
                let mut buf = vec![0u8; len as usize];
                let e = w.recv(&comm, 0, 5, &mut buf).unwrap_err();
                match &e {
                    P2pError::Transfer {
                        rank: 0,
                        source: LmtError::BadCookie { peer: 0, why },
                    } => assert!(why.contains(what), "{e}"),
                    other => panic!("expected a bad key ({what}), got {other}"),
                }
                assert!(buf.iter().all(|&b| b == 0), "bytes were written on a bad key");
            }
            w.send(&comm, 0, 9, &[1]).unwrap();
            // The pair goes on.
            let mut buf = vec![0u8; len as usize];
            w.recv(&comm, 0, 5, &mut buf).unwrap();
            assert!(buf == pattern(7, len as usize));
        }
    });
}

#[test]
fn pinned_buffers_are_registered_once_and_every_other_registration_ends_with_its_transfer() {
    use crate::Pinned;
    let c = Arc::new(RdmaCounters::default());
    let len = 300_000;
    let counters = c.clone();
    job_nodes_full(&[1, 1], Some(c.clone()), None, move |mut w| {
        let comm = w.comm();
        let n = |c: &RdmaCounters| c.registered.load(Ordering::Relaxed);
        if w.rank() == 0 {
            // From ordinary memory: one registration a message, ended with it.
            for i in 0..3 {
                w.send(&comm, 1, 0, &pattern(i, len)).unwrap();
            }
            w.barrier(&comm).unwrap();
            // Rank 1 counts between these two barriers, before our next registration.
            w.barrier(&comm).unwrap();
            let mut p = Pinned::new(len).unwrap();
            for i in 0..3 {
                p.copy_from_slice(&pattern(10 + i, len));
                w.send(&comm, 1, 1, &p).unwrap();
            }
            w.barrier(&comm).unwrap();
            // A part of a pinned buffer uses its registration too.
            w.send(&comm, 1, 2, &p[1000..]).unwrap();
            w.barrier(&comm).unwrap();
            drop(p);
            w.barrier(&comm).unwrap();
            // The next large message finds the buffer gone and ends its registration.
            w.send(&comm, 1, 3, &pattern(20, len)).unwrap();
            w.barrier(&comm).unwrap();
        } else {
            let mut got = vec![0u8; len];
            for i in 0..3 {
                w.recv(&comm, 0, 0, &mut got).unwrap();
                assert!(got == pattern(i, len));
            }
            w.barrier(&comm).unwrap();
            // Three messages each way, into ordinary memory: six registrations.
            assert_eq!(n(&counters), 6);
            assert_eq!(
                counters.live.load(Ordering::Relaxed),
                0,
                "a registration outlived its transfer"
            );
            w.barrier(&comm).unwrap();
            let mut into = Pinned::new(len).unwrap();
            for i in 0..3 {
                w.recv(&comm, 0, 1, &mut into).unwrap();
                assert!(*into == pattern(10 + i, len)[..]);
            }
            w.barrier(&comm).unwrap();
            // One for the sender's pinned buffer, one for ours: kept.
            assert_eq!(n(&counters), 8);
            assert_eq!(counters.live.load(Ordering::Relaxed), 2);
            w.recv(&comm, 0, 2, &mut into[..len - 1000]).unwrap();
            assert!(into[..len - 1000] == pattern(12, len)[1000..]);
            assert_eq!(n(&counters), 8);
            w.barrier(&comm).unwrap();
            drop(into);
            w.barrier(&comm).unwrap();
            w.recv(&comm, 0, 3, &mut got).unwrap();
            assert!(got == pattern(20, len));
            w.barrier(&comm).unwrap();
            assert_eq!(
                counters.live.load(Ordering::Relaxed),
                0,
                "a gone buffer's registration was kept"
            );
        }
    });
}
