//! The packet handle the core works on.
//!
//! The core is generic over the packet type so that the DPDK shell can queue owned
//! mbufs while tests and benches queue `Vec<u8>` or [`FrameBuf`]. The core needs only
//! the frame's bytes (to classify, rewrite MACs/TTL, mark ECN) and one way to grow the
//! frame for the INT push.
//!
//! INT push (INT-MD v2.0, hop record inserted right after the MD header, HPCC++ 000
//! section 3) inserts 16 bytes in the middle of the headers. On an mbuf the cheap way is
//! to take 16 bytes of headroom (`rte_pktmbuf_prepend`) and move the ~58 header bytes
//! forward, so the payload never moves; [`PacketBuf::prepend`] is that primitive and
//! `rdma::wire::int::push_hop_front` does the header move on the bytes.

/// A frame the switch core can inspect and edit in place.
///
/// Frames are single-segment: `bytes()` is the whole Ethernet frame (without FCS unless
/// the switch is configured with `fcs_in_frame = true`).
pub trait PacketBuf {
    /// Whether a switch's queues of this packet type allocate all their slots when the
    /// switch is built (true: nothing is allocated on the hot path, as the DPDK switch
    /// needs) or grow on demand up to the same bound (false: a simulator's fabric of
    /// thousands of mostly idle ports; see [`crate::PktQueue::growing`]).
    const PREALLOCATED_QUEUES: bool = true;

    /// Frame length in bytes.
    fn len(&self) -> usize;

    /// True if the frame is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame bytes.
    fn bytes(&self) -> &[u8];

    /// The frame bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];

    /// Grows the frame by `n` bytes at the front (like `rte_pktmbuf_prepend`); the new
    /// bytes' content is unspecified. Returns false, changing nothing, when there is no
    /// room (headroom exhausted).
    fn prepend(&mut self, n: usize) -> bool;

    /// Removes `n` bytes from the front (like `rte_pktmbuf_adj`). `n` is at most
    /// `len()`; implementations must not panic if it is larger (they may clamp).
    fn trim_front(&mut self, n: usize);

    /// Asks the CPU to start loading the frame's first bytes (its headers) into the
    /// cache; [`crate::Switch::receive_burst`] calls it on every frame of a burst
    /// before parsing any. A hint only: the default does nothing.
    #[inline]
    fn prefetch(&self) {}

    /// Grows at the front by `n` bytes and moves the first `m` bytes of the old frame to
    /// the new front, which opens an `n`-byte gap at `m..m + n` (content unspecified).
    /// This is the INT insertion primitive; the default is `prepend` + `copy_within`.
    fn grow_front_shift(&mut self, n: usize, m: usize) -> bool {
        if m > self.len() || !self.prepend(n) {
            return false;
        }
        self.bytes_mut().copy_within(n..n + m, 0);
        true
    }
}

/// `Vec<u8>` as a packet: prepend moves the whole frame (fine for tests, not for speed).
impl PacketBuf for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn prepend(&mut self, n: usize) -> bool {
        self.splice(0..0, std::iter::repeat(0).take(n));
        true
    }
    fn trim_front(&mut self, n: usize) {
        let n = n.min(Vec::len(self));
        self.drain(..n);
    }
}

/// A fixed buffer with headroom, laid out like an mbuf data room: the frame is
/// `buf[start..start + len]`. Used by benches and tests to exercise the headroom path
/// of the INT push with no allocation per packet.
#[derive(Clone, PartialEq, Eq)]
pub struct FrameBuf {
    buf: Box<[u8]>,
    start: usize,
    len: usize,
}

impl FrameBuf {
    /// Default headroom, as DPDK's `RTE_PKTMBUF_HEADROOM`.
    pub const HEADROOM: usize = 128;

    /// A buffer of `capacity` bytes holding `frame` after `headroom` bytes; `None` if
    /// the frame does not fit.
    pub fn new(frame: &[u8], headroom: usize, capacity: usize) -> Option<Self> {
        if headroom.checked_add(frame.len())? > capacity {
            return None;
        }
        let mut buf = vec![0u8; capacity].into_boxed_slice();
        buf[headroom..headroom + frame.len()].copy_from_slice(frame);
        Some(Self {
            buf,
            start: headroom,
            len: frame.len(),
        })
    }

    /// A buffer with [`FrameBuf::HEADROOM`] and room for a 2 KiB frame (an mbuf's
    /// default data room).
    pub fn from_frame(frame: &[u8]) -> Option<Self> {
        Self::new(
            frame,
            Self::HEADROOM,
            Self::HEADROOM + 2048.max(frame.len()),
        )
    }

    /// Replaces the content with `frame` at `headroom` (reuse without allocating).
    /// Returns false if it does not fit.
    pub fn reset(&mut self, frame: &[u8], headroom: usize) -> bool {
        match headroom.checked_add(frame.len()) {
            Some(e) if e <= self.buf.len() => {
                self.buf[headroom..e].copy_from_slice(frame);
                self.start = headroom;
                self.len = frame.len();
                true
            }
            _ => false,
        }
    }

    /// Bytes free in front of the frame.
    pub fn headroom(&self) -> usize {
        self.start
    }
}

impl std::fmt::Debug for FrameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The frame only (a capacity-sized dump of zeros helps nobody).
        f.debug_struct("FrameBuf")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("frame", &self.bytes())
            .finish()
    }
}

impl PacketBuf for FrameBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
    fn prepend(&mut self, n: usize) -> bool {
        if n > self.start {
            return false;
        }
        self.start -= n;
        self.len += n;
        true
    }
    fn trim_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.start += n;
        self.len -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_front_shift_opens_a_gap() {
        let mut v: Vec<u8> = (1..=6).collect();
        assert!(v.grow_front_shift(2, 3));
        assert_eq!(&v[..3], &[1, 2, 3]);
        assert_eq!(&v[5..], &[4, 5, 6]);
        let mut f = FrameBuf::new(&[1, 2, 3, 4, 5, 6], 2, 8).unwrap();
        assert!(f.grow_front_shift(2, 3));
        assert_eq!(f.len(), 8);
        assert_eq!(&f.bytes()[..3], &[1, 2, 3]);
        assert_eq!(&f.bytes()[5..], &[4, 5, 6]);
        assert!(!f.grow_front_shift(1, 0), "no headroom left");
        f.trim_front(100);
        assert!(f.is_empty());
        assert!(FrameBuf::new(&[0; 10], 4, 8).is_none());
    }
}
