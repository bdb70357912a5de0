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
//! TCP to `<server>:<port>` (docs/connection.md), as perftest's does; the
//! RDMA traffic runs over the DPDK port.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bench::perftest::{self, AddressLine, BwRow, LatStats};
use cc::CcKind;
use clap::{Parser, Subcommand};
use dpdk::{Eal, Port};
use nic::exchange::{check_compatible, CcName, ConnInfo};
use nic::verbs::{
    CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair, RemoteQp,
};
use rdma::transport::{Access, RecvWr, SendOp, SendWr, Sge, WcStatus};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "perftest-style RDMA benchmarks over the rsnic DPDK NIC"
)]
struct Cli {
    #[command(subcommand)]
    test: Test,
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
#[allow(non_camel_case_types)]
#[command(rename_all = "snake_case")]
enum Test {
    /// RDMA WRITE bandwidth (ib_write_bw).
    write_bw(Opts),
    /// RDMA READ bandwidth (ib_read_bw).
    read_bw(Opts),
    /// SEND bandwidth (ib_send_bw).
    send_bw(Opts),
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    write_lat(Opts),
    /// RDMA READ latency (ib_read_lat).
    read_lat(Opts),
    /// SEND ping-pong latency (ib_send_lat).
    send_lat(Opts),
}

use cc::CcKind as CcArg;

#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
struct Opts {
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency).
    #[arg(short = 's', long = "size")]
    size: Option<u32>,
    /// Iterations (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u16,
    /// Run sizes 2 .. 2^23 (bandwidth) or 2 .. 2^16 (latency).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the largest the
    /// port carries, as perftest takes the port's active MTU; 1024 on a TAP).
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<u16>,
    /// Send queue depth (outstanding work requests).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u16,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Report bandwidth in Gbit/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Write the results as JSON to this file.
    #[arg(long = "out_json")]
    out_json: Option<std::ffi::OsString>,
    /// DPDK devargs or PCI address of the port.
    #[arg(long = "dev", default_value = "net_tap0,iface=rsnic0")]
    dev: String,
    /// IPv4 address of this NIC.
    #[arg(long = "ip")]
    ip: Ipv4Addr,
    /// MAC address of this NIC (default: the port's; for `net_tap` ports a
    /// locally administered 02:52:53:<ip>, because the kernel side of a TAP
    /// carries the PMD's own MAC, and a Linux bridge keeps frames for that
    /// address to itself instead of forwarding them into the TAP).
    #[arg(long = "mac", value_parser = parse_mac)]
    mac: Option<[u8; 6]>,
    /// Congestion control.
    #[arg(long = "cc", value_enum, default_value = "none")]
    cc: CcArg,
    /// Capture every frame into this pcapng file.
    #[arg(long = "pcap")]
    pcap: Option<std::ffi::OsString>,
    /// CPU for the NIC engine.
    #[arg(long = "core")]
    core: Option<usize>,
    /// Never yield the engine's core, even when idle (by default an idle
    /// engine yields after 64 empty poll turns, so that processes sharing
    /// cores, e.g. both ends on one host, make progress).
    #[arg(long = "busy_poll")]
    busy_poll: bool,
    /// Shard this NIC's QPs over N engine threads behind a dispatcher that
    /// owns the port (`nic::verbs::Device::open_sharded`; the dispatcher on
    /// `--core`); QPs (`-q`) go to the shards in turn. 1: one engine.
    #[arg(long = "shards", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    shards: u16,
    /// Run the server and the client in this process, back to back on a
    /// DPDK ring pair (`--dev` and the server address are not used; the
    /// server is `--ip`, the client the next address); prints the client's
    /// results.
    #[arg(long = "loopback")]
    loopback: bool,
    /// The server's address (TCP); absent: be the server.
    server: Option<std::net::IpAddr>,
}

impl Test {
    fn parts(&self) -> (&'static str, &Opts) {
        match self {
            Test::write_bw(o) => ("write_bw", o),
            Test::read_bw(o) => ("read_bw", o),
            Test::send_bw(o) => ("send_bw", o),
            Test::write_lat(o) => ("write_lat", o),
            Test::read_lat(o) => ("read_lat", o),
            Test::send_lat(o) => ("send_lat", o),
        }
    }
    /// The same test with changed options.
    fn with(&self, f: impl FnOnce(&mut Opts)) -> Test {
        let mut t = self.clone();
        match &mut t {
            Test::write_bw(o)
            | Test::read_bw(o)
            | Test::send_bw(o)
            | Test::write_lat(o)
            | Test::read_lat(o)
            | Test::send_lat(o) => f(o),
        }
        t
    }

    fn is_lat(&self) -> bool {
        self.parts().0.ends_with("_lat")
    }
    fn title(&self) -> &'static str {
        match self {
            Test::write_bw(_) => "RDMA_Write BW Test",
            Test::read_bw(_) => "RDMA_Read BW Test",
            Test::send_bw(_) => "Send BW Test",
            Test::write_lat(_) => "RDMA_Write Latency Test",
            Test::read_lat(_) => "RDMA_Read Latency Test",
            Test::send_lat(_) => "Send Latency Test",
        }
    }
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    let mut m = [0u8; 6];
    for (d, p) in m.iter_mut().zip(parts) {
        *d = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address"))?;
    }
    Ok(m)
}

fn cc_kind(c: CcArg) -> CcKind {
    match c {
        CcArg::None => CcKind::None,
        CcArg::Dcqcn => CcKind::Dcqcn,
        CcArg::Hpcc => CcKind::Hpcc,
        CcArg::RxHpcc => CcKind::RxHpcc,
        CcArg::Ldcp => CcKind::Ldcp,
    }
}

fn cc_name(c: CcArg) -> CcName {
    match c {
        CcArg::None => CcName::None,
        CcArg::Dcqcn => CcName::Dcqcn,
        CcArg::Hpcc => CcName::Hpcc,
        CcArg::RxHpcc => CcName::RxHpcc,
        CcArg::Ldcp => CcName::Ldcp,
    }
}

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

/// The session's completion queues: one per shard of the device (a QP
/// completes into its shard's), polled in turn.
struct Cqs {
    cqs: Vec<CompletionQueue>,
    next: usize,
}

impl Cqs {
    fn poll_one(&mut self) -> Option<rdma::transport::WorkCompletion> {
        let n = self.cqs.len();
        for j in 0..n {
            let k = (self.next + j) % n;
            if let Some(wc) = self.cqs[k].poll_one() {
                self.next = (k + 1) % n;
                return Some(wc);
            }
        }
        None
    }

    /// As [`CompletionQueue::wait`], over every CQ.
    fn wait(&mut self, timeout: Duration) -> Option<rdma::transport::WorkCompletion> {
        nic::verbs::wait_until(timeout, || self.poll_one())
    }
}

struct Session {
    dev: Device,
    cq: Cqs,
    /// The test's QPs (`-q`; one for latency tests).
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    /// The peer's QP parameters, by QP.
    remotes: Vec<ConnInfo>,
    stream: TcpStream,
}

fn line_of(s: &mut TcpStream) -> Res<String> {
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    if line.is_empty() {
        return Err("the peer closed the connection".into());
    }
    Ok(line)
}

/// Starts the EAL with the user's arguments (after `--`), or with ours:
/// no hugepages, no PCI scan, a per-process file prefix.
fn start_eal(eal_args: Vec<String>) -> Res<&'static Eal> {
    let mut args = vec!["roce-perf".to_string()];
    if eal_args.is_empty() {
        args.extend(
            [
                "--no-huge",
                "-m",
                "1024",
                "--no-pci",
                "--no-shconf",
                "--no-telemetry",
                "--log-level=lib.eal:error",
            ]
            .map(String::from),
        );
        args.push(format!("--file-prefix=roce-perf-{}", std::process::id()));
    } else {
        args.extend(eal_args);
    }
    Ok(Eal::init(&args)?)
}

/// Opens the NIC on `--dev` and waits for its link.
fn open_device(o: &Opts, eal: &'static Eal) -> Res<Device> {
    // Wait for the link as perftest waits for the port to be ACTIVE. A TAP
    // re-attached to a persistent multi-queue interface can come up without
    // carrier (the kernel then drops all we send, so every transfer would end
    // in retry-exceeded): the port is opened again, which attaches afresh.
    let mut attempt = 1;
    loop {
        let port = Port::open(eal, o.dev.as_str())?;
        let link = port.link_watch();
        let mut cfg = DeviceConfig::new(o.ip.octets());
        let ip = o.ip.octets();
        cfg.mac = o.mac.or_else(|| {
            o.dev
                .starts_with("net_tap")
                .then_some([0x02, 0x52, 0x53, ip[1], ip[2], ip[3]])
        });
        cfg.core = o.core;
        cfg.idle_yield = !o.busy_poll;
        cfg.pcap = o.pcap.as_ref().map(std::path::PathBuf::from);
        let dev = if o.shards > 1 {
            let cores = vec![None; usize::from(o.shards)];
            Device::open_sharded(eal, port, cfg, &cores)?
        } else {
            Device::open(eal, port, cfg)?
        };
        if link.wait_up(Duration::from_secs(2)) {
            return Ok(dev);
        }
        drop(link);
        dev.close();
        if attempt == 3 {
            return Err(format!("the link of {} did not come up", o.dev).into());
        }
        attempt += 1;
        eprintln!(
            "roce-perf: the link of {} is down after start; opening it again",
            o.dev
        );
    }
}

/// Opens the device on `--dev` (or takes `given`), creates the QP and
/// connects it with the peer's over TCP; prints perftest's preamble unless
/// `quiet`.
fn setup(
    test: &Test,
    eal: &'static Eal,
    buf_len: usize,
    given: Option<Device>,
    quiet: bool,
) -> Res<Session> {
    let (name, o) = test.parts();
    let dev = match given {
        Some(d) => d,
        None => open_device(o, eal)?,
    };
    // As ibverbs' active_mtu follows the netdev's MTU: a path MTU whose
    // frames the port would drop is refused up front.
    let mtu = o.mtu.map_or(dev.max_path_mtu(), u32::from);
    if mtu > dev.max_path_mtu() {
        return Err(format!(
            "-m {mtu}: {} carries RoCE MTUs up to {} (its frames are too short for more)",
            o.dev,
            dev.max_path_mtu()
        )
        .into());
    }
    // One CQ per shard (a QP completes on its own shard); QP j on CQ j.
    let mut cq = Cqs {
        cqs: Vec::new(),
        next: 0,
    };
    for _ in 0..dev.shards() {
        cq.cqs.push(dev.create_cq(o.tx_depth as usize * 4 + 64)?);
    }
    let qopts = QpOptions {
        sq_depth: o.tx_depth.max(1),
        rq_depth: o.tx_depth.max(1),
        mtu,
        cc: cc_kind(o.cc),
        ..QpOptions::default()
    };
    // -q N: N RC QPs (bandwidth tests), posted to round robin, sharing the
    // CQ and the buffer; one exchange line per QP, in lock step, and the
    // count in the test name so that both sides must agree.
    if test.is_lat() && o.qps > 1 {
        return Err(
            "-q applies to the bandwidth tests (perftest's latency tests use one QP)".into(),
        );
    }
    let nq = usize::from(o.qps.max(1));
    let mut qps = Vec::with_capacity(nq);
    for j in 0..nq {
        let c = &cq.cqs[j % cq.cqs.len()];
        qps.push(dev.create_qp(c, c, qopts)?);
    }
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dev.reg_mr(buf_len, access)?;
    let kind = cc_kind(o.cc);
    let test_name = if nq > 1 {
        format!("{name}-q{nq}")
    } else {
        name.to_string()
    };
    let ext: Vec<String> = if kind.uses_extensions() {
        vec!["cc".into()]
    } else {
        Vec::new()
    };
    let locals: Vec<ConnInfo> = qps
        .iter()
        .map(|qp| {
            let me = qp.remote_info();
            ConnInfo {
                qpn: me.qpn,
                psn: me.psn,
                ip: o.ip,
                mac: dev.mac(),
                rkey: mr.rkey(),
                va: mr.va(),
                len: buf_len as u64,
                mtu: mtu as u16,
                cc: cc_name(o.cc),
                ext: ext.clone(),
                udp_sport: 0xC000 | (me.qpn as u16 & 0x3FFF),
                test: test_name.clone(),
            }
        })
        .collect();
    let timeout = Duration::from_secs(60);
    let (stream, remotes) = match o.server {
        None => {
            let l = TcpListener::bind(("0.0.0.0", o.port))
                .map_err(|e| format!("cannot listen on TCP port {}: {e}", o.port))?;
            if !quiet {
                println!("\n************************************\n* Waiting for client to connect... *\n************************************");
            }
            let (mut s, _) = l.accept()?;
            s.set_read_timeout(Some(timeout))?;
            let mut remotes = Vec::with_capacity(nq);
            for l in &locals {
                let remote = ConnInfo::parse(&line_of(&mut s)?)?;
                s.write_all(l.format()?.as_bytes())?;
                check_compatible(l, &remote)?;
                remotes.push(remote);
            }
            (s, remotes)
        }
        Some(addr) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut s = loop {
                match TcpStream::connect_timeout(&(addr, o.port).into(), Duration::from_secs(2)) {
                    Ok(s) => break s,
                    Err(e)
                        if Instant::now() < deadline
                            && e.kind() == std::io::ErrorKind::ConnectionRefused =>
                    {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => {
                        return Err(
                            format!("cannot reach the server at {addr}:{}: {e}", o.port).into()
                        )
                    }
                }
            };
            s.set_read_timeout(Some(timeout))?;
            let mut remotes = Vec::with_capacity(nq);
            for l in &locals {
                s.write_all(l.format()?.as_bytes())?;
                let remote = ConnInfo::parse(&line_of(&mut s)?)?;
                check_compatible(&remote, l)?;
                remotes.push(remote);
            }
            (s, remotes)
        }
    };
    stream.set_nodelay(true)?;
    for (qp, remote) in qps.iter_mut().zip(&remotes) {
        qp.connect(&RemoteQp {
            qpn: remote.qpn,
            psn: remote.psn,
            ip: remote.ip.octets(),
            mac: Some(remote.mac),
            mtu: u32::from(remote.mtu),
            cc: kind,
        })?;
    }
    let settings = vec![
        ("Dual-port", "OFF".to_string()),
        ("Device", o.dev.as_str().to_string()),
        ("Number of qps", nq.to_string()),
        ("Transport type", "RoCEv2 (rsnic, DPDK)".to_string()),
        ("Connection type", "RC".to_string()),
        ("TX depth", o.tx_depth.to_string()),
        ("Mtu", format!("{mtu}[B]")),
        ("Link type", "Ethernet".to_string()),
        ("Congestion ctl", kind.to_string()),
        ("Data ex. method", "Ethernet".to_string()),
    ];
    if quiet {
        return Ok(Session {
            dev,
            cq,
            qps,
            mr,
            remotes,
            stream,
        });
    }
    print!("{}", perftest::preamble(test.title(), &settings));
    let line = |c: &ConnInfo| AddressLine {
        qpn: c.qpn,
        psn: c.psn,
        rkey: c.rkey,
        vaddr: c.va,
        ip: c.ip.octets(),
    };
    // As perftest: one local and one remote line per QP.
    for l in &locals {
        print!("{}", line(l).format("local"));
    }
    for r in &remotes {
        print!("{}", line(r).format("remote"));
    }
    println!("{}", perftest::RULE);
    Ok(Session {
        dev,
        cq,
        qps,
        mr,
        remotes,
        stream,
    })
}

fn sizes(test: &Test) -> Vec<u32> {
    let (_, o) = test.parts();
    if o.all {
        let max = if test.is_lat() { 16 } else { 23 };
        (1..=max).map(|p| 1u32 << p).collect()
    } else {
        vec![o.size.unwrap_or(if test.is_lat() { 2 } else { 65536 })]
    }
}

fn wait_wc(cq: &mut Cqs) -> Res<rdma::transport::WorkCompletion> {
    let wc = cq
        .wait(Duration::from_secs(10))
        .ok_or("no completion within 10 s (peer gone?)")?;
    if wc.status != WcStatus::Success {
        return Err(format!("work request failed: {:?}", wc.status).into());
    }
    Ok(wc)
}

fn run(test: Test, eal_args: Vec<String>) -> Res<()> {
    let (_, o) = test.parts();
    if let Some(m) = o
        .mtu
        .filter(|m| !matches!(m, 256 | 512 | 1024 | 2048 | 4096))
    {
        return Err(format!("-m {m}: MTU must be 256, 512, 1024, 2048 or 4096").into());
    }
    let eal = start_eal(eal_args)?;
    if !o.loopback {
        return run_side(&test, eal, None, false);
    }
    // Both ends here: a ring pair with both NICs' engines on one poll-mode
    // thread (so that the two sides' own threads have the other core), the
    // server on one end in a thread (quiet), the client on the other, the
    // exchange over TCP on the loopback address.
    let (pa, pb) = Port::ring_pair(eal, "roce-perf", 4096)?;
    // The engines on the last core (or --core), both sides on the first.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let engine_core = o.core.unwrap_or(cores.saturating_sub(1));
    let side_core = (cores > 1).then_some(0);
    let [a, b, c, d] = o.ip.octets();
    let client_ip = Ipv4Addr::new(a, b, c, d.wrapping_add(1));
    let (dev_a, dev_b) = if o.shards > 1 {
        // Sharded: each side's dispatcher and shards on threads of their
        // own (unpinned), yielding when idle.
        let shards = vec![None; usize::from(o.shards)];
        let open = |port, ip: Ipv4Addr| {
            let mut cfg = DeviceConfig::new(ip.octets());
            cfg.idle_yield = !o.busy_poll;
            Device::open_sharded(eal, port, cfg, &shards)
        };
        (Some(open(pa, o.ip)?), Some(open(pb, client_ip)?))
    } else {
        let mut devs = Device::open_group(
            eal,
            vec![
                (pa, DeviceConfig::new(o.ip.octets())),
                (pb, DeviceConfig::new(client_ip.octets())),
            ],
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
    // A failed client returns at once (the server may still wait for it).
    client
        .join()
        .map_err(|_| "the client thread panicked".to_string())??;
    server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?
        .map_err(|e| format!("server: {e}"))?;
    Ok(())
}

/// One side (server or client) of a test.
fn run_side(test: &Test, eal: &'static Eal, dev: Option<Device>, quiet: bool) -> Res<()> {
    let (name, o) = test.parts();
    let sizes = sizes(test);
    let max = *sizes.iter().max().unwrap_or(&2) as usize;
    let depth = o.tx_depth.max(1) as usize;
    let buf = if test.is_lat() {
        max.max(64)
    } else {
        (max * depth.min(64)).max(4096)
    };
    let mut s = setup(test, eal, buf, dev, quiet)?;
    let server = o.server.is_none();
    let mut json = Vec::new();
    if !quiet {
        if test.is_lat() {
            print!("{}", perftest::lat_header());
        } else {
            print!("{}", perftest::bw_header(o.report_gbits));
        }
    }
    for size in sizes {
        let iters = o.iters.unwrap_or(if test.is_lat() { 1000 } else { 5000 });
        match test {
            Test::write_bw(_) | Test::read_bw(_) | Test::send_bw(_) => {
                let row = bw(test, &mut s, size, iters, server)?;
                if let Some(r) = row {
                    if !quiet {
                        print!("{}", perftest::bw_row(&r, o.report_gbits));
                    }
                    json.push(format!(
                        "{{\"bytes\":{},\"iterations\":{},\"bw_peak_gbps\":{:.3},\"bw_avg_gbps\":{:.3},\"msg_rate_mpps\":{:.6}}}",
                        r.bytes, r.iterations, r.peak_bps * 8e-9, r.avg_bps * 8e-9, r.msg_rate / 1e6
                    ));
                }
            }
            _ => {
                let st = lat(test, &mut s, size, iters, server)?;
                if let Some(st) = st {
                    if !quiet {
                        print!("{}", perftest::lat_row(u64::from(size), iters, &st));
                    }
                    json.push(format!(
                        "{{\"bytes\":{size},\"iterations\":{iters},\"t_min\":{:.3},\"t_max\":{:.3},\"t_typical\":{:.3},\"t_avg\":{:.3},\"t_stdev\":{:.3},\"p99\":{:.3},\"p99_9\":{:.3}}}",
                        st.t_min, st.t_max, st.t_typical, st.t_avg, st.t_stdev, st.p99, st.p999
                    ));
                }
            }
        }
    }
    if !quiet {
        println!("{}", perftest::RULE);
    }
    if let Some(path) = &o.out_json {
        let c = s.dev.counters();
        let text = format!(
            "{{\"test\":\"{name}\",\"role\":\"{}\",\"results\":[{}],\"counters\":{{{}}}}}\n",
            if server { "server" } else { "client" },
            json.join(","),
            c.iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        std::fs::write(path, text)
            .map_err(|e| format!("cannot write {}: {e}", std::path::Path::new(path).display()))?;
    }
    s.dev.close();
    Ok(())
}

/// Bandwidth: the client posts `iters` messages keeping `tx_depth` in
/// flight (for SEND the server posts receives); both sides sync over TCP at
/// the end of each size. Peak is the best 10 ms window.
fn bw(test: &Test, s: &mut Session, size: u32, iters: u64, server: bool) -> Res<Option<BwRow>> {
    let (_, o) = test.parts();
    let depth = o.tx_depth.max(1) as u64;
    let slots = (s.mr.len() / size.max(1) as usize).max(1) as u64;
    let is_send = matches!(test, Test::send_bw(_));
    if server {
        // Receive every SEND, keeping the receive queue full; the first
        // receives are posted before telling the client to start.
        let total = if is_send { iters } else { 0 };
        let (mut posted, mut done) = (0u64, 0u64);
        let post = |s: &mut Session, posted: &mut u64| -> Res<()> {
            let off = (*posted % slots) * u64::from(size);
            let q = (*posted % s.qps.len() as u64) as usize;
            s.qps[q].post_recv(RecvWr {
                wr_id: *posted,
                sge: Sge {
                    addr: s.mr.va() + off,
                    len: size,
                    lkey: s.mr.lkey(),
                },
            })?;
            *posted += 1;
            Ok(())
        };
        while posted < total && posted < depth {
            post(s, &mut posted)?;
        }
        s.stream.write_all(b"READY\n")?;
        while done < total {
            wait_wc(&mut s.cq)?;
            done += 1;
            if posted < total {
                post(s, &mut posted)?;
            }
        }
        let l = line_of(&mut s.stream)?;
        if l.trim() != "DONE" {
            return Err(format!("unexpected sync message {l:?}").into());
        }
        return Ok(None);
    }
    if line_of(&mut s.stream)?.trim() != "READY" {
        return Err("the server did not get ready".into());
    }
    let deadline = o.duration.map(|d| Instant::now() + Duration::from_secs(d));
    let total = if deadline.is_some() { u64::MAX } else { iters };
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let mut window = (start, 0u64);
    let mut peak = 0f64;
    while done < total {
        if deadline.is_some_and(|d| Instant::now() >= d) && posted == done {
            break;
        }
        while posted < total && posted - done < depth && deadline.is_none_or(|d| Instant::now() < d)
        {
            let off = (posted % slots) * u64::from(size);
            // Round robin over the QPs (-q), as the server posts receives.
            let q = (posted % s.qps.len() as u64) as usize;
            let remote = &s.remotes[q];
            let op = match test {
                Test::read_bw(_) => SendOp::Read {
                    remote_va: remote.va + off % remote.len.max(1),
                    rkey: remote.rkey,
                },
                Test::send_bw(_) => SendOp::Send,
                _ => SendOp::Write {
                    remote_va: remote.va + off % remote.len.max(1),
                    rkey: remote.rkey,
                },
            };
            s.qps[q].post_send(SendWr {
                wr_id: posted,
                op,
                sge: Sge {
                    addr: s.mr.va() + off,
                    len: size,
                    lkey: s.mr.lkey(),
                },
                signaled: true,
                solicited: false,
            })?;
            posted += 1;
        }
        wait_wc(&mut s.cq)?;
        done += 1;
        let el = window.0.elapsed();
        if el >= Duration::from_millis(10) {
            peak = peak.max((done - window.1) as f64 * f64::from(size) / el.as_secs_f64());
            window = (Instant::now(), done);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    s.stream.write_all(b"DONE\n")?;
    let avg = done as f64 * f64::from(size) / secs;
    Ok(Some(BwRow {
        bytes: u64::from(size),
        iterations: done,
        peak_bps: peak.max(avg),
        avg_bps: avg,
        msg_rate: done as f64 / secs,
    }))
}

/// Latency. write_lat and send_lat are ping-pongs (reported as half the
/// round trip, as perftest does); read_lat times each READ to completion.
fn lat(test: &Test, s: &mut Session, size: u32, iters: u64, server: bool) -> Res<Option<LatStats>> {
    let size = size.max(8);
    let mut samples = Vec::with_capacity(iters as usize);
    let stamp = |i: u64| (i + 1).to_le_bytes();
    // The peer's message lands in the second half of our region.
    let incoming = s.mr.len() as u64 / 2;
    let off_last = incoming + u64::from(size) - 8;
    match test {
        Test::read_lat(_) => {
            if server {
                s.stream.write_all(b"READY\n")?;
                line_of(&mut s.stream)?;
                return Ok(None);
            }
            line_of(&mut s.stream)?;
            for i in 0..iters {
                let t = Instant::now();
                s.qps[0].post_send(SendWr {
                    wr_id: i,
                    op: SendOp::Read {
                        remote_va: s.remotes[0].va,
                        rkey: s.remotes[0].rkey,
                    },
                    sge: Sge {
                        addr: s.mr.va(),
                        len: size,
                        lkey: s.mr.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })?;
                wait_wc(&mut s.cq)?;
                samples.push(t.elapsed().as_nanos() as u64);
            }
            s.stream.write_all(b"DONE\n")?;
        }
        Test::write_lat(_) | Test::send_lat(_) => {
            let send = matches!(test, Test::send_lat(_));
            let mut last = [0u8; 8];
            // The server answers each message; the client times the round trip.
            if send {
                s.qps[0].post_recv(RecvWr {
                    wr_id: 0,
                    sge: Sge {
                        addr: s.mr.va() + incoming,
                        len: size,
                        lkey: s.mr.lkey(),
                    },
                })?;
            }
            s.stream.write_all(b"READY\n")?;
            line_of(&mut s.stream)?;
            for i in 0..iters {
                let t = Instant::now();
                if !server {
                    post_ping(s, send, size, i)?;
                }
                // Wait for the peer's message i.
                if send {
                    loop {
                        let wc = wait_wc(&mut s.cq)?;
                        if wc.opcode == rdma::transport::WcOpcode::Recv {
                            break;
                        }
                    }
                    s.qps[0].post_recv(RecvWr {
                        wr_id: i + 1,
                        sge: Sge {
                            addr: s.mr.va() + incoming,
                            len: size,
                            lkey: s.mr.lkey(),
                        },
                    })?;
                } else {
                    let end = Instant::now() + Duration::from_secs(10);
                    let mut spins = 0u32;
                    loop {
                        s.mr.read(off_last as usize, &mut last);
                        if last == stamp(i) {
                            break;
                        }
                        if Instant::now() > end {
                            return Err(format!(
                                "no answer to message {i} within 10 s (peer gone?); last 8 bytes {last:?}; counters:\n{}",
                                s.dev.counters()
                            )
                            .into());
                        }
                        // Spin, then let a thread that shares the core run.
                        spins += 1;
                        if spins < 64 {
                            std::hint::spin_loop();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
                if server {
                    post_ping(s, send, size, i)?;
                } else {
                    samples.push(t.elapsed().as_nanos() as u64 / 2);
                }
                // Reap our own send completions.
                if !send {
                    wait_wc(&mut s.cq)?;
                }
            }
            if send {
                // Send completions of the loop, reaped at the end.
                while s.cq.poll_one().is_some() {}
            }
            if server {
                return Ok(None);
            }
        }
        _ => unreachable!("latency tests only"),
    }
    Ok(LatStats::from_ns(&mut samples))
}

fn post_ping(s: &mut Session, send: bool, size: u32, i: u64) -> Res<()> {
    // Sent from the first half of our region into the second half of the
    // peer's.
    let off_last = u64::from(size) - 8;
    // The last 8 bytes carry the iteration number, so the peer sees when the
    // whole message has landed (WRITE data is placed in order).
    s.mr.write(off_last as usize, &(i + 1).to_le_bytes());
    let op = if send {
        SendOp::Send
    } else {
        SendOp::Write {
            remote_va: s.remotes[0].va + s.remotes[0].len / 2,
            rkey: s.remotes[0].rkey,
        }
    };
    s.qps[0].post_send(SendWr {
        wr_id: i,
        op,
        sge: Sge {
            addr: s.mr.va(),
            len: size,
            lkey: s.mr.lkey(),
        },
        signaled: !send,
        solicited: false,
    })?;
    Ok(())
}
