//! The harness of `scripts/icount.sh`: repeats one 8-byte channel send plus the matching
//! receive, with the message already arrived, inside one function that callgrind counts;
//! or, for `stream`, windows of 64 non-blocking sends and pre-posted receives.
//!
//! Both ends live in this process, on one anonymous segment, so nothing spins or waits
//! and the count is the same on every run.
//!
//! The one-sided counts (`rma-put`: an 8-byte put and its flush; `rma-fop`: an 8-byte
//! fetch-and-add; `rma-lock`: an exclusive lock and its unlock) run rank 0 on this
//! thread against a window that rank 1, on another thread, made with it and then leaves
//! alone: the target of an allocated window takes no part.

use nemesis::rma::{AccOp, LockKind, Window};
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
                if let Ok(r) = sb.irecv(cb, 0, 1, buf) {
                    recvs.push(r);
                }
            }
            let mut sends = Vec::with_capacity(WINDOW);
            for _ in 0..WINDOW {
                if let Ok(r) = sa.isend(ca, 1, 1, msg) {
                    sends.push(r);
                }
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

/// One 8-byte put into rank 1's memory and the flush that completes it.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_rma_put(ep: &mut nemesis::rma::LockEpoch<'_, '_, u64>, msg: &[u64; 1]) -> usize {
    match ep.put(msg, 1, 0).and_then(|_| ep.flush(1)) {
        Ok(()) => 1,
        Err(_) => 0,
    }
}

/// One 8-byte fetch-and-add on rank 1's memory.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_rma_fop(ep: &mut nemesis::rma::LockEpoch<'_, '_, u64>) -> usize {
    ep.fetch_and_op(1, 1, 0, AccOp::Sum).map_or(0, |_| 1)
}

/// An exclusive lock of rank 1 and its unlock.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn nemesis_icount_rma_lock(w: &mut World, win: &Window<u64>) -> usize {
    match win.lock(w, 1, LockKind::Exclusive).and_then(|ep| ep.unlock()) {
        Ok(()) => 1,
        Err(_) => 0,
    }
}

/// Runs `ops` of the one-sided count `what` as rank 0 against rank 1 on `b`'s thread;
/// returns how many succeeded.
fn rma(what: &str, a: NemesisChannel, b: NemesisChannel, ops: u64) -> u64 {
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let target = std::thread::spawn(move || {
        let mut w = World::new(b).expect("world 1");
        let c = w.comm();
        let win = Window::<u64>::allocate(&mut w, &c, 1).expect("window 1");
        // Rank 1 takes no part in what rank 0 counts: it waits here, asleep.
        let _ = done_rx.recv();
        w.barrier(&c).expect("barrier 1");
        win.free(&mut w).expect("free 1");
    });
    let mut w = World::new(a).expect("world 0");
    let c = w.comm();
    let win = Window::<u64>::allocate(&mut w, &c, 1).expect("window 0");
    let mut ok = 0u64;
    match what {
        "rma-lock" => {
            for _ in 0..ops {
                ok += nemesis_icount_rma_lock(&mut w, &win) as u64;
            }
        }
        _ => {
            let mut ep = win.lock(&mut w, 1, LockKind::Shared).expect("lock");
            for _ in 0..ops {
                ok += if what == "rma-put" {
                    nemesis_icount_rma_put(&mut ep, &[7])
                } else {
                    nemesis_icount_rma_fop(&mut ep)
                } as u64;
            }
            ep.unlock().expect("unlock");
        }
    }
    let _ = done_tx.send(());
    w.barrier(&c).expect("barrier 0");
    win.free(&mut w).expect("free 0");
    target.join().expect("rank 1");
    ok
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
        "rma-put" | "rma-fop" | "rma-lock" => {
            let ok = rma(what.as_str(), a, b, ops);
            if ok != ops {
                eprintln!("icount: {ok} of {ops} one-sided operations succeeded");
                std::process::exit(1);
            }
            println!("{ops} ops");
            return;
        }
        other => {
            eprintln!(
                "icount: unknown layer {other:?} (expected: channel, p2p, stream, channel-stream, rma-put, rma-fop or rma-lock)"
            );
            std::process::exit(2);
        }
    }
    if delivered as u64 != ops || into != msg {
        eprintln!("icount: delivered {delivered} of {ops}");
        std::process::exit(1);
    }
    println!("{ops} ops");
}
