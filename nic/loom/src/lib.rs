//! nic's doorbell, completion-channel and parking protocols, compiled from
//! nic's own source files (`nic/src/sync.rs`, `doorbell.rs`, `notify.rs`,
//! `park.rs`) so that the
//! model checks the code the engine runs; with `--cfg loom` their atomics
//! are loom's. The tests are in `protocols.rs`; run them with
//! `scripts/loom.sh`.

#![allow(dead_code)]

#[path = "../../src/sync.rs"]
pub mod sync;

#[path = "../../src/doorbell.rs"]
pub mod doorbell;

#[path = "../../src/notify.rs"]
pub mod notify;

#[path = "../../src/park.rs"]
pub mod park;

/// The eventfd `notify` writes, as the model sees it: a counter. Whether it
/// was written is all the model asks; the real one is `nic/src/sys/`.
pub mod sys {
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A counter in place of the kernel's.
    #[derive(Debug, Default)]
    pub struct EventFd(AtomicU64);

    impl EventFd {
        /// A zero counter.
        pub fn new() -> std::io::Result<EventFd> {
            Ok(EventFd::default())
        }
        /// Adds one.
        pub fn signal(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        /// Whether the counter was non-zero; resets it. Never sleeps.
        pub fn wait(&self, _timeout: Option<Duration>) -> std::io::Result<bool> {
            Ok(self.0.swap(0, Ordering::SeqCst) != 0)
        }
    }

    impl AsRawFd for EventFd {
        fn as_raw_fd(&self) -> RawFd {
            -1
        }
    }

    /// The futex `park` sleeps on, as the model sees it: the kernel checks
    /// the word and queues the sleeper under its hash bucket's lock, and a
    /// wake takes that lock; here a mutex and a condition variable. A
    /// waker changes the word before it wakes, so a sleeper that checks
    /// after the wake sees the change, and one that checked before is
    /// queued and notified. Timeouts are not modelled (a park that needs
    /// its timeout to end is a lost wake-up, which loom reports as a
    /// deadlock).
    #[cfg(loom)]
    #[derive(Debug)]
    pub struct Futex {
        word: loom::sync::atomic::AtomicU32,
        lock: loom::sync::Mutex<()>,
        cv: loom::sync::Condvar,
    }

    #[cfg(loom)]
    impl Default for Futex {
        fn default() -> Self {
            Futex::new(0)
        }
    }

    #[cfg(loom)]
    impl Futex {
        /// A word holding `v`.
        pub fn new(v: u32) -> Futex {
            Futex {
                word: loom::sync::atomic::AtomicU32::new(v),
                lock: loom::sync::Mutex::new(()),
                cv: loom::sync::Condvar::new(),
            }
        }
        /// The word.
        pub fn word(&self) -> &loom::sync::atomic::AtomicU32 {
            &self.word
        }
        /// Sleeps while the word holds `expected` (checked under the lock).
        pub fn wait(&self, expected: u32, _timeout: Option<Duration>) {
            let g = self.lock.lock().unwrap();
            if self.word.load(Ordering::SeqCst) != expected {
                return;
            }
            drop(self.cv.wait(g).unwrap());
        }
        /// Wakes a sleeper.
        pub fn wake(&self) {
            let _g = self.lock.lock().unwrap();
            self.cv.notify_one();
        }
    }
}

#[cfg(all(test, loom))]
mod protocols;
