//! The windows of the parallel event loop: the coordinator that runs between them
//! (message hand-over, flow set-up, the next window) and the threads that run the
//! partitions' share of each window (see the parent module).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

use super::{own, FlowResult, FlowSetup, Layout, Part, RunConfig};
use crate::event::Event;
use crate::workload::Flow;

/// The coordinator's state: what is decided between windows.
pub(super) struct Coord {
    pub(super) flows: Vec<Flow>,
    pub(super) results: Vec<FlowResult>,
    /// Flow start attempts `(time, flow)` not yet set up.
    pub(super) pending: BinaryHeap<Reverse<(u64, u32)>>,
    pub(super) rng: switch::Rng,
    pub(super) cfg: RunConfig,
    pub(super) layout: std::sync::Arc<Layout>,
    pub(super) lookahead: u64,
    pub(super) done: usize,
    pub(super) windows: u64,
    pub(super) next_progress: u64,
}

impl Coord {
    /// Between windows (every partition stopped at `end`): hands the messages over,
    /// sets up the flows starting in the next window and returns its start and end,
    /// or `None` when the run is over.
    pub(super) fn between(
        &mut self,
        parts: &mut [&mut Part],
        end: u64,
        progress: &mut dyn FnMut(u64, usize, usize),
    ) -> Option<(u64, u64)> {
        // Each partition's messages and returned buffers to their partitions (handed
        // over whole: the receivers sort and deliver them at the next window's start).
        let n = parts.len();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let (pa, pb) = if a < b {
                    let (x, y) = parts.split_at_mut(b);
                    (&mut *x[a], &mut *y[0])
                } else {
                    let (x, y) = parts.split_at_mut(a);
                    (&mut *y[0], &mut *x[b])
                };
                std::mem::swap(&mut pa.outbox[b], &mut pb.inbox[a]);
                std::mem::swap(&mut pa.give_back[b], &mut pb.taken_back[a]);
            }
        }
        self.windows += 1;
        let total = self.flows.len();
        self.done = parts.iter().map(|p| p.done).sum();
        let events: u64 = parts.iter().map(|p| p.q.popped()).sum();
        if events >= self.next_progress {
            self.next_progress = (events | 0xF_FFFF) + 1;
            progress(end, self.done, total);
        }
        if self.done >= total || end > self.cfg.max_time_ns {
            return None;
        }
        // Nothing scheduled: jump to the next flow start (or stop).
        let idle = parts
            .iter()
            .all(|p| p.q.is_empty() && p.inbox.iter().all(Vec::is_empty));
        let start = if idle {
            let &Reverse((t, _)) = self.pending.peek()?;
            t.max(end)
        } else {
            end
        };
        let next = (start + self.lookahead).min(self.cfg.max_time_ns.saturating_add(1));
        while let Some(&Reverse((t, f))) = self.pending.peek() {
            if t >= next {
                break;
            }
            self.pending.pop();
            self.open_flow(parts, f as usize, t);
        }
        Some((start, next))
    }

    /// Allocates flow `f`'s two QPs (at `t`, in the next window) and schedules its
    /// start at both ends; with no QP free at one end it gives back the other
    /// end's and tries again 10 us later.
    fn open_flow(&mut self, parts: &mut [&mut Part], f: usize, t: u64) {
        let Flow {
            src, dst, bytes, ..
        } = self.flows[f];
        let sp = usize::from(self.layout.host_part[src as usize]);
        let dp = usize::from(self.layout.host_part[dst as usize]);
        // Counted by the NIC that has none free.
        let Some((rq, rpsn)) = own(&mut parts[dp].nics, dst as usize).open_qp() else {
            self.pending.push(Reverse((t + 10_000, f as u32)));
            return;
        };
        let Some((sq, spsn)) = own(&mut parts[sp].nics, src as usize).open_qp() else {
            own(&mut parts[dp].nics, dst as usize).give_back_unconnected_qp(rq);
            self.pending.push(Reverse((t + 10_000, f as u32)));
            return;
        };
        // The UDP source port is the ECMP key: random per flow, in RoCEv2's range.
        let sport = 0xC000 | (self.rng.next_u32() as u16 & 0x3FFF);
        let setup = FlowSetup {
            src,
            dst,
            bytes,
            sq,
            spsn,
            rq,
            rpsn,
            sport,
        };
        let r = &mut self.results[f];
        r.start = t;
        r.sqpn = sq;
        r.rqpn = rq;
        parts[dp].setup[f] = setup;
        parts[dp].q.push(t, Event::FlowAccept(f as u32));
        parts[sp].setup[f] = setup;
        parts[sp].q.push(t, Event::FlowStart(f as u32));
    }
}

/// CPU time of the calling thread (user + system), for reporting only: on a shared
/// machine it is what the run would take alone, where wall time is not. Linux's
/// `/proc/thread-self/stat` in clock ticks of 1/100 s.
pub fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

pub(super) type Progress<'a> = &'a mut dyn FnMut(u64, usize, usize);
pub(super) type PanicPayload = Box<dyn std::any::Any + Send>;

/// What the threads of one run share.
pub(super) struct Shared<'a> {
    pub(super) parts: &'a [Mutex<Part>],
    pub(super) barrier: Barrier,
    /// Start and end of the current window (set by thread 0 between windows).
    pub(super) window_start: AtomicU64,
    pub(super) window_end: AtomicU64,
    pub(super) stop: AtomicBool,
    /// A partition or the coordinator panicked: stop after this window.
    pub(super) failed: AtomicBool,
    pub(super) threads: usize,
}

fn lock(p: &Mutex<Part>) -> std::sync::MutexGuard<'_, Part> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared<'_> {
    /// Thread `tid`'s loop: its partitions' share of every window (partitions
    /// `tid`, `tid + threads`, ...); thread 0 also runs the coordinator between
    /// windows while the others wait at the barrier. Returns the thread's CPU
    /// seconds and the panic of one of its partitions or of the coordinator: a
    /// panic stops every thread after the window (none is left at the barrier).
    pub(super) fn worker(
        &self,
        tid: usize,
        mut coord: Option<(&mut Coord, Progress<'_>)>,
    ) -> (Option<f64>, Option<PanicPayload>) {
        let cpu0 = thread_cpu_seconds();
        let mut panic = None;
        self.coordinate(0, &mut coord, &mut panic);
        self.wait();
        while !self.stop.load(Ordering::SeqCst) {
            let start = self.window_start.load(Ordering::SeqCst);
            let end = self.window_end.load(Ordering::SeqCst);
            self.guarded(&mut panic, || {
                for p in (tid..self.parts.len()).step_by(self.threads) {
                    let mut part = lock(&self.parts[p]);
                    part.deliver(start);
                    part.run_until(end);
                }
            });
            self.wait();
            self.coordinate(end, &mut coord, &mut panic);
            self.wait();
        }
        let cpu = thread_cpu_seconds().zip(cpu0).map(|(b, a)| b - a);
        (cpu, panic)
    }

    /// Runs `f` unless this thread already panicked; keeps its panic.
    fn guarded(&self, panic: &mut Option<PanicPayload>, f: impl FnOnce()) {
        if panic.is_some() {
            return;
        }
        if let Err(e) = catch_unwind(AssertUnwindSafe(f)) {
            self.failed.store(true, Ordering::SeqCst);
            *panic = Some(e);
        }
    }

    /// The coordinator's turn on thread 0 (a no-op elsewhere).
    fn coordinate(
        &self,
        end: u64,
        coord: &mut Option<(&mut Coord, Progress<'_>)>,
        panic: &mut Option<PanicPayload>,
    ) {
        if coord.is_none() {
            return;
        }
        self.guarded(panic, || self.between(end, coord));
        if self.failed.load(Ordering::SeqCst) {
            self.stop.store(true, Ordering::SeqCst);
        }
    }

    fn wait(&self) {
        if self.threads > 1 {
            self.barrier.wait();
        }
    }

    /// The coordinator's turn (thread 0 only), every partition at rest.
    fn between(&self, end: u64, coord: &mut Option<(&mut Coord, Progress<'_>)>) {
        let Some((c, progress)) = coord.as_mut() else {
            return;
        };
        let mut guards: Vec<_> = self.parts.iter().map(lock).collect();
        let mut refs: Vec<&mut Part> = guards.iter_mut().map(|g| &mut **g).collect();
        let next = if self.failed.load(Ordering::SeqCst) {
            None
        } else {
            c.between(&mut refs, end, &mut **progress)
        };
        match next {
            Some((start, end)) => {
                self.window_start.store(start, Ordering::SeqCst);
                self.window_end.store(end, Ordering::SeqCst);
            }
            None => self.stop.store(true, Ordering::SeqCst),
        }
    }
}
