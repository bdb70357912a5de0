//! The exported libibverbs functions (`rsnic_<name>`, given their public
//! name and rdma-core's symbol version by build.rs) and the `ibv_context_ops`
//! that verbs.h's inline `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` call. Return conventions and errno values are those
//! of the man pages (`ibv_open_device(3)`, `ibv_modify_qp(3)`, ...): a
//! pointer or NULL with errno; 0 or an errno value; 0 or -1 with errno
//! where the page says so. Every function runs inside [`guard`], which
//! catches a panic and fails the call instead of unwinding into C.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use libc::{EAGAIN, EBUSY, EINVAL, ENODEV, ENOMEM, EOPNOTSUPP};
use nic::contract::{AsyncEvent, QpOptions, QpTransition, RemoteQp};
use nic::verbs::VerbsError;
use rdma::transport::{RecvWr, SendOp, SendWr, Sge};

use crate::backend::Backend;
use crate::ffi::*;
use crate::objects::*;
use crate::translate::*;

/// The largest inline payload a QP may ask for (`max_inline_data`).
pub const MAX_INLINE: u32 = 256;
/// The deepest send or receive queue (`max_qp_wr`).
pub const MAX_WR: u32 = 16384;
/// The deepest CQ (`max_cqe`).
pub const MAX_CQE: i32 = 1 << 20;
/// Empty `ibv_poll_cq` calls in a row before one `sched_yield` (unless
/// `RSNIC_BUSY_POLL=1`).
pub const IDLE_POLLS_BEFORE_YIELD: u32 = 64;
/// Outstanding READ/ATOMIC requests a QP issues and takes.
pub const MAX_RD_ATOMIC: u8 = 16;

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// Runs `f`; a panic is reported on stderr and turned into `fail` (a
/// failed call), never an unwind into the C caller.
#[inline]
pub fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("rsnic: internal error (a panic) in a verbs call; the call fails with EIO");
            set_errno(libc::EIO);
            fail
        }
    }
}

/// NULL with errno `e`.
fn null_with<T>(e: i32) -> *mut T {
    set_errno(e);
    null_mut()
}

/// -1 with errno `e`.
fn minus_one(e: i32) -> c_int {
    set_errno(e);
    -1
}

// ---------------------------------------------------------------- devices

/// The one device, `rsnic0`, as `ibv_get_device_list` lists it.
struct DeviceBox(*mut ibv_device);
// SAFETY: the device struct is written once, before it is shared, and only
// read afterwards.
unsafe impl Send for DeviceBox {}
// SAFETY: as above.
unsafe impl Sync for DeviceBox {}

static DEVICE: OnceLock<DeviceBox> = OnceLock::new();

fn copy_cstr(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
}

fn device() -> *mut ibv_device {
    DEVICE
        .get_or_init(|| {
            let mut d = Box::new(ibv_device {
                node_type: IBV_NODE_CA,
                transport_type: IBV_TRANSPORT_IB,
                ..Default::default()
            });
            copy_cstr(&mut d.name, "rsnic0");
            copy_cstr(&mut d.dev_name, "uverbs_rsnic0");
            copy_cstr(&mut d.dev_path, "/dev/null");
            copy_cstr(&mut d.ibdev_path, "/sys/class/infiniband/rsnic0");
            DeviceBox(Box::into_raw(d))
        })
        .0
}

fn is_our_device(d: *mut ibv_device) -> bool {
    !d.is_null() && d == device()
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        let n = match Backend::configured() {
            Ok(_) => 1,
            Err(why) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("rsnic: no device: {why}"));
                0
            }
        };
        let mut list: Box<[*mut ibv_device; 2]> = Box::new([null_mut(); 2]);
        if n == 1 {
            list[0] = device();
        }
        if !num.is_null() {
            // SAFETY: the caller passes an int to fill (or NULL, checked).
            unsafe { *num = n };
        }
        Box::into_raw(list).cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if !list.is_null() {
            // SAFETY: `list` came from `rsnic_ibv_get_device_list`, a boxed
            // array of two pointers (ibv_free_device_list(3): only lists it
            // returned may be passed).
            drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_device; 2]>()) });
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || {
        if !is_our_device(d) {
            set_errno(EINVAL);
            return std::ptr::null();
        }
        // SAFETY: our device, alive for the whole process.
        unsafe { (*d).name.as_ptr() }
    })
}

/// The node GUID: the EUI-64 of the port's MAC (as rxe derives it), in
/// network order.
fn node_guid(mac: [u8; 6]) -> u64 {
    let g = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_ne_bytes(g)
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_device_guid(d: *mut ibv_device) -> u64 {
    guard(0, || {
        if !is_our_device(d) {
            set_errno(EINVAL);
            return 0;
        }
        Backend::configured()
            .ok()
            .and_then(|c| c.port_mac())
            .map_or(0, node_guid)
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_device_index(d: *mut ibv_device) -> c_int {
    guard(-1, || if is_our_device(d) { 0 } else { -1 })
}

#[no_mangle]
extern "C" fn rsnic_ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
    guard(null_mut(), || {
        if !is_our_device(d) {
            return null_with(EINVAL);
        }
        let backend = match Backend::get() {
            Ok(b) => b,
            Err(why) => {
                eprintln!("rsnic: cannot open rsnic0: {why}");
                return null_with(ENODEV);
            }
        };
        // SAFETY: eventfd takes no pointers; a non-negative result is ours.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return null_with(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(ENOMEM),
            );
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let async_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let mut ctx = Box::new(Context {
            vctx: verbs_context::default(),
            backend,
            async_fd,
        });
        let v = &mut ctx.vctx;
        v.sz = std::mem::size_of::<verbs_context>();
        v.query_port = Some(ctx_query_port);
        v.query_device_ex = Some(ctx_query_device_ex);
        v.context.device = d;
        v.context.cmd_fd = -1;
        v.context.async_fd = efd;
        v.context.num_comp_vectors = 1;
        // verbs.h: `#define __VERBS_ABI_IS_EXTENDED ((void *)UINTPTR_MAX)`.
        v.context.abi_compat = usize::MAX as *mut c_void;
        v.context.ops.post_send = Some(op_post_send);
        v.context.ops.post_recv = Some(op_post_recv);
        v.context.ops.poll_cq = Some(op_poll_cq);
        v.context.ops.req_notify_cq = Some(op_req_notify_cq);
        let ctx = Box::into_raw(ctx);
        // SAFETY: just allocated.
        let p = unsafe { &raw mut (*ctx).vctx.context };
        register(p.cast(), Kind::Context);
        p
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_close_device(c: *mut ibv_context) -> c_int {
    guard(-1, || {
        if !unregister(c.cast(), Kind::Context) {
            return minus_one(EINVAL);
        }
        let off = std::mem::offset_of!(Context, vctx.context);
        // SAFETY: a live context we allocated in `open_device` (checked and
        // now unregistered, so nobody else frees it).
        drop(unsafe { Box::from_raw(c.cast::<u8>().sub(off).cast::<Context>()) });
        0
    })
}

/// Our context of `c`, if it is one.
fn ctx<'a>(c: *mut ibv_context) -> Option<&'a Context> {
    // SAFETY: checked live in the registry just now.
    is_live(c.cast(), Kind::Context).then(|| unsafe { Context::from_ibv(c) })
}

// ---------------------------------------------------------------- queries

fn device_attr(b: &Backend) -> ibv_device_attr {
    let mut a = ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, concat!("rsnic ", env!("CARGO_PKG_VERSION")));
    let guid = node_guid(b.dev.mac());
    a.node_guid = guid;
    a.sys_image_guid = guid;
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 4096;
    // An unknown vendor: perftest then takes its plain, portable paths.
    a.vendor_id = 0;
    a.vendor_part_id = 0;
    a.hw_ver = 0;
    a.max_qp = nic::contract::MAX_QPS as i32;
    a.max_qp_wr = MAX_WR as i32;
    a.device_cap_flags = 0;
    a.max_sge = 1;
    a.max_sge_rd = 1;
    a.max_cq = 65536;
    a.max_cqe = MAX_CQE;
    a.max_mr = 65536;
    a.max_pd = 65536;
    a.max_qp_rd_atom = MAX_RD_ATOMIC.into();
    a.max_qp_init_rd_atom = MAX_RD_ATOMIC.into();
    a.max_res_rd_atom = i32::from(MAX_RD_ATOMIC) * nic::contract::MAX_QPS as i32;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

#[no_mangle]
extern "C" fn rsnic_ibv_query_device(c: *mut ibv_context, out: *mut ibv_device_attr) -> c_int {
    guard(libc::EIO, || {
        let Some(ctx) = ctx(c) else { return EINVAL };
        if out.is_null() {
            return EINVAL;
        }
        // SAFETY: the caller's struct to fill (checked non-NULL).
        unsafe { out.write(device_attr(ctx.backend)) };
        0
    })
}

/// `verbs_context.query_device_ex`: the base attributes, nothing extended.
extern "C" fn ctx_query_device_ex(
    c: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    out: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    guard(libc::EIO, || {
        let Some(ctx) = ctx(c) else { return EINVAL };
        if out.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
            return EINVAL;
        }
        let mut ex = ibv_device_attr_ex {
            orig_attr: device_attr(ctx.backend),
            ..Default::default()
        };
        ex.phys_port_cnt_ex = 1;
        let n = size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct of `size` bytes; we write at most that.
        unsafe { std::ptr::copy_nonoverlapping((&raw const ex).cast::<u8>(), out.cast::<u8>(), n) };
        0
    })
}

fn port_attr(b: &Backend) -> ibv_port_attr {
    let mtu = mtu_enum(b.dev.max_path_mtu());
    let up = b.link_up();
    let mut a = ibv_port_attr {
        state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: mtu,
        active_mtu: mtu,
        gid_tbl_len: 1,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        // IB_WIDTH_4X and IB_SPEED_EDR: what rxe reports for a 100 GbE link.
        active_width: 2,
        active_speed: 32,
        phys_state: if up { 5 } else { 3 },
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    };
    a.max_vl_num = 1;
    a
}

#[no_mangle]
extern "C" fn rsnic_ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut _compat_ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(ctx) = ctx(c) else { return EINVAL };
        if out.is_null() || port != 1 {
            return EINVAL;
        }
        let a = port_attr(ctx.backend);
        let n =
            std::mem::size_of::<_compat_ibv_port_attr>().min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's (older, shorter) port attribute struct: the
        // new struct only appended fields, so its first `n` bytes are it.
        unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), out.cast::<u8>(), n) };
        0
    })
}

/// `verbs_context.query_port` (the `ibv_query_port` macro's path).
extern "C" fn ctx_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    size: usize,
) -> c_int {
    guard(libc::EIO, || {
        let Some(ctx) = ctx(c) else { return EINVAL };
        if out.is_null() || port != 1 {
            return EINVAL;
        }
        let a = port_attr(ctx.backend);
        let n = size.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's struct of `size` bytes; we write at most that.
        unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), out.cast::<u8>(), n) };
        0
    })
}

fn our_gid(ctx: &Context) -> [u8; 16] {
    gid_of_ipv4(ctx.backend.dev.ip())
}

#[no_mangle]
extern "C" fn rsnic_ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        let Some(ctx) = ctx(c) else {
            return minus_one(EINVAL);
        };
        if gid.is_null() || port != 1 || index != 0 {
            return minus_one(EINVAL);
        }
        // SAFETY: the caller's GID to fill.
        unsafe { (*gid).raw = our_gid(ctx) };
        0
    })
}

fn gid_entry(ctx: &Context) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: our_gid(ctx) },
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    }
}

#[no_mangle]
extern "C" fn rsnic__ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    size: usize,
) -> c_int {
    guard(libc::EIO, || {
        let Some(ctx) = ctx(c) else { return EINVAL };
        if entry.is_null() || flags != 0 || port != 1 || size < std::mem::size_of::<ibv_gid_entry>()
        {
            return EINVAL;
        }
        if index != 0 {
            // ibv_query_gid_ex(3): an index past the table is EINVAL.
            return EINVAL;
        }
        // SAFETY: the caller's entry of at least our size.
        unsafe { entry.write(gid_entry(ctx)) };
        0
    })
}

#[no_mangle]
extern "C" fn rsnic__ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        let Some(ctx) = ctx(c) else {
            return -(EINVAL as isize);
        };
        if entries.is_null() || flags != 0 || size < std::mem::size_of::<ibv_gid_entry>() {
            return -(EINVAL as isize);
        }
        if max == 0 {
            return -(EINVAL as isize);
        }
        // SAFETY: the caller's array of `max` entries of `size` bytes each.
        unsafe { entries.write(gid_entry(ctx)) };
        1
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; `ibv_devinfo` calls it):
/// `enum ibv_gid_type_sysfs`, where RoCE v2 is 1.
#[no_mangle]
extern "C" fn rsnic_ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut c_uint,
) -> c_int {
    guard(-1, || {
        if ctx(c).is_none() || ty.is_null() || port != 1 || index != 0 {
            return minus_one(EINVAL);
        }
        // SAFETY: the caller's enum to fill.
        unsafe { *ty = 1 };
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        if ctx(c).is_none() || pkey.is_null() || port != 1 || index != 0 {
            return minus_one(EINVAL);
        }
        // SAFETY: the caller's pkey to fill: the default P_Key, network order.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    guard(-1, || {
        if ctx(c).is_none() || port != 1 || u16::from_be(pkey) & 0x7fff != 0x7fff {
            return minus_one(EINVAL);
        }
        0
    })
}

// ------------------------------------------------------- PDs and regions

#[no_mangle]
extern "C" fn rsnic_ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        let Some(ctx) = ctx(c) else {
            return null_with(EINVAL);
        };
        let pd = ctx.backend.dev.alloc_pd();
        let b = Box::new(Pd {
            ibv: ibv_pd {
                context: c,
                handle: pd.id(),
            },
            pd: Some(pd),
        });
        let p = Box::into_raw(b);
        register(p.cast(), Kind::Pd);
        p.cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        if !is_live(p.cast(), Kind::Pd) {
            return EINVAL;
        }
        // SAFETY: a live PD of ours (checked).
        let pd = unsafe { &mut *p.cast::<Pd>() };
        // SAFETY: its context outlives it (the program closes it last).
        let dev = &unsafe { Context::from_ibv(pd.ibv.context) }.backend.dev;
        let Some(h) = pd.pd.take() else { return EINVAL };
        if let Err(busy) = dev.dealloc_pd(h) {
            pd.pd = Some(busy.handle);
            return EBUSY;
        }
        unregister(p.cast(), Kind::Pd);
        // SAFETY: allocated in alloc_pd, now unregistered.
        drop(unsafe { Box::from_raw(p.cast::<Pd>()) });
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    rsnic_ibv_reg_mr_iova2(p, addr, len, addr as u64, access as c_uint)
}

#[no_mangle]
extern "C" fn rsnic_ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    rsnic_ibv_reg_mr_iova2(p, addr, len, iova, access as c_uint)
}

/// `ibv_reg_mr_iova2(3)`. The engine's virtual address of a region is its
/// pointer (DESIGN.md §5), so an `iova` other than `addr` is refused with
/// EINVAL (perftest and ibv_rc_pingpong pass iova == addr).
#[no_mangle]
extern "C" fn rsnic_ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        if !is_live(p.cast(), Kind::Pd) {
            return null_with(EINVAL);
        }
        if addr.is_null() || len == 0 || iova != addr as u64 {
            return null_with(EINVAL);
        }
        let acc = match access_of(access) {
            Ok(a) => a,
            Err(e) => return null_with(e),
        };
        // SAFETY: a live PD of ours (checked).
        let pd = unsafe { &*p.cast::<Pd>() };
        let Some(h) = pd.pd.as_ref() else {
            return null_with(EINVAL);
        };
        // SAFETY: ibv_reg_mr(3)'s contract: the buffer stays valid until
        // ibv_dereg_mr, which returns only once the engine let go of it.
        let mr = match unsafe { h.reg_user_mr(addr.cast(), len, acc) } {
            Ok(m) => m,
            Err(e) => return null_with(errno_of(&e)),
        };
        let b = Box::new(Mr {
            ibv: ibv_mr {
                context: pd.ibv.context,
                pd: p,
                addr,
                length: len,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            },
            mr: Some(mr),
        });
        let m = Box::into_raw(b);
        register(m.cast(), Kind::Mr);
        m.cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if !unregister(m.cast(), Kind::Mr) {
            return EINVAL;
        }
        // SAFETY: allocated in reg_mr, now unregistered.
        let mut mr = unsafe { Box::from_raw(m.cast::<Mr>()) };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(mr.ibv.context) }.backend.dev;
        match mr.mr.take().map(|h| dev.dereg_mr(h)) {
            Some(Err(e)) => errno_of(&e),
            _ => 0,
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_rereg_mr(
    _m: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _a: *mut c_void,
    _l: usize,
    _acc: c_int,
) -> c_int {
    EOPNOTSUPP
}

// -------------------------------------------------------- channels and CQs

#[no_mangle]
extern "C" fn rsnic_ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        if ctx(c).is_none() {
            return null_with(EINVAL);
        }
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return null_with(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(ENOMEM),
            );
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let b = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: c,
                fd,
                refcnt: 0,
            },
            epoll,
            cqs: AtomicU32::new(0),
        });
        let p = Box::into_raw(b);
        register(p.cast(), Kind::Channel);
        p.cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(-1, || {
        if !is_live(ch.cast(), Kind::Channel) {
            return minus_one(EINVAL);
        }
        // SAFETY: a live channel (checked).
        if unsafe { &*ch.cast::<Channel>() }
            .cqs
            .load(Ordering::Acquire)
            != 0
        {
            return minus_one(EBUSY);
        }
        unregister(ch.cast(), Kind::Channel);
        // SAFETY: allocated in create_comp_channel, now unregistered.
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    _vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        let Some(ctx) = ctx(c) else {
            return null_with(EINVAL);
        };
        if !(1..=MAX_CQE).contains(&cqe) {
            return null_with(EINVAL);
        }
        if !ch.is_null() && !is_live(ch.cast(), Kind::Channel) {
            return null_with(EINVAL);
        }
        let dev = &ctx.backend.dev;
        let depth = cqe as usize;
        let made = if ch.is_null() {
            dev.create_cq(depth)
        } else {
            dev.create_cq_with_channel(depth)
        };
        let cq = match made {
            Ok(q) => q,
            Err(e) => return null_with(errno_of(&e)),
        };
        let id = cq.id();
        let efd = cq.channel_fd();
        let b = Box::new(Cq {
            ibv: ibv_cq {
                context: c,
                channel: ch,
                cq_context,
                handle: id,
                cqe,
                ..Default::default()
            },
            lock: Spin::default(),
            cq: std::cell::UnsafeCell::new(Some(cq)),
            channel: ch.cast(),
            id,
            idle_polls: std::cell::Cell::new(0),
            yield_when_idle: !ctx.backend.cfg.busy_poll,
        });
        let p = Box::into_raw(b);
        if let (false, Some(efd)) = (ch.is_null(), efd) {
            // SAFETY: a live channel (checked above).
            let chan = unsafe { &*ch.cast::<Channel>() };
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: p as u64,
            };
            // SAFETY: both descriptors are live; `ev` is a valid event.
            let rc = unsafe {
                libc::epoll_ctl(chan.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, efd, &mut ev)
            };
            if rc != 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(ENOMEM);
                // SAFETY: just allocated, never shared.
                drop(unsafe { Box::from_raw(p) });
                return null_with(e);
            }
            chan.cqs.fetch_add(1, Ordering::AcqRel);
        }
        register(p.cast(), Kind::Cq);
        live()
            .get_or_insert_with(Default::default)
            .cqs
            .insert(id, p as usize);
        p.cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_destroy_cq(q: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        if !is_live(q.cast(), Kind::Cq) {
            return EINVAL;
        }
        // SAFETY: a live CQ of ours (checked).
        let cq = unsafe { &*q.cast::<Cq>() };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(cq.ibv.context) }.backend.dev;
        let g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        let slot = unsafe { &mut *cq.cq.get() };
        let Some(h) = slot.take() else { return EINVAL };
        let efd = h.channel_fd();
        if let Err(busy) = dev.destroy_cq(h) {
            *slot = Some(busy.handle);
            return EBUSY;
        }
        drop(g);
        if let (false, Some(efd)) = (cq.channel.is_null(), efd) {
            // SAFETY: a CQ's channel cannot be destroyed while the CQ lives.
            let chan = unsafe { &*cq.channel };
            // SAFETY: live descriptors; a DEL takes no event.
            unsafe {
                libc::epoll_ctl(chan.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, efd, null_mut())
            };
            chan.cqs.fetch_sub(1, Ordering::AcqRel);
        }
        unregister(q.cast(), Kind::Cq);
        if let Some(l) = live().as_mut() {
            l.cqs.remove(&cq.id);
        }
        // SAFETY: allocated in create_cq, now unregistered.
        drop(unsafe { Box::from_raw(q.cast::<Cq>()) });
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_resize_cq(_q: *mut ibv_cq, _cqe: c_int) -> c_int {
    EOPNOTSUPP
}

/// `ibv_poll_cq` (through `ops.poll_cq`): at most `n` completions into
/// `wc`; no allocation, no system call, one uncontended lock.
extern "C" fn op_poll_cq(q: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if n < 0 || (n > 0 && wc.is_null()) {
            return -1;
        }
        // SAFETY: `ops.poll_cq` is only reached through a CQ of ours.
        let cq = unsafe { &*q.cast::<Cq>() };
        let _g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        let Some(h) = (unsafe { &mut *cq.cq.get() }).as_mut() else {
            return -1;
        };
        let mut got = 0;
        while got < n {
            let Some(c) = h.poll_one() else { break };
            // SAFETY: the caller's array of `n` entries.
            fill_wc(&c, unsafe { &mut *wc.add(got as usize) });
            got += 1;
        }
        if got == 0 && cq.yield_when_idle {
            // A program spinning on an empty CQ (perftest does) on a host
            // with fewer cores than spinning threads holds its core for a
            // whole scheduler slice while the engine (or the peer) needs it:
            // after IDLE_POLLS_BEFORE_YIELD empty polls in a row it yields
            // once, as the engine does (RSNIC_BUSY_POLL=1: never).
            let idle = cq.idle_polls.get() + 1;
            if idle >= IDLE_POLLS_BEFORE_YIELD {
                cq.idle_polls.set(0);
                std::thread::yield_now();
            } else {
                cq.idle_polls.set(idle);
            }
        } else {
            cq.idle_polls.set(0);
        }
        got
    })
}

/// `ibv_req_notify_cq` (through `ops.req_notify_cq`): arms the CQ's
/// channel for the next completion (solicited-only is taken as any).
extern "C" fn op_req_notify_cq(q: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: reached only through a CQ of ours.
        let cq = unsafe { &*q.cast::<Cq>() };
        let _g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        match (unsafe { &*cq.cq.get() }).as_ref() {
            Some(h) => {
                h.req_notify();
                0
            }
            None => EINVAL,
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if !is_live(ch.cast(), Kind::Channel) || cq_out.is_null() || ctx_out.is_null() {
            return minus_one(EINVAL);
        }
        // SAFETY: a live channel (checked).
        let chan = unsafe { &*ch.cast::<Channel>() };
        let epfd = chan.epoll.as_raw_fd();
        // A program that made the channel's fd non-blocking gets EAGAIN
        // instead of a sleep, as from the uverbs descriptor.
        // SAFETY: F_GETFL on a live descriptor.
        let nonblock = unsafe { libc::fcntl(epfd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        loop {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: one event slot, live for the call.
            let n = unsafe { libc::epoll_wait(epfd, &mut ev, 1, if nonblock { 0 } else { -1 }) };
            if n < 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                // DPDK's own signals (net_tap's SIGIO) interrupt the sleep:
                // not the program's, so not its EINTR.
                if e == libc::EINTR {
                    continue;
                }
                return minus_one(e);
            }
            if n == 0 {
                return minus_one(EAGAIN);
            }
            let q = ev.u64 as *mut Cq;
            // SAFETY: the CQ is registered in the epoll set only while live.
            let cq = unsafe { &*q };
            let efd = {
                let _g = cq.lock.lock();
                // SAFETY: under the CQ's lock.
                (unsafe { &*cq.cq.get() })
                    .as_ref()
                    .and_then(|h| h.channel_fd())
            };
            let Some(efd) = efd else { continue };
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
            let r = unsafe { libc::read(efd, (&raw mut count).cast(), 8) };
            if r != 8 {
                // Another thread took this event first.
                continue;
            }
            // SAFETY: the caller's out parameters (checked non-NULL).
            unsafe {
                *cq_out = q.cast();
                *ctx_out = cq.ibv.cq_context;
            }
            return 0;
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_ack_cq_events(q: *mut ibv_cq, n: c_uint) {
    guard((), || {
        if is_live(q.cast(), Kind::Cq) {
            // SAFETY: a live CQ of ours; the counter is the program's to read.
            let cq = unsafe { &mut *q.cast::<Cq>() };
            cq.ibv.comp_events_completed = cq.ibv.comp_events_completed.wrapping_add(n);
        }
    })
}

// ------------------------------------------------------------------- QPs

#[no_mangle]
extern "C" fn rsnic_ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard(null_mut(), || {
        if !is_live(p.cast(), Kind::Pd) || attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL); `cap` is
        // written back below, as ibv_create_qp(3) says.
        let a = unsafe { &mut *attr };
        if a.qp_type != IBV_QPT_RC {
            // UD, UC, XRC, raw packet: not implemented by this NIC.
            return null_with(EOPNOTSUPP);
        }
        if !a.srq.is_null() {
            return null_with(EOPNOTSUPP);
        }
        if !is_live(a.send_cq.cast(), Kind::Cq) || !is_live(a.recv_cq.cast(), Kind::Cq) {
            return null_with(EINVAL);
        }
        let cap = a.cap;
        if cap.max_send_wr > MAX_WR
            || cap.max_recv_wr > MAX_WR
            || cap.max_send_sge > 1
            || cap.max_recv_sge > 1
            || cap.max_inline_data > MAX_INLINE
        {
            return null_with(EINVAL);
        }
        // SAFETY: a live PD and live CQs of ours (checked).
        let (pd, scq, rcq) = unsafe {
            (
                &*p.cast::<Pd>(),
                &*a.send_cq.cast::<Cq>(),
                &*a.recv_cq.cast::<Cq>(),
            )
        };
        // SAFETY: the PD's context outlives it.
        let backend = unsafe { Context::from_ibv(pd.ibv.context) }.backend;
        let Some(h) = pd.pd.as_ref() else {
            return null_with(EINVAL);
        };
        let opts = QpOptions {
            sq_depth: cap.max_send_wr.max(1) as u16,
            rq_depth: cap.max_recv_wr.max(1) as u16,
            mtu: backend.dev.max_path_mtu(),
            cc: backend.cfg.cc,
            max_rd_atomic: MAX_RD_ATOMIC,
            max_sge: 1,
            max_inline_data: cap.max_inline_data,
            ..QpOptions::default()
        };
        let made = {
            let _g1 = scq.lock.lock();
            let _g2 = (!std::ptr::eq(scq, rcq)).then(|| rcq.lock.lock());
            // SAFETY: under both CQs' locks.
            let (s, r) = unsafe { ((*scq.cq.get()).as_ref(), (*rcq.cq.get()).as_ref()) };
            match (s, r) {
                (Some(s), Some(r)) => h.create_qp(s, r, opts),
                _ => return null_with(EINVAL),
            }
        };
        let qp = match made {
            Ok(q) => q,
            Err(e) => return null_with(errno_of(&e)),
        };
        let granted = ibv_qp_cap {
            max_send_wr: u32::from(opts.sq_depth),
            max_recv_wr: u32::from(opts.rq_depth),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cap.max_inline_data,
        };
        a.cap = granted;
        let qpn = qp.qpn();
        let b = Box::new(Qp {
            ibv: ibv_qp {
                context: pd.ibv.context,
                qp_context: a.qp_context,
                pd: p,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: null_mut(),
                handle: qpn,
                qp_num: qpn,
                state: IBV_QPS_RESET,
                qp_type: IBV_QPT_RC,
                ..Default::default()
            },
            lock: Spin::default(),
            inner: std::cell::UnsafeCell::new(QpInner {
                qp: Some(qp),
                state: IBV_QPS_RESET,
                sq_sig_all: a.sq_sig_all != 0,
                cap: granted,
                attr: ibv_qp_attr {
                    cap: granted,
                    ..Default::default()
                },
            }),
        });
        let q = Box::into_raw(b);
        register(q.cast(), Kind::Qp);
        live()
            .get_or_insert_with(Default::default)
            .qps
            .insert(qpn, q as usize);
        q.cast()
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        if !unregister(q.cast(), Kind::Qp) {
            return EINVAL;
        }
        // SAFETY: allocated in create_qp, now unregistered.
        let qp = unsafe { Box::from_raw(q.cast::<Qp>()) };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(qp.ibv.context) }.backend.dev;
        if let Some(l) = live().as_mut() {
            l.qps.remove(&qp.ibv.qp_num);
        }
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        match inner.qp.take().map(|h| dev.destroy_qp(h)) {
            Some(Err(e)) => errno_of(&e),
            _ => 0,
        }
    })
}

/// Applies a checked `ibv_modify_qp` to the engine's QP.
fn modify(
    inner: &mut QpInner,
    attr: &ibv_qp_attr,
    mask: u32,
    backend: &Backend,
) -> Result<(), i32> {
    let cur = inner.state;
    let to = check_modify(cur, attr.qp_state, mask)?;
    if mask & IBV_QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
        return Err(EINVAL);
    }
    if mask & IBV_QP_PORT != 0 && attr.port_num != 1 {
        return Err(EINVAL);
    }
    if mask & IBV_QP_PKEY_INDEX != 0 && attr.pkey_index != 0 {
        return Err(EINVAL);
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0
        && attr.qp_access_flags
            & !(IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC)
            != 0
    {
        return Err(EINVAL);
    }
    // max_rd_atomic / max_dest_rd_atomic above this NIC's 16 are taken as
    // 16, not refused: perftest sets them to the *peer's* `out_reads` (Linux
    // rxe advertises 128), and the engine issues and serves at most 16
    // either way; the peer learns 16 from our device attributes.
    if (mask & IBV_QP_RETRY_CNT != 0 && attr.retry_cnt > 7)
        || (mask & IBV_QP_RNR_RETRY != 0 && attr.rnr_retry > 7)
        || (mask & IBV_QP_SQ_PSN != 0 && attr.sq_psn > 0xFF_FFFF)
        || (mask & IBV_QP_RQ_PSN != 0 && attr.rq_psn > 0xFF_FFFF)
        || (mask & IBV_QP_DEST_QPN != 0 && attr.dest_qp_num > 0xFF_FFFF)
    {
        return Err(EINVAL);
    }
    let h = inner.qp.as_mut().ok_or(EINVAL)?;
    let engine = |r: Result<(), VerbsError>| r.map_err(|e| errno_of(&e));
    match (cur, to) {
        (_, IBV_QPS_RESET) => engine(h.modify_qp(QpTransition::Reset))?,
        (_, IBV_QPS_ERR) => engine(h.modify_qp(QpTransition::Err))?,
        (IBV_QPS_RESET, IBV_QPS_INIT) => engine(h.modify_qp(QpTransition::Init))?,
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            let mtu = mtu_bytes(attr.path_mtu).ok_or(EINVAL)?;
            let ah = &attr.ah_attr;
            // RoCE needs the GRH: the peer is its GID (IBA annex A17.4.5).
            if ah.is_global == 0 || ah.grh.sgid_index != 0 || (ah.port_num != 0 && ah.port_num != 1)
            {
                return Err(EINVAL);
            }
            // SAFETY: a GID is 16 plain bytes either way it is read.
            let dgid = unsafe { ah.grh.dgid.raw };
            let ip = ipv4_of_gid(&dgid).ok_or(EINVAL)?;
            let remote = RemoteQp {
                qpn: attr.dest_qp_num,
                psn: attr.rq_psn,
                ip,
                // The peer's MAC by the NIC's own ARP; our own address (two
                // QPs of this device, the GID loopback of a hardware NIC) is
                // our own MAC: the port's link brings the frames back only
                // where it loops (net_ring), as a switch would hairpin.
                mac: (ip == backend.dev.ip()).then(|| backend.dev.mac()),
                mtu: mtu.min(backend.dev.max_path_mtu()),
                cc: backend.cfg.cc,
            };
            engine(h.modify_qp(QpTransition::Rtr(remote)))?;
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            engine(h.set_sq_psn(attr.sq_psn))?;
            engine(h.modify_qp(QpTransition::Rts))?;
        }
        // INIT -> INIT and RTS -> RTS change only attributes kept here.
        _ => {}
    }
    inner.state = to;
    let a = &mut inner.attr;
    a.qp_state = to;
    a.cur_qp_state = to;
    macro_rules! keep {
        ($($bit:ident => $($f:ident),+);+ $(;)?) => {
            $( if mask & $bit != 0 { $( a.$f = attr.$f; )+ } )+
        };
    }
    keep! {
        IBV_QP_ACCESS_FLAGS => qp_access_flags;
        IBV_QP_PKEY_INDEX => pkey_index;
        IBV_QP_PORT => port_num;
        IBV_QP_AV => ah_attr;
        IBV_QP_PATH_MTU => path_mtu;
        IBV_QP_TIMEOUT => timeout;
        IBV_QP_RETRY_CNT => retry_cnt;
        IBV_QP_RNR_RETRY => rnr_retry;
        IBV_QP_RQ_PSN => rq_psn;
        IBV_QP_MAX_QP_RD_ATOMIC => max_rd_atomic;
        IBV_QP_MIN_RNR_TIMER => min_rnr_timer;
        IBV_QP_SQ_PSN => sq_psn;
        IBV_QP_MAX_DEST_RD_ATOMIC => max_dest_rd_atomic;
        IBV_QP_DEST_QPN => dest_qp_num;
    }
    a.max_rd_atomic = a.max_rd_atomic.min(MAX_RD_ATOMIC);
    a.max_dest_rd_atomic = a.max_dest_rd_atomic.min(MAX_RD_ATOMIC);
    Ok(())
}

#[no_mangle]
extern "C" fn rsnic_ibv_modify_qp(q: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        if !is_live(q.cast(), Kind::Qp) || attr.is_null() {
            return EINVAL;
        }
        // SAFETY: a live QP of ours and the caller's attributes (checked).
        let (qp, attr) = unsafe { (&mut *q.cast::<Qp>(), &*attr) };
        // SAFETY: its context outlives it.
        let backend = unsafe { Context::from_ibv(qp.ibv.context) }.backend;
        let g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        let r = modify(inner, attr, mask as u32, backend);
        let state = inner.state;
        drop(g);
        qp.ibv.state = state;
        match r {
            Ok(()) => 0,
            Err(e) => e,
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        if !is_live(q.cast(), Kind::Qp) || attr.is_null() {
            return EINVAL;
        }
        // SAFETY: a live QP of ours (checked).
        let qp = unsafe { &*q.cast::<Qp>() };
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &*qp.inner.get() };
        let mut a = inner.attr;
        a.qp_state = inner.state;
        a.cur_qp_state = inner.state;
        a.cap = inner.cap;
        // SAFETY: the caller's structs to fill (`init` may be NULL).
        unsafe {
            attr.write(a);
            if !init.is_null() {
                init.write(ibv_qp_init_attr {
                    qp_context: qp.ibv.qp_context,
                    send_cq: qp.ibv.send_cq,
                    recv_cq: qp.ibv.recv_cq,
                    srq: null_mut(),
                    cap: inner.cap,
                    qp_type: IBV_QPT_RC,
                    sq_sig_all: inner.sq_sig_all.into(),
                });
            }
        }
        0
    })
}

/// One send work request to the engine.
#[inline]
fn post_one(
    h: &mut nic::verbs::QueuePair,
    inner_sig_all: bool,
    max_inline: u32,
    w: &ibv_send_wr,
) -> Result<(), i32> {
    let op = send_op(w)?;
    let signaled = inner_sig_all || w.send_flags & IBV_SEND_SIGNALED != 0;
    let solicited = w.send_flags & IBV_SEND_SOLICITED != 0;
    let n = usize::try_from(w.num_sge).map_err(|_| EINVAL)?;
    if n > 0 && w.sg_list.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: ibv_post_send(3): `sg_list` holds `num_sge` entries.
    let sges = if n == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    if w.send_flags & IBV_SEND_INLINE != 0
        && matches!(
            op,
            SendOp::Send | SendOp::SendImm(_) | SendOp::Write { .. } | SendOp::WriteImm { .. }
        )
    {
        let mut buf = [0u8; MAX_INLINE as usize];
        let mut len = 0usize;
        for s in sges {
            let l = s.length as usize;
            if len + l > max_inline as usize {
                return Err(EINVAL);
            }
            if l > 0 {
                // SAFETY: an inline SGE is the program's memory, readable for
                // `length` bytes during the call (no lkey needed).
                unsafe {
                    std::ptr::copy_nonoverlapping(s.addr as *const u8, buf[len..].as_mut_ptr(), l)
                };
            }
            len += l;
        }
        return h
            .post_send_inline(w.wr_id, op, &buf[..len], signaled)
            .map_err(|e| errno_of(&e));
    }
    let sge = match sges {
        [] => Sge::default(),
        [s] => Sge {
            addr: s.addr,
            len: s.length,
            lkey: s.lkey,
        },
        _ => return Err(EINVAL),
    };
    h.post_send(SendWr {
        wr_id: w.wr_id,
        op,
        sge,
        signaled,
        solicited,
    })
    .map_err(|e| errno_of(&e))
}

/// `ibv_post_send` (through `ops.post_send`): the chain of work requests,
/// each to the engine's doorbell ring; on the first failure `*bad` is set
/// to it and its errno returned (ibv_post_send(3)). No allocation, no
/// system call.
extern "C" fn op_post_send(
    q: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: `ops.post_send` is only reached through a QP of ours.
        let qp = unsafe { &*q.cast::<Qp>() };
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        let fail = |at: *mut ibv_send_wr, e: i32| {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = at };
            }
            e
        };
        if !matches!(inner.state, IBV_QPS_RTS | IBV_QPS_ERR) {
            return fail(wr, EINVAL);
        }
        let (sig_all, max_inline) = (inner.sq_sig_all, inner.cap.max_inline_data);
        let Some(h) = inner.qp.as_mut() else {
            return fail(wr, EINVAL);
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a work request of the caller's chain.
            let w = unsafe { &*cur };
            if let Err(e) = post_one(h, sig_all, max_inline, w) {
                return fail(cur, e);
            }
            cur = w.next;
        }
        0
    })
}

/// `ibv_post_recv` (through `ops.post_recv`), as [`op_post_send`].
extern "C" fn op_post_recv(
    q: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: reached only through a QP of ours.
        let qp = unsafe { &*q.cast::<Qp>() };
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        let fail = |at: *mut ibv_recv_wr, e: i32| {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = at };
            }
            e
        };
        if inner.state == IBV_QPS_RESET {
            return fail(wr, EINVAL);
        }
        let Some(h) = inner.qp.as_mut() else {
            return fail(wr, EINVAL);
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a work request of the caller's chain.
            let w = unsafe { &*cur };
            let sge = match w.num_sge {
                0 => Sge::default(),
                1 if !w.sg_list.is_null() => {
                    // SAFETY: one entry (num_sge).
                    let s = unsafe { &*w.sg_list };
                    Sge {
                        addr: s.addr,
                        len: s.length,
                        lkey: s.lkey,
                    }
                }
                _ => return fail(cur, EINVAL),
            };
            if let Err(e) = h.post_recv(RecvWr {
                wr_id: w.wr_id,
                sge,
            }) {
                return fail(cur, errno_of(&e));
            }
            cur = w.next;
        }
        0
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_qp_to_qp_ex(_q: *mut ibv_qp) -> *mut ibv_qp_ex {
    // Only QPs created with ibv_create_qp_ex and send_ops_flags have one;
    // this library creates none (ibv_wr_* is not implemented yet).
    null_with(EOPNOTSUPP)
}

// --------------------------------------------------------------- events

#[no_mangle]
extern "C" fn rsnic_ibv_get_async_event(c: *mut ibv_context, ev: *mut ibv_async_event) -> c_int {
    guard(-1, || {
        let Some(ctx) = ctx(c) else {
            return minus_one(EINVAL);
        };
        if ev.is_null() {
            return minus_one(EINVAL);
        }
        let events = ctx.backend.dev.events();
        loop {
            let Some(e) = events.next_timeout(std::time::Duration::from_secs(1)) else {
                continue;
            };
            let l = live();
            let l = l.as_ref();
            let (ty, elem) = match e {
                AsyncEvent::QpFatal { qpn } => match l.and_then(|l| l.qps.get(&qpn)) {
                    Some(&p) => (
                        IBV_EVENT_QP_FATAL,
                        ibv_async_event__bindgen_ty_1 {
                            qp: p as *mut ibv_qp,
                        },
                    ),
                    None => continue,
                },
                AsyncEvent::CqOverrun { cq, .. } => match l.and_then(|l| l.cqs.get(&cq)) {
                    Some(&p) => (
                        IBV_EVENT_CQ_ERR,
                        ibv_async_event__bindgen_ty_1 {
                            cq: p as *mut ibv_cq,
                        },
                    ),
                    None => continue,
                },
                AsyncEvent::PortActive => (
                    IBV_EVENT_PORT_ACTIVE,
                    ibv_async_event__bindgen_ty_1 { port_num: 1 },
                ),
                AsyncEvent::PortDown => (
                    IBV_EVENT_PORT_ERR,
                    ibv_async_event__bindgen_ty_1 { port_num: 1 },
                ),
            };
            // SAFETY: the caller's event to fill.
            unsafe {
                ev.write(ibv_async_event {
                    element: elem,
                    event_type: ty,
                })
            };
            return 0;
        }
    })
}

#[no_mangle]
extern "C" fn rsnic_ibv_ack_async_event(_ev: *mut ibv_async_event) {}

// ------------------------------------------------- not implemented (yet)

#[no_mangle]
extern "C" fn rsnic_ibv_create_srq(_p: *mut ibv_pd, _a: *mut c_void) -> *mut c_void {
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_modify_srq(_s: *mut c_void, _a: *mut c_void, _m: c_int) -> c_int {
    EOPNOTSUPP
}
#[no_mangle]
extern "C" fn rsnic_ibv_query_srq(_s: *mut c_void, _a: *mut c_void) -> c_int {
    EOPNOTSUPP
}
#[no_mangle]
extern "C" fn rsnic_ibv_destroy_srq(_s: *mut c_void) -> c_int {
    // No SRQ is ever created here, so any pointer is foreign.
    EINVAL
}
#[no_mangle]
extern "C" fn rsnic_ibv_create_ah(_p: *mut ibv_pd, _a: *mut ibv_ah_attr) -> *mut c_void {
    // Address handles serve UD QPs, which this NIC does not have.
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_create_ah_from_wc(
    _p: *mut ibv_pd,
    _w: *mut ibv_wc,
    _g: *mut c_void,
    _port: u8,
) -> *mut c_void {
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_init_ah_from_wc(
    _c: *mut ibv_context,
    _port: u8,
    _w: *mut ibv_wc,
    _g: *mut c_void,
    _a: *mut ibv_ah_attr,
) -> c_int {
    minus_one(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_destroy_ah(_a: *mut c_void) -> c_int {
    EINVAL
}
#[no_mangle]
extern "C" fn rsnic_ibv_attach_mcast(_q: *mut ibv_qp, _g: *const ibv_gid, _lid: u16) -> c_int {
    // Multicast needs UD QPs.
    EOPNOTSUPP
}
#[no_mangle]
extern "C" fn rsnic_ibv_detach_mcast(_q: *mut ibv_qp, _g: *const ibv_gid, _lid: u16) -> c_int {
    EOPNOTSUPP
}
#[no_mangle]
extern "C" fn rsnic_ibv_import_device(_fd: c_int) -> *mut ibv_context {
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_import_pd(_c: *mut ibv_context, _h: u32) -> *mut ibv_pd {
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_unimport_pd(_p: *mut ibv_pd) {}
#[no_mangle]
extern "C" fn rsnic_ibv_import_mr(_p: *mut ibv_pd, _h: u32) -> *mut ibv_mr {
    null_with(EOPNOTSUPP)
}
#[no_mangle]
extern "C" fn rsnic_ibv_unimport_mr(_m: *mut ibv_mr) {}
#[no_mangle]
extern "C" fn rsnic_ibv_query_ece(_q: *mut ibv_qp, _e: *mut c_void) -> c_int {
    EOPNOTSUPP
}
#[no_mangle]
extern "C" fn rsnic_ibv_set_ece(_q: *mut ibv_qp, _e: *mut c_void) -> c_int {
    EOPNOTSUPP
}

// ------------------------------------------------ fork and sysfs helpers

/// `ibv_fork_init`: nothing to do (registered memory is not pinned by a
/// kernel driver here), so it succeeds.
#[no_mangle]
extern "C" fn rsnic_ibv_fork_init() -> c_int {
    0
}
#[no_mangle]
extern "C" fn rsnic_ibv_is_fork_initialized() -> c_uint {
    IBV_FORK_UNNEEDED
}
#[no_mangle]
extern "C" fn rsnic_ibv_dontfork_range(_b: *mut c_void, _s: usize) -> c_int {
    0
}
#[no_mangle]
extern "C" fn rsnic_ibv_dofork_range(_b: *mut c_void, _s: usize) -> c_int {
    0
}
/// There is no sysfs entry for rsnic0: -1 (ENOENT), as for a missing file.
#[no_mangle]
extern "C" fn rsnic_ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    minus_one(libc::ENOENT)
}
#[no_mangle]
extern "C" fn rsnic_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_resolve_eth_l2_from_gid`: the peer's MAC by the NIC's own ARP
/// (the GID's IPv4 address); no VLAN (0xffff... is not used: `vid` 0).
#[no_mangle]
extern "C" fn rsnic_ibv_resolve_eth_l2_from_gid(
    c: *mut ibv_context,
    a: *mut ibv_ah_attr,
    mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    guard(-1, || {
        let Some(ctx) = ctx(c) else {
            return minus_one(EINVAL);
        };
        if a.is_null() || mac.is_null() {
            return minus_one(EINVAL);
        }
        // SAFETY: the caller's address vector; a GID is 16 plain bytes.
        let dgid = unsafe { (*a).grh.dgid.raw };
        let Some(ip) = ipv4_of_gid(&dgid) else {
            return minus_one(EINVAL);
        };
        match ctx.backend.dev.resolve_mac(ip) {
            Ok(m) => {
                // SAFETY: the caller's 6-byte MAC buffer and optional VLAN id.
                unsafe {
                    std::ptr::copy_nonoverlapping(m.as_ptr(), mac, 6);
                    if !vid.is_null() {
                        *vid = 0;
                    }
                }
                0
            }
            Err(e) => minus_one(errno_of(&e)),
        }
    })
}

// ------------------------------------------------------------- strings

#[no_mangle]
extern "C" fn rsnic_ibv_wc_status_str(status: c_uint) -> *const c_char {
    wc_status_str(status).as_ptr()
}

#[no_mangle]
extern "C" fn rsnic_ibv_node_type_str(t: c_int) -> *const c_char {
    let s: &CStr = match t {
        IBV_NODE_CA => c"InfiniBand channel adapter",
        IBV_NODE_SWITCH => c"InfiniBand switch",
        IBV_NODE_ROUTER => c"InfiniBand router",
        IBV_NODE_RNIC => c"iWARP NIC",
        IBV_NODE_USNIC => c"usNIC",
        IBV_NODE_USNIC_UDP => c"usNIC UDP",
        IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
extern "C" fn rsnic_ibv_port_state_str(s: c_uint) -> *const c_char {
    let s: &CStr = match s {
        IBV_PORT_NOP => c"no state change (NOP)",
        IBV_PORT_DOWN => c"down",
        IBV_PORT_INIT => c"init",
        IBV_PORT_ARMED => c"armed",
        IBV_PORT_ACTIVE => c"active",
        IBV_PORT_ACTIVE_DEFER => c"active defer",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
extern "C" fn rsnic_ibv_event_type_str(e: c_uint) -> *const c_char {
    let s: &CStr = match e {
        IBV_EVENT_CQ_ERR => c"CQ error",
        IBV_EVENT_QP_FATAL => c"local work queue catastrophic error",
        IBV_EVENT_QP_REQ_ERR => c"invalid request local work queue error",
        IBV_EVENT_QP_ACCESS_ERR => c"local access violation work queue error",
        IBV_EVENT_COMM_EST => c"communication established",
        IBV_EVENT_SQ_DRAINED => c"send queue drained",
        IBV_EVENT_PATH_MIG => c"path migrated",
        IBV_EVENT_PATH_MIG_ERR => c"path migration request error",
        IBV_EVENT_DEVICE_FATAL => c"local catastrophic error",
        IBV_EVENT_PORT_ACTIVE => c"port active",
        IBV_EVENT_PORT_ERR => c"port error",
        IBV_EVENT_LID_CHANGE => c"LID change",
        IBV_EVENT_PKEY_CHANGE => c"P_Key change",
        IBV_EVENT_SM_CHANGE => c"SM change",
        IBV_EVENT_SRQ_ERR => c"SRQ catastrophic error",
        IBV_EVENT_SRQ_LIMIT_REACHED => c"SRQ limit reached",
        IBV_EVENT_QP_LAST_WQE_REACHED => c"last WQE reached",
        IBV_EVENT_CLIENT_REREGISTER => c"client reregistration",
        IBV_EVENT_GID_CHANGE => c"GID table change",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `enum ibv_rate` -> (multiple of 2.5 Gb/s, Mbit/s), verbs.h's values.
const RATES: &[(c_uint, c_int, c_int)] = &[
    (IBV_RATE_2_5_GBPS, 1, 2500),
    (IBV_RATE_5_GBPS, 2, 5000),
    (IBV_RATE_10_GBPS, 4, 10000),
    (IBV_RATE_20_GBPS, 8, 20000),
    (IBV_RATE_30_GBPS, 12, 30000),
    (IBV_RATE_40_GBPS, 16, 40000),
    (IBV_RATE_60_GBPS, 24, 60000),
    (IBV_RATE_80_GBPS, 32, 80000),
    (IBV_RATE_120_GBPS, 48, 120000),
    (IBV_RATE_25_GBPS, 10, 25000),
    (IBV_RATE_50_GBPS, 20, 50000),
    (IBV_RATE_100_GBPS, 40, 100000),
    (IBV_RATE_200_GBPS, 80, 200000),
    (IBV_RATE_300_GBPS, 120, 300000),
    (IBV_RATE_400_GBPS, 160, 400000),
];

#[no_mangle]
extern "C" fn rsnic_ibv_rate_to_mult(r: c_uint) -> c_int {
    RATES.iter().find(|x| x.0 == r).map_or(0, |x| x.1)
}
#[no_mangle]
extern "C" fn rsnic_mult_to_ibv_rate(m: c_int) -> c_uint {
    RATES
        .iter()
        .find(|x| x.1 == m)
        .map_or(IBV_RATE_MAX, |x| x.0)
}
#[no_mangle]
extern "C" fn rsnic_ibv_rate_to_mbps(r: c_uint) -> c_int {
    RATES.iter().find(|x| x.0 == r).map_or(0, |x| x.2)
}
#[no_mangle]
extern "C" fn rsnic_mbps_to_ibv_rate(m: c_int) -> c_uint {
    RATES
        .iter()
        .find(|x| x.2 == m)
        .map_or(IBV_RATE_MAX, |x| x.0)
}
