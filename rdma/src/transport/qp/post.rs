//! Posting to a [`Qp`]: send work requests (RC/UC, UD with their destination,
//! gathered SGLs, the zero-packet local ones: memory-window binds and local
//! invalidations, IBA 10.8.2.3 and 11.4.1.1), receive work requests, and what
//! a work request posted in ERR gets (a WR_FLUSH_ERR completion, IBA 10.3.1).

use super::*;

impl Qp {
    /// A work request posted in ERR completes at once with WR_FLUSH_ERR.
    pub(super) fn flushed(&mut self, wr_id: u64, opcode: WcOpcode) {
        self.out.push_wc(WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.cfg.qpn,
            solicited: false,
            src_qp: 0,
            grh: false,
        });
    }

    /// Posts a send work request. The local SGE is checked against `mrs` now; a failure is
    /// returned synchronously instead of as a LOC_PROT_ERR completion.
    pub fn post_send(&mut self, wr: SendWr, mrs: &MrTable) -> Result<(), QpError> {
        self.post_send_sgl(wr, None, mrs)
    }

    /// Posts a UD send work request to `dest` (`ibv_post_send` with `wr.ud`; `sgl` as
    /// [`Self::post_send_sgl`]). Only SEND and SEND with immediate, of at most the
    /// path MTU (IBA 9.8: one packet per message; `ibv_port_attr.max_msg_sz` of a UD
    /// QP), and only on a UD QP: anything else is refused
    /// ([`QpError::InvalidWr`], rxe's EINVAL). Where IBA C10-93.1.1 lets a CI drop
    /// an over-long UD message silently (rxe fakes its success), this transport
    /// refuses it at post, so the caller learns of it.
    pub fn post_send_ud(
        &mut self,
        wr: SendWr,
        dest: UdDest,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if self.cfg.service != Service::Ud {
            return Err(QpError::InvalidWr("a UD destination on a connected QP"));
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendImm(_)) {
            return Err(QpError::InvalidWr("UD has SEND only"));
        }
        if dest.remote_qpn > psn::MASK {
            return Err(QpError::InvalidWr("remote QPN above 24 bits"));
        }
        let len = match sgl {
            Some(l) => crate::transport::sgl::total_len(l).ok_or(QpError::LocalLength)?,
            None => wr.sge.len,
        };
        if len > self.cfg.pmtu {
            return Err(QpError::InvalidWr("a UD message is at most the path MTU"));
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.ud_dests.len() >= self.ud_dests.capacity()
        {
            return Err(QpError::QueueFull);
        }
        self.post_checked(wr, sgl, mrs)?;
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            crate::transport::inline_deque::push_compact(&mut self.ud_dests, dest);
        }
        Ok(())
    }

    /// [`Self::post_send`] of a work request whose gather list (or READ
    /// scatter list) is `sgl` (`wr.sge` ignored; up to
    /// [`QpConfig::max_send_sge`] entries, each checked now).
    pub fn post_send_sgl(
        &mut self,
        wr: SendWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if wr.op.is_local() {
            return Err(QpError::InvalidWr("a local operation: post_local"));
        }
        match self.cfg.service {
            Service::Rc => {}
            // IBA 9.8.2 / rxe `validate_send_wr`: UC has SEND and RDMA WRITE only.
            Service::Uc if wr.op.needs_response() => {
                return Err(QpError::InvalidWr("UC has no READ or ATOMIC"))
            }
            // IBA table 38: SEND with Invalidate is RC's alone.
            Service::Uc if matches!(wr.op, SendOp::SendInv(_)) => {
                return Err(QpError::InvalidWr("UC has no SEND with Invalidate"))
            }
            Service::Uc => {}
            Service::Ud => return Err(QpError::InvalidWr("UD needs a destination: post_send_ud")),
        }
        self.post_checked(wr, sgl, mrs)
    }

    /// Queues a send work request the service allows (or flushes it in ERR).
    pub(super) fn post_checked(
        &mut self,
        wr: SendWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {
                self.req.post(wr, sgl, &mut self.sq_sgls, &self.cfg, mrs)
            }
            QpState::Err => {
                self.flushed(wr.wr_id, wr.op.wc_opcode());
                Ok(())
            }
            s => Err(QpError::BadState(s)),
        }
    }

    /// Posts a local operation ([`SendOp::is_local`]: `IBV_WR_BIND_MW`,
    /// `IBV_WR_LOCAL_INV`) and executes it on `mrs` now, when the device takes it
    /// from the send queue's doorbell, in the order of the work requests posted on
    /// this QP (IBA 10.6.7.2; rxe executes it when its requester reaches it, which
    /// orders it the same way against this QP's other work requests). Its
    /// completion comes in send-queue order, after those posted before it; one that
    /// failed completes with `MW_BIND_ERR` (a bind) or `LOC_QP_OP_ERR` (an
    /// invalidation) and the QP then enters ERR, so nothing posted after it runs.
    /// RC QPs only (rsnic's limit; rxe also binds on UC).
    pub fn post_local(&mut self, wr: SendWr, mrs: &mut MrTable) -> Result<(), QpError> {
        if !wr.op.is_local() {
            return Err(QpError::InvalidWr("not a local operation"));
        }
        if self.cfg.service != Service::Rc {
            return Err(QpError::InvalidWr("memory windows are bound on RC QPs"));
        }
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.flushed(wr.wr_id, wr.op.wc_opcode());
                return Ok(());
            }
            s => return Err(QpError::BadState(s)),
        }
        if self.req.sq.len() >= self.cfg.sq_depth as usize {
            return Err(QpError::QueueFull);
        }
        let err = if self.req.local_failed() {
            // The QP enters ERR before this one's turn: it is flushed, not run.
            Some(WcStatus::WrFlushErr)
        } else {
            match wr.op {
                SendOp::BindMw(b) => mrs
                    .bind_window(self.cfg.pd, self.cfg.qpn, &b)
                    .err()
                    .map(|_| WcStatus::MwBindErr),
                SendOp::LocalInv(rkey) => mrs.invalidate(rkey).err().map(|_| WcStatus::LocQpOpErr),
                _ => None,
            }
        };
        self.req.post_local(wr, err, &self.cfg)?;
        self.complete_local_front();
        Ok(())
    }

    /// Completes the local operations at the front of the send queue: everything
    /// posted before them has completed. A failed one moves the QP to ERR with its
    /// status (the rest flushed).
    pub(super) fn complete_local_front(&mut self) {
        while let Some(w) = self.req.sq.front().copied() {
            if !w.wr.op.is_local() {
                return;
            }
            if let Some(st) = w.local_err {
                self.enter_error(Some(st));
                return;
            }
            self.req.pop_front();
            if w.wr.signaled {
                self.out.push_wc(WorkCompletion {
                    wr_id: w.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: w.wr.op.wc_opcode(),
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                    solicited: false,
                    src_qp: 0,
                    grh: false,
                });
            }
        }
    }

    /// Posts a receive work request (buffer must be LOCAL_WRITE).
    pub fn post_recv(&mut self, wr: RecvWr, mrs: &MrTable) -> Result<(), QpError> {
        self.post_recv_sgl(wr, None, mrs)
    }

    /// [`Self::post_recv`] of a work request whose scatter list is `sgl`
    /// (`wr.sge` ignored; up to [`QpConfig::max_recv_sge`] entries).
    pub fn post_recv_sgl(
        &mut self,
        wr: RecvWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        match self.state {
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {
                self.resp.post_recv(wr, sgl, &self.cfg, mrs)
            }
            QpState::Err => {
                self.flushed(wr.wr_id, WcOpcode::Recv);
                Ok(())
            }
            s => Err(QpError::BadState(s)),
        }
    }

    /// The gather list a [`Payload::Gather`] of this QP's packets refers
    /// to (empty for any other payload): the NIC attaches its
    /// [`crate::transport::sgl::pieces`].
    #[inline]
    pub fn gather_list(&self, p: &Payload) -> &[Sge] {
        match *p {
            Payload::Gather { sgl, .. } => self.sq_sgls.get(sgl),
            _ => &[],
        }
    }
}
