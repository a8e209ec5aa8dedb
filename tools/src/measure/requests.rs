//! The cost of waiting on many outstanding requests: a receiver posts `n` receives,
//! a sender (another thread of this process, on the same segment) sends `n` messages,
//! and the receiver finishes them with `test_some` over a request set, or with a scoped
//! `waitall`. Time per request should not grow with `n`.

use super::{MeasureError, Result};
use nemesis::channel::{NemesisChannel, ShmChannel, WaitPolicy};
use nemesis::shm::{Geometry, Segment};
use nemesis::{RequestSet, World};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Which way the receiver waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Owned receives in a [`RequestSet`], finished by `World::test_some`.
    TestSome,
    /// Scoped receives finished by `Scope::waitall`.
    Waitall,
}

impl Api {
    /// Both.
    pub const ALL: [Api; 2] = [Api::TestSome, Api::Waitall];

    /// Its name, as in the JSON rows.
    pub fn name(self) -> &'static str {
        match self {
            Api::TestSome => "test_some",
            Api::Waitall => "waitall",
        }
    }
}

/// One measurement: `count` requests finished through `api`.
#[derive(Debug, Clone, Copy)]
pub struct RequestsRow {
    /// How they were finished.
    pub api: Api,
    /// Requests outstanding at once.
    pub count: usize,
    /// Nanoseconds per request to post it.
    pub post_ns: f64,
    /// Nanoseconds per request from the first message sent to the last request finished.
    pub finish_ns: f64,
    /// Calls of `test_some` that finished nothing (0 for `waitall`).
    pub empty_tests: u64,
}

/// Two worlds that are threads of this process, on one anonymous segment.
fn pair() -> Result<(World, World)> {
    let seg = Arc::new(
        Segment::anonymous(2, Geometry::from_env().map_err(nemesis::ChannelError::from)?)
            .map_err(nemesis::ChannelError::from)?,
    );
    let policy = WaitPolicy {
        spin: 1000,
        yields: 100,
        slice: Duration::from_millis(10),
    };
    let world = |r| -> Result<World> {
        let shm = ShmChannel::from_segment(seg.clone(), r, 2, &[0, 1], r, policy)?;
        Ok(World::new(NemesisChannel::with_netmod(shm, None))?)
    };
    Ok((world(0)?, world(1)?))
}

/// Measures `api` with `count` requests outstanding, the best of `rounds`.
pub fn requests(api: Api, count: usize, rounds: u32) -> Result<RequestsRow> {
    let (mut sender, mut receiver) = pair()?;
    let go = Arc::new(Barrier::new(2));
    let go2 = go.clone();
    let send = std::thread::spawn(move || -> std::result::Result<(), nemesis::P2pError> {
        let c = sender.comm();
        for r in 0..rounds {
            go2.wait();
            for i in 0..count {
                sender.send(&c, 1, 0, &(i as u64 ^ u64::from(r)).to_le_bytes())?;
            }
            sender.flush(Duration::from_secs(600))?;
            go2.wait();
        }
        Ok(())
    });
    let c = receiver.comm();
    let mut best: Option<RequestsRow> = None;
    for r in 0..rounds {
        let t0 = Instant::now();
        let mut empty = 0;
        let (posted, finished) = match api {
            Api::TestSome => {
                let mut set = RequestSet::new();
                for _ in 0..count {
                    set.push(receiver.irecv(&c, 0, 0, vec![0u8; 8])?);
                }
                let posted = t0.elapsed();
                go.wait();
                let t1 = Instant::now();
                let mut next = 0u64;
                while !set.is_empty() {
                    let done = receiver.test_some(&mut set)?;
                    empty += u64::from(done.is_empty());
                    for d in done {
                        // In order: a message goes to the earliest posted receive.
                        let want = next ^ u64::from(r);
                        if d.index as u64 != next || d.buf[..] != want.to_le_bytes() {
                            return Err(MeasureError::Protocol(format!(
                                "request {} got {:?}",
                                d.index, d.buf
                            )));
                        }
                        next += 1;
                    }
                }
                (posted, t1.elapsed())
            }
            Api::Waitall => {
                let mut bufs = vec![[0u8; 8]; count];
                let mut posted = Duration::ZERO;
                let mut finished = Duration::ZERO;
                receiver.scope(|s| -> std::result::Result<(), nemesis::P2pError> {
                    let reqs = bufs
                        .iter_mut()
                        .map(|b| s.irecv(&c, 0, 0, b))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    posted = t0.elapsed();
                    go.wait();
                    let t1 = Instant::now();
                    s.waitall(reqs)?;
                    finished = t1.elapsed();
                    Ok(())
                })?;
                for (i, b) in bufs.iter().enumerate() {
                    if *b != (i as u64 ^ u64::from(r)).to_le_bytes() {
                        return Err(MeasureError::Protocol(format!("request {i} got {b:?}")));
                    }
                }
                (posted, finished)
            }
        };
        go.wait();
        let row = RequestsRow {
            api,
            count,
            post_ns: posted.as_nanos() as f64 / count as f64,
            finish_ns: finished.as_nanos() as f64 / count as f64,
            empty_tests: empty,
        };
        if best.is_none_or(|b| row.finish_ns < b.finish_ns) {
            best = Some(row);
        }
    }
    send.join()
        .map_err(|_| MeasureError::Other("the sending thread panicked".into()))??;
    best.ok_or_else(|| MeasureError::Other("no rounds".into()))
}
