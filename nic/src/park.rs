//! Parking: how a waiter with nothing to do (an idle engine thread, a
//! program waiting for a completion) sleeps in the kernel instead of
//! spinning or yielding, and how whoever gives it work wakes it, at the
//! cost of one fence and one load on the hot path and a system call only
//! when the waiter really sleeps (as DPDK's `rte_power` and Linux's busy
//! poll do: spin a bounded while, then sleep).
//!
//! The waiter
//! 1. announces that it is about to sleep ([`Parker::prepare`]),
//! 2. checks once more for work (a doorbell, a command, a frame, a
//!    completion), and [`Parker::cancel`]s if it finds some,
//! 3. otherwise sleeps ([`Parker::park`]) until woken or a timeout.
//!
//! The waker publishes the work (pushes into a ring or queue), then calls
//! [`Parker::wake`]: a fence and a relaxed load of the flag, and the
//! system call only if the flag says "parked". Store buffering is the
//! danger (each side stores, then loads what the other stored; x86 lets the
//! load pass the store): the fences on both sides make either the waiter's
//! re-check see the work or the waker see the flag, so a wake-up is never
//! lost. The futex's own check (the kernel sleeps only while the word still
//! says "parked") closes the window between the re-check and the sleep.
//!
//! A waiter may ask for several items before it is woken
//! ([`Parker::prepare_for`], the word holds the count): a waker that counts
//! what is queued ([`Parker::wake_when`]) wakes it only at that count, as
//! `ibv_modify_cq`'s `cq_count` moderates completion events. The same
//! fences make the waker of the last item needed see the flag.
//!
//! This file depends on nothing but `crate::sync` and the futex of
//! `crate::sys`, so that the loom model (`nic/loom`, `scripts/loom.sh`)
//! runs the very code the engine and the program run.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use crate::sync::{fence, Ordering};
use crate::sys::Futex;

/// How long a waiter spins before it parks (`CompletionQueue::wait`,
/// `verbs::wait_until`), and an idle engine or dispatcher before its thread
/// does: Linux's default busy-poll budget. Longer than the gap between two
/// completions of a busy QP, so that a stream of work never parks, and
/// short enough that an idle thread hands its core over within a scheduler
/// tick.
pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(50);

/// The longest park of a thread that a frame cannot wake (an engine on a
/// port nobody wakes it for, a dispatcher on its port), ns: a frame that
/// arrives meanwhile waits that long at worst.
pub const UNWOKEN_PARK_NS: u64 = 100_000;

/// The timer slack of a parking poll-mode thread: a timed park oversleeps
/// by at most this (Linux's default is 50 us).
pub(crate) const PARK_TIMER_SLACK_NS: u64 = 1_000;

/// The word's value while the waiter runs. A parked waiter's word holds
/// how many items it waits for (1 or more; see [`Parker::prepare_for`]).
const RUNNING: u32 = 0;

/// One waiter's parked flag and the futex it sleeps on. One thread parks
/// on it at a time (an engine thread, or the program's thread polling a
/// CQ); any number wake it.
#[derive(Debug)]
pub struct Parker {
    futex: Futex,
    /// The CPU the waiter's thread last said it runs on ([`NO_CPU`]: not
    /// known), counted in [`NOTED_ON`]: a hint outside the wake-up protocol
    /// (whoever waits for an engine's work should not spin on the CPU the
    /// engine needs to do it: [`an_engine_runs_on`]).
    cpu: AtomicU32,
}

/// The CPU noted by a waiter that never said ([`Parker::note_cpu`]).
const NO_CPU: u32 = u32::MAX;

/// CPUs [`an_engine_runs_on`] keeps count of (numbered from 0; a thread
/// on a higher one is not counted).
const TRACKED_CPUS: usize = 1024;

/// How many waiters of this process last noted each CPU
/// ([`Parker::note_cpu`]; the engine threads do, for as long as they run).
static NOTED_ON: [AtomicU32; TRACKED_CPUS] = [const { AtomicU32::new(0) }; TRACKED_CPUS];

/// Whether an engine thread of this process last said it runs on `cpu`
/// ([`Parker::note_cpu`]): a thread that waits for any engine's work (a
/// program polling a CQ, whose completion may need the peer's engine in
/// the same process first: roce-perf's `--loopback`, or another shard's)
/// should not spin there.
pub fn an_engine_runs_on(cpu: u32) -> bool {
    NOTED_ON
        .get(cpu as usize)
        .is_some_and(|n| n.load(std::sync::atomic::Ordering::Relaxed) > 0)
}

/// Moves one count of [`NOTED_ON`] from CPU `from` to CPU `to` (either
/// [`NO_CPU`]: none).
fn move_noted(from: u32, to: u32) {
    use std::sync::atomic::Ordering::Relaxed;
    if let Some(n) = NOTED_ON.get(from as usize) {
        n.fetch_sub(1, Relaxed);
    }
    if let Some(n) = NOTED_ON.get(to as usize) {
        n.fetch_add(1, Relaxed);
    }
}

impl Drop for Parker {
    /// A parker dropped while its CPU is noted takes its count along.
    fn drop(&mut self) {
        self.note_cpu(None);
    }
}

impl Default for Parker {
    fn default() -> Self {
        Parker::new()
    }
}

impl Parker {
    /// A parker whose waiter is running.
    pub fn new() -> Parker {
        Parker {
            futex: Futex::new(RUNNING),
            cpu: AtomicU32::new(NO_CPU),
        }
    }

    /// The waiter's thread runs on `cpu` (None: unknown, or no longer
    /// runs), counted by [`an_engine_runs_on`] too. Writes only a change,
    /// so that readers' copies of the lines stay valid while a pinned
    /// thread says the same thing again. One thread notes for a parker.
    pub fn note_cpu(&self, cpu: Option<u32>) {
        let cpu = cpu.unwrap_or(NO_CPU);
        let was = self.cpu.load(std::sync::atomic::Ordering::Relaxed);
        if was != cpu {
            self.cpu.store(cpu, std::sync::atomic::Ordering::Relaxed);
            move_noted(was, cpu);
        }
    }

    /// The CPU the waiter's thread last noted ([`Self::note_cpu`]): where
    /// it runs, or ran before it parked or was moved.
    #[cfg(test)]
    fn ran_on(&self) -> Option<u32> {
        let cpu = self.cpu.load(std::sync::atomic::Ordering::Relaxed);
        (cpu != NO_CPU).then_some(cpu)
    }

    /// The waiter's step 1: from here on wakers make the system call.
    /// Check for work after this, then [`Self::park`] or [`Self::cancel`].
    pub fn prepare(&self) {
        self.prepare_for(1);
    }

    /// As [`Self::prepare`] for a waiter that needs `want` items (one at
    /// least) before it is worth waking: a waker that counts what it published
    /// ([`Self::wake_when`]) leaves it asleep below that (completion
    /// moderation: a client with several completions due sleeps until half
    /// of them are there instead of waking for each). The waiter must be
    /// sure that `want` items will come, or bound its park.
    pub fn prepare_for(&self, want: u32) {
        self.futex.word().store(want.max(1), Ordering::SeqCst);
        // Pairs with the fence in `wake`: the re-check's loads come after
        // the flag's store in the single total order of SeqCst fences.
        fence(Ordering::SeqCst);
    }

    /// The waiter found work after [`Self::prepare`]: back to running.
    pub fn cancel(&self) {
        self.futex.word().store(RUNNING, Ordering::Relaxed);
    }

    /// The waiter's step 3: sleeps until a [`Self::wake`] (also one that
    /// came since [`Self::prepare`]), `timeout` (None: none) or a spurious
    /// return; the waiter is running again on return. The caller checks for
    /// work after it in any case.
    pub fn park(&self, timeout: Option<Duration>) {
        let want = self.futex.word().load(Ordering::Acquire);
        if want != RUNNING {
            self.futex.wait(want, timeout);
        }
        // Acquire pairs with the waker's swap: what it published before
        // waking is visible to the caller's next check (the fences give
        // that too; this keeps it local).
        self.futex.word().swap(RUNNING, Ordering::AcqRel);
    }

    /// Whether the waiter announced that it sleeps (for tests and counters).
    pub fn is_parked(&self) -> bool {
        self.futex.word().load(Ordering::Relaxed) != RUNNING
    }

    /// The waker's half, after it published work for the waiter: wakes it
    /// if it is parked. A fence and a load while the waiter runs.
    #[inline]
    pub fn wake(&self) {
        // Pairs with the fence in `prepare` (see the module docs).
        fence(Ordering::SeqCst);
        if self.futex.word().load(Ordering::Relaxed) != RUNNING {
            self.wake_parked();
        }
    }

    /// As [`Self::wake`] for a waker that can count the items waiting for
    /// the waiter (`queued`, called only while the waiter is parked; it
    /// may count more than the waiter will find, never fewer): wakes it
    /// only once they reach what it asked for in [`Self::prepare_for`].
    /// The waker whose item makes the count is the one that wakes it.
    #[inline]
    pub fn wake_when(&self, queued: impl FnOnce() -> usize) {
        fence(Ordering::SeqCst);
        let want = self.futex.word().load(Ordering::Relaxed);
        if want != RUNNING && queued() >= want as usize {
            self.wake_parked();
        }
    }

    #[cold]
    fn wake_parked(&self) {
        if self.futex.word().swap(RUNNING, Ordering::AcqRel) != RUNNING {
            self.futex.wake();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;
    use std::time::Instant;

    /// The count per CPU follows each parker's notes: two on one CPU, one
    /// moved away, one unnoted, one dropped while noted. CPUs 1000 and
    /// 1001 (no test thread runs there) keep other tests' engines out of it.
    #[test]
    fn engine_cpus_follow_the_notes() {
        let (p, q) = (Parker::new(), Parker::new());
        assert!(!an_engine_runs_on(1000));
        p.note_cpu(Some(1000));
        q.note_cpu(Some(1000));
        q.note_cpu(Some(1000));
        assert!(an_engine_runs_on(1000));
        p.note_cpu(Some(1001));
        assert!(an_engine_runs_on(1000) && an_engine_runs_on(1001));
        q.note_cpu(None);
        assert!(!an_engine_runs_on(1000) && an_engine_runs_on(1001));
        drop(p);
        assert!(!an_engine_runs_on(1001));
        assert_eq!(q.ran_on(), None);
        // Past the table: noted, not counted, and no harm.
        q.note_cpu(Some(TRACKED_CPUS as u32 + 5));
        assert!(!an_engine_runs_on(TRACKED_CPUS as u32 + 5));
        assert_eq!(q.ran_on(), Some(TRACKED_CPUS as u32 + 5));
    }

    /// A parked thread is woken by a wake, not by its (long) timeout.
    #[test]
    fn wake_ends_a_park() {
        let p = Arc::new(Parker::new());
        let work = Arc::new(AtomicBool::new(false));
        let t = {
            let (p, work) = (p.clone(), work.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                loop {
                    p.prepare();
                    if work.load(Ordering::Acquire) {
                        p.cancel();
                        break;
                    }
                    p.park(Some(Duration::from_secs(20)));
                }
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        work.store(true, Ordering::Release);
        p.wake();
        let waited = t.join().unwrap();
        assert!(waited < Duration::from_secs(15), "woken by the timeout");
        assert!(!p.is_parked());
    }

    /// A park with a timeout and no waker returns.
    #[test]
    fn park_times_out() {
        let p = Parker::new();
        p.prepare();
        p.park(Some(Duration::from_millis(1)));
        assert!(!p.is_parked());
    }

    /// A waiter that asks for two items sleeps through the first (a
    /// counting waker leaves it parked) and is woken by the second.
    #[test]
    fn a_moderated_waiter_sleeps_until_its_count() {
        let p = Arc::new(Parker::new());
        let queued = Arc::new(AtomicU64::new(0));
        let t = {
            let (p, queued) = (p.clone(), queued.clone());
            std::thread::spawn(move || loop {
                p.prepare_for(2);
                let n = queued.load(Ordering::Acquire);
                if n >= 2 {
                    p.cancel();
                    return n;
                }
                p.park(Some(Duration::from_secs(20)));
            })
        };
        while !p.is_parked() {
            std::thread::sleep(Duration::from_millis(1));
        }
        queued.store(1, Ordering::Release);
        p.wake_when(|| queued.load(Ordering::Acquire) as usize);
        std::thread::sleep(Duration::from_millis(20));
        assert!(p.is_parked(), "woken with one item of two");
        let start = Instant::now();
        queued.store(2, Ordering::Release);
        p.wake_when(|| queued.load(Ordering::Acquire) as usize);
        assert_eq!(t.join().unwrap(), 2);
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "woken by the timeout"
        );
    }

    /// No lost wake-up under stress: a producer publishes numbered items and
    /// wakes; the consumer spins briefly, then parks with NO timeout. A
    /// lost wake-up leaves it asleep with an item published, and the join
    /// below never returns (the test's timeout catches it).
    #[test]
    fn no_lost_wake_ups() {
        let rounds: u64 = if cfg!(debug_assertions) {
            2_000
        } else {
            50_000
        };
        let p = Arc::new(Parker::new());
        let published = Arc::new(AtomicU64::new(0));
        let consumed = Arc::new(AtomicU64::new(0));
        let consumer = {
            let (p, published, consumed) = (p.clone(), published.clone(), consumed.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while seen < rounds {
                    let now = published.load(Ordering::Acquire);
                    if now > seen {
                        seen = now;
                        consumed.store(seen, Ordering::Release);
                        continue;
                    }
                    p.prepare();
                    if published.load(Ordering::Acquire) > seen {
                        p.cancel();
                        continue;
                    }
                    p.park(None);
                }
            })
        };
        for i in 1..=rounds {
            published.store(i, Ordering::Release);
            p.wake();
            // Let the consumer catch up (and park) now and then.
            if i % 64 == 0 {
                while consumed.load(Ordering::Acquire) < i {
                    std::hint::spin_loop();
                }
            }
        }
        consumer.join().unwrap();
    }
}
