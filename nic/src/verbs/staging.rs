//! A QP's send staging memory: where the bytes of an inline send
//! (`IBV_SEND_INLINE`: copied at post time, no lkey) are put, so the engine
//! sends them as one local buffer. Requests with SGEs stay zero-copy, with
//! one SGE or several (rdma::transport::sgl).
//!
//! One region per QP (in the QP's PD), cut into slots used round robin.
//! A slot is reused only after `slots` later posts; as a send WR stays in
//! the doorbell ring (at most `sq_depth + rq_depth` entries) or in the
//! QP's send queue (at most `sq_depth`, until acknowledged, after which no
//! retransmission reads it), `2 * sq_depth + rq_depth` slots are never
//! overwritten while their WR may still be read.

use rdma::transport::{Access, Sge};

use super::mr::MemoryRegion;
use crate::contract::QpOptions;
use crate::error::VerbsError;

/// The staging memory of one QP.
pub(crate) struct Staging {
    mr: MemoryRegion,
    slot_bytes: usize,
    slots: usize,
    next: usize,
}

impl Staging {
    /// The slot size a QP with `opts` needs (0: no staging).
    pub(crate) fn slot_bytes(opts: &QpOptions) -> usize {
        opts.max_inline_data as usize
    }

    /// Staging over `mr`, registered for a QP with `opts` with
    /// [`Self::region_len`] bytes.
    pub(crate) fn new(mr: MemoryRegion, opts: &QpOptions) -> Staging {
        Staging {
            mr,
            slot_bytes: Self::slot_bytes(opts),
            slots: Self::slots(opts),
            next: 0,
        }
    }

    fn slots(opts: &QpOptions) -> usize {
        2 * opts.sq_depth as usize + opts.rq_depth as usize
    }

    /// The region's length for a QP with `opts` (0: none needed).
    pub(crate) fn region_len(opts: &QpOptions) -> usize {
        Self::slot_bytes(opts) * Self::slots(opts)
    }

    /// The access the region is registered with.
    pub(crate) const ACCESS: Access = Access::LOCAL_WRITE;

    /// Copies `data` into the next slot; the SGE of the staged bytes (a
    /// payload longer than a slot is refused).
    pub(crate) fn stage(&mut self, data: &[u8]) -> Result<Sge, VerbsError> {
        if data.len() > self.slot_bytes {
            return Err(VerbsError::TooLong {
                len: data.len(),
                max: self.slot_bytes,
            });
        }
        let base = self.next * self.slot_bytes;
        self.mr.write(base, data);
        self.next = (self.next + 1) % self.slots;
        Ok(Sge {
            addr: self.mr.va() + base as u64,
            len: data.len() as u32,
            lkey: self.mr.lkey(),
        })
    }
}
