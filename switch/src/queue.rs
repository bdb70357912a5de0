//! A byte-bounded FIFO of packet handles over a ring: fixed (no allocation after
//! construction) or growing on demand up to the same bound.
//!
//! Capacity is `cap_bytes` of frame bytes (the switch's `buf_max`) and a slot count
//! sized so that the byte bound, not the slot bound, binds for any frame of at least
//! [`MIN_CHARGE`] bytes. Each slot also keeps the frame length the packet had at
//! enqueue (so accounting never depends on later edits) and a small tag.

use crate::PacketBuf;

/// Frames shorter than this still use one slot; the slot count is
/// `cap_bytes / MIN_CHARGE + 1`.
pub const MIN_CHARGE: u64 = 60;

/// What the queue keeps beside each packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// Frame length at enqueue (the byte accounting uses this).
    pub len: u32,
    /// Caller's tag (the switch marks INT frames).
    pub tag: u8,
    /// Arrival time, ns.
    pub arrival: u64,
}

/// FIFO of packets bounded in bytes and slots, over a ring of (packet, metadata)
/// entries (one entry, one cache line at most, per packet touched).
///
/// [`PktQueue::new`] allocates every slot at construction (nothing is allocated
/// afterwards: the DPDK switch's hot path). [`PktQueue::growing`] starts with a few
/// slots and doubles the ring, up to the same bound, when it is full: for the simulator,
/// whose thousands of ports would otherwise hold gigabytes of rings that are never used
/// and whose used slots would lie a ring apart.
#[derive(Debug)]
pub struct PktQueue<P> {
    ring: Vec<(Option<P>, Meta)>,
    head: usize,
    count: usize,
    bytes: u64,
    cap_bytes: u64,
    max_slots: usize,
}

/// Slots of a new growing queue.
const GROWING_INITIAL_SLOTS: usize = 16;

impl<P> PktQueue<P> {
    /// A queue holding at most `cap_bytes` bytes (all slots allocated now).
    pub fn new(cap_bytes: u64) -> Self {
        let n = Self::slots_for(cap_bytes);
        Self::with_slots(cap_bytes, n, n)
    }

    /// A queue with the same bounds as [`PktQueue::new`] whose ring starts small and
    /// grows (allocating) when a packet finds it full.
    pub fn growing(cap_bytes: u64) -> Self {
        let n = Self::slots_for(cap_bytes);
        Self::with_slots(cap_bytes, n.min(GROWING_INITIAL_SLOTS), n)
    }

    /// The queue the switch builds for packets of type `P`: fixed or growing, as
    /// [`PacketBuf::PREALLOCATED_QUEUES`] says.
    pub fn for_packets(cap_bytes: u64) -> Self
    where
        P: PacketBuf,
    {
        if P::PREALLOCATED_QUEUES {
            Self::new(cap_bytes)
        } else {
            Self::growing(cap_bytes)
        }
    }

    fn slots_for(cap_bytes: u64) -> usize {
        usize::try_from(cap_bytes / MIN_CHARGE + 1)
            .unwrap_or(usize::MAX / 64)
            .min(1 << 24)
    }

    fn with_slots(cap_bytes: u64, slots: usize, max_slots: usize) -> Self {
        let mut ring = Vec::with_capacity(slots);
        ring.resize_with(slots, || (None, Meta::default()));
        Self {
            ring,
            head: 0,
            count: 0,
            bytes: 0,
            cap_bytes,
            max_slots,
        }
    }

    /// Bytes resident.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Packets resident.
    #[inline]
    pub fn len(&self) -> usize {
        self.count
    }

    /// True if empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Byte capacity.
    pub fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    /// Slot capacity (the bound, whether or not a growing ring has reached it).
    pub fn cap_slots(&self) -> usize {
        self.max_slots
    }

    /// True if a frame of `len` bytes fits now.
    #[inline]
    pub fn fits(&self, len: u64) -> bool {
        self.count < self.max_slots && self.bytes + len <= self.cap_bytes
    }

    /// Appends `p` with its metadata; gives `p` back if `m.len` bytes do not fit.
    #[inline(always)]
    pub fn push(&mut self, p: P, m: Meta) -> Result<(), P> {
        if !self.fits(u64::from(m.len)) {
            return Err(p);
        }
        if self.count == self.ring.len() {
            self.grow();
        }
        let mut i = self.head + self.count;
        if i >= self.ring.len() {
            i -= self.ring.len();
        }
        self.ring[i] = (Some(p), m);
        self.count += 1;
        self.bytes += u64::from(m.len);
        Ok(())
    }

    /// Doubles a full ring (up to the slot bound), oldest packet first at slot 0.
    #[cold]
    fn grow(&mut self) {
        let n = (self.ring.len() * 2).clamp(1, self.max_slots);
        self.ring.rotate_left(self.head);
        self.head = 0;
        self.ring.resize_with(n, || (None, Meta::default()));
    }

    /// Arrival time of the oldest packet.
    #[inline]
    pub fn head_arrival(&self) -> Option<u64> {
        (self.count > 0).then(|| self.ring[self.head].1.arrival)
    }

    /// Removes the oldest packet with its metadata.
    #[inline(always)]
    pub fn pop(&mut self) -> Option<(P, Meta)> {
        if self.count == 0 {
            return None;
        }
        let i = self.head;
        let (slot, m) = &mut self.ring[i];
        let p = slot.take()?;
        let m = *m;
        self.count -= 1;
        // An empty queue restarts at slot 0: a queue that drains every poll turn then
        // stays in the same few (cached) lines of its ring instead of walking the whole
        // ring (buf_max / 60 slots) through the cache.
        self.head = if i + 1 == self.ring.len() || self.count == 0 {
            0
        } else {
            i + 1
        };
        self.bytes -= u64::from(m.len);
        Some((p, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_bytes_and_wraps() {
        let m = |len: u32, tag: u8| Meta {
            len,
            tag,
            arrival: u64::from(len),
        };
        let mut q: PktQueue<u32> = PktQueue::new(300);
        assert_eq!(q.cap_slots(), 6);
        assert!(q.push(1, m(100, 0)).is_ok());
        assert!(q.push(2, m(200, 1)).is_ok());
        assert_eq!(q.push(3, m(1, 0)), Err(3));
        assert_eq!(q.head_arrival(), Some(100));
        assert_eq!(q.pop(), Some((1, m(100, 0))));
        for i in 0..20u32 {
            assert!(q.push(i, m(10, 0)).is_ok());
            assert_eq!(
                q.pop().map(|x| x.1.len),
                Some(if i == 0 { 200 } else { 10 })
            );
        }
        assert_eq!(q.len(), 1);
        assert_eq!(q.bytes(), 10);
        // Slot bound: 6 tiny frames.
        for i in 0..5 {
            assert!(q.push(i, m(1, 0)).is_ok());
        }
        assert_eq!(q.push(9, m(1, 0)), Err(9));
    }

    #[test]
    fn growing_ring_keeps_order_across_growth_and_has_the_same_bounds() {
        let m = |len: u32| Meta {
            len,
            tag: 0,
            arrival: u64::from(len),
        };
        let mut fixed: PktQueue<u32> = PktQueue::new(100_000);
        let mut q: PktQueue<u32> = PktQueue::growing(100_000);
        assert_eq!(q.cap_slots(), fixed.cap_slots());
        assert_eq!(q.ring.len(), GROWING_INITIAL_SLOTS);
        // Wrap the small ring first, so that growth has to unrotate it.
        for i in 0..10 {
            assert!(q.push(i, m(60)).is_ok());
        }
        for i in 0..10 {
            assert_eq!(q.pop().map(|x| x.0), Some(i));
        }
        assert!(q.push(100, m(60)).is_ok());
        assert_eq!(q.pop().map(|x| x.0), Some(100));
        let mut next_out = 0;
        let mut next_in = 0;
        for round in 0..40u32 {
            for _ in 0..(round % 7) * 9 + 3 {
                let (a, b) = (q.push(next_in, m(60)), fixed.push(next_in, m(60)));
                assert_eq!(a.is_ok(), b.is_ok());
                if a.is_ok() {
                    next_in += 1;
                }
            }
            for _ in 0..(round % 5) * 8 {
                let (a, b) = (q.pop(), fixed.pop());
                assert_eq!(a, b);
                if let Some((p, _)) = a {
                    assert_eq!(p, next_out);
                    next_out += 1;
                }
            }
        }
        assert!(q.ring.len() > GROWING_INITIAL_SLOTS);
        // The slot bound binds exactly as the fixed ring's: fill both to it.
        while fixed.push(0, m(1)).is_ok() {
            assert!(q.push(0, m(1)).is_ok());
        }
        assert!(q.push(0, m(1)).is_err());
        assert_eq!(q.len(), fixed.len());
        assert_eq!(q.ring.len(), q.cap_slots());
    }
}
