//! `rsnic-exec`: runs an unmodified ibverbs program on rsnic, e.g.
//!
//! ```text
//! rsnic-exec --dev net_tap0,iface=rs0 --ip 10.0.0.1 [--cc hpcc] -- ib_write_bw -d rsnic0 ...
//! rsnic-exec --dev af_xdp:eth0 -- ib_write_bw -d rsnic0 ...   # host mode: eth0's own IP
//! ```
//!
//! It sets the `RSNIC_*` variables that `librsnic_verbs.so` reads (see
//! verbs-abi's `config` module), puts the library first in `LD_PRELOAD`
//! and replaces itself with the program (`execvp`), so the program's pid,
//! signals and exit status are its own.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Parser;

/// Run an unmodified ibverbs program (perftest, ibv_rc_pingpong, ...) on
/// the rsnic software RoCEv2 NIC.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// DPDK devargs of the port (RSNIC_DEV), e.g. net_tap0,iface=rs0.
    #[arg(long)]
    dev: String,
    /// The port's IPv4 address (RSNIC_IP); the GID is `::ffff:<ip>`.
    /// Required, except on a net_af_xdp port (af_xdp:IF), which takes its
    /// interface's own (host mode).
    #[arg(long)]
    ip: Option<std::net::Ipv4Addr>,
    /// The port's MAC (RSNIC_MAC; default: derived from the IP on net_tap).
    #[arg(long)]
    mac: Option<String>,
    /// CPU for the engine thread (RSNIC_CORE).
    #[arg(long)]
    core: Option<usize>,
    /// Congestion control of every QP (RSNIC_CC): none, dcqcn, hpcc, ...
    #[arg(long, default_value = "none")]
    cc: String,
    /// Loss recovery of every RC QP (RSNIC_LOSS_RECOVERY): gbn or sr (both
    /// ends must agree).
    #[arg(long = "loss-recovery", default_value = "gbn")]
    loss_recovery: String,
    /// Extra EAL arguments (RSNIC_EAL), one string.
    #[arg(long)]
    eal: Option<String>,
    /// The engine never yields its core (RSNIC_BUSY_POLL=1).
    #[arg(long)]
    busy_poll: bool,
    /// The library to preload (default: librsnic_verbs.so beside this binary).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

/// Whether `dev` names a `net_af_xdp` port on a kernel interface (the
/// library's host mode; the same test as `dpdk::af_xdp::iface_of`, which
/// this small launcher does not link).
fn is_af_xdp(dev: &str) -> bool {
    let d = dev.trim();
    d.strip_prefix("af_xdp:")
        .is_some_and(|rest| !rest.split(',').next().unwrap_or_default().trim().is_empty())
        || (d.starts_with("net_af_xdp") && d.split(',').any(|kv| kv.trim().starts_with("iface=")))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.ip.is_none() && !is_af_xdp(&cli.dev) {
        eprintln!(
            "rsnic-exec: --ip is required (only a net_af_xdp port, af_xdp:IF, takes its \
             interface's own)"
        );
        return ExitCode::from(2);
    }
    let lib = match cli.lib.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("librsnic_verbs.so")))
    }) {
        Some(l) if l.exists() => l,
        Some(l) => {
            eprintln!(
                "rsnic-exec: {} not found (cargo build --release builds it)",
                l.display()
            );
            return ExitCode::from(127);
        }
        None => {
            eprintln!("rsnic-exec: cannot locate librsnic_verbs.so: pass --lib");
            return ExitCode::from(127);
        }
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = Command::new(&cli.program[0]);
    cmd.args(&cli.program[1..])
        .env("LD_PRELOAD", preload)
        .env("RSNIC_DEV", &cli.dev)
        .env("RSNIC_CC", &cli.cc)
        .env("RSNIC_LOSS_RECOVERY", &cli.loss_recovery);
    match cli.ip {
        Some(ip) => cmd.env("RSNIC_IP", ip.to_string()),
        // Host mode: the library reads the interface's address; an RSNIC_IP
        // inherited from the caller's environment must not override it.
        None => cmd.env_remove("RSNIC_IP"),
    };
    if let Some(m) = &cli.mac {
        cmd.env("RSNIC_MAC", m);
    }
    if let Some(c) = cli.core {
        cmd.env("RSNIC_CORE", c.to_string());
    }
    if let Some(e) = &cli.eal {
        cmd.env("RSNIC_EAL", e);
    }
    if cli.busy_poll {
        cmd.env("RSNIC_BUSY_POLL", "1");
    }
    let err = cmd.exec();
    eprintln!("rsnic-exec: cannot run {}: {err}", cli.program[0]);
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::is_af_xdp;

    #[test]
    fn af_xdp_ports_need_no_ip() {
        assert!(is_af_xdp("af_xdp:eth0") && is_af_xdp("af_xdp:eth0,start_queue=1"));
        assert!(is_af_xdp("net_af_xdp0,iface=v0,force_copy=1"));
        for d in [
            "af_xdp:",
            "af_xdp:,start_queue=1",
            "net_af_xdp0",
            "net_tap0,iface=t0",
        ] {
            assert!(!is_af_xdp(d), "{d}");
        }
    }
}
