//! Hashed timing wheel for the NIC's timers (docs/design.md §5: "timers (pacing
//! wake-up, retransmit, LDCP sub-packet window tick RTT/cw) on a timing wheel").
//!
//! # Why a wheel
//!
//! The engine keeps several timers per QP (retransmit timeout, RNR timer,
//! LDCP sub-packet window tick, HPCC++ probe, DCQCN rate-increase / alpha
//! timers, pacing wake-up) for up to 16k QPs, and re-arms most of them on
//! nearly every ACK. A binary heap costs O(log n) per re-arm and cannot cancel
//! in place; a hashed wheel (Varghese & Lauck, scheme 6/7) does schedule,
//! cancel and re-schedule in O(1) and expires in O(1) per fired timer.
//!
//! # Structure
//!
//! * Time is a `u64` of nanoseconds passed in by the caller (docs/design.md §2/§3:
//!   the pure cores never read a clock). It is quantised into ticks of
//!   `tick_ns`; a timer due at `d` ns expires at tick `e = ceil(d / tick_ns)`,
//!   so it never fires early and fires at the first [`TimerWheel::advance`]
//!   whose `now >= e * tick_ns`, i.e. less than one tick after `d` when the
//!   wheel is advanced at least once a tick.
//! * One level of `slots` (a power of two) doubly-linked lists covers one
//!   rotation: a pending timer with `cur < e <= cur + slots` sits in slot
//!   `e & (slots - 1)`, so every timer found in a slot when its tick is
//!   processed is due (no "rounds" to skip).
//! * Timers further out than one rotation sit in a second level of
//!   [`LEVEL2`] lists, one per rotation (rotation `r` holds the ticks
//!   `r * slots + 1 ..= (r + 1) * slots`): when the current tick crosses a
//!   multiple of `slots`, the list of the rotation that begins moves into
//!   the slots. So a timer 67 ms out (a retransmit timeout) against a 4 ms
//!   rotation is moved once, O(1), however many such timers are pending.
//! * Timers further out than that sit in an *overflow* list, swept when the
//!   current tick crosses a multiple of `slots` and the list's earliest expiry
//!   (a lower bound kept on insert, made exact by each sweep) comes within the
//!   second level's reach: no sweep while nothing in it is near.
//! * Timers whose deadline has already passed go straight to a *ready* list and
//!   fire on the next advance, whatever `now` it is given.
//! * A time jump longer than one rotation is handled in one pass over the slots
//!   and the overflow list (O(slots + pending)), never tick by tick.
//!
//! All nodes live in a slab preallocated at construction (`capacity` timers
//! plus one sentinel per list), linked by `u32` indices with a free list; no
//! operation allocates. Handles carry a generation so that cancelling a timer
//! that already fired (or whose slot was reused) is a harmless no-op.

/// Index value meaning "no node".
const NIL: u32 = u32::MAX;

/// Lists of the second level: one per rotation of the slots, the next
/// `LEVEL2` rotations (module docs). 64, so that one word marks which are
/// occupied.
pub const LEVEL2: usize = 64;

/// What kind of timer a [`TimerKey`] is; the engine matches on it when a timer
/// fires (docs/design.md §5 lists the timers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum TimerKind {
    /// Pacing wake-up: a credit-limited QP has earned enough credit (§5 scheduler).
    PacingWake = 0,
    /// Retransmit timeout (IBA local ACK timeout) of a requester QP.
    Retransmit = 1,
    /// Receiver-not-ready timer after an RNR NAK.
    Rnr = 2,
    /// LDCP sub-packet window tick: send one packet every RTT/cw (LDCP draft).
    LdcpTick = 3,
    /// HPCC++ probe packet (probe-mode telemetry, HPCC++ 000 §6).
    HpccProbe = 4,
    /// DCQCN rate-increase timer.
    DcqcnRateIncrease = 5,
    /// DCQCN alpha-update timer.
    DcqcnAlpha = 6,
    /// Anything else the engine needs (delayed ACK, statistics, ...).
    Other = 7,
}

/// A small `Copy` payload naming the timer: which QP, which kind, and the
/// QP's generation (so a timer left over from a destroyed and re-created QP
/// number is recognised and ignored by the engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerKey {
    /// QP index in the engine's QP table (not necessarily the 24-bit QPN).
    pub qp: u32,
    /// What to do when it fires.
    pub kind: TimerKind,
    /// Generation of the QP slot when the timer was set.
    pub gen: u32,
}

/// Handle to a scheduled timer, returned by [`TimerWheel::schedule`].
///
/// Generation-checked: once the timer fired or was cancelled, the handle goes
/// stale and every operation on it is a no-op that reports so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    idx: u32,
    gen: u32,
}

impl TimerHandle {
    /// A handle that never refers to a pending timer (handy as an initial
    /// value in per-QP state).
    pub const NONE: TimerHandle = TimerHandle { idx: NIL, gen: 0 };
}

/// Errors of [`TimerWheel`] operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimerError {
    /// All `capacity` timers are pending; size the wheel for QPs x timer kinds.
    #[error("timer wheel full: all {0} timers are pending")]
    Full(usize),
    /// The handle's timer already fired or was cancelled.
    #[error("stale timer handle (the timer already fired or was cancelled)")]
    Stale,
}

/// Where a node currently is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Free,
    Slot,
    Level2,
    Overflow,
    Ready,
    Sentinel,
}

#[derive(Debug, Clone, Copy)]
struct Node<T> {
    prev: u32,
    next: u32,
    gen: u32,
    place: Place,
    /// Expiry tick `ceil(deadline / tick_ns)`.
    tick: u64,
    value: Option<T>,
}

/// A hashed timing wheel with an overflow list; see the module docs.
///
/// `T` is the payload handed back when a timer fires (usually [`TimerKey`]).
#[derive(Debug, Clone)]
pub struct TimerWheel<T: Copy> {
    tick_ns: u64,
    slots: usize,
    mask: u64,
    capacity: usize,
    /// `capacity` timer nodes, then `slots` slot sentinels, then the overflow
    /// sentinel, then the ready sentinel, then [`LEVEL2`] second-level
    /// sentinels.
    nodes: Vec<Node<T>>,
    /// `log2(slots)`: a tick's rotation is `(tick - 1) >> shift`.
    shift: u32,
    /// One bit per second-level list: the list is non-empty.
    level2_occupied: u64,
    /// Lower bound of each second-level list's expiry ticks (stale-low
    /// after cancels, as `overflow_min`).
    level2_min: [u64; LEVEL2],
    /// One bit per slot: the slot list is non-empty (for [`Self::next_deadline`]).
    occupied: Vec<u64>,
    free_head: u32,
    /// Last processed tick: every tick `<= cur` has been expired.
    cur: u64,
    pending: usize,
    overflow_len: usize,
    /// Lower bound of the expiry ticks in the overflow list (may be stale-low
    /// after cancels, which only makes [`Self::next_deadline`] early, never late).
    overflow_min: u64,
}

impl<T: Copy> TimerWheel<T> {
    /// Creates a wheel whose ticks are `tick_ns` nanoseconds (at least 1),
    /// with `slots` lists (rounded up to a power of two, at least 2; one
    /// rotation is `slots * tick_ns`) and room for `capacity` pending timers.
    ///
    /// Everything is allocated here; nothing afterwards. `now` starts at 0:
    /// call [`Self::advance`] (or construct with [`Self::with_start`]) if the
    /// clock starts elsewhere.
    pub fn new(tick_ns: u64, slots: usize, capacity: usize) -> Self {
        Self::with_start(tick_ns, slots, capacity, 0)
    }

    /// Like [`Self::new`] but the wheel's current time starts at `now_ns`.
    pub fn with_start(tick_ns: u64, slots: usize, capacity: usize, now_ns: u64) -> Self {
        let tick_ns = tick_ns.max(1);
        let slots = slots.clamp(2, 1 << 24).next_power_of_two();
        // Keep every index (timers + sentinels) below NIL.
        let capacity = capacity.min((u32::MAX as usize) - slots - 3 - LEVEL2);
        let total = capacity + slots + 2 + LEVEL2;
        let mut nodes = Vec::with_capacity(total);
        for i in 0..capacity {
            nodes.push(Node {
                prev: NIL,
                next: if i + 1 < capacity {
                    (i + 1) as u32
                } else {
                    NIL
                },
                gen: 1,
                place: Place::Free,
                tick: 0,
                value: None,
            });
        }
        for i in capacity..total {
            nodes.push(Node {
                prev: i as u32,
                next: i as u32,
                gen: 0,
                place: Place::Sentinel,
                tick: 0,
                value: None,
            });
        }
        TimerWheel {
            tick_ns,
            slots,
            mask: (slots - 1) as u64,
            shift: slots.trailing_zeros(),
            level2_occupied: 0,
            level2_min: [u64::MAX; LEVEL2],
            capacity,
            nodes,
            occupied: vec![0; slots.div_ceil(64)],
            free_head: if capacity > 0 { 0 } else { NIL },
            cur: now_ns / tick_ns,
            pending: 0,
            overflow_len: 0,
            overflow_min: u64::MAX,
        }
    }

    /// Tick length in nanoseconds.
    pub fn tick_ns(&self) -> u64 {
        self.tick_ns
    }

    /// Number of slots (one rotation is `slots() * tick_ns()`).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Maximum number of pending timers.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of pending (scheduled, not yet fired or cancelled) timers.
    pub fn len(&self) -> usize {
        self.pending
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// The wheel's time: the start of the last processed tick, in ns.
    pub fn now_ns(&self) -> u64 {
        self.cur.saturating_mul(self.tick_ns)
    }

    #[inline]
    fn slot_sentinel(&self, slot: usize) -> u32 {
        (self.capacity + slot) as u32
    }

    #[inline]
    fn overflow_sentinel(&self) -> u32 {
        (self.capacity + self.slots) as u32
    }

    #[inline]
    fn ready_sentinel(&self) -> u32 {
        (self.capacity + self.slots + 1) as u32
    }

    #[inline]
    fn level2_sentinel(&self, list: usize) -> u32 {
        (self.capacity + self.slots + 2 + list) as u32
    }

    /// The rotation that begins at the next multiple of `slots` after the
    /// current tick: the first one the second level holds.
    #[inline]
    fn next_rotation(&self) -> u64 {
        (self.cur >> self.shift) + 1
    }

    #[inline]
    fn list_is_empty(&self, sentinel: u32) -> bool {
        self.nodes[sentinel as usize].next == sentinel
    }

    /// Appends node `i` at the tail of the list of `sentinel`.
    #[inline]
    fn push_back(&mut self, sentinel: u32, i: u32) {
        let tail = self.nodes[sentinel as usize].prev;
        self.nodes[i as usize].prev = tail;
        self.nodes[i as usize].next = sentinel;
        self.nodes[tail as usize].next = i;
        self.nodes[sentinel as usize].prev = i;
    }

    /// Unlinks node `i` from whatever list it is in.
    #[inline]
    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        self.nodes[prev as usize].next = next;
        self.nodes[next as usize].prev = prev;
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = NIL;
    }

    #[inline]
    fn slot_of(&self, tick: u64) -> usize {
        (tick & self.mask) as usize
    }

    #[inline]
    fn set_occupied(&mut self, slot: usize) {
        self.occupied[slot / 64] |= 1u64 << (slot % 64);
    }

    #[inline]
    fn clear_occupied_if_empty(&mut self, slot: usize) {
        if self.list_is_empty(self.slot_sentinel(slot)) {
            self.occupied[slot / 64] &= !(1u64 << (slot % 64));
        }
    }

    /// Links node `i` (already holding its tick) into the list its tick
    /// belongs to, relative to the current tick.
    fn place(&mut self, i: u32) {
        let tick = self.nodes[i as usize].tick;
        if tick <= self.cur {
            self.nodes[i as usize].place = Place::Ready;
            self.push_back(self.ready_sentinel(), i);
        } else if tick - self.cur <= self.slots as u64 {
            let slot = self.slot_of(tick);
            self.nodes[i as usize].place = Place::Slot;
            self.push_back(self.slot_sentinel(slot), i);
            self.set_occupied(slot);
        } else if ((tick - 1) >> self.shift) < self.next_rotation() + LEVEL2 as u64 {
            // tick > cur + slots, so its rotation is at least the next one.
            let list = ((tick - 1) >> self.shift) as usize & (LEVEL2 - 1);
            self.nodes[i as usize].place = Place::Level2;
            self.push_back(self.level2_sentinel(list), i);
            self.level2_occupied |= 1 << list;
            self.level2_min[list] = self.level2_min[list].min(tick);
        } else {
            self.nodes[i as usize].place = Place::Overflow;
            self.push_back(self.overflow_sentinel(), i);
            self.overflow_len += 1;
            self.overflow_min = self.overflow_min.min(tick);
        }
    }

    /// Removes node `i` from its list, keeping the bookkeeping right.
    fn take_out(&mut self, i: u32) {
        let place = self.nodes[i as usize].place;
        self.unlink(i);
        match place {
            Place::Slot => {
                let slot = self.slot_of(self.nodes[i as usize].tick);
                self.clear_occupied_if_empty(slot);
            }
            Place::Level2 => {
                let list =
                    ((self.nodes[i as usize].tick - 1) >> self.shift) as usize & (LEVEL2 - 1);
                if self.list_is_empty(self.level2_sentinel(list)) {
                    self.level2_occupied &= !(1 << list);
                    self.level2_min[list] = u64::MAX;
                }
            }
            Place::Overflow => {
                self.overflow_len -= 1;
                if self.overflow_len == 0 {
                    self.overflow_min = u64::MAX;
                }
            }
            _ => {}
        }
    }

    #[inline]
    fn deadline_tick(&self, deadline_ns: u64) -> u64 {
        deadline_ns.div_ceil(self.tick_ns)
    }

    #[inline]
    fn live(&self, h: TimerHandle) -> bool {
        (h.idx as usize) < self.capacity && {
            let n = &self.nodes[h.idx as usize];
            n.gen == h.gen
                && matches!(
                    n.place,
                    Place::Slot | Place::Level2 | Place::Overflow | Place::Ready
                )
        }
    }

    /// Schedules `value` to fire at `deadline_ns` (never before it; at the
    /// first advance at or after the end of its tick). A deadline in the past
    /// fires on the next [`Self::advance`]. O(1).
    pub fn schedule(&mut self, deadline_ns: u64, value: T) -> Result<TimerHandle, TimerError> {
        let i = self.free_head;
        if i == NIL {
            return Err(TimerError::Full(self.capacity));
        }
        self.free_head = self.nodes[i as usize].next;
        let tick = self.deadline_tick(deadline_ns);
        let n = &mut self.nodes[i as usize];
        n.tick = tick;
        n.value = Some(value);
        n.next = NIL;
        let gen = n.gen;
        self.place(i);
        self.pending += 1;
        Ok(TimerHandle { idx: i, gen })
    }

    /// Returns node `i` to the free list, bumping its generation.
    fn release(&mut self, i: u32) -> Option<T> {
        let n = &mut self.nodes[i as usize];
        n.gen = n.gen.wrapping_add(1).max(1);
        n.place = Place::Free;
        let v = n.value.take();
        n.next = self.free_head;
        n.prev = NIL;
        self.free_head = i;
        self.pending -= 1;
        v
    }

    /// Cancels a pending timer, returning its payload; `None` if the handle is
    /// stale (already fired or cancelled). O(1).
    pub fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        if !self.live(h) {
            return None;
        }
        self.take_out(h.idx);
        self.release(h.idx)
    }

    /// True while the handle's timer is pending.
    pub fn is_pending(&self, h: TimerHandle) -> bool {
        self.live(h)
    }

    /// The deadline tick of a pending timer, in ns (`ceil(deadline/tick)*tick`).
    pub fn expiry_ns(&self, h: TimerHandle) -> Option<u64> {
        self.live(h)
            .then(|| self.nodes[h.idx as usize].tick.saturating_mul(self.tick_ns))
    }

    /// Moves a pending timer to a new deadline, keeping its handle. O(1).
    /// Fails with [`TimerError::Stale`] if it already fired or was cancelled
    /// (then schedule a new one).
    pub fn reschedule(&mut self, h: TimerHandle, deadline_ns: u64) -> Result<(), TimerError> {
        if !self.live(h) {
            return Err(TimerError::Stale);
        }
        self.take_out(h.idx);
        self.nodes[h.idx as usize].tick = self.deadline_tick(deadline_ns);
        self.place(h.idx);
        Ok(())
    }

    /// Moves every timer of slot list `slot` (all due) to the ready list.
    fn drain_slot(&mut self, slot: usize) {
        let s = self.slot_sentinel(slot);
        if self.list_is_empty(s) {
            return;
        }
        // Splice the whole slot list onto the tail of the ready list.
        let r = self.ready_sentinel();
        let first = self.nodes[s as usize].next;
        let last = self.nodes[s as usize].prev;
        let mut i = first;
        loop {
            self.nodes[i as usize].place = Place::Ready;
            if i == last {
                break;
            }
            i = self.nodes[i as usize].next;
        }
        let rtail = self.nodes[r as usize].prev;
        self.nodes[rtail as usize].next = first;
        self.nodes[first as usize].prev = rtail;
        self.nodes[last as usize].next = r;
        self.nodes[r as usize].prev = last;
        self.nodes[s as usize].next = s;
        self.nodes[s as usize].prev = s;
        self.occupied[slot / 64] &= !(1u64 << (slot % 64));
    }

    /// Re-places every timer of second-level list `list` relative to the
    /// current tick (into the slots, when its rotation has begun).
    fn drain_level2(&mut self, list: usize) {
        let l = self.level2_sentinel(list);
        // Detach the whole list first: a timer may go back into it (after
        // a jump of the current tick, its rotation may still be ahead).
        let mut i = self.nodes[l as usize].next;
        let last = self.nodes[l as usize].prev;
        self.nodes[l as usize].next = l;
        self.nodes[l as usize].prev = l;
        self.level2_occupied &= !(1 << list);
        self.level2_min[list] = u64::MAX;
        if i == l {
            return;
        }
        loop {
            let next = self.nodes[i as usize].next;
            self.nodes[i as usize].prev = NIL;
            self.nodes[i as usize].next = NIL;
            self.place(i);
            if i == last {
                break;
            }
            i = next;
        }
    }

    /// Walks the overflow list: timers now within the reach of the slots or
    /// the second level go there (or to ready), others stay. Recomputes the
    /// min.
    fn sweep_overflow(&mut self) {
        let o = self.overflow_sentinel();
        let mut i = self.nodes[o as usize].next;
        let mut min = u64::MAX;
        let reach = (self.next_rotation() + LEVEL2 as u64) << self.shift;
        while i != o {
            let next = self.nodes[i as usize].next;
            let tick = self.nodes[i as usize].tick;
            if tick <= reach {
                self.unlink(i);
                self.overflow_len -= 1;
                self.place(i);
            } else {
                min = min.min(tick);
            }
            i = next;
        }
        self.overflow_min = min;
    }

    /// Moves every timer due at `now_ns` to the ready list, without firing.
    /// Use with [`Self::pop_ready`] when the handler must schedule timers
    /// while firing; [`Self::advance`] does both. Time never goes backwards:
    /// an earlier `now_ns` than the wheel's time is a no-op.
    pub fn expire(&mut self, now_ns: u64) {
        let target = now_ns / self.tick_ns;
        if target <= self.cur {
            return;
        }
        if self.pending == 0 {
            self.cur = target;
            return;
        }
        if target - self.cur > self.slots as u64 {
            // A jump past one whole rotation: every slotted timer is due.
            for k in 1..=self.slots as u64 {
                let slot = self.slot_of(self.cur + k);
                self.drain_slot(slot);
            }
            // The second level in rotation order from the old time's next
            // one, so that the ready list stays in expiry order.
            let first = self.next_rotation() as usize;
            self.cur = target;
            for k in 0..LEVEL2 {
                self.drain_level2((first + k) & (LEVEL2 - 1));
            }
            self.sweep_overflow();
            return;
        }
        // Tick by tick, but over the occupancy bitmap: a run of empty slots
        // costs a bit scan, not a look at each slot's list (4096 list heads
        // are more than L1 holds; the bitmap is 512 bytes).
        while self.cur < target {
            let base = self.cur + 1;
            if base & self.mask == 0 {
                // A new rotation: its first slot, then its second-level
                // list moves into the slots, and the overflow list is swept
                // once `overflow_min` (a lower bound) says that a timer in
                // it may have come within the second level's reach.
                self.cur = base;
                self.drain_slot(0);
                let list = (base >> self.shift) as usize & (LEVEL2 - 1);
                if self.level2_occupied & (1 << list) != 0 {
                    self.drain_level2(list);
                }
                let reach = (self.next_rotation() + LEVEL2 as u64) << self.shift;
                if self.overflow_len > 0 && self.overflow_min <= reach {
                    self.sweep_overflow();
                }
                continue;
            }
            // Ticks base..=limit lie in one rotation: slots from..=to.
            let limit = target.min(base | self.mask);
            let (from, to) = (self.slot_of(base), self.slot_of(limit));
            match self.first_occupied(from, to) {
                Some(slot) => {
                    self.cur = base + (slot - from) as u64;
                    self.drain_slot(slot);
                }
                None => self.cur = limit,
            }
        }
    }

    /// The first slot in `from..=to` (`from <= to`) whose list is not
    /// empty, by the occupancy bitmap.
    fn first_occupied(&self, from: usize, to: usize) -> Option<usize> {
        let (w_from, w_to) = (from / 64, to / 64);
        for w in w_from..=w_to {
            let mut bits = self.occupied[w];
            if w == w_from {
                bits &= !0u64 << (from % 64);
            }
            if w == w_to && to % 64 != 63 {
                bits &= (1u64 << (to % 64 + 1)) - 1;
            }
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
        }
        None
    }

    /// Pops one expired timer (moved to the ready list by [`Self::expire`], or
    /// scheduled in the past), in expiry order. Its handle goes stale.
    pub fn pop_ready(&mut self) -> Option<T> {
        let r = self.ready_sentinel();
        let i = self.nodes[r as usize].next;
        if i == r {
            return None;
        }
        self.unlink(i);
        self.release(i)
    }

    /// Advances the wheel to `now_ns` and calls `fire` once for every timer
    /// that is due (deadline `<= now_ns` rounded up to the tick), in expiry
    /// order (except after a jump of more than one rotation, where timers
    /// from beyond the first rotation come last). Each timer fires exactly
    /// once; O(ticks elapsed + timers fired), O(slots + pending) for a jump.
    pub fn advance(&mut self, now_ns: u64, fire: &mut impl FnMut(T)) {
        self.expire(now_ns);
        while let Some(v) = self.pop_ready() {
            fire(v);
        }
    }

    /// The earliest time (ns, tick-aligned) at which a timer may be due, or
    /// `None` if none is pending: a hint for how long the engine may sleep.
    /// Never later than the real next expiry; may be earlier after cancels of
    /// far-future timers. Cost: O(slots / 64) word scans.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.pending == 0 {
            return None;
        }
        if !self.list_is_empty(self.ready_sentinel()) {
            return Some(self.now_ns());
        }
        let mut best = self.overflow_min;
        if self.level2_occupied != 0 {
            // The first occupied second-level list from the next rotation on
            // (its timers come before every later list's).
            let first = self.next_rotation() as usize & (LEVEL2 - 1);
            let k = self
                .level2_occupied
                .rotate_right(first as u32)
                .trailing_zeros();
            best = best.min(self.level2_min[(first + k as usize) & (LEVEL2 - 1)]);
        }
        // Scan slots cur+1 ..= cur+slots in order via the occupancy bitmap.
        let start = self.slot_of(self.cur + 1);
        let words = self.occupied.len();
        let mut found = None;
        // First the part of the start word at and after `start`, then the
        // following words cyclically, then the part of the start word before.
        let w0 = start / 64;
        let first_bits = self.occupied[w0] & (!0u64 << (start % 64));
        if first_bits != 0 {
            found = Some(w0 * 64 + first_bits.trailing_zeros() as usize);
        } else {
            for k in 1..=words {
                let w = (w0 + k) % words;
                let mut bits = self.occupied[w];
                if w == w0 {
                    bits &= !(!0u64 << (start % 64));
                }
                if bits != 0 {
                    found = Some(w * 64 + bits.trailing_zeros() as usize);
                    break;
                }
            }
        }
        if let Some(slot) = found {
            let dist = (slot as u64).wrapping_sub(start as u64) & self.mask;
            best = best.min(self.cur + 1 + dist);
        }
        (best != u64::MAX).then(|| best.saturating_mul(self.tick_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn fired(w: &mut TimerWheel<u32>, now: u64) -> Vec<u32> {
        let mut v = Vec::new();
        w.advance(now, &mut |x| v.push(x));
        v
    }

    #[test]
    fn fires_never_early_at_most_one_tick_late() {
        let mut w = TimerWheel::new(100, 16, 8);
        w.schedule(250, 1).unwrap();
        assert!(fired(&mut w, 249).is_empty());
        // Tick of 250 is 3 (ends at 300): not yet due at 299.
        assert!(fired(&mut w, 299).is_empty());
        assert_eq!(fired(&mut w, 300), vec![1]);
        assert!(fired(&mut w, 10_000).is_empty());
        assert!(w.is_empty());
    }

    #[test]
    fn exact_tick_deadline_fires_at_deadline() {
        let mut w = TimerWheel::new(100, 16, 8);
        w.schedule(300, 7).unwrap();
        assert!(fired(&mut w, 299).is_empty());
        assert_eq!(fired(&mut w, 300), vec![7]);
    }

    #[test]
    fn past_deadline_fires_on_next_advance_even_same_tick() {
        let mut w = TimerWheel::with_start(100, 16, 8, 1_000);
        w.schedule(5, 1).unwrap();
        w.schedule(1_000, 2).unwrap();
        assert_eq!(w.next_deadline(), Some(1_000));
        assert_eq!(fired(&mut w, 1_000), vec![1, 2]);
    }

    /// A jump over many rotations fires the second level's timers in expiry
    /// order, also where its lists wrap (rotations 62 and 63 sit in the
    /// last lists, 67 and 72 in lists 3 and 8).
    #[test]
    fn a_jump_fires_second_level_timers_in_expiry_order() {
        let mut w = TimerWheel::with_start(1, 8, 8, 480);
        for (id, d) in [(1, 540), (2, 580), (3, 500), (4, 510), (5, 100_000)] {
            w.schedule(d, id).unwrap();
        }
        assert_eq!(w.next_deadline(), Some(500));
        assert_eq!(fired(&mut w, 5_000), vec![3, 4, 1, 2]);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn far_future_beyond_rotations() {
        let mut w = TimerWheel::new(10, 8, 8); // rotation = 80 ns
        w.schedule(1_000, 1).unwrap();
        w.schedule(95, 2).unwrap();
        w.schedule(10_000_000, 3).unwrap();
        assert_eq!(w.next_deadline(), Some(100));
        let mut now = 0;
        let mut log = Vec::new();
        while now <= 2_000 {
            w.advance(now, &mut |x| log.push((x, now)));
            now += 7;
        }
        // Advances at multiples of 7: 105 is the first >= 100, 1001 the first >= 1000.
        assert_eq!(log, vec![(2, 105), (1, 1001)]);
        assert_eq!(w.len(), 1);
        assert!(w.next_deadline().unwrap() <= 10_000_000);
        // Big jump.
        assert_eq!(fired(&mut w, 20_000_000), vec![3]);
    }

    #[test]
    fn cancel_and_stale_handles() {
        let mut w = TimerWheel::new(10, 8, 2);
        let a = w.schedule(50, 1).unwrap();
        let b = w.schedule(5_000, 2).unwrap();
        assert_eq!(w.schedule(60, 3), Err(TimerError::Full(2)));
        assert_eq!(w.cancel(b), Some(2));
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.reschedule(b, 1), Err(TimerError::Stale));
        let c = w.schedule(60, 3).unwrap(); // reuses b's node
        assert_ne!(b, c);
        assert_eq!(
            w.cancel(b),
            None,
            "old handle must not cancel the new timer"
        );
        assert!(w.is_pending(c));
        assert_eq!(fired(&mut w, 100), vec![1, 3]);
        assert!(!w.is_pending(a));
        assert_eq!(w.cancel(a), None);
        assert_eq!(w.cancel(TimerHandle::NONE), None);
    }

    #[test]
    fn reschedule_moves_timer() {
        let mut w = TimerWheel::new(10, 8, 4);
        let h = w.schedule(50, 1).unwrap();
        w.reschedule(h, 500).unwrap();
        assert!(fired(&mut w, 100).is_empty());
        assert_eq!(w.expiry_ns(h), Some(500));
        w.reschedule(h, 0).unwrap();
        assert_eq!(fired(&mut w, 100), vec![1]);
    }

    #[test]
    fn pop_ready_lets_handler_rearm() {
        let mut w = TimerWheel::new(10, 8, 4);
        w.schedule(10, 1).unwrap();
        let mut log = Vec::new();
        for now in [10, 50, 110, 150, 310] {
            w.expire(now);
            while let Some(v) = w.pop_ready() {
                log.push((v, now));
                if v < 3 {
                    w.schedule(now + v as u64 * 100, v + 1).unwrap();
                }
            }
        }
        assert_eq!(log, vec![(1, 10), (2, 110), (3, 310)]);
        assert!(w.is_empty());
    }

    #[test]
    fn many_qps_many_timers() {
        let qps = 16_384u32;
        let mut w: TimerWheel<TimerKey> = TimerWheel::new(1_000, 4_096, qps as usize * 4);
        let kinds = [
            TimerKind::Retransmit,
            TimerKind::PacingWake,
            TimerKind::LdcpTick,
            TimerKind::HpccProbe,
        ];
        let mut handles = Vec::new();
        for qp in 0..qps {
            for (k, &kind) in kinds.iter().enumerate() {
                let d = (qp as u64 * 7_919 + k as u64 * 1_000_003) % 50_000_000;
                handles.push(w.schedule(d, TimerKey { qp, kind, gen: 0 }).unwrap());
            }
        }
        // Cancel every retransmit timer.
        for h in handles.iter().step_by(4) {
            assert!(w.cancel(*h).is_some());
        }
        let mut n = 0usize;
        let mut now = 0;
        while now <= 50_000_000 {
            w.advance(now, &mut |k: TimerKey| {
                assert_ne!(k.kind, TimerKind::Retransmit);
                n += 1;
            });
            now += 250_000;
        }
        assert_eq!(n, qps as usize * 3);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Schedule(u64),
        Cancel(usize),
        Reschedule(usize, u64),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..5_000).prop_map(Op::Schedule),
            1 => (0u64..200_000).prop_map(Op::Schedule),
            2 => any::<usize>().prop_map(Op::Cancel),
            1 => (any::<usize>(), 0u64..10_000).prop_map(|(i, d)| Op::Reschedule(i, d)),
            4 => prop_oneof![0u64..50, 0u64..1_000, 0u64..100_000].prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Against a BTreeMap reference: the same timers fire, each exactly
        /// once, never early, and exactly at the first advance past the end
        /// of its tick.
        #[test]
        fn matches_reference_model(tick in 1u64..50, slots in 2usize..64, ops in proptest::collection::vec(op(), 1..200)) {
            let mut w: TimerWheel<u32> = TimerWheel::new(tick, slots, 64);
            let mut model: BTreeMap<u32, (u64, TimerHandle)> = BTreeMap::new();
            let mut now = 0u64;
            let mut id = 0u32;
            for op in ops {
                match op {
                    Op::Schedule(dt) => {
                        let d = now + dt;
                        match w.schedule(d, id) {
                            Ok(h) => { model.insert(id, (d, h)); }
                            Err(TimerError::Full(_)) => prop_assert_eq!(model.len(), 64),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                        id += 1;
                    }
                    Op::Cancel(i) => {
                        if !model.is_empty() {
                            let k = *model.keys().nth(i % model.len()).unwrap();
                            let (_, h) = model.remove(&k).unwrap();
                            prop_assert_eq!(w.cancel(h), Some(k));
                            prop_assert_eq!(w.cancel(h), None);
                        }
                    }
                    Op::Reschedule(i, dt) => {
                        if !model.is_empty() {
                            let k = *model.keys().nth(i % model.len()).unwrap();
                            let e = model.get_mut(&k).unwrap();
                            e.0 = now + dt;
                            prop_assert!(w.reschedule(e.1, now + dt).is_ok());
                        }
                    }
                    Op::Advance(dt) => {
                        now += dt;
                        if let Some(nd) = w.next_deadline() {
                            let earliest = model.values().map(|&(d, _)| d.div_ceil(tick) * tick).min().unwrap();
                            prop_assert!(nd <= earliest.max(w.now_ns()), "hint {nd} later than {earliest}");
                        } else {
                            prop_assert!(model.is_empty());
                        }
                        let mut got = Vec::new();
                        w.advance(now, &mut |x| got.push(x));
                        got.sort();
                        let want: Vec<u32> = model.iter()
                            .filter(|(_, &(d, _))| d.div_ceil(tick) * tick <= now)
                            .map(|(&k, _)| k).collect();
                        prop_assert_eq!(&got, &want);
                        for k in &want {
                            let (d, _) = model.remove(k).unwrap();
                            prop_assert!(d <= now, "fired early");
                        }
                        prop_assert_eq!(w.len(), model.len());
                    }
                }
            }
        }
    }
}
