//! The terminal table and the JSON document of a testbed run.

use std::fmt::Write as _;

use serde::Serialize;

use super::analyze::{Calibration, CcResult, Limit};
use super::fabric::FabricConfig;

/// Everything `--json` / `--out_json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `roce-testbed`.
    pub tool: String,
    /// The scenario.
    pub scenario: String,
    /// The command line.
    pub command: String,
    /// Senders.
    pub senders: usize,
    /// Scenario parameters, as given.
    pub params: Vec<(String, String)>,
    /// The fabric.
    pub fabric: FabricConfig,
    /// Idle RTT and CPU capacity, if measured.
    pub calibration: Option<Calibration>,
    /// Where the base RTT came from.
    pub base_rtt_source: String,
    /// Per CC, in the order run.
    pub results: Vec<CcResult>,
    /// SVG files written.
    pub plots: Vec<String>,
}

fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) => format!("{x:.prec$}"),
        None => "-".into(),
    }
}

fn kb(b: u64) -> String {
    format!("{:.1}", b as f64 / 1000.0)
}

/// The comparison table, one row per CC.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let f = &r.fabric;
    let _ = writeln!(
        s,
        "roce-testbed {}: {} senders -> 1 receiver, bottleneck {:.2} Gbit/s, MTU {}, base RTT {:.0} us ({}), K_min {} KB, K_max {} KB, P_max {}, buffer {} KB",
        r.scenario,
        r.senders,
        f.bottleneck_bps as f64 / 1e9,
        f.mtu,
        f.base_rtt_ns as f64 / 1e3,
        r.base_rtt_source,
        kb(f.k_min),
        kb(f.k_max),
        f.p_max,
        kb(f.buf_max)
    );
    if let Some(c) = &r.calibration {
        let _ = writeln!(
            s,
            "calibration: idle RTT min/p50/p99 {:.1}/{:.1}/{:.1} us; without CC the senders offered {:.2} Gbit/s (bottleneck {:.0} % busy){}",
            c.rtt_min_us,
            c.rtt_p50_us,
            c.rtt_p99_us,
            c.offered_gbps,
            c.utilisation * 100.0,
            if c.fills_link { "" } else { " -> CPU-LIMITED: the senders cannot offer the bottleneck rate, lower --bottleneck" }
        );
    }
    let _ = writeln!(
        s,
        "{:<8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7} {:>10} {:>10} {:>7} {:>7} {:>6} {:>5}",
        "cc",
        "goodput",
        "util",
        "q p50",
        "q p99",
        "q max",
        "tail",
        "wred",
        "CE",
        "FCT p50",
        "FCT p99",
        "slow50",
        "slow99",
        "Jain",
        "limit"
    );
    let _ = writeln!(
        s,
        "{:<8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7} {:>10} {:>10} {:>7} {:>7} {:>6} {:>5}",
        "", "Gbit/s", "%", "KB", "KB", "KB", "drops", "drops", "marks", "us", "us", "", "", "", ""
    );
    for c in &r.results {
        let _ = writeln!(
            s,
            "{:<8} {:>8.3} {:>6.1} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7} {:>10} {:>10} {:>7} {:>7} {:>6} {:>5}",
            c.cc,
            c.goodput_gbps,
            c.utilisation * 100.0,
            kb(c.queue_p50_bytes),
            kb(c.queue_p99_bytes),
            kb(c.queue_max_bytes),
            c.tail_drops,
            c.wred_drops,
            c.ce_marks,
            opt(c.fct_p50_us, 0),
            opt(c.fct_p99_us, 0),
            opt(c.slowdown_p50, 2),
            opt(c.slowdown_p99, 2),
            opt(c.jain, 3),
            c.limit
        );
    }
    for c in &r.results {
        let mut notes = Vec::new();
        if c.limit != Limit::Link {
            notes.push(format!("limited by {}: {}", c.limit, c.limit_note));
        }
        if c.timed_out {
            notes.push("TIMED OUT (see --timeout)".into());
        }
        if !c.errors.is_empty() {
            notes.push(format!("errors: {}", c.errors.join("; ")));
        }
        if c.bytes_delivered != c.bytes_sent || !c.data_verified {
            notes.push(format!(
                "delivered {} of {} bytes, data {}",
                c.bytes_delivered,
                c.bytes_sent,
                if c.data_verified {
                    "verified"
                } else {
                    "NOT verified"
                }
            ));
        }
        if c.retransmits > 0 || c.timeouts > 0 {
            notes.push(format!(
                "{} retransmitted packets, {} timeouts",
                c.retransmits, c.timeouts
            ));
        }
        if !notes.is_empty() {
            let _ = writeln!(s, "  {}: {}", c.cc, notes.join("; "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt_formats() {
        assert_eq!(opt(None, 2), "-");
        assert_eq!(opt(Some(1.234), 2), "1.23");
        assert_eq!(kb(1500), "1.5");
    }
}
