//! The owned packet buffer.

use std::ptr::NonNull;

use dpdk_sys::rte_mbuf;

use crate::error::{Error, Result};

/// An owned DPDK packet buffer (possibly a chain of segments).
///
/// `repr(transparent)` over a non-null `rte_mbuf*`, so a `[Mbuf]` is a
/// `rte_mbuf*[]` and goes straight to the burst functions. Dropping it frees
/// the whole chain back to its pool; transmitting it hands ownership to the
/// driver. All data access is bounds-checked against the segment lengths, so
/// a short or empty packet can be read without undefined behaviour.
#[repr(transparent)]
pub struct Mbuf(NonNull<rte_mbuf>);

// SAFETY: an mbuf is owned by exactly one Mbuf; DPDK mbufs may move between
// threads (that is what rings are for).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid mbuf that nobody else owns or frees.
    #[inline]
    pub unsafe fn from_raw(raw: *mut rte_mbuf) -> Mbuf {
        debug_assert!(!raw.is_null());
        // SAFETY: the caller passes a valid, hence non-null, mbuf.
        Mbuf(unsafe { NonNull::new_unchecked(raw) })
    }

    /// Gives up ownership without freeing.
    #[inline]
    pub fn into_raw(self) -> *mut rte_mbuf {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The raw pointer (still owned by `self`).
    #[inline]
    pub fn as_ptr(&self) -> *mut rte_mbuf {
        self.0.as_ptr()
    }

    #[inline]
    fn raw(&self) -> &rte_mbuf {
        // SAFETY: we own a valid mbuf.
        unsafe { self.0.as_ref() }
    }

    /// Bytes in the first segment.
    #[inline]
    pub fn data_len(&self) -> usize {
        self.raw().data_len as usize
    }

    /// Bytes in the whole packet (all segments).
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Number of segments in the chain.
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        self.raw().nb_segs
    }

    /// The input port of a received packet.
    #[inline]
    pub fn port(&self) -> u16 {
        self.raw().port
    }

    /// Free bytes in front of the data (first segment).
    ///
    /// `rte_pktmbuf_headroom` (`data_off`) written out in Rust: the switch's INT push
    /// asks for it per frame, and through the C shim it was a call each time.
    #[inline]
    pub fn headroom(&self) -> usize {
        self.raw().data_off as usize
    }

    /// Hints the CPU to load the first cache line of the data (a packet's headers)
    /// ahead of use, as DPDK's `rte_prefetch0`: a batch of frames is prefetched
    /// before the first is parsed, so the loads overlap.
    #[inline]
    pub fn prefetch_data(&self) {
        let m = self.raw();
        crate::prefetch((m.buf_addr as *const u8).wrapping_add(m.data_off as usize));
    }

    /// Hints the CPU to load the metadata (`struct rte_mbuf`, two cache
    /// lines) of segment `depth` of the chain (0: this mbuf), reading the
    /// `next` pointers of the segments before it: a receiver walks a chain
    /// another core wrote one dependent load after another, so it
    /// prefetches a frame's chain in stages, a segment deeper each stage,
    /// as each stage's lines arrive (nothing past the chain's end).
    #[inline]
    pub fn prefetch_segment_meta(&self, depth: usize) {
        if let Some(seg) = self.segment_ptr(depth) {
            let p = seg.cast::<u8>().cast_const();
            crate::prefetch(p);
            crate::prefetch(p.wrapping_add(64));
        }
    }

    /// Hints the CPU to load the first line of segment `depth`'s data (the
    /// headers in segment 0, the ICRC in a trailer), reading that segment's
    /// metadata and the `next` pointers before it
    /// ([`Mbuf::prefetch_segment_meta`]'s stages).
    #[inline]
    pub fn prefetch_segment_data(&self, depth: usize) {
        if let Some(seg) = self.segment_ptr(depth) {
            // SAFETY: every segment of an owned chain is valid.
            let m = unsafe { &*seg };
            crate::prefetch((m.buf_addr as *const u8).wrapping_add(m.data_off as usize));
        }
    }

    /// Segment `depth` of the chain (0: this mbuf), if the chain is that long.
    #[inline]
    fn segment_ptr(&self, depth: usize) -> Option<*mut rte_mbuf> {
        let mut seg = self.as_ptr();
        for _ in 0..depth {
            // SAFETY: `seg` is a segment of our chain, hence valid.
            seg = unsafe { (*seg).next };
            if seg.is_null() {
                return None;
            }
        }
        Some(seg)
    }

    /// Free bytes after the data of the last segment.
    ///
    /// `rte_pktmbuf_tailroom` written out in Rust (it is a static inline
    /// function: through the C shim it cost a call per packet on the TX path).
    #[inline]
    pub fn tailroom(&self) -> usize {
        // SAFETY: valid mbuf chain that we own; `last_seg` follows `next`
        // pointers DPDK keeps valid.
        unsafe { seg_tailroom(last_seg(self.as_ptr())) }
    }

    /// The data of the first segment.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: buf_addr + data_off .. + data_len lies inside the buffer
        // (DPDK's invariant), and we own it.
        unsafe { seg_slice(self.as_ptr()) }
    }

    /// The data of the first segment, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let m = self.as_ptr();
        // SAFETY: as in `data`, and `&mut self` makes the access unique.
        unsafe {
            let len = (*m).data_len as usize;
            let p = ((*m).buf_addr as *mut u8).add((*m).data_off as usize);
            std::slice::from_raw_parts_mut(p, len)
        }
    }

    /// Iterates the data of every segment in order.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: self.as_ptr(),
            _owner: std::marker::PhantomData,
        }
    }

    /// Copies `out.len()` bytes starting at `offset` (across segments).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(out.len());
        if end > self.pkt_len() {
            return Err(Error::MbufRoom {
                op: "read",
                need: end,
                room: self.pkt_len(),
            });
        }
        let mut skip = offset;
        let mut done = 0;
        for seg in self.segments() {
            if done == out.len() {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let take = (seg.len() - skip).min(out.len() - done);
            out[done..done + take].copy_from_slice(&seg[skip..skip + take]);
            done += take;
            skip = 0;
        }
        Ok(())
    }

    /// The whole packet as one vector (tests and slow paths only).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.pkt_len());
        for seg in self.segments() {
            v.extend_from_slice(seg);
        }
        v
    }

    /// Grows the packet at the end by `n` bytes and returns them.
    ///
    /// `rte_pktmbuf_append` written out in Rust (a static inline function in
    /// DPDK; through the C shim it cost two calls per packet on the TX path).
    #[inline]
    pub fn append(&mut self, n: usize) -> Result<&mut [u8]> {
        let m = self.as_ptr();
        // SAFETY: we own the valid chain `m` (and `&mut self` makes the access
        // unique); `n` fits in the last segment's tailroom, so the returned
        // bytes lie inside its buffer, after its data; the lengths stay
        // consistent (data_len of the last segment and pkt_len of the first
        // grow by the same `n`, which fits u16 because the tailroom does).
        unsafe {
            let last = last_seg(m);
            let room = seg_tailroom(last);
            if n > room {
                return Err(Error::MbufRoom {
                    op: "append",
                    need: n,
                    room,
                });
            }
            let p = ((*last).buf_addr as *mut u8)
                .add((*last).data_off as usize + (*last).data_len as usize);
            (*last).data_len += n as u16;
            (*m).pkt_len += n as u32;
            Ok(std::slice::from_raw_parts_mut(p, n))
        }
    }

    /// Appends `bytes` at the end of the packet.
    #[inline]
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> Result<()> {
        self.append(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Grows the packet at the front by `n` bytes (taken from the headroom)
    /// and returns them.
    ///
    /// `rte_pktmbuf_prepend` written out in Rust (a static inline function: through
    /// the C shim it cost a call per frame on the switch's INT push).
    #[inline]
    pub fn prepend(&mut self, n: usize) -> Result<&mut [u8]> {
        let room = self.headroom();
        let data_len = self.data_len();
        if n > room || data_len + n > usize::from(u16::MAX) {
            return Err(Error::MbufRoom {
                op: "prepend",
                need: n,
                room,
            });
        }
        let m = self.as_ptr();
        // SAFETY: we own the mbuf (`&mut self`); `n <= data_off`, so the new start
        // `buf_addr + data_off - n` is still inside the buffer, and the new
        // `data_len` fits its u16 (checked above). This is what DPDK's inline
        // function does to the same three fields.
        unsafe {
            (*m).data_off -= n as u16;
            (*m).data_len += n as u16;
            (*m).pkt_len += n as u32;
            let p = ((*m).buf_addr as *mut u8).add((*m).data_off as usize);
            Ok(std::slice::from_raw_parts_mut(p, n))
        }
    }

    /// Removes `n` bytes from the front of the first segment.
    #[inline]
    pub fn adj(&mut self, n: usize) -> Result<()> {
        let room = self.data_len();
        if n > room {
            return Err(Error::MbufRoom {
                op: "adj",
                need: n,
                room,
            });
        }
        // SAFETY: n <= data_len of the first segment.
        let p = unsafe { dpdk_sys::shim_rte_pktmbuf_adj(self.as_ptr(), n as u16) };
        if p.is_null() {
            return Err(Error::MbufRoom {
                op: "adj",
                need: n,
                room,
            });
        }
        Ok(())
    }

    /// Removes `n` bytes from the end of the last segment.
    #[inline]
    pub fn trim(&mut self, n: usize) -> Result<()> {
        // SAFETY: valid chain.
        let room = unsafe { (*last_seg(self.as_ptr())).data_len as usize };
        if n > room {
            return Err(Error::MbufRoom {
                op: "trim",
                need: n,
                room,
            });
        }
        // SAFETY: n <= data_len of the last segment.
        let rc = unsafe { dpdk_sys::shim_rte_pktmbuf_trim(self.as_ptr(), n as u16) };
        if rc != 0 {
            return Err(Error::MbufRoom {
                op: "trim",
                need: n,
                room,
            });
        }
        Ok(())
    }

    /// Appends `tail` as further segment(s). On failure (too many segments)
    /// the tail is handed back.
    pub fn chain(&mut self, tail: Mbuf) -> std::result::Result<(), (Error, Mbuf)> {
        let t = tail.as_ptr();
        // SAFETY: both valid and distinct; on success DPDK takes `tail` into
        // our chain, so we must not free it separately.
        let rc = unsafe { dpdk_sys::shim_rte_pktmbuf_chain(self.as_ptr(), t) };
        if rc != 0 {
            return Err((Error::from_errno("rte_pktmbuf_chain", rc), tail));
        }
        std::mem::forget(tail);
        Ok(())
    }

    /// Points this (empty, direct) mbuf at external memory.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid until `shinfo`'s free callback runs,
    /// `shinfo` must be a valid, initialised shared-info whose reference count
    /// already accounts for this attachment, and the mbuf must be direct and
    /// hold no data. Prefer [`crate::ExtBuf::attach`].
    pub unsafe fn attach_extbuf_raw(
        &mut self,
        addr: *mut u8,
        iova: u64,
        len: u16,
        shinfo: *mut dpdk_sys::rte_mbuf_ext_shared_info,
    ) {
        // SAFETY: the caller's contract above is the C function's; the mbuf
        // is ours (`&mut self`).
        unsafe {
            dpdk_sys::shim_rte_pktmbuf_attach_extbuf(self.as_ptr(), addr.cast(), iova, len, shinfo)
        };
    }

    /// Whether the first segment's data lives in an external buffer.
    pub fn has_extbuf(&self) -> bool {
        self.raw().ol_flags & dpdk_sys::RTE_MBUF_F_EXTERNAL != 0
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the chain.
        unsafe { dpdk_sys::shim_rte_pktmbuf_free(self.as_ptr()) }
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("pkt_len", &self.pkt_len())
            .field("nb_segs", &self.nb_segs())
            .finish()
    }
}

/// Iterator over the segments of an [`Mbuf`].
pub struct Segments<'a> {
    next: *mut rte_mbuf,
    _owner: std::marker::PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: every segment of an owned chain is valid for 'a.
        unsafe {
            let seg = self.next;
            self.next = (*seg).next;
            Some(seg_slice(seg))
        }
    }
}

/// The data of one segment.
///
/// # Safety
/// `m` must be a valid mbuf that lives, and whose data nobody writes, for
/// `'a` (for external memory: [`crate::ExtBuf::base_ptr`]'s rule).
unsafe fn seg_slice<'a>(m: *mut rte_mbuf) -> &'a [u8] {
    // SAFETY: `m` is valid (the caller's contract); DPDK keeps
    // `data_off + data_len <= buf_len`, so the data lies in its buffer.
    unsafe {
        let len = (*m).data_len as usize;
        if len == 0 {
            return &[];
        }
        let p = ((*m).buf_addr as *const u8).add((*m).data_off as usize);
        std::slice::from_raw_parts(p, len)
    }
}

/// Bytes after the data of one segment (`rte_pktmbuf_tailroom`).
///
/// # Safety
/// `m` must be a valid mbuf.
#[inline]
unsafe fn seg_tailroom(m: *const rte_mbuf) -> usize {
    // SAFETY: `m` is valid (the caller's contract).
    unsafe {
        ((*m).buf_len as usize).saturating_sub((*m).data_off as usize + (*m).data_len as usize)
    }
}

/// The last segment of the chain starting at `m`.
///
/// # Safety
/// `m` must be a valid mbuf chain.
#[inline]
unsafe fn last_seg(mut m: *mut rte_mbuf) -> *mut rte_mbuf {
    // SAFETY: every `next` of a valid chain is null or a valid segment.
    unsafe {
        while !(*m).next.is_null() {
            m = (*m).next;
        }
    }
    m
}
