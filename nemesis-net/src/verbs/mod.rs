//! InfiniBand verbs (and RoCE, and Soft-RoCE): the `ud` and `rc` netmods.
//!
//! Built only with the `verbs` feature. The library is opened at run time, so a binary
//! built with the feature starts on any machine and reports [`VerbsError::Unavailable`]
//! where there is no RDMA.
//!
//! - [`raw`]: every raw verbs call, each behind a small safe type.
//! - [`ud`]: one UD queue pair for every peer, as a [`crate::dgram::Endpoint`], so the
//!   `ud` netmod is [`crate::reliable`] over it, the same code as `udp`.
//! - [`rc`]: one RC queue pair per peer, connected on first contact through a UD
//!   endpoint, one shared receive queue; the device's own reliability.
//! - [`hybrid`]: `ud` as a job opens it: [`ud`]'s datagrams, and an [`rc`] netmod beside
//!   them for RDMA only, its pairs made for the peers large messages are read from.
//!
//! Variables (every rank must use the same values):
//!
//! - `NEMESIS_VERBS_DEVICE` ([`DEVICE_VAR`]): the device, by name (`rxe0`, `mlx5_0`);
//!   default the first one listed.
//! - `NEMESIS_VERBS_PORT` ([`PORT_VAR`]): its port, default 1.
//! - `NEMESIS_VERBS_GID_INDEX` ([`GID_INDEX_VAR`]): the GID to use; by default the one
//!   of the job's address (`NEMESIS_NET_ADDR`), else the first RoCE v2 GID that maps an
//!   IPv4 address, else (InfiniBand) index 0.

pub mod hybrid;
pub mod raw;
pub mod rc;
pub mod ud;

use crate::NetError;
use std::io;

/// Chooses the device.
pub const DEVICE_VAR: &str = "NEMESIS_VERBS_DEVICE";
/// Chooses the device's port.
pub const PORT_VAR: &str = "NEMESIS_VERBS_PORT";
/// Chooses the GID.
pub const GID_INDEX_VAR: &str = "NEMESIS_VERBS_GID_INDEX";

/// Why verbs could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// The machine has no RDMA: a kernel without it (ENOSYS), no libibverbs
    /// (EOPNOTSUPP), or no device.
    #[error(
        "no RDMA on this machine ({0}): the verbs netmods need an InfiniBand or RoCE device, \
         or Soft-RoCE (`rdma link add rxe0 type rxe netdev <interface>`); use NEMESIS_NETMOD=tcp or udp otherwise"
    )]
    Unavailable(#[source] io::Error),
    /// No device of the name asked for.
    #[error("no verbs device called {name:?} (this machine has: {have}); set {DEVICE_VAR} to one of them")]
    NoDevice {
        /// The name asked for.
        name: String,
        /// The devices there are.
        have: String,
    },
    /// The device could not be opened.
    #[error(
        "cannot open verbs device {device}: {source}; check that /dev/infiniband/uverbs* exist and that \
         this user may read and write them"
    )]
    Open {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The port is not active.
    #[error(
        "port {port} of {device} is not active (state {state}); bring its link up, or choose another \
         port with {PORT_VAR}"
    )]
    PortDown {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Its state (`IBV_PORT_ACTIVE` is 4).
        state: u32,
    },
    /// No usable GID on the port.
    #[error("port {port} of {device} has no usable GID: {detail}; choose one with {GID_INDEX_VAR}")]
    NoGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// What was looked for.
        detail: String,
    },
    /// Memory could not be registered: usually the memory-lock limit.
    #[error(
        "registering {bytes} bytes with the RDMA device failed ({source}): the memory-lock limit is \
         probably too low; raise it with `ulimit -l` (for example `ulimit -l unlimited`), or with \
         LimitMEMLOCK= under systemd and the scheduler's settings under Slurm"
    )]
    MemLock {
        /// Bytes asked for.
        bytes: usize,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A verbs call failed.
    #[error("{what}: {source}")]
    Call {
        /// The call.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl VerbsError {
    pub(crate) fn call(what: &'static str, source: io::Error) -> Self {
        Self::Call { what, source }
    }

    /// Whether the error only says that this machine has no RDMA, so that a test or a
    /// tool may skip.
    pub fn unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl From<VerbsError> for NetError {
    fn from(e: VerbsError) -> Self {
        NetError::Verbs(Box::new(e))
    }
}

/// Whether this machine has a verbs device: `Ok(names)`, or why not.
///
/// # Errors
/// [`VerbsError::Unavailable`] when it has none.
pub fn devices() -> Result<Vec<String>, VerbsError> {
    raw::device_names()
}
