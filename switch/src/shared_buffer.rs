//! A switch's shared packet buffer with dynamic thresholds (Choudhury and Hahne,
//! "Dynamic queue length thresholds for shared-memory packet switches", IEEE/ACM ToN
//! 6(2), 1998), the admission rule of common switch ASICs' buffer managers: all data
//! queues of a switch draw on one pool of `B` bytes, and a port's data queue may take
//! a frame only while it stays within `alpha x` the bytes still free in the pool.
//!
//! One congested port thus settles at `alpha / (1 + alpha)` of the pool, `n` congested
//! ports at `alpha / (1 + n alpha)` each, and some room is always left for a port that
//! starts to queue. `alpha` is a power of two (`2^alpha_log2`, as the ASICs' alpha
//! settings 1/128 .. 8 are). The control class (ACK/NAK/CNP) keeps its own per-port
//! buffer and is not counted. A port's static `buf_max` still bounds its ring.

/// The pool and its occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedBuffer {
    total: u64,
    used: u64,
    alpha_log2: i8,
}

impl SharedBuffer {
    /// A pool of `total` bytes with `alpha = 2^alpha_log2` (clamped to -16..=16).
    pub fn new(total: u64, alpha_log2: i8) -> Self {
        Self {
            total,
            used: 0,
            alpha_log2: alpha_log2.clamp(-16, 16),
        }
    }

    /// Bytes of the pool.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes queued in it.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The dynamic threshold now: `alpha x` the free bytes.
    #[inline]
    pub fn threshold(&self) -> u64 {
        let free = self.total.saturating_sub(self.used);
        if self.alpha_log2 >= 0 {
            free.saturating_mul(1 << self.alpha_log2)
        } else {
            free >> -self.alpha_log2
        }
    }

    /// Whether a data queue holding `queue_bytes` may take a frame of `len` bytes:
    /// the pool has room and the queue stays within the threshold.
    #[inline]
    pub fn admits(&self, queue_bytes: u64, len: u64) -> bool {
        self.used + len <= self.total && queue_bytes + len <= self.threshold()
    }

    /// A frame of `len` bytes was queued.
    #[inline]
    pub fn take(&mut self, len: u64) {
        self.used += len;
    }

    /// A frame of `len` bytes left.
    #[inline]
    pub fn give(&mut self, len: u64) {
        self.used = self.used.saturating_sub(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills `n` ports in turn with 1000-byte frames until none is admitted; the
    /// ports' queue bytes.
    fn fill(b: &mut SharedBuffer, n: usize) -> Vec<u64> {
        let mut q = vec![0u64; n];
        loop {
            let mut any = false;
            for qi in q.iter_mut() {
                if b.admits(*qi, 1000) {
                    b.take(1000);
                    *qi += 1000;
                    any = true;
                }
            }
            if !any {
                return q;
            }
        }
    }

    #[test]
    fn one_port_settles_at_alpha_over_one_plus_alpha_of_the_pool() {
        for (alpha_log2, share) in [(0i8, 1.0 / 2.0), (1, 2.0 / 3.0), (-1, 1.0 / 3.0)] {
            let mut b = SharedBuffer::new(1_000_000, alpha_log2);
            let q = fill(&mut b, 1)[0] as f64;
            assert!(
                (q / 1e6 - share).abs() < 0.002,
                "alpha 2^{alpha_log2}: {q} bytes"
            );
        }
    }

    #[test]
    fn n_ports_share_alike_and_leave_room_for_another() {
        let mut b = SharedBuffer::new(3_000_000, 0);
        let q = fill(&mut b, 2);
        // alpha / (1 + 2 alpha) = 1/3 of the pool each.
        for &x in &q {
            assert!((x as f64 / 3e6 - 1.0 / 3.0).abs() < 0.002, "{q:?}");
        }
        assert!(b.admits(0, 1000), "a new port still gets in");
        // Draining gives the bytes back.
        b.give(q[0]);
        assert_eq!(b.used(), q[1]);
    }

    #[test]
    fn the_pool_is_a_hard_bound_whatever_alpha() {
        let mut b = SharedBuffer::new(100_000, 16);
        let q = fill(&mut b, 4);
        assert_eq!(q.iter().sum::<u64>(), b.used());
        assert!(b.used() <= 100_000);
        assert!(!b.admits(0, 1000));
    }
}
