//! Shared receive queue handles ([`SharedReceiveQueue`], `ibv_srq`; IBA
//! 10.2.9): receive WRs posted once for many RC QPs, which consume them in
//! posting order (rdma::transport::srq). Posting is lock-free, as for a QP:
//! the handle owns the producer end of the SRQ's doorbell ring, which the
//! engine empties every turn.

use std::sync::Arc;

use rdma::transport::{RecvWr, Sge};

use super::{request, Busy, VerbsError};
use crate::contract::{push_request, Command, CommandTx, Doorbell, DoorbellSlot, EngineShared};

/// The attributes of an SRQ (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// WQEs it holds (`max_wr`).
    pub max_wr: u16,
    /// SGEs per WQE (`max_sge`).
    pub max_sge: u8,
    /// The armed limit (`srq_limit`; 0: not armed).
    pub limit: u32,
}

/// A shared receive queue: QPs created with `QpOptions::srq` set to its
/// [`Self::id`] receive from it.
pub struct SharedReceiveQueue {
    pub(super) id: u32,
    pub(super) ring: rtrb::Producer<DoorbellSlot>,
    pub(super) shared: Arc<EngineShared>,
    pub(super) cmd: Option<CommandTx>,
    pub(super) max_sge: u8,
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DestroySrq {
                srq: self.id,
                reply: None,
            });
        }
    }
}

impl SharedReceiveQueue {
    /// Its id on its engine (what `QpOptions::srq` takes).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Posts a receive WR (`ibv_post_srq_recv`) whose buffer is `sgl` (up to
    /// `max_sge` SGEs; `wr.sge` ignored when `sgl` is given, else the one
    /// SGE). A full doorbell ring is [`VerbsError::QueueFull`] (ENOMEM). The
    /// local keys are checked when a QP uses the WQE (a bad one completes it
    /// with `LOC_QP_OP_ERR` there).
    pub fn post_recv(&mut self, wr: RecvWr, sgl: Option<&[Sge]>) -> Result<(), VerbsError> {
        let sgl = sgl.unwrap_or(std::slice::from_ref(&wr.sge));
        let max = usize::from(self.max_sge);
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        let wr = match sgl {
            [] => RecvWr {
                sge: Sge::default(),
                ..wr
            },
            [one] => RecvWr { sge: *one, ..wr },
            _ => wr,
        };
        push_request(&mut self.ring, Doorbell::Recv(wr), sgl)
            .map_err(|()| VerbsError::QueueFull)?;
        // The engine takes SRQ rings every turn: only a parked one needs
        // waking (as a command wakes it).
        self.shared.parker.wake();
        Ok(())
    }

    /// Arms its limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once fewer
    /// WQEs than `limit` remain, `AsyncEvent::SrqLimitReached` is raised
    /// and it disarms. 0 disarms; a limit above `max_wr` is refused.
    pub fn arm(&mut self, limit: u32) -> Result<(), VerbsError> {
        let srq = self.id;
        request(self.cmd.as_ref().ok_or(VerbsError::EngineGone)?, |reply| {
            Command::ArmSrq { srq, limit, reply }
        })
    }

    /// Its attributes (`ibv_query_srq`).
    pub fn query(&self) -> Result<SrqAttr, VerbsError> {
        let srq = self.id;
        let (max_wr, max_sge, limit) =
            request(self.cmd.as_ref().ok_or(VerbsError::EngineGone)?, |reply| {
                Command::QuerySrq { srq, reply }
            })?;
        Ok(SrqAttr {
            max_wr,
            max_sge,
            limit,
        })
    }

    /// Destroys it (`ibv_destroy_srq`); refused while a QP receives from it
    /// (the handle comes back). Its queued WQEs go without completions.
    pub fn destroy(mut self) -> Result<(), Busy<SharedReceiveQueue>> {
        let srq = self.id;
        let r = match &self.cmd {
            Some(c) => request(c, |reply| Command::DestroySrq {
                srq,
                reply: Some(reply),
            }),
            None => Ok(()),
        };
        match r {
            Ok(()) => {
                self.cmd = None;
                Ok(())
            }
            Err(error) => Err(Busy {
                handle: self,
                error,
            }),
        }
    }
}
