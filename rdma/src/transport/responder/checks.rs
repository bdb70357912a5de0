//! What the responder checks a request against, in IBA's order (9.7.4.1: the
//! PSN, the opcode sequence, the length, the resources (a receive WQE, the
//! READ/ATOMIC slots), the R_Key, an invalidation), how a request that fails
//! is refused (a NAK, or silence for what IBA says to drop, 9.7.5.2), and how a
//! duplicate is answered (9.7.5.1.x, rxe `duplicate_request`).

use super::*;

impl Responder {
    /// IBA 9.7.4.1.1: the expected PSN, a duplicate (before it), or ahead (a gap).
    pub(super) fn check_psn(&self, p: u32) -> PsnCheck {
        match psn::diff(p, self.epsn) {
            0 => PsnCheck::Expected,
            d if d < 0 => PsnCheck::Duplicate,
            _ => PsnCheck::Ahead,
        }
    }

    /// A gap: one PSN sequence NAK per gap, then silent drops until the expected PSN
    /// arrives (IBA 9.7.5.2.1, class B).
    pub(super) fn out_of_sequence(&mut self, out: &mut Outputs) {
        out.counters.count_error(|c| &mut c.rx_out_of_sequence);
        if !self.nak_sent {
            self.nak_sent = true;
            let item = self.ack_item(self.epsn, AethSyndrome::Nak(NakCode::PsnSequenceError));
            self.push_out(item, out);
            out.counters.count_error(|c| &mut c.nak_seq_sent);
        }
    }

    /// Opcode sequence (IBA 9.8.3.1, rxe `check_op_seq`): inside a message only its
    /// MIDDLE/LAST; outside one, no MIDDLE/LAST.
    pub(super) fn check_op_seq(&self, op: Opcode) -> Check<()> {
        let ok = match self.cur {
            Some(InMsg::Send { .. }) => op.is_send() && (op.is_middle() || op.is_last()),
            Some(InMsg::Write { .. }) => op.is_write() && (op.is_middle() || op.is_last()),
            None => !(op.is_middle() || op.is_last()),
        };
        ok.then_some(()).ok_or(INVALID)
    }

    /// Length (rxe `check_length`): FIRST/MIDDLE carry exactly one PMTU, no packet more;
    /// a WRITE or READ asks for at most [`MAX_MESSAGE`] bytes.
    pub(super) fn check_length(&self, f: &RoceFrame<'_>, cfg: &QpConfig) -> Check<()> {
        let op = f.bth.opcode;
        let pm = cfg.pmtu as usize;
        let len = f.payload.len();
        if (op.is_first() || op.is_middle()) && len != pm || len > pm {
            return Err(INVALID);
        }
        if f.reth.is_some_and(|r| r.dma_len > MAX_MESSAGE) {
            return Err(INVALID);
        }
        Ok(())
    }

    /// Resources (rxe `check_resource`): a receive WQE for SEND and WRITE with
    /// immediate, the message's bytes within it (a longer SEND is an invalid request
    /// that completes the WQE with LOC_LEN_ERR) and within a region it may still
    /// write (its region deregistered since the post: a malformed WQE, NAK remote
    /// operational error, class A) or within the WRITE's announced length, room for a
    /// READ or ATOMIC response.
    pub(super) fn check_resource(
        &mut self,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &MrTable,
        srq: Option<&mut Srq>,
    ) -> Check<Target> {
        let op = f.bth.opcode;
        let len = f.payload.len() as u32;
        if op.is_send() {
            let wqe = self.hold_recv(srq).ok_or(Refusal::NotReady)?;
            let offset = match self.cur {
                Some(InMsg::Send { offset }) => offset,
                _ => 0,
            };
            if u64::from(offset) + u64::from(len) > u64::from(wqe.wr.sge.len) {
                return Err(fatal(NakCode::InvalidRequest, WcStatus::LocLenErr));
            }
            // Every part the bytes land in must still be writable (its region
            // may have been deregistered since the post).
            let writable = |p: Sge| {
                mrs.check_local_in(
                    cfg.pd,
                    p.lkey,
                    p.addr,
                    u64::from(p.len),
                    Access::LOCAL_WRITE,
                )
                .is_ok()
            };
            let ok = if wqe.sgl.is_list() {
                sgl::pieces(self.recv_sgl(&wqe), offset, len).all(writable)
            } else {
                len == 0
                    || writable(Sge {
                        addr: wqe.wr.sge.addr + u64::from(offset),
                        len,
                        lkey: wqe.wr.sge.lkey,
                    })
            };
            if !ok {
                return Err(fatal(NakCode::RemoteOperationalError, WcStatus::LocQpOpErr));
            }
            return Ok(Target::Recv { wqe, offset });
        }
        if op.is_write() {
            let (va, rkey, remaining, total) = match (self.cur, f.reth) {
                (
                    Some(InMsg::Write {
                        va,
                        rkey,
                        remaining,
                        total,
                    }),
                    _,
                ) => (va, rkey, remaining, total),
                (None, Some(r)) => (r.va, r.rkey, r.dma_len, r.dma_len),
                _ => return Err(INVALID),
            };
            let end = op.is_last() || op.is_only();
            if len > remaining || (end && len != remaining) {
                return Err(INVALID);
            }
            if f.immdt.is_some() && self.hold_recv(srq).is_none() {
                return Err(Refusal::NotReady);
            }
            return Ok(Target::Write {
                va,
                rkey,
                remaining,
                total,
            });
        }
        // A READ or ATOMIC response, after the delayed ACK it flushes first.
        if self.out.len() + 2 > self.out_cap as usize {
            return Err(Refusal::NoRoom);
        }
        match (f.reth, f.atomic) {
            (Some(r), _) if op == Opcode::ReadRequest => Ok(Target::Read(r, r.rkey)),
            (_, Some(a)) if op.has_atomic_eth() => Ok(Target::Atomic(a)),
            _ => Err(INVALID),
        }
    }

    /// R_Key, range and permission (rxe `check_rkey`) of a message's first packet, and
    /// ATOMIC alignment. The one place a remote key is checked. A zero-length WRITE or
    /// READ checks none: it need carry no valid R_Key or VA (IBA C9-88, rxe's "a
    /// zero-byte op is not required to set an addr or rkey"); UCX's rc_verbs flushes a
    /// QP with a zero-length WRITE to rkey 0 at VA 0 (rc_verbs_ep.c, 1.13).
    ///
    /// The target comes back with the key its bytes are reached through: the region's,
    /// also when the R_Key names a memory window bound to it (IBA 10.6.7.3).
    pub(super) fn check_rkey(&self, t: Target, cfg: &QpConfig, mrs: &MrTable) -> Check<Target> {
        let (rkey, va, len, need) = match t {
            Target::Recv { .. } => return Ok(t),
            Target::Write { .. } if self.cur.is_some() => return Ok(t),
            Target::Write {
                va, rkey, total, ..
            } => (rkey, va, u64::from(total), Access::REMOTE_WRITE),
            Target::Read(r, _) => (r.rkey, r.va, u64::from(r.dma_len), Access::REMOTE_READ),
            Target::Atomic(a) => {
                if a.va % 8 != 0 {
                    return Err(INVALID);
                }
                (a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
            }
        };
        if len == 0 {
            return Ok(t);
        }
        let key = mrs
            .check_remote_in(cfg.pd, cfg.qpn, rkey, va, len, need)
            .map_err(|_| ACCESS)?;
        Ok(match t {
            Target::Write {
                va,
                remaining,
                total,
                ..
            } => Target::Write {
                va,
                rkey: key,
                remaining,
                total,
            },
            Target::Read(r, _) => Target::Read(r, key),
            Target::Atomic(a) => Target::Atomic(AtomicEthRepr { rkey: key, ..a }),
            t => t,
        })
    }

    /// The IETH of a SEND Last/Only with Invalidate names a type 2 memory window that
    /// is bound (IBA 10.6.7.2.4, o10-37.2.26; rxe `invalidate_rkey`); otherwise the
    /// request is an invalid request (rxe completes the receive with
    /// `REM_INV_REQ_ERR`, and the QP enters ERR).
    pub(super) fn check_invalidate(&self, f: &RoceFrame<'_>, mrs: &MrTable) -> Check<()> {
        match f.ieth {
            None => Ok(()),
            Some(i) => match mrs.window(i.0) {
                Some(w) if w.kind == MwType::Two && w.binding.is_some() => Ok(()),
                _ => Err(INVALID),
            },
        }
    }

    /// Answers a refusal: the NAK and, for a fatal one, the completion of the receive
    /// WQE a SEND message was using (the QP's flush completes the others).
    pub(super) fn refuse(
        &mut self,
        f: &RoceFrame<'_>,
        r: Refusal,
        cfg: &QpConfig,
        out: &mut Outputs,
        srq: Option<&mut Srq>,
    ) -> Verdict {
        let p = f.bth.psn;
        match r {
            Refusal::Fatal { code, local } => {
                if f.bth.opcode.is_send() || matches!(self.cur, Some(InMsg::Send { .. })) {
                    if let Some(wqe) = self.take_recv(srq) {
                        out.push_wc(recv_wc(
                            wqe.wr.wr_id,
                            local,
                            WcOpcode::Recv,
                            0,
                            None,
                            cfg.qpn,
                            false,
                        ));
                    }
                }
                let item = self.ack_item(p, AethSyndrome::Nak(code));
                self.push_out(item, out);
                out.counters.count_error(|c| &mut c.nak_error_sent);
                Verdict::Error
            }
            Refusal::NotReady => {
                let item = self.ack_item(
                    p,
                    AethSyndrome::RnrNak {
                        timer: cfg.min_rnr_timer,
                    },
                );
                self.push_out(item, out);
                out.counters.count_error(|c| &mut c.rnr_nak_sent);
                Verdict::Continue
            }
            Refusal::NoRoom => {
                out.counters.resp_queue_full += 1;
                Verdict::Continue
            }
        }
    }

    /// A duplicate request (IBA 9.7.5.1.x, rxe `duplicate_request`): a READ is
    /// re-executed from memory when it asks for the rest of an earlier READ from one of
    /// its PSNs (a new, shorter PSN range; the region re-checked), superseding a replay
    /// of it still queued; ATOMICs are answered from the result cache, never executed
    /// twice; SEND/WRITE re-ACK the newest PSN received in order. Anything else is
    /// dropped (counted as a duplicate). On an `sr` QP (`part`) a READ may ask for a
    /// run of an earlier READ's responses ([`ReadResource::replay`]), and supersedes
    /// only a queued replay from the same PSN.
    pub(super) fn duplicate(
        &mut self,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &MrTable,
        out: &mut Outputs,
        part: bool,
    ) {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if op == Opcode::ReadRequest {
            let Some(r) = f.reth else { return };
            let Some(job) = self
                .read_cache
                .iter()
                .find_map(|res| res.replay(p, &r, cfg.pmtu, part))
            else {
                return;
            };
            let need = Access::REMOTE_READ;
            // A zero-length READ carries no key to check (C9-88, `check_rkey`).
            let mut job = job;
            if r.dma_len != 0 {
                match mrs.check_remote_in(cfg.pd, cfg.qpn, r.rkey, r.va, u64::from(r.dma_len), need)
                {
                    Ok(key) => job.rkey = key,
                    Err(_) => return,
                }
            }
            // go-back-N: the replay supersedes whatever of this READ is queued.
            // sr: whatever of it lies within the run asked for (a job still to
            // send what the replay sends again; a whole READ asked again while
            // its first reply is on its way replays from there once, not twice).
            let run_end = psn::add(p, job.npkts(cfg.pmtu));
            self.out.retain(|i| {
                !matches!(i, RespItem::Read(j) if j.msn == job.msn
                    && (!part || (psn::le(p, j.psn)
                        && psn::le(psn::add(j.psn, j.npkts(cfg.pmtu)), run_end))))
            });
            // Everything before it counts as delivered for the READ-response window.
            self.resp_acked_lsn = self.resp_next_lsn;
            if self.push_out(RespItem::Read(job), out) && part {
                // sr: a hole goes out before the responses queued behind it (IRN
                // §3.1 sends retransmissions first): the requester places them in
                // any order, and its completions wait for the hole alone.
                self.out.back_to_front();
            }
        } else if op.has_atomic_eth() {
            if let Some(&(_, orig)) = self.atomic_cache.iter().find(|(q, _)| *q == p) {
                let msn = self.msn;
                self.push_out(RespItem::AtomicAck { psn: p, msn, orig }, out);
            }
        } else {
            let item = self.ack_item(psn::sub(self.epsn, 1), AethSyndrome::ACK);
            self.push_out(item, out);
        }
    }
}
