//! Doorbells: how a program's post tells the engine that a QP has new work
//! requests in its ring, without a lock or a system call.
//!
//! Each QP has a flag; a post pushes its work request into the QP's ring,
//! then sets the flag, and queues the QP's number only if the flag was
//! clear. The engine pops a QP number, clears its flag, then drains the QP's
//! ring. So a QP is queued at most once until the engine takes it (the
//! queue never overflows) and the engine visits only QPs that rang.
//!
//! This file depends on nothing but [`crate::sync`], so that the model of it
//! under loom (`nic/loom`, `scripts/loom.sh`) runs the very code the engine
//! runs.

use crate::sync::{AtomicBool, IndexQueue, Ordering};

/// The doorbell flags and queue of one engine's QPs.
pub(crate) struct Doorbells {
    queue: IndexQueue,
    rung: Vec<AtomicBool>,
    /// The engine's first QPN (each shard of a device has its own range).
    qpn_base: u32,
}

impl Doorbells {
    /// Doorbells for `max_qps` QPs numbered from `qpn_base`.
    pub(crate) fn new(max_qps: usize, qpn_base: u32) -> Self {
        Doorbells {
            queue: IndexQueue::new(max_qps),
            rung: (0..max_qps).map(|_| AtomicBool::new(false)).collect(),
            qpn_base,
        }
    }

    /// The engine's first QPN.
    pub(crate) fn qpn_base(&self) -> u32 {
        self.qpn_base
    }

    /// The program's half: QP `qpn` has new work (call after pushing it into
    /// the QP's ring). A QPN outside the engine's range is ignored. Whether
    /// the QP was queued: only then may the engine be parked with nothing
    /// to find (if it was already rung, the engine has yet to take it or is
    /// taking it now, and its next drain of the ring sees the post), so
    /// only then does the caller wake it ([`crate::park`]).
    #[inline]
    pub(crate) fn ring(&self, qpn: u32) -> bool {
        let i = qpn.wrapping_sub(self.qpn_base) as usize;
        if let Some(flag) = self.rung.get(i) {
            if !flag.swap(true, Ordering::AcqRel) {
                let _ = self.queue.push(qpn);
                return true;
            }
        }
        false
    }

    /// Whether no QP waits to be taken (the engine's last check before it
    /// parks).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The engine's half: the next QP index with new work, its flag cleared
    /// so that the next post rings again (drain the QP's ring after this).
    ///
    /// The flag is cleared with an RMW, not a store: a plain release store
    /// may sit in the store buffer while the engine then reads the QP's ring
    /// (x86 lets a later load pass an earlier store); a poster whose
    /// `swap(true)` still saw `true` would skip queuing the QP, and its work
    /// request would wait for the next doorbell, forever for the last one.
    /// With RMWs on both sides, whichever comes second in the flag's order
    /// reads from the other, so the poster's ring push is visible to the
    /// engine's read of the ring.
    #[inline]
    pub(crate) fn take(&self) -> Option<usize> {
        let qpn = self.queue.pop()?;
        let i = (qpn - self.qpn_base) as usize;
        self.rung[i].swap(false, Ordering::AcqRel);
        Some(i)
    }
}
