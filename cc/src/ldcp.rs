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
        ((self.srtt_ns.max(1) as f64) / self.cw).min(1e15) as u64
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
            self.srtt_ns = if self.srtt_ns == 0 {
                ev.rtt_ns
            } else {
                (self.srtt_ns * 7 + ev.rtt_ns) / 8
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
