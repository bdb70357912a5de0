//! Addresses and the rest: `sockaddr` parsing, `rdma_getaddrinfo`,
//! `rdma_get_devices`, the ports of an id, `rdma_set_option` and `rpoll`.
//! IPv4 only (an IPv4-mapped IPv6 address is taken as its IPv4 address): rsnic's
//! GIDs are IPv4-mapped (RoCE v2 over IPv4).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ptr::null_mut;

use super::*;
use crate::abi::{guard, minus_one, pure};

/// An IPv4 socket address of a `sockaddr` (AF_INET, or AF_INET6 holding an
/// IPv4-mapped or the unspecified address); EAFNOSUPPORT for anything else.
pub(crate) fn parse_sockaddr<T>(a: *const T) -> Result<SocketAddrV4, i32> {
    if a.is_null() {
        return Err(libc::EINVAL);
    }
    let a = a.cast::<libc::sockaddr>();
    // SAFETY: the program's address; its family says how long it is.
    let family = c_int::from(unsafe { (*a).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let s = unsafe { &*a.cast::<libc::sockaddr_in>() };
            Ok(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let s = unsafe { &*a.cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
            let v4 = if ip.is_unspecified() {
                Some(Ipv4Addr::UNSPECIFIED)
            } else {
                ip.to_ipv4_mapped()
            };
            v4.map(|v4| SocketAddrV4::new(v4, u16::from_be(s.sin6_port)))
                .ok_or(libc::EAFNOSUPPORT)
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The `sockaddr_in` of an address.
pub(crate) fn sockaddr_in(a: SocketAddrV4) -> sockaddr_in {
    // SAFETY: a C struct of integers: zeros are valid.
    let mut s: sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as _;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

// ---------------------------------------------------------------- ports

/// The port of an id's source or destination address, in network order
/// (`rdma_get_src_port(3)`): 0 when there is none.
fn port_of(id: *mut rdma_cm_id, src: bool) -> u16 {
    if id.is_null() {
        return 0;
    }
    let g = state();
    let Some(s) = g.as_ref().and_then(|st| st.ids.get(&(id as usize))) else {
        return 0;
    };
    let a = if src { s.src } else { s.dst };
    a.map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || port_of(id, true))
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || port_of(id, false))
}

// ---------------------------------------------------------------- options

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(-1, || {
        let mut g = state();
        let Some(s) = g.as_mut().and_then(|st| st.ids.get_mut(&(id as usize))) else {
            return minus_one(libc::EINVAL);
        };
        if optval.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the program's value, of the length it gave (checked below).
        let byte = || unsafe { *optval.cast::<u8>() };
        // SAFETY: as above.
        let int = || unsafe { optval.cast::<c_int>().read_unaligned() };
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => s.tos = byte(),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
                s.ack_timeout = Some(byte().min(31))
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if optlen == 4 => s.reuseaddr = int() != 0,
            // IPv4 only here: an IPv6 id is never dual-stack.
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if optlen == 4 => {}
            // A path record set by the program (RDMA_OPTION_IB_PATH): RoCE's
            // path is the IP route; librdmacm takes it and so do we.
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
            _ => return minus_one(libc::EINVAL),
        }
        0
    })
}

// ---------------------------------------------------------------- devices

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let ctx = match shared() {
            Ok(s) => s.ctx as *mut ibv_context,
            Err(e) => {
                crate::abi::set_errno(e);
                if !num.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *num = 0 };
                }
                return null_mut();
            }
        };
        // SAFETY: two pointers from malloc, freed by rdma_free_devices.
        let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            crate::abi::set_errno(libc::ENOMEM);
            return null_mut();
        }
        // SAFETY: the two slots just allocated.
        unsafe { *list = ctx };
        if !num.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *num = 1 };
        }
        list
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: a list of rdma_get_devices (malloc'd), or NULL.
    pure((), || unsafe { libc::free(list.cast()) })
}

// ---------------------------------------------------------------- addrinfo

/// A malloc'd copy of a sockaddr_in (freed by rdma_freeaddrinfo).
fn alloc_sockaddr(a: SocketAddrV4) -> *mut sockaddr {
    let sz = std::mem::size_of::<sockaddr_in>();
    // SAFETY: plain allocation.
    let p = unsafe { libc::malloc(sz) }.cast::<sockaddr_in>();
    if !p.is_null() {
        // SAFETY: `sz` fresh bytes.
        unsafe { p.write(sockaddr_in(a)) };
    }
    p.cast()
}

/// A C string's text, if any.
fn text<'a>(s: *const c_char) -> Option<&'a str> {
    // SAFETY: the program's NUL-terminated string, or NULL.
    (!s.is_null())
        .then(|| unsafe { CStr::from_ptr(s) }.to_str().ok())
        .flatten()
}

/// The IPv4 address of `node` (numeric, or through the resolver unless
/// RAI_NUMERICHOST), with `service`'s port: an EAI_* code on failure.
fn lookup(node: Option<&str>, service: Option<&str>, numeric: bool) -> Result<SocketAddrV4, c_int> {
    let port = match service {
        None => 0,
        Some(s) => s.parse::<u16>().map_err(|_| libc::EAI_SERVICE)?,
    };
    let Some(node) = node else {
        return Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    };
    if let Ok(ip) = node.parse::<Ipv4Addr>() {
        return Ok(SocketAddrV4::new(ip, port));
    }
    if numeric {
        return Err(libc::EAI_NONAME);
    }
    use std::net::ToSocketAddrs;
    (node, port)
        .to_socket_addrs()
        .map_err(|_| libc::EAI_NONAME)?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .ok_or(libc::EAI_NONAME)
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the program's hints, or NULL.
        let h = unsafe { hints.as_ref() };
        // Without a node and a service the addresses are the hints' own
        // (libfabric's verbs provider asks so).
        let hint_dst = h
            .filter(|h| !h.ai_dst_addr.is_null())
            .and_then(|h| parse_sockaddr(h.ai_dst_addr).ok());
        let hint_src_only = h
            .filter(|h| !h.ai_src_addr.is_null())
            .and_then(|h| parse_sockaddr(h.ai_src_addr).ok());
        if node.is_null() && service.is_null() && hint_dst.is_none() && hint_src_only.is_none() {
            return minus_one(libc::EINVAL);
        }
        let flags = h.map_or(0, |h| h.ai_flags);
        if h.is_some_and(|h| h.ai_family != 0 && h.ai_family != libc::AF_INET) {
            return libc::EAI_FAMILY;
        }
        let numeric = flags & RAI_NUMERICHOST as c_int != 0;
        let from_hints = node.is_null() && service.is_null();
        let addr = if from_hints {
            let passive = flags & RAI_PASSIVE as c_int != 0;
            match (passive, hint_src_only, hint_dst) {
                (true, Some(a), _) | (false, _, Some(a)) => a,
                (_, Some(a), None) | (_, None, Some(a)) => a,
                _ => return minus_one(libc::EINVAL),
            }
        } else {
            match lookup(text(node), text(service), numeric) {
                Ok(a) => a,
                Err(eai) => return eai,
            }
        };
        let qp_type = h.map_or(0, |h| h.ai_qp_type);
        let qp_type = if qp_type == 0 {
            IBV_QPT_RC as c_int
        } else {
            qp_type
        };
        let ps = match h.map_or(0, |h| h.ai_port_space) {
            0 if qp_type == IBV_QPT_UD as c_int => RDMA_PS_UDP as c_int,
            0 => RDMA_PS_TCP as c_int,
            ps => ps,
        };
        // SAFETY: one zeroed rdma_addrinfo from malloc (freed by rdma_freeaddrinfo).
        let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if ai.is_null() {
            return minus_one(libc::ENOMEM);
        }
        // SAFETY: the fresh allocation.
        let a = unsafe { &mut *ai };
        a.ai_flags = flags;
        a.ai_family = libc::AF_INET;
        a.ai_qp_type = qp_type;
        a.ai_port_space = ps;
        let len = std::mem::size_of::<sockaddr_in>() as libc::socklen_t;
        let hint_src = h
            .filter(|h| !h.ai_src_addr.is_null())
            .and_then(|h| parse_sockaddr(h.ai_src_addr).ok());
        if flags & RAI_PASSIVE as c_int != 0 || (from_hints && hint_dst.is_none()) {
            a.ai_src_addr = alloc_sockaddr(addr);
            a.ai_src_len = len;
        } else {
            a.ai_dst_addr = alloc_sockaddr(addr);
            a.ai_dst_len = len;
            if let Some(src) = hint_src {
                a.ai_src_addr = alloc_sockaddr(src);
                a.ai_src_len = len;
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *res = ai };
        0
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    pure((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list of rdma_getaddrinfo: every pointer from malloc.
            unsafe {
                let next = (*p).ai_next;
                libc::free((*p).ai_src_addr.cast());
                libc::free((*p).ai_dst_addr.cast());
                libc::free((*p).ai_src_canonname.cast());
                libc::free((*p).ai_dst_canonname.cast());
                libc::free((*p).ai_route);
                libc::free((*p).ai_connect);
                libc::free(p.cast());
                p = next;
            }
        }
    })
}

/// rsockets' `rpoll`: no descriptor here is an rsocket, so it is `poll(2)`.
#[no_mangle]
pub(crate) extern "C" fn rsnic_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the program's array, as poll(2) takes it.
    pure(-1, || unsafe { libc::poll(fds, nfds, timeout) })
}
