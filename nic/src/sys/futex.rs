//! The futex system calls a parked thread sleeps in ([`crate::park`]; see
//! [`super`]).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A 32-bit word a thread sleeps on while it holds an expected value
/// (`futex(2)`, `FUTEX_WAIT_PRIVATE` / `FUTEX_WAKE_PRIVATE`): the kernel
/// checks the value and queues the sleeper atomically with respect to a
/// wake, so a waker that changed the word before it calls [`Futex::wake`]
/// is never missed.
#[derive(Debug, Default)]
pub(crate) struct Futex(AtomicU32);

impl Futex {
    /// A word holding `v`.
    pub(crate) fn new(v: u32) -> Futex {
        Futex(AtomicU32::new(v))
    }

    /// The word, for the atomics of the protocol built on it.
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.0
    }

    /// Sleeps while the word holds `expected`, until a [`Futex::wake`], a
    /// signal, or `timeout` (None: no limit). Returns at once if the word
    /// holds something else. Spurious returns are possible: the caller
    /// checks what it waits for.
    pub(crate) fn wait(&self, expected: u32, timeout: Option<Duration>) {
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the word is a live, aligned u32 for the whole call; the
        // timespec (relative, as FUTEX_WAIT takes it) lives on this stack
        // frame. EAGAIN (the value changed), EINTR and ETIMEDOUT are all
        // returns the caller handles by checking again.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                tsp,
            );
        }
    }

    /// Wakes one thread sleeping in [`Futex::wait`] on this word (call
    /// after changing it).
    pub(crate) fn wake(&self) {
        // SAFETY: the word is live and aligned; FUTEX_WAKE reads no memory.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            );
        }
    }
}
