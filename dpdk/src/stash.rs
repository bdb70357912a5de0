//! Mbufs taken from a pool ahead of use, and prefetched.
//!
//! Where another core frees the mbufs this one sends (a ring pair's peer, a
//! sharded device's dispatcher), each freed mbuf's header lines sit modified
//! in that core's cache, and `rte_pktmbuf_alloc` stalls on their transfer
//! when it resets the mbuf (its first read, of `buf_len`). An [`MbufStash`]
//! takes the mbufs [`STASH_REFILL`] at a time and prefetches each
//! [`PREFETCH_AHEAD`] allocations before it hands it out, so the transfer is
//! done by then, as DPDK's drivers prefetch the descriptors and mbufs they
//! will touch a few packets ahead. One mbuf at a time, not a whole refill:
//! 128 prefetches in a row fill the core's miss queue and stall themselves
//! (docs/benchmarks.md has the figures).

use std::sync::Arc;

use dpdk_sys::rte_mbuf;

use crate::error::{Error, Result};
use crate::prefetch;
use crate::{Mbuf, Mempool};

/// Mbufs taken from the pool at a time.
pub const STASH_REFILL: usize = 32;
/// How many allocations ahead an mbuf is prefetched: a TX path allocates one
/// every 100-300 ns, a line moves between cores in about 100.
pub const PREFETCH_AHEAD: usize = 8;
/// Most mbufs a stash holds: a refill happens when at most
/// [`PREFETCH_AHEAD`] are left.
const STASH_CAP: usize = PREFETCH_AHEAD + STASH_REFILL;
/// The mbuf header's two cache lines (`struct rte_mbuf` is 128 bytes).
const HEADER_LINES: usize = 2;
/// Data lines prefetched from where a fresh mbuf's data starts: a RoCEv2
/// frame's headers (70 bytes for a WRITE's first packet) span two.
const DATA_LINES: usize = 2;
const LINE: usize = 64;

/// A stash of mbufs of one pool, for one thread (module docs).
///
/// Dropping it returns what it holds to the pool. The mbufs it holds count as
/// in use ([`Mempool::in_use`]).
pub struct MbufStash {
    pool: Arc<Mempool>,
    /// A FIFO: `len` mbufs from `head`, wrapping; the first
    /// `min(len, PREFETCH_AHEAD)` of them are prefetched.
    slots: [*mut rte_mbuf; STASH_CAP],
    head: usize,
    len: usize,
    /// From an mbuf's address to where its data starts after a reset; `None`
    /// for a pool without data room.
    data_offset: Option<usize>,
}

// SAFETY: the stash owns its mbufs exclusively, as an `Mbuf` does, and mbufs
// may move between threads; the pool is `Sync`.
unsafe impl Send for MbufStash {}

impl MbufStash {
    /// An empty stash of `pool` (filled on the first allocation).
    pub fn new(pool: Arc<Mempool>) -> Result<MbufStash> {
        // One mbuf, reset, says where the pool's data starts.
        let probe = pool.alloc()?;
        let data_offset = (probe.tailroom() > 0)
            .then(|| probe.data().as_ptr() as usize - probe.as_ptr() as usize);
        drop(probe);
        Ok(MbufStash {
            pool,
            slots: [std::ptr::null_mut(); STASH_CAP],
            head: 0,
            len: 0,
            data_offset,
        })
    }

    /// The pool it takes from.
    pub fn pool(&self) -> &Arc<Mempool> {
        &self.pool
    }

    /// Mbufs held now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Mbufs of the pool in use outside this stash: the pool's in-use count
    /// less what the stash holds (the leak check of whoever allocates
    /// through it).
    pub fn handed_out(&self) -> u32 {
        self.pool.in_use() - self.len as u32
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One mbuf, reset (empty, default headroom), as [`Mempool::alloc`] gives.
    #[inline]
    pub fn alloc(&mut self) -> Result<Mbuf> {
        if self.len <= PREFETCH_AHEAD {
            self.refill();
            if self.len == 0 {
                return Err(Error::PoolExhausted(self.pool.name().to_owned()));
            }
        }
        let m = self.slots[self.head];
        self.head = (self.head + 1) % STASH_CAP;
        self.len -= 1;
        if self.len >= PREFETCH_AHEAD {
            // The one that has just come within reach.
            self.prefetch_mbuf(self.slots[(self.head + PREFETCH_AHEAD - 1) % STASH_CAP]);
        }
        // SAFETY: `m` came from the pool's get and nobody else has it; a reset
        // makes it what `rte_pktmbuf_alloc` returns.
        unsafe {
            dpdk_sys::shim_rte_pktmbuf_reset(m);
            Ok(Mbuf::from_raw(m))
        }
    }

    /// Returns every mbuf it holds to the pool (the next allocation takes
    /// more): an idle holder then keeps none out of the pool, so that a
    /// pool's in-use count is what is really in flight.
    pub fn release(&mut self) {
        while self.len > 0 {
            let run = self.len.min(STASH_CAP - self.head);
            // SAFETY: these `run` mbufs came from this pool's get, untouched
            // since (no reset), and are returned once.
            unsafe {
                dpdk_sys::shim_rte_mempool_put_bulk(
                    self.pool.as_ptr(),
                    self.slots[self.head..].as_ptr().cast(),
                    run as u32,
                );
            }
            self.head = (self.head + run) % STASH_CAP;
            self.len -= run;
        }
    }

    /// Takes [`STASH_REFILL`] mbufs (fewer when the pool is short),
    /// prefetching those that fall within [`PREFETCH_AHEAD`] of the head.
    #[cold]
    #[inline(never)]
    fn refill(&mut self) {
        let mut got = [std::ptr::null_mut::<rte_mbuf>(); STASH_REFILL];
        let mut n = STASH_REFILL.min(STASH_CAP - self.len);
        // The bulk get is all or nothing: ask for less when the pool is short.
        while n > 0 {
            // SAFETY: `got` has room for `n` pointers; on success all are set.
            let rc = unsafe {
                dpdk_sys::shim_rte_mempool_get_bulk(
                    self.pool.as_ptr(),
                    got.as_mut_ptr().cast(),
                    n as u32,
                )
            };
            if rc == 0 {
                break;
            }
            n /= 2;
        }
        for &m in &got[..n] {
            if self.len < PREFETCH_AHEAD {
                self.prefetch_mbuf(m);
            }
            self.slots[(self.head + self.len) % STASH_CAP] = m;
            self.len += 1;
        }
    }

    #[inline]
    fn prefetch_mbuf(&self, m: *mut rte_mbuf) {
        let m = m.cast::<u8>();
        for l in 0..HEADER_LINES {
            prefetch(m.wrapping_add(l * LINE));
        }
        if let Some(off) = self.data_offset {
            for l in 0..DATA_LINES {
                prefetch(m.wrapping_add(off + l * LINE));
            }
        }
    }
}

impl Drop for MbufStash {
    fn drop(&mut self) {
        self.release();
    }
}
