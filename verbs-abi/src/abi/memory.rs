//! Protection domains and memory regions (`ibv_alloc_pd`, `ibv_reg_mr*`, `ibv_dereg_mr`).

use super::*;
use libc::{EBUSY, EINVAL};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        let Some(ctx) = ctx(c) else {
            return null_with(EINVAL);
        };
        let pd = ctx.backend.dev.alloc_pd();
        let b = Box::new(Pd {
            ibv: ibv_pd {
                context: c,
                handle: pd.id(),
            },
            pd: Some(pd),
        });
        let p = Box::into_raw(b);
        register(p.cast(), Kind::Pd);
        p.cast()
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        if !is_live(p.cast(), Kind::Pd) {
            return EINVAL;
        }
        // SAFETY: a live PD of ours (checked).
        let pd = unsafe { &mut *p.cast::<Pd>() };
        // SAFETY: its context outlives it (the program closes it last).
        let dev = &unsafe { Context::from_ibv(pd.ibv.context) }.backend.dev;
        let Some(h) = pd.pd.take() else { return EINVAL };
        if let Err(busy) = dev.dealloc_pd(h) {
            pd.pd = Some(busy.handle);
            return EBUSY;
        }
        unregister(p.cast(), Kind::Pd);
        // SAFETY: allocated in alloc_pd, now unregistered.
        drop(unsafe { Box::from_raw(p.cast::<Pd>()) });
        0
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    rsnic_ibv_reg_mr_iova2(p, addr, len, addr as u64, access as c_uint)
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    rsnic_ibv_reg_mr_iova2(p, addr, len, iova, access as c_uint)
}

/// `ibv_reg_mr_iova2(3)`. The engine's virtual address of a region is its
/// pointer (docs/design.md §5.4), so an `iova` other than `addr` is refused with
/// EINVAL (perftest and ibv_rc_pingpong pass iova == addr).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        if !is_live(p.cast(), Kind::Pd) {
            return null_with(EINVAL);
        }
        if addr.is_null() || len == 0 || iova != addr as u64 {
            return null_with(EINVAL);
        }
        let acc = match access_of(access) {
            Ok(a) => a,
            Err(e) => return null_with(e),
        };
        // SAFETY: a live PD of ours (checked).
        let pd = unsafe { &*p.cast::<Pd>() };
        let Some(h) = pd.pd.as_ref() else {
            return null_with(EINVAL);
        };
        // SAFETY: ibv_reg_mr(3)'s contract: the buffer stays valid until
        // ibv_dereg_mr, which returns only once the engine let go of it.
        let mr = match unsafe { h.reg_user_mr(addr.cast(), len, acc) } {
            Ok(m) => m,
            Err(e) => return null_with(errno_of(&e)),
        };
        let b = Box::new(Mr {
            ibv: ibv_mr {
                context: pd.ibv.context,
                pd: p,
                addr,
                length: len,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            },
            mr: Some(mr),
        });
        let m = Box::into_raw(b);
        register(m.cast(), Kind::Mr);
        m.cast()
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if !unregister(m.cast(), Kind::Mr) {
            return EINVAL;
        }
        // SAFETY: allocated in reg_mr, now unregistered.
        let mut mr = unsafe { Box::from_raw(m.cast::<Mr>()) };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(mr.ibv.context) }.backend.dev;
        match mr.mr.take().map(|h| dev.dereg_mr(h)) {
            Some(Err(e)) => errno_of(&e),
            _ => 0,
        }
    })
}
