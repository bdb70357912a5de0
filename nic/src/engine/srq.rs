//! Shared receive queues on the engine (IBA 10.2.9; `rdma::transport::Srq`):
//! each SRQ's doorbell ring, taken every turn into the SRQ; create, arm,
//! query and destroy from the slow path. A QP created with
//! `QpOptions::srq` receives from it (rx.rs `deliver`), which raises
//! `AsyncEvent::SrqLimitReached` when its armed limit is crossed.

use rdma::transport::{QpError, Srq};

use super::doorbells::next_request;
use super::Engine;
use crate::contract::{Doorbell, DoorbellSlot, EngineError};

/// An SRQ and what feeds it.
pub(super) struct SrqSlot {
    pub(super) srq: Srq,
    ring: rtrb::Consumer<DoorbellSlot>,
    /// QPs receiving from it (it cannot be destroyed while any do).
    pub(super) users: u32,
    /// Its receive WRs wait in the ring: the SRQ was full.
    blocked: bool,
}

impl Engine {
    pub(super) fn create_srq(
        &mut self,
        pd: u32,
        depth: u16,
        max_sge: u8,
        ring: rtrb::Consumer<DoorbellSlot>,
    ) -> Result<u32, EngineError> {
        let srq = Srq::new(depth, max_sge, pd)
            .map_err(|source| EngineError::Transport { qpn: 0, source })?;
        let slot = SrqSlot {
            srq,
            ring,
            users: 0,
            blocked: false,
        };
        let i = match self.srqs.iter().position(Option::is_none) {
            Some(i) => {
                self.srqs[i] = Some(slot);
                i
            }
            None => {
                self.srqs.push(Some(slot));
                self.srqs.len() - 1
            }
        };
        Ok(i as u32)
    }

    pub(super) fn srq_slot(&mut self, srq: u32) -> Result<&mut SrqSlot, EngineError> {
        self.srqs
            .get_mut(srq as usize)
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoSuchSrq(srq))
    }

    pub(super) fn arm_srq(&mut self, srq: u32, limit: u32) -> Result<(), EngineError> {
        // What was posted before the arm counts.
        self.srq_doorbells();
        self.srq_slot(srq)?
            .srq
            .arm(limit)
            .map_err(|source| EngineError::Transport { qpn: 0, source })
    }

    pub(super) fn query_srq(&mut self, srq: u32) -> Result<(u16, u8, u32), EngineError> {
        let s = self.srq_slot(srq)?;
        Ok((s.srq.depth(), s.srq.max_sge(), s.srq.limit()))
    }

    /// Destroys `srq` unless a QP receives from it; its queued WQEs go
    /// without completions (`ibv_destroy_srq(3)`).
    pub(super) fn destroy_srq(&mut self, srq: u32) -> Result<(), EngineError> {
        let s = self.srq_slot(srq)?;
        if s.users > 0 {
            return Err(EngineError::SrqBusy(srq));
        }
        self.srqs[srq as usize] = None;
        Ok(())
    }

    /// Takes the receive WRs posted to every SRQ into it (one with several
    /// SGEs takes several slots, contract::Doorbell::Sges). A full SRQ
    /// leaves them in the ring until QPs consume WQEs; a WR the SRQ refuses
    /// (too many SGEs) is dropped and counted: an SRQ has no CQ to complete
    /// it to. Local keys are checked when a QP uses the WQE, as rxe does.
    pub(super) fn srq_doorbells(&mut self) {
        let mut sges = None;
        for s in self.srqs.iter_mut().flatten() {
            if s.blocked && s.srq.len() >= usize::from(s.srq.depth()) {
                continue;
            }
            s.blocked = false;
            while let Some(next) = next_request(&mut s.ring, &mut sges) {
                let Ok((d, sgl, used)) = next else {
                    self.counters.completion_errors += 1;
                    continue;
                };
                let r = match d {
                    Doorbell::Recv(wr) => s.srq.post(wr, sgl),
                    // Only receives are posted to an SRQ.
                    _ => Err(QpError::Config("not a receive")),
                };
                match r {
                    Err(QpError::QueueFull) => {
                        s.blocked = true;
                        break;
                    }
                    Err(_) => self.counters.completion_errors += 1,
                    Ok(()) => {}
                }
                if let Ok(c) = s.ring.read_chunk(used) {
                    c.commit_all();
                }
            }
        }
    }
}
