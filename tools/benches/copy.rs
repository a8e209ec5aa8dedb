//! Copies between two page-aligned buffers, the destination 0, 16, 24, 32 or 64 bytes
//! further into its page than the source: `memcpy` against
//! `nemesis_shm::copy::copy_large`, which every copy of the ring, the pair buffer and the
//! cells goes through. On CPUs whose `rep movsb` is slow when the destination is 1 to 31
//! bytes ahead (AMD Zen 3), `memcpy` at +16 and +24 runs at a twentieth of its speed and
//! `copy_large` does not; elsewhere the two should match. The kernel's copies into and
//! out of sockets use the same instruction, which is why tcp frames are padded.

use criterion::{BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;

/// A buffer of `len` bytes starting `off` bytes into a page.
fn at_offset(v: &mut Vec<u8>, len: usize, off: usize) -> *mut u8 {
    v.resize(len + 8192, 0x5a);
    let base = v.as_mut_ptr();
    // SAFETY: the page boundary found is within the first 4096 bytes, and `off + len`
    // more fit in the 8192 spare.
    unsafe { base.add(base.align_offset(4096) + off) }
}

fn copies(c: &mut Criterion) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for ahead in [0usize, 16, 24, 32, 64] {
        let mut g = c.benchmark_group(format!("copy_dst_ahead_{ahead}"));
        for len in [4096usize, 65536, 262144] {
            let src = at_offset(&mut a, len, 0).cast_const();
            let dst = at_offset(&mut b, len, ahead);
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |bch, &len| {
                // SAFETY: both hold `len` bytes, in different vectors.
                bch.iter(|| unsafe { std::ptr::copy_nonoverlapping(black_box(src), black_box(dst), len) });
            });
            g.bench_with_input(BenchmarkId::new("copy_large", len), &len, |bch, &len| {
                // SAFETY: as above.
                bch.iter(|| unsafe { nemesis_shm::copy::copy_large(black_box(src), black_box(dst), len) });
            });
        }
        g.finish();
    }
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    copies(&mut c);
    c.final_summary();
}
