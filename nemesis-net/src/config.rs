//! Reading the netmods' tunables from the environment.
//!
//! Every variable is optional and has a documented default; a value that cannot be used
//! is a [`NetError::Config`] naming the variable, never a silent fallback.

use crate::NetError;
use std::time::Duration;

/// Which netmod reaches peers on other nodes: `tcp` (the default), `udp`, or with the
/// `verbs` feature `ud` or `rc`.
pub const NETMOD_VAR: &str = "NEMESIS_NETMOD";
/// Seconds a peer may leave us without an answer (a connection that does not come up,
/// or data and probes that stay unacknowledged) before it counts as failed.
pub const NET_TIMEOUT_VAR: &str = "NEMESIS_NET_TIMEOUT";
/// The default of [`NET_TIMEOUT_VAR`].
pub const DEFAULT_NET_TIMEOUT: Duration = Duration::from_secs(10);

/// The netmods this build offers, by their `NEMESIS_NETMOD` names.
#[cfg(not(feature = "verbs"))]
pub const NETMODS: &[&str] = &["tcp", "udp"];
/// The netmods this build offers, by their `NEMESIS_NETMOD` names.
#[cfg(feature = "verbs")]
pub const NETMODS: &[&str] = &["tcp", "udp", "ud", "rc"];
/// The verbs netmods, offered by builds with the `verbs` feature.
pub const VERBS_NETMODS: &[&str] = &["ud", "rc"];

/// Why `name` is no netmod of this build.
pub fn unknown_netmod(name: &str) -> String {
    let want = name.trim().to_ascii_lowercase();
    if VERBS_NETMODS.contains(&want.as_str()) && !NETMODS.contains(&want.as_str()) {
        format!(
            "{want} is a verbs netmod, and this build has none: build nemesis with the `verbs` feature \
             (expected one of: {})",
            NETMODS.join(", ")
        )
    } else {
        format!("expected one of: {}", NETMODS.join(", "))
    }
}

/// The netmod `NEMESIS_NETMOD` asks for, read through `get`.
///
/// # Errors
/// A name that is not in [`NETMODS`].
pub fn netmod(get: impl Fn(&str) -> Option<String>) -> Result<&'static str, NetError> {
    match get(NETMOD_VAR) {
        None => Ok(NETMODS[0]),
        Some(v) => {
            let want = v.trim().to_ascii_lowercase();
            NETMODS
                .iter()
                .copied()
                .find(|n| *n == want)
                .ok_or_else(|| NetError::Config {
                    var: NETMOD_VAR,
                    value: v.clone(),
                    reason: unknown_netmod(&v),
                })
        }
    }
}

/// `var` as a positive number of seconds, or `default` when unset.
///
/// # Errors
/// A value that is not a positive, finite number of seconds.
pub fn seconds(
    get: impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: Duration,
) -> Result<Duration, NetError> {
    match get(var) {
        None => Ok(default),
        Some(v) => nemesis_shm::config::parse_seconds(&v).ok_or_else(|| NetError::Config {
            var,
            value: v.clone(),
            reason: "expected a positive number of seconds".into(),
        }),
    }
}

/// `var` as a size (`K`, `M` and `G` suffixes allowed) within `min..=max`, or `default`
/// when unset.
///
/// # Errors
/// A value that is not a size, or lies outside the range.
pub fn size(
    get: impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, NetError> {
    match get(var) {
        None => Ok(default),
        Some(v) => nemesis_shm::config::parse_size(&v)
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| NetError::Config {
                var,
                value: v.clone(),
                reason: format!("expected a whole number from {min} to {max} (K, M and G suffixes allowed)"),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn values_defaults_and_errors() {
        assert_eq!(netmod(env(&[])).unwrap(), "tcp");
        assert_eq!(netmod(env(&[(NETMOD_VAR, " UDP ")])).unwrap(), "udp");
        let e = netmod(env(&[(NETMOD_VAR, "ib")])).unwrap_err();
        assert!(
            e.to_string().contains("NEMESIS_NETMOD") && e.to_string().contains("tcp, udp"),
            "{e}"
        );

        let t = seconds(env(&[]), NET_TIMEOUT_VAR, DEFAULT_NET_TIMEOUT).unwrap();
        assert_eq!(t, DEFAULT_NET_TIMEOUT);
        let t = seconds(
            env(&[(NET_TIMEOUT_VAR, "0.5")]),
            NET_TIMEOUT_VAR,
            DEFAULT_NET_TIMEOUT,
        )
        .unwrap();
        assert_eq!(t, Duration::from_millis(500));
        for bad in ["0", "-1", "soon", "inf"] {
            assert!(
                seconds(
                    env(&[(NET_TIMEOUT_VAR, bad)]),
                    NET_TIMEOUT_VAR,
                    DEFAULT_NET_TIMEOUT
                )
                .is_err()
            );
        }

        assert_eq!(size(env(&[("X", "4K")]), "X", 1, 1, 1 << 20).unwrap(), 4096);
        assert_eq!(size(env(&[]), "X", 7, 1, 10).unwrap(), 7);
        let e = size(env(&[("X", "2M")]), "X", 1, 1, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("X=\"2M\""), "{e}");
    }
}
