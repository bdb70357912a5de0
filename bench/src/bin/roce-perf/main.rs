//! `roce-perf`: perftest for this NIC. The same subcommands, flags and output
//! tables as `ib_write_bw`, `ib_read_lat`, ...: run it without a server
//! address to be the server, with one to be the client.
//!
//! ```text
//! roce-perf write_bw --dev net_tap0,iface=rt-a --ip 10.0.0.1            # server
//! roce-perf write_bw --dev net_tap0,iface=rt-b --ip 10.0.0.2 10.99.0.1  # client
//! ```
//!
//! The out-of-band exchange (QPN, PSN, IP, MAC, rkey, VA, MTU, CC) runs over
//! TCP to `<server>:<port>`: ours (docs/connection.md) or perftest's
//! (`oob::perftest`), so that the real `ib_write_bw` and friends
//! are peers in either role: a server tells them apart by the client's
//! first byte, a client speaks perftest's with `--exchange perftest`. The
//! RDMA traffic runs over the DPDK port.
//!
//! Modules: [`cli`] (flags), [`setup`] (NIC, exchange, buffer layout), [`bw`]
//! and [`lat`] (the tests).

mod bw;
mod cli;
mod keys;
mod lat;
mod link;
mod setup;

use std::net::{Ipv4Addr, TcpListener};

use bench::perftest;
use clap::Parser;
use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig};

use cli::{Cli, Test};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // EAL arguments follow `--`.
    let (ours, eal): (Vec<String>, Vec<String>) = match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args.clone(), Vec::new()),
    };
    let cli = Cli::parse_from(ours);
    if let Err(e) = run(cli.test, eal) {
        eprintln!("roce-perf: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// `--ip` as given, or on a `net_af_xdp` port without it, the kernel
/// interface's own IPv4 address (host mode, nic::host).
fn host_ip(test: Test) -> Res<Test> {
    let (_, o) = test.parts();
    if !o.ip.is_unspecified() {
        return Ok(test);
    }
    match dpdk::af_xdp::iface_of(&o.dev).filter(|_| !o.loopback) {
        Some(iface) => {
            let ip = nic::host::KernelIface::new(&iface)?.ipv4()?;
            Ok(test.with(|o| o.ip = ip.into()))
        }
        None => Err("--ip is required (a net_af_xdp port takes its interface's own)".into()),
    }
}

fn run(test: Test, eal_args: Vec<String>) -> Res<()> {
    let test = host_ip(test)?;
    let (_, o) = test.parts();
    // Ctrl-C or a kill must not leave our XDP program on the interface
    // (dpdk::xdp_link): before the EAL starts any thread.
    if dpdk::af_xdp::is_af_xdp(&o.dev) && !o.loopback {
        dpdk::xdp_link::detach_on_signals()?;
    }
    if let Some(m) = o
        .mtu
        .filter(|m| !matches!(m, 256 | 512 | 1024 | 2048 | 4096))
    {
        return Err(format!("-m {m}: MTU must be 256, 512, 1024, 2048 or 4096").into());
    }
    // A PCI address (0000:03:00.0) needs the PCI scan.
    let pci = o.dev.contains(':') && !o.dev.contains(',') && !dpdk::af_xdp::is_af_xdp(&o.dev);
    let eal = Eal::init(&dpdk::tool_args("roce-perf", &eal_args, pci))?;
    if !o.loopback {
        return run_side(&test, eal, None, false);
    }
    // Both ends here: a ring pair with both NICs' engines on one poll-mode
    // thread (so that the two sides' own threads have the other core), the
    // server on one end in a thread (quiet), the client on the other, the
    // exchange over TCP on the loopback address.
    let queues = o.shards.filter(|_| !o.dispatcher).unwrap_or(1);
    let (pa, pb) = Port::ring_pair_queues(eal, "roce-perf", 4096, queues)?;
    // The engines on the last core (or --core), the sides by `side_core`.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let engine_core = o.core.unwrap_or(cores.saturating_sub(1));
    let side_core = side_core(cores, o.busy_poll, o.shards.is_some());
    let [a, b, c, d] = o.ip.octets();
    let client_ip = Ipv4Addr::new(a, b, c, d.wrapping_add(1));
    let (dev_a, dev_b) = if let Some(shards) = o.shards {
        let shards = usize::from(shards);
        let plan = shard_cores(shards, 2, o.dispatcher, cores);
        let open = |port, ip: Ipv4Addr, pcap: Option<&std::ffi::OsString>, cores: &[_]| {
            let mut cfg = device_config(o, ip);
            cfg.idle_yield = !o.busy_poll;
            cfg.pcap = pcap.map(std::path::PathBuf::from);
            Device::open_sharded(eal, port, cfg, cores)
        };
        (
            Some(open(pa, o.ip, None, &plan[..shards])?),
            Some(open(pb, client_ip, o.pcap.as_ref(), &plan[shards..])?),
        )
    } else {
        // --pcap captures at the client's NIC (both directions). The
        // group's thread parks when both engines are idle (unless
        // --busy_poll), so that the core is free for whatever shares it.
        let mut server_cfg = device_config(o, o.ip);
        server_cfg.idle_yield = !o.busy_poll;
        let mut client_cfg = device_config(o, client_ip);
        client_cfg.idle_yield = !o.busy_poll;
        client_cfg.pcap = o.pcap.as_ref().map(std::path::PathBuf::from);
        let mut devs = Device::open_group(
            eal,
            vec![(pa, server_cfg), (pb, client_cfg)],
            Some(engine_core),
        )?;
        let (dev_b, dev_a) = (devs.pop(), devs.pop());
        (dev_a, dev_b)
    };
    // A free TCP port for the exchange, so that loopback runs side by side.
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port();
    let server_test = test.with(|o| {
        o.port = tcp;
        o.server = None;
        o.dev = "ring pair (server end)".into();
        o.out_json = None;
        o.pcap = None;
    });
    let client_test = test.with(|o| {
        o.port = tcp;
        o.server = Some(Ipv4Addr::LOCALHOST.into());
        o.ip = client_ip;
        o.dev = "ring pair (loopback)".into();
    });
    let server = dpdk::lcore::spawn_pinned(eal, "roce-perf-server", side_core, move || {
        run_side(&server_test, eal, dev_a, true).map_err(|e| e.to_string())
    })?;
    let client = dpdk::lcore::spawn_pinned(eal, "roce-perf-client", side_core, move || {
        run_side(&client_test, eal, dev_b, false).map_err(|e| e.to_string())
    })?;
    // A failed client returns at once (the server may still wait for it);
    // a server that failed first says why (the client only saw it close).
    let done = client
        .join()
        .map_err(|_| "the client thread panicked".to_string())?;
    if let Err(e) = done {
        if server.is_finished() {
            if let Ok(Err(s)) = server.join() {
                return Err(format!("{e} (server: {s})").into());
            }
        }
        return Err(e.into());
    }
    server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?
        .map_err(|e| format!("server: {e}"))?;
    Ok(())
}

/// One side (server or client) of a test.
fn run_side(test: &Test, eal: &'static Eal, dev: Option<Device>, quiet: bool) -> Res<()> {
    let (name, o) = test.parts();
    if !o.busy_poll {
        // Woken by the engine (a completion), run at once even on a core
        // something else keeps busy.
        nic::verbs::wake_quickly();
    }
    let mut s = setup::setup(test, eal, dev, quiet)?;
    if !quiet {
        if test.is_lat() {
            print!("{}", perftest::lat_header());
        } else {
            print!("{}", perftest::bw_header(o.report_gbits));
        }
    }
    let json: Vec<String> = if test.is_lat() {
        lat::run(test, &mut s, quiet)?
            .iter()
            .map(|(size, iters, st)| format!(
                "{{\"bytes\":{size},\"iterations\":{iters},\"t_min\":{:.3},\"t_max\":{:.3},\"t_typical\":{:.3},\"t_avg\":{:.3},\"t_stdev\":{:.3},\"p99\":{:.3},\"p99_9\":{:.3}}}",
                st.t_min, st.t_max, st.t_typical, st.t_avg, st.t_stdev, st.p99, st.p999
            ))
            .collect()
    } else {
        bw::run(test, &mut s, quiet)?
            .iter()
            .map(|r| format!(
                "{{\"bytes\":{},\"iterations\":{},\"bw_peak_gbps\":{:.6},\"bw_avg_gbps\":{:.6},\"msg_rate_mpps\":{:.6}}}",
                r.bytes, r.iterations, r.peak_bps * 8e-9, r.avg_bps * 8e-9, r.msg_rate / 1e6
            ))
            .collect()
    };
    if !quiet {
        println!("{}", perftest::RULE);
    }
    let server = s.server;
    let protocol = s.link.protocol();
    // The counters once every engine has stopped: final.
    drop(s.qps);
    let counters = s.dev.close_with_counters();
    if let Some(path) = &o.out_json {
        let text = format!(
            "{{\"test\":\"{name}\",\"role\":\"{}\",\"exchange\":\"{protocol}\",\"results\":[{}],\"counters\":{{{}}}}}\n",
            if server { "server" } else { "client" },
            json.join(","),
            counters
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        std::fs::write(path, text)
            .map_err(|e| format!("cannot write {}: {e}", std::path::Path::new(path).display()))?;
    }
    Ok(())
}

/// The CPU of a loopback run's server and client threads on `cores` CPUs:
/// the first where they spin (`busy_poll`: each needs a core of its own,
/// away from the engines') or beside pinned shards (`sharded`:
/// [`shard_cores`] keeps CPU 0 for them); otherwise none. Those threads
/// then park while they wait, and the kernel wakes them on whichever CPU is
/// free: pinned to CPU 0 beside another busy process, a woken client waited
/// out that process's slice (over 1 ms, a quarter of the run) while the
/// engine's core idled (docs/benchmarks.md, "roce-perf on a shared core").
fn side_core(cores: usize, busy_poll: bool, sharded: bool) -> Option<usize> {
    (cores > 1 && (busy_poll || sharded)).then_some(0)
}

/// A device at `ip` with the options every NIC of a run shares: where
/// payloads are copied into one-segment frames (`--copy_threshold`), the
/// room for them.
pub(crate) fn device_config(o: &cli::Opts, ip: Ipv4Addr) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(ip.octets());
    cfg.line_rate_bps = u64::from(o.line_rate_gbps) * 1_000_000_000;
    if let Some(n) = o.copy_threshold {
        cfg.copy_threshold = usize::from(n);
        // Headers (with INT and the CC extension), pad, ICRC and headroom.
        cfg.tx_data_room = n + 512;
    }
    cfg
}

/// The CPUs of `sides` devices' shards (`shards` each, side after side):
/// pinned when every busy thread (the shards, each side's dispatcher with
/// `dispatcher`, and the client on CPU 0) has a CPU of its own, one per
/// physical core first ([`cpus_by_core`]: a hyperthread sibling shares its
/// core's execution units); otherwise not pinned, and said so, since more
/// busy threads than CPUs share them by the scheduler's time slices and
/// the rates show the sharing, not the NIC.
pub(crate) fn shard_cores(
    shards: usize,
    sides: usize,
    dispatcher: bool,
    cores: usize,
) -> Vec<Option<usize>> {
    let busy = sides * (shards + usize::from(dispatcher)) + 1;
    if busy <= cores {
        cpus_by_core(cores)
            .into_iter()
            .filter(|&c| c != 0)
            .take(sides * shards)
            .map(Some)
            .collect()
    } else {
        eprintln!(
            "roce-perf: warning: {busy} busy threads ({sides} x {shards} shards{}, the client) \
             on {cores} CPUs: shards not pinned, the rates show the CPUs' sharing",
            if dispatcher { ", dispatchers" } else { "" }
        );
        vec![None; sides * shards]
    }
}

/// CPUs `0..cores`, one per physical core first (in CPU order, CPU 0's
/// core taken by the client), then their hyperthread siblings; by CPU
/// number where sysfs does not tell the topology.
fn cpus_by_core(cores: usize) -> Vec<usize> {
    let core_of = |c: usize| {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{c}/topology/{f}"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        (read("physical_package_id"), read("core_id"))
    };
    let mut seen = vec![core_of(0)];
    let (mut first, mut siblings) = (vec![0], Vec::new());
    for c in 1..cores {
        let id = core_of(c);
        if id.1.is_some() && seen.contains(&id) {
            siblings.push(c);
        } else {
            seen.push(id);
            first.push(c);
        }
    }
    first.extend(siblings);
    first
}

#[cfg(test)]
mod tests {
    use super::side_core;

    /// Threads that spin, or share the machine with pinned shards, keep
    /// CPU 0; threads that park float; one CPU pins nothing.
    #[test]
    fn sides_are_pinned_only_where_they_spin_or_shards_are_pinned() {
        assert_eq!(side_core(2, true, false), Some(0));
        assert_eq!(side_core(16, false, true), Some(0));
        assert_eq!(side_core(2, false, false), None);
        assert_eq!(side_core(1, true, true), None);
    }
}
