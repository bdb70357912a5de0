//! The calls that make and end connections: `rdma_listen`, `rdma_connect`,
//! `rdma_accept`, `rdma_reject`, `rdma_establish`, `rdma_disconnect`,
//! `rdma_migrate_id`. Each becomes a request to the port's CM (REQ, REP, REJ,
//! RTU, DREQ through `nic::Device::cm_*`); what comes back arrives as events
//! (events.rs). Return values and errno as librdmacm's (`rdma_*(3)`): 0, or -1
//! with errno.

use std::ffi::{c_int, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};

use rdma::cm::ConnParams;
use rdma::wire::cm::{rej_reason, service_id, CmaHdr, RDMA_UDP_QKEY};

use super::*;
use crate::abi::{guard, minus_one, MAX_RD_ATOMIC};

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            if st.ids[&idp].phase == Phase::Idle {
                bind(st, idp, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
            }
            let s = &st.ids[&idp];
            if s.phase != Phase::Bound {
                return Err(libc::EINVAL);
            }
            let port = s.src.map_or(0, |a| a.port());
            let sid = service_id(s.ps as u16, port);
            if st.listeners.contains_key(&sid) {
                return Err(libc::EADDRINUSE);
            }
            backend()
                .dev
                .cm_listen(sid)
                .map_err(|e| crate::translate::errno_of(&e))?;
            st.listeners.insert(sid, idp);
            let s = st.ids.get_mut(&idp).expect("live");
            s.listening = Some(sid);
            s.phase = Phase::Listening;
            Ok(())
        }))
    })
}

/// The private data of a request: rdma_cm's header, then the program's.
fn request_data(s: &IdState, user: &[u8], room: usize) -> Result<Vec<u8>, i32> {
    if user.len() > room - CmaHdr::LEN {
        return Err(libc::EINVAL);
    }
    let src = s.src.ok_or(libc::EINVAL)?;
    let dst = s.dst.ok_or(libc::EINVAL)?;
    let mut v = vec![0u8; CmaHdr::LEN + user.len()];
    CmaHdr::ipv4(src.ip().octets(), src.port(), dst.ip().octets())
        .emit(&mut v)
        .map_err(|_| libc::EINVAL)?;
    v[CmaHdr::LEN..].copy_from_slice(user);
    Ok(v)
}

/// The program's private data of a `rdma_conn_param`.
pub(crate) fn user_data(p: Option<&rdma_conn_param>) -> &[u8] {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the program's buffer of the length it gave.
            unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
            }
        }
        _ => &[],
    }
}

/// A resource count of a `rdma_conn_param` (RDMA_MAX_RESP_RES / _INIT_DEPTH: the
/// device's most; above it: EINVAL, as librdmacm's `ucma_valid_param`).
pub(crate) fn resources(v: u8) -> Result<u8, i32> {
    match v {
        0xFF => Ok(MAX_RD_ATOMIC),
        v if v > MAX_RD_ATOMIC => Err(libc::EINVAL),
        v => Ok(v),
    }
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's parameters, if any.
        let p = unsafe { param.as_ref() };
        let r = with_id(id, |st, idp| {
            let s = &st.ids[&idp];
            if s.phase != Phase::RouteResolved {
                return Err(libc::EINVAL);
            }
            let peer_ip = s.dst.ok_or(libc::EINVAL)?.ip().octets();
            let port = s.dst.map_or(0, |a| a.port());
            let sid = service_id(s.ps as u16, port);
            // SAFETY: a live id of ours.
            let cid = unsafe { cm_id(idp) };
            let dev = &backend().dev;
            if cid.qp_type == IBV_QPT_UD {
                let data = request_data(s, user_data(p), 216)?;
                let rid = dev
                    .cm_sidr_request(peer_ip, sid, &data)
                    .map_err(|e| crate::translate::errno_of(&e))?;
                st.sidrs.insert(rid, idp);
                let s = st.ids.get_mut(&idp).expect("live");
                s.sidr = Some(rid);
                s.phase = Phase::Connecting;
                return Ok(idp);
            }
            let data = request_data(s, user_data(p), 92)?;
            let (qpn, srq) = if cid.qp.is_null() {
                (p.map_or(0, |p| p.qp_num), p.is_some_and(|p| p.srq != 0))
            } else {
                // SAFETY: the id's QP, ours.
                let q = unsafe { &*cid.qp };
                (q.qp_num, !q.srq.is_null())
            };
            let rr = resources(p.map_or(MAX_RD_ATOMIC, |p| p.responder_resources))?;
            let id_ = resources(p.map_or(MAX_RD_ATOMIC, |p| p.initiator_depth))?;
            let retry = p.map_or(7, |p| p.retry_count.min(7));
            let rnr = p.map_or(7, |p| p.rnr_retry_count.min(7));
            let mtu = mtu_enum(dev.max_path_mtu());
            let params = ConnParams {
                qpn,
                starting_psn: s.psn,
                responder_resources: rr,
                initiator_depth: id_,
                retry_count: retry,
                rnr_retry_count: rnr,
                path_mtu: mtu,
                srq,
                local_ack_timeout: s.ack_timeout.unwrap_or(18),
                traffic_class: s.tos,
            };
            let conn = dev
                .cm_connect(peer_ip, sid, params, &data)
                .map_err(|e| crate::translate::errno_of(&e))?;
            st.conns.insert(conn, idp);
            let s = st.ids.get_mut(&idp).expect("live");
            s.conn = Some(conn);
            s.phase = Phase::Connecting;
            s.resources = (rr, id_);
            s.retry = (retry, rnr);
            s.peer = Some(PeerQp {
                qpn: 0,
                psn: 0,
                responder_resources: 0,
                initiator_depth: 0,
                retry_count: retry,
                rnr_retry_count: 0,
                path_mtu: mtu,
                ack_timeout: 0,
            });
            Ok(idp)
        });
        match r {
            Ok(idp) => ret(complete(idp)),
            Err(e) => minus_one(e),
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program's parameters, if any.
        let p = unsafe { param.as_ref() };
        let r = with_id(id, |st, idp| {
            let s = &st.ids[&idp];
            if s.phase != Phase::ReqReceived {
                return Err(libc::EINVAL);
            }
            // SAFETY: a live id of ours.
            let cid = unsafe { cm_id(idp) };
            let dev = &backend().dev;
            if let Some(ask) = s.sidr_ask.clone() {
                let qpn = if cid.qp.is_null() {
                    p.map_or(0, |p| p.qp_num)
                } else {
                    // SAFETY: the id's QP, ours.
                    unsafe { (*cid.qp).qp_num }
                };
                dev.cm_sidr_reply(
                    ask.peer_ip,
                    ask.tid,
                    ask.req,
                    rdma::cm::sidr_status::VALID,
                    (qpn, RDMA_UDP_QKEY),
                )
                .map_err(|e| crate::translate::errno_of(&e))?;
                let s = st.ids.get_mut(&idp).expect("live");
                s.sidr_ask = None;
                s.phase = Phase::Connected;
                return Ok(None);
            }
            let peer = s.peer.ok_or(libc::EINVAL)?;
            let user = user_data(p);
            if user.len() > 196 {
                return Err(libc::EINVAL);
            }
            let rr = match p {
                Some(p) => resources(p.responder_resources)?,
                None => peer.initiator_depth.min(MAX_RD_ATOMIC),
            };
            let id_ = match p {
                Some(p) => resources(p.initiator_depth)?,
                None => peer.responder_resources.min(MAX_RD_ATOMIC),
            };
            let rnr = p.map_or(7, |p| p.rnr_retry_count.min(7));
            let conn = s.conn.ok_or(libc::EINVAL)?;
            let s = st.ids.get_mut(&idp).expect("live");
            s.resources = (rr, id_);
            s.retry = (peer.retry_count, peer.rnr_retry_count);
            let (qpn, srq) = if cid.qp.is_null() {
                (p.map_or(0, |p| p.qp_num), p.is_some_and(|p| p.srq != 0))
            } else {
                connect_qp(st, idp)?;
                // SAFETY: the id's QP, ours.
                let q = unsafe { &*cid.qp };
                (q.qp_num, !q.srq.is_null())
            };
            let s = &st.ids[&idp];
            let ours = mtu_enum(dev.max_path_mtu());
            let params = ConnParams {
                qpn,
                starting_psn: s.psn,
                responder_resources: rr,
                initiator_depth: id_,
                retry_count: peer.retry_count,
                rnr_retry_count: rnr,
                path_mtu: peer.path_mtu.min(ours),
                srq,
                local_ack_timeout: s.ack_timeout.unwrap_or(18),
                traffic_class: s.tos,
            };
            dev.cm_accept(conn, params, user)
                .map_err(|e| crate::translate::errno_of(&e))?;
            st.ids.get_mut(&idp).expect("live").phase = Phase::Accepting;
            Ok(Some(idp))
        });
        match r {
            Ok(Some(idp)) => ret(complete(idp)),
            Ok(None) => 0,
            Err(e) => minus_one(e),
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            let s = st.ids.get_mut(&idp).expect("live");
            if s.phase != Phase::ReqReceived {
                return Err(libc::EINVAL);
            }
            let dev = &backend().dev;
            if let Some(ask) = s.sidr_ask.take() {
                s.phase = Phase::Idle;
                return dev
                    .cm_sidr_reply(
                        ask.peer_ip,
                        ask.tid,
                        ask.req,
                        rdma::cm::sidr_status::REJECTED,
                        (0, 0),
                    )
                    .map_err(|e| crate::translate::errno_of(&e));
            }
            let data: &[u8] = if private_data.is_null() || len == 0 {
                &[]
            } else {
                // SAFETY: the program's buffer of the length it gave.
                unsafe { std::slice::from_raw_parts(private_data.cast(), len.into()) }
            };
            if data.len() > 148 {
                return Err(libc::EINVAL);
            }
            let conn = s.conn.take().ok_or(libc::EINVAL)?;
            s.phase = Phase::Idle;
            st.conns.remove(&conn);
            dev.cm_reject(conn, rej_reason::CONSUMER_DEFINED, data)
                .map_err(|e| crate::translate::errno_of(&e))
        }))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            let s = st.ids.get_mut(&idp).expect("live");
            if s.phase != Phase::RepReceived {
                return Err(libc::EINVAL);
            }
            let conn = s.conn.ok_or(libc::EINVAL)?;
            backend()
                .dev
                .cm_ready(conn)
                .map_err(|e| crate::translate::errno_of(&e))?;
            s.phase = Phase::Connected;
            Ok(())
        }))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            let s = st.ids.get_mut(&idp).expect("live");
            // SAFETY: a live id of ours.
            if unsafe { cm_id(idp) }.qp_type == IBV_QPT_UD {
                return Ok(());
            }
            let conn = s.conn.ok_or(libc::EINVAL)?;
            events::qp_to_err(idp);
            // As the kernel: a DREQ if we are connected and the peer did not
            // release first (then our CM answered its DREQ already).
            if matches!(s.phase, Phase::Connected | Phase::Disconnected) && !s.dreq_received {
                let _ = backend().dev.cm_disconnect(conn, &[]);
            }
            Ok(())
        }))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        ret(with_id(id, |st, idp| {
            let (new, sync) = if channel.is_null() {
                (new_channel(st)?, true)
            } else if st.channels.contains_key(&(channel as usize)) {
                (channel as usize, false)
            } else {
                return Err(libc::EINVAL);
            };
            let s = st.ids.get_mut(&idp).expect("live");
            let (old, old_sync) = (s.channel, s.sync);
            s.channel = new;
            s.sync = sync;
            // SAFETY: a live id of ours.
            unsafe { cm_id(idp) }.channel = new as *mut rdma_event_channel;
            let mut moved = Vec::new();
            if let Some(ch) = st.channels.get_mut(&old) {
                let had = ch.queue.len();
                let (mine, rest): (Vec<_>, Vec<_>) =
                    ch.queue.drain(..).partition(|q| q.owner == idp);
                ch.queue = rest.into();
                if had > 0 && ch.queue.is_empty() {
                    ch.drained();
                }
                moved = mine;
            }
            if let Some(ch) = st.channels.get_mut(&new) {
                for q in moved {
                    ch.push(q);
                }
            }
            if old_sync && old != new {
                free_channel(st, old);
            }
            Ok(())
        }))
    })
}
