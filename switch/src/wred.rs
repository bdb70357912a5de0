//! WRED/ECN on the instantaneous queue (LDCP draft 004 section 2.1 and section 2.3,
//! docs/design.md §6) and the seeded random generator it draws from.
//!
//! For ECN-capable packets (ECT(0)/ECT(1)) arriving at a queue of `q` bytes:
//!
//! ```text
//! q <  K_min          : p = 0
//! K_min <= q < K_max  : p = (q - K_min) / (K_max - K_min) * P_max
//! q >= K_max          : p = 1
//! ```
//!
//! and the packet is marked CE with probability `p` (marking, never dropping). Not-ECT
//! packets are dropped when `q >= K` (004 section 2.3, Eq. 3: LDCP's first-RTT packets).
//! Everything is dropped when it would not fit in `buf_max` (tail drop, done by the
//! queue). LDCP deliberately uses the instantaneous queue, not RED's average.
//!
//! Probabilities are fixed point in units of 2^-32 so the per-packet decision is one
//! 128-bit multiply and one compare against a 32-bit random number.

/// SplitMix64: a tiny, fast, seeded generator; deterministic runs for tests and
/// reproducible experiments (no OS entropy, no clock).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Next 32 random bits (the high half, the better-mixed one).
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}

/// Random numbers for WRED drawn [`RngBatch::LEN`] at a time: one refill runs eight
/// independent splitmix64 finalisers (the CPU overlaps them) and keeps both 32-bit
/// halves of each, so a frame's draw is a load from a small array instead of a
/// dependent chain of multiplies.
#[derive(Debug, Clone)]
pub struct RngBatch {
    rng: Rng,
    buf: [u32; RngBatch::LEN],
    next: usize,
}

impl RngBatch {
    /// Numbers per refill.
    pub const LEN: usize = 16;

    /// A batch source over `rng`'s stream (filled on the first draw).
    pub fn new(rng: Rng) -> Self {
        Self {
            rng,
            buf: [0; Self::LEN],
            next: Self::LEN,
        }
    }

    /// The next uniform 32-bit number.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        if self.next == Self::LEN {
            self.refill();
        }
        let r = self.buf[self.next];
        self.next += 1;
        r
    }

    fn refill(&mut self) {
        let base = self.rng.state;
        for k in 0..Self::LEN / 2 {
            let mut z = base.wrapping_add((k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            self.buf[2 * k] = (z >> 32) as u32;
            self.buf[2 * k + 1] = z as u32;
        }
        self.rng.state =
            base.wrapping_add((Self::LEN as u64 / 2).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.next = 0;
    }
}

/// One in fixed point (2^32).
pub const ONE_Q32: u64 = 1 << 32;

/// What WRED decides for one arriving packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WredAction {
    /// Enqueue unchanged.
    Pass,
    /// Enqueue with ECN set to CE.
    Mark,
    /// Drop (Not-ECT at or above K).
    Drop,
}

/// The WRED/ECN law of one port.
#[derive(Debug, Clone)]
pub struct Wred {
    k_min: u64,
    k_max: u64,
    k_drop: u64,
    p_max_q32: u64,
    /// P_max * 2^64 / (K_max - K_min): threshold = ((q - K_min) * slope) >> 32.
    /// Held in 64 bits (one 64 x 64 -> 128 multiply per decision): it exceeds them
    /// only when K_max - K_min is 1, where q - K_min is always 0.
    slope: u64,
}

impl Wred {
    /// The law for `k_min <= k_max`, `p_max` in [0, 1] (validated by the config;
    /// out-of-range values are clamped here rather than trusted).
    pub fn new(k_min: u64, k_max: u64, p_max: f64, k_drop: u64) -> Self {
        let k_max = k_max.max(k_min);
        let p = if p_max.is_finite() {
            p_max.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let p_max_q32 = ((p * ONE_Q32 as f64).round() as u64).min(ONE_Q32);
        let range = k_max - k_min;
        let slope = if range == 0 {
            0
        } else {
            (u128::from(p_max_q32) << 32) / u128::from(range)
        };
        Self {
            k_min,
            k_max,
            k_drop,
            p_max_q32,
            slope: u64::try_from(slope).unwrap_or(u64::MAX),
        }
    }

    /// Marking probability at queue `q` bytes, in units of 2^-32 (0..=2^32).
    #[inline]
    pub fn mark_threshold_q32(&self, q: u64) -> u64 {
        if q < self.k_min {
            0
        } else if q >= self.k_max {
            ONE_Q32
        } else {
            let t = (u128::from(q - self.k_min) * u128::from(self.slope)) >> 32;
            (t as u64).min(self.p_max_q32)
        }
    }

    /// Marking probability at queue `q` bytes (the law as a real number).
    pub fn mark_probability(&self, q: u64) -> f64 {
        self.mark_threshold_q32(q) as f64 / ONE_Q32 as f64
    }

    /// Decides for a packet with ECN-capable transport `ect` (ECT(0), ECT(1); CE
    /// counts as ECN-capable and stays CE) arriving at queue `q`.
    #[inline]
    pub fn decide(&self, q: u64, ect: bool, rng: &mut Rng) -> WredAction {
        self.decide_with(q, ect, || rng.next_u32())
    }

    /// [`Wred::decide`] with the random number from `draw` (called only in the linear
    /// region, where the decision is random).
    #[inline]
    pub fn decide_with(&self, q: u64, ect: bool, draw: impl FnOnce() -> u32) -> WredAction {
        if !ect {
            return if q >= self.k_drop {
                WredAction::Drop
            } else {
                WredAction::Pass
            };
        }
        let t = self.mark_threshold_q32(q);
        if t == 0 {
            WredAction::Pass
        } else if t >= ONE_Q32 || u64::from(draw()) < t {
            WredAction::Mark
        } else {
            WredAction::Pass
        }
    }

    /// K (Not-ECT drop threshold).
    pub fn k_drop(&self) -> u64 {
        self.k_drop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn law_endpoints() {
        let w = Wred::new(1000, 3000, 0.5, 2000);
        assert_eq!(w.mark_probability(0), 0.0);
        assert_eq!(w.mark_probability(999), 0.0);
        assert_eq!(w.mark_probability(1000), 0.0);
        assert!((w.mark_probability(2000) - 0.25).abs() < 1e-9);
        assert!((w.mark_probability(2999) - 0.49975).abs() < 1e-9);
        assert_eq!(w.mark_probability(3000), 1.0);
        assert_eq!(w.mark_probability(u64::MAX), 1.0);
        let mut r = Rng::new(7);
        assert_eq!(w.decide(1999, false, &mut r), WredAction::Pass);
        assert_eq!(w.decide(2000, false, &mut r), WredAction::Drop);
        assert_eq!(w.decide(3000, true, &mut r), WredAction::Mark);
        assert_eq!(w.decide(999, true, &mut r), WredAction::Pass);
        // K_min == K_max: a step.
        let s = Wred::new(500, 500, 0.1, 0);
        assert_eq!(s.mark_probability(499), 0.0);
        assert_eq!(s.mark_probability(500), 1.0);
        // P_max clamped, NaN treated as 0.
        assert!((Wred::new(0, 10, 7.0, 0).mark_probability(5) - 0.5).abs() < 1e-9);
        assert_eq!(Wred::new(0, 10, f64::NAN, 0).mark_probability(5), 0.0);
    }

    #[test]
    fn batch_draws_the_splitmix_stream() {
        // The batch holds the same splitmix64 outputs as Rng, both halves of each.
        let mut r = Rng::new(42);
        let mut b = RngBatch::new(Rng::new(42));
        for _ in 0..(3 * RngBatch::LEN / 2) {
            let x = r.next_u64();
            assert_eq!(b.next_u32(), (x >> 32) as u32);
            assert_eq!(b.next_u32(), x as u32);
        }
        // And it is roughly uniform: the mean of 64k draws is near 2^31.
        let mut b = RngBatch::new(Rng::new(7));
        let mean = (0..65536).map(|_| f64::from(b.next_u32())).sum::<f64>() / 65536.0;
        assert!((mean / 2f64.powi(31) - 1.0).abs() < 0.01, "{mean}");
    }

    #[test]
    fn rng_is_deterministic() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
