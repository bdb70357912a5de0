//! A byte-bounded FIFO of packet handles over a fixed ring (no allocation after
//! construction).
//!
//! Capacity is `cap_bytes` of frame bytes (the switch's `buf_max`) and a slot count
//! sized so that the byte bound, not the slot bound, binds for any frame of at least
//! [`MIN_CHARGE`] bytes. Each slot also keeps the frame length the packet had at
//! enqueue (so accounting never depends on later edits) and a small tag.

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

/// Fixed-capacity FIFO of packets, bounded in bytes and slots.
#[derive(Debug)]
pub struct PktQueue<P> {
    slots: Box<[Option<P>]>,
    meta: Box<[Meta]>,
    head: usize,
    count: usize,
    bytes: u64,
    cap_bytes: u64,
}

impl<P> PktQueue<P> {
    /// A queue holding at most `cap_bytes` bytes (all slots allocated now).
    pub fn new(cap_bytes: u64) -> Self {
        let n = usize::try_from(cap_bytes / MIN_CHARGE + 1)
            .unwrap_or(usize::MAX / 64)
            .min(1 << 24);
        let mut slots = Vec::with_capacity(n);
        slots.resize_with(n, || None);
        Self {
            slots: slots.into_boxed_slice(),
            meta: vec![Meta::default(); n].into_boxed_slice(),
            head: 0,
            count: 0,
            bytes: 0,
            cap_bytes,
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

    /// Slot capacity.
    pub fn cap_slots(&self) -> usize {
        self.slots.len()
    }

    /// True if a frame of `len` bytes fits now.
    #[inline]
    pub fn fits(&self, len: u64) -> bool {
        self.count < self.slots.len() && self.bytes + len <= self.cap_bytes
    }

    /// Appends `p` with its metadata; gives `p` back if `m.len` bytes do not fit.
    #[inline(always)]
    pub fn push(&mut self, p: P, m: Meta) -> Result<(), P> {
        if !self.fits(u64::from(m.len)) {
            return Err(p);
        }
        let mut i = self.head + self.count;
        if i >= self.slots.len() {
            i -= self.slots.len();
        }
        self.slots[i] = Some(p);
        self.meta[i] = m;
        self.count += 1;
        self.bytes += u64::from(m.len);
        Ok(())
    }

    /// Arrival time of the oldest packet.
    #[inline]
    pub fn head_arrival(&self) -> Option<u64> {
        (self.count > 0).then(|| self.meta[self.head].arrival)
    }

    /// Removes the oldest packet with its metadata.
    #[inline(always)]
    pub fn pop(&mut self) -> Option<(P, Meta)> {
        if self.count == 0 {
            return None;
        }
        let i = self.head;
        let p = self.slots[i].take()?;
        let m = self.meta[i];
        self.count -= 1;
        // An empty queue restarts at slot 0: a queue that drains every poll turn then
        // stays in the same few (cached) lines of its ring instead of walking the whole
        // ring (buf_max / 60 slots) through the cache.
        self.head = if i + 1 == self.slots.len() || self.count == 0 {
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
}
