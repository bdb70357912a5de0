//! What a run reports: FCT slowdown (FCT over the flow's FCT alone in the empty
//! network) by flow class and size bucket, bottleneck queue percentiles, drops,
//! retransmissions, speed; the table, the JSON and the SVG plots.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::fabric::{FlowResult, RunTotals};
use crate::workload::Flow;

/// Flows below this many bytes are "short" (HPCC paper, issue 16).
pub const SHORT_BYTES: u64 = 100_000;

/// Upper bounds of the flow-size buckets, bytes (the last is open).
pub const BUCKETS: [u64; 6] = [10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, u64::MAX];

/// The path a flow takes, for its ideal FCT: link rates in order and the propagation
/// delay of each link.
#[derive(Debug, Clone)]
pub struct PathModel {
    /// Link rates from sender to receiver, bit/s.
    pub rates: Vec<u64>,
    /// Propagation delay per link, ns.
    pub prop_ns: u64,
}

/// Frame bytes a RoCEv2 WRITE packet adds to its payload: Ethernet 14, IPv4 20, UDP 8,
/// BTH 12, ICRC 4 (RETH's 16 on the first packet are left out: a lower bound).
const DATA_OVERHEAD: u64 = 58;
/// Wire bytes of an ACK frame: 62 bytes (Ethernet, IPv4, UDP, BTH, AETH, ICRC), FCS,
/// preamble and inter-frame gap.
const ACK_WIRE: u64 = 86;
/// Preamble, inter-frame gap and FCS.
const WIRE_EXTRA: u64 = 24;

fn ser_ns(bytes: u64, bps: u64) -> f64 {
    bytes as f64 * 8e9 / bps as f64
}

/// The FCT of a `bytes` flow alone in an empty network (a lower bound of any run's):
/// every packet's wire bytes through the slowest link, the first packet's store and
/// forward through the others, propagation both ways, and the last ACK back, less 1 ns
/// per link crossing (the shapers round each frame's time down and carry the rest).
pub fn ideal_fct_ns(bytes: u64, mtu: u32, path: &PathModel) -> f64 {
    let mtu = u64::from(mtu);
    let pkts = bytes.div_ceil(mtu).max(1);
    let wire = bytes + pkts * (DATA_OVERHEAD + WIRE_EXTRA);
    let first = bytes.min(mtu) + DATA_OVERHEAD + WIRE_EXTRA;
    let slowest = path.rates.iter().copied().min().unwrap_or(1).max(1);
    let mut t = ser_ns(wire, slowest);
    let mut skipped = false;
    for &r in &path.rates {
        if r == slowest && !skipped {
            skipped = true;
        } else {
            t += ser_ns(first, r);
        }
        t += ser_ns(ACK_WIRE, r);
    }
    let crossings = 2.0 * path.rates.len() as f64;
    t + crossings * (path.prop_ns as f64 - 1.0)
}

/// p50 / p95 / p99 of a set of slowdowns.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Pcts {
    /// Flows.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// The `q` quantile of sorted values (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

impl Pcts {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            count: v.len(),
            p50: quantile(&v, 0.50),
            p95: quantile(&v, 0.95),
            p99: quantile(&v, 0.99),
        }
    }
}

/// One size bucket.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bucket {
    /// Smallest size, bytes.
    pub lo: u64,
    /// Largest size (exclusive), bytes; `u64::MAX` for the last.
    pub hi: u64,
    /// Slowdowns in it.
    #[serde(flatten)]
    pub pcts: Pcts,
}

/// Everything reported for one CC.
#[derive(Debug, Clone, Serialize)]
pub struct CcReport {
    /// CC name.
    pub cc: String,
    /// Short flows (< 100 KB).
    pub short: Pcts,
    /// Long flows.
    pub long: Pcts,
    /// All flows.
    pub all: Pcts,
    /// Per size bucket.
    pub buckets: Vec<Bucket>,
    /// Bottleneck (monitored port) queue, bytes: p50.
    pub queue_p50: u64,
    /// p99.
    pub queue_p99: u64,
    /// Largest sample.
    pub queue_max: u64,
    /// Utilisation of the monitored ports: wire bits sent over (rate x run time), mean
    /// over the ports.
    pub utilisation: f64,
    /// Flows, finished, unfinished.
    pub flows: usize,
    /// Flows that did not finish before the time limit.
    pub unfinished: usize,
    /// Payload bytes of all flows.
    pub bytes_offered: u64,
    /// Payload bytes the receivers' transports wrote into memory.
    pub bytes_delivered: u64,
    /// Switch drops (all reasons), tail drops, CE marks.
    pub drops: u64,
    /// Tail drops of the data class.
    pub tail_drops: u64,
    /// CE marks.
    pub ce_marks: u64,
    /// PFC pause time summed over links, ns (0 without `--pfc`).
    pub pfc_pause_ns: u64,
    /// PFC PAUSE frames sent.
    pub pfc_pauses: u64,
    /// Retransmitted data packets.
    pub retransmits: u64,
    /// Retransmit timeouts.
    pub timeouts: u64,
    /// CNPs sent.
    pub cnps: u64,
    /// Simulated time to the last completion, ns.
    pub sim_ns: u64,
    /// Events processed.
    pub events: u64,
    /// Wall-clock seconds (reporting only).
    pub wall_s: f64,
    /// Events per wall-clock second (reporting only; the machine may be shared).
    pub events_per_s: f64,
    /// CPU seconds of the run (user + system; reporting only).
    pub cpu_s: f64,
    /// Events per CPU second.
    pub events_per_cpu_s: f64,
    /// Slowdown per flow: (bytes, slowdown), for the plot.
    #[serde(skip)]
    pub per_flow: Vec<(u64, f64)>,
    /// Queue samples, sorted, bytes: for the CDF plot.
    #[serde(skip)]
    pub queue_sorted: Vec<u32>,
}

/// Inputs of [`CcReport::build`].
pub struct RunOutcome<'a> {
    /// CC name.
    pub cc: &'a str,
    /// Flows and their results.
    pub flows: &'a [Flow],
    /// Results.
    pub results: &'a [FlowResult],
    /// Totals.
    pub totals: &'a RunTotals,
    /// Queue samples.
    pub samples: Vec<u32>,
    /// Rates of the monitored ports, bit/s.
    pub monitored_bps: Vec<u64>,
    /// Payload bytes delivered.
    pub delivered: u64,
    /// Each flow's path.
    pub path: &'a dyn Fn(&Flow) -> PathModel,
    /// RoCE MTU.
    pub mtu: u32,
    /// Wall-clock seconds of the run.
    pub wall_s: f64,
    /// CPU seconds of the run.
    pub cpu_s: f64,
}

impl CcReport {
    /// Computes the report of one run.
    pub fn build(o: RunOutcome<'_>) -> Self {
        let mut per_flow = Vec::new();
        let (mut short, mut long, mut all) = (Vec::new(), Vec::new(), Vec::new());
        let mut buckets: Vec<Vec<f64>> = vec![Vec::new(); BUCKETS.len()];
        let mut unfinished = 0;
        let mut first = u64::MAX;
        let mut last = 0;
        for (f, r) in o.flows.iter().zip(o.results) {
            if r.end == 0 {
                unfinished += 1;
                continue;
            }
            first = first.min(r.start);
            last = last.max(r.end);
            let fct = (r.end - r.start) as f64;
            let sd = fct / ideal_fct_ns(f.bytes, o.mtu, &(o.path)(f));
            per_flow.push((f.bytes, sd));
            all.push(sd);
            if f.bytes < SHORT_BYTES {
                short.push(sd);
            } else {
                long.push(sd);
            }
            let b = BUCKETS.iter().position(|&hi| f.bytes < hi).unwrap_or(0);
            buckets[b].push(sd);
        }
        let mut lo = 0;
        let buckets = buckets
            .into_iter()
            .zip(BUCKETS)
            .map(|(v, hi)| {
                let b = Bucket {
                    lo,
                    hi,
                    pcts: Pcts::of(v),
                };
                lo = hi;
                b
            })
            .collect();
        let mut q = o.samples;
        q.sort_unstable();
        let qp = |p: f64| {
            if q.is_empty() {
                0
            } else {
                let k = ((p * q.len() as f64).ceil() as usize).clamp(1, q.len());
                u64::from(q[k - 1])
            }
        };
        // The run ends at the last completion (or the time limit).
        let span = o
            .totals
            .end_ns
            .max(last)
            .saturating_sub(first.min(last))
            .max(1) as f64;
        let utilisation = if o.monitored_bps.is_empty() {
            0.0
        } else {
            o.totals
                .monitored_tx_wire
                .iter()
                .zip(&o.monitored_bps)
                .map(|(&b, &r)| b as f64 * 8e9 / (r as f64 * span))
                .sum::<f64>()
                / o.monitored_bps.len() as f64
        };
        let t = o.totals;
        Self {
            cc: o.cc.to_string(),
            short: Pcts::of(short),
            long: Pcts::of(long),
            all: Pcts::of(all),
            buckets,
            queue_p50: qp(0.50),
            queue_p99: qp(0.99),
            queue_max: q.last().map_or(0, |&x| u64::from(x)),
            utilisation,
            flows: o.flows.len(),
            unfinished,
            bytes_offered: o.flows.iter().map(|f| f.bytes).sum(),
            bytes_delivered: o.delivered,
            drops: t.switch_drops,
            tail_drops: t.tail_drops,
            ce_marks: t.ce_marks,
            pfc_pause_ns: t.pfc_pause_ns,
            pfc_pauses: t.pfc_pauses,
            retransmits: t.retransmits,
            timeouts: t.timeouts,
            cnps: t.cnps,
            sim_ns: last,
            events: t.events,
            wall_s: o.wall_s,
            events_per_s: t.events as f64 / o.wall_s.max(1e-9),
            cpu_s: o.cpu_s,
            events_per_cpu_s: t.events as f64 / o.cpu_s.max(1e-9),
            per_flow,
            queue_sorted: q,
        }
    }
}

/// The table printed after a run.
pub fn table(reports: &[CcReport]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<8} {:>21} {:>21} {:>21} {:>9} {:>9} {:>6} {:>7} {:>7} {:>6} {:>6} {:>9}\n",
        "cc",
        "short p50/p95/p99",
        "long p50/p95/p99",
        "all p50/p95/p99",
        "q p50 KB",
        "q p99 KB",
        "util%",
        "drops",
        "retx",
        "PFC ms",
        "unfin",
        "Mev/cpu-s"
    ));
    let p = |x: &Pcts| format!("{:.2}/{:.2}/{:.2}", x.p50, x.p95, x.p99);
    for r in reports {
        s.push_str(&format!(
            "{:<8} {:>21} {:>21} {:>21} {:>9.1} {:>9.1} {:>6.1} {:>7} {:>7} {:>6} {:>6} {:>9.2}\n",
            r.cc,
            p(&r.short),
            p(&r.long),
            p(&r.all),
            r.queue_p50 as f64 / 1000.0,
            r.queue_p99 as f64 / 1000.0,
            r.utilisation * 100.0,
            r.drops,
            r.retransmits,
            format!("{:.2}", r.pfc_pause_ns as f64 / 1e6),
            r.unfinished,
            r.events_per_cpu_s / 1e6,
        ));
    }
    s.push_str("slowdown p99 per flow size:\n");
    s.push_str(&format!("{:<8}", "cc"));
    for b in BUCKETS {
        s.push_str(&format!(" {:>10}", bucket_name(b)));
    }
    s.push('\n');
    for r in reports {
        s.push_str(&format!("{:<8}", r.cc));
        for b in &r.buckets {
            if b.pcts.count == 0 {
                s.push_str(&format!(" {:>10}", "-"));
            } else {
                s.push_str(&format!(" {:>10.2}", b.pcts.p99));
            }
        }
        s.push('\n');
    }
    s
}

fn bucket_name(hi: u64) -> String {
    match hi {
        u64::MAX => ">10MB".into(),
        h if h >= 1_000_000 => format!("<{}MB", h / 1_000_000),
        h => format!("<{}KB", h / 1000),
    }
}

fn color(i: usize) -> RGBColor {
    // Okabe-Ito, as the testbed's plots.
    const C: [RGBColor; 6] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
    ];
    C[i % C.len()]
}

fn perr(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Slowdown (p50 dashed, p99 solid) per flow-size bucket, one colour per CC.
pub fn plot_slowdown(path: &Path, reports: &[CcReport], title: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(path, e))?;
    let ymax = reports
        .iter()
        .flat_map(|r| r.buckets.iter().map(|b| b.pcts.p99))
        .fold(1.0f64, f64::max)
        * 1.2;
    let n = BUCKETS.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("FCT slowdown by flow size, p99 (solid) and p50 (dashed): {title}"),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..(n as f64 - 0.5), (1f64..ymax.max(2.0)).log_scale())
        .map_err(|e| perr(path, e))?;
    chart
        .configure_mesh()
        .x_desc("flow size")
        .y_desc("slowdown")
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round() as usize;
            if (x - i as f64).abs() < 0.01 && i < n {
                bucket_name(BUCKETS[i])
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(|e| perr(path, e))?;
    for (i, r) in reports.iter().enumerate() {
        let c = color(i);
        let pts = |f: fn(&Pcts) -> f64| -> Vec<(f64, f64)> {
            r.buckets
                .iter()
                .enumerate()
                .filter(|(_, b)| b.pcts.count > 0)
                .map(|(k, b)| (k as f64, f(&b.pcts).max(1.0)))
                .collect()
        };
        chart
            .draw_series(LineSeries::new(pts(|p| p.p99), c.stroke_width(2)))
            .map_err(|e| perr(path, e))?
            .label(r.cc.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        let p50 = pts(|p| p.p50);
        for w in p50.windows(2) {
            // Dashed: every other half segment.
            let (a, b) = (w[0], w[1]);
            for k in 0..6 {
                if k % 2 == 0 {
                    let s = |t: f64| (a.0 + (b.0 - a.0) * t, a.1 * (b.1 / a.1).powf(t));
                    chart
                        .draw_series(LineSeries::new(
                            vec![s(k as f64 / 6.0), s((k + 1) as f64 / 6.0)],
                            c.stroke_width(1),
                        ))
                        .map_err(|e| perr(path, e))?;
                }
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| perr(path, e))?;
    root.present().map_err(|e| perr(path, e))
}

/// CDF of the sampled bottleneck queue, one line per CC.
pub fn plot_queue_cdf(path: &Path, reports: &[CcReport], title: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(path, e))?;
    let xmax = reports
        .iter()
        .map(|r| r.queue_p99.max(r.queue_p50))
        .max()
        .unwrap_or(0)
        .max(1000) as f64
        / 1000.0
        * 1.3;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("bottleneck queue CDF: {title}"), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..1.0)
        .map_err(|e| perr(path, e))?;
    chart
        .configure_mesh()
        .x_desc("queue (KB), up to 1.3 x the largest p99")
        .y_desc("fraction of samples")
        .draw()
        .map_err(|e| perr(path, e))?;
    for (i, r) in reports.iter().enumerate() {
        let c = color(i);
        let q = &r.queue_sorted;
        let step = (q.len() / 400).max(1);
        let mut pts: Vec<(f64, f64)> = (0..q.len())
            .step_by(step)
            .map(|k| (q[k] as f64 / 1000.0, (k + 1) as f64 / q.len() as f64))
            .collect();
        if let Some(&l) = q.last() {
            pts.push((l as f64 / 1000.0, 1.0));
        }
        chart
            .draw_series(LineSeries::new(
                pts.into_iter().map(|(x, y)| (x.min(xmax), y)),
                c.stroke_width(2),
            ))
            .map_err(|e| perr(path, e))?
            .label(r.cc.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| perr(path, e))?;
    root.present().map_err(|e| perr(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_fct_is_serialisation_plus_rtt() {
        // One 1000-byte packet over two 100G links with 1 us each way.
        let p = PathModel {
            rates: vec![100_000_000_000, 100_000_000_000],
            prop_ns: 1000,
        };
        let t = ideal_fct_ns(1000, 1024, &p);
        let one = (1000.0 + 82.0) * 8.0 / 100.0; // ns at 100 Gbit/s
        let ack = 86.0 * 8.0 / 100.0;
        let want = 2.0 * one + 2.0 * ack + 4.0 * (1000.0 - 1.0);
        assert!((t - want).abs() < 1e-6, "{t} vs {want}");
        // A long flow is dominated by the slowest link: 10 000 packets of 1000 + 82 bytes.
        let q = PathModel {
            rates: vec![100_000_000_000, 1_000_000_000],
            prop_ns: 0,
        };
        let t = ideal_fct_ns(10_000_000, 1000, &q);
        assert!((t / (10_820_000.0 * 8.0) - 1.0).abs() < 0.001, "{t}");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        let p = Pcts::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((p.count, p.p50, p.p99), (3, 2.0, 3.0));
    }
}
