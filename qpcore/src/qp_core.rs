//! The per-QP core (docs/design.md "The per-QP core"): one QP's transport, its
//! congestion control, its place in the flow scheduler and its timers on the wheel,
//! and every step between them, driven with the time as an argument.
//!
//! The NIC engine (`nic/src/engine`) and roce-sim's NIC (`sim/src/nic.rs`) hold one
//! [`QpCore`] per QP and call the same steps:
//!
//! - a received frame: [`QpCore::receive`] (the receiver side of the CC on a
//!   request, then the transport);
//! - after anything touched the QP: [`QpCore::feed_events`] (transport events into
//!   the CC and the CC's answers back), [`QpCore::move_completions`] (into a
//!   [`Completions`], the driver's CQs or flows), then [`QpCore::requeue`] (timers
//!   onto the wheel, control packets into the scheduler's control ring, the CC's rate
//!   into the pacer, the QP back on the round robin);
//! - a timer off the wheel: [`QpCore::on_timer`];
//! - the scheduler's decision: [`QpCore::send_control`] (a CNP owed, an ACK/NAK, a
//!   probe response) or [`QpCore::send_data`] (the transport's next packet with the
//!   CC told of data sent), each handing the packet to a [`FrameSink`], the driver's
//!   mbufs or simulated frames.
//!
//! What stays in each driver is its own: the engine's doorbells, CQ rings, slow path,
//! fatal-error reports and DPDK frames; the simulator's flows and counters. Pure and
//! allocation-free: the engine's hot path calls it for every packet.

use cc::{AnyCc, CongestionControl};
use rdma::transport::{
    EchoedHops, MemorySpace, MrTable, Payload, Qp, QpEvent, Sge, Srq, TxPacket, WorkCompletion,
};
use rdma::wire::frame::{IntInsert, RoceRepr};
use rdma::wire::{BthRepr, Ecn, FrameBuilder, Opcode, RoceFrame};
use sched::scheduler::{Scheduler, RATE_UNPACED};
use sched::timer_wheel::{TimerHandle, TimerKey, TimerKind as WheelKind, TimerWheel};

use crate::gbn_backoff::GoBackNBackoff;
use crate::qp_cc::{self, RttProbe, CC_TIMERS};

/// Where a QP's packets go: the driver builds each into a frame and queues it for
/// its link (the engine into an mbuf of its TX burst, the simulator into a frame
/// buffer for its link).
pub trait FrameSink {
    /// Builds `pkt` on the headers of `fb` and queues the frame: its wire bytes
    /// (frame, FCS, preamble and inter-frame gap), as the pacer charges them, or
    /// `None` when it could not be built (the driver counts that; the transport has
    /// taken the packet as sent and will resend it if it is lost). `gather`
    /// is the SGE list a [`Payload::Gather`] payload refers to
    /// ([`Qp::gather_list`]; empty for any other payload).
    fn emit(&mut self, fb: &FrameBuilder, pkt: &TxPacket, gather: &[Sge]) -> Option<u32>;
}

/// Where a QP's completions go: the engine's CQ rings, the simulator's flows.
pub trait Completions {
    /// Whether one more completion fits (a full CQ leaves them in the QP).
    fn has_room(&self) -> bool;
    /// Takes one completion.
    fn complete(&mut self, wc: WorkCompletion);
}

/// What [`QpCore::feed_events`] saw besides what it handed the CC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fed {
    /// Retransmit timeouts among the events.
    pub timeouts: u32,
    /// The transport entered ERR (the engine reports it as `IBV_EVENT_QP_FATAL`).
    pub fatal: bool,
}

/// One QP as the engine and the simulator drive it.
///
/// In a set order (`repr(C)`), for thousands of QPs whose state is cold at
/// each visit: what every visit reads first, on three lines when the core
/// starts a line, as it does in the engine's slot (the go-back-N window and
/// the transport timer; the headers, the flags and the RTT probe; the pacing
/// rate and the CC's first 24 bytes, all the state of CC `none`), then the
/// rest of the CC's state, the CC timers and the transport (laid out the
/// same way, [`Qp`]).
#[derive(Debug)]
#[repr(C)]
pub struct QpCore {
    /// CC `none` only: the window cut by go-back-N rounds ([`crate::gbn_backoff`]).
    pub backoff: Option<GoBackNBackoff>,
    /// The transport timer on the wheel and the deadline it is armed for.
    pub transport_timer: Option<(TimerHandle, u64)>,
    /// Its headers (with an INT insert when the CC wants telemetry on data).
    pub fb: FrameBuilder,
    /// Wire bytes of the QP's next data packet, as the pacer charges it (the last
    /// data packet's size).
    pub next_bytes: u32,
    /// The CC extension header was negotiated (the parser needs to know).
    pub cc_ext: bool,
    /// The QP index is in the scheduler's control ring.
    pub ctrl_queued: bool,
    /// A CNP is owed to the peer (DCQCN notification point).
    pub cnp_pending: bool,
    /// Bit `k` clear: CC timer `k` is neither wanted (`cc_timers`) nor on
    /// the wheel (`cc_armed`), so [`Self::sync_timers`] skips it. A QP whose CC
    /// has no timer running (CC `none`) then does not read those two arrays,
    /// two cache lines that are cold on every visit with thousands of QPs.
    cc_live: u8,
    /// The port holds all QPs together to the line rate, the rate of a QP
    /// without CC: that QP is then not paced ([`Self::pacing_rate`]), which
    /// would only cost a trip over the timer wheel whenever a TX burst (one
    /// `now` for up to 32 frames) spent the pacing bucket. True on the NIC (its
    /// port shaper runs at the line rate); false in the simulator, whose NICs'
    /// line may be slower than their link and is held by the pacing alone.
    pub port_holds_line_rate: bool,
    /// The INT insert a probe always carries (HPCC++ 000 §6.2).
    pub probe_int: IntInsert,
    /// One RTT measurement at a time.
    pub rtt_probe: RttProbe,
    /// The rate the scheduler paces the QP at ([`Self::pacing_rate`] when the QP
    /// was last requeued); `None` until the first requeue after a (re)start.
    pub sched_rate: Option<u64>,
    /// Its congestion control.
    pub cc: AnyCc,
    /// The CC timers on the wheel, by [`qp_cc::timer_index`].
    pub cc_armed: [Option<(TimerHandle, u64)>; 4],
    /// Deadlines of the CC timers, by [`qp_cc::timer_index`] (0 = not armed).
    pub cc_timers: [u64; 4],
    /// The RC transport; `None` while the QP is not connected (RESET, INIT).
    pub qp: Option<Qp>,
}

/// Whether a packet the transport gives is data for the CC and the pacer (not an
/// ACK, not a control packet, not header-only).
#[inline]
pub fn is_data(pkt: &TxPacket) -> bool {
    !pkt.priority && pkt.lsn_len > 0 && pkt.repr.bth.opcode != Opcode::Acknowledge
}

impl QpCore {
    /// The byte offsets of the lines a visit reads (the struct's docs): the
    /// first three, then the transport's ([`Qp::HOT_LINES`]). For an engine
    /// that prefetches a QP's state ahead of its visit.
    pub const HOT_LINES: [usize; 3 + Qp::HOT_LINES.len()] =
        rdma::transport::nest_hot_lines(3, core::mem::offset_of!(QpCore, qp), Qp::HOT_LINES);

    /// A QP without a transport yet, with its CC, headers and path MTU.
    pub fn new(cc: AnyCc, fb: FrameBuilder, probe_int: IntInsert, cc_ext: bool, mtu: u32) -> Self {
        Self {
            qp: None,
            cc,
            fb,
            probe_int,
            cc_ext,
            ctrl_queued: false,
            sched_rate: None,
            next_bytes: mtu + 100,
            transport_timer: None,
            cc_armed: [None; 4],
            cc_timers: [0; 4],
            cc_live: 0,
            rtt_probe: None,
            cnp_pending: false,
            backoff: None,
            port_holds_line_rate: false,
        }
    }

    /// Applies the CC's answer: timers to arm, a CNP to send, the window to feed
    /// back (Rx-HPCC), a probe to send (HPCC++ probe mode).
    #[inline]
    pub fn apply(&mut self, a: cc::Actions) {
        for t in a.timers() {
            self.cc_live |= 1 << qp_cc::timer_index(t.kind);
        }
        qp_cc::apply(
            a,
            self.qp.as_mut(),
            &mut self.cc_timers,
            &mut self.cnp_pending,
        );
    }

    /// The transport's send window: the CC's, or for CC `none` the go-back-N
    /// backoff's.
    #[inline]
    pub fn update_window(&mut self) {
        let w = qp_cc::window(&self.cc, self.backoff.as_ref());
        if let Some(qp) = self.qp.as_mut() {
            qp.set_window(w);
        }
    }

    /// A received frame for this QP: the receiver side of the CC for a request
    /// (DCQCN notification point, Rx-HPCC NewINT), then the transport.
    #[inline]
    pub fn receive<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now: u64,
        mrs: &mut MrTable,
        mem: &mut M,
    ) {
        if f.bth.opcode.is_request() {
            let a = qp_cc::on_rx_data(&mut self.cc, f, now);
            self.apply(a);
        }
        if let Some(qp) = self.qp.as_mut() {
            qp.on_rx(f, now, mrs, mem);
        }
    }

    /// [`Self::receive`] for a QP that receives from shared receive queue
    /// `srq`; whether the SRQ's armed limit was crossed (the driver raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn receive_srq<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now: u64,
        mrs: &mut MrTable,
        mem: &mut M,
        mut srq: Option<&mut Srq>,
    ) -> bool {
        if f.bth.opcode.is_request() {
            let a = qp_cc::on_rx_data(&mut self.cc, f, now);
            self.apply(a);
        }
        if let Some(qp) = self.qp.as_mut() {
            qp.on_rx_srq(f, now, mrs, mem, srq.as_deref_mut());
        }
        srq.is_some_and(Srq::take_limit_event)
    }

    /// Feeds every event the transport raised into the CC and the CC's answers back
    /// (`qp_cc::on_event`), after the core's own part: a QP without CC backs off on
    /// go-back-N rounds and grows back on ACKs. The transport's window follows.
    pub fn feed_events(&mut self, now: u64) -> Fed {
        let mut fed = Fed::default();
        let mut events = 0;
        while let Some((ev, echo)) = self.qp.as_mut().and_then(Qp::poll_event) {
            events += 1;
            match ev {
                QpEvent::Ack { newly_acked, .. } => {
                    if let Some(b) = self.backoff.as_mut() {
                        b.on_ack(newly_acked);
                    }
                }
                QpEvent::Error => fed.fatal = true,
                QpEvent::Timeout { .. } => fed.timeouts += 1,
                _ => {}
            }
            if qp_cc::is_go_back_n(&ev) {
                let in_flight = self.qp.as_ref().map_or(0, Qp::in_flight);
                if let Some(b) = self.backoff.as_mut() {
                    b.on_go_back_n(in_flight);
                }
            }
            let hops = echo.as_ref().map_or(&[][..], EchoedHops::records);
            let a = qp_cc::on_event(&mut self.cc, &mut self.rtt_probe, &ev, hops, now);
            self.apply(a);
        }
        if events > 0 {
            self.update_window();
        }
        fed
    }

    /// Moves the transport's completions into `out` while it has room; whether none
    /// is left in the QP.
    pub fn move_completions<C: Completions>(&mut self, out: &mut C) -> bool {
        let Some(qp) = self.qp.as_mut() else {
            return true;
        };
        loop {
            if !out.has_room() {
                return qp.pending_completions() == 0;
            }
            let Some(wc) = qp.poll_cq() else { return true };
            out.complete(wc);
        }
    }

    /// The rate the scheduler paces the QP at: its CC's, except that a QP without
    /// CC is not paced ([`RATE_UNPACED`]) where [`Self::port_holds_line_rate`].
    pub fn pacing_rate(&self) -> u64 {
        if self.port_holds_line_rate && self.cc.kind() == cc::CcKind::None {
            RATE_UNPACED
        } else {
            self.cc.rate_bps()
        }
    }

    /// Puts the connected QP where it belongs after its state changed: its timers on
    /// the wheel ([`Self::sync_timers`]), its control packets in the scheduler's
    /// control ring, its pacing rate ([`Self::pacing_rate`]) in the scheduler, and
    /// back on the round robin (new work may have become sendable: a window opened,
    /// an RNR wait ended, a READ to answer; the QP leaves it again when the
    /// transport has nothing). `q` is its
    /// index in the scheduler, `key` its timers' key (the kind is set here). The
    /// earliest deadline it armed on the wheel, `u64::MAX` if none.
    pub fn requeue(
        &mut self,
        sched: &mut Scheduler<u32>,
        wheel: &mut TimerWheel<TimerKey>,
        key: TimerKey,
        now: u64,
    ) -> u64 {
        let Some(qp) = self.qp.as_ref() else {
            return u64::MAX;
        };
        let control = self.cnp_pending || qp.has_control();
        let armed = self.sync_timers(wheel, key);
        let q = key.qp;
        if control && !self.ctrl_queued {
            // One entry per QP at most, in a ring of as many entries as QPs: never full.
            self.ctrl_queued = sched.push_control(q).is_ok();
        }
        let rate = self.pacing_rate();
        if self.sched_rate != Some(rate) {
            // First requeue after a (re)start, or the CC's rate changed. A QP
            // without CC takes the scheduler's quantum (NIC_QUANTUM_BYTES): runs
            // of its packets let the receiver coalesce ACKs.
            self.sched_rate = Some(rate);
            let _ = sched.set_rate(q, rate, now);
            let _ = sched.set_uses_quantum(q, self.cc.kind() == cc::CcKind::None);
        }
        let _ = sched.mark_ready(q, self.next_bytes);
        armed
    }

    /// Puts the QP's timers on the wheel where their deadlines changed: the
    /// transport's next timer (retransmit or RNR) and each armed CC timer. The
    /// earliest deadline it armed, `u64::MAX` if none.
    #[inline]
    pub fn sync_timers(&mut self, wheel: &mut TimerWheel<TimerKey>, key: TimerKey) -> u64 {
        let with = |kind| TimerKey { kind, ..key };
        let want = self.qp.as_ref().and_then(Qp::next_timer);
        let mut armed = arm(
            wheel,
            &mut self.transport_timer,
            want,
            with(WheelKind::Retransmit),
        );
        if self.cc_live == 0 {
            return armed;
        }
        let mut live = 0;
        for (k, ((slot, &d), &(_, kind))) in self
            .cc_armed
            .iter_mut()
            .zip(&self.cc_timers)
            .zip(&CC_TIMERS)
            .enumerate()
        {
            armed = armed.min(arm(wheel, slot, (d != 0).then_some(d), with(kind)));
            if slot.is_some() || d != 0 {
                live |= 1 << k;
            }
        }
        self.cc_live = live;
        armed
    }

    /// A timer of kind `kind` came off the wheel at `now`: the transport's
    /// (retransmit or RNR) or a CC timer, each acted on only if really due (timers
    /// are re-armed lazily, [`Self::sync_timers`]). False when the QP has no
    /// transport (nothing to do, nothing to requeue).
    pub fn on_timer(&mut self, kind: WheelKind, now: u64) -> bool {
        let Some(qp) = self.qp.as_mut() else {
            return false;
        };
        if kind == WheelKind::Retransmit {
            self.transport_timer = None;
            if qp.next_timer().is_some_and(|t| t <= now) {
                qp.on_timer(now);
            }
        } else if let Some(k) = CC_TIMERS.iter().position(|&(_, w)| w == kind) {
            self.cc_armed[k] = None;
            let d = self.cc_timers[k];
            if d != 0 && d <= now {
                self.cc_timers[k] = 0;
                let a = self.cc.on_timer(now, CC_TIMERS[k].0);
                self.apply(a);
                self.update_window();
            }
        }
        true
    }

    /// One control packet, the scheduler's control ring having chosen the QP (index
    /// `q`): a CNP it owes, else its transport's next ACK/NAK or probe response, into
    /// `out` without an INT container (probe responses echo telemetry in their CC
    /// extension header, HPCC++ 000 §6.2). Not charged to the QP's credit.
    pub fn send_control<F: FrameSink>(
        &mut self,
        sched: &mut Scheduler<u32>,
        q: u32,
        now: u64,
        out: &mut F,
    ) {
        self.ctrl_queued = false;
        let Some(qp) = self.qp.as_mut() else { return };
        let mut fb = self.fb;
        fb.int = None;
        // Emitted from where it was built (a `TxPacket` is ~300 bytes).
        let polled = if self.cnp_pending {
            self.cnp_pending = false;
            Some(TxPacket {
                repr: RoceRepr::new(BthRepr::new(Opcode::Cnp, qp.config().dest_qpn, 0)),
                payload: Payload::None,
                ecn: Ecn::NotEct,
                priority: true,
                lsn: 0,
                lsn_len: 0,
                retransmit: false,
                ah: None,
            })
        } else {
            qp.poll_tx_control(now)
        };
        let Some(pkt) = &polled else { return };
        if self.cnp_pending || qp.has_control() {
            self.ctrl_queued = sched.push_control(q).is_ok();
        }
        // Control packets carry no gathered payload.
        let _ = out.emit(&fb, pkt, &[]);
    }

    /// The transport's next packet (data, a READ request, a probe, or an ACK that was
    /// due), the round robin having chosen the QP: the CC is told of data sent, a
    /// probe carries an INT container, the frame goes to `out`, the pacer is
    /// charged and the QP requeued. A QP with nothing sendable leaves the round
    /// robin. The earliest timer deadline it armed, `u64::MAX` if none.
    pub fn send_data<F: FrameSink>(
        &mut self,
        sched: &mut Scheduler<u32>,
        wheel: &mut TimerWheel<TimerKey>,
        key: TimerKey,
        now: u64,
        out: &mut F,
    ) -> u64 {
        let q = key.qp;
        // Worked on where the transport built it (a `TxPacket` is ~300 bytes).
        let mut polled = match self.qp.as_mut() {
            Some(qp) => qp.poll_tx(now),
            None => None,
        };
        let Some(pkt) = polled.as_mut() else {
            let _ = sched.mark_idle(q);
            return u64::MAX;
        };
        let data = is_data(pkt);
        let mut fb = self.fb;
        if data {
            let a = qp_cc::on_data_sent(&mut self.cc, &mut self.rtt_probe, pkt, now);
            self.apply(a);
        } else if pkt.repr.bth.opcode == Opcode::Probe {
            // Probes always collect telemetry (HPCC++ 000 §6.2).
            fb.int = Some(self.probe_int);
        } else {
            fb.int = None;
        }
        let gather = self
            .qp
            .as_ref()
            .map_or(&[][..], |qp| qp.gather_list(&pkt.payload));
        let wire = out.emit(&fb, pkt, gather);
        // Even when the frame could not be built (the sink counts it), the
        // transport has taken the packet as sent: its retransmit timer must still
        // go on the wheel below, or a lost tail would never be resent.
        if let Some(w) = wire {
            let _ = sched.on_sent(q, w, now);
            if data {
                self.next_bytes = w;
            }
        }
        self.requeue(sched, wheel, key, now)
    }

    /// Takes the QP's timers off the wheel (the QP is destroyed or reset).
    pub fn cancel_timers(&mut self, wheel: &mut TimerWheel<TimerKey>) {
        if let Some((h, _)) = self.transport_timer.take() {
            wheel.cancel(h);
        }
        for (h, _) in self.cc_armed.iter_mut().filter_map(Option::take) {
            wheel.cancel(h);
        }
        self.cc_timers = [0; 4];
        self.cc_live = 0;
    }
}

/// Makes sure one timer fires no later than `want`; O(1). A timer armed earlier
/// than wanted is left alone (the retransmit deadline moves later on every ACK):
/// the handler ([`QpCore::on_timer`]) acts only on what is really due and re-arms
/// for the real deadline, so while data is in flight the wheel is touched about
/// once per timeout, not once per packet. A timer no longer wanted at all (the
/// last ACK came in) is taken off the wheel now, while the QP's state is in the
/// cache: left to fire, it would visit a QP that is cold by then (67 ms later,
/// with thousands of QPs) for nothing, a dozen cache misses per message.
/// The deadline it armed, `u64::MAX` if none.
#[inline]
fn arm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    want: Option<u64>,
    key: TimerKey,
) -> u64 {
    // `armed` is Some exactly while its entry is on the wheel: the handler clears
    // it when the entry fires, and this and `cancel_timers` when they take it off
    // (so no wheel lookup, a likely cache miss, on this per-packet path).
    match (*armed, want) {
        (Some((_, at)), Some(w)) if at <= w => u64::MAX,
        (None, None) => u64::MAX,
        (Some((h, _)), None) => {
            wheel.cancel(h);
            *armed = None;
            u64::MAX
        }
        (cur, Some(w)) => {
            rearm(wheel, armed, cur, w, key);
            w
        }
    }
}

/// The rare half of [`arm`]: a deadline earlier than the armed one, or none armed.
#[cold]
fn rearm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    cur: Option<(TimerHandle, u64)>,
    want: u64,
    key: TimerKey,
) {
    *armed = match cur {
        Some((h, _)) if wheel.reschedule(h, want).is_ok() => Some((h, want)),
        _ => wheel.schedule(want, key).ok().map(|h| (h, want)),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use cc::{CcKind, PathConfig};
    use rdma::transport::{Access, QpConfig, QpState, SendOp, SendWr, Sge, VecMemory, WcStatus};
    use rdma::wire::frame::NetHeaders;
    use rdma::wire::{parse_frame, EthernetAddress, Ipv4Address, ParseOptions};
    use sched::scheduler::Decision;

    /// CC `none`'s whole state and what every visit reads fit the first
    /// three lines, and the transport starts a line (the struct's docs).
    #[test]
    fn a_visit_reads_the_first_three_lines() {
        use core::mem::{offset_of, size_of};
        assert!(offset_of!(QpCore, cc) + size_of::<u64>() + size_of::<cc::NoCc>() <= 3 * 64);
        assert!(offset_of!(QpCore, sched_rate) < offset_of!(QpCore, cc));
        assert_eq!(offset_of!(QpCore, qp) % 64, 0);
    }

    /// `HOT_LINES` counts the transport from where `qp` starts: `Option<Qp>`
    /// keeps its `Qp` at offset 0 (a niche, no tag before it), which Rust
    /// does not promise, so it is checked on a real core.
    #[test]
    fn the_hot_lines_find_the_transport() {
        let core = end(CcKind::None, 1, 2, 1, 2).core;
        let base = (&core as *const QpCore).cast::<u8>() as usize;
        let qp = core.qp.as_ref().expect("connected");
        let at = (qp as *const Qp).cast::<u8>() as usize - base;
        assert_eq!(at, core::mem::offset_of!(QpCore, qp));
        assert_eq!(QpCore::HOT_LINES[3], at);
        assert!(QpCore::HOT_LINES
            .iter()
            .all(|&l| l % 64 == 0 && l < core::mem::size_of::<QpCore>()));
    }

    const BASE: u64 = 0x1000;
    const LEN: usize = 64 << 10;

    /// Frames into byte vectors (as a driver's link would take them).
    struct Frames<'a> {
        mem: &'a VecMemory,
        out: Vec<Vec<u8>>,
    }

    impl FrameSink for Frames<'_> {
        fn emit(&mut self, fb: &FrameBuilder, pkt: &TxPacket, gather: &[Sge]) -> Option<u32> {
            let mut buf = vec![0; 2048];
            let n = pkt
                .build_frame_gather(fb, self.mem, gather, &mut buf)
                .ok()?;
            buf.truncate(n);
            self.out.push(buf);
            Some(n as u32 + 24)
        }
    }

    /// Completions into a vector with room for `room` of them.
    struct Cq {
        wcs: Vec<WorkCompletion>,
        room: usize,
    }

    impl Completions for Cq {
        fn has_room(&self) -> bool {
            self.wcs.len() < self.room
        }
        fn complete(&mut self, wc: WorkCompletion) {
            self.wcs.push(wc);
        }
    }

    /// One end: its core, scheduler, wheel, memory and MR table.
    struct End {
        core: QpCore,
        sched: Scheduler<u32>,
        wheel: TimerWheel<TimerKey>,
        mrs: MrTable,
        mem: VecMemory,
        key: TimerKey,
        /// The region's (lkey, rkey).
        keys: (u32, u32),
    }

    fn end(kind: CcKind, qpn: u32, dest: u32, ip: u8, peer: u8) -> End {
        let cc = kind.build(PathConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 10_000,
            mtu_bytes: 1024,
        });
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress([2, 0, 0, 0, 0, ip]),
                dst_mac: EthernetAddress([2, 0, 0, 0, 0, peer]),
                src_ip: Ipv4Address([10, 0, 0, ip]),
                dst_ip: Ipv4Address([10, 0, 0, peer]),
                udp_src_port: 0xC000,
                dscp: crate::ROCE_DSCP,
                ttl: 64,
            },
            int: None,
        };
        let probe_int = IntInsert {
            int_dscp: 0x18,
            max_hops: qp_cc::MAX_HOPS as u8,
        };
        let mut core = QpCore::new(cc, fb, probe_int, kind.uses_extensions(), 1024);
        let mut qp = Qp::new(QpConfig {
            qpn,
            dest_qpn: dest,
            cc_ext: kind.uses_extensions(),
            ..QpConfig::default()
        })
        .unwrap();
        for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
            qp.modify(st).unwrap();
        }
        core.qp = Some(qp);
        core.update_window();
        let mut mrs = MrTable::new();
        let mr = mrs
            .register(BASE, LEN as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        End {
            core,
            sched: Scheduler::new(4, crate::PACING_BURST_BYTES, 4),
            wheel: TimerWheel::new(crate::TIMER_TICK_NS, crate::TIMER_SLOTS, 16),
            mrs,
            mem: VecMemory::new(BASE, LEN),
            key: TimerKey {
                qp: 0,
                kind: WheelKind::Retransmit,
                gen: 0,
            },
            keys: (mr.lkey, mr.rkey),
        }
    }

    /// A signaled WRITE of `len` bytes from the start of `a`'s region to
    /// `off` bytes into `b`'s.
    fn write_wr(a: &End, b: &End, wr_id: u64, off: u64, len: u32) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Write {
                remote_va: BASE + off,
                rkey: b.keys.1,
            },
            sge: Sge {
                addr: BASE,
                len,
                lkey: a.keys.0,
            },
            signaled: true,
            solicited: false,
        }
    }

    /// Runs `e`'s scheduler once: the frames of one decision.
    fn transmit(e: &mut End, now: u64) -> Vec<Vec<u8>> {
        let mut out = Frames {
            mem: &e.mem,
            out: Vec::new(),
        };
        match e.sched.next(now) {
            Decision::Idle { .. } => {}
            Decision::Control(q) => e.core.send_control(&mut e.sched, q, now, &mut out),
            Decision::Qp { .. } => {
                e.core
                    .send_data(&mut e.sched, &mut e.wheel, e.key, now, &mut out);
            }
        }
        out.out
    }

    /// Hands `frames` to `e` and runs what a driver runs after: events,
    /// completions into `cq`, requeue.
    fn deliver(e: &mut End, frames: &[Vec<u8>], cq: &mut Cq, now: u64) {
        let opts = ParseOptions {
            int_dscp: Some(0x18),
            verify_icrc: true,
        };
        let cc_ext = e.core.cc_ext;
        for b in frames {
            let f = parse_frame(b, &opts, |_| cc_ext).unwrap();
            e.core.receive(&f, now, &mut e.mrs, &mut e.mem);
        }
        e.core.feed_events(now);
        e.core.move_completions(cq);
        e.core.requeue(&mut e.sched, &mut e.wheel, e.key, now);
    }

    #[test]
    fn a_write_goes_out_is_acknowledged_and_completes() {
        let mut a = end(CcKind::Hpcc, 0x11, 0x12, 1, 2);
        let mut b = end(CcKind::Hpcc, 0x12, 0x11, 2, 1);
        a.mem.write(BASE, b"per-QP core");
        let wr = write_wr(&a, &b, 7, 100, 11);
        a.core.qp.as_mut().unwrap().post_send(wr, &a.mrs).unwrap();
        let armed = a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 0);
        assert_eq!(armed, u64::MAX, "nothing sent, no timer yet");
        let data = transmit(&mut a, 0);
        assert_eq!(data.len(), 1, "one WRITE packet");
        // The retransmit timer of what is in flight is on the wheel.
        assert!(a.core.transport_timer.is_some());
        let mut b_cq = Cq {
            wcs: Vec::new(),
            room: 8,
        };
        deliver(&mut b, &data, &mut b_cq, 1_000);
        assert_eq!(b.mem.read(BASE + 100, 11), b"per-QP core");
        let ack = transmit(&mut b, 1_000);
        assert_eq!(ack.len(), 1, "the responder's ACK goes out as control");
        // A full CQ holds the completion in the QP ...
        let mut a_cq = Cq {
            wcs: Vec::new(),
            room: 0,
        };
        deliver(&mut a, &ack, &mut a_cq, 2_000);
        assert!(a_cq.wcs.is_empty());
        // ... until it has room.
        a_cq.room = 1;
        assert!(a.core.move_completions(&mut a_cq));
        assert_eq!(a_cq.wcs.len(), 1);
        assert_eq!(a_cq.wcs[0].wr_id, 7);
        assert_eq!(a_cq.wcs[0].status, WcStatus::Success);
    }

    /// The retransmit timer stays on the wheel while anything is in flight,
    /// however its deadline moves, and leaves it with the last ACK (not 67 ms
    /// later, when a QP among thousands would be visited cold for nothing).
    #[test]
    fn the_retransmit_timer_leaves_the_wheel_with_the_last_ack() {
        let mut a = end(CcKind::None, 0x11, 0x12, 1, 2);
        let mut b = end(CcKind::None, 0x12, 0x11, 2, 1);
        let (w1, w2) = (write_wr(&a, &b, 1, 0, 8), write_wr(&a, &b, 2, 64, 8));
        let mut cq = Cq {
            wcs: Vec::new(),
            room: 8,
        };
        let qp = a.core.qp.as_mut().unwrap();
        qp.post_send(w1, &a.mrs).unwrap();
        a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 0);
        let first = transmit(&mut a, 0);
        assert_eq!(first.len(), 1);
        let armed = a.core.transport_timer.expect("armed with data in flight");
        assert_eq!(a.wheel.len(), 1);
        // A second WRITE goes out before the first is acknowledged.
        a.core.qp.as_mut().unwrap().post_send(w2, &a.mrs).unwrap();
        a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 500);
        let second = transmit(&mut a, 500);
        assert_eq!(second.len(), 1);
        // The first one's ACK: the second is still in flight, and the timer
        // armed for the first stays as it was (moved later lazily, on firing).
        deliver(&mut b, &first, &mut cq, 1_000);
        let ack1 = transmit(&mut b, 1_000);
        assert_eq!(ack1.len(), 1);
        deliver(&mut a, &ack1, &mut cq, 2_000);
        assert_eq!(a.core.transport_timer, Some(armed));
        assert_eq!(a.wheel.len(), 1);
        // The last ACK: nothing in flight, the timer is off the wheel now.
        deliver(&mut b, &second, &mut cq, 2_500);
        let ack2 = transmit(&mut b, 2_500);
        assert_eq!(ack2.len(), 1);
        deliver(&mut a, &ack2, &mut cq, 3_000);
        assert_eq!(a.core.transport_timer, None);
        assert!(a.wheel.is_empty(), "{} timers left", a.wheel.len());
        assert_eq!(cq.wcs.iter().filter(|wc| wc.wr_id <= 2).count(), 2);
    }

    /// A CC timer the CC asks for goes on the wheel and comes off it when no
    /// longer wanted, through the live mask that lets a QP without CC timers
    /// skip them; the mask clears once nothing is armed or wanted.
    #[test]
    fn cc_timers_are_armed_and_dropped_through_the_live_mask() {
        let mut a = end(CcKind::Dcqcn, 0x11, 0x12, 1, 2);
        let key = a.key;
        assert_eq!(a.core.sync_timers(&mut a.wheel, key), u64::MAX);
        assert_eq!((a.core.cc_live, a.wheel.len()), (0, 0));
        let mut act = cc::Actions::NONE;
        act.arm(5_000, cc::TimerKind::DcqcnAlpha);
        act.arm(7_000, cc::TimerKind::DcqcnRateIncrease);
        a.core.apply(act);
        assert_eq!(a.core.sync_timers(&mut a.wheel, key), 5_000);
        assert_eq!(a.wheel.len(), 2);
        assert_eq!(a.core.cc_live.count_ones(), 2);
        // One is no longer wanted: off the wheel, its bit clear.
        let alpha = qp_cc::timer_index(cc::TimerKind::DcqcnAlpha);
        a.core.cc_timers[alpha] = 0;
        a.core.sync_timers(&mut a.wheel, key);
        assert_eq!(a.wheel.len(), 1);
        assert_eq!(a.core.cc_live.count_ones(), 1);
        // Then the other: the mask is clear.
        let inc = qp_cc::timer_index(cc::TimerKind::DcqcnRateIncrease);
        a.core.cc_timers[inc] = 0;
        a.core.sync_timers(&mut a.wheel, key);
        assert_eq!((a.core.cc_live, a.wheel.len()), (0, 0));
    }

    /// Frames a QP with CC `kind` sends at one `now` (until the scheduler has
    /// nothing) for two 64 KiB WRITEs, and its pacing rate: the pacer's bucket
    /// (64 KiB) stops a paced QP inside it, an unpaced one sends it all.
    fn frames_at_one_now(kind: CcKind, port_holds_line_rate: bool) -> (usize, u64) {
        let mut a = end(kind, 0x11, 0x12, 1, 2);
        a.core.port_holds_line_rate = port_holds_line_rate;
        let len = LEN as u32;
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_va: BASE,
                rkey: 0x1234,
            },
            sge: Sge {
                addr: BASE,
                len,
                lkey: a.keys.0,
            },
            signaled: false,
            solicited: false,
        };
        for _ in 0..2 {
            a.core.qp.as_mut().unwrap().post_send(wr, &a.mrs).unwrap();
        }
        a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 1_000);
        let mut frames = 0;
        for _ in 0..1000 {
            let out = transmit(&mut a, 1_000);
            if out.is_empty() {
                break;
            }
            frames += out.len();
        }
        (frames, a.core.sched_rate.expect("requeued"))
    }

    #[test]
    fn a_qp_without_cc_is_unpaced_only_where_the_port_holds_the_line_rate() {
        let all = (128 << 10) / 1024;
        // The NIC: its port shaper holds the line rate, the QP is not paced.
        let (frames, rate) = frames_at_one_now(CcKind::None, true);
        assert_eq!(rate, RATE_UNPACED);
        assert_eq!(frames, all, "the whole WRITE at one now");
        // The simulator: the QP's pacing holds it to the line rate.
        let (frames, rate) = frames_at_one_now(CcKind::None, false);
        assert_eq!(rate, 100_000_000_000);
        assert!(
            (50..all).contains(&frames),
            "{frames} frames: the 64 KiB bucket of wire bytes"
        );
        // A QP with CC is paced at its CC's rate either way.
        let (frames, rate) = frames_at_one_now(CcKind::Dcqcn, true);
        assert_ne!(rate, RATE_UNPACED);
        assert!(frames < all, "{frames} frames");
    }

    #[test]
    fn a_cnp_owed_goes_out_first_as_control() {
        let mut a = end(CcKind::Dcqcn, 0x11, 0x12, 1, 2);
        a.core.cnp_pending = true;
        a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 0);
        let out = transmit(&mut a, 0);
        assert_eq!(out.len(), 1);
        let f = parse_frame(&out[0], &ParseOptions::default(), |_| false).unwrap();
        assert_eq!(f.bth.opcode, Opcode::Cnp);
        assert_eq!(f.bth.dest_qp, 0x12);
        assert!(!a.core.cnp_pending);
        assert!(transmit(&mut a, 0).is_empty(), "one CNP, then nothing");
    }

    #[test]
    fn a_qp_without_transport_sends_nothing_and_takes_no_timer() {
        let mut a = end(CcKind::Hpcc, 0x11, 0x12, 1, 2);
        a.core.qp = None;
        a.core.cnp_pending = true;
        assert_eq!(
            a.core.requeue(&mut a.sched, &mut a.wheel, a.key, 0),
            u64::MAX
        );
        assert_eq!(a.sched.control_len(), 0);
        assert!(!a.core.on_timer(WheelKind::Retransmit, 5));
        let mut out = Frames {
            mem: &a.mem,
            out: Vec::new(),
        };
        a.core.send_control(&mut a.sched, 0, 0, &mut out);
        assert!(out.out.is_empty());
        assert!(a.wheel.is_empty());
    }
}
