//! The harness of `scripts/icount.sh`: repeats one 8-byte channel send plus the matching
//! receive, with the message already arrived, inside one function that callgrind counts.
//!
//! Both ends live in this process, on one anonymous segment, so nothing spins or waits
//! and the count is the same on every run.

use nemesis::shm::region::copy_into;
use nemesis::shm::{Geometry, Segment};
use nemesis::{Channel, Comm, Header, NemesisChannel, ShmChannel, WaitPolicy, World};
use std::sync::Arc;
use std::time::Duration;

/// One 8-byte send from `a` to `b` and its receive into `into`.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_channel_op(
    a: &mut NemesisChannel,
    b: &mut NemesisChannel,
    msg: &[u8; 8],
    into: &mut [u8; 8],
) -> usize {
    let h = Header {
        tag: 1,
        ..Header::default()
    };
    if a.send_bytes(1, h, msg).is_err() {
        return 0;
    }
    b.poll(|p| {
        copy_into(into, p.payload);
    })
    .unwrap_or(0)
}

/// One 8-byte two-sided send from `a` to `b` and the matching blocking receive.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_p2p_op(
    a: &mut World,
    b: &mut World,
    ca: &Comm,
    cb: &Comm,
    msg: &[u8; 8],
    into: &mut [u8; 8],
) -> usize {
    if a.send(ca, 1, 1, msg).is_err() {
        return 0;
    }
    b.recv(cb, 0, 1, into).map_or(0, |s| s.len / 8)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "channel".into());
    let ops: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).expect("segment"));
    let policy = WaitPolicy {
        spin: 0,
        yields: 0,
        slice: Duration::from_millis(1),
    };
    // The channel `nemesis::init()` gives, over a segment of this process.
    let channel = |seg, r| {
        let shm = ShmChannel::from_segment(seg, r, 2, &[0, 1], r, policy).expect("rank");
        NemesisChannel::with_netmod(shm, None)
    };
    let mut a = channel(seg.clone(), 0);
    let mut b = channel(seg, 1);
    let msg = 0x0102_0304_0506_0708u64.to_le_bytes();
    let mut into = [0u8; 8];
    let mut delivered = 0;
    match what.as_str() {
        "channel" => {
            for _ in 0..ops {
                delivered += nemesis_icount_channel_op(&mut a, &mut b, &msg, &mut into);
            }
        }
        "p2p" => {
            let mut wa = World::new(a).expect("world 0");
            let mut wb = World::new(b).expect("world 1");
            let (ca, cb) = (wa.comm(), wb.comm());
            for _ in 0..ops {
                delivered += nemesis_icount_p2p_op(&mut wa, &mut wb, &ca, &cb, &msg, &mut into);
            }
        }
        other => {
            eprintln!("icount: unknown layer {other:?} (expected: channel or p2p)");
            std::process::exit(2);
        }
    }
    if delivered as u64 != ops || into != msg {
        eprintln!("icount: delivered {delivered} of {ops}");
        std::process::exit(1);
    }
    println!("{ops} ops");
}
