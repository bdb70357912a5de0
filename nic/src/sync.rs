//! The atomics through which the program's handles and the engine meet
//! outside the rings: the doorbell flags and queue ([`crate::contract`]) and
//! the completion channel's armed flag ([`crate::notify`]). They come from
//! `std`, or from `loom` when the protocols are model-checked
//! (`RUSTFLAGS="--cfg loom"`, `scripts/loom.sh`), which explores every
//! interleaving and every value the C++ memory model lets a load return.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, Ordering};

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
}

/// A single-producer, single-consumer ring as loom sees `rtrb`'s (0.3): the
/// producer writes a slot, then publishes it with a release store of the
/// tail; the consumer loads the tail with acquire, reads the slot, then
/// frees it with a release store of the head. Slots are relaxed atomics
/// that start as [`model::UNWRITTEN`]: a read without a happens-before edge
/// from its write may return that, which the tests catch.
#[cfg(all(test, loom))]
pub(crate) mod model {
    use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    const CAP: usize = 4;
    /// What a slot holds before its first write.
    pub(crate) const UNWRITTEN: u64 = u64::MAX;

    pub(crate) struct Spsc {
        slots: [AtomicU64; CAP],
        head: AtomicUsize,
        tail: AtomicUsize,
    }

    impl Spsc {
        pub(crate) fn new() -> Self {
            Spsc {
                slots: std::array::from_fn(|_| AtomicU64::new(UNWRITTEN)),
                head: AtomicUsize::new(0),
                tail: AtomicUsize::new(0),
            }
        }

        /// The producer's push (one producer thread only).
        pub(crate) fn push(&self, v: u64) {
            let tail = self.tail.load(Ordering::Relaxed);
            assert!(
                tail - self.head.load(Ordering::Acquire) < CAP,
                "model ring full"
            );
            self.slots[tail % CAP].store(v, Ordering::Relaxed);
            self.tail.store(tail + 1, Ordering::Release);
        }

        /// The consumer's pop (one consumer thread only).
        pub(crate) fn pop(&self) -> Option<u64> {
            let head = self.head.load(Ordering::Relaxed);
            if self.tail.load(Ordering::Acquire) == head {
                return None;
            }
            let v = self.slots[head % CAP].load(Ordering::Relaxed);
            self.head.store(head + 1, Ordering::Release);
            Some(v)
        }
    }
}
