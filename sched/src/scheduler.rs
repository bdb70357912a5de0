//! The NIC's flow scheduler (docs/design.md §5; HPCC++ draft-pan-tsvwg-hpccplus-00
//! §7.2 "round-robin credit-based flow scheduler"; HPCC++ 2023 §6.3.1 fig. 7).
//!
//! # What it decides
//!
//! Each call to [`Scheduler::next`] answers "what does the TX pipe send now?":
//!
//! 1. **Control first.** ACK / NAK / CNP descriptors wait in a fixed-capacity
//!    ring ([`Scheduler::push_control`]) and are always served before data, so
//!    feedback is never stuck behind data (docs/design.md §4: ACK/NAK/CNP go at high
//!    priority).
//! 2. **Round-robin over active QPs.** Only QPs that have data *and* may send
//!    are on the active list (an intrusive circular doubly-linked list over a
//!    preallocated per-QP array), so a decision never scans idle QPs. By
//!    default the cursor moves one QP per packet, as in the HPCC++ prototype
//!    (HPCC++ 002 §7.2: "sufficient credits to send one packet"). With a
//!    quantum ([`Scheduler::with_quantum`]) a QP that takes it
//!    ([`Scheduler::set_uses_quantum`]: the NIC's QPs without CC) keeps the
//!    cursor for up to that many bytes while its credit and window allow
//!    (deficit round robin without the deficit carried over): with thousands
//!    of QPs, packet-by-packet interleaving gives the receiver one QP per
//!    packet in every RX burst, so no ACK can be coalesced and every packet
//!    loads another QP's state. A QP under CC keeps one packet per visit: in
//!    the simulator 64 KiB runs made HPCC++'s queues twice as deep.
//! 3. **Credit (pacing).** Each QP earns credit in proportion to its pacing
//!    rate, a token bucket in bytes: `credit += rate_bps * (now - last) / 8e9`,
//!    capped at the burst size. A QP sends when it has credit for its next
//!    packet.
//! 4. **Window.** A QP sends only while `inflight < window` (bytes of LSN in
//!    flight against the CC window; HPCC++ and LDCP are window-based).
//!
//! A QP found window-limited leaves the active list until the engine reports
//! an ACK ([`Scheduler::set_window_state`] / [`Scheduler::on_acked`]). A QP
//! found credit-limited leaves the active list with a wake-up time (the
//! earliest time its credit suffices); the scheduler keeps those wake-ups on
//! its own [`TimerWheel`] and puts the QP back when [`Scheduler::next`] is
//! called at or after that time, so the engine need not route pacing timers
//! itself. When nothing can be sent, `next` returns [`Decision::Idle`] with the
//! earliest wake-up time, which the engine uses to decide how long to poll
//! RX before asking again.
//!
//! Every blocked QP is removed at most once per activation, so a decision is
//! amortised O(1) whatever the number of QPs (16k in docs/design.md §5); nothing
//! allocates after [`Scheduler::new`].
//!
//! # Credit arithmetic
//!
//! Credit is kept exactly in integer units of "bit-nanoseconds per second":
//! one byte is `8e9` units, and `rate_bps * dt_ns` units are earned in `dt_ns`
//! nanoseconds, so no rounding accumulates and the long-run rate is exact.

use crate::timer_wheel::{TimerHandle, TimerWheel};

/// Credit units per byte: 8 bits x 1e9 ns/s.
const UNITS_PER_BYTE: u64 = 8_000_000_000;

/// A rate meaning "not paced": the QP always has credit (CC `none` at line rate).
pub const RATE_UNPACED: u64 = u64::MAX;

/// A window meaning "no window": the QP is never window-limited.
pub const WINDOW_UNLIMITED: u64 = u64::MAX;

/// A control packet to send ahead of data (docs/design.md §5: "ACK/NAK/CNP first").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlDesc {
    /// QP index the control packet belongs to.
    pub qp: u32,
    /// Which control packet.
    pub kind: ControlKind,
    /// PSN to acknowledge / NAK (24 bits used).
    pub psn: u32,
    /// Extra: AETH syndrome/MSN for ACK/NAK, unused for CNP.
    pub aux: u32,
}

/// Kind of [`ControlDesc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// ACKNOWLEDGE (positive).
    Ack,
    /// ACKNOWLEDGE with a NAK syndrome (sequence error, RNR, access, ...).
    Nak,
    /// Congestion notification packet (BTH opcode 0x81, DCQCN).
    Cnp,
    /// Any other high-priority packet (HPCC++ probe response, ...).
    Other,
}

/// What [`Scheduler::next`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<C> {
    /// Send this control packet now (already removed from the control ring).
    Control(C),
    /// QP `qp` may send its next packet of `bytes` bytes now; report it with
    /// [`Scheduler::on_sent`] (and tell the scheduler whether more data is
    /// queued with [`Scheduler::mark_ready`] / [`Scheduler::mark_idle`]).
    Qp {
        /// QP index.
        qp: u32,
        /// Size of the packet the QP announced with `mark_ready`.
        bytes: u32,
    },
    /// Nothing to send now. `wake_at` is the earliest time (ns) a paced QP
    /// will have credit, or `None` if no QP is waiting for credit (only for
    /// data, a window, or a rate above 0).
    Idle {
        /// Earliest pacing wake-up, tick-aligned (never later than the real one).
        wake_at: Option<u64>,
    },
}

/// Errors of [`Scheduler`] calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// The QP index is not below `max_qps`.
    #[error("QP index {0} out of range (max_qps {1})")]
    NoSuchQp(u32, u32),
    /// The control ring is full; the descriptor was not queued.
    #[error("control ring full ({0} descriptors)")]
    ControlFull(usize),
}

/// Where a QP is in the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// No data announced (or removed).
    Idle,
    /// On the round-robin list.
    Active,
    /// Has data but `inflight >= window`; waits for an ACK.
    WindowLimited,
    /// Has data but not enough credit; waits for its pacing wake-up.
    CreditLimited,
    /// Has data but its rate is 0.
    Paused,
}

/// One QP's entry: 64 bytes, on a cache line of its own (`repr(align(64))`).
/// With thousands of QPs an entry is cold at each visit, and one that
/// straddled two lines cost two misses.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Qp {
    prev: u32,
    next: u32,
    state: QpState,
    /// Takes the scheduler's quantum per visit (else one packet).
    uses_quantum: bool,
    next_bytes: u32,
    rate_bps: u64,
    /// Credit in units of 1/8e9 byte.
    credit: u64,
    last_ns: u64,
    inflight: u64,
    window: u64,
    timer: TimerHandle,
}

const NIL: u32 = u32::MAX;

/// The flow scheduler; see the module docs. `C` is the control descriptor
/// type (default [`ControlDesc`]); the engine may use its own `Copy` type.
#[derive(Debug, Clone)]
pub struct Scheduler<C: Copy = ControlDesc> {
    qps: Vec<Qp>,
    /// Current round-robin position (an active QP) or NIL.
    cursor: u32,
    active: u32,
    burst_units: u64,
    /// Bytes a QP may send per visit (at least one packet).
    quantum: u64,
    /// Bytes the QP at the cursor has been given in its current visit.
    turn: u64,
    ctrl: Vec<Option<C>>,
    ctrl_head: usize,
    ctrl_len: usize,
    ctrl_drops: u64,
    wheel: TimerWheel<u32>,
}

/// The round-robin quantum the DPDK NIC's engines use
/// ([`Scheduler::with_quantum`]): a 64 KiB message in one visit at any path
/// MTU from 1024 (64 frames, each charged its payload plus at most 128 bytes
/// of headers and wire overhead), so that with thousands of QPs a receiver
/// gets a message's packets in a run and acknowledges it once. At exactly
/// 64 KiB the last frame of every such message waited for the round robin's
/// next turn: two ACKs and two visits per message.
pub const NIC_QUANTUM_BYTES: u32 = (64 << 10) + 64 * MAX_FRAME_CHARGE_OVER_PAYLOAD;

/// The most a data frame of a QP without CC is charged beyond its payload
/// (its headers: Ethernet, IPv4, UDP, BTH, RETH, ImmDt, the CC extension's;
/// the ICRC; the wire's preamble, gap and FCS), rounded up; the NIC's tests
/// check its largest frame against it.
pub const MAX_FRAME_CHARGE_OVER_PAYLOAD: u32 = 128;

/// Default pacing-wheel tick: 100 ns (a 4 KiB packet at 100 Gbit/s is 330 ns).
pub const DEFAULT_PACING_TICK_NS: u64 = 100;

impl<C: Copy> Scheduler<C> {
    /// A scheduler for QP indices `0..max_qps`, with a token-bucket burst of
    /// `burst_bytes` (the credit cap; a QP can always save at least its next
    /// packet) and a control ring of `control_capacity` descriptors. Uses a
    /// pacing wheel of [`DEFAULT_PACING_TICK_NS`] x 4096 slots. Every QP starts
    /// idle, unpaced, with no window and a full bucket.
    pub fn new(max_qps: u32, burst_bytes: u32, control_capacity: usize) -> Self {
        Self::with_pacing_tick(
            max_qps,
            burst_bytes,
            control_capacity,
            DEFAULT_PACING_TICK_NS,
        )
    }

    /// Like [`Self::new`] with a chosen pacing-wheel tick (ns). A QP is put
    /// back at most one tick after its credit suffices; credit keeps accruing
    /// meanwhile, so the long-run rate is unaffected as long as the burst is
    /// at least one packet plus `rate * tick`.
    pub fn with_pacing_tick(
        max_qps: u32,
        burst_bytes: u32,
        control_capacity: usize,
        tick_ns: u64,
    ) -> Self {
        let max_qps = max_qps.min(NIL - 1);
        let burst_units = burst_bytes as u64 * UNITS_PER_BYTE;
        let qp = Qp {
            prev: NIL,
            next: NIL,
            state: QpState::Idle,
            uses_quantum: false,
            next_bytes: 0,
            rate_bps: RATE_UNPACED,
            credit: burst_units,
            last_ns: 0,
            inflight: 0,
            window: WINDOW_UNLIMITED,
            timer: TimerHandle::NONE,
        };
        Scheduler {
            qps: vec![qp; max_qps as usize],
            cursor: NIL,
            active: 0,
            burst_units,
            quantum: 0,
            turn: 0,
            ctrl: vec![None; control_capacity.max(1)],
            ctrl_head: 0,
            ctrl_len: 0,
            ctrl_drops: 0,
            wheel: TimerWheel::new(tick_ns, 4096, max_qps as usize),
        }
    }

    /// Lets a QP that takes it ([`Self::set_uses_quantum`]) send up to
    /// `bytes` per visit of the round robin (at least one packet; `0`, the
    /// default, is one packet per visit); a paced QP's visit also ends when
    /// its credit does.
    pub fn with_quantum(mut self, bytes: u32) -> Self {
        self.quantum = u64::from(bytes);
        self
    }

    /// Whether QP `qp` takes the quantum per visit (else one packet; every
    /// QP starts without, and [`Self::reset_qp`] clears it).
    pub fn set_uses_quantum(&mut self, qp: u32, on: bool) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.qps[i].uses_quantum = on;
        Ok(())
    }

    /// Number of QP slots.
    pub fn max_qps(&self) -> u32 {
        self.qps.len() as u32
    }

    /// Number of QPs on the round-robin list.
    pub fn active_len(&self) -> u32 {
        self.active
    }

    /// Number of QPs waiting for a pacing wake-up.
    pub fn credit_limited_len(&self) -> usize {
        self.wheel.len()
    }

    /// Control descriptors refused because the ring was full.
    pub fn control_drops(&self) -> u64 {
        self.ctrl_drops
    }

    /// Control descriptors waiting.
    pub fn control_len(&self) -> usize {
        self.ctrl_len
    }

    #[inline]
    fn check(&self, qp: u32) -> Result<usize, SchedError> {
        if (qp as usize) < self.qps.len() {
            Ok(qp as usize)
        } else {
            Err(SchedError::NoSuchQp(qp, self.qps.len() as u32))
        }
    }

    /// The state of a QP (for counters and tests).
    pub fn state(&self, qp: u32) -> Result<QpState, SchedError> {
        Ok(self.qps[self.check(qp)?].state)
    }

    /// The QP's credit in whole bytes (as of its last update).
    pub fn credit_bytes(&self, qp: u32) -> Result<u64, SchedError> {
        Ok(self.qps[self.check(qp)?].credit / UNITS_PER_BYTE)
    }

    /// Queues a control descriptor to be sent before any data. O(1). When the
    /// ring is full the descriptor is refused and counted
    /// ([`Self::control_drops`]); the peer's retransmission recovers.
    pub fn push_control(&mut self, desc: C) -> Result<(), SchedError> {
        if self.ctrl_len == self.ctrl.len() {
            self.ctrl_drops += 1;
            return Err(SchedError::ControlFull(self.ctrl.len()));
        }
        let i = (self.ctrl_head + self.ctrl_len) % self.ctrl.len();
        self.ctrl[i] = Some(desc);
        self.ctrl_len += 1;
        Ok(())
    }

    fn pop_control(&mut self) -> Option<C> {
        if self.ctrl_len == 0 {
            return None;
        }
        let d = self.ctrl[self.ctrl_head].take();
        self.ctrl_head = (self.ctrl_head + 1) % self.ctrl.len();
        self.ctrl_len -= 1;
        d
    }

    /// Links QP `i` at the tail of the round-robin (just before the cursor).
    fn link(&mut self, i: u32) {
        if self.cursor == NIL {
            self.qps[i as usize].prev = i;
            self.qps[i as usize].next = i;
            self.cursor = i;
            self.turn = 0;
        } else {
            let c = self.cursor;
            let p = self.qps[c as usize].prev;
            self.qps[i as usize].prev = p;
            self.qps[i as usize].next = c;
            self.qps[p as usize].next = i;
            self.qps[c as usize].prev = i;
        }
        self.qps[i as usize].state = QpState::Active;
        self.active += 1;
    }

    fn unlink(&mut self, i: u32, to: QpState) {
        let Qp { prev, next, .. } = self.qps[i as usize];
        if next == i {
            self.cursor = NIL;
            self.turn = 0;
        } else {
            self.qps[prev as usize].next = next;
            self.qps[next as usize].prev = prev;
            if self.cursor == i {
                self.cursor = next;
                self.turn = 0;
            }
        }
        let q = &mut self.qps[i as usize];
        q.prev = NIL;
        q.next = NIL;
        q.state = to;
        self.active -= 1;
    }

    /// Leaves whatever blocked/active state the QP is in (cancelling its
    /// pacing wake-up) and becomes `to`.
    fn leave(&mut self, i: u32, to: QpState) {
        match self.qps[i as usize].state {
            QpState::Active => self.unlink(i, to),
            QpState::CreditLimited => {
                let h = self.qps[i as usize].timer;
                self.wheel.cancel(h);
                self.qps[i as usize].state = to;
            }
            _ => self.qps[i as usize].state = to,
        }
    }

    /// Puts a QP that has data back on the round-robin (the next decision
    /// re-checks its window and credit).
    fn reactivate(&mut self, i: u32) {
        if self.qps[i as usize].state != QpState::Active {
            self.leave(i, QpState::Idle);
            self.link(i);
        }
    }

    /// Per-QP cap: the burst, but at least the next packet.
    #[inline]
    fn cap(&self, q: &Qp) -> u64 {
        self.burst_units.max(q.next_bytes as u64 * UNITS_PER_BYTE)
    }

    #[inline]
    fn refill(&mut self, i: usize, now: u64) {
        let cap = self.cap(&self.qps[i]);
        let q = &mut self.qps[i];
        if now > q.last_ns {
            let earned = q.rate_bps.saturating_mul(now - q.last_ns);
            q.credit = q.credit.saturating_add(earned).min(cap);
            q.last_ns = now;
        }
    }

    /// Sets a QP's pacing rate in bit/s (from the CC module's Update event,
    /// HPCC++ 002 §7.2): credit earned so far at the old rate is kept. `0`
    /// pauses the QP; [`RATE_UNPACED`] disables pacing.
    pub fn set_rate(&mut self, qp: u32, rate_bps: u64, now: u64) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.refill(i, now);
        self.qps[i].last_ns = self.qps[i].last_ns.max(now);
        self.qps[i].rate_bps = rate_bps;
        match self.qps[i].state {
            QpState::Idle | QpState::WindowLimited => {}
            QpState::Active if rate_bps == 0 => self.leave(qp, QpState::Paused),
            QpState::Active => {}
            // The wake-up time depends on the rate: decide again.
            QpState::CreditLimited | QpState::Paused => {
                if rate_bps == 0 {
                    self.leave(qp, QpState::Paused)
                } else {
                    self.reactivate(qp)
                }
            }
        }
        Ok(())
    }

    /// Sets a QP's bytes in flight and CC window (bytes of LSN). A
    /// window-limited QP whose window opened goes back on the round-robin.
    pub fn set_window_state(
        &mut self,
        qp: u32,
        inflight: u64,
        window: u64,
    ) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.qps[i].inflight = inflight;
        self.qps[i].window = window;
        if self.qps[i].state == QpState::WindowLimited && inflight < window {
            self.reactivate(qp);
        }
        Ok(())
    }

    /// Sets only the window (keeps the inflight count).
    pub fn set_window(&mut self, qp: u32, window: u64) -> Result<(), SchedError> {
        let inflight = self.qps[self.check(qp)?].inflight;
        self.set_window_state(qp, inflight, window)
    }

    /// `bytes` were acknowledged: inflight shrinks (saturating) and a
    /// window-limited QP may resume.
    pub fn on_acked(&mut self, qp: u32, bytes: u64) -> Result<(), SchedError> {
        let q = self.qps[self.check(qp)?];
        self.set_window_state(qp, q.inflight.saturating_sub(bytes), q.window)
    }

    /// The QP has data; its next packet is `next_pkt_bytes` long (needed to
    /// know how much credit it takes). Idempotent; an idle QP joins the
    /// round-robin at the tail.
    pub fn mark_ready(&mut self, qp: u32, next_pkt_bytes: u32) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.qps[i].next_bytes = next_pkt_bytes;
        if self.qps[i].state == QpState::Idle {
            if self.qps[i].rate_bps == 0 {
                self.qps[i].state = QpState::Paused;
            } else {
                self.link(qp);
            }
        }
        Ok(())
    }

    /// The QP has no more data: it leaves every list (its credit is kept).
    pub fn mark_idle(&mut self, qp: u32) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.leave(i as u32, QpState::Idle);
        Ok(())
    }

    /// Resets a QP slot (QP destroyed or re-created): idle, unpaced, no
    /// window, full bucket.
    pub fn reset_qp(&mut self, qp: u32, now: u64) -> Result<(), SchedError> {
        self.mark_idle(qp)?;
        let burst = self.burst_units;
        let q = &mut self.qps[qp as usize];
        q.next_bytes = 0;
        q.rate_bps = RATE_UNPACED;
        q.credit = burst;
        q.last_ns = now;
        q.inflight = 0;
        q.window = WINDOW_UNLIMITED;
        q.uses_quantum = false;
        Ok(())
    }

    /// Reports that QP `qp` sent a packet of `bytes` at `now`: its credit and
    /// window are charged. The QP stays on the round-robin (call
    /// [`Self::mark_idle`] when it has nothing more, or [`Self::mark_ready`]
    /// with the size of its next packet).
    pub fn on_sent(&mut self, qp: u32, bytes: u32, now: u64) -> Result<(), SchedError> {
        let i = self.check(qp)?;
        self.refill(i, now);
        let q = &mut self.qps[i];
        if q.rate_bps != RATE_UNPACED {
            q.credit = q.credit.saturating_sub(bytes as u64 * UNITS_PER_BYTE);
        }
        q.inflight = q.inflight.saturating_add(bytes as u64);
        Ok(())
    }

    /// Decides what to send at `now` (see the module docs). Amortised O(1).
    pub fn next(&mut self, now: u64) -> Decision<C> {
        if let Some(c) = self.pop_control() {
            return Decision::Control(c);
        }
        // Paced QPs whose credit is due come back (at the tail).
        self.wheel.expire(now);
        while let Some(qp) = self.wheel.pop_ready() {
            if self.qps[qp as usize].state == QpState::CreditLimited {
                self.qps[qp as usize].timer = TimerHandle::NONE;
                self.link(qp);
            }
        }
        while self.cursor != NIL {
            let c = self.cursor;
            let i = c as usize;
            let q = self.qps[i];
            if q.inflight >= q.window {
                self.unlink(c, QpState::WindowLimited);
                continue;
            }
            let bytes = u64::from(q.next_bytes);
            let quantum = if q.uses_quantum { self.quantum } else { 0 };
            if self.turn > 0 && self.turn + bytes > quantum {
                // Its visit is over: the next QP's turn.
                self.cursor = q.next;
                self.turn = 0;
                continue;
            }
            if q.rate_bps != RATE_UNPACED {
                self.refill(i, now);
                let credit = self.qps[i].credit;
                let need = bytes * UNITS_PER_BYTE;
                if credit < need {
                    // Credit-limited: sleep until the deficit is earned (rate
                    // > 0 here, a paused QP never stays active).
                    let wait = (need - credit).div_ceil(q.rate_bps.max(1));
                    self.unlink(c, QpState::CreditLimited);
                    match self.wheel.schedule(now.saturating_add(wait), c) {
                        Ok(h) => self.qps[i].timer = h,
                        // Cannot happen (one timer per QP, capacity max_qps);
                        // stay correct anyway by keeping the QP active.
                        Err(_) => self.link(c),
                    }
                    continue;
                }
            }
            self.turn += bytes;
            if self.turn >= quantum {
                self.cursor = q.next;
                self.turn = 0;
            }
            return Decision::Qp {
                qp: c,
                bytes: q.next_bytes,
            };
        }
        Decision::Idle {
            wake_at: self.wheel.next_deadline(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type S = Scheduler<ControlDesc>;

    /// Virtual-time simulation: a link of `link_bps` serialises packets; all
    /// QPs always have `pkt`-byte packets. Returns bytes sent per QP by `end`.
    fn simulate(s: &mut S, link_bps: u64, end: u64) -> Vec<u64> {
        let mut sent = vec![0u64; s.max_qps() as usize];
        let mut now = 0u64;
        while now < end {
            match s.next(now) {
                Decision::Control(_) => {}
                Decision::Qp { qp, bytes } => {
                    s.on_sent(qp, bytes, now).unwrap();
                    s.on_acked(qp, bytes as u64).unwrap();
                    sent[qp as usize] += bytes as u64;
                    now += (bytes as u64 * 8_000_000_000).div_ceil(link_bps);
                }
                Decision::Idle { wake_at } => now = wake_at.expect("paced QPs must wake"),
            }
        }
        sent
    }

    #[test]
    fn unpaced_equal_qps_alternate() {
        let mut s = S::new(4, 8192, 8);
        s.mark_ready(1, 1000).unwrap();
        s.mark_ready(2, 1000).unwrap();
        assert_eq!(order(&mut s, 6), vec![1, 2, 1, 2, 1, 2]);
    }

    /// Order of the QPs the scheduler picks in `n` decisions at time 0..n,
    /// each sent at once.
    fn order(s: &mut S, n: u64) -> Vec<u32> {
        let mut order = Vec::new();
        for t in 0..n {
            if let Decision::Qp { qp, bytes } = s.next(t) {
                s.on_sent(qp, bytes, t).unwrap();
                order.push(qp);
            }
        }
        order
    }

    /// An entry is one cache line (its docs).
    #[test]
    fn an_entry_is_one_line() {
        assert_eq!(core::mem::size_of::<Qp>(), 64);
        assert_eq!(core::mem::align_of::<Qp>(), 64);
    }

    /// A scheduler with `quantum`, every QP taking it.
    fn with_quantum(s: S, quantum: u32) -> S {
        let mut s = s.with_quantum(quantum);
        for q in 0..s.max_qps() {
            s.set_uses_quantum(q, true).unwrap();
        }
        s
    }

    #[test]
    fn quantum_keeps_a_qp_for_whole_packets_up_to_its_bytes() {
        // 2500 bytes: two 1000-byte packets per visit (a third would exceed).
        let mut s = with_quantum(S::new(4, 8192, 8), 2500);
        for qp in 1..4 {
            s.mark_ready(qp, 1000).unwrap();
        }
        assert_eq!(order(&mut s, 8), vec![1, 1, 2, 2, 3, 3, 1, 1]);
        // A packet larger than the quantum still goes, one per visit.
        let mut s = with_quantum(S::new(4, 8192, 8), 500);
        s.mark_ready(0, 1000).unwrap();
        s.mark_ready(1, 1000).unwrap();
        assert_eq!(order(&mut s, 4), vec![0, 1, 0, 1]);
    }

    /// The NIC's quantum takes a whole 64 KiB message per visit at the path
    /// MTUs from 1024, each frame charged the most a frame may be.
    #[test]
    fn the_nic_quantum_holds_a_64_kib_message() {
        for mtu in [1024u32, 2048, 4096] {
            let frames = (64 << 10) / mtu;
            let mut s = with_quantum(S::new(3, 8192, 8), NIC_QUANTUM_BYTES);
            for qp in 0..3 {
                s.mark_ready(qp, mtu + MAX_FRAME_CHARGE_OVER_PAYLOAD)
                    .unwrap();
            }
            let o = order(&mut s, u64::from(2 * frames));
            let first = o.iter().take_while(|&&q| q == o[0]).count() as u32;
            assert!(first >= frames, "mtu {mtu}: {first} frames a visit");
        }
    }

    #[test]
    fn quantum_visit_ends_with_credit_or_window() {
        // QP 0 is paced with a burst of two packets: its visit ends when its
        // credit does, though the quantum would allow four.
        let mut s = with_quantum(S::with_pacing_tick(2, 2000, 8, 1), 4000);
        s.set_rate(0, 8_000_000, 0).unwrap();
        s.mark_ready(0, 1000).unwrap();
        s.mark_ready(1, 1000).unwrap();
        assert_eq!(order(&mut s, 8), vec![0, 0, 1, 1, 1, 1, 1, 1]);
        // QP 0's window holds three packets: then QP 1's turn.
        let mut s = with_quantum(S::new(2, 8192, 8), 8000);
        s.set_window_state(0, 0, 3000).unwrap();
        s.mark_ready(0, 1000).unwrap();
        s.mark_ready(1, 1000).unwrap();
        assert_eq!(order(&mut s, 5), vec![0, 0, 0, 1, 1]);
        // A QP that joins mid-visit waits for the visit to end.
        let mut s = with_quantum(S::new(3, 8192, 8), 3000);
        s.mark_ready(0, 1000).unwrap();
        assert_eq!(order(&mut s, 1), vec![0]);
        s.mark_ready(1, 1000).unwrap();
        assert_eq!(order(&mut s, 4), vec![0, 0, 1, 1]);
    }

    #[test]
    fn only_qps_that_take_the_quantum_keep_the_cursor() {
        // QP 0 takes it, QP 1 does not (a QP under CC in the NIC).
        let mut s = S::new(2, 8192, 8).with_quantum(3000);
        s.set_uses_quantum(0, true).unwrap();
        s.mark_ready(0, 1000).unwrap();
        s.mark_ready(1, 1000).unwrap();
        assert_eq!(order(&mut s, 8), vec![0, 0, 0, 1, 0, 0, 0, 1]);
        // Reset clears it.
        s.reset_qp(0, 8).unwrap();
        s.mark_ready(0, 1000).unwrap();
        let o = order(&mut s, 12);
        assert!(o.windows(2).all(|w| w[0] != w[1]), "{o:?}");
    }

    #[test]
    fn equal_rates_alternate_under_pacing() {
        let mut s = S::new(2, 2000, 8);
        for qp in 0..2 {
            s.set_rate(qp, 10_000_000_000, 0).unwrap();
            s.mark_ready(qp, 1000).unwrap();
        }
        let mut order = Vec::new();
        let mut now = 0;
        while order.len() < 20 {
            match s.next(now) {
                Decision::Qp { qp, bytes } => {
                    s.on_sent(qp, bytes, now).unwrap();
                    order.push(qp);
                    now += 80; // 100 Gbit/s link
                }
                Decision::Idle { wake_at } => now = wake_at.unwrap(),
                Decision::Control(_) => unreachable!(),
            }
        }
        for pair in order.chunks(2) {
            assert_ne!(pair[0], pair[1], "{order:?}");
        }
    }

    #[test]
    fn rates_one_to_three_share_bytes_one_to_three() {
        let mut s = S::new(2, 4096, 8);
        s.set_rate(0, 10_000_000_000, 0).unwrap();
        s.set_rate(1, 30_000_000_000, 0).unwrap();
        s.mark_ready(0, 1024).unwrap();
        s.mark_ready(1, 1024).unwrap();
        let sent = simulate(&mut s, 100_000_000_000, 1_000_000);
        let ratio = sent[1] as f64 / sent[0] as f64;
        assert!((ratio - 3.0).abs() / 3.0 < 0.02, "ratio {ratio} {sent:?}");
    }

    #[test]
    fn pacing_sends_rate_times_time_within_one_packet() {
        // tick 1 ns: within one packet; default 100 ns tick: the credit still
        // unspent at the end may also include up to one tick of lateness.
        for &tick in &[1u64, DEFAULT_PACING_TICK_NS] {
            for &(rate, pkt) in &[
                (1_000_000_000u64, 1024u32),
                (25_000_000_000, 4096),
                (7_777_777_777, 333),
            ] {
                // Burst of two packets: more than one packet plus rate * tick,
                // so waking up to one tick late loses no credit.
                let mut s = S::with_pacing_tick(1, 2 * pkt, 8, tick);
                s.set_rate(0, rate, 0).unwrap();
                s.mark_ready(0, pkt).unwrap();
                let t = 2_000_000; // 2 ms
                let sent = simulate(&mut s, 400_000_000_000, t)[0] as f64;
                // Starts with a full bucket (two packets).
                let expect = rate as f64 * t as f64 / 8e9 + 2.0 * pkt as f64;
                let tol = pkt as f64 + rate as f64 * (tick - 1) as f64 / 8e9;
                assert!(
                    sent <= expect + 1.0 && sent >= expect - tol,
                    "tick {tick} rate {rate}: sent {sent}, expected {expect} -{tol}"
                );
            }
        }
    }

    #[test]
    fn control_goes_first() {
        let mut s = S::new(2, 4096, 2);
        s.mark_ready(0, 100).unwrap();
        let a = ControlDesc {
            qp: 1,
            kind: ControlKind::Ack,
            psn: 5,
            aux: 0,
        };
        let c = ControlDesc {
            qp: 1,
            kind: ControlKind::Cnp,
            psn: 0,
            aux: 0,
        };
        s.push_control(a).unwrap();
        s.push_control(c).unwrap();
        assert_eq!(s.push_control(a), Err(SchedError::ControlFull(2)));
        assert_eq!(s.control_drops(), 1);
        assert_eq!(s.next(0), Decision::Control(a));
        assert_eq!(s.next(0), Decision::Control(c));
        assert_eq!(s.next(0), Decision::Qp { qp: 0, bytes: 100 });
    }

    #[test]
    fn window_limited_qp_is_skipped_and_resumes() {
        let mut s = S::new(3, 4096, 2);
        s.set_window_state(0, 0, 2000).unwrap();
        s.mark_ready(0, 1000).unwrap();
        s.mark_ready(1, 1000).unwrap();
        let mut order = Vec::new();
        for t in 0..6 {
            if let Decision::Qp { qp, bytes } = s.next(t) {
                s.on_sent(qp, bytes, t).unwrap();
                order.push(qp);
            }
        }
        assert_eq!(order, vec![0, 1, 0, 1, 1, 1]);
        assert_eq!(s.state(0), Ok(QpState::WindowLimited));
        assert_eq!(s.active_len(), 1);
        s.on_acked(0, 1000).unwrap();
        assert_eq!(s.state(0), Ok(QpState::Active));
        let mut got0 = false;
        for t in 6..8 {
            if let Decision::Qp { qp, bytes } = s.next(t) {
                s.on_sent(qp, bytes, t).unwrap();
                got0 |= qp == 0;
            }
        }
        assert!(got0);
    }

    #[test]
    fn idle_returns_right_wake_time() {
        let mut s = S::with_pacing_tick(2, 1000, 2, 1);
        s.set_rate(0, 8_000_000_000, 0).unwrap(); // 1 byte/ns
        s.mark_ready(0, 1000).unwrap();
        assert_eq!(s.next(0), Decision::Qp { qp: 0, bytes: 1000 });
        s.on_sent(0, 1000, 0).unwrap();
        // No credit left: needs 1000 ns.
        assert_eq!(
            s.next(10),
            Decision::Idle {
                wake_at: Some(1000)
            }
        );
        assert_eq!(s.state(0), Ok(QpState::CreditLimited));
        assert_eq!(
            s.next(999),
            Decision::Idle {
                wake_at: Some(1000)
            }
        );
        assert_eq!(s.next(1000), Decision::Qp { qp: 0, bytes: 1000 });
        // Nothing paced and nothing ready: no wake time.
        s.mark_idle(0).unwrap();
        assert_eq!(s.next(2000), Decision::Idle { wake_at: None });
    }

    #[test]
    fn rate_change_and_pause() {
        let mut s = S::with_pacing_tick(1, 1000, 2, 1);
        s.set_rate(0, 8_000_000_000, 0).unwrap();
        s.mark_ready(0, 1000).unwrap();
        assert!(matches!(s.next(0), Decision::Qp { .. }));
        s.on_sent(0, 1000, 0).unwrap();
        assert_eq!(
            s.next(0),
            Decision::Idle {
                wake_at: Some(1000)
            }
        );
        // Faster rate: wake sooner.
        s.set_rate(0, 80_000_000_000, 0).unwrap();
        assert_eq!(s.next(0), Decision::Idle { wake_at: Some(100) });
        s.set_rate(0, 0, 0).unwrap();
        assert_eq!(s.state(0), Ok(QpState::Paused));
        assert_eq!(s.next(5000), Decision::Idle { wake_at: None });
        // A paused QP earns nothing: 1000 more ns are needed after resuming.
        s.set_rate(0, 8_000_000_000, 5000).unwrap();
        assert_eq!(
            s.next(5000),
            Decision::Idle {
                wake_at: Some(6000)
            }
        );
        assert!(matches!(s.next(6000), Decision::Qp { qp: 0, .. }));
    }

    #[test]
    fn bad_qp_is_an_error_not_a_panic() {
        let mut s = S::new(2, 1000, 2);
        assert_eq!(s.mark_ready(2, 10), Err(SchedError::NoSuchQp(2, 2)));
        assert!(s.on_sent(u32::MAX, 10, 0).is_err());
        assert!(s.set_rate(7, 1, 0).is_err());
        assert!(s.state(9).is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Ready(u32, u32),
        Idle(u32),
        Rate(u32, u64),
        Window(u32, u64, u64),
        Ctrl,
        Next(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..8, 1u32..5000).prop_map(|(q, b)| Op::Ready(q, b)),
            1 => (0u32..8).prop_map(Op::Idle),
            2 => (0u32..8, prop_oneof![Just(0u64), Just(RATE_UNPACED), 1u64..100_000_000_000]).prop_map(|(q, r)| Op::Rate(q, r)),
            2 => (0u32..8, 0u64..10_000, 0u64..10_000).prop_map(|(q, i, w)| Op::Window(q, i, w)),
            1 => Just(Op::Ctrl),
            6 => (0u64..5_000).prop_map(Op::Next),
        ]
    }

    proptest! {
        /// Unpaced QPs that always have data take turns in a fixed order,
        /// each visit as many whole packets as fit the quantum (at least one).
        #[test]
        fn quantum_visits_rotate_and_hold_whole_packets(quantum in 0u32..20_000, sizes in proptest::collection::vec(64u32..5000, 2..6)) {
            let n = sizes.len() as u32;
            let mut s = with_quantum(S::new(n, 8192, 4), quantum);
            for (q, &b) in sizes.iter().enumerate() {
                s.mark_ready(q as u32, b).unwrap();
            }
            // Runs of consecutive decisions for one QP: (qp, packets).
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for t in 0..2000 {
                let Decision::Qp { qp, bytes } = s.next(t) else { unreachable!() };
                s.on_sent(qp, bytes, t).unwrap();
                match runs.last_mut() {
                    Some((q, k)) if *q == qp => *k += 1,
                    _ => runs.push((qp, 1)),
                }
            }
            runs.pop(); // the last may be cut short
            for (j, &(qp, k)) in runs.iter().enumerate() {
                prop_assert_eq!(qp, j as u32 % n);
                let b = sizes[qp as usize];
                prop_assert_eq!(k, (quantum / b).max(1), "quantum {} sizes {:?}", quantum, sizes);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Invariants: a QP chosen is active with window room and credit; the
        /// active list is consistent; control always comes first; a paced QP
        /// waiting for credit is never idle-forgotten (Idle reports a wake).
        #[test]
        fn invariants(ops in proptest::collection::vec(op(), 1..300), quantum in prop_oneof![Just(0u32), 1u32..20_000]) {
            let mut s = S::with_pacing_tick(8, 6000, 4, 10).with_quantum(quantum);
            for q in 0..8 {
                s.set_uses_quantum(q, q % 2 == 0).unwrap();
            }
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Ready(q, b) => s.mark_ready(q, b).unwrap(),
                    Op::Idle(q) => s.mark_idle(q).unwrap(),
                    Op::Rate(q, r) => s.set_rate(q, r, now).unwrap(),
                    Op::Window(q, i, w) => s.set_window_state(q, i, w).unwrap(),
                    Op::Ctrl => { let _ = s.push_control(ControlDesc { qp: 0, kind: ControlKind::Ack, psn: 0, aux: 0 }); }
                    Op::Next(dt) => {
                        now += dt;
                        let had_ctrl = s.control_len() > 0;
                        match s.next(now) {
                            Decision::Control(_) => prop_assert!(had_ctrl),
                            Decision::Qp { qp, bytes } => {
                                prop_assert!(!had_ctrl);
                                let q = s.qps[qp as usize];
                                prop_assert_eq!(q.state, QpState::Active);
                                prop_assert!(q.inflight < q.window);
                                prop_assert_eq!(q.next_bytes, bytes);
                                prop_assert!(q.rate_bps == RATE_UNPACED || q.credit >= bytes as u64 * UNITS_PER_BYTE);
                                // A visit holds at most the quantum (or one packet).
                                prop_assert!(s.turn <= u64::from(quantum.max(bytes)));
                                s.on_sent(qp, bytes, now).unwrap();
                            }
                            Decision::Idle { wake_at } => {
                                prop_assert!(!had_ctrl);
                                prop_assert_eq!(s.active_len(), 0);
                                let limited = (0..8).any(|q| s.state(q) == Ok(QpState::CreditLimited));
                                prop_assert_eq!(wake_at.is_some(), limited);
                                if let Some(w) = wake_at { prop_assert!(w > now.saturating_sub(10)); }
                            }
                        }
                    }
                }
                // Active list consistency.
                let n_active = (0..8).filter(|&q| s.state(q) == Ok(QpState::Active)).count() as u32;
                prop_assert_eq!(n_active, s.active_len());
                if s.active_len() > 0 {
                    let mut c = s.cursor;
                    for _ in 0..s.active_len() {
                        prop_assert_eq!(s.qps[s.qps[c as usize].next as usize].prev, c);
                        c = s.qps[c as usize].next;
                    }
                    prop_assert_eq!(c, s.cursor);
                }
                if s.cursor == NIL {
                    prop_assert_eq!(s.turn, 0);
                }
                let n_limited = (0..8).filter(|&q| s.state(q) == Ok(QpState::CreditLimited)).count();
                prop_assert_eq!(n_limited, s.credit_limited_len());
            }
        }
    }
}
