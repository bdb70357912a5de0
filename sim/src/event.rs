//! The event queue: a binary min-heap of 16-byte entries `(time, seq << 32 | event)`.
//!
//! Events at the same nanosecond leave in the order they were scheduled (the sequence
//! number), so a run is a pure function of its inputs and seed. An event is a 32-bit
//! word ([`Event`]) naming what happens; the state it acts on (a link's frames in
//! flight, a host's NIC) lives in the fabric, so entries stay small.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What happens at an event's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The first frame in flight on link `0` reaches the link's far end.
    LinkArrive(u32),
    /// Switch egress port of link `0` may start its next frame.
    PortTx(u32),
    /// Host `0`'s NIC: timers due, then transmit while its link is free.
    HostWake(u32),
    /// Flow `0` starts (its QPs are created and its first message posted).
    FlowStart(u32),
    /// Periodic sample of the monitored queues.
    Sample,
}

const KIND_SHIFT: u32 = 29;
const ID_MASK: u32 = (1 << KIND_SHIFT) - 1;

impl Event {
    /// Largest id an event can carry.
    pub const MAX_ID: u32 = ID_MASK;

    fn encode(self) -> u32 {
        let (k, id) = match self {
            Event::LinkArrive(i) => (0, i),
            Event::PortTx(i) => (1, i),
            Event::HostWake(i) => (2, i),
            Event::FlowStart(i) => (3, i),
            Event::Sample => (4, 0),
        };
        debug_assert!(id <= ID_MASK);
        (k << KIND_SHIFT) | (id & ID_MASK)
    }

    fn decode(w: u32) -> Self {
        let id = w & ID_MASK;
        match w >> KIND_SHIFT {
            0 => Event::LinkArrive(id),
            1 => Event::PortTx(id),
            2 => Event::HostWake(id),
            3 => Event::FlowStart(id),
            _ => Event::Sample,
        }
    }
}

/// The future event list.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    seq: u32,
    popped: u64,
}

impl EventQueue {
    /// An empty queue with room for `cap` pending events.
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            heap: BinaryHeap::with_capacity(cap),
            seq: 0,
            popped: 0,
        }
    }

    /// Schedules `ev` at `time` (ns).
    #[inline]
    pub fn push(&mut self, time: u64, ev: Event) {
        // The sequence number wraps after 2^32 events; it only orders events of the
        // same nanosecond, which are never that far apart.
        let key = (u64::from(self.seq) << 32) | u64::from(ev.encode());
        self.seq = self.seq.wrapping_add(1);
        self.heap.push(Reverse((time, key)));
    }

    /// The earliest event, if any.
    #[inline]
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        let Reverse((t, key)) = self.heap.pop()?;
        self.popped += 1;
        Some((t, Event::decode(key as u32)))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No event pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events taken so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_fifo_within_a_nanosecond() {
        let mut q = EventQueue::with_capacity(8);
        q.push(30, Event::HostWake(1));
        q.push(10, Event::PortTx(7));
        q.push(30, Event::LinkArrive(2));
        q.push(20, Event::FlowStart(Event::MAX_ID));
        q.push(30, Event::Sample);
        q.push(10, Event::HostWake(0));
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            got,
            vec![
                (10, Event::PortTx(7)),
                (10, Event::HostWake(0)),
                (20, Event::FlowStart(Event::MAX_ID)),
                (30, Event::HostWake(1)),
                (30, Event::LinkArrive(2)),
                (30, Event::Sample),
            ]
        );
        assert_eq!(q.popped(), 6);
        assert!(q.is_empty());
    }
}
