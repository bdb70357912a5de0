//! A FIFO queue whose first `N` entries live inside the struct that holds
//! it, beside the header a visit reads anyway, and whose overflow goes to a
//! heap buffer allocated once at creation.
//!
//! Why: a QP's output queues (its events, completions and pending ACKs)
//! hold one or two entries between two visits of the QP and are drained in
//! the same visit or the next. In a `VecDeque` the entry lives in a separate
//! heap buffer: with thousands of QPs whose state is cold at each visit,
//! every push writes a line of its own that no prefetch of the QP's state
//! can name (its address sits in the header, itself still on its way). Here
//! the usual entry is written into the inline slots, on lines whose offsets
//! are known at compile time (`InlineDeque::HOT_BYTES`) and which the
//! engine prefetches with the rest of the QP (docs/design.md §5.1).
//!
//! Order: the inline slots only ever hold entries older than any in the
//! heap buffer (a push goes inline only while the heap part is empty), so
//! the queue is the inline entries, oldest first, then the heap's. A queue
//! that empties starts again at its first inline slot.

use std::collections::VecDeque;

/// A FIFO of `Copy` entries: up to `N` inline, the rest in a heap buffer of
/// the capacity given at creation. The buffer alone can hold that many (the
/// inline slots may be half drained while it fills), so a queue kept within
/// [`InlineDeque::capacity`], as the transport's are, never allocates after
/// creation; past it the buffer grows, as a `VecDeque` would.
///
/// `repr(C)`: the three small fields and the inline slots come first, so a
/// push or pop that stays inline reads and writes only the first
/// `Self::HOT_BYTES` bytes; the heap buffer's header comes last.
#[derive(Clone)]
#[repr(C)]
pub(crate) struct InlineDeque<T: Copy, const N: usize> {
    /// Index of the oldest inline entry.
    head: u8,
    /// Inline entries in use.
    len: u8,
    /// Whether the heap buffer holds entries (kept here so that the usual
    /// push and pop need not read the buffer's header).
    spilled: bool,
    slots: [T; N],
    spill: VecDeque<T>,
}

impl<T: Copy, const N: usize> InlineDeque<T, N> {
    /// The bytes from the start of the queue that a push or pop reads when
    /// the queue holds at most `N` entries: the small fields and the slots
    /// (the layout tests of the queues' holders check where they fall).
    #[cfg(test)]
    pub(crate) const HOT_BYTES: usize = core::mem::offset_of!(Self, slots) + N * size_of::<T>();

    /// An empty queue with room for at least `cap` entries without
    /// allocating (the heap buffer's; the inline slots are room on top);
    /// `blank` fills the inline slots.
    pub(crate) fn with_capacity(cap: usize, blank: T) -> Self {
        const { assert!(N >= 1 && N <= u8::MAX as usize, "1 to 255 inline slots") };
        InlineDeque {
            head: 0,
            len: 0,
            spilled: false,
            slots: [blank; N],
            spill: VecDeque::with_capacity(cap),
        }
    }

    /// Entries held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len) + if self.spilled { self.spill.len() } else { 0 }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0 && !self.spilled
    }

    /// Entries it holds without allocating, wherever they lie: the heap
    /// buffer's capacity.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.spill.capacity()
    }

    /// Appends `v`: inline while there is an inline slot and nothing in the
    /// heap buffer, else at the heap buffer's back.
    #[inline]
    pub(crate) fn push_back(&mut self, v: T) {
        if !self.spilled && usize::from(self.len) < N {
            let at = self.slot(usize::from(self.len));
            self.slots[at] = v;
            self.len += 1;
        } else {
            push_compact(&mut self.spill, v);
            self.spilled = true;
        }
    }

    /// Removes and returns the oldest entry.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len > 0 {
            let v = self.slots[usize::from(self.head)];
            self.len -= 1;
            self.head = if self.len == 0 {
                0
            } else {
                (self.head + 1) % N as u8
            };
            return Some(v);
        }
        if !self.spilled {
            return None;
        }
        let v = self.spill.pop_front();
        self.spilled = !self.spill.is_empty();
        v
    }

    /// The oldest entry.
    #[inline]
    pub(crate) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// The oldest entry, to change in place.
    #[inline]
    pub(crate) fn front_mut(&mut self) -> Option<&mut T> {
        self.get_mut(0)
    }

    /// The newest entry.
    #[inline]
    pub(crate) fn back(&self) -> Option<&T> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The newest entry, to change in place.
    #[inline]
    pub(crate) fn back_mut(&mut self) -> Option<&mut T> {
        self.len().checked_sub(1).and_then(|i| self.get_mut(i))
    }

    /// The entry `i` places from the front.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let inline = usize::from(self.len);
        if i < inline {
            Some(&self.slots[self.slot(i)])
        } else if self.spilled {
            self.spill.get(i - inline)
        } else {
            None
        }
    }

    /// The entry `i` places from the front, to change in place.
    #[inline]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let inline = usize::from(self.len);
        if i < inline {
            let at = self.slot(i);
            Some(&mut self.slots[at])
        } else if self.spilled {
            self.spill.get_mut(i - inline)
        } else {
            None
        }
    }

    /// The entries, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        let inline = (0..usize::from(self.len)).map(|i| &self.slots[self.slot(i)]);
        // The heap buffer is empty whenever `spilled` is false.
        inline.chain(self.spill.iter())
    }

    /// Keeps only the entries `keep` accepts, in their order (a rotation
    /// through the queue: nothing allocates).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for _ in 0..self.len() {
            if let Some(v) = self.pop_front() {
                if keep(&v) {
                    self.push_back(v);
                }
            }
        }
    }

    /// Moves the newest entry to the front, the others keeping their order (a
    /// rotation through the queue: nothing allocates).
    pub(crate) fn back_to_front(&mut self) {
        for _ in 1..self.len() {
            if let Some(v) = self.pop_front() {
                self.push_back(v);
            }
        }
    }

    /// Whether entries wait in the heap buffer.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> bool {
        self.spilled
    }

    /// The slot of the inline entry `i` places from the front (`i < N`).
    #[inline]
    fn slot(&self, i: usize) -> usize {
        let at = usize::from(self.head) + i;
        if at >= N {
            at - N
        } else {
            at
        }
    }
}

impl<T: Copy + std::fmt::Debug, const N: usize> std::fmt::Debug for InlineDeque<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Pushes `v` at the back of `q`, starting again at the front of its
/// buffer when `q` is empty (`VecDeque::clear` rewinds it). A queue drained
/// after every packet then reuses its first few cache lines instead of
/// walking its whole preallocated buffer, which keeps a QP's hot state
/// small when thousands of QPs share the caches.
pub(crate) fn push_compact<T>(q: &mut VecDeque<T>, v: T) {
    if q.is_empty() {
        q.clear();
    }
    q.push_back(v);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A queue emptied between pushes starts again at the front of its
    /// buffer: what it holds is never split around the buffer's end.
    #[test]
    fn push_compact_rewinds_an_empty_queue() {
        let mut q: VecDeque<u32> = VecDeque::with_capacity(4);
        let cap = q.capacity();
        for v in 0..(cap as u32 * 2 + 1) {
            push_compact(&mut q, v);
            assert_eq!(q.pop_front(), Some(v));
        }
        for v in 0..cap as u32 {
            push_compact(&mut q, v);
        }
        let (front, back) = q.as_slices();
        assert_eq!((front.len(), back.len()), (cap, 0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Pop,
        SetFront(u32),
        SetBack(u32),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u32>().prop_map(Op::Push),
            3 => Just(Op::Pop),
            1 => any::<u32>().prop_map(Op::SetFront),
            1 => any::<u32>().prop_map(Op::SetBack),
            1 => Just(Op::RetainOdd),
        ]
    }

    /// Applies `ops` to the queue and to a `VecDeque`; they must agree
    /// after every step, entry by entry.
    fn check<const N: usize>(ops: &[Op]) -> Result<(), TestCaseError> {
        let mut q = InlineDeque::<u32, N>::with_capacity(8, 0);
        let cap = q.capacity();
        prop_assert!(cap >= 8);
        let mut m = VecDeque::<u32>::new();
        let mut most = 0;
        for o in ops {
            match *o {
                Op::Push(v) => {
                    q.push_back(v);
                    m.push_back(v);
                }
                Op::Pop => prop_assert_eq!(q.pop_front(), m.pop_front()),
                Op::SetFront(v) => {
                    if let (Some(a), Some(b)) = (q.front_mut(), m.front_mut()) {
                        *a = v;
                        *b = v;
                    }
                }
                Op::SetBack(v) => {
                    if let (Some(a), Some(b)) = (q.back_mut(), m.back_mut()) {
                        *a = v;
                        *b = v;
                    }
                }
                Op::RetainOdd => {
                    q.retain(|v| v % 2 == 1);
                    m.retain(|v| v % 2 == 1);
                }
            }
            most = most.max(m.len());
            if most <= cap {
                // Never more than its capacity: nothing allocated.
                prop_assert_eq!(q.capacity(), cap);
            }
            prop_assert_eq!(q.len(), m.len());
            prop_assert_eq!(q.is_empty(), m.is_empty());
            prop_assert_eq!(q.front(), m.front());
            prop_assert_eq!(q.back(), m.back());
            prop_assert!(q.iter().eq(m.iter()));
            for i in 0..=m.len() {
                prop_assert_eq!(q.get(i), m.get(i));
            }
        }
        Ok(())
    }

    proptest! {
        /// Any sequence of operations leaves it holding what a `VecDeque`
        /// holds, in the same order, with one, two or three inline slots,
        /// and it allocates only once it holds more than its capacity.
        #[test]
        fn it_behaves_as_a_vecdeque(ops in proptest::collection::vec(op(), 0..200)) {
            check::<1>(&ops)?;
            check::<2>(&ops)?;
            check::<3>(&ops)?;
        }
    }

    /// A queue that empties starts again at its first inline slot, and the
    /// heap buffer is used only once the inline slots are full.
    #[test]
    fn it_stays_inline_and_rewinds() {
        let mut q = InlineDeque::<u64, 2>::with_capacity(6, 0);
        assert_eq!(q.capacity(), 6);
        for round in 0..10u64 {
            q.push_back(round);
            assert_eq!((q.head, q.len, q.spilled), (0, 1, false));
            assert_eq!(q.slots[0], round);
            assert_eq!(q.pop_front(), Some(round));
        }
        q.push_back(1);
        q.push_back(2);
        assert!(!q.spilled);
        q.push_back(3);
        assert!(q.spilled);
        assert_eq!(q.spill.len(), 1);
        // Inline is drained first; a push meanwhile goes behind the heap's.
        assert_eq!(q.pop_front(), Some(1));
        q.push_back(4);
        assert_eq!(q.spill.len(), 2);
        assert_eq!(
            (1..=4).map(|_| q.pop_front()).collect::<Vec<_>>(),
            [Some(2), Some(3), Some(4), None]
        );
        assert_eq!((q.head, q.len, q.spilled), (0, 0, false));
        q.push_back(5);
        assert_eq!((q.head, q.len, q.spilled, q.slots[0]), (0, 1, false, 5));
    }

    /// The hot bytes are the small fields and the slots, before the heap
    /// buffer's header.
    #[test]
    fn the_hot_bytes_come_first() {
        type Q = InlineDeque<u64, 2>;
        assert_eq!(Q::HOT_BYTES, 8 + 16);
        assert_eq!(core::mem::offset_of!(Q, spill), Q::HOT_BYTES);
    }
}
