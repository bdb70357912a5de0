//! Workloads: flow-size CDFs, Poisson arrivals at a load, N:1 incast, flow-list files.

use std::path::Path;

/// One flow: `bytes` from host `src` to host `dst`, starting at `start_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Sender.
    pub src: u32,
    /// Receiver.
    pub dst: u32,
    /// Bytes to write.
    pub bytes: u64,
    /// Start, ns.
    pub start_ns: u64,
}

/// The WebSearch flow-size CDF of the HPCC paper (sim/data/websearch_cdf.txt).
pub const WEBSEARCH: &str = include_str!("../data/websearch_cdf.txt");
/// The Facebook Hadoop flow-size CDF of the HPCC paper (sim/data/fb_hadoop_cdf.txt).
pub const FB_HADOOP: &str = include_str!("../data/fb_hadoop_cdf.txt");

/// A piecewise-linear flow-size distribution: points (bytes, cumulative fraction),
/// sampled the way the HPCC authors' traffic generator does (uniform in the CDF,
/// linear between points).
#[derive(Debug, Clone, PartialEq)]
pub struct SizeCdf {
    points: Vec<(f64, f64)>,
}

impl SizeCdf {
    /// Parses "bytes percent" lines (`#` comments); percents must rise to 100.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut points = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut it = line.split_whitespace();
            let (Some(a), Some(b), None) = (it.next(), it.next(), it.next()) else {
                return Err(format!("line {}: expected 'bytes percent'", n + 1));
            };
            let bytes: f64 = a
                .parse()
                .map_err(|_| format!("line {}: bad size {a:?}", n + 1))?;
            let pct: f64 = b
                .parse()
                .map_err(|_| format!("line {}: bad percent {b:?}", n + 1))?;
            if let Some(&(pb, pp)) = points.last() {
                if bytes < pb || pct < pp {
                    return Err(format!("line {}: the CDF must not decrease", n + 1));
                }
            }
            points.push((bytes, pct / 100.0));
        }
        match points.last() {
            Some(&(_, p)) if (p - 1.0).abs() < 1e-9 && points.len() >= 2 => Ok(Self { points }),
            _ => Err("the CDF needs at least two points and must end at 100 %".into()),
        }
    }

    /// The size at cumulative fraction `u` in [0, 1].
    pub fn quantile(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        for w in self.points.windows(2) {
            let ((x0, p0), (x1, p1)) = (w[0], w[1]);
            if u <= p1 {
                return if p1 > p0 {
                    x0 + (x1 - x0) * (u - p0) / (p1 - p0)
                } else {
                    x1
                };
            }
        }
        self.points.last().map_or(0.0, |p| p.0)
    }

    /// Mean flow size, bytes (exact for the piecewise-linear distribution).
    pub fn mean(&self) -> f64 {
        self.points
            .windows(2)
            .map(|w| (w[1].1 - w[0].1) * (w[0].0 + w[1].0) / 2.0)
            .sum()
    }
}

/// A uniform sample in (0, 1].
fn unit(rng: &mut switch::Rng) -> f64 {
    ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
}

/// Poisson flow arrivals on every host for `duration_ns`, sizes from `cdf`, each to a
/// uniformly random other host, at `load` of the host link rate (the HPCC traffic
/// generator's model). Sorted by start time.
pub fn poisson(
    hosts: u32,
    host_bps: u64,
    load: f64,
    duration_ns: u64,
    cdf: &SizeCdf,
    seed: u64,
) -> Vec<Flow> {
    let mut rng = switch::Rng::new(seed ^ 0xF10E_5EED);
    // Mean inter-arrival per host: mean size / (load x rate).
    let mean_gap_ns = cdf.mean() * 8.0 * 1e9 / (load * host_bps as f64);
    let mut flows = Vec::new();
    if hosts < 2 || load <= 0.0 {
        return flows;
    }
    for src in 0..hosts {
        let mut t = 0.0f64;
        loop {
            t += -unit(&mut rng).ln() * mean_gap_ns;
            if t >= duration_ns as f64 {
                break;
            }
            let mut dst = (rng.next_u64() % u64::from(hosts - 1)) as u32;
            if dst >= src {
                dst += 1;
            }
            let bytes = cdf.quantile(unit(&mut rng)).round().max(1.0) as u64;
            flows.push(Flow {
                src,
                dst,
                bytes,
                start_ns: t as u64,
            });
        }
    }
    flows.sort_by_key(|f| (f.start_ns, f.src));
    flows
}

/// N:1 incast: hosts 1..=n each write `bytes` to host 0, all at time 0.
pub fn incast(n: u32, bytes: u64) -> Vec<Flow> {
    (1..=n)
        .map(|src| Flow {
            src,
            dst: 0,
            bytes,
            start_ns: 0,
        })
        .collect()
}

/// A flow-list file: one flow a line, `src dst bytes start_us` (`#` comments).
pub fn flow_file(path: &Path) -> Result<Vec<Flow>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut flows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            format!(
                "{}:{}: expected 'src dst bytes start_us'",
                path.display(),
                n + 1
            )
        };
        if f.len() != 4 {
            return Err(bad());
        }
        let src = f[0].parse().map_err(|_| bad())?;
        let dst = f[1].parse().map_err(|_| bad())?;
        let bytes: u64 = f[2].parse().map_err(|_| bad())?;
        let start_us: f64 = f[3].parse().map_err(|_| bad())?;
        if bytes == 0 || start_us.is_nan() || start_us < 0.0 {
            return Err(bad());
        }
        flows.push(Flow {
            src,
            dst,
            bytes,
            start_ns: (start_us * 1000.0) as u64,
        });
    }
    flows.sort_by_key(|f| f.start_ns);
    Ok(flows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdfs_parse_and_means_match_the_papers_workloads() {
        let ws = SizeCdf::parse(WEBSEARCH).unwrap();
        let fb = SizeCdf::parse(FB_HADOOP).unwrap();
        // Known means of these tables: WebSearch about 1.6 MB, Hadoop about 0.2 MB.
        assert!((ws.mean() / 1.6e6 - 1.0).abs() < 0.1, "{}", ws.mean());
        assert!(fb.mean() < 0.4e6 && fb.mean() > 0.1e6, "{}", fb.mean());
        assert_eq!(ws.quantile(0.15), 10_000.0);
        assert_eq!(ws.quantile(1.0), 30_000_000.0);
        assert!(SizeCdf::parse("0 0\n10 50\n").is_err());
        assert!(SizeCdf::parse("0 0\n10 60\n5 100\n").is_err());
    }

    #[test]
    fn poisson_load_and_destinations() {
        let ws = SizeCdf::parse(WEBSEARCH).unwrap();
        let (hosts, bps, dur) = (16u32, 100_000_000_000u64, 200_000_000u64);
        let flows = poisson(hosts, bps, 0.3, dur, &ws, 7);
        let bytes: u64 = flows.iter().map(|f| f.bytes).sum();
        let offered = bytes as f64 * 8.0 / (dur as f64 / 1e9) / (hosts as f64 * bps as f64);
        assert!((offered - 0.3).abs() < 0.06, "offered {offered}");
        assert!(flows.iter().all(|f| f.src != f.dst && f.dst < hosts));
        assert!(flows.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
        assert_eq!(flows, poisson(hosts, bps, 0.3, dur, &ws, 7));
        assert_ne!(flows, poisson(hosts, bps, 0.3, dur, &ws, 8));
    }
}
