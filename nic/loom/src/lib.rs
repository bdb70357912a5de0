//! nic's doorbell and completion-channel protocols, compiled from nic's own
//! source files (`nic/src/sync.rs`, `doorbell.rs`, `notify.rs`) so that the
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
}

#[cfg(all(test, loom))]
mod protocols;
