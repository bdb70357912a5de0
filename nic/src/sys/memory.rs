//! The engine's side of registered memory (see [`super`]): the transport's
//! placement and the TX path's view of an operation in flight.

use std::sync::Arc;

use dpdk::ExtBuf;
use rdma::transport::MemorySpace;

/// A registered region as the engine reaches it: its key, its virtual
/// address (what work requests and peers name: the program's address) and
/// its memory (where the bytes are: the region's own allocation, the
/// program's pages, or the engine's own mapping of them, [`crate::shmem`]).
#[derive(Clone)]
pub(crate) struct MrMem {
    /// The region's key (lkey == rkey).
    pub(crate) key: u32,
    /// Virtual address of byte 0 of `mem`.
    pub(crate) va: u64,
    /// The memory.
    pub(crate) mem: Arc<ExtBuf>,
}

impl MrMem {
    /// The engine's address of `[va, va + len)` of the region of `key`, if
    /// the region in `regions` is still the one of that key and holds the
    /// range.
    #[inline]
    pub(crate) fn find(
        regions: &[Option<MrMem>],
        key: u32,
        va: u64,
        len: usize,
    ) -> Option<(&MrMem, usize)> {
        let r = key
            .checked_shr(8)
            .and_then(|k| k.checked_sub(1))
            .and_then(|k| regions.get(k as usize))
            .and_then(Option::as_ref)
            .filter(|r| r.key == key)?;
        let off = usize::try_from(va.checked_sub(r.va)?).ok()?;
        (off.checked_add(len)? <= r.mem.len()).then_some((r, off))
    }
}

/// Registered memory as the transport reaches it: by key, each region's
/// virtual address translated to where its bytes are ([`MrMem`]; a region
/// of the program's memory is reached through the engine's own mapping of
/// it, docs/design.md §5.4). The transport calls it only for a range an
/// [`rdma::transport::MrTable`] check accepted, and the engine keeps every
/// registered region's memory alive while it is in the table, so each
/// access lies in live memory (the contract a NIC's DMA engine has); a
/// range whose region left the table since (deregistered while an
/// operation was in flight) is not touched: a copy in is dropped, a copy
/// out reads zeros.
pub(crate) struct RawMemory<'a> {
    /// The engine's regions by slot (key >> 8, less one).
    pub(crate) regions: &'a [Option<MrMem>],
}

impl MemorySpace for RawMemory<'_> {
    fn copy_out_key(&self, key: u32, va: u64, dst: &mut [u8]) {
        let Some((r, off)) = MrMem::find(self.regions, key, va, dst.len()) else {
            dst.fill(0);
            return;
        };
        // SAFETY: `off..off + dst.len()` lies in the region's live memory
        // (checked by `find`); `dst` is the engine's own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(r.mem.base_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    fn copy_in_key(&mut self, key: u32, va: u64, src: &[u8]) {
        let Some((r, off)) = MrMem::find(self.regions, key, va, src.len()) else {
            return;
        };
        // SAFETY: as in `copy_out_key`; `src` (a received frame's payload,
        // in an mbuf) is not region memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), r.mem.base_ptr().add(off), src.len()) }
    }

    /// Unkeyed (not used by the transport, which names the key): the
    /// address as a pointer, right for regions at their own address only.
    fn copy_out(&self, va: u64, dst: &mut [u8]) {
        debug_assert!(false, "unkeyed access to registered memory");
        if dst.is_empty() {
            return;
        }
        // SAFETY: `va..va + dst.len()` was accepted by the MR table, so it
        // lies in a live registered region (see the type's docs); `dst` is
        // the engine's own buffer and cannot overlap a region.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, dst.as_mut_ptr(), dst.len()) }
    }

    /// Unkeyed, as [`Self::copy_out`].
    fn copy_in(&mut self, va: u64, src: &[u8]) {
        debug_assert!(false, "unkeyed access to registered memory");
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
