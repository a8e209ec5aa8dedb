//! A token passed round a ring of processes, which may outnumber the CPUs: this process
//! is rank 0, the others are started from this executable. The job stays up for every
//! round, so that a caller can interleave each round with the placement probe.

use super::{
    KIND_DATA, KIND_DONE, MeasureError, Pair, RING_VAR, ROLE_VAR, Result, allowed_cpus, data, end_job,
    pin_to, set_cpus, start_job,
};
use crate::launch::Job;
use nemesis::channel::{Channel, Header, NemesisChannel};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Rounds every rank of the ring runs.
const ROUNDS_VAR: &str = "NEMESIS_MEASURE_RING_ROUNDS";
/// Set when each rank pins itself to CPU `rank % cpus`.
const PIN_VAR: &str = "NEMESIS_MEASURE_RING_PIN";

/// A ring of processes, ready to run its rounds.
#[derive(Debug)]
pub struct Ring {
    job: Option<Job>,
    ch: NemesisChannel,
    procs: u32,
    messages: u64,
    rounds: u32,
    done: u32,
    /// This process's CPUs before the ring, given back at the end.
    cpus: Vec<usize>,
}

impl Ring {
    /// Starts `procs` processes (this one rank 0) that will pass a token `messages`
    /// times round the ring in each of `rounds` rounds, on the CPUs `cpus` (the
    /// machine's, taken before anything pinned this process); with `pin`, rank `r` runs
    /// on the `r % n`-th of the `n` of them.
    pub fn start(procs: u32, messages: u64, rounds: u32, cpus: &[usize], pin: bool) -> Result<Self> {
        if procs < 2 {
            return Err(MeasureError::Other("a ring needs at least 2 processes".into()));
        }
        // The ranks start with this process's CPUs, and decide from them how to wait
        // (spin, or sleep when oversubscribed): they must be the machine's.
        let before = allowed_cpus();
        if !cpus.is_empty() {
            set_cpus(cpus);
        }
        let mut env = vec![
            (ROLE_VAR.into(), "ring".into()),
            (RING_VAR.into(), messages.to_string().into()),
            (ROUNDS_VAR.into(), rounds.to_string().into()),
        ];
        if pin && !cpus.is_empty() {
            env.push((PIN_VAR.into(), join(cpus).into()));
        }
        let started = start_job(procs, env);
        // Pinned only once the job is up, as the other ranks pin themselves once joined.
        let pinned = match (&started, pin && !cpus.is_empty()) {
            (Ok(_), true) => {
                pin_to(cpus[0]).map_err(|e| MeasureError::Other(format!("pinning to cpu {}: {e}", cpus[0])))
            }
            _ => {
                set_cpus(&before);
                Ok(())
            }
        };
        let (job, ch) = started?;
        pinned?;
        Ok(Self {
            job: Some(job),
            ch,
            procs,
            messages,
            rounds,
            done: 0,
            cpus: before,
        })
    }

    /// Processes in the ring.
    pub fn procs(&self) -> u32 {
        self.procs
    }

    /// Runs the next round; returns the time from the first send to the last arrival.
    pub fn round(&mut self) -> Result<Duration> {
        if self.done == self.rounds {
            return Err(MeasureError::Other(format!(
                "the ring ran its {} rounds",
                self.rounds
            )));
        }
        self.done += 1;
        let mut alive = Pair::alive_check(&mut self.job);
        run(&mut self.ch, self.messages, &mut alive)
    }

    /// Waits for the other ranks to leave (after every round has run) and gives this
    /// process its CPUs back.
    pub fn finish(mut self) -> Result<()> {
        while self.done < self.rounds {
            self.round()?;
        }
        let r = end_job(self.job.take().expect("job"), Duration::from_secs(60));
        if !self.cpus.is_empty() {
            set_cpus(&self.cpus);
        }
        r
    }
}

fn join(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The role of every rank but 0.
pub(super) fn rank() -> Result<()> {
    let var = |name: &str| -> Result<u64> {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| MeasureError::Other(format!("{name} is not set")))
    };
    let (messages, rounds) = (var(RING_VAR)?, var(ROUNDS_VAR)?);
    let mut ch = NemesisChannel::init()?;
    if let Ok(list) = std::env::var(PIN_VAR) {
        let cpus: Vec<usize> = list.split(',').filter_map(|c| c.parse().ok()).collect();
        if !cpus.is_empty() {
            let cpu = cpus[ch.rank() as usize % cpus.len()];
            pin_to(cpu).map_err(|e| MeasureError::Other(format!("pinning to cpu {cpu}: {e}")))?;
        }
    }
    // Rank 0 is our parent: its death kills us (parent-death signal).
    for _ in 0..rounds {
        run(&mut ch, messages, &mut || Ok(()))?;
    }
    ch.flush(Duration::from_secs(30))?;
    Ok(())
}

/// One round: `m` hops, each rank checking that every hop it sees arrives once and in
/// order. Rank 0 hears the end from whoever makes the last hop.
fn run(ch: &mut NemesisChannel, m: u64, alive: &mut dyn FnMut() -> Result<()>) -> Result<Duration> {
    let (r, n) = (ch.rank() as u64, ch.size() as u64);
    let mine = if r == 0 {
        m / n
    } else {
        m / n + u64::from(m % n >= r)
    };
    let mut next = if r == 0 { n } else { r };
    let mut inbox = VecDeque::new();
    let start = Instant::now();
    if r == 0 && m >= 1 {
        ch.send_bytes(1, data(), &1u64.to_le_bytes())?;
    }
    let mut got = 0;
    let mut done = r != 0 || m % n == 0;
    while got < mine || !done {
        let (h, value) = next_packet(ch, &mut inbox, alive)?;
        match h.kind {
            KIND_DATA => {
                if value != next {
                    return Err(MeasureError::Protocol(format!(
                        "rank {r} got hop {value}, expected {next}"
                    )));
                }
                got += 1;
                next += n;
                if value < m {
                    ch.send_bytes(((value + 1) % n) as u32, data(), &(value + 1).to_le_bytes())?;
                } else if r != 0 {
                    let done = Header {
                        kind: KIND_DONE,
                        ..Header::default()
                    };
                    ch.send_bytes(0, done, &[])?;
                }
            }
            KIND_DONE if r == 0 => done = true,
            _ => return Err(MeasureError::Protocol(format!("rank {r} got {h:?}"))),
        }
    }
    Ok(start.elapsed())
}

/// The next packet, and the hop number it carries: from what an earlier poll brought,
/// or from the channel, waiting as it says.
fn next_packet(
    ch: &mut NemesisChannel,
    inbox: &mut VecDeque<(Header, u64)>,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<(Header, u64)> {
    let mut last_check = Instant::now();
    loop {
        if let Some(p) = inbox.pop_front() {
            return Ok(p);
        }
        ch.poll(|p| {
            let mut word = [0u8; 8];
            let n = p.payload.len().min(8);
            word[..n].copy_from_slice(&p.payload[..n]);
            inbox.push_back((p.header, u64::from_le_bytes(word)));
        })?;
        if !inbox.is_empty() {
            continue;
        }
        ch.wait(Some(Duration::from_secs(1)))?;
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            alive()?;
        }
    }
}
