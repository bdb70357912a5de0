//! Memory windows (issue 40 item 6; IBA 10.6.7, Linux rxe's provider and
//! `rxe_mw.c` as the reference): `ibv_alloc_mw`, `ibv_dealloc_mw` and
//! `ibv_bind_mw`, which verbs.h's inline functions reach through
//! `ibv_context.ops` (`alloc_mw`, `dealloc_mw`, `bind_mw`). The bind work
//! request's translation for `ibv_post_send` (`IBV_WR_BIND_MW`) and
//! `ibv_wr_bind_mw` is [`bind_op`] (in `translate`).

use super::*;
use libc::EINVAL;
use nic::verbs::inc_rkey;
use rdma::transport::MwType;
use std::ffi::c_int;
use std::ptr::null_mut;

/// `ops.alloc_mw` (`ibv_alloc_mw(3)`): a window of `type_` (1 or 2, as rxe:
/// type 2B) in PD `p`, unbound, with its first R_Key; NULL with errno EINVAL
/// for another type or a PD not ours, ENOMEM when the key table is full.
pub(crate) extern "C" fn ctx_alloc_mw(p: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    guard(null_mut(), || {
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        let kind = match type_ {
            IBV_MW_TYPE_1 => MwType::One,
            IBV_MW_TYPE_2 => MwType::Two,
            _ => return null_with(EINVAL),
        };
        // SAFETY: a live PD of ours (held).
        let pd = unsafe { &*p.cast::<Pd>() };
        let Some(h) = pd.pd.as_ref() else {
            return null_with(EINVAL);
        };
        let mw = match h.alloc_mw(kind) {
            Ok(w) => w,
            Err(e) => return null_with(errno_of(&e)),
        };
        let b = Box::new(Mw {
            ibv: ibv_mw {
                context: pd.ibv.context,
                pd: p,
                rkey: mw.rkey(),
                handle: mw.rkey() >> 8,
                type_,
            },
            mw: Some(mw),
        });
        let m = Box::into_raw(b);
        register(m.cast(), Kind::Mw, &[p.cast()]);
        m.cast()
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw(3)`): frees the window, bound or not; 0
/// or the errno (EINVAL: not a live window of ours).
pub(crate) extern "C" fn ctx_dealloc_mw(m: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(m.cast(), Kind::Mw) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live window of ours that nobody else holds or can take.
        let mw = unsafe { &mut *m.cast::<Mw>() };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(mw.ibv.context) }.backend.dev;
        if let Some(h) = mw.mw.take() {
            if let Err(e) = dev.dealloc_mw(h) {
                return errno_of(&e);
            }
        }
        dying.finish();
        // SAFETY: allocated in alloc_mw, now unregistered.
        drop(unsafe { Box::from_raw(m.cast::<Mw>()) });
        0
    })
}

/// `ops.bind_mw` (what verbs.h's `ibv_bind_mw(3)` calls after its own checks:
/// a type 1 window, a region of the window's PD): posts an `IBV_WR_BIND_MW`
/// work request with the window's next R_Key (`ibv_inc_rkey`) on `q`, as rxe's
/// provider does, and gives the window that key; 0 or the errno. A zero-based
/// window is EINVAL (IBA o10-36.2.2). If the bind then fails, its completion
/// says `IBV_WC_MW_BIND_ERR` and the program restores the key (rdma-core's
/// rule).
pub(crate) extern "C" fn ctx_bind_mw(q: *mut ibv_qp, m: *mut ibv_mw, b: *mut ibv_mw_bind) -> c_int {
    guard(libc::EIO, || {
        if m.is_null() || b.is_null() {
            return EINVAL;
        }
        let Some(_held) = hold(m.cast(), Kind::Mw) else {
            return EINVAL;
        };
        // SAFETY: the caller's bind (checked non-NULL), read only; a live
        // window of ours (held).
        let (bind, mw) = unsafe { (&*b, &mut *m.cast::<Mw>()) };
        if bind.bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
            return EINVAL;
        }
        let new_rkey = inc_rkey(mw.ibv.rkey);
        let mut wr = ibv_send_wr {
            wr_id: bind.wr_id,
            opcode: IBV_WR_BIND_MW,
            send_flags: bind.send_flags,
            ..Default::default()
        };
        wr.__bindgen_anon_2.bind_mw = ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: m,
            rkey: new_rkey,
            bind_info: bind.bind_info,
        };
        let mut bad = null_mut();
        let r = op_post_send(q, &mut wr, &mut bad);
        if r == 0 {
            mw.ibv.rkey = new_rkey;
        }
        r
    })
}
