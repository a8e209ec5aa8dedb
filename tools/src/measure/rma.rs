//! Timing one-sided operations between the two processes of a [`Pair`], as the osu
//! one-sided benchmarks do: rank 0 is the origin, rank 1 the target, which only waits
//! in a barrier (serving requests that come as messages) until rank 0 is done.

use super::{MeasureError, OP_RMA, Pair, Result};
use nemesis::channel::NemesisChannel;
use nemesis::rma::{AccOp, Assert, Executor, LockKind, Window};
use nemesis::{P2pError, World};

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RmaOp {
    /// A put of `size` bytes (osu_put_latency).
    Put,
    /// A get of `size` bytes, waited for (osu_get_latency).
    Get,
    /// An accumulate (sum) of `size` bytes of u64 (osu_acc_latency).
    Acc,
    /// An 8-byte fetch-and-add (osu_fop_latency).
    Fop,
    /// An 8-byte compare-and-swap (osu_cas_latency).
    Cas,
    /// An exclusive lock and unlock of the target, with nothing in between.
    Lock,
    /// Windows of 16 gets of `size` bytes each, waited for together: bandwidth.
    GetBw,
    /// One get of `size` bytes consumed in parts of [`OVERLAP_PART`] bytes as they
    /// arrive ([`nemesis::rma::Ops::wait_range`]), each part crunched by [`crunch`]
    /// while the rest moves.
    GetPipelined,
    /// The same get waited for whole, then crunched part by part: what the pipelined
    /// one saves time against.
    GetSerial,
}

/// Bytes of each part a pipelined get is consumed in.
pub const OVERLAP_PART: usize = 64 << 10;

/// Passes [`crunch`] makes over each part.
pub const CRUNCH_PASSES: u32 = 8;

/// The computation on each part of the overlap tests: `passes` sums over its words.
#[inline(never)]
pub fn crunch(part: &[u64], passes: u32) -> u64 {
    let mut acc = 0u64;
    for p in 0..passes {
        for &x in part {
            acc = acc.wrapping_mul(31).wrapping_add(x ^ u64::from(p));
        }
    }
    std::hint::black_box(acc)
}

/// How each timed operation is completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RmaSync {
    /// Inside one lock epoch, each operation followed by a flush (osu's `-s lock`
    /// style with a flush per operation; fetch-and-op and compare-and-swap complete by
    /// themselves).
    Flush,
    /// Each operation followed by a fence of both processes (osu's `-s fence`).
    Fence,
}

/// The tag of the message that starts the partner.
const GO_TAG: i32 = 77;

/// Gets in flight per window of [`RmaOp::GetBw`].
pub const GET_WINDOW: usize = 16;

impl RmaOp {
    /// Every operation, by name.
    pub const ALL: [RmaOp; 9] = [
        RmaOp::Put,
        RmaOp::Get,
        RmaOp::Acc,
        RmaOp::Fop,
        RmaOp::Cas,
        RmaOp::Lock,
        RmaOp::GetBw,
        RmaOp::GetPipelined,
        RmaOp::GetSerial,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            RmaOp::Put => "put",
            RmaOp::Get => "get",
            RmaOp::Acc => "acc",
            RmaOp::Fop => "fop",
            RmaOp::Cas => "cas",
            RmaOp::Lock => "lock",
            RmaOp::GetBw => "get_bw",
            RmaOp::GetPipelined => "get_pipelined",
            RmaOp::GetSerial => "get_serial",
        }
    }

    /// The operation called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    fn code(self) -> u64 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u64
    }
}

impl RmaSync {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            RmaSync::Flush => "flush",
            RmaSync::Fence => "fence",
        }
    }
}

fn other(e: impl std::fmt::Display) -> MeasureError {
    MeasureError::Other(e.to_string())
}

impl Pair {
    /// `warmup + iters` timed operations `op` of `size` bytes from this process on the
    /// partner's window, completed as `sync` says; pushes the ticks of each of the last
    /// `iters` onto `t` (for [`RmaOp::GetBw`], of each window of [`GET_WINDOW`] gets).
    ///
    /// The window's atomics and locks are run by `executor`.
    ///
    /// # Errors
    /// [`MeasureError::Other`] for a combination that does not exist (a fence after a
    /// lock, or after an operation that completes by itself; the card as executor where
    /// the netmod has no RDMA atomics), and the layers' errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rma(
        &mut self,
        op: RmaOp,
        sync: RmaSync,
        executor: Executor,
        size: usize,
        iters: u64,
        warmup: u64,
        t: &mut Vec<u64>,
    ) -> Result<()> {
        if sync == RmaSync::Fence && !matches!(op, RmaOp::Put | RmaOp::Get | RmaOp::Acc) {
            return Err(MeasureError::Other(format!(
                "{} is not timed with fences",
                op.name()
            )));
        }
        let code =
            op.code() | u64::from(sync == RmaSync::Fence) << 8 | u64::from(executor == Executor::Nic) << 9;
        self.command(OP_RMA, [warmup + iters, size as u64, code])?;
        let clock = self.clock;
        let mut w = World::new(&mut self.ch).map_err(other)?;
        // The partner starts only now: what it sent earlier would have been taken by
        // the settling after the command.
        let c = w.comm();
        w.send(&c, 1, GO_TAG, &[]).map_err(other)?;
        run(
            &mut w,
            op,
            sync,
            executor,
            size,
            warmup + iters,
            warmup,
            Some((clock, t)),
        )
    }
}

/// The partner's side of [`Pair::rma`]; the benchmark's packets that come while its
/// world runs go to `early`.
pub(super) fn serve(
    ch: &mut NemesisChannel,
    early: &mut super::early::Stash,
    count: u64,
    size: u64,
    code: u64,
) -> Result<()> {
    let op = RmaOp::ALL
        .get((code & 0xff) as usize)
        .copied()
        .ok_or_else(|| MeasureError::Protocol(format!("one-sided op {code}")))?;
    let sync = if code >> 8 & 1 == 1 {
        RmaSync::Fence
    } else {
        RmaSync::Flush
    };
    let executor = if code >> 9 & 1 == 1 {
        Executor::Nic
    } else {
        Executor::Cpu
    };
    super::early::with_world(ch, early, |w| {
        let c = w.comm();
        w.recv(&c, 0, GO_TAG, &mut []).map_err(other)?;
        run(w, op, sync, executor, size as usize, count, 0, None)
    })
}

/// Both sides: make the window, and time from rank 0 (`timing` is its clock and
/// samples) while rank 1 waits; `count` operations, the first `warmup` untimed.
#[allow(clippy::too_many_arguments)]
fn run(
    w: &mut World<&mut NemesisChannel>,
    op: RmaOp,
    sync: RmaSync,
    executor: Executor,
    size: usize,
    count: u64,
    warmup: u64,
    mut timing: Option<(super::Clock, &mut Vec<u64>)>,
) -> Result<()> {
    let comm = w.comm();
    let origin = w.rank() == 0;
    let len = size.div_ceil(8).max(1);
    let win = Window::<u64>::allocate_with(w, &comm, len, executor).map_err(other)?;
    let src = vec![1u64; len];
    let mut dst = vec![0u64; len];
    let clock = timing.as_ref().map(|(c, _)| *c);
    let mut samples = timing.take().map(|(_, t)| t);
    let now = move || clock.map_or(0, |c| c.now());
    let mut sample = |i: u64, t0: u64| {
        if let (Some(t), Some(c)) = (samples.as_mut(), clock)
            && i >= warmup
        {
            t.push(c.now().wrapping_sub(t0));
        }
    };
    match sync {
        RmaSync::Flush if origin => match op {
            RmaOp::Lock => {
                for i in 0..count {
                    let t0 = now();
                    let ep = win.lock(w, 1, LockKind::Exclusive).map_err(other)?;
                    ep.unlock().map_err(other)?;
                    sample(i, t0);
                }
            }
            RmaOp::GetPipelined | RmaOp::GetSerial => {
                let part = (OVERLAP_PART / 8).min(len);
                let mut buf = vec![0u64; len];
                let mut lent: Option<&mut [u64]> = Some(&mut buf[..]);
                let mut ep = win.lock(w, 1, LockKind::Shared).map_err(other)?;
                for i in 0..count {
                    let t0 = now();
                    let b = lent.take().expect("lent back each time");
                    let mut g = ep.rget(b, 1, 0).map_err(other)?;
                    if op == RmaOp::GetPipelined {
                        let mut at = 0;
                        while at < len {
                            let end = (at + part).min(len);
                            crunch(ep.wait_range(&mut g, at..end).map_err(other)?, CRUNCH_PASSES);
                            at = end;
                        }
                        lent = Some(ep.wait(g).map_err(other)?);
                    } else {
                        let whole = ep.wait(g).map_err(other)?;
                        for p in whole.chunks(part) {
                            crunch(p, CRUNCH_PASSES);
                        }
                        lent = Some(whole);
                    }
                    sample(i, t0);
                }
                ep.unlock().map_err(other)?;
            }
            RmaOp::GetBw => {
                let mut bufs: Vec<Vec<u64>> = (0..GET_WINDOW).map(|_| vec![0u64; len]).collect();
                let mut lent: Vec<&mut [u64]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                let mut ep = win.lock(w, 1, LockKind::Shared).map_err(other)?;
                for i in 0..count {
                    let t0 = now();
                    let mut gets = Vec::with_capacity(GET_WINDOW);
                    for b in lent.drain(..) {
                        gets.push(ep.rget(b, 1, 0).map_err(other)?);
                    }
                    for g in gets {
                        lent.push(ep.wait(g).map_err(other)?);
                    }
                    sample(i, t0);
                }
                ep.unlock().map_err(other)?;
            }
            _ => {
                let mut ep = win.lock(w, 1, LockKind::Shared).map_err(other)?;
                for i in 0..count {
                    let t0 = now();
                    match op {
                        RmaOp::Put => {
                            ep.put(&src, 1, 0).map_err(other)?;
                            ep.flush(1).map_err(other)?;
                        }
                        RmaOp::Get => ep.read(&mut dst, 1, 0).map_err(other)?,
                        RmaOp::Acc => {
                            ep.accumulate(&src, 1, 0, AccOp::Sum).map_err(other)?;
                            ep.flush(1).map_err(other)?;
                        }
                        RmaOp::Fop => {
                            ep.fetch_and_op(1, 1, 0, AccOp::Sum).map_err(other)?;
                        }
                        RmaOp::Cas => {
                            ep.compare_and_swap(0, 0, 1, 0).map_err(other)?;
                        }
                        RmaOp::Lock | RmaOp::GetBw | RmaOp::GetPipelined | RmaOp::GetSerial => {
                            unreachable!("handled above")
                        }
                    }
                    sample(i, t0);
                }
                ep.unlock().map_err(other)?;
            }
        },
        RmaSync::Flush => {}
        RmaSync::Fence => {
            let mut ep = win.fence(w, Assert::NONE).map_err(other)?;
            for i in 0..count {
                let t0 = now();
                if origin {
                    match op {
                        RmaOp::Put => ep.put(&src, 1, 0).map_err(other)?,
                        RmaOp::Get => ep.read(&mut dst, 1, 0).map_err(other)?,
                        _ => ep.accumulate(&src, 1, 0, AccOp::Sum).map_err(other)?,
                    }
                }
                ep = ep.fence(Assert::NONE).map_err(other)?;
                sample(i, t0);
            }
            ep.end(Assert::NONE).map_err(other)?;
        }
    }
    // The target serves requests by messages while it waits here.
    w.barrier(&comm).map_err(|e: P2pError| other(e))?;
    win.free(w).map_err(other)?;
    Ok(())
}
