//! The netmod conformance suite (`tests/suite`) run against the netmods every host has:
//! tcp and udp, on loopback.

mod suite;

use nemesis_net::{Accept, WaitHint};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use suite::Kind;

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

fn always() -> bool {
    true
}

/// Connects to the tcp netmod and writes `junk` where its handshake's hello belongs.
fn inject_tcp(card: &[u8], junk: &[u8]) {
    let to = nemesis_net::addr::decode_card("tcp", 1, card).unwrap();
    let mut s = TcpStream::connect(to).unwrap();
    let _ = s.write_all(junk);
    // Closing without a word is itself bad input: a connection that never proved itself.
}

/// Sends `junk` as one datagram to the udp netmod's socket.
fn inject_udp(card: &[u8], junk: &[u8]) {
    let to = nemesis_net::addr::decode_card("udp", 1, card).unwrap();
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.send_to(junk, to).unwrap();
}

const TCP: Kind = Kind {
    name: "tcp",
    addr: loopback,
    here: always,
    inject: inject_tcp,
    vars: &[],
};

const UDP: Kind = Kind {
    name: "udp",
    addr: loopback,
    here: always,
    inject: inject_udp,
    // Loopback's MTU would carry every packet in one datagram: a smaller one makes the
    // suite's packets span many segments, as on a real network.
    vars: &[("NEMESIS_UDP_MTU", "1500")],
};

netmod_suite!(tcp, super::TCP);
netmod_suite!(udp, super::UDP);

#[test]
fn unacknowledged_udp_data_has_a_timer() {
    // udp retransmits from a timer: a waiter on its descriptor must know when.
    let mut nms = suite::job(&UDP, 2, &[]);
    assert_eq!(nms[0].send(1, &[1, 0], &[b"x"]).unwrap(), Accept::Sent);
    match nms[0].wait_hint().unwrap() {
        WaitHint::Later(Some(t)) => assert!(t <= Instant::now() + Duration::from_secs(2)),
        other => panic!("expected a timer, got {other:?}"),
    }
}
