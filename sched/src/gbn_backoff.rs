//! Loss backoff of a QP without congestion control (CC `none`): a window
//! that shrinks on every go-back-N round and grows back as data is
//! acknowledged, so that a NIC sending at line rate into a slow peer does
//! not resend most of what it sends.
//!
//! Without it, each loss makes the sender go back N and resend everything
//! it had in flight (IBA 9.7.5.1.3), at line rate again, into the same
//! overflowing peer: almost everything is sent several times. A
//! go-back-N round wastes what was in flight, so the lever is the window
//! (the bytes in flight), not the pacing rate (whose waste also depends on
//! the peer's queueing delay, which the NIC does not know):
//!
//! - at each round (a PSN sequence error NAK, or a retransmit timeout: a
//!   sender that sent its whole window into an overflowing peer hears no
//!   NAK, as nothing arrives after the gap):
//!   `window = max(mtu, min(window, in_flight) / 2)`. The first round
//!   halves what was really in flight (the window starts unlimited); each
//!   further round halves again, down to one packet, as TCP Reno does on
//!   each loss;
//! - on progress: one MTU more per window of bytes acknowledged (Reno's
//!   congestion avoidance); the window is lifted again once it reaches
//!   [`UNLIMITED_ABOVE`].
//!
//! Against a peer that absorbs `C` bytes per round trip (its queue and the
//! path), the window saw-tooths between `C/2` and `C`; each overflow wastes
//! about one window while a cycle delivers about `0.375 C^2 / mtu`, so the
//! share of retransmitted bytes is about `2.7 mtu / C` (a few percent for
//! `C` of a few hundred KB). Pure: no clock, no DPDK.

/// Window above which the backoff stops limiting the QP: more than any
/// path this NIC drives needs in flight (100 Gbit/s for over 1 ms).
pub const UNLIMITED_ABOVE: u32 = 16 << 20;

/// The backoff state of one QP (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoBackNBackoff {
    mtu: u32,
    /// `None`: not limiting.
    window: Option<u32>,
    /// Bytes acknowledged towards the next MTU of growth.
    credit: u64,
    /// Go-back-N rounds seen.
    rounds: u64,
}

impl GoBackNBackoff {
    /// A backoff for a QP with path MTU `mtu`, not limiting yet.
    pub fn new(mtu: u32) -> Self {
        GoBackNBackoff {
            mtu: mtu.max(1),
            window: None,
            credit: 0,
            rounds: 0,
        }
    }

    /// The window in bytes (`u32::MAX`: not limiting).
    pub fn window(&self) -> u32 {
        self.window.unwrap_or(u32::MAX)
    }

    /// Go-back-N rounds seen.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// A go-back-N round began with `in_flight` bytes sent and not
    /// acknowledged.
    pub fn on_go_back_n(&mut self, in_flight: u32) {
        let base = self.window().min(in_flight);
        self.window = Some((base / 2).max(self.mtu));
        self.credit = 0;
        self.rounds += 1;
    }

    /// `bytes` newly acknowledged.
    pub fn on_ack(&mut self, bytes: u32) {
        let Some(w) = self.window else { return };
        self.credit += u64::from(bytes);
        let mut w = u64::from(w);
        while self.credit >= w {
            self.credit -= w;
            w += u64::from(self.mtu);
        }
        self.window = (w < u64::from(UNLIMITED_ABOVE)).then_some(w as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u32 = 4096;

    #[test]
    fn first_round_halves_what_was_in_flight() {
        let mut b = GoBackNBackoff::new(MTU);
        assert_eq!(b.window(), u32::MAX);
        b.on_go_back_n(1 << 20);
        assert_eq!(b.window(), 512 << 10);
        assert_eq!(b.rounds(), 1);
    }

    #[test]
    fn each_round_halves_down_to_one_packet() {
        let mut b = GoBackNBackoff::new(MTU);
        b.on_go_back_n(8 << 20);
        assert_eq!(b.window(), 4 << 20);
        // Less in flight than the window: half of what was in flight.
        b.on_go_back_n(100 << 10);
        assert_eq!(b.window(), 50 << 10);
        for _ in 0..10 {
            b.on_go_back_n(u32::MAX);
        }
        assert_eq!(b.window(), MTU);
        assert_eq!(b.rounds(), 12);
    }

    #[test]
    fn grows_one_mtu_per_window_acknowledged_then_lets_go() {
        let mut b = GoBackNBackoff::new(MTU);
        b.on_go_back_n(64 << 10);
        assert_eq!(b.window(), 32 << 10);
        b.on_ack((32 << 10) - 1);
        assert_eq!(b.window(), 32 << 10);
        b.on_ack(1);
        assert_eq!(b.window(), (32 << 10) + MTU);
        // Acknowledging a lot grows it past the limit: no longer limiting.
        for _ in 0..200_000 {
            b.on_ack(1 << 20);
        }
        assert_eq!(b.window(), u32::MAX);
    }

    /// A model of the slow peer: it absorbs `cap` bytes per round trip; the
    /// sender has its window in flight each round trip; a window above
    /// `cap` overflows and, pessimistically, the whole window is resent
    /// (go-back-N from the first loss, and what was sent until the NAK
    /// came). The resent share stays under 10 % once the window settled.
    #[test]
    fn against_a_slow_peer_most_bytes_are_sent_once() {
        let cap = 512u32 << 10;
        let mut b = GoBackNBackoff::new(MTU);
        let (mut sent, mut resent) = (0u64, 0u64);
        let wanted = 16u32 << 20;
        for rtt in 0..20_000 {
            let window = wanted.min(b.window());
            if rtt > 100 {
                sent += u64::from(window);
            }
            if window > cap {
                if rtt > 100 {
                    resent += u64::from(window);
                }
                b.on_ack(cap);
                b.on_go_back_n(window);
            } else {
                b.on_ack(window);
            }
        }
        let share = resent as f64 / sent as f64;
        assert!(share < 0.10, "resent {:.1} %", share * 100.0);
    }
}
