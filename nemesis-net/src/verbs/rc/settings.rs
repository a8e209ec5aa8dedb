//! How the `rc` netmod is set up, and the variables that set it.

use crate::verbs::{DEVICE_VAR, GID_INDEX_VAR, PORT_VAR};
use crate::{NetError, config};
use std::time::Duration;

/// Bytes of a receive slot.
pub const EAGER_VAR: &str = "NEMESIS_RC_EAGER";
/// Slots in the shared receive ring.
pub const RECV_DEPTH_VAR: &str = "NEMESIS_RC_RECV_DEPTH";
/// Default of [`EAGER_VAR`].
pub const DEFAULT_EAGER: usize = 8 << 10;
/// Default of [`RECV_DEPTH_VAR`].
pub const DEFAULT_RECV_DEPTH: u32 = 256;
/// How the `rc` netmod is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RcConfig {
    /// The device; `None`: the first.
    pub device: Option<String>,
    /// Its port.
    pub port: u8,
    /// The GID index; `None`: chosen (see [`crate::verbs`]).
    pub gid_index: Option<u32>,
    /// Bytes of a receive slot.
    pub eager: usize,
    /// Slots in the shared receive ring.
    pub recv_depth: u32,
    /// How long a peer may leave a connection request unanswered.
    pub timeout: Duration,
}

impl Default for RcConfig {
    fn default() -> Self {
        Self {
            device: None,
            port: 1,
            gid_index: None,
            eager: DEFAULT_EAGER,
            recv_depth: DEFAULT_RECV_DEPTH,
            timeout: config::DEFAULT_NET_TIMEOUT,
        }
    }
}

impl RcConfig {
    /// The configuration the variables read through `get` ask for.
    ///
    /// # Errors
    /// A variable that cannot be used.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let mut c = Self {
            timeout: config::seconds(&get, config::NET_TIMEOUT_VAR, config::DEFAULT_NET_TIMEOUT)?,
            ..Self::default()
        };
        c.device = get(DEVICE_VAR).filter(|d| !d.trim().is_empty());
        c.port = config::size(&get, PORT_VAR, 1, 1, 255)? as u8;
        if get(GID_INDEX_VAR).is_some() {
            c.gid_index = Some(config::size(&get, GID_INDEX_VAR, 0, 0, 65535)? as u32);
        }
        c.eager = config::size(&get, EAGER_VAR, DEFAULT_EAGER as u64, 1 << 10, 1 << 20)? as usize;
        c.recv_depth = config::size(&get, RECV_DEPTH_VAR, DEFAULT_RECV_DEPTH.into(), 16, 65536)? as u32;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_variables() {
        let c = RcConfig::from_lookup(|_| None).unwrap();
        assert_eq!(c, RcConfig::default());
        let get = |k: &str| match k {
            EAGER_VAR => Some("16K".to_string()),
            RECV_DEPTH_VAR => Some("64".to_string()),
            _ => None,
        };
        let c = RcConfig::from_lookup(get).unwrap();
        assert_eq!((c.eager, c.recv_depth), (16 << 10, 64));
        for (var, v) in [(EAGER_VAR, "100"), (EAGER_VAR, "2M"), (RECV_DEPTH_VAR, "8")] {
            let get = |k: &str| (k == var).then(|| v.to_string());
            assert!(
                matches!(RcConfig::from_lookup(get), Err(NetError::Config { .. })),
                "{var}={v}"
            );
        }
    }
}
