//! The QP an id owns: `rdma_create_qp(_ex)`, `rdma_destroy_qp`,
//! `rdma_init_qp_attr` and the transitions the CM makes (INIT at creation, RTR
//! and RTS when a REP comes or at `rdma_accept`, as the kernel's rdma_cm), and
//! the synchronous endpoints (`rdma_create_ep`, `rdma_get_request`).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use rdma::wire::cm::RDMA_UDP_QKEY;

use super::calls::*;
use super::*;
use crate::abi::{guard, minus_one};

/// The attributes of a QP transition for an id's connection (librdmacm's
/// `rdma_init_qp_attr`, from the kernel's `ib_cm_init_qp_attr`): INIT with
/// REMOTE_WRITE (and READ/ATOMIC when it accepts READs), RTR toward the peer's
/// QPN and PSN, RTS from our PSN with the REQ's retry count and the peer's RNR
/// retry count. A UD id: INIT with rdma_cm's Q_Key.
pub(crate) fn qp_attr(
    s: &IdState,
    idp: usize,
    to: ibv_qp_state,
) -> Result<(ibv_qp_attr, u32), i32> {
    // SAFETY: a C struct of integers: zeros are valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = to;
    // SAFETY: a live id of ours.
    let ud = unsafe { cm_id(idp) }.qp_type == IBV_QPT_UD;
    let mask = match to {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
            } else {
                if s.peer.is_some() {
                    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
                    if s.resources.0 > 0 {
                        a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
                    }
                }
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
            }
        }
        IBV_QPS_RTR if ud => IBV_QP_STATE,
        IBV_QPS_RTS if ud => {
            a.sq_psn = 0;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        IBV_QPS_RTR => {
            let peer = s.peer.ok_or(libc::EINVAL)?;
            let dst = s.dst.ok_or(libc::EINVAL)?;
            let ours = mtu_enum(backend().dev.max_path_mtu());
            a.path_mtu = match peer.path_mtu {
                0 => ours,
                m => m.min(ours),
            }
            .into();
            a.dest_qp_num = peer.qpn;
            // We receive from the PSN we announced and send from the peer's
            // (Linux's ib_cm: a REQ's or REP's Starting PSN is its sender's
            // receive PSN).
            a.rq_psn = s.psn;
            a.max_dest_rd_atomic = s.resources.0;
            a.min_rnr_timer = 12;
            a.ah_attr = events::ah_to(dst.ip().octets());
            a.ah_attr.grh.traffic_class = s.tos;
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        IBV_QPS_RTS => {
            let peer = s.peer.ok_or(libc::EINVAL)?;
            a.sq_psn = peer.psn;
            a.timeout = s.ack_timeout.unwrap_or(match peer.ack_timeout {
                0 => 18,
                t => t,
            });
            a.retry_cnt = s.retry.0;
            a.rnr_retry = s.retry.1;
            a.max_rd_atomic = s.resources.1;
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask))
}

/// Applies one transition to the id's QP.
fn modify_to(s: &IdState, idp: usize, to: ibv_qp_state) -> Result<(), i32> {
    let (mut a, mask) = qp_attr(s, idp, to)?;
    // SAFETY: a live id of ours.
    let qp = unsafe { cm_id(idp) }.qp;
    match crate::abi::rsnic_ibv_modify_qp(qp, &mut a, mask as c_int) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves a connecting id's QP to RTS (INIT again with the connection's access,
/// RTR, RTS), as the kernel's rdma_cm does on a REP and in `rdma_accept`.
pub(crate) fn connect_qp(st: &mut CmState, idp: usize) -> Result<(), i32> {
    let s = st.ids.get(&idp).ok_or(libc::EINVAL)?;
    modify_to(s, idp, IBV_QPS_INIT)?;
    modify_to(s, idp, IBV_QPS_RTR)?;
    modify_to(s, idp, IBV_QPS_RTS)
}

// ---------------------------------------------------------------- the id's QP

/// Creates the CQs a QP was given none of (librdmacm's `ucma_create_cqs`: each
/// on a completion channel of its own, `id->send_cq_channel` ...).
fn make_cqs(s: &mut IdState, cid: &mut rdma_cm_id, attr: &mut ibv_qp_init_attr) -> Result<(), i32> {
    let verbs = cid.verbs;
    let owner: *mut c_void = (cid as *mut rdma_cm_id).cast();
    let mut one = |depth: u32| -> Result<(*mut ibv_cq, *mut ibv_comp_channel), i32> {
        let ch = crate::abi::rsnic_ibv_create_comp_channel(verbs);
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        let cq = crate::abi::rsnic_ibv_create_cq(verbs, depth.max(1) as c_int, owner, ch, 0);
        if cq.is_null() {
            crate::abi::rsnic_ibv_destroy_comp_channel(ch);
            return Err(libc::ENOMEM);
        }
        s.lib_cqs.push((cq, ch));
        Ok((cq, ch))
    };
    if attr.recv_cq.is_null() {
        let (cq, ch) = one(attr.cap.max_recv_wr)?;
        cid.recv_cq = cq;
        cid.recv_cq_channel = ch;
        attr.recv_cq = cq;
    }
    if attr.send_cq.is_null() {
        let (cq, ch) = one(attr.cap.max_send_wr)?;
        cid.send_cq = cq;
        cid.send_cq_channel = ch;
        attr.send_cq = cq;
    }
    Ok(())
}

/// Moves a new QP to where librdmacm leaves it: INIT for RC (RTR/RTS at
/// connect), RTS for UD (a UD QP needs no peer).
fn init_qp(s: &IdState, idp: usize) -> Result<(), i32> {
    modify_to(s, idp, IBV_QPS_INIT)?;
    // SAFETY: a live id of ours.
    if unsafe { cm_id(idp) }.qp_type == IBV_QPT_UD {
        modify_to(s, idp, IBV_QPS_RTR)?;
        modify_to(s, idp, IBV_QPS_RTS)?;
    }
    Ok(())
}

/// `rdma_create_qp` of a live id under the lock.
fn create_qp(
    st: &mut CmState,
    idp: usize,
    pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
) -> Result<(), i32> {
    // SAFETY: a live id of ours.
    let cid = unsafe { cm_id(idp) };
    if cid.verbs.is_null() || !cid.qp.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if !pd.is_null() {
        pd
    } else if !cid.pd.is_null() {
        cid.pd
    } else {
        shared()?.pd as *mut ibv_pd
    };
    // SAFETY: a PD the program passed (ours: checked by ibv_create_qp).
    if unsafe { (*pd).context } != cid.verbs {
        return Err(libc::EINVAL);
    }
    let s = st.ids.get_mut(&idp).expect("live");
    make_cqs(s, cid, attr)?;
    let qp = crate::abi::rsnic_ibv_create_qp(pd, attr);
    if qp.is_null() {
        return Err(crate::abi::last_errno(libc::EINVAL));
    }
    cid.qp = qp;
    cid.pd = pd;
    if let Err(e) = init_qp(s, idp) {
        crate::abi::rsnic_ibv_destroy_qp(qp);
        cid.qp = null_mut();
        return Err(e);
    }
    Ok(())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if attr.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the program's attributes (written back as ibv_create_qp does).
        let attr = unsafe { &mut *attr };
        ret(with_id(id, |st, idp| create_qp(st, idp, pd, attr)))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        if attr.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the program's attributes.
        let a = unsafe { &mut *attr };
        ret(with_id(id, |st, idp| {
            // SAFETY: a live id of ours.
            let cid = unsafe { cm_id(idp) };
            if cid.verbs.is_null() || !cid.qp.is_null() {
                return Err(libc::EINVAL);
            }
            if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
                a.pd = if cid.pd.is_null() {
                    shared()?.pd as *mut ibv_pd
                } else {
                    cid.pd
                };
                a.comp_mask |= IBV_QP_INIT_ATTR_PD;
            }
            // SAFETY: a C struct of pointers and integers: zeros are valid.
            let mut plain: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            plain.send_cq = a.send_cq;
            plain.recv_cq = a.recv_cq;
            plain.cap = a.cap;
            let s = st.ids.get_mut(&idp).expect("live");
            make_cqs(s, cid, &mut plain)?;
            a.send_cq = plain.send_cq;
            a.recv_cq = plain.recv_cq;
            let qp = crate::abi::ctx_create_qp_ex(cid.verbs, a);
            if qp.is_null() {
                return Err(crate::abi::last_errno(libc::EINVAL));
            }
            cid.qp = qp;
            cid.pd = a.pd;
            if let Err(e) = init_qp(s, idp) {
                crate::abi::rsnic_ibv_destroy_qp(qp);
                cid.qp = null_mut();
                return Err(e);
            }
            Ok(())
        }))
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let _ = with_id(id, |_, idp| {
            // SAFETY: a live id of ours.
            let cid = unsafe { cm_id(idp) };
            if !cid.qp.is_null() {
                crate::abi::rsnic_ibv_destroy_qp(cid.qp);
                cid.qp = null_mut();
            }
            Ok(())
        });
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        if attr.is_null() || mask.is_null() {
            return minus_one(libc::EINVAL);
        }
        ret(with_id(id, |st, idp| {
            // SAFETY: the program's attributes, their state asked for.
            let to = unsafe { (*attr).qp_state };
            let (a, m) = qp_attr(&st.ids[&idp], idp, to)?;
            // SAFETY: the program's out pointers.
            unsafe {
                *attr = a;
                *mask = m as c_int;
            }
            Ok(())
        }))
    })
}

// ---------------------------------------------------------------- endpoints

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the program's address info.
        let r = unsafe { &*res };
        let mut cid: *mut rdma_cm_id = null_mut();
        if rsnic_rdma_create_id(null_mut(), &mut cid, null_mut(), r.ai_port_space as u32) != 0 {
            return -1;
        }
        let done = if r.ai_flags & RAI_PASSIVE as c_int != 0 {
            if rsnic_rdma_bind_addr(cid, r.ai_src_addr) != 0 {
                Err(())
            } else {
                if !qp_init_attr.is_null() {
                    // SAFETY: the program's attributes, copied for each
                    // request, of the address info's QP type (as librdmacm).
                    let mut a = unsafe { *qp_init_attr };
                    a.qp_type = r.ai_qp_type as ibv_qp_type;
                    let _ = with_id(cid, |st, idp| {
                        st.ids.get_mut(&idp).expect("live").ep_qp = Some((a, pd));
                        Ok(())
                    });
                }
                // SAFETY: ours.
                unsafe { (*cid).pd = pd };
                Ok(())
            }
        } else if rsnic_rdma_resolve_addr(cid, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
            || rsnic_rdma_resolve_route(cid, 2000) != 0
            || (!qp_init_attr.is_null() && {
                // SAFETY: the program's attributes: the QP type is the
                // address info's (as librdmacm sets it).
                unsafe { (*qp_init_attr).qp_type = r.ai_qp_type as ibv_qp_type };
                rsnic_rdma_create_qp(cid, pd, qp_init_attr) != 0
            })
        {
            Err(())
        } else {
            Ok(())
        };
        if done.is_err() {
            let e = crate::abi::last_errno(libc::EINVAL);
            rsnic_rdma_destroy_id(cid);
            return minus_one(e);
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = cid };
        0
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        rsnic_rdma_destroy_qp(id);
        rsnic_rdma_destroy_id(id);
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return minus_one(libc::EINVAL);
        }
        let ok = with_id(listen, |st, idp| {
            let s = &st.ids[&idp];
            (s.sync && s.phase == Phase::Listening)
                .then_some(())
                .ok_or(libc::EINVAL)
        });
        if let Err(e) = ok {
            return minus_one(e);
        }
        if let Err(e) = complete(listen as usize) {
            return minus_one(e);
        }
        // SAFETY: a live listening id of ours; its event was just taken.
        let l = unsafe { &mut *listen };
        // SAFETY: as above.
        let ev = unsafe { &*l.event };
        if ev.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            return minus_one(libc::EINVAL);
        }
        let child = ev.id;
        // The request's event now belongs to the new id (acked with its next).
        // SAFETY: the child is a live id of ours.
        unsafe { (*child).event = std::mem::replace(&mut l.event, null_mut()) };
        let ep = with_id(listen, |st, idp| Ok(st.ids[&idp].ep_qp));
        if let Ok(Some((mut a, pd))) = ep {
            if rsnic_rdma_create_qp(child, pd, &mut a) != 0 {
                let e = crate::abi::last_errno(libc::EINVAL);
                rsnic_rdma_reject(child, std::ptr::null(), 0);
                rsnic_rdma_destroy_id(child);
                return minus_one(e);
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = child };
        0
    })
}
