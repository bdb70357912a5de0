//! A link impairment stage, like `tc netem`: forwards frames from one port
//! to another, dropping, duplicating and reordering them with given
//! probabilities from a seeded generator, and corrupting them (one bit
//! flipped, in a copy: a zero-copy frame's payload is the sender's memory). Put between two NICs (two ring
//! pairs and a forwarding thread), it proves that go-back-N and the
//! retransmission timer recover every loss.
//!
//! [`run_throttled`] is the other stage: a slow link (like `tc tbf`),
//! frames leave at a given rate behind a FIFO of a given size and what does
//! not fit is dropped, as at a slow peer's port or a switch's egress.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use dpdk::{Burst, Mbuf, Mempool, RxQueue, TxQueue};

/// Probabilities of each impairment, per frame, and the generator's seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Drop the frame.
    pub drop: f64,
    /// Send it twice.
    pub duplicate: f64,
    /// Hold it back and send it after the next frame.
    pub reorder: f64,
    // --- corruption (chaos soak, issue 14) ---
    /// Flip one random bit of the frame's first segment (the receiver's
    /// ICRC check must catch it, or a variant field the ICRC masks).
    pub corrupt: f64,
    // --- end corruption ---
    /// Seed of the generator (runs are repeatable).
    pub seed: u64,
}

/// What the stage did.
#[derive(Debug, Default)]
pub struct ImpairCounters {
    /// Frames forwarded (duplicates included).
    pub forwarded: AtomicU64,
    /// Frames dropped on purpose.
    pub dropped: AtomicU64,
    /// Extra copies sent.
    pub duplicated: AtomicU64,
    /// Frames sent out of order.
    pub reordered: AtomicU64,
    /// Frames sent with one bit flipped.
    pub corrupted: AtomicU64,
}

/// A small, fast, seeded generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One direction of an impaired link.
pub struct ImpairedPath {
    /// Where frames come in.
    pub rx: RxQueue,
    /// Where they leave.
    pub tx: TxQueue,
    /// A frame held back for reordering.
    held: Option<Mbuf>,
    /// Frames waiting for room in the output port.
    out: Burst<64>,
    /// Frames each drop takes, the dropped one and the next ones on this
    /// path (burst loss, as a switch's overflowing queue drops; 1, the
    /// default: independent drops).
    pub drop_burst: u32,
    /// Frames the current burst still takes.
    burst_left: u32,
}

impl ImpairedPath {
    /// A path from `rx` to `tx`.
    pub fn new(rx: RxQueue, tx: TxQueue) -> Self {
        ImpairedPath {
            rx,
            tx,
            held: None,
            out: Burst::new(),
            drop_burst: 1,
            burst_left: 0,
        }
    }
}

/// A deep copy of `m` (chained as needed) from `pool`.
fn copy_of(m: &Mbuf, pool: &Mempool) -> Option<Mbuf> {
    let mut c = pool.alloc().ok()?;
    for seg in m.segments() {
        let mut rest = seg;
        while !rest.is_empty() {
            let room = c.tailroom();
            if room == 0 {
                c.chain(pool.alloc().ok()?).ok()?;
                continue;
            }
            let k = room.min(rest.len());
            c.extend_from_slice(&rest[..k]).ok()?;
            rest = &rest[k..];
        }
    }
    Some(c)
}

// --- corruption (chaos soak, issue 14) ---
/// A copy of `m` with one bit of its first segment flipped at a random
/// place (the original, possibly attached to the sender's memory, is freed
/// untouched).
fn corrupted_copy(m: &Mbuf, pool: &Mempool, rng: &mut Rng) -> Option<Mbuf> {
    let mut c = copy_of(m, pool)?;
    let seg = c.data_mut();
    if seg.is_empty() {
        return Some(c);
    }
    let at = ((rng.next_f64() * seg.len() as f64) as usize).min(seg.len() - 1);
    let bit = (rng.next_f64() * 8.0) as u32 & 7;
    seg[at] ^= 1 << bit;
    Some(c)
}
// --- end corruption ---

/// Forwards on every path until `stop`, impairing as configured. Copies for
/// duplicates come from `pool`. Frames the output port refuses are retried,
/// never dropped silently.
pub fn run(
    paths: &mut [ImpairedPath],
    cfg: &Impairment,
    pool: &Mempool,
    counters: &ImpairCounters,
    stop: &AtomicBool,
) {
    let mut rng = Rng::new(cfg.seed);
    let mut inb: Burst = Burst::new();
    while !stop.load(Ordering::Relaxed) {
        for p in paths.iter_mut() {
            let out = &mut p.out;
            if out.is_empty() {
                p.rx.recv(&mut inb);
                for m in inb.drain() {
                    if p.burst_left > 0 {
                        p.burst_left -= 1;
                        counters.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if rng.next_f64() < cfg.drop {
                        p.burst_left = p.drop_burst.saturating_sub(1);
                        counters.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // --- corruption (chaos soak, issue 14) ---
                    let m = if cfg.corrupt > 0.0 && rng.next_f64() < cfg.corrupt {
                        match corrupted_copy(&m, pool, &mut rng) {
                            Some(c) => {
                                counters.corrupted.fetch_add(1, Ordering::Relaxed);
                                c
                            }
                            None => m,
                        }
                    } else {
                        m
                    };
                    // --- end corruption ---
                    if rng.next_f64() < cfg.duplicate {
                        if let Some(c) = copy_of(&m, pool) {
                            if out.push(c).is_ok() {
                                counters.duplicated.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    if p.held.is_none() && rng.next_f64() < cfg.reorder {
                        p.held = Some(m);
                        continue;
                    }
                    // `out` has room: at most 2 frames per input frame, 32 in.
                    let _ = out.push(m);
                    if let Some(h) = p.held.take() {
                        counters.reordered.fetch_add(1, Ordering::Relaxed);
                        let _ = out.push(h);
                    }
                }
            }
            // What the output port refuses waits in `out` for the next turn.
            let n = p.tx.send(out);
            counters.forwarded.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// A slow link: its rate and its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Bits per second a frame (plus 24 bytes of preamble, gap and FCS)
    /// takes to leave.
    pub rate_bps: u64,
    /// Bytes of frames the FIFO holds; a frame that does not fit is dropped.
    pub queue_bytes: usize,
}

/// One direction of a throttled link ([`run_throttled`]).
pub struct ThrottledPath {
    rx: RxQueue,
    tx: TxQueue,
    /// `None`: forwarded at once.
    throttle: Option<Throttle>,
    queue: VecDeque<Mbuf>,
    queued_bytes: usize,
    /// When the head of the queue may leave, ns since the stage started.
    next_ns: u64,
    out: Burst<64>,
}

impl ThrottledPath {
    /// A path from `rx` to `tx`, slowed by `throttle` if given.
    pub fn new(rx: RxQueue, tx: TxQueue, throttle: Option<Throttle>) -> Self {
        let frames = throttle.map_or(0, |t| t.queue_bytes / 60 + 64);
        ThrottledPath {
            rx,
            tx,
            throttle,
            queue: VecDeque::with_capacity(frames),
            queued_bytes: 0,
            next_ns: 0,
            out: Burst::new(),
        }
    }

    /// Takes what arrived into the FIFO (tail drop when full, counted).
    fn enqueue(&mut self, t: &Throttle, inb: &mut Burst, now: u64, counters: &ImpairCounters) {
        for m in inb.drain() {
            let len = m.pkt_len();
            if self.queued_bytes + len > t.queue_bytes {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.queue.is_empty() {
                // An idle link earns no credit for later.
                self.next_ns = self.next_ns.max(now);
            }
            self.queued_bytes += len;
            self.queue.push_back(m);
        }
    }

    /// Moves the frames whose time has come to the output burst.
    fn release(&mut self, t: &Throttle, now: u64) {
        while now >= self.next_ns && !self.out.is_full() {
            let Some(m) = self.queue.pop_front() else {
                break;
            };
            let len = m.pkt_len();
            self.queued_bytes -= len;
            self.next_ns += (len as u64 + 24) * 8 * 1_000_000_000 / t.rate_bps.max(1);
            let _ = self.out.push(m);
        }
    }
}

/// Forwards on every path until `stop`, each throttled as configured.
/// Frames the output port refuses are retried, never dropped silently.
pub fn run_throttled(paths: &mut [ThrottledPath], counters: &ImpairCounters, stop: &AtomicBool) {
    let start = Instant::now();
    let mut inb: Burst = Burst::new();
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed().as_nanos() as u64;
        for p in paths.iter_mut() {
            match p.throttle {
                Some(t) => {
                    p.rx.recv(&mut inb);
                    p.enqueue(&t, &mut inb, now, counters);
                    p.release(&t, now);
                }
                None if p.out.is_empty() => {
                    p.rx.recv(&mut p.out);
                }
                None => {}
            }
            let n = p.tx.send(&mut p.out);
            counters.forwarded.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_uniform_enough_and_repeatable() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let n = 100_000;
        let mut below = 0;
        for _ in 0..n {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
            if x < 0.1 {
                below += 1;
            }
        }
        // Binomial(1e5, 0.1): sd ~ 95; 5 sd.
        assert!((below as i64 - 10_000).abs() < 475, "{below}");
    }
}
