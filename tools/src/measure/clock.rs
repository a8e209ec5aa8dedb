//! A cheap clock for timing single round trips: the TSC on x86-64, calibrated against
//! the monotonic clock, and the monotonic clock elsewhere.

use std::time::{Duration, Instant};

/// Ticks and their length.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    ns_per_tick: f64,
    #[cfg(not(target_arch = "x86_64"))]
    base: Instant,
}

impl Clock {
    /// Measures the tick length over about 20 ms.
    pub fn calibrate() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let mut c = Self { ns_per_tick: 1.0 };
            let (t0, i0) = (c.now(), Instant::now());
            while i0.elapsed() < Duration::from_millis(20) {
                std::hint::spin_loop();
            }
            let (t1, i1) = (c.now(), Instant::now());
            c.ns_per_tick = (i1 - i0).as_nanos() as f64 / (t1.wrapping_sub(t0)).max(1) as f64;
            c
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self {
                ns_per_tick: 1.0,
                base: Instant::now(),
            }
        }
    }

    /// The current tick.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: RDTSC is available on every x86-64 processor and has no preconditions.
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.base.elapsed().as_nanos() as u64
        }
    }

    /// Nanoseconds in `ticks`.
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick
    }
}
