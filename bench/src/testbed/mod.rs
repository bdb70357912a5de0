//! `roce-testbed`: a whole congestion-controlled RoCEv2 fabric in one process
//! (docs/design.md §1 job 4, issue 7).
//!
//! N sender NICs and one receiver NIC ([`nic::verbs::Device`], all engines on
//! one poll-mode thread with [`nic::verbs::Device::open_group`]) are cabled
//! to one switch ([`switch::dataplane::Dataplane`]) through in-process DPDK
//! ring pairs. The switch port towards the receiver is shaped to the
//! bottleneck speed; every other port runs at 100 Gbit/s. The switch poll
//! loop runs on a second thread that we drive ourselves ([`fabric`]): besides
//! `Dataplane::poll` it samples the bottleneck queue every few microseconds,
//! posts the scenario's RDMA WRITEs and polls the senders' completion queues,
//! so that every timestamp (post, completion, queue sample) comes from the
//! same TSC clock without a third spinning thread.
//!
//! * [`Workload`]: the scenarios (`incast`, `fairness`, `longshort`) as flows
//!   of RDMA WRITEs with start times.
//! * [`fabric`]: builds the fabric for one CC and runs a workload on it.
//! * [`analyze`]: turns what a run recorded into the figures of one CC.
//! * [`report`]: the terminal table and the JSON document.
//! * [`plot`]: SVG plots (queue over time, per-flow rate, FCT CDF).

pub mod analyze;
mod driver;
pub mod fabric;
pub mod plot;
pub mod report;

use serde::Serialize;

/// Errors of the testbed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// A DPDK call failed.
    #[error("DPDK: {0}")]
    Dpdk(#[from] dpdk::Error),
    /// The NIC refused something.
    #[error("NIC: {0}")]
    Verbs(#[from] nic::verbs::VerbsError),
    /// The switch configuration is invalid.
    #[error("switch configuration: {0}")]
    Switch(#[from] switch::ConfigError),
    /// A setting is out of range.
    #[error("{0}")]
    Config(String),
    /// A file could not be written.
    #[error("{path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        err: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("plot {0}")]
    Plot(String),
    /// A thread of the fabric died.
    #[error("{0}")]
    Thread(String),
}

/// Parses a byte size: an integer, or a number with `B`, `K`/`KB`/`M`/`MB`/`G`/`GB`
/// (powers of 1000) or `KiB`/`MiB`/`GiB` (powers of 1024), e.g. `64KiB`, `1.5MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 65536, 64KiB, 2MB)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        _ => {
            return Err(format!(
                "'{s}': unknown size unit '{unit}' (B, KB, KiB, MB, MiB, GB, GiB)"
            ))
        }
    };
    let b = v * mult;
    if !b.is_finite() || !(0.0..=1e15).contains(&b) {
        return Err(format!("'{s}' is out of range"));
    }
    Ok(b.round() as u64)
}

/// Parses a link speed in bit/s: an integer, or a number with `bps`, `Kbps`,
/// `Mbps`, `Gbps` (also `K`, `M`, `G`, `Gbit/s`), e.g. `2Gbps`, `500Mbps`.
pub fn parse_speed(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a speed (e.g. 2Gbps, 500Mbps)"))?;
    let u = unit.trim().to_ascii_lowercase();
    let u = u
        .trim_end_matches("bit/s")
        .trim_end_matches("bps")
        .trim_end_matches("b/s");
    let mult = match u {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return Err(format!("'{s}': unknown speed unit (bps, Mbps, Gbps)")),
    };
    let b = v * mult;
    if !b.is_finite() || !(1e6..=4e11).contains(&b) {
        return Err(format!(
            "'{s}': the bottleneck must be between 1 Mbit/s and 400 Gbit/s"
        ));
    }
    Ok(b.round() as u64)
}

/// SplitMix64: a small deterministic generator for the scenarios (`--seed`).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    /// Exponential with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

/// When a flow stops posting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// After this many bytes.
    Bytes(u64),
    /// At this time (ns after the workload's start); what is in flight then completes.
    At(u64),
}

/// What a flow stands for in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowKind {
    /// A bulk flow (incast, fairness, the long flow of longshort).
    Long,
    /// A short RPC-like WRITE (longshort).
    Short,
}

/// One flow: a sequence of RDMA WRITEs of `msg` bytes on one sender's QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FlowSpec {
    /// The sender (0-based) whose QP carries it; flows of one sender run one
    /// after the other, in start order.
    pub sender: usize,
    /// Start (ns after the workload's start).
    pub start_ns: u64,
    /// When it stops.
    pub stop: Stop,
    /// Message size (the last message of a `Bytes` flow may be shorter).
    pub msg: u32,
    /// Role.
    pub kind: FlowKind,
}

/// A scenario: flows and how to judge them.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// `incast`, `fairness`, `longshort` or `calibration`.
    pub name: String,
    /// Senders used.
    pub senders: usize,
    /// The flows, sorted by start.
    pub flows: Vec<FlowSpec>,
    /// Expected duration at the bottleneck rate (for the progress bar and the plot bins).
    pub planned_ns: u64,
    /// Times at which the set of active flows changes (fairness phases).
    pub events_ns: Vec<u64>,
}

impl Workload {
    /// N:1 incast: every sender writes `size` bytes in `msg`-byte WRITEs, all
    /// starting together.
    pub fn incast(senders: usize, size: u64, msg: u32, bottleneck_bps: u64) -> Workload {
        let flows = (0..senders)
            .map(|s| FlowSpec {
                sender: s,
                start_ns: 0,
                stop: Stop::Bytes(size),
                msg,
                kind: FlowKind::Long,
            })
            .collect();
        Workload {
            name: "incast".into(),
            senders,
            flows,
            planned_ns: bytes_time_ns(size * senders as u64, bottleneck_bps),
            events_ns: vec![0],
        }
    }

    /// Flows join one by one every `phase_ns` and leave in reverse order:
    /// flow i runs from `i * phase` to `(2N - 1 - i) * phase`.
    pub fn fairness(senders: usize, phase_ns: u64, msg: u32) -> Workload {
        let n = senders as u64;
        let flows = (0..senders)
            .map(|s| FlowSpec {
                sender: s,
                start_ns: s as u64 * phase_ns,
                stop: Stop::At((2 * n - 1 - s as u64) * phase_ns),
                msg,
                kind: FlowKind::Long,
            })
            .collect();
        Workload {
            name: "fairness".into(),
            senders,
            flows,
            planned_ns: (2 * n - 1) * phase_ns,
            events_ns: (0..2 * n).map(|k| k * phase_ns).collect(),
        }
    }

    /// One long flow (sender 0, `duration_ns`) plus short WRITEs of `rpc`
    /// bytes from senders 1..N, Poisson arrivals at `load` of the bottleneck
    /// in total, each on a sender picked at random.
    pub fn longshort(
        senders: usize,
        duration_ns: u64,
        msg: u32,
        rpc: u32,
        load: f64,
        bottleneck_bps: u64,
        seed: u64,
    ) -> Workload {
        let mut flows = vec![FlowSpec {
            sender: 0,
            start_ns: 0,
            stop: Stop::At(duration_ns),
            msg,
            kind: FlowKind::Long,
        }];
        let shorts = senders.saturating_sub(1).max(1);
        let mean_gap = u64::from(rpc) as f64 * 8.0 / (bottleneck_bps as f64 * load) * 1e9;
        let mut rng = Rng::new(seed);
        // Leave the first 10 % to the long flow alone, so it is at speed.
        let mut t = duration_ns as f64 * 0.1;
        let end = duration_ns as f64 * 0.95;
        loop {
            t += rng.exp(mean_gap);
            if t >= end {
                break;
            }
            let s = if senders > 1 {
                1 + (rng.next_u64() % shorts as u64) as usize
            } else {
                0
            };
            flows.push(FlowSpec {
                sender: s,
                start_ns: t as u64,
                stop: Stop::Bytes(u64::from(rpc)),
                msg: rpc,
                kind: FlowKind::Short,
            });
        }
        flows.sort_by_key(|f| f.start_ns);
        Workload {
            name: "longshort".into(),
            senders: senders.max(1),
            flows,
            planned_ns: duration_ns,
            events_ns: vec![0, duration_ns],
        }
    }

    /// The calibration run: `pings` one-packet WRITEs from sender 0 on an
    /// idle fabric, `gap_ns` apart (their completion times are the idle
    /// RTT), then every sender at full speed for `blast_ns` (what the CPU
    /// can offer to the bottleneck).
    pub fn calibration(
        senders: usize,
        pings: usize,
        gap_ns: u64,
        mtu: u32,
        blast_ns: u64,
    ) -> Workload {
        let mut flows: Vec<FlowSpec> = (0..pings)
            .map(|i| FlowSpec {
                sender: 0,
                start_ns: i as u64 * gap_ns,
                stop: Stop::Bytes(u64::from(mtu)),
                msg: mtu,
                kind: FlowKind::Short,
            })
            .collect();
        let t0 = (pings as u64 + 2) * gap_ns;
        for s in 0..senders {
            flows.push(FlowSpec {
                sender: s,
                start_ns: t0,
                stop: Stop::At(t0 + blast_ns),
                msg: 64 << 10,
                kind: FlowKind::Long,
            });
        }
        Workload {
            name: "calibration".into(),
            senders,
            flows,
            planned_ns: t0 + blast_ns,
            events_ns: vec![0, t0, t0 + blast_ns],
        }
    }

    /// Total bytes of the `Bytes` flows, if every flow is one (progress by bytes).
    pub fn total_bytes(&self) -> Option<u64> {
        self.flows
            .iter()
            .map(|f| match f.stop {
                Stop::Bytes(b) => Some(b),
                Stop::At(_) => None,
            })
            .sum()
    }
}

/// Time to send `bytes` of payload at `bps` (ns).
pub fn bytes_time_ns(bytes: u64, bps: u64) -> u64 {
    (bytes as f64 * 8.0 / bps.max(1) as f64 * 1e9) as u64
}

/// Wire bytes of a `bytes`-byte WRITE at `mtu`: per packet Ethernet (14) +
/// IPv4 (20) + UDP (8) + BTH (12) + ICRC (4) + FCS (4) + preamble and
/// inter-frame gap (20), plus one RETH (16) per message.
pub fn wire_bytes(bytes: u64, mtu: u32) -> u64 {
    let pkts = bytes.div_ceil(u64::from(mtu.max(1))).max(1);
    bytes + pkts * (14 + 20 + 8 + 12 + 4 + 4 + 20) + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_speeds() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("1.5 MiB"), Ok(1_572_864));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_speed("2Gbps"), Ok(2_000_000_000));
        assert_eq!(parse_speed("500Mbps"), Ok(500_000_000));
        assert_eq!(parse_speed("2.5 Gbit/s"), Ok(2_500_000_000));
        assert_eq!(parse_speed("1G"), Ok(1_000_000_000));
        assert!(parse_speed("fast").is_err());
        assert!(parse_speed("10bps").is_err());
    }

    #[test]
    fn workloads() {
        let w = Workload::incast(4, 1 << 20, 65536, 1_000_000_000);
        assert_eq!(w.flows.len(), 4);
        assert_eq!(w.total_bytes(), Some(4 << 20));
        let f = Workload::fairness(3, 1000, 4096);
        assert_eq!(f.flows[0].stop, Stop::At(5000));
        assert_eq!(f.flows[2].start_ns, 2000);
        assert_eq!(f.flows[2].stop, Stop::At(3000));
        assert_eq!(f.planned_ns, 5000);
        assert_eq!(f.total_bytes(), None);
        let l = Workload::longshort(3, 100_000_000, 65536, 8192, 0.1, 1_000_000_000, 1);
        let shorts = l.flows.iter().filter(|f| f.kind == FlowKind::Short).count();
        // 10 % of 1 Gbit/s in 8 KiB RPCs over 85 ms: ~130.
        assert!((80..200).contains(&shorts), "{shorts}");
        assert!(l.flows.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
        assert!(l
            .flows
            .iter()
            .all(|f| f.kind == FlowKind::Long || (1..3).contains(&f.sender)));
    }
}
