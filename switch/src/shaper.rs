//! Egress rate shaper: departure-time accounting at the link speed B.
//!
//! A real switch port serializes at B, so queues form when the offered load exceeds B
//! (docs/design.md §6). The shaper keeps the time `next_free` at which the link is
//! free again. Sending `w` wire bytes takes `w * 8 * 10^9 / B` ns; the remainder of that
//! division is carried to the next packet, so the long-run rate is exactly B at any
//! speed from 1 kbit/s to 10 Tbit/s (no rounding drift even when a packet lasts a
//! fraction of a nanosecond's worth of error each time).
//!
//! Wire bytes are the frame plus the Ethernet per-frame overhead: preamble + SFD (8 B)
//! and inter-frame gap (12 B), plus the FCS (4 B) when the frame the core sees excludes
//! it (DPDK strips it by default), with frames padded to the 64-byte minimum. See
//! [`wire_bytes`].
//!
//! A frame starts at `max(next_free, arrival)`, as on an ideal link, so a poll loop that
//! runs late loses no link time; but never more than `burst` bytes' worth of time
//! before `now`, so a stalled loop does not release an unbounded burst.

/// Preamble (7) + SFD (1).
pub const PREAMBLE_SFD: u64 = 8;
/// Inter-frame gap.
pub const IFG: u64 = 12;
/// Frame check sequence.
pub const FCS: u64 = 4;
/// Minimum Ethernet frame, FCS included.
pub const MIN_FRAME_WITH_FCS: u64 = 64;
/// Frames longer than this are charged as this (keeps the u64 arithmetic in range;
/// no real frame comes close).
const MAX_CHARGE: u64 = 1 << 20;

const NS_PER_S: u64 = 1_000_000_000;

/// Bytes a frame of `frame_len` occupies on the wire, overhead included.
/// `fcs_in_frame`: whether `frame_len` already counts the 4-byte FCS.
#[inline]
pub fn wire_bytes(frame_len: usize, fcs_in_frame: bool) -> u64 {
    let l = frame_len as u64 + if fcs_in_frame { 0 } else { FCS };
    l.max(MIN_FRAME_WITH_FCS) + PREAMBLE_SFD + IFG
}

/// Departure-time shaper for one egress port.
#[derive(Debug, Clone)]
pub struct Shaper {
    rate_bps: u64,
    /// Time (ns) at which the link is free for the next frame.
    next_free: u64,
    /// Remainder of `bits * 10^9 / rate`, in units of 1/rate ns (always < rate).
    carry: u64,
    /// Token-bucket depth expressed in ns at `rate_bps`.
    burst_ns: u64,
    /// The last frame's wire bytes and `wire * 8 * 10^9` divided by the rate (quotient,
    /// remainder): a stream of equal frames books each one without a division.
    last_wire: u64,
    last_q: u64,
    last_r: u64,
}

impl Shaper {
    /// A shaper at `rate_bps` (clamped to at least 1) with `burst_bytes` of idle credit.
    pub fn new(rate_bps: u64, burst_bytes: u64) -> Self {
        let rate_bps = rate_bps.max(1);
        let burst_ns = (u128::from(burst_bytes) * 8 * u128::from(NS_PER_S) / u128::from(rate_bps))
            .min(u128::from(u64::MAX / 4)) as u64;
        Self {
            rate_bps,
            next_free: 0,
            carry: 0,
            burst_ns,
            last_wire: u64::MAX,
            last_q: 0,
            last_r: 0,
        }
    }

    /// Link speed in bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// The earliest time a frame may start (may lie in the past).
    pub fn next_free(&self) -> u64 {
        self.next_free
    }

    /// True if a frame may start at `now`.
    #[inline]
    pub fn ready(&self, now: u64) -> bool {
        now >= self.next_free
    }

    /// When the frame at the head of the queue starts on the wire, as an ideal link
    /// would send it: when the link is free and the frame has arrived
    /// (`max(next_free, arrival)`), but no earlier than `now - burst` so a stalled
    /// poll loop does not release an unbounded burst. Never later than `now` when
    /// [`Shaper::ready`] holds. This is the frame's departure timestamp (INT `ts`),
    /// independent of poll jitter.
    #[inline]
    pub fn start_time(&self, now: u64, arrival: u64) -> u64 {
        self.next_free
            .max(arrival.min(now))
            .max(now.saturating_sub(self.burst_ns))
    }

    /// Books `wire` bytes starting at `start` (from [`Shaper::start_time`]); returns
    /// the time the frame's last bit leaves, which is the next free time.
    #[inline]
    pub fn commit(&mut self, start: u64, wire: u64) -> u64 {
        if start != self.next_free {
            // The link went idle: the schedule restarts, the fraction is forgotten.
            self.carry = 0;
        }
        // wire <= 2^20, so bits * 10^9 < 2^23 * 2^30 = 2^53, plus carry < rate <= 2^44.
        let w = wire.min(MAX_CHARGE);
        if w != self.last_wire {
            let num = w * 8 * NS_PER_S;
            self.last_wire = w;
            self.last_q = num / self.rate_bps;
            self.last_r = num % self.rate_bps;
        }
        // (w * 8 * 10^9 + carry) / rate = last_q + (last_r + carry) / rate, and
        // last_r + carry < 2 * rate: one compare instead of a 64-bit division.
        let mut ns = self.last_q;
        let mut r = self.last_r + self.carry;
        if r >= self.rate_bps {
            r -= self.rate_bps;
            ns += 1;
        }
        self.carry = r;
        self.next_free = start.saturating_add(ns);
        self.next_free
    }

    /// [`Shaper::commit`] of a frame that arrived at `now`.
    #[inline]
    pub fn send(&mut self, now: u64, wire: u64) -> u64 {
        self.commit(self.start_time(now, now), wire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_overhead() {
        assert_eq!(wire_bytes(60, false), 64 + 20);
        assert_eq!(wire_bytes(10, false), 64 + 20);
        assert_eq!(wire_bytes(1000, false), 1004 + 20);
        assert_eq!(wire_bytes(1004, true), 1004 + 20);
    }

    #[test]
    fn fractional_carry_is_exact() {
        // 84 wire bytes at 400 Gbit/s = 1.68 ns each: 100 frames take exactly 168 ns.
        let mut s = Shaper::new(400_000_000_000, 0);
        let mut t = 0;
        for _ in 0..100 {
            t = s.send(s.next_free(), 84);
        }
        assert_eq!(t, 168);
        // Idle link: the next frame starts at now.
        let mut s = Shaper::new(1_000_000, 0);
        assert_eq!(s.send(1_000, 125), 1_000 + 1_000_000);
        assert!(!s.ready(1_000_000));
        assert!(s.ready(1_001_000));
    }

    #[test]
    fn burst_credit_is_bounded() {
        // 1 Gbit/s, burst 1000 B = 8 us of credit.
        let mut s = Shaper::new(1_000_000_000, 1000);
        // Arrived 10 us before a late poll: starts 8 us back, not 10.
        assert_eq!(s.start_time(1_000_000, 990_000), 992_000);
        // Arrived 5 us before: starts at its arrival.
        assert_eq!(s.start_time(1_000_000, 995_000), 995_000);
        // A future arrival (misused clock) is clamped to now.
        assert_eq!(s.start_time(1_000_000, 2_000_000), 1_000_000);
        assert_eq!(s.commit(992_000, 100), 992_800);
        // Busy link: next frame starts at next_free even if polled late.
        assert_eq!(s.start_time(999_000, 0), 992_800);
    }
}
