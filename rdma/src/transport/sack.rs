//! Selective repeat beside go-back-N (issue 43): the per-QP loss-recovery mode, the
//! selective acknowledgement's encoding on the wire, and the PSN bitmap both ends
//! keep.
//!
//! IBA 9.7.5.1.3 recovers a loss by go-back-N: the responder drops every packet after
//! a gap (one PSN sequence error NAK, 9.7.5.2.1) and the requester resends everything
//! from the NAKed PSN. [IRN] (Mittal et al., "Revisiting Network Support for RDMA",
//! SIGCOMM 2018, §3.1-3.3 and §5.2) shows that selective repeat plus a cap on the
//! packets in flight at the path's bandwidth-delay product makes RoCE work without
//! PFC. A QP in [`LossRecovery::Sr`] does that, between two rsnic peers that agreed
//! on it (the device setting `--loss-recovery sr`, `RSNIC_LOSS_RECOVERY`, on both
//! ends, docs/reliability.md):
//!
//! - the responder (`responder::selective`) accepts a request ahead of the expected
//!   PSN within [`WINDOW`] PSNs when it can place it now: an RDMA WRITE packet that
//!   carries its own RETH (a requester in `sr` sends a plain WRITE as one WRITE ONLY
//!   per path MTU, each with the RETH of its bytes, as IRN puts a RETH in every WRITE
//!   packet, §5.2); it marks it in a [`PsnBitmap`] and answers with a selective ACK
//!   ([`SACK_PLACED`]). A request it cannot place yet (a SEND, whose receive WQE and
//!   offset depend on the messages before it; a WRITE with immediate, whose
//!   completion consumes a receive WQE; a READ or ATOMIC, which IBA executes in PSN
//!   order so that it sees every WRITE before it) is dropped and answered with
//!   [`SACK_UNPLACED`]. When the expected PSN arrives the responder executes it and
//!   then walks over every PSN the bitmap holds: each was a WRITE ONLY, whose
//!   in-order effects (the MSN, the coalesced ACK) happen then, in PSN order. So
//!   receive WQEs are consumed, SEND data lands and completions are made exactly in
//!   the order go-back-N gives;
//! - the requester (`completer::selective`, `requester::selective`) marks what the
//!   selective ACKs and out-of-order READ responses report, retransmits only the
//!   holes below the highest PSN reported (a READ re-requests only the missing range
//!   of its responses), caps the PSNs in flight at the BDP ([`SrParams::bdp_pkts`]),
//!   and keeps IRN's two timeouts ([`SrParams::rto_low_ns`] while at most
//!   [`SrParams::low_pkts`] packets are in flight, [`SrParams::rto_high_ns`]
//!   otherwise), which resend without spending the IBA retry count; the IBA
//!   timer (`timeout_ns`, `retry_cnt`) still ends a QP whose peer went away. A work
//!   request completes only when the cumulative ACK (or, for a READ and an ATOMIC,
//!   every response) covers it and every one before it completed, as with go-back-N.
//!
//! # The selective ACK on the wire
//!
//! An ACKNOWLEDGE packet (IBA 9.7.5.1, opcode 0x11) whose AETH syndrome is a NAK with
//! a NAK code IBA reserves (9.7.5.2, table 44: codes 5-31 are reserved):
//!
//! | field | value |
//! |---|---|
//! | BTH PSN | the responder's expected PSN: every PSN before it arrived (as in a PSN sequence error NAK) |
//! | AETH syndrome | `011_11110` (0x7E, [`SACK_PLACED`]): the PSN below arrived and was placed; `011_11101` (0x7D, [`SACK_UNPLACED`]): it arrived and could not be placed yet |
//! | AETH MSN (24 bits) | the PSN that arrived (IRN's "sequence number of the packet that triggered the NACK") |
//!
//! Everything else is an ordinary ACKNOWLEDGE (ICRC included), so tshark and scapy
//! decode it, as a NAK with a reserved code. A standard requester (rxe's
//! `check_ack`, hardware) takes a reserved NAK code as a fatal error, so a responder
//! sends one only on a QP in `sr`, which the NIC makes only with a peer known to be
//! an rsnic QP in `sr` too (negotiated by the IB CM, `crate::cm::ext`, or told by an
//! exchange between two rsnic programs; docs/reliability.md), and never after the QP fell
//! back to go-back-N: a requester in `sr` that hears a PSN sequence error NAK (a NAK
//! with no selective part) knows that the peer's responder does go-back-N, and the
//! QP falls back ([`SrCounters::fallbacks`]): the bitmap is forgotten, the requester
//! goes back N from the NAKed PSN as IBA says, and the responder NAKs gaps as IBA
//! says. Nothing is lost: what the bitmap held is resent (a WRITE placed twice writes
//! the same bytes; a READ response placed twice the same bytes).
//!
//! [IRN]: https://dl.acm.org/doi/10.1145/3230543.3230557

use crate::wire::psn;
use crate::wire::transport_hdrs::{AethSyndrome, NakCode};

/// NAK code of a selective ACK whose PSN was placed (module docs; IBA table 44
/// reserves NAK codes 5-31).
pub const SACK_PLACED: u8 = 0x1E;
/// NAK code of a selective ACK whose PSN arrived but could not be placed yet.
pub const SACK_UNPLACED: u8 = 0x1D;

/// PSNs a bitmap tracks past its base (the responder's expected PSN, the requester's
/// oldest unacknowledged one): 2048, the most PSNs in flight an `sr` QP allows
/// (a READ of 2 MiB at a path MTU of 1024, 8 MiB at 4096). A READ response beyond it
/// is dropped and re-requested once the window reaches it.
pub const WINDOW: u32 = 2048;

/// A selective ACK, decoded from an AETH syndrome and MSN field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sack {
    /// The PSN that arrived.
    pub psn: u32,
    /// It was placed (else it must be sent again).
    pub placed: bool,
}

impl Sack {
    /// The selective ACK an AETH carries (`syndrome`, `msn`), if it is one.
    pub fn from_aeth(syndrome: AethSyndrome, msn: u32) -> Option<Sack> {
        match syndrome {
            AethSyndrome::Nak(NakCode::Reserved(SACK_PLACED)) => Some(Sack {
                psn: msn & psn::MASK,
                placed: true,
            }),
            AethSyndrome::Nak(NakCode::Reserved(SACK_UNPLACED)) => Some(Sack {
                psn: msn & psn::MASK,
                placed: false,
            }),
            _ => None,
        }
    }

    /// The AETH syndrome that carries it (its PSN goes in the MSN field).
    pub fn syndrome(placed: bool) -> AethSyndrome {
        AethSyndrome::Nak(NakCode::Reserved(if placed {
            SACK_PLACED
        } else {
            SACK_UNPLACED
        }))
    }
}

/// How a reliable QP recovers a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LossRecovery {
    /// Go-back-N (IBA 9.7.5.1.3), the default, and what any peer that is not an
    /// rsnic configured `sr` gets.
    #[default]
    Gbn,
    /// Selective repeat with a BDP cap (IRN; module docs). Both ends must agree.
    Sr,
}

impl LossRecovery {
    /// Its name: `gbn` or `sr`.
    pub fn name(self) -> &'static str {
        match self {
            LossRecovery::Gbn => "gbn",
            LossRecovery::Sr => "sr",
        }
    }
}

impl std::fmt::Display for LossRecovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LossRecovery {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gbn" | "go-back-n" => Ok(LossRecovery::Gbn),
            "sr" | "selective-repeat" => Ok(LossRecovery::Sr),
            o => Err(format!("unknown loss recovery {o:?}: expected sr or gbn")),
        }
    }
}

/// The requester's selective-repeat parameters (IRN §3.1-3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrParams {
    /// Most PSNs in flight (from the oldest unacknowledged to the next to send):
    /// IRN's BDP-FC, the path's bandwidth-delay product in packets. At most
    /// [`WINDOW`]; one work request may always start when nothing is in flight.
    pub bdp_pkts: u32,
    /// IRN's RTO_low: the retransmit timeout while at most [`Self::low_pkts`]
    /// packets are in flight (a tail loss, which no later packet reveals).
    pub rto_low_ns: u64,
    /// IRN's RTO_high: the retransmit timeout otherwise.
    pub rto_high_ns: u64,
    /// IRN's N (3 in the paper).
    pub low_pkts: u32,
}

impl Default for SrParams {
    /// IRN's values for a 40 Gbit/s fabric (RTO_low 100 us, RTO_high 320 us, N 3)
    /// and a cap of 256 packets (1 MiB at a path MTU of 4096).
    fn default() -> Self {
        SrParams {
            bdp_pkts: 256,
            rto_low_ns: 100_000,
            rto_high_ns: 320_000,
            low_pkts: 3,
        }
    }
}

impl SrParams {
    /// Parameters for a path of `line_bps` and round-trip time `rtt_ns` with path MTU
    /// `mtu`: the cap at the BDP in packets (at least 16, at most [`WINDOW`]),
    /// RTO_high at 4 RTTs and RTO_low at 1.25 RTTs, each at least `min_rto_ns` (IRN
    /// sets them a few RTTs above the fabric's; a software NIC on a shared host needs a
    /// floor above its scheduling delays).
    pub fn for_path(line_bps: u64, rtt_ns: u64, mtu: u32, min_rto_ns: u64) -> SrParams {
        let bdp_bytes = u128::from(line_bps) * u128::from(rtt_ns) / 8 / 1_000_000_000;
        let pkts = (bdp_bytes / u128::from(mtu.max(1))) as u64;
        SrParams {
            bdp_pkts: pkts.clamp(16, u64::from(WINDOW)) as u32,
            rto_low_ns: (rtt_ns * 5 / 4).max(min_rto_ns),
            rto_high_ns: (rtt_ns * 4).max(min_rto_ns * 3),
            low_pkts: 3,
        }
    }
}

/// What the selective-repeat machinery of one QP counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrCounters {
    /// Requests placed ahead of the expected PSN (responder).
    pub rx_placed_ahead: u64,
    /// Selective ACKs sent (responder), placed or not.
    pub sacks_sent: u64,
    /// Selective ACKs received (requester).
    pub sacks_received: u64,
    /// Holes resent (requester): request packets, and READ re-requests.
    pub holes_resent: u64,
    /// READ re-requests of a missing range of responses (requester).
    pub read_rerequests: u64,
    /// READ responses placed ahead of the oldest missing one (requester).
    pub rx_read_ahead: u64,
    /// RTO_low / RTO_high timeouts (requester).
    pub sr_timeouts: u64,
    /// Times the QP fell back to go-back-N (its peer NAKed a gap without a
    /// selective part).
    pub fallbacks: u64,
}

/// The selective-repeat state of one `sr` QP, both roles (kept apart from the
/// QP's hot lines, allocated with the QP: a QP in go-back-N has none).
#[derive(Debug, Clone)]
pub(crate) struct SrState {
    /// Still selective: false once the QP fell back to go-back-N.
    pub active: bool,
    /// The requester's parameters.
    pub params: SrParams,
    /// What it counted.
    pub counters: SrCounters,
    /// Responder: the PSNs after the expected one that arrived and were placed.
    pub arrived: PsnBitmap,
    /// Requester: the PSNs from the oldest unacknowledged one that are done (a
    /// request the responder reported placed, a READ response or ATOMIC ACK
    /// received).
    pub done: PsnBitmap,
    /// Requester: how many PSNs [`Self::done`] marks (all of them past the
    /// oldest unacknowledged PSN): what the cap on PSNs in flight leaves out.
    pub done_ahead: u32,
    /// Requester: the responder's expected PSN as last heard (every request before
    /// it was executed in order).
    pub cum: u32,
    /// Requester: the PSN just past the highest one reported arrived; the PSNs
    /// below it that are not done are holes.
    pub hi: u32,
    /// Requester: the PSN from which holes are still to be resent in this round.
    pub resend_from: u32,
    /// Requester: the PSN just past the highest one sent when a hole was last
    /// resent: a report that a PSN at or past it was placed while a hole of this
    /// round is still missing means that resend was lost (the link keeps order
    /// between them, as IRN assumes): a new round starts then, not a timer later.
    pub round_hi: Option<u32>,
    /// Requester: when the RTO_low / RTO_high timer started (a packet left with
    /// none running, or the oldest unacknowledged PSN moved): it fires at
    /// [`SrState::deadline`], which follows the PSNs in flight.
    pub armed_at: Option<u64>,
    /// Requester: a READ's missing responses are re-requested run by run, which
    /// only an `sr` responder replays. Cleared by the IBA timer (a peer that
    /// ignored a run then gets the rest of the READ, as IBA 9.7.5.1.5 asks), set
    /// again by the next progress or selective ACK.
    pub part_reads: bool,
    /// Requester: a timer fired: the oldest unacknowledged PSN goes again even if
    /// the responder reported it placed (the cumulative ACK that would pass it may
    /// be what was lost; the responder answers the duplicate with it).
    pub probe: bool,
}

impl SrState {
    /// When the RTO_low / RTO_high timer fires, with PSNs `una` to `sent_hi` sent:
    /// IRN's RTO_low while at most N packets are in flight (§3.1: nothing sent after
    /// them will reveal their loss), RTO_high otherwise (so a timer started by the
    /// first packet of a burst takes the burst's timeout). In flight as the cap
    /// counts them ([`Self::done_ahead`] left out): once everything after a resent
    /// hole has been reported, the hole is all that is in flight, and a resend that
    /// was lost too waits RTO_low, not RTO_high (a program that waits for the
    /// hole's completion before it posts more sends nothing that would start the
    /// next round).
    pub fn deadline(&self, una: u32, sent_hi: u32) -> Option<u64> {
        let t = self.armed_at?;
        let in_flight = psn::sub(sent_hi, una).saturating_sub(self.done_ahead);
        let rto = if in_flight <= self.params.low_pkts {
            self.params.rto_low_ns
        } else {
            self.params.rto_high_ns
        };
        Some(t + rto)
    }

    /// The state of a QP whose requester starts at PSN `sq_psn`.
    pub fn new(sq_psn: u32, params: SrParams) -> SrState {
        SrState {
            active: true,
            params,
            counters: SrCounters::default(),
            arrived: PsnBitmap::default(),
            done: PsnBitmap::default(),
            done_ahead: 0,
            cum: sq_psn,
            hi: sq_psn,
            resend_from: sq_psn,
            round_hi: None,
            armed_at: None,
            part_reads: true,
            probe: false,
        }
    }
}

/// A ring of [`WINDOW`] bits indexed by PSN: bit `p % WINDOW` stands for PSN `p`, for
/// PSNs in `[base, base + WINDOW)` of an owner that keeps the base (and clears what it
/// passes with [`Self::clear_span`]).
#[derive(Debug, Clone)]
pub struct PsnBitmap {
    words: [u64; (WINDOW / 64) as usize],
}

impl Default for PsnBitmap {
    fn default() -> Self {
        PsnBitmap {
            words: [0; (WINDOW / 64) as usize],
        }
    }
}

impl PsnBitmap {
    #[inline]
    fn at(p: u32) -> (usize, u64) {
        let i = p % WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Whether PSN `p` is marked.
    #[inline]
    pub fn get(&self, p: u32) -> bool {
        let (w, b) = Self::at(p);
        self.words[w] & b != 0
    }

    /// Marks PSN `p`.
    #[inline]
    pub fn set(&mut self, p: u32) {
        let (w, b) = Self::at(p);
        self.words[w] |= b;
    }

    /// Clears PSN `p`; whether it was marked.
    #[inline]
    pub fn take(&mut self, p: u32) -> bool {
        let (w, b) = Self::at(p);
        let was = self.words[w] & b != 0;
        self.words[w] &= !b;
        was
    }

    /// Marks PSN `p`; whether it was not marked before.
    #[inline]
    pub fn insert(&mut self, p: u32) -> bool {
        let (w, b) = Self::at(p);
        let new = self.words[w] & b == 0;
        self.words[w] |= b;
        new
    }

    /// Clears the `n` PSNs from `from` (all of them when `n >= WINDOW`); how many
    /// of them were marked.
    pub fn clear_span(&mut self, from: u32, n: u32) -> u32 {
        if n >= WINDOW {
            let was = self.words.iter().map(|w| w.count_ones()).sum();
            self.words = [0; (WINDOW / 64) as usize];
            return was;
        }
        let mut was = 0;
        let mut p = from;
        let mut left = n;
        while left > 0 {
            let i = p % WINDOW;
            let bit = i % 64;
            let take = (64 - bit).min(left);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            was += (self.words[(i / 64) as usize] & mask).count_ones();
            self.words[(i / 64) as usize] &= !mask;
            left -= take;
            p = psn::add(p, take);
        }
        was
    }

    /// Clears everything.
    pub fn clear(&mut self) {
        self.words = [0; (WINDOW / 64) as usize];
    }

    /// The first PSN in `[from, from + n)` that is marked (`want`) or not, if any.
    pub fn find(&self, from: u32, n: u32, want: bool) -> Option<u32> {
        let mut p = from;
        let mut left = n.min(WINDOW);
        while left > 0 {
            let i = p % WINDOW;
            let bit = i % 64;
            let w = self.words[(i / 64) as usize];
            let w = if want { w } else { !w } >> bit;
            let span = (64 - bit).min(left);
            let w = if span == 64 {
                w
            } else {
                w & ((1u64 << span) - 1)
            };
            if w != 0 {
                return Some(psn::add(p, w.trailing_zeros()));
            }
            left -= span;
            p = psn::add(p, span);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sack_round_trips_through_the_aeth_and_is_a_reserved_nak() {
        for placed in [true, false] {
            let s = Sack::syndrome(placed);
            // A NAK (011 in the top bits) with a reserved code: what a standard
            // requester takes as an error, never sent to one.
            assert_eq!(s.to_u8() >> 5, 0b011);
            assert!(s.to_u8() & 0x1F >= 5);
            let back = AethSyndrome::from_u8(s.to_u8());
            assert_eq!(
                Sack::from_aeth(back, 0xAB_CDEF),
                Some(Sack {
                    psn: 0xAB_CDEF,
                    placed
                })
            );
        }
        assert_eq!(Sack::syndrome(true).to_u8(), 0x7E);
        assert_eq!(Sack::syndrome(false).to_u8(), 0x7D);
        assert_eq!(
            Sack::from_aeth(AethSyndrome::Nak(NakCode::PsnSequenceError), 5),
            None
        );
        assert_eq!(Sack::from_aeth(AethSyndrome::ACK, 5), None);
    }

    #[test]
    fn the_mode_parses_and_prints() {
        for m in [LossRecovery::Gbn, LossRecovery::Sr] {
            assert_eq!(m.to_string().parse::<LossRecovery>(), Ok(m));
        }
        assert_eq!("SR".parse::<LossRecovery>(), Ok(LossRecovery::Sr));
        assert!("irn".parse::<LossRecovery>().is_err());
        assert_eq!(LossRecovery::default(), LossRecovery::Gbn);
    }

    #[test]
    fn params_for_a_path_cap_at_the_bdp() {
        // 100 Gbit/s x 100 us = 1.25 MB = 305 packets of 4 KiB.
        let p = SrParams::for_path(100_000_000_000, 100_000, 4096, 50_000);
        assert_eq!(p.bdp_pkts, 305);
        assert_eq!((p.rto_low_ns, p.rto_high_ns), (125_000, 400_000));
        let tiny = SrParams::for_path(1_000_000, 1_000, 4096, 50_000);
        assert_eq!(tiny.bdp_pkts, 16);
        assert_eq!((tiny.rto_low_ns, tiny.rto_high_ns), (50_000, 150_000));
        let huge = SrParams::for_path(400_000_000_000, 10_000_000, 256, 0);
        assert_eq!(huge.bdp_pkts, WINDOW);
    }

    /// The bitmap against a plain set of PSNs, across the PSN wrap and the ring's.
    #[test]
    fn the_bitmap_answers_as_a_set() {
        let mut b = PsnBitmap::default();
        let mut model = std::collections::BTreeSet::new();
        let mut r = 0x2545_F491_4F6C_DD1Du64;
        let mut base = psn::MASK - 700;
        for _ in 0..20_000 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            let off = (r % u64::from(WINDOW)) as u32;
            let p = psn::add(base, off);
            match r >> 60 {
                0..=3 => {
                    b.set(p);
                    model.insert(p);
                }
                4..=7 => assert_eq!(b.insert(p), model.insert(p)),
                8..=11 => assert_eq!(b.take(p), model.remove(&p)),
                _ => {
                    let n = (r >> 32) as u32 % 300;
                    let was = (0..n).filter(|k| model.remove(&psn::add(base, *k))).count();
                    assert_eq!(b.clear_span(base, n) as usize, was);
                    base = psn::add(base, n);
                }
            }
            let probe = psn::add(base, (r >> 20) as u32 % WINDOW);
            assert_eq!(b.get(probe), model.contains(&probe));
            let n = (r >> 40) as u32 % 200;
            let want_set = (0..n)
                .map(|k| psn::add(probe, k))
                .find(|q| psn::sub(*q, base) < WINDOW && model.contains(q));
            let lim = n.min(WINDOW - psn::sub(probe, base));
            assert_eq!(
                b.find(probe, lim, true),
                want_set.filter(|q| psn::sub(*q, probe) < lim)
            );
            let want_clear = (0..lim)
                .map(|k| psn::add(probe, k))
                .find(|q| !model.contains(q));
            assert_eq!(b.find(probe, lim, false), want_clear);
        }
        assert_eq!(b.clear_span(0, WINDOW) as usize, model.len());
        assert_eq!(b.find(0, WINDOW, true), None);
    }
}
