//! The ceiling under a ring of fastboxes: how many records a second two pinned threads
//! stream through a ring of cache lines with no protocol above it, by record size, with
//! and without a locked add on a line of the sender's after each record (what the
//! doorbell's ring costs a sender), beside a ping-pong on one line (the probe) that says
//! whether the two CPUs share a cache. The records of one size lie back to back, so a
//! record of 32 bytes puts two in a line and one of 64 one. `--stride` spreads them
//! out instead, a record at every so many bytes, as a ring of fastboxes puts a short
//! message at the start of each box; `--prefetchw` has the sender ask for the next
//! record's first line for writing after each record, as a fastbox send prepares the
//! next box. Both ask what of the ring's shape holds a stream back.
//!
//!   cargo run --release -p nemesis-tools --example line_stream -- [--sizes 16,32,64,128] [--records N]
//!       [--rounds N] [--stride BYTES] [--prefetchw] [--near-below NS] [--json]
//!
//! Each round measures the probe, then every size without and with the locked add; the
//! medians are taken per size, way and placement over the rounds.

use nemesis_tools::measure::{pair_cpus, pin_to};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A cache line of words.
#[repr(C, align(64))]
#[derive(Default)]
struct Line([AtomicU64; 8]);

/// Words in the ring: 256 KiB, more than a CPU's first-level cache and less than its
/// second.
const WORDS: usize = 1 << 15;
/// The longest record, and the widest stride: the ring holds at least twice
/// [`ACK_EVERY`] records, so that the sender never waits for an acknowledgement that
/// the receiver gives only after records the sender has no room for.
const MAX_STRIDE: usize = WORDS * 8 / (2 * ACK_EVERY as usize);
/// The receiver says how far it has read once per this many records, as a window's
/// acknowledgement would.
const ACK_EVERY: u64 = 64;
/// Round trips of one batch of the probe, and batches: the probe is the fastest batch's,
/// so that a batch the scheduler interrupted does not count.
const PROBE_TRIPS: u64 = 4_000;
const PROBE_BATCHES: usize = 5;

struct Shared {
    ring: Box<[Line]>,
    /// How many records the receiver has read, as it last said.
    read: Line,
    /// The probe's line.
    probe: Line,
    /// The line the sender's locked adds go to, as a doorbell's.
    bell: Line,
}

impl Shared {
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.ring[i / 8 % (WORDS / 8)].0[i % 8]
    }
}

struct Args {
    sizes: Vec<usize>,
    /// Bytes from one record's start to the next's; 0: the record's size.
    stride: usize,
    prefetchw: bool,
    records: u64,
    rounds: usize,
    near_below: f64,
    json: bool,
}

const USAGE: &str = "usage: line_stream [--sizes 16,32,64,128] [--records N] [--rounds N] [--stride BYTES]
                   [--prefetchw] [--near-below NS] [--json]
  --sizes       record sizes in bytes, multiples of 8 from 16 to 2048 (default 16,32,64,128)
  --stride      bytes from one record's start to the next's, a multiple of 64 up to 2048 and
                at least every size (default: each size, records back to back); 1152 is where
                a ring of fastboxes puts consecutive short messages
  --prefetchw   after each record the sender asks for the next one's first line for writing,
                as a fastbox send prepares the next box (x86-64 CPUs with PREFETCHW)
  --records     records per stream (default 4000000)
  --rounds      rounds, each with its probe (default 5)
  --near-below  the probe's one-way ns below which the CPUs count as sharing a cache (default 130)
  --json        one JSON object per size, way and placement";

fn parse() -> Result<Args, String> {
    let mut a = Args {
        sizes: vec![16, 32, 64, 128],
        stride: 0,
        prefetchw: false,
        records: 4_000_000,
        rounds: 5,
        near_below: 130.0,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--json" => a.json = true,
            "--sizes" => {
                a.sizes = value("--sizes")?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--sizes {s:?}: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
                if let Some(s) = a
                    .sizes
                    .iter()
                    .find(|&&s| !(16..=MAX_STRIDE).contains(&s) || s % 8 != 0)
                {
                    return Err(format!(
                        "--sizes: {s} is not a multiple of 8 from 16 to {MAX_STRIDE}"
                    ));
                }
            }
            "--stride" => {
                a.stride = value("--stride")?.parse().map_err(|e| format!("--stride: {e}"))?;
                if a.stride == 0 || a.stride % 64 != 0 || a.stride > MAX_STRIDE {
                    return Err(format!(
                        "--stride: {} is not a multiple of 64 up to {MAX_STRIDE}",
                        a.stride
                    ));
                }
            }
            "--prefetchw" => {
                if !has_prefetchw() {
                    return Err("--prefetchw: this CPU has no PREFETCHW".into());
                }
                a.prefetchw = true;
            }
            "--records" => {
                a.records = value("--records")?
                    .parse()
                    .map_err(|e| format!("--records: {e}"))?;
                if a.records < ACK_EVERY {
                    return Err(format!("--records: at least {ACK_EVERY}"));
                }
            }
            "--rounds" => {
                a.rounds = value("--rounds")?.parse().map_err(|e| format!("--rounds: {e}"))?;
                if a.rounds == 0 {
                    return Err("--rounds: at least 1".into());
                }
            }
            "--near-below" => {
                a.near_below = value("--near-below")?
                    .parse()
                    .map_err(|e| format!("--near-below: {e}"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(s) = a.sizes.iter().find(|&&s| a.stride != 0 && s > a.stride) {
        return Err(format!("--stride: {} is shorter than the size {s}", a.stride));
    }
    Ok(a)
}

/// Runs `far` on a thread pinned to `cpus.1` and `near` here, pinned to `cpus.0`, once
/// the thread is pinned and running: a thread made on this CPU would otherwise wait out
/// this one's time slice, inside what `near` times.
fn on_both<T: Send + 'static>(
    cpus: (usize, usize),
    far: impl FnOnce() -> T + Send + 'static,
    near: impl FnOnce(),
) -> T {
    let ready = Arc::new(AtomicBool::new(false));
    let set = Arc::clone(&ready);
    let t = std::thread::spawn(move || {
        // A failed pin leaves the thread where the scheduler puts it; the probe says where.
        let _ = pin_to(cpus.1);
        set.store(true, Ordering::Release);
        far()
    });
    let _ = pin_to(cpus.0);
    while !ready.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    near();
    t.join().expect("the partner thread panicked")
}

/// One-way nanoseconds of a ping-pong on one line, the fastest of a few batches.
fn probe(s: &Arc<Shared>, cpus: (usize, usize)) -> f64 {
    (0..PROBE_BATCHES)
        .map(|_| probe_batch(s, cpus))
        .fold(f64::INFINITY, f64::min)
}

/// One batch of the probe: this side writes odd counts, the other answers each with the
/// next even one.
fn probe_batch(s: &Arc<Shared>, cpus: (usize, usize)) -> f64 {
    let word = |s: &Shared| -> *const AtomicU64 { &s.probe.0[0] };
    s.probe.0[0].store(0, Ordering::Relaxed);
    let other = Arc::clone(s);
    let mut ns = 0.0;
    on_both(
        cpus,
        move || {
            // SAFETY: the word lives in `other`, which this closure owns.
            let w = unsafe { &*word(&other) };
            for i in 0..PROBE_TRIPS {
                while w.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                w.store(2 * i + 2, Ordering::Release);
            }
        },
        || {
            let w = &s.probe.0[0];
            let t = Instant::now();
            for i in 0..PROBE_TRIPS {
                w.store(2 * i + 1, Ordering::Release);
                while w.load(Ordering::Acquire) != 2 * i + 2 {
                    std::hint::spin_loop();
                }
            }
            ns = t.elapsed().as_nanos() as f64 / PROBE_TRIPS as f64 / 2.0;
        },
    );
    ns
}

/// How one stream lays out and sends its records.
#[derive(Clone, Copy)]
struct Way {
    size: usize,
    /// Bytes from a record's start to the next's, at least `size`.
    stride: usize,
    locked: bool,
    prefetchw: bool,
}

/// Records a second of one stream of `records` records laid out and sent as `way`
/// says. Each record's first word is its number plus one, stored last with Release; the
/// receiver waits for it with Acquire, then reads the rest.
fn stream(s: &Arc<Shared>, cpus: (usize, usize), way: Way, records: u64) -> f64 {
    let Way {
        size,
        stride,
        locked,
        prefetchw,
    } = way;
    let per = size / 8;
    let step = stride / 8;
    let slots = (WORDS / step) as u64;
    for l in s.ring.iter() {
        for w in &l.0 {
            w.store(0, Ordering::Relaxed);
        }
    }
    s.read.0[0].store(0, Ordering::Relaxed);
    let other = Arc::clone(s);
    let mut rate = 0.0;
    let sum = on_both(
        cpus,
        move || {
            let mut sum = 0u64;
            for i in 0..records {
                let at = (i % slots) as usize * step;
                while other.word(at).load(Ordering::Acquire) != i + 1 {
                    std::hint::spin_loop();
                }
                for k in 1..per {
                    sum = sum.wrapping_add(other.word(at + k).load(Ordering::Relaxed));
                }
                if i % ACK_EVERY == ACK_EVERY - 1 {
                    other.read.0[0].store(i + 1, Ordering::Release);
                }
            }
            sum
        },
        || {
            let t = Instant::now();
            let mut read = 0;
            for i in 0..records {
                // A record's slot is free once the receiver has said it read the one a
                // lap before.
                while i + ACK_EVERY >= read + slots {
                    read = s.read.0[0].load(Ordering::Acquire);
                }
                let at = (i % slots) as usize * step;
                for k in 1..per {
                    s.word(at + k).store(i, Ordering::Relaxed);
                }
                s.word(at).store(i + 1, Ordering::Release);
                if prefetchw {
                    prefetch_for_write(s.word(((i + 1) % slots) as usize * step));
                }
                if locked {
                    s.bell.0[0].fetch_add(4, Ordering::AcqRel);
                }
            }
            rate = records as f64 / t.elapsed().as_secs_f64();
        },
    );
    std::hint::black_box(sum);
    rate
}

/// Whether the CPU has PREFETCHW (CPUID 8000_0001h, ECX bit 8).
fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86_64 CPU (the call is safe on newer compilers).
        #[allow(unused_unsafe)]
        let (max, ecx) = unsafe { (__cpuid(0x8000_0000).eax, __cpuid(0x8000_0001).ecx) };
        max >= 0x8000_0001 && ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks for the line of `w` for writing, without waiting for it.
#[inline(always)]
fn prefetch_for_write(w: &AtomicU64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW reads and writes nothing the program can see and does not
    // fault; `--prefetchw` is refused where the CPU lacks it.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) w.as_ptr(), options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("line_stream: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let Some(cpus) = pair_cpus() else {
        eprintln!("line_stream: needs two CPUs to run on");
        std::process::exit(1);
    };
    let s = Arc::new(Shared {
        ring: (0..WORDS / 8).map(|_| Line::default()).collect(),
        read: Line::default(),
        probe: Line::default(),
        bell: Line::default(),
    });
    // (placement, size, locked) -> the rounds' rates, and each placement's probes.
    let mut rates: BTreeMap<(&str, usize, bool), Vec<f64>> = BTreeMap::new();
    let mut probes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 1..=a.rounds {
        let p = probe(&s, cpus);
        let place = if p < a.near_below { "near" } else { "far" };
        probes.entry(place).or_default().push(p);
        let mut said = format!(
            "line_stream: round {round}/{}: probe {p:.0} ns ({place}); million records/s",
            a.rounds
        );
        for &size in &a.sizes {
            let mut both = [0.0; 2];
            for (locked, r) in [false, true].into_iter().zip(&mut both) {
                let way = Way {
                    size,
                    stride: if a.stride == 0 { size } else { a.stride },
                    locked,
                    prefetchw: a.prefetchw,
                };
                *r = stream(&s, cpus, way, a.records);
                rates.entry((place, size, locked)).or_default().push(*r);
            }
            said += &format!(", {size} B {:.1} ({:.1} locked)", both[0] / 1e6, both[1] / 1e6);
        }
        eprintln!("{said}");
    }
    if !a.json {
        println!(
            "# records a second through a ring of lines between two pinned threads (cpus {} and {}); {}{}",
            cpus.0,
            cpus.1,
            if a.stride == 0 {
                "records back to back".to_string()
            } else {
                format!("a record every {} bytes", a.stride)
            },
            if a.prefetchw {
                ", the next record's line prefetched for writing"
            } else {
                ""
            }
        );
        println!("#  bytes  placement  rounds  probe ns       plain   locked add   locked/plain");
    }
    for &place in &["near", "far"] {
        let Some(pr) = probes.get_mut(place) else { continue };
        let probe_ns = median(pr);
        let n = pr.len();
        for &size in &a.sizes {
            let plain = median(rates.get_mut(&(place, size, false)).expect("measured"));
            let locked = median(rates.get_mut(&(place, size, true)).expect("measured"));
            if a.json {
                println!(
                    "{{\"bench\":\"line_stream\",\"record_bytes\":{size},\"stride_bytes\":{},\"prefetchw\":{},\"placement\":\"{place}\",\"rounds\":{n},\"probe_ns\":{probe_ns:.1},\"records_per_s\":{plain:.0},\"locked_add_records_per_s\":{locked:.0},\"locked_ratio\":{:.3}}}",
                    if a.stride == 0 { size } else { a.stride },
                    a.prefetchw,
                    locked / plain
                );
            } else {
                println!(
                    "{size:>8}  {place:>9}  {n:>6}  {probe_ns:>8.0}  {plain:>10.0}  {locked:>11.0}  {:>13.2}",
                    locked / plain
                );
            }
        }
    }
}
