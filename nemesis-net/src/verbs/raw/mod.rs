//! Every raw verbs call of nemesis, each behind a small safe type: the device context, a
//! protection domain, registered memory, a completion channel and queue, a shared receive
//! queue, queue pairs and address handles.
//!
//! Ownership follows the order of destruction verbs requires: a child holds an `Arc` of
//! its parent (a queue pair its protection domain and completion queue, a completion
//! queue its channel, everything the context), so a parent is destroyed only after the
//! last of its children. Memory a work request names must outlive the request: the types
//! that post requests here take the memory's description, and their callers (the
//! netmods) keep the memory and the queue pair in one struct, the queue pair first, so it
//! is destroyed before the memory is freed.

use std::io;

/// The error of the last call, as verbs reports it: through `errno`, or a returned code.
fn errno() -> io::Error {
    io::Error::last_os_error()
}

fn rc_error(rc: i32) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        errno()
    }
}

mod completion;
mod context;
mod memory;
mod qp;

pub use completion::{Channel, Completion, Cq};
pub use context::{Context, DeviceInfo, Pd, PortInfo, device_names};
pub use memory::{Mr, OneSided, Region};
pub use qp::{Ah, Qp, QpCap, RETRY_CNT, RcPath, Sge, Srq, UdDest, ack_timeout_for};
