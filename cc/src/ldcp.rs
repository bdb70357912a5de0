//! LDCP (004): per-ACK window adjustment (PAWA, §2.2 eq. 1 and eq. 2), window below
//! one packet ticked by a timer of RTT/cw (§2.2), zero-RTT fast start (§2.3, §3.1).
//!
//! The window `cw` is kept in packets (`f64`); [`CongestionControl::window_bytes`]
//! converts it with the path MTU. The scheduler sends when
//! `snd_nxt - snd_una < window_bytes()` (LSN bytes).

use crate::types::{AckEvent, Actions, IntHop, PathConfig, TimerKind};
use crate::{CcKind, CongestionControl, NakEvent, RxDataEvent, SendEvent};

/// LDCP parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LdcpConfig {
    /// Line rate, base RTT and MTU (packet size in LSN bytes).
    pub path: PathConfig,
    /// Additive step `alpha` of eq. 1 (cw += alpha/cw per unmarked ACK). The draft only
    /// bounds it (0 < alpha <= 1); default 1 (one packet per RTT, our choice).
    pub alpha: f64,
    /// Decrease `beta` of eq. 1 (cw -= beta per marked ACK), 0 < beta <= 1; default 0.5
    /// (our choice).
    pub beta: f64,
    /// `gamma`: increase step and minimum window below one packet (§2.2: typical 1/4,
    /// 1/8, 1/16); default 1/8.
    pub gamma: f64,
    /// `eta`: multiplicative decrease below one packet; the draft chooses 1/2 (§2.2).
    pub eta: f64,
    /// Zero-RTT fast start (§2.3). Default on.
    pub fast_start: bool,
    /// Initial window in bytes; `None` = BDP at line rate (§2.3, §3.1 "IW is set to
    /// BDP").
    pub iw_bytes: Option<u64>,
    /// Upper bound of cw in packets; `None` = 4 x BDP (keeps cw finite when the path
    /// never marks).
    pub max_cw_pkts: Option<f64>,
}

impl Default for LdcpConfig {
    fn default() -> Self {
        Self::for_path(PathConfig::default())
    }
}

impl LdcpConfig {
    /// Defaults for a given path.
    pub fn for_path(path: PathConfig) -> Self {
        LdcpConfig {
            path,
            alpha: 1.0,
            beta: 0.5,
            gamma: 0.125,
            eta: 0.5,
            fast_start: true,
            iw_bytes: None,
            max_cw_pkts: None,
        }
    }
}

/// Stage of an LDCP flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LdcpStage {
    /// First RTT(s): window = IW, first-IW packets Not-ECT except the last (§2.3, §3.1).
    FastStart,
    /// Congestion avoidance with PAWA (§2.2).
    Stable,
}

/// LDCP sender for one QP.
#[derive(Clone, Debug)]
pub struct Ldcp {
    cw: f64,
    stage: LdcpStage,
    started: bool,
    /// LSN where the fast-start IW ends (first LSN + IW).
    iw_end: u64,
    iw_start: u64,
    snd_nxt: u64,
    snd_una: u64,
    srtt_ns: u64,
    /// cw < 1: one packet may be sent (granted by the RTT/cw tick).
    tick_credit: bool,
    /// Deadline of the armed tick, 0 = none.
    tick_deadline_ns: u64,
    // configuration
    alpha: f64,
    beta: f64,
    gamma: f64,
    eta: f64,
    mtu: u64,
    iw_bytes: u64,
    max_cw: f64,
    line_rate_bps: u64,
}

impl Ldcp {
    /// New flow: fast start when enabled, else stable stage with cw = IW packets.
    pub fn new(cfg: &LdcpConfig) -> Self {
        let path = cfg.path.sanitized();
        let mtu = path.mtu_bytes as u64;
        let iw_bytes = cfg.iw_bytes.unwrap_or_else(|| path.bdp_bytes()).max(mtu);
        let bdp_pkts = path.bdp_bytes() as f64 / mtu as f64;
        let gamma = finite_in(cfg.gamma, 1e-6, 1.0, 0.125);
        let max_cw = cfg
            .max_cw_pkts
            .filter(|m| m.is_finite() && *m >= 1.0)
            .unwrap_or(4.0 * bdp_pkts)
            .max(1.0);
        Ldcp {
            cw: (iw_bytes as f64 / mtu as f64).clamp(gamma, max_cw),
            stage: if cfg.fast_start {
                LdcpStage::FastStart
            } else {
                LdcpStage::Stable
            },
            started: false,
            iw_end: iw_bytes,
            iw_start: 0,
            snd_nxt: 0,
            snd_una: 0,
            srtt_ns: path.base_rtt_ns,
            tick_credit: false,
            tick_deadline_ns: 0,
            alpha: finite_in(cfg.alpha, 1e-9, 1.0, 1.0),
            beta: finite_in(cfg.beta, 1e-9, 1.0, 0.5),
            gamma,
            eta: finite_in(cfg.eta, 1e-6, 0.999, 0.5),
            mtu,
            iw_bytes,
            max_cw,
            line_rate_bps: path.line_rate_bps,
        }
    }

    /// Congestion window in packets.
    pub fn cw(&self) -> f64 {
        self.cw
    }

    /// Current stage.
    pub fn stage(&self) -> LdcpStage {
        self.stage
    }

    /// Smoothed RTT used for the sub-packet tick (ns).
    pub fn srtt_ns(&self) -> u64 {
        self.srtt_ns
    }

    /// PAWA for an ACK covering `n` packets (004 §2.2 eq. 1 for n = 1, eq. 2 for
    /// delayed ACKs), with the sub-packet rule when cw < 1.
    ///
    /// Boundary (our reading of §2.2): eq. 1/2 apply while cw >= 1 and never take cw
    /// below 1; a mark at cw <= 1 (i.e. at the floor of eq. 1) applies
    /// `cw = max(gamma, eta*cw)`; an unmarked ACK at cw < 1 adds `gamma`.
    pub fn pawa(&mut self, ece: bool, n: u32) {
        let n = n.max(1) as f64;
        let cw = self.cw;
        self.cw = if !ece {
            if cw >= 1.0 {
                cw + n * self.alpha / cw // eq. 1 / eq. 2, ECE = 0
            } else {
                cw + n * self.gamma // sub-packet: cw = cw + gamma
            }
        } else if cw > 1.0 {
            (cw - n * self.beta).max(1.0) // eq. 1 / eq. 2, ECE = 1
        } else {
            // sub-packet: cw = max{gamma, eta * cw}, once per marked packet
            (cw * self.eta.powf(n)).max(self.gamma)
        };
        if !self.cw.is_finite() {
            self.cw = self.gamma;
        }
        self.cw = self.cw.clamp(self.gamma, self.max_cw);
    }

    fn inflight(&self) -> u64 {
        self.snd_nxt.saturating_sub(self.snd_una)
    }

    fn tick_period_ns(&self) -> u64 {
        // RTT / cw (004 §2.2), cw >= gamma > 0.
        ((self.srtt_ns.max(1) as f64) / self.cw).min(1e15).round() as u64
    }

    fn maybe_arm_tick(&mut self, now_ns: u64, a: &mut Actions) {
        if self.stage == LdcpStage::Stable && self.cw < 1.0 && self.tick_deadline_ns == 0 {
            self.tick_deadline_ns = now_ns.saturating_add(self.tick_period_ns()).max(1);
            a.arm(self.tick_deadline_ns, TimerKind::LdcpTick);
        }
    }

    fn enter_stable(&mut self, cw_pkts: f64) {
        self.stage = LdcpStage::Stable;
        self.cw = cw_pkts.clamp(1.0, self.max_cw);
    }
}

fn finite_in(v: f64, lo: f64, hi: f64, default: f64) -> f64 {
    if v.is_finite() {
        v.clamp(lo, hi)
    } else {
        default
    }
}

impl CongestionControl for Ldcp {
    fn on_send(&mut self, ev: &SendEvent) -> Actions {
        let mut a = Actions::NONE;
        if !self.started {
            self.started = true;
            self.iw_start = ev.lsn;
            self.iw_end = ev.lsn.saturating_add(self.iw_bytes);
            self.snd_una = ev.lsn;
            self.snd_nxt = ev.lsn;
        }
        let end = ev.lsn.saturating_add(ev.bytes as u64);
        if self.stage == LdcpStage::FastStart && !ev.retransmit && end <= self.iw_end {
            // §3.1: first-RTT packets Not-ECT, except the IW-th packet or the last
            // packet of a message shorter than the IW.
            let last_of_iw = end.saturating_add(self.mtu) > self.iw_end;
            a.fast_start = !(last_of_iw || ev.last_of_message);
        }
        self.snd_nxt = self.snd_nxt.max(end);
        if self.cw < 1.0 {
            self.tick_credit = false;
        }
        a
    }

    fn on_ack(&mut self, ev: &AckEvent<'_>) -> Actions {
        let mut a = Actions::NONE;
        if ev.rtt_ns > 0 {
            // RFC 6298-style EWMA with gain 1/8, used only for the RTT/cw tick.
            // Written without `7 * srtt` so that absurd samples cannot overflow.
            self.srtt_ns = if self.srtt_ns == 0 {
                ev.rtt_ns
            } else {
                self.srtt_ns - self.srtt_ns / 8 + ev.rtt_ns / 8
            };
        }
        self.snd_una = self.snd_una.max(ev.acked_lsn);
        self.snd_nxt = self.snd_nxt.max(self.snd_una);
        match self.stage {
            LdcpStage::FastStart => {
                if self.started && self.snd_una >= self.iw_end {
                    // §3.1 condition 2: a full IW acknowledged -> cw = BDP (= IW).
                    self.enter_stable(self.iw_bytes as f64 / self.mtu as f64);
                }
            }
            LdcpStage::Stable => {
                let n = if ev.acked_pkts > 0 {
                    ev.acked_pkts
                } else {
                    (ev.acked_bytes as u64).div_ceil(self.mtu).max(1) as u32
                };
                self.pawa(ev.ecn_echo, n);
                if self.cw >= 1.0 {
                    self.tick_credit = false;
                }
                self.maybe_arm_tick(ev.now_ns, &mut a);
            }
        }
        a
    }

    fn on_nak(&mut self, ev: &NakEvent) -> Actions {
        let mut a = Actions::NONE;
        self.snd_una = self.snd_una.max(ev.expected_lsn);
        match self.stage {
            LdcpStage::FastStart => {
                // §3.1 condition 1: loss in fast start -> cw = packets acknowledged
                // before the loss (at least 1); go-back-N is the transport's job.
                let acked = self.snd_una.saturating_sub(self.iw_start) / self.mtu;
                self.enter_stable(acked as f64);
            }
            LdcpStage::Stable => {
                // Loss in the stable stage (only on buffer overflow): treated as one
                // ECE (our choice, the draft does not specify it).
                self.pawa(true, 1);
                self.maybe_arm_tick(ev.now_ns, &mut a);
            }
        }
        a
    }

    fn on_cnp(&mut self, now_ns: u64) -> Actions {
        // 004 §3.2 (commercial NIC form): window decreased by beta upon every CNP.
        let mut a = Actions::NONE;
        if self.stage == LdcpStage::Stable {
            self.pawa(true, 1);
            self.maybe_arm_tick(now_ns, &mut a);
        }
        a
    }

    fn on_rto(&mut self, now_ns: u64) -> Actions {
        let mut a = Actions::NONE;
        if self.stage == LdcpStage::FastStart {
            let acked = self.snd_una.saturating_sub(self.iw_start) / self.mtu;
            self.enter_stable(acked as f64);
        } else {
            self.cw = self.cw.min(1.0);
            self.maybe_arm_tick(now_ns, &mut a);
        }
        a
    }

    fn on_timer(&mut self, now_ns: u64, kind: TimerKind) -> Actions {
        let mut a = Actions::NONE;
        if kind != TimerKind::LdcpTick
            || self.tick_deadline_ns == 0
            || now_ns < self.tick_deadline_ns
        {
            return a; // not ours, or stale
        }
        self.tick_deadline_ns = 0;
        if self.cw < 1.0 {
            // §2.2: a flow with cw < 1 is ticked out once per RTT/cw.
            self.tick_credit = true;
            self.maybe_arm_tick(now_ns, &mut a);
        }
        a
    }

    fn on_probe_response(&mut self, _now_ns: u64, _telemetry: &[IntHop]) -> Actions {
        Actions::NONE
    }

    fn on_rx_data(&mut self, _ev: &RxDataEvent<'_>) -> Actions {
        // The receiver echoes CE per packet (or per ACK with delayed ACK); nothing to
        // compute here.
        Actions::NONE
    }

    fn window_bytes(&self) -> u64 {
        match self.stage {
            LdcpStage::FastStart => self.iw_bytes,
            LdcpStage::Stable if self.cw >= 1.0 => (self.cw * self.mtu as f64) as u64,
            LdcpStage::Stable => {
                if self.tick_credit {
                    self.inflight().saturating_add(self.mtu)
                } else {
                    self.inflight()
                }
            }
        }
    }

    fn rate_bps(&self) -> u64 {
        // LDCP is window-based and ACK-clocked (§2.2); below one packet the RTT/cw tick
        // does the pacing. The scheduler paces at line rate.
        self.line_rate_bps
    }

    fn kind(&self) -> CcKind {
        CcKind::Ldcp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 Gbit/s, T = 8 us, MTU 1000: BDP = 100 000 B = 100 packets.
    fn cfg() -> LdcpConfig {
        LdcpConfig::for_path(PathConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 8_000,
            mtu_bytes: 1000,
        })
    }

    fn stable(cw: f64) -> Ldcp {
        let mut c = cfg();
        c.fast_start = false;
        let mut l = Ldcp::new(&c);
        l.cw = cw;
        l
    }

    fn ack(lsn: u64, ece: bool, n: u32) -> AckEvent<'static> {
        AckEvent {
            now_ns: 1_000,
            acked_lsn: lsn,
            acked_bytes: n * 1000,
            acked_pkts: n,
            ecn_echo: ece,
            ..Default::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn pawa_eq1_per_ack() {
        let mut l = stable(4.0);
        // 004 §2.2 eq. 1, ECE = 0: cw = cw + alpha/cw = 4 + 1/4
        l.on_ack(&ack(1000, false, 1));
        assert!(close(l.cw(), 4.25), "{}", l.cw());
        // ECE = 1: cw = cw - beta = 4.25 - 0.5
        l.on_ack(&ack(2000, true, 1));
        assert!(close(l.cw(), 3.75), "{}", l.cw());
        assert_eq!(l.window_bytes(), 3750);
    }

    #[test]
    fn pawa_eq2_delayed_ack() {
        let mut l = stable(5.0);
        // eq. 2, ECE = 0 with n = 3: cw = 5 + 3 * 1/5 = 5.6
        l.on_ack(&ack(3000, false, 3));
        assert!(close(l.cw(), 5.6), "{}", l.cw());
        // eq. 2, ECE = 1 with n = 2: cw = 5.6 - 2 * 0.5 = 4.6
        l.on_ack(&ack(5000, true, 2));
        assert!(close(l.cw(), 4.6), "{}", l.cw());
        // n derived from bytes when the NIC does not count packets: 2500 B -> 3 packets
        let mut ev = ack(8000, true, 0);
        ev.acked_bytes = 2500;
        l.on_ack(&ev);
        assert!(close(l.cw(), 3.1), "{}", l.cw());
    }

    #[test]
    fn sub_packet_window_rules_and_tick() {
        let mut l = stable(1.2);
        // eq. 1 never goes below 1
        l.on_ack(&ack(1000, true, 1));
        assert!(close(l.cw(), 1.0));
        // at cw <= 1 a mark applies cw = max{gamma, eta * cw} = 0.5 and arms RTT/cw
        let a = l.on_ack(&ack(2000, true, 1));
        assert!(close(l.cw(), 0.5));
        let t = a.timers().next().expect("tick armed");
        assert_eq!(t.kind, TimerKind::LdcpTick);
        // srtt = base RTT 8 us (no sample yet): RTT / cw = 16 us
        assert_eq!(t.deadline_ns, 1_000 + 16_000);
        // 0.5 -> 0.25 -> 0.125 -> gamma floor 0.125
        l.on_ack(&ack(3000, true, 1));
        l.on_ack(&ack(4000, true, 1));
        l.on_ack(&ack(5000, true, 1));
        assert!(close(l.cw(), 0.125), "{}", l.cw());
        // ECE = 0 below one packet: cw = cw + gamma
        l.on_ack(&ack(6000, false, 1));
        assert!(close(l.cw(), 0.25), "{}", l.cw());
        // no credit before the tick: window = inflight, i.e. blocked
        l.on_send(&SendEvent {
            now_ns: 2_000,
            lsn: 6000,
            bytes: 1000,
            ..Default::default()
        });
        assert_eq!(l.window_bytes(), 1000);
        // stale expiry ignored; the real one grants exactly one packet
        assert_eq!(l.on_timer(2_000, TimerKind::LdcpTick), Actions::NONE);
        let a = l.on_timer(17_000, TimerKind::LdcpTick);
        assert_eq!(l.window_bytes(), 2000);
        // re-armed with RTT/cw = 8 us / 0.25 = 32 us
        assert_eq!(a.timers().next().unwrap().deadline_ns, 17_000 + 32_000);
        l.on_send(&SendEvent {
            now_ns: 17_000,
            lsn: 7000,
            bytes: 1000,
            ..Default::default()
        });
        assert_eq!(l.window_bytes(), 2000, "credit consumed: blocked again");
        // unmarked ACKs grow it back above 1: eq. 1 applies again
        for k in 0..6 {
            l.on_ack(&ack(8000 + k, false, 1));
        }
        assert!(close(l.cw(), 1.0), "{}", l.cw());
        l.on_ack(&ack(9000, false, 1));
        assert!(close(l.cw(), 2.0), "{}", l.cw());
    }

    fn send(l: &mut Ldcp, lsn: u64, last: bool) -> bool {
        l.on_send(&SendEvent {
            now_ns: 0,
            lsn,
            bytes: 1000,
            last_of_message: last,
            retransmit: false,
        })
        .fast_start
    }

    #[test]
    fn fast_start_marks_and_full_iw_acked() {
        let mut l = Ldcp::new(&cfg());
        assert_eq!(l.stage(), LdcpStage::FastStart);
        assert_eq!(l.window_bytes(), 100_000, "IW = BDP (§2.3)");
        // §3.1: IW packets 1..99 Not-ECT, the IW-th (100th) ECT, later ones ECT
        for i in 0..99 {
            assert!(send(&mut l, i * 1000, false), "packet {i}");
        }
        assert!(!send(&mut l, 99_000, false), "IW-th packet is ECT");
        assert!(!send(&mut l, 100_000, false), "beyond IW: ECT");
        // ECE during fast start does not change the window
        l.on_ack(&ack(50_000, true, 1));
        assert_eq!(l.stage(), LdcpStage::FastStart);
        // a full IW acknowledged: stable with cw = BDP = 100 packets
        l.on_ack(&ack(100_000, false, 1));
        assert_eq!(l.stage(), LdcpStage::Stable);
        assert!(close(l.cw(), 100.0));
        assert_eq!(l.window_bytes(), 100_000);
    }

    #[test]
    fn fast_start_short_message_last_packet_is_ect() {
        let mut l = Ldcp::new(&cfg());
        assert!(send(&mut l, 0, false));
        assert!(
            !send(&mut l, 1000, true),
            "last packet of a message < IW is ECT"
        );
    }

    #[test]
    fn fast_start_loss_sets_cw_to_acked_packets() {
        let mut l = Ldcp::new(&cfg());
        for i in 0..100 {
            send(&mut l, i * 1000, false);
        }
        l.on_ack(&ack(37_000, false, 1));
        // §3.1 condition 1: loss -> cw = packets acknowledged before it (37)
        l.on_nak(&NakEvent {
            now_ns: 5_000,
            expected_lsn: 37_000,
        });
        assert_eq!(l.stage(), LdcpStage::Stable);
        assert!(close(l.cw(), 37.0), "{}", l.cw());
        // retransmissions are never fast-start packets
        let a = l.on_send(&SendEvent {
            lsn: 37_000,
            bytes: 1000,
            retransmit: true,
            ..Default::default()
        });
        assert!(!a.fast_start);
    }

    #[test]
    fn cnp_decreases_by_beta() {
        // 004 §3.2: MD by beta on every CNP
        let mut l = stable(3.0);
        l.on_cnp(0);
        assert!(close(l.cw(), 2.5));
    }
}
