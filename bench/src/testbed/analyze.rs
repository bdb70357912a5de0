//! From what a run recorded ([`RunData`]) to the figures of one CC ([`CcResult`]).

use serde::Serialize;

use super::fabric::{FabricConfig, FlowResult, RunData, NO_SAMPLE, QUEUE_BUCKET};
use super::{wire_bytes, FlowKind, Stop, Workload};

/// Below this bottleneck utilisation a run is not link-limited.
pub const LINK_LIMITED: f64 = 0.9;

/// What limited a run's throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The bottleneck link was busy (utilisation >= 90 %).
    Link,
    /// The congestion control kept the link below 90 % although the CPU
    /// could offer more (the calibration filled it).
    Cc,
    /// The CPU: the senders could not offer the bottleneck rate (the
    /// calibration did not fill it either), or the switch thread was
    /// descheduled for a large part of the run.
    Cpu,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::Link => "link",
            Limit::Cc => "cc",
            Limit::Cpu => "CPU",
        })
    }
}

/// One flow's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FlowFigures {
    /// Sender index.
    pub sender: usize,
    /// `long` or `short`.
    pub kind: FlowKind,
    /// Start (ms after the workload's start).
    pub start_ms: f64,
    /// Bytes posted.
    pub bytes_sent: u64,
    /// Bytes completed.
    pub bytes_delivered: u64,
    /// Flow completion time, us (absent if it did not finish).
    pub fct_us: Option<f64>,
    /// Average goodput from start to end, Gbit/s.
    pub goodput_gbps: Option<f64>,
}

/// The idle-fabric calibration: RTT and what the CPU can offer.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// One-MTU WRITE completion time on the idle fabric, us: min, p50, p99.
    pub rtt_min_us: f64,
    /// Median.
    pub rtt_p50_us: f64,
    /// 99th percentile.
    pub rtt_p99_us: f64,
    /// What all senders without CC offered to the switch, Gbit/s.
    pub offered_gbps: f64,
    /// Bottleneck utilisation while they did.
    pub utilisation: f64,
    /// Whether the senders offered at least the bottleneck rate.
    pub fills_link: bool,
}

/// The figures of one CC.
#[derive(Debug, Clone, Serialize)]
pub struct CcResult {
    /// The congestion control.
    pub cc: String,
    /// Run time, s (start to the end of the last flow).
    pub duration_s: f64,
    /// Bytes of every WRITE posted.
    pub bytes_sent: u64,
    /// Bytes of every WRITE completed successfully.
    pub bytes_delivered: u64,
    /// Whether the receiver's memory holds exactly what the senders wrote.
    pub data_verified: bool,
    /// Delivered payload over the run, Gbit/s.
    pub goodput_gbps: f64,
    /// Bottleneck wire bits sent / (bottleneck rate x run time).
    pub utilisation: f64,
    /// Frame bits the senders offered to the switch per second.
    pub offered_gbps: f64,
    /// Bottleneck queue, sampled every `sample_us`, bytes: median.
    pub queue_p50_bytes: u64,
    /// 99th percentile.
    pub queue_p99_bytes: u64,
    /// Largest sample.
    pub queue_max_bytes: u64,
    /// Fraction of samples with less than one MTU queued.
    pub queue_empty_fraction: f64,
    /// Frames dropped at the bottleneck: buffer full.
    pub tail_drops: u64,
    /// Frames dropped at the bottleneck: Not-ECT at K (LDCP first RTT).
    pub wred_drops: u64,
    /// Frames marked CE at the bottleneck.
    pub ce_marks: u64,
    /// INT hop records pushed at the bottleneck.
    pub int_records: u64,
    /// Packets retransmitted by the senders.
    pub retransmits: u64,
    /// Retransmission timeouts at the senders.
    pub timeouts: u64,
    /// CNPs the senders received.
    pub cnps: u64,
    /// FCT of the judged flows (incast: every flow; longshort: the short
    /// WRITEs), us: median.
    pub fct_p50_us: Option<f64>,
    /// 99th percentile.
    pub fct_p99_us: Option<f64>,
    /// FCT / ideal FCT (base RTT + wire bytes at the bottleneck rate): median.
    pub slowdown_p50: Option<f64>,
    /// 99th percentile.
    pub slowdown_p99: Option<f64>,
    /// Jain's index over per-flow goodputs (incast: while all flows run;
    /// fairness: mean over phases, second half of each).
    pub jain: Option<f64>,
    /// Jain per fairness phase (with two or more flows).
    pub jain_phases: Vec<f64>,
    /// What limited the run.
    pub limit: Limit,
    /// Why, in words.
    pub limit_note: String,
    /// Fraction of the run the switch thread was descheduled (gaps > 0.5 ms).
    pub switch_stall_fraction: f64,
    /// Whether the run hit `--timeout`.
    pub timed_out: bool,
    /// Error completions, if any.
    pub errors: Vec<String>,
    /// Per flow.
    pub flows: Vec<FlowFigures>,
    /// Sorted FCTs (us) of the judged flows.
    pub fcts_us: Vec<f64>,
    /// Queue over time: (ms, bytes), the largest sample per plot bin.
    pub queue_series: Vec<(f64, u64)>,
    /// Per-flow goodput over time: bin width (ms) and, per plotted flow, its
    /// label and Gbit/s per bin.
    pub rate_bin_ms: f64,
    /// Label and Gbit/s per bin, per plotted flow.
    pub rates: Vec<(String, Vec<f64>)>,
}

/// Nearest-rank percentile of sorted `v`.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    Some(v[((p * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// Percentile of a weighted histogram of `bucket`-wide buckets (lower edge).
pub fn hist_percentile(h: &[u64], bucket: u64, p: f64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let want = ((p * total as f64).ceil() as u64).clamp(1, total);
    let mut acc = 0;
    for (i, &c) in h.iter().enumerate() {
        acc += c;
        if acc >= want {
            return i as u64 * bucket;
        }
    }
    (h.len() as u64 - 1) * bucket
}

/// Jain's fairness index (1 = equal shares).
pub fn jain(x: &[f64]) -> Option<f64> {
    if x.is_empty() {
        return None;
    }
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if s2 == 0.0 {
        return None;
    }
    Some(s * s / (x.len() as f64 * s2))
}

/// Bytes each flow completed in `[a, b)` (ns after the start).
fn bytes_in(d: &RunData, a: u64, b: u64) -> Vec<u64> {
    let mut v = vec![0u64; d.flows.len()];
    for c in &d.completions {
        if c.t_ns >= a && c.t_ns < b {
            v[c.flow as usize] += u64::from(c.bytes);
        }
    }
    v
}

/// The calibration's figures: pings are the short flows, the blast the long ones.
pub fn calibration(d: &RunData, cfg: &FabricConfig, w: &Workload) -> Calibration {
    let mut rtts: Vec<f64> = d
        .flows
        .iter()
        .filter(|f| f.spec.kind == FlowKind::Short)
        .filter_map(|f| Some((f.end_ns? - f.spec.start_ns) as f64 / 1e3))
        .collect();
    rtts.sort_by(f64::total_cmp);
    // From the blast's start to the end of the run (what was in flight at
    // its planned end drains at the bottleneck rate).
    let a = w.events_ns.get(1).copied().unwrap_or(0);
    let b = d.duration_ns.max(a + 1);
    let secs = (b - a) as f64 / 1e9;
    let util = d.bottleneck.tx_wire_bytes as f64 * 8.0 / (cfg.bottleneck_bps as f64 * secs);
    let offered = d.offered_bytes as f64 * 8.0 / secs / 1e9;
    Calibration {
        rtt_min_us: rtts.first().copied().unwrap_or(0.0),
        rtt_p50_us: percentile(&rtts, 0.5).unwrap_or(0.0),
        rtt_p99_us: percentile(&rtts, 0.99).unwrap_or(0.0),
        offered_gbps: offered,
        utilisation: util,
        // Without CC, go-back-N after tail drops and retransmission
        // timeouts idle the link at times: what matters is that the
        // senders offered more than it carries.
        fills_link: offered * 1e9 >= cfg.bottleneck_bps as f64,
    }
}

/// The figures of one run. `base_rtt_ns`: the idle RTT the ideal FCT adds.
pub fn analyze(
    d: &RunData,
    cfg: &FabricConfig,
    w: &Workload,
    idle_rtt_ns: u64,
    calib: Option<&Calibration>,
) -> CcResult {
    let dur = d.duration_ns.max(1);
    let secs = dur as f64 / 1e9;
    let b = cfg.bottleneck_bps as f64;
    let sent: u64 = d.flows.iter().map(|f| f.bytes_posted).sum();
    let delivered: u64 = d.flows.iter().map(|f| f.bytes_done).sum();
    let util = d.bottleneck.tx_wire_bytes as f64 * 8.0 / (b * secs);
    let h = &d.queue_hist;
    let total: u64 = h.iter().sum();
    let small = (u64::from(cfg.mtu) / QUEUE_BUCKET) as usize;
    let empty: u64 = h.iter().take(small.max(1)).sum();
    let empty_frac = if total > 0 {
        empty as f64 / total as f64
    } else {
        1.0
    };

    let (fcts, slow) = judged_fcts(d, cfg, w, idle_rtt_ns);
    let (jain_all, jain_phases) = jain_of(d, w, dur);
    let (rate_bin, rates) = rates_over_time(d, dur);
    let queue_series = downsampled_queue(d);
    let stall = d.stall_ns as f64 / dur as f64;
    let cc_name = d.cc.to_string();
    let (limit, note) = limit_of(
        d,
        Load {
            util,
            stall,
            empty_frac,
            secs,
            bottleneck_bps: b,
        },
        calib,
    );
    let flows = d.flows.iter().map(flow_figures).collect();
    CcResult {
        cc: cc_name,
        duration_s: secs,
        bytes_sent: sent,
        bytes_delivered: delivered,
        data_verified: d.verified,
        goodput_gbps: delivered as f64 * 8.0 / secs / 1e9,
        utilisation: util,
        offered_gbps: d.offered_bytes as f64 * 8.0 / secs / 1e9,
        queue_p50_bytes: hist_percentile(h, QUEUE_BUCKET, 0.5),
        queue_p99_bytes: hist_percentile(h, QUEUE_BUCKET, 0.99),
        queue_max_bytes: d.queue_max,
        queue_empty_fraction: empty_frac,
        tail_drops: d.bottleneck.tail_drops,
        wred_drops: d.bottleneck.wred_drops,
        ce_marks: d.bottleneck.ce_marked,
        int_records: d.bottleneck.int_pushed,
        retransmits: d.senders_nic.retransmits,
        timeouts: d.senders_nic.timeouts,
        cnps: d.senders_nic.rx_cnps,
        fct_p50_us: percentile(&fcts, 0.5),
        fct_p99_us: percentile(&fcts, 0.99),
        slowdown_p50: percentile(&slow, 0.5),
        slowdown_p99: percentile(&slow, 0.99),
        jain: jain_all,
        jain_phases,
        limit,
        limit_note: note,
        switch_stall_fraction: stall,
        timed_out: d.timed_out,
        errors: d.errors.clone(),
        flows,
        fcts_us: fcts.iter().take(20_000).copied().collect(),
        queue_series,
        rate_bin_ms: rate_bin as f64 / 1e6,
        rates,
    }
}

/// The FCTs (us) and slowdowns of the flows the scenario judges (the short flows of
/// `longshort`, none of `fairness`, every flow otherwise), each sorted. The ideal
/// FCT is the idle RTT plus the flow's wire bytes at the bottleneck rate.
fn judged_fcts(
    d: &RunData,
    cfg: &FabricConfig,
    w: &Workload,
    idle_rtt_ns: u64,
) -> (Vec<f64>, Vec<f64>) {
    let b = cfg.bottleneck_bps as f64;
    let judged: Vec<usize> = match w.name.as_str() {
        "longshort" => (0..d.flows.len())
            .filter(|&i| d.flows[i].spec.kind == FlowKind::Short)
            .collect(),
        "fairness" => Vec::new(),
        _ => (0..d.flows.len()).collect(),
    };
    let mut fcts = Vec::new();
    let mut slow = Vec::new();
    for &i in &judged {
        let f = &d.flows[i];
        if let (Some(end), Stop::Bytes(size)) = (f.end_ns, f.spec.stop) {
            let fct = (end - f.spec.start_ns) as f64;
            let ideal = idle_rtt_ns as f64 + wire_bytes(size, cfg.mtu) as f64 * 8.0 / b * 1e9;
            fcts.push(fct / 1e3);
            slow.push(fct / ideal);
        }
    }
    fcts.sort_by(f64::total_cmp);
    slow.sort_by(f64::total_cmp);

    (fcts, slow)
}

/// Jain's fairness index of the run (incast: over the window where all flows were
/// active; fairness: the mean over its phases) and of each fairness phase.
fn jain_of(d: &RunData, w: &Workload, dur: u64) -> (Option<f64>, Vec<f64>) {
    let mut jain_phases = Vec::new();
    let jain_all = match w.name.as_str() {
        "incast" => {
            let a = d
                .flows
                .iter()
                .filter_map(|f| f.first_post_ns)
                .max()
                .unwrap_or(0);
            let e = d.flows.iter().filter_map(|f| f.end_ns).min().unwrap_or(dur);
            // Bytes in the window where all flows were active; when none
            // completed inside it (a few large WRs that all complete at the
            // end), each flow's average rate instead.
            let overlap = (e > a && d.flows.len() > 1)
                .then(|| {
                    jain(
                        &bytes_in(d, a, e)
                            .iter()
                            .map(|&x| x as f64)
                            .collect::<Vec<_>>(),
                    )
                })
                .flatten();
            if overlap.is_some() {
                overlap
            } else {
                jain(
                    &d.flows
                        .iter()
                        .filter_map(|f| {
                            let e = f.end_ns?;
                            Some(f.bytes_done as f64 / (e - f.spec.start_ns).max(1) as f64)
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
        "fairness" => {
            for p in w.events_ns.windows(2) {
                let (a, e) = (p[0], p[1]);
                let active: Vec<usize> = (0..d.flows.len())
                    .filter(|&i| {
                        let s = d.flows[i].spec;
                        s.start_ns <= a && matches!(s.stop, Stop::At(t) if t >= e)
                    })
                    .collect();
                if active.len() < 2 || e > dur {
                    continue;
                }
                let bytes = bytes_in(d, a + (e - a) / 2, e);
                if let Some(j) = jain(&active.iter().map(|&i| bytes[i] as f64).collect::<Vec<_>>())
                {
                    jain_phases.push(j);
                }
            }
            if jain_phases.is_empty() {
                None
            } else {
                Some(jain_phases.iter().sum::<f64>() / jain_phases.len() as f64)
            }
        }
        _ => None,
    };

    (jain_all, jain_phases)
}

/// Goodput over time in about 60 bins (wide enough for several WRITEs per flow per
/// bin), one row per long flow and one for all short WRITEs: the bin width (ns)
/// and the rows in Gbit/s.
fn rates_over_time(d: &RunData, dur: u64) -> (u64, Vec<(String, Vec<f64>)>) {
    let rate_bin = (dur / 60).max(100_000);
    let bins = (dur / rate_bin + 1) as usize;
    let long: Vec<usize> = (0..d.flows.len())
        .filter(|&i| d.flows[i].spec.kind == FlowKind::Long)
        .collect();
    let mut rates: Vec<(String, Vec<f64>)> = long
        .iter()
        .map(|&i| (format!("flow {}", d.flows[i].spec.sender), vec![0.0; bins]))
        .collect();
    let any_short = d.flows.iter().any(|f| f.spec.kind == FlowKind::Short);
    if any_short {
        rates.push(("short WRITEs".into(), vec![0.0; bins]));
    }
    let scale = 8.0 / rate_bin as f64; // bytes per bin -> Gbit/s
    for c in &d.completions {
        let i = c.flow as usize;
        let row = match long.iter().position(|&l| l == i) {
            Some(r) => r,
            None => rates.len() - 1,
        };
        let bin = ((c.t_ns / rate_bin) as usize).min(bins - 1);
        rates[row].1[bin] += f64::from(c.bytes) * scale;
    }

    (rate_bin, rates)
}

/// The bottleneck queue series downsampled to at most ~800 points (the maximum of
/// each group): (ms, bytes).
fn downsampled_queue(d: &RunData) -> Vec<(f64, u64)> {
    let step = d.queue_series.len().div_ceil(800).max(1);
    d.queue_series
        .chunks(step)
        .enumerate()
        .filter_map(|(k, c)| {
            let q = c.iter().copied().filter(|&q| q != NO_SAMPLE).max()?;
            Some((
                (k * step) as f64 * d.series_bin_ns as f64 / 1e6,
                u64::from(q),
            ))
        })
        .collect()
}

/// What the run's load looked like, for [`limit_of`].
struct Load {
    /// Bottleneck utilisation.
    util: f64,
    /// Fraction of the run the switch thread was descheduled.
    stall: f64,
    /// Fraction of the queue samples that were (nearly) empty.
    empty_frac: f64,
    /// The run's length in seconds.
    secs: f64,
    bottleneck_bps: f64,
}

/// What limited the run (the link, the CPU or the CC) and why, in words.
fn limit_of(d: &RunData, l: Load, calib: Option<&Calibration>) -> (Limit, String) {
    let (util, stall, empty_frac, secs, b) =
        (l.util, l.stall, l.empty_frac, l.secs, l.bottleneck_bps);
    let cc_name = d.cc.to_string();
    if util >= LINK_LIMITED {
        (
            Limit::Link,
            format!("bottleneck {:.0} % busy", util * 100.0),
        )
    } else if stall > 0.1 {
        (
            Limit::Cpu,
            format!(
                "the switch thread was descheduled {:.0} % of the run (other load on the cores?)",
                stall * 100.0
            ),
        )
    } else if d.cc == cc::CcKind::None || calib.is_some_and(|c| !c.fills_link) {
        (
            Limit::Cpu,
            format!(
                "senders offered {:.2} Gbit/s, queue empty {:.0} % of the time: the NIC thread cannot fill {:.2} Gbit/s",
                d.offered_bytes as f64 * 8.0 / secs / 1e9,
                empty_frac * 100.0,
                b / 1e9
            ),
        )
    } else {
        (
            Limit::Cc,
            format!(
                "{cc_name} held the link at {:.0} % (queue empty {:.0} % of the time) though the calibration filled it",
                util * 100.0,
                empty_frac * 100.0
            ),
        )
    }
}

/// One flow's figures for the report.
fn flow_figures(f: &FlowResult) -> FlowFigures {
    FlowFigures {
        sender: f.spec.sender,
        kind: f.spec.kind,
        start_ms: f.spec.start_ns as f64 / 1e6,
        bytes_sent: f.bytes_posted,
        bytes_delivered: f.bytes_done,
        fct_us: f.end_ns.map(|e| (e - f.spec.start_ns) as f64 / 1e3),
        goodput_gbps: f
            .end_ns
            .map(|e| f.bytes_done as f64 * 8.0 / (e - f.spec.start_ns).max(1) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), Some(1.0));
        assert!((jain(&[1.0, 0.0]).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), None);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        let mut h = vec![0u64; 10];
        h[0] = 50;
        h[3] = 49;
        h[9] = 1;
        assert_eq!(hist_percentile(&h, 64, 0.5), 0);
        assert_eq!(hist_percentile(&h, 64, 0.99), 3 * 64);
        assert_eq!(hist_percentile(&h, 64, 1.0), 9 * 64);
    }
}
