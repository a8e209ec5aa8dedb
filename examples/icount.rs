//! The harness of `scripts/icount.sh`: repeats one 8-byte channel send plus the matching
//! receive, with the message already arrived, inside one function that callgrind counts;
//! or, for `stream`, windows of 64 non-blocking sends and pre-posted receives.
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

/// Messages per window of the streaming count.
const WINDOW: usize = 64;

/// One window of the streaming count: `b` posts `WINDOW` 8-byte receives, `a` starts as
/// many sends, and both wait for all of theirs, as osu_bw's inner loop does. Returns the
/// bytes received.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_window(
    a: &mut World,
    b: &mut World,
    ca: &Comm,
    cb: &Comm,
    msg: &[u8; 8],
    into: &mut [[u8; 8]; WINDOW],
) -> usize {
    b.scope(|sb| {
        a.scope(|sa| {
            let mut recvs = Vec::with_capacity(WINDOW);
            for buf in into.iter_mut() {
                recvs.extend(sb.irecv(cb, 0, 1, buf).ok());
            }
            let mut sends = Vec::with_capacity(WINDOW);
            for _ in 0..WINDOW {
                sends.extend(sa.isend(ca, 1, 1, msg).ok());
            }
            let sent = sa.waitall(sends).map_or(0, |d| d.len());
            let got = sb
                .waitall(recvs)
                .map_or(0, |d| d.iter().map(|d| d.status().len).sum());
            if sent == WINDOW { got } else { 0 }
        })
    })
}

/// The channel's own streaming: `WINDOW` 8-byte packets sent, then all received.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_channel_window(
    a: &mut NemesisChannel,
    b: &mut NemesisChannel,
    msg: &[u8; 8],
    into: &mut [[u8; 8]; WINDOW],
) -> usize {
    let h = Header {
        tag: 1,
        ..Header::default()
    };
    let sent = (0..WINDOW).filter(|_| a.send_bytes(1, h, msg).is_ok()).count();
    let mut got = 0;
    while got < sent {
        match b.poll(|p| {
            copy_into(&mut into[got % WINDOW], p.payload);
            got += 1;
        }) {
            Ok(_) => {}
            Err(_) => return 0,
        }
    }
    got * 8
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
        "channel-stream" => {
            let mut bufs = [[0u8; 8]; WINDOW];
            if ops % WINDOW as u64 != 0 {
                eprintln!("icount: channel-stream counts whole windows of {WINDOW} messages");
                std::process::exit(2);
            }
            for _ in 0..ops / WINDOW as u64 {
                delivered += nemesis_icount_channel_window(&mut a, &mut b, &msg, &mut bufs) / 8;
            }
            into = bufs[WINDOW - 1];
        }
        "stream" => {
            let mut wa = World::new(a).expect("world 0");
            let mut wb = World::new(b).expect("world 1");
            let (ca, cb) = (wa.comm(), wb.comm());
            let mut bufs = [[0u8; 8]; WINDOW];
            if ops % WINDOW as u64 != 0 {
                eprintln!("icount: stream counts whole windows of {WINDOW} messages");
                std::process::exit(2);
            }
            for _ in 0..ops / WINDOW as u64 {
                delivered += nemesis_icount_stream_window(&mut wa, &mut wb, &ca, &cb, &msg, &mut bufs) / 8;
            }
            into = bufs[WINDOW - 1];
        }
        other => {
            eprintln!("icount: unknown layer {other:?} (expected: channel, p2p, stream or channel-stream)");
            std::process::exit(2);
        }
    }
    if delivered as u64 != ops || into != msg {
        eprintln!("icount: delivered {delivered} of {ops}");
        std::process::exit(1);
    }
    println!("{ops} ops");
}
