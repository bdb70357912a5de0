//! The event queue: 16-byte entries `(time, seq << 32 | event)` in a calendar queue.
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
    /// Flow `0` starts at its sender: its requester QP is connected and its first
    /// message posted (both QPs were allocated before the window, see `fabric`).
    FlowStart(u32),
    /// Flow `0`'s responder QP is connected at its receiver.
    FlowAccept(u32),
    /// Periodic sample of the monitored queues.
    Sample,
    /// A PFC PAUSE reaches the sending end of link `0`: it stops sending data.
    PfcPause(u32),
    /// A PFC resume (PAUSE with time 0) reaches the sending end of link `0`.
    PfcResume(u32),
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
            Event::PfcPause(i) => (5, i),
            Event::PfcResume(i) => (6, i),
            Event::FlowAccept(i) => (7, i),
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
            5 => Event::PfcPause(id),
            6 => Event::PfcResume(id),
            7 => Event::FlowAccept(id),
            _ => Event::Sample,
        }
    }
}

/// Bucket width of the calendar: 2^4 = 16 ns.
const WIDTH_SHIFT: u32 = 4;
/// Buckets: 2^18 x 16 ns = 4.2 ms ahead; later events wait in a heap.
const BUCKETS: usize = 1 << 18;

/// The future event list: a calendar queue (buckets of 16 ns over a 4.2 ms horizon,
/// each sorted only when the clock reaches it) with a binary heap for events beyond
/// the horizon (retransmit timeouts). Entries are `(time, seq << 32 | event)`, so the
/// order is total and the same in every run.
#[derive(Debug)]
pub struct EventQueue {
    buckets: Vec<Vec<(u64, u64)>>,
    /// Start time of the current bucket (a multiple of the width).
    cur_start: u64,
    cur: usize,
    /// The current bucket is sorted, latest first.
    cur_sorted: bool,
    in_buckets: usize,
    far: BinaryHeap<Reverse<(u64, u64)>>,
    seq: u32,
    popped: u64,
}

impl Default for EventQueue {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl EventQueue {
    /// An empty queue (`cap`: pending events expected beyond the horizon).
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            cur_start: 0,
            cur: 0,
            cur_sorted: true,
            in_buckets: 0,
            far: BinaryHeap::with_capacity(cap),
            seq: 0,
            popped: 0,
        }
    }

    #[inline]
    fn horizon(&self) -> u64 {
        self.cur_start + ((BUCKETS as u64) << WIDTH_SHIFT)
    }

    #[inline]
    fn insert(&mut self, e: (u64, u64)) {
        let t = e.0.max(self.cur_start);
        let e = (t, e.1);
        if t >= self.horizon() {
            self.far.push(Reverse(e));
            return;
        }
        let i = ((t >> WIDTH_SHIFT) as usize) & (BUCKETS - 1);
        let b = &mut self.buckets[i];
        if i == self.cur && self.cur_sorted {
            // Latest first: keep it sorted.
            let pos = b.partition_point(|x| *x > e);
            b.insert(pos, e);
        } else {
            b.push(e);
        }
        self.in_buckets += 1;
    }

    /// Schedules `ev` at `time` (ns); a time before the current bucket counts as now.
    #[inline]
    pub fn push(&mut self, time: u64, ev: Event) {
        // The sequence number wraps after 2^32 events; it only orders events of the
        // same nanosecond, which are never that far apart.
        let key = (u64::from(self.seq) << 32) | u64::from(ev.encode());
        self.seq = self.seq.wrapping_add(1);
        self.insert((time, key));
    }

    /// The earliest event, if any.
    #[inline]
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        self.pop_before(u64::MAX)
    }

    /// The earliest event if it is earlier than `limit` (the end of a window of the
    /// parallel loop). The queue's clock never moves past the bucket that holds
    /// `limit`, so events pushed later at `limit` or after keep their times.
    #[inline]
    pub fn pop_before(&mut self, limit: u64) -> Option<(u64, Event)> {
        loop {
            if !self.cur_sorted {
                self.buckets[self.cur].sort_unstable_by(|a, b| b.cmp(a));
                self.cur_sorted = true;
            }
            if let Some(&(t, key)) = self.buckets[self.cur].last() {
                if t >= limit {
                    return None;
                }
                self.buckets[self.cur].pop();
                self.in_buckets -= 1;
                self.popped += 1;
                return Some((t, Event::decode(key as u32)));
            }
            let next_start = if self.in_buckets == 0 {
                // Jump to the first far event (or stop).
                let &Reverse((t, _)) = self.far.peek()?;
                t >> WIDTH_SHIFT << WIDTH_SHIFT
            } else {
                self.cur_start + (1 << WIDTH_SHIFT)
            };
            if next_start >= limit {
                return None;
            }
            self.cur_start = next_start;
            self.cur = ((self.cur_start >> WIDTH_SHIFT) as usize) & (BUCKETS - 1);
            self.cur_sorted = false;
            // Far events that the horizon now covers move into their buckets.
            let h = self.horizon();
            while let Some(&Reverse(e)) = self.far.peek() {
                if e.0 >= h {
                    break;
                }
                self.far.pop();
                self.insert(e);
            }
        }
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.in_buckets + self.far.len()
    }

    /// No event pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// Windows of the parallel loop: nothing at or after the limit leaves, and an
    /// event pushed later at the limit (a message from another partition) keeps its
    /// time even when the queue had nothing before it.
    #[test]
    fn pop_before_stops_at_the_limit_and_later_pushes_keep_their_time() {
        let mut q = EventQueue::default();
        q.push(990, Event::HostWake(1));
        q.push(5_000, Event::HostWake(2));
        q.push(100_000_000, Event::HostWake(3)); // beyond the horizon
        assert_eq!(q.pop_before(1_000), Some((990, Event::HostWake(1))));
        assert_eq!(q.pop_before(1_000), None);
        q.push(1_000, Event::LinkArrive(7));
        assert_eq!(q.pop_before(2_000), Some((1_000, Event::LinkArrive(7))));
        assert_eq!(q.pop_before(2_000), None);
        assert_eq!(q.pop_before(99_000_000), Some((5_000, Event::HostWake(2))));
        assert_eq!(q.pop_before(99_000_000), None);
        q.push(99_000_003, Event::PortTx(4));
        assert_eq!(q.pop(), Some((99_000_003, Event::PortTx(4))));
        assert_eq!(q.pop(), Some((100_000_000, Event::HostWake(3))));
        assert!(q.pop().is_none());
    }

    /// Against a plain sorted reference: random times near and far (beyond the
    /// calendar's horizon), pushes interleaved with pops, never in the past.
    #[test]
    fn matches_a_sorted_reference() {
        let mut rng = switch::Rng::new(9);
        let mut q = EventQueue::default();
        let mut reference: Vec<(u64, u64, u32)> = Vec::new();
        let (mut now, mut seq) = (0u64, 0u64);
        for round in 0..20_000u32 {
            let n = rng.next_u32() % 3;
            for _ in 0..n {
                let d = match rng.next_u32() % 10 {
                    0 => u64::from(rng.next_u32()) * 8, // up to 34 s: beyond the horizon
                    1 => 0,
                    _ => u64::from(rng.next_u32() % 5_000),
                };
                q.push(now + d, Event::HostWake(round));
                reference.push((now + d, seq, round));
                seq += 1;
            }
            if rng.next_u32() % 2 == 0 {
                reference.sort();
                let want = (!reference.is_empty()).then(|| reference.remove(0));
                let got = q.pop();
                assert_eq!(got, want.map(|(t, _, id)| (t, Event::HostWake(id))));
                if let Some((t, _)) = got {
                    now = t;
                }
            }
        }
        reference.sort();
        for (t, _, id) in reference {
            assert_eq!(q.pop(), Some((t, Event::HostWake(id))));
        }
        assert!(q.pop().is_none());
    }
}
