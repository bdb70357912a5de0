//! Posting to a QP: `ibv_post_send(3)` (a chain of work requests translated
//! and handed to the QP's doorbell ring, batched where they go as they are;
//! several SGEs, inline data and UD destinations each their own way) and
//! `ibv_post_recv(3)`; `bad_wr` and the errno as rdma-core's providers set
//! them (rxe: the first WR that fails, EINVAL / ENOMEM).

use super::*;
use libc::EINVAL;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{RecvWr, SendOp, SendWr, Sge, UdDest};
use std::ffi::c_int;
use std::ptr::null_mut;

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
