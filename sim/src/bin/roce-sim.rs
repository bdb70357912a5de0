//! `roce-sim`: datacenter-scale experiments on the project's own transport, CC, switch
//! core and NIC scheduler (see docs/sim.md).
//!
//! ```text
//! roce-sim fattree --hosts 320 --workload websearch --load 0.3 --duration-ms 100 --cc all --seed 1 --out_json r.json
//! roce-sim incast --senders 8 --bottleneck 1Gbps --size 8MiB --cc all
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use cc::CcKind;
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use sim::report::{plot_queue_cdf, plot_slowdown, table, CcReport};
use sim::scenario::{self, Params};
use sim::topo::{hpcc_ecn, PortParams, Topology};
use sim::workload::{self, Flow, SizeCdf};
use switch::config::{parse_size, parse_speed};
use switch::Quantity;

#[derive(Parser)]
#[command(
    name = "roce-sim",
    about = "Discrete-event simulation of a RoCEv2 fabric running this project's transport, CC, switch core and NIC scheduler"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A three-tier fat-tree with Poisson flows (or a flow list).
    Fattree(FatTree),
    /// N:1 incast on one switch.
    Incast(Incast),
}

#[derive(Args)]
struct Common {
    /// none, dcqcn, hpcc, rx-hpcc, ldcp, a comma-separated list, or all.
    #[arg(long, default_value = "all")]
    cc: String,
    /// Seed of everything random (arrivals, WRED, ECMP, PSNs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// RoCE MTU.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Propagation delay of every link, us.
    #[arg(long, default_value_t = 1.0)]
    link_delay_us: f64,
    /// The CCs' base RTT T in us (default: the topology's).
    #[arg(long)]
    base_rtt_us: Option<f64>,
    /// Queue sampling interval, us.
    #[arg(long)]
    sample_us: Option<f64>,
    /// Stop after this much simulated time even if flows are unfinished, ms.
    #[arg(long, default_value_t = 2000.0)]
    max_ms: f64,
    /// Retransmit timeout, us (default: the NIC's, IBA local ACK timeout 14 = 67 ms).
    #[arg(long, default_value_t = 67_108.864)]
    timeout_us: f64,
    /// Write the results as JSON here.
    #[arg(long = "out_json", alias = "out-json")]
    out_json: Option<PathBuf>,
    /// Directory for the SVG plots.
    #[arg(long, default_value = "target/sim")]
    out: PathBuf,
    /// No plots.
    #[arg(long)]
    no_plots: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// PFC on the data class: PAUSE an ingress link above XOFF queued bytes.
    #[arg(long)]
    pfc: bool,
    /// Loss recovery of every QP: gbn (go-back-N) or sr (selective repeat with
    /// IRN's BDP cap and timeouts).
    #[arg(long = "loss-recovery", default_value = "gbn")]
    loss_recovery: rdma::transport::LossRecovery,
    /// PFC XOFF per ingress link (resume at half of it).
    #[arg(long, default_value = "256KB")]
    pfc_xoff: String,
    /// A shared buffer per switch (the HPCC paper's switches: 32MB): its data queues
    /// draw on one pool with a dynamic threshold, within their own port buffers.
    #[arg(long)]
    shared_buffer: Option<String>,
    /// The dynamic threshold's alpha as a power of two: a data queue may hold
    /// 2^N x the shared buffer's free bytes.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    shared_alpha_log2: i8,
    /// Logical partitions of the parallel event loop (default: 2 for a fat-tree of
    /// 64 hosts or more, else 1). The results depend on it, not on --threads.
    #[arg(long)]
    partitions: Option<u32>,
    /// Threads that run the partitions (default: min(partitions, cores)).
    #[arg(long)]
    threads: Option<u32>,
    /// Bytes a QP without CC (`--cc none`) sends per visit of its NIC's round
    /// robin: 0, one packet per visit, as the paper's simulator; the DPDK NIC
    /// uses 73728 (`sched::scheduler::NIC_QUANTUM_BYTES`). QPs under CC send one packet per visit either way.
    #[arg(long, default_value_t = 0)]
    sched_quantum: u32,
}

#[derive(Args)]
struct FatTree {
    #[command(flatten)]
    common: Common,
    /// Hosts of the HPCC paper's fat-tree shape (multiple of 16; 320 = the paper's).
    #[arg(long, default_value_t = 320)]
    hosts: u32,
    /// A k-ary fat-tree instead (k even), all links at --kary-speed.
    #[arg(long)]
    k: Option<u32>,
    /// Link speed of the k-ary fat-tree.
    #[arg(long, default_value = "100Gbps")]
    kary_speed: String,
    /// websearch, hadoop, or a CDF file ("bytes percent" lines).
    #[arg(long, default_value = "websearch")]
    workload: String,
    /// Offered load, fraction of the host link rate.
    #[arg(long, default_value_t = 0.3)]
    load: f64,
    /// Flow arrivals during this many ms.
    #[arg(long, default_value_t = 100.0)]
    duration_ms: f64,
    /// A flow-list file ("src dst bytes start_us" lines) instead of Poisson arrivals.
    #[arg(long)]
    flows: Option<PathBuf>,
    /// Data buffer of a 100 Gbit/s switch port (faster ports scale with speed).
    #[arg(long, default_value = "2MB")]
    port_buffer: String,
}

#[derive(Args)]
struct Incast {
    #[command(flatten)]
    common: Common,
    /// Senders.
    #[arg(long, default_value_t = 8)]
    senders: u32,
    /// Bytes each sender writes.
    #[arg(long, default_value = "8MiB")]
    size: String,
    /// Speed of the switch port to the receiver.
    #[arg(long, default_value = "1Gbps")]
    bottleneck: String,
    /// Host link rate (roce-testbed's switch ports to the senders: 100 Gbit/s).
    #[arg(long, default_value = "100Gbps")]
    host_rate: String,
    /// The NICs' line rate for CC and pacing (default: the bottleneck's, as
    /// roce-testbed's DeviceConfig::line_rate_bps).
    #[arg(long)]
    nic_rate: Option<String>,
    /// WRITE size the flows are posted as.
    #[arg(long, default_value = "32KiB")]
    msg: String,
    /// WRITEs in flight per flow.
    #[arg(long, default_value_t = 16)]
    outstanding: u16,
    /// WRED K_min.
    #[arg(long, default_value = "20KB")]
    k_min: String,
    /// WRED K_max.
    #[arg(long, default_value = "100KB")]
    k_max: String,
    /// WRED P_max.
    #[arg(long, default_value_t = 0.5)]
    p_max: f64,
    /// Data buffer per port.
    #[arg(long, default_value = "1MB")]
    buf_max: String,
}

fn size(s: &str, what: &str) -> Result<u64, String> {
    parse_size(&Quantity::Text(s.to_string())).ok_or(format!("--{what} {s:?}: not a size"))
}

fn speed(s: &str, what: &str) -> Result<u64, String> {
    parse_speed(&Quantity::Text(s.to_string())).map_err(|e| format!("--{what} {s:?}: {e}"))
}

fn ccs(s: &str) -> Result<Vec<CcKind>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(CcKind::ALL.to_vec());
    }
    s.split(',')
        .map(|x| x.parse::<CcKind>().map_err(|e| e.to_string()))
        .collect()
}

fn params(
    c: &Common,
    msg: u32,
    outstanding: u16,
    sample_default_us: f64,
) -> Result<Params, String> {
    let xoff = size(&c.pfc_xoff, "pfc-xoff")?;
    Ok(Params {
        mtu: c.mtu,
        base_rtt_ns: c.base_rtt_us.map_or(0, |u| (u * 1000.0) as u64),
        seed: c.seed,
        msg_bytes: msg,
        outstanding,
        sample_ns: (c.sample_us.unwrap_or(sample_default_us) * 1000.0) as u64,
        max_time_ns: (c.max_ms * 1e6) as u64,
        timeout_ns: (c.timeout_us * 1000.0) as u64,
        ctrl_buf: 256 << 10,
        nic_line_bps: 0,
        pfc: c.pfc.then_some((xoff, xoff / 2)),
        shared_buffer: match &c.shared_buffer {
            Some(s) => Some((size(s, "shared-buffer")?, c.shared_alpha_log2)),
            None => None,
        },
        partitions: c.partitions.unwrap_or(0),
        threads: c.threads.unwrap_or(0),
        sched_quantum: c.sched_quantum,
        loss_recovery: c.loss_recovery,
    })
}

/// Runs every CC and prints, writes and plots the results.
fn run_all(
    title: &str,
    topo: &Topology,
    flows: &[Flow],
    c: &Common,
    p: &Params,
    extra: serde_json::Value,
) -> Result<(), String> {
    let kinds = ccs(&c.cc)?;
    let offered: u64 = flows.iter().map(|f| f.bytes).sum();
    eprintln!(
        "roce-sim {title}: {} hosts, {} switches, {} flows ({:.1} MB), seed {}, T = {:.1} us",
        topo.hosts(),
        topo.switches.len(),
        flows.len(),
        offered as f64 / 1e6,
        c.seed,
        if p.base_rtt_ns > 0 {
            p.base_rtt_ns
        } else {
            topo.base_rtt_ns(p.mtu)
        } as f64
            / 1000.0
    );
    let mut reports: Vec<CcReport> = Vec::new();
    let mut loops = Vec::new();
    let mut invariants = Vec::new();
    for k in kinds {
        let r = scenario::run(topo, flows, k, p, progress_bar(k, c.quiet))?;
        if !c.quiet {
            eprintln!();
        }
        if r.totals.late_messages > 0 {
            invariants.push(format!(
                "{}: {} messages between partitions arrived after their time",
                k.as_str(),
                r.totals.late_messages
            ));
        }
        loops.push(r.totals);
        let rep = r.report;
        let min_sd = rep
            .per_flow
            .iter()
            .map(|f| f.1)
            .fold(f64::INFINITY, f64::min);
        if rep.unfinished > 0 || rep.bytes_delivered != rep.bytes_offered || min_sd < 1.0 {
            invariants.push(format!(
                "{}: {} flows unfinished, {} of {} bytes delivered, smallest slowdown {min_sd:.3}",
                rep.cc, rep.unfinished, rep.bytes_delivered, rep.bytes_offered
            ));
        }
        reports.push(rep);
    }
    // Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
    let mut out = std::io::stdout().lock();
    print_results(&mut out, &reports, &loops, p);
    if let Some(path) = &c.out_json {
        write_json(path, title, topo, flows, c.seed, extra, &reports)?;
        let _ = writeln!(out, "json: {}", path.display());
    }
    if !c.no_plots {
        std::fs::create_dir_all(&c.out).map_err(|e| format!("{}: {e}", c.out.display()))?;
        let s = c.out.join("slowdown.svg");
        plot_slowdown(&s, &reports, title)?;
        let q = c.out.join("queue_cdf.svg");
        plot_queue_cdf(&q, &reports, title)?;
        let _ = writeln!(out, "plots: {} {}", s.display(), q.display());
    }
    if invariants.is_empty() {
        Ok(())
    } else {
        Err(format!("invariants broken: {}", invariants.join("; ")))
    }
}

/// The progress bar of one CC's run on stderr (none with `--quiet`): at most two
/// redraws a second.
fn progress_bar(k: CcKind, quiet: bool) -> impl FnMut(u64, usize, usize) {
    let start = Instant::now();
    let mut last_print = 0.0f64;
    move |now: u64, done: usize, total: usize| {
        if quiet {
            return;
        }
        let el = start.elapsed().as_secs_f64();
        if el - last_print < 0.5 && done < total {
            return;
        }
        last_print = el;
        let frac = done as f64 / total.max(1) as f64;
        let bar: String = (0..30)
            .map(|i| if (i as f64) < frac * 30.0 { '#' } else { '.' })
            .collect();
        eprint!(
            "\r{:<8} [{bar}] {done}/{total} flows, {:.2} ms simulated, {:.0} s",
            k.as_str(),
            now as f64 / 1e6,
            el
        );
        let _ = std::io::stderr().flush();
    }
}

/// The tables, drops and PFC pauses, and per CC its events, time and the parallel
/// loop's partitions.
fn print_results(
    out: &mut impl Write,
    t: &[CcReport],
    loops: &[sim::fabric::RunTotals],
    p: &Params,
) {
    let _ = write!(out, "{}", table(t));
    let _ = writeln!(
        out,
        "drops: {}; PFC pause time: {}; events/s measured on a shared machine",
        t.iter()
            .map(|r| format!("{} {} (tail {})", r.cc, r.drops, r.tail_drops))
            .collect::<Vec<_>>()
            .join(", "),
        t.iter()
            .map(|r| if p.pfc.is_some() {
                format!(
                    "{} {:.3} ms ({} PAUSEs)",
                    r.cc,
                    r.pfc_pause_ns as f64 / 1e6,
                    r.pfc_pauses
                )
            } else {
                format!("{} n/a (no --pfc)", r.cc)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (r, x) in t.iter().zip(loops) {
        let _ = writeln!(
            out,
            "{}: {} events in {:.1} s wall, {:.1} s CPU on {} thread{} ({:.2} M events per wall second, {:.2} M per CPU second), {:.3} ms simulated, {} retransmissions, {} timeouts, {} CNPs, {} CE marks",
            r.cc,
            r.events,
            r.wall_s,
            r.cpu_s,
            x.threads,
            if x.threads == 1 { "" } else { "s" },
            r.events_per_s / 1e6,
            r.events_per_cpu_s / 1e6,
            r.sim_ns as f64 / 1e6,
            r.retransmits,
            r.timeouts,
            r.cnps,
            r.ce_marks
        );
        let _ = writeln!(
            out,
            "{}: {} partitions, {} ns windows ({} windows), {} messages between partitions",
            r.cc, x.partitions, x.lookahead_ns, x.windows, x.cross_messages
        );
        if x.qp_exhausted > 0 {
            let _ = writeln!(
                out,
                "{}: {} flow starts waited 10 us for a free QP ({} per NIC); {} QPs open at the end",
                r.cc,
                x.qp_exhausted,
                sim::nic::MAX_QPS,
                x.qps_open_at_end
            );
        }
    }
}

/// The run as JSON at `path`: the scenario, its parameters and each CC's report.
fn write_json(
    path: &std::path::Path,
    title: &str,
    topo: &Topology,
    flows: &[Flow],
    seed: u64,
    extra: serde_json::Value,
    reports: &[CcReport],
) -> Result<(), String> {
    let results: serde_json::Map<String, serde_json::Value> = reports
        .iter()
        .map(|r| (r.cc.clone(), serde_json::to_value(r).unwrap_or_default()))
        .collect();
    let doc = json!({
        "scenario": title,
        "topology": topo.name,
        "hosts": topo.hosts(),
        "flows": flows.len(),
        "seed": seed,
        "params": extra,
        "results": results,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn fattree(a: FatTree) -> Result<(), String> {
    let c = &a.common;
    let prop = (c.link_delay_us * 1000.0) as u64;
    let buf = size(&a.port_buffer, "port-buffer")?;
    let (shape, name) = match a.k {
        Some(k) => (
            Topology::kary_shape(k, speed(&a.kary_speed, "kary-speed")?, prop)?,
            format!("{k}-ary fat-tree"),
        ),
        None => (
            Topology::hpcc_shape(a.hosts, prop)?,
            format!("HPCC fat-tree, {} hosts", a.hosts),
        ),
    };
    let topo = Topology::fattree(&name, shape, |b| hpcc_ecn(b, buf));
    let duration_ns = (a.duration_ms * 1e6) as u64;
    let (flows, wl) = match &a.flows {
        Some(f) => (
            workload::flow_file(f)?,
            format!("flows from {}", f.display()),
        ),
        None => {
            let cdf = match a.workload.as_str() {
                "websearch" => SizeCdf::parse(workload::WEBSEARCH)?,
                "hadoop" | "fb_hadoop" => SizeCdf::parse(workload::FB_HADOOP)?,
                path => SizeCdf::parse(
                    &std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?,
                )?,
            };
            if !(a.load > 0.0 && a.load < 1.0) {
                return Err(format!("--load {}: a fraction in (0, 1)", a.load));
            }
            (
                workload::poisson(
                    topo.hosts(),
                    topo.host_rate_bps,
                    a.load,
                    duration_ns,
                    &cdf,
                    c.seed,
                ),
                format!(
                    "{} at {:.0} % load, {} ms of arrivals",
                    a.workload,
                    a.load * 100.0,
                    a.duration_ms
                ),
            )
        }
    };
    let p = params(c, 0, 1, 10.0)?;
    let title = format!("{name}, {wl}");
    run_all(
        &title,
        &topo,
        &flows,
        c,
        &p,
        json!({"workload": a.workload, "load": a.load, "duration_ms": a.duration_ms, "mtu": c.mtu, "port_buffer": buf}),
    )
}

fn incast(a: Incast) -> Result<(), String> {
    let c = &a.common;
    let bottleneck = speed(&a.bottleneck, "bottleneck")?;
    let host = speed(&a.host_rate, "host-rate")?;
    let nic = match &a.nic_rate {
        Some(s) => speed(s, "nic-rate")?,
        None => bottleneck,
    };
    if a.senders == 0 || a.senders > 250 {
        return Err(format!("--senders {}: 1..=250", a.senders));
    }
    let port = PortParams {
        speed_bps: host,
        buf_max: size(&a.buf_max, "buf-max")?,
        k_min: size(&a.k_min, "k-min")?,
        k_max: size(&a.k_max, "k-max")?,
        p_max: a.p_max,
    };
    let topo = Topology::star(
        a.senders + 1,
        host,
        bottleneck,
        (c.link_delay_us * 1000.0) as u64,
        port,
    );
    let bytes = size(&a.size, "size")?;
    let flows = workload::incast(a.senders, bytes);
    let msg = size(&a.msg, "msg")?.min(u64::from(u32::MAX >> 1)) as u32;
    let mut p = params(c, msg, a.outstanding, 5.0)?;
    p.nic_line_bps = nic;
    if c.base_rtt_us.is_none() {
        // roce-testbed's default T.
        p.base_rtt_ns = 100_000;
    }
    let title = format!(
        "incast {}:1, bottleneck {:.2} Gbit/s",
        a.senders,
        bottleneck as f64 / 1e9
    );
    run_all(
        &title,
        &topo,
        &flows,
        c,
        &p,
        json!({"senders": a.senders, "size": bytes, "bottleneck_bps": bottleneck, "host_bps": host, "nic_line_bps": nic,
               "msg": msg, "outstanding": a.outstanding, "k_min": port.k_min, "k_max": port.k_max,
               "p_max": port.p_max, "buf_max": port.buf_max, "base_rtt_ns": p.base_rtt_ns}),
    )
}

/// glibc's tunable that makes malloc back its heap with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`; glibc 2.35 and later, ignored by older ones).
const HUGE_PAGE_TUNABLE: &str = "glibc.malloc.hugetlb=1";

/// Runs this binary again with [`HUGE_PAGE_TUNABLE`] when the environment sets no
/// glibc tunables (they are read only at process start). A large fabric's working set
/// (frames in flight, queues, QP and timer state of hundreds of NICs) spans far more
/// 4 KiB pages than the TLB maps: with huge pages a 320-host run needs about a fifth
/// less CPU time (docs/sim.md, "Speed"). If the exec fails the run goes on as it is.
fn reexec_with_huge_pages() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", HUGE_PAGE_TUNABLE)
        .exec();
    eprintln!("roce-sim: running without huge pages ({err})");
}

fn main() -> ExitCode {
    reexec_with_huge_pages();
    let r = match Cli::parse().cmd {
        Cmd::Fattree(a) => fattree(a),
        Cmd::Incast(a) => incast(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("roce-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
