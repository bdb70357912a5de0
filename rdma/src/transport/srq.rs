//! Shared receive queues (IBA vol. 1 10.2.9 and 11.2.3; Linux rxe
//! `rxe_srq.c`): one queue of receive WQEs that many RC QPs of a protection
//! domain consume from, in posting order. A QP takes a WQE when a message
//! that needs one starts (a SEND's first packet, a WRITE with immediate's
//! last) and holds it, with a copy of its scatter list, until the message
//! completes (rxe's `srq_wqe`); the SRQ can be armed with a limit, and
//! raises the "limit reached" event once when fewer WQEs remain (IBA
//! 11.3.3.3, `IBV_EVENT_SRQ_LIMIT_REACHED`).

use super::config::QpError;
use super::rq::{admit_recv, RecvWqe};
use super::sgl::{SglStore, MAX_SGE};
use super::wc::{RecvWr, Sge};
use std::collections::VecDeque;

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    rq: VecDeque<RecvWqe>,
    sgls: SglStore,
    depth: u16,
    max_sge: u8,
    pd: u32,
    /// The armed limit (0: not armed).
    limit: u32,
    /// The limit was crossed since the last [`Srq::take_limit_event`].
    limit_reached: bool,
}

impl Srq {
    /// An SRQ of `depth` WQEs (`ibv_srq_attr.max_wr`) of up to `max_sge`
    /// SGEs each, in protection domain `pd`.
    pub fn new(depth: u16, max_sge: u8, pd: u32) -> Result<Srq, QpError> {
        if depth == 0 || max_sge == 0 || usize::from(max_sge) > MAX_SGE {
            return Err(QpError::Config("SRQ depth > 0, 1..=32 SGEs"));
        }
        Ok(Srq {
            rq: VecDeque::with_capacity(depth.into()),
            sgls: SglStore::new(depth, max_sge),
            depth,
            max_sge,
            pd,
            limit: 0,
            limit_reached: false,
        })
    }

    /// Checks a receive WR (its SGE count and length) and queues it; `sgl`
    /// as [`super::Qp::post_recv_sgl`]. Its local keys are checked when a
    /// QP uses it (the SRQ has no CQ to report a bad one to): a key not
    /// LOCAL_WRITE in the SRQ's PD then completes the WQE with
    /// `LOC_QP_OP_ERR` on that QP, as rxe's malformed-WQE path does.
    pub fn post(&mut self, wr: RecvWr, sgl: Option<&[Sge]>) -> Result<(), QpError> {
        if self.rq.len() >= usize::from(self.depth) {
            return Err(QpError::QueueFull);
        }
        let wqe = admit_recv(wr, sgl, &mut self.sgls, self.pd, None)?;
        super::inline_deque::push_compact(&mut self.rq, wqe);
        Ok(())
    }

    /// WQEs queued.
    pub fn len(&self) -> usize {
        self.rq.len()
    }

    /// No WQE queued.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }

    /// Its depth (`max_wr`).
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// The most SGEs a WQE may carry (`max_sge`).
    pub fn max_sge(&self) -> u8 {
        self.max_sge
    }

    /// Its protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when a QP
    /// takes a WQE and fewer than `limit` remain, the event is raised once
    /// and the SRQ disarms (as rxe checks it, on consumption). 0 disarms. A
    /// limit above the depth is refused.
    pub fn arm(&mut self, limit: u32) -> Result<(), QpError> {
        if limit > u32::from(self.depth) {
            return Err(QpError::Config("SRQ limit above its depth"));
        }
        self.limit = limit;
        Ok(())
    }

    /// The armed limit (`ibv_query_srq`'s `srq_limit`; 0 when not armed).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Whether the limit was crossed since the last call (the NIC raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    fn check_limit(&mut self) {
        if self.limit > 0 && (self.rq.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
    }

    /// Takes the oldest WQE for a QP, its scatter list copied into `sgl`
    /// (cleared first): the QP holds both until the message completes.
    pub(super) fn take(&mut self, sgl: &mut Vec<Sge>) -> Option<RecvWqe> {
        let w = self.rq.pop_front()?;
        sgl.clear();
        sgl.extend_from_slice(self.sgls.get(w.sgl));
        self.check_limit();
        Some(w)
    }

    /// Drops every queued WQE (the SRQ is destroyed: no completions, as
    /// `ibv_destroy_srq` discards them); how many.
    pub fn clear(&mut self) -> usize {
        let n = self.rq.len();
        self.rq.clear();
        n
    }
}
