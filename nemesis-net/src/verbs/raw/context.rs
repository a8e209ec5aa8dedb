//! The device context, its ports, and protection domains.

use super::{errno, rc_error};
use crate::verbs::VerbsError;
use rdma_mummy_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// The names of the verbs devices of this machine.
///
/// # Errors
/// [`VerbsError::Unavailable`] when the machine has no RDMA at all (a kernel without it,
/// no libibverbs, no device), so a caller can skip.
pub fn device_names() -> Result<Vec<String>, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a live int the call writes the count into; the list it returns is
    // freed below, after its names are copied out.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::Unavailable(errno()));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a listed device's name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(VerbsError::Unavailable(io::Error::new(
            io::ErrorKind::NotFound,
            "the RDMA subsystem lists no device",
        )));
    }
    Ok(names)
}

/// An open device.
#[derive(Debug)]
pub struct Context {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
}

// SAFETY: a verbs context may be used from any thread (libibverbs locks internally).
unsafe impl Send for Context {}
// SAFETY: as above; nothing here mutates through `&self` without the library's locks.
unsafe impl Sync for Context {}

/// What a port says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// `IBV_PORT_ACTIVE` is 4.
    pub state: u32,
    /// The active MTU in bytes.
    pub mtu: usize,
    /// Entries in the GID table.
    pub gids: u32,
    /// `IBV_LINK_LAYER_ETHERNET` (2) for RoCE.
    pub link_layer: u8,
}

/// What the device can do, as far as the netmods ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Most work requests a queue pair may hold.
    pub max_qp_wr: u32,
    /// Most entries of a completion queue.
    pub max_cqe: u32,
    /// Most scatter-gather entries a send request may have.
    pub max_sge: u32,
    /// Whether the device does atomics at all (`atomic_cap` not `IBV_ATOMIC_NONE`).
    pub atomics: bool,
}

impl Context {
    /// Opens the device called `name`, or the first one when `None`.
    ///
    /// # Errors
    /// No RDMA here, no such device, or a device that cannot be opened (permission).
    pub fn open(name: Option<&str>) -> Result<Arc<Self>, VerbsError> {
        let names = device_names()?;
        let want = match name {
            Some(n) => names
                .iter()
                .position(|d| d == n)
                .ok_or_else(|| VerbsError::NoDevice {
                    name: n.to_string(),
                    have: names.join(", "),
                })?,
            None => 0,
        };
        let mut n = 0;
        // SAFETY: as in device_names; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::Unavailable(errno()));
        }
        // SAFETY: `want` is below the count the list had a moment ago; a device that
        // went away in between makes the list shorter, which the bound checks.
        let dev = (want < usize::try_from(n).unwrap_or(0)).then(|| unsafe { *list.add(want) });
        // SAFETY: a device from the live list; ibv_open_device does not keep the list.
        let ctx = dev.map(|d| unsafe { ffi::ibv_open_device(d) });
        let err = errno();
        // SAFETY: freed once, after the device was opened.
        unsafe { ffi::ibv_free_device_list(list) };
        let dev_name = names[want].clone();
        match ctx.and_then(NonNull::new) {
            Some(ctx) => Ok(Arc::new(Self { ctx, name: dev_name })),
            None => Err(VerbsError::Open {
                device: dev_name,
                source: err,
            }),
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the device can do.
    ///
    /// # Errors
    /// The query failed.
    pub fn device_info(&self) -> Result<DeviceInfo, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and a live attribute struct the call fills.
        let rc = unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut a) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_device", rc_error(rc)));
        }
        Ok(DeviceInfo {
            max_qp_wr: u32::try_from(a.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(a.max_cqe).unwrap_or(0),
            max_sge: u32::try_from(a.max_sge).unwrap_or(0),
            atomics: a.atomic_cap != ffi::ibv_atomic_cap::IBV_ATOMIC_NONE,
        })
    }

    /// What `port` says of itself.
    ///
    /// # Errors
    /// The query failed (no such port).
    pub fn port_info(&self, port: u8) -> Result<PortInfo, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and a live attribute struct the call fills.
        let rc = unsafe { ffi::ibv_query_port(self.ctx.as_ptr(), port, &mut a) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_port", rc_error(rc)));
        }
        Ok(PortInfo {
            state: a.state,
            mtu: mtu_bytes(a.active_mtu),
            gids: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            link_layer: a.link_layer,
        })
    }

    /// The GID at `index` of `port`, and whether it is a RoCE v2 one.
    ///
    /// # Errors
    /// The query failed.
    pub fn gid(&self, port: u8, index: u32) -> Result<([u8; 16], bool), VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut g: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        let i = i32::try_from(index).unwrap_or(i32::MAX);
        // SAFETY: a live context and a live gid the call fills.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), port, i, &mut g) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_gid", rc_error(rc)));
        }
        let mut ty: ffi::ibv_gid_type_sysfs = 0;
        // SAFETY: as above; the type is one int the call writes.
        let rc = unsafe { ffi::ibv_query_gid_type(self.ctx.as_ptr(), port, index, &mut ty) };
        // SAFETY: every bit pattern is a valid array of bytes.
        let raw = unsafe { g.raw };
        Ok((raw, rc == 0 && ty == ffi::IBV_GID_TYPE_SYSFS_ROCE_V2))
    }

    /// The set GIDs of `port` as (index, GID, whether RoCE v2), read in one call (the
    /// table may have a thousand entries, most of them empty).
    ///
    /// # Errors
    /// The query failed.
    pub fn gid_table(&self, port: u8, len: u32) -> Result<Vec<(u32, [u8; 16], bool)>, VerbsError> {
        let n = len.max(1) as usize;
        // SAFETY: plain data, valid when all zero.
        let mut entries: Vec<ffi::ibv_gid_entry> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: a live context and room for `n` entries, which the call fills.
        let got = unsafe { ffi::ibv_query_gid_table(self.ctx.as_ptr(), entries.as_mut_ptr(), n, 0) };
        if got < 0 {
            return Err(VerbsError::call("ibv_query_gid_table", rc_error(-(got as i32))));
        }
        Ok(entries
            .iter()
            .take(got as usize)
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| {
                // SAFETY: every bit pattern is a valid array of bytes.
                let gid = unsafe { e.gid.raw };
                (e.gid_index, gid, e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2)
            })
            .collect())
    }

    /// For the other raw types' calls: the context outlives them (each holds an `Arc`).
    pub(super) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ctx.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of the context, so none is left.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// Bytes of an `ibv_mtu` value.
fn mtu_bytes(m: ffi::ibv_mtu::Type) -> usize {
    match m {
        ffi::ibv_mtu::IBV_MTU_256 => 256,
        ffi::ibv_mtu::IBV_MTU_512 => 512,
        ffi::ibv_mtu::IBV_MTU_1024 => 1024,
        ffi::ibv_mtu::IBV_MTU_2048 => 2048,
        ffi::ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 0,
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: as for Context.
unsafe impl Send for Pd {}
// SAFETY: as for Context.
unsafe impl Sync for Pd {}

impl Pd {
    /// A new protection domain on `ctx`.
    ///
    /// # Errors
    /// The device refused one.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: a live context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) };
        match NonNull::new(pd) {
            Some(pd) => Ok(Arc::new(Self {
                pd,
                ctx: Arc::clone(ctx),
            })),
            None => Err(VerbsError::call("ibv_alloc_pd", errno())),
        }
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// For the calls that make the domain's children, which hold an `Arc` of it.
    pub(super) fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of the domain, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}
