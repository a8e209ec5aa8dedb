//! Where a two-sided stream's window spends its time, step by step on each side: what
//! `nemesis-bench msgrate --phases` reports. Instruction counts (`scripts/icount.sh
//! stream-phases`) say what each step executes; these say how long it takes with the
//! other process running, which is what decides which side holds the stream back.

use super::{MeasureError, Result};
use std::time::Instant;

/// How long each step of a window took, in nanoseconds: each the median over the
/// windows of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamPhases {
    /// The sender's non-blocking sends.
    pub send_isends_ns: f64,
    /// The sender's waitall on them.
    pub send_waitall_ns: f64,
    /// The sender's wait for the receiver's acknowledgement of the window.
    pub send_ack_wait_ns: f64,
    /// The receiver's posting of the window's receives.
    pub recv_irecvs_ns: f64,
    /// The receiver's waitall on them: the polls, matches and copies it drives, and any
    /// wait for messages not yet sent.
    pub recv_waitall_ns: f64,
    /// The receiver's send of the acknowledgement.
    pub recv_ack_ns: f64,
}

impl StreamPhases {
    /// Each step with its JSON key, sender's first.
    pub fn named(&self) -> [(&'static str, f64); 6] {
        [
            ("send_isends_ns", self.send_isends_ns),
            ("send_waitall_ns", self.send_waitall_ns),
            ("send_ack_wait_ns", self.send_ack_wait_ns),
            ("recv_irecvs_ns", self.recv_irecvs_ns),
            ("recv_waitall_ns", self.recv_waitall_ns),
            ("recv_ack_ns", self.recv_ack_ns),
        ]
    }

    /// The phases of a sender's and a receiver's [`Steps`] medians.
    pub(crate) fn of(send: [f64; 3], recv: [f64; 3]) -> Self {
        Self {
            send_isends_ns: send[0],
            send_waitall_ns: send[1],
            send_ack_wait_ns: send[2],
            recv_irecvs_ns: recv[0],
            recv_waitall_ns: recv[1],
            recv_ack_ns: recv[2],
        }
    }
}

/// One side's three step times, window by window. A step may come round more than once
/// in a window (a receiver that posts a long window in parts); its times add up.
#[derive(Debug)]
pub(crate) struct Steps {
    times: [Vec<u64>; 3],
    window: [u64; 3],
    last: Instant,
}

impl Steps {
    pub(crate) fn new(windows: u64) -> Self {
        let n = usize::try_from(windows).unwrap_or(0);
        Self {
            times: std::array::from_fn(|_| Vec::with_capacity(n)),
            window: [0; 3],
            last: Instant::now(),
        }
    }

    /// A window starts now.
    pub(crate) fn start(&mut self) {
        self.window = [0; 3];
        self.last = Instant::now();
    }

    /// Step `i` (0 to 2) ended now; the next starts.
    pub(crate) fn mark(&mut self, i: usize) {
        let now = Instant::now();
        let ns = u64::try_from(now.duration_since(self.last).as_nanos()).unwrap_or(u64::MAX);
        self.window[i] = self.window[i].saturating_add(ns);
        self.last = now;
    }

    /// The window ended: its times are kept.
    pub(crate) fn end(&mut self) {
        for (v, t) in self.times.iter_mut().zip(self.window) {
            v.push(t);
        }
    }

    /// Forgets the windows so far (the warm-up's).
    pub(crate) fn clear(&mut self) {
        self.times.iter_mut().for_each(Vec::clear);
    }

    /// Each step's median over the windows, in nanoseconds (0 where none ended).
    pub(crate) fn medians(&self) -> [f64; 3] {
        std::array::from_fn(|i| {
            let mut v = self.times[i].clone();
            v.sort_unstable();
            v.get(v.len() / 2).map_or(0.0, |&t| t as f64)
        })
    }
}

/// The three medians as the receiver sends them back: little-endian `f64`s.
pub(crate) fn encode(m: [f64; 3]) -> [u8; 24] {
    let mut b = [0u8; 24];
    for (chunk, v) in b.chunks_exact_mut(8).zip(m) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The medians [`encode`] made, from a message of `len` bytes in `b`.
pub(crate) fn decode(b: &[u8; 24], len: usize) -> Result<[f64; 3]> {
    if len != b.len() {
        return Err(MeasureError::Protocol(format!(
            "the receiver's step times came in {len} bytes, not {}",
            b.len()
        )));
    }
    let mut m = [0.0; 3];
    for (v, chunk) in m.iter_mut().zip(b.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(chunk);
        *v = f64::from_le_bytes(a);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_within_a_window_and_forget_the_warm_up() {
        let ms = std::time::Duration::from_millis;
        let mut s = Steps::new(4);
        s.start();
        std::thread::sleep(ms(30));
        s.mark(0);
        s.end();
        s.clear();
        for _ in 0..3 {
            s.start();
            // Step 1 twice, 2 ms each time: 4 ms in the window.
            for _ in 0..2 {
                s.mark(0);
                std::thread::sleep(ms(2));
                s.mark(1);
            }
            s.mark(2);
            s.end();
        }
        let m = s.medians();
        // The warm-up's 30 ms are gone; the sleeps are in step 1 and nowhere else.
        assert!(m[0] < 1e6, "{m:?}");
        assert!(m[1] >= 4e6, "{m:?}");
        assert!(m[2] < 1e6, "{m:?}");
        assert_eq!(Steps::new(0).medians(), [0.0; 3]);
    }

    #[test]
    fn medians_cross_the_wire_and_a_short_message_is_refused() {
        let m = [1.5, 2250.0, 0.0];
        assert_eq!(decode(&encode(m), 24).unwrap(), m);
        assert!(matches!(decode(&encode(m), 20), Err(MeasureError::Protocol(_))));
    }
}
