//! DCQCN as deployed in RoCE NICs (Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015, §3; the Mellanox/NVIDIA implementation; parameters
//! cross-checked with the HPCC authors' ns-3 simulator configuration).
//!
//! Rate-based: the window is unlimited and the pacing rate is the current rate `R_C`.
//! Both roles live in one instance: the reaction point (sender: CNP -> rate decrease,
//! timers and byte counter -> increase) and the notification point (receiver: CE-marked
//! data -> CNP, at most one per `cnp_interval_ns`).

use crate::types::{AckEvent, Actions, IntHop, PathConfig, TimerKind};
use crate::{CcKind, CongestionControl, NakEvent, RxDataEvent, SendEvent};

/// DCQCN parameters. Every default names its source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcqcnConfig {
    /// Line rate (initial and maximum rate).
    pub path: PathConfig,
    /// EWMA gain `g` of alpha. Default 1/256 (Zhu et al. §3.1; ns-3 `EWMA_GAIN
    /// 0.00390625`).
    pub g: f64,
    /// Initial alpha. Default 1 (Zhu et al.; Mellanox `initial_alpha_value` 1023/1023).
    pub alpha_init: f64,
    /// Alpha update period `K` (ns): alpha decays when no CNP arrived for K. Default
    /// 55 us (Zhu et al. §3.1).
    pub alpha_timer_ns: u64,
    /// Rate increase timer period `T` (ns). Default 300 us (Mellanox `rpg_time_reset`;
    /// HPCC ns-3 run script `t_inc=300` for "dcqcn").
    pub rate_timer_ns: u64,
    /// Byte counter `B` (bytes); 0 disables it. Default 32767 B (Mellanox
    /// `rpg_byte_reset`; Zhu et al. use 10 MB).
    pub byte_counter_bytes: u64,
    /// Fast-recovery stages `F`. Default 1 (Mellanox `rpg_threshold`; HPCC ns-3
    /// `FAST_RECOVERY_TIMES 1`; Zhu et al. use 5).
    pub fast_recovery_stages: u32,
    /// Additive increase `R_AI` (bit/s). Default 5 Mbit/s per 25 Gbit/s of line rate
    /// (20 Mbit/s at 100G; HPCC ns-3 run script `ai = 5 * bw / 25`; Mellanox
    /// `rpg_ai_rate` 5 Mbit/s).
    pub rate_ai_bps: u64,
    /// Hyper increase `R_HAI` (bit/s). Default 50 Mbit/s per 25 Gbit/s of line rate
    /// (HPCC ns-3 run script `hai = 50 * bw / 25`; Mellanox `rpg_hai_rate` 50 Mbit/s).
    pub rate_hai_bps: u64,
    /// Minimum rate (bit/s). Default 100 Mbit/s (our choice; ns-3 `MIN_RATE` is 100 Mbit/s
    /// in its sample config, 1 Gbit/s in the run script).
    pub min_rate_bps: u64,
    /// Minimum time between two rate decreases (ns). Default 4 us (HPCC ns-3
    /// `RATE_DECREASE_INTERVAL 4`, Mellanox `rate_reduce_monitor_period`).
    pub rate_decrease_interval_ns: u64,
    /// Notification point: at most one CNP per flow per this period (ns). Default 4 us
    /// (Mellanox NP `min_time_between_cnps`; Zhu et al. use N = 50 us).
    pub cnp_interval_ns: u64,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        Self::for_path(PathConfig::default())
    }
}

impl DcqcnConfig {
    /// Defaults for a given path.
    pub fn for_path(path: PathConfig) -> Self {
        let scale = path.line_rate_bps as f64 / 25e9;
        DcqcnConfig {
            path,
            g: 1.0 / 256.0,
            alpha_init: 1.0,
            alpha_timer_ns: 55_000,
            rate_timer_ns: 300_000,
            byte_counter_bytes: 32_767,
            fast_recovery_stages: 1,
            rate_ai_bps: (5e6 * scale) as u64,
            rate_hai_bps: (50e6 * scale) as u64,
            min_rate_bps: 100_000_000,
            rate_decrease_interval_ns: 4_000,
            cnp_interval_ns: 4_000,
        }
    }
}

/// DCQCN state for one QP.
#[derive(Clone, Debug)]
pub struct Dcqcn {
    /// Current rate `R_C` (bit/s).
    rc: f64,
    /// Target rate `R_T` (bit/s).
    rt: f64,
    alpha: f64,
    /// Rate-increase timer expirations since the last decrease (`T` counter).
    t_count: u32,
    /// Byte-counter expirations since the last decrease (`BC` counter).
    bc_count: u32,
    bytes_since: u64,
    /// A decrease has happened at least once (timers and byte counter run).
    recovering: bool,
    last_decrease_ns: Option<u64>,
    cnp_since_alpha_update: bool,
    alpha_deadline_ns: u64,
    rate_deadline_ns: u64,
    np_last_cnp_ns: Option<u64>,
    cfg: DcqcnConfig,
    line: f64,
}

impl Dcqcn {
    /// New flow at line rate.
    pub fn new(cfg: &DcqcnConfig) -> Self {
        let mut cfg = *cfg;
        cfg.path = cfg.path.sanitized();
        if !(cfg.g.is_finite() && cfg.g > 0.0 && cfg.g <= 1.0) {
            cfg.g = 1.0 / 256.0;
        }
        if !cfg.alpha_init.is_finite() {
            cfg.alpha_init = 1.0;
        }
        cfg.alpha_init = cfg.alpha_init.clamp(0.0, 1.0);
        cfg.alpha_timer_ns = cfg.alpha_timer_ns.max(1);
        cfg.rate_timer_ns = cfg.rate_timer_ns.max(1);
        let line = cfg.path.line_rate_bps as f64;
        cfg.min_rate_bps = cfg.min_rate_bps.clamp(1, cfg.path.line_rate_bps);
        Dcqcn {
            rc: line,
            rt: line,
            alpha: cfg.alpha_init,
            t_count: 0,
            bc_count: 0,
            bytes_since: 0,
            recovering: false,
            last_decrease_ns: None,
            cnp_since_alpha_update: false,
            alpha_deadline_ns: 0,
            rate_deadline_ns: 0,
            np_last_cnp_ns: None,
            cfg,
            line,
        }
    }

    /// `alpha`.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Target rate `R_T` (bit/s).
    pub fn target_rate_bps(&self) -> u64 {
        self.rt as u64
    }

    /// Rate increase (Zhu et al. §3.1, fig. "RP algorithm"): fast recovery while both
    /// counters are below F, additive increase when one of them reached F, hyper
    /// increase when both did. The counters count the events *before* this one, so the
    /// first F events after a cut are fast recovery (as the ns-3 and Mellanox RP do).
    fn increase(&mut self) {
        let f = self.cfg.fast_recovery_stages;
        let (hi, lo) = if self.t_count >= self.bc_count {
            (self.t_count, self.bc_count)
        } else {
            (self.bc_count, self.t_count)
        };
        if hi < f {
            // fast recovery: R_C = (R_T + R_C) / 2
        } else if lo < f {
            self.rt += self.cfg.rate_ai_bps as f64; // additive increase
        } else {
            let i = (lo - f + 1) as f64;
            self.rt += i * self.cfg.rate_hai_bps as f64; // hyper increase
        }
        self.rt = self.rt.min(self.line);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.line);
        if self.rc >= self.line {
            self.recovering = false;
        }
    }

    fn decrease(&mut self, now_ns: u64, a: &mut Actions) {
        // Zhu et al. §3.1: R_T = R_C; R_C = R_C (1 - alpha/2); T = BC = 0.
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.cfg.min_rate_bps as f64);
        self.t_count = 0;
        self.bc_count = 0;
        self.bytes_since = 0;
        self.recovering = true;
        self.last_decrease_ns = Some(now_ns);
        self.rate_deadline_ns = now_ns.saturating_add(self.cfg.rate_timer_ns);
        a.arm(self.rate_deadline_ns, TimerKind::DcqcnRateIncrease);
    }
}

impl CongestionControl for Dcqcn {
    fn on_send(&mut self, ev: &SendEvent) -> Actions {
        if self.recovering && self.cfg.byte_counter_bytes > 0 {
            self.bytes_since = self.bytes_since.saturating_add(ev.bytes as u64);
            if self.bytes_since >= self.cfg.byte_counter_bytes {
                self.bytes_since -= self.cfg.byte_counter_bytes;
                self.increase();
                self.bc_count = self.bc_count.saturating_add(1);
            }
        }
        Actions::NONE
    }

    fn on_ack(&mut self, _ev: &AckEvent<'_>) -> Actions {
        Actions::NONE
    }

    fn on_nak(&mut self, _ev: &NakEvent) -> Actions {
        Actions::NONE
    }

    fn on_cnp(&mut self, now_ns: u64) -> Actions {
        let mut a = Actions::NONE;
        let may_decrease = match self.last_decrease_ns {
            None => true,
            Some(t) => now_ns.saturating_sub(t) >= self.cfg.rate_decrease_interval_ns,
        };
        if may_decrease {
            self.decrease(now_ns, &mut a);
        }
        // alpha = (1 - g) alpha + g on CNP (after the cut, which uses the old alpha).
        self.alpha = (1.0 - self.cfg.g) * self.alpha + self.cfg.g;
        self.cnp_since_alpha_update = true;
        if self.alpha_deadline_ns == 0 {
            self.alpha_deadline_ns = now_ns.saturating_add(self.cfg.alpha_timer_ns).max(1);
            a.arm(self.alpha_deadline_ns, TimerKind::DcqcnAlpha);
        }
        a
    }

    fn on_rto(&mut self, _now_ns: u64) -> Actions {
        Actions::NONE
    }

    fn on_timer(&mut self, now_ns: u64, kind: TimerKind) -> Actions {
        let mut a = Actions::NONE;
        match kind {
            TimerKind::DcqcnAlpha => {
                if self.alpha_deadline_ns == 0 || now_ns < self.alpha_deadline_ns {
                    return a;
                }
                if !self.cnp_since_alpha_update {
                    // No CNP during K: alpha = (1 - g) alpha.
                    self.alpha *= 1.0 - self.cfg.g;
                }
                self.cnp_since_alpha_update = false;
                if self.recovering || self.alpha > 1e-3 {
                    self.alpha_deadline_ns = now_ns.saturating_add(self.cfg.alpha_timer_ns);
                    a.arm(self.alpha_deadline_ns, TimerKind::DcqcnAlpha);
                } else {
                    self.alpha_deadline_ns = 0;
                }
            }
            TimerKind::DcqcnRateIncrease => {
                if !self.recovering || now_ns < self.rate_deadline_ns {
                    return a;
                }
                self.increase();
                self.t_count = self.t_count.saturating_add(1);
                if self.recovering {
                    self.rate_deadline_ns = now_ns.saturating_add(self.cfg.rate_timer_ns);
                    a.arm(self.rate_deadline_ns, TimerKind::DcqcnRateIncrease);
                }
            }
            _ => {}
        }
        a
    }

    fn on_probe_response(&mut self, _now_ns: u64, _telemetry: &[IntHop]) -> Actions {
        Actions::NONE
    }

    fn on_rx_data(&mut self, ev: &RxDataEvent<'_>) -> Actions {
        let mut a = Actions::NONE;
        if ev.ce {
            let due = match self.np_last_cnp_ns {
                None => true,
                Some(t) => ev.now_ns.saturating_sub(t) >= self.cfg.cnp_interval_ns,
            };
            if due {
                self.np_last_cnp_ns = Some(ev.now_ns);
                a.send_cnp = true;
            }
        }
        a
    }

    fn window_bytes(&self) -> u64 {
        u64::MAX
    }

    fn rate_bps(&self) -> u64 {
        self.rc as u64
    }

    fn kind(&self) -> CcKind {
        CcKind::Dcqcn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G40: u64 = 40_000_000_000;

    fn cfg() -> DcqcnConfig {
        let mut c = DcqcnConfig::for_path(PathConfig {
            line_rate_bps: G40,
            base_rtt_ns: 10_000,
            mtu_bytes: 1000,
        });
        c.rate_ai_bps = 40_000_000;
        c.rate_hai_bps = 400_000_000;
        c.byte_counter_bytes = 100_000;
        c.fast_recovery_stages = 5; // Zhu et al.'s F
        c.cnp_interval_ns = 50_000; // Zhu et al.'s N
        c
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn defaults_scale_with_line_rate() {
        let c = DcqcnConfig::default(); // 100G
        assert_eq!(c.rate_ai_bps, 20_000_000);
        assert_eq!(c.rate_hai_bps, 200_000_000);
        assert!(close(c.g, 1.0 / 256.0));
    }

    #[test]
    fn cnp_cuts_rate_with_old_alpha_then_raises_alpha() {
        let mut d = Dcqcn::new(&cfg());
        assert_eq!(d.rate_bps(), G40);
        let a = d.on_cnp(1_000);
        // R_T = R_C = 40G; R_C = 40G * (1 - 1/2) = 20G (alpha = 1)
        assert_eq!(d.rate_bps(), 20_000_000_000);
        assert_eq!(d.target_rate_bps(), G40);
        // alpha = (1 - g) * 1 + g = 1
        assert!(close(d.alpha(), 1.0));
        let kinds: Vec<_> = a.timers().map(|t| (t.kind, t.deadline_ns)).collect();
        assert!(kinds.contains(&(TimerKind::DcqcnRateIncrease, 301_000)));
        assert!(kinds.contains(&(TimerKind::DcqcnAlpha, 56_000)));
        // a second CNP within 4 us does not cut again
        d.on_cnp(3_000);
        assert_eq!(d.rate_bps(), 20_000_000_000);
        // after 4 us it does: 20G * (1 - 1/2)
        d.on_cnp(5_000);
        assert_eq!(d.rate_bps(), 10_000_000_000);
        assert_eq!(d.target_rate_bps(), 20_000_000_000);
    }

    #[test]
    fn alpha_decays_without_cnp() {
        let mut d = Dcqcn::new(&cfg());
        d.on_cnp(0);
        // first alpha period had a CNP: no decay
        d.on_timer(55_000, TimerKind::DcqcnAlpha);
        assert!(close(d.alpha(), 1.0));
        // then alpha = (1 - g) alpha per quiet period
        d.on_timer(110_000, TimerKind::DcqcnAlpha);
        assert!(close(d.alpha(), 255.0 / 256.0));
        d.on_timer(165_000, TimerKind::DcqcnAlpha);
        assert!(close(d.alpha(), (255.0f64 / 256.0).powi(2)));
        // a stale expiry is ignored
        d.on_timer(165_001, TimerKind::DcqcnAlpha);
        let alpha = (255.0f64 / 256.0).powi(2);
        assert!(close(d.alpha(), alpha));
        // the next cut uses the decayed alpha: R_C = 20G * (1 - alpha/2), then
        // alpha = (1 - g) alpha + g
        d.on_cnp(200_000);
        assert!(close(d.rate_bps() as f64, 20e9 * (1.0 - alpha / 2.0)));
        assert!(close(d.alpha(), alpha * 255.0 / 256.0 + 1.0 / 256.0));
    }

    #[test]
    fn fast_recovery_additive_and_hyper_increase() {
        let mut d = Dcqcn::new(&cfg());
        d.on_cnp(0); // R_C = 20G, R_T = 40G
        d.on_cnp(4_000); // R_T = 20G, R_C = 20G * (1 - alpha/2) = 10G (alpha = 1)
        assert_eq!(d.rate_bps(), 10_000_000_000);
        let rt = 20e9;
        let mut rc = 10e9;
        let mut t = 4_000;
        // F = 5 timer events of fast recovery (T = 0..4 < F): R_C = (R_T + R_C) / 2
        for _ in 0..5 {
            t += 300_000;
            d.on_timer(t, TimerKind::DcqcnRateIncrease);
            rc = (rt + rc) / 2.0;
            assert!(close(d.rate_bps() as f64, rc), "{} {rc}", d.rate_bps());
            assert!(close(d.target_rate_bps() as f64, rt));
        }
        // 6th event: T = 5 = F, BC = 0 < F: additive increase R_T += R_AI
        t += 300_000;
        d.on_timer(t, TimerKind::DcqcnRateIncrease);
        let rt = rt + 40e6;
        rc = (rt + rc) / 2.0;
        assert!(close(d.target_rate_bps() as f64, rt));
        assert!(close(d.rate_bps() as f64, rc));
        // byte counter B = 100 kB: events with BC = 0..4 are additive (T >= F),
        // the one with BC = 5 is hyper, i = min(T, BC) - F + 1 = 1: R_T += R_HAI
        for k in 0..600u64 {
            d.on_send(&SendEvent {
                now_ns: t,
                lsn: k * 1000,
                bytes: 1000,
                ..Default::default()
            });
        }
        let rt_expected = rt + 5.0 * 40e6 + 400e6;
        assert!(
            close(d.target_rate_bps() as f64, rt_expected),
            "{} {rt_expected}",
            d.target_rate_bps()
        );
    }

    #[test]
    fn notification_point_rate_limits_cnps() {
        let mut d = Dcqcn::new(&cfg());
        let rx = |t, ce| RxDataEvent {
            now_ns: t,
            ce,
            ..Default::default()
        };
        assert!(!d.on_rx_data(&rx(0, false)).send_cnp);
        assert!(d.on_rx_data(&rx(10, true)).send_cnp);
        assert!(
            !d.on_rx_data(&rx(20_000, true)).send_cnp,
            "within N = 50 us"
        );
        assert!(d.on_rx_data(&rx(50_010, true)).send_cnp);
    }

    #[test]
    fn rate_never_below_min_nor_above_line() {
        let mut d = Dcqcn::new(&cfg());
        for k in 0..10_000u64 {
            d.on_cnp(k * 5_000);
        }
        assert_eq!(d.rate_bps(), 100_000_000);
        assert_eq!(d.window_bytes(), u64::MAX);
    }
}
