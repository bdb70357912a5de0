//! Where the engine runs: the one module the ABI layer ([`crate::abi`])
//! asks for a device, and the boundary a second backend replaces.
//!
//! Today's backend is **in-process**: the first `ibv_open_device` starts
//! the DPDK EAL (per-process `--file-prefix`, no hugepages) and the rsnic
//! engine on a thread of its own, on the port `RSNIC_DEV`, exactly as
//! `roce-perf` does; the device lives until the process exits (the EAL
//! cannot be started twice in one process, so `ibv_close_device` of the
//! last context leaves it running).
//!
//! The ABI layer uses only [`Backend`] and the handle types of
//! [`nic::verbs`] that it returns (queue pairs, completion queues, memory
//! regions, protection domains). A daemon that owns the port and serves
//! several programs over shared-memory rings (the planned next step, README) is a
//! second implementation of this module with the same handle API over
//! those rings: the C structs, the attribute checks and the translations
//! stay as they are.

use std::sync::OnceLock;
use std::time::Duration;

use dpdk::{Eal, LinkWatch, Port};
use nic::contract::DeviceConfig;
use nic::verbs::Device;

use crate::config::Config;

/// The running device of this process.
pub struct Backend {
    /// The rsnic device (its engine thread runs until the process exits).
    pub dev: Device,
    /// The port's link, read by `ibv_query_port`.
    pub link: LinkWatch,
    /// What the environment asked for.
    pub cfg: Config,
    /// The port's lock file, held while the process lives.
    _port_lock: std::fs::File,
}

static BACKEND: OnceLock<Result<Backend, String>> = OnceLock::new();

impl Backend {
    /// The device, started at the first call (later calls return the same
    /// one, or the same error message).
    pub fn get() -> Result<&'static Backend, &'static str> {
        BACKEND
            .get_or_init(|| {
                let cfg = Config::from_env().map_err(|e| e.to_string())?;
                // The EAL pins the thread that initialises it (and starts
                // its own threads from it): a thread of our own keeps the
                // program's threads and their CPU sets untouched.
                std::thread::Builder::new()
                    .name("rsnic-start".into())
                    .spawn(move || Self::start(cfg))
                    .map_err(|e| format!("cannot start a thread: {e}"))?
                    .join()
                    .map_err(|_| "the start-up thread panicked".to_string())?
            })
            .as_ref()
            .map_err(|e| e.as_str())
    }

    /// The configuration, without starting anything (`ibv_get_device_list`).
    pub fn configured() -> Result<Config, String> {
        Config::from_env().map_err(|e| e.to_string())
    }

    fn start(mut cfg: Config) -> Result<Backend, String> {
        let port_lock = lock_port(&cfg.dev)?;
        // Host mode (a net_af_xdp port without RSNIC_IP): the interface's
        // own IPv4 address, as roce-perf takes it; the device then resolves
        // peers through the kernel's neighbour table (nic::host).
        let ip = match (cfg.ip, cfg.host_iface()) {
            (Some(ip), _) => ip,
            (None, Some(iface)) => nic::host::KernelIface::new(&iface)
                .and_then(|k| k.ipv4())
                .map_err(|e| format!("{}: host mode: {e}", cfg.dev))?
                .into(),
            (None, None) => return Err("RSNIC_IP is not set".into()),
        };
        cfg.ip = Some(ip);
        let eal: &'static Eal = Eal::init(&eal_args(&cfg)?).map_err(|e| format!("EAL: {e}"))?;
        // As roce-perf: a TAP re-attached to a persistent multi-queue
        // interface can come up without carrier; open it again then.
        for attempt in 1..=3 {
            let port = Port::open(eal, &cfg.dev).map_err(|e| format!("{}: {e}", cfg.dev))?;
            let link = port.link_watch();
            let mut dc = DeviceConfig::new(ip.octets());
            dc.mac = cfg.port_mac();
            dc.core = cfg.core;
            dc.idle_yield = !cfg.busy_poll;
            let dev = Device::open(eal, port, dc).map_err(|e| format!("{}: {e}", cfg.dev))?;
            if link.wait_up(Duration::from_secs(2)) {
                tracing::info!(dev = %cfg.dev, ip = %ip, "rsnic0 up");
                return Ok(Backend {
                    dev,
                    link,
                    cfg,
                    _port_lock: port_lock,
                });
            }
            drop(link);
            dev.close();
            if attempt < 3 {
                tracing::warn!(dev = %cfg.dev, "the link is down after start; opening it again");
            }
        }
        Err(format!("the link of {} did not come up", cfg.dev))
    }

    /// Whether the port's link is up (`IBV_PORT_ACTIVE`).
    pub fn link_up(&self) -> bool {
        self.link.link().is_ok_and(|l| l.up)
    }

    /// The link speed in Mbit/s (0: unknown).
    pub fn speed_mbps(&self) -> u32 {
        self.link.link().map_or(0, |l| l.speed_mbps)
    }
}

/// The EAL's arguments in a program's process (`RSNIC_LOG` and
/// `RSNIC_EAL` applied), after sending DPDK's log where `RSNIC_LOG` says
/// (nowhere by default; crate::config) and, with a level, rsnic's own
/// `tracing` events there too:
/// - `--no-pci` unless the port is a PCI device (`dpdk::needs_pci`): a
///   virtual port needs no bus scan, which probes and complains about the
///   host's PCI devices ("Requested device ... cannot be used");
/// - one lcore, `-l CPU` (the engine's `RSNIC_CORE`, else the first CPU the
///   program may run on), unless `RSNIC_EAL` names its own: without it the
///   EAL starts an idle worker thread per further CPU (`rte-worker-N`)
///   inside the program; the engine runs on a thread of its own
///   registered as an lcore (`dpdk::lcore`), so it needs none of them;
/// - `--no-telemetry` and `--no-shconf` (dpdk::tool_args' defaults).
fn eal_args(cfg: &Config) -> Result<Vec<String>, String> {
    let log = &cfg.log;
    let sink = match (log.level, &log.file) {
        (None, _) => dpdk::LogSink::Discard,
        (Some(_), None) => dpdk::LogSink::Stderr,
        (Some(_), Some(f)) => dpdk::LogSink::File(f),
    };
    dpdk::set_log_sink(sink).map_err(|e| format!("RSNIC_LOG: {e}"))?;
    if let Some(level) = log.level {
        install_tracing(level, log.file.as_deref())?;
    }
    let mut args = dpdk::tool_args("rsnic-verbs", &[] as &[&str], dpdk::needs_pci(&cfg.dev));
    if let Some(level) = log.level {
        // After tool_args' `--log-level=error`: the last global level
        // wins; `*:` also lowers every log type's own level (most start
        // at info), without which `debug` would add nothing.
        args.push(format!("--log-level={}", level.dpdk_name()));
        args.push(format!("--log-level=*:{}", level.dpdk_name()));
    }
    let own_lcores = cfg
        .eal
        .iter()
        .any(|a| a.starts_with("-l") || a.starts_with("-c") || a.starts_with("--lcores"));
    let core = cfg
        .core
        .or_else(|| dpdk::lcore::available_cores().first().copied());
    if let (false, Some(core)) = (own_lcores, core) {
        args.extend(["-l".to_owned(), core.to_string()]);
    }
    args.extend(cfg.eal.iter().cloned());
    Ok(args)
}

/// Records rsnic's `tracing` events from `level` up on standard error or
/// in `file` (`RSNIC_LOG`). A program that installed its own global
/// subscriber keeps it.
fn install_tracing(
    level: crate::config::LogLevel,
    file: Option<&std::path::Path>,
) -> Result<(), String> {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level.tracing())
        .with_target(true);
    let done = match file {
        None => builder.with_writer(std::io::stderr).try_init(),
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("RSNIC_LOG: {}: {e}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init()
        }
    };
    if done.is_err() {
        tracing::debug!("the program has its own tracing subscriber; rsnic's events go there");
    }
    Ok(())
}

/// Takes the port's lock: one program per port (in one network namespace).
/// A second program on the same port would attach to the same TAP or NIC
/// queues and take half of the first one's frames; it is refused with a
/// message instead (its `ibv_open_device` fails with ENODEV). The lock is
/// an `flock` on a file named after the devargs and the namespace, released
/// by the kernel when the process ends, however it ends.
fn lock_port(devargs: &str) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let ns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let name: String = format!("{devargs}-{ns}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path = std::env::temp_dir().join(format!("rsnic-port-{name}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own; no pointers.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(format!(
            "port {devargs} is in use by another rsnic program (pid {}; lock {})",
            holder.trim(),
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = std::io::Write::write_all(&mut &f, std::process::id().to_string().as_bytes());
    Ok(f)
}
