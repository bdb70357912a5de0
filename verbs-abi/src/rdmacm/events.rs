//! librdmacm's events: the engine's CM events turned into `rdma_cm_event`s on the
//! right id's channel ([`dispatch`], the `rsnic-cm` thread), and
//! `rdma_get_cm_event`/`rdma_ack_cm_event`/`rdma_event_str`. What each event carries
//! follows the kernel's `cma_ib_handler`/`cma_sidr_rep_handler` (drivers/infiniband/
//! core/cma.c): REQ and REP resources seen from the local side, UNREACHABLE with
//! `-ETIMEDOUT` when the peer never answered, REJECTED with the IBA reason.

use std::ffi::{c_char, c_int};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

use rdma::cm::CmEvent;
use rdma::wire::cm::{rej_reason, CmaHdr, RDMA_UDP_QKEY};

use super::*;
use crate::abi::{guard, minus_one, pure};

/// An event as the program sees it, with room for its private data (the
/// largest, a REP's, is 196 bytes).
#[repr(C)]
pub(crate) struct EventBox {
    /// What the program reads.
    pub ev: rdma_cm_event,
    /// `param.conn.private_data` / `param.ud.private_data` point here.
    pub data: [u8; 224],
}

/// The parameters of one event.
pub(crate) enum Param<'a> {
    /// None (zeros).
    None,
    /// `param.conn` with this private data.
    Conn(rdma_conn_param, &'a [u8]),
    /// `param.ud` with this private data.
    Ud(rdma_ud_param, &'a [u8]),
}

/// Queues an event for `id` on its channel (counted on `owner` once taken).
pub(crate) fn push_event(
    st: &mut CmState,
    owner: usize,
    id: usize,
    listen_id: usize,
    kind: rdma_cm_event_type,
    status: c_int,
    param: Param<'_>,
) {
    let Some(channel) = st.ids.get(&owner).map(|s| s.channel) else {
        return;
    };
    let Some(ch) = st.channels.get_mut(&channel) else {
        return;
    };
    let mut b = Box::new(EventBox {
        // SAFETY: a C struct of pointers and integers: all zero is valid.
        ev: unsafe { std::mem::zeroed() },
        data: [0; 224],
    });
    b.ev.id = id as *mut rdma_cm_id;
    b.ev.listen_id = listen_id as *mut rdma_cm_id;
    b.ev.event = kind;
    b.ev.status = status;
    let data = b.data.as_mut_ptr();
    match param {
        Param::None => {}
        Param::Conn(mut c, pd) => {
            let n = pd.len().min(224);
            b.data[..n].copy_from_slice(&pd[..n]);
            c.private_data = if n > 0 { data.cast() } else { null_mut() };
            c.private_data_len = n as u8;
            b.ev.param.conn = c;
        }
        Param::Ud(mut u, pd) => {
            let n = pd.len().min(224);
            b.data[..n].copy_from_slice(&pd[..n]);
            u.private_data = if n > 0 { data.cast() } else { null_mut() };
            u.private_data_len = n as u8;
            b.ev.param.ud = u;
        }
    }
    let event = Box::into_raw(b) as usize;
    ch.push(Queued { event, owner });
}

/// Frees an event that was never taken.
pub(crate) fn free_event(event: usize) {
    // SAFETY: a boxed EventBox of push_event, in no queue and not taken.
    drop(unsafe { Box::from_raw(event as *mut EventBox) });
}

/// `param.conn` seen from the local side: the peer's responder resources are
/// our initiator depth's bound and its initiator depth our responder
/// resources' (ib_cm's `cm_format_req_event`/`cm_format_rep_event` swap them).
fn conn_param(peer: &PeerQp, flow_control: bool, srq: bool) -> rdma_conn_param {
    rdma_conn_param {
        private_data: null_mut::<u8>().cast(),
        private_data_len: 0,
        responder_resources: peer.initiator_depth,
        initiator_depth: peer.responder_resources,
        flow_control: flow_control.into(),
        retry_count: peer.retry_count,
        rnr_retry_count: peer.rnr_retry_count,
        srq: srq.into(),
        qp_num: peer.qpn,
    }
}

/// The address vector to reach `peer_ip` (a UD id's `param.ud.ah_attr`).
pub(crate) fn ah_to(peer_ip: [u8; 4]) -> ibv_ah_attr {
    // SAFETY: a C struct of integers: all zero is valid.
    let mut ah: ibv_ah_attr = unsafe { std::mem::zeroed() };
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.hop_limit = 64;
    ah.grh.sgid_index = 0;
    ah.grh.dgid.raw = crate::translate::gid_of_ipv4(peer_ip);
    ah
}

/// A connection that ended before it was established (rejected or timed
/// out): its id is idle again and its QP in error. The id, if still live.
fn connection_failed(st: &mut CmState, id: u32) -> Option<usize> {
    let idp = st.conns.remove(&id)?;
    let s = st.ids.get_mut(&idp)?;
    s.conn = None;
    s.phase = Phase::Idle;
    qp_to_err(idp);
    Some(idp)
}

/// One engine CM event, turned into librdmacm's (the `rsnic-cm` thread).
pub(crate) fn dispatch(st: &mut CmState, e: CmEvent) {
    match e {
        CmEvent::ConnectRequest { id, peer_ip, req } => {
            let Some(&listener) = st.listeners.get(&req.service_id) else {
                let _ = backend()
                    .dev
                    .cm_reject(id, rej_reason::INVALID_SERVICE_ID, &[]);
                return;
            };
            let Ok(hdr) = CmaHdr::parse(&req.private_data) else {
                let _ = backend()
                    .dev
                    .cm_reject(id, rej_reason::INVALID_PRIVATE_DATA, &[]);
                return;
            };
            let peer = PeerQp {
                qpn: req.local_qpn,
                psn: req.starting_psn,
                responder_resources: req.responder_resources,
                initiator_depth: req.initiator_depth,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                path_mtu: req.path_mtu,
                ack_timeout: req.primary.local_ack_timeout,
            };
            let port = (req.service_id & 0xffff) as u16;
            let src_ip = backend().dev.ip();
            let child = new_child(
                st,
                listener,
                SocketAddrV4::new(src_ip.into(), port),
                SocketAddrV4::new(peer_ip.into(), hdr.src_port),
                IBV_QPT_RC,
            );
            if let Some(s) = st.ids.get_mut(&child) {
                s.phase = Phase::ReqReceived;
                s.conn = Some(id);
                s.peer = Some(peer);
            }
            st.conns.insert(id, child);
            let p = conn_param(&peer, req.e2e_flow_control, req.srq);
            let user = &req.private_data[CmaHdr::LEN..];
            push_event(
                st,
                listener,
                child,
                listener,
                RDMA_CM_EVENT_CONNECT_REQUEST,
                0,
                Param::Conn(p, user),
            );
        }
        CmEvent::ConnectReply { id, rep } => {
            let Some(&idp) = st.conns.get(&id) else {
                return;
            };
            let peer = PeerQp {
                qpn: rep.local_qpn,
                psn: rep.starting_psn,
                responder_resources: rep.responder_resources,
                initiator_depth: rep.initiator_depth,
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                path_mtu: 0,
                ack_timeout: 0,
            };
            let p = conn_param(&peer, rep.e2e_flow_control, rep.srq);
            let has_qp = {
                let Some(s) = st.ids.get_mut(&idp) else {
                    return;
                };
                let mtu = s.peer.map_or(0, |q| q.path_mtu);
                s.peer = Some(PeerQp {
                    path_mtu: mtu,
                    ..peer
                });
                // The passive side decided (ib_cm's `cm_rep_handler`): we issue
                // as many READs as it accepts and accept as many as it issues;
                // our RNR retries are the count it asked for.
                s.resources = (
                    rep.initiator_depth.min(crate::abi::MAX_RD_ATOMIC),
                    rep.responder_resources.min(crate::abi::MAX_RD_ATOMIC),
                );
                s.retry.1 = rep.rnr_retry_count;
                // SAFETY: a live id of ours.
                !unsafe { (*(idp as *mut rdma_cm_id)).qp }.is_null()
            };
            if !has_qp {
                st.ids.get_mut(&idp).expect("live").phase = Phase::RepReceived;
                push_event(
                    st,
                    idp,
                    idp,
                    0,
                    RDMA_CM_EVENT_CONNECT_RESPONSE,
                    0,
                    Param::Conn(p, &rep.private_data),
                );
                return;
            }
            let r = connect_qp(st, idp).and_then(|()| {
                backend()
                    .dev
                    .cm_ready(id)
                    .map_err(|e| crate::translate::errno_of(&e))
            });
            match r {
                Ok(()) => {
                    st.ids.get_mut(&idp).expect("live").phase = Phase::Connected;
                    push_event(
                        st,
                        idp,
                        idp,
                        0,
                        RDMA_CM_EVENT_ESTABLISHED,
                        0,
                        Param::Conn(p, &rep.private_data),
                    );
                }
                Err(errno) => {
                    let _ = backend()
                        .dev
                        .cm_reject(id, rej_reason::CONSUMER_DEFINED, &[]);
                    st.conns.remove(&id);
                    let s = st.ids.get_mut(&idp).expect("live");
                    s.conn = None;
                    s.phase = Phase::Idle;
                    push_event(
                        st,
                        idp,
                        idp,
                        0,
                        RDMA_CM_EVENT_CONNECT_ERROR,
                        -errno,
                        Param::None,
                    );
                }
            }
        }
        CmEvent::Established { id } => {
            let Some(&idp) = st.conns.get(&id) else {
                return;
            };
            // The passive side's RTU. The active side's own `ready` reports
            // one too: its ESTABLISHED went out with the REP's handling (or,
            // after `rdma_establish`, there is none, as the kernel's).
            let s = st.ids.get_mut(&idp).expect("live");
            if s.phase != Phase::Accepting {
                return;
            }
            s.phase = Phase::Connected;
            push_event(st, idp, idp, 0, RDMA_CM_EVENT_ESTABLISHED, 0, Param::None);
        }
        CmEvent::Rejected {
            id,
            reason,
            private_data,
        } => {
            let Some(idp) = connection_failed(st, id) else {
                return;
            };
            // A REJ reaches the program as REJECTED with its reason (the
            // kernel's cma_ib_handler, IB_CM_REJ_RECEIVED).
            // SAFETY: a C struct of integers and a pointer: zeros are valid.
            let p: rdma_conn_param = unsafe { std::mem::zeroed() };
            let status = c_int::from(reason);
            push_event(
                st,
                idp,
                idp,
                0,
                RDMA_CM_EVENT_REJECTED,
                status,
                Param::Conn(p, &private_data[..]),
            );
        }
        CmEvent::TimedOut { id } => {
            let Some(idp) = connection_failed(st, id) else {
                return;
            };
            // ib_cm's REQ_ERROR / REP_ERROR (no answer through every retry):
            // UNREACHABLE, -ETIMEDOUT, as cma_ib_handler reports them.
            push_event(
                st,
                idp,
                idp,
                0,
                RDMA_CM_EVENT_UNREACHABLE,
                -libc::ETIMEDOUT,
                Param::None,
            );
        }
        CmEvent::DisconnectRequest { id } | CmEvent::Disconnected { id } => {
            let Some(&idp) = st.conns.get(&id) else {
                return;
            };
            let Some(s) = st.ids.get_mut(&idp) else {
                return;
            };
            if matches!(e, CmEvent::DisconnectRequest { .. }) {
                s.dreq_received = true;
            }
            s.phase = Phase::Disconnected;
            if !std::mem::replace(&mut s.disconnect_reported, true) {
                push_event(st, idp, idp, 0, RDMA_CM_EVENT_DISCONNECTED, 0, Param::None);
            }
        }
        CmEvent::TimewaitExit { id } => {
            let Some(idp) = st.conns.remove(&id) else {
                return;
            };
            if let Some(s) = st.ids.get_mut(&idp) {
                s.conn = None;
                push_event(st, idp, idp, 0, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, Param::None);
            }
        }
        CmEvent::SidrRequest { peer_ip, tid, req } => {
            let Some(&listener) = st.listeners.get(&req.service_id) else {
                let _ = backend().dev.cm_sidr_reply(
                    peer_ip,
                    tid,
                    req,
                    rdma::cm::sidr_status::SID_NOT_SUPPORTED,
                    (0, 0),
                );
                return;
            };
            let Ok(hdr) = CmaHdr::parse(&req.private_data) else {
                let _ = backend().dev.cm_sidr_reply(
                    peer_ip,
                    tid,
                    req,
                    rdma::cm::sidr_status::REJECTED,
                    (0, 0),
                );
                return;
            };
            let port = (req.service_id & 0xffff) as u16;
            let src_ip = backend().dev.ip();
            let child = new_child(
                st,
                listener,
                SocketAddrV4::new(src_ip.into(), port),
                SocketAddrV4::new(peer_ip.into(), hdr.src_port),
                IBV_QPT_UD,
            );
            let user: Vec<u8> = req.private_data[CmaHdr::LEN..].to_vec();
            if let Some(s) = st.ids.get_mut(&child) {
                s.phase = Phase::ReqReceived;
                s.sidr_ask = Some(SidrAsk { peer_ip, tid, req });
            }
            let ud = rdma_ud_param {
                private_data: null_mut::<u8>().cast(),
                private_data_len: 0,
                ah_attr: ah_to(peer_ip),
                qp_num: 0,
                qkey: 0,
            };
            push_event(
                st,
                listener,
                child,
                listener,
                RDMA_CM_EVENT_CONNECT_REQUEST,
                0,
                Param::Ud(ud, &user),
            );
        }
        CmEvent::SidrReply { id, rep } => {
            let Some(idp) = st.sidrs.remove(&id) else {
                return;
            };
            let Some(s) = st.ids.get_mut(&idp) else {
                return;
            };
            let peer_ip = s.dst.map_or([0; 4], |a| a.ip().octets());
            let ud = rdma_ud_param {
                private_data: null_mut::<u8>().cast(),
                private_data_len: 0,
                ah_attr: ah_to(peer_ip),
                qp_num: rep.qpn,
                qkey: rep.qkey,
            };
            let (kind, status) = if rep.status != 0 {
                (RDMA_CM_EVENT_UNREACHABLE, c_int::from(rep.status))
            } else if rep.qkey != RDMA_UDP_QKEY {
                (RDMA_CM_EVENT_UNREACHABLE, -libc::EINVAL)
            } else {
                s.phase = Phase::Connected;
                (RDMA_CM_EVENT_ESTABLISHED, 0)
            };
            if kind != RDMA_CM_EVENT_ESTABLISHED {
                s.phase = Phase::RouteResolved;
            }
            push_event(
                st,
                idp,
                idp,
                0,
                kind,
                status,
                Param::Ud(ud, &rep.private_data),
            );
        }
        CmEvent::SidrTimeout { id } => {
            let Some(idp) = st.sidrs.remove(&id) else {
                return;
            };
            if let Some(s) = st.ids.get_mut(&idp) {
                s.phase = Phase::RouteResolved;
            }
            push_event(
                st,
                idp,
                idp,
                0,
                RDMA_CM_EVENT_UNREACHABLE,
                -libc::ETIMEDOUT,
                Param::None,
            );
        }
    }
}

/// Moves an id's QP (if it has one) to ERR, as the kernel's rdma_cm does when a
/// connection is rejected or released.
pub(crate) fn qp_to_err(idp: usize) {
    // SAFETY: a live id of ours.
    let qp = unsafe { (*(idp as *mut rdma_cm_id)).qp };
    if qp.is_null() {
        return;
    }
    // SAFETY: a C struct of integers: zeros are valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_ERR;
    let _ = crate::abi::rsnic_ibv_modify_qp(qp, &mut a, IBV_QP_STATE as c_int);
}

/// Takes the oldest event of a channel without waiting (under the lock).
fn take(st: &mut CmState, channel: usize) -> Result<Option<*mut rdma_cm_event>, i32> {
    let ch = st.channels.get_mut(&channel).ok_or(libc::EINVAL)?;
    let Some(q) = ch.pop() else {
        return Ok(None);
    };
    if let Some(s) = st.ids.get_mut(&q.owner) {
        s.unacked += 1;
    }
    st.taken.insert(q.event, q.owner);
    Ok(Some(q.event as *mut rdma_cm_event))
}

/// Waits for the next event of `channel`: blocking unless its descriptor was
/// set `O_NONBLOCK` (then EAGAIN), as a read of librdmacm's would. An
/// interrupted wait fails with EINTR, as that read does.
pub(crate) fn next_event(channel: usize) -> Result<*mut rdma_cm_event, i32> {
    let mut waited = false;
    loop {
        let fd = {
            let mut g = state();
            let st = g.as_mut().expect("state");
            if waited && !st.channels.contains_key(&channel) {
                // Destroyed by another thread while this one waited: a
                // `read` on librdmacm's closed channel fd goes on waiting
                // (the kernel holds the file), so this one does too, until
                // a signal (EINTR, as the read returns), not an error that
                // a program's event thread would report at its exit (rping).
                drop(g);
                // SAFETY: poll on no descriptor: sleeps until a signal.
                unsafe { libc::poll(null_mut(), 0, -1) };
                return Err(libc::EINTR);
            }
            if let Some(e) = take(st, channel)? {
                return Ok(e);
            }
            st.channels
                .get(&channel)
                .ok_or(libc::EINVAL)?
                .fd
                .as_raw_fd()
        };
        waited = true;
        // SAFETY: fcntl on our own descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            return Err(libc::EAGAIN);
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
            let e = crate::abi::last_errno(libc::EINTR);
            return Err(e);
        }
    }
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        if channel.is_null() || event.is_null() {
            return minus_one(libc::EINVAL);
        }
        match next_event(channel as usize) {
            Ok(e) => {
                // SAFETY: the caller's out pointer.
                unsafe { *event = e };
                0
            }
            Err(e) => minus_one(e),
        }
    })
}

/// Forgets a taken event and frees it (the owner's count goes down).
pub(crate) fn ack(st: &mut CmState, event: usize) -> Result<(), i32> {
    let owner = st.taken.remove(&event).ok_or(libc::EINVAL)?;
    if let Some(s) = st.ids.get_mut(&owner) {
        s.unacked = s.unacked.saturating_sub(1);
    }
    free_event(event);
    ACKED.notify_all();
    Ok(())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        let mut g = state();
        match ack(g.as_mut().expect("state"), event as usize) {
            Ok(()) => 0,
            Err(e) => minus_one(e),
        }
    })
}

/// librdmacm's names of the events.
const EVENT_NAMES: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    pure(c"UNKNOWN EVENT".as_ptr(), || {
        EVENT_NAMES
            .get(event as usize)
            .map_or(c"UNKNOWN EVENT".as_ptr(), |s| s.as_ptr())
    })
}
