//! rsnicd: owns one port, runs its engine (and QP 1's CM), and serves the
//! host's programs over a Unix socket (issue 42; docs/design.md §7).
//!
//! The main thread opens the device, listens, and waits for SIGTERM or
//! SIGINT (blocked in every thread, taken with `sigwait`); one thread accepts
//! connections, one per client answers its requests. At the signal the
//! socket file goes, every client is shut down, and the device closes.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use dpdk::{Eal, Port};
use nic::contract::{DeviceConfig, QpOptions};
use nic::verbs::{CompletionQueue, Device, QueuePair};
use rdma::transport::Service;
use rsnicd::proto::{Message, ProgramInfo, QpInfo, QpService, Welcome, VERSION};
use rsnicd::sock::{self, PeerCred, SockError};

/// Runs the rsnic NIC for the whole host.
#[derive(Parser, Debug)]
#[command(name = "rsnicd", version)]
struct Cli {
    /// DPDK devargs of the port, e.g. net_tap0,iface=rs0 or net_ring0.
    #[arg(long)]
    dev: String,
    /// The port's IPv4 address (its GID is ::ffff:IP). Without it, a port of
    /// a kernel interface (net_af_xdp) takes the interface's own.
    #[arg(long)]
    ip: Option<std::net::Ipv4Addr>,
    /// The port's MAC (default: derived from the IP on virtual ports).
    #[arg(long)]
    mac: Option<String>,
    /// CPU for the engine thread.
    #[arg(long)]
    core: Option<usize>,
    /// Where to listen (default: RSNIC_SOCKET, else /run/rsnic/rsnicd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Extra EAL arguments, one string (replaces the defaults).
    #[arg(long)]
    eal: Option<String>,
}

/// The daemon's own counters, reported beside the engine's.
#[derive(Default)]
struct CtlCounters {
    connections: AtomicU64,
    refused: AtomicU64,
    malformed: AtomicU64,
    /// Requests naming a handle the program does not own.
    bad_handle: AtomicU64,
    /// QPs destroyed because their program went away.
    qps_reclaimed: AtomicU64,
}

/// A QP the daemon holds for a program, with the CQ made for it.
struct OwnedQp {
    qp: QueuePair,
    cq: CompletionQueue,
}

/// A program attached.
struct Program {
    cred: PeerCred,
    name: String,
    since: Instant,
    /// Its connection's descriptor number, shut down when the daemon stops.
    fd: i32,
    /// Its QPs by the handles it names them with: only its own.
    qps: HashMap<u32, OwnedQp>,
    next_handle: u32,
}

/// What every client thread shares.
struct Shared {
    dev: Device,
    welcome: Welcome,
    ctl: CtlCounters,
    programs: Mutex<HashMap<u64, Program>>,
    /// Who may attach besides root: the daemon's user and its group's
    /// members (the socket is 0660 too).
    uid: u32,
    gid: u32,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC {s}")))
        .collect::<Result<_, _>>()?;
    v.try_into().map_err(|_| format!("bad MAC {s}"))
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: a local sigset, filled by the libc calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn open_device(cli: &Cli) -> Result<(Device, Welcome), String> {
    let extra: Vec<String> = cli
        .eal
        .as_deref()
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let eal: &'static Eal = Eal::init(&dpdk::tool_args(
        "rsnicd",
        &extra,
        dpdk::needs_pci(&cli.dev),
    ))
    .map_err(|e| format!("EAL: {e}"))?;
    let port = Port::open(eal, &cli.dev).map_err(|e| format!("{}: {e}", cli.dev))?;
    let ip = match (cli.ip, port.kernel_iface()) {
        (Some(ip), _) => ip,
        (None, Some(iface)) => nic::host::KernelIface::new(iface)
            .and_then(|k| k.ipv4())
            .map_err(|e| format!("{}: host mode: {e}", cli.dev))?
            .into(),
        (None, None) => return Err("--ip is required on this port".into()),
    };
    let mut dc = DeviceConfig::new(ip.octets());
    dc.mac = cli.mac.as_deref().map(parse_mac).transpose()?;
    dc.core = cli.core;
    let dev = Device::open(eal, port, dc).map_err(|e| format!("{}: {e}", cli.dev))?;
    let welcome = Welcome {
        daemon_pid: std::process::id(),
        dev: cli.dev.clone(),
        ip: dev.ip(),
        mac: dev.mac(),
        shards: dev.shards() as u16,
        max_path_mtu: dev.max_path_mtu(),
    };
    Ok((dev, welcome))
}

/// Listens at `path`: its directory made if missing; a socket file left by a
/// daemon that died is replaced, one that a live daemon answers is not.
fn listen_at(path: &Path) -> Result<OwnedFd, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    if path.exists() {
        match sock::connect(path) {
            Ok(_) => return Err(format!("another rsnicd listens at {}", path.display())),
            Err(_) => std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?,
        }
    }
    sock::listen(path, 0o660).map_err(|e| format!("{}: {e}", path.display()))
}

fn counters(sh: &Shared) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = sh
        .dev
        .counters()
        .iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let c = &sh.ctl;
    v.push((
        "ctl_connections".into(),
        c.connections.load(Ordering::Relaxed),
    ));
    v.push(("ctl_refused".into(), c.refused.load(Ordering::Relaxed)));
    v.push(("ctl_malformed".into(), c.malformed.load(Ordering::Relaxed)));
    v.push((
        "ctl_bad_handle".into(),
        c.bad_handle.load(Ordering::Relaxed),
    ));
    v.push((
        "qps_reclaimed".into(),
        c.qps_reclaimed.load(Ordering::Relaxed),
    ));
    v.push((
        "programs".into(),
        sh.programs.lock().expect("programs").len() as u64,
    ));
    v
}

fn programs(sh: &Shared) -> Vec<ProgramInfo> {
    let mut v: Vec<ProgramInfo> = sh
        .programs
        .lock()
        .expect("programs")
        .values()
        .map(|p| ProgramInfo {
            pid: p.cred.pid,
            uid: p.cred.uid,
            name: p.name.clone(),
            connected_s: p.since.elapsed().as_secs(),
        })
        .collect();
    v.sort_by_key(|p| p.pid);
    v
}

/// Every program's QPs, with the engine's description of each.
fn qps(sh: &Shared) -> Vec<QpInfo> {
    let programs = sh.programs.lock().expect("programs");
    let mut v: Vec<QpInfo> = programs
        .values()
        .flat_map(|p| {
            p.qps.iter().map(|(&handle, o)| QpInfo {
                pid: p.cred.pid,
                handle,
                qpn: o.qp.qpn(),
                describe: o.qp.describe().unwrap_or_else(|e| format!("({e})")),
            })
        })
        .collect();
    v.sort_by_key(|q| q.qpn);
    v
}

/// Creates a QP and its CQ for program `id`.
fn create_qp(sh: &Shared, id: u64, service: QpService, sq: u16, rq: u16) -> Message {
    let error = |e: nic::verbs::VerbsError| Message::Error {
        errno: libc::EINVAL,
        message: e.to_string(),
    };
    let cq = match sh.dev.create_cq(usize::from(sq) + usize::from(rq)) {
        Ok(cq) => cq,
        Err(e) => return error(e),
    };
    let opts = QpOptions {
        service: match service {
            QpService::Rc => Service::Rc,
            QpService::Uc => Service::Uc,
            QpService::Ud => Service::Ud,
        },
        sq_depth: sq,
        rq_depth: rq,
        ..QpOptions::default()
    };
    let qp = match sh.dev.create_qp(&cq, &cq, opts) {
        Ok(qp) => qp,
        Err(e) => {
            let _ = sh.dev.destroy_cq(cq);
            return error(e);
        }
    };
    let qpn = qp.qpn();
    let mut programs = sh.programs.lock().expect("programs");
    let p = programs.get_mut(&id).expect("a served program");
    p.next_handle += 1;
    let handle = p.next_handle;
    p.qps.insert(handle, OwnedQp { qp, cq });
    Message::QpCreated { handle, qpn }
}

/// Destroys a QP and its CQ.
fn destroy(sh: &Shared, o: OwnedQp) {
    let _ = sh.dev.destroy_qp(o.qp);
    let _ = sh.dev.destroy_cq(o.cq);
}

/// Destroys program `id`'s QP `handle`: an error for a handle it does not own
/// (another program's, or one never made), counted.
fn destroy_qp(sh: &Shared, id: u64, handle: u32) -> Message {
    let taken = sh
        .programs
        .lock()
        .expect("programs")
        .get_mut(&id)
        .and_then(|p| p.qps.remove(&handle));
    match taken {
        Some(o) => {
            destroy(sh, o);
            Message::Done
        }
        None => {
            sh.ctl.bad_handle.fetch_add(1, Ordering::Relaxed);
            Message::Error {
                errno: libc::EINVAL,
                message: format!("no QP {handle} of yours"),
            }
        }
    }
}

/// Refuses a malformed request: says why, counts it, ends the connection.
fn malformed(sh: &Shared, fd: &OwnedFd, seq: u32, why: String) {
    sh.ctl.malformed.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(%why, "malformed control message");
    let _ = sock::send(
        fd,
        &Message::Error {
            errno: libc::EINVAL,
            message: why,
        },
        seq,
    );
}

/// One client, from its `Hello` to its last request.
fn serve(sh: &Shared, id: u64, fd: OwnedFd, cred: PeerCred) {
    let mut buf = Vec::new();
    let (name, seq) = match sock::recv(&fd, &mut buf) {
        Ok((Message::Hello { version, name }, seq)) if version == VERSION => (name, seq),
        Ok((Message::Hello { version, .. }, seq)) => {
            let _ = sock::send(
                &fd,
                &Message::Error {
                    errno: libc::EPROTO,
                    message: format!("protocol version {version}, rsnicd speaks {VERSION}"),
                },
                seq,
            );
            return;
        }
        Ok((_, seq)) => return malformed(sh, &fd, seq, "the first message must be Hello".into()),
        Err(SockError::Proto(e)) => return malformed(sh, &fd, 0, e.to_string()),
        Err(_) => return,
    };
    sh.programs.lock().expect("programs").insert(
        id,
        Program {
            cred,
            name,
            since: Instant::now(),
            fd: fd.as_raw_fd(),
            qps: HashMap::new(),
            next_handle: 0,
        },
    );
    let mut reply = Message::Welcome(sh.welcome.clone());
    let mut seq = seq;
    loop {
        if sock::send(&fd, &reply, seq).is_err() {
            break;
        }
        reply = match sock::recv(&fd, &mut buf) {
            Ok((Message::GetCounters, s)) => {
                seq = s;
                Message::Counters(counters(sh))
            }
            Ok((Message::GetPrograms, s)) => {
                seq = s;
                Message::Programs(programs(sh))
            }
            Ok((Message::GetQps, s)) => {
                seq = s;
                Message::Qps(qps(sh))
            }
            Ok((
                Message::CreateQp {
                    service,
                    sq_depth,
                    rq_depth,
                },
                s,
            )) => {
                seq = s;
                create_qp(sh, id, service, sq_depth, rq_depth)
            }
            Ok((Message::DestroyQp { handle }, s)) => {
                seq = s;
                destroy_qp(sh, id, handle)
            }
            Ok((m, s)) => {
                malformed(sh, &fd, s, format!("not a request: {m:?}"));
                break;
            }
            Err(SockError::Proto(e)) => {
                malformed(sh, &fd, 0, e.to_string());
                break;
            }
            Err(_) => break,
        };
    }
    // The program is gone (it closed, or died): what it held goes with it.
    let gone = sh.programs.lock().expect("programs").remove(&id);
    if let Some(p) = gone {
        sh.ctl
            .qps_reclaimed
            .fetch_add(p.qps.len() as u64, Ordering::Relaxed);
        for (_, o) in p.qps {
            destroy(sh, o);
        }
    }
}

fn accept_loop(sh: Arc<Shared>, listener: OwnedFd) {
    let mut next_id = 0u64;
    while let Ok(fd) = sock::accept(&listener) {
        let Ok(cred) = sock::peer_cred(&fd) else {
            continue;
        };
        if cred.uid != 0 && cred.uid != sh.uid && cred.gid != sh.gid {
            sh.ctl.refused.fetch_add(1, Ordering::Relaxed);
            let _ = sock::send(
                &fd,
                &Message::Error {
                    errno: libc::EACCES,
                    message: format!("uid {} may not use this NIC", cred.uid),
                },
                0,
            );
            continue;
        }
        sh.ctl.connections.fetch_add(1, Ordering::Relaxed);
        next_id += 1;
        let (id, sh) = (next_id, sh.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("rsnicd-client-{}", cred.pid))
            .spawn(move || serve(&sh, id, fd, cred));
        if let Err(e) = spawned {
            tracing::warn!(%e, "cannot start a client thread");
        }
    }
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSNIC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Before any thread: every thread inherits the mask, and only sigwait
    // below takes these signals.
    let signals = block_signals();
    let path = cli.socket.clone().unwrap_or_else(rsnicd::socket_path);
    // The socket first: a second daemon for the same socket stops before it
    // touches a port.
    let listener = match listen_at(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rsnicd: {e}");
            std::process::exit(1);
        }
    };
    let (dev, welcome) = match open_device(&cli) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rsnicd: {e}");
            let _ = std::fs::remove_file(&path);
            std::process::exit(1);
        }
    };
    let listener_raw = listener.as_raw_fd();
    // SAFETY: no arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let sh = Arc::new(Shared {
        dev,
        welcome,
        ctl: CtlCounters::default(),
        programs: Mutex::new(HashMap::new()),
        uid,
        gid,
    });
    tracing::info!(dev = %cli.dev, socket = %path.display(), "rsnicd serving");
    let acceptor = {
        let sh = sh.clone();
        std::thread::Builder::new()
            .name("rsnicd-accept".into())
            .spawn(move || accept_loop(sh, listener))
            .expect("accept thread")
    };
    let mut sig = 0;
    // SAFETY: a sigset of blocked signals and an out int.
    while unsafe { libc::sigwait(&signals, &mut sig) } != 0 {}
    tracing::info!(signal = sig, "rsnicd stopping");
    let _ = std::fs::remove_file(&path);
    // SAFETY: shutdown of descriptors that stay open (their owners close
    // them): the blocked accept and recvs return, their threads end.
    unsafe { libc::shutdown(listener_raw, libc::SHUT_RDWR) };
    for p in sh.programs.lock().expect("programs").values() {
        // SAFETY: as above.
        unsafe { libc::shutdown(p.fd, libc::SHUT_RDWR) };
    }
    let _ = acceptor.join();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sh = sh;
    let shared = loop {
        match Arc::try_unwrap(sh) {
            Ok(s) => break Some(s),
            Err(again) if Instant::now() < deadline => {
                sh = again;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => break None,
        }
    };
    match shared {
        Some(s) => s.dev.close(),
        None => tracing::warn!("a client thread did not end; exiting without closing the device"),
    }
}
