//! `roce-switch`: the DPDK software switch (docs/design.md §6).
//!
//! ```text
//! roce-switch --config FILE [--port DEVARGS]... [--speed [PORT=]RATE]...
//!             [--switch-id N] [--int-dscp N] [--seed N] [--buf-max SIZE] [--k-min SIZE]
//!             [--k-max SIZE] [--p-max P] [--k-drop SIZE] [--burst SIZE]
//!             [--stats-interval SECS] [--core N] [--duration SECS] [-- EAL args]
//! ```
//!
//! The ports are DPDK devargs (`net_tap0,iface=sw0`, `net_af_packet0,iface=veth0`, a
//! PCI address, ...) given in port-id order: the i-th `--port` must become the DPDK
//! port whose id is the i-th smallest `id` of the configuration (a fresh process with
//! `--no-pci` numbers run-time vdevs 0, 1, ...). `net_null0` and `net_ring0` (a ring
//! port that loops back to itself) work too; ring pairs cabled back to back inside one
//! process (`dpdk::Port::ring_pair`) need their other ends in the same process, so they
//! are used through the library (`switch::dataplane`, as in tests/dpdk_ring.rs), not
//! from this binary. Flags override the TOML (per-port flags apply to every port).
//! One lcore runs the poll loop of [`switch::dataplane`]; the main thread waits for Ctrl-C
//! (SIGINT/SIGTERM) or `--duration` and prints the final counters. Every error (bad
//! configuration, a port that does not open, a port count that does not match) is a
//! one-line message and exit status 1, never a panic.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use dpdk::{lcore, Eal, Mempool, Port, TscClock};
use switch::dataplane::{pending_total, Dataplane, PortIo, PrintStats};
use switch::{Config, Quantity, Switch, SwitchSettings};

/// Command line (clap derive).
#[derive(Debug, Parser)]
#[command(name = "roce-switch", about = "RoCEv2 software switch on DPDK")]
struct Args {
    /// Switch configuration (TOML, see switch/examples/two-port.toml).
    #[arg(long)]
    config: PathBuf,
    /// A port as DPDK devargs, in port-id order (repeat for each port).
    #[arg(long = "port", value_name = "DEVARGS")]
    ports: Vec<String>,
    /// Link speed override: `PORT=RATE` for one port (e.g. `1=10Gbps`), or `RATE` for
    /// every port (repeatable; later ones win).
    #[arg(long = "speed", value_name = "[PORT=]RATE")]
    speeds: Vec<String>,
    /// INT switch_ID (overrides `switch_id`).
    #[arg(long)]
    switch_id: Option<u16>,
    /// DSCP announcing an INT container (overrides `int_dscp`).
    #[arg(long)]
    int_dscp: Option<u8>,
    /// WRED random seed (overrides `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Data-class buffer of every port, e.g. `1MiB` (overrides `buf_max`).
    #[arg(long, value_name = "SIZE")]
    buf_max: Option<String>,
    /// WRED K_min of every port, e.g. `5KiB` (overrides `k_min`).
    #[arg(long, value_name = "SIZE")]
    k_min: Option<String>,
    /// WRED K_max of every port (overrides `k_max`).
    #[arg(long, value_name = "SIZE")]
    k_max: Option<String>,
    /// WRED P_max of every port, in [0, 1] (overrides `p_max`).
    #[arg(long, value_name = "P")]
    p_max: Option<f64>,
    /// Not-ECT drop threshold K of every port (overrides `k_drop`).
    #[arg(long, value_name = "SIZE")]
    k_drop: Option<String>,
    /// Shaper burst credit of every port (overrides `burst`).
    #[arg(long, value_name = "SIZE")]
    burst: Option<String>,
    /// Seconds between stats lines (0: none).
    #[arg(long, default_value_t = 1.0)]
    stats_interval: f64,
    /// CPU to pin the switching lcore to (default: the last available one).
    #[arg(long)]
    core: Option<usize>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<f64>,
    /// EAL arguments (after `--`).
    #[arg(last = true)]
    eal: Vec<String>,
}

/// Set by SIGINT/SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

fn install_signals() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe {
            libc::signal(sig, handler as libc::sighandler_t);
        }
    }
}

/// A per-port size key of the TOML, for the overrides.
type SizeField = fn(&mut switch::config::PortDefaults) -> &mut Option<Quantity>;

/// Applies the command-line overrides to the parsed TOML (validated afterwards, so a
/// bad value from a flag gets the same error as one from the file). Returns whether any
/// override was given.
fn apply_overrides(cfg: &mut Config, a: &Args) -> Result<bool, String> {
    let mut any = false;
    for s in &a.speeds {
        any = true;
        match s.split_once('=') {
            None => {
                for p in cfg.ports.iter_mut() {
                    p.own.speed = Some(Quantity::from(s.trim()));
                }
            }
            Some((port, rate)) => {
                let id: u16 = port
                    .trim()
                    .parse()
                    .map_err(|_| format!("--speed {s:?}: bad port id {port:?}"))?;
                let p =
                    cfg.ports.iter_mut().find(|p| p.id == id).ok_or_else(|| {
                        format!("--speed {s:?}: no port {id} in the configuration")
                    })?;
                p.own.speed = Some(Quantity::from(rate.trim()));
            }
        }
    }
    if let Some(v) = a.switch_id {
        cfg.switch_id = v;
        any = true;
    }
    if let Some(v) = a.int_dscp {
        cfg.int_dscp = v;
        any = true;
    }
    if let Some(v) = a.seed {
        cfg.seed = v;
        any = true;
    }
    // Per-port keys: set on every port (a port's own key beats `[defaults]`).
    let sizes: [(&Option<String>, SizeField); 5] = [
        (&a.buf_max, |p| &mut p.buf_max),
        (&a.k_min, |p| &mut p.k_min),
        (&a.k_max, |p| &mut p.k_max),
        (&a.k_drop, |p| &mut p.k_drop),
        (&a.burst, |p| &mut p.burst),
    ];
    for (flag, field) in sizes {
        if let Some(v) = flag {
            any = true;
            for p in cfg.ports.iter_mut() {
                *field(&mut p.own) = Some(Quantity::from(v.trim()));
            }
        }
    }
    if let Some(v) = a.p_max {
        any = true;
        for p in cfg.ports.iter_mut() {
            p.own.p_max = Some(v);
        }
    }
    Ok(any)
}

/// The switch's settings: the configuration file, the command-line overrides,
/// checked, and the sorted port ids, one per `--port`.
fn settings(args: &Args) -> Result<(SwitchSettings, Vec<u16>), String> {
    if !(args.stats_interval >= 0.0 && args.stats_interval.is_finite()) {
        return Err("--stats-interval must be a non-negative number".into());
    }
    if let Some(d) = args.duration {
        if !(d >= 0.0 && d.is_finite()) {
            return Err("--duration must be a non-negative number".into());
        }
    }
    let mut cfg =
        Config::from_file(&args.config).map_err(|e| format!("{}: {e}", args.config.display()))?;
    let overridden = apply_overrides(&mut cfg, args)?;
    let settings = cfg.validate().map_err(|e| {
        let with = if overridden {
            " (with the command-line overrides)"
        } else {
            ""
        };
        format!("{}{with}: {e}", args.config.display())
    })?;
    let mut ids: Vec<u16> = settings.ports.iter().map(|p| p.id).collect();
    ids.sort_unstable();
    if args.ports.len() != ids.len() {
        return Err(format!(
            "the configuration has {} port(s) ({ids:?}) but {} --port given",
            ids.len(),
            args.ports.len()
        ));
    }
    Ok((settings, ids))
}

/// Opens every `--port` in port-id order on one pool sized for every queue slot of
/// every port (one mbuf per 64 bytes of buffer), the descriptor rings and the
/// bursts in flight.
fn open_ports(
    eal: &'static Eal,
    args: &Args,
    settings: &SwitchSettings,
    ids: &[u16],
) -> Result<(Vec<Port>, Vec<PortIo>), String> {
    let mbufs: u64 = settings
        .ports
        .iter()
        .map(|p| (p.buf_max + p.ctrl_buf_max) / 64 + 2 * 1024 + 2 * 64)
        .sum::<u64>()
        .clamp(8191, 1 << 20);
    let pool = Mempool::new(
        eal,
        "roce_switch",
        mbufs as u32,
        256,
        Mempool::DEFAULT_DATA_ROOM,
    )
    .map_err(|e| format!("mempool of {mbufs} mbufs: {e}"))?;
    let mut ports = Vec::new();
    let mut ios = Vec::new();
    for (devargs, &want) in args.ports.iter().zip(ids) {
        let mut port = Port::open(eal, devargs).map_err(|e| {
            format!(
                "port {devargs:?}: {e} (unknown driver, bad devargs, or a device that does \
                 not exist)"
            )
        })?;
        if port.id() != want {
            return Err(format!(
                "port {devargs:?} became DPDK port {} but the configuration expects id {want} \
                 (give --port in port-id order)",
                port.id()
            ));
        }
        let (rx, tx) = port
            .configure_single(&pool)
            .map_err(|e| format!("port {devargs:?}: {e}"))?;
        if let Ok(mac) = port.mac() {
            tracing::info!(port = want, devargs = %devargs, mac = ?mac, "port up");
        }
        ios.push(PortIo::new(want, rx, tx));
        ports.push(port);
    }
    Ok((ports, ios))
}

/// The final counters of every port: the switch core's and the driver's.
fn print_final(dp: &Dataplane, ports: &[Port], ids: &[u16], secs: f64) {
    println!("final counters ({secs:.1} s):");
    for &id in ids {
        if let Some(c) = dp.switch.counters(id) {
            let fields: Vec<String> = c.fields().iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!("  port {id}: {}", fields.join(" "));
        }
        if let Some(p) = ports.iter().find(|p| p.id() == id) {
            if let Ok(s) = p.stats() {
                println!(
                    "  port {id} (driver): rx {} tx {} rx_missed {} tx_errors {}",
                    s.rx_packets, s.tx_packets, s.rx_missed, s.tx_errors
                );
            }
        }
    }
    println!(
        "  unknown-port rx {} | tx pending at exit {}",
        dp.switch.unknown_port_rx(),
        pending_total(&dp.ports)
    );
}

fn run(args: Args) -> Result<(), String> {
    let (settings, ids) = settings(&args)?;
    // No hugepages needed for a software switch of this size (docs/design.md
    // §10); its ports may be PCI devices, so the PCI bus is scanned.
    let eal = Eal::init(&dpdk::tool_args("roce-switch", &args.eal, true))
        .map_err(|e| format!("EAL: {e}"))?;

    let (ports, ios) = open_ports(eal, &args, &settings, &ids)?;

    let sw: Switch<dpdk::Mbuf> = Switch::new(&settings);
    let clock = TscClock::new(eal);
    let mut dp = Dataplane::new(sw, ios, clock);
    let core = args
        .core
        .or_else(|| lcore::available_cores().last().copied());
    let interval_ns = (args.stats_interval * 1e9) as u64;
    install_signals();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let worker = lcore::spawn_pinned(eal, "roce-switch", core, move || {
        dp.run(&stop2, interval_ns, &mut PrintStats);
        dp
    })
    .map_err(|e| format!("cannot start the switching lcore: {e}"))?;
    println!(
        "roce-switch: switch_id {} with {} port(s) on core {:?}; Ctrl-C to stop",
        settings.switch_id,
        ids.len(),
        core
    );

    let start = Instant::now();
    let limit = args.duration.map(Duration::from_secs_f64);
    while !STOP.load(Ordering::SeqCst) && !worker.is_finished() {
        if limit.is_some_and(|l| start.elapsed() >= l) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let dp = worker
        .join()
        .map_err(|_| "the switching lcore panicked".to_owned())?;

    print_final(&dp, &ports, &ids, start.elapsed().as_secs_f64());
    drop(dp);
    drop(ports);
    Ok(())
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("roce-switch: error: {e}");
            ExitCode::FAILURE
        }
    }
}
