//! Completion queues ([`CompletionQueue`], `ibv_cq` with its completion
//! channel) and the device's async event queue ([`AsyncEvents`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma::transport::WorkCompletion;

use super::{AsyncEvent, VerbsError, SPIN_BEFORE_PARK};
use crate::contract::{Command, CommandTx, EngineShared};
use crate::notify::CqNotify;
use crate::park::Parker;

/// A completion queue: the consumer end of the engine's completion ring.
/// Dropping it destroys the CQ (with its last QP, if QPs still use it).
pub struct CompletionQueue {
    pub(super) id: u32,
    /// The engine (shard) that completes into it.
    pub(super) shard: usize,
    pub(super) ring: rtrb::Consumer<WorkCompletion>,
    /// The engine's command channel (None once destroyed).
    pub(super) cmd: Option<CommandTx>,
    /// The completion channel ([`super::Device::create_cq_with_channel`]).
    pub(super) notify: Option<Arc<CqNotify>>,
    /// Where [`Self::wait`] sleeps; the engine wakes it after each push.
    pub(super) waiter: Arc<Parker>,
    /// Until when [`Self::wait`] takes the core as shared and parks
    /// without spinning.
    pub(super) contended_until: Option<Instant>,
    /// A score of how often recent completions came within
    /// `SPIN_WHEN_SHARED` of the wait's start (up one for each that did,
    /// down one for each that did not; 0..=2 x [`QUICK_ANSWERS_TO_SPIN`]).
    pub(super) quick_answers: u8,
}

/// The score of quick completions from which [`CompletionQueue::wait`]
/// spins on a shared core.
const QUICK_ANSWERS_TO_SPIN: u8 = 8;

/// A gap this long between two looks at the clock of a spin (64 polls
/// apart, well under a microsecond) means that the thread was preempted:
/// something else wants its core.
const PREEMPTED: Duration = Duration::from_micros(30);
/// How long [`CompletionQueue::wait`] spins only [`SPIN_WHEN_SHARED`]
/// after it found its core shared; then it spins in full again (and finds
/// out again).
const CONTENDED_FOR: Duration = Duration::from_millis(50);
/// The spin of [`CompletionQueue::wait`] on a shared core: about three
/// round trips of a READ between two engines on one core (read_lat's
/// t_typical is 3 us), so that a latency test's answers are caught
/// spinning and only its tail parks.
const SPIN_WHEN_SHARED: Duration = Duration::from_micros(10);

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DestroyCq {
                cq: self.id,
                reply: None,
            });
        }
    }
}

impl CompletionQueue {
    /// The CQ's number on its engine (ids of destroyed CQs are reused).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Completions queued now (the engine may add more at any time).
    pub fn queued(&self) -> usize {
        self.ring.slots()
    }

    /// Entries the CQ holds (its depth).
    pub fn depth(&self) -> usize {
        self.ring.buffer().capacity()
    }

    /// Gives the CQ `depth` entries (`ibv_resize_cq(3)`), keeping the
    /// completions queued, in order. Refused with
    /// [`VerbsError::CqTooSmall`] when more completions are queued than
    /// `depth` (rxe: EINVAL); the CQ is then unchanged.
    pub fn resize(&mut self, depth: usize) -> Result<(), VerbsError> {
        let depth = depth.max(1);
        let queued = self.queued();
        if queued > depth {
            return Err(VerbsError::CqTooSmall { queued, depth });
        }
        let cmd = self.cmd.clone().ok_or(VerbsError::EngineGone)?;
        let (ring, new) = rtrb::RingBuffer::new(depth);
        // The program's end goes to the engine with the request and comes
        // back in the reply (`&mut self`: no poll runs in between).
        let (_, placeholder) = rtrb::RingBuffer::new(1);
        let old = std::mem::replace(&mut self.ring, placeholder);
        let id = self.id;
        let (ring, resized) = super::request(&cmd, |reply| Command::ResizeCq {
            cq: id,
            ring,
            new,
            old,
            reply,
        })?;
        self.ring = ring;
        if resized {
            Ok(())
        } else {
            Err(VerbsError::CqTooSmall {
                queued: self.queued(),
                depth,
            })
        }
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.ring.pop() {
                Ok(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// Takes one completion, if any.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        self.ring.pop().ok()
    }

    /// Polls for one completion for at most `timeout`: busy for
    /// [`SPIN_BEFORE_PARK`], then parked in the kernel until the engine
    /// pushes one (crate::park), so that a thread sharing the core (the
    /// engine, the peer of a ping-pong, anything else) runs meanwhile and
    /// this one runs again as soon as the completion is there. A
    /// completion costs the engine a system call only while this sleeps.
    ///
    /// While the core is shared (a spin was preempted: the scheduler ran
    /// something else in the middle of it, within the last
    /// `CONTENDED_FOR`), it spins only `SPIN_WHEN_SHARED` (a few round
    /// trips of the engines: a ping-pong's answer), and only while recent
    /// completions came that quickly, before it parks: a thread
    /// that spins on a shared core gets half of it in slices of
    /// milliseconds and misses its completions by that much, one that
    /// sleeps is run as soon as it is woken. On an idle core it spins, as
    /// waking a sleeping (in a VM: halted) CPU costs tens of microseconds.
    pub fn wait(&mut self, timeout: Duration) -> Option<WorkCompletion> {
        self.wait_until_queued(1, timeout)
            .then(|| self.poll_one())
            .flatten()
    }

    /// As [`Self::wait`], for a caller with `want` or more completions due
    /// (signaled requests outstanding): once it parks, it sleeps until
    /// `want` are queued (or `timeout` passes), not until the first, then
    /// takes up to `out.len()`; returns how many (0: timed out). As
    /// `ibv_modify_cq`'s `cq_count`: a bandwidth client that waits for half
    /// of its completions wakes half as often and still finds the other
    /// half of its requests in flight. While it spins it returns at the
    /// first completion. If fewer than `want` come, it sleeps until the
    /// timeout.
    pub fn wait_batch(
        &mut self,
        out: &mut [WorkCompletion],
        want: usize,
        timeout: Duration,
    ) -> usize {
        if self.wait_until_queued(want, timeout) {
            self.poll(out)
        } else {
            0
        }
    }

    /// The wait of [`Self::wait`] and [`Self::wait_batch`]: spins until
    /// one completion is queued, parks until `want` are; true if one is
    /// queued at the end.
    fn wait_until_queued(&mut self, want: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        let end = start + timeout;
        let shared = self.contended_until.is_some_and(|t| start < t);
        let spin = match (shared, self.quick_answers >= QUICK_ANSWERS_TO_SPIN) {
            (false, _) => SPIN_BEFORE_PARK,
            (true, true) => SPIN_WHEN_SHARED,
            (true, false) => Duration::ZERO,
        };
        let spin_end = start + spin.min(timeout);
        let mut last = start;
        // On the engine's CPU a spin only keeps the engine from the work
        // it waits for; checked again at each look at the clock, since
        // the kernel may move either thread.
        while !self.on_engine_cpu() {
            for _ in 0..64 {
                if !self.ring.is_empty() {
                    self.learn(start);
                    return true;
                }
                std::hint::spin_loop();
            }
            let now = Instant::now();
            if now - last >= PREEMPTED {
                self.contended_until = Some(now + CONTENDED_FOR);
                break;
            }
            last = now;
            if now >= spin_end {
                break;
            }
        }
        let want = want.clamp(1, self.ring.buffer().capacity());
        loop {
            let left = end.saturating_duration_since(Instant::now());
            self.waiter.prepare_for(want as u32);
            // Completions pushed before the flag was set did not wake us.
            if self.ring.slots() >= want || left.is_zero() {
                self.waiter.cancel();
            } else {
                self.waiter.park(Some(left));
            }
            if self.ring.slots() >= want {
                self.learn(start);
                return true;
            }
            if Instant::now() >= end {
                return !self.ring.is_empty();
            }
        }
    }

    /// Whether the calling thread runs on the CPU of an engine thread of
    /// this process (as far as the two last noted: [`crate::park::an_engine_runs_on`]),
    /// the one that completes into this CQ or another (the peer's in a
    /// loopback, another shard's): the kernel put the program beside a
    /// NIC, as it does on a host with fewer cores than busy threads (a
    /// woken waiter goes to its waker's CPU). A waiter there should park,
    /// not spin: while it spins that engine cannot run, and the work this
    /// CQ waits for may need it first.
    pub fn on_engine_cpu(&self) -> bool {
        super::on_an_engine_cpu()
    }

    /// Scores whether the completion [`Self::wait`] began waiting for at
    /// `start` came within [`SPIN_WHEN_SHARED`] (a spin on a shared core
    /// would have caught it) or later (the spin would only have taken CPU
    /// from the neighbour).
    fn learn(&mut self, start: Instant) {
        self.quick_answers = if start.elapsed() <= SPIN_WHEN_SHARED {
            (self.quick_answers + 1).min(2 * QUICK_ANSWERS_TO_SPIN)
        } else {
            self.quick_answers.saturating_sub(1)
        };
    }

    /// Sleeps until the engine pushes a completion or `timeout` passes
    /// (spurious returns are possible), then takes one if there is one: the
    /// park of [`Self::wait`], for a caller that spins on its own first
    /// (verbs-abi's `ibv_poll_cq` after a run of empty polls).
    pub fn park_for(&mut self, timeout: Duration) -> Option<WorkCompletion> {
        self.waiter.prepare();
        // A completion pushed before the flag was set did not wake us.
        if let Some(wc) = self.poll_one() {
            self.waiter.cancel();
            return Some(wc);
        }
        if timeout.is_zero() {
            self.waiter.cancel();
            return None;
        }
        self.waiter.park(Some(timeout));
        self.poll_one()
    }

    /// Asks the engine to signal the completion channel at the next
    /// completion (`ibv_req_notify_cq`); false without a channel.
    pub fn req_notify(&self) -> bool {
        self.notify.as_ref().inspect(|n| n.arm()).is_some()
    }

    /// As [`Self::req_notify`] for the next solicited completion only
    /// (`ibv_req_notify_cq(cq, 1)`: a receive whose message carried the
    /// BTH SE bit, or a completion in error).
    pub fn req_notify_solicited(&self) -> bool {
        self.notify
            .as_ref()
            .inspect(|n| n.arm_solicited())
            .is_some()
    }

    /// Takes one completion, sleeping in the kernel (not spinning) until
    /// one arrives or `timeout` passes: poll, arm, poll again, sleep on the
    /// completion channel (`ibv_get_cq_event`). Without a channel
    /// ([`super::Device::create_cq`]) it falls back to [`Self::wait`].
    pub fn wait_blocking(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        let Some(notify) = self.notify.clone() else {
            return Ok(self.wait(timeout));
        };
        let end = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll_one() {
                return Ok(Some(wc));
            }
            notify.arm();
            // A completion that came before the arm does not signal.
            if let Some(wc) = self.poll_one() {
                return Ok(Some(wc));
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            notify.wait(Some(left)).map_err(VerbsError::Channel)?;
        }
    }

    /// The completion channel's eventfd, for a program that waits in its
    /// own `epoll` (arm with [`Self::req_notify`] first).
    pub fn channel_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.notify.as_ref().map(|n| n.as_raw_fd())
    }
}

/// A device's async event queue ([`super::Device::events`]), one per engine
/// (shard) of the device, read as one.
///
/// Each engine's queue has an eventfd ([`Self::fds`]) that is readable
/// while the queue holds an event, so that a program can `poll` for events
/// (`ibv_context.async_fd`, `ibv_get_async_event(3)`): the engine signals
/// it after it sends; a taker resets it, takes, and signals it again if
/// events are left. Whatever the interleaving, a send after the reset is
/// followed by the engine's signal, and one before it is found by the
/// taker's look at what is left.
pub struct AsyncEvents {
    pub(super) engines: Vec<Arc<EngineShared>>,
}

impl AsyncEvents {
    /// The next event, if one is queued.
    pub fn try_next(&self) -> Option<AsyncEvent> {
        self.engines.iter().find_map(|e| {
            e.events_fd.reset();
            let ev = e.events.1.try_recv().ok();
            Self::resync(e);
            ev
        })
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        let mut sel = crossbeam_channel::Select::new();
        for e in &self.engines {
            sel.recv(&e.events.1);
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let op = sel.select_timeout(left).ok()?;
            let i = op.index();
            let e = &self.engines[i];
            if let Ok(ev) = op.recv(&e.events.1) {
                e.events_fd.reset();
                Self::resync(e);
                return Some(ev);
            }
            // That engine is gone; wait on the others.
            sel.remove(i);
        }
    }

    /// The descriptors that are readable while an event is queued, one per
    /// engine (level-triggered: for `poll` or an `epoll` set). Valid while
    /// the device lives.
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.engines
            .iter()
            .map(|e| e.events_fd.as_raw_fd())
            .collect()
    }

    /// After a reset: readable again if events are left.
    fn resync(e: &EngineShared) {
        if !e.events.1.is_empty() {
            e.events_fd.signal();
        }
    }
}
