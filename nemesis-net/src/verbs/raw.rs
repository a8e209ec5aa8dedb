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

use super::VerbsError;
use rdma_mummy_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

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

    fn as_ptr(&self) -> *mut ffi::ibv_context {
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
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of the domain, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Memory of our own, registered with the device: the pools work requests name.
///
/// The bytes live in a heap block the region owns and never moves; the device may write
/// them at any time while a receive naming them is posted, so they are reached only
/// through raw pointers ([`Region::ptr`]) by code that knows nothing is posted there.
#[derive(Debug)]
pub struct Region {
    mr: NonNull<ffi::ibv_mr>,
    mem: NonNull<u8>,
    len: usize,
    _pd: Arc<Pd>,
}

// SAFETY: the region is a registration and a heap block; both may move between threads.
unsafe impl Send for Region {}
// SAFETY: `&Region` hands out only raw pointers and keys.
unsafe impl Sync for Region {}

const REGION_ALIGN: usize = 4096;

impl Region {
    /// `len` zeroed bytes, page-aligned, registered on `pd` for local writes (and for
    /// remote access when `remote`).
    ///
    /// # Errors
    /// No memory, or a registration refused; past the memory-lock limit that is
    /// [`VerbsError::MemLock`], which names `ulimit -l`.
    pub fn new(pd: &Arc<Pd>, len: usize, remote: bool) -> Result<Self, VerbsError> {
        let len = len.max(1);
        let layout = std::alloc::Layout::from_size_align(len, REGION_ALIGN)
            .map_err(|e| VerbsError::call("laying out a region", io::Error::other(e)))?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| VerbsError::call("allocating a region", io::ErrorKind::OutOfMemory.into()))?;
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        // SAFETY: a live domain and `len` bytes we own until after deregistration.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.pd.as_ptr(),
                mem.as_ptr().cast(),
                len,
                i32::try_from(access).unwrap_or(i32::MAX),
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let e = errno();
            // SAFETY: allocated above with this layout, and registered nowhere.
            unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
            return Err(
                if e.raw_os_error() == Some(libc::ENOMEM) || e.raw_os_error() == Some(libc::EPERM) {
                    VerbsError::MemLock {
                        bytes: len,
                        source: e,
                    }
                } else {
                    VerbsError::call("ibv_reg_mr", e)
                },
            );
        };
        Ok(Self {
            mr,
            mem,
            len,
            _pd: Arc::clone(pd),
        })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: a region has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key local work requests name it by.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration; the key does not change.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The key remote work requests name it by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: a live registration, deregistered once; its owner destroyed the queue
        // pairs that could name it first (see the module documentation).
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        let layout =
            std::alloc::Layout::from_size_align(self.len, REGION_ALIGN).expect("checked at allocation");
        // SAFETY: allocated in `new` with this layout, no longer registered.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), layout) };
    }
}

/// A registration of memory the caller owns (a user's buffer), for RDMA: local and
/// remote reads, writes and atomics. Deregistered on drop.
#[derive(Debug)]
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: a registration handle; the library locks internally.
unsafe impl Send for Mr {}

impl Mr {
    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must stay allocated until the registration is dropped and every
    /// operation naming it has completed.
    ///
    /// # Errors
    /// The registration was refused; past the memory-lock limit that is
    /// [`VerbsError::MemLock`].
    pub unsafe fn new(pd: &Arc<Pd>, ptr: *mut u8, len: usize) -> Result<Self, VerbsError> {
        use ffi::ibv_access_flags as acc;
        let access = acc::IBV_ACCESS_LOCAL_WRITE.0
            | acc::IBV_ACCESS_REMOTE_WRITE.0
            | acc::IBV_ACCESS_REMOTE_READ.0
            | acc::IBV_ACCESS_REMOTE_ATOMIC.0;
        // SAFETY: the caller's contract.
        unsafe { Self::with_access(pd, ptr, len, access) }
    }

    /// Registers `len` bytes at `ptr` for peers to read only: the device never writes
    /// them, so they may be read-only pages.
    ///
    /// # Safety
    /// As for [`Mr::new`].
    ///
    /// # Errors
    /// As for [`Mr::new`].
    pub unsafe fn read_only(pd: &Arc<Pd>, ptr: *mut u8, len: usize) -> Result<Self, VerbsError> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        // SAFETY: the caller's contract.
        unsafe { Self::with_access(pd, ptr, len, access) }
    }

    /// # Safety
    /// As for [`Mr::new`].
    unsafe fn with_access(pd: &Arc<Pd>, ptr: *mut u8, len: usize, access: u32) -> Result<Self, VerbsError> {
        // SAFETY: a live domain; the caller keeps the bytes as the contract says.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), ptr.cast(), len.max(1), access as i32) };
        match NonNull::new(mr) {
            Some(mr) => Ok(Self {
                mr,
                _pd: Arc::clone(pd),
            }),
            None => {
                let e = errno();
                Err(if matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) {
                    VerbsError::MemLock {
                        bytes: len,
                        source: e,
                    }
                } else {
                    VerbsError::call("ibv_reg_mr", e)
                })
            }
        }
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration; the key does not change.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: a live registration, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A one-sided operation on a connected pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneSided {
    /// Read the remote bytes into the local ones.
    Read,
    /// Write the local bytes into the remote ones.
    Write,
    /// Add to the remote 8-byte word; its old value lands locally.
    FetchAdd(u64),
    /// Swap the remote word for the second value if it equals the first; its old value
    /// lands locally.
    CompareSwap(u64, u64),
}

/// A completion channel: the descriptor a waiter sleeps on.
#[derive(Debug)]
pub struct Channel {
    ch: NonNull<ffi::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: as for Context.
unsafe impl Send for Channel {}
// SAFETY: as for Context.
unsafe impl Sync for Channel {}

impl Channel {
    /// A new channel on `ctx`, its descriptor non-blocking.
    ///
    /// # Errors
    /// The device refused one.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: a live context.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| VerbsError::call("ibv_create_comp_channel", errno()))?;
        let this = Self {
            ch,
            _ctx: Arc::clone(ctx),
        };
        let fd = this.raw_fd();
        // SAFETY: the channel's own live descriptor; only its flags change.
        let rc = unsafe {
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            )
        };
        if rc < 0 {
            return Err(VerbsError::call(
                "making the completion channel non-blocking",
                errno(),
            ));
        }
        Ok(Arc::new(this))
    }

    fn raw_fd(&self) -> RawFd {
        // SAFETY: a live channel; its descriptor does not change.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The descriptor, readable when an armed completion queue has an event.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor lives as long as the channel, which `self` borrows.
        unsafe { BorrowedFd::borrow_raw(self.raw_fd()) }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every queue on the channel holds an Arc of it, so none is left.
        unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

/// Posts one receive of `len` bytes at `addr` with key `lkey` through `post` (a pair's
/// receive queue, or a shared one), which gets the request and the place for a bad one.
fn post_one_recv(
    what: &'static str,
    wr_id: u64,
    addr: *mut u8,
    len: u32,
    lkey: u32,
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> i32,
) -> Result<(), VerbsError> {
    let mut sge = ffi::ibv_sge {
        addr: addr as u64,
        length: len,
        lkey,
    };
    let mut wr = ffi::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = ptr::null_mut();
    let rc = post(&mut wr, &mut bad);
    if rc != 0 {
        return Err(VerbsError::call(what, rc_error(rc)));
    }
    Ok(())
}

/// A work completion, as much of it as the netmods read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request's own number.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or why it failed.
    pub status: u32,
    /// Whether it completes a receive.
    pub recv: bool,
    /// Bytes received.
    pub byte_len: u32,
    /// The sending queue pair (UD receives).
    pub src_qp: u32,
    /// Our queue pair it belongs to (receives through a shared receive queue).
    pub qp_num: u32,
    /// Whether a GRH precedes the data (UD receives).
    pub grh: bool,
}

impl Completion {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The status's name, for messages.
    pub fn status_name(&self) -> String {
        // SAFETY: the call returns a static string for any status.
        let s = unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(self.status)) };
        s.to_string_lossy().into_owned()
    }
}

/// A completion queue on a channel.
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    channel: Arc<Channel>,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
}

// SAFETY: as for Context; polling needs `&mut self`.
unsafe impl Send for Cq {}

/// Events acknowledged at once: acknowledging takes a lock in the library.
const ACK_BATCH: u32 = 64;

impl Cq {
    /// A queue of `entries` on `channel`.
    ///
    /// # Errors
    /// The device refused one.
    pub fn new(ctx: &Arc<Context>, channel: &Arc<Channel>, entries: u32) -> Result<Self, VerbsError> {
        let n = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: a live context and channel; no user context pointer.
        let cq = unsafe { ffi::ibv_create_cq(ctx.as_ptr(), n, ptr::null_mut(), channel.ch.as_ptr(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::call("ibv_create_cq", errno()))?;
        Ok(Self {
            cq,
            channel: Arc::clone(channel),
            unacked: 0,
        })
    }

    /// Takes up to `max` completions (32 at most) into `out`; returns how many.
    ///
    /// # Errors
    /// The queue failed (overrun).
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, VerbsError> {
        const BATCH: usize = 32;
        let mut wc = [const { std::mem::MaybeUninit::<ffi::ibv_wc>::uninit() }; BATCH];
        let want = i32::try_from(max.min(BATCH)).unwrap_or(1);
        // SAFETY: a live queue, and room for `want` completions, which the call writes.
        let n = unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), want, wc.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(VerbsError::call("ibv_poll_cq", rc_error(-n)));
        }
        let n = (n as usize).min(BATCH);
        for w in &wc[..n] {
            // SAFETY: the call wrote the first `n` completions.
            let w = unsafe { w.assume_init_ref() };
            out.push(Completion {
                wr_id: w.wr_id,
                status: w.status,
                recv: w.opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0,
                byte_len: w.byte_len,
                src_qp: w.src_qp,
                qp_num: w.qp_num,
                grh: w.wc_flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0,
            });
        }
        Ok(n)
    }

    /// Arms the queue: the channel becomes readable at its next completion.
    ///
    /// # Errors
    /// The call failed.
    pub fn arm(&mut self) -> Result<(), VerbsError> {
        // SAFETY: a live queue.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_req_notify_cq", rc_error(rc)));
        }
        Ok(())
    }

    /// Takes the events waiting on the channel (it is non-blocking), acknowledging them in
    /// batches.
    ///
    /// # Errors
    /// Reading the channel failed other than by having nothing.
    pub fn take_events(&mut self) -> Result<(), VerbsError> {
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live channel; the call writes two pointers we only compare.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel.ch.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc != 0 {
                let e = errno();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(());
                }
                return Err(VerbsError::call("ibv_get_cq_event", e));
            }
            self.unacked += 1;
            if self.unacked >= ACK_BATCH {
                self.ack();
            }
        }
    }

    fn ack(&mut self) {
        if self.unacked > 0 {
            // SAFETY: a live queue, and events taken from its channel.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
    }

    /// The channel.
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.cq.as_ptr()
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // Destroying a queue waits for every event taken from it to be acknowledged.
        self.ack();
        // SAFETY: its queue pairs are gone (their owners drop them first).
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A scatter-gather element: bytes of a registered region, or of any memory when the
/// request is inline.
#[derive(Debug, Clone, Copy)]
pub struct Sge {
    /// The first byte.
    pub addr: *const u8,
    /// Bytes.
    pub len: u32,
    /// The region's key (ignored inline).
    pub lkey: u32,
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle.
    pub ah: &'a Ah,
    /// The queue pair's number.
    pub qpn: u32,
    /// The queue key.
    pub qkey: u32,
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    /// What the device granted.
    pub cap: QpCap,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context; posting needs `&mut self`.
unsafe impl Send for Qp {}

/// What a queue pair was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send requests at once.
    pub send: u32,
    /// Receive requests at once.
    pub recv: u32,
    /// Scatter-gather elements of a send.
    pub send_sge: u32,
    /// Bytes a send may carry inline.
    pub inline: u32,
}

impl Qp {
    /// A UD queue pair on `cq` (sends and receives), brought to RTS with queue key
    /// `qkey` on `port`.
    ///
    /// # Errors
    /// The device refused the pair or a state change.
    pub fn ud(pd: &Arc<Pd>, cq: &Cq, cap: QpCap, port: u8, qkey: u32) -> Result<Self, VerbsError> {
        let qp = Self::create(pd, cq, None, cap, ffi::ibv_qp_type::IBV_QPT_UD)?;
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        qp.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
        )?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        qp.modify(&mut a, m::IBV_QP_STATE)?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        qp.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_SQ_PSN)?;
        Ok(qp)
    }

    /// An RC queue pair on `cq`, receiving through `srq`, in INIT on `port` with every
    /// remote access allowed; [`Qp::connect`] brings it to RTS.
    ///
    /// # Errors
    /// The device refused the pair or the state change.
    pub fn rc(pd: &Arc<Pd>, cq: &Cq, srq: &Srq, cap: QpCap, port: u8) -> Result<Self, VerbsError> {
        let qp = Self::create(pd, cq, Some(srq), cap, ffi::ibv_qp_type::IBV_QPT_RC)?;
        use ffi::ibv_access_flags as acc;
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = acc::IBV_ACCESS_LOCAL_WRITE.0
            | acc::IBV_ACCESS_REMOTE_WRITE.0
            | acc::IBV_ACCESS_REMOTE_READ.0
            | acc::IBV_ACCESS_REMOTE_ATOMIC.0;
        qp.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
        )?;
        Ok(qp)
    }

    /// Brings an RC pair from INIT to RTS, connected to `to`. Its ACK timeout and
    /// [`RETRY_CNT`] make a dead peer an error completion (on rxe a `timeout` of 0 or a
    /// `retry_cnt` of 7 mean "retry forever"); a receiver out of buffers is retried
    /// without end (`rnr_retry` 7), as it is alive.
    ///
    /// # Errors
    /// The device refused a state change.
    pub fn connect(&self, to: RcPath) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as m;
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_enum(to.mtu);
        a.dest_qp_num = to.qpn;
        a.rq_psn = to.their_psn;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ffi::ibv_gid { raw: to.gid };
        a.ah_attr.grh.sgid_index = to.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = to.port;
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
        )?;
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = to.our_psn;
        a.timeout = to.timeout;
        a.retry_cnt = RETRY_CNT;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn create(
        pd: &Arc<Pd>,
        cq: &Cq,
        srq: Option<&Srq>,
        cap: QpCap,
        ty: ffi::ibv_qp_type::Type,
    ) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.srq = srq.map_or(ptr::null_mut(), |s| s.srq.as_ptr());
        init.qp_type = ty;
        init.cap.max_send_wr = cap.send;
        init.cap.max_recv_wr = cap.recv;
        init.cap.max_send_sge = cap.send_sge;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = cap.inline;
        // SAFETY: a live domain and queue; `init` is read and its `cap` written back.
        let mut qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        if qp.is_null() && cap.inline > 0 {
            // Some devices refuse any inline data: ask again without.
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        }
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::call("ibv_create_qp", errno()))?;
        Ok(Self {
            qp,
            cap: QpCap {
                send: init.cap.max_send_wr,
                recv: init.cap.max_recv_wr,
                send_sge: init.cap.max_send_sge,
                inline: init.cap.max_inline_data,
            },
            _pd: Arc::clone(pd),
        })
    }

    fn modify(&self, a: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> Result<(), VerbsError> {
        // SAFETY: a live pair and a live attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), a, i32::try_from(mask.0).unwrap_or(0)) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_modify_qp", rc_error(rc)));
        }
        Ok(())
    }

    /// The pair's number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: a live pair; the number does not change.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// Posts one receive of `len` bytes at `addr` of a region with key `lkey`.
    ///
    /// # Safety
    /// The bytes must stay allocated and registered, and be neither read nor written by
    /// anyone else, until the receive completes or the pair is destroyed.
    pub unsafe fn post_recv(
        &mut self,
        wr_id: u64,
        addr: *mut u8,
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        let qp = self.qp.as_ptr();
        // SAFETY: a live pair; the request is read during the call; the caller keeps the
        // bytes as the contract says.
        post_one_recv("ibv_post_recv", wr_id, addr, len, lkey, |wr, bad| unsafe {
            ffi::ibv_post_recv(qp, wr, bad)
        })
    }

    /// Posts one signalled one-sided operation between `local` and `remote_addr` of the
    /// peer's registration `rkey`.
    ///
    /// # Safety
    /// `local` must lie in a registration and stay valid (for writing, unless a
    /// [`OneSided::Write`]) and unused until the operation completes.
    ///
    /// # Errors
    /// The queue refused it.
    pub unsafe fn post_one_sided(
        &mut self,
        wr_id: u64,
        op: OneSided,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<(), VerbsError> {
        let mut sge = ffi::ibv_sge {
            addr: local.addr as u64,
            length: local.len,
            lkey: local.lkey,
        };
        // SAFETY: plain data (pointers may be null), valid when all zero.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        use ffi::ibv_wr_opcode as o;
        match op {
            OneSided::Read | OneSided::Write => {
                wr.opcode = if op == OneSided::Read {
                    o::IBV_WR_RDMA_READ
                } else {
                    o::IBV_WR_RDMA_WRITE
                };
                wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
            }
            OneSided::FetchAdd(add) => {
                wr.opcode = o::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            OneSided::CompareSwap(compare, swap) => {
                wr.opcode = o::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live pair; the request and its element are read during the call;
        // the caller keeps the local bytes as the contract says.
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_send", rc_error(rc)));
        }
        Ok(())
    }

    /// Posts one send of `sges`, to `to` on a UD pair (`None` on a connected one);
    /// inline when `inline` (the bytes are copied during the call, any memory will do);
    /// with a completion when `signaled` (an error always makes one).
    ///
    /// # Safety
    /// Unless inline, the bytes must stay allocated, registered and unchanged until the
    /// send completes or the pair is destroyed.
    pub unsafe fn post_send(
        &mut self,
        wr_id: u64,
        sges: &[Sge],
        to: Option<UdDest<'_>>,
        inline: bool,
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let mut list = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 4];
        if sges.len() > list.len() {
            return Err(VerbsError::call(
                "ibv_post_send",
                io::Error::new(io::ErrorKind::InvalidInput, "more than 4 pieces"),
            ));
        }
        for (l, s) in list.iter_mut().zip(sges) {
            *l = ffi::ibv_sge {
                addr: s.addr as u64,
                length: s.len,
                lkey: s.lkey,
            };
        }
        // SAFETY: plain data (pointers may be null), valid when all zero.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = sges.len() as i32;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        if signaled {
            wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if let Some(to) = to {
            wr.wr.ud = ffi::ud_t {
                ah: to.ah.ah.as_ptr(),
                remote_qpn: to.qpn,
                remote_qkey: to.qkey,
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live pair and address handle; the request and list are read during
        // the call; the caller keeps the bytes as the contract says.
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_send", rc_error(rc)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: a live pair, destroyed once; what its requests named is freed only
        // after this (its owner keeps the pair before the memory).
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// Where an RC pair connects to, and the packet numbers each side starts from.
#[derive(Debug, Clone, Copy)]
pub struct RcPath {
    /// The peer's pair.
    pub qpn: u32,
    /// The peer's port GID.
    pub gid: [u8; 16],
    /// Our GID's index and port.
    pub sgid_index: u8,
    /// Our port.
    pub port: u8,
    /// The path MTU in bytes (256 to 4096).
    pub mtu: usize,
    /// The first packet number we send, and the first the peer sends.
    pub our_psn: u32,
    /// See `our_psn`.
    pub their_psn: u32,
    /// The ACK timeout's exponent: 4.096 µs × 2^`timeout` (see [`ack_timeout_for`]).
    pub timeout: u8,
}

/// Retries of an unacknowledged RC packet; rxe takes 7 for "forever".
pub const RETRY_CNT: u8 = 6;

/// The largest ACK-timeout exponent (12 to 20) with which a pair gives up on a silent
/// peer, after its first try and [`RETRY_CNT`] more, within `within`: 4.096 µs × 2^t
/// per try. Longer tries spare a slow but live peer spurious retransmissions; the bound
/// keeps a dead one found in time.
pub fn ack_timeout_for(within: std::time::Duration) -> u8 {
    let tries = f64::from(RETRY_CNT) + 1.0;
    (12..=20)
        .rev()
        .find(|&t| tries * 4.096e-6 * f64::from(1u32 << t) <= within.as_secs_f64())
        .unwrap_or(12)
}

/// An `ibv_mtu` for a size in bytes (the largest not above it).
fn mtu_enum(bytes: usize) -> ffi::ibv_mtu::Type {
    match bytes {
        4096.. => ffi::ibv_mtu::IBV_MTU_4096,
        2048.. => ffi::ibv_mtu::IBV_MTU_2048,
        1024.. => ffi::ibv_mtu::IBV_MTU_1024,
        512.. => ffi::ibv_mtu::IBV_MTU_512,
        _ => ffi::ibv_mtu::IBV_MTU_256,
    }
}

/// A shared receive queue: one ring of receives for every RC pair.
#[derive(Debug)]
pub struct Srq {
    srq: NonNull<ffi::ibv_srq>,
    /// Receives it holds at most.
    pub depth: u32,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context; posting needs `&mut self`.
unsafe impl Send for Srq {}

impl Srq {
    /// A queue of `depth` receives on `pd`.
    ///
    /// # Errors
    /// The device refused it.
    pub fn new(pd: &Arc<Pd>, depth: u32) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut init: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = depth;
        init.attr.max_sge = 1;
        // SAFETY: a live domain and attribute struct; `attr` is written back.
        let srq = unsafe { ffi::ibv_create_srq(pd.pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| VerbsError::call("ibv_create_srq", errno()))?;
        Ok(Self {
            srq,
            depth: init.attr.max_wr.max(1),
            _pd: Arc::clone(pd),
        })
    }

    /// Posts one receive of `len` bytes at `addr` of a region with key `lkey`.
    ///
    /// # Safety
    /// As for [`Qp::post_recv`]: the bytes must stay allocated, registered and
    /// untouched until the receive completes or the queue is destroyed.
    pub unsafe fn post_recv(
        &mut self,
        wr_id: u64,
        addr: *mut u8,
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        let srq = self.srq.as_ptr();
        // SAFETY: a live queue; the request is read during the call; the caller keeps
        // the bytes as the contract says.
        post_one_recv("ibv_post_srq_recv", wr_id, addr, len, lkey, |wr, bad| unsafe {
            ffi::ibv_post_srq_recv(srq, wr, bad)
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: a live queue, destroyed once, after the pairs that use it (their
        // owner keeps them before it).
        unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// An address handle: the way to one remote port, for UD sends.
#[derive(Debug)]
pub struct Ah {
    ah: NonNull<ffi::ibv_ah>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Context.
unsafe impl Send for Ah {}

impl Ah {
    /// The way to `gid` from our `port` and GID `sgid_index` (RoCE and routed IB need the
    /// global header; it does no harm on a subnet).
    ///
    /// # Errors
    /// The device refused it (an unreachable GID).
    pub fn new(pd: &Arc<Pd>, port: u8, sgid_index: u8, gid: [u8; 16]) -> Result<Self, VerbsError> {
        // SAFETY: plain data, valid when all zero.
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.grh.dgid = ffi::ibv_gid { raw: gid };
        a.grh.sgid_index = sgid_index;
        a.grh.hop_limit = 64;
        a.port_num = port;
        // SAFETY: a live domain and attribute struct.
        let ah = unsafe { ffi::ibv_create_ah(pd.pd.as_ptr(), &mut a) };
        let ah = NonNull::new(ah).ok_or_else(|| VerbsError::call("ibv_create_ah", errno()))?;
        Ok(Self {
            ah,
            _pd: Arc::clone(pd),
        })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: a live handle, destroyed once; a send naming it has completed or its
        // pair is gone (the endpoint drops its pair first).
        unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}
