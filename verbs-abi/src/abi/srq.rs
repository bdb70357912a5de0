//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`,
//! `ibv_query_srq(3)`, `ibv_destroy_srq(3)`, and verbs.h's inline
//! `ibv_post_srq_recv` through `ops.post_srq_recv`) over
//! `nic::verbs::SharedReceiveQueue` (IBA 10.2.9).

use super::*;
use libc::EINVAL;
use nic::verbs::SrqAttr;
use rdma::transport::sgl::MAX_SGE;
use std::ffi::c_int;
use std::ptr::null_mut;

/// The deepest SRQ (`max_srq_wr`).
pub const MAX_SRQ_WR: u32 = MAX_WR;

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_srq(
    p: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(null_mut(), || {
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        if attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL); `attr` is
        // written back with what was granted, as ibv_create_srq(3) says.
        let a = unsafe { &mut *attr };
        let want = a.attr;
        if want.max_wr == 0
            || want.max_wr > MAX_SRQ_WR
            || want.max_sge == 0
            || want.max_sge > MAX_SGE as u32
        {
            return null_with(EINVAL);
        }
        // SAFETY: a live PD of ours (checked).
        let pd = unsafe { &*p.cast::<Pd>() };
        let Some(h) = pd.pd.as_ref() else {
            return null_with(EINVAL);
        };
        let srq = match h.create_srq(want.max_wr as u16, want.max_sge as u8) {
            Ok(s) => s,
            Err(e) => return null_with(errno_of(&e)),
        };
        a.attr = ibv_srq_attr {
            max_wr: want.max_wr,
            max_sge: want.max_sge,
            srq_limit: 0,
        };
        let id = srq.id();
        let b = Box::new(Srq {
            ibv: ibv_srq {
                context: pd.ibv.context,
                srq_context: a.srq_context,
                pd: p,
                handle: id,
                ..Default::default()
            },
            lock: Spin::default(),
            inner: std::cell::UnsafeCell::new(Some(srq)),
        });
        let s = Box::into_raw(b);
        register(s.cast(), Kind::Srq, &[p.cast()]);
        live()
            .get_or_insert_with(Default::default)
            .srqs
            .insert(id, s as usize);
        s.cast()
    })
}

/// Runs `f` on the engine's SRQ of `s` under its lock; EINVAL for a
/// pointer that is not a live SRQ of ours.
fn with_srq<T>(
    s: *mut ibv_srq,
    f: impl FnOnce(&mut nic::verbs::SharedReceiveQueue) -> Result<T, c_int>,
) -> Result<T, c_int> {
    let Some(_held) = hold(s.cast(), Kind::Srq) else {
        return Err(EINVAL);
    };
    // SAFETY: a live SRQ of ours, held.
    let srq = unsafe { &*s.cast::<Srq>() };
    let _g = srq.lock.lock();
    // SAFETY: under the SRQ's lock.
    let inner = unsafe { &mut *srq.inner.get() };
    f(inner.as_mut().ok_or(EINVAL)?)
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_modify_srq(
    s: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        if attr.is_null() {
            return EINVAL;
        }
        // SAFETY: the caller's attributes (checked non-NULL).
        let a = unsafe { *attr };
        let mask = mask as u32;
        // Resizing needs IBV_DEVICE_SRQ_RESIZE, which this device does not
        // report (ibv_modify_srq(3)); no other bit exists.
        if mask & IBV_SRQ_MAX_WR != 0 || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return EINVAL;
        }
        let r = with_srq(s, |q| {
            if mask & IBV_SRQ_LIMIT != 0 {
                q.arm(a.srq_limit).map_err(|e| errno_of(&e))?;
            }
            Ok(())
        });
        r.err().unwrap_or(0)
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_query_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        if attr.is_null() {
            return EINVAL;
        }
        match with_srq(s, |q| q.query().map_err(|e| errno_of(&e))) {
            Ok(SrqAttr {
                max_wr,
                max_sge,
                limit,
            }) => {
                // SAFETY: the caller's struct to fill.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: max_wr.into(),
                        max_sge: max_sge.into(),
                        srq_limit: limit,
                    })
                };
                0
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_destroy_srq(s: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // QPs on it count as its children: EBUSY while any lives.
        let dying = match begin_destroy(s.cast(), Kind::Srq) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live SRQ of ours that no other call holds or can take.
        let srq = unsafe { &*s.cast::<Srq>() };
        {
            let _g = srq.lock.lock();
            // SAFETY: under the SRQ's lock.
            let inner = unsafe { &mut *srq.inner.get() };
            if let Some(h) = inner.take() {
                if let Err(busy) = h.destroy() {
                    // The engine refused: the SRQ stays a valid object.
                    let e = errno_of(&busy.error);
                    *inner = Some(busy.handle);
                    return e;
                }
            }
        }
        dying.finish();
        // SAFETY: allocated by create_srq with Box, unregistered above with
        // nobody holding it.
        drop(unsafe { Box::from_raw(s.cast::<Srq>()) });
        0
    })
}

/// `ibv_post_srq_recv` (through `ops.post_srq_recv`): each receive WR of
/// the chain (up to the SRQ's `max_sge` SGEs) to the SRQ's doorbell ring;
/// on the first failure `*bad` names it and its errno is returned, those
/// before it posted. No allocation, no system call.
pub(crate) extern "C" fn op_post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let fail = |at: *mut ibv_recv_wr, e: i32| {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = at };
            }
            e
        };
        // SAFETY: `ops.post_srq_recv` is only reached through an SRQ of ours.
        let srq = unsafe { &*s.cast::<Srq>() };
        let _g = srq.lock.lock();
        // SAFETY: under the SRQ's lock.
        let Some(h) = (unsafe { &mut *srq.inner.get() }).as_mut() else {
            return fail(wr, EINVAL);
        };
        let mut list = None;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a work request of the caller's chain.
            let w = unsafe { &*cur };
            let r = recv_wr_of(w, MAX_SGE, &mut list)
                .and_then(|(rwr, sgl)| h.post_recv(rwr, sgl).map_err(|e| errno_of(&e)));
            if let Err(e) = r {
                return fail(cur, e);
            }
            cur = w.next;
        }
        0
    })
}

/// The engine's SRQ id of `s` for a QP created on it (the caller holds
/// it): EINVAL for a pointer that is not a live SRQ of ours or one of
/// another PD.
pub(crate) fn srq_for_qp(s: *mut ibv_srq, pd: *mut ibv_pd) -> Result<u32, c_int> {
    let Some(_held) = hold(s.cast(), Kind::Srq) else {
        return Err(EINVAL);
    };
    // SAFETY: a live SRQ of ours, held.
    let srq = unsafe { &*s.cast::<Srq>() };
    if srq.ibv.pd != pd {
        return Err(EINVAL);
    }
    Ok(srq.ibv.handle)
}
