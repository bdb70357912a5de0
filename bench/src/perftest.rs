//! perftest's output, so that `roce-perf` reads like `ib_write_bw` and
//! `ib_write_lat` (the preamble with local and remote address lines, and the
//! bandwidth and latency result tables, with perftest's columns and units).

use std::fmt::Write as _;

/// One side's connection parameters, as perftest prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressLine {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Virtual address of the buffer.
    pub vaddr: u64,
    /// IPv4 address (printed as perftest prints a RoCEv2 GID).
    pub ip: [u8; 4],
}

impl AddressLine {
    /// `local address: LID 0000 QPN 0x0107 PSN 0x5f4a3e RKey 0x1fffbd VAddr 0x007f7e0a5b8000`
    /// followed by the GID line, exactly as perftest formats them.
    pub fn format(&self, side: &str) -> String {
        format!(
            " {side} address: LID 0000 QPN {:#06x} PSN {:#08x} RKey {:#08x} VAddr {:#016x}\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:{:02}:{:02}:{:02}:{:02}\n",
            self.qpn, self.psn, self.rkey, self.vaddr, self.ip[0], self.ip[1], self.ip[2], self.ip[3]
        )
    }
}

/// perftest's horizontal rule.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The test banner and settings block.
pub fn preamble(title: &str, settings: &[(&str, String)]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{RULE}");
    let _ = writeln!(s, "                    {title}");
    for (k, v) in settings {
        let _ = writeln!(s, " {k:<16}: {v}");
    }
    let _ = writeln!(s, "{RULE}");
    s
}

/// One row of a bandwidth test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size in bytes.
    pub bytes: u64,
    /// Messages completed.
    pub iterations: u64,
    /// Highest rate over any window, in bytes per second.
    pub peak_bps: f64,
    /// Average rate, in bytes per second.
    pub avg_bps: f64,
    /// Messages per second.
    pub msg_rate: f64,
}

/// The bandwidth table header; `gbits` selects `--report_gbits` units.
pub fn bw_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]\n")
}

/// One bandwidth row, in perftest's units: MB/sec is 2^20 bytes per
/// second; Gb/sec is 10^9 bits per second.
pub fn bw_row(r: &BwRow, gbits: bool) -> String {
    let conv = |bps: f64| {
        if gbits {
            bps * 8.0 / 1e9
        } else {
            bps / 1_048_576.0
        }
    };
    format!(
        " {:<10} {:<10}       {:<7.2}            {:<7.2}\t\t   {:.6}\n",
        r.bytes,
        r.iterations,
        conv(r.peak_bps),
        conv(r.avg_bps),
        r.msg_rate / 1e6
    )
}

/// Latency statistics over a run, in microseconds, as perftest reports them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    /// Minimum.
    pub t_min: f64,
    /// Maximum.
    pub t_max: f64,
    /// The median ("typical").
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl LatStats {
    /// Computes the statistics from samples in nanoseconds (sorted in place).
    /// `None` for an empty sample set.
    pub fn from_ns(samples: &mut [u64]) -> Option<LatStats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let n = samples.len();
        let us = |ns: u64| ns as f64 / 1000.0;
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / n as f64;
        let var = samples
            .iter()
            .map(|&s| (s as f64 - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        // perftest's percentile: the sample at index ceil(p * n) - 1.
        let pct = |p: f64| us(samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1]);
        Some(LatStats {
            t_min: us(samples[0]),
            t_max: us(samples[n - 1]),
            t_typical: us(samples[n / 2]),
            t_avg: mean / 1000.0,
            t_stdev: var.sqrt() / 1000.0,
            p99: pct(0.99),
            p999: pct(0.999),
        })
    }
}

/// The latency table header.
pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n".to_string()
}

/// One latency row.
pub fn lat_row(bytes: u64, iterations: u64, s: &LatStats) -> String {
    format!(
        " {:<6} {:<10}     {:<7.2}        {:<7.2}      {:<7.2}     \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}\t\t{:<7.2}\n",
        bytes, iterations, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p999
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_line_matches_perftest_layout() {
        let a = AddressLine {
            qpn: 0x107,
            psn: 0x5f4a3e,
            rkey: 0x1fffbd,
            vaddr: 0x7f7e0a5b8000,
            ip: [10, 0, 0, 1],
        };
        assert_eq!(
            a.format("local"),
            " local address: LID 0000 QPN 0x0107 PSN 0x5f4a3e RKey 0x1fffbd VAddr 0x007f7e0a5b8000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01\n"
        );
    }

    #[test]
    fn bw_units_follow_perftest() {
        let r = BwRow {
            bytes: 65536,
            iterations: 5000,
            peak_bps: 12.5e9,
            avg_bps: 1_048_576.0 * 1000.0,
            msg_rate: 186_132.0,
        };
        let mb = bw_row(&r, false);
        assert!(mb.contains("11920.93"), "{mb}"); // 12.5e9 / 2^20
        assert!(mb.contains("1000.00"), "{mb}");
        assert!(mb.contains("0.186132"), "{mb}");
        let gb = bw_row(&r, true);
        assert!(gb.contains("100.00"), "{gb}"); // 12.5e9 B/s = 100 Gb/s
        assert!(bw_header(true).contains("BW peak[Gb/sec]"));
        assert!(bw_header(false).contains("BW average[MB/sec]"));
    }

    #[test]
    fn latency_statistics() {
        let mut v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect(); // 1..1000 us
        v.reverse();
        let s = LatStats::from_ns(&mut v).unwrap();
        assert_eq!(s.t_min, 1.0);
        assert_eq!(s.t_max, 1000.0);
        assert_eq!(s.t_typical, 501.0);
        assert!((s.t_avg - 500.5).abs() < 1e-9);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!((s.t_stdev - 288.6749).abs() < 1e-3);
        assert!(LatStats::from_ns(&mut []).is_none());
        assert!(lat_header().contains("99.9% percentile[usec]"));
    }
}
