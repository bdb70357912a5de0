//! The C objects this library hands out: each is a libibverbs struct
//! (`ibv_context` inside a `verbs_context`, `ibv_pd`, `ibv_mr`, `ibv_cq`,
//! `ibv_qp`, `ibv_comp_channel`) as the **first** field of a `repr(C)`
//! struct of ours, so the program's pointer is ours too; the rest holds the
//! engine's handle. Every live object's address is in [`LIVE`] with its
//! kind: the slow-path calls check a pointer there before they follow it,
//! so a foreign, freed or NULL pointer fails with EINVAL instead of being
//! dereferenced (rdma-core would crash on most of them). The hot path
//! (`post_send`, `post_recv`, `poll_cq`, `req_notify_cq`) is reached only
//! through the `ops` of a context we built, with objects of ours, and
//! skips the check.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use nic::verbs::{CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, SharedReceiveQueue};

use crate::backend::Backend;
use crate::ffi::*;

/// What a registered address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A [`Context`] (keyed by its `ibv_context` address).
    Context,
    /// A [`Pd`].
    Pd,
    /// An [`Mr`].
    Mr,
    /// A [`Cq`].
    Cq,
    /// A [`Qp`].
    Qp,
    /// A [`Channel`].
    Channel,
    /// An [`Srq`].
    Srq,
}

/// Live objects: address -> kind; and QPN / CQ id -> object, for async
/// events.
#[derive(Default)]
pub struct Live {
    /// Address of the ibverbs struct -> its kind.
    pub objects: HashMap<usize, Kind>,
    /// QPN -> its [`Qp`].
    pub qps: HashMap<u32, usize>,
    /// CQ id -> its [`Cq`].
    pub cqs: HashMap<u32, usize>,
    /// SRQ id -> its [`Srq`].
    pub srqs: HashMap<u32, usize>,
}

/// Every object this library handed out and has not freed.
pub static LIVE: Mutex<Option<Live>> = Mutex::new(None);

/// The registry, locked (a panic elsewhere does not poison it for good).
pub fn live() -> MutexGuard<'static, Option<Live>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `p` is a live object of kind `k`.
pub fn is_live(p: *const std::ffi::c_void, k: Kind) -> bool {
    !p.is_null()
        && live()
            .as_ref()
            .is_some_and(|l| l.objects.get(&(p as usize)) == Some(&k))
}

/// Records a new object.
pub fn register(p: *const std::ffi::c_void, k: Kind) {
    live()
        .get_or_insert_with(Live::default)
        .objects
        .insert(p as usize, k);
}

/// Forgets an object; whether it was live with kind `k` (so a double
/// destroy finds it gone).
pub fn unregister(p: *const std::ffi::c_void, k: Kind) -> bool {
    let mut g = live();
    let Some(l) = g.as_mut() else { return false };
    if l.objects.get(&(p as usize)) != Some(&k) {
        return false;
    }
    l.objects.remove(&(p as usize));
    true
}

/// A lock for the hot path: one atomic swap when nobody else holds it
/// (libibverbs objects may be used from several threads; providers lock a
/// QP's send queue and a CQ the same way).
#[derive(Default)]
pub struct Spin(AtomicBool);

/// Holds a [`Spin`] until dropped.
pub struct SpinGuard<'a>(&'a AtomicBool);

impl Spin {
    /// Takes the lock, spinning while another thread holds it.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_> {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        SpinGuard(&self.0)
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// An open device context (`ibv_open_device`).
#[repr(C)]
pub struct Context {
    /// The extended context; its last field is the `ibv_context` the
    /// program holds (verbs.h: "Must be last field in the struct").
    pub vctx: verbs_context,
    /// The running device.
    pub backend: &'static Backend,
    /// `ibv_context.async_fd`: an epoll descriptor over the device's async
    /// event descriptors, readable while an event is queued.
    pub async_fd: OwnedFd,
}

impl Context {
    /// Our context of the program's `ibv_context` pointer.
    ///
    /// # Safety
    /// `p` must point at the `ibv_context` of a live [`Context`].
    pub unsafe fn from_ibv<'a>(p: *mut ibv_context) -> &'a Context {
        let off = std::mem::offset_of!(Context, vctx.context);
        // SAFETY: the caller's contract: `p` is `vctx.context` of a Context.
        unsafe { &*(p.cast::<u8>().sub(off).cast::<Context>()) }
    }
}

/// A protection domain.
#[repr(C)]
pub struct Pd {
    /// What the program sees.
    pub ibv: ibv_pd,
    /// The engine's PD (None once deallocated).
    pub pd: Option<ProtectionDomain<'static>>,
}

/// A memory region over the program's buffer.
#[repr(C)]
pub struct Mr {
    /// What the program sees (addr, length, lkey, rkey).
    pub ibv: ibv_mr,
    /// The registration (None once deregistered).
    pub mr: Option<MemoryRegion>,
}

/// A completion channel: `ibv.fd` is an epoll descriptor watching the
/// eventfd of each CQ created on the channel, so the program can `poll`
/// it and `ibv_get_cq_event` learns which CQ fired.
#[repr(C)]
pub struct Channel {
    /// What the program sees.
    pub ibv: ibv_comp_channel,
    /// The epoll descriptor (`ibv.fd`).
    pub epoll: OwnedFd,
    /// CQs on the channel (it cannot be destroyed while one exists: EBUSY).
    pub cqs: AtomicU32,
}

/// A completion queue.
#[repr(C)]
pub struct Cq {
    /// What the program sees.
    pub ibv: ibv_cq,
    /// The rest of an `ibv_cq_ex` after its `ibv_cq` part, and the
    /// iterator's state (`ibv_create_cq_ex(3)`; crate::abi::ex).
    pub ex: crate::abi::CqExTail,
    /// Serialises pollers.
    pub lock: Spin,
    /// The engine's CQ (None once destroyed).
    pub cq: UnsafeCell<Option<CompletionQueue>>,
    /// Its channel, if any.
    pub channel: *mut Channel,
    /// The engine's CQ id.
    pub id: u32,
    /// Empty polls in a row (under `lock`).
    pub idle_polls: std::cell::Cell<u32>,
    /// When the current run of empty polls began (under `lock`).
    pub idle_since: std::cell::Cell<Option<std::time::Instant>>,
    /// Yield the core after a run of empty polls (not `RSNIC_BUSY_POLL`).
    pub yield_when_idle: bool,
}

/// The QP state that the program moved the QP to, with what it gave.
pub struct QpInner {
    /// The engine's QP (None once destroyed).
    pub qp: Option<QueuePair>,
    /// `ibv_qp_state` as ibverbs numbers it (a new QP is in RESET).
    pub state: ibv_qp_state,
    /// Every send signaled (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// The capabilities granted at creation.
    pub cap: ibv_qp_cap,
    /// The attributes given so far (`ibv_query_qp`).
    pub attr: ibv_qp_attr,
}

/// A queue pair.
#[repr(C)]
pub struct Qp {
    /// What the program sees.
    pub ibv: ibv_qp,
    /// The rest of an `ibv_qp_ex` after its `qp_base`, and the `ibv_wr_*`
    /// batch (`ibv_wr_post(3)`; crate::abi::ex).
    pub ex: crate::abi::QpExTail,
    /// Serialises posters and modify/destroy.
    pub lock: Spin,
    /// The handle and the state, under `lock`.
    pub inner: UnsafeCell<QpInner>,
}

/// A shared receive queue (`ibv_create_srq`).
#[repr(C)]
pub struct Srq {
    /// What the program sees (`handle` is the engine's SRQ id).
    pub ibv: ibv_srq,
    /// Serialises posters and modify/destroy.
    pub lock: Spin,
    /// The engine's SRQ (None once destroyed), under `lock`.
    pub inner: UnsafeCell<Option<SharedReceiveQueue>>,
}

// SAFETY: as for Qp below: our own mutable state is behind `lock`.
unsafe impl Send for Srq {}
// SAFETY: as above.
unsafe impl Sync for Srq {}

// SAFETY: the raw pointers in the ibverbs structs are the program's
// business (it shares them across threads as it likes); our own mutable
// state is behind `lock` (Spin) or `LIVE` (Mutex).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}
// SAFETY: as above.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}
