//! A 2-D halo exchange: Jacobi iterations of the heat equation on a grid split into
//! tiles, one per rank, each exchanging its edges with its four neighbours every
//! iteration (non-blocking sends and receives), with an allreduce of the residual now
//! and then. The pattern of layered ocean models, which is sensitive to both latency
//! and bandwidth.
//!
//! ```text
//! target/release/nemesis-run -n 4 target/release/examples/halo [--tile N] [--iters K] [--check]
//! ```
//!
//! `--check` gathers the grid at rank 0 and compares it, bit for bit, with the same
//! iterations computed by one process.

use nemesis::{Comm, Op, P2pError, World};
use std::time::Instant;

const USAGE: &str = "usage: halo [--tile N] [--iters K] [--check]
  --tile N   rows and columns of each rank's tile (default 64)
  --iters K  Jacobi iterations (default 1000)
  --check    compare the result with a single-process run at rank 0";

/// Directions a message travels, used as tags.
const UP: i32 = 0;
const DOWN: i32 = 1;
const LEFT: i32 = 2;
const RIGHT: i32 = 3;

struct Args {
    tile: usize,
    iters: u32,
    check: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        tile: 64,
        iters: 1000,
        check: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |what: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{what} needs a positive whole number"))
        };
        match arg.as_str() {
            "--tile" => a.tile = num("--tile")?.min(1 << 14) as usize,
            "--iters" => a.iters = num("--iters")?.min(u64::from(u32::MAX)) as u32,
            "--check" => a.check = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// The most square `px x py = n`.
fn grid_of(n: u32) -> (u32, u32) {
    let mut px = (f64::from(n).sqrt() as u32).max(1);
    while n % px != 0 {
        px -= 1;
    }
    (px, n / px)
}

/// One Jacobi sweep over the interior of a `(rows + 2) x (cols + 2)` array whose outer
/// ring holds boundary or halo values.
fn sweep(cur: &[f64], next: &mut [f64], rows: usize, cols: usize) -> f64 {
    let w = cols + 2;
    let mut diff = 0.0;
    for i in 1..=rows {
        for j in 1..=cols {
            let v = 0.25
                * (cur[(i - 1) * w + j] + cur[(i + 1) * w + j] + cur[i * w + j - 1] + cur[i * w + j + 1]);
            let d = v - cur[i * w + j];
            diff += d * d;
            next[i * w + j] = v;
        }
    }
    diff
}

/// The fixed boundary: the top edge of the whole grid is hot.
fn boundary(grid: &mut [f64], cols: usize) {
    grid[1..=cols].fill(1.0);
}

struct Tile {
    rows: usize,
    cols: usize,
    /// Neighbours' ranks in the directions up, down, left, right.
    nbr: [Option<u32>; 4],
}

fn exchange(world: &mut World, comm: &Comm, t: &Tile, g: &mut [f64]) -> Result<(), P2pError> {
    let (rows, cols, w) = (t.rows, t.cols, t.cols + 2);
    // Rows are contiguous; columns are packed.
    let col = |g: &[f64], j: usize| -> Vec<f64> { (1..=rows).map(|i| g[i * w + j]).collect() };
    let sends: [Vec<f64>; 4] = [
        g[w + 1..w + 1 + cols].to_vec(),
        g[rows * w + 1..rows * w + 1 + cols].to_vec(),
        col(g, 1),
        col(g, cols),
    ];
    let mut recvs: [Vec<f64>; 4] = [vec![0.0; cols], vec![0.0; cols], vec![0.0; rows], vec![0.0; rows]];
    // What travels towards each neighbour, and what arrives from it.
    let out_tag = [UP, DOWN, LEFT, RIGHT];
    let in_tag = [DOWN, UP, RIGHT, LEFT];
    world.scope(|s| {
        let mut reqs = Vec::new();
        for (d, buf) in recvs.iter_mut().enumerate() {
            if let Some(n) = t.nbr[d] {
                reqs.push(s.irecv(comm, n, in_tag[d], bytemuck::cast_slice_mut(buf))?);
            }
        }
        for (d, buf) in sends.iter().enumerate() {
            if let Some(n) = t.nbr[d] {
                reqs.push(s.isend(comm, n, out_tag[d], bytemuck::cast_slice(buf))?);
            }
        }
        s.waitall(reqs).map(|_| ())
    })?;
    if t.nbr[0].is_some() {
        g[1..=cols].copy_from_slice(&recvs[0]);
    }
    if t.nbr[1].is_some() {
        g[(rows + 1) * w + 1..(rows + 1) * w + 1 + cols].copy_from_slice(&recvs[1]);
    }
    for i in 1..=rows {
        if t.nbr[2].is_some() {
            g[i * w] = recvs[2][i - 1];
        }
        if t.nbr[3].is_some() {
            g[i * w + cols + 1] = recvs[3][i - 1];
        }
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), P2pError> {
    let mut world = nemesis::init()?;
    let comm = world.comm();
    let (me, n) = (world.rank(), world.size());
    let (px, py) = grid_of(n);
    let (x, y) = ((me % px) as usize, (me / px) as usize);
    let rank_at = |x: usize, y: usize| (y as u32) * px + x as u32;
    let t = Tile {
        rows: a.tile,
        cols: a.tile,
        nbr: [
            (y > 0).then(|| rank_at(x, y - 1)),
            (y + 1 < py as usize).then(|| rank_at(x, y + 1)),
            (x > 0).then(|| rank_at(x - 1, y)),
            (x + 1 < px as usize).then(|| rank_at(x + 1, y)),
        ],
    };
    let w = t.cols + 2;
    let mut cur = vec![0.0f64; (t.rows + 2) * w];
    if t.nbr[0].is_none() {
        boundary(&mut cur, t.cols);
    }
    let mut next = cur.clone();
    world.barrier(&comm)?;
    let start = Instant::now();
    let mut residual = [0.0f64];
    for it in 0..a.iters {
        exchange(&mut world, &comm, &t, &mut cur)?;
        let diff = sweep(&cur, &mut next, t.rows, t.cols);
        std::mem::swap(&mut cur, &mut next);
        if it % 10 == 9 || it + 1 == a.iters {
            residual = [diff];
            world.allreduce(&comm, &mut residual, Op::Sum)?;
        }
    }
    let elapsed = start.elapsed();
    let mut total = [cur.iter().sum::<f64>()];
    world.allreduce(&comm, &mut total, Op::Sum)?;
    if me == 0 {
        let per = elapsed.as_secs_f64() * 1e6 / f64::from(a.iters);
        println!(
            "{n} ranks as {px}x{py} tiles of {0}x{0}: {1} iterations in {elapsed:.3?}, {per:.2} us each; \
             residual {2:.3e}",
            a.tile,
            a.iters,
            residual[0].sqrt()
        );
    }
    if a.check {
        check(&mut world, &comm, a, &t, (px, py), &cur)?;
    }
    Ok(())
}

/// Gathers the tiles at rank 0 and compares them with one process's iterations.
fn check(
    world: &mut World,
    comm: &Comm,
    a: &Args,
    t: &Tile,
    (px, py): (u32, u32),
    cur: &[f64],
) -> Result<(), P2pError> {
    let w = t.cols + 2;
    let mine: Vec<f64> = (1..=t.rows)
        .flat_map(|i| cur[i * w + 1..i * w + 1 + t.cols].to_vec())
        .collect();
    let n = (px * py) as usize;
    let mut all = if world.rank() == 0 {
        vec![0.0; mine.len() * n]
    } else {
        Vec::new()
    };
    world.gather(comm, 0, &mine, &mut all)?;
    if world.rank() != 0 {
        return Ok(());
    }
    let (rows, cols) = (t.rows * py as usize, t.cols * px as usize);
    let gw = cols + 2;
    let mut g = vec![0.0f64; (rows + 2) * gw];
    boundary(&mut g, cols);
    let mut h = g.clone();
    for _ in 0..a.iters {
        sweep(&g, &mut h, rows, cols);
        std::mem::swap(&mut g, &mut h);
    }
    for r in 0..n {
        let (x, y) = (r % px as usize, r / px as usize);
        let tile = &all[r * mine.len()..(r + 1) * mine.len()];
        for i in 0..t.rows {
            for j in 0..t.cols {
                let want = g[(y * t.rows + i + 1) * gw + x * t.cols + j + 1];
                let got = tile[i * t.cols + j];
                if want.to_bits() != got.to_bits() {
                    eprintln!("halo: rank {r} cell ({i},{j}) is {got}, one process computes {want}");
                    std::process::exit(1);
                }
            }
        }
    }
    println!("check: the {rows}x{cols} grid matches a single-process run bit for bit");
    Ok(())
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("halo: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!("halo: {e}");
        std::process::exit(1);
    }
}
