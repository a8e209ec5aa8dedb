//! Which strategy a transfer uses: automatic by availability and size, or forced with
//! `NEMESIS_LMT` for benchmarking.
//!
//! Which strategy is fastest depends on the machine: on a Zen 5 guest the copy ring moved
//! three times what CMA did at every size, on an Intel Xeon guest CMA moved 1.3–1.8 times
//! what the ring did up to 1 MiB and the ring won from 4 MiB (BENCHMARKS.md). So the
//! automatic order can change with the size (`NEMESIS_LMT_AUTO=cma,ring;4M:ring,cma`),
//! and `nemesis-bench calibrate` measures a machine and prints the value to set.

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

/// The strategies automatic selection tries from [`AUTO_CMA_MIN`] bytes up to
/// [`DEFAULT_SPLIT_FROM`], best first, unless `NEMESIS_LMT_AUTO` says, on CPUs other than
/// Intel's: the copy ring, whose two processes copy at once a slot apart, moved 3–4 times
/// what CMA's kernel copy did at every size from 64 KiB to 16 MiB, in latency and in
/// bandwidth, on the Zen 5 guests measured (BENCHMARKS.md). Below [`DEFAULT_SPLIT_FROM`]
/// it serves only a stream's medium messages when asked for (`NEMESIS_STREAM_MEDIUM_LIMIT`).
pub const DEFAULT_AUTO: &[Strategy] = &[Strategy::Ring, Strategy::Cma];

/// The order on CPUs other than Intel's from [`DEFAULT_SPLIT_FROM`] bytes up: on a 2-vCPU
/// AMD EPYC guest (family 25, model 1), both processes copying by CMA at once moved 1.2–2
/// times what the ring did in osu_bw from 256 KiB to 16 MiB, and a ping-pong took a third
/// to two fifths of the ring's time; `nemesis-bench calibrate` put it first from 1 MiB in
/// four runs of four (BENCHMARKS.md). The Zen 5 guests were measured before it existed.
pub const DEFAULT_AUTO_LARGE: &[Strategy] = &[Strategy::CmaSplit, Strategy::Ring, Strategy::Cma];

/// Where [`DEFAULT_AUTO_LARGE`] takes over from [`DEFAULT_AUTO`]: the two-sided layer's
/// default medium limit, above which a message goes by rendezvous unless forced.
pub const DEFAULT_SPLIT_FROM: usize = 128 << 10;

/// The default order on Intel CPUs: on the Intel Xeon guests measured (2 and 16 CPUs),
/// `nemesis-bench calibrate` put CMA ahead of the ring from 256 KiB to 4 MiB, and to
/// 16 MiB on the larger; with both processes copying at once, CMA moved 1.6–2.4 times
/// what one did from 256 KiB to 16 MiB on the smaller, and 1.2 times at 64 KiB
/// (BENCHMARKS.md).
pub const INTEL_AUTO: &[Strategy] = &[Strategy::CmaSplit, Strategy::Cma, Strategy::Ring];

/// The default automatic selection for this machine's CPU: by its vendor, as measured.
/// Every process of a node reads the same. `nemesis-bench calibrate` finds a better one,
/// by size, for a machine of its own.
pub fn default_auto() -> AutoBands {
    // Built once, not on every default policy (a channel without strategies of its own
    // builds one for each large message).
    static BANDS: std::sync::OnceLock<AutoBands> = std::sync::OnceLock::new();
    *BANDS.get_or_init(|| auto_for_vendor(&nemesis_shm::cpu::vendor()))
}

fn auto_for_vendor(vendor: &[u8; 12]) -> AutoBands {
    let order = |s| AutoOrder::new(s).expect("a valid order");
    if vendor == b"GenuineIntel" {
        AutoBands::single(order(INTEL_AUTO))
    } else {
        AutoBands::new(&[
            (0, order(DEFAULT_AUTO)),
            (DEFAULT_SPLIT_FROM, order(DEFAULT_AUTO_LARGE)),
        ])
        .expect("two bands, increasing")
    }
}

/// From this many bytes up, a message to a peer on another node goes by RDMA read when
/// the netmod offers RDMA (`NEMESIS_LMT_RDMA_MIN`); below it, in packets. Measured in
/// the Soft-RoCE VM over rc (BENCHMARKS.md): below it the registrations and the read's
/// round trip cost more than sending a few packets (16 KiB: 1.0 ms against 0.73 ms a
/// ping-pong); at 64 KiB the two are level in latency and bandwidth, and above it the
/// read wins (256 KiB: 8.0 ms against 8.7; 4 MiB streamed: 36 MB/s against 30).
pub const DEFAULT_RDMA_MIN: usize = 64 << 10;

/// The most strategies an automatic order names: every one between processes of a node.
const AUTO_MAX: usize = 5;

/// The most size bands an automatic selection has.
pub const AUTO_BANDS_MAX: usize = 8;

/// The order automatic selection tries strategies in (chunks, the fallback, after them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoOrder {
    order: [Strategy; AUTO_MAX],
    len: usize,
}

impl AutoOrder {
    /// No strategy: chunks alone. What unused bands hold.
    const NONE: Self = Self {
        order: [Strategy::Chunks; AUTO_MAX],
        len: 0,
    };

    /// An order of up to five strategies; `None` if there are more, or chunks among them
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

impl std::fmt::Display for AutoOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, s) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(s.name())?;
        }
        Ok(())
    }
}

/// Automatic orders by message size: each band's order holds from its first size up to
/// the next band's (`NEMESIS_LMT_AUTO`, written `ORDER[;SIZE:ORDER]...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBands {
    /// (first size, order), by increasing size; the first band starts at 0.
    bands: [(usize, AutoOrder); AUTO_BANDS_MAX],
    len: usize,
}

impl AutoBands {
    /// Bands from `(first size, order)` pairs; `None` unless the first starts at 0, the
    /// sizes increase and there are at most [`AUTO_BANDS_MAX`].
    pub fn new(bands: &[(usize, AutoOrder)]) -> Option<Self> {
        if bands.is_empty() || bands.len() > AUTO_BANDS_MAX || bands[0].0 != 0 {
            return None;
        }
        if bands.windows(2).any(|w| w[1].0 <= w[0].0) {
            return None;
        }
        let mut b = [(0, AutoOrder::NONE); AUTO_BANDS_MAX];
        b[..bands.len()].copy_from_slice(bands);
        Some(Self {
            bands: b,
            len: bands.len(),
        })
    }

    /// One order for every size.
    pub fn single(order: AutoOrder) -> Self {
        Self::new(&[(0, order)]).expect("one band from 0")
    }

    /// The order for a message of `len` bytes.
    pub fn order_for(&self, len: usize) -> &AutoOrder {
        let bands = &self.bands[..self.len];
        let i = bands.iter().rposition(|&(from, _)| from <= len).unwrap_or(0);
        &bands[i].1
    }

    /// The bands, by increasing first size.
    pub fn as_slice(&self) -> &[(usize, AutoOrder)] {
        &self.bands[..self.len]
    }

    /// Reads the `ORDER[;SIZE:ORDER]...` form of `NEMESIS_LMT_AUTO`.
    fn parse(v: &str) -> Result<Self, String> {
        let mut bands = Vec::new();
        for (i, part) in v.split(';').enumerate() {
            let (from, order) = match part.split_once(':') {
                None if i == 0 => (0, part),
                None => {
                    return Err(format!(
                        "band {part:?} needs the size it starts at, as in 4M:ring"
                    ));
                }
                Some(_) if i == 0 => return Err("the first band starts at 0 and takes no size".into()),
                Some((size, order)) => {
                    let from = nemesis_shm::config::parse_size(size.trim())
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| format!("{:?} is not a size such as 4M", size.trim()))?;
                    (from, order)
                }
            };
            let order = order
                .split(',')
                .map(|n| {
                    let n = n.trim().to_ascii_lowercase();
                    Strategy::ALL
                        .into_iter()
                        .find(|s| s.name() == n && !matches!(s, Strategy::Chunks | Strategy::Rdma))
                        .ok_or_else(|| {
                            "expected strategies from cma, cma-put, cma-split, ring and vmsplice, best first, \
                             such as ring,cma, optionally by size, such as cma,ring;4M:ring,cma"
                                .to_string()
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let order = AutoOrder::new(&order).ok_or("each strategy at most once in a band")?;
            bands.push((from, order));
        }
        Self::new(&bands).ok_or_else(|| {
            format!("band sizes must increase, and there may be at most {AUTO_BANDS_MAX} bands")
        })
    }
}

impl Default for AutoBands {
    fn default() -> Self {
        default_auto()
    }
}

impl std::fmt::Display for AutoBands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (from, order)) in self.as_slice().iter().enumerate() {
            if i > 0 {
                write!(f, ";{}:", size_name(*from))?;
            }
            write!(f, "{order}")?;
        }
        Ok(())
    }
}

/// `n` bytes as the shortest exact size `parse_size` reads back (4M, 192K, 1000).
fn size_name(n: usize) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
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
    /// What automatic selection tries, best first, by size (`NEMESIS_LMT_AUTO`).
    pub auto: AutoBands,
    /// From how many bytes a message to another node goes by RDMA read, or `None` for
    /// never (`NEMESIS_LMT_RDMA_MIN`).
    pub rdma_min: Option<usize>,
    /// Whether automatic selection puts first, among the strategies its order allows,
    /// the one this pair's recent transfers of the size found fastest (`NEMESIS_LMT_TUNE`).
    pub tune: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            force: None,
            ring: DEFAULT_RING,
            auto: AutoBands::default(),
            rdma_min: Some(DEFAULT_RDMA_MIN),
            tune: true,
        }
    }
}

impl Policy {
    /// The strategies automatic selection tries for `len` bytes, best first (chunks, the
    /// fallback, after them).
    pub fn auto_order(&self, len: usize) -> &[Strategy] {
        if len >= AUTO_CMA_MIN {
            self.auto.order_for(len).as_slice()
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
    /// Reads `NEMESIS_LMT`, `NEMESIS_LMT_AUTO`, `NEMESIS_LMT_TUNE`, `NEMESIS_LMT_RING_SLOTS`,
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
                            reason: "expected auto, chunks, cma, cma-put, cma-split, ring, vmsplice or rdma"
                                .into(),
                        })?,
                ),
            };
        }
        if let Some(v) = get("NEMESIS_LMT_AUTO").filter(|v| !v.trim().is_empty()) {
            p.auto = AutoBands::parse(&v).map_err(|reason| LmtError::Config {
                var: "NEMESIS_LMT_AUTO",
                value: v.clone(),
                reason,
            })?;
        }
        let tune =
            nemesis_shm::config::switch(&get, "NEMESIS_LMT_TUNE").map_err(|value| LmtError::Config {
                var: "NEMESIS_LMT_TUNE",
                value,
                reason: nemesis_shm::config::SWITCH_EXPECTED.into(),
            })?;
        if let Some(on) = tune {
            p.tune = on;
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
        assert_eq!(Policy::default().auto, default_auto());
        let intel = auto_for_vendor(b"GenuineIntel");
        assert_eq!(intel.order_for(1 << 20).as_slice(), INTEL_AUTO);
        assert_eq!(intel.order_for(AUTO_CMA_MIN).as_slice(), INTEL_AUTO);
        for other in [b"AuthenticAMD", &[0; 12]] {
            let b = auto_for_vendor(other);
            assert_eq!(b.order_for(AUTO_CMA_MIN).as_slice(), DEFAULT_AUTO);
            assert_eq!(b.order_for(DEFAULT_SPLIT_FROM - 1).as_slice(), DEFAULT_AUTO);
            assert_eq!(b.order_for(DEFAULT_SPLIT_FROM).as_slice(), DEFAULT_AUTO_LARGE);
            assert_eq!(b.order_for(1 << 30).as_slice(), DEFAULT_AUTO_LARGE);
        }
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
        assert!(d.tune);
        assert!(!parse(&[("NEMESIS_LMT_TUNE", " Off")]).unwrap().tune);
        assert!(parse(&[("NEMESIS_LMT_TUNE", "1")]).unwrap().tune);
        let e = parse(&[("NEMESIS_LMT_TUNE", "sometimes")]).unwrap_err();
        assert!(e.to_string().contains("NEMESIS_LMT_TUNE"), "{e}");
    }

    #[test]
    fn automatic_orders_change_with_the_size() {
        use Strategy::{Cma, CmaPut, Ring, Vmsplice};
        let p = parse(&[("NEMESIS_LMT_AUTO", " cma, ring ; 4M: ring,cma;16m:vmsplice")]).unwrap();
        assert_eq!(p.auto_order(AUTO_CMA_MIN), &[Cma, Ring]);
        assert_eq!(p.auto_order((4 << 20) - 1), &[Cma, Ring]);
        assert_eq!(p.auto_order(4 << 20), &[Ring, Cma]);
        assert_eq!(p.auto_order(16 << 20), &[Vmsplice]);
        assert_eq!(p.auto_order(1 << 30), &[Vmsplice]);
        assert_eq!(p.auto.to_string(), "cma,ring;4M:ring,cma;16M:vmsplice");
        // What Display writes, parse reads back.
        let q = parse(&[("NEMESIS_LMT_AUTO", "cma-put;192K:ring;1000:cma")]);
        assert!(q.is_err(), "sizes must increase");
        let q = parse(&[("NEMESIS_LMT_AUTO", "cma-put;1000:cma;192K:ring")]).unwrap();
        assert_eq!(q.auto.to_string(), "cma-put;1000:cma;192K:ring");
        assert_eq!(parse(&[("NEMESIS_LMT_AUTO", &q.auto.to_string())]).unwrap(), q);
        assert_eq!(q.auto_order(100 << 10), &[Cma]);
        assert_eq!(q.auto_order(192 << 10), &[Ring]);
        let want = if default_auto() == auto_for_vendor(b"GenuineIntel") {
            "cma-split,cma,ring"
        } else {
            "ring,cma;128K:cma-split,ring,cma"
        };
        assert_eq!(Policy::default().auto.to_string(), want);
        assert_eq!(
            parse(&[("NEMESIS_LMT_AUTO", "cma-put")])
                .unwrap()
                .auto_order(1 << 20),
            &[CmaPut]
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("NEMESIS_LMT_AUTO", "ring,ring"),
            ("NEMESIS_LMT_AUTO", "ring,chunks"),
            ("NEMESIS_LMT_AUTO", "rdma"),
            ("NEMESIS_LMT_AUTO", "4M:ring"),
            ("NEMESIS_LMT_AUTO", "cma;ring"),
            ("NEMESIS_LMT_AUTO", "cma;4M:ring;4M:cma"),
            ("NEMESIS_LMT_AUTO", "cma;big:ring"),
            ("NEMESIS_LMT_AUTO", "cma;4M:"),
            (
                "NEMESIS_LMT_AUTO",
                "cma;1K:ring;2K:cma;3K:ring;4K:cma;5K:ring;6K:cma;7K:ring;8K:cma",
            ),
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
