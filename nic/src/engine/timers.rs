//! Timers: every QP's transport timer (retransmit or RNR) and CC timers
//! (LDCP tick, DCQCN alpha and rate increase, HPCC++ probe timeout) on one
//! timing wheel (DESIGN.md §5: O(1) per timer whatever the number of QPs).

use cc::{CongestionControl, TimerKind};
use rdma::transport::Qp;
use sched::qp_cc::CC_TIMERS;

use super::{Engine, QpSlot, MAX_QPS};
use crate::timer_wheel::{TimerHandle, TimerKey, TimerKind as WheelKind, TimerWheel};

/// Timer wheel of the transport and CC timers: 1 us ticks, 4096 slots (one
/// rotation is 4 ms; the 67 ms retransmit timer waits in the overflow list).
const TIMER_TICK_NS: u64 = 1_000;
const TIMER_SLOTS: usize = 4096;
/// Timers per QP on the wheel: the transport's (retransmit or RNR) and the
/// four CC timers.
const TIMERS_PER_QP: usize = 5;

/// An engine's wheel, starting at `now` ns.
pub(super) fn wheel(now: u64) -> TimerWheel<TimerKey> {
    TimerWheel::with_start(TIMER_TICK_NS, TIMER_SLOTS, MAX_QPS * TIMERS_PER_QP, now)
}

/// The CC timer kinds and the wheel's name for each, by the slot
/// `sched::qp_cc::timer_index` gives them (the glue shared with roce-sim).
const TIMER_KINDS: [TimerKind; 4] = {
    let c = CC_TIMERS;
    [c[0].0, c[1].0, c[2].0, c[3].0]
};
const WHEEL_KINDS: [WheelKind; 4] = {
    let c = CC_TIMERS;
    [c[0].1, c[1].1, c[2].1, c[3].1]
};

/// Makes sure one timer fires no later than `want`; O(1). Lazily: a timer
/// armed earlier than wanted is left alone (the retransmit deadline moves
/// later on every ACK), and one no longer wanted is left to fire; the
/// handler ([`Engine::timers`]) acts only on what is really due and re-arms
/// for the real deadline. So the wheel is touched about once per timeout,
/// not once per packet.
#[inline]
fn arm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    want: Option<u64>,
    key: TimerKey,
) {
    // `armed` is Some exactly while its entry is on the wheel: the handler
    // clears it when the entry fires, and nothing cancels one (so no wheel
    // lookup, a likely cache miss, on this per-packet path).
    match (*armed, want) {
        (Some((_, at)), Some(w)) if at <= w => {}
        (_, None) => {}
        (cur, Some(w)) => rearm(wheel, armed, cur, w, key),
    }
}

/// The rare half of [`arm`]: a deadline earlier than the armed one, or none
/// armed.
#[cold]
fn rearm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    cur: Option<(TimerHandle, u64)>,
    want: u64,
    key: TimerKey,
) {
    *armed = match cur {
        Some((h, _)) if wheel.reschedule(h, want).is_ok() => Some((h, want)),
        _ => wheel.schedule(want, key).ok().map(|h| (h, want)),
    };
}

/// Puts a QP's timers on the wheel where their deadlines changed: the
/// transport's next timer (retransmit or RNR) and each armed CC timer.
pub(super) fn sync_timers(wheel: &mut TimerWheel<TimerKey>, i: usize, s: &mut QpSlot) {
    let key = |kind| TimerKey {
        qp: i as u32,
        kind,
        gen: 0,
    };
    let want = s.qp.as_ref().and_then(Qp::next_timer);
    arm(
        wheel,
        &mut s.transport_timer,
        want,
        key(WheelKind::Retransmit),
    );
    for ((armed, &d), &kind) in s.cc_armed.iter_mut().zip(&s.cc_timers).zip(&WHEEL_KINDS) {
        arm(wheel, armed, (d != 0).then_some(d), key(kind));
    }
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
            let Some(qp) = s.qp.as_mut() else { continue };
            if key.kind == WheelKind::Retransmit {
                s.transport_timer = None;
                if qp.next_timer().is_some_and(|t| t <= now) {
                    qp.on_timer(now);
                }
            } else if let Some(k) = WHEEL_KINDS.iter().position(|&w| w == key.kind) {
                s.cc_armed[k] = None;
                let d = s.cc_timers[k];
                if d != 0 && d <= now {
                    s.cc_timers[k] = 0;
                    let a = s.cc.on_timer(now, TIMER_KINDS[k]);
                    s.apply(a);
                    s.update_window();
                }
            }
            // Moves events and completions on and re-arms what is still due.
            self.after_qp_work(i, now);
        }
    }
}
