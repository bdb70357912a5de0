//! The devices list, opening and closing a device, and the queries (`ibv_query_device`, `_port`, `_gid`, `_pkey`); the device's uverbs node as `stat` and `access` see it.

use super::*;
use crate::backend::Backend;
use libc::{EINVAL, ENODEV, ENOMEM};
use rdma::transport::sgl::MAX_SGE;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::OnceLock;

/// The one device, `rsnic0`, as `ibv_get_device_list` lists it.
pub(crate) struct DeviceBox(*mut ibv_device);
// SAFETY: the device struct is written once, before it is shared, and only
// read afterwards.
unsafe impl Send for DeviceBox {}
// SAFETY: as above.
unsafe impl Sync for DeviceBox {}

pub(crate) static DEVICE: OnceLock<DeviceBox> = OnceLock::new();

/// The device as rdma-core allocates one: `struct verbs_device` (driver.h)
/// begins with the `ibv_device` and then the provider's `ops`, which
/// libmlx5's `mlx5dv_is_supported` reads past the `ibv_device` it is given
/// (`verbs_get_device(d)->ops == &mlx5_dev_ops`). UCX 1.13 asks it of every
/// device it opens (uct/ib/mlx5/dv/ib_mlx5dv_md.c:851 and :1255): here it
/// reads this NULL, no provider's, rather than past our allocation.
#[repr(C)]
struct VerbsDevice {
    device: ibv_device,
    ops: *const c_void,
}

/// `ibv_device.dev_name`, the name of a kernel device's uverbs node.
const DEV_NAME: &str = "uverbs_rsnic0";
/// `ibv_device.dev_path`: what the uverbs node stands for ([`dev_node_alias`]).
const DEV_PATH: &CStr = c"/dev/null";
/// `/dev/infiniband/` + [`DEV_NAME`]: where UCX 1.13 looks for the node of
/// each device the list gives it (`uct_ib_device_is_accessible`,
/// uct/ib/base/ib_md.c:1158).
const DEV_NODE: &CStr = c"/dev/infiniband/uverbs_rsnic0";

pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
}

pub(crate) fn device() -> *mut ibv_device {
    DEVICE
        .get_or_init(|| {
            let mut d = Box::new(VerbsDevice {
                device: ibv_device {
                    node_type: IBV_NODE_CA,
                    transport_type: IBV_TRANSPORT_IB,
                    ..Default::default()
                },
                ops: std::ptr::null(),
            });
            copy_cstr(&mut d.device.name, "rsnic0");
            copy_cstr(&mut d.device.dev_name, DEV_NAME);
            copy_cstr(
                &mut d.device.dev_path,
                DEV_PATH.to_str().unwrap_or_default(),
            );
            copy_cstr(&mut d.device.ibdev_path, "/sys/class/infiniband/rsnic0");
            // The `ibv_device` is the first field of a `repr(C)` struct.
            DeviceBox(Box::into_raw(d).cast())
        })
        .0
}

pub(crate) fn is_our_device(d: *mut ibv_device) -> bool {
    !d.is_null() && d == device()
}

/// `path`, or [`DEV_PATH`] where `path` is [`DEV_NODE`] and the list has
/// rsnic0 (not in a forked child, whose list is empty: `guard`).
fn dev_node_alias(path: *const c_char) -> *const c_char {
    if path.is_null() || crate::backend::FORKED.load(std::sync::atomic::Ordering::Relaxed) {
        return path;
    }
    // SAFETY: the caller's NUL-terminated path (stat(2), access(2)).
    if unsafe { CStr::from_ptr(path) } == DEV_NODE && Backend::configured().is_ok() {
        DEV_PATH.as_ptr()
    } else {
        path
    }
}

/// `stat(2)`, where the device's uverbs node exists: a program that checks
/// for it before it lists a device finds rsnic0's ([`DEV_NODE`], a
/// character device: the one `dev_path` names). UCX 1.13 lists no device
/// without one (`uct_ib_query_md_resources`: `stat` of
/// `/dev/infiniband/<dev_name>`, `S_ISCHR`, `access(R_OK | W_OK)`,
/// ib_md.c:1171). Every other path is glibc's own `stat`, which since 2.33
/// is `fstatat(AT_FDCWD, path, buf, 0)` (io/stat.c).
#[no_mangle]
pub(crate) extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's path and buffer, passed on as stat(2) takes them.
    pure(-1, || unsafe {
        libc::fstatat(libc::AT_FDCWD, dev_node_alias(path), buf, 0)
    })
}

/// `access(2)`, for the node as [`stat`] sees it; every other path as
/// POSIX defines `access`: `faccessat(AT_FDCWD, path, mode, 0)`.
#[no_mangle]
pub(crate) extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the caller's path, passed on as access(2) takes it.
    pure(-1, || unsafe {
        libc::faccessat(libc::AT_FDCWD, dev_node_alias(path), mode, 0)
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
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
pub(crate) extern "C" fn rsnic_ibv_free_device_list(list: *mut *mut ibv_device) {
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
pub(crate) extern "C" fn rsnic_ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
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
pub(crate) fn node_guid(mac: [u8; 6]) -> u64 {
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
pub(crate) extern "C" fn rsnic_ibv_get_device_guid(d: *mut ibv_device) -> u64 {
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
pub(crate) extern "C" fn rsnic_ibv_get_device_index(d: *mut ibv_device) -> c_int {
    guard(-1, || if is_our_device(d) { 0 } else { -1 })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
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
        // `async_fd`: an epoll set over the engines' async event
        // descriptors, readable while an event is queued (nic::verbs::
        // AsyncEvents), so the program can poll it; one per context, so
        // that O_NONBLOCK on it is this context's (ibv_get_async_event(3)).
        let async_fd = match async_event_fd(backend) {
            Ok(fd) => fd,
            Err(e) => return null_with(e),
        };
        let efd = async_fd.as_raw_fd();
        let mut ctx = Box::new(Context {
            vctx: verbs_context::default(),
            backend,
            async_fd,
        });
        let v = &mut ctx.vctx;
        v.sz = std::mem::size_of::<verbs_context>();
        v.query_port = Some(ctx_query_port);
        v.query_device_ex = Some(ctx_query_device_ex);
        v.create_qp_ex = Some(ctx_create_qp_ex);
        v.create_cq_ex = Some(ctx_create_cq_ex);
        v.context.device = d;
        v.context.cmd_fd = -1;
        v.context.async_fd = efd;
        v.context.num_comp_vectors = NUM_COMP_VECTORS;
        // verbs.h: `#define __VERBS_ABI_IS_EXTENDED ((void *)UINTPTR_MAX)`.
        v.context.abi_compat = usize::MAX as *mut c_void;
        v.context.ops.post_send = Some(op_post_send);
        v.context.ops.alloc_mw = Some(ctx_alloc_mw);
        v.context.ops.dealloc_mw = Some(ctx_dealloc_mw);
        v.context.ops.bind_mw = Some(ctx_bind_mw);
        v.context.ops.post_recv = Some(op_post_recv);
        v.context.ops.post_srq_recv = Some(op_post_srq_recv);
        v.context.ops.poll_cq = Some(op_poll_cq);
        v.context.ops.req_notify_cq = Some(op_req_notify_cq);
        let ctx = Box::into_raw(ctx);
        // SAFETY: just allocated.
        let p = unsafe { &raw mut (*ctx).vctx.context };
        register(p.cast(), Kind::Context, &[]);
        p
    })
}

/// `ibv_close_device(3)`: 0, or -1 with errno. Its page says it "does not
/// release all the resources allocated using context"; here a context
/// whose PDs, CQs or completion channels still live is refused with EBUSY
/// and stays usable (freeing it under them would leave every later verb
/// on them reading freed memory), as a destroy of any other parent is.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_close_device(c: *mut ibv_context) -> c_int {
    guard(-1, || {
        // Objects of it still live: closed now, freed with the last of them
        // (ibv_close_device(3): "does not release all the resources"; a
        // program such as perftest's ib_send_bw closes with some left).
        if close_with_children(c.cast()) {
            return 0;
        }
        let dying = match begin_destroy(c.cast(), Kind::Context) {
            Ok(d) => d,
            Err(e) => return minus_one(e),
        };
        dying.finish();
        // SAFETY: a context we allocated in `open_device`, now unregistered
        // with nobody holding it, so nobody else frees or uses it.
        unsafe { Context::free(c) };
        0
    })
}

/// A new epoll descriptor watching the device's async event descriptors
/// (level-triggered); the errno if one cannot be made.
fn async_event_fd(backend: &Backend) -> Result<OwnedFd, i32> {
    let errno = || last_errno(ENOMEM);
    // SAFETY: epoll_create1 takes no pointers.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
    for efd in backend.dev.events().fds() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: both descriptors are live (the engines' live as long as
        // the device, which outlives every context); `ev` is valid.
        if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, efd, &mut ev) } != 0 {
            return Err(errno());
        }
    }
    Ok(epoll)
}

/// A held context ([`ctx`]): `ibv_close_device` waits for it.
pub(crate) struct HeldCtx<'a>(&'a Context, #[allow(dead_code)] Held);

impl std::ops::Deref for HeldCtx<'_> {
    type Target = Context;
    fn deref(&self) -> &Context {
        self.0
    }
}

/// Our context of `c`, held for as long as the result lives, if it is one.
pub(crate) fn ctx<'a>(c: *mut ibv_context) -> Option<HeldCtx<'a>> {
    let held = hold(c.cast(), Kind::Context)?;
    // SAFETY: a live context of ours, held.
    Some(HeldCtx(unsafe { Context::from_ibv(c) }, held))
}

// ---------------------------------------------------------------- queries

/// `ibv_device_attr.vendor_id` as Linux rxe reports it (`RXE_VENDOR_ID`).
pub(crate) const RXE_VENDOR_ID: u32 = 0xFF_FFFF;

/// Completion vectors of a context (`ibv_context.num_comp_vectors`): the
/// engine signals every completion channel from its one thread.
pub(crate) const NUM_COMP_VECTORS: i32 = 1;

pub(crate) fn device_attr(b: &Backend) -> ibv_device_attr {
    let mut a = ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, concat!("rsnic ", env!("CARGO_PKG_VERSION")));
    let guid = node_guid(b.dev.mac());
    a.node_guid = guid;
    a.sys_image_guid = guid;
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 4096;
    // What Linux rxe (the other software RoCE device) reports: vendor_id
    // RXE_VENDOR_ID = 0xFFFFFF ("IBTA v1.4 A3.3.1 VENDOR INFORMATION
    // section", drivers/infiniband/sw/rxe/rxe_param.h) and vendor_part_id
    // 0 (rxe_init_device_param leaves it unset in Debian 12's kernel,
    // 6.1). A program sees a software device it knows rather than a
    // zero it may take for "no answer"; perftest (ib_dev_name) still finds
    // no known vendor and takes its plain, portable paths (no inline data).
    a.vendor_id = RXE_VENDOR_ID;
    a.vendor_part_id = 0;
    a.hw_ver = 0;
    a.max_qp = nic::contract::MAX_QPS as i32;
    a.max_qp_wr = MAX_WR as i32;
    // Memory windows of type 1 and 2B, as rxe (IBA 10.6.7).
    a.device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    a.max_sge = MAX_SGE as i32;
    a.max_sge_rd = MAX_SGE as i32;
    a.max_cq = 65536;
    a.max_cqe = MAX_CQE;
    a.max_mr = 65536;
    a.max_pd = 65536;
    // Windows share the regions' key table (2^24 keys).
    a.max_mw = 65536;
    a.max_qp_rd_atom = MAX_RD_ATOMIC.into();
    a.max_srq = 65536;
    a.max_srq_wr = MAX_WR as i32;
    a.max_srq_sge = MAX_SGE as i32;
    a.max_qp_init_rd_atom = MAX_RD_ATOMIC.into();
    a.max_res_rd_atom = i32::from(MAX_RD_ATOMIC) * nic::contract::MAX_QPS as i32;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_device(
    c: *mut ibv_context,
    out: *mut ibv_device_attr,
) -> c_int {
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
pub(crate) extern "C" fn ctx_query_device_ex(
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

pub(crate) fn port_attr(b: &Backend) -> ibv_port_attr {
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
pub(crate) extern "C" fn rsnic_ibv_query_port(
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
pub(crate) extern "C" fn ctx_query_port(
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

pub(crate) fn our_gid(ctx: &Context) -> [u8; 16] {
    gid_of_ipv4(ctx.backend.dev.ip())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_gid(
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
        unsafe { (*gid).raw = our_gid(&ctx) };
        0
    })
}

pub(crate) fn gid_entry(ctx: &Context) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: our_gid(ctx) },
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    }
}

#[no_mangle]
pub(crate) extern "C" fn rsnic__ibv_query_gid_ex(
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
        unsafe { entry.write(gid_entry(&ctx)) };
        0
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic__ibv_query_gid_table(
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
        unsafe { entries.write(gid_entry(&ctx)) };
        1
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; `ibv_devinfo` calls it):
/// `enum ibv_gid_type_sysfs`, where RoCE v2 is 1.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_gid_type(
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
pub(crate) extern "C" fn rsnic_ibv_query_pkey(
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
pub(crate) extern "C" fn rsnic_ibv_get_pkey_index(
    c: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        if ctx(c).is_none() || port != 1 || u16::from_be(pkey) & 0x7fff != 0x7fff {
            return minus_one(EINVAL);
        }
        0
    })
}
