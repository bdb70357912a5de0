//! The extended QP (issue 40, item 5): `verbs_context.create_qp_ex`
//! (`ibv_create_qp_ex(3)`, verbs.h's inline function calls it for any
//! `comp_mask` but `IBV_QP_INIT_ATTR_PD` alone) and `ibv_qp_to_qp_ex`; the
//! `ibv_qp_ex` function pointers that verbs.h's inline `ibv_wr_*` call
//! (`ibv_wr_post(3)`): a batch built between `ibv_wr_start` and
//! `ibv_wr_complete` is posted to the QP's doorbell ring with the same
//! `nic::verbs::QueuePair` calls as `ibv_post_send`, all of it or nothing.
//!
//! An `ibv_qp_ex` begins with its `ibv_qp` (`qp_base`), so the extended QP
//! is the same address as the plain one: [`Qp`] carries the rest of the
//! extended struct ([`QpExTail`], with the batch, [`WrBatch`]) right after
//! its `ibv_qp`, zero (no function pointers) for a QP of `ibv_create_qp`.
//! The compile-time checks next to those types (`objects`) hold the layout
//! to verbs.h's.
//!
//! Which combinations are accepted follows Linux rxe's provider
//! (rdma-core providers/rxe/rxe.c): `comp_mask` beyond PD, CREATE_FLAGS and
//! SEND_OPS_FLAGS, any `create_flags`, or a `send_ops_flags` bit the QP
//! type does not take is EOPNOTSUPP (`check_qp_init_attr`). An RC QP
//! here takes WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM, READ and both
//! atomics, LOCAL_INV, BIND_MW and SEND_WITH_INV (memory windows), as rxe;
//! rxe also takes FLUSH and ATOMIC_WRITE (IBA 1.5).

use super::*;
use libc::{EINVAL, ENOSPC, EOPNOTSUPP};
use nic::contract::doorbell_slots;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{SendOp, SendWr, Sge, UdDest};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// `send_ops_flags` an RC QP takes here.
pub const RC_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV) as u64;
/// `send_ops_flags` a UC QP will take (rxe's set minus memory windows).
pub const UC_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;
/// `send_ops_flags` a UD QP will take (rxe's).
pub const UD_SEND_OPS: u64 = (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;

/// The `send_ops_flags` a QP of type `t` may ask for; None: the type has
/// no `ibv_wr_*` here.
pub fn send_ops_of(t: ibv_qp_type) -> Option<u64> {
    match t {
        IBV_QPT_RC => Some(RC_SEND_OPS),
        IBV_QPT_UC => Some(UC_SEND_OPS),
        IBV_QPT_UD => Some(UD_SEND_OPS),
        _ => None,
    }
}

impl WrBatch {
    fn clear(&mut self) {
        self.err = 0;
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
    }

    /// Records the batch's first error.
    fn fail(&mut self, e: i32) {
        if self.err == 0 {
            self.err = e;
        }
    }
}

/// The [`Qp`] of an `ibv_qp_ex` of ours.
///
/// # Safety
/// `q` must be the `ibv_qp_ex` of a live QP created by `create_qp_ex`.
unsafe fn qp_of<'a>(q: *mut ibv_qp_ex) -> &'a Qp {
    // SAFETY: the caller's contract; `qp_base` is the Qp's first field.
    unsafe { &*q.cast::<Qp>() }
}

/// The open batch of `q` (None outside `ibv_wr_start` .. `complete`).
///
/// # Safety
/// As [`qp_of`]; the caller holds the QP's lock (it is in the batch) or
/// is the thread that opened the batch.
unsafe fn open_batch<'a>(q: *mut ibv_qp_ex) -> Option<&'a mut WrBatch> {
    // SAFETY: the caller's contract.
    let qp = unsafe { qp_of(q) };
    // SAFETY: the batch is only touched by the thread inside the QP's
    // critical section (ibv_wr_post(3), CONCURRENCY).
    let b = unsafe { &mut *qp.ex.batch.get() }.as_deref_mut()?;
    b.guard.is_some().then_some(b)
}

/// Starts a work request of `op` with the QP's `wr_id` and `wr_flags`.
fn begin(q: *mut ibv_qp_ex, op: SendOp) {
    guard((), || {
        // SAFETY: reached only through the ops of a QP of ours.
        let Some(b) = (unsafe { open_batch(q) }) else {
            return;
        };
        if b.err != 0 {
            return;
        }
        // rxe: a full send queue is ENOSPC (check_qp_queue_full).
        if b.wrs.len() >= b.cap.max_send_wr as usize {
            return b.fail(ENOSPC);
        }
        // SAFETY: the program's fields of its ibv_qp_ex, set before the
        // builder is called (ibv_wr_post(3)).
        let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
        b.wrs.push(Staged {
            wr: SendWr {
                wr_id,
                op,
                sge: Sge::default(),
                signaled: b.sig_all || flags & IBV_SEND_SIGNALED != 0,
                solicited: flags & IBV_SEND_SOLICITED != 0,
            },
            first: 0,
            n: 0,
            inline: None,
            ud: None,
        });
    })
}

/// Fails the open batch of `q` with `e` (reported by `ibv_wr_complete`).
fn fail_batch(q: *mut ibv_qp_ex, e: i32) {
    // SAFETY: reached only through the ops of a QP of ours.
    if let Some(b) = unsafe { open_batch(q) } {
        b.fail(e);
    }
}

extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    begin(q, SendOp::Send)
}
extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    begin(q, SendOp::SendImm(u32::from_be(imm)))
}
extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(q, SendOp::SendInv(invalidate_rkey))
}
extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(q, SendOp::LocalInv(invalidate_rkey))
}
/// `ibv_wr_bind_mw`: the bind of `mw` to `info` under the new R_Key `rkey`
/// (the program's choice, `ibv_inc_rkey` of the window's as a rule); a bad
/// bind fails the batch with its errno (EINVAL, EPERM) at `ibv_wr_complete`.
extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if info.is_null() {
        return fail_batch(q, EINVAL);
    }
    // SAFETY: the program's bind information (checked non-NULL), read only.
    match bind_op(mw, rkey, unsafe { &*info }) {
        Ok(op) => begin(q, op),
        Err(e) => fail_batch(q, e),
    }
}
extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_va: u64) {
    begin(q, SendOp::Write { remote_va, rkey })
}
extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, remote_va: u64, imm: u32) {
    begin(
        q,
        SendOp::WriteImm {
            remote_va,
            rkey,
            imm: u32::from_be(imm),
        },
    )
}
extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_va: u64) {
    begin(q, SendOp::Read { remote_va, rkey })
}
extern "C" fn wr_atomic_cmp_swp(q: *mut ibv_qp_ex, rkey: u32, va: u64, compare: u64, swap: u64) {
    begin(
        q,
        SendOp::CompareSwap {
            remote_va: va,
            rkey,
            compare,
            swap,
        },
    )
}
extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, va: u64, add: u64) {
    begin(
        q,
        SendOp::FetchAdd {
            remote_va: va,
            rkey,
            add,
        },
    )
}

/// Sets the SGE list of the last work request (`ibv_wr_set_sge_list`).
fn set_sges(q: *mut ibv_qp_ex, list: &[ibv_sge]) {
    // SAFETY: reached only through the ops of a QP of ours.
    let Some(b) = (unsafe { open_batch(q) }) else {
        return;
    };
    if b.err != 0 {
        return;
    }
    let max = b.cap.max_send_sge as usize;
    let Some(last) = b.wrs.last().copied() else {
        // A setter with no work request to set.
        return b.fail(EINVAL);
    };
    // rxe: more SGEs than the QP takes is ENOSPC (wr_set_sge_list).
    if list.len() > max {
        return b.fail(ENOSPC);
    }
    // An ATOMIC takes one 8-byte SGE (IBA 9.4.5); rxe's post_send: EINVAL.
    if last.wr.op.is_atomic() && list.len() > 1 {
        return b.fail(EINVAL);
    }
    let first = b.sges.len() as u32;
    b.sges.extend(list.iter().map(|s| Sge {
        addr: s.addr,
        len: s.length,
        lkey: s.lkey,
    }));
    let w = b.wrs.last_mut().expect("checked above");
    w.first = first;
    w.n = list.len() as u32;
    w.inline = None;
}

extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    guard((), || {
        // rxe: a zero length leaves the request without data.
        let one = [ibv_sge { addr, length, lkey }];
        set_sges(q, if length == 0 { &[] } else { &one });
    })
}

extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    guard((), || {
        if n > 0 && list.is_null() {
            // SAFETY: reached only through the ops of a QP of ours.
            if let Some(b) = unsafe { open_batch(q) } {
                b.fail(EINVAL);
            }
            return;
        }
        // ibv_wr_post(3): the list holds `num_sge` entries. More than
        // MAX_SGE is refused by set_sges (over the QP's max_send_sge).
        let list = if n == 0 {
            &[][..]
        } else {
            // SAFETY: as above, read during the call only.
            unsafe { std::slice::from_raw_parts(list, n.min(MAX_SGE + 1)) }
        };
        set_sges(q, list);
    })
}

/// Copies `bufs` as the inline data of the last work request
/// (`ibv_wr_set_inline_data_list`: "Valid only for SEND and RDMA_WRITE").
fn set_inline(q: *mut ibv_qp_ex, bufs: &[ibv_data_buf]) {
    // SAFETY: reached only through the ops of a QP of ours.
    let Some(b) = (unsafe { open_batch(q) }) else {
        return;
    };
    if b.err != 0 {
        return;
    }
    let Some(last) = b.wrs.last().copied() else {
        return b.fail(EINVAL);
    };
    if !matches!(
        last.wr.op,
        SendOp::Send | SendOp::SendImm(_) | SendOp::Write { .. } | SendOp::WriteImm { .. }
    ) {
        return b.fail(EINVAL);
    }
    let total: usize = bufs.iter().map(|d| d.length).sum();
    // rxe: more than max_inline_data is ENOSPC (wr_set_inline_data).
    if total > b.cap.max_inline_data as usize {
        return b.fail(ENOSPC);
    }
    let at = b.inline.len();
    for d in bufs {
        if d.length == 0 {
            continue;
        }
        if d.addr.is_null() {
            b.inline.truncate(at);
            return b.fail(EINVAL);
        }
        // SAFETY: ibv_wr_post(3): the program's buffer of `length` bytes,
        // copied during the call ("allows the caller to immediately re-use
        // the buffer").
        b.inline.extend_from_slice(unsafe {
            std::slice::from_raw_parts(d.addr.cast::<u8>(), d.length)
        });
    }
    let w = b.wrs.last_mut().expect("checked above");
    w.inline = Some((at as u32, total as u32));
    w.n = 0;
}

extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    guard((), || set_inline(q, &[ibv_data_buf { addr, length }]))
}

extern "C" fn wr_set_inline_data_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    guard((), || {
        if n > 0 && list.is_null() {
            // SAFETY: reached only through the ops of a QP of ours.
            if let Some(b) = unsafe { open_batch(q) } {
                b.fail(EINVAL);
            }
            return;
        }
        let list = if n == 0 {
            &[][..]
        } else {
            // SAFETY: ibv_wr_post(3): `num_buf` entries, read during the call.
            unsafe { std::slice::from_raw_parts(list, n) }
        };
        set_inline(q, list)
    })
}

/// `ibv_wr_set_ud_addr`: the destination of the last work request of a UD
/// QP (its address handle, QP number and Q_Key). An RC or UC QP has no
/// per-request address, and a handle that is not a live one of ours names
/// none: the batch fails with EINVAL.
extern "C" fn wr_set_ud_addr(
    q: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    guard((), || {
        // SAFETY: reached only through the ops of a QP of ours.
        let Some(b) = (unsafe { open_batch(q) }) else {
            return;
        };
        if b.err != 0 {
            return;
        }
        let (IBV_QPT_UD, Some(ah), Some(w)) = (b.qp_type, ah_id(ah), b.wrs.last_mut()) else {
            return b.fail(EINVAL);
        };
        w.ud = Some(UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        });
    })
}

/// `ibv_wr_start`: takes the QP's lock (the one `ibv_post_send` takes)
/// until `ibv_wr_complete` or `ibv_wr_abort` (ibv_wr_post(3),
/// CONCURRENCY), and opens an empty batch.
extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: reached only through the ops of a QP of ours, which lives
        // until ibv_destroy_qp (not while a batch is open).
        let qp: &'static Qp = unsafe { qp_of(q) };
        let g = qp.lock.lock();
        // SAFETY: under the QP's lock.
        let inner = unsafe { &*qp.inner.get() };
        // SAFETY: under the QP's lock, which we now hold.
        let Some(b) = (unsafe { &mut *qp.ex.batch.get() }).as_deref_mut() else {
            return;
        };
        b.clear();
        b.sig_all = inner.sq_sig_all;
        b.cap = inner.cap;
        b.guard = Some(g);
    })
}

/// `ibv_wr_abort`: discards the batch and releases the QP.
extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: reached only through the ops of a QP of ours.
        if let Some(b) = unsafe { open_batch(q) } {
            b.clear();
            b.guard = None;
        }
    })
}

/// `ibv_wr_complete`: posts the batch to the doorbell ring, all of it or,
/// on the batch's first error, none of it (its errno returned); releases
/// the QP either way. Outside a batch (never started, or after
/// `ibv_wr_abort` or `ibv_wr_complete`) it is EINVAL. A QP not in RTS (or
/// ERR) is EINVAL, as for `ibv_post_send`; a batch that does not fit in
/// the free doorbell slots is ENOSPC (rxe's answer for a full queue).
extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: reached only through the ops of a QP of ours.
        let qp = unsafe { qp_of(q) };
        // SAFETY: as above.
        let Some(b) = (unsafe { open_batch(q) }) else {
            return EINVAL;
        };
        let r = if b.err != 0 {
            b.err
        } else {
            // SAFETY: under the QP's lock (held by the batch).
            let inner = unsafe { &mut *qp.inner.get() };
            if !matches!(inner.state, IBV_QPS_RTS | IBV_QPS_ERR) {
                EINVAL
            } else {
                match inner.qp.as_mut() {
                    Some(h) => post_batch(h, b),
                    None => EINVAL,
                }
            }
        };
        b.clear();
        b.guard = None;
        r
    })
}

/// Posts a checked batch: the doorbell slots it needs are checked free
/// first, so that the posts below cannot fail half way.
fn post_batch(h: &mut nic::verbs::QueuePair, b: &WrBatch) -> c_int {
    let slots: usize = b.wrs.iter().map(|w| doorbell_slots(w.n as usize)).sum();
    if slots > h.free_slots() {
        return ENOSPC;
    }
    const BATCH: usize = 16;
    let mut run = [SendWr {
        wr_id: 0,
        op: SendOp::Send,
        sge: Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        signaled: false,
        solicited: false,
    }; BATCH];
    let mut n = 0;
    let flush = |h: &mut nic::verbs::QueuePair, run: &[SendWr]| -> Result<(), i32> {
        if run.is_empty() {
            return Ok(());
        }
        h.post_send_list(run).map_err(|(_, e)| errno_of(&e))
    };
    let mut go = || -> Result<(), i32> {
        for w in &b.wrs {
            let (first, k) = (w.first as usize, w.n as usize);
            if b.qp_type == IBV_QPT_UD {
                flush(h, &run[..n])?;
                n = 0;
                post_ud(h, b, w)?;
            } else if let Some((at, len)) = w.inline {
                flush(h, &run[..n])?;
                n = 0;
                let data = &b.inline[at as usize..(at + len) as usize];
                h.post_send_inline(w.wr.wr_id, w.wr.op, data, w.wr.signaled)
                    .map_err(|e| errno_of(&e))?;
            } else if k <= 1 {
                let mut wr = w.wr;
                if k == 1 {
                    wr.sge = b.sges[first];
                }
                run[n] = wr;
                n += 1;
                if n == BATCH {
                    flush(h, &run)?;
                    n = 0;
                }
            } else {
                flush(h, &run[..n])?;
                n = 0;
                h.post_send_sges(w.wr, &b.sges[first..first + k])
                    .map_err(|e| errno_of(&e))?;
            }
        }
        flush(h, &run[..n])
    };
    match go() {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// One staged request of a UD QP: a SEND (with or without immediate) to
/// the destination `ibv_wr_set_ud_addr` gave it (none: EINVAL).
fn post_ud(h: &mut nic::verbs::QueuePair, b: &WrBatch, w: &Staged) -> Result<(), i32> {
    let imm = match w.wr.op {
        SendOp::Send => None,
        SendOp::SendImm(i) => Some(i),
        _ => return Err(EINVAL),
    };
    let u = nic::verbs::UdWr {
        wr_id: w.wr.wr_id,
        sge: Sge::default(),
        imm,
        dest: w.ud.ok_or(EINVAL)?,
        signaled: w.wr.signaled,
        solicited: w.wr.solicited,
    };
    let r = match w.inline {
        Some((at, len)) => h.post_send_ud_inline(u, &b.inline[at as usize..(at + len) as usize]),
        None => {
            let first = w.first as usize;
            h.post_send_ud(u, &b.sges[first..first + w.n as usize])
        }
    };
    r.map_err(|e| errno_of(&e))
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`): the checks of
/// rxe's `check_qp_init_attr` (EOPNOTSUPP), the QP made by
/// `ibv_create_qp`'s path, then its `ibv_qp_ex`: `wr_start`,
/// `wr_complete`, `wr_abort` and the setters always, a builder only for
/// each operation in `send_ops_flags` (the others stay NULL, as rxe
/// leaves them).
pub(crate) extern "C" fn ctx_create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        if ctx(c).is_none() || attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL); `cap` is
        // written back, as ibv_create_qp_ex(3) says.
        let a = unsafe { &mut *attr };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return null_with(EOPNOTSUPP);
        }
        let ops = a.send_ops_flags;
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            match send_ops_of(a.qp_type) {
                Some(ok) if ops & !ok == 0 => {}
                _ => return null_with(EOPNOTSUPP),
            }
        }
        // A QP needs its PD (the kernel's create_qp: EINVAL without one).
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return null_with(EINVAL);
        }
        let Some(_pd_held) = hold(a.pd.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        // SAFETY: a live PD of ours, held.
        if unsafe { (*a.pd).context } != c {
            return null_with(EINVAL);
        }
        let mut plain = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let q = rsnic_ibv_create_qp(a.pd, &mut plain);
        if q.is_null() {
            return q;
        }
        a.cap = plain.cap;
        let x = q.cast::<ibv_qp_ex>();
        // SAFETY: a QP of ours just made, not yet shared: its ex tail is the
        // rest of this ibv_qp_ex (the layout checks in objects.rs).
        unsafe {
            let qp = &*q.cast::<Qp>();
            *qp.ex.batch.get() = Some(Box::new(WrBatch {
                guard: None,
                err: 0,
                sig_all: false,
                cap: plain.cap,
                qp_type: plain.qp_type,
                wrs: Vec::with_capacity((plain.cap.max_send_wr as usize).min(256)),
                sges: Vec::with_capacity(256),
                inline: Vec::with_capacity(plain.cap.max_inline_data as usize * 4),
            }));
            let has = |f: u32| ops & u64::from(f) != 0;
            (*x).comp_mask = 0;
            (*x).wr_id = 0;
            (*x).wr_flags = 0;
            if has(IBV_QP_EX_WITH_SEND) {
                (*x).wr_send = Some(wr_send);
            }
            if has(IBV_QP_EX_WITH_SEND_WITH_IMM) {
                (*x).wr_send_imm = Some(wr_send_imm);
            }
            if has(IBV_QP_EX_WITH_RDMA_WRITE) {
                (*x).wr_rdma_write = Some(wr_rdma_write);
            }
            if has(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
                (*x).wr_rdma_write_imm = Some(wr_rdma_write_imm);
            }
            if has(IBV_QP_EX_WITH_RDMA_READ) {
                (*x).wr_rdma_read = Some(wr_rdma_read);
            }
            if has(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
                (*x).wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
            }
            if has(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
                (*x).wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
            }
            if has(IBV_QP_EX_WITH_SEND_WITH_INV) {
                (*x).wr_send_inv = Some(wr_send_inv);
            }
            if has(IBV_QP_EX_WITH_LOCAL_INV) {
                (*x).wr_local_inv = Some(wr_local_inv);
            }
            if has(IBV_QP_EX_WITH_BIND_MW) {
                (*x).wr_bind_mw = Some(wr_bind_mw);
            }
            (*x).wr_set_sge = Some(wr_set_sge);
            (*x).wr_set_sge_list = Some(wr_set_sge_list);
            (*x).wr_set_inline_data = Some(wr_set_inline_data);
            (*x).wr_set_inline_data_list = Some(wr_set_inline_data_list);
            (*x).wr_set_ud_addr = Some(wr_set_ud_addr);
            (*x).wr_start = Some(wr_start);
            (*x).wr_complete = Some(wr_complete);
            (*x).wr_abort = Some(wr_abort);
        }
        q
    })
}

/// `ibv_qp_to_qp_ex` (libibverbs/verbs.c): the `ibv_qp_ex` of a QP created
/// with `ibv_create_qp_ex`, NULL for any other (errno untouched, as there).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_qp_to_qp_ex(q: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(null_mut(), || {
        let Some(_held) = hold(q.cast(), Kind::Qp) else {
            return null_mut();
        };
        // SAFETY: a live QP of ours, held; the batch is set once at creation.
        let ex = unsafe { (*(*q.cast::<Qp>()).ex.batch.get()).is_some() };
        if ex {
            q.cast()
        } else {
            null_mut()
        }
    })
}
