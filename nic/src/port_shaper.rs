//! The port's line rate as a token bucket: whatever its QPs' pacing and
//! congestion control allow together, a NIC never puts more than its line
//! rate on the wire (`DeviceConfig::line_rate_bps`). Each QP is paced at
//! its CC's rate, at most the line rate, so without this many QPs (or CC
//! `none`, which paces every QP at line rate) would add up to a multiple
//! of it.
//!
//! Tokens are bytes on the wire (frame plus preamble, inter-frame gap and
//! FCS), earned at the line rate up to [`PortShaper::depth_bytes`]; a frame
//! may go while the bucket is not empty and may take it below zero (the
//! debt is repaid before the next one), so the long-run rate is the line
//! rate and a burst is at most the depth plus one frame. Pure: time is an
//! argument.

/// Token bucket of a port (module docs).
#[derive(Debug, Clone, Copy)]
pub struct PortShaper {
    rate_bps: u64,
    /// Bucket depth, in units of 1e-9 bits (a byte is 8e9 units).
    depth: i128,
    /// Tokens, same units; may go below zero by one frame.
    tokens: i128,
    last_ns: u64,
}

/// Units of one byte (tokens are kept in 1e-9 bits, so that `rate_bps`
/// times nanoseconds needs no division).
const UNITS_PER_BYTE: i128 = 8_000_000_000;

impl PortShaper {
    /// A full bucket of `depth_bytes` at `rate_bps`, starting at `now`.
    pub fn new(rate_bps: u64, depth_bytes: u32, now: u64) -> Self {
        let depth = i128::from(depth_bytes.max(1)) * UNITS_PER_BYTE;
        PortShaper {
            rate_bps: rate_bps.max(1),
            depth,
            tokens: depth,
            last_ns: now,
        }
    }

    /// The bucket depth in bytes.
    pub fn depth_bytes(&self) -> u64 {
        (self.depth / UNITS_PER_BYTE) as u64
    }

    /// Whether a frame may go at `now` (the bucket is not empty).
    #[inline]
    pub fn may_send(&mut self, now: u64) -> bool {
        self.refill(now);
        self.tokens > 0
    }

    /// Takes `wire_bytes` (a frame sent) from the bucket.
    #[inline]
    pub fn charge(&mut self, wire_bytes: u64) {
        self.tokens -= i128::from(wire_bytes) * UNITS_PER_BYTE;
    }

    fn refill(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now);
        let earned = i128::from(dt) * i128::from(self.rate_bps);
        self.tokens = (self.tokens + earned).min(self.depth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sending as fast as allowed for a simulated second, in 1 us steps:
    /// the bytes sent are the line rate's plus at most the depth and one
    /// frame, and at least the line rate's minus one frame.
    #[test]
    fn long_run_rate_is_the_line_rate() {
        for (rate, frame) in [(1_000_000_000u64, 1_100u64), (100_000_000_000, 4_200)] {
            let mut s = PortShaper::new(rate, 64 << 10, 0);
            let mut sent = 0u64;
            let mut now = 0u64;
            while now <= 1_000_000_000 {
                while s.may_send(now) {
                    s.charge(frame);
                    sent += frame;
                }
                now += 1_000;
            }
            let line = rate / 8;
            assert!(sent <= line + s.depth_bytes() + frame, "{rate}: {sent}");
            assert!(sent + frame >= line, "{rate}: {sent}");
        }
    }

    #[test]
    fn a_burst_is_at_most_the_depth_plus_one_frame_and_idle_time_is_not_hoarded() {
        let mut s = PortShaper::new(10_000_000_000, 64 << 10, 0);
        // After a long idle spell the bucket is only full, not more.
        let now = 10_000_000_000;
        let mut burst = 0u64;
        while s.may_send(now) {
            s.charge(1000);
            burst += 1000;
        }
        assert!((64 << 10..=(64 << 10) + 1000).contains(&burst), "{burst}");
        // 1 us later, 1250 bytes were earned at 10 Gbit/s: the debt of the
        // last frame first.
        let mut more = 0;
        while s.may_send(now + 1_000) {
            s.charge(1000);
            more += 1000;
        }
        assert!(more <= 2000, "{more}");
    }
}
