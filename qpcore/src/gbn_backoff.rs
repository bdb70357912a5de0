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
//!   `window = max(mtu, min(window, in_flight, acked) / 2)`, where `acked`
//!   is what the peer acknowledged since the previous round: what it could
//!   take. The first round (the window starts unlimited, and a QP that
//!   starts with a deep queue has megabytes in flight) so drops at once to
//!   half of what got through, instead of halving the flight round after
//!   round and resending a flight each time; later rounds halve the window
//!   (the peer took more than a window since), as TCP Reno does on each
//!   loss;
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
    /// Bytes acknowledged since the last go-back-N round (or the start).
    acked_in_round: u64,
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
            acked_in_round: 0,
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
        let acked = u32::try_from(self.acked_in_round).unwrap_or(u32::MAX);
        let base = self.window().min(in_flight).min(acked);
        self.window = Some((base / 2).max(self.mtu));
        self.credit = 0;
        self.acked_in_round = 0;
        self.rounds += 1;
    }

    /// `bytes` newly acknowledged.
    pub fn on_ack(&mut self, bytes: u32) {
        self.acked_in_round = self.acked_in_round.saturating_add(u64::from(bytes));
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
        b.on_ack(4 << 20);
        b.on_go_back_n(1 << 20);
        assert_eq!(b.window(), 512 << 10);
        assert_eq!(b.rounds(), 1);
    }

    #[test]
    fn each_round_halves_down_to_one_packet() {
        let mut b = GoBackNBackoff::new(MTU);
        b.on_ack(64 << 20);
        b.on_go_back_n(8 << 20);
        assert_eq!(b.window(), 4 << 20);
        // Less in flight than the window: half of what was in flight.
        b.on_ack(64 << 20);
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
        b.on_ack(1 << 20);
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

    #[test]
    fn first_round_drops_to_half_of_what_the_peer_took() {
        // 8 MiB in flight at the start; the peer took 256 KiB of it.
        let mut b = GoBackNBackoff::new(MTU);
        b.on_ack(256 << 10);
        b.on_go_back_n(8 << 20);
        assert_eq!(b.window(), 128 << 10);
        // A round with nothing acknowledged since (a timeout): one packet.
        b.on_go_back_n(128 << 10);
        assert_eq!(b.window(), MTU);
    }

    /// From an unlimited start with 16 MiB in flight into a peer that
    /// takes 512 KiB per round trip: one round brings the window under the
    /// peer's capacity, so only the first flight is wasted.
    #[test]
    fn one_round_from_an_unlimited_start() {
        let cap = 512u32 << 10;
        let mut b = GoBackNBackoff::new(MTU);
        let flight = 16u32 << 20;
        b.on_ack(cap);
        b.on_go_back_n(flight);
        assert!(b.window() <= cap, "{}", b.window());
        assert_eq!(b.rounds(), 1);
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
