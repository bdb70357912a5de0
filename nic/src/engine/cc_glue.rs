//! The glue between a QP's transport, its congestion control and the flow
//! scheduler (DESIGN.md §5, §7): transport events (ACK, NAK, timeout, CNP,
//! probe response) and received data become CC calls; the CC's answers
//! (window, rate, timers, CNPs, probes) go back to the transport, the
//! scheduler and the timer wheel; completions go to the CQs.
//!
//! [`Engine::after_qp_work`] runs after anything touched a QP (a frame, a
//! timer, a doorbell); each of its steps is a small function below.

use cc::{CcKind, CongestionControl};
use rdma::transport::qp::QpEvent;
use rdma::transport::{Qp, TxPacket, WcOpcode, WcStatus};
use rdma::wire::RoceFrame;
use sched::qp_cc;

use super::cq::CqRing;
use super::timers::sync_timers;
use super::{Engine, QpSlot};
use crate::counters::Counters;

impl Engine {
    /// Moves a QP's events into its CC, its completions into the CQs, and
    /// puts it back where the scheduler and the wheel should have it.
    pub(super) fn after_qp_work(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        if s.qp.is_none() {
            return;
        }
        feed_events(s, now);
        // Completions, as long as both CQs have room (a full CQ holds them
        // in the QP instead of losing them, and the QP waits in `cq_waiting`
        // until the program makes room).
        if !move_completions(&mut self.cqs, &mut self.counters, s) && !s.cq_waiting {
            s.cq_waiting = true;
            self.cq_waiting.push(i as u32);
            let (send, recv) = (s.send_cq, s.recv_cq);
            let full = [send, recv]
                .into_iter()
                .find(|&c| self.cqs[c as usize].slots() == 0);
            self.report_cq_full(full.unwrap_or(send), false);
        }
        self.report_qp_error(i);
        self.requeue(i, now);
        if self.qps[i].as_ref().is_some_and(|s| s.doorbell_blocked) {
            self.take_doorbells(i);
        }
    }

    /// Puts connected QP `i` where it belongs after its state changed: its
    /// timers on the wheel, its control packets in the scheduler's control
    /// ring, its pacing rate the CC's, and back on the round robin (new work
    /// may have become sendable: a window opened, an RNR wait ended, a READ
    /// to answer; the QP leaves it again when `poll_tx` finds nothing).
    pub(super) fn requeue(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        let Some(qp) = s.qp.as_ref() else { return };
        let control = s.cnp_pending || qp.has_control();
        sync_timers(&mut self.wheel, i, s);
        let q = i as u32;
        if control && !s.ctrl_queued {
            // One entry per QP at most, in a ring of MAX_QPS: never full.
            s.ctrl_queued = self.sched.push_control(q).is_ok();
        }
        let rate = s.cc.rate_bps();
        if rate != s.sched_rate {
            // First requeue after a (re)start, or the CC's rate changed. A QP
            // without CC takes the scheduler's quantum (NIC_QUANTUM_BYTES):
            // runs of its packets let the receiver coalesce ACKs.
            s.sched_rate = rate;
            let _ = self.sched.set_rate(q, rate, now);
            let _ = self.sched.set_uses_quantum(q, s.cc.kind() == CcKind::None);
        }
        let _ = self.sched.mark_ready(q, s.next_bytes);
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

/// Feeds every event the transport raised into the CC, and the CC's
/// answers back; the transport's window follows the CC's.
fn feed_events(s: &mut QpSlot, now: u64) {
    let mut events = 0;
    while let Some(ev) = s.qp.as_mut().and_then(Qp::poll_event) {
        events += 1;
        let a = on_event(s, &ev, now);
        s.apply(a);
    }
    if events > 0 {
        s.update_window();
    }
}

/// The CC's answer to one transport event (`sched::qp_cc`, shared with
/// roce-sim), after the engine's own part: a QP without CC backs off on
/// go-back-N rounds and grows back on ACKs; an error makes the QP fatal.
fn on_event(s: &mut QpSlot, ev: &QpEvent, now: u64) -> cc::Actions {
    match *ev {
        QpEvent::Ack { newly_acked, .. } => {
            if let Some(b) = s.backoff.as_mut() {
                b.on_ack(newly_acked);
            }
        }
        QpEvent::Error => s.fatal_pending = true,
        _ if qp_cc::is_go_back_n(ev) => s.go_back_n(),
        _ => {}
    }
    qp_cc::on_event(&mut s.cc, &mut s.rtt_probe, ev, now)
}

/// The receiver side of the CC for a data packet received (DCQCN
/// notification point, Rx-HPCC NewINT): its CE mark and its telemetry.
pub(super) fn on_rx_data(s: &mut QpSlot, f: &RoceFrame<'_>, now: u64) {
    let a = qp_cc::on_rx_data(&mut s.cc, f, now);
    s.apply(a);
}

/// Tells the CC of a data packet about to be sent, applies its answer (a
/// fast-start packet goes Not-ECT, LDCP draft) and starts an RTT sample
/// when none is running.
pub(super) fn on_data_sent(s: &mut QpSlot, pkt: &mut TxPacket, now: u64) {
    let a = qp_cc::on_data_sent(&mut s.cc, &mut s.rtt_probe, pkt, now);
    s.apply(a);
}

/// Moves QP `s`'s completions into its CQs while both have room; whether
/// none is left in the QP.
fn move_completions(cqs: &mut [CqRing], counters: &mut Counters, s: &mut QpSlot) -> bool {
    let Some(qp) = s.qp.as_mut() else {
        return true;
    };
    loop {
        let room = |c: u32| cqs.get(c as usize).is_some_and(|r| r.slots() > 0);
        if !(room(s.send_cq) && room(s.recv_cq)) {
            return qp.pending_completions() == 0;
        }
        let Some(wc) = qp.poll_cq() else { return true };
        if wc.status != WcStatus::Success {
            counters.completion_errors += 1;
        }
        let cq = if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            s.recv_cq
        } else {
            s.send_cq
        };
        let _ = cqs[cq as usize].push(wc);
    }
}

impl QpSlot {
    /// Applies the CC's answer: timers to arm, a CNP to send, the window to
    /// feed back (Rx-HPCC), a probe to send (HPCC++ probe mode).
    pub(super) fn apply(&mut self, a: cc::Actions) {
        qp_cc::apply(
            a,
            self.qp.as_mut(),
            &mut self.cc_timers,
            &mut self.cnp_pending,
        );
    }

    /// The transport's send window: the CC's, or for CC `none` the
    /// go-back-N backoff's.
    pub(super) fn update_window(&mut self) {
        let w = qp_cc::window(&self.cc, self.backoff.as_ref());
        if let Some(qp) = self.qp.as_mut() {
            qp.set_window(w);
        }
    }

    /// A go-back-N round began (a sequence error NAK or a retransmit
    /// timeout): the backoff of a QP without CC shrinks its window.
    fn go_back_n(&mut self) {
        let in_flight = self.qp.as_ref().map_or(0, Qp::in_flight);
        if let Some(b) = self.backoff.as_mut() {
            b.on_go_back_n(in_flight);
        }
    }
}
