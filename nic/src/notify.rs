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
//! The only module of `nic` that calls the C library directly.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

/// The armed flag and the eventfd of one completion queue, shared by the
/// program's handle and the engine.
#[derive(Debug)]
pub struct CqNotify {
    armed: AtomicBool,
    fd: OwnedFd,
}

impl CqNotify {
    /// A disarmed notifier with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<CqNotify> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor that we own from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
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
    }

    /// Whether the CQ is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// The engine's half, after it pushed completions into the CQ's ring:
    /// if the CQ is armed, disarm it and write the eventfd. The fence orders
    /// the ring's tail store before the flag's load (and pairs with the
    /// program's arm before its last poll), so either the program's poll
    /// sees the completion or this sees the arm.
    #[inline]
    pub fn completed(&self) {
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            self.signal();
        }
    }

    #[cold]
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our descriptor. A full
        // counter (EAGAIN, after 2^64-2 unread signals) needs no second one.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Sleeps until the eventfd was written or `timeout` passed (None:
    /// forever), then resets it; whether it was written
    /// (`ibv_get_cq_event`).
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(false),
                _ => Err(e),
            };
        }
        if n == 0 {
            return Ok(false);
        }
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking
        // descriptor (EAGAIN if another waiter took the count first).
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        Ok(true)
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
