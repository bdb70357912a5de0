//! Packet buffer pools.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Burst, Eal, Mbuf};

/// A DPDK packet mbuf pool (`rte_pktmbuf_pool_create`).
///
/// Shared with `Arc`: ports keep their RX pool alive. Mbufs do not hold a
/// reference (that would cost an atomic per packet), so dropping the last
/// `Arc` while mbufs are still out would be unsound; in that case the pool
/// is deliberately leaked (and a warning logged) instead of freed.
pub struct Mempool {
    raw: NonNull<dpdk_sys::rte_mempool>,
    name: String,
    packed: bool,
}

// SAFETY: rte_mempool is designed for concurrent use from many threads.
unsafe impl Send for Mempool {}
// SAFETY: as for Send (get/put are thread-safe, the cache is per lcore).
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Default data room: 2 KiB of packet data plus the standard headroom.
    pub const DEFAULT_DATA_ROOM: u16 = dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

    /// Creates a pool of `n` mbufs with a per-lcore cache of `cache` and
    /// `data_room` bytes per buffer (headroom included; 0 makes a pool of
    /// bare mbufs for attaching external buffers).
    ///
    /// In IOVA-as-VA mode the mbufs are packed back to back rather than one
    /// per 4 KiB page (see [`Mempool::is_packed`]).
    pub fn new(_eal: &Eal, name: &str, n: u32, cache: u32, data_room: u16) -> Result<Arc<Self>> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(name.into(), "contains a NUL byte"))?;
        // SAFETY: the EAL is initialised (proved by `_eal`).
        let packed = unsafe { dpdk_sys::rte_eal_iova_mode() } == dpdk_sys::RTE_IOVA_VA;
        // SAFETY: valid C string; the EAL is initialised.
        let raw = unsafe {
            if packed {
                pool_create_packed(&cname, n, cache, data_room)
            } else {
                dpdk_sys::rte_pktmbuf_pool_create(
                    cname.as_ptr(),
                    n,
                    cache,
                    0,
                    data_room,
                    dpdk_sys::SOCKET_ID_ANY,
                )
            }
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rte_pktmbuf_pool_create"))?;
        Ok(Arc::new(Mempool {
            raw,
            name: name.to_owned(),
            packed,
        }))
    }

    /// Whether the pool was made with `RTE_MEMPOOL_F_NO_IOVA_CONTIG` (IOVA
    /// as VA): mbufs packed back to back instead of one per 4 KiB page
    /// without hugepages, which put every mbuf of a burst in the same L1
    /// cache set (see `pool_create_packed` in this module's source).
    pub fn is_packed(&self) -> bool {
        self.packed
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw pointer, for calls the safe layer does not cover.
    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_mempool {
        self.raw.as_ptr()
    }

    /// Total number of mbufs in the pool.
    pub fn capacity(&self) -> u32 {
        // SAFETY: the pointer is valid for the pool's lifetime.
        unsafe { (*self.raw.as_ptr()).size }
    }

    /// Mbufs currently allocated (not in the pool or its caches): the leak
    /// check of every test.
    pub fn in_use(&self) -> u32 {
        // SAFETY: valid pool.
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }

    /// Mbufs available for allocation.
    pub fn available(&self) -> u32 {
        // SAFETY: valid pool.
        unsafe { dpdk_sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Allocates one mbuf (reset, empty, default headroom).
    #[inline]
    pub fn alloc(&self) -> Result<Mbuf> {
        // SAFETY: valid pool; a non-null result is a fresh mbuf we now own.
        let m = unsafe { dpdk_sys::shim_rte_pktmbuf_alloc(self.raw.as_ptr()) };
        if m.is_null() {
            Err(Error::PoolExhausted(self.name.clone()))
        } else {
            // SAFETY: a non-null result is a fresh mbuf nobody else owns.
            Ok(unsafe { Mbuf::from_raw(m) })
        }
    }

    /// Fills the free space of `burst` with fresh mbufs, all or nothing.
    #[inline]
    pub fn alloc_bulk<const N: usize>(&self, burst: &mut Burst<N>) -> Result<usize> {
        let (ptr, room) = burst.spare_raw();
        if room == 0 {
            return Ok(0);
        }
        // SAFETY: `ptr` has room for `room` pointers; on success all are set.
        let rc =
            unsafe { dpdk_sys::shim_rte_pktmbuf_alloc_bulk(self.raw.as_ptr(), ptr, room as u32) };
        if rc != 0 {
            return Err(Error::PoolExhausted(self.name.clone()));
        }
        // SAFETY: on success the bulk call set all `room` spare slots.
        unsafe { burst.assume_init_spare(room) };
        Ok(room)
    }
}

/// `rte_pktmbuf_pool_create` (DPDK 22.11 `rte_mbuf.c`, step for step) with
/// `RTE_MEMPOOL_F_NO_IOVA_CONTIG`, for IOVA-as-VA mode.
///
/// Without hugepages (`--no-huge`, how this project runs, docs/design.md §10) the
/// mempool keeps each object inside one 4 KiB page unless told that objects
/// need no contiguous IOVA; an mbuf with a 2 KiB data room (2.3 KiB with its
/// header) then takes a page of its own, so every mbuf starts at the same
/// offset in its page. All of a burst's mbuf headers (and frame starts) then
/// fall in the same L1 cache set, 32 lines for 8 ways, and miss L1 on every
/// packet (the TX pipeline bench showed the mbuf header stores as a quarter of
/// its time, and the stride in the pointers was 4096). When IOVA is VA,
/// virtually contiguous is IOVA-contiguous, so the flag costs nothing: objects
/// are packed back to back (a stride of 37 cache lines, spread over all sets).
/// Measured on the TX pipeline bench (docs/benchmarks.md): 0.64 of testpmd
/// txonly before, 0.84 after, same frames. With hugepages the mempool packs
/// objects anyway (pages are larger than an object); the flag changes nothing
/// there.
///
/// # Safety
/// The EAL is initialised and its IOVA mode is VA.
unsafe fn pool_create_packed(
    name: &CString,
    n: u32,
    cache: u32,
    data_room: u16,
) -> *mut dpdk_sys::rte_mempool {
    let elt_size = std::mem::size_of::<dpdk_sys::rte_mbuf>() as u32 + u32::from(data_room);
    let mut priv_ = dpdk_sys::rte_pktmbuf_pool_private {
        mbuf_data_room_size: data_room,
        mbuf_priv_size: 0,
        flags: 0,
    };
    // SAFETY: plain DPDK calls on the pool created here, in the order
    // `rte_pktmbuf_pool_create_by_ops` makes them; every failure frees it.
    unsafe {
        let mp = dpdk_sys::rte_mempool_create_empty(
            name.as_ptr(),
            n,
            elt_size,
            cache,
            std::mem::size_of::<dpdk_sys::rte_pktmbuf_pool_private>() as u32,
            dpdk_sys::SOCKET_ID_ANY,
            dpdk_sys::RTE_MEMPOOL_F_NO_IOVA_CONTIG,
        );
        if mp.is_null() {
            return mp;
        }
        let ops = dpdk_sys::rte_mbuf_best_mempool_ops();
        let rc = dpdk_sys::rte_mempool_set_ops_byname(mp, ops, std::ptr::null_mut());
        if rc != 0 {
            dpdk_sys::rte_mempool_free(mp);
            return std::ptr::null_mut();
        }
        dpdk_sys::rte_pktmbuf_pool_init(mp, (&raw mut priv_).cast());
        if dpdk_sys::rte_mempool_populate_default(mp) < 0 {
            dpdk_sys::rte_mempool_free(mp);
            return std::ptr::null_mut();
        }
        dpdk_sys::rte_mempool_obj_iter(mp, Some(dpdk_sys::rte_pktmbuf_init), std::ptr::null_mut());
        mp
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        let in_use = self.in_use();
        if in_use == 0 {
            // SAFETY: no mbuf of this pool is outstanding, and no port can
            // still use it (ports hold an Arc).
            unsafe { dpdk_sys::rte_mempool_free(self.raw.as_ptr()) };
        } else {
            tracing::warn!(pool = %self.name, in_use, "mempool dropped with mbufs in use; leaking it");
        }
    }
}

impl std::fmt::Debug for Mempool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.name)
            .field("capacity", &self.capacity())
            .field("in_use", &self.in_use())
            .finish()
    }
}
