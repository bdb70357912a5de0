//! Completion channels and CQs: create, destroy, the `poll_cq`/`req_notify_cq` ops, the events (`ibv_get_cq_event`) and `ibv_resize_cq(3)`.

use super::*;
use libc::{EAGAIN, EBUSY, EINVAL, ENOMEM};
use nic::verbs::VerbsError;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_comp_channel(
    c: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        if ctx(c).is_none() {
            return null_with(EINVAL);
        }
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return null_with(last_errno(ENOMEM));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let b = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: c,
                fd,
                refcnt: 0,
            },
            epoll,
        });
        let p = Box::into_raw(b);
        register(p.cast(), Kind::Channel, &[c.cast()]);
        p.cast()
    })
}

/// `ibv_destroy_comp_channel`: 0 or the errno value, as rdma-core's
/// (libibverbs/verbs.c returns EBUSY itself, not -1/errno); EBUSY while a
/// CQ uses the channel or a thread waits in `ibv_get_cq_event` on it.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(ch.cast(), Kind::Channel) {
            Ok(d) => d,
            Err(e) => return e,
        };
        dying.finish();
        // SAFETY: allocated in create_comp_channel, now unregistered with
        // nobody holding it.
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
        0
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        let Some(ctx) = ctx(c) else {
            return null_with(EINVAL);
        };
        // ibv_create_cq(3): `cqe` is at least 1 and at most the device's
        // `max_cqe`, `comp_vector` below the context's `num_comp_vectors`;
        // otherwise NULL with EINVAL, as the kernel answers (rxe_cq_chk_attr
        // for `cqe`, ib_uverbs_create_cq for the vector).
        if !(1..=MAX_CQE).contains(&cqe) || !(0..NUM_COMP_VECTORS).contains(&vector) {
            return null_with(EINVAL);
        }
        let ch_held = (!ch.is_null()).then(|| hold(ch.cast(), Kind::Channel));
        if let Some(None) = ch_held {
            return null_with(EINVAL);
        }
        let dev = &ctx.backend.dev;
        let depth = cqe as usize;
        let made = if ch.is_null() {
            dev.create_cq(depth)
        } else {
            dev.create_cq_with_channel(depth)
        };
        let cq = match made {
            Ok(q) => q,
            Err(e) => return null_with(errno_of(&e)),
        };
        let id = cq.id();
        let efd = cq.channel_fd();
        let b = Box::new(Cq {
            ibv: ibv_cq {
                context: c,
                channel: ch,
                cq_context,
                handle: id,
                cqe,
                ..Default::default()
            },
            ex: Default::default(),
            lock: Spin::default(),
            cq: std::cell::UnsafeCell::new(Some(cq)),
            channel: ch.cast(),
            id,
            idle_polls: std::cell::Cell::new(0),
            idle_since: std::cell::Cell::new(None),
            yield_when_idle: !ctx.backend.cfg.busy_poll,
        });
        let p = Box::into_raw(b);
        if let (false, Some(efd)) = (ch.is_null(), efd) {
            // SAFETY: a live channel (checked above).
            let chan = unsafe { &*ch.cast::<Channel>() };
            // The CQ's address: ibv_get_cq_event looks it up in the
            // registry (hold) before following it.
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: p as u64,
            };
            // SAFETY: both descriptors are live; `ev` is a valid event.
            let rc = unsafe {
                libc::epoll_ctl(chan.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, efd, &mut ev)
            };
            if rc != 0 {
                let e = last_errno(ENOMEM);
                // SAFETY: just allocated, never shared.
                drop(unsafe { Box::from_raw(p) });
                return null_with(e);
            }
        }
        register(p.cast(), Kind::Cq, &[c.cast(), ch.cast()]);
        live()
            .get_or_insert_with(Default::default)
            .cqs
            .insert(id, p as usize);
        p.cast()
    })
}

/// `ibv_destroy_cq(3)`: 0 or the errno; EBUSY while a QP completes into
/// the CQ, and (after waiting up to [`SLOW_WAIT`]) while completion events
/// handed out by `ibv_get_cq_event` are not acknowledged, which
/// `ibv_get_cq_event(3)` says the destroy waits for.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_destroy_cq(q: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(q.cast(), Kind::Cq) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // SAFETY: a live CQ of ours that no other call holds or can take.
        let cq = unsafe { &*q.cast::<Cq>() };
        // SAFETY: its context outlives it.
        let dev = &unsafe { Context::from_ibv(cq.ibv.context) }.backend.dev;
        let g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        let slot = unsafe { &mut *cq.cq.get() };
        let Some(h) = slot.take() else { return EINVAL };
        let efd = h.channel_fd();
        if let (false, Some(efd)) = (cq.channel.is_null(), efd) {
            // Out of the channel's set before the eventfd closes (a closed
            // descriptor would stay in the set while a dup of it lives).
            // SAFETY: the channel outlives its CQs; a DEL takes no event.
            let chan = unsafe { &*cq.channel };
            // SAFETY: live descriptors; a DEL takes no event.
            unsafe {
                libc::epoll_ctl(chan.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, efd, null_mut())
            };
        }
        if let Err(busy) = dev.destroy_cq(h) {
            if let (false, Some(efd)) = (cq.channel.is_null(), efd) {
                // SAFETY: as above; the CQ lives on, so does its event.
                let chan = unsafe { &*cq.channel };
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: q as u64,
                };
                // SAFETY: live descriptors, a valid event.
                unsafe {
                    libc::epoll_ctl(chan.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, efd, &mut ev)
                };
            }
            *slot = Some(busy.handle);
            return EBUSY;
        }
        drop(g);
        dying.finish();
        // SAFETY: allocated in create_cq, now unregistered with nobody
        // holding it.
        drop(unsafe { Box::from_raw(q.cast::<Cq>()) });
        0
    })
}

/// `ibv_poll_cq` (through `ops.poll_cq`): at most `n` completions into
/// `wc`; no allocation, no system call, one uncontended lock.
pub(crate) extern "C" fn op_poll_cq(q: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if n < 0 || (n > 0 && wc.is_null()) {
            return -1;
        }
        // SAFETY: `ops.poll_cq` is only reached through a CQ of ours.
        let cq = unsafe { &*q.cast::<Cq>() };
        let _g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        let Some(h) = (unsafe { &mut *cq.cq.get() }).as_mut() else {
            return -1;
        };
        let mut got = 0;
        while got < n {
            let Some(c) = h.poll_one() else { break };
            // SAFETY: the caller's array of `n` entries.
            fill_wc(&c, unsafe { &mut *wc.add(got as usize) });
            got += 1;
        }
        if got == 0 && n > 0 && cq.yield_when_idle {
            // A program spinning on an empty CQ (perftest does) on a host
            // with fewer cores than busy threads holds its core while the
            // engine (or the peer, or anything else) needs it: once a run of
            // empty polls has lasted SPIN_BEFORE_PARK (at once where the
            // program runs on its engine's CPU: its spin only keeps the
            // engine from the work), each empty poll parks on the CQ until
            // the engine's next completion or IDLE_POLL_PARK (nic::park;
            // RSNIC_BUSY_POLL=1: never). sched_yield would give a busy
            // neighbour a whole scheduler slice.
            let idle = cq.idle_polls.get() + 1;
            if idle >= IDLE_POLLS_BEFORE_YIELD {
                cq.idle_polls.set(0);
                let now = std::time::Instant::now();
                let since = cq.idle_since.get().unwrap_or(now);
                cq.idle_since.set(Some(since));
                if now.duration_since(since) >= nic::verbs::SPIN_BEFORE_PARK || h.on_engine_cpu() {
                    if let Some(c) = h.park_for(IDLE_POLL_PARK) {
                        // SAFETY: the caller's array has room for one (n > 0).
                        fill_wc(&c, unsafe { &mut *wc });
                        cq.idle_since.set(None);
                        return 1;
                    }
                }
            } else {
                cq.idle_polls.set(idle);
            }
        } else {
            cq.idle_polls.set(0);
            cq.idle_since.set(None);
        }
        got
    })
}

/// `ibv_req_notify_cq` (through `ops.req_notify_cq`): arms the CQ's
/// channel for the next completion, or with `solicited_only` non-zero for
/// the next solicited one (a receive of a message whose last packet had
/// the BTH SE bit, or an error; `ibv_req_notify_cq(3)`, IBA 11.4.2.2).
pub(crate) extern "C" fn op_req_notify_cq(q: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: reached only through a CQ of ours.
        let cq = unsafe { &*q.cast::<Cq>() };
        let _g = cq.lock.lock();
        // SAFETY: under the CQ's lock.
        match (unsafe { &*cq.cq.get() }).as_ref() {
            Some(h) => {
                if solicited_only != 0 {
                    h.req_notify_solicited();
                } else {
                    h.req_notify();
                }
                0
            }
            None => EINVAL,
        }
    })
}

#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        let Some(_ch_held) = hold(ch.cast(), Kind::Channel) else {
            return minus_one(EINVAL);
        };
        if cq_out.is_null() || ctx_out.is_null() {
            return minus_one(EINVAL);
        }
        // SAFETY: a live channel (checked).
        let chan = unsafe { &*ch.cast::<Channel>() };
        let epfd = chan.epoll.as_raw_fd();
        // A program that made the channel's fd non-blocking gets EAGAIN
        // instead of a sleep, as from the uverbs descriptor.
        // SAFETY: F_GETFL on a live descriptor.
        let nonblock = unsafe { libc::fcntl(epfd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        loop {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: one event slot, live for the call.
            let n = unsafe { libc::epoll_wait(epfd, &mut ev, 1, if nonblock { 0 } else { -1 }) };
            if n < 0 {
                let e = last_errno(libc::EIO);
                // A signal of the program's with a handler ends the wait
                // with EINTR, as rdma-core's read(2) of the uverbs descriptor
                // does (qperf's SIGALRM ends its test so). DPDK's own signal
                // never lands here: it goes to the engine's thread
                // (dpdk::tap_signal).
                return minus_one(e);
            }
            if n == 0 {
                return minus_one(EAGAIN);
            }
            let q = ev.u64 as *mut Cq;
            // Followed only once held: a CQ destroyed since (or being
            // destroyed) is skipped, and its destroy waits for this call.
            let Some(held) = hold(q.cast(), Kind::Cq) else {
                continue;
            };
            // SAFETY: a live CQ of ours, held.
            let cq = unsafe { &*q };
            if cq.channel != ch.cast() {
                // Its address was reused by a CQ of another channel.
                continue;
            }
            let efd = {
                let _g = cq.lock.lock();
                // SAFETY: under the CQ's lock.
                (unsafe { &*cq.cq.get() })
                    .as_ref()
                    .and_then(|h| h.channel_fd())
            };
            let Some(efd) = efd else { continue };
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
            let r = unsafe { libc::read(efd, (&raw mut count).cast(), 8) };
            if r != 8 {
                // Another thread took this event first.
                continue;
            }
            // Acknowledged by ibv_ack_cq_events; ibv_destroy_cq waits for it.
            add_event(&held);
            // SAFETY: the caller's out parameters (checked non-NULL).
            unsafe {
                *cq_out = q.cast();
                *ctx_out = cq.ibv.cq_context;
            }
            return 0;
        }
    })
}

/// `ibv_ack_cq_events(3)`: acknowledges `n` events of the CQ (so that
/// its destroy need not wait for them) and adds them to its
/// `comp_events_completed`, under the registry's lock.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_ack_cq_events(q: *mut ibv_cq, n: c_uint) {
    guard((), || {
        ack_events(q.cast(), Kind::Cq, n, || {
            // SAFETY: a live CQ of ours (checked under the same lock, which
            // every writer of this field holds); written through the raw
            // pointer, no reference to the program's struct is made.
            unsafe {
                let f = &raw mut (*q).comp_events_completed;
                f.write(f.read().wrapping_add(n));
            }
        });
    })
}

/// `ibv_resize_cq(3)`: 0 or an errno value. `cqe` below 1 or above
/// `max_cqe`, or below the number of completions the CQ holds now, is
/// EINVAL (rxe_cq_chk_attr); the completions queued stay, in order
/// (`nic::verbs::CompletionQueue::resize`). The CQ gets exactly `cqe`
/// entries (`cq->cqe`).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_resize_cq(q: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        let Some(_held) = hold(q.cast(), Kind::Cq) else {
            return EINVAL;
        };
        if !(1..=MAX_CQE).contains(&cqe) {
            return EINVAL;
        }
        let r = {
            // SAFETY: a live CQ of ours (checked).
            let cq = unsafe { &*q.cast::<Cq>() };
            let _g = cq.lock.lock();
            // SAFETY: under the CQ's lock.
            match (unsafe { &mut *cq.cq.get() }).as_mut() {
                Some(h) => h.resize(cqe as usize),
                None => return EINVAL,
            }
        };
        match r {
            Ok(()) => {
                // SAFETY: the program's field of a live CQ of ours.
                unsafe { (*q).cqe = cqe };
                0
            }
            Err(VerbsError::CqTooSmall { .. }) => EINVAL,
            Err(e) => errno_of(&e),
        }
    })
}
