//! Rx-HPCC: receiver-based HPCC++ (000 §6.3.2, 003 §6.2).
//!
//! The receiver runs MeasureInflight/ComputeWind on the telemetry of the data packets
//! (`int.L`) and feeds the window back in an ACK at most once per `T` (NewINT, 000
//! fig. 8, lines 28-34). The sender applies the fed-back window and paces at `W/T`.
//! One [`RxHpcc`] per QP holds both roles (a QP can be both sender and receiver).

use crate::hpcc::{HpccConfig, HpccCore};
use crate::types::{window_to_bps, AckEvent, Actions, IntHop};
use crate::{CcKind, CongestionControl, RxDataEvent, SendEvent};

/// Rx-HPCC uses the HPCC++ parameters; `T` is also the feedback period.
pub type RxHpccConfig = HpccConfig;

/// Receiver-based HPCC++ for one QP.
#[derive(Clone, Debug)]
pub struct RxHpcc {
    /// Receiver role: the control law fed by `int.L`.
    rx: HpccCore,
    /// `lastUpdateTime` (line 29/32); `None` before the first feedback.
    last_update_ns: Option<u64>,
    t_ns: u64,
    /// Sender role: the window last fed back (bytes), clamped like the core's.
    tx_window: f64,
    tx_w_min: f64,
    tx_w_max: f64,
    t_ns_f: f64,
    line_bps: f64,
}

impl RxHpcc {
    /// New instance; the sender starts at `W_init` (line rate by default).
    pub fn new(cfg: &RxHpccConfig) -> Self {
        let rx = HpccCore::new(cfg);
        let path = cfg.path.sanitized();
        let w_max = path.bdp_bytes() as f64;
        let w_min = (cfg.min_rate_bps as f64 * path.base_rtt_ns as f64 / 8.0e9).clamp(1.0, w_max);
        RxHpcc {
            tx_window: rx.w,
            rx,
            last_update_ns: None,
            t_ns: path.base_rtt_ns,
            tx_w_min: w_min,
            tx_w_max: w_max,
            t_ns_f: path.base_rtt_ns as f64,
            line_bps: path.line_rate_bps as f64,
        }
    }

    /// Receiver-side control-law state.
    pub fn receiver_core(&self) -> &HpccCore {
        &self.rx
    }

    /// 000 fig. 8: NewINT. Returns the window to feed back (line 31) when `T` has passed
    /// since the last feedback (line 29: `now > lastUpdateTime + T`).
    pub fn new_int(&mut self, now_ns: u64, hops: &[IntHop]) -> Option<u64> {
        let due = match self.last_update_ns {
            None => true,
            Some(last) => now_ns > last.saturating_add(self.t_ns),
        };
        let u = self.rx.measure_inflight(hops)?;
        if due {
            let w = self.rx.compute_wind(u, true); // line 30
            self.last_update_ns = Some(now_ns); // line 32
            Some(w as u64) // line 31
        } else {
            self.rx.compute_wind(u, false); // line 34
            None
        }
    }
}

impl CongestionControl for RxHpcc {
    fn on_send(&mut self, _ev: &SendEvent) -> Actions {
        Actions::NONE
    }

    fn on_ack(&mut self, ev: &AckEvent<'_>) -> Actions {
        if let Some(w) = ev.rx_window {
            self.tx_window = (w as f64).clamp(self.tx_w_min, self.tx_w_max);
        }
        Actions::NONE
    }

    fn on_rx_data(&mut self, ev: &RxDataEvent<'_>) -> Actions {
        let mut a = Actions::NONE;
        if !ev.telemetry.is_empty() {
            a.feedback_window = self.new_int(ev.now_ns, ev.telemetry);
        }
        a
    }

    fn window_bytes(&self) -> u64 {
        self.tx_window as u64
    }

    fn rate_bps(&self) -> u64 {
        window_to_bps(self.tx_window, self.t_ns_f)
            .min(self.line_bps)
            .max(1.0) as u64
    }

    fn kind(&self) -> CcKind {
        CcKind::RxHpcc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::PathConfig;

    const G100: u64 = 100_000_000_000;

    fn hop(ts: u32, tx: u32) -> IntHop {
        IntHop {
            switch_id: 3,
            port_id: 2,
            ts_ns: ts,
            tx_bytes: tx,
            qlen_bytes: 0,
            link_bps: G100,
        }
    }

    fn rx(now: u64, h: &[IntHop]) -> RxDataEvent<'_> {
        RxDataEvent {
            now_ns: now,
            bytes: 1000,
            telemetry: h,
            ..Default::default()
        }
    }

    #[test]
    fn new_int_feeds_back_at_most_once_per_t() {
        // T = 10 us, BDP 125 000 B, W_ai = 390.625
        let cfg = HpccConfig::for_path(PathConfig {
            line_rate_bps: G100,
            base_rtt_ns: 10_000,
            mtu_bytes: 1000,
        });
        let mut r = RxHpcc::new(&cfg);
        assert_eq!(r.on_rx_data(&rx(0, &[hop(0, 0)])).feedback_window, None);
        // first sample: u' = 25 B/ns / 12.5 = 2, U = 0.5 * 1 + 0.5 * 2 = 1.5 >= eta:
        // line 30 + 31, W = Wc * eta / U + W_ai
        let a = r.on_rx_data(&rx(5_000, &[hop(5_000, 125_000)]));
        let w1 = (125_000.0 * 0.95 / 1.5 + 390.625) as u64;
        assert_eq!(a.feedback_window, Some(w1));
        // within T (line 33-34): local update only, nothing fed back
        let a = r.on_rx_data(&rx(10_000, &[hop(10_000, 187_500)]));
        assert_eq!(a.feedback_window, None);
        // now = last + T is not "> last + T" (line 29)
        let a = r.on_rx_data(&rx(15_000, &[hop(15_000, 250_000)]));
        assert_eq!(a.feedback_window, None);
        let a = r.on_rx_data(&rx(15_001, &[hop(15_001, 250_013)]));
        assert!(a.feedback_window.is_some());
        // sender side applies the fed-back window and paces at W/T
        let mut s = RxHpcc::new(&cfg);
        s.on_ack(&AckEvent {
            rx_window: Some(50_000),
            ..Default::default()
        });
        assert_eq!(s.window_bytes(), 50_000);
        assert_eq!(s.rate_bps(), 40_000_000_000);
        // an absurd window is clamped to [W_min, BDP]
        s.on_ack(&AckEvent {
            rx_window: Some(u64::MAX),
            ..Default::default()
        });
        assert_eq!(s.window_bytes(), 125_000);
        s.on_ack(&AckEvent {
            rx_window: Some(0),
            ..Default::default()
        });
        assert!(s.window_bytes() >= 1 && s.rate_bps() >= 100_000_000 - 1);
    }
}
