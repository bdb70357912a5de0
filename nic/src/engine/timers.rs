//! Timers: every QP's transport timer (retransmit or RNR) and CC timers
//! (LDCP tick, DCQCN alpha and rate increase, HPCC++ probe timeout) on one
//! timing wheel (docs/design.md "The engine's loop": O(1) per timer whatever
//! the number of QPs). The per-QP core arms them (`QpCore::sync_timers`) and
//! acts on them (`QpCore::on_timer`).

use qpcore::{TIMERS_PER_QP, TIMER_SLOTS, TIMER_TICK_NS};

use super::{Engine, MAX_QPS};
use crate::timer_wheel::{TimerKey, TimerWheel};

/// An engine's wheel, starting at `now` ns.
pub(super) fn wheel(now: u64) -> TimerWheel<TimerKey> {
    TimerWheel::with_start(TIMER_TICK_NS, TIMER_SLOTS, MAX_QPS * TIMERS_PER_QP, now)
}

impl Engine {
    /// Fires the timers due on the wheel (O(1) per timer, whatever the
    /// number of QPs): the transport's retransmit/RNR timer and the CC timers.
    pub(super) fn timers(&mut self, now: u64) {
        self.wheel.expire(now);
        while let Some(key) = self.wheel.pop_ready() {
            let i = key.qp as usize;
            let Some(s) = self.slot_mut(i) else {
                continue;
            };
            if !s.core.on_timer(key.kind, now) {
                continue;
            }
            // Moves events and completions on and re-arms what is still due.
            self.after_qp_work(i, now);
        }
    }
}
