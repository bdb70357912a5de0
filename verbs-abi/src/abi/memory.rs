//! Protection domains and memory regions (`ibv_alloc_pd`, `ibv_reg_mr*`, `ibv_dereg_mr`, `ibv_rereg_mr`).

use super::*;
use libc::{EBUSY, EINVAL};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use nic::verbs::{DeregError, MemoryRegion};
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
            Some(Err(DeregError::WindowsBound(h))) => {
                mr.mr = Some(h);
                return libc::EINVAL;
            }
            // The engine's handle is gone with the error (nic's dereg_mr
            // consumes it): the program's region stays a valid object
            // whose next dereg succeeds.
            Some(Err(DeregError::Failed(e))) => return errno_of(&e),
            _ => {}
        }
        dying.finish();
        // SAFETY: allocated in reg_mr, now unregistered.
        drop(unsafe { Box::from_raw(m.cast::<Mr>()) });
        0
    })
}

/// `ibv_rereg_mr(3)`: 0, or a negative `enum ibv_rereg_mr_err_code` with
/// errno. libibverbs' own checks first (verbs.c): a foreign region, a flag
/// beyond IBV_REREG_MR_FLAGS_SUPPORTED, CHANGE_TRANSLATION without an
/// address or a length, access flags without CHANGE_ACCESS:
/// IBV_REREG_MR_ERR_INPUT with EINVAL, the region unchanged. Then the
/// device's part, which fails with IBV_REREG_MR_ERR_CMD and the kernel's
/// errno: no flag at all, a PD that is not live or of another context,
/// access flags `ibv_reg_mr` refuses (EINVAL, or EOPNOTSUPP for flags this
/// NIC lacks).
///
/// The three changes are done as the man page describes rereg ("performs
/// the functions deregister memory region followed by register memory
/// region"): the region is registered again with its new PD, access and
/// translation (`addr`, `length`; the iova is `addr`, as
/// `ibv_cmd_rereg_mr` passes it), under new keys written to `lkey` and
/// `rkey` (as the kernel's rereg returns them); the old keys stop working.
/// The new registration is made before the old one is dropped, so a
/// refusal leaves the region as it was. (Linux rxe's kernel driver takes
/// CHANGE_PD and CHANGE_ACCESS only, and rdma-core's rxe provider has no
/// rereg at all: EOPNOTSUPP through libibverbs' dummy op.)
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_rereg_mr(
    m: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(IBV_REREG_MR_ERR_CMD, || {
        let input = || {
            set_errno(EINVAL);
            IBV_REREG_MR_ERR_INPUT
        };
        let cmd = |e: i32| {
            set_errno(e);
            IBV_REREG_MR_ERR_CMD
        };
        let Some(_held) = hold(m.cast(), Kind::Mr) else {
            return input();
        };
        let flags = flags as u32;
        if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0
            || (flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()))
            || (access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0)
        {
            return input();
        }
        // The kernel: a rereg that changes nothing is EINVAL.
        if flags == 0 {
            return cmd(EINVAL);
        }
        // SAFETY: a live region of ours (checked).
        let mr = unsafe { &mut *m.cast::<Mr>() };
        // The new PD is held until the region counts in it.
        let mut _pd_held = None;
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            let Some(pd_held) = hold(pd.cast(), Kind::Pd) else {
                return cmd(EINVAL);
            };
            // SAFETY: a live PD of ours, held.
            if unsafe { (*pd).context } != mr.ibv.context {
                return cmd(EINVAL);
            }
            _pd_held = Some(pd_held);
            pd
        } else {
            mr.ibv.pd
        };
        let (new_addr, new_len) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (addr, length)
        } else {
            (mr.ibv.addr, mr.ibv.length)
        };
        let Some(old) = mr.mr.as_ref() else {
            return cmd(EINVAL);
        };
        let acc = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            match access_of(access as u32) {
                Ok(a) => a,
                Err(e) => return cmd(e),
            }
        } else {
            old.access()
        };
        // SAFETY: a live PD of ours (checked, or the region's own).
        let p = unsafe { &*new_pd.cast::<Pd>() };
        let Some(h) = p.pd.as_ref() else {
            return cmd(EINVAL);
        };
        // The new range is set up as ibv_reg_mr's (moved onto shared
        // memory where it can be, checked mapped and writable as the
        // access needs).
        let fresh = match register_range(h, new_addr, new_len, acc) {
            Ok(r) => r,
            Err(e) => return cmd(e),
        };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(mr.ibv.context) }.backend.dev;
        let (lkey, rkey) = (fresh.lkey(), fresh.rkey());
        if let Some(stale) = mr.mr.replace(fresh) {
            match dev.dereg_mr(stale) {
                // Windows are bound to it: the region stays as it was.
                Err(DeregError::WindowsBound(h)) => {
                    mr.mr = Some(h);
                    return cmd(EINVAL);
                }
                Err(DeregError::Failed(e)) => return cmd(errno_of(&e)),
                Ok(()) => {}
            }
        }
        if new_pd != mr.ibv.pd {
            reparent(m.cast(), mr.ibv.pd.cast(), new_pd.cast());
        }
        mr.ibv.pd = new_pd;
        mr.ibv.addr = new_addr;
        mr.ibv.length = new_len;
        mr.ibv.lkey = lkey;
        mr.ibv.rkey = rkey;
        mr.ibv.handle = lkey;
        0
    })
}
