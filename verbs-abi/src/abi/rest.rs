//! Async events, the calls not implemented yet (each fails as rdma-core documents), fork and sysfs helpers, and the string and rate helpers.

use super::*;
use libc::{EINVAL, EOPNOTSUPP};
use nic::contract::AsyncEvent;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_get_async_event(
    c: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        let Some(ctx) = ctx(c) else {
            return minus_one(EINVAL);
        };
        if ev.is_null() {
            return minus_one(EINVAL);
        }
        let events = ctx.backend.dev.events();
        let fd = ctx.async_fd.as_raw_fd();
        // ibv_get_async_event(3): blocking by default; a program that made
        // `async_fd` non-blocking gets -1 with EAGAIN when none is queued.
        // SAFETY: F_GETFL on our live descriptor.
        let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        loop {
            let Some(e) = events.try_next() else {
                if nonblock {
                    return minus_one(libc::EAGAIN);
                }
                let mut ev = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: one event slot, live for the call.
                if unsafe { libc::epoll_wait(fd, &mut ev, 1, -1) } < 0 {
                    // A signal of the program's with a handler: -1 with
                    // EINTR, as rdma-core's read(2) of async_fd gives.
                    let e = last_errno(libc::EIO);
                    return minus_one(e);
                }
                continue;
            };
            // A QP's or CQ's event holds it until ibv_ack_async_event
            // (its destroy waits for that); one whose object is gone or
            // being destroyed is not reported.
            let (ty, elem) = match e {
                AsyncEvent::QpFatal { qpn } => match event_of(EventOf::Qp(qpn)) {
                    Some(p) => (
                        IBV_EVENT_QP_FATAL,
                        ibv_async_event__bindgen_ty_1 {
                            qp: p as *mut ibv_qp,
                        },
                    ),
                    None => continue,
                },
                AsyncEvent::CqOverrun { cq, .. } => match event_of(EventOf::Cq(cq)) {
                    Some(p) => (
                        IBV_EVENT_CQ_ERR,
                        ibv_async_event__bindgen_ty_1 {
                            cq: p as *mut ibv_cq,
                        },
                    ),
                    None => continue,
                },
                AsyncEvent::SrqLimitReached { srq } => match event_of(EventOf::Srq(srq)) {
                    Some(p) => (
                        IBV_EVENT_SRQ_LIMIT_REACHED,
                        ibv_async_event__bindgen_ty_1 {
                            srq: p as *mut ibv_srq,
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

/// `ibv_ack_async_event(3)`: releases the QP or CQ the event held, so
/// that its destroy need not wait.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_ack_async_event(ev: *mut ibv_async_event) {
    guard((), || {
        if ev.is_null() {
            return;
        }
        // SAFETY: the caller's event, filled by ibv_get_async_event.
        let e = unsafe { ev.read() };
        // SAFETY: the union member the event type names.
        let (p, k) = match e.event_type {
            IBV_EVENT_QP_FATAL => (unsafe { e.element.qp }.cast::<c_void>(), Kind::Qp),
            IBV_EVENT_CQ_ERR => (unsafe { e.element.cq }.cast::<c_void>(), Kind::Cq),
            IBV_EVENT_SRQ_LIMIT_REACHED => (unsafe { e.element.srq }.cast::<c_void>(), Kind::Srq),
            _ => return,
        };
        ack_events(p, k, 1, || {});
    })
}

// ------------------------------------------------- not implemented (yet)

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_attach_mcast(
    _q: *mut ibv_qp,
    _g: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // Multicast needs UD QPs.
    EOPNOTSUPP
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_detach_mcast(
    _q: *mut ibv_qp,
    _g: *const ibv_gid,
    _lid: u16,
) -> c_int {
    EOPNOTSUPP
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_import_device(_fd: c_int) -> *mut ibv_context {
    guard(null_mut(), || null_with(EOPNOTSUPP))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_import_pd(_c: *mut ibv_context, _h: u32) -> *mut ibv_pd {
    guard(null_mut(), || null_with(EOPNOTSUPP))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_unimport_pd(_p: *mut ibv_pd) {
    pure((), || {})
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_import_mr(_p: *mut ibv_pd, _h: u32) -> *mut ibv_mr {
    guard(null_mut(), || null_with(EOPNOTSUPP))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_unimport_mr(_m: *mut ibv_mr) {
    pure((), || {})
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_ece(_q: *mut ibv_qp, _e: *mut c_void) -> c_int {
    guard(libc::EIO, || EOPNOTSUPP)
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_set_ece(_q: *mut ibv_qp, _e: *mut c_void) -> c_int {
    guard(libc::EIO, || EOPNOTSUPP)
}

// ------------------------------------------------ fork and sysfs helpers

/// `ibv_fork_init(3)`: 0, with nothing to do, as rdma-core answers where
/// the kernel copies pinned pages on fork ([`rsnic_ibv_is_fork_initialized`]:
/// IBV_FORK_UNNEEDED), also when `RDMAV_FORK_SAFE` asks for it. That is
/// what holds here: registered memory is not pinned for a DMA engine but
/// read and written by the engine's threads, which stay in the parent and
/// see the parent's pages, so the parent's traffic goes on across a
/// `fork()` whatever the child writes. The child has no engine: its verbs
/// fail with EIO (backend::FORKED), as a child's do on rdma-core.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_fork_init() -> c_int {
    pure(libc::EIO, || 0)
}
/// `ibv_is_fork_initialized(3)`: IBV_FORK_UNNEEDED ([`rsnic_ibv_fork_init`]).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_is_fork_initialized() -> c_uint {
    pure(IBV_FORK_UNNEEDED, || IBV_FORK_UNNEEDED)
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dontfork_range(_b: *mut c_void, _s: usize) -> c_int {
    pure(libc::EIO, || 0)
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dofork_range(_b: *mut c_void, _s: usize) -> c_int {
    pure(libc::EIO, || 0)
}
/// There is no sysfs entry for rsnic0: -1 (ENOENT), as for a missing file.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    pure(-1, || minus_one(libc::ENOENT))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_get_sysfs_path() -> *const c_char {
    pure(std::ptr::null(), || c"/sys".as_ptr())
}

/// `ibv_resolve_eth_l2_from_gid`: the peer's MAC by the NIC's own ARP
/// (the GID's IPv4 address); no VLAN (0xffff... is not used: `vid` 0).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_resolve_eth_l2_from_gid(
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
pub(crate) extern "C" fn rsnic_ibv_wc_status_str(status: c_uint) -> *const c_char {
    pure(std::ptr::null(), || wc_status_str(status).as_ptr())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_node_type_str(t: c_int) -> *const c_char {
    pure(std::ptr::null(), || {
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
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_port_state_str(s: c_uint) -> *const c_char {
    pure(std::ptr::null(), || {
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
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_event_type_str(e: c_uint) -> *const c_char {
    pure(std::ptr::null(), || {
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
    })
}

/// `enum ibv_rate` -> (multiple of 2.5 Gb/s, Mbit/s), verbs.h's values.
pub(crate) const RATES: &[(c_uint, c_int, c_int)] = &[
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
pub(crate) extern "C" fn rsnic_ibv_rate_to_mult(r: c_uint) -> c_int {
    pure(0, || RATES.iter().find(|x| x.0 == r).map_or(0, |x| x.1))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_mult_to_ibv_rate(m: c_int) -> c_uint {
    pure(IBV_RATE_MAX, || {
        RATES
            .iter()
            .find(|x| x.1 == m)
            .map_or(IBV_RATE_MAX, |x| x.0)
    })
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_rate_to_mbps(r: c_uint) -> c_int {
    pure(0, || RATES.iter().find(|x| x.0 == r).map_or(0, |x| x.2))
}
#[no_mangle]
pub(crate) extern "C" fn rsnic_mbps_to_ibv_rate(m: c_int) -> c_uint {
    pure(IBV_RATE_MAX, || {
        RATES
            .iter()
            .find(|x| x.2 == m)
            .map_or(IBV_RATE_MAX, |x| x.0)
    })
}
