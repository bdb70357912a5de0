//! The eventfd system calls of completion notification (see [`super`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking Linux eventfd (`eventfd(2)`): the descriptor a completion
/// channel's program sleeps on ([`crate::notify::CqNotify`]).
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd with a zero counter.
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, waking a sleeper. A full counter (EAGAIN,
    /// after 2^64-2 unread signals) needs no second one, so errors are
    /// ignored.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our descriptor.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Resets the counter without waiting (a no-op when it is zero).
    pub(crate) fn reset(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking
        // descriptor (EAGAIN when the counter is zero).
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Sleeps until the counter is non-zero or `timeout` passed (None:
    /// forever), then resets it; whether it was signalled. An interrupted
    /// sleep counts as not signalled.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: one valid pollfd, live for the duration of the call.
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
                self.0.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        Ok(true)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
