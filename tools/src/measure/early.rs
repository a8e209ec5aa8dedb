//! The partner's worlds, and the parent's commands that reach them.
//!
//! The parent sends its next command as soon as it has left its own world, while the
//! partner's world may still be polling (a flush, a window being freed). Unregistered,
//! the benchmark's protocol would be dropped there and the pair would wait for each
//! other for ever; so every world the partner makes keeps such packets, in order, for
//! the partner's loop to take before any others.

use super::{MeasureError, Result};
use nemesis::channel::NemesisChannel;
use nemesis::progress::{Outbox, Protocol, ProtocolId};
use nemesis::{Header, Packet, World};
use std::collections::VecDeque;
use std::time::Duration;

/// Packets of the benchmark's own protocol, kept in order.
pub(super) type Stash = VecDeque<(Header, Vec<u8>)>;

/// The protocol that keeps them while a world runs.
#[derive(Debug, Default)]
struct Keep(Stash);

impl Protocol for Keep {
    fn handle(&mut self, p: Packet<'_>, _: &mut Outbox) {
        self.0.push_back((p.header, p.payload.to_vec()));
    }
}

/// How long the world waits for what it sent before it is dropped.
const FLUSH: Duration = Duration::from_secs(10);

/// Runs `f` with a world on `ch` that keeps the benchmark's packets, and adds them to
/// `early`. The world is flushed before the packets are taken, so that its drop has
/// nothing left to poll for.
pub(super) fn with_world<T>(
    ch: &mut NemesisChannel,
    early: &mut Stash,
    f: impl FnOnce(&mut World<&mut NemesisChannel>) -> Result<T>,
) -> Result<T> {
    let other = |e: nemesis::P2pError| MeasureError::Other(e.to_string());
    let mut w = World::new(ch).map_err(other)?;
    w.register(ProtocolId::BENCH, Keep::default())
        .map_err(|e| MeasureError::Other(e.to_string()))?;
    let r = f(&mut w);
    let flushed = w.flush(FLUSH).map_err(other);
    if let Some(k) = w.protocol_mut::<Keep>(ProtocolId::BENCH) {
        early.append(&mut k.0);
    }
    let v = r?;
    flushed?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nemesis::channel::Channel;
    use nemesis::shm::{Geometry, Segment};
    use nemesis::{NemesisChannel, ShmChannel, WaitPolicy};
    use std::sync::Arc;

    const POLICY: WaitPolicy = WaitPolicy {
        spin: 64,
        yields: 16,
        slice: std::time::Duration::from_millis(1),
    };

    fn pair() -> (NemesisChannel, NemesisChannel) {
        let seg = Arc::new(Segment::anonymous(2, Geometry::default()).unwrap());
        let mk = |r| {
            let shm = ShmChannel::from_segment(seg.clone(), r, 2, &[0, 1], r, POLICY);
            NemesisChannel::with_netmod(shm.unwrap(), None)
        };
        (mk(0), mk(1))
    }

    /// A command sent while the partner's world runs comes out of `early`, in order,
    /// and the world's own messages still arrive.
    #[test]
    fn a_command_sent_during_the_world_is_kept() {
        let (mut a, mut b) = pair();
        let cmd = |n: u32| Header {
            kind: ProtocolId::BENCH.kind(1),
            aux: n,
            ..Header::default()
        };
        a.send_bytes(1, cmd(1), b"one").unwrap();
        a.send_bytes(1, cmd(2), b"two").unwrap();
        let mut early = Stash::new();
        let t = std::thread::spawn(move || {
            let mut w = World::new(&mut a).unwrap();
            let c = w.comm();
            w.send(&c, 1, 5, b"hello").unwrap();
        });
        let got = with_world(&mut b, &mut early, |w| {
            let c = w.comm();
            let mut buf = [0u8; 8];
            let st = w
                .recv(&c, 0, 5, &mut buf)
                .map_err(|e| MeasureError::Other(e.to_string()))?;
            Ok(buf[..st.len].to_vec())
        })
        .unwrap();
        t.join().unwrap();
        assert_eq!(got, b"hello");
        let kept: Vec<_> = early.iter().map(|(h, d)| (h.aux, d.clone())).collect();
        assert_eq!(kept, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    }
}
