//! The tcp netmod's tunables, from the environment or given.

use super::MAX_TIMEOUT;
use crate::{NetError, config};
use std::time::Duration;

/// The largest payload of one packet, as a size (`K`, `M` suffixes allowed). Every rank
/// must use the same value: the handshake refuses a peer with another.
pub const MAX_PAYLOAD_VAR: &str = "NEMESIS_TCP_MAX_PAYLOAD";
/// Bytes that may wait in the queue to one peer before sends to it answer "again".
pub const QUEUE_LIMIT_VAR: &str = "NEMESIS_TCP_QUEUE_LIMIT";
/// The default of [`MAX_PAYLOAD_VAR`].
pub const DEFAULT_MAX_PAYLOAD: usize = 256 << 10;
/// The default of [`QUEUE_LIMIT_VAR`].
pub const DEFAULT_QUEUE_LIMIT: usize = 4 << 20;
/// How long an accepted connection may take to prove itself with its hello.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest max payload: it bounds every connection's input buffer.
pub const MAX_MAX_PAYLOAD: usize = 64 << 20;

/// The tunables of the tcp netmod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// How long a connection may take to come up (retrying all the while) before the peer
    /// counts as failed; also sets the keepalive that finds peers on dead nodes.
    pub timeout: Duration,
    /// The largest payload of one packet.
    pub max_payload: usize,
    /// Bytes that may wait in one peer's queue; past it, sends answer [`Accept::Again`](crate::Accept::Again).
    pub queue_limit: usize,
    /// How long an accepted connection may take to prove itself with its hello.
    pub handshake_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            timeout: config::DEFAULT_NET_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl TcpConfig {
    /// The configuration the environment asks for.
    ///
    /// # Errors
    /// As for [`TcpConfig::from_lookup`].
    pub fn from_env() -> Result<Self, NetError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The configuration that `get` describes: [`config::NET_TIMEOUT_VAR`],
    /// [`MAX_PAYLOAD_VAR`] and [`QUEUE_LIMIT_VAR`], each optional.
    ///
    /// # Errors
    /// A value that is not usable, naming its variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let timeout = config::seconds(&get, config::NET_TIMEOUT_VAR, config::DEFAULT_NET_TIMEOUT)?;
        let max_payload = config::size(
            &get,
            MAX_PAYLOAD_VAR,
            DEFAULT_MAX_PAYLOAD as u64,
            1 << 10,
            MAX_MAX_PAYLOAD as u64,
        )?;
        let queue_limit = config::size(
            &get,
            QUEUE_LIMIT_VAR,
            DEFAULT_QUEUE_LIMIT as u64,
            4 << 10,
            1 << 30,
        )?;
        Ok(Self {
            timeout,
            // Both are bounded above by values that fit a usize.
            max_payload: max_payload as usize,
            queue_limit: queue_limit as usize,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// Refuses values the netmod cannot work with, whoever built the configuration.
    pub(super) fn validate(&self) -> Result<(), NetError> {
        let bad = |var: &'static str, value: String, reason: &str| NetError::Config {
            var,
            value,
            reason: reason.into(),
        };
        if self.max_payload == 0 || self.max_payload > MAX_MAX_PAYLOAD {
            return Err(bad(
                "TcpConfig::max_payload",
                self.max_payload.to_string(),
                &format!("expected 1 to {MAX_MAX_PAYLOAD} bytes"),
            ));
        }
        if self.queue_limit == 0 {
            return Err(bad(
                "TcpConfig::queue_limit",
                "0".into(),
                "expected at least one byte",
            ));
        }
        for (var, t) in [
            ("TcpConfig::timeout", self.timeout),
            ("TcpConfig::handshake_timeout", self.handshake_timeout),
        ] {
            if t.is_zero() || t > MAX_TIMEOUT {
                return Err(bad(var, format!("{t:?}"), "expected a positive duration"));
            }
        }
        Ok(())
    }
}
