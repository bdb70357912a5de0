//! What the engine does after anything touched a QP (a frame, a timer, a
//! doorbell), on the per-QP core shared with roce-sim (`qpcore::QpCore`,
//! docs/design.md "The per-QP core"): transport events into the CC and the
//! CC's answers back, completions into the CQ rings (a full CQ holds them in
//! the QP), a transport error reported, and the QP back where the scheduler
//! and the timer wheel should have it.

use qpcore::Completions;
use rdma::transport::{WcStatus, WorkCompletion};

use super::cq::CqRing;
use super::{Engine, QpSlot};
use crate::counters::Counters;
use crate::timer_wheel::{TimerKey, TimerKind};

impl Engine {
    /// Moves a QP's events into its CC, its completions into the CQs, and
    /// puts it back where the scheduler and the wheel should have it.
    pub(super) fn after_qp_work(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        if s.core.qp.is_none() {
            return;
        }
        if s.core.feed_events(now).fatal {
            s.fatal_pending = true;
        }
        self.deliver_completions(i);
        self.report_qp_error(i);
        self.requeue(i, now);
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        super::poll::sync_counters(s, &mut self.qp_sums);
        if s.doorbell_blocked {
            self.take_doorbells(i);
        }
    }

    /// QP `i`'s completions into its CQs, as long as both have room (a
    /// full CQ holds them in the QP instead of losing them, and the QP
    /// waits in `cq_waiting` until the program makes room).
    pub(super) fn deliver_completions(&mut self, i: usize) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        if !move_completions(&mut self.cqs, &mut self.counters, s) && !s.cq_waiting {
            s.cq_waiting = true;
            self.cq_waiting.push(i as u32);
            let (send, recv) = (s.send_cq, s.recv_cq);
            let full = [send, recv]
                .into_iter()
                .find(|&c| self.cqs[c as usize].slots() == 0);
            self.report_cq_full(full.unwrap_or(send), false);
        }
    }

    /// Puts connected QP `i` where it belongs after its state changed
    /// (`QpCore::requeue`): its timers on the wheel, its control packets in
    /// the scheduler's control ring, its pacing rate the CC's, and back on
    /// the round robin.
    pub(super) fn requeue(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        s.core
            .requeue(&mut self.sched, &mut self.wheel, timer_key(i), now);
    }

    /// Gives the QPs whose CQ was full their held completions, now that the
    /// program may have polled room free; those drained leave the list.
    #[cold]
    pub(super) fn retry_completions(&mut self) {
        let (qps, cqs, counters) = (&mut self.qps, &mut self.cqs, &mut self.counters);
        self.cq_waiting.retain(|&i| {
            let Some(s) = qps[i as usize].as_deref_mut() else {
                return false;
            };
            let drained = move_completions(cqs, counters, s);
            s.cq_waiting = !drained;
            !drained
        });
    }
}

/// The key of QP `i`'s timers on the wheel (the engine reuses a slot only
/// after its timers were cancelled, so no generation).
#[inline]
pub(super) fn timer_key(i: usize) -> TimerKey {
    TimerKey {
        qp: i as u32,
        kind: TimerKind::Retransmit,
        gen: 0,
    }
}

/// Moves QP `s`'s completions into its CQs while both have room; whether
/// none is left in the QP.
fn move_completions(cqs: &mut [CqRing], counters: &mut Counters, s: &mut QpSlot) -> bool {
    let mut rings = CqRings {
        cqs,
        counters,
        send_cq: s.send_cq,
        recv_cq: s.recv_cq,
    };
    s.core.move_completions(&mut rings)
}

/// Where a QP's completions go in the engine: its send or receive CQ ring
/// (by opcode), an error status counted.
struct CqRings<'a> {
    cqs: &'a mut [CqRing],
    counters: &'a mut Counters,
    send_cq: u32,
    recv_cq: u32,
}

impl Completions for CqRings<'_> {
    #[inline]
    fn has_room(&self) -> bool {
        let room = |c: u32| self.cqs.get(c as usize).is_some_and(|r| r.slots() > 0);
        room(self.send_cq) && room(self.recv_cq)
    }

    #[inline]
    fn complete(&mut self, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.counters.completion_errors += 1;
        }
        let cq = if wc.opcode.is_recv() {
            self.recv_cq
        } else {
            self.send_cq
        };
        let _ = self.cqs[cq as usize].push(wc);
    }
}
