//! The extended CQ (issue 40, item 5): `verbs_context.create_cq_ex`
//! (`ibv_create_cq_ex(3)`) and the `ibv_cq_ex` iterator (`ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`).
//!
//! An `ibv_cq_ex` begins with the fields of an `ibv_cq` (`ibv_cq_ex_to_cq`
//! is a cast), so the extended CQ is the same address as the plain one:
//! [`Cq`] carries the rest of the extended struct ([`CqExTail`]) right after
//! its `ibv_cq`, zero (no function pointers) for a CQ of `ibv_create_cq`.
//! The compile-time checks next to that type (`objects`) hold the layout
//! to verbs.h's.
//!
//! Which `wc_flags` are accepted follows Linux rxe's provider (rdma-core
//! providers/rxe/rxe.c): a bit beyond BYTE_LEN, IMM, QP_NUM, SRC_QP, SLID,
//! SL, DLID_PATH_BITS (completion timestamps) is EOPNOTSUPP
//! (`rxe_create_cq_ex`).

use super::*;
use libc::{EINVAL, ENOENT, EOPNOTSUPP};
use rdma::transport::WorkCompletion;
use std::ffi::{c_int, c_uint};
use std::ptr::null_mut;

/// `wc_flags` an extended CQ takes (rxe's RXE_SUP_WC_EX_FLAGS): SRC_QP,
/// SLID, SL and DLID_PATH_BITS read 0 on RoCE RC; no timestamps.
pub const SUPPORTED_WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// The [`Cq`] of an `ibv_cq_ex` of ours.
///
/// # Safety
/// `c` must be the `ibv_cq_ex` of a live CQ created by `create_cq_ex`.
unsafe fn cq_of<'a>(c: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: the caller's contract; the ibv_cq is the Cq's first field.
    unsafe { &*c.cast::<Cq>() }
}

/// Makes `wc` the current completion: `status` and `wr_id` are read from
/// the `ibv_cq_ex` itself (ibv_create_cq_ex(3)).
///
/// # Safety
/// As [`cq_of`], under the CQ's lock.
unsafe fn set_current(c: *mut ibv_cq_ex, wc: WorkCompletion) {
    // SAFETY: the caller's contract.
    unsafe {
        *cq_of(c).ex.cur.get() = wc;
        (*c).status = wc.status as u32;
        (*c).wr_id = wc.wr_id;
    }
}

/// `ibv_start_poll`: takes the CQ's lock and its first completion (0), or
/// ENOENT with the lock released when there is none; `attr.comp_mask`
/// must be 0 (EINVAL, as mlx5). An empty CQ is polled as `ibv_poll_cq`
/// polls it: after a run of empty polls it parks until the engine's next
/// completion or `IDLE_POLL_PARK`.
extern "C" fn cq_start_poll(c: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's attributes, read if given.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return EINVAL;
        }
        // SAFETY: reached only through the ops of a CQ of ours.
        let cq: &'static Cq = unsafe { cq_of(c) };
        let g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        let Some(h) = (unsafe { &mut *cq.cq.get() }).as_mut() else {
            return EINVAL;
        };
        let got = match h.poll_one() {
            Some(wc) => Some(wc),
            None if cq.yield_when_idle => {
                let idle = cq.idle_polls.get() + 1;
                if idle >= IDLE_POLLS_BEFORE_YIELD {
                    cq.idle_polls.set(0);
                    let now = std::time::Instant::now();
                    let since = cq.idle_since.get().unwrap_or(now);
                    cq.idle_since.set(Some(since));
                    if now.duration_since(since) >= nic::verbs::SPIN_BEFORE_PARK
                        || h.on_engine_cpu()
                    {
                        h.park_for(IDLE_POLL_PARK)
                    } else {
                        None
                    }
                } else {
                    cq.idle_polls.set(idle);
                    None
                }
            }
            None => None,
        };
        let Some(wc) = got else {
            return ENOENT;
        };
        cq.idle_polls.set(0);
        cq.idle_since.set(None);
        // SAFETY: under the CQ's lock, which the iterator keeps until
        // end_poll.
        unsafe {
            set_current(c, wc);
            *cq.ex.guard.get() = Some(g);
        }
        0
    })
}

/// `ibv_next_poll`: the next completion (0) or ENOENT; the lock is kept
/// until `ibv_end_poll` either way.
extern "C" fn cq_next_poll(c: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: reached only through the ops of a CQ of ours.
        let cq = unsafe { cq_of(c) };
        // SAFETY: the iterator's lock is held by this thread (start_poll).
        if unsafe { (*cq.ex.guard.get()).is_none() } {
            return EINVAL;
        }
        // SAFETY: under the CQ's lock.
        let Some(h) = (unsafe { &mut *cq.cq.get() }).as_mut() else {
            return EINVAL;
        };
        match h.poll_one() {
            Some(wc) => {
                // SAFETY: under the CQ's lock.
                unsafe { set_current(c, wc) };
                0
            }
            None => ENOENT,
        }
    })
}

/// `ibv_end_poll`: releases the CQ's lock.
extern "C" fn cq_end_poll(c: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: reached only through the ops of a CQ of ours; the lock
        // is held by this thread since start_poll.
        unsafe { *cq_of(c).ex.guard.get() = None };
    })
}

/// The current completion of `c`.
fn cur(c: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: reached only through the ops of a CQ of ours, between
    // start_poll and end_poll.
    unsafe { *cq_of(c).ex.cur.get() }
}

extern "C" fn cq_read_opcode(c: *mut ibv_cq_ex) -> c_uint {
    match cur(c).opcode {
        rdma::transport::WcOpcode::RecvInv => IBV_WC_RECV,
        o => o as c_uint,
    }
}
extern "C" fn cq_read_vendor_err(_c: *mut ibv_cq_ex) -> u32 {
    0
}
extern "C" fn cq_read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    cur(c).byte_len
}
/// The immediate in network order; for a SEND with Invalidate the R_Key it
/// invalidated, in host order (`ibv_wc_read_invalidated_rkey` is this call,
/// as mlx5's answers it).
extern "C" fn cq_read_imm_data(c: *mut ibv_cq_ex) -> u32 {
    let w = cur(c);
    match w.opcode {
        rdma::transport::WcOpcode::RecvInv => w.imm.unwrap_or(0),
        _ => w.imm.unwrap_or(0).to_be(),
    }
}
extern "C" fn cq_read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    cur(c).qp_num
}
/// A UD receive's sender (0 on other services, as `ibv_wc.src_qp`).
extern "C" fn cq_read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    cur(c).src_qp
}
extern "C" fn cq_read_zero32(_c: *mut ibv_cq_ex) -> u32 {
    0
}
extern "C" fn cq_read_zero8(_c: *mut ibv_cq_ex) -> u8 {
    0
}
/// IBV_WC_WITH_IMM and, for a UD receive, IBV_WC_GRH (as `fill_wc`).
extern "C" fn cq_read_wc_flags(c: *mut ibv_cq_ex) -> c_uint {
    let w = cur(c);
    let imm = match w.imm {
        Some(_) if w.opcode == rdma::transport::WcOpcode::RecvInv => IBV_WC_WITH_INV,
        Some(_) => IBV_WC_WITH_IMM,
        None => 0,
    };
    let grh = if w.grh || crate::translate::received_roce(&w) {
        IBV_WC_GRH
    } else {
        0
    };
    imm | grh
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`): `comp_mask`
/// beyond FLAGS and PD is EOPNOTSUPP (libibverbs' ibv_cmd_create_cq_ex),
/// a `wc_flags` bit beyond [`SUPPORTED_WC_FLAGS`] EOPNOTSUPP (rxe), flags
/// beyond SINGLE_THREADED (IGNORE_OVERRUN: rxe's kernel driver refuses
/// CQ flags) EOPNOTSUPP, a parent domain EOPNOTSUPP (none exist here);
/// `cqe`, the vector and the channel as `ibv_create_cq`. The iterator's
/// functions and `read_opcode`, `read_vendor_err`, `read_wc_flags` are
/// always set, the other readers for the `wc_flags` asked for (NULL
/// otherwise, as rxe leaves them).
pub(crate) extern "C" fn ctx_create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(null_mut(), || {
        if ctx(c).is_none() || attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL).
        let a = unsafe { &mut *attr };
        if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0
            || a.wc_flags & !SUPPORTED_WC_FLAGS != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0)
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null())
        {
            return null_with(EOPNOTSUPP);
        }
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return null_with(EINVAL);
        };
        let q = rsnic_ibv_create_cq(c, cqe, a.cq_context, a.channel, vector);
        if q.is_null() {
            return null_mut();
        }
        let x = q.cast::<ibv_cq_ex>();
        let want = |f: u32| a.wc_flags & u64::from(f) != 0;
        // SAFETY: a CQ of ours just made, not yet shared: its ex tail is
        // the rest of this ibv_cq_ex (the layout checks in objects.rs).
        unsafe {
            (*x).comp_mask = 0;
            (*x).start_poll = Some(cq_start_poll);
            (*x).next_poll = Some(cq_next_poll);
            (*x).end_poll = Some(cq_end_poll);
            (*x).read_opcode = Some(cq_read_opcode);
            (*x).read_vendor_err = Some(cq_read_vendor_err);
            (*x).read_wc_flags = Some(cq_read_wc_flags);
            if want(IBV_WC_EX_WITH_BYTE_LEN) {
                (*x).read_byte_len = Some(cq_read_byte_len);
            }
            if want(IBV_WC_EX_WITH_IMM) {
                (*x).read_imm_data = Some(cq_read_imm_data);
            }
            if want(IBV_WC_EX_WITH_QP_NUM) {
                (*x).read_qp_num = Some(cq_read_qp_num);
            }
            if want(IBV_WC_EX_WITH_SRC_QP) {
                (*x).read_src_qp = Some(cq_read_src_qp);
            }
            if want(IBV_WC_EX_WITH_SLID) {
                (*x).read_slid = Some(cq_read_zero32);
            }
            if want(IBV_WC_EX_WITH_SL) {
                (*x).read_sl = Some(cq_read_zero8);
            }
            if want(IBV_WC_EX_WITH_DLID_PATH_BITS) {
                (*x).read_dlid_path_bits = Some(cq_read_zero8);
            }
        }
        x
    })
}
