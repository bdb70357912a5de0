//! The engine's side of registered memory (see [`super`]): the transport's
//! placement and the TX path's view of an operation in flight.

use dpdk::ExtBuf;
use rdma::transport::MemorySpace;

/// Registered memory seen as the process's address space: a region's
/// virtual address is its pointer (docs/design.md §5). The transport calls it only
/// for a range an [`rdma::transport::MrTable`] check accepted, and the engine
/// keeps every registered region alive while it is in the table, so each
/// access lies in live memory (the contract a NIC's DMA engine has).
pub(crate) struct RawMemory;

impl MemorySpace for RawMemory {
    fn copy_out(&self, va: u64, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        // SAFETY: `va..va + dst.len()` was accepted by the MR table, so it
        // lies in a live registered region (see the type's docs); `dst` is
        // the engine's own buffer and cannot overlap a region.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, dst.as_mut_ptr(), dst.len()) }
    }

    fn copy_in(&mut self, va: u64, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        // SAFETY: as in `copy_out`: a live registered range, and `src` (a
        // received frame's payload, in an mbuf) is not region memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), va as *mut u8, src.len()) }
    }
}

/// `len` bytes at `offset` of `mem`, the payload of one operation in flight,
/// for the TX path to copy into a frame and hash; None when out of range.
#[inline]
pub(crate) fn in_flight(mem: &ExtBuf, offset: usize, len: usize) -> Option<&[u8]> {
    // SAFETY: the bytes belong to a posted work request; the verbs contract
    // (module docs) keeps every writer off them until it completes, and the
    // reference does not outlive the frame being built.
    unsafe { mem.window(offset, len) }
}
