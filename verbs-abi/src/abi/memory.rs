//! Protection domains and memory regions (`ibv_alloc_pd`, `ibv_reg_mr*`, `ibv_dereg_mr`).

use super::*;
use libc::{EBUSY, EINVAL};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use nic::verbs::MemoryRegion;
use rdma::transport::Access;

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
        register(p.cast(), Kind::Pd, &[c.cast()]);
        p.cast()
    })
}

/// `ibv_dealloc_pd(3)`: 0 or the errno; EBUSY while regions or QPs of the
/// PD exist (the registry's count, then the engine's).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(p.cast(), Kind::Pd) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live PD of ours that nobody else holds or can take
        // (begin_destroy): this call is its only user.
        let pd = unsafe { &mut *p.cast::<Pd>() };
        // SAFETY: its context outlives it (it cannot close while the PD lives).
        let dev = &unsafe { Context::from_ibv(pd.ibv.context) }.backend.dev;
        let Some(h) = pd.pd.take() else { return EINVAL };
        if let Err(busy) = dev.dealloc_pd(h) {
            pd.pd = Some(busy.handle);
            return EBUSY;
        }
        dying.finish();
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
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
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
        let mr = match register_range(h, addr, len, acc) {
            Ok(m) => m,
            Err(e) => return null_with(e),
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
        register(m.cast(), Kind::Mr, &[p.cast()]);
        m.cast()
    })
}

/// Registers `len` bytes at `addr` in `pd` for `ibv_reg_mr` and
/// `ibv_rereg_mr`'s new translation (docs/verbs.md, "Registered memory"):
/// - every page must be mapped and readable, and writable when `acc` lets
///   the NIC write (local write, remote write, remote atomic): else EFAULT,
///   as the kernel's pinning (`ib_umem_get`) answers;
/// - the pages of private anonymous memory (malloc's, the heap, anonymous
///   mmaps) are moved onto a memfd the engine maps too (`nic::shmem`):
///   the program freeing or unmapping them costs it its view only, the
///   engine keeps its own until the region is deregistered;
/// - other mappings (file-backed, shared, hugetlb, the main thread's
///   stack) cannot be moved without the program noticing: the region uses
///   the program's pages directly, as before, and the program must keep
///   them mapped until `ibv_dereg_mr` (on a PCI port, whose NIC needs DMA
///   mappings of what it sends from, such a range is EINVAL).
pub(crate) fn register_range(
    pd: &nic::verbs::ProtectionDomain<'_>,
    addr: *mut c_void,
    len: usize,
    acc: Access,
) -> Result<MemoryRegion, c_int> {
    let write = acc.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
    match nic::shmem::share(addr as usize, len, write) {
        Ok(shared) => pd
            .reg_shared_mr(addr as u64, shared, acc)
            .map_err(|e| errno_of(&e)),
        Err(nic::shmem::ShareError::Unmovable) => {
            // SAFETY: ibv_reg_mr(3)'s contract: the buffer stays valid
            // until ibv_dereg_mr, which returns only once the engine let go
            // of it (checked mapped with the access it needs above).
            unsafe { pd.reg_user_mr(addr.cast(), len, acc) }.map_err(|e| errno_of(&e))
        }
        Err(e) => Err(e.errno()),
    }
}

/// `ibv_dereg_mr(3)`: 0 or the errno. The region is freed only once the
/// engine let go of it; on a failure it stays registered and usable.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(m.cast(), Kind::Mr) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live region of ours that nobody else holds or can take.
        let mr = unsafe { &mut *m.cast::<Mr>() };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(mr.ibv.context) }.backend.dev;
        match mr.mr.take().map(|h| dev.dereg_mr(h)) {
            // Memory windows are bound to it (IBA 10.6.7.2.6; rxe: EINVAL):
            // it stays registered and usable.
            Some(Err(nic::verbs::VerbsError::WindowsBound(h))) => {
                mr.mr = Some(h);
                return libc::EINVAL;
            }
            // The engine's handle is gone with the error (nic's dereg_mr
            // consumes it): the program's region stays a valid object
            // whose next dereg succeeds.
            Some(Err(e)) => return errno_of(&e),
            _ => {}
        }
        dying.finish();
        // SAFETY: allocated in reg_mr, now unregistered.
        drop(unsafe { Box::from_raw(m.cast::<Mr>()) });
        0
    })
}
