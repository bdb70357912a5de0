//! Completion notification: how a program sleeps until a CQ has work
//! instead of spinning (`ibv_req_notify_cq` + `ibv_get_cq_event` on a
//! completion channel, whose file descriptor is an eventfd in rxe's
//! `rxe_cq.c` / uverbs).
//!
//! The program *arms* the CQ ([`CqNotify::arm`]); the engine, after it puts
//! a completion into an armed CQ, disarms it and writes the eventfd once
//! ([`CqNotify::completed`]). So the engine makes one system call per arm,
//! never one per completion, and none for a CQ nobody armed. The program
//! reads the eventfd ([`CqNotify::wait`]) and re-arms before it sleeps
//! again.
//!
//! An arm is for the next completion, or for the next *solicited* one
//! ([`CqNotify::arm_solicited`], `ibv_req_notify_cq(cq, 1)`): a receive
//! completion of a message whose last packet carried the BTH SE bit, or a
//! completion in error, as `ibv_req_notify_cq(3)` and IBA 11.4.2.2 define
//! it (the engine tells which when it pushes a completion).

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::sync::{fence, AtomicU8, Ordering};
use crate::sys::EventFd;

/// Not armed: completions signal nothing.
const DISARMED: u8 = 0;
/// Armed for the next completion.
const NEXT: u8 = 1;
/// Armed for the next solicited completion.
const SOLICITED: u8 = 2;

/// The armed state and the eventfd of one completion queue, shared by the
/// program's handle and the engine.
#[derive(Debug)]
pub struct CqNotify {
    /// [`DISARMED`], [`NEXT`] or [`SOLICITED`].
    armed: AtomicU8,
    fd: EventFd,
}

impl CqNotify {
    /// A disarmed notifier with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<CqNotify> {
        let fd = EventFd::new()?;
        Ok(CqNotify {
            armed: AtomicU8::new(DISARMED),
            fd,
        })
    }

    /// Asks for one wake-up at the next completion (`ibv_req_notify_cq`).
    /// A program polls the CQ once more after arming: a completion that
    /// arrived just before the arm does not write the eventfd.
    pub fn arm(&self) {
        self.arm_as(NEXT);
    }

    /// Asks for one wake-up at the next solicited completion
    /// (`ibv_req_notify_cq(cq, 1)`): other completions are
    /// queued without a signal and leave the CQ armed. As [`Self::arm`],
    /// the program polls once more after arming.
    pub fn arm_solicited(&self) {
        self.arm_as(SOLICITED);
    }

    fn arm_as(&self, how: u8) {
        self.armed.store(how, Ordering::SeqCst);
        // Pairs with the fence in `completed` (store buffering: each side
        // stores, then loads what the other stored). Without it the
        // program's next poll, an acquire load of the ring's tail, may
        // miss a completion whose `completed` missed the arm, and the
        // program sleeps with a completion waiting (found by the loom
        // model, nic/loom).
        fence(Ordering::SeqCst);
    }

    /// Whether the CQ is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst) != DISARMED
    }

    /// The engine's half, after it pushed a completion into the CQ's ring
    /// (`solicited`: whether it is a solicited one): if the CQ is armed for
    /// it, disarm it and write the eventfd. The fence orders the ring's
    /// tail store before the state's load and pairs with the one in
    /// [`Self::arm`], so either the program's poll after arming sees the
    /// completion or this sees the arm. The exchange disarms only the arm
    /// it looked at: one the program made meanwhile follows that poll.
    #[inline]
    pub fn completed(&self, solicited: bool) {
        fence(Ordering::SeqCst);
        let how = self.armed.load(Ordering::Relaxed);
        if (how == NEXT || (how == SOLICITED && solicited))
            && self
                .armed
                .compare_exchange(how, DISARMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.signal();
        }
    }

    #[cold]
    fn signal(&self) {
        self.fd.signal();
    }

    /// Sleeps until the eventfd was written or `timeout` passed (None:
    /// forever), then resets it; whether it was written
    /// (`ibv_get_cq_event`).
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        self.fd.wait(timeout)
    }
}

/// A plain wake-up: the engine signals it when it queued something for a
/// program thread that sleeps on it (the CM's events, `rdma_get_cm_event`).
/// One eventfd, no arm: a signal per batch of events, never per packet.
#[derive(Debug)]
pub struct EventNotify {
    fd: EventFd,
}

impl EventNotify {
    /// A notifier with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<EventNotify> {
        Ok(EventNotify {
            fd: EventFd::new()?,
        })
    }

    /// Wakes the sleeper (the engine's half).
    pub fn signal(&self) {
        self.fd.signal();
    }

    /// Sleeps until signalled or `timeout` passed (None: forever), then
    /// resets; whether it was signalled.
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        self.fd.wait(timeout)
    }
}

impl AsRawFd for EventNotify {
    /// The eventfd, for a program's own `poll`.
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsRawFd for CqNotify {
    /// The eventfd, for a program that waits in its own `epoll`.
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_signal_per_arm() {
        let n = CqNotify::new().unwrap();
        n.completed(true);
        assert!(
            !n.wait(Some(Duration::from_millis(10))).unwrap(),
            "not armed"
        );
        n.arm();
        n.completed(false);
        n.completed(false);
        assert!(!n.is_armed());
        assert!(n.wait(Some(Duration::from_millis(10))).unwrap());
        assert!(!n.wait(Some(Duration::from_millis(10))).unwrap(), "reset");
    }

    /// Armed for solicited completions, unsolicited ones pass without a
    /// signal and leave it armed; the first solicited one signals once.
    #[test]
    fn solicited_only_waits_for_a_solicited_completion() {
        let n = CqNotify::new().unwrap();
        n.arm_solicited();
        n.completed(false);
        n.completed(false);
        assert!(n.is_armed(), "an unsolicited completion disarmed it");
        assert!(!n.wait(Some(Duration::from_millis(10))).unwrap());
        n.completed(true);
        assert!(!n.is_armed());
        n.completed(true);
        assert!(n.wait(Some(Duration::from_millis(10))).unwrap());
        assert!(
            !n.wait(Some(Duration::from_millis(10))).unwrap(),
            "one signal"
        );
    }
}
