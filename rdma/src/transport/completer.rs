//! The completer (Linux rxe `rxe_comp.c`; IBA vol. 1 9.7.5.1 "ACK processing",
//! 9.7.5.2 NAK codes, 9.7.6 retry): what the requester hears back. Cumulative ACKs
//! complete SEND/WRITE WQEs, READ responses and ATOMIC ACKs complete theirs (and
//! implicitly acknowledge every earlier PSN), a PSN sequence NAK or a response gap
//! moves the requester's cursor back (go-back-N, implied NAK 9.7.5.1.3), an RNR NAK
//! waits its timer (9.7.5.2.8), an error NAK fails the WQE, and the retransmit timer
//! counts retries down to RETRY_EXC_ERR.

use super::config::{QpConfig, RNR_RETRY_INFINITE};
use super::mr::MemorySpace;
use super::output::{Outputs, QpEvent};
use super::requester::Requester;
use super::sgl::{self, SglStore};
use super::wc::{SendOp, WcStatus, WorkCompletion};
use crate::wire::bth::Opcode;
use crate::wire::ccext::CcExtRepr;
use crate::wire::frame::RoceFrame;
use crate::wire::psn;
use crate::wire::transport_hdrs::{rnr_timer_ns, AethSyndrome, NakCode};

mod selective;

/// What a response did to the QP: nothing more, or the QP must enter ERR with the
/// oldest WQE completing with this status.
pub(super) type Fatal = Option<WcStatus>;

/// What a response did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard {
    /// Processed or dropped (counted).
    Done,
    /// A READ response was accepted (the CC extension acknowledges it, LDCP 3.1).
    ReadData,
    /// The QP must enter ERR, the oldest WQE completing with this status.
    Error(WcStatus),
}

/// The completer's state.
#[derive(Debug)]
pub(super) struct Completer {
    /// Oldest unacknowledged PSN.
    pub una: u32,
    /// Requester LSN acknowledged (cumulative).
    pub acked_lsn: u32,
    /// Retransmit deadline, while something is unacknowledged.
    pub rto_deadline: Option<u64>,
    retry_left: u8,
    rnr_left: u8,
    /// The PSN a gap already rewound to, so one gap rewinds once.
    rewound_for: Option<u32>,
}

impl Completer {
    /// Retries left after a change of the QP's retry attributes before it
    /// sent anything ([`super::Qp::set_retry`]).
    pub(super) fn set_retry(&mut self, retry_cnt: u8, rnr_retry: u8) {
        self.retry_left = retry_cnt;
        self.rnr_left = rnr_retry;
    }

    pub fn new(cfg: &QpConfig) -> Self {
        Self {
            una: cfg.sq_psn,
            acked_lsn: 0,
            rto_deadline: None,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            rewound_for: None,
        }
    }

    /// Arms the retransmit timer when a request packet leaves and none is running.
    pub fn on_sent(&mut self, now: u64, cfg: &QpConfig) {
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + cfg.timeout_ns);
        }
    }

    /// Go-back-N to `p`, once per gap.
    fn rewind_once(&mut self, p: u32, req: &mut Requester, out: &mut Outputs) {
        if self.rewound_for != Some(p) {
            self.rewound_for = Some(p);
            req.rewind(p);
            out.counters.rewinds += 1;
        }
    }

    /// Completes the oldest WQE with `status` (a completion if signaled or failed).
    fn complete_front(
        &mut self,
        status: WcStatus,
        cfg: &QpConfig,
        req: &mut Requester,
        out: &mut Outputs,
    ) {
        let Some(w) = req.pop_front() else { return };
        if w.wr.signaled || status != WcStatus::Success {
            let byte_len = if status == WcStatus::Success {
                w.wr.sge.len
            } else {
                0
            };
            out.push_wc(WorkCompletion {
                wr_id: w.wr.wr_id,
                status,
                opcode: w.wr.op.wc_opcode(),
                byte_len,
                imm: w.wr.op.completion_imm(),
                qp_num: cfg.qpn,
                solicited: false,
                src_qp: 0,
                grh: false,
            });
        }
        self.una = w.end_psn();
    }

    /// Forward progress: retry counters reset, the timer re-armed for what is left,
    /// and the cursor moved past what is acknowledged.
    fn progress(&mut self, now: u64, cfg: &QpConfig, req: &mut Requester, out: &mut Outputs) {
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
        self.rewound_for = None;
        self.rto_deadline = if self.una != req.sent_hi {
            Some(now + cfg.timeout_ns)
        } else {
            None
        };
        if psn::lt(req.cursor_psn(), self.una) {
            req.rewind(self.una);
            out.counters.rewinds += 1;
        }
    }

    /// Cumulative acknowledgement of every PSN before `to` (exclusive). Returns the LSN
    /// bytes newly acknowledged.
    fn ack_until(
        &mut self,
        to: u32,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        out: &mut Outputs,
    ) -> u32 {
        if psn::le(to, self.una) || psn::lt(req.sent_hi, to) {
            return 0;
        }
        let before = self.acked_lsn;
        while let Some(w) = req.sq.front().copied() {
            if !w.started {
                break;
            }
            if w.wr.op.needs_response() {
                // ACK beyond an unfinished READ/ATOMIC: its response was lost (implied
                // NAK, IBA 9.7.5.1.3): re-request from the oldest missing PSN.
                if psn::lt(self.una, to) {
                    let u = self.una;
                    self.rewind_once(u, req, out);
                }
                break;
            }
            if psn::le(w.end_psn(), to) {
                self.complete_front(WcStatus::Success, cfg, req, out);
            } else {
                self.una = to;
                break;
            }
        }
        self.settle(before, now, cfg, req, out)
    }

    /// Recomputes the acknowledged LSN after `una` moved; on progress, resets the
    /// retry state. Returns the LSN bytes newly acknowledged.
    fn settle(
        &mut self,
        before: u32,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        out: &mut Outputs,
    ) -> u32 {
        self.acked_lsn = req.lsn_at(self.una, cfg.pmtu);
        let n = self.acked_lsn.wrapping_sub(before);
        if n > 0 {
            self.progress(now, cfg, req, out);
        }
        n
    }

    fn ack_event(&self, p: u32, newly: u32, ext: Option<&CcExtRepr>, out: &mut Outputs) {
        let e = QpEvent::Ack {
            psn: p,
            acked_lsn: self.acked_lsn,
            newly_acked: newly,
            ce_count: ext.map_or(0, |e| e.ce_count),
            window: ext.and_then(|e| e.window),
            n_hops: 0,
        };
        out.push_echo(e, ext);
    }

    /// Whether `p` is a PSN sent and not yet acknowledged.
    fn outstanding(&self, p: u32, req: &Requester) -> bool {
        psn::le(self.una, p) && psn::lt(p, req.sent_hi)
    }

    /// An ACKNOWLEDGE packet: ACK, NAK or RNR NAK.
    fn on_acknowledge(
        &mut self,
        f: &RoceFrame<'_>,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        out: &mut Outputs,
    ) -> Fatal {
        let p = f.bth.psn;
        let aeth = f.aeth?;
        let nak = QpEvent::Nak {
            psn: p,
            syndrome: aeth.syndrome,
        };
        match aeth.syndrome {
            AethSyndrome::Ack { .. } => {
                let n = self.ack_until(psn::add(p, 1), now, cfg, req, out);
                self.ack_event(p, n, f.ccext.as_ref(), out);
            }
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                let n = self.ack_until(p, now, cfg, req, out);
                out.push_event(nak);
                if n > 0 {
                    self.ack_event(p, n, f.ccext.as_ref(), out);
                }
                if self.outstanding(p, req) {
                    req.rewind(p);
                    out.counters.rewinds += 1;
                }
            }
            AethSyndrome::RnrNak { timer } => {
                self.ack_until(p, now, cfg, req, out);
                out.push_event(nak);
                if !self.outstanding(p, req) || req.rnr_until > now {
                    // Stale, or a duplicate of the RNR NAK being waited out.
                    return None;
                }
                if cfg.rnr_retry != RNR_RETRY_INFINITE {
                    if self.rnr_left == 0 {
                        return Some(WcStatus::RnrRetryExcErr);
                    }
                    self.rnr_left -= 1;
                }
                req.rewind(p);
                out.counters.rewinds += 1;
                req.rnr_until = now + rnr_timer_ns(timer).max(1);
                self.rto_deadline = None;
            }
            AethSyndrome::Nak(code) => {
                self.ack_until(p, now, cfg, req, out);
                out.push_event(nak);
                let st = match code {
                    NakCode::InvalidRequest | NakCode::InvalidRdRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::BadRespErr,
                };
                if self.outstanding(p, req) {
                    return Some(st);
                }
            }
            AethSyndrome::Reserved(_) => out.counters.rx_bad_response += 1,
        }
        None
    }

    /// A response packet (ACKNOWLEDGE, READ response, ATOMIC ACK). READ data and ATOMIC
    /// results are written through `mem` into the WQE's local SGEs (checked at post;
    /// a list of several in `sgls`). Returns what the QP does next.
    #[allow(clippy::too_many_arguments)]
    pub fn on_response<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        sgls: &SglStore,
        mem: &mut M,
        out: &mut Outputs,
    ) -> Heard {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if op == Opcode::Acknowledge {
            return match self.on_acknowledge(f, now, cfg, req, out) {
                Some(st) => Heard::Error(st),
                None => Heard::Done,
            };
        }
        // A READ response or ATOMIC ACK for a later WQE implicitly acknowledges every
        // SEND/WRITE before it (IBA 9.7.5.1, coalesced ACKs; rxe `check_psn`); an
        // unfinished READ/ATOMIC before it lost its response (implied NAK).
        let before = self.acked_lsn;
        let owner = req.sq.iter().find(|w| w.holds(p)).copied();
        if let Some(w) = owner.filter(|w| w.wr.op.needs_response()) {
            if psn::lt(self.una, w.first_psn) {
                self.ack_until(w.first_psn, now, cfg, req, out);
            }
        }
        // READ responses and ATOMIC ACKs must be the oldest outstanding PSN.
        let Some(w) = req.sq.front().copied() else {
            out.counters.rx_bad_response += 1;
            return Heard::Done;
        };
        if !w.started || !w.wr.op.needs_response() || p != self.una {
            if psn::lt(self.una, p) && psn::lt(p, req.sent_hi) && op.is_read_response() {
                // Out-of-order READ response: the responder does not NAK READs, so the
                // requester re-requests from the missing PSN (LDCP 3.1, IBA 9.7.5.1.5).
                let u = self.una;
                self.rewind_once(u, req, out);
            }
            out.counters.rx_bad_response += 1;
            return Heard::Done;
        }
        let idx = psn::sub(p, w.first_psn);
        if op == Opcode::AtomicAcknowledge {
            let (true, Some(a)) = (w.wr.op.is_atomic(), f.atomic_ack) else {
                out.counters.rx_bad_response += 1;
                return Heard::Done;
            };
            mem.write_u64_key(w.wr.sge.lkey, w.wr.sge.addr, a.orig);
            self.complete_front(WcStatus::Success, cfg, req, out);
            self.acked_lsn = req.lsn_at(self.una, cfg.pmtu);
            let n = self.acked_lsn.wrapping_sub(before);
            self.progress(now, cfg, req, out);
            self.ack_event(p, n, f.ccext.as_ref(), out);
            return Heard::Done;
        }
        if !op.is_read_response() || !matches!(w.wr.op, SendOp::Read { .. }) {
            out.counters.rx_bad_response += 1;
            return Heard::Done;
        }
        let pm = cfg.pmtu;
        let total = w.wr.sge.len;
        let last = idx + 1 == w.npkts;
        let off = idx * pm;
        let expect_len = if last { total - off } else { pm };
        let op_ok = if last {
            op.is_last() || op.is_only()
        } else {
            op.is_first() || op.is_middle()
        };
        if !op_ok || f.payload.len() as u32 != expect_len {
            out.counters.rx_bad_response += 1;
            return Heard::Done;
        }
        if w.sgl.is_list() {
            // Scattered over the READ's SGEs (IBA 10.7.2.1).
            let mut rest = f.payload;
            for p in sgl::pieces(sgls.get(w.sgl), off, rest.len() as u32) {
                let (now_in, later) = rest.split_at(p.len as usize);
                mem.copy_in_key(p.lkey, p.addr, now_in);
                rest = later;
            }
        } else if !f.payload.is_empty() {
            mem.copy_in_key(w.wr.sge.lkey, w.wr.sge.addr + u64::from(off), f.payload);
        }
        if last {
            self.complete_front(WcStatus::Success, cfg, req, out);
        } else {
            self.una = psn::add(self.una, 1);
        }
        self.acked_lsn = req.lsn_at(self.una, cfg.pmtu);
        let n = self.acked_lsn.wrapping_sub(before);
        self.progress(now, cfg, req, out);
        if n > 0 || f.ccext.is_some() || cfg.ack_events_without_progress {
            self.ack_event(p, n, f.ccext.as_ref(), out);
        }
        Heard::ReadData
    }

    /// The retransmit timer at `now`: go-back-N from the oldest unacknowledged PSN, or
    /// RETRY_EXC_ERR when the retry count is spent.
    pub fn on_timer(&mut self, now: u64, req: &mut Requester, out: &mut Outputs) -> Fatal {
        let d = self.rto_deadline?;
        if d > now {
            return None;
        }
        self.rto_deadline = None;
        if self.una == req.sent_hi {
            return None;
        }
        out.counters.count_error(|c| &mut c.timeouts);
        if self.retry_left == 0 {
            out.push_event(QpEvent::Timeout {
                psn: self.una,
                retries_left: 0,
            });
            return Some(WcStatus::RetryExcErr);
        }
        self.retry_left -= 1;
        out.push_event(QpEvent::Timeout {
            psn: self.una,
            retries_left: self.retry_left,
        });
        let u = self.una;
        self.rewound_for = Some(u);
        req.rewind(u);
        out.counters.rewinds += 1;
        None
    }
}
