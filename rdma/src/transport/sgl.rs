//! Scatter/gather lists: work requests with several SGEs (IBA vol. 1 10.7.2.1
//! "work request" and 11.4.1.1 `PostSend` / `PostReceive`: a gather list for
//! SEND and RDMA WRITE, a scatter list for RDMA READ and receives; the message
//! is the SGEs' bytes one after the other). ibverbs: `ibv_send_wr.sg_list` /
//! `num_sge`, `ibv_recv_wr.sg_list`.
//!
//! A work request keeps its first [`Sge`] where it always did (`SendWr::sge`,
//! `RecvWr::sge`); a request with more than one keeps the whole list in its
//! queue's [`SglStore`] and the queue entry holds an [`SglRef`] to it. The
//! transport and the NIC walk a list with [`pieces`]: the SGE-sized parts of a
//! byte range of the message, so that a packet's payload is gathered from (or
//! scattered into) its parts without a staging copy.

use super::wc::Sge;

/// The most SGEs one work request may carry: Linux rxe's `RXE_MAX_SGE`
/// (`ibv_device_attr.max_sge`, and `max_sge_rd` for READ scatter lists).
pub const MAX_SGE: usize = 32;

/// The longest message IBA allows (vol. 1 9.4.1: a DMA length is 2^31 at most).
pub const MAX_MESSAGE: u32 = 1 << 31;

/// Where a queued work request's SGEs are: in the request itself (one SGE or
/// none), or in its queue's [`SglStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SglRef {
    slot: u16,
    n: u8,
}

impl SglRef {
    /// The work request's own SGE is its whole list.
    pub const OWN: SglRef = SglRef { slot: 0, n: 0 };

    /// Whether the list lives in the store (more than one SGE).
    #[inline]
    pub fn is_list(self) -> bool {
        self.n > 1
    }

    /// A list of `n` held apart from any store (an SRQ's WQE a QP took,
    /// its list copied: super::srq).
    pub(super) const fn held(n: u8) -> SglRef {
        SglRef { slot: u16::MAX, n }
    }

    /// Whether this is a [`SglRef::held`] list.
    pub(super) fn is_held(self) -> bool {
        self.slot == u16::MAX && self.is_list()
    }
}

/// The SGE lists of one queue's work requests with more than one SGE: one
/// slot of `max_sge` entries per queue entry, used in posting order. A queue
/// holds at most `depth` requests and retires them in posting order (the send
/// queue as they complete, the receive queue as they are consumed), so the
/// slot a new list takes is free: the list `depth` posts before it retired.
/// Allocated once, when the QP is created; empty for a QP created for one
/// SGE.
#[derive(Debug, Clone, Default)]
pub struct SglStore {
    sges: Vec<Sge>,
    max_sge: usize,
    slots: u16,
    next: u16,
}

impl SglStore {
    /// Room for `depth` lists of up to `max_sge` SGEs (none when `max_sge` is
    /// at most 1).
    pub fn new(depth: u16, max_sge: u8) -> SglStore {
        let max_sge = usize::from(max_sge).min(MAX_SGE);
        if max_sge <= 1 || depth == 0 {
            return SglStore::default();
        }
        SglStore {
            sges: vec![Sge::default(); usize::from(depth) * max_sge],
            max_sge,
            slots: depth,
            next: 0,
        }
    }

    /// The most SGEs one request may carry here (at least 1).
    pub fn max_sge(&self) -> usize {
        self.max_sge.max(1)
    }

    /// Stores `sgl` (2..=`max_sge` entries; the caller checked that the queue
    /// has room for one more request) and returns its reference.
    pub(super) fn push(&mut self, sgl: &[Sge]) -> SglRef {
        debug_assert!(sgl.len() > 1 && sgl.len() <= self.max_sge);
        let slot = self.next;
        let at = usize::from(slot) * self.max_sge;
        self.sges[at..at + sgl.len()].copy_from_slice(sgl);
        self.next = if slot + 1 == self.slots { 0 } else { slot + 1 };
        SglRef {
            slot,
            n: sgl.len() as u8,
        }
    }

    /// The list `r` refers to (empty for [`SglRef::OWN`]).
    #[inline]
    pub fn get(&self, r: SglRef) -> &[Sge] {
        if !r.is_list() || r.is_held() {
            return &[];
        }
        let at = usize::from(r.slot) * self.max_sge;
        self.sges.get(at..at + usize::from(r.n)).unwrap_or(&[])
    }
}

/// The list's total length, `None` past [`MAX_MESSAGE`].
pub fn total_len(sgl: &[Sge]) -> Option<u32> {
    let sum: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
    u32::try_from(sum).ok().filter(|&n| n <= MAX_MESSAGE)
}

/// The SGE-sized parts of bytes `[offset, offset + len)` of the message laid
/// out over `sgl` in order: each an address and length inside one SGE (with
/// its lkey), empty SGEs skipped. Stops at the list's end if the range runs
/// past it (the caller checked the length).
pub fn pieces(sgl: &[Sge], offset: u32, len: u32) -> Pieces<'_> {
    Pieces {
        sgl,
        skip: offset,
        left: len,
    }
}

/// The iterator of [`pieces`].
#[derive(Debug, Clone)]
pub struct Pieces<'a> {
    sgl: &'a [Sge],
    skip: u32,
    left: u32,
}

impl Iterator for Pieces<'_> {
    type Item = Sge;

    #[inline]
    fn next(&mut self) -> Option<Sge> {
        while self.left > 0 {
            let (s, rest) = self.sgl.split_first()?;
            self.sgl = rest;
            if self.skip >= s.len {
                self.skip -= s.len;
                continue;
            }
            let n = (s.len - self.skip).min(self.left);
            let piece = Sge {
                addr: s.addr + u64::from(self.skip),
                len: n,
                lkey: s.lkey,
            };
            self.skip = 0;
            self.left -= n;
            return Some(piece);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sge(addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            len,
            lkey: addr as u32,
        }
    }

    #[test]
    fn pieces_cross_sges_and_skip_empty_ones() {
        let sgl = [sge(100, 4), sge(200, 0), sge(300, 3), sge(400, 5)];
        let got: Vec<_> = pieces(&sgl, 2, 7).map(|p| (p.addr, p.len)).collect();
        assert_eq!(got, vec![(102, 2), (300, 3), (400, 2)]);
        assert_eq!(pieces(&sgl, 12, 5).count(), 0, "past the end");
        assert_eq!(pieces(&sgl, 0, 0).count(), 0);
    }

    #[test]
    fn the_store_reuses_slots_in_posting_order() {
        let mut st = SglStore::new(2, 3);
        let a = st.push(&[sge(1, 1), sge(2, 2)]);
        let b = st.push(&[sge(3, 3), sge(4, 4), sge(5, 5)]);
        assert_eq!(st.get(a), &[sge(1, 1), sge(2, 2)]);
        assert_eq!(st.get(b).len(), 3);
        let c = st.push(&[sge(6, 6), sge(7, 7)]);
        assert_eq!(st.get(c), &[sge(6, 6), sge(7, 7)], "a's slot, a retired");
        assert_eq!(st.get(b).len(), 3, "b untouched");
        assert!(st.get(SglRef::OWN).is_empty());
        assert_eq!(SglStore::new(8, 1).max_sge(), 1);
    }

    #[test]
    fn total_len_refuses_more_than_iba_allows() {
        assert_eq!(
            total_len(&[sge(0, 1 << 30), sge(0, 1 << 30)]),
            Some(1 << 31)
        );
        assert_eq!(total_len(&[sge(0, 1 << 31), sge(0, 1)]), None);
        assert_eq!(total_len(&[sge(0, u32::MAX), sge(0, u32::MAX)]), None);
    }

    proptest! {
        /// The pieces of any range are the range's bytes, in order, each
        /// inside one SGE.
        #[test]
        fn pieces_cover_exactly_the_range(
            lens in proptest::collection::vec(0u32..50, 1..MAX_SGE),
            a in 0u32..2000, b in 0u32..2000,
        ) {
            let mut addr = 0u64;
            let sgl: Vec<Sge> = lens.iter().map(|&l| {
                // Gaps between SGEs, so that an address names one SGE's byte.
                let s = sge(addr, l);
                addr += u64::from(l) + 1000;
                s
            }).collect();
            let total = total_len(&sgl).unwrap();
            let (lo, hi) = (a.min(b).min(total), a.max(b).min(total));
            // The message's bytes as addresses.
            let flat: Vec<u64> = sgl.iter()
                .flat_map(|s| (0..u64::from(s.len)).map(move |i| s.addr + i))
                .collect();
            let got: Vec<u64> = pieces(&sgl, lo, hi - lo)
                .flat_map(|p| {
                    assert!(p.len > 0);
                    assert!(sgl.iter().any(|s| s.lkey == p.lkey
                        && p.addr >= s.addr
                        && p.addr + u64::from(p.len) <= s.addr + u64::from(s.len)));
                    (0..u64::from(p.len)).map(move |i| p.addr + i)
                })
                .collect();
            prop_assert_eq!(&got[..], &flat[lo as usize..hi as usize]);
        }
    }
}
