//! Which strategy a transfer uses: automatic by availability and size, or forced with
//! `NEMESIS_LMT` for benchmarking.

use crate::{LmtError, Strategy};
use nemesis_shm::ring::RingGeometry;

/// Default ring: slots × bytes per slot. Measured with `nemesis-bench calibrate` on a
/// Zen 5 guest: a 512 KiB ring (8 × 64 KiB) stays in the core's cache, and moved 16 MiB
/// at 32–35 GB/s where a 1 MiB one (8 × 128 KiB) moved 14–16 (BENCHMARKS.md).
pub const DEFAULT_RING: RingGeometry = RingGeometry {
    slots: 8,
    slot_size: 64 << 10,
};

/// Below this many bytes, automatic selection moves data in chunks through the queue
/// cells even when a single-copy strategy is possible: the system call and the page
/// walks of CMA cost more than the second copy of a small message.
pub const AUTO_CMA_MIN: usize = 32 << 10;

/// The strategies automatic selection tries from [`AUTO_CMA_MIN`] bytes up, best first,
/// unless `NEMESIS_LMT_AUTO` says: the copy ring, whose two processes copy at once a
/// slot apart, moved 3–4 times what CMA's kernel copy did at every size from 64 KiB to
/// 16 MiB, in latency and in bandwidth, on the machines measured (BENCHMARKS.md).
pub const DEFAULT_AUTO: &[Strategy] = &[Strategy::Ring, Strategy::Cma];

/// From this many bytes up, a message to a peer on another node goes by RDMA read when
/// the netmod offers RDMA (`NEMESIS_LMT_RDMA_MIN`); below it, in packets. Measured in
/// the Soft-RoCE VM over rc (BENCHMARKS.md): below it the registrations and the read's
/// round trip cost more than sending a few packets (16 KiB: 1.0 ms against 0.73 ms a
/// ping-pong); at 64 KiB the two are level in latency and bandwidth, and above it the
/// read wins (256 KiB: 8.0 ms against 8.7; 4 MiB streamed: 36 MB/s against 30).
pub const DEFAULT_RDMA_MIN: usize = 64 << 10;

/// The most strategies an automatic order names.
const AUTO_MAX: usize = 4;

/// The order automatic selection tries strategies in (chunks, the fallback, after them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoOrder {
    order: [Strategy; AUTO_MAX],
    len: usize,
}

impl AutoOrder {
    /// An order of up to four strategies; `None` if there are more, or chunks among them
    /// (it is always last), or one twice.
    pub fn new(order: &[Strategy]) -> Option<Self> {
        if order.len() > AUTO_MAX || order.contains(&Strategy::Chunks) {
            return None;
        }
        for (i, s) in order.iter().enumerate() {
            if order[..i].contains(s) {
                return None;
            }
        }
        let mut o = [Strategy::Chunks; AUTO_MAX];
        o[..order.len()].copy_from_slice(order);
        Some(Self {
            order: o,
            len: order.len(),
        })
    }

    /// The strategies, best first.
    pub fn as_slice(&self) -> &[Strategy] {
        &self.order[..self.len]
    }
}

impl Default for AutoOrder {
    fn default() -> Self {
        Self::new(DEFAULT_AUTO).expect("a valid order")
    }
}

/// Bytes one CMA system call moves at most, so a huge transfer leaves room for other
/// traffic between calls.
pub const CMA_STEP: usize = 4 << 20;

/// How transfers are chosen, read from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The strategy `NEMESIS_LMT` forces, or `None` for automatic selection.
    pub force: Option<Strategy>,
    /// Shape of each copy ring (`NEMESIS_LMT_RING_SLOTS`, `NEMESIS_LMT_RING_SLOT_SIZE`).
    pub ring: RingGeometry,
    /// What automatic selection tries, best first (`NEMESIS_LMT_AUTO`).
    pub auto: AutoOrder,
    /// From how many bytes a message to another node goes by RDMA read, or `None` for
    /// never (`NEMESIS_LMT_RDMA_MIN`).
    pub rdma_min: Option<usize>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            force: None,
            ring: DEFAULT_RING,
            auto: AutoOrder::default(),
            rdma_min: Some(DEFAULT_RDMA_MIN),
        }
    }
}

impl Policy {
    /// The strategies automatic selection tries for `len` bytes, best first (chunks, the
    /// fallback, after them).
    pub fn auto_order(&self, len: usize) -> &[Strategy] {
        if len >= AUTO_CMA_MIN {
            self.auto.as_slice()
        } else {
            &[]
        }
    }

    /// Whether a message of `len` bytes to a peer on another node goes by RDMA read
    /// when the netmod offers it: forced, or automatic and at least `rdma_min` bytes.
    pub fn rdma_for(&self, len: usize) -> bool {
        match self.force {
            Some(Strategy::Rdma) => true,
            Some(_) => false,
            None => self.rdma_min.is_some_and(|m| len >= m),
        }
    }
}

impl Policy {
    /// Reads `NEMESIS_LMT`, `NEMESIS_LMT_AUTO`, `NEMESIS_LMT_RING_SLOTS`,
    /// `NEMESIS_LMT_RING_SLOT_SIZE` and `NEMESIS_LMT_RDMA_MIN`.
    pub fn from_env() -> Result<Self, LmtError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Policy::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, LmtError> {
        let mut p = Policy::default();
        if let Some(v) = get("NEMESIS_LMT").filter(|v| !v.trim().is_empty()) {
            let v = v.trim().to_ascii_lowercase();
            p.force = match v.as_str() {
                "auto" => None,
                name => Some(
                    Strategy::ALL
                        .into_iter()
                        .find(|s| s.name() == name)
                        .ok_or_else(|| LmtError::Config {
                            var: "NEMESIS_LMT",
                            value: v.clone(),
                            reason: "expected auto, chunks, cma, cma-put, ring, vmsplice or rdma".into(),
                        })?,
                ),
            };
        }
        if let Some(v) = get("NEMESIS_LMT_AUTO").filter(|v| !v.trim().is_empty()) {
            let bad = |reason: &str| LmtError::Config {
                var: "NEMESIS_LMT_AUTO",
                value: v.clone(),
                reason: reason.into(),
            };
            let order = v
                .split(',')
                .map(|n| {
                    let n = n.trim().to_ascii_lowercase();
                    Strategy::ALL
                        .into_iter()
                        .find(|s| s.name() == n && !matches!(s, Strategy::Chunks | Strategy::Rdma))
                        .ok_or_else(|| bad("expected strategies from cma, cma-put, ring and vmsplice, best first, such as ring,cma"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            p.auto = AutoOrder::new(&order).ok_or_else(|| bad("each strategy at most once"))?;
        }
        let size = |var: &'static str, default: u32, what: &str| -> Result<u32, LmtError> {
            match get(var).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => nemesis_shm::config::parse_size(&v)
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| LmtError::Config {
                        var,
                        value: v,
                        reason: format!("expected {what}"),
                    }),
            }
        };
        p.ring.slots = size(
            "NEMESIS_LMT_RING_SLOTS",
            DEFAULT_RING.slots,
            "a slot count from 1 to 1024",
        )?;
        if p.ring.slots > 1024 {
            return Err(LmtError::Config {
                var: "NEMESIS_LMT_RING_SLOTS",
                value: p.ring.slots.to_string(),
                reason: "at most 1024 slots".into(),
            });
        }
        let slot = size(
            "NEMESIS_LMT_RING_SLOT_SIZE",
            DEFAULT_RING.slot_size,
            "a size such as 64K, a multiple of 4K up to 64M",
        )?;
        if slot % 4096 != 0 || slot > 64 << 20 {
            return Err(LmtError::Config {
                var: "NEMESIS_LMT_RING_SLOT_SIZE",
                value: slot.to_string(),
                reason: "a multiple of 4096 bytes, at most 64M".into(),
            });
        }
        p.ring.slot_size = slot;
        if let Some(v) = get("NEMESIS_LMT_RDMA_MIN").filter(|v| !v.trim().is_empty()) {
            p.rdma_min = if v.trim().eq_ignore_ascii_case("off") {
                None
            } else {
                Some(
                    nemesis_shm::config::parse_size(&v)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| LmtError::Config {
                            var: "NEMESIS_LMT_RDMA_MIN",
                            value: v.clone(),
                            reason: "expected a size such as 32K, or off".into(),
                        })?,
                )
            };
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Policy, LmtError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Policy::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_forcing_and_ring_shape() {
        assert_eq!(parse(&[]).unwrap(), Policy::default());
        assert_eq!(parse(&[("NEMESIS_LMT", "auto")]).unwrap().force, None);
        for s in Strategy::ALL {
            assert_eq!(parse(&[("NEMESIS_LMT", s.name())]).unwrap().force, Some(s));
        }
        let p = parse(&[
            ("NEMESIS_LMT_RING_SLOTS", "4"),
            ("NEMESIS_LMT_RING_SLOT_SIZE", "1M"),
        ])
        .unwrap();
        assert_eq!((p.ring.slots, p.ring.slot_size), (4, 1 << 20));
        let p = parse(&[("NEMESIS_LMT_AUTO", "vmsplice, CMA")]).unwrap();
        assert_eq!(p.auto_order(1 << 20), &[Strategy::Vmsplice, Strategy::Cma]);
        assert_eq!(p.auto_order(AUTO_CMA_MIN - 1), &[] as &[Strategy]);
        assert_eq!(Policy::default().auto_order(1 << 20), DEFAULT_AUTO);
        let d = Policy::default();
        assert!(d.rdma_for(DEFAULT_RDMA_MIN) && !d.rdma_for(DEFAULT_RDMA_MIN - 1));
        assert!(
            !parse(&[("NEMESIS_LMT_RDMA_MIN", "off")])
                .unwrap()
                .rdma_for(1 << 30)
        );
        assert!(parse(&[("NEMESIS_LMT_RDMA_MIN", "0")]).unwrap().rdma_for(1));
        assert!(parse(&[("NEMESIS_LMT", "rdma")]).unwrap().rdma_for(1));
        assert!(!parse(&[("NEMESIS_LMT", "ring")]).unwrap().rdma_for(1 << 30));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("NEMESIS_LMT_AUTO", "ring,ring"),
            ("NEMESIS_LMT_AUTO", "ring,chunks"),
            ("NEMESIS_LMT_AUTO", "rdma"),
            ("NEMESIS_LMT", "rdma-read"),
            ("NEMESIS_LMT_RDMA_MIN", "big"),
            ("NEMESIS_LMT_RING_SLOTS", "0"),
            ("NEMESIS_LMT_RING_SLOTS", "5000"),
            ("NEMESIS_LMT_RING_SLOT_SIZE", "1000"),
            ("NEMESIS_LMT_RING_SLOT_SIZE", "lots"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
        }
    }
}
