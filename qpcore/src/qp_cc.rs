//! The per-QP glue between the RC transport (`rdma::transport::Qp`) and its congestion
//! control (`cc`), docs/design.md "The per-QP core": what the per-QP core
//! ([`crate::QpCore`]) of the NIC engine and of roce-sim's NIC does, in one place, so that the simulator feeds
//! the CC exactly as the NIC does.
//!
//! - transport events become CC calls ([`on_event`]): an ACK with its echoed INT
//!   telemetry and the RTT of the one packet being timed, a PSN sequence error NAK, a
//!   retransmit timeout, a CNP, a probe response;
//! - a received request becomes the receiver-side call ([`on_rx_data`]: DCQCN's
//!   notification point, Rx-HPCC's NewINT) with its CE mark and telemetry;
//! - a data packet about to leave becomes the sender-side call ([`on_data_sent`]); a
//!   fast-start packet goes Not-ECT (LDCP draft) and an RTT sample starts when none runs;
//! - the CC's answer ([`cc::Actions`]) goes back into the QP's state ([`apply`]):
//!   timers to arm, a CNP owed, the window fed back (Rx-HPCC), a probe to send;
//! - the transport's window is the CC's, or for CC `none` the go-back-N backoff's
//!   ([`window`], [`crate::gbn_backoff`]).
//!
//! Pure and allocation-free (the engine's hot path calls it for every packet): time is
//! an argument and telemetry is converted on the stack. What the callers keep apart is
//! theirs: the engine's completion queues, fatal errors and counters, the simulator's
//! flows.

use cc::{
    AckEvent, Actions, CongestionControl, IntHop, NakEvent, RxDataEvent, SendEvent, TimerKind,
};
use rdma::transport::qp::QpEvent;
use rdma::transport::{Qp, TxPacket};
use rdma::wire::int::HopRecord;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};
use rdma::wire::{Ecn, RoceFrame};

use crate::gbn_backoff::GoBackNBackoff;
use sched::timer_wheel::TimerKind as WheelKind;

/// INT hop records handed to a CC at most (the NIC's INT container holds 8).
pub const MAX_HOPS: usize = 8;

/// The CC timers a QP keeps, by [`timer_index`]: the CC's name and the wheel's.
pub const CC_TIMERS: [(TimerKind, WheelKind); 4] = [
    (TimerKind::LdcpTick, WheelKind::LdcpTick),
    (TimerKind::DcqcnAlpha, WheelKind::DcqcnAlpha),
    (TimerKind::DcqcnRateIncrease, WheelKind::DcqcnRateIncrease),
    (TimerKind::ProbeTimeout, WheelKind::HpccProbe),
];

/// The slot of a CC timer kind in a QP's timer arrays ([`CC_TIMERS`]).
#[inline]
pub fn timer_index(k: TimerKind) -> usize {
    match k {
        TimerKind::LdcpTick => 0,
        TimerKind::DcqcnAlpha => 1,
        TimerKind::DcqcnRateIncrease => 2,
        TimerKind::ProbeTimeout => 3,
    }
}

/// One RTT measurement at a time: (LSN just past the timed packet, time it was sent).
pub type RttProbe = Option<(u32, u64)>;

/// The RTT of the packet being timed once an ACK covers it (the sample ends), else 0.
#[inline]
pub fn take_rtt_sample(probe: &mut RttProbe, acked_lsn: u32, now: u64) -> u64 {
    match *probe {
        Some((end, t)) if (acked_lsn.wrapping_sub(end) as i32) >= 0 => {
            *probe = None;
            now.saturating_sub(t)
        }
        _ => 0,
    }
}

/// INT hop records in the CC's units (queue length in bytes, link speed in bit/s);
/// how many were converted (at most [`MAX_HOPS`]).
#[inline]
pub fn telemetry(hops: &[HopRecord], out: &mut [IntHop; MAX_HOPS]) -> usize {
    for (d, h) in out.iter_mut().zip(hops) {
        *d = IntHop {
            switch_id: h.switch_id,
            port_id: h.port_id,
            ts_ns: h.ts_ns,
            tx_bytes: h.tx_bytes,
            qlen_bytes: u32::from(h.qlen_64b) * 64,
            link_bps: u64::from(h.link_100m) * 100_000_000,
        };
    }
    hops.len().min(MAX_HOPS)
}

/// The CC's answer to one transport event, with the hop records it echoed
/// (`hops`: empty for an event without telemetry). A PSN sequence error NAK and a
/// timeout end the RTT sample (the timed packet will be sent again); other NAKs, CE
/// marks, READ response ACKs and errors ask nothing of the CC.
#[inline]
pub fn on_event<C: CongestionControl>(
    cc: &mut C,
    probe: &mut RttProbe,
    ev: &QpEvent,
    hops: &[HopRecord],
    now: u64,
) -> Actions {
    let mut th = [IntHop::default(); MAX_HOPS];
    match *ev {
        QpEvent::Ack {
            acked_lsn,
            newly_acked,
            ce_count,
            window,
            ..
        } => {
            let rtt_ns = take_rtt_sample(probe, acked_lsn, now);
            let n = telemetry(hops, &mut th);
            cc.on_ack(&AckEvent {
                now_ns: now,
                acked_lsn: u64::from(acked_lsn),
                acked_bytes: newly_acked,
                acked_pkts: 1,
                rtt_ns,
                ecn_echo: ce_count > 0,
                telemetry: &th[..n],
                rx_window: window.map(u64::from),
            })
        }
        QpEvent::Nak {
            syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
            ..
        } => {
            *probe = None;
            cc.on_nak(&NakEvent {
                now_ns: now,
                expected_lsn: 0,
            })
        }
        QpEvent::Timeout { .. } => {
            *probe = None;
            cc.on_rto(now)
        }
        QpEvent::CnpReceived => cc.on_cnp(now),
        QpEvent::ProbeResponse { .. } => {
            let n = telemetry(hops, &mut th);
            cc.on_probe_response(now, &th[..n])
        }
        QpEvent::Nak { .. }
        | QpEvent::CeMarked { .. }
        | QpEvent::ReadRespAck { .. }
        | QpEvent::Error => Actions::NONE,
    }
}

/// Whether an event starts a go-back-N round (a PSN sequence error NAK or a retransmit
/// timeout), which shrinks the backoff window of a QP without CC.
#[inline]
pub fn is_go_back_n(ev: &QpEvent) -> bool {
    matches!(
        *ev,
        QpEvent::Nak {
            syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
            ..
        } | QpEvent::Timeout { .. }
    )
}

/// The receiver side of the CC for a request received: its CE mark, its LSN (CC
/// extension header) and its INT telemetry.
#[inline]
pub fn on_rx_data<C: CongestionControl>(cc: &mut C, f: &RoceFrame<'_>, now: u64) -> Actions {
    let mut hops = [HopRecord::default(); MAX_HOPS];
    let n = f.int.as_ref().map_or(0, |c| c.copy_hops(&mut hops));
    let mut th = [IntHop::default(); MAX_HOPS];
    let n = telemetry(&hops[..n.min(MAX_HOPS)], &mut th);
    cc.on_rx_data(&RxDataEvent {
        now_ns: now,
        lsn: f.ccext.map_or(0, |c| u64::from(c.lsn)),
        bytes: f.payload.len() as u32,
        ce: f.ip.ecn == Ecn::Ce,
        telemetry: &th[..n],
    })
}

/// Tells the CC of a data packet about to be sent; a fast-start packet goes Not-ECT
/// (LDCP draft) and an RTT sample starts when none is running. The answer is the
/// caller's to [`apply`].
#[inline]
pub fn on_data_sent<C: CongestionControl>(
    cc: &mut C,
    probe: &mut RttProbe,
    pkt: &mut TxPacket,
    now: u64,
) -> Actions {
    let op = pkt.repr.bth.opcode;
    let a = cc.on_send(&SendEvent {
        now_ns: now,
        lsn: u64::from(pkt.lsn),
        bytes: pkt.lsn_len,
        last_of_message: !op.is_first() && !op.is_middle(),
        retransmit: pkt.retransmit,
    });
    if a.fast_start {
        pkt.ecn = Ecn::NotEct;
    }
    if probe.is_none() && !pkt.retransmit {
        *probe = Some((pkt.lsn.wrapping_add(pkt.lsn_len), now));
    }
    a
}

/// Applies the CC's answer to a QP's state: the CC timers' deadlines (by
/// [`timer_index`], 0 = not armed), a CNP owed to the peer, the window fed back to it
/// (Rx-HPCC) and a probe to send (HPCC++ probe mode) on the QP, if it has one.
#[inline]
pub fn apply(a: Actions, qp: Option<&mut Qp>, cc_timers: &mut [u64; 4], cnp_pending: &mut bool) {
    for t in a.timers() {
        cc_timers[timer_index(t.kind)] = t.deadline_ns.max(1);
    }
    if a.send_cnp {
        *cnp_pending = true;
    }
    if let Some(qp) = qp {
        if let Some(w) = a.feedback_window {
            qp.set_ack_window(w.min(u64::from(u32::MAX)) as u32);
        }
        if a.send_probe {
            qp.send_probe();
        }
    }
}

/// The transport's send window in bytes: the CC's, or for a QP with a go-back-N
/// backoff (CC `none`) the smaller of that and the backoff's.
#[inline]
pub fn window<C: CongestionControl>(cc: &C, backoff: Option<&GoBackNBackoff>) -> u32 {
    let w = cc.window_bytes().min(u64::from(u32::MAX)) as u32;
    w.min(backoff.map_or(u32::MAX, GoBackNBackoff::window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cc::{AnyCc, CcKind, PathConfig};

    fn hpcc() -> AnyCc {
        CcKind::Hpcc.build(PathConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 10_000,
            mtu_bytes: 1024,
        })
    }

    #[test]
    fn timer_index_is_the_position_in_cc_timers() {
        for (i, &(k, _)) in CC_TIMERS.iter().enumerate() {
            assert_eq!(timer_index(k), i);
        }
    }

    #[test]
    fn rtt_sample_ends_only_when_an_ack_covers_the_timed_packet() {
        let mut p: RttProbe = Some((1000, 5_000));
        assert_eq!(take_rtt_sample(&mut p, 999, 9_000), 0);
        assert!(p.is_some());
        assert_eq!(take_rtt_sample(&mut p, 1000, 12_000), 7_000);
        assert!(p.is_none());
        // Across the 32-bit LSN wrap.
        let mut p: RttProbe = Some((10, 1));
        assert_eq!(take_rtt_sample(&mut p, u32::MAX - 5, 2), 0);
        assert_eq!(take_rtt_sample(&mut p, 20, 101), 100);
    }

    #[test]
    fn telemetry_converts_units_and_caps_at_max_hops() {
        let h = HopRecord {
            qlen_64b: 3,
            link_100m: 1000,
            ..HopRecord::default()
        };
        let mut out = [IntHop::default(); MAX_HOPS];
        assert_eq!(telemetry(&[h; 12], &mut out), MAX_HOPS);
        assert_eq!(out[7].qlen_bytes, 192);
        assert_eq!(out[7].link_bps, 100_000_000_000);
        assert_eq!(telemetry(&[h; 2], &mut out), 2);
    }

    #[test]
    fn go_back_n_rounds_are_sequence_error_naks_and_timeouts_only() {
        let seq = QpEvent::Nak {
            psn: 0,
            syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
        };
        assert!(is_go_back_n(&seq));
        assert!(!is_go_back_n(&QpEvent::CnpReceived));
        // A timeout ends the RTT sample; a CNP does not.
        let mut cc = hpcc();
        let mut p: RttProbe = Some((1, 1));
        on_event(&mut cc, &mut p, &QpEvent::CnpReceived, &[], 10);
        assert!(p.is_some());
        on_event(&mut cc, &mut p, &seq, &[], 10);
        assert!(p.is_none());
    }

    #[test]
    fn window_is_the_smaller_of_the_cc_and_the_backoff() {
        let cc = hpcc();
        let w = window(&cc, None);
        assert!(w > 0);
        let mut b = GoBackNBackoff::new(1024);
        b.on_go_back_n(8192);
        assert_eq!(window(&cc, Some(&b)), w.min(b.window()));
        assert!(window(&cc, Some(&b)) < w);
    }
}
