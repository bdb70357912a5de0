//! A [`Qp`]'s data path: completions and events out, packets to send
//! ([`Qp::poll_tx`], the responder's answers first), packets received
//! ([`Qp::on_rx`], dispatched to the completer or the responder by opcode,
//! UD by its DETH), the retransmission and RNR timers ([`Qp::on_timer`]),
//! and the move to ERR that flushes every queued WR (IBA 10.3.1, 11.6.2).

use super::*;

impl Qp {
    /// Next completion.
    pub fn poll_cq(&mut self) -> Option<WorkCompletion> {
        self.out.cq.pop_front()
    }

    /// Completions waiting to be taken with [`Self::poll_cq`].
    pub fn pending_completions(&self) -> usize {
        self.out.cq.len()
    }

    /// Next event for CC / the NIC, with the hop records it echoed (an ACK's
    /// or a probe response's telemetry, when it carried some).
    pub fn poll_event(&mut self) -> Option<(QpEvent, Option<EchoedHops>)> {
        self.out.pop_event()
    }

    /// The earliest time [`Qp::on_timer`] has work to do, if any.
    pub fn next_timer(&self) -> Option<u64> {
        let rnr = (self.req.rnr_until > 0).then_some(self.req.rnr_until);
        let t = match (self.comp.rto_deadline, rnr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sr = self.sr.as_ref().filter(|s| s.active);
        match (
            t,
            sr.and_then(|s| s.deadline(self.comp.una, self.req.sent_hi)),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// ERR: every queued WR completes (the oldest send WR with `failing`, if given; the
    /// rest with WR_FLUSH_ERR) and the timers stop.
    pub(super) fn enter_error(&mut self, failing: Option<WcStatus>) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        let q = self.cfg.qpn;
        self.req.flush(failing, q, &mut self.out.cq);
        self.ud_dests.clear();
        self.resp.flush(q, &mut self.out.cq);
        self.comp.rto_deadline = None;
        if let Some(sr) = self.sr.as_deref_mut() {
            sr.armed_at = None;
        }
        self.out.push_event(QpEvent::Error);
        tracing::debug!(qpn = q, ?failing, "QP entered error state");
    }

    // ------------------------------------------------------------------ entry points

    /// Whether a control packet (ACK, NAK, atomic ACK, the LDCP ACK of READ
    /// responses, a probe response) waits: what a NIC's scheduler sends ahead of
    /// data (docs/design.md §5, HPCC++ 002 §7.2), via [`Qp::poll_tx_control`].
    pub fn has_control(&self) -> bool {
        debug_assert_eq!(self.resp_output, self.resp.has_output());
        !matches!(self.state, QpState::Reset | QpState::Init)
            && (self.ext_control || (self.resp_output && self.resp.has_control()))
    }

    /// The next control packet only (see [`Qp::has_control`]); never data, so
    /// a scheduler may send it without charging the QP's pacing credit.
    pub fn poll_tx_control(&mut self, _now_ns: u64) -> Option<TxPacket> {
        if !self.has_control() {
            return None;
        }
        if self.ext_control {
            let t = self.ext.poll_control(&self.cfg);
            self.ext_control = self.ext.has_control();
            if t.is_some() {
                return t;
            }
        }
        // The front of the responder's queue is an ACK/NAK or atomic ACK.
        self.poll_responder()
    }

    /// The responder's next packet ([`Responder::poll_tx`]), counted, with
    /// `resp_output` brought up to date.
    pub(super) fn poll_responder(&mut self) -> Option<TxPacket> {
        let t = self.resp.poll_tx(&self.cfg, &mut self.ext);
        self.resp_output = self.resp.has_output();
        if t.is_some() {
            self.out.counters.tx_packets += 1;
        }
        t
    }

    /// The next packet to transmit at `now_ns`, if any: responses and ACKs first
    /// (including the LDCP ACK of READ responses), then requester packets gated by the
    /// window, RNR wait and outstanding-READ limit.
    pub fn poll_tx(&mut self, now_ns: u64) -> Option<TxPacket> {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        if let Some(t) = self.poll_tx_control(now_ns) {
            return Some(t);
        }
        if self.resp_output {
            if let Some(t) = self.poll_responder() {
                return Some(t);
            }
        }
        if self.state == QpState::Err {
            return None;
        }
        let (psn, lsn) = (self.req.next_psn, self.req.next_lsn);
        if std::mem::take(&mut self.ext_probe) {
            if let Some(t) = self.ext.poll_probe(&self.cfg, psn, lsn) {
                return Some(t);
            }
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let sqd = self.state == QpState::Sqd;
        if let Some(sr) = self.sr.as_deref_mut().filter(|s| s.active) {
            // Selective repeat: a hole first, then new packets within the cap.
            if self.req.rnr_until <= now_ns {
                if let Some(p) = self.comp.sr_next_hole(&self.req, sr, &self.cfg) {
                    self.comp.on_sent(now_ns, &self.cfg);
                    self.comp.sr_on_sent(now_ns, sr);
                    self.out.counters.tx_packets += 1;
                    self.out.counters.count_error(|c| &mut c.tx_retransmits);
                    return Some(p);
                }
            }
            if !self
                .req
                .within_cap(self.comp.una, sr.done_ahead, sr.params.bdp_pkts)
            {
                return None;
            }
        }
        // The packet stays where the requester built it (returned as is, only
        // looked at here): a `TxPacket` is ~300 bytes, and moving it out of the
        // `Option` and back in cost two copies per packet.
        let mut t = self
            .req
            .next_packet(now_ns, &self.cfg, sqd, self.comp.acked_lsn);
        if self.cfg.service != Service::Rc {
            if let Some(p) = &mut t {
                self.unreliable_sent(p);
            }
            return t;
        }
        if let Some(p) = &t {
            self.comp.on_sent(now_ns, &self.cfg);
            self.out.counters.tx_packets += 1;
            if p.retransmit {
                self.out.counters.count_error(|c| &mut c.tx_retransmits);
            }
            if let Some(sr) = self.sr.as_deref_mut().filter(|s| s.active) {
                self.comp.sr_on_sent(now_ns, sr);
            }
        }
        t
    }

    /// A UC or UD packet the requester built, made what its service sends (IBA 9.8):
    /// the service's opcode, no AckReq, for UD the work request's destination (BTH
    /// DestQP, the DETH with the Q_Key rule of IBA 10.2.4.4 and this QP as source,
    /// [`TxPacket::ah`]); it counts as acknowledged now (nothing will acknowledge it:
    /// no window gate, no retransmit timer), and its WQE completes with success
    /// when its last packet is handed out (rxe `rxe_xmit_packet`).
    #[cold]
    pub(super) fn unreliable_sent(&mut self, p: &mut TxPacket) {
        let svc = self.cfg.service;
        let op = p.repr.bth.opcode;
        p.repr.bth.opcode = op.in_service(svc).unwrap_or(op);
        p.repr.bth.ack_req = false;
        if svc == Service::Ud {
            if let Some(d) = self.ud_dests.front() {
                p.repr.bth.dest_qp = d.remote_qpn;
                p.repr.deth = Some(DethRepr {
                    qkey: d.effective_qkey(self.cfg.qkey),
                    src_qp: self.cfg.qpn,
                });
                p.ah = Some(d.ah);
            }
        }
        self.comp.acked_lsn = p.lsn.wrapping_add(p.lsn_len);
        self.out.counters.tx_packets += 1;
        if op.is_last() || op.is_only() {
            if let Some(w) = self.req.pop_front() {
                if w.wr.signaled {
                    self.out.push_wc(WorkCompletion {
                        wr_id: w.wr.wr_id,
                        status: WcStatus::Success,
                        opcode: w.wr.op.wc_opcode(),
                        byte_len: w.wr.sge.len,
                        imm: w.wr.op.completion_imm(),
                        qp_num: self.cfg.qpn,
                        solicited: false,
                        src_qp: 0,
                        grh: false,
                    });
                }
                self.comp.una = w.end_psn();
            }
            if svc == Service::Ud {
                self.ud_dests.pop_front();
            }
        }
    }

    /// Handles a received frame already parsed by [`crate::wire::parse_frame`] (ICRC
    /// checked, INT stripped or not). Memory is touched only through `mem`, and only after
    /// the `mrs` checks pass; `mrs` changes only when a SEND with Invalidate frees a
    /// memory window (IBA 10.6.7.2.4).
    pub fn on_rx<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now_ns: u64,
        mrs: &mut MrTable,
        mem: &mut M,
    ) {
        self.on_rx_srq(f, now_ns, mrs, mem, None);
    }

    /// [`Self::on_rx`] for a QP created to receive from a shared receive
    /// queue ([`QpConfig::srq`]): `srq` is it.
    pub fn on_rx_srq<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now_ns: u64,
        mrs: &mut MrTable,
        mem: &mut M,
        srq: Option<&mut Srq>,
    ) {
        let op = f.bth.opcode;
        // A packet of another service is not for this QP (rxe `check_type_state`);
        // a CNP slows any QP.
        if f.bth.dest_qp != self.cfg.qpn
            || matches!(self.state, QpState::Reset | QpState::Init | QpState::Err)
            || (op.service() != self.cfg.service && op != Opcode::Cnp)
        {
            self.out.counters.count_error(|c| &mut c.rx_dropped_state);
            return;
        }
        if self.cfg.service == Service::Ud {
            self.on_rx_ud(f, &*mrs, mem, srq);
            return;
        }
        if self.peer_ip.is_some_and(|ip| ip != f.ip.src) {
            self.out.counters.count_error(|c| &mut c.rx_wrong_source);
            return;
        }
        match op {
            Opcode::Cnp => self.out.push_event(QpEvent::CnpReceived),
            Opcode::Acknowledge
                if f.ccext
                    .is_some_and(|e| e.flags.contains(CcExtFlags::RESP_SPACE)) =>
            {
                // The requester acknowledges our READ responses (LDCP 3.1).
                let e = f.ccext.expect("matched above");
                if (e.lsn.wrapping_sub(self.resp.resp_acked_lsn) as i32) > 0 {
                    self.resp.resp_acked_lsn = e.lsn;
                }
                self.out.push_event(QpEvent::ReadRespAck {
                    lsn: e.lsn,
                    ce_count: e.ce_count,
                });
            }
            Opcode::Probe => {
                self.ext.on_probe(f);
                self.ext_control = true;
            }
            Opcode::ProbeResponse => {
                self.out
                    .push_echo(QpEvent::ProbeResponse { n_hops: 0 }, f.ccext.as_ref());
            }
            _ if op.is_request() => {
                let v = if self.cfg.service == Service::Uc {
                    self.resp
                        .on_uc_request(f, &self.cfg, &*mrs, mem, &mut self.out, srq)
                } else {
                    let sr = self.sr.as_deref_mut().filter(|s| s.active);
                    self.resp.on_request(
                        f,
                        &self.cfg,
                        mrs,
                        mem,
                        &mut self.ext,
                        &mut self.out,
                        srq,
                        sr,
                    )
                };
                self.resp_output = self.resp.has_output();
                if v == Verdict::Error {
                    self.enter_error(None);
                }
            }
            _ if op.is_response()
                && matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) =>
            {
                let sr = self.sr.as_deref_mut().filter(|s| s.active);
                let heard = sr
                    .and_then(|sr| {
                        self.comp.sr_on_response(
                            f,
                            now_ns,
                            &self.cfg,
                            &mut self.req,
                            &self.sq_sgls,
                            mem,
                            &mut self.out,
                            sr,
                        )
                    })
                    .unwrap_or_else(|| {
                        self.comp.on_response(
                            f,
                            now_ns,
                            &self.cfg,
                            &mut self.req,
                            &self.sq_sgls,
                            mem,
                            &mut self.out,
                        )
                    });
                match heard {
                    Heard::Done => {}
                    Heard::ReadData => {
                        self.ext.on_read_response(f, &self.cfg);
                        self.ext_control = self.ext.has_control();
                    }
                    Heard::Error(st) => self.enter_error(Some(st)),
                }
                if self.state != QpState::Err && !self.req.sq.is_empty() {
                    self.complete_local_front();
                }
            }
            _ => self.out.counters.count_error(|c| &mut c.rx_dropped_state),
        }
    }

    /// A UD packet for this QP (any source, any PSN; IBA 9.8, rxe `check_keys`): a
    /// SEND whose DETH carries this QP's Q_Key is placed; any other is dropped and
    /// counted.
    #[cold]
    pub(super) fn on_rx_ud<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        mrs: &MrTable,
        mem: &mut M,
        srq: Option<&mut Srq>,
    ) {
        match f.deth {
            Some(d) if d.qkey == self.cfg.qkey && f.bth.opcode.is_send() => {
                let v = self
                    .resp
                    .on_ud_send(f, &self.cfg, mrs, mem, &mut self.out, srq);
                if v == Verdict::Error {
                    self.enter_error(None);
                }
            }
            Some(_) => self.out.count_unreliable(|c| &mut c.rx_qkey_mismatch),
            None => self.out.counters.count_error(|c| &mut c.rx_dropped_state),
        }
    }

    /// Fires due timers: the retransmit timeout (go-back-N from the oldest unacknowledged
    /// PSN, or ERR with RETRY_EXC_ERR when the retry count is spent) and the RNR wait.
    pub fn on_timer(&mut self, now_ns: u64) {
        if self.req.rnr_until != 0 && self.req.rnr_until <= now_ns {
            self.req.rnr_until = 0;
        }
        if self.state == QpState::Err {
            return;
        }
        let fatal = match self.sr.as_deref_mut().filter(|s| s.active) {
            Some(sr) => self
                .comp
                .sr_on_timer(now_ns, &mut self.req, &mut self.out, sr),
            None => self.comp.on_timer(now_ns, &mut self.req, &mut self.out),
        };
        if let Some(st) = fatal {
            self.enter_error(Some(st));
        }
    }
}
