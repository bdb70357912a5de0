//! The exported libibverbs functions (`rsnic_<name>`, given their public
//! name and rdma-core's symbol version by build.rs) and the `ibv_context_ops`
//! that verbs.h's inline `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` call. Return conventions and errno values are those
//! of the man pages (`ibv_open_device(3)`, `ibv_modify_qp(3)`, ...): a
//! pointer or NULL with errno; 0 or an errno value; 0 or -1 with errno
//! where the page says so. Every function runs inside [`guard`], which
//! catches a panic and fails the call instead of unwinding into C.
//!
//! Files: `device` (the device list, contexts, queries), `memory` (PDs,
//! regions, `ibv_rereg_mr`), `cq` (channels, CQs, polling,
//! `ibv_resize_cq`), `qp` (QPs, posting), `srq` (shared receive queues),
//! `ah` (address handles), `mw` (memory windows), `rest` (async events,
//! unimplemented calls, helpers), `qp_ex` (the extended QP: `ibv_wr_*`,
//! `ibv_qp_to_qp_ex`), `cq_ex` (the extended CQ: `ibv_start_poll`,
//! `ibv_wc_read_*`).

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use crate::ffi::*;
use crate::objects::*;
use crate::translate::*;

/// The largest inline payload a QP may ask for (`max_inline_data`).
pub const MAX_INLINE: u32 = 256;
/// The deepest send or receive queue (`max_qp_wr`).
pub const MAX_WR: u32 = 16384;
/// The deepest CQ (`max_cqe`).
pub const MAX_CQE: i32 = 1 << 20;
/// Empty `ibv_poll_cq` calls in a row between two looks at the clock
/// (whether the run of empty polls has lasted `nic::verbs::SPIN_BEFORE_PARK`).
pub const IDLE_POLLS_BEFORE_YIELD: u32 = 64;
/// The longest park of one empty `ibv_poll_cq` once a run of empty polls
/// lasted `nic::verbs::SPIN_BEFORE_PARK` (unless `RSNIC_BUSY_POLL=1`): the
/// engine's next completion ends it at once; the bound keeps a program
/// that also watches memory (perftest's `write_lat`) polling that.
pub const IDLE_POLL_PARK: std::time::Duration = std::time::Duration::from_micros(50);
/// Outstanding READ/ATOMIC requests a QP issues and takes.
pub const MAX_RD_ATOMIC: u8 = 16;

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// Runs `f`; a panic is reported on stderr and turned into `fail` (a
/// failed call), never an unwind into the C caller. In a forked child
/// ([`crate::backend::FORKED`]) the call fails the same way, with EIO,
/// without running `f`.
#[inline]
pub fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    if crate::backend::FORKED.load(std::sync::atomic::Ordering::Relaxed) {
        set_errno(libc::EIO);
        return fail;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("rsnic: internal error (a panic) in a verbs call; the call fails with EIO");
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Runs `f`, a helper that needs no device (strings, rates, fork and
/// sysfs answers), turning a panic into `fail` as [`guard`] does, in a
/// forked child too.
#[inline]
pub fn pure<T>(fail: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fail)
}

/// NULL with errno `e`.
pub(crate) fn null_with<T>(e: i32) -> *mut T {
    set_errno(e);
    null_mut()
}

/// -1 with errno `e`.
pub(crate) fn minus_one(e: i32) -> c_int {
    set_errno(e);
    -1
}

/// The errno the last failed system call (or libc call) left, or `fallback`
/// when it left none.
pub(crate) fn last_errno(fallback: i32) -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(fallback)
}

mod ah;
mod cq;
mod cq_ex;
mod device;
mod memory;
mod mw;
mod post;
mod qp;
mod qp_ex;
mod rest;
mod srq;

pub(crate) use ah::ah_id;
pub(crate) use cq::*;
pub(crate) use cq_ex::ctx_create_cq_ex;
pub(crate) use device::*;
pub(crate) use memory::rsnic_ibv_alloc_pd;
pub(crate) use mw::{ctx_alloc_mw, ctx_bind_mw, ctx_dealloc_mw};
pub(crate) use post::*;
pub(crate) use qp::*;
pub(crate) use qp_ex::ctx_create_qp_ex;
pub(crate) use srq::{op_post_srq_recv, srq_for_qp};
