//! What a run of the one-bottleneck model answers: its time series and counts, and
//! the measures the tests hold the algorithms to (throughput, utilisation, Jain's
//! fairness, queue statistics), over a window of observation.

use std::io::{self, Write};

/// One row of the time series.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Time (ns).
    pub t_ns: u64,
    /// Bottleneck queue (bytes).
    pub qlen_bytes: u64,
    /// Cumulative bytes delivered in order to each receiver.
    pub delivered: Vec<u64>,
    /// Each sender's window (bytes, `u64::MAX` = unlimited).
    pub window: Vec<u64>,
    /// Each sender's pacing rate (bit/s).
    pub rate_bps: Vec<u64>,
}

/// Outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct ModelResult {
    /// Time series, one row per `sample_ns`.
    pub samples: Vec<Sample>,
    /// Packets dropped at the switch (Not-ECT above K, or buffer full).
    pub drops: u64,
    /// Packets marked CE.
    pub marks: u64,
    /// Largest queue seen at any enqueue (bytes).
    pub max_qlen_bytes: u64,
    /// ACKs sent by the receivers.
    pub acks: u64,
    /// Bottleneck capacity (bit/s).
    pub link_bps: u64,
}

impl ModelResult {
    fn window(&self, from_ns: u64, to_ns: u64) -> (&Sample, &Sample) {
        let first = self
            .samples
            .iter()
            .find(|s| s.t_ns >= from_ns)
            .or(self.samples.last())
            .expect("samples");
        let last = self
            .samples
            .iter()
            .rev()
            .find(|s| s.t_ns <= to_ns)
            .unwrap_or(first);
        (first, last)
    }

    /// Per-flow goodput (bit/s) over `[from, to]`.
    pub fn flow_throughput_bps(&self, from_ns: u64, to_ns: u64) -> Vec<f64> {
        if self.samples.is_empty() {
            return Vec::new();
        }
        let (a, b) = self.window(from_ns, to_ns);
        let dt = b.t_ns.saturating_sub(a.t_ns).max(1) as f64;
        a.delivered
            .iter()
            .zip(&b.delivered)
            .map(|(x, y)| (y - x) as f64 * 8e9 / dt)
            .collect()
    }

    /// Total goodput (bit/s) over `[from, to]`.
    pub fn throughput_bps(&self, from_ns: u64, to_ns: u64) -> f64 {
        self.flow_throughput_bps(from_ns, to_ns).iter().sum()
    }

    /// Utilisation of the bottleneck over `[from, to]`.
    pub fn utilization(&self, from_ns: u64, to_ns: u64) -> f64 {
        self.throughput_bps(from_ns, to_ns) / self.link_bps as f64
    }

    /// Jain's fairness index of the per-flow goodput over `[from, to]`.
    pub fn jain(&self, from_ns: u64, to_ns: u64) -> f64 {
        jain(&self.flow_throughput_bps(from_ns, to_ns))
    }

    fn queue_in(&self, from_ns: u64, to_ns: u64) -> impl Iterator<Item = u64> + '_ {
        self.samples
            .iter()
            .filter(move |s| s.t_ns >= from_ns && s.t_ns <= to_ns)
            .map(|s| s.qlen_bytes)
    }

    /// Mean sampled queue (bytes) over `[from, to]`.
    pub fn mean_queue(&self, from_ns: u64, to_ns: u64) -> f64 {
        let (n, s) = self
            .queue_in(from_ns, to_ns)
            .fold((0u64, 0u64), |(n, s), q| (n + 1, s + q));
        s as f64 / n.max(1) as f64
    }

    /// Largest sampled queue (bytes) over `[from, to]`.
    pub fn max_queue(&self, from_ns: u64, to_ns: u64) -> u64 {
        self.queue_in(from_ns, to_ns).max().unwrap_or(0)
    }

    /// Fraction of samples in `[from, to]` whose queue lies in `[lo, hi]`.
    pub fn fraction_queue_within(&self, from_ns: u64, to_ns: u64, lo: u64, hi: u64) -> f64 {
        let (n, k) = self
            .queue_in(from_ns, to_ns)
            .fold((0u64, 0u64), |(n, k), q| {
                (n + 1, k + (lo <= q && q <= hi) as u64)
            });
        k as f64 / n.max(1) as f64
    }

    /// Writes the time series as CSV: `t_us,qlen_bytes,total_gbps` then, per flow,
    /// `fN_gbps,fN_window,fN_rate_gbps` (goodput over the preceding sample period).
    pub fn write_csv<W: Write>(&self, mut w: W) -> io::Result<()> {
        let n = self.samples.first().map_or(0, |s| s.delivered.len());
        write!(w, "t_us,qlen_bytes,total_gbps")?;
        for i in 0..n {
            write!(w, ",f{i}_gbps,f{i}_window,f{i}_rate_gbps")?;
        }
        writeln!(w)?;
        let mut prev: Option<&Sample> = None;
        for s in &self.samples {
            let dt = prev.map_or(1, |p| s.t_ns.saturating_sub(p.t_ns).max(1)) as f64;
            let g: Vec<f64> = (0..n)
                .map(|i| {
                    let before = prev.map_or(0, |p| p.delivered[i]);
                    (s.delivered[i] - before) as f64 * 8.0 / dt
                })
                .collect();
            write!(
                w,
                "{:.3},{},{:.3}",
                s.t_ns as f64 / 1e3,
                s.qlen_bytes,
                g.iter().sum::<f64>()
            )?;
            for (i, gi) in g.iter().enumerate() {
                let win = if s.window[i] == u64::MAX {
                    -1i128
                } else {
                    s.window[i] as i128
                };
                write!(w, ",{:.3},{},{:.3}", gi, win, s.rate_bps[i] as f64 / 1e9)?;
            }
            writeln!(w)?;
            prev = Some(s);
        }
        Ok(())
    }
}

/// Jain's fairness index (1 = perfectly fair); 0 for an empty or all-zero input.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || s2 <= 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * s2)
    }
}
