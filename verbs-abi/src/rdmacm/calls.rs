//! The calls on channels and ids: `rdma_create_event_channel` .. `rdma_destroy_id`,
//! address and route resolution, and the helpers every call on an id shares
//! (connections are in conn.rs, an id's QP in qp.rs). Return values and errno as
//! librdmacm's (`rdma_*(3)`): 0, or -1 with errno.

use std::ffi::{c_int, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ptr::null_mut;

use rdma::wire::cm::rej_reason;

use super::*;
use crate::abi::{guard, minus_one, null_with, MAX_RD_ATOMIC};

/// librdmacm's `ucma_complete`'s errno for a failed event: REJECTED is
/// ECONNREFUSED, others their status.
fn status_errno(ev: &rdma_cm_event) -> Option<i32> {
    match ev.status {
        0 => None,
        _ if ev.event == RDMA_CM_EVENT_REJECTED => Some(libc::ECONNREFUSED),
        s if s < 0 => Some(-s),
        s => Some(s),
    }
}

/// The program's id.
///
/// # Safety
/// `idp` is a live id of ours (in [`CmState::ids`]).
pub(crate) unsafe fn cm_id<'a>(idp: usize) -> &'a mut rdma_cm_id {
    // SAFETY: the caller's contract.
    unsafe { &mut *(idp as *mut rdma_cm_id) }
}

/// Runs `f` on a live id's state (EINVAL for a pointer that is not one).
pub(crate) fn with_id<T>(
    id: *mut rdma_cm_id,
    f: impl FnOnce(&mut CmState, usize) -> Result<T, i32>,
) -> Result<T, i32> {
    let mut g = state();
    let st = g.as_mut().expect("state");
    let idp = id as usize;
    if id.is_null() || !st.ids.contains_key(&idp) {
        return Err(libc::EINVAL);
    }
    f(st, idp)
}

/// 0, or -1 with errno.
pub(crate) fn ret(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => minus_one(e),
    }
}

/// A synchronous id waits for the event of the call it just made (librdmacm's
/// `ucma_complete`): the event stays in `id->event` until the next.
pub(crate) fn complete(idp: usize) -> Result<(), i32> {
    let (sync, channel) = {
        let g = state();
        let s = g
            .as_ref()
            .and_then(|st| st.ids.get(&idp))
            .ok_or(libc::EINVAL)?;
        (s.sync, s.channel)
    };
    if !sync {
        return Ok(());
    }
    // SAFETY: a live id of ours.
    let id = unsafe { cm_id(idp) };
    if !id.event.is_null() {
        let mut g = state();
        let _ = events::ack(g.as_mut().expect("state"), id.event as usize);
        id.event = null_mut();
    }
    let e = events::next_event(channel)?;
    id.event = e;
    // SAFETY: a taken event of ours.
    match status_errno(unsafe { &*e }) {
        Some(errno) => Err(errno),
        None => Ok(()),
    }
}

/// A new id (its `rdma_cm_id` boxed, its state registered).
fn new_id(
    st: &mut CmState,
    channel: usize,
    sync: bool,
    context: *mut c_void,
    ps: u32,
    qp_type: ibv_qp_type,
) -> usize {
    // SAFETY: a C struct of pointers and integers: zeros are valid.
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.channel = channel as *mut rdma_event_channel;
    id.context = context;
    id.ps = ps;
    id.qp_type = qp_type;
    // SAFETY: a C struct of integers: zeros are valid.
    let mut path: Box<ibv_sa_path_rec> = Box::new(unsafe { std::mem::zeroed() });
    id.route.path_rec = &mut *path;
    let idp = Box::into_raw(id) as usize;
    st.ids.insert(
        idp,
        IdState {
            channel,
            sync,
            ps,
            phase: Phase::Idle,
            src: None,
            dst: None,
            dst_loopback: false,
            listening: None,
            conn: None,
            sidr: None,
            sidr_ask: None,
            peer: None,
            psn: random_u32() & 0xFF_FFFF,
            resources: (MAX_RD_ATOMIC, MAX_RD_ATOMIC),
            retry: (7, 7),
            tos: 0,
            ack_timeout: None,
            reuseaddr: false,
            unacked: 0,
            dreq_received: false,
            disconnect_reported: false,
            lib_cqs: Vec::new(),
            ep_qp: None,
            path,
        },
    );
    idp
}

/// The id of an incoming request, on its listener's channel, with the
/// listener's context, the addresses of the request and the device's context.
pub(crate) fn new_child(
    st: &mut CmState,
    listener: usize,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    qp_type: ibv_qp_type,
) -> usize {
    let (channel, sync, ps, tos) = {
        let l = &st.ids[&listener];
        (l.channel, l.sync, l.ps, l.tos)
    };
    // SAFETY: a live id of ours.
    let context = unsafe { cm_id(listener) }.context;
    // A synchronous listener's requests each get a private channel (librdmacm
    // migrates them to one); the request's event stays on the listener's.
    let (channel, sync) = match sync {
        true => new_channel(st).map_or((channel, false), |c| (c, true)),
        false => (channel, false),
    };
    let child = new_id(st, channel, sync, context, ps, qp_type);
    let s = st.ids.get_mut(&child).expect("new");
    s.tos = tos;
    s.src = Some(src);
    s.dst = Some(dst);
    set_route(child, s, true);
    child
}

/// Fills `id->route` from the state: the addresses, the GIDs, the verbs
/// context, and with `path` one path record (IPv4-mapped GIDs, the device's
/// MTU, the TOS as traffic class: what the kernel reports for RoCE).
fn set_route(idp: usize, s: &mut IdState, path: bool) {
    // SAFETY: a live id of ours.
    let id = unsafe { cm_id(idp) };
    if let Ok(sh) = shared() {
        id.verbs = sh.ctx as *mut ibv_context;
    }
    id.port_num = 1;
    let src = s.src.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    // Writing a union's field is safe: the sockaddr_in view of the addresses.
    id.route.addr.__bindgen_anon_1.src_sin = addr::sockaddr_in(src);
    id.route.addr.addr.ibaddr.sgid.raw = crate::translate::gid_of_ipv4(src.ip().octets());
    id.route.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
    if let Some(dst) = s.dst {
        id.route.addr.__bindgen_anon_2.dst_sin = addr::sockaddr_in(dst);
        id.route.addr.addr.ibaddr.dgid.raw = crate::translate::gid_of_ipv4(dst.ip().octets());
    }
    if path {
        let p = &mut *s.path;
        // SAFETY: the GIDs were just written.
        unsafe {
            p.sgid.raw = id.route.addr.addr.ibaddr.sgid.raw;
            p.dgid.raw = id.route.addr.addr.ibaddr.dgid.raw;
        }
        p.hop_limit = 64;
        p.traffic_class = s.tos;
        p.reversible = 1;
        p.numb_path = 1;
        p.pkey = 0xffffu16.to_be();
        p.mtu_selector = 2;
        p.mtu = mtu_enum(backend().dev.max_path_mtu());
        p.rate_selector = 2;
        p.packet_life_time_selector = 2;
        id.route.path_rec = p;
        id.route.num_paths = 1;
    }
}

/// `enum ibv_mtu` of a path MTU in bytes.
pub(crate) fn mtu_enum(bytes: u32) -> u8 {
    match bytes {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

// ---------------------------------------------------------------- channels

/// A channel: its `rdma_event_channel` (the fd) boxed, its state registered.
pub(crate) fn new_channel(st: &mut CmState) -> Result<usize, i32> {
    let ch = ChannelState::new()?;
    let b = Box::new(rdma_event_channel {
        fd: std::os::fd::AsRawFd::as_raw_fd(&ch.fd),
    });
    let p = Box::into_raw(b) as usize;
    st.channels.insert(p, ch);
    Ok(p)
}

/// Frees a channel and the events nobody took.
pub(crate) fn free_channel(st: &mut CmState, p: usize) {
    if let Some(ch) = st.channels.remove(&p) {
        for q in ch.queue {
            events::free_event(q.event);
        }
        // SAFETY: boxed in new_channel, unregistered now.
        drop(unsafe { Box::from_raw(p as *mut rdma_event_channel) });
    }
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(null_mut(), || {
        if let Err(e) = shared() {
            return null_with(e);
        }
        let mut g = state();
        match new_channel(g.as_mut().expect("state")) {
            Ok(p) => p as *mut rdma_event_channel,
            Err(e) => null_with(e),
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        let mut g = state();
        free_channel(g.as_mut().expect("state"), channel as usize);
    })
}

// ---------------------------------------------------------------- ids

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return minus_one(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return minus_one(libc::EINVAL),
        };
        if let Err(e) = shared() {
            return minus_one(e);
        }
        let mut g = state();
        let st = g.as_mut().expect("state");
        let (ch, sync) = if channel.is_null() {
            match new_channel(st) {
                Ok(p) => (p, true),
                Err(e) => return minus_one(e),
            }
        } else if st.channels.contains_key(&(channel as usize)) {
            (channel as usize, false)
        } else {
            return minus_one(libc::EINVAL);
        };
        let p = new_id(st, ch, sync, context, ps, qp_type);
        // SAFETY: the caller's out pointer.
        unsafe { *id = p as *mut rdma_cm_id };
        0
    })
}

/// Ends what a connection still holds in the engine's CM when its id goes:
/// a DREQ for an established one, a REJ for one being set up (as the kernel's
/// `ib_destroy_cm_id`).
fn release_conn(s: &IdState) {
    let Some(conn) = s.conn else {
        return;
    };
    let dev = &backend().dev;
    match s.phase {
        Phase::Connected if !s.dreq_received => {
            let _ = dev.cm_disconnect(conn, &[]);
        }
        Phase::ReqReceived => {
            let _ = dev.cm_reject(conn, rej_reason::CONSUMER_DEFINED, &[]);
        }
        Phase::Connecting | Phase::RepReceived | Phase::Accepting => {
            let _ = dev.cm_reject(conn, rej_reason::TIMEOUT, &[]);
        }
        _ => {}
    }
}

/// Destroys an id: its listen, its connection, its queued events (and the ids of
/// requests queued for it), then waits until the program acked every event it
/// took for it (rdma_destroy_id(3)). Takes the lock and gives it back (the wait
/// releases it).
type Guard = MutexGuard<'static, Option<CmState>>;

fn destroy(mut g: Guard, idp: usize) -> (Guard, Result<(), i32>) {
    let st = g.as_mut().expect("state");
    if !st.ids.contains_key(&idp) {
        return (g, Err(libc::EINVAL));
    }
    // SAFETY: a live id of ours.
    let id = unsafe { cm_id(idp) };
    if !id.event.is_null() {
        let e = std::mem::replace(&mut id.event, null_mut()) as usize;
        let _ = events::ack(st, e);
    }
    let s = st.ids.get_mut(&idp).expect("live");
    if let Some(sid) = s.listening.take() {
        let _ = backend().dev.cm_unlisten(sid);
        st.listeners.remove(&sid);
    }
    let s = st.ids.get_mut(&idp).expect("live");
    release_conn(s);
    if let Some(conn) = s.conn.take() {
        st.conns.remove(&conn);
    }
    let s = st.ids.get_mut(&idp).expect("live");
    if let Some(r) = s.sidr.take() {
        st.sidrs.remove(&r);
    }
    let channel = st.ids[&idp].channel;
    let mut orphans = Vec::new();
    if let Some(ch) = st.channels.get_mut(&channel) {
        let was = ch.queue.len();
        let mut keep = std::collections::VecDeque::new();
        for q in ch.queue.drain(..) {
            // SAFETY: a queued event of ours.
            let ev_id = unsafe { (*(q.event as *mut rdma_cm_event)).id } as usize;
            if q.owner == idp || ev_id == idp {
                if ev_id != idp {
                    orphans.push(ev_id);
                }
                events::free_event(q.event);
            } else {
                keep.push_back(q);
            }
        }
        ch.queue = keep;
        if was > 0 && ch.queue.is_empty() {
            ch.drained();
        }
    }
    // The ids of requests nobody saw: no event of theirs was taken.
    for o in orphans {
        g = destroy(g, o).0;
    }
    while g
        .as_ref()
        .and_then(|st| st.ids.get(&idp))
        .is_some_and(|s| s.unacked > 0)
    {
        g = ACKED.wait(g).unwrap_or_else(|p| p.into_inner());
    }
    let st = g.as_mut().expect("state");
    let s = st.ids.remove(&idp).expect("live");
    for &(cq, ch) in &s.lib_cqs {
        if !cq.is_null() {
            crate::abi::rsnic_ibv_destroy_cq(cq);
        }
        if !ch.is_null() {
            crate::abi::rsnic_ibv_destroy_comp_channel(ch);
        }
    }
    if s.sync {
        free_channel(st, s.channel);
    }
    // SAFETY: boxed in new_id, unregistered now.
    drop(unsafe { Box::from_raw(idp as *mut rdma_cm_id) });
    (g, Ok(()))
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || ret(destroy(state(), id as usize).1))
}

// ---------------------------------------------------------------- addresses

/// Whether another id of the port space holds `port` (bound or listening).
fn port_taken(st: &CmState, ps: u32, port: u16, except: usize) -> bool {
    st.ids.iter().any(|(&p, s)| {
        p != except
            && s.ps == ps
            && matches!(s.phase, Phase::Bound | Phase::Listening)
            && s.src.is_some_and(|a| a.port() == port)
            && !s.reuseaddr
    })
}

/// A free ephemeral port (32768..61000, as Linux's default range).
fn ephemeral_port(st: &mut CmState, ps: u32) -> Result<u16, i32> {
    for _ in 0..28232 {
        let p = st.next_port;
        st.next_port = if p >= 60999 { 32768 } else { p + 1 };
        let used = st
            .ids
            .values()
            .any(|s| s.ps == ps && s.src.is_some_and(|a| a.port() == p));
        if !used {
            return Ok(p);
        }
    }
    Err(libc::EADDRINUSE)
}

/// Binds an id to `addr` (our address or the wildcard; port 0: an ephemeral one).
pub(crate) fn bind(st: &mut CmState, idp: usize, addr: SocketAddrV4) -> Result<(), i32> {
    let ours = Ipv4Addr::from(backend().dev.ip());
    // A loopback address binds, as Linux 6.1's rdma_cm binds it with rxe
    // (`rping -s -a 127.0.0.1`); an address of no interface: EADDRNOTAVAIL.
    if !addr.ip().is_unspecified() && !addr.ip().is_loopback() && *addr.ip() != ours {
        return Err(libc::EADDRNOTAVAIL);
    }
    let s = &st.ids[&idp];
    if s.phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    let ps = s.ps;
    let port = match addr.port() {
        0 => ephemeral_port(st, ps)?,
        p if port_taken(st, ps, p, idp) => return Err(libc::EADDRINUSE),
        p => p,
    };
    let s = st.ids.get_mut(&idp).expect("live");
    s.src = Some(SocketAddrV4::new(*addr.ip(), port));
    s.phase = Phase::Bound;
    set_route(idp, s, false);
    if addr.ip().is_unspecified() || addr.ip().is_loopback() {
        // A wildcard or loopback bind names no device (Linux 6.1 with rxe:
        // `verbs` NULL, `port_num` 0). libfabric's verbs provider relies on
        // it: a NULL `verbs` after binding "localhost" makes it take the
        // device's interface addresses as the endpoint's source.
        // SAFETY: a live id of ours.
        let id = unsafe { cm_id(idp) };
        id.verbs = null_mut();
        id.port_num = 0;
    }
    Ok(())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_bind_addr(id: *mut rdma_cm_id, a: *mut sockaddr) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            let addr = addr::parse_sockaddr(a)?;
            bind(st, idp, addr)
        }))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        let prepared = with_id(id, |st, idp| {
            let mut dst = addr::parse_sockaddr(dst)?;
            if dst.ip().is_unspecified() {
                return Err(libc::EINVAL);
            }
            // A loopback destination is this device (the kernel's
            // `cma_resolve_loopback`: the peer's GID is our own).
            let loopback = dst.ip().is_loopback();
            if loopback {
                dst.set_ip(Ipv4Addr::from(backend().dev.ip()));
            }
            if st.ids[&idp].phase == Phase::Idle {
                let src = if src.is_null() {
                    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)
                } else {
                    addr::parse_sockaddr(src)?
                };
                bind(st, idp, src)?;
            }
            let s = st.ids.get_mut(&idp).expect("live");
            if !matches!(
                s.phase,
                Phase::Bound | Phase::AddrResolved | Phase::RouteResolved
            ) {
                return Err(libc::EINVAL);
            }
            let ours = Ipv4Addr::from(backend().dev.ip());
            let port = s.src.map_or(0, |a| a.port());
            s.src = Some(SocketAddrV4::new(ours, port));
            s.dst = Some(dst);
            s.dst_loopback = loopback;
            set_route(idp, s, false);
            Ok(*dst.ip())
        });
        let peer = match prepared {
            Ok(p) => p,
            Err(e) => return minus_one(e),
        };
        // The neighbour, by the NIC's ARP (or the kernel's table in host mode),
        // without the lock: this may wait for an ARP reply.
        let dev = &backend().dev;
        let resolved = peer.octets() == dev.ip() || dev.resolve_mac(peer.octets()).is_ok();
        let r = with_id(id, |st, idp| {
            let (kind, status) = if resolved {
                st.ids.get_mut(&idp).expect("live").phase = Phase::AddrResolved;
                (RDMA_CM_EVENT_ADDR_RESOLVED, 0)
            } else {
                (RDMA_CM_EVENT_ADDR_ERROR, -libc::ETIMEDOUT)
            };
            push_event(st, idp, idp, 0, kind, status, Param::None);
            Ok(idp)
        });
        match r {
            Ok(idp) => ret(complete(idp)),
            Err(e) => minus_one(e),
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_resolve_route(
    id: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        let r = with_id(id, |st, idp| {
            let s = st.ids.get_mut(&idp).expect("live");
            if !matches!(s.phase, Phase::AddrResolved | Phase::RouteResolved) {
                return Err(libc::EINVAL);
            }
            // Linux 6.1 (rxe): `rping -c -a 127.0.0.1` gets ADDR_RESOLVED, then
            // "rdma_resolve_route: No such device" (`lo` has no RoCE GID).
            if s.dst_loopback {
                return Err(libc::ENODEV);
            }
            s.phase = Phase::RouteResolved;
            set_route(idp, s, true);
            push_event(
                st,
                idp,
                idp,
                0,
                RDMA_CM_EVENT_ROUTE_RESOLVED,
                0,
                Param::None,
            );
            Ok(idp)
        });
        match r {
            Ok(idp) => ret(complete(idp)),
            Err(e) => minus_one(e),
        }
    })
}
