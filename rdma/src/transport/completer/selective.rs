//! What an `sr` requester hears back (crate::transport::sack; IRN §3.1-3.2): the
//! cumulative ACK and the selective ACK's report, READ responses and ATOMIC ACKs in
//! any order, placed on arrival; work requests completed strictly in order, each
//! only once everything of it is done (a SEND or WRITE once the cumulative ACK passes
//! it, a READ once every response arrived, an ATOMIC once its ACK did: IBA 9.7.5.1
//! and 10.8.3, as with go-back-N); the holes below the highest PSN reported, resent
//! one at a time; IRN's two timeouts; and the fall back to go-back-N when the peer
//! NAKs a gap without a selective part.

use super::{Completer, Fatal, Heard};
use crate::transport::config::QpConfig;
use crate::transport::mr::MemorySpace;
use crate::transport::output::{Outputs, QpEvent, TxPacket};
use crate::transport::requester::Requester;
use crate::transport::sack::{Sack, SrState, WINDOW};
use crate::transport::sgl::{self, SglStore};
use crate::transport::wc::{SendOp, WcStatus};
use crate::wire::bth::Opcode;
use crate::wire::frame::RoceFrame;
use crate::wire::psn;
use crate::wire::transport_hdrs::{AethSyndrome, NakCode};

impl Completer {
    /// A response on a QP in `sr`. `None`: the peer NAKed a gap without a selective
    /// part, the QP fell back to go-back-N, and the response is the go-back-N
    /// completer's ([`Completer::on_response`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::transport) fn sr_on_response<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        sgls: &SglStore,
        mem: &mut M,
        out: &mut Outputs,
        sr: &mut SrState,
    ) -> Option<Heard> {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if op == Opcode::Acknowledge {
            let aeth = f.aeth?;
            if let Some(s) = Sack::from_aeth(aeth.syndrome, aeth.msn) {
                sr.counters.sacks_received += 1;
                sr.part_reads = true;
                self.heard_cum(p, req, sr);
                self.mark(s.psn, s.placed, req, sr);
                out.push_event(QpEvent::Nak {
                    psn: p,
                    syndrome: aeth.syndrome,
                });
                let n = self.sr_advance(now, cfg, req, out, sr);
                if n > 0 {
                    self.ack_event(p, n, f.ccext.as_ref(), out);
                }
                return Some(Heard::Done);
            }
            return match aeth.syndrome {
                AethSyndrome::Ack { .. } => {
                    self.heard_cum(psn::add(p, 1), req, sr);
                    let n = self.sr_advance(now, cfg, req, out, sr);
                    self.ack_event(p, n, f.ccext.as_ref(), out);
                    Some(Heard::Done)
                }
                AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                    self.fall_back(req, sr);
                    None
                }
                _ => {
                    // RNR and error NAKs as with go-back-N (an RNR NAK goes back
                    // to its PSN, which the responder did not take).
                    if let AethSyndrome::RnrNak { .. } = aeth.syndrome {
                        self.heard_cum(p, req, sr);
                    }
                    let una = self.una;
                    let fatal = self.on_acknowledge(f, now, cfg, req, out);
                    sr.done_ahead -= sr.done.clear_span(una, psn::sub(self.una, una));
                    Some(match fatal {
                        Some(st) => Heard::Error(st),
                        None => Heard::Done,
                    })
                }
            };
        }
        let Some(w) = req.holder(p).filter(|w| w.wr.op.needs_response()) else {
            out.counters.rx_bad_response += 1;
            return Some(Heard::Done);
        };
        if psn::lt(p, self.una) || psn::sub(p, self.una) >= WINDOW || sr.done.get(p) {
            // Already placed (a duplicate, a replay), or beyond what the bitmap
            // holds (re-requested once the window reaches it).
            out.counters.rx_bad_response += 1;
            return Some(Heard::Done);
        }
        let before = self.acked_lsn;
        if op == Opcode::AtomicAcknowledge {
            let (true, Some(a)) = (w.wr.op.is_atomic(), f.atomic_ack) else {
                out.counters.rx_bad_response += 1;
                return Some(Heard::Done);
            };
            mem.write_u64_key(w.wr.sge.lkey, w.wr.sge.addr, a.orig);
            self.heard_cum(psn::add(p, 1), req, sr);
        } else {
            if !op.is_read_response() || !matches!(w.wr.op, SendOp::Read { .. }) {
                out.counters.rx_bad_response += 1;
                return Some(Heard::Done);
            }
            // Placed by its offset (IRN §5.2); its opcode follows the run it was
            // sent in (a re-requested run ends with a LAST), its length the READ.
            let pm = cfg.pmtu;
            let idx = psn::sub(p, w.first_psn);
            let off = idx * pm;
            let total = w.wr.sge.len;
            let expect_len = if idx + 1 == w.npkts { total - off } else { pm };
            if f.payload.len() as u32 != expect_len {
                out.counters.rx_bad_response += 1;
                return Some(Heard::Done);
            }
            if w.sgl.is_list() {
                let mut rest = f.payload;
                for piece in sgl::pieces(sgls.get(w.sgl), off, rest.len() as u32) {
                    let (now_in, later) = rest.split_at(piece.len as usize);
                    mem.copy_in_key(piece.lkey, piece.addr, now_in);
                    rest = later;
                }
            } else if !f.payload.is_empty() {
                mem.copy_in_key(w.wr.sge.lkey, w.wr.sge.addr + u64::from(off), f.payload);
            }
            if p != self.una {
                sr.counters.rx_read_ahead += 1;
            }
            // The READ executed: so did every request before it (IBA 9.7.5.1.1).
            self.heard_cum(w.end_psn(), req, sr);
        }
        self.mark(p, true, req, sr);
        let n = self.sr_advance(now, cfg, req, out, sr);
        let moved = self.acked_lsn.wrapping_sub(before);
        if op == Opcode::AtomicAcknowledge {
            self.ack_event(p, moved, f.ccext.as_ref(), out);
            return Some(Heard::Done);
        }
        if n > 0 || f.ccext.is_some() || cfg.ack_events_without_progress {
            self.ack_event(p, n, f.ccext.as_ref(), out);
        }
        Some(Heard::ReadData)
    }

    /// The responder's expected PSN is at least `to` (every request before it
    /// executed), if `to` was sent.
    fn heard_cum(&mut self, to: u32, req: &Requester, sr: &mut SrState) {
        if psn::lt(sr.cum, to) && psn::le(to, req.sent_hi) {
            sr.cum = to;
        }
        if psn::lt(sr.cum, self.una) {
            sr.cum = self.una;
        }
    }

    /// PSN `p` arrived (placed or not): holes below it are known; placed, it is done.
    fn mark(&mut self, p: u32, placed: bool, req: &Requester, sr: &mut SrState) {
        if !(psn::le(self.una, p) && psn::lt(p, req.sent_hi)) || psn::sub(p, self.una) >= WINDOW {
            return;
        }
        if placed {
            if sr.done.insert(p) {
                sr.done_ahead += 1;
            }
            if sr.round_hi.is_some_and(|h| psn::le(h, p)) && psn::lt(self.una, sr.resend_from) {
                // What was resent before `p` was sent is still missing: lost again.
                sr.round_hi = None;
                sr.resend_from = self.una;
            }
        }
        let past = psn::add(p, 1);
        if psn::lt(sr.hi, past) {
            sr.hi = past;
        }
    }

    /// Completes, in order, every work request now done, moves the oldest
    /// unacknowledged PSN past what is done, and on progress re-arms the timers.
    /// Returns the LSN bytes newly acknowledged.
    fn sr_advance(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        req: &mut Requester,
        out: &mut Outputs,
        sr: &mut SrState,
    ) -> u32 {
        let (una0, lsn0) = (self.una, self.acked_lsn);
        while let Some(w) = req.sq.front().copied() {
            if !w.started {
                break;
            }
            let end = w.end_psn();
            let done_to = if w.wr.op.needs_response() {
                // A READ's responses and an ATOMIC's ACK: each PSN by its bit.
                let from = if psn::lt(self.una, w.first_psn) {
                    w.first_psn
                } else {
                    self.una
                };
                let n = psn::sub(end, from);
                match sr.done.find(from, n.min(WINDOW), false) {
                    Some(q) => q,
                    None if n <= WINDOW => end,
                    None => psn::add(from, WINDOW),
                }
            } else if psn::le(end, sr.cum) {
                end
            } else {
                sr.cum
            };
            if done_to == end {
                self.complete_front(WcStatus::Success, cfg, req, out);
                continue;
            }
            if psn::lt(self.una, done_to) {
                self.una = done_to;
            }
            break;
        }
        if self.una == una0 {
            return 0;
        }
        sr.done_ahead -= sr.done.clear_span(una0, psn::sub(self.una, una0));
        // Progress after an IBA timeout: the peer answers again, and READ runs
        // go back to being re-requested alone.
        sr.part_reads = true;
        self.acked_lsn = req.lsn_at(self.una, cfg.pmtu);
        self.progress(now, cfg, req, out);
        sr.armed_at = (self.una != req.sent_hi).then_some(now);
        self.acked_lsn.wrapping_sub(lsn0)
    }

    /// The next hole to resend, if any: the first PSN from where this round left off,
    /// below the highest one reported, that is not done (IRN §3.1: each lost packet
    /// once per round; a round starts at a timeout). A SEND or WRITE packet is sent
    /// again; a READ not yet executed is requested again whole, an executed one only
    /// for its run of missing responses; an ATOMIC is sent again (its duplicate is
    /// answered from the responder's cache).
    pub(in crate::transport) fn sr_next_hole(
        &self,
        req: &Requester,
        sr: &mut SrState,
        cfg: &QpConfig,
    ) -> Option<TxPacket> {
        let una = self.una;
        if psn::lt(sr.resend_from, una) {
            sr.resend_from = una;
        }
        if std::mem::take(&mut sr.probe) && una != req.sent_hi {
            if let Some(w) = req.holder(una).filter(|w| !w.wr.op.needs_response()) {
                if sr.done.get(una) {
                    sr.counters.holes_resent += 1;
                    return Some(req.resend(&w, una, 1, cfg));
                }
            }
        }
        let mut limit = req.sent_hi;
        for cap in [sr.hi, psn::add(una, WINDOW)] {
            if psn::lt(cap, limit) {
                limit = cap;
            }
        }
        while psn::lt(sr.resend_from, limit) {
            let q = sr.resend_from;
            let Some(w) = req.holder(q) else {
                sr.resend_from = limit;
                break;
            };
            let end = w.end_psn();
            let stop = if psn::lt(end, limit) { end } else { limit };
            if !w.wr.op.needs_response() {
                if psn::lt(q, sr.cum) {
                    sr.resend_from = if psn::lt(sr.cum, stop) { sr.cum } else { stop };
                    continue;
                }
                sr.resend_from = psn::add(q, 1);
                if sr.done.get(q) {
                    continue;
                }
                sr.counters.holes_resent += 1;
                sr.round_hi = Some(req.sent_hi);
                return Some(req.resend(&w, q, 1, cfg));
            }
            let Some(m) = sr.done.find(q, psn::sub(stop, q), false) else {
                sr.resend_from = stop;
                continue;
            };
            if w.wr.op.is_atomic() || !psn::lt(w.first_psn, sr.cum) {
                // Not known executed: the request again, whole.
                sr.resend_from = end;
                sr.counters.holes_resent += 1;
                sr.round_hi = Some(req.sent_hi);
                return Some(req.resend(&w, w.first_psn, w.npkts, cfg));
            }
            let mut run_end = sr.done.find(m, psn::sub(stop, m), true).unwrap_or(stop);
            if !sr.part_reads {
                run_end = end;
            }
            sr.resend_from = run_end;
            sr.counters.holes_resent += 1;
            sr.counters.read_rerequests += 1;
            sr.round_hi = Some(req.sent_hi);
            return Some(req.resend(&w, m, psn::sub(run_end, m), cfg));
        }
        None
    }

    /// A request packet left: the RTO_low / RTO_high timer runs if it did not.
    pub(in crate::transport) fn sr_on_sent(&self, now: u64, sr: &mut SrState) {
        if sr.armed_at.is_none() {
            sr.armed_at = Some(now);
        }
    }

    /// The timers of an `sr` QP at `now`: the IBA timer counts retries down as with
    /// go-back-N (and ends the QP when they run out); it and RTO_low / RTO_high
    /// start a round that resends the oldest unacknowledged PSN and the holes known
    /// (what else is missing shows when that arrives; a spurious timeout, a stalled
    /// host, costs a packet). After the IBA timer a READ is re-requested to its end
    /// (any responder replays that) until the next progress or selective ACK.
    pub(in crate::transport) fn sr_on_timer(
        &mut self,
        now: u64,
        req: &mut Requester,
        out: &mut Outputs,
        sr: &mut SrState,
    ) -> Fatal {
        let outstanding = self.una != req.sent_hi;
        if self.rto_deadline.is_some_and(|d| d <= now) {
            self.rto_deadline = None;
            if outstanding {
                out.counters.count_error(|c| &mut c.timeouts);
                let retries_left = self.retry_left.saturating_sub(1);
                out.push_event(QpEvent::Timeout {
                    psn: self.una,
                    retries_left,
                });
                if self.retry_left == 0 {
                    return Some(WcStatus::RetryExcErr);
                }
                self.retry_left = retries_left;
                sr.part_reads = false;
                sr.counters.sr_timeouts += 1;
                let next = psn::add(self.una, 1);
                if psn::lt(sr.hi, next) {
                    sr.hi = next;
                }
                sr.resend_from = self.una;
                sr.probe = true;
                return None;
            }
        }
        if sr.deadline(self.una, req.sent_hi).is_some_and(|d| d <= now) {
            sr.armed_at = None;
            if outstanding {
                // A tail loss (nothing after it arrived to report it), a lost
                // resend or a lost ACK: the oldest PSN goes again.
                sr.counters.sr_timeouts += 1;
                let next = psn::add(self.una, 1);
                if psn::lt(sr.hi, next) {
                    sr.hi = next;
                }
                sr.resend_from = self.una;
                sr.probe = true;
            }
        }
        None
    }

    /// The peer's responder does go-back-N: so does this QP from now on (module
    /// docs of crate::transport::sack). What the bitmaps held is forgotten and will
    /// be sent again.
    fn fall_back(&mut self, req: &mut Requester, sr: &mut SrState) {
        sr.active = false;
        sr.counters.fallbacks += 1;
        sr.done.clear();
        sr.done_ahead = 0;
        sr.arrived.clear();
        sr.armed_at = None;
        req.chunk_writes = false;
        self.rewound_for = None;
    }
}
