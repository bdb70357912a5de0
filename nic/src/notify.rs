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

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::sync::{fence, AtomicBool, Ordering};
use crate::sys::EventFd;

/// The armed flag and the eventfd of one completion queue, shared by the
/// program's handle and the engine.
#[derive(Debug)]
pub struct CqNotify {
    armed: AtomicBool,
    fd: EventFd,
}

impl CqNotify {
    /// A disarmed notifier with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<CqNotify> {
        let fd = EventFd::new()?;
        Ok(CqNotify {
            armed: AtomicBool::new(false),
            fd,
        })
    }

    /// Asks for one wake-up at the next completion (`ibv_req_notify_cq`).
    /// A program polls the CQ once more after arming: a completion that
    /// arrived just before the arm does not write the eventfd.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
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
        self.armed.load(Ordering::SeqCst)
    }

    /// The engine's half, after it pushed completions into the CQ's ring:
    /// if the CQ is armed, disarm it and write the eventfd. The fence orders
    /// the ring's tail store before the flag's load and pairs with the one
    /// in [`Self::arm`], so either the program's poll after arming sees the
    /// completion or this sees the arm.
    #[inline]
    pub fn completed(&self) {
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
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
        n.completed();
        assert!(
            !n.wait(Some(Duration::from_millis(10))).unwrap(),
            "not armed"
        );
        n.arm();
        n.completed();
        n.completed();
        assert!(!n.is_armed());
        assert!(n.wait(Some(Duration::from_millis(10))).unwrap());
        assert!(!n.wait(Some(Duration::from_millis(10))).unwrap(), "reset");
    }
}
