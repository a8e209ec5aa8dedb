//! The layer's tunables, and the same in the units it computes with.

use super::wire::{HEADER_LEN, MAX_HEADER_LEN, MIN_DATAGRAM};
use crate::NetError;
use crate::auth::JobKey;
use std::time::Duration;

/// Default of [`ReliableConfig::window`].
pub const DEFAULT_WINDOW: u32 = 64;
/// Largest [`ReliableConfig::window`]; keeps every window far from half the sequence
/// space, so wrapping comparisons stay unambiguous.
pub const MAX_WINDOW: u32 = 1 << 16;
/// Default of [`ReliableConfig::max_message`].
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 10;

/// Tunables of the reliability layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReliableConfig {
    /// Segments in flight per peer, 1 to [`MAX_WINDOW`]. Every rank must use the same.
    pub window: u32,
    /// Largest message, [`Reliable::max_payload`](super::Reliable::max_payload).
    pub max_message: usize,
    /// Retransmission timeout before any round trip has been measured.
    pub rto_initial: Duration,
    /// Least retransmission timeout, however short the round trip.
    pub rto_min: Duration,
    /// Most retransmission timeout, however far backed off.
    pub rto_max: Duration,
    /// Longest a received segment waits for its acknowledgement when no data goes back
    /// to carry it.
    pub ack_delay: Duration,
    /// Unacknowledged segments that make an ACK go at once; 0 for a quarter window.
    pub ack_every: u32,
    /// How long a peer may acknowledge nothing we sent before it counts as failed.
    pub timeout: Duration,
    /// The first sequence number in both directions; every rank must use the same. Tests
    /// set it near `u32::MAX` to make the numbers wrap.
    pub initial_seq: u32,
}

impl Default for ReliableConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_message: DEFAULT_MAX_MESSAGE,
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_secs(1),
            ack_delay: Duration::from_micros(200),
            ack_every: 0,
            timeout: crate::config::DEFAULT_NET_TIMEOUT,
            initial_seq: 0,
        }
    }
}

/// The configuration in the units the layer computes with.
#[derive(Debug, Clone)]
pub(super) struct Tuned {
    pub(super) me: u32,
    pub(super) size: u32,
    pub(super) key: JobKey,
    pub(super) window: u32,
    pub(super) max_message: usize,
    /// Data bytes in a first segment and in any other.
    pub(super) first_room: usize,
    pub(super) rest_room: usize,
    pub(super) rto_initial: u64,
    pub(super) rto_min: u64,
    pub(super) rto_max: u64,
    pub(super) ack_delay: u64,
    pub(super) ack_every: u32,
    pub(super) timeout: u64,
    /// Least silence before check_peer probes a peer, so a spinning waiter does not
    /// flood it.
    pub(super) ping_every: u64,
    pub(super) initial_seq: u32,
}

pub(super) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Tuned {
    /// The configuration checked, for rank `me` of `size` over a transport carrying
    /// datagrams of `max_datagram` bytes.
    pub(super) fn new(
        me: u32,
        size: u32,
        key: JobKey,
        cfg: &ReliableConfig,
        max_datagram: usize,
    ) -> Result<Self, NetError> {
        if me >= size {
            return Err(NetError::InvalidRank { rank: me, size });
        }
        let bad = |var: &'static str, value: String, reason: &str| NetError::Config {
            var,
            value,
            reason: reason.into(),
        };
        if !(1..=MAX_WINDOW).contains(&cfg.window) {
            return Err(bad(
                "window",
                cfg.window.to_string(),
                &format!("expected 1 to {MAX_WINDOW} segments"),
            ));
        }
        if max_datagram < MIN_DATAGRAM {
            return Err(bad(
                "max_datagram",
                max_datagram.to_string(),
                &format!("the transport must carry at least {MIN_DATAGRAM} bytes"),
            ));
        }
        if cfg.max_message > u32::MAX as usize {
            return Err(bad(
                "max_message",
                cfg.max_message.to_string(),
                "a message's length must fit 32 bits",
            ));
        }
        let (rto_min, rto_max) = (ns(cfg.rto_min), ns(cfg.rto_max));
        if rto_min == 0 || rto_min > rto_max {
            return Err(bad(
                "rto_min",
                format!("{:?}..{:?}", cfg.rto_min, cfg.rto_max),
                "expected 0 < rto_min <= rto_max",
            ));
        }
        let timeout = ns(cfg.timeout);
        if timeout == 0 {
            return Err(bad("timeout", "0".into(), "expected a positive timeout"));
        }
        let ack_every = match cfg.ack_every {
            0 => (cfg.window / 4).max(1),
            n => n.min(cfg.window),
        };
        Ok(Self {
            me,
            size,
            key,
            window: cfg.window,
            max_message: cfg.max_message,
            first_room: max_datagram - MAX_HEADER_LEN,
            rest_room: max_datagram - HEADER_LEN,
            rto_initial: ns(cfg.rto_initial).clamp(rto_min, rto_max),
            rto_min,
            rto_max,
            ack_delay: ns(cfg.ack_delay),
            ack_every,
            timeout,
            ping_every: timeout / 10,
            initial_seq: cfg.initial_seq,
        })
    }
}
