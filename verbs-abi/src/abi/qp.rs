//! QPs: create, modify (`ibv_modify_qp(3)`'s masks and transitions), query, destroy, and the `post_send`/`post_recv` ops.

use super::*;
use crate::backend::Backend;
use libc::{EINVAL, EOPNOTSUPP};
use nic::contract::{QpOptions, QpTransition, RemoteQp};
use nic::verbs::VerbsError;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{RecvWr, SendOp, SendWr, Service, Sge, UdDest};
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

/// A send work request of the caller's chain, translated.
enum Prepared {
    /// Goes to the engine as it is (batched with its neighbours).
    Wr(SendWr),
    /// Several SGEs: goes alone, its list translated into the caller's
    /// array (`n` of them; `QueuePair::post_send_sges`).
    List(SendWr, usize),
    /// `IBV_SEND_INLINE`: its `len` bytes, copied now into the caller's
    /// buffer (staged when posted).
    Inline {
        wr_id: u64,
        op: SendOp,
        len: usize,
        signaled: bool,
    },
}

/// Translates one send work request (its flags, opcode and SGEs); an
/// inline one's bytes go to `buf`.
#[inline]
fn prepare(
    sig_all: bool,
    cap: &ibv_qp_cap,
    w: &ibv_send_wr,
    buf: &mut [u8; MAX_INLINE as usize],
    list: &mut Option<[Sge; MAX_SGE]>,
) -> Result<Prepared, i32> {
    let max_inline = cap.max_inline_data;
    let op = send_op(w)?;
    let signaled = sig_all || w.send_flags & IBV_SEND_SIGNALED != 0;
    let solicited = w.send_flags & IBV_SEND_SOLICITED != 0;
    let n = usize::try_from(w.num_sge).map_err(|_| EINVAL)?;
    // More SGEs than the QP was created for: EINVAL, as rxe's
    // `validate_send_wr` answers (checked for inline requests too).
    if (n > 0 && w.sg_list.is_null()) || n > cap.max_send_sge as usize {
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
        return Ok(Prepared::Inline {
            wr_id: w.wr_id,
            op,
            len,
            signaled,
        });
    }
    let mut wr = SendWr {
        wr_id: w.wr_id,
        op,
        sge: Sge::default(),
        signaled,
        solicited,
    };
    match sges {
        [] => Ok(Prepared::Wr(wr)),
        [s] => {
            wr.sge = sge_of(s);
            Ok(Prepared::Wr(wr))
        }
        // An ATOMIC takes one 8-byte SGE (IBA 9.4.5; rxe: EINVAL).
        _ if op.is_atomic() => Err(EINVAL),
        _ => {
            let list = list.get_or_insert([Sge::default(); MAX_SGE]);
            for (dst, s) in list.iter_mut().zip(sges) {
                *dst = sge_of(s);
            }
            Ok(Prepared::List(wr, sges.len()))
        }
    }
}

/// An `ibv_sge` as the engine's SGE.
#[inline]
fn sge_of(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        len: s.length,
        lkey: s.lkey,
    }
}

/// Work requests of a chain posted with one doorbell
/// (`QueuePair::post_send_list`).
const CHAIN_BATCH: usize = 16;

/// `ibv_post_send` (through `ops.post_send`): the chain of work requests to
/// the engine's doorbell ring, up to [`CHAIN_BATCH`] of them with one
/// doorbell (an inline one goes alone, in its place in the order); on the
/// first failure `*bad` is set to it and its errno returned, those before
/// it posted (ibv_post_send(3)). No allocation, no system call.
pub(crate) extern "C" fn op_post_send(
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
        let (sig_all, cap) = (inner.sq_sig_all, inner.cap);
        let Some(h) = inner.qp.as_mut() else {
            return fail(wr, EINVAL);
        };
        let posted = match qp.ibv.qp_type {
            IBV_QPT_UD => post_chain_ud(sig_all, &cap, h, wr),
            t => post_chain(sig_all, &cap, t == IBV_QPT_UC, h, wr),
        };
        match posted {
            Ok(()) => 0,
            Err((at, e)) => fail(at, e),
        }
    })
}

/// Posts the chain of UD work requests from `wr` through `h`
/// ([`op_post_send`] on a UD QP), one doorbell each: SEND or SEND with
/// immediate of at most the path MTU to `wr.ud` (an address handle of the
/// QP's PD, the remote QPN and Q_Key); anything else is EINVAL, as rxe's
/// `validate_send_wr` answers.
fn post_chain_ud(
    sig_all: bool,
    cap: &ibv_qp_cap,
    h: &mut nic::verbs::QueuePair,
    wr: *mut ibv_send_wr,
) -> Result<(), (*mut ibv_send_wr, i32)> {
    let mut cur = wr;
    let mut list = [Sge::default(); MAX_SGE];
    let mut inline = [0u8; MAX_INLINE as usize];
    while !cur.is_null() {
        // SAFETY: a work request of the caller's chain.
        let w = unsafe { &*cur };
        post_one_ud(sig_all, cap, h, w, &mut list, &mut inline).map_err(|e| (cur, e))?;
        cur = w.next;
    }
    Ok(())
}

/// One UD work request of [`post_chain_ud`].
fn post_one_ud(
    sig_all: bool,
    cap: &ibv_qp_cap,
    h: &mut nic::verbs::QueuePair,
    w: &ibv_send_wr,
    list: &mut [Sge; MAX_SGE],
    inline: &mut [u8; MAX_INLINE as usize],
) -> Result<(), i32> {
    let imm = match send_op(w)? {
        SendOp::Send => None,
        SendOp::SendImm(i) => Some(i),
        _ => return Err(EINVAL),
    };
    // SAFETY (union read): plain integers and a pointer; the opcode says
    // the program set `wr.ud`.
    let ud = unsafe { w.wr.ud };
    let ah = ah_id(ud.ah).ok_or(EINVAL)?;
    let n = usize::try_from(w.num_sge).map_err(|_| EINVAL)?;
    if (n > 0 && w.sg_list.is_null()) || n > cap.max_send_sge as usize {
        return Err(EINVAL);
    }
    // SAFETY: ibv_post_send(3): `sg_list` holds `num_sge` entries.
    let sges = if n == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    let u = nic::verbs::UdWr {
        wr_id: w.wr_id,
        sge: Sge::default(),
        imm,
        dest: UdDest {
            ah,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        },
        signaled: sig_all || w.send_flags & IBV_SEND_SIGNALED != 0,
        solicited: w.send_flags & IBV_SEND_SOLICITED != 0,
    };
    let r = if w.send_flags & IBV_SEND_INLINE != 0 {
        let mut len = 0usize;
        for s in sges {
            let l = s.length as usize;
            if len + l > cap.max_inline_data as usize {
                return Err(EINVAL);
            }
            if l > 0 {
                // SAFETY: an inline SGE is the program's memory, readable for
                // `length` bytes during the call (no lkey needed).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.addr as *const u8,
                        inline[len..].as_mut_ptr(),
                        l,
                    )
                };
            }
            len += l;
        }
        h.post_send_ud_inline(u, &inline[..len])
    } else {
        for (dst, s) in list.iter_mut().zip(sges) {
            *dst = sge_of(s);
        }
        h.post_send_ud(u, &list[..n])
    };
    r.map_err(|e| errno_of(&e))
}

/// Posts the chain from `wr` through `h` ([`op_post_send`]), the QP's
/// `sq_sig_all` and capabilities given (`uc`: a UC QP, which refuses READ
/// and ATOMIC); the failed request and its errno.
fn post_chain(
    sig_all: bool,
    cap: &ibv_qp_cap,
    uc: bool,
    h: &mut nic::verbs::QueuePair,
    wr: *mut ibv_send_wr,
) -> Result<(), (*mut ibv_send_wr, i32)> {
    {
        const FILLER: SendWr = SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sge: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            signaled: false,
            solicited: false,
        };
        let mut batch = [FILLER; CHAIN_BATCH];
        let mut from = [null_mut::<ibv_send_wr>(); CHAIN_BATCH];
        let mut n = 0;
        let mut inline = [0u8; MAX_INLINE as usize];
        // The translated list of a request with several SGEs (cleared only
        // when one comes: one SGE is the common case).
        let mut list = None;
        // Posts the batch; the failed request's place in the chain if any.
        let flush = |h: &mut nic::verbs::QueuePair,
                     batch: &[SendWr],
                     from: &[*mut ibv_send_wr]|
         -> Result<(), (*mut ibv_send_wr, i32)> {
            if batch.is_empty() {
                return Ok(());
            }
            h.post_send_list(batch)
                .map_err(|(k, e)| (from[k], errno_of(&e)))
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a work request of the caller's chain.
            let w = unsafe { &*cur };
            // UC has SEND and RDMA WRITE only (IBA 9.8.2; rxe: EINVAL), and
            // memory windows are bound on RC QPs here.
            let prepared = match send_op(w) {
                Ok(op)
                    if uc
                        && (op.needs_response()
                            || op.is_local()
                            || matches!(op, SendOp::SendInv(_))) =>
                {
                    Err(EINVAL)
                }
                _ => prepare(sig_all, cap, w, &mut inline, &mut list),
            };
            match prepared {
                Ok(Prepared::Wr(x)) => {
                    batch[n] = x;
                    from[n] = cur;
                    n += 1;
                    if n == CHAIN_BATCH {
                        flush(h, &batch, &from)?;
                        n = 0;
                    }
                }
                Ok(Prepared::List(x, k)) => {
                    flush(h, &batch[..n], &from[..n])?;
                    n = 0;
                    let sgl = list.as_ref().map_or(&[][..], |l| &l[..k]);
                    h.post_send_sges(x, sgl).map_err(|e| (cur, errno_of(&e)))?;
                }
                Ok(Prepared::Inline {
                    wr_id,
                    op,
                    len,
                    signaled,
                }) => {
                    flush(h, &batch[..n], &from[..n])?;
                    n = 0;
                    h.post_send_inline(wr_id, op, &inline[..len], signaled)
                        .map_err(|e| (cur, errno_of(&e)))?;
                }
                Err(e) => {
                    flush(h, &batch[..n], &from[..n])?;
                    return Err((cur, e));
                }
            }
            cur = w.next;
        }
        flush(h, &batch[..n], &from[..n])
    }
}

/// `ibv_post_recv` (through `ops.post_recv`), as [`op_post_send`].
pub(crate) extern "C" fn op_post_recv(
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
        let max_sge = inner.cap.max_recv_sge as usize;
        let Some(h) = inner.qp.as_mut() else {
            return fail(wr, EINVAL);
        };
        let mut list = None;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a work request of the caller's chain.
            let w = unsafe { &*cur };
            let r = recv_wr_of(w, max_sge, &mut list).and_then(|(rwr, sgl)| {
                match sgl {
                    Some(l) => h.post_recv_sges(rwr, l),
                    None => h.post_recv(rwr),
                }
                .map_err(|e| errno_of(&e))
            });
            if let Err(e) = r {
                return fail(cur, e);
            }
            cur = w.next;
        }
        0
    })
}

/// Receive WR `w` (`ibv_post_recv(3)`, `ibv_post_srq_recv(3)`) as the
/// engine's request: its one SGE (or none) in the request itself, or, for
/// several, the list copied into `list` (made only then): EINVAL for more
/// than `max` SGEs (at most [`MAX_SGE`]) or a NULL list with entries.
pub(crate) fn recv_wr_of<'a>(
    w: &ibv_recv_wr,
    max: usize,
    list: &'a mut Option<[Sge; MAX_SGE]>,
) -> Result<(RecvWr, Option<&'a [Sge]>), c_int> {
    let n = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
    if n > max.min(MAX_SGE) || (n > 0 && w.sg_list.is_null()) {
        return Err(EINVAL);
    }
    let sges = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the man pages: `sg_list` holds `num_sge` entries.
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    let mut wr = RecvWr {
        wr_id: w.wr_id,
        sge: Sge::default(),
    };
    match sges {
        [] => Ok((wr, None)),
        [one] => {
            wr.sge = sge_of(one);
            Ok((wr, None))
        }
        _ => {
            let l = list.get_or_insert([Sge::default(); MAX_SGE]);
            for (dst, s) in l.iter_mut().zip(sges) {
                *dst = sge_of(s);
            }
            Ok((wr, Some(&l[..n])))
        }
    }
}
