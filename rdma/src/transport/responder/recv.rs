//! The responder's receive WQEs (IBA 10.7.2.1, 11.2.3): posting to the QP's
//! own receive queue, and the WQE of the message at hand, from that queue
//! or held from a shared receive queue (crate::transport::srq) with a copy
//! of its scatter list until the message completes.

use super::{recv_wc, Responder};
use crate::transport::config::{QpConfig, QpError};
use crate::transport::mr::MrTable;
use crate::transport::output::CompletionQueue;
use crate::transport::rq::{admit_recv, RecvWqe};
use crate::transport::sgl::SglRef;
use crate::transport::srq::Srq;
use crate::transport::wc::{RecvWr, Sge, WcOpcode, WcStatus};

impl Responder {
    /// Checks a receive WR (every buffer must be LOCAL_WRITE) and queues it.
    /// `sgl`, when given, is the WR's whole scatter list (`wr.sge` ignored;
    /// at most `max_recv_sge` entries, IBA 10.7.2.1).
    pub fn post_recv(
        &mut self,
        wr: RecvWr,
        sgl: Option<&[Sge]>,
        cfg: &QpConfig,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if self.uses_srq {
            // Its receives come from the SRQ (ibv_post_recv: EINVAL).
            return Err(QpError::Config("the QP receives from an SRQ"));
        }
        if self.rq.len() >= cfg.rq_depth as usize {
            return Err(QpError::QueueFull);
        }
        let wqe = admit_recv(wr, sgl, &mut self.rq_sgls, cfg.pd, Some(mrs))?;
        crate::transport::inline_deque::push_compact(&mut self.rq, wqe);
        Ok(())
    }

    /// The receive WQE of the message at hand, without consuming it: the
    /// one held, else the QP's oldest; a QP on an SRQ takes the SRQ's oldest
    /// now and holds it (with a copy of its scatter list) until the message
    /// completes or fails.
    pub(super) fn hold_recv(&mut self, srq: Option<&mut Srq>) -> Option<RecvWqe> {
        if let Some(w) = self.held {
            return Some(w);
        }
        if !self.uses_srq {
            return self.rq.front().copied();
        }
        let mut w = srq?.take(&mut self.held_sgl)?;
        if w.sgl.is_list() {
            w.sgl = SglRef::held(self.held_sgl.len() as u8);
        }
        self.held = Some(w);
        Some(w)
    }

    /// Consumes the receive WQE of the message at hand (its completion or
    /// failure): the one held, else the QP's oldest, else (a QP on an SRQ
    /// that held none yet) the SRQ's oldest.
    pub(super) fn take_recv(&mut self, srq: Option<&mut Srq>) -> Option<RecvWqe> {
        if let Some(w) = self.held.take() {
            return Some(w);
        }
        if !self.uses_srq {
            return self.rq.pop_front();
        }
        srq?.take(&mut self.held_sgl)
    }

    /// The scatter list of receive WQE `w` (empty: its own SGE).
    pub(super) fn recv_sgl(&self, w: &RecvWqe) -> &[Sge] {
        if w.sgl.is_held() {
            &self.held_sgl
        } else {
            self.rq_sgls.get(w.sgl)
        }
    }

    /// Completes every receive WQE with WR_FLUSH_ERR: the QP entered ERR
    /// (with an SRQ, the one it held; the SRQ's others stay for other QPs).
    pub fn flush(&mut self, qpn: u32, cq: &mut CompletionQueue) {
        while let Some(r) = self.held.take().or_else(|| self.rq.pop_front()) {
            cq.push_back(recv_wc(
                r.wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                qpn,
                false,
            ));
        }
    }
}
