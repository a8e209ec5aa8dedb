//! Every `NEMESIS_*` variable nemesis reads, and a warning for one it does not: a
//! misspelt variable (`NEMESIS_CELL=4`) would otherwise be ignored without a word.

use std::sync::Once;

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The library: every process of a job.
    Library,
    /// The tools: `nemesis-run` or `nemesis-bench` (and the partners it starts).
    Tools,
}

/// The variables, with who reads them and what they set. README's table says more.
pub const KNOWN: &[(&str, Reader, &str)] = &[
    ("NEMESIS_CELLS", Reader::Library, "cells per process"),
    ("NEMESIS_CELL_SIZE", Reader::Library, "bytes per cell"),
    ("NEMESIS_FBOX_SIZE", Reader::Library, "bytes per fastbox"),
    (
        "NEMESIS_FBOX_READ_AHEAD",
        Reader::Library,
        "whether a receiver behind its sender reads ahead in the ring of fastboxes",
    ),
    (
        "NEMESIS_FBOX_SLOTS",
        Reader::Library,
        "fastboxes per ordered pair",
    ),
    (
        "NEMESIS_PAIR_SIZE",
        Reader::Library,
        "bytes of the buffer each pair of processes shares for medium messages",
    ),
    ("NEMESIS_SHM_DIR", Reader::Library, "where segment files are made"),
    (
        "NEMESIS_STARTUP_TIMEOUT",
        Reader::Library,
        "seconds any start-up wait may take",
    ),
    ("NEMESIS_SPIN", Reader::Library, "checks for work before yielding"),
    ("NEMESIS_YIELDS", Reader::Library, "yields before sleeping"),
    ("NEMESIS_EAGER_LIMIT", Reader::Library, "largest eager message"),
    (
        "NEMESIS_MEDIUM_LIMIT",
        Reader::Library,
        "largest medium message within the node",
    ),
    (
        "NEMESIS_PAIR_EAGER_LIMIT",
        Reader::Library,
        "within the node, messages above this go through the pair buffer when they answer",
    ),
    (
        "NEMESIS_STREAM_MEDIUM_LIMIT",
        Reader::Library,
        "largest medium message within the node while streaming to the peer",
    ),
    (
        "NEMESIS_STREAM_TUNE_LIMIT",
        Reader::Library,
        "within the node, a stream's messages up to this go as packets or by rendezvous, as measured",
    ),
    (
        "NEMESIS_STREAM_COPIES_LIMIT",
        Reader::Library,
        "within the node, a stream's rendezvous up to this offers all strategies or own copies only, as measured",
    ),
    (
        "NEMESIS_FAILURE_TIMEOUT",
        Reader::Library,
        "seconds between checks of peers",
    ),
    (
        "NEMESIS_WAIT_WARN",
        Reader::Library,
        "seconds before a blocked call says what it waits for",
    ),
    (
        "NEMESIS_NODE_COLLECTIVES",
        Reader::Library,
        "collectives through the node's blocks",
    ),
    (
        "NEMESIS_FLAT_COLLECTIVES",
        Reader::Library,
        "small collectives through messages gathered at rank 0",
    ),
    ("NEMESIS_LMT", Reader::Library, "large-message strategy"),
    (
        "NEMESIS_RMA_PROGRESS",
        Reader::Library,
        "thread: a helper serves one-sided requests during World::compute",
    ),
    (
        "NEMESIS_RMA_RDMA_MIN",
        Reader::Library,
        "smallest one-sided put or get that goes by RDMA",
    ),
    (
        "NEMESIS_LMT_AUTO",
        Reader::Library,
        "the order automatic selection tries strategies in, by size",
    ),
    (
        "NEMESIS_LMT_TUNE",
        Reader::Library,
        "whether automatic selection takes the strategy the pair's transfers found fastest",
    ),
    (
        "NEMESIS_LMT_RING_SLOTS",
        Reader::Library,
        "slots of each copy ring",
    ),
    (
        "NEMESIS_LMT_RING_SLOT_SIZE",
        Reader::Library,
        "bytes per ring slot",
    ),
    (
        "NEMESIS_LMT_RDMA_MIN",
        Reader::Library,
        "smallest message to another node read by RDMA",
    ),
    ("NEMESIS_NETMOD", Reader::Library, "network module"),
    (
        "NEMESIS_NO_SHM",
        Reader::Library,
        "every peer through the network module",
    ),
    (
        "NEMESIS_NET_ADDR",
        Reader::Library,
        "address the network module binds",
    ),
    (
        "NEMESIS_NET_IFACE",
        Reader::Library,
        "interface the network module binds",
    ),
    (
        "NEMESIS_NET_TIMEOUT",
        Reader::Library,
        "seconds a silent peer has before it fails",
    ),
    ("NEMESIS_TCP_MAX_PAYLOAD", Reader::Library, "largest tcp packet"),
    (
        "NEMESIS_TCP_QUEUE_LIMIT",
        Reader::Library,
        "bytes queued per tcp peer",
    ),
    ("NEMESIS_UDP_MTU", Reader::Library, "MTU udp sizes datagrams for"),
    (
        "NEMESIS_UDP_WINDOW",
        Reader::Library,
        "udp segments in flight per peer",
    ),
    (
        "NEMESIS_VERBS_DEVICE",
        Reader::Library,
        "the verbs device (ud netmod)",
    ),
    ("NEMESIS_VERBS_PORT", Reader::Library, "the verbs device's port"),
    (
        "NEMESIS_VERBS_GID_INDEX",
        Reader::Library,
        "the GID the verbs netmods use",
    ),
    ("NEMESIS_UD_MTU", Reader::Library, "largest ud datagram"),
    (
        "NEMESIS_UD_WINDOW",
        Reader::Library,
        "ud segments in flight per peer",
    ),
    (
        "NEMESIS_UD_RECV_DEPTH",
        Reader::Library,
        "ud receive slots posted",
    ),
    (
        "NEMESIS_UD_RDMA",
        Reader::Library,
        "ud opens rc pairs on demand for RDMA",
    ),
    ("NEMESIS_RC_EAGER", Reader::Library, "bytes of an rc receive slot"),
    (
        "NEMESIS_RC_RECV_DEPTH",
        Reader::Library,
        "rc receive slots posted",
    ),
    (
        "NEMESIS_PMI_DEBUG",
        Reader::Tools,
        "nemesis-run prints its PMI traffic",
    ),
    (
        "NEMESIS_MEASURE_ROLE",
        Reader::Tools,
        "a nemesis-bench partner's role",
    ),
    (
        "NEMESIS_MEASURE_CPU",
        Reader::Tools,
        "a nemesis-bench partner's CPU",
    ),
    (
        "NEMESIS_MEASURE_RING",
        Reader::Tools,
        "a nemesis-bench ring's shape",
    ),
    (
        "NEMESIS_MEASURE_RING_ROUNDS",
        Reader::Tools,
        "a nemesis-bench ring's rounds",
    ),
    (
        "NEMESIS_MEASURE_RING_PIN",
        Reader::Tools,
        "the CPUs a nemesis-bench ring's ranks pin themselves to",
    ),
    (
        "NEMESIS_MEASURE_COLL",
        Reader::Tools,
        "a nemesis-bench collective run's shape",
    ),
];

/// Whether `name` is one of [`KNOWN`].
pub fn is_known(name: &str) -> bool {
    KNOWN.iter().any(|(k, _, _)| *k == name)
}

/// The known variable nearest to `name` (fewest single-character edits), if one is
/// near enough to be a likely misspelling.
pub fn nearest(name: &str) -> Option<&'static str> {
    let (best, d) = KNOWN
        .iter()
        .map(|(k, _, _)| (*k, edits(name, k)))
        .min_by_key(|&(_, d)| d)?;
    (d <= 3.max(name.len() / 4)).then_some(best)
}

/// Levenshtein distance.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The warnings for the unknown `NEMESIS_*` names among `names`.
pub fn unknown<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| n.starts_with("NEMESIS_") && !is_known(n))
        .map(|n| match nearest(n) {
            Some(k) => {
                format!("nemesis: {n} is not a variable nemesis reads (did you mean {k}?); it is ignored")
            }
            None => format!("nemesis: {n} is not a variable nemesis reads; it is ignored"),
        })
        .collect()
}

/// Warns on standard error, once per process, about every `NEMESIS_*` variable of the
/// environment that nemesis does not read.
pub fn warn_unknown() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        for w in unknown(names.iter().map(String::as_str)) {
            eprintln!("{w}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_variable_is_named_with_the_one_meant() {
        let w = unknown([
            "NEMESIS_CELL",
            "NEMESIS_CELLS",
            "PATH",
            "NEMESIS_NETMDO",
            "NEMESIS_XYZZY_PLUGH",
        ]);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("NEMESIS_CELL is not") && w[0].contains("did you mean NEMESIS_CELLS?"));
        assert!(w[1].contains("did you mean NEMESIS_NETMOD?"), "{}", w[1]);
        assert!(!w[2].contains("did you mean"), "{}", w[2]);
        assert_eq!(edits("kitten", "sitting"), 3);
    }

    #[test]
    fn every_variable_the_library_reads_is_known() {
        for v in [
            crate::progress::WAIT_WARN_VAR,
            crate::progress::FAILURE_TIMEOUT_VAR,
            crate::channel::NO_SHM_VAR,
            nemesis_net::config::NETMOD_VAR,
            nemesis_net::config::NET_TIMEOUT_VAR,
            "NEMESIS_VERBS_DEVICE",
            "NEMESIS_VERBS_PORT",
            "NEMESIS_VERBS_GID_INDEX",
            "NEMESIS_UD_MTU",
            "NEMESIS_UD_WINDOW",
            "NEMESIS_UD_RECV_DEPTH",
            "NEMESIS_UD_RDMA",
            "NEMESIS_RC_EAGER",
            "NEMESIS_RC_RECV_DEPTH",
            "NEMESIS_LMT_RDMA_MIN",
        ] {
            assert!(is_known(v), "{v}");
        }
    }

    #[test]
    fn every_variable_in_the_readmes_tables_is_known() {
        let readme = include_str!("../README.md");
        let rows: Vec<&str> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("| `NEMESIS_"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert!(rows.len() > 20, "the tables were not found: {}", rows.len());
        for r in rows {
            let v = format!("NEMESIS_{r}");
            assert!(is_known(&v), "{v} is in README's tables but not in KNOWN");
        }
    }
}
