//! The engine's end of a completion queue: the producer of the CQ's ring,
//! and its completion channel when the program sleeps on it
//! ([`crate::notify`]). The hot path pushes through [`CqRing::push`], which
//! signals an armed channel once and otherwise costs a branch, and wakes
//! the program if it parked waiting for a completion (crate::park: a fence
//! and a load unless it sleeps).

use std::sync::Arc;

use rdma::transport::{WcStatus, WorkCompletion};

use crate::notify::CqNotify;
use crate::park::Parker;

/// One CQ id's slot in the engine.
pub(crate) struct CqRing {
    /// The ring's producer; None once the CQ is destroyed (its id is free).
    ring: Option<rtrb::Producer<WorkCompletion>>,
    /// The completion channel, if the program asked for one.
    notify: Option<Arc<CqNotify>>,
    /// Where a program waiting on the CQ sleeps.
    waiter: Option<Arc<Parker>>,
    /// The program dropped its handle while QPs still used the CQ: it is
    /// freed with its last QP.
    pub(super) orphaned: bool,
}

impl CqRing {
    pub(super) fn new(
        ring: rtrb::Producer<WorkCompletion>,
        notify: Option<Arc<CqNotify>>,
        waiter: Arc<Parker>,
    ) -> Self {
        CqRing {
            ring: Some(ring),
            notify,
            waiter: Some(waiter),
            orphaned: false,
        }
    }

    /// Whether the id is taken (a live CQ, or an orphan waiting for its QPs).
    pub(super) fn in_use(&self) -> bool {
        self.ring.is_some()
    }

    /// Frees the CQ (its id may be reused).
    pub(super) fn free(&mut self) {
        self.ring = None;
        self.notify = None;
        self.waiter = None;
        self.orphaned = false;
    }

    /// Moves the completions queued in the current ring (`old`, the
    /// program's consumer end) into `ring`, in order, and completes into
    /// `ring` from now on ([`crate::contract::Command::ResizeCq`]). Refused,
    /// with `old` given back and nothing changed, for a destroyed CQ or when
    /// more completions are queued than `ring` holds (rxe_cq_chk_attr:
    /// EINVAL for a size below the number of entries in the CQ).
    pub(super) fn resize(
        &mut self,
        mut ring: rtrb::Producer<WorkCompletion>,
        new: rtrb::Consumer<WorkCompletion>,
        mut old: rtrb::Consumer<WorkCompletion>,
    ) -> (rtrb::Consumer<WorkCompletion>, bool) {
        if self.ring.is_none() || old.slots() > ring.slots() {
            return (old, false);
        }
        while let Ok(wc) = old.pop() {
            // Cannot fail: the new ring has room for all of them (checked).
            let _ = ring.push(wc);
        }
        self.ring = Some(ring);
        (new, true)
    }

    /// Free entries (0 for a destroyed CQ).
    #[inline]
    pub(super) fn slots(&self) -> usize {
        self.ring.as_ref().map_or(0, rtrb::Producer::slots)
    }

    /// Pushes a completion (gives it back if the ring is full or the CQ is
    /// destroyed), signals the completion channel if it is armed and wakes
    /// the program if it parked on the CQ.
    #[inline]
    pub(super) fn push(&mut self, wc: WorkCompletion) -> Result<(), WorkCompletion> {
        let ring = self.ring.as_mut().ok_or(wc)?;
        let solicited = solicits(&wc);
        ring.push(wc).map_err(|rtrb::PushError::Full(wc)| wc)?;
        if let Some(n) = &self.notify {
            n.completed(solicited);
        }
        if let Some(w) = &self.waiter {
            // A waiter that asked for N completions (CompletionQueue::
            // wait_batch) sleeps until N are queued. The producer's count
            // of free slots can lag the consumer's pops, so this counts
            // high, never low.
            w.wake_when(|| ring.buffer().capacity() - ring.slots());
        }
        Ok(())
    }
}

/// Whether `wc` ends the wait of a CQ armed for solicited completions only.
/// `ibv_req_notify_cq(3)`: "A CQE is solicited if it is a receive
/// completion for a message with the Solicited Event header bit set, or if
/// the status is not successful. All other successful receive completions,
/// or any successful send completion is unsolicited." (IBA 11.4.2.2; rxe
/// passes the received packet's SE bit to `rxe_cq_post`.)
#[inline]
pub(crate) fn solicits(wc: &WorkCompletion) -> bool {
    wc.solicited || wc.status != WcStatus::Success
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::transport::WcOpcode;

    #[test]
    fn what_solicits() {
        let recv = WorkCompletion {
            opcode: WcOpcode::Recv,
            ..WorkCompletion::BLANK
        };
        assert!(!solicits(&recv), "a receive without SE");
        assert!(solicits(&WorkCompletion {
            solicited: true,
            ..recv
        }));
        assert!(!solicits(&WorkCompletion::BLANK), "a successful send");
        for status in [WcStatus::RemAccessErr, WcStatus::WrFlushErr] {
            assert!(solicits(&WorkCompletion {
                status,
                ..WorkCompletion::BLANK
            }));
        }
    }
}
