//! Event and decision types shared by every algorithm.
//!
//! Units used everywhere in this crate:
//! * time: `u64` nanoseconds, supplied by the caller (the crate never reads a clock);
//! * sequence numbers: LDCP sequence numbers (LSN, 004 §3.1), a byte sequence, `u64`;
//! * windows: bytes (`u64`, `u64::MAX` = unlimited);
//! * pacing rates: **bits per second** (`u64`), never above the configured line rate.

/// One inband-telemetry hop record, as the NIC hands it to the CC module after
/// converting it from the wire (P4.org INT-MD v2.0 hop stack, docs/design.md §4).
///
/// 000 §3 / 003 §6.1: each switch records link load (`ts`, `tx_bytes`, `qlen`) and
/// link spec (`switch_id`, `port_id`, `B`) in one snapshot at the egress port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IntHop {
    /// Switch identifier; with `port_id` it keys the per-link state (path change => reset).
    pub switch_id: u16,
    /// Egress port identifier on that switch.
    pub port_id: u16,
    /// Egress timestamp in nanoseconds, modulo 2^32 (wraps every ~4.29 s).
    pub ts_ns: u32,
    /// Cumulative bytes transmitted on that egress port, modulo 2^32.
    pub tx_bytes: u32,
    /// Egress queue length in bytes when the packet was dequeued.
    pub qlen_bytes: u32,
    /// Link capacity B in bits per second.
    pub link_bps: u64,
}

/// A data packet is about to leave (call it after the scheduler picked the packet and
/// before the IP header is written: the returned [`Actions::fast_start`] selects the ECN
/// codepoint).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendEvent {
    /// Current time (ns).
    pub now_ns: u64,
    /// LSN of the first byte of the packet.
    pub lsn: u64,
    /// Payload bytes counted in LSN space.
    pub bytes: u32,
    /// Last packet of the message (LDCP §3.1: the last fast-start packet is ECT).
    pub last_of_message: bool,
    /// Retransmission (go-back-N); never a fast-start packet.
    pub retransmit: bool,
}

/// An ACK arrived at the sender.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AckEvent<'a> {
    /// Current time (ns).
    pub now_ns: u64,
    /// Cumulative acknowledged LSN: every byte below it has been received.
    pub acked_lsn: u64,
    /// Bytes newly acknowledged by this ACK.
    pub acked_bytes: u32,
    /// Data packets covered by this ACK (`n` of LDCP eq. 2); 0 = derive from bytes/MTU.
    pub acked_pkts: u32,
    /// RTT sample in ns; 0 = no sample.
    pub rtt_ns: u64,
    /// ECN-Echo: the acknowledged packet(s) carried CE (LDCP §2.2).
    pub ecn_echo: bool,
    /// Echoed INT hop records (HPCC++, 000 §6.2.2 item 1); may be empty.
    pub telemetry: &'a [IntHop],
    /// Window computed by an Rx-HPCC receiver (000 §6.3.2 `send_ack(W)`), bytes.
    pub rx_window: Option<u64>,
}

/// A NAK (PSN sequence error) arrived: data at `expected_lsn` was lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NakEvent {
    /// Current time (ns).
    pub now_ns: u64,
    /// LSN the receiver expects next (everything below is acknowledged).
    pub expected_lsn: u64,
}

/// A data (or telemetry-request probe) packet arrived at the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RxDataEvent<'a> {
    /// Current time (ns).
    pub now_ns: u64,
    /// LSN of the first byte.
    pub lsn: u64,
    /// Payload bytes.
    pub bytes: u32,
    /// The packet arrived with ECN CE.
    pub ce: bool,
    /// INT hop records carried by the packet; may be empty.
    pub telemetry: &'a [IntHop],
}

/// Which timer an algorithm asks the NIC to arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimerKind {
    /// LDCP: sub-packet window tick, period RTT/cw (004 §2.2).
    LdcpTick,
    /// DCQCN: alpha update timer (period K, Zhu et al. §3.1).
    DcqcnAlpha,
    /// DCQCN: rate increase timer (period T).
    DcqcnRateIncrease,
    /// HPCC++ probe mode: probe response did not come back; send a new probe.
    ProbeTimeout,
}

/// A timer to arm: call [`crate::CongestionControl::on_timer`] with `kind` at or after
/// `deadline_ns`. Re-arming a kind replaces the previous deadline of that kind; a
/// stale expiry (called before the newest deadline) is ignored by the algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerArm {
    /// Absolute deadline (ns).
    pub deadline_ns: u64,
    /// Timer kind.
    pub kind: TimerKind,
}

/// What the NIC must do after an event, beyond reading the new window and rate.
///
/// Small and `Copy`: returned by value, no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Actions {
    /// From `on_send` only: send this packet Not-ECT (LDCP fast start, 004 §2.3/§3.1).
    pub fast_start: bool,
    /// Send a telemetry-request probe on the flow's 5-tuple (HPCC++ probe mode, 000 §6.2.1).
    pub send_probe: bool,
    /// Receiver (notification point) side: send a CNP to the sender (DCQCN).
    pub send_cnp: bool,
    /// Receiver side (Rx-HPCC, 000 §6.3.2 line 31): put this window (bytes) in the next ACK.
    pub feedback_window: Option<u64>,
    /// Timers to arm (at most two per event).
    pub timers: [Option<TimerArm>; 2],
}

impl Actions {
    /// No action.
    pub const NONE: Actions = Actions {
        fast_start: false,
        send_probe: false,
        send_cnp: false,
        feedback_window: None,
        timers: [None, None],
    };

    /// Adds a timer request (a third one in the same event is dropped: no algorithm
    /// needs more than two).
    #[inline]
    pub fn arm(&mut self, deadline_ns: u64, kind: TimerKind) {
        let t = Some(TimerArm { deadline_ns, kind });
        if self.timers[0].is_none() {
            self.timers[0] = t;
        } else {
            self.timers[1] = t;
        }
    }

    /// Iterates over the timers to arm.
    pub fn timers(&self) -> impl Iterator<Item = TimerArm> + '_ {
        self.timers.iter().flatten().copied()
    }
}

/// Properties of the path that every algorithm needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathConfig {
    /// NIC line rate in bits per second. Default 100 Gbit/s.
    pub line_rate_bps: u64,
    /// Known base RTT `T` in ns. Default 5 us (000 fig. 3).
    pub base_rtt_ns: u64,
    /// Bytes of LSN per full-size packet (the path MTU payload). Default 1024.
    pub mtu_bytes: u32,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 5_000,
            mtu_bytes: 1024,
        }
    }
}

impl PathConfig {
    /// Returns a copy with zero fields replaced by safe minima (1 bit/s, 1 ns, 1 byte),
    /// so that no division by zero can happen downstream.
    pub fn sanitized(self) -> Self {
        PathConfig {
            line_rate_bps: self.line_rate_bps.max(1),
            base_rtt_ns: self.base_rtt_ns.max(1),
            mtu_bytes: self.mtu_bytes.max(1),
        }
    }

    /// Bandwidth-delay product at line rate, bytes (at least one MTU).
    pub fn bdp_bytes(&self) -> u64 {
        let p = self.sanitized();
        let bdp = (p.line_rate_bps as u128 * p.base_rtt_ns as u128 / 8_000_000_000u128) as u64;
        bdp.max(p.mtu_bytes as u64)
    }
}

/// Converts a window (bytes) over a time `t_ns` to a rate in bit/s (`R = W/T`).
#[inline]
pub(crate) fn window_to_bps(w_bytes: f64, t_ns: f64) -> f64 {
    w_bytes * 8.0e9 / t_ns
}
