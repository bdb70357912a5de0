//! QPs: create, modify (`ibv_modify_qp(3)`'s masks and transitions), query, destroy;
//! posting to them is in `post.rs`.

use super::*;
use crate::backend::Backend;
use libc::{EINVAL, EOPNOTSUPP};
use nic::contract::{QpOptions, QpTransition, RemoteQp};
use nic::verbs::VerbsError;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::Service;
use std::ffi::c_int;
use std::ptr::null_mut;

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_qp(
    p: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        if attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL); `cap` is
        // written back below, as ibv_create_qp(3) says.
        let a = unsafe { &mut *attr };
        let service = match a.qp_type {
            IBV_QPT_RC => Service::Rc,
            IBV_QPT_UC => Service::Uc,
            IBV_QPT_UD => Service::Ud,
            // XRC, raw packet, driver QPs: not implemented by this NIC.
            _ => return null_with(EOPNOTSUPP),
        };
        // A QP on an SRQ of the same PD takes its receives from it
        // (ibv_create_qp(3); its own max_recv_wr/max_recv_sge are ignored);
        // the SRQ counts it as a child (destroy_srq: EBUSY while it lives).
        let _srq_held = (!a.srq.is_null()).then(|| hold(a.srq.cast(), Kind::Srq));
        let srq = match &_srq_held {
            None => None,
            Some(None) => return null_with(EINVAL),
            Some(Some(_)) => match srq_for_qp(a.srq, p) {
                Ok(id) => Some(id),
                Err(e) => return null_with(e),
            },
        };
        let (Some(_scq_held), Some(_rcq_held)) = (
            hold(a.send_cq.cast(), Kind::Cq),
            hold(a.recv_cq.cast(), Kind::Cq),
        ) else {
            return null_with(EINVAL);
        };
        let cap = a.cap;
        if cap.max_send_wr > MAX_WR
            || cap.max_recv_wr > MAX_WR
            || cap.max_send_sge > MAX_SGE as u32
            || cap.max_recv_sge > MAX_SGE as u32
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
            loss_recovery: backend.cfg.loss_recovery,
            max_rd_atomic: MAX_RD_ATOMIC,
            // Checked above: at most MAX_SGE.
            max_send_sge: cap.max_send_sge.max(1) as u8,
            max_recv_sge: cap.max_recv_sge.max(1) as u8,
            max_inline_data: cap.max_inline_data,
            srq,
            service,
            ..QpOptions::default()
        };
        let made = {
            // In address order: creates on (A, B) and (B, A) never deadlock.
            let _g = lock_two(&scq.lock, &rcq.lock);
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
        // On an SRQ the QP has no receive queue: 0 receive WRs and SGEs
        // (its receives are the SRQ's).
        let on_srq = srq.is_some();
        let granted = ibv_qp_cap {
            max_send_wr: u32::from(opts.sq_depth),
            max_recv_wr: if on_srq { 0 } else { u32::from(opts.rq_depth) },
            max_send_sge: u32::from(opts.max_send_sge),
            max_recv_sge: if on_srq {
                0
            } else {
                u32::from(opts.max_recv_sge)
            },
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
                srq: a.srq,
                handle: qpn,
                qp_num: qpn,
                state: IBV_QPS_RESET,
                qp_type: a.qp_type,
                ..Default::default()
            },
            ex: Default::default(),
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
        register(
            q.cast(),
            Kind::Qp,
            &[p.cast(), a.send_cq.cast(), a.recv_cq.cast(), a.srq.cast()],
        );
        live()
            .get_or_insert_with(Default::default)
            .qps
            .insert(qpn, q as usize);
        q.cast()
    })
}

/// `ibv_destroy_qp(3)`: 0 or the errno. It waits (up to [`SLOW_WAIT`],
/// then EBUSY) for the QP's async events to be acknowledged, as
/// `ibv_get_async_event(3)` says; the QP is freed only once the engine
/// confirmed, so a failure returns an errno for a QP that still exists.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(q.cast(), Kind::Qp) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live QP of ours that no other call holds or can take.
        let qp = unsafe { &*q.cast::<Qp>() };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(qp.ibv.context) }.backend.dev;
        let r = {
            let _g = qp.lock.lock();
            // SAFETY: under the QP's lock.
            let inner = unsafe { &mut *qp.inner.get() };
            inner.qp.take().map(|h| dev.destroy_qp(h))
        };
        if let Some(Err(e)) = r {
            // nic's destroy_qp consumed the handle (the engine is gone):
            // the QP stays a valid object whose next destroy succeeds.
            return errno_of(&e);
        }
        dying.finish();
        // SAFETY: allocated in create_qp, now unregistered with nobody
        // holding it.
        drop(unsafe { Box::from_raw(q.cast::<Qp>()) });
        0
    })
}

/// Applies a checked `ibv_modify_qp` to the engine's QP.
pub(crate) fn modify(
    inner: &mut QpInner,
    qp_type: ibv_qp_type,
    attr: &ibv_qp_attr,
    mask: u32,
    backend: &Backend,
) -> Result<(), i32> {
    let cur = inner.state;
    let to = check_modify_of(qp_type, cur, attr.qp_state, mask)?;
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
    // ibv_modify_qp(3): EINVAL for "invalid value provided in attr". The
    // initiator depth (`max_rd_atomic`) above the device's
    // `max_qp_init_rd_atom` and the responder resources
    // (`max_dest_rd_atomic`) above its `max_qp_rd_atom` are refused, as
    // mlx5 refuses both and rxe the first (rxe_qp_chk_attr); a silent clamp
    // would hide a program's bug. perftest 4.5 sets `max_rd_atomic` to the
    // *peer's* `out_reads` (its device's `max_qp_rd_atom` unless `-o`), so
    // two rsnic ends agree (16); against a device that advertises more
    // (rxe: 128) the peer runs with `-o 16`, as against any such hardware.
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 && attr.max_rd_atomic > MAX_RD_ATOMIC)
        || (mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 && attr.max_dest_rd_atomic > MAX_RD_ATOMIC)
        || (mask & IBV_QP_RETRY_CNT != 0 && attr.retry_cnt > 7)
        || (mask & IBV_QP_RNR_RETRY != 0 && attr.rnr_retry > 7)
        || (mask & IBV_QP_SQ_PSN != 0 && attr.sq_psn > 0xFF_FFFF)
        || (mask & IBV_QP_RQ_PSN != 0 && attr.rq_psn > 0xFF_FFFF)
        || (mask & IBV_QP_DEST_QPN != 0 && attr.dest_qp_num > 0xFF_FFFF)
    {
        return Err(EINVAL);
    }
    let h = inner.qp.as_mut().ok_or(EINVAL)?;
    let engine = |r: Result<(), VerbsError>| r.map_err(|e| errno_of(&e));
    if mask & IBV_QP_QKEY != 0 && !matches!(to, IBV_QPS_RESET | IBV_QPS_ERR) {
        engine(h.set_qkey(attr.qkey))?;
    }
    match (cur, to) {
        (_, IBV_QPS_RESET) => engine(h.modify_qp(QpTransition::Reset))?,
        (_, IBV_QPS_ERR) => engine(h.modify_qp(QpTransition::Err))?,
        (IBV_QPS_RESET, IBV_QPS_INIT) => engine(h.modify_qp(QpTransition::Init))?,
        // A UD QP has no peer: its datagrams carry their address.
        (IBV_QPS_INIT, IBV_QPS_RTR) if qp_type == IBV_QPT_UD => {
            let me = h.ud_self();
            engine(h.modify_qp(QpTransition::Rtr(me)))?;
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) if qp_type != IBV_QPT_RC => {
            // UC and UD never retransmit: no retry attributes.
            engine(h.set_sq_psn(attr.sq_psn))?;
            engine(h.modify_qp(QpTransition::Rts))?;
        }
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
            // The retry attributes of this transition (the mask rules made
            // them present), applied to the transport before it sends.
            engine(h.set_retry(timeout_ns(attr.timeout), attr.retry_cnt, attr.rnr_retry))?;
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
        IBV_QP_QKEY => qkey;
    }
    Ok(())
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_modify_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let Some(_held) = hold(q.cast(), Kind::Qp) else {
            return EINVAL;
        };
        if attr.is_null() {
            return EINVAL;
        }
        // SAFETY: a live QP of ours (held) and the caller's attributes.
        let (qp, attr) = unsafe { (&*q.cast::<Qp>(), &*attr) };
        // SAFETY: its context outlives it.
        let backend = unsafe { Context::from_ibv(qp.ibv.context) }.backend;
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        let r = modify(inner, qp.ibv.qp_type, attr, mask as u32, backend);
        set_ibv_state(q, inner.state);
        match r {
            Ok(()) => 0,
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(_held) = hold(q.cast(), Kind::Qp) else {
            return EINVAL;
        };
        if attr.is_null() {
            return EINVAL;
        }
        // SAFETY: a live QP of ours (held).
        let qp = unsafe { &*q.cast::<Qp>() };
        let _g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &mut *qp.inner.get() };
        // ibv_query_qp(3) reports the QP's current state, which includes
        // an ERR the engine entered by itself (retries exhausted, a remote
        // error, a receive too short): ask the engine, and keep what it
        // says, as rdma-core's ibv_query_qp updates `qp->state`.
        if let Some(Ok(rdma::transport::QpState::Err)) = inner.qp.as_ref().map(|h| h.state()) {
            if inner.state != IBV_QPS_RESET {
                inner.state = IBV_QPS_ERR;
                set_ibv_state(q, IBV_QPS_ERR);
            }
        }
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
                    srq: qp.ibv.srq,
                    cap: inner.cap,
                    qp_type: qp.ibv.qp_type,
                    sq_sig_all: inner.sq_sig_all.into(),
                });
            }
        }
        0
    })
}

/// Writes the program-visible `ibv_qp.state` (under the QP's lock, through
/// the raw pointer: no `&mut` to a struct the program reads).
fn set_ibv_state(q: *mut ibv_qp, state: ibv_qp_state) {
    // SAFETY: a live QP of ours whose lock the caller holds.
    unsafe { (&raw mut (*q).state).write(state) };
}
