//! HPCC++ sender-based (000 §4, §5, §6.2, §6.3.1) and its shared core, also used by
//! Rx-HPCC (000 §6.3.2, see [`crate::rx_hpcc`]).
//!
//! All arithmetic is in `f64` on per-QP state; no allocation, no loop longer than the
//! hop count (at most [`MAX_HOPS`]).

use crate::types::{window_to_bps, AckEvent, Actions, IntHop, PathConfig, TimerKind};
use crate::{CcKind, CongestionControl, NakEvent, RxDataEvent, SendEvent};

/// Hops whose state is kept per QP. 003 §7.1: "the path length is often no more than
/// 5 hops"; records beyond this are ignored.
pub const MAX_HOPS: usize = 8;

/// Where HPCC++ gets its telemetry (000 §6.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TelemetryMode {
    /// Inband on every data packet, echoed on every ACK (000 §6.2.1 item 1, the §4 base
    /// algorithm).
    EveryPacket,
    /// Dedicated probe packets, one per RTT while data is in flight (000 §6.2.1 item 2,
    /// §7.1).
    Probe,
}

/// HPCC++ parameters (000 fig. 3 and §5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HpccConfig {
    /// Line rate, base RTT `T` and MTU.
    pub path: PathConfig,
    /// Target utilisation `eta`. Default 0.95 (000 fig. 3, §5).
    pub eta: f64,
    /// `maxStage`. Default 5 (000 fig. 3, §5).
    pub max_stage: u32,
    /// Expected maximum number of concurrent flows on a link `N`, used by the §5 rule of
    /// thumb for `W_ai`. Default 16 (our choice; the draft leaves it to the operator).
    pub expected_flows: u32,
    /// `W_ai` in bytes; `None` = §5 rule of thumb `W_init * (1 - eta) / N`.
    pub w_ai_bytes: Option<f64>,
    /// Initial window `W_init` in bytes; `None` = line-rate BDP (flows start at line
    /// rate, 000 §5).
    pub w_init_bytes: Option<f64>,
    /// Lower bound on the pacing rate (bit/s), which bounds the window from below
    /// (`W_min = min_rate * T`). Default 100 Mbit/s (`MIN_RATE` of the HPCC authors' ns-3
    /// configuration).
    pub min_rate_bps: u64,
    /// Telemetry source. Default [`TelemetryMode::EveryPacket`].
    pub mode: TelemetryMode,
    /// Probe mode: re-send a probe when no response came back within this many base
    /// RTTs. Default 4.
    pub probe_timeout_rtts: u32,
}

impl Default for HpccConfig {
    fn default() -> Self {
        Self::for_path(PathConfig::default())
    }
}

impl HpccConfig {
    /// Defaults for a given path.
    pub fn for_path(path: PathConfig) -> Self {
        HpccConfig {
            path,
            eta: 0.95,
            max_stage: 5,
            expected_flows: 16,
            w_ai_bytes: None,
            w_init_bytes: None,
            min_rate_bps: 100_000_000,
            mode: TelemetryMode::EveryPacket,
            probe_timeout_rtts: 4,
        }
    }
}

/// Per-QP state of the HPCC++ control law (MeasureInflight + ComputeWind), shared by
/// the sender-based and the receiver-based form.
#[derive(Clone, Debug)]
pub struct HpccCore {
    /// `U`, the EWMA of the normalised inflight bytes of the most loaded link (line 9).
    pub u: f64,
    /// Reference window `Wc` (bytes).
    pub wc: f64,
    /// Current window `W` (bytes).
    pub w: f64,
    /// `incStage`.
    pub inc_stage: u32,
    /// Telemetry of the previous update, per hop (`L` of line 27).
    links: [IntHop; MAX_HOPS],
    n_links: u8,
    /// Some telemetry has been stored (`L` is defined).
    has_links: bool,
    // Constants derived from the configuration.
    t_ns: f64,
    eta: f64,
    max_stage: u32,
    w_ai: f64,
    w_min: f64,
    w_max: f64,
    line_bps: f64,
}

/// Smallest `U` used as a divisor in line 13 (keeps `Wc*eta/U` finite; the result is
/// clamped to `W_max` anyway).
const U_FLOOR: f64 = 1e-6;

impl HpccCore {
    /// New state: `W = Wc = W_init`, no per-link state, and `U = 1`: a flow starts at
    /// line rate, so the link is taken as fully used until samples say otherwise (the
    /// draft leaves the initial `U` open; starting at 0 would make the first EWMA
    /// samples of line 9 look like an idle link and trigger spurious increases).
    pub fn new(cfg: &HpccConfig) -> Self {
        let path = cfg.path.sanitized();
        let t_ns = path.base_rtt_ns as f64;
        let bdp = path.bdp_bytes() as f64;
        let eta = if cfg.eta.is_finite() && cfg.eta > 0.0 {
            cfg.eta.min(1.0)
        } else {
            0.95
        };
        let w_max = bdp;
        let w_min = (cfg.min_rate_bps as f64 * t_ns / 8.0e9).clamp(1.0, w_max);
        let w_init = cfg
            .w_init_bytes
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(bdp)
            .clamp(w_min, w_max);
        let n = cfg.expected_flows.max(1) as f64;
        // 000 §5 rule of thumb: W_ai = W_init * (1 - eta) / N.
        let w_ai = cfg
            .w_ai_bytes
            .filter(|w| w.is_finite() && *w >= 0.0)
            .unwrap_or(w_init * (1.0 - eta) / n);
        HpccCore {
            u: 1.0,
            wc: w_init,
            w: w_init,
            inc_stage: 0,
            links: [IntHop::default(); MAX_HOPS],
            n_links: 0,
            has_links: false,
            t_ns,
            eta,
            max_stage: cfg.max_stage,
            w_ai,
            w_min,
            w_max,
            line_bps: path.line_rate_bps as f64,
        }
    }

    /// `W_ai` in bytes.
    pub fn w_ai(&self) -> f64 {
        self.w_ai
    }

    /// Pacing rate `R = W / T` (line 27), bit/s, capped at the line rate (the cap only
    /// binds when the BDP is below one MTU, where `W_max` is one MTU).
    pub fn rate_bps(&self) -> u64 {
        window_to_bps(self.w, self.t_ns).min(self.line_bps).max(1.0) as u64
    }

    /// 000 fig. 4 (lines 1-10): MeasureInflight. Returns the new `U`, or `None` when no
    /// hop yields a rate sample (first telemetry, path change, empty telemetry, zero or
    /// backwards time delta, zero capacity); `U` is then left unchanged.
    ///
    /// Per-link state is keyed by (`switch_id`, `port_id`) at each hop index: a hop
    /// whose identity changed is reset (its new record is stored, no sample is taken).
    /// Counters are differenced with `wrapping_sub` (mod 2^32). A record older than the
    /// stored one (time delta >= 2^31 ns, i.e. reordered) is ignored and not stored.
    pub fn measure_inflight(&mut self, hops: &[IntHop]) -> Option<f64> {
        let n = hops.len().min(MAX_HOPS);
        let mut u = 0.0f64; // line 2
        let mut tau = 0.0f64;
        let mut sampled = false;
        for (i, new) in hops.iter().take(n).enumerate() {
            // line 3
            let old = &mut self.links[i];
            let known = i < self.n_links as usize
                && old.switch_id == new.switch_id
                && old.port_id == new.port_id;
            if !known {
                *old = *new; // path change (or first record): reset this link
                continue;
            }
            let dt = new.ts_ns.wrapping_sub(old.ts_ns);
            if dt == 0 || dt >= 1 << 31 || new.link_bps == 0 {
                continue; // no usable interval: keep the older record
            }
            let dt = dt as f64;
            let b = new.link_bps as f64 / 8.0e9; // bytes per ns
            let tx_rate = new.tx_bytes.wrapping_sub(old.tx_bytes) as f64 / dt; // line 4
            let qlen = new.qlen_bytes.min(old.qlen_bytes) as f64;
            let u_prime = qlen / (b * self.t_ns) + tx_rate / b; // line 5
            if !sampled || u_prime > u {
                // lines 6-7
                u = u_prime;
                tau = dt;
            }
            sampled = true;
            *old = *new; // line 27: L = ack.L
        }
        self.n_links = n as u8;
        self.has_links |= n > 0;
        if !sampled {
            return None;
        }
        let tau = tau.min(self.t_ns); // line 8
        self.u = (1.0 - tau / self.t_ns) * self.u + tau / self.t_ns * u; // line 9
        Some(self.u)
    }

    /// 000 fig. 5 (lines 11-20): ComputeWind. The result is clamped to
    /// `[W_min, W_max]` (`W_max` = line-rate BDP: never faster than line rate).
    pub fn compute_wind(&mut self, u: f64, update_wc: bool) -> f64 {
        let w = if u >= self.eta || self.inc_stage >= self.max_stage {
            // line 12-13: W = Wc / (U/eta) + W_ai
            let w = self.wc / (u.max(U_FLOOR) / self.eta) + self.w_ai;
            if update_wc {
                self.inc_stage = 0; // line 15
            }
            w
        } else {
            if update_wc {
                self.inc_stage = self.inc_stage.saturating_add(1); // line 19
            }
            self.wc + self.w_ai // line 17
        };
        let w = if w.is_finite() { w } else { self.w_max };
        self.w = w.clamp(self.w_min, self.w_max);
        if update_wc {
            self.wc = self.w; // line 15 / 19
        }
        self.w
    }

    /// Sets `W` (and `Wc`) from outside, clamped (Rx-HPCC sender side).
    pub fn set_window(&mut self, w: f64) {
        if w.is_finite() {
            self.w = w.clamp(self.w_min, self.w_max);
        }
    }

    /// Window in whole bytes.
    pub fn window_bytes(&self) -> u64 {
        self.w as u64
    }

    /// Whether telemetry has been stored (`L` of line 27 is defined).
    pub fn has_telemetry(&self) -> bool {
        self.has_links
    }
}

/// HPCC++ sender-based congestion control (000 §4, §6.3.1), one per QP.
#[derive(Clone, Debug)]
pub struct Hpcc {
    core: HpccCore,
    /// `snd_nxt`: LSN after the highest byte sent.
    snd_nxt: u64,
    /// Highest cumulative ACK seen.
    snd_una: u64,
    /// `lastUpdateSeq` (line 22/24).
    last_update_seq: u64,
    mode: TelemetryMode,
    probe_outstanding: bool,
    /// `snd_nxt` when the outstanding probe was sent: the probe response plays the
    /// role of `ack.seq` in line 22.
    probe_seq: u64,
    probe_deadline_ns: u64,
    probe_timeout_ns: u64,
}

impl Hpcc {
    /// New instance: starts at line rate with `W = W_init`.
    pub fn new(cfg: &HpccConfig) -> Self {
        let t = cfg.path.sanitized().base_rtt_ns;
        Hpcc {
            core: HpccCore::new(cfg),
            snd_nxt: 0,
            snd_una: 0,
            last_update_seq: 0,
            mode: cfg.mode,
            probe_outstanding: false,
            probe_seq: 0,
            probe_deadline_ns: 0,
            probe_timeout_ns: t.saturating_mul(cfg.probe_timeout_rtts.max(1) as u64),
        }
    }

    /// The control-law state (for tests and tracing).
    pub fn core(&self) -> &HpccCore {
        &self.core
    }

    /// Telemetry source in use.
    pub fn mode(&self) -> TelemetryMode {
        self.mode
    }

    /// 000 fig. 6 (lines 21-27): NewAck with the echoed telemetry and the ACK's
    /// sequence number.
    ///
    /// The very first telemetry only defines `L` (there is nothing to difference
    /// against); it also starts the first update round (`lastUpdateSeq = snd_nxt`), so
    /// that the first `Wc` update uses a `U` averaged over one RTT of samples, as in
    /// the HPCC authors' reference simulator.
    pub fn new_ack(&mut self, ack_seq: u64, hops: &[IntHop]) {
        let first = !self.core.has_telemetry();
        let Some(u) = self.core.measure_inflight(hops) else {
            if first {
                self.last_update_seq = self.snd_nxt;
            }
            return;
        };
        if ack_seq > self.last_update_seq {
            // line 22-24
            self.core.compute_wind(u, true);
            self.last_update_seq = self.snd_nxt;
        } else {
            self.core.compute_wind(u, false); // line 26
        }
    }

    fn inflight(&self) -> bool {
        self.snd_nxt > self.snd_una
    }

    fn issue_probe(&mut self, now_ns: u64, a: &mut Actions) {
        self.probe_outstanding = true;
        self.probe_seq = self.snd_nxt;
        self.probe_deadline_ns = now_ns.saturating_add(self.probe_timeout_ns);
        a.send_probe = true;
        a.arm(self.probe_deadline_ns, TimerKind::ProbeTimeout);
    }
}

impl CongestionControl for Hpcc {
    fn on_send(&mut self, ev: &SendEvent) -> Actions {
        let end = ev.lsn.saturating_add(ev.bytes as u64);
        self.snd_nxt = self.snd_nxt.max(end);
        let mut a = Actions::NONE;
        if self.mode == TelemetryMode::Probe && !self.probe_outstanding {
            // 000 §6.2.1 item 2: probe only while data is in flight, one per RTT.
            self.issue_probe(ev.now_ns, &mut a);
        }
        a
    }

    fn on_ack(&mut self, ev: &AckEvent<'_>) -> Actions {
        self.snd_una = self.snd_una.max(ev.acked_lsn);
        self.snd_nxt = self.snd_nxt.max(self.snd_una);
        if !ev.telemetry.is_empty() {
            self.new_ack(ev.acked_lsn, ev.telemetry);
        }
        Actions::NONE
    }

    fn on_nak(&mut self, ev: &NakEvent) -> Actions {
        // HPCC++ reacts to telemetry, not to loss; only the ACK point moves.
        self.snd_una = self.snd_una.max(ev.expected_lsn);
        Actions::NONE
    }

    fn on_cnp(&mut self, _now_ns: u64) -> Actions {
        Actions::NONE
    }

    fn on_rto(&mut self, _now_ns: u64) -> Actions {
        Actions::NONE
    }

    fn on_timer(&mut self, now_ns: u64, kind: TimerKind) -> Actions {
        let mut a = Actions::NONE;
        if kind == TimerKind::ProbeTimeout
            && self.probe_outstanding
            && now_ns >= self.probe_deadline_ns
        {
            self.probe_outstanding = false;
            if self.inflight() {
                self.issue_probe(now_ns, &mut a);
            }
        }
        a
    }

    fn on_probe_response(&mut self, now_ns: u64, telemetry: &[IntHop]) -> Actions {
        // One probe per RTT (000 §6.2.1 item 2). The response runs NewAck (fig. 6)
        // with the probe's send-time snd_nxt as `ack.seq`: a probe sent right after a
        // Wc update measures traffic still sent with the old Wc, so it only updates W
        // (line 26); Wc is committed at most once per round (003 §6.1).
        if !self.probe_outstanding {
            return Actions::NONE; // unsolicited or duplicate response
        }
        self.new_ack(self.probe_seq.max(1), telemetry);
        let mut a = Actions::NONE;
        self.probe_outstanding = false;
        if self.mode == TelemetryMode::Probe && self.inflight() {
            self.issue_probe(now_ns, &mut a);
        }
        a
    }

    fn on_rx_data(&mut self, _ev: &RxDataEvent<'_>) -> Actions {
        // Sender-based: the receiver only echoes telemetry (000 §6.3.1 item 2).
        Actions::NONE
    }

    fn window_bytes(&self) -> u64 {
        self.core.window_bytes()
    }

    fn rate_bps(&self) -> u64 {
        self.core.rate_bps()
    }

    fn kind(&self) -> CcKind {
        CcKind::Hpcc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::AckEvent;

    const G100: u64 = 100_000_000_000;

    /// 100 Gbit/s, T = 10 us: BDP = 125 000 B; eta = 0.95, N = 16:
    /// W_ai = 125000 * 0.05 / 16 = 390.625 B.
    fn cfg() -> HpccConfig {
        HpccConfig::for_path(PathConfig {
            line_rate_bps: G100,
            base_rtt_ns: 10_000,
            mtu_bytes: 1000,
        })
    }

    fn hop(sw: u16, ts: u32, tx: u32, q: u32, bps: u64) -> IntHop {
        IntHop {
            switch_id: sw,
            port_id: 1,
            ts_ns: ts,
            tx_bytes: tx,
            qlen_bytes: q,
            link_bps: bps,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn rule_of_thumb_w_ai() {
        // 000 §5: W_ai = W_init * (1 - eta) / N
        let c = HpccCore::new(&cfg());
        assert!(close(c.w_ai(), 390.625), "{}", c.w_ai());
        assert!(close(c.w, 125_000.0));
        // R = W/T at W = BDP is the line rate (000 fig. 6 line 27)
        assert_eq!(c.rate_bps(), G100);
    }

    #[test]
    fn measure_inflight_single_hop() {
        let mut c = HpccCore::new(&cfg());
        // first record: no previous L, no sample (per-link state initialised)
        assert_eq!(c.measure_inflight(&[hop(1, 1_000, 0, 5_000, G100)]), None);
        // 000 fig. 4 line 4: txRate = 50000 B / 5000 ns = 10 B/ns; B = 12.5 B/ns
        // line 5: u' = min(10000, 5000) / (12.5 * 10000) + 10 / 12.5 = 0.04 + 0.8 = 0.84
        // line 8: tau = min(5000, 10000) = 5000; line 9 from the initial U = 1: U = 0.5 * 1 + 0.5 * 0.84 = 0.92
        let u = c
            .measure_inflight(&[hop(1, 6_000, 50_000, 10_000, G100)])
            .unwrap();
        assert!(close(u, 0.92), "{u}");
        // next interval 20 us > T: tau clamped to T (line 8) so U = u'
        // txRate = 250000 / 20000 = 12.5 B/ns -> 1.0; qlen min(10000, 0) = 0
        let u = c
            .measure_inflight(&[hop(1, 26_000, 300_000, 0, G100)])
            .unwrap();
        assert!(close(u, 1.0), "{u}");
    }

    #[test]
    fn measure_inflight_picks_most_loaded_hop() {
        let mut c = HpccCore::new(&cfg());
        let g40 = 40_000_000_000;
        c.measure_inflight(&[hop(1, 1_000, 0, 5_000, G100), hop(2, 1_000, 0, 25_000, g40)]);
        // hop 1 as above: u' = 0.84, dt = 5000
        // hop 2: B = 5 B/ns, txRate = 8000 / 2000 = 4 B/ns -> 0.8;
        //        qlen min(25000, 30000) / (5 * 10000) = 0.5 -> u' = 1.3 (lines 6-7 pick it)
        // line 9 with tau = 2000: U = 0.8 * 1 + 0.2 * 1.3 = 1.06
        let u = c
            .measure_inflight(&[
                hop(1, 6_000, 50_000, 10_000, G100),
                hop(2, 3_000, 8_000, 30_000, g40),
            ])
            .unwrap();
        assert!(close(u, 1.06), "{u}");
    }

    #[test]
    fn measure_inflight_counter_wraparound() {
        let mut c = HpccCore::new(&cfg());
        c.measure_inflight(&[hop(1, u32::MAX - 1_999, u32::MAX - 9_999, 5_000, G100)]);
        // ts: 2000 + 3000 = 5000 ns; tx: 10000 + 40000 = 50000 B (mod 2^32)
        let u = c
            .measure_inflight(&[hop(1, 3_000, 40_000, 10_000, G100)])
            .unwrap();
        assert!(close(u, 0.92), "{u}");
    }

    #[test]
    fn path_change_resets_link_state() {
        let mut c = HpccCore::new(&cfg());
        c.measure_inflight(&[hop(1, 1_000, 0, 0, G100)]);
        // a different switch at hop 0: its record is new, no sample
        assert_eq!(c.measure_inflight(&[hop(7, 6_000, 50_000, 0, G100)]), None);
        // the next record of switch 7 is differenced against switch 7's, not switch 1's
        let u = c
            .measure_inflight(&[hop(7, 11_000, 100_000, 0, G100)])
            .unwrap();
        assert!(close(u, 0.5 * 1.0 + 0.5 * 0.8), "{u}");
    }

    #[test]
    fn hops_beyond_max_hops_are_ignored_and_hop_count_change_resets() {
        let mut c = HpccCore::new(&cfg());
        let many: Vec<IntHop> = (0..12).map(|i| hop(i, 0, 0, 0, G100)).collect();
        assert_eq!(c.measure_inflight(&many), None);
        // hop 10 would be fully loaded (u' = 3) but is beyond MAX_HOPS: ignored
        let mut next: Vec<IntHop> = (0..12).map(|i| hop(i, 10_000, 62_500, 0, G100)).collect();
        next[10] = hop(10, 10_000, 375_000, 0, G100);
        // every kept hop: txRate = 6.25 B/ns -> u' = 0.5, tau = T: U = 0.5
        assert!(close(c.measure_inflight(&next).unwrap(), 0.5));
        // a shorter path: hop 0 keeps its state, the rest is gone
        let u = c
            .measure_inflight(&[hop(0, 20_000, 187_500, 0, G100)])
            .unwrap();
        assert!(close(u, 1.0), "{u}");
        let u = c.measure_inflight(&[hop(0, 30_000, 250_000, 0, G100), hop(1, 30_000, 0, 0, G100)]);
        // hop 1 reappears: its old record was dropped with the short path, so only
        // hop 0 is sampled (txRate 6.25 B/ns -> 0.5)
        assert!(close(u.unwrap(), 0.5));
    }

    #[test]
    fn odd_telemetry_gives_no_sample() {
        let mut c = HpccCore::new(&cfg());
        assert_eq!(c.measure_inflight(&[]), None);
        c.measure_inflight(&[hop(1, 1_000, 0, 0, G100)]);
        // zero time delta, zero capacity, stale (reordered) record
        assert_eq!(c.measure_inflight(&[hop(1, 1_000, 9, 0, G100)]), None);
        assert_eq!(c.measure_inflight(&[hop(1, 2_000, 9, 0, 0)]), None);
        assert_eq!(c.measure_inflight(&[hop(1, 500, 9, 0, G100)]), None);
        assert_eq!(c.u, 1.0);
    }

    #[test]
    fn compute_wind_md_line_13() {
        let mut c = HpccCore::new(&cfg());
        // 000 fig. 5 line 13: W = Wc / (U/eta) + W_ai = 125000 / 2 + 390.625
        let w = c.compute_wind(1.9, true);
        assert!(close(w, 62_890.625), "{w}");
        assert!(close(c.wc, 62_890.625)); // line 15
        assert_eq!(c.inc_stage, 0);
    }

    #[test]
    fn compute_wind_ai_then_mi_after_max_stage() {
        let mut c = HpccCore::new(&cfg());
        c.wc = 50_000.0;
        // line 17/19: five additive stages at U = 0.5 < eta
        for stage in 1..=5u32 {
            let w = c.compute_wind(0.5, true);
            assert!(close(w, 50_000.0 + stage as f64 * 390.625), "{w}");
            assert_eq!(c.inc_stage, stage);
        }
        // without updateWc, W = Wc + W_ai and Wc stays (line 17, 18 false)
        // incStage = 5 = maxStage -> line 12 takes the MI branch:
        // W = Wc * eta / U + W_ai = 51953.125 * 0.95 / 0.5 + 390.625
        let wc = c.wc;
        let w = c.compute_wind(0.5, false);
        assert!(close(w, wc * 0.95 / 0.5 + 390.625), "{w}");
        assert!(close(c.wc, wc));
        // clamped to the line-rate BDP when MI would overshoot
        let w = c.compute_wind(0.01, true);
        assert!(close(w, 125_000.0), "{w}");
    }

    #[test]
    fn new_ack_updates_wc_once_per_rtt() {
        let mut h = Hpcc::new(&cfg());
        let send = |h: &mut Hpcc, from: u64, to: u64| {
            for i in from..to {
                h.on_send(&SendEvent {
                    now_ns: 0,
                    lsn: i * 1000,
                    bytes: 1000,
                    ..Default::default()
                });
            }
        };
        fn ack(seq: u64, tel: &[IntHop]) -> AckEvent<'_> {
            AckEvent {
                acked_lsn: seq,
                telemetry: tel,
                ..Default::default()
            }
        }
        send(&mut h, 0, 10);
        // first telemetry: defines L, starts the first round (lastUpdateSeq = snd_nxt)
        h.on_ack(&ack(1000, &[hop(1, 0, 0, 0, G100)]));
        assert_eq!(h.last_update_seq, 10_000);
        assert!(close(h.core.w, 125_000.0));
        // ack.seq 2000 <= lastUpdateSeq: line 26 (W only). txRate = 62500/5000 B/ns
        // -> u' = 1.0; U = 0.5 * 1 + 0.5 * 1 = 1.0 >= eta: line 13 with Wc = 125000
        h.on_ack(&ack(2000, &[hop(1, 5_000, 62_500, 0, G100)]));
        let w = 125_000.0 / (1.0 / 0.95) + 390.625;
        assert!(close(h.core.w, w), "{} vs {w}", h.core.w);
        assert!(close(h.core.wc, 125_000.0), "Wc unchanged (line 14 false)");
        assert_eq!(h.last_update_seq, 10_000);
        send(&mut h, 10, 20);
        // ack.seq 10001 > lastUpdateSeq: line 23-24, Wc updated, lastUpdateSeq = 20000
        // txRate = 125000/5000 = 25 B/ns -> u' = 2; U = 0.5 * 1 + 0.5 * 2 = 1.5
        h.on_ack(&ack(10_001, &[hop(1, 10_000, 187_500, 0, G100)]));
        let w = 125_000.0 / (1.5 / 0.95) + 390.625;
        assert!(close(h.core.w, w), "{} vs {w}", h.core.w);
        assert!(close(h.core.wc, w));
        assert_eq!(h.core.inc_stage, 0);
        assert_eq!(h.last_update_seq, 20_000);
        assert_eq!(h.window_bytes(), w as u64);
        // R = W / T (line 27): bits/s
        let r = (w * 8.0e9 / 10_000.0) as u64;
        assert!(h.rate_bps().abs_diff(r) <= 1);
        // an ACK without telemetry changes nothing
        h.on_ack(&ack(11_000, &[]));
        assert!(close(h.core.w, w));
    }

    #[test]
    fn probe_mode_one_probe_per_rtt_while_inflight() {
        let mut c = cfg();
        c.mode = TelemetryMode::Probe;
        let mut h = Hpcc::new(&c);
        let s = |lsn| SendEvent {
            now_ns: 100,
            lsn,
            bytes: 1000,
            ..Default::default()
        };
        let a = h.on_send(&s(0));
        assert!(a.send_probe);
        assert_eq!(a.timers().next().unwrap().kind, TimerKind::ProbeTimeout);
        assert!(
            !h.on_send(&s(1000)).send_probe,
            "one probe outstanding at a time"
        );
        // response while data is in flight -> next probe at once (000 §6.2.1 item 2)
        let a = h.on_probe_response(8_000, &[hop(1, 0, 0, 0, G100)]);
        assert!(a.send_probe);
        // everything acknowledged, then the response: no new probe
        h.on_ack(&AckEvent {
            acked_lsn: 2000,
            ..Default::default()
        });
        let a = h.on_probe_response(16_000, &[hop(1, 8_000, 90_000, 0, G100)]);
        assert!(!a.send_probe);
        // the response carried a sample: txRate = 90000 / 8000 = 11.25 B/ns -> u' = 0.9,
        // tau = 8000 (line 9): U = 0.2 * 1 + 0.8 * 0.9 = 0.92
        assert!(close(h.core.u, 0.92), "{}", h.core.u);
        // a new send starts probing again
        assert!(h.on_send(&s(2000)).send_probe);
        // a lost probe: the timeout re-issues it (stale expiry ignored)
        assert_eq!(h.on_timer(101, TimerKind::ProbeTimeout), Actions::NONE);
        assert!(h.on_timer(100 + 40_000, TimerKind::ProbeTimeout).send_probe);
    }
}
