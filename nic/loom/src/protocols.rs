//! The doorbell and completion-channel protocols under loom: every
//! interleaving of the program's thread with the engine's, and every value
//! the C++ memory model lets each load return. Run by `scripts/loom.sh`
//! (`RUSTFLAGS="--cfg loom"`).

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;

use crate::doorbell::Doorbells;
use crate::notify::CqNotify;
use crate::park::Parker;

/// A single-producer, single-consumer ring as `rtrb` (0.3) publishes: the
/// producer writes a slot, then stores the tail with release; the consumer
/// loads the tail with acquire, reads the slot, then stores the head with
/// release. Slots are relaxed atomics that start as [`UNWRITTEN`]: a read
/// without a happens-before edge from its write may return that, which the
/// tests catch.
struct Spsc {
    slots: [AtomicU64; 4],
    head: AtomicUsize,
    tail: AtomicUsize,
}

/// What a slot holds before its first write.
const UNWRITTEN: u64 = u64::MAX;

impl Spsc {
    fn new() -> Self {
        Spsc {
            slots: std::array::from_fn(|_| AtomicU64::new(UNWRITTEN)),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    fn push(&self, v: u64) {
        let tail = self.tail.load(Ordering::Relaxed);
        let n = self.slots.len();
        assert!(
            tail - self.head.load(Ordering::Acquire) < n,
            "model ring full"
        );
        self.slots[tail % n].store(v, Ordering::Relaxed);
        self.tail.store(tail + 1, Ordering::Release);
    }

    /// Items queued, as the producer counts them (its own tail, the
    /// consumer's head as last published: never fewer than there are).
    fn queued(&self) -> usize {
        self.tail.load(Ordering::Relaxed) - self.head.load(Ordering::Acquire)
    }

    /// Items queued, as the consumer counts them.
    fn available(&self) -> usize {
        self.tail.load(Ordering::Acquire) - self.head.load(Ordering::Relaxed)
    }

    fn pop(&self) -> Option<u64> {
        let head = self.head.load(Ordering::Relaxed);
        if self.tail.load(Ordering::Acquire) == head {
            return None;
        }
        let v = self.slots[head % self.slots.len()].load(Ordering::Relaxed);
        self.head.store(head + 1, Ordering::Release);
        Some(v)
    }
}

const QPN_BASE: u32 = 0x100;

/// A post is never stranded: the poster pushes two work requests into the
/// QP's ring, ringing after each, while an engine pass (take the rung QP,
/// drain its ring) runs concurrently. Whatever the pass missed must still be
/// rung, so the engine's next pass finds it. Clearing the flag with a plain
/// release store instead of the swap fails here.
#[test]
fn doorbell_posts_are_never_stranded() {
    loom::model(|| {
        let bells = Arc::new(Doorbells::new(1, QPN_BASE));
        let ring = Arc::new(Spsc::new());
        let poster = {
            let (bells, ring) = (bells.clone(), ring.clone());
            loom::thread::spawn(move || {
                for v in 0..2 {
                    ring.push(v);
                    bells.ring(QPN_BASE);
                }
            })
        };
        let mut taken = Vec::new();
        if let Some(i) = bells.take() {
            assert_eq!(i, 0);
            while let Some(v) = ring.pop() {
                taken.push(v);
            }
        }
        poster.join().unwrap();
        while bells.take().is_some() {
            while let Some(v) = ring.pop() {
                taken.push(v);
            }
        }
        assert_eq!(taken, [0, 1], "a work request was stranded in its ring");
    });
}

/// No lost wake-up: the program does what `CompletionQueue::wait_blocking`
/// does (poll, arm, poll, then sleep) while the engine pushes a completion
/// and calls `completed`. If both polls found the ring empty, the engine
/// must have seen the arm and written the eventfd, or the program would
/// sleep with a completion waiting. Without the fence in `CqNotify::arm`
/// this fails.
#[test]
fn a_completion_is_polled_or_wakes_the_program() {
    loom::model(|| {
        let notify = Arc::new(CqNotify::new().unwrap());
        let ring = Arc::new(Spsc::new());
        let engine = {
            let (notify, ring) = (notify.clone(), ring.clone());
            loom::thread::spawn(move || {
                ring.push(7);
                notify.completed(false);
            })
        };
        let polled = ring.pop().or_else(|| {
            notify.arm();
            ring.pop()
        });
        engine.join().unwrap();
        match polled {
            Some(v) => assert_eq!(v, 7, "a completion read before it was written"),
            None => assert!(
                notify.wait(None).unwrap(),
                "both polls missed the completion and the engine did not signal"
            ),
        }
    });
}

/// An engine that parks when idle never sleeps through a post: the poster
/// pushes two work requests, ringing after each and waking the engine when
/// the ring queued the QP (`EngineShared::ring_doorbell`); the engine takes
/// and drains, and with nothing found announces its park, takes and drains
/// once more (its re-check turn) and sleeps with no timeout. A lost wake-up
/// leaves it asleep with a post in the ring: loom reports the deadlock.
/// Waking only on the queueing ring is enough: a ring that found the QP
/// already rung races with an engine that has yet to drain it.
#[test]
fn a_parked_engine_wakes_for_every_post() {
    loom::model(|| {
        let bells = Arc::new(Doorbells::new(1, QPN_BASE));
        let ring = Arc::new(Spsc::new());
        let parker = Arc::new(Parker::new());
        let poster = {
            let (bells, ring, parker) = (bells.clone(), ring.clone(), parker.clone());
            loom::thread::spawn(move || {
                for v in 0..2 {
                    ring.push(v);
                    if bells.ring(QPN_BASE) {
                        parker.wake();
                    }
                }
            })
        };
        let mut taken = Vec::new();
        let turn = |taken: &mut Vec<u64>| {
            let before = taken.len();
            while let Some(i) = bells.take() {
                assert_eq!(i, 0);
                while let Some(v) = ring.pop() {
                    taken.push(v);
                }
            }
            taken.len() > before
        };
        while taken.len() < 2 {
            if turn(&mut taken) {
                continue;
            }
            parker.prepare();
            if turn(&mut taken) {
                parker.cancel();
                continue;
            }
            parker.park(None);
        }
        poster.join().unwrap();
        assert_eq!(taken, [0, 1]);
    });
}

/// A program parked on its CQ (`CompletionQueue::wait` / `park_for`:
/// announce, poll once more, sleep with no timeout) is woken by the
/// engine's push (`CqRing::push`: push, then `Parker::wake`). Without the
/// fences in `prepare` and `wake` this deadlocks.
#[test]
fn a_parked_waiter_wakes_for_a_completion() {
    loom::model(|| {
        let parker = Arc::new(Parker::new());
        let ring = Arc::new(Spsc::new());
        let engine = {
            let (parker, ring) = (parker.clone(), ring.clone());
            loom::thread::spawn(move || {
                ring.push(7);
                parker.wake();
            })
        };
        let got = loop {
            if let Some(v) = ring.pop() {
                break v;
            }
            parker.prepare();
            if let Some(v) = ring.pop() {
                parker.cancel();
                break v;
            }
            parker.park(None);
        };
        assert_eq!(got, 7);
        engine.join().unwrap();
    });
}

/// Completion moderation (`CompletionQueue::wait_batch`): a program parked
/// until two completions are queued (`Parker::prepare_for(2)`, re-check,
/// sleep with no timeout) is woken by the push that makes two
/// (`CqRing::push`: push, then `Parker::wake_when` with the producer's
/// count), and not left asleep by the one before it.
#[test]
fn a_moderated_waiter_wakes_at_its_count() {
    loom::model(|| {
        let parker = Arc::new(Parker::new());
        let ring = Arc::new(Spsc::new());
        let engine = {
            let (parker, ring) = (parker.clone(), ring.clone());
            loom::thread::spawn(move || {
                for v in [7, 8] {
                    ring.push(v);
                    parker.wake_when(|| ring.queued());
                }
            })
        };
        loop {
            if ring.available() >= 2 {
                break;
            }
            parker.prepare_for(2);
            if ring.available() >= 2 {
                parker.cancel();
                break;
            }
            parker.park(None);
        }
        assert_eq!((ring.pop(), ring.pop()), (Some(7), Some(8)));
        engine.join().unwrap();
    });
}

/// Why `scripts/loom.sh` bounds the preemptions: loom 0.7 lets a store
/// land between the read and the write of an RMW another thread did before
/// it (tokio-rs/loom#254, #424; the fix, tokio-rs/loom#391, is not
/// released), so a later load of that thread may return the RMW's write
/// although the store happens before the load. From 4 preemptions on, that
/// gives [`a_parked_engine_wakes_for_every_post`] a deadlock the memory
/// model forbids: the poster's `wake_parked` swap, then the engine's next
/// `prepare` store, then the poster's ring of its second post (after the
/// engine's re-check has taken the doorbell queue's lock) reading the
/// swap's `RUNNING`. With the fix applied to a local copy of loom (a store
/// is ordered after every earlier RMW's write), all five models above pass
/// with no bound, and still catch a missing fence in `Parker::wake`. This
/// test is that bug in three lines: it passes while loom has it, and fails
/// once a loom without it is in use, the time to lift the bound.
#[test]
#[should_panic(expected = "a load missed a store that happens before it")]
fn loom_still_lets_a_store_into_an_rmw() {
    use loom::sync::atomic::AtomicU32;
    use loom::sync::Mutex;
    loom::model(|| {
        let x = Arc::new(AtomicU32::new(0));
        let m = Arc::new(Mutex::new(false));
        let t = {
            let (x, m) = (x.clone(), m.clone());
            loom::thread::spawn(move || {
                let before = x.swap(0, Ordering::AcqRel);
                *m.lock().unwrap() = true;
                (before, x.load(Ordering::Relaxed))
            })
        };
        x.store(1, Ordering::Relaxed);
        let after_mine = !*m.lock().unwrap();
        let (before, seen) = t.join().unwrap();
        // `before == 0`: the swap precedes the store of 1 in x's order;
        // `after_mine`: that store happens before the thread's load
        // (through the lock), which must then return 1.
        assert!(
            !(after_mine && before == 0) || seen == 1,
            "a load missed a store that happens before it"
        );
    });
}
