//! The harness of `scripts/icount.sh stream-phases`: the window of `icount stream` (64
//! pre-posted 8-byte receives, 64 sends, each side waiting for all of its window), with
//! each step a function of its own, so that callgrind can say what each costs.
//!
//! A binary of its own: sharing the library's generic code with `icount`'s window would
//! change how the compiler inlines it there, and with it the figure `stream` reports.

use nemesis::p2p::{Request, Scope};
use nemesis::shm::{Geometry, Segment};
use nemesis::{Comm, NemesisChannel, ShmChannel, WaitPolicy, World};
use std::sync::Arc;
use std::time::Duration;

/// Messages per window, as in `icount`.
const WINDOW: usize = 64;

/// One window; returns the bytes received.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_phases(
    a: &mut World,
    b: &mut World,
    ca: &Comm,
    cb: &Comm,
    msg: &[u8; 8],
    into: &mut [[u8; 8]; WINDOW],
) -> usize {
    b.scope(|sb| {
        a.scope(|sa| {
            let recvs = nemesis_icount_stream_irecvs(sb, cb, into);
            let sends = nemesis_icount_stream_isends(sa, ca, msg);
            let sent = nemesis_icount_stream_send_waitall(sa, sends);
            let got = nemesis_icount_stream_recv_waitall(sb, recvs);
            if sent == WINDOW { got } else { 0 }
        })
    })
}

/// The receiver posts its window.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_irecvs<'s>(
    sb: &'s Scope<'s, '_, NemesisChannel>,
    cb: &Comm,
    into: &'s mut [[u8; 8]; WINDOW],
) -> Vec<Request<'s>> {
    let mut recvs = Vec::with_capacity(WINDOW);
    for buf in into.iter_mut() {
        if let Ok(r) = sb.irecv(cb, 0, 1, buf) {
            recvs.push(r);
        }
    }
    recvs
}

/// The sender starts its window.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_isends<'s>(
    sa: &'s Scope<'s, '_, NemesisChannel>,
    ca: &Comm,
    msg: &'s [u8; 8],
) -> Vec<Request<'s>> {
    let mut sends = Vec::with_capacity(WINDOW);
    for _ in 0..WINDOW {
        if let Ok(r) = sa.isend(ca, 1, 1, msg) {
            sends.push(r);
        }
    }
    sends
}

/// The sender waits for its window; returns how many sends finished.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_send_waitall<'s>(
    sa: &'s Scope<'s, '_, NemesisChannel>,
    sends: Vec<Request<'s>>,
) -> usize {
    sa.waitall(sends).map_or(0, |d| d.len())
}

/// The receiver waits for its window, and so polls, matches and copies it; returns the
/// bytes received.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_stream_recv_waitall<'s>(
    sb: &'s Scope<'s, '_, NemesisChannel>,
    recvs: Vec<Request<'s>>,
) -> usize {
    sb.waitall(recvs)
        .map_or(0, |d| d.iter().map(|d| d.status().len).sum())
}

fn main() {
    let ops: u64 = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 6400,
        Some(Ok(n)) if n > 0 && n % WINDOW as u64 == 0 => n,
        Some(_) => {
            eprintln!("icount_phases: OPS must be a positive multiple of {WINDOW}");
            std::process::exit(2);
        }
    };
    let seg = Arc::new(Segment::anonymous(2, Geometry::default()).expect("segment"));
    // Nothing waits in this harness: both ends live on this thread.
    let policy = WaitPolicy {
        spin: 0,
        yields: 0,
        slice: Duration::from_millis(1),
    };
    let world = |seg, r| {
        let shm = ShmChannel::from_segment(seg, r, 2, &[0, 1], r, policy).expect("rank");
        World::new(NemesisChannel::with_netmod(shm, None)).expect("world")
    };
    let mut wa = world(seg.clone(), 0);
    let mut wb = world(seg, 1);
    let (ca, cb) = (wa.comm(), wb.comm());
    let msg = 0x0102_0304_0506_0708u64.to_le_bytes();
    let mut bufs = [[0u8; 8]; WINDOW];
    let mut delivered = 0;
    for _ in 0..ops / WINDOW as u64 {
        delivered += nemesis_icount_stream_phases(&mut wa, &mut wb, &ca, &cb, &msg, &mut bufs) / 8;
    }
    if delivered as u64 != ops || bufs[WINDOW - 1] != msg {
        eprintln!("icount_phases: {delivered} of {ops} messages arrived");
        std::process::exit(1);
    }
    println!("{ops} ops");
}
