//! The progress core: protocols beside two-sided messaging on one channel, alone, and
//! what happens to packets nobody registered.

use super::*;
use crate::P2pError;
use crate::channel::{NemesisChannel, ShmChannel};
use crate::testkit::job;
use nemesis_shm::{Geometry, Segment};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A runtime's protocol: it counts what it is handed and answers every "ping" with a
/// "pong" from inside its handler.
#[derive(Debug, Default)]
struct PingPong {
    pings: u32,
    pongs: u32,
}

const PING: u16 = 1;
const PONG: u16 = 2;

impl Protocol for PingPong {
    fn handle(&mut self, p: Packet<'_>, out: &mut Outbox) {
        assert_eq!(ProtocolId::of(p.header.kind), ProtocolId::user(3).unwrap());
        match p.header.kind & 0xff {
            PING => {
                self.pings += 1;
                let reply = Header {
                    kind: PONG,
                    tag: p.header.tag,
                    ..Header::default()
                };
                out.send(p.src, reply, p.payload).unwrap();
            }
            PONG => self.pongs += 1,
            k => panic!("unexpected kind {k}"),
        }
    }
}

fn proto() -> ProtocolId {
    ProtocolId::user(3).unwrap()
}

#[test]
fn a_runtimes_protocol_is_served_while_the_world_waits_in_a_receive() {
    job(2, |mut w| {
        let c = w.comm();
        w.register(proto(), PingPong::default()).unwrap();
        w.barrier(&c).unwrap();
        if w.rank() == 0 {
            for i in 0..100 {
                let h = Header {
                    kind: PING,
                    tag: i,
                    ..Header::default()
                };
                w.send_packet(proto(), 1, h, b"ping").unwrap();
            }
            // Rank 1 answers from inside its blocked `recv`: the pongs come back before
            // we send what it waits for.
            assert!(
                w.progress_until(Some(Duration::from_secs(30)), |w| {
                    w.protocol::<PingPong>(proto()).unwrap().pongs == 100
                })
                .unwrap()
            );
            w.send(&c, 1, 0, b"go").unwrap();
        } else {
            let mut b = [0u8; 4];
            w.recv(&c, 0, 0, &mut b).unwrap();
            assert_eq!(w.protocol::<PingPong>(proto()).unwrap().pings, 100);
        }
        assert_eq!(w.core().dropped(), vec![]);
        w.barrier(&c).unwrap();
    });
}

#[test]
fn a_packet_of_an_unregistered_protocol_is_counted_and_dropped_and_the_others_go_on() {
    job(2, |mut w| {
        let c = w.comm();
        let stranger = ProtocolId::user(9).unwrap();
        if w.rank() == 0 {
            for _ in 0..3 {
                w.send_packet(stranger, 1, Header::default(), b"who?").unwrap();
            }
            w.send(&c, 1, 0, b"two-sided").unwrap();
        } else {
            let mut b = [0u8; 16];
            let st = w.recv(&c, 0, 0, &mut b).unwrap();
            assert_eq!(&b[..st.len], b"two-sided");
            assert!(
                w.progress_until(Some(Duration::from_secs(30)), |w| {
                    w.core().dropped() == vec![(stranger, 3)]
                })
                .unwrap()
            );
        }
        w.barrier(&c).unwrap();
    });
}

#[test]
fn registration_and_sends_refuse_what_cannot_work() {
    job(1, |mut w| {
        assert_eq!(
            w.register(ProtocolId::P2P, PingPong::default()),
            Err(RegistryError::Reserved(ProtocolId::P2P))
        );
        w.register(proto(), PingPong::default()).unwrap();
        assert_eq!(
            w.register(proto(), |_: Packet<'_>, _: &mut Outbox| {}),
            Err(RegistryError::Taken(proto()))
        );
        let big = Header {
            kind: 0x100,
            ..Header::default()
        };
        assert!(matches!(
            w.send_packet(proto(), 0, big, b""),
            Err(P2pError::Channel(crate::ChannelError::Registry(
                RegistryError::Kind(0x100)
            )))
        ));
        assert!(matches!(
            w.send_packet(ProtocolId::P2P, 0, Header::default(), b""),
            Err(P2pError::Channel(crate::ChannelError::Registry(
                RegistryError::Reserved(_)
            )))
        ));
        assert!(matches!(
            w.send_packet(proto(), 5, Header::default(), b""),
            Err(P2pError::Channel(crate::ChannelError::InvalidRank {
                rank: 5,
                size: 1
            }))
        ));
        let mut out = Outbox::new(1);
        assert_eq!(
            out.send(3, Header::default(), b""),
            Err(RegistryError::InvalidRank { rank: 3, size: 1 })
        );
        assert_eq!(out.send(0, big, b""), Err(RegistryError::Kind(0x100)));
        assert!(out.is_empty());
        // A packet to ourselves is served by our own handler, ping and pong.
        w.send_packet(
            proto(),
            0,
            Header {
                kind: PING,
                ..Header::default()
            },
            b"self",
        )
        .unwrap();
        assert!(
            w.progress_until(Some(Duration::from_secs(10)), |w| {
                w.protocol::<PingPong>(proto()).is_some_and(|p| p.pongs == 1)
            })
            .unwrap()
        );
        #[derive(Debug)]
        struct Other;
        impl Protocol for Other {
            fn handle(&mut self, _: Packet<'_>, _: &mut Outbox) {}
        }
        assert!(
            w.protocol::<Other>(proto()).is_none(),
            "the wrong type is not handed out"
        );
        assert!(w.unregister(proto()).is_some());
        assert!(w.protocol::<PingPong>(proto()).is_none());
    });
}

#[test]
fn a_core_alone_serves_its_protocols_and_drops_two_sided_packets() {
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
    let policy = crate::channel::WaitPolicy {
        spin: 100,
        yields: 10,
        slice: Duration::from_millis(20),
    };
    let got = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..2u32)
        .map(|r| {
            let (seg, got) = (seg.clone(), got.clone());
            std::thread::spawn(move || {
                let shm = ShmChannel::from_segment(seg, r, 2, &[0, 1], r, policy).unwrap();
                let mut core = Core::new(NemesisChannel::with_netmod(shm, None)).unwrap();
                let sink = got.clone();
                core.register(proto(), move |p: Packet<'_>, _: &mut Outbox| {
                    sink.lock().unwrap().push((p.src, p.payload.to_vec()));
                })
                .unwrap();
                if r == 0 {
                    core.send(proto(), 1, Header::default(), &[b"task"]).unwrap();
                    // A two-sided packet that no world is here to take.
                    let eager = Header {
                        kind: ProtocolId::P2P.kind(1),
                        ..Header::default()
                    };
                    core.ch.send_bytes(1, eager, b"x").unwrap();
                } else {
                    assert!(
                        core.progress_until(Some(Duration::from_secs(30)), |c| c.dropped()
                            == vec![(ProtocolId::P2P, 1)])
                            .unwrap()
                    );
                }
                core
            })
        })
        .collect();
    let cores: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got.lock().unwrap().as_slice(), &[(0, b"task".to_vec())]);
    drop(cores);
}
