//! `roce-testbed`: a congestion-controlled RoCEv2 fabric in one process —
//! N sender NICs, one switch with a shaped bottleneck, one receiver NIC on
//! in-process DPDK ring pairs — running a scenario once per congestion
//! control and comparing them (table, JSON, SVG plots).
//!
//! ```text
//! roce-testbed incast --cc all                 # N:1, every sender writes --size
//! roce-testbed fairness --cc hpcc,dcqcn        # flows join one by one, then leave
//! roce-testbed longshort --cc ldcp             # one long flow + short WRITEs (FCT)
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use bench::testbed::analyze::{self, Calibration, CcResult};
use bench::testbed::fabric::{self, FabricConfig};
use bench::testbed::report::{self, Report};
use bench::testbed::{parse_size, parse_speed, plot, TestbedError, Workload};
use cc::CcKind;
use clap::{Args, Parser, Subcommand};
use dpdk::Eal;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "In-process RoCEv2 fabric (N senders -> switch with a shaped bottleneck -> 1 receiver) comparing congestion controls",
    after_help = "EAL arguments may follow `--` (default: --no-huge -m 1024 --no-pci --no-shconf --no-telemetry)."
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// N:1 incast: all senders start together, each WRITEs --size bytes.
    Incast {
        /// Bytes each sender writes.
        #[arg(long, default_value = "8MiB", value_parser = parse_size)]
        size: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Flows join one every --phase-ms, then leave in reverse order; Jain per phase.
    Fairness {
        /// Time between two joins (and two leaves), ms.
        #[arg(long = "phase-ms", default_value_t = 400)]
        phase_ms: u64,
        #[command(flatten)]
        common: Common,
    },
    /// One long flow (sender 0) plus short RPC-like WRITEs from the other senders; FCT of the short ones.
    Longshort {
        /// Length of the long flow, ms.
        #[arg(long = "duration-ms", default_value_t = 2000)]
        duration_ms: u64,
        /// Size of a short WRITE.
        #[arg(long = "rpc-size", default_value = "16KiB", value_parser = parse_size)]
        rpc_size: u64,
        /// Load of the short WRITEs as a fraction of the bottleneck (Poisson arrivals).
        #[arg(long, default_value_t = 0.1)]
        load: f64,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Congestion control: none, dcqcn, hpcc, rx-hpcc, ldcp, a comma-separated list, or all.
    #[arg(long, default_value = "all")]
    cc: String,
    /// Sender NICs (default: 8 for incast, 4 for fairness and longshort).
    #[arg(long)]
    senders: Option<usize>,
    /// Bottleneck speed (the switch port towards the receiver); also every NIC's line rate.
    #[arg(long, default_value = "1Gbps", value_parser = parse_speed)]
    bottleneck: u64,
    /// Path MTU: 256, 512 or 1024 (frames must fit one mbuf for the switch core).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// WRITE size of the bulk flows.
    #[arg(long, default_value = "32KiB", value_parser = parse_size)]
    msg: u64,
    /// WRITEs in flight per sender QP.
    #[arg(long, default_value_t = 16)]
    outstanding: usize,
    /// Base RTT T the CCs size their windows from (HPCC++ W_max = B*T, LDCP IW), us, or
    /// `auto` (the calibration's idle RTT at --rtt-percentile). Must cover the RTT under
    /// load: all NIC engines share one core, so that is several times the idle RTT.
    #[arg(long = "base-rtt-us", default_value = "100")]
    base_rtt_us: String,
    /// With `--base-rtt-us auto`: the percentile of the idle RTT samples to use.
    #[arg(long = "rtt-percentile", default_value_t = 0.5)]
    rtt_percentile: f64,
    /// WRED K_min.
    #[arg(long = "k-min", default_value = "20KB", value_parser = parse_size)]
    k_min: u64,
    /// WRED K_max.
    #[arg(long = "k-max", default_value = "100KB", value_parser = parse_size)]
    k_max: u64,
    /// WRED P_max.
    #[arg(long = "p-max", default_value_t = 0.5)]
    p_max: f64,
    /// Switch buffer per port.
    #[arg(long = "buf-max", default_value = "1MB", value_parser = parse_size)]
    buf_max: u64,
    /// Not-ECT drop threshold K (LDCP's first-RTT packets); default K_max.
    #[arg(long = "k-drop", value_parser = parse_size)]
    k_drop: Option<u64>,
    /// Shaper idle credit at the bottleneck.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    burst: u64,
    /// Queue sampling interval at the bottleneck, us.
    #[arg(long = "sample-us", default_value_t = 5.0)]
    sample_us: f64,
    /// Seed (WRED marking, short-WRITE arrivals).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory for the plots and report.json.
    #[arg(long, default_value = "target/testbed")]
    out: PathBuf,
    /// Also write the JSON report to this file.
    #[arg(long = "out_json")]
    out_json: Option<PathBuf>,
    /// Print the JSON report on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// Do not draw the SVG plots.
    #[arg(long = "no-plots")]
    no_plots: bool,
    /// Skip the idle-fabric calibration (idle RTT, what the CPU can offer).
    #[arg(long = "no-calibrate")]
    no_calibrate: bool,
    /// Length of the calibration's all-senders blast, ms.
    #[arg(long = "calib-ms", default_value_t = 300)]
    calib_ms: u64,
    /// Stop a CC's run after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// CPU of the NIC engines' thread (default 0 when there are 2+ CPUs).
    #[arg(long = "nic-core")]
    nic_core: Option<usize>,
    /// CPU of the switch thread (default 1 when there are 2+ CPUs).
    #[arg(long = "switch-core")]
    switch_core: Option<usize>,
    /// Do not pin the two fabric threads.
    #[arg(long = "no-pin")]
    no_pin: bool,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let (ours, eal): (Vec<String>, Vec<String>) = match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args.clone(), Vec::new()),
    };
    let cli = Cli::parse_from(&ours);
    if let Err(e) = run(cli, eal, ours.join(" ")) {
        eprintln!("roce-testbed: {e}");
        std::process::exit(1);
    }
}

fn parse_ccs(s: &str) -> Result<Vec<CcKind>, TestbedError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(CcKind::ALL.to_vec());
    }
    let mut v = Vec::new();
    for part in s.split(',') {
        let k: CcKind = part.trim().parse().map_err(|_| {
            TestbedError::Config(format!(
                "--cc {part}: expected none, dcqcn, hpcc, rx-hpcc, ldcp, a comma-separated list or all"
            ))
        })?;
        if !v.contains(&k) {
            v.push(k);
        }
    }
    Ok(v)
}

/// A progress bar on stderr, drawn only on a terminal and once a run takes
/// more than two seconds.
struct Progress {
    on: bool,
    started: Instant,
    drawn: bool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            on: std::io::stderr().is_terminal(),
            started: Instant::now(),
            drawn: false,
        }
    }
    fn draw(&mut self, label: &str, frac: f64) {
        if !self.on || self.started.elapsed().as_secs_f64() < 2.0 {
            return;
        }
        let w = 30;
        let k = ((frac.clamp(0.0, 1.0)) * w as f64) as usize;
        eprint!(
            "\r{label:<28} [{}{}] {:>3.0} %  {:>5.1} s",
            "#".repeat(k),
            "-".repeat(w - k),
            frac * 100.0,
            self.started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        self.drawn = true;
    }
    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r{:<80}\r", "");
            let _ = std::io::stderr().flush();
            self.drawn = false;
        }
    }
}

fn write_file(path: &std::path::Path, data: &str) -> Result<(), TestbedError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| TestbedError::Io {
            path: dir.display().to_string(),
            err: e,
        })?;
    }
    std::fs::write(path, data).map_err(|e| TestbedError::Io {
        path: path.display().to_string(),
        err: e,
    })
}

/// The scenario's name, its common flags and its own parameters (for the report).
fn scenario_parts(cli: &Cli) -> (&'static str, Common, Vec<(String, String)>) {
    match &cli.scenario {
        Scenario::Incast { size, common } => (
            "incast",
            common.clone(),
            vec![("size".to_string(), size.to_string())],
        ),
        Scenario::Fairness { phase_ms, common } => (
            "fairness",
            common.clone(),
            vec![("phase_ms".to_string(), phase_ms.to_string())],
        ),
        Scenario::Longshort {
            duration_ms,
            rpc_size,
            load,
            common,
        } => (
            "longshort",
            common.clone(),
            vec![
                ("duration_ms".to_string(), duration_ms.to_string()),
                ("rpc_size".to_string(), rpc_size.to_string()),
                ("load".to_string(), load.to_string()),
            ],
        ),
    }
}

/// `--base-rtt-us`: microseconds, or `auto` (None: measured by the calibration).
fn base_rtt_us(c: &Common) -> Result<Option<f64>, TestbedError> {
    Ok(if c.base_rtt_us.trim().eq_ignore_ascii_case("auto") {
        None
    } else {
        match c.base_rtt_us.trim().parse::<f64>() {
            Ok(r) if r > 0.0 && r <= 1e6 => Some(r),
            _ => {
                return Err(TestbedError::Config(format!(
                    "--base-rtt-us {}: expected microseconds in (0, 1e6] or auto",
                    c.base_rtt_us
                )))
            }
        }
    })
}

/// The scenario's flows, its flags checked.
fn workload(cli: &Cli, c: &Common, senders: usize, msg: u32) -> Result<Workload, TestbedError> {
    Ok(match &cli.scenario {
        Scenario::Incast { size, .. } => {
            if *size == 0 {
                return Err(TestbedError::Config("--size must be > 0".into()));
            }
            Workload::incast(senders, *size, msg, c.bottleneck)
        }
        Scenario::Fairness { phase_ms, .. } => {
            if *phase_ms == 0 {
                return Err(TestbedError::Config("--phase-ms must be > 0".into()));
            }
            Workload::fairness(senders, phase_ms * 1_000_000, msg)
        }
        Scenario::Longshort {
            duration_ms,
            rpc_size,
            load,
            ..
        } => {
            if !(*load > 0.0 && *load < 1.0) {
                return Err(TestbedError::Config("--load must be in (0, 1)".into()));
            }
            let rpc = u32::try_from(*rpc_size)
                .ok()
                .filter(|&m| (1..=1 << 24).contains(&m))
                .ok_or_else(|| TestbedError::Config("--rpc-size must be 1 B .. 16 MiB".into()))?;
            if *duration_ms == 0 {
                return Err(TestbedError::Config("--duration-ms must be > 0".into()));
            }
            Workload::longshort(
                senders,
                duration_ms * 1_000_000,
                msg,
                rpc,
                *load,
                c.bottleneck,
                c.seed,
            )
        }
    })
}

/// The calibration run with CC none: the idle RTT and what the senders' CPU can
/// offer; with `--base-rtt-us auto` the CCs' base RTT becomes the idle RTT's
/// `--rtt-percentile`. The calibration, the idle RTT (ns) and where the base RTT
/// came from.
fn calibrate(
    eal: &'static Eal,
    cfg: &mut FabricConfig,
    c: &Common,
    senders: usize,
    base_rtt_us: Option<f64>,
    progress: &mut Progress,
    tag: u32,
) -> Result<(Calibration, u64, String), TestbedError> {
    let mut rtt_source = "set with --base-rtt-us".to_string();
    let w = Workload::calibration(senders, 40, 300_000, cfg.mtu, c.calib_ms.max(1) * 1_000_000);
    let mut ccfg = cfg.clone();
    ccfg.timeout_ns = w.planned_ns * 4 + 2_000_000_000;
    let d = fabric::run(eal, &ccfg, CcKind::None, &w, &format!("{tag}"), &mut |f| {
        progress.draw("calibration", f)
    })?;
    progress.clear();
    let cal = analyze::calibration(&d, &ccfg, &w);
    let mut rtts: Vec<f64> = d
        .flows
        .iter()
        .filter(|f| f.spec.kind == bench::testbed::FlowKind::Short)
        .filter_map(|f| Some((f.end_ns? - f.spec.start_ns) as f64))
        .collect();
    rtts.sort_by(f64::total_cmp);
    let idle_rtt_ns = (cal.rtt_min_us.max(1.0) * 1e3) as u64;
    if base_rtt_us.is_none() {
        let p = analyze::percentile(&rtts, c.rtt_percentile).unwrap_or(100_000.0);
        cfg.base_rtt_ns = (p as u64).max(1_000);
        rtt_source = format!("measured: idle RTT p{:.0}", c.rtt_percentile * 100.0);
    }
    Ok((cal, idle_rtt_ns, rtt_source))
}

/// The report as JSON (in `--out` and `--out-json`), the table and where things
/// went.
fn write_report(rep: &Report, c: &Common) -> Result<(), TestbedError> {
    let json = serde_json::to_string_pretty(rep)
        .map_err(|e| TestbedError::Config(format!("JSON: {e}")))?;
    let report_path = c.out.join("report.json");
    write_file(&report_path, &json)?;
    if let Some(p) = &c.out_json {
        write_file(p, &json)?;
    }
    let table = report::table(rep);
    let mut where_ = format!("report: {}", report_path.display());
    for p in &rep.plots {
        where_ += &format!("\nplot:   {p}");
    }
    if c.json {
        eprint!("{table}");
        eprintln!("{where_}");
        println!("{json}");
    } else {
        print!("{table}");
        println!("{where_}");
    }
    Ok(())
}

fn run(cli: Cli, eal_args: Vec<String>, command: String) -> Result<(), TestbedError> {
    let (name, c, params) = scenario_parts(&cli);
    let ccs = parse_ccs(&c.cc)?;
    let senders = c.senders.unwrap_or(if name == "incast" { 8 } else { 4 });
    let msg = u32::try_from(c.msg)
        .ok()
        .filter(|&m| (1..=1 << 24).contains(&m))
        .ok_or_else(|| TestbedError::Config(format!("--msg {}: must be 1 B .. 16 MiB", c.msg)))?;
    if !(c.sample_us > 0.0 && c.sample_us <= 10_000.0) {
        return Err(TestbedError::Config(
            "--sample-us must be in (0, 10000]".into(),
        ));
    }
    if !(0.0..=1.0).contains(&c.rtt_percentile) {
        return Err(TestbedError::Config(
            "--rtt-percentile must be in [0, 1]".into(),
        ));
    }
    let base_rtt_us = base_rtt_us(&c)?;
    if c.no_calibrate && base_rtt_us.is_none() {
        return Err(TestbedError::Config(
            "--base-rtt-us auto needs the calibration (drop --no-calibrate)".into(),
        ));
    }
    let workload = workload(&cli, &c, senders, msg)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = !c.no_pin && cpus >= 2;
    let mut cfg = FabricConfig {
        bottleneck_bps: c.bottleneck,
        buf_max: c.buf_max,
        k_min: c.k_min,
        k_max: c.k_max,
        p_max: c.p_max,
        k_drop: c.k_drop.unwrap_or(c.k_max),
        burst: c.burst,
        mtu: c.mtu,
        base_rtt_ns: base_rtt_us.map_or(100_000, |r| (r * 1e3) as u64),
        outstanding: c.outstanding,
        region: 4 << 20,
        nic_core: c.nic_core.or(pin.then_some(0)),
        switch_core: c.switch_core.or(pin.then_some(1)),
        sample_ns: (c.sample_us * 1e3).max(1.0) as u64,
        seed: c.seed,
        timeout_ns: c.timeout.max(1) * 1_000_000_000,
    };
    // Bad flags fail here, before DPDK starts.
    fabric::check_config(&cfg, senders)?;

    let eal = Eal::init(&dpdk::tool_args("roce-testbed", &eal_args, false))?;
    let mut progress = Progress::new();
    let mut tag = 0u32;

    // Calibration: idle RTT and what the CPU can offer, with CC none.
    let (calibration, idle_rtt_ns, rtt_source) = if c.no_calibrate {
        (None, cfg.base_rtt_ns, "set with --base-rtt-us".to_string())
    } else {
        let (cal, idle, source) =
            calibrate(eal, &mut cfg, &c, senders, base_rtt_us, &mut progress, tag)?;
        tag += 1;
        (Some(cal), idle, source)
    };

    let mut results: Vec<CcResult> = Vec::new();
    for (i, &cc) in ccs.iter().enumerate() {
        let label = format!("{name} {cc} ({}/{})", i + 1, ccs.len());
        let d = fabric::run(eal, &cfg, cc, &workload, &format!("{tag}"), &mut |f| {
            progress.draw(&label, f)
        })?;
        tag += 1;
        progress.clear();
        let r = analyze::analyze(&d, &cfg, &workload, idle_rtt_ns, calibration.as_ref());
        tracing::info!(cc = %cc, goodput = r.goodput_gbps, "run done");
        results.push(r);
    }

    let mut rep = Report {
        tool: "roce-testbed".into(),
        scenario: name.into(),
        command,
        senders,
        params,
        fabric: cfg.clone(),
        calibration,
        base_rtt_source: rtt_source,
        results,
        plots: Vec::new(),
    };
    if !c.no_plots {
        let files = plot::all(
            &c.out,
            &rep.results,
            cfg.k_min,
            cfg.k_max,
            cfg.bottleneck_bps as f64 / 1e9,
        )?;
        rep.plots = files.iter().map(|p| p.display().to_string()).collect();
    }
    write_report(&rep, &c)
}
