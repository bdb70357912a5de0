//! The port's line rate as a token bucket: whatever its QPs' pacing and
//! congestion control allow together, a NIC never puts more than its line
//! rate on the wire (`DeviceConfig::line_rate_bps`). Each QP is paced at
//! its CC's rate, at most the line rate, so without this many QPs would add
//! up to a multiple of it; a QP without CC (`none`) is not paced at all
//! (`QpCore::pacing_rate`), so this alone holds it to the line rate.
//!
//! Tokens are bytes on the wire (frame plus preamble, inter-frame gap and
//! FCS), earned at the line rate up to [`PortShaper::depth_bytes`]; a frame
//! may go while the bucket is not empty and may take it below zero (the
//! debt is repaid before the next one), so the long-run rate is the line
//! rate and a burst is at most the depth plus one frame. Pure: time is an
//! argument.
//!
//! The shards of a sharded device send on one port, so they share its line
//! ([`SharedLine`]): each shard's bucket earns nothing by itself and takes
//! line time from the shared line [`CLAIM_BYTES`] at a time, one atomic
//! compare-and-swap per claim, never per frame. Together they send at most
//! the line rate, plus the depth and a claim per shard in a burst.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The line time a shard takes from its [`SharedLine`] at once, in wire
/// bytes: a handful of 4 KiB frames, a few hundred small ones.
pub const CLAIM_BYTES: u64 = 32 << 10;

/// Picoseconds per second times bits per byte: a byte's line time in ps is
/// this over the rate in bit/s.
const PS_BITS_PER_BYTE: u128 = 8_000_000_000_000;

/// One port's line shared by several senders (module docs): a virtual
/// clock, the time at which the line will have sent everything claimed so
/// far (GCRA). A claim books line time from that point (or from now, if the
/// line has gone idle), and is refused while the line is booked more than
/// the depth ahead of now.
#[derive(Debug)]
pub struct SharedLine {
    rate_bps: u64,
    /// Picoseconds since `base_ns` at which the claimed time runs out.
    booked_until_ps: AtomicU64,
    /// How far ahead of now the line may be booked: the depth, as line time.
    tolerance_ps: u64,
    base_ns: u64,
}

impl SharedLine {
    /// A line of `rate_bps` that may be booked `depth_bytes` ahead, idle at
    /// `now`.
    pub fn new(rate_bps: u64, depth_bytes: u32, now: u64) -> Self {
        let rate_bps = rate_bps.max(1);
        SharedLine {
            rate_bps,
            booked_until_ps: AtomicU64::new(0),
            tolerance_ps: line_time_ps(u64::from(depth_bytes.max(1)), rate_bps),
            base_ns: now,
        }
    }

    /// Books `bytes` of line time at `now`: false, and nothing booked, when
    /// the line is already booked more than the depth ahead.
    #[inline]
    pub fn claim(&self, bytes: u64, now: u64) -> bool {
        let now_ps = now.saturating_sub(self.base_ns).saturating_mul(1_000);
        let cost = line_time_ps(bytes, self.rate_bps);
        let mut booked = self.booked_until_ps.load(Ordering::Relaxed);
        loop {
            let from = booked.max(now_ps);
            if from > now_ps.saturating_add(self.tolerance_ps) {
                return false;
            }
            match self.booked_until_ps.compare_exchange_weak(
                booked,
                from.saturating_add(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now_booked) => booked = now_booked,
            }
        }
    }
}

/// The line time of `bytes` at `rate_bps`, in picoseconds.
fn line_time_ps(bytes: u64, rate_bps: u64) -> u64 {
    u64::try_from(u128::from(bytes) * PS_BITS_PER_BYTE / u128::from(rate_bps.max(1)))
        .unwrap_or(u64::MAX)
}

/// Token bucket of a port (module docs).
#[derive(Debug, Clone)]
pub struct PortShaper {
    rate_bps: u64,
    /// Bucket depth, in units of 1e-9 bits (a byte is 8e9 units).
    depth: i128,
    /// Tokens, same units; may go below zero by one frame.
    tokens: i128,
    last_ns: u64,
    /// The line this bucket shares with others (a shard's): tokens come
    /// from it, not from time.
    line: Option<Arc<SharedLine>>,
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
            line: None,
        }
    }

    /// A bucket that takes its tokens from `line`, [`CLAIM_BYTES`] at a
    /// time, when it runs out (one shard of a sharded device).
    pub fn on_line(line: Arc<SharedLine>) -> Self {
        PortShaper {
            rate_bps: line.rate_bps,
            depth: i128::from(CLAIM_BYTES) * UNITS_PER_BYTE,
            tokens: 0,
            last_ns: 0,
            line: Some(line),
        }
    }

    /// The bucket depth in bytes.
    pub fn depth_bytes(&self) -> u64 {
        (self.depth / UNITS_PER_BYTE) as u64
    }

    /// Whether a frame may go at `now` (the bucket is not empty).
    #[inline]
    pub fn may_send(&mut self, now: u64) -> bool {
        match &self.line {
            None => self.refill(now),
            Some(line) => {
                if self.tokens <= 0 && line.claim(CLAIM_BYTES, now) {
                    self.tokens += i128::from(CLAIM_BYTES) * UNITS_PER_BYTE;
                }
            }
        }
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

    /// Three shards' buckets on one line, each sending as fast as allowed
    /// for a simulated second (frames of different sizes, the shards taking
    /// turns in 1 us steps): together they send the line rate, plus at most
    /// the depth and a claim and a frame per shard, and at least the line
    /// rate minus a claim per shard.
    #[test]
    fn shards_on_one_line_send_the_line_rate_together() {
        let rate = 100_000_000_000u64;
        let depth = 250_000u32;
        let line = Arc::new(SharedLine::new(rate, depth, 0));
        let frames = [4_200u64, 1_100, 120];
        let mut shards: Vec<PortShaper> = frames
            .iter()
            .map(|_| PortShaper::on_line(line.clone()))
            .collect();
        let mut sent = [0u64; 3];
        let mut now = 0u64;
        let mut step = 0usize;
        while now <= 1_000_000_000 {
            // Who comes first at the line changes, as between threads.
            for j in 0..shards.len() {
                let k = (step + j) % shards.len();
                while shards[k].may_send(now) {
                    shards[k].charge(frames[k]);
                    sent[k] += frames[k];
                }
            }
            now += 1_000;
            step += 1;
        }
        let total: u64 = sent.iter().sum();
        let line_bytes = rate / 8;
        let slack: u64 = frames.iter().map(|f| CLAIM_BYTES + f).sum();
        assert!(
            total <= line_bytes + u64::from(depth) + slack,
            "{total} > {line_bytes}: {sent:?}"
        );
        assert!(total + 3 * CLAIM_BYTES >= line_bytes, "{total}: {sent:?}");
        // Each shard had its turn at the line.
        assert!(sent.iter().all(|&b| b > line_bytes / 10), "{sent:?}");
    }

    /// Threads claiming at once at one instant: the line is booked up to the
    /// depth and not more than one claim beyond, however the claims race.
    #[test]
    fn racing_claims_book_the_depth_and_at_most_one_claim_more() {
        let depth = 1u32 << 20;
        let line = Arc::new(SharedLine::new(10_000_000_000, depth, 5));
        let claims: u64 = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let line = &line;
                    sc.spawn(move || {
                        let mut n = 0u64;
                        while line.claim(CLAIM_BYTES, 5) {
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let booked = claims * CLAIM_BYTES;
        assert!(
            booked > u64::from(depth) && booked <= u64::from(depth) + CLAIM_BYTES,
            "{claims} claims"
        );
        // 400 us later (500 kB of line time at 10 Gbit/s) the line is still
        // busy with what was booked: it takes as much more as passed.
        let claim_all = |now| {
            let mut n = 0u64;
            while line.claim(CLAIM_BYTES, now) {
                n += CLAIM_BYTES;
            }
            n
        };
        let more = claim_all(5 + 400_000);
        assert!(
            (500_000 - CLAIM_BYTES..=500_000 + CLAIM_BYTES).contains(&more),
            "{more}"
        );
        // After a long idle spell the line takes a depth again, not the idle
        // time.
        let after_idle = claim_all(5 + 1_000_000_000);
        assert!(
            after_idle > u64::from(depth) && after_idle <= u64::from(depth) + CLAIM_BYTES,
            "{after_idle}"
        );
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
