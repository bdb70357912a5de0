//! `dpdk-testpmd` as a baseline in the same run.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::memory::MemoryMode;

/// Memory a testpmd baseline reserves on hugepages: its pool of
/// [`TESTPMD_MBUFS`] 2176-byte mbufs (18 MiB), rings and the EAL's own.
pub const TESTPMD_HUGE_MIB: u32 = 64;
/// The same on `--no-huge` (the EAL cannot grow it there).
pub const TESTPMD_NO_HUGE_MIB: u32 = 1024;
/// testpmd's mbuf pool, the size of ours (its default, sized for every possible
/// port, would need hundreds of MiB of hugepages).
pub const TESTPMD_MBUFS: &str = "--total-num-mbufs=8191";

/// What a testpmd run measured.
#[derive(Debug, Clone)]
pub struct TestpmdRate {
    /// Median over the stats periods of the packets per second summed over
    /// all ports (receive side, or transmit side for [`run_tx`]), in Mpps.
    pub mpps: f64,
    /// Number of stats periods the median is over.
    pub samples: usize,
    /// The pages its memory was on.
    pub mode: MemoryMode,
}

/// Errors running testpmd.
#[derive(Debug, thiserror::Error)]
pub enum TestpmdError {
    /// The binary is missing or failed to start.
    #[error("cannot run dpdk-testpmd ({0}); run scripts/setup.sh")]
    Spawn(std::io::Error),
    /// It ran but printed no usable rate.
    #[error("dpdk-testpmd printed no rate; its output was:\n{0}")]
    NoRate(String),
}

/// Runs `dpdk-testpmd` with `eal_args` (cores and vdevs; the memory arguments
/// are added here) and `app_args` (plus [`TESTPMD_MBUFS`]) for about `secs`
/// seconds of forwarding (stats every second, stopped with SIGINT via
/// `timeout`; its start-up comes on top) and returns the median total receive
/// rate over the periods after the first one that moved packets (warm-up).
///
/// On hugepages when enough are free ([`MemoryMode::choose`]); if that run
/// fails (the pages went to another process meanwhile) it runs again on
/// `--no-huge`. The result says which.
pub fn run(eal_args: &[&str], app_args: &[&str], secs: u64) -> Result<TestpmdRate, TestpmdError> {
    run_best(eal_args, app_args, secs, "Rx-pps:")
}

/// As [`run`], but sums the transmit rates (`Tx-pps:`), for `txonly`.
pub fn run_tx(
    eal_args: &[&str],
    app_args: &[&str],
    secs: u64,
) -> Result<TestpmdRate, TestpmdError> {
    run_best(eal_args, app_args, secs, "Tx-pps:")
}

fn run_best(
    eal_args: &[&str],
    app_args: &[&str],
    secs: u64,
    key: &str,
) -> Result<TestpmdRate, TestpmdError> {
    let mode = MemoryMode::choose(TESTPMD_HUGE_MIB, TESTPMD_NO_HUGE_MIB);
    match run_counting(mode, eal_args, app_args, secs, key) {
        Err(TestpmdError::NoRate(_)) if mode.is_huge() => {
            let fallback = MemoryMode::NoHuge {
                mib: TESTPMD_NO_HUGE_MIB,
            };
            run_counting(fallback, eal_args, app_args, secs, key)
        }
        r => r,
    }
}

fn run_counting(
    mode: MemoryMode,
    eal_args: &[&str],
    app_args: &[&str],
    secs: u64,
    key: &str,
) -> Result<TestpmdRate, TestpmdError> {
    let out = Command::new("timeout")
        .args(["-s", "INT", &format!("{}", secs + 8)])
        .arg("dpdk-testpmd")
        .args(eal_args)
        .args(mode.eal_args("testpmd"))
        .arg("--")
        .args(app_args)
        .arg(TESTPMD_MBUFS)
        .arg("--stats-period=1")
        .stdin(Stdio::null())
        .output()
        .map_err(TestpmdError::Spawn)?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (mpps, samples) =
        parse_rates_of(&text, key).ok_or_else(|| TestpmdError::NoRate(text.clone()))?;
    std::thread::sleep(Duration::from_millis(100));
    Ok(TestpmdRate {
        mpps,
        samples,
        mode,
    })
}

/// Parses testpmd's periodic stats: each period prints one `Rx-pps:` line
/// per port, ports in order; the first port's id starts a new period.
/// Returns (median Mpps, periods).
pub fn parse_rates(text: &str) -> Option<(f64, usize)> {
    parse_rates_of(text, "Rx-pps:")
}

/// As [`parse_rates`] for the per-port lines starting with `key`.
pub fn parse_rates_of(text: &str, key: &str) -> Option<(f64, usize)> {
    let mut periods: Vec<f64> = Vec::new();
    let mut port_in_period = 0usize;
    let mut ports = 0usize;
    let mut current = 0f64;
    for line in text.lines() {
        if let Some(p) = line
            .trim()
            .strip_prefix("######################## NIC statistics for port")
        {
            let id: usize = p.split_whitespace().next()?.parse().ok()?;
            if id == 0 && port_in_period > 0 {
                periods.push(current);
                current = 0.0;
                ports = ports.max(port_in_period);
                port_in_period = 0;
            }
            port_in_period += 1;
        } else if let Some(rest) = line.trim().strip_prefix(key) {
            current += rest.split_whitespace().next()?.parse::<f64>().ok()?;
        }
    }
    if port_in_period == ports.max(1) {
        periods.push(current);
    }
    // Drop the periods before forwarding started, and the first one after
    // (partial, warm-up).
    let mut v: Vec<f64> = periods
        .into_iter()
        .skip_while(|&r| r <= 0.0)
        .skip(1)
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some((v[v.len() / 2] / 1e6, v.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_periods_and_takes_the_median_after_warmup() {
        let mut text = String::new();
        for r in [0u64, 0, 5, 10, 30, 20, 40] {
            for port in 0..2 {
                text += &format!("  ######################## NIC statistics for port {port}  ########################\n");
                text += &format!("  Rx-pps:   {}          Rx-bps: 0\n", r * 1_000_000);
            }
        }
        let r = parse_rates(&text).unwrap();
        // periods (sum of 2 ports): 0,0,10,20,60,40,80 -> from the first
        // non-zero, skip one -> 20,60,40,80 -> median (upper) 60
        assert_eq!(r, (60.0, 4));
        assert!(parse_rates("nothing here").is_none());
    }
}

/// The median of `v` (the upper one of an even count); NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Alternating rounds of a baseline and ours (docs/design.md §9): prints each
/// round's pair and ratio, then the medians and the ratio of the medians,
/// the figure a bench reports.
#[derive(Debug)]
pub struct Rounds {
    baseline: &'static str,
    theirs: Vec<f64>,
    ours: Vec<f64>,
}

impl Rounds {
    /// Rounds against `baseline` (as printed, e.g. "dpdk-testpmd io").
    pub fn new(baseline: &'static str) -> Self {
        Self {
            baseline,
            theirs: Vec::new(),
            ours: Vec::new(),
        }
    }

    /// Records and prints round `round`: the baseline's rate, ours (Mpps)
    /// and `note` about ours (drops, frames verified), if any.
    pub fn record(&mut self, round: u64, tp: &TestpmdRate, ours_mpps: f64, note: &str) {
        println!(
            "  round {round}: {} {:7.2} Mpps ({}) | ours {ours_mpps:7.2} Mpps{note} | ratio {:.3}",
            self.baseline,
            tp.mpps,
            tp.mode,
            ours_mpps / tp.mpps
        );
        self.theirs.push(tp.mpps);
        self.ours.push(ours_mpps);
    }

    /// Prints the medians and their ratio; returns the ratio.
    pub fn finish(self) -> f64 {
        let (t, o) = (median(self.theirs), median(self.ours));
        println!(
            "  median: {} {t:7.2} Mpps | ours {o:7.2} Mpps",
            self.baseline
        );
        println!("  ratio ours/testpmd: {:.3}", o / t);
        o / t
    }
}

#[cfg(test)]
mod rounds_tests {
    use super::*;

    #[test]
    fn median_is_the_middle_of_the_sorted_values() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn the_ratio_is_of_the_medians() {
        let tp = |mpps| TestpmdRate {
            mpps,
            samples: 1,
            mode: crate::memory::MemoryMode::NoHuge { mib: 64 },
        };
        let mut r = Rounds::new("baseline");
        r.record(1, &tp(10.0), 5.0, "");
        r.record(2, &tp(20.0), 1.0, "");
        r.record(3, &tp(30.0), 9.0, "");
        assert_eq!(r.finish(), 5.0 / 20.0);
    }
}
