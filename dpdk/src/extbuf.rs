//! External buffers: memory that mbufs point into without copying.
//!
//! The NIC transmits large payloads straight from registered memory
//! (docs/design.md §3): an mbuf is attached to a window of the buffer with
//! `rte_pktmbuf_attach_extbuf`, and DPDK's shared-info reference count keeps
//! the memory alive until the last such mbuf is freed.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::Mbuf;

/// The heap block behind an [`ExtBuf`]: the memory and its shared info.
struct Block {
    /// The memory, if the block owns it (None: the caller's, [`ExtBuf::from_raw`],
    /// or a parent's, [`ExtBuf::view`]).
    _owned: Option<Owned>,
    /// The buffer whose memory this block views ([`ExtBuf::view`]), kept
    /// alive as long as this block is.
    _parent: Option<Arc<ExtBuf>>,
    /// The memory's address, taken once so attaching never reborrows it.
    base: *mut u8,
    len: usize,
    /// References taken in the shared info's count ahead of the attaches
    /// that use them ([`ATTACH_BATCH`] at a time); may dip below zero for
    /// a moment while threads attach at once (each that takes the count to
    /// zero or below adds a batch before it attaches).
    credit: AtomicI32,
    /// DPDK's shared info, on a cache line of its own: whoever frees an
    /// attached mbuf (the receiving core) decrements its count, and the
    /// attaching core should not have to fetch that line back for `base`,
    /// `len` or `credit`.
    shinfo: OwnLine<dpdk_sys::rte_mbuf_ext_shared_info>,
}

/// A value alone on its cache line(s).
#[repr(C, align(64))]
struct OwnLine<T>(T);

/// References an attach takes from the shared info's count at once: the
/// count is written by the attaching core once per this many attaches, not
/// on each, so its cache line stays with the core that frees the mbufs
/// (one atomic each, as DPDK frees them). With one QP sending 64 KiB WRITEs
/// the line moving between the two cores on every frame was 4-5 % of the
/// receiving engine's samples on the 2-core VM.
const ATTACH_BATCH: i32 = 64;

impl Block {
    fn new(owned: Option<Owned>, parent: Option<Arc<ExtBuf>>, base: *mut u8, len: usize) -> Self {
        Block {
            _owned: owned,
            _parent: parent,
            base,
            len,
            credit: AtomicI32::new(0),
            shinfo: OwnLine(dpdk_sys::rte_mbuf_ext_shared_info::default()),
        }
    }
}

/// Memory a block owns, held only to be freed with it.
enum Owned {
    /// [`ExtBuf::new`]'s.
    Boxed { _data: Box<[u8]> },
    /// [`ExtBuf::zeroed_pages`]'s.
    Pages { _pages: Pages },
    /// [`ExtBuf::with_owner`]'s: whatever keeps the memory mapped.
    Other { _owner: Box<dyn Send + Sync> },
}

/// The page size [`ExtBuf::zeroed_pages`] aligns to.
const PAGE: usize = 4096;

/// Zeroed, page-aligned heap memory, freed with the layout it was allocated
/// with.
struct Pages {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Pages {
    /// `len` (> 0) zeroed bytes at a page boundary; aborts as `Vec` does when
    /// the allocator has none.
    fn zeroed(len: usize) -> Pages {
        let layout = std::alloc::Layout::from_size_align(len, PAGE).expect("region size");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Pages { ptr, layout }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: allocated in `Pages::zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A block of memory that mbufs can be attached to.
///
/// The `ExtBuf` holds `HANDLE_REFS` references and every attached mbuf one
/// more; the memory is freed by whichever goes last (the handle's drop, or
/// DPDK's free callback when the last mbuf is freed, possibly by a driver on
/// another thread).
pub struct ExtBuf {
    block: NonNull<Block>,
}

// SAFETY: the block is only freed through the atomic reference count, and
// the handle's methods read only fields fixed at creation.
unsafe impl Send for ExtBuf {}
// SAFETY: as for Send; writes through `base_ptr` are the caller's unsafe.
unsafe impl Sync for ExtBuf {}

/// References the handle holds. Two, not one: DPDK's
/// `rte_mbuf_ext_refcnt_update` takes a non-atomic shortcut when it reads a
/// count of 1 (read, then plain store), which is only safe while a single
/// thread can touch the count. Two threads attaching mbufs to the same
/// buffer (two NIC shards sending from one registered region) could both
/// read 1 and both store 2, losing a reference, and the block would be freed
/// under the handle. With the handle holding two, the count is never 1 while
/// attaches can happen, so every update is atomic; once the handle is gone
/// only mbufs hold references, and the one that reads 1 is the last.
const HANDLE_REFS: u16 = 2;

unsafe extern "C" fn free_block(_addr: *mut c_void, opaque: *mut c_void) {
    // SAFETY: `opaque` is the Box<Block> leaked in ExtBuf::new, and this runs
    // exactly once, when the reference count reaches zero.
    drop(unsafe { Box::from_raw(opaque as *mut Block) });
}

impl ExtBuf {
    /// Takes ownership of `data` as attachable memory.
    pub fn new(data: Box<[u8]>) -> ExtBuf {
        let mut data = data;
        let (base, len) = (data.as_mut_ptr(), data.len());
        Self::with_block(Block::new(
            Some(Owned::Boxed { _data: data }),
            None,
            base,
            len,
        ))
    }

    /// `len` zeroed bytes (at least one) starting at a page boundary, every
    /// page faulted in now, as `ibv_reg_mr` pins a region's pages.
    ///
    /// Page-aligned, as programs allocate what they register (perftest's
    /// `memalign(page_size)`): two regions then sit at the same offset
    /// within their pages, and a copy between the same offsets of two
    /// regions runs at one speed. With the allocator's 16-byte alignment
    /// their offsets depend on what was allocated before (glibc mmaps a
    /// large block or takes it from the heap, by a threshold that moves),
    /// and so did the engine's copy speed (docs/benchmarks.md, NIC
    /// goodput). Faulted in because zeroed memory is mapped
    /// lazily: the first touch of each page would otherwise be a page fault
    /// in the engine's copy (with 16k QPs' buffers, most of the engine's time
    /// in the first seconds).
    pub fn zeroed_pages(len: usize) -> ExtBuf {
        let pages = Pages::zeroed(len.max(1));
        let (base, len) = (pages.ptr.as_ptr(), pages.layout.size());
        for i in (0..len).step_by(PAGE) {
            // A store of a zero the compiler cannot see (it would drop a store
            // of the zero already there): the kernel maps a private page.
            // SAFETY: `i < len`, inside the allocation, which nobody else sees yet.
            unsafe { base.add(i).write_volatile(std::hint::black_box(0)) };
        }
        Self::with_block(Block::new(
            Some(Owned::Pages { _pages: pages }),
            None,
            base,
            len,
        ))
    }

    /// Memory the caller owns (`len` bytes at `base`), attachable like
    /// [`ExtBuf::new`]'s but never freed by it.
    ///
    /// # Safety
    /// `base..base + len` must be valid for reads and writes, and stay so
    /// (not freed, not reused) until this handle is dropped and
    /// [`ExtBuf::refs`] has been 1 since (no mbuf attached any more: an
    /// attached mbuf reads the memory until the driver frees it).
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> ExtBuf {
        Self::with_block(Block::new(None, None, base, len))
    }

    /// Memory that `owner` keeps valid (`len` bytes at `base`, e.g. a
    /// mapping `owner` unmaps when dropped): attachable like
    /// [`ExtBuf::new`]'s, and `owner` is dropped with the last reference
    /// (the handle's, or the last attached mbuf's, on whichever thread
    /// frees it), so the memory outlives every frame that points into it.
    ///
    /// # Safety
    /// `base..base + len` must be valid for reads and writes as long as
    /// `owner` lives.
    pub unsafe fn with_owner(base: *mut u8, len: usize, owner: Box<dyn Send + Sync>) -> ExtBuf {
        Self::with_block(Block::new(
            Some(Owned::Other { _owner: owner }),
            None,
            base,
            len,
        ))
    }

    /// Another handle on the same memory with a reference count of its
    /// own (its own `rte_mbuf_ext_shared_info`). It keeps `self` alive
    /// until it and every mbuf attached through it are gone; `self`'s
    /// [`ExtBuf::refs`] counts only mbufs attached through `self`.
    ///
    /// Why: every attach and every free updates the count atomically, so
    /// threads attaching to one buffer (NIC shards sending from one
    /// registered region, and the threads that free their frames) all
    /// write one cache line. A view per thread keeps each count on the
    /// cores that use it.
    pub fn view(self: &Arc<Self>) -> ExtBuf {
        Self::with_block(Block::new(
            None,
            Some(self.clone()),
            self.base_ptr(),
            self.len(),
        ))
    }

    fn with_block(block: Block) -> ExtBuf {
        let block = Box::new(block);
        let block = NonNull::from(Box::leak(block));
        // SAFETY: we own the block; refcount 1 is the handle's own reference.
        unsafe {
            let b = block.as_ptr();
            (*b).shinfo.0.free_cb = Some(free_block);
            (*b).shinfo.0.fcb_opaque = b.cast();
            dpdk_sys::shim_rte_mbuf_ext_refcnt_set(&mut (*b).shinfo.0, HANDLE_REFS);
        }
        ExtBuf { block }
    }

    /// Length of the memory.
    pub fn len(&self) -> usize {
        // SAFETY: the block lives while we hold a reference.
        unsafe { self.block.as_ref().len }
    }

    /// Whether the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes at `offset` of the memory, read-only; None when out of
    /// range.
    ///
    /// # Safety
    /// Nobody may write these bytes (through [`ExtBuf::base_ptr`]) while the
    /// returned reference lives. Other bytes of the memory may be written
    /// meanwhile: the reference covers only the window.
    pub unsafe fn window(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if offset.checked_add(len)? > self.len() {
            return None;
        }
        // SAFETY: the block lives while we hold a reference; the window is
        // inside base..base+len (owned, or the caller's under `from_raw`'s
        // contract); the caller keeps writers off it.
        Some(unsafe { std::slice::from_raw_parts(self.block.as_ref().base.add(offset), len) })
    }

    /// The memory, writable; only while no mbuf is attached.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if self.refs() != 1 {
            return None;
        }
        // SAFETY: no mbuf refers to it and we have `&mut self`.
        Some(unsafe {
            let b = self.block.as_ref();
            std::slice::from_raw_parts_mut(b.base, b.len)
        })
    }

    /// The memory's base address, for a datapath that writes into it while
    /// mbufs may be reading other parts of it (the NIC's RX path placing an
    /// RDMA WRITE into a registered region). Writing through it is the
    /// caller's responsibility, exactly as a NIC's DMA is: it must not write
    /// bytes an attached mbuf carries or an [`ExtBuf::window`] covers.
    pub fn base_ptr(&self) -> *mut u8 {
        // SAFETY: the block lives while we hold a reference.
        unsafe { self.block.as_ref().base }
    }

    /// References held: this handle (counted once) plus one per attached
    /// mbuf. Exact while no attach runs at the same time (the references
    /// taken ahead of attaches are subtracted, and they are another count).
    pub fn refs(&self) -> u16 {
        // SAFETY: the block lives while we hold a reference.
        let (n, credit) = unsafe {
            let b = self.block.as_ref();
            (
                dpdk_sys::shim_rte_mbuf_ext_refcnt_read(&b.shinfo.0),
                b.credit.load(Ordering::Acquire),
            )
        };
        let ahead = u16::try_from(credit.max(0)).unwrap_or(u16::MAX);
        n - (HANDLE_REFS - 1) - ahead
    }

    /// Attaches `m` (an empty mbuf, typically from a pool with no data room)
    /// to `offset..offset+len` of this memory; `m` then carries those bytes
    /// as its data. `len` is at most 65535 (`buf_len` is 16 bits).
    pub fn attach(&self, m: &mut Mbuf, offset: usize, len: usize) -> Result<()> {
        let total = self.len();
        let end = offset.saturating_add(len);
        if end > total || len > u16::MAX as usize {
            return Err(Error::MbufRoom {
                op: "attach_extbuf",
                need: end,
                room: total.min(u16::MAX as usize),
            });
        }
        if m.pkt_len() != 0 || m.nb_segs() != 1 || m.has_extbuf() {
            return Err(Error::InvalidArgument(
                format!("{m:?}"),
                "attach needs an empty, direct, single-segment mbuf",
            ));
        }
        // SAFETY: the range is inside the block; the mbuf's reference is in
        // the count before the mbuf is attached (taken ahead, or a batch
        // added here), so the block outlives it.
        unsafe {
            let b = self.block.as_ptr();
            if (*b).credit.fetch_sub(1, Ordering::AcqRel) <= 0 {
                dpdk_sys::shim_rte_mbuf_ext_refcnt_update(&mut (*b).shinfo.0, ATTACH_BATCH as i16);
                (*b).credit.fetch_add(ATTACH_BATCH, Ordering::AcqRel);
            }
            let addr = (*b).base.add(offset);
            // Software PMDs use virtual addresses; a hardware NIC would need
            // rte_extmem_register + rte_dev_dma_map for a real IOVA.
            m.attach_extbuf_raw(addr, addr as u64, len as u16, &mut (*b).shinfo.0);
        }
        m.append(len)?;
        Ok(())
    }
}

impl Drop for ExtBuf {
    fn drop(&mut self) {
        // SAFETY: drop our reference; free the block if it was the last one.
        unsafe {
            let b = self.block.as_ptr();
            // The handle's references and those taken ahead of attaches
            // (none can run: this is the last handle). The count is at least
            // HANDLE_REFS here, so this update is DPDK's atomic one.
            let ahead = (*b).credit.swap(0, Ordering::AcqRel).max(0);
            let give_back = HANDLE_REFS as i32 + ahead;
            if dpdk_sys::shim_rte_mbuf_ext_refcnt_update(&mut (*b).shinfo.0, -(give_back as i16))
                == 0
            {
                drop(Box::from_raw(b));
            }
        }
    }
}
