//! Summaries of latency samples.

/// Percentiles of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Mean of the middle 80% (the 10th to the 90th percentile): as robust as the
    /// median to stalls, and finer than it where the clock ticks coarsely.
    pub tmean: f64,
    /// How many samples.
    pub count: usize,
}

impl Summary {
    /// Summarises `samples` (sorted in place). `None` for no samples.
    pub fn of(samples: &mut [f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        let (lo, hi) = (samples.len() / 10, samples.len() - samples.len() / 10);
        let mid = &samples[lo..hi.max(lo + 1)];
        Some(Self {
            tmean: mid.iter().sum::<f64>() / mid.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
            min: samples[0],
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            count: samples.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<f64> = (1..=101).rev().map(f64::from).collect();
        let s = Summary::of(&mut v).unwrap();
        assert_eq!(
            (s.p50, s.p99, s.min, s.mean, s.count),
            (51.0, 100.0, 1.0, 51.0, 101)
        );
        assert!(Summary::of(&mut []).is_none());
    }
}
