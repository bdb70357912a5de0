//! The C objects this library hands out: each is a libibverbs struct
//! (`ibv_context` inside a `verbs_context`, `ibv_pd`, `ibv_mr`, `ibv_cq`,
//! `ibv_qp`, `ibv_comp_channel`) as the **first** field of a `repr(C)`
//! struct of ours, so the program's pointer is ours too; the rest holds the
//! engine's handle.
//!
//! Every live object's address is in the registry ([`LIVE`]) with its
//! kind, its parents and three counts, and a slow-path call follows a
//! pointer only while it holds a reference taken there ([`hold`]): a
//! foreign, freed or NULL pointer fails with EINVAL instead of being
//! dereferenced (rdma-core would crash on most of them), and an object is
//! freed only once nobody holds it. As in rdma-core:
//! - objects count their children (a PD its MRs and QPs, a CQ the QPs that
//!   complete into it, a channel its CQs, a context its PDs, CQs and
//!   channels): a destroy of an object with children is refused with EBUSY
//!   (`ibv_dealloc_pd(3)`, `ibv_destroy_cq(3)`, `ibv_destroy_comp_channel`,
//!   and `ibv_close_device`, whose page says it does not release them);
//! - an event handed out holds its object until acknowledged: a CQ event
//!   until `ibv_ack_cq_events`, an async event until `ibv_ack_async_event`;
//!   the destroy waits for the acknowledgements (`ibv_get_cq_event(3)`,
//!   `ibv_get_async_event(3)`: "destroying ... will wait for all
//!   events to be acknowledged");
//! - a destroy ([`begin_destroy`]) first marks the object dying (no new
//!   reference), waits until the references and unacknowledged events
//!   are gone, asks the engine, and frees the object only once the
//!   engine confirmed ([`Dying::finish`]); on a failure the object lives
//!   on ([`Dying`]'s drop) and the errno refers to a live object.
//!
//! Waits are bounded ([`SLOW_WAIT`]): a destroy whose object stays held
//! (an event never acknowledged, another thread asleep in a call on it)
//! fails with EBUSY at the end instead of hanging the program.
//!
//! Locks, in the one order they may be taken: a QP's lock, then CQ locks in
//! address order ([`lock_two`]), then the registry (a leaf: nothing is
//! locked and no engine call is made while it is held). The object locks
//! are sleeping locks ([`Spin`]): uncontended they cost one atomic swap
//! each way, as a spin lock; contended they sleep instead of spinning, so
//! the slow-path work done under them (an engine round trip, the ARP of
//! a `modify_qp` to RTR, the bounded park of an empty `poll_cq`) costs the
//! other threads no CPU.
//!
//! The hot path (`post_send`, `post_recv`, `poll_cq`, `req_notify_cq`) is
//! reached only through the `ops` of a context we built, with objects of
//! ours, and skips the registry.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nic::verbs::{CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, SharedReceiveQueue};
use rdma::transport::{SendWr, Sge, UdDest, WorkCompletion};

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
    /// An [`Ah`].
    Ah,
    /// An [`Mw`].
    Mw,
}

/// The longest a destroy waits for its object's references and
/// unacknowledged events to go (then EBUSY), longer than any engine call
/// (the ARP of a `modify_qp` to RTR gives up after ~3 s).
pub const SLOW_WAIT: Duration = Duration::from_secs(10);

/// One live object.
#[derive(Debug)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// The objects it counts in (their addresses; a QP whose send and
    /// receive CQ are one counts twice in it).
    pub parents: Vec<usize>,
    /// Objects counting in it.
    pub children: u32,
    /// References held by calls in progress ([`Held`]).
    pub users: u32,
    /// Events handed out and not acknowledged yet.
    pub events: u32,
    /// A destroy is under way: no new reference.
    pub dying: bool,
    /// A context closed while objects of it lived (`ibv_close_device`):
    /// it takes no new object and is freed with its last child.
    pub closed: bool,
}

/// Live objects: address -> entry; and QPN / CQ id -> object, for async
/// events.
#[derive(Default)]
pub struct Live {
    /// Address of the ibverbs struct -> its entry.
    pub objects: HashMap<usize, Entry>,
    /// QPN -> its [`Qp`].
    pub qps: HashMap<u32, usize>,
    /// CQ id -> its [`Cq`].
    pub cqs: HashMap<u32, usize>,
    /// SRQ id -> its [`Srq`].
    pub srqs: HashMap<u32, usize>,
}

/// Every object this library handed out and has not freed.
pub static LIVE: Mutex<Option<Live>> = Mutex::new(None);
/// Signalled whenever a reference, an event or a destroy ends.
static RELEASED: Condvar = Condvar::new();

/// The registry, locked (a panic elsewhere does not poison it for good).
pub fn live() -> MutexGuard<'static, Option<Live>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn live_mut<'a>(g: &'a mut MutexGuard<'static, Option<Live>>) -> &'a mut Live {
    g.get_or_insert_with(Live::default)
}

/// A reference to a live object, taken by [`hold`]: while it exists the
/// object is neither freed nor destroyed (a destroy waits for it).
#[must_use]
pub struct Held(usize);

impl Drop for Held {
    fn drop(&mut self) {
        let mut g = live();
        // Only a destroy waits for references (no wake-up otherwise: a
        // futex call per slow-path verb for nobody).
        let wake = live_mut(&mut g).objects.get_mut(&self.0).is_some_and(|e| {
            e.users -= 1;
            e.dying
        });
        drop(g);
        if wake {
            RELEASED.notify_all();
        }
    }
}

/// A reference to `p` if it is a live object of kind `k` that is not
/// being destroyed.
pub fn hold(p: *const c_void, k: Kind) -> Option<Held> {
    if p.is_null() {
        return None;
    }
    let mut g = live();
    let e = live_mut(&mut g).objects.get_mut(&(p as usize))?;
    if e.kind != k || e.dying {
        return None;
    }
    e.users += 1;
    Some(Held(p as usize))
}

/// Records a new object counting in `parents` (each held by the caller,
/// so live; NULLs are skipped).
pub fn register(p: *const c_void, k: Kind, parents: &[*const c_void]) {
    let mut g = live();
    let l = live_mut(&mut g);
    let parents: Vec<usize> = parents
        .iter()
        .filter(|q| !q.is_null())
        .map(|&q| q as usize)
        .collect();
    for q in &parents {
        if let Some(e) = l.objects.get_mut(q) {
            e.children += 1;
        }
    }
    l.objects.insert(
        p as usize,
        Entry {
            kind: k,
            parents,
            children: 0,
            users: 0,
            events: 0,
            dying: false,
            closed: false,
        },
    );
}

/// Moves `p`'s count from parent `from` to parent `to` (`ibv_rereg_mr` with
/// `IBV_REREG_MR_CHANGE_PD`: the region now counts in its new PD). The
/// caller holds `p` and `to`.
pub fn reparent(p: *const c_void, from: *const c_void, to: *const c_void) {
    let mut g = live();
    let l = live_mut(&mut g);
    let Some(e) = l.objects.get_mut(&(p as usize)) else {
        return;
    };
    let Some(slot) = e.parents.iter_mut().find(|q| **q == from as usize) else {
        return;
    };
    *slot = to as usize;
    if let Some(f) = l.objects.get_mut(&(from as usize)) {
        f.children -= 1;
    }
    if let Some(t) = l.objects.get_mut(&(to as usize)) {
        t.children += 1;
    }
    let wake = l.objects.get(&(from as usize)).is_some_and(|f| f.dying);
    drop(g);
    if wake {
        RELEASED.notify_all();
    }
}

/// `ibv_close_device` of context `p` that still has objects (rdma-core's
/// `ibv_close_device(3)` does not release them either): it is marked closed
/// (no new reference, no new object) and freed with its last child by
/// [`Dying::finish`]. Whether `p` was such a context.
pub fn close_with_children(p: *const c_void) -> bool {
    let mut g = live();
    match live_mut(&mut g).objects.get_mut(&(p as usize)) {
        Some(e) if e.kind == Kind::Context && !e.dying && e.children > 0 => {
            e.dying = true;
            e.closed = true;
            true
        }
        _ => false,
    }
}

/// An object being destroyed ([`begin_destroy`]): nobody else holds it and
/// nobody can take it. Dropped without [`Dying::finish`] (the engine
/// refused, or a panic), the object lives on.
#[must_use]
pub struct Dying(usize);

impl Dying {
    /// Forgets the object (the caller frees it next): its parents no
    /// longer count it.
    pub fn finish(self) {
        let key = self.0;
        std::mem::forget(self);
        let mut g = live();
        let l = live_mut(&mut g);
        let mut free_ctx = None;
        if let Some(e) = l.objects.remove(&key) {
            for q in e.parents {
                if let Some(pe) = l.objects.get_mut(&q) {
                    pe.children -= 1;
                    if pe.closed && pe.children == 0 && pe.users == 0 {
                        free_ctx = Some(q);
                    }
                }
            }
        }
        if let Some(q) = free_ctx {
            l.objects.remove(&q);
        }
        l.qps.retain(|_, &mut a| a != key);
        l.cqs.retain(|_, &mut a| a != key);
        l.srqs.retain(|_, &mut a| a != key);
        drop(g);
        RELEASED.notify_all();
        if let Some(q) = free_ctx {
            // SAFETY: a context closed by ibv_close_device whose last child
            // just went: unregistered above, nobody holds or can take it.
            unsafe { Context::free(q as *mut ibv_context) };
        }
    }
}

impl Drop for Dying {
    fn drop(&mut self) {
        let mut g = live();
        if let Some(e) = live_mut(&mut g).objects.get_mut(&self.0) {
            e.dying = false;
        }
        drop(g);
        RELEASED.notify_all();
    }
}

/// Starts destroying `p`, a live object of kind `k`: EINVAL if it is not
/// one (or another destroy of it is under way), EBUSY while it has
/// children, or while references or unacknowledged events remain after
/// [`SLOW_WAIT`].
pub fn begin_destroy(p: *const c_void, k: Kind) -> Result<Dying, i32> {
    let key = p as usize;
    let mut g = live();
    {
        let Some(e) = live_mut(&mut g).objects.get_mut(&key) else {
            return Err(libc::EINVAL);
        };
        if p.is_null() || e.kind != k || e.dying {
            return Err(libc::EINVAL);
        }
        if e.children > 0 {
            return Err(libc::EBUSY);
        }
        e.dying = true;
    }
    let dying = Dying(key);
    let until = Instant::now() + SLOW_WAIT;
    loop {
        let e = &live_mut(&mut g).objects[&key];
        // A call that held the object may have made a child meanwhile.
        if e.children > 0 {
            drop(g);
            return Err(libc::EBUSY);
        }
        if e.users == 0 && e.events == 0 {
            drop(g);
            return Ok(dying);
        }
        let now = Instant::now();
        if now >= until {
            drop(g);
            return Err(libc::EBUSY);
        }
        g = RELEASED
            .wait_timeout(g, until - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Counts an event handed out for `held` (acknowledged by [`ack_events`]).
pub fn add_event(held: &Held) {
    let mut g = live();
    if let Some(e) = live_mut(&mut g).objects.get_mut(&held.0) {
        e.events += 1;
    }
}

/// Acknowledges up to `n` events of `p` (kind `k`, dying or not); runs
/// `also` under the registry's lock if it is one. Whether it was.
pub fn ack_events(p: *const c_void, k: Kind, n: u32, also: impl FnOnce()) -> bool {
    let mut g = live();
    let Some(e) = live_mut(&mut g).objects.get_mut(&(p as usize)) else {
        return false;
    };
    if e.kind != k {
        return false;
    }
    e.events -= n.min(e.events);
    let wake = e.dying;
    also();
    drop(g);
    if wake {
        RELEASED.notify_all();
    }
    true
}

/// What an async event names: a QP by QPN, a CQ or an SRQ by engine id.
#[derive(Debug, Clone, Copy)]
pub enum EventOf {
    /// A QP.
    Qp(u32),
    /// A CQ.
    Cq(u32),
    /// An SRQ.
    Srq(u32),
}

/// The object an async event names, with one event counted against it
/// (until `ibv_ack_async_event`), unless it is gone or being destroyed.
pub fn event_of(of: EventOf) -> Option<usize> {
    let mut g = live();
    let l = live_mut(&mut g);
    let a = match of {
        EventOf::Qp(n) => *l.qps.get(&n)?,
        EventOf::Cq(id) => *l.cqs.get(&id)?,
        EventOf::Srq(id) => *l.srqs.get(&id)?,
    };
    let e = l.objects.get_mut(&a)?;
    if e.dying {
        return None;
    }
    e.events += 1;
    Some(a)
}

/// A lock for the objects (historically a spin lock, hence the name): one
/// atomic swap to take and one to release when nobody else holds it, as
/// providers lock a QP's send queue and a CQ (libibverbs objects may be
/// used from several threads); a contended one spins briefly and then
/// sleeps on a futex (std's `Mutex`), so that slow-path work done under
/// it costs the waiting threads no CPU.
#[derive(Default)]
pub struct Spin(Mutex<()>);

/// Holds a [`Spin`] until dropped.
pub struct SpinGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

impl Spin {
    /// Takes the lock (a panic under it does not poison it for good).
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_> {
        SpinGuard(self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Locks `a` and `b` (once if they are the same lock) in address order, so
/// that two threads locking the same two objects in opposite roles (two
/// QPs created on CQs (A, B) and (B, A)) cannot deadlock.
pub fn lock_two<'a>(a: &'a Spin, b: &'a Spin) -> (SpinGuard<'a>, Option<SpinGuard<'a>>) {
    if std::ptr::eq(a, b) {
        return (a.lock(), None);
    }
    let (first, second) = if (a as *const Spin) < (b as *const Spin) {
        (a, b)
    } else {
        (b, a)
    };
    let g1 = first.lock();
    (g1, Some(second.lock()))
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
    /// Frees a context allocated by `ibv_open_device`.
    ///
    /// # Safety
    /// `p` is the `ibv_context` of a [`Context`] in a `Box`, unregistered,
    /// that nobody holds or can take.
    pub unsafe fn free(p: *mut ibv_context) {
        let off = std::mem::offset_of!(Context, vctx.context);
        // SAFETY: the caller's contract.
        drop(unsafe { Box::from_raw(p.cast::<u8>().sub(off).cast::<Context>()) });
    }

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
}

/// A completion queue.
#[repr(C)]
pub struct Cq {
    /// What the program sees.
    pub ibv: ibv_cq,
    /// The rest of an `ibv_cq_ex` after its `ibv_cq` part, and the
    /// iterator's state (`ibv_create_cq_ex(3)`; `abi::cq_ex`).
    pub ex: CqExTail,
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
    /// batch (`ibv_wr_post(3)`; `abi::qp_ex`).
    pub ex: QpExTail,
    /// Serialises posters and modify/destroy.
    pub lock: Spin,
    /// The handle and the state, under `lock`.
    pub inner: UnsafeCell<QpInner>,
}

// ------------------------------------------- the extended QP and CQ tails

// An `ibv_qp_ex` begins with its `ibv_qp` (`qp_base`) and an `ibv_cq_ex`
// with the fields of an `ibv_cq` (`ibv_cq_ex_to_cq` is a cast), so the
// extended object is the same address as the plain one: `Qp` and `Cq`
// carry the rest of the extended struct (`QpExTail`, `CqExTail`)
// right after their `ibverbs` struct, zero (no function pointers) for an
// object of `ibv_create_qp` / `ibv_create_cq` (`abi::qp_ex`, `abi::cq_ex`
// fill them for `ibv_create_qp_ex` / `ibv_create_cq_ex`). The compile-time
// checks below hold the layouts to verbs.h's.

/// 64-bit words of an `ibv_qp_ex` after its `qp_base`.
const QP_TAIL_WORDS: usize = (size_of::<ibv_qp_ex>() - size_of::<ibv_qp>()) / 8;
/// 64-bit words of an `ibv_cq_ex` after the fields it shares with `ibv_cq`.
const CQ_TAIL_WORDS: usize = (size_of::<ibv_cq_ex>() - size_of::<ibv_cq>()) / 8;

const _: () = {
    // `ibv_qp_ex` = `ibv_qp` + what QpExTail holds, at Qp's `ex`.
    assert!(offset_of!(ibv_qp_ex, comp_mask) == size_of::<ibv_qp>());
    assert!((size_of::<ibv_qp_ex>() - size_of::<ibv_qp>()).is_multiple_of(8));
    assert!(offset_of!(Qp, ex) == offset_of!(ibv_qp_ex, comp_mask));
    // `ibv_cq_ex` starts with `ibv_cq`'s fields (ibv_cq_ex_to_cq is a cast).
    assert!(offset_of!(ibv_cq_ex, cqe) == offset_of!(ibv_cq, cqe));
    assert!(
        offset_of!(ibv_cq_ex, async_events_completed) == offset_of!(ibv_cq, async_events_completed)
    );
    assert!(offset_of!(ibv_cq_ex, comp_mask) == size_of::<ibv_cq>());
    assert!((size_of::<ibv_cq_ex>() - size_of::<ibv_cq>()).is_multiple_of(8));
    assert!(offset_of!(Cq, ex) == offset_of!(ibv_cq_ex, comp_mask));
};

/// The rest of an `ibv_qp_ex` after `qp_base` (its words, written through
/// an `ibv_qp_ex` pointer to the [`Qp`]), and the `ibv_wr_*` batch of a QP
/// created with `ibv_create_qp_ex` (None for one of `ibv_create_qp`).
#[repr(C)]
pub struct QpExTail {
    words: UnsafeCell<[u64; QP_TAIL_WORDS]>,
    pub(crate) batch: UnsafeCell<Option<Box<WrBatch>>>,
}

impl Default for QpExTail {
    fn default() -> Self {
        QpExTail {
            words: UnsafeCell::new([0; QP_TAIL_WORDS]),
            batch: UnsafeCell::new(None),
        }
    }
}

/// The rest of an `ibv_cq_ex` after its `ibv_cq` fields, and the
/// iterator's state (the current completion, the CQ's lock from
/// `start_poll` to `end_poll`).
#[repr(C)]
pub struct CqExTail {
    words: UnsafeCell<[u64; CQ_TAIL_WORDS]>,
    pub(crate) cur: UnsafeCell<WorkCompletion>,
    pub(crate) guard: UnsafeCell<Option<SpinGuard<'static>>>,
}

impl Default for CqExTail {
    fn default() -> Self {
        CqExTail {
            words: UnsafeCell::new([0; CQ_TAIL_WORDS]),
            cur: UnsafeCell::new(WorkCompletion::BLANK),
            guard: UnsafeCell::new(None),
        }
    }
}

/// A work request built since `ibv_wr_start`.
#[derive(Clone, Copy)]
pub(crate) struct Staged {
    pub(crate) wr: SendWr,
    /// Its SGEs: `sges[first..first + n]` of the batch (n = 0: none).
    pub(crate) first: u32,
    pub(crate) n: u32,
    /// Inline data: `inline[at..at + len]` of the batch.
    pub(crate) inline: Option<(u32, u32)>,
    /// A UD QP's destination (`ibv_wr_set_ud_addr`).
    pub(crate) ud: Option<UdDest>,
}

/// The `ibv_wr_*` state of an extended QP: the QP's lock while a batch is
/// open, the batch and the first error (`ibv_wr_post(3)`: "If a failure is
/// detected during operation ... ibv_wr_complete() will return failure and
/// the entire posting will be aborted"). Its vectors keep their capacity
/// from batch to batch: after the first batches, building allocates
/// nothing.
pub(crate) struct WrBatch {
    pub(crate) guard: Option<SpinGuard<'static>>,
    pub(crate) err: i32,
    pub(crate) sig_all: bool,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: ibv_qp_type,
    pub(crate) wrs: Vec<Staged>,
    pub(crate) sges: Vec<Sge>,
    pub(crate) inline: Vec<u8>,
}

/// An address handle (`ibv_create_ah`): where a UD QP's datagrams go.
#[repr(C)]
pub struct Ah {
    /// What the program sees.
    pub ibv: ibv_ah,
    /// The NIC's handle (None once destroyed).
    pub ah: Option<nic::verbs::AddressHandle>,
}

/// A memory window (`ibv_alloc_mw`); `ibv.rkey` is the program's copy of its
/// R_Key (a type 1 window's is advanced by `ibv_bind_mw`).
#[repr(C)]
pub struct Mw {
    /// What the program sees.
    pub ibv: ibv_mw,
    /// The NIC's handle (None once deallocated).
    pub mw: Option<nic::verbs::MemoryWindow>,
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
// state is behind `lock` (Spin) or `LIVE` (Mutex), and the object itself
// is freed only once no call holds it (`hold`, `begin_destroy`).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}
// SAFETY: as above.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}
