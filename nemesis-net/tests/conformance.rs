//! What every netmod promises, written once and run against each of them (`tcp`,
//! `udp`) through [`nemesis_net::open`].

use nemesis_net::{Accept, Cards, Identity, NetError, Netmod, WaitHint};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NETMODS: [&str; 2] = ["tcp", "udp"];

/// Cards every netmod of a test shares, filled in once all are bound.
#[derive(Clone, Default)]
struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

impl Cards for Table {
    fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
        self.0.lock().unwrap().card(rank)
    }
}

/// `n` netmods called `name`, ranks 0..n of one job, on loopback.
fn job(name: &str, n: u32) -> Vec<Box<dyn Netmod>> {
    let table = Table::default();
    let none = |_: &str| None;
    let nms: Vec<Box<dyn Netmod>> = (0..n)
        .map(|rank| {
            let id = Identity {
                rank,
                size: n,
                job_key: nemesis_net::auth::JobKey::from_bytes([0x5e; 32]),
                addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            };
            nemesis_net::open(name, id, Box::new(table.clone()), &none).unwrap()
        })
        .collect();
    *table.0.lock().unwrap() = nms.iter().map(|m| m.business_card()).collect();
    nms
}

fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

#[test]
fn the_wait_descriptor_is_readable_when_a_packet_waits_and_not_when_nothing_does() {
    for name in NETMODS {
        let mut nms = job(name, 2);
        // Make contact both ways, then let everything settle.
        while nms[0].send(1, &[1, 0], &[b"hello"]).unwrap() != Accept::Sent {}
        let mut got = 0;
        let (a, b) = nms.split_at_mut(1);
        let end = Instant::now() + Duration::from_secs(10);
        while got == 0 {
            assert!(Instant::now() < end, "{name}: nothing arrived");
            a[0].poll(&mut |_, _, _| {}).unwrap();
            got += b[0].poll(&mut |_, _, _| {}).unwrap();
        }
        // Acknowledgements and replies go out; then nothing is left to do.
        let settle = Instant::now() + Duration::from_millis(500);
        while Instant::now() < settle {
            for m in nms.iter_mut() {
                m.poll(&mut |_, _, _| {}).unwrap();
            }
        }
        let fd = nms[1].wait_fd().expect("a wait descriptor").as_raw_fd();
        assert!(
            matches!(nms[1].wait_hint().unwrap(), WaitHint::Later(_)),
            "{name}: nothing to do"
        );
        assert!(!readable(fd, 0), "{name}: readable with nothing to read");
        assert_eq!(nms[0].send(1, &[2, 0], &[b"wake"]).unwrap(), Accept::Sent);
        // udp sends from `send`; tcp may leave bytes for the next poll.
        nms[0].poll(&mut |_, _, _| {}).unwrap();
        assert!(readable(fd, 5000), "{name}: not readable after a packet came");
        assert_eq!(nms[1].wait_hint().unwrap(), WaitHint::Now, "{name}");
        let mut seen = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while seen.is_empty() {
            assert!(Instant::now() < end, "{name}: the packet did not come");
            nms[1]
                .poll(&mut |src, env, p| seen.push((src, env[0], p.to_vec())))
                .unwrap();
        }
        assert_eq!(seen, vec![(0, 2, b"wake".to_vec())], "{name}");
    }
}

#[test]
fn unacknowledged_data_has_a_timer() {
    // udp retransmits from a timer: a waiter on its descriptor must know when.
    let mut nms = job("udp", 2);
    assert_eq!(nms[0].send(1, &[1, 0], &[b"x"]).unwrap(), Accept::Sent);
    match nms[0].wait_hint().unwrap() {
        WaitHint::Later(Some(t)) => assert!(t <= Instant::now() + Duration::from_secs(2)),
        other => panic!("expected a timer, got {other:?}"),
    }
}

#[test]
fn a_packet_over_the_largest_is_refused_and_one_of_exactly_it_taken() {
    for name in NETMODS {
        let mut nms = job(name, 2);
        let max = nms[0].max_payload();
        let big = vec![0u8; max + 1];
        match nms[0].send(1, &[0, 0], &[&big]) {
            Err(NetError::TooLarge { len, max: m }) => assert_eq!((len, m), (max + 1, max), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let exact = vec![0u8; max];
        let end = Instant::now() + Duration::from_secs(10);
        while nms[0]
            .send(1, &[0, 0], &[&exact[..max / 2], &exact[max / 2..]])
            .unwrap()
            == Accept::Again
        {
            assert!(Instant::now() < end, "{name}: never taken");
            for m in nms.iter_mut() {
                m.poll(&mut |_, _, _| {}).unwrap();
            }
        }
        let mut got = 0;
        while got == 0 {
            assert!(Instant::now() < end, "{name}: never arrived");
            nms[0].poll(&mut |_, _, _| {}).unwrap();
            nms[1]
                .poll(&mut |_, _, p| {
                    assert_eq!(p.len(), max);
                    got += 1;
                })
                .unwrap();
        }
    }
}
