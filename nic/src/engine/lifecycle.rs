//! The verbs lifecycle on the engine's side (IBA 10.3.1 QP states, as
//! `ibv_modify_qp` / `ibv_destroy_*` and rxe's `rxe_qp.c` do it):
//! moving a QP through RESET, INIT, RTR, RTS and ERR; destroying QPs and
//! CQs (a CQ a QP still uses is refused, EBUSY) and checking a PD is empty;
//! and the async events the program reads from `Device::events`
//! (`ibv_get_async_event`): QP fatal, CQ overrun, port up and down.
//!
//! Served on the slow path. What the hot path does here is queue an event
//! into a preallocated list ([`Lifecycle::queue`]); the slow path hands the
//! list to the program's channel.

use cc::PathConfig;
use rdma::transport::{Qp, QpConfig, QpError, QpState};

use super::cq::CqRing;
use super::Engine;
use crate::contract::{AsyncEvent, Command, EngineError, QpTransition, ASYNC_EVENT_QUEUE, MAX_QPS};
use crate::counters::Counters;

/// How often the slow path looks at the port's link, ns.
const LINK_CHECK_EVERY_NS: u64 = 10_000_000;

/// The engine's lifecycle state besides the QP slots.
pub(super) struct Lifecycle {
    /// Async events not yet handed to the program (capacity
    /// [`ASYNC_EVENT_QUEUE`], never grown).
    events: Vec<AsyncEvent>,
    /// QP index `i` was destroyed while its index waited in the
    /// scheduler's control ring: a QP created in the slot owns that entry.
    ctrl_orphan: Vec<bool>,
    /// The link state last seen (None: not looked at yet).
    link_up: Option<bool>,
    next_link_check_ns: u64,
}

impl Lifecycle {
    pub(super) fn new() -> Self {
        Lifecycle {
            events: Vec::with_capacity(ASYNC_EVENT_QUEUE),
            ctrl_orphan: vec![false; MAX_QPS],
            link_up: None,
            next_link_check_ns: 0,
        }
    }

    /// Queues an async event for the program; counted and dropped when the
    /// program has not taken the last [`ASYNC_EVENT_QUEUE`]. Never allocates.
    pub(super) fn queue(&mut self, ev: AsyncEvent, counters: &mut Counters) {
        if self.events.len() < self.events.capacity() {
            self.events.push(ev);
        } else {
            counters.async_event_drops += 1;
        }
    }

    /// Whether a QP created in slot `i` takes over a control-ring entry a
    /// destroyed QP left (and clears the mark).
    pub(super) fn take_ctrl_orphan(&mut self, i: usize) -> bool {
        std::mem::take(&mut self.ctrl_orphan[i])
    }

    /// The control-ring entry of a destroyed QP came out of the ring.
    pub(super) fn clear_ctrl_orphan(&mut self, i: usize) {
        if let Some(o) = self.ctrl_orphan.get_mut(i) {
            *o = false;
        }
    }
}

impl Engine {
    /// The lifecycle's turn of the slow path: hands queued async events to
    /// the program's channel and watches the port's link.
    pub(super) fn lifecycle_turn(&mut self, now: u64) {
        if now >= self.life.next_link_check_ns {
            self.life.next_link_check_ns = now + LINK_CHECK_EVERY_NS;
            if let Some(up) = self
                ._port
                .as_ref()
                .and_then(|p| p.link().ok())
                .map(|l| l.up)
            {
                if self.life.link_up.is_some_and(|was| was != up) {
                    let ev = if up {
                        AsyncEvent::PortActive
                    } else {
                        AsyncEvent::PortDown
                    };
                    self.life.queue(ev, &mut self.counters);
                }
                self.life.link_up = Some(up);
            }
        }
        let mut sent = false;
        for ev in self.life.events.drain(..) {
            if self.shared.events.0.try_send(ev).is_err() {
                self.counters.async_event_drops += 1;
            } else {
                sent = true;
            }
        }
        if sent {
            // After the sends: a program woken by the descriptor finds them.
            self.shared.events_fd.signal();
        }
    }

    /// Serves the lifecycle's slow-path commands (the others are served in
    /// slow_path.rs and ignored here).
    pub(super) fn lifecycle_command(&mut self, cmd: Command) {
        match cmd {
            Command::ModifyQp {
                qpn,
                to,
                peer_sr,
                reply,
            } => {
                let _ = reply.send(self.modify_qp(qpn, to, peer_sr));
            }
            Command::DestroyQp { qpn, reply } => {
                let r = self.destroy_qp(qpn);
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            Command::DestroyCq { cq, reply } => {
                let dropped = reply.is_none();
                let r = self.destroy_cq(cq, dropped);
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            Command::DeallocPd { pd, reply } => {
                let _ = reply.send(self.dealloc_pd(pd));
            }
            _ => {}
        }
    }

    /// QP index of `qpn`, if the QP exists.
    fn qp_index(&self, qpn: u32) -> Result<usize, EngineError> {
        qpn.checked_sub(self.qpn_base)
            .map(|i| i as usize)
            .filter(|&i| self.qps.get(i).is_some_and(Option::is_some))
            .ok_or(EngineError::NoSuchQp(qpn))
    }

    /// Creates a CQ around `ring`, in the lowest free id.
    pub(super) fn create_cq(&mut self, ring: CqRing) -> u32 {
        match self.cqs.iter().position(|c| !c.in_use()) {
            Some(id) => {
                self.cqs[id] = ring;
                id as u32
            }
            None => {
                self.cqs.push(ring);
                self.cqs.len() as u32 - 1
            }
        }
    }

    fn cq_used(&self, cq: u32) -> bool {
        self.qps
            .iter()
            .flatten()
            .any(|s| s.send_cq == cq || s.recv_cq == cq)
    }

    /// Destroys CQ `cq`; refused while a QP uses it, unless the program
    /// dropped the handle (`dropped`): then it is freed with its last QP.
    pub(super) fn destroy_cq(&mut self, cq: u32, dropped: bool) -> Result<(), EngineError> {
        if !self.cqs.get(cq as usize).is_some_and(CqRing::in_use) {
            return Err(EngineError::NoSuchCq(cq));
        }
        if self.cq_used(cq) {
            if !dropped {
                return Err(EngineError::CqBusy(cq));
            }
            self.cqs[cq as usize].orphaned = true;
            return Ok(());
        }
        self.cqs[cq as usize].free();
        Ok(())
    }

    /// Refuses to deallocate a PD that still holds a region or a QP.
    pub(super) fn dealloc_pd(&self, pd: u32) -> Result<(), EngineError> {
        if self.mrs.any_in_pd(pd) || self.qps.iter().flatten().any(|s| s.pd == pd) {
            return Err(EngineError::PdBusy(pd));
        }
        Ok(())
    }

    /// Destroys a QP: its timers leave the wheel, it leaves the scheduler
    /// and every list, and its slot is free (work in flight is dropped, as
    /// `ibv_destroy_qp` does). A dropped CQ it was the last user of goes too.
    pub(super) fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        let i = self.qp_index(qpn)?;
        self.detach(i);
        let s = self.qps[i].take().expect("qp_index checked it");
        if s.core.ctrl_queued {
            self.life.ctrl_orphan[i] = true;
        }
        if let Some(q) = s
            .opts
            .srq
            .and_then(|k| self.srqs.get_mut(k as usize))
            .and_then(Option::as_mut)
        {
            q.users -= 1;
        }
        self.counters.qps_live = self.counters.qps_live.saturating_sub(1);
        for cq in [s.send_cq, s.recv_cq] {
            if self.cqs.get(cq as usize).is_some_and(|c| c.orphaned) && !self.cq_used(cq) {
                self.cqs[cq as usize].free();
            }
        }
        Ok(())
    }

    /// Takes QP `i` out of the wheel, the scheduler and the engine's lists
    /// (its slot stays).
    fn detach(&mut self, i: usize) {
        let now = self.clock.now_ns();
        if let Some(k) = self.connected.iter().position(|&c| c == i) {
            // What its transport counted stays in the device's counters.
            self.sync_qp_counters(i);
            self.connected.swap_remove(k);
        }
        if let Some(s) = self.qps[i].as_deref_mut() {
            s.core.cancel_timers(&mut self.wheel);
            s.cq_waiting = false;
        }
        let _ = self.sched.reset_qp(i as u32, now);
        self.cq_waiting.retain(|&c| c as usize != i);
    }

    /// `ibv_modify_qp` to `to`, if IBA 10.3.1 allows it from the QP's state.
    pub(super) fn modify_qp(
        &mut self,
        qpn: u32,
        to: QpTransition,
        peer_sr: bool,
    ) -> Result<(), EngineError> {
        let i = self.qp_index(qpn)?;
        let from = {
            let s = self.qps[i].as_deref().expect("qp_index checked it");
            s.core.qp.as_ref().map_or(s.idle_state, Qp::state)
        };
        let transport = |source| EngineError::Transport { qpn, source };
        let illegal = |to| transport(QpError::IllegalTransition { from, to });
        match to {
            QpTransition::Reset => self.reset(i),
            QpTransition::Init => match from {
                QpState::Reset | QpState::Init => {
                    self.slot_mut(i).expect("checked").idle_state = QpState::Init
                }
                _ => return Err(illegal(QpState::Init)),
            },
            QpTransition::Rtr(remote) => {
                if from != QpState::Init {
                    return Err(illegal(QpState::Rtr));
                }
                self.slot_mut(i).expect("checked").stop_at_rtr = true;
                let r = self.connect(qpn, &remote, peer_sr);
                if let Some(s) = self.slot_mut(i) {
                    s.stop_at_rtr = false;
                }
                r?;
            }
            QpTransition::Rts => {
                let s = self.slot_mut(i).expect("checked");
                let qp = s.core.qp.as_mut().ok_or_else(|| illegal(QpState::Rts))?;
                qp.modify(QpState::Rts).map_err(transport)?;
                self.shared.ring_doorbell(qpn);
            }
            QpTransition::Err => {
                let s = self.slot_mut(i).expect("checked");
                s.err_by_program = true;
                if s.core.qp.is_none() {
                    // Never connected: a transport without a peer, only to
                    // flush what is posted and what will be.
                    let cfg = QpConfig {
                        qpn,
                        pmtu: s.opts.mtu,
                        sq_depth: s.opts.sq_depth,
                        rq_depth: s.opts.rq_depth,
                        pd: s.pd,
                        srq: s.opts.srq.is_some(),
                        ..QpConfig::default()
                    };
                    s.core.qp = Some(Qp::new(cfg).map_err(transport)?);
                }
                let qp = s.core.qp.as_mut().expect("set above");
                qp.modify(QpState::Err).map_err(transport)?;
                let now = self.clock.now_ns();
                self.after_qp_work(i, now);
                // Work requests still in the doorbell ring are flushed too.
                self.shared.ring_doorbell(qpn);
            }
        }
        Ok(())
    }

    /// RESET: the QP drops its transport, its queued work (without
    /// completions, IBA 10.3.1) and its CC state, and may go to INIT again.
    fn reset(&mut self, i: usize) {
        self.detach(i);
        let path = |s: &super::QpSlot| PathConfig {
            line_rate_bps: self.line_rate_bps,
            base_rtt_ns: self.base_rtt_ns,
            mtu_bytes: s.opts.mtu,
        };
        let Some(s) = self.qps[i].as_deref() else {
            return;
        };
        let cc = s.opts.cc.build(path(s));
        let s = self.qps[i].as_deref_mut().expect("checked above");
        while s.doorbell.pop().is_ok() {}
        s.core.qp = None;
        s.tpl = None;
        s.core.fb.int = None;
        s.core.cc = cc;
        s.idle_state = QpState::Reset;
        s.err_by_program = false;
        s.fatal_pending = false;
        s.doorbell_blocked = false;
        s.core.rtt_probe = None;
        s.core.cnp_pending = false;
        s.core.sched_rate = None;
        // `detach` added what the old transport counted; a transport made
        // later (by `connect`, or to flush an ERR) counts from here.
        super::poll::take_baseline(s);
    }

    /// After a QP's events went to its CC: a QP that went to ERR on its own
    /// is reported (`IBV_EVENT_QP_FATAL`).
    pub(super) fn report_qp_error(&mut self, i: usize) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        if std::mem::take(&mut s.fatal_pending) && !s.err_by_program {
            let qpn = self.qpn_base + i as u32;
            self.life
                .queue(AsyncEvent::QpFatal { qpn }, &mut self.counters);
        }
    }

    /// QP `i`'s completions wait because one of its CQs is full
    /// (`IBV_EVENT_CQ_ERR`; `lost`: a completion could not be held).
    pub(super) fn report_cq_full(&mut self, cq: u32, lost: bool) {
        self.life
            .queue(AsyncEvent::CqOverrun { cq, lost }, &mut self.counters);
    }
}
