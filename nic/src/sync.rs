//! The atomics through which the program's handles and the engine meet
//! outside the rings: the doorbell flags and queue ([`crate::doorbell`]) and
//! the completion channel's armed state ([`crate::notify`]) and the parked
//! flag ([`crate::park`]). They come from
//! `std`, or from `loom` when the loom model (`nic/loom`, its own crate so
//! that loom stays out of the workspace; `scripts/loom.sh`) compiles these
//! files with `--cfg loom`: it explores every interleaving and every value
//! the C++ memory model lets a load return.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};

/// The queue of QP indices whose doorbell rang: lock-free and bounded.
#[cfg(not(loom))]
pub(crate) type IndexQueue = crossbeam_queue::ArrayQueue<u32>;

/// The queue of QP indices whose doorbell rang, as loom sees it: a lock
/// gives the happens-before edge from push to pop that `ArrayQueue`'s
/// release/acquire pair gives.
#[cfg(loom)]
pub(crate) struct IndexQueue(loom::sync::Mutex<std::collections::VecDeque<u32>>);

#[cfg(loom)]
impl IndexQueue {
    pub(crate) fn new(cap: usize) -> Self {
        IndexQueue(loom::sync::Mutex::new(
            std::collections::VecDeque::with_capacity(cap),
        ))
    }
    pub(crate) fn push(&self, v: u32) -> Result<(), u32> {
        self.0.lock().unwrap().push_back(v);
        Ok(())
    }
    pub(crate) fn pop(&self) -> Option<u32> {
        self.0.lock().unwrap().pop_front()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().unwrap().is_empty()
    }
}
