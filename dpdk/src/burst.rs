//! A fixed-size array of owned mbufs: the unit of work of every poll loop.

use std::mem::MaybeUninit;

use dpdk_sys::rte_mbuf;

use crate::Mbuf;

/// The burst size used throughout (docs/design.md §3).
pub const BURST_SIZE: usize = 32;

/// Up to `N` owned mbufs, stored inline (no allocation), laid out as the
/// `rte_mbuf*[]` that the burst functions take.
///
/// Received packets are appended at the end; transmitted ones leave from
/// the front, and what the driver did not take stays in the burst (so the
/// caller decides: retry or drop, and counts it). Dropping the burst frees
/// what it holds.
pub struct Burst<const N: usize = BURST_SIZE> {
    len: usize,
    slots: [MaybeUninit<Mbuf>; N],
}

impl<const N: usize> Default for Burst<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Burst<N> {
    /// An empty burst.
    pub fn new() -> Self {
        Burst {
            len: 0,
            // SAFETY: an array of MaybeUninit needs no initialisation.
            slots: unsafe { MaybeUninit::uninit().assume_init() },
        }
    }

    /// Number of mbufs held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is full.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == N
    }

    /// Maximum number of mbufs.
    #[inline]
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Adds an mbuf at the end; hands it back when full.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.len == N {
            return Err(m);
        }
        self.slots[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Removes the last mbuf.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot `len` was initialised and is now outside the burst.
        Some(unsafe { self.slots[self.len].assume_init_read() })
    }

    /// Moves mbufs from the front into `to`, in order, while it has room;
    /// the rest move up to the front (a FIFO: what a queue of frames waiting
    /// for the receive path needs). How many moved.
    #[inline]
    pub fn move_front_into<const M: usize>(&mut self, to: &mut Burst<M>) -> usize {
        let k = self.len.min(M - to.len);
        if k == 0 {
            return 0;
        }
        // SAFETY: slots 0..k of `self` are initialised and move out (they
        // leave `self`'s initialised prefix below); slots to.len..to.len+k
        // of `to` are free (k <= M - to.len); the remaining k..len move down
        // to 0..len-k within `self` (`copy` allows the overlap). Each mbuf
        // ends up owned exactly once.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.slots.as_ptr(),
                to.slots.as_mut_ptr().add(to.len),
                k,
            );
            std::ptr::copy(
                self.slots.as_ptr().add(k),
                self.slots.as_mut_ptr(),
                self.len - k,
            );
        }
        to.len += k;
        self.len -= k;
        k
    }

    /// The held mbufs.
    #[inline]
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: the first `len` slots are initialised.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr().cast(), self.len) }
    }

    /// The held mbufs, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: the first `len` slots are initialised.
        unsafe { std::slice::from_raw_parts_mut(self.slots.as_mut_ptr().cast(), self.len) }
    }

    /// Moves every mbuf out, in order; the burst is empty afterwards (even if
    /// the iterator is dropped early: the rest is freed).
    #[inline]
    pub fn drain(&mut self) -> Drain<'_, N> {
        let end = self.len;
        self.len = 0;
        Drain {
            burst: self,
            pos: 0,
            end,
        }
    }

    /// Frees everything held, in one `rte_pktmbuf_free_bulk` (the mbufs
    /// of one pool go back to it together); returns how many were freed.
    pub fn clear(&mut self) -> usize {
        let n = self.len;
        if n > 0 {
            self.len = 0;
            // SAFETY: the first `n` slots hold owned mbufs, laid out as the
            // `rte_mbuf*[]` it takes (segments and attached external
            // buffers are released as by `rte_pktmbuf_free`); with `len`
            // 0 nothing else frees them.
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(self.as_raw(), n as u32) };
        }
        n
    }

    /// Raw pointer to the first held mbuf.
    #[inline]
    pub(crate) fn as_raw(&mut self) -> *mut *mut rte_mbuf {
        self.slots.as_mut_ptr().cast()
    }

    /// Raw pointer to the free space and its size.
    #[inline]
    pub(crate) fn spare_raw(&mut self) -> (*mut *mut rte_mbuf, usize) {
        // SAFETY: len <= N, so the pointer stays inside (or one past) the array.
        let p = unsafe { self.slots.as_mut_ptr().add(self.len) };
        (p.cast(), N - self.len)
    }

    /// Marks `n` slots after the current end as initialised.
    ///
    /// # Safety
    /// Those slots must now hold valid, owned mbufs.
    #[inline]
    pub(crate) unsafe fn assume_init_spare(&mut self, n: usize) {
        debug_assert!(self.len + n <= N);
        self.len += n;
    }

    /// Forgets the first `n` mbufs (ownership went to the driver or a ring)
    /// and moves the rest to the front.
    #[inline]
    pub(crate) fn consume_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        let rest = self.len - n;
        if rest > 0 && n > 0 {
            // SAFETY: both ranges lie within the array; ptr::copy handles overlap.
            unsafe {
                std::ptr::copy(self.slots.as_ptr().add(n), self.slots.as_mut_ptr(), rest);
            }
        }
        self.len = rest;
    }
}

impl<const N: usize> Drop for Burst<N> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Owning iterator returned by [`Burst::drain`].
pub struct Drain<'a, const N: usize> {
    burst: &'a mut Burst<N>,
    pos: usize,
    end: usize,
}

impl<const N: usize> Iterator for Drain<'_, N> {
    type Item = Mbuf;
    #[inline]
    fn next(&mut self) -> Option<Mbuf> {
        if self.pos == self.end {
            return None;
        }
        // SAFETY: slots pos..end are initialised and read exactly once.
        let m = unsafe { self.burst.slots[self.pos].assume_init_read() };
        self.pos += 1;
        Some(m)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.end - self.pos, Some(self.end - self.pos))
    }
}

impl<const N: usize> ExactSizeIterator for Drain<'_, N> {}

impl<const N: usize> Drop for Drain<'_, N> {
    fn drop(&mut self) {
        for m in self.by_ref() {
            drop(m);
        }
    }
}
