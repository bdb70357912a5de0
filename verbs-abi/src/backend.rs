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
//! several programs over shared-memory rings (issue 42, rsnicd) is a
//! second implementation of this module with the same handle API over
//! those rings: the C structs, the attribute checks and the translations
//! stay as they are.

use std::sync::OnceLock;
use std::time::Duration;

use dpdk::{Eal, LinkWatch, Port};
use nic::contract::DeviceConfig;
use nic::verbs::Device;

use crate::config::Config;

/// Blocks every signal on the calling thread (a thread of ours).
fn block_all_signals() {
    // SAFETY: a local sigset filled by sigfillset.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// The running device of this process.
pub struct Backend {
    /// The rsnic device (its engine thread runs until the process exits).
    pub dev: Device,
    /// The port's link, read by `ibv_query_port`.
    pub link: LinkWatch,
    /// What the environment asked for.
    pub cfg: Config,
    /// The port's lock (an abstract socket), held while the process lives.
    _port_lock: std::os::fd::OwnedFd,
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
                    .spawn(move || {
                        // Every thread the device starts (DPDK's interrupt
                        // thread, the engine's) inherits this mask: none of
                        // them may take a signal meant for the program (an
                        // alarm that must interrupt the program's own wait,
                        // qperf's). The engine's thread unblocks only the TAP
                        // PMD's signal, routed to it (dpdk::TapSignalRoute).
                        block_all_signals();
                        Self::start(cfg)
                    })
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
        let fds_before = open_fds();
        let eal: &'static Eal = Eal::init(&eal_args(&cfg)?).map_err(|e| format!("EAL: {e}"))?;
        restore_syslog();
        // Nothing goes in it (--no-shconf), and nothing would remove it.
        let _ = std::fs::remove_dir(eal.runtime_dir());
        // As roce-perf: a TAP re-attached to a persistent multi-queue
        // interface can come up without carrier; open it again then.
        for attempt in 1..=3 {
            let port = Port::open(eal, &cfg.dev).map_err(|e| format!("{}: {e}", cfg.dev))?;
            let link = port.link_watch();
            let mut dc = DeviceConfig::new(ip.octets());
            dc.mac = cfg.port_mac();
            dc.core = cfg.core;
            dc.idle_yield = !cfg.busy_poll;
            dc.cm_timing = cfg.cm_timing;
            let dev = Device::open(eal, port, dc).map_err(|e| format!("{}: {e}", cfg.dev))?;
            if link.wait_up(Duration::from_secs(2)) {
                tracing::info!(dev = %cfg.dev, ip = %ip, "rsnic0 up");
                close_on_exec_since(&fds_before);
                // SAFETY: registers a plain extern "C" function for the child.
                unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
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
/// a listening Unix socket in the abstract namespace, named after the
/// devargs: abstract names are per network namespace, the kernel frees
/// the name when the process ends, however it ends, and no file is left
/// behind in `$TMPDIR` (the lock files of before were never removed). A
/// second program learns the holder's pid by connecting (`SO_PEERCRED`).
fn lock_port(devargs: &str) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // FNV-1a of the devargs: any length fits the 107-byte name.
    let hash = devargs.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let name = format!("rsnic-port-{hash:016x}");
    let addr = || {
        // SAFETY: sockaddr_un is plain data.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as u16;
        // sun_path[0] = 0: the abstract namespace.
        for (d, b) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        (a, len as libc::socklen_t)
    };
    let socket = || {
        // SAFETY: no pointers.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(format!(
                "port lock: socket: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fd = socket()?;
    let (a, len) = addr();
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    let bound = unsafe { libc::bind(fd.as_raw_fd(), (&raw const a).cast(), len) } == 0;
    // SAFETY: listen on our socket; no pointers.
    if bound && unsafe { libc::listen(fd.as_raw_fd(), 1) } == 0 {
        return Ok(fd);
    }
    // Held: ask the holder's pid.
    let holder = socket().ok().and_then(|c| {
        // SAFETY: as above; `cred` is written by getsockopt.
        unsafe {
            if libc::connect(c.as_raw_fd(), (&raw const a).cast(), len) != 0 {
                return None;
            }
            let mut cred: libc::ucred = std::mem::zeroed();
            let mut cl = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
            (libc::getsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &mut cl,
            ) == 0)
                .then_some(cred.pid)
        }
    });
    Err(format!(
        "port {devargs} is in use by another rsnic program (pid {}; lock @{name})",
        holder.map_or("unknown".to_string(), |p| p.to_string())
    ))
}

/// The process's open descriptors (`/proc/self/fd`, less the one that
/// listed them, closed by then).
fn open_fds() -> Vec<i32> {
    let listed: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // SAFETY: F_GETFD on a descriptor number; no pointers.
    listed
        .into_iter()
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
        .collect()
}

/// Marks close-on-exec every descriptor opened since `before` (the EAL's
/// and the PMDs' own: net_tap's `/dev/net/tun` and queue descriptors, the
/// interrupt thread's pipes, which DPDK opens without `O_CLOEXEC`), so
/// that none leaks into a program the application `exec`s. Descriptors
/// the program's other threads open during this first `ibv_open_device`
/// would be marked too; a program that exec's a child with a descriptor
/// it opened then marks it itself, as it must anyway against any library.
fn close_on_exec_since(before: &[i32]) {
    for fd in open_fds() {
        if before.contains(&fd) {
            continue;
        }
        // SAFETY: F_GETFD/F_SETFD on a descriptor number, no pointers; one
        // closed since the listing fails harmlessly with EBADF.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFD);
            if fl >= 0 && fl & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, fl | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Undoes the EAL's `openlog("rsnic-verbs", LOG_PID | LOG_NDELAY,
/// LOG_DAEMON)` (rte_eal_init, lib/eal/linux/eal_log.c), which would
/// otherwise name the program's own `syslog()` messages after us: back to
/// glibc's defaults (the program's name, no options, LOG_USER), as if
/// `openlog` had never been called. (glibc cannot tell what a program
/// that called `openlog` before its first `ibv_open_device` had set.)
fn restore_syslog() {
    // SAFETY: closelog/openlog take no pointers we own (ident NULL).
    unsafe {
        libc::closelog();
        libc::openlog(std::ptr::null(), 0, libc::LOG_USER);
        libc::closelog();
    }
}

/// Set in a child of `fork()` ([`forked_child`]): the engine's threads did
/// not follow the program into it, so every verb there fails at once (EIO,
/// as on a context the kernel disassociated; crate::abi's `guard`) instead
/// of waiting forever for an engine that is not there.
pub static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `pthread_atfork`'s child handler: the engine's threads are not in the
/// child, so its verbs fail ([`FORKED`]) instead of waiting for them;
/// nothing else runs here (async-signal-safe: one atomic store).
extern "C" fn forked_child() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}
