//! Ports on a kernel interface through DPDK's `net_af_xdp` PMD, shared with
//! the kernel.
//!
//! The PMD (DPDK 22.11 `doc/guides/nics/af_xdp.rst`) binds an AF_XDP socket
//! to one queue of a kernel interface. Without `xdp_prog=` it attaches
//! libbpf/libxdp's default program, which redirects *every* frame of that
//! queue to the socket: the kernel would lose ARP, ICMP, SSH. With
//! `xdp_prog=PATH` it loads that object, links it to the interface
//! (`XDP_FLAGS_UPDATE_IF_NOEXIST`: refused if a program is already there)
//! and puts its socket into the object's XSKMAP `xsks_map` at the queue's
//! index.
//!
//! rsnic's program (`xdp/rsnic_xdp.c`, built by `build.rs` with clang's BPF
//! target and embedded here as [`XDP_OBJECT`]) redirects only IPv4 UDP to
//! port 4791 (RoCEv2) and passes everything else to the kernel. So that
//! users need not know it exists, [`prepare`] fills it in:
//!
//! * `af_xdp:IF[,key=value...]` becomes `net_af_xdp_IF,iface=IF,...,xdp_prog=<ours>`;
//! * `net_af_xdp<N>,iface=IF,...` without `xdp_prog` gets ours added;
//! * an explicit `xdp_prog=PATH` is kept (it must have an `xsks_map`);
//! * `busy_budget=0` unless the devargs set it ([`DEFAULT_BUSY_BUDGET`]).
//!
//! The object is written to a private temporary file for the PMD to load
//! (libbpf opens it by path when the RX queue is set up, and the PMD links
//! it to the interface then) and removed as soon as the RX queues are set
//! up ([`Prepared::program_loaded`]), or when the port is dropped before.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// rsnic's XDP program (ELF object for the BPF target, `xdp/rsnic_xdp.c`).
pub const XDP_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rsnic_xdp.o"));

/// The short form of a `net_af_xdp` port: `af_xdp:IF`.
pub const SHORT_PREFIX: &str = "af_xdp:";

/// The DPDK driver name (vdev names start with it).
pub const DRIVER: &str = "net_af_xdp";

/// The PMD's `busy_budget` unless the devargs give one: 0, no preferred
/// busy polling.
///
/// The PMD's own default (64) sets `SO_PREFER_BUSY_POLL` on the socket and
/// makes every receive burst that finds the ring empty call `recvfrom()`,
/// so that the socket's owner, not the kernel's softirq, runs the
/// interface's NAPI. That suits a thread that owns its core and never
/// sleeps. rsnic's engines yield their core when idle (`idle_yield`, the
/// default where processes share cores), and then (a) every idle poll turn
/// is a system call (perf: `recvfrom` and `xsk_recvmsg` take about 40 % of
/// the engine's samples during `read_lat`) and (b) frames wait for the
/// receiving engine's next `recvfrom` instead of being processed in the
/// sender's `sendto` path. With 0, an empty ring costs no system call in
/// copy mode and `read_lat` over a veth drops from 60.0 to 20.8 us (median
/// of 8 alternating rounds, docs/benchmarks.md), bandwidth unchanged. With 0 the PMD calls `poll()` (up to 1 s) instead
/// when the kernel asks for a fill-ring wakeup, which only zero-copy
/// drivers do when their fill ring ran dry; on such a NIC with a dedicated
/// core (`--busy_poll`), `busy_budget=64` may be given explicitly.
pub const DEFAULT_BUSY_BUDGET: u32 = 0;

/// A `net_af_xdp` port about to be created: the full devargs and what
/// must outlive `rte_vdev_init`.
#[derive(Debug)]
pub struct Prepared {
    /// The vdev name (`net_af_xdp...`).
    pub name: String,
    /// The devargs after the name (`iface=...,xdp_prog=...`).
    pub args: String,
    /// The kernel interface.
    pub iface: String,
    /// The first queue the PMD binds (`start_queue`, default 0).
    pub start_queue: u32,
    /// Whether the XDP program is rsnic's (filled in, not the user's).
    pub ours: bool,
    /// Our object's temporary file, removed on drop.
    _prog: Option<TempFile>,
}

impl Prepared {
    /// `name,args`, as DPDK's devargs.
    pub fn devargs(&self) -> String {
        format!("{},{}", self.name, self.args)
    }

    /// Removes our object's temporary file once the PMD has loaded it
    /// (after the RX queues are set up): a process that never closes its
    /// port (the ibverbs library's) or is killed leaves no file behind.
    pub fn program_loaded(&self) {
        if let Some(f) = &self._prog {
            let _ = std::fs::remove_file(&f.0);
        }
    }
}

/// Whether `devargs` names a `net_af_xdp` port (either form).
pub fn is_af_xdp(devargs: &str) -> bool {
    let d = devargs.trim();
    d.starts_with(SHORT_PREFIX) || d.starts_with(DRIVER)
}

/// The kernel interface of `net_af_xdp` devargs (`iface=` or `af_xdp:IF`),
/// or `None` for any other port.
pub fn iface_of(devargs: &str) -> Option<String> {
    let d = devargs.trim();
    if let Some(rest) = d.strip_prefix(SHORT_PREFIX) {
        let iface = rest.split(',').next().unwrap_or_default().trim();
        return (!iface.is_empty()).then(|| iface.to_owned());
    }
    if !d.starts_with(DRIVER) {
        return None;
    }
    d.split(',')
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == "iface")
        .map(|(_, v)| v.trim().to_owned())
}

/// The devargs as DPDK gets them: the pure part of [`prepare`]. `prog` is
/// the path of our object, used when the devargs name no program; returns
/// (name, args, iface, start_queue, whether ours was filled in).
pub fn rewrite(devargs: &str, prog: &Path) -> Result<(String, String, String, u32, bool)> {
    let d = devargs.trim();
    let bad = |why: &'static str| Error::InvalidArgument(devargs.into(), why);
    let (name, rest): (String, &str) = if let Some(rest) = d.strip_prefix(SHORT_PREFIX) {
        let (iface, more) = rest.split_once(',').unwrap_or((rest, ""));
        let iface = iface.trim();
        if iface.is_empty() {
            return Err(bad("af_xdp: needs an interface name (af_xdp:eth0)"));
        }
        let args = if more.trim().is_empty() {
            format!("iface={iface}")
        } else {
            format!("iface={iface},{}", more.trim())
        };
        // A vdev name per interface, so that two interfaces can be open at once.
        return finish(format!("{DRIVER}_{iface}"), &args, prog, devargs);
    } else if d.starts_with(DRIVER) {
        let (n, a) = d.split_once(',').unwrap_or((d, ""));
        (n.trim().to_owned(), a)
    } else {
        return Err(bad("not a net_af_xdp port"));
    };
    finish(name, rest, prog, devargs)
}

fn finish(
    name: String,
    args: &str,
    prog: &Path,
    devargs: &str,
) -> Result<(String, String, String, u32, bool)> {
    let bad = |why: &'static str| Error::InvalidArgument(devargs.into(), why);
    let mut iface = None;
    let mut start_queue = 0u32;
    let mut has_prog = false;
    let mut has_budget = false;
    let mut parts: Vec<String> = Vec::new();
    for kv in args.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad("net_af_xdp arguments are key=value"))?;
        match k.trim() {
            "iface" => iface = Some(v.trim().to_owned()),
            "start_queue" => {
                start_queue = v
                    .trim()
                    .parse()
                    .map_err(|_| bad("start_queue is a number"))?
            }
            "xdp_prog" => has_prog = true,
            "busy_budget" => has_budget = true,
            _ => {}
        }
        parts.push(kv.to_owned());
    }
    if !has_budget {
        parts.push(format!("busy_budget={DEFAULT_BUSY_BUDGET}"));
    }
    let iface = iface.ok_or_else(|| bad("net_af_xdp needs iface=<interface>"))?;
    if iface.is_empty() || iface.len() >= 16 || iface.contains(['/', ' ']) {
        return Err(bad("iface= is not a valid interface name"));
    }
    if !has_prog {
        parts.push(format!("xdp_prog={}", prog.display()));
    }
    Ok((name, parts.join(","), iface, start_queue, !has_prog))
}

/// Checks `devargs` of a `net_af_xdp` port and fills in rsnic's XDP program
/// ([`rewrite`]), writing it to a temporary file that lives as long as the
/// returned value. Fails with a clear error before DPDK is asked when the
/// interface does not exist or has no such queue.
pub fn prepare(devargs: &str) -> Result<Prepared> {
    let prog = TempFile::path_for();
    let (name, args, iface, start_queue, ours) = rewrite(devargs, &prog)?;
    let ifindex = ifindex(&iface);
    if ifindex == 0 {
        return Err(Error::AfXdp {
            iface,
            reason: "no such network interface in this network namespace".into(),
        });
    }
    if let Some(n) = rx_queues(&iface) {
        if start_queue >= n {
            return Err(Error::AfXdp {
                iface,
                reason: format!(
                    "it has {n} receive queue(s); start_queue={start_queue} is not one"
                ),
            });
        }
    }
    let file = if ours {
        Some(
            TempFile::create(prog, XDP_OBJECT).map_err(|e| Error::AfXdp {
                iface: iface.clone(),
                reason: format!("cannot write the XDP program to a temporary file: {e}"),
            })?,
        )
    } else {
        None
    };
    Ok(Prepared {
        name,
        args,
        iface,
        start_queue,
        ours,
        _prog: file,
    })
}

/// Why the PMD failed on a prepared port (`rte_vdev_init`, or the RX
/// queue setup, where it loads the program and binds the socket), as far
/// as we can tell from outside it (it logs its own reason at error level).
pub fn diagnose(p: &Prepared, rc: i32) -> Error {
    let mut reason = format!(
        "the net_af_xdp PMD could not attach ({})",
        crate::error::strerror(rc.abs())
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        reason.push_str("; not root: AF_XDP and XDP need CAP_NET_ADMIN, CAP_BPF (and CAP_NET_RAW)");
    }
    reason.push_str(if p.ours {
        "; likely causes: another XDP program is already attached to the interface \
         (another rsnic on it, or `ip link set dev IF xdp off` to remove a stale one), \
         or the queue is bound to another AF_XDP socket"
    } else {
        "; check that the xdp_prog object loads and has a BPF_MAP_TYPE_XSKMAP named xsks_map, \
         and that no other XDP program is attached"
    });
    Error::AfXdp {
        iface: p.iface.clone(),
        reason,
    }
}

/// The interface's index, 0 if there is none (`if_nametoindex(3)`).
pub fn ifindex(iface: &str) -> u32 {
    let Ok(c) = CString::new(iface) else {
        return 0;
    };
    // SAFETY: valid NUL-terminated string; the call only reads it.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// The interface's receive queues, from sysfs (`/sys/class/net/IF/queues`),
/// if it can be read.
fn rx_queues(iface: &str) -> Option<u32> {
    let dir = std::fs::read_dir(Path::new("/sys/class/net").join(iface).join("queues")).ok()?;
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    (n > 0).then_some(n as u32)
}

/// The interface's IP MTU, from sysfs (`/sys/class/net/IF/mtu`).
pub fn kernel_mtu(iface: &str) -> Option<u32> {
    std::fs::read_to_string(Path::new("/sys/class/net").join(iface).join("mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A file that is removed when dropped.
#[derive(Debug)]
struct TempFile(PathBuf);

impl TempFile {
    /// A fresh path in the temporary directory.
    fn path_for() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("rsnic-xdp-{}-{n}.o", std::process::id()))
    }

    fn create(path: PathBuf, bytes: &[u8]) -> std::io::Result<TempFile> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let t = TempFile(path);
        f.write_all(bytes)?;
        Ok(t)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_form_names_the_port_and_fills_our_program() {
        let p = Path::new("/tmp/p.o");
        let (name, args, iface, q, ours) = rewrite("af_xdp:eth0", p).unwrap();
        assert_eq!(name, "net_af_xdp_eth0");
        assert_eq!(args, "iface=eth0,busy_budget=0,xdp_prog=/tmp/p.o");
        assert_eq!((iface.as_str(), q, ours), ("eth0", 0, true));
        let (_, args, _, q, _) = rewrite("af_xdp:eth1,start_queue=2,force_copy=1", p).unwrap();
        assert_eq!(
            args,
            "iface=eth1,start_queue=2,force_copy=1,busy_budget=0,xdp_prog=/tmp/p.o"
        );
        assert_eq!(q, 2);
    }

    #[test]
    fn long_form_keeps_a_given_program() {
        let p = Path::new("/tmp/p.o");
        let (name, args, _, _, ours) = rewrite("net_af_xdp0,iface=v0", p).unwrap();
        assert_eq!(
            (name.as_str(), args.as_str(), ours),
            (
                "net_af_xdp0",
                "iface=v0,busy_budget=0,xdp_prog=/tmp/p.o",
                true
            )
        );
        let (_, args, _, _, ours) = rewrite("net_af_xdp0,iface=v0,xdp_prog=/x.o", p).unwrap();
        assert_eq!(
            (args.as_str(), ours),
            ("iface=v0,xdp_prog=/x.o,busy_budget=0", false)
        );
        // A busy_budget given is kept as it is.
        let (_, args, _, _, _) = rewrite("af_xdp:v0,busy_budget=64", p).unwrap();
        assert_eq!(args, "iface=v0,busy_budget=64,xdp_prog=/tmp/p.o");
    }

    #[test]
    fn bad_devargs_are_refused() {
        let p = Path::new("/tmp/p.o");
        for bad in [
            "af_xdp:",
            "net_af_xdp0",
            "net_af_xdp0,iface",
            "net_tap0,iface=x",
            "af_xdp:a/b",
        ] {
            assert!(rewrite(bad, p).is_err(), "{bad}");
        }
        assert!(rewrite("af_xdp:v0,start_queue=x", p).is_err());
    }

    #[test]
    fn iface_is_found_in_either_form() {
        assert_eq!(
            iface_of("af_xdp:eth0,start_queue=1").as_deref(),
            Some("eth0")
        );
        assert_eq!(
            iface_of("net_af_xdp0,start_queue=1,iface=v1").as_deref(),
            Some("v1")
        );
        assert_eq!(iface_of("net_tap0,iface=t0"), None);
        assert!(
            is_af_xdp("af_xdp:x") && is_af_xdp("net_af_xdp1,iface=x") && !is_af_xdp("net_tap0")
        );
    }

    #[test]
    fn the_embedded_object_is_a_bpf_elf_with_the_map_and_program() {
        // ELF, 64-bit, machine EM_BPF (247).
        assert_eq!(&XDP_OBJECT[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([XDP_OBJECT[18], XDP_OBJECT[19]]), 247);
        let has = |s: &[u8]| XDP_OBJECT.windows(s.len()).any(|w| w == s);
        assert!(has(b"xsks_map") && has(b"rsnic_xdp") && has(b".maps"));
    }

    #[test]
    fn loopback_is_seen_through_the_kernel() {
        // Every network namespace has `lo` (index 1, MTU 65536 since 3.6).
        assert_eq!(ifindex("lo"), 1);
        assert!(kernel_mtu("lo").is_some_and(|m| m >= 1500));
        assert_eq!(ifindex("xd-none-here"), 0);
        assert_eq!(kernel_mtu("xd-none-here"), None);
    }

    #[test]
    fn a_queue_the_interface_lacks_is_a_clear_error() {
        let e = prepare("af_xdp:lo,start_queue=4096")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("receive queue") && e.contains("start_queue=4096"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_interface_is_a_clear_error() {
        let e = prepare("af_xdp:xd-nonexistent9").unwrap_err().to_string();
        assert!(
            e.contains("xd-nonexistent9") && e.contains("no such network interface"),
            "{e}"
        );
    }
}
